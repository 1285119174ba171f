//! The scenarios: each sends its requests and judges the answers.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, header};

use super::report::{Exchange, Scenario, Verdict};
use super::{Target, Values, expand, value};

mod keys;
mod replay;
mod timing;

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

    /// Whether this is a refusal that says the key expired: a `409`, `410`, `412` or `422` whose
    /// body names it
    /// (this crate's `key_expired`, AdCP's `IDEMPOTENCY_EXPIRED`, any body that says
    /// "expired").
    fn says_expired(&self) -> bool {
        // A refusal of the key (409, 410, 412, 422), not of the caller: a late retry's bearer
        // token may have expired too (401), which says nothing of the key.
        matches!(self.status, 409 | 410 | 412 | 422)
            && String::from_utf8_lossy(&self.body)
                .to_ascii_lowercase()
                .contains("expired")
    }

    /// The lifetime of a key the answer advertises (`Idempotency-TTL`): its seconds, `Err`
    /// with the value when it is not a number of seconds.
    fn advertised_lifetime(&self) -> Option<Result<u64, String>> {
        let value = self.headers.get("idempotency-ttl")?;
        let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
        Some(text.trim().parse::<u64>().map_err(|_| text))
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
                format!("key={key}")
            }
            Key::Missing => "no key".to_owned(),
            Key::Twice(a, b) => {
                for key in [a, b] {
                    if let Some(value) = value(&quoted(key)) {
                        request = request.header(self.target.key_header.clone(), value);
                    }
                }
                format!("keys={},{}", quoted(a), quoted(b))
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
            "advertised_lifetime" => self.advertised_lifetime().await,
            _ => self.after_lifetime().await,
        }
    }

    /// The scenario's first request, on a key of its own: the key, the payload's number, the
    /// exchange and the created answer; or the scenario's verdict at once if it created
    /// nothing.
    async fn first_create(
        &mut self,
        name: &'static str,
    ) -> Result<(String, u64, Exchange, Answer), Scenario> {
        let key = self.key(name);
        let n = self.n();
        let (first, answer) = self
            .send(&Values { key: &key, n }, Key::One(&key), None)
            .await;
        match self.created(&answer) {
            Some(created) => Ok((key, n, first, created)),
            None => Err(not_created(name, first)),
        }
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
    not_applicable(
        name,
        "two creates of one payload under two keys answered alike (no Location, the same body): a replay cannot be told from a second create",
        evidence,
    )
}

/// A scenario that does not apply, and why.
fn not_applicable(name: &'static str, summary: &str, evidence: Vec<Exchange>) -> Scenario {
    Scenario {
        name,
        verdict: Verdict::NotApplicable,
        summary: summary.to_owned(),
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
