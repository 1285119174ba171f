//! The key: malformed ones, and one key on another endpoint or with another method.

use super::*;

impl Run<'_> {
    /// A missing, empty, over-long or repeated key is refused when the endpoint requires keys.
    pub(super) async fn bad_keys(&mut self) -> Scenario {
        let name = "bad_keys";
        let key = self.key(name);
        let long = "k".repeat(1024);
        // The control: the same request with a good key creates, so a refusal below is the
        // key's.
        let control_key = format!("{key}-good");
        let n = self.n();
        let (control, created) = self
            .send(
                &Values {
                    key: &control_key,
                    n,
                },
                Key::One(&control_key),
                None,
            )
            .await;
        if self.created(&created).is_none() {
            return not_created(name, control);
        }
        let n = self.n();
        let (missing, answer) = self.send(&Values { key: "", n }, Key::Missing, None).await;
        if answer.as_ref().is_some_and(Answer::is_success) {
            return not_applicable(
                name,
                "the endpoint does not require a key: a request without one was created",
                vec![control, missing],
            );
        }
        let mut accepted = Vec::new();
        if !answer
            .as_ref()
            .is_some_and(|a| (400..500).contains(&a.status))
        {
            accepted.push("no key (not refused with a 4xx)");
        }
        let mut evidence = vec![control, missing];
        let twice = format!("{key}-b");
        for (what, carried) in [
            ("an empty key", Key::One("")),
            ("two keys", Key::Twice(&key, &twice)),
        ] {
            // Answered other than a 4xx refusal: created, or a server error.
            let n = self.n();
            let (exchange, answer) = self.send(&Values { key: &key, n }, carried, None).await;
            if !answer
                .as_ref()
                .is_some_and(|a| (400..500).contains(&a.status))
            {
                accepted.push(what);
            }
            evidence.push(exchange);
        }
        // The draft sets no length: a long key accepted is noted, not a failure.
        let n = self.n();
        let (exchange, answer) = self
            .send(&Values { key: &key, n }, Key::One(&long), None)
            .await;
        let long_note = if answer.as_ref().is_some_and(Answer::is_success) {
            "; a 1,024-character key is accepted (the draft sets no length)"
        } else {
            "; a 1,024-character key is refused"
        };
        evidence.push(exchange);
        if accepted.is_empty() {
            return pass(
                name,
                format!("a missing, empty or repeated key is refused{long_note}"),
                evidence,
            );
        }
        fail(
            name,
            &format!("not refused: {}", accepted.join(", ")),
            "a request with a malformed key is created without protection: its retry creates again",
            evidence,
        )
    }

    /// The key of a create on the target sent to another endpoint, with the same body, is
    /// another operation there: never the first endpoint's answer.
    pub(super) async fn other_endpoint(&mut self) -> Scenario {
        let name = "other_endpoint";
        let Some(other_url) = self.target.other_url.clone() else {
            return not_applicable(
                name,
                "not checked: whether a key on another endpoint is another operation (give --other-url)",
                Vec::new(),
            );
        };
        let (key, n, first, created) = match self.first_create(name).await {
            Ok(first) => first,
            Err(scenario) => return scenario,
        };
        let values = Values { key: &key, n };
        let (request, line) = self.request_to(&other_url, &values, Key::One(&key), None);
        let (second, other) = exchange(line, request.send().await).await;
        let evidence = vec![first, second];
        let distinct = self.distinct().await;
        match other {
            Some(other) if other.is_success() && other.same_resource(&created) && !distinct => {
                indistinct(name, evidence)
            }
            Some(other) if other.is_success() && other.same_resource(&created) => fail(
                name,
                "the key on another endpoint was answered with the first endpoint's result",
                "a client that uses one key on two endpoints (a payment, then its refund) gets the first result for the second, which never runs",
                evidence,
            ),
            Some(other) => pass(
                name,
                format!(
                    "the key on another endpoint is another operation there (answered {})",
                    other.status
                ),
                evidence,
            ),
            None => fail(
                name,
                "the other endpoint gave no answer",
                "a client cannot use the other endpoint",
                evidence,
            ),
        }
    }

    /// The key of a create sent with another method to the same URL (`PUT` for a `POST`,
    /// `POST` otherwise) is another operation: never the create's answer.
    pub(super) async fn other_method(&mut self) -> Scenario {
        let name = "other_method";
        let (key, n, first, created) = match self.first_create(name).await {
            Ok(first) => first,
            Err(scenario) => return scenario,
        };
        let values = Values { key: &key, n };
        let method = if self.target.method == http::Method::POST {
            http::Method::PUT
        } else {
            http::Method::POST
        };
        let (request, line) = self.request(&values, Key::One(&key), None);
        let line = line.replacen(self.target.method.as_str(), method.as_str(), 1);
        let request = request.build().map(|mut request| {
            *request.method_mut() = method.clone();
            request
        });
        let sent = match request {
            Ok(request) => self.client.execute(request).await,
            Err(error) => Err(error),
        };
        let (second, other) = exchange(line, sent).await;
        let evidence = vec![first, second];
        let distinct = self.distinct().await;
        match other {
            Some(other) if other.is_success() && other.same_resource(&created) && !distinct => {
                indistinct(name, evidence)
            }
            Some(other) if other.is_success() && other.same_resource(&created) => fail(
                name,
                &format!(
                    "the key with {method} was answered with the {} create's result",
                    self.target.method
                ),
                "a client that uses one key for two methods (a create, then an update) gets the create's result for the second, which never runs",
                evidence,
            ),
            Some(other) => pass(
                name,
                format!(
                    "the key with {method} is another operation (answered {})",
                    other.status
                ),
                evidence,
            ),
            None => pass(
                name,
                format!("the key with {method} got no answer: not the create's"),
                evidence,
            ),
        }
    }
}
