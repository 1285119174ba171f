//! Time and concurrency: requests at once, a retry while the first runs, a key after its
//! lifetime.

use super::*;

impl Run<'_> {
    /// Requests with one key sent at once create once: identical ones (the rest replays or
    /// `409`), or with different bodies (the rest refused).
    pub(super) async fn concurrent(&mut self, name: &'static str, conflicting: bool) -> Scenario {
        self.warm().await;
        let key = self.key(name);
        let shared = self.n();
        let requests: Vec<_> = (0..self.target.concurrency)
            .map(|_| {
                let n = if conflicting { self.n() } else { shared };
                self.request(&Values { key: &key, n }, Key::One(&key), None)
            })
            .collect();
        let answers = self.send_at_once(requests).await;
        let creates = self.target.created.as_u16();
        let created = resources(
            answers
                .iter()
                .filter_map(|(_, answer)| answer.as_ref())
                .filter(|answer| answer.status == creates),
        );
        let statuses: BTreeSet<u16> = answers
            .iter()
            .filter_map(|(_, answer)| answer.as_ref().map(|a| a.status))
            .collect();
        let sent = answers.len();
        let succeeded = answers
            .iter()
            .filter(|(_, answer)| answer.as_ref().is_some_and(Answer::is_success))
            .count();
        let pending: Vec<&Answer> = answers
            .iter()
            .filter_map(|(_, answer)| answer.as_ref())
            .filter(|answer| answer.status == 409)
            .collect();
        let retry_after = if pending.is_empty() {
            ""
        } else if pending
            .iter()
            .all(|answer| answer.headers.contains_key(header::RETRY_AFTER))
        {
            "; each 409 with Retry-After"
        } else {
            "; a 409 without Retry-After (a client guesses when to retry)"
        };
        // The evidence: the successes first, ten at most (a burst's every exchange is noise).
        let mut answers = answers;
        answers.sort_by_key(|(_, answer)| !answer.as_ref().is_some_and(Answer::is_success));
        let evidence: Vec<Exchange> = answers
            .into_iter()
            .take(10)
            .map(|(exchange, _)| exchange)
            .collect();
        if created == 0 {
            return fail(
                name,
                &format!("{sent} requests with one key at once created nothing"),
                "nothing can be checked: is the endpoint up, the body template a valid request, and --expect-created the create's status?",
                evidence,
            );
        }
        if created > 1 {
            return fail(
                name,
                &format!("{sent} requests with one key at once created {created} resources"),
                "two resources created for one intent: a client's retries, or two clients' racing requests, charge twice",
                evidence,
            );
        }
        if conflicting && succeeded > 1 {
            return fail(
                name,
                &format!(
                    "{sent} requests with one key and different bodies at once: {succeeded} succeeded, where one may"
                ),
                "a client that reuses a key by mistake, at the same time as another, is told its request succeeded, and it never ran",
                evidence,
            );
        }
        if !self.distinct().await {
            return indistinct(name, evidence);
        }
        let statuses: Vec<String> = statuses.iter().map(u16::to_string).collect();
        pass(
            name,
            format!(
                "{sent} requests with one key at once created {created} resource (answers: {}){retry_after}",
                statuses.join(", ")
            ),
            Vec::new(),
        )
    }

    /// Opens as many connections as the concurrent scenarios use, with requests that create
    /// nothing (`GET`, answers ignored), so that their requests leave at once rather than each
    /// behind a handshake.
    pub(super) async fn warm(&self) {
        let requests: Vec<_> = (0..self.target.concurrency)
            .map(|_| {
                let request = self
                    .client
                    .get(&self.target.url)
                    .timeout(self.target.timeout);
                (request, String::new())
            })
            .collect();
        self.send_at_once(requests).await;
    }

    /// A retry sent while the first attempt still runs is refused as pending (`409`) or waits
    /// for its result: never a second create.
    pub(super) async fn retry_while_running(&mut self) -> Scenario {
        let name = "retry_while_running";
        let Some(slow) = self.target.slow.clone() else {
            return not_applicable(
                name,
                "not checked: a retry while the first attempt still runs (give --slow-ms, or --slow-header \
                 with --slow-ms)",
                Vec::new(),
            );
        };
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (request, line) = self.request(&values, Key::One(&key), None);
        let (first_request, line, after) = match &slow {
            crate::Slow::Already(after) => (request, line, *after),
            crate::Slow::Header(name, value, after) => (
                request.header(name.clone(), value.clone()),
                format!(
                    "{line} ({name}: {})",
                    String::from_utf8_lossy(value.as_bytes())
                ),
                *after,
            ),
        };
        // The first attempt, and when its answer came; dropped with the scenario.
        let mut first = tokio::task::JoinSet::new();
        first.spawn(async move {
            let answered = exchange(line, first_request.send().await).await;
            (answered, tokio::time::Instant::now())
        });
        tokio::time::sleep(after).await;
        let sent_at = tokio::time::Instant::now();
        let (second, retry) = self.send(&values, Key::One(&key), None).await;
        let Some(Ok(((first, created), answered_at))) = first.join_next().await else {
            return fail(
                name,
                "the first attempt was lost",
                "nothing can be checked",
                vec![second],
            );
        };
        let evidence = vec![first.clone(), second];
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        if answered_at <= sent_at {
            return not_applicable(
                name,
                &format!(
                    "the first attempt had answered before its retry was sent, {} ms in: make it slower",
                    after.as_millis()
                ),
                evidence,
            );
        }
        match retry {
            Some(retry) if retry.status == 409 => pass(
                name,
                "a retry while the first attempt ran was refused as pending (409)".to_owned(),
                evidence,
            ),
            Some(retry) if retry.is_success() && retry.same_resource(&created) => {
                if !self.distinct().await {
                    return indistinct(name, evidence);
                }
                pass(
                    name,
                    format!(
                        "a retry while the first attempt ran waited, and was answered its result ({})",
                        retry.status
                    ),
                    evidence,
                )
            }
            Some(retry) if retry.is_success() => fail(
                name,
                "a retry while the first attempt ran created a second resource",
                "a client that times out and retries while its create is slow creates twice",
                evidence,
            ),
            Some(retry) => fail(
                name,
                &format!(
                    "a retry while the first attempt ran was answered {}, not 409",
                    retry.status
                ),
                "a client cannot tell that its first attempt is still running, and when to retry",
                evidence,
            ),
            None => fail(
                name,
                "a retry while the first attempt ran got no answer",
                "a client cannot tell that its first attempt is still running",
                evidence,
            ),
        }
    }

    /// The lifetime the server advertises on a create's answer (`Idempotency-TTL`, the IETF
    /// draft's issue #49): a number of seconds, or none said.
    pub(super) async fn advertised_lifetime(&mut self) -> Scenario {
        let name = "advertised_lifetime";
        let (_, _, first, created) = match self.first_create(name).await {
            Ok(first) => first,
            Err(scenario) => return scenario,
        };
        let evidence = vec![first];
        match created.advertised_lifetime() {
            None => not_applicable(
                name,
                "the server advertises no lifetime of its keys (no Idempotency-TTL): a client \
                 cannot tell how late it may retry; give --after-s to check one you know",
                evidence,
            ),
            Some(Ok(seconds)) => pass(
                name,
                format!("the server advertises a lifetime of {seconds} s (Idempotency-TTL)"),
                evidence,
            ),
            Some(Err(value)) => fail(
                name,
                &format!("Idempotency-TTL {value:?} is not a number of seconds"),
                "a client cannot read how long its key is kept",
                evidence,
            ),
        }
    }

    /// The key after the server's advertised lifetime (`--after-s`): refused as expired, still
    /// replayed, or created anew (which the draft allows, with a note), never refused
    /// otherwise.
    pub(super) async fn after_lifetime(&mut self) -> Scenario {
        let name = "after_lifetime";
        let Some(after) = self.target.after else {
            return not_applicable(
                name,
                "not checked: give the key's lifetime with --after-s to retry a create that \
                 long after it",
                Vec::new(),
            );
        };
        let (key, n, first, created) = match self.first_create(name).await {
            Ok(first) => first,
            Err(scenario) => return scenario,
        };
        let values = Values { key: &key, n };
        tokio::time::sleep(after).await;
        let (second, later) = self.send(&values, Key::One(&key), None).await;
        let evidence = vec![first, second];
        let seconds = after.as_secs_f64();
        match later {
            Some(later) if later.is_success() && later.same_resource(&created) => pass(
                name,
                format!(
                    "{seconds} s later, the key still replays its create (kept longer than that)"
                ),
                evidence,
            ),
            Some(later) if later.says_expired() => pass(
                name,
                format!(
                    "{seconds} s later, the key is refused as expired ({}): a late retry is \
                     not created twice",
                    later.status
                ),
                evidence,
            ),
            Some(later) if later.is_success() => pass(
                name,
                format!(
                    "{seconds} s later, the key is forgotten: the request created anew (the \
                     draft allows it; a client that retries that late creates twice, where an \
                     expired answer would refuse it)"
                ),
                evidence,
            ),
            Some(later) => fail(
                name,
                &format!("{seconds} s later, the key was answered {}", later.status),
                "a client that reuses its key after the advertised lifetime is refused, without \
                 being told the key expired",
                evidence,
            ),
            None => fail(
                name,
                &format!("{seconds} s later, no answer"),
                "a late retry gets no answer",
                evidence,
            ),
        }
    }
}
