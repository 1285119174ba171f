//! The scenarios: each sends its requests and judges the answers.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, header};

use super::report::{Exchange, Scenario, Verdict};
use super::{Target, Values, expand, value};

/// The headers a client relies on, compared between a create and its replay.
const KEPT: [HeaderName; 3] = [header::LOCATION, header::ETAG, header::CONTENT_TYPE];

/// The headers an exchange shows.
const SHOWN: [&str; 6] = [
    "location",
    "etag",
    "content-type",
    "retry-after",
    "idempotent-replayed",
    "idempotency-key",
];

/// How a request carries its key.
#[derive(Clone, Copy)]
enum Key<'a> {
    One(&'a str),
    Missing,
    Twice(&'a str, &'a str),
}

/// An answer, whole.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    fn location(&self) -> Option<&[u8]> {
        self.headers.get(header::LOCATION).map(|l| l.as_bytes())
    }

    /// Whether `self` and `other` name one resource: one `Location` where both have one,
    /// else one body (a replay that lost its `Location` still names its resource).
    fn same_resource(&self, other: &Self) -> bool {
        match (self.location(), other.location()) {
            (Some(a), Some(b)) => a == b,
            _ => self.body == other.body,
        }
    }
}

/// How many resources `answers` name: their `Location`s where every one has one, else their
/// bodies.
fn resources<'a>(answers: impl Iterator<Item = &'a Answer> + Clone) -> usize {
    if answers.clone().all(|a| a.location().is_some()) {
        answers
            .filter_map(Answer::location)
            .collect::<BTreeSet<_>>()
            .len()
    } else {
        answers.map(|a| &a.body[..]).collect::<BTreeSet<_>>().len()
    }
}

/// One run of the scenarios: its keys and numbers, unique to it.
pub(crate) struct Run<'a> {
    target: &'a Target,
    client: &'a reqwest::Client,
    prefix: String,
    next: u64,
    /// Whether two creates can be told apart, once probed.
    distinct: Option<bool>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(target: &'a Target, client: &'a reqwest::Client) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            target,
            client,
            prefix: format!("check-{now:x}-{:x}", std::process::id()),
            // Unique within the run (its keys are unique across runs), small enough for any
            // field: 1001, 1002, …
            next: 1_000,
            distinct: None,
        }
    }

    /// Whether two resources created with one payload under two keys answer differently (by
    /// `Location`, or by body where there is none): if not, a replay cannot be told from a
    /// second create. Probed once a run, with two creates.
    async fn distinct(&mut self) -> bool {
        if let Some(distinct) = self.distinct {
            return distinct;
        }
        let n = self.n();
        let mut answers = Vec::new();
        for probe in ["probe-a", "probe-b"] {
            let key = self.key(probe);
            let (_, answer) = self
                .send(&Values { key: &key, n }, Key::One(&key), None)
                .await;
            answers.extend(self.created(&answer));
        }
        let distinct = match answers.as_slice() {
            [a, b] => !a.same_resource(b),
            _ => true,
        };
        self.distinct = Some(distinct);
        distinct
    }

    fn key(&self, scenario: &str) -> String {
        format!("{}-{scenario}", self.prefix)
    }

    fn n(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The request for `values`, its key carried as `key`, its body `body` (the template's
    /// expansion if `None`), and the line that shows it.
    fn request(
        &self,
        values: &Values<'_>,
        key: Key<'_>,
        body: Option<&str>,
    ) -> (reqwest::RequestBuilder, String) {
        self.request_to(&self.target.url, values, key, body)
    }

    /// [`request`](Self::request) to `url`.
    fn request_to(
        &self,
        url: &str,
        values: &Values<'_>,
        key: Key<'_>,
        body: Option<&str>,
    ) -> (reqwest::RequestBuilder, String) {
        let body = body.map_or_else(|| expand(&self.target.body, values), str::to_owned);
        let mut request = self
            .client
            .request(self.target.method.clone(), url)
            .timeout(self.target.timeout);
        for (name, template) in &self.target.headers {
            if let Some(value) = value(&expand(template, values)) {
                request = request.header(name.clone(), value);
            }
        }
        let quoted = |key: &str| {
            if self.target.quote_key {
                format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
            } else {
                key.to_owned()
            }
        };
        let key_line = match key {
            Key::One(key) => {
                let key = quoted(key);
                if let Some(value) = value(&key) {
                    request = request.header(self.target.key_header.clone(), value);
                }
                format!("key={key:?}")
            }
            Key::Missing => "no key".to_owned(),
            Key::Twice(a, b) => {
                for key in [a, b] {
                    if let Some(value) = value(&quoted(key)) {
                        request = request.header(self.target.key_header.clone(), value);
                    }
                }
                format!("keys={:?},{:?}", quoted(a), quoted(b))
            }
        };
        let line = format!("{} {url} {key_line} body={body}", self.target.method);
        (request.body(body), line)
    }

    async fn send(
        &self,
        values: &Values<'_>,
        key: Key<'_>,
        body: Option<&str>,
    ) -> (Exchange, Option<Answer>) {
        let (request, line) = self.request(values, key, body);
        exchange(line, request.send().await).await
    }

    /// Sends `requests` at once; their exchanges and answers, in order.
    async fn send_at_once(
        &self,
        requests: Vec<(reqwest::RequestBuilder, String)>,
    ) -> Vec<(Exchange, Option<Answer>)> {
        let mut tasks = tokio::task::JoinSet::new();
        // Every request built first, then all sent: the server sees them together.
        let gate = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
        for (i, (request, line)) in requests.into_iter().enumerate() {
            let gate = std::sync::Arc::clone(&gate);
            tasks.spawn(async move {
                gate.wait().await;
                (i, exchange(line, request.send().await).await)
            });
        }
        let mut answers: Vec<_> = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        answers.sort_by_key(|(i, _)| *i);
        answers.into_iter().map(|(_, answer)| answer).collect()
    }

    pub(crate) async fn scenario(&mut self, name: &'static str) -> Scenario {
        match name {
            "create_then_replay" => self.create_then_replay().await,
            "conflict" => self.conflict().await,
            "bad_keys" => self.bad_keys().await,
            "concurrent_identical" => self.concurrent(name, false).await,
            "concurrent_conflicting" => self.concurrent(name, true).await,
            "reordered_json" => self.reordered_json().await,
            "other_endpoint" => self.other_endpoint().await,
            "other_method" => self.other_method().await,
            "retry_while_running" => self.retry_while_running().await,
            _ => self.after_lifetime().await,
        }
    }

    /// A first request creates; its retry replays it: the same status, body and headers.
    async fn create_then_replay(&mut self) -> Scenario {
        let name = "create_then_replay";
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (second, replay) = self.send(&values, Key::One(&key), None).await;
        let evidence = vec![first, second];
        if !self.distinct().await {
            return indistinct(name, evidence);
        }
        let Some(replay) = replay else {
            return fail(
                name,
                "the retry got no answer",
                "a client that retries gets no answer",
                evidence,
            );
        };
        let mut differences = Vec::new();
        if replay.status != created.status {
            differences.push(format!(
                "status {} instead of {}",
                replay.status, created.status
            ));
        }
        if replay.body != created.body {
            differences.push("another body".to_owned());
        }
        for name in &KEPT {
            if replay
                .headers
                .get_all(name)
                .iter()
                .ne(created.headers.get_all(name).iter())
            {
                differences.push(format!("another {name}"));
            }
        }
        if differences.is_empty() {
            let marker = if replay.headers.contains_key("idempotent-replayed") {
                ", marked Idempotent-Replayed"
            } else {
                ""
            };
            return pass(
                name,
                format!(
                    "created {}, the retry replayed it byte for byte{marker}",
                    created.status
                ),
                evidence,
            );
        }
        let lost_location = created.headers.contains_key(header::LOCATION)
            && !replay.headers.contains_key(header::LOCATION);
        let suffering = if lost_location {
            "a client whose first answer was lost retries and does not learn where its resource is"
        } else {
            "a client whose first answer was lost retries and reads another answer than the create's"
        };
        fail(
            name,
            &format!("the retry's answer differs: {}", differences.join(", ")),
            suffering,
            evidence,
        )
    }

    /// The key with another body is refused (`422` per the draft), and the key still replays
    /// its first request.
    async fn conflict(&mut self) -> Scenario {
        let name = "conflict";
        let key = self.key(name);
        let first_values = Values {
            key: &key,
            n: self.n(),
        };
        let other_values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&first_values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (second, other) = self.send(&other_values, Key::One(&key), None).await;
        let (third, again) = self.send(&first_values, Key::One(&key), None).await;
        let evidence = vec![first, second, third];
        let Some(other) = other else {
            return fail(
                name,
                "the other body got no answer",
                "a client cannot tell a reused key",
                evidence,
            );
        };
        if other.is_success() {
            let (summary, suffering) = if other.same_resource(&created) {
                (
                    format!(
                        "another body under the key was answered {} with the first request's result",
                        other.status
                    ),
                    "a client that reuses a key by mistake is told its request succeeded, and it never ran",
                )
            } else {
                (
                    format!(
                        "another body under the key was answered {}, created anew",
                        other.status
                    ),
                    "a key reused with another body creates a second resource",
                )
            };
            return fail(name, &summary, suffering, evidence);
        }
        let unchanged = again
            .as_ref()
            .is_some_and(|again| again.is_success() && again.same_resource(&created));
        if !unchanged {
            return fail(
                name,
                "after the refused body, the first request no longer replays",
                "a client's retry after another client's mistake loses its answer",
                evidence,
            );
        }
        let summary = if other.status == 422 {
            "another body under the key was refused with 422, and the key still replays".to_owned()
        } else {
            format!(
                "another body under the key was refused with {}, not the draft's 422; the key still replays",
                other.status
            )
        };
        pass(name, summary, evidence)
    }

    /// A missing, empty, over-long or repeated key is refused when the endpoint requires keys.
    async fn bad_keys(&mut self) -> Scenario {
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
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: "the endpoint does not require a key: a request without one was created"
                    .to_owned(),
                suffering: String::new(),
                evidence: vec![control, missing],
            };
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

    /// Requests with one key sent at once create once: identical ones (the rest replays or
    /// `409`), or with different bodies (the rest refused).
    async fn concurrent(&mut self, name: &'static str, conflicting: bool) -> Scenario {
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
        let evidence: Vec<Exchange> = answers.into_iter().map(|(exchange, _)| exchange).collect();
        if created == 0 {
            return fail(
                name,
                &format!("{sent} requests with one key at once created nothing"),
                "nothing can be checked: is the endpoint up, the body template a valid request, and --expect-created the create's status?",
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
        if created > 1 {
            return fail(
                name,
                &format!("{sent} requests with one key at once created {created} resources"),
                "two resources created for one intent: a client's retries, or two clients' racing requests, charge twice",
                evidence,
            );
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

    /// The same JSON body re-serialised (members reordered, spaces added) is a replay, or is
    /// noted as compared by bytes.
    async fn reordered_json(&mut self) -> Scenario {
        let name = "reordered_json";
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let body = expand(&self.target.body, &values);
        let Some(reordered) = reordered(&body) else {
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: "the body is not a JSON object with two members or more".to_owned(),
                suffering: String::new(),
                evidence: Vec::new(),
            };
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (second, replay) = self.send(&values, Key::One(&key), Some(&reordered)).await;
        let evidence = vec![first, second];
        match replay {
            Some(replay) if replay.is_success() && replay.same_resource(&created) => pass(
                name,
                "the same JSON, reordered and re-spaced, replayed the create".to_owned(),
                evidence,
            ),
            Some(replay) if !replay.is_success() => Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: format!(
                    "the same JSON reordered was refused with {}: the server compares bytes, so a client must resend its exact bytes",
                    replay.status
                ),
                suffering: String::new(),
                evidence,
            },
            Some(replay) if !replay.same_resource(&created) => fail(
                name,
                "the same JSON reordered created anew",
                "a client whose library re-serialises its retry creates a second resource",
                evidence,
            ),
            _ => fail(
                name,
                "the same JSON reordered got another answer than the create's",
                "a client whose library re-serialises its retry reads another answer",
                evidence,
            ),
        }
    }

    /// The key of a create on the target sent to another endpoint, with the same body, is
    /// another operation there: never the first endpoint's answer.
    async fn other_endpoint(&mut self) -> Scenario {
        let name = "other_endpoint";
        let Some(other_url) = self.target.other_url.clone() else {
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: "no other endpoint given (--other-url)".to_owned(),
                suffering: String::new(),
                evidence: Vec::new(),
            };
        };
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (request, line) = self.request_to(&other_url, &values, Key::One(&key), None);
        let (second, other) = exchange(line, request.send().await).await;
        let evidence = vec![first, second];
        match other {
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
    async fn other_method(&mut self) -> Scenario {
        let name = "other_method";
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
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
        match other {
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

    /// The key after the server's advertised lifetime (`--after-s`): created anew, or still
    /// replayed, never refused.
    async fn after_lifetime(&mut self) -> Scenario {
        let name = "after_lifetime";
        let Some(after) = self.target.after else {
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: "no lifetime given (--after-s)".to_owned(),
                suffering: String::new(),
                evidence: Vec::new(),
            };
        };
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
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
            Some(later) if later.is_success() => pass(
                name,
                format!("{seconds} s later, the key is forgotten: the request created anew"),
                evidence,
            ),
            Some(later) => fail(
                name,
                &format!("{seconds} s later, the key was answered {}", later.status),
                "a client that retries within the advertised lifetime, or reuses the key after it, is refused",
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

    /// A retry sent while the first attempt still runs is refused as pending (`409`) or waits
    /// for its result: never a second create.
    async fn retry_while_running(&mut self) -> Scenario {
        let name = "retry_while_running";
        let Some(slow) = self.target.slow.clone() else {
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary:
                    "no slow first attempt to make (--slow-ms, or --slow-header with --slow-ms)"
                        .to_owned(),
                suffering: String::new(),
                evidence: Vec::new(),
            };
        };
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, line) = self.request(&values, Key::One(&key), None);
        let (first, after) = match &slow {
            super::Slow::Already(after) => (first, *after),
            super::Slow::Header(name, value, after) => {
                (first.header(name.clone(), value.clone()), *after)
            }
        };
        let first = tokio::spawn(async move { exchange(line, first.send().await).await });
        tokio::time::sleep(after).await;
        let retry_sent = first.is_finished();
        let (second, retry) = self.send(&values, Key::One(&key), None).await;
        let Ok((first, created)) = first.await else {
            return fail(
                name,
                "the first attempt was lost",
                "nothing can be checked",
                vec![second],
            );
        };
        let evidence = vec![first.clone(), second];
        if retry_sent {
            return Scenario {
                name,
                verdict: Verdict::NotApplicable,
                summary: format!(
                    "the first attempt had answered before its retry was sent, {} ms in: make it slower",
                    after.as_millis()
                ),
                suffering: String::new(),
                evidence,
            };
        }
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        match retry {
            Some(retry) if retry.status == 409 => pass(
                name,
                "a retry while the first attempt ran was refused as pending (409)".to_owned(),
                evidence,
            ),
            Some(retry) if retry.is_success() && retry.same_resource(&created) => pass(
                name,
                format!(
                    "a retry while the first attempt ran waited, and was answered its result ({})",
                    retry.status
                ),
                evidence,
            ),
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

    /// Opens as many connections as the concurrent scenarios use, with requests that create
    /// nothing (`GET`, answers ignored), so that their requests leave at once rather than each
    /// behind a handshake.
    async fn warm(&self) {
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

    /// `answer` if it is the target's create status.
    fn created(&self, answer: &Option<Answer>) -> Option<Answer> {
        answer
            .as_ref()
            .filter(|answer| answer.status == self.target.created.as_u16())
            .cloned()
    }
}

/// The exchange and answer of a request sent.
async fn exchange(
    request: String,
    sent: Result<reqwest::Response, reqwest::Error>,
) -> (Exchange, Option<Answer>) {
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            let exchange = Exchange {
                request,
                status: None,
                version: String::new(),
                headers: Vec::new(),
                body: String::new(),
                error: Some(error.to_string()),
            };
            return (exchange, None);
        }
    };
    let status = response.status().as_u16();
    let version = format!("{:?}", response.version());
    let headers = response.headers().clone();
    let body = match capped(response).await {
        Ok(body) => body,
        Err(error) => {
            let exchange = Exchange {
                request,
                status: Some(status),
                version,
                headers: shown(&headers),
                body: String::new(),
                error: Some(error),
            };
            return (exchange, None);
        }
    };
    let shown_body = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    let exchange = Exchange {
        request,
        status: Some(status),
        version,
        headers: shown(&headers),
        body: shown_body,
        error: None,
    };
    (
        exchange,
        Some(Answer {
            status,
            headers,
            body,
        }),
    )
}

/// The most of an answer's body the checker reads: past it, the answer is an error.
const MAX_BODY: usize = 1024 * 1024;

/// `response`'s body, read up to [`MAX_BODY`].
async fn capped(mut response: reqwest::Response) -> Result<Bytes, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("the body is over {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

fn shown(headers: &HeaderMap) -> Vec<String> {
    SHOWN
        .iter()
        .flat_map(|name| {
            headers
                .get_all(*name)
                .iter()
                .map(move |value| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
        })
        .collect()
}

/// `body`, a JSON object of two members or more, with its members in reverse order and spaces
/// between its tokens.
fn reordered(body: &str) -> Option<String> {
    let serde_json::Value::Object(members) = serde_json::from_str(body).ok()? else {
        return None;
    };
    if members.len() < 2 {
        return None;
    }
    // The members in the reverse of their order in `body` (where each name first appears as a
    // string), so that the order changes whatever it was.
    let mut members: Vec<_> = members.iter().collect();
    let at = |name: &str| body.find(&serde_json::Value::from(name).to_string());
    members.sort_by_key(|(name, _)| std::cmp::Reverse(at(name)));
    let members: Vec<String> = members
        .iter()
        .map(|(name, value)| format!("{} : {value}", serde_json::Value::from(name.as_str())))
        .collect();
    Some(format!("{{ {} }}", members.join(" , ")))
}

/// A scenario that cannot judge: two creates answer alike, so a replay looks like a second
/// create.
fn indistinct(name: &'static str, evidence: Vec<Exchange>) -> Scenario {
    Scenario {
        name,
        verdict: Verdict::NotApplicable,
        summary: "two creates of one payload under two keys answered alike (no Location, the same body): a replay cannot be told from a second create".to_owned(),
        suffering: String::new(),
        evidence,
    }
}

fn pass(name: &'static str, summary: String, evidence: Vec<Exchange>) -> Scenario {
    Scenario {
        name,
        verdict: Verdict::Pass,
        summary,
        suffering: String::new(),
        evidence,
    }
}

fn fail(name: &'static str, summary: &str, suffering: &str, evidence: Vec<Exchange>) -> Scenario {
    Scenario {
        name,
        verdict: Verdict::Fail,
        summary: summary.to_owned(),
        suffering: suffering.to_owned(),
        evidence,
    }
}

/// A scenario whose first request did not create: the endpoint, or the check's template,
/// is not what the check expects.
fn not_created(name: &'static str, first: Exchange) -> Scenario {
    let summary = match (first.status, &first.error) {
        (Some(status), None) => {
            format!("the first request was answered {status}, not the create status")
        }
        (Some(status), Some(error)) => {
            format!("the first request's answer ({status}) could not be read: {error}")
        }
        (None, _) => "the first request got no answer".to_owned(),
    };
    fail(
        name,
        &summary,
        "nothing can be checked: is the body template a valid request, and --expect-created the create's status?",
        vec![first],
    )
}

#[cfg(test)]
mod tests {
    use super::reordered;

    #[test]
    fn a_reordered_body_reverses_the_members_as_written() {
        assert_eq!(
            reordered(r#"{"currency":"EUR","amount":1}"#).unwrap(),
            r#"{ "amount" : 1 , "currency" : "EUR" }"#
        );
        assert_eq!(
            reordered(r#"{"amount":1,"currency":"EUR"}"#).unwrap(),
            r#"{ "currency" : "EUR" , "amount" : 1 }"#
        );
        assert_eq!(reordered(r#"{"amount":1}"#), None);
        assert_eq!(reordered("[1,2]"), None);
        assert_eq!(reordered("amount=1"), None);
    }
}
