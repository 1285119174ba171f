//! A black-box checker of any create endpoint that takes an idempotency key, over HTTP (the
//! library of the `idempotency-check` command; with `tower-idempotency`, its feature `check`
//! at `tower_idempotency::check`): it sends the requests of the
//! IETF draft's scenarios to a running server and says, for each, whether the endpoint passed,
//! what a client would suffer where it failed, and the exchanges that show it.
//!
//! ```no_run
//! # async fn check() -> Result<(), Box<dyn std::error::Error>> {
//! use idempotency_check::{Target, client, run};
//!
//! let target = Target::new(http::Method::POST, "http://127.0.0.1:3001/payments")
//!     .body(r#"{"amount":{{n}},"currency":"EUR"}"#);
//! let report = run(&target, &client()?).await;
//! print!("{report}");
//! assert!(report.passed());
//! # Ok(()) }
//! ```
//!
//! In a template (the body, a header's value), `{{key}}` is the scenario's key and `{{n}}` a
//! number unique to the request's payload within the run (1001, 1002, …); a run's keys are its
//! own, so a server that keeps keys from earlier runs answers as for new ones.
//!
//! Resources are told apart by their `Location`, or by their body where an answer has none:
//! an endpoint that answers without `Location` and with the same body for every create (or
//! one that echoes the request) cannot be checked for a second create.

#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::fmt;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};

mod report;
mod scenarios;

pub use self::report::{Exchange, Report, Scenario, Verdict};

/// The endpoint to check and how to make a request for it.
#[derive(Debug, Clone)]
pub struct Target {
    pub(crate) method: Method,
    pub(crate) url: String,
    pub(crate) body: String,
    pub(crate) headers: Vec<(HeaderName, String)>,
    pub(crate) key_header: HeaderName,
    pub(crate) created: StatusCode,
    pub(crate) concurrency: usize,
    pub(crate) timeout: Duration,
    pub(crate) only: Vec<String>,
    pub(crate) skip: Vec<String>,
    pub(crate) other_url: Option<String>,
    pub(crate) quote_key: bool,
    pub(crate) slow: Option<Slow>,
    pub(crate) after: Option<Duration>,
}

/// How the `retry_while_running` scenario makes a first attempt that is still running when its
/// retry arrives.
#[derive(Debug, Clone)]
pub enum Slow {
    /// The endpoint's creates are slow on their own (a test server's delay): the retry is sent
    /// after this long.
    Already(Duration),
    /// The first attempt carries this header, a delay hook the endpoint honours (`X-Delay-Ms:
    /// 1000`, say); the retry, without it, is sent after the duration.
    Header(HeaderName, HeaderValue, Duration),
}

impl Target {
    /// `method` on `url`, with the defaults: the body `{"n":{{n}}}` as JSON, the key in
    /// `Idempotency-Key`, a create answered `201`, 32 requests at once, 10 seconds a request,
    /// every scenario.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            body: r#"{"n":{{n}}}"#.to_owned(),
            headers: vec![(http::header::CONTENT_TYPE, "application/json".to_owned())],
            key_header: HeaderName::from_static("idempotency-key"),
            created: StatusCode::CREATED,
            concurrency: 32,
            timeout: Duration::from_secs(10),
            only: Vec::new(),
            skip: Vec::new(),
            other_url: None,
            quote_key: false,
            slow: None,
            after: None,
        }
    }

    /// The server's advertised lifetime of a key: the `after_lifetime` scenario retries a
    /// create this long after it; without it, that scenario does not apply.
    pub fn after(mut self, lifetime: Duration) -> Self {
        self.after = Some(lifetime);
        self
    }

    /// How to make a first attempt still running when its retry arrives, for
    /// `retry_while_running`; without it, that scenario does not apply.
    pub fn slow(mut self, slow: Slow) -> Self {
        self.slow = Some(slow);
        self
    }

    /// Sends the key as the draft writes it, a Structured Field string (`"…"`), rather than a
    /// bare token, for a server that takes only that form.
    pub fn quote_key(mut self) -> Self {
        self.quote_key = true;
        self
    }

    /// Another create endpoint of the same server, taking the same body: the
    /// `other_endpoint` scenario checks that a key there is another operation.
    pub fn other_url(mut self, url: impl Into<String>) -> Self {
        self.other_url = Some(url.into());
        self
    }

    /// The body template (JSON, for the scenarios that reorder it).
    pub fn body(mut self, template: impl Into<String>) -> Self {
        self.body = template.into();
        self
    }

    /// A header every request sends, its value a template; one of the same name replaces it.
    pub fn header(mut self, name: HeaderName, template: impl Into<String>) -> Self {
        self.headers.retain(|(existing, _)| *existing != name);
        self.headers.push((name, template.into()));
        self
    }

    /// The header that carries the key; `Idempotency-Key` by default.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The status of a create; `201` by default.
    pub fn created(mut self, status: StatusCode) -> Self {
        self.created = status;
        self
    }

    /// How many requests the concurrent scenarios send at once (at least 2); 32 by default.
    pub fn concurrency(mut self, requests: usize) -> Self {
        self.concurrency = requests.max(2);
        self
    }

    /// How long a request may take (its answer read whole, at most 1 MiB); 10 seconds by
    /// default, at least a millisecond.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Runs only these scenarios (by [name](Scenario::name)).
    pub fn only(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.only = names.into_iter().map(Into::into).collect();
        self
    }

    /// Skips these scenarios (by [name](Scenario::name)).
    pub fn skip(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.skip = names.into_iter().map(Into::into).collect();
        self
    }

    fn runs(&self, name: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|only| only == name))
            && !self.skip.iter().any(|skip| skip == name)
    }
}

/// The names of the scenarios, in the order they run.
pub const SCENARIOS: [&str; 11] = [
    "create_then_replay",
    "conflict",
    "bad_keys",
    "concurrent_identical",
    "concurrent_conflicting",
    "reordered_json",
    "other_endpoint",
    "other_method",
    "retry_while_running",
    "advertised_lifetime",
    "after_lifetime",
];

/// The client the checker uses: TLS through rustls (its `ring` provider installed for the
/// process unless one is), HTTP/2 where the server offers it, redirects not followed (an
/// answer is judged as the server gave it).
///
/// # Errors
///
/// reqwest's, where the client cannot be built (no TLS roots, say).
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    client_with(Http::Negotiated, &[])
}

/// Which HTTP the checker speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Http {
    /// HTTP/1.1, or HTTP/2 where a TLS server offers it (ALPN).
    #[default]
    Negotiated,
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/2 only, with prior knowledge over plain TCP (h2c) and over TLS.
    Http2,
}

/// [`client`] speaking `http`, trusting `roots` beside the platform's (a staging server's own
/// CA: `reqwest::Certificate::from_pem`).
///
/// # Errors
///
/// reqwest's, where the client cannot be built (no TLS roots, say).
pub fn client_with(
    http: Http,
    roots: &[reqwest::Certificate],
) -> Result<reqwest::Client, reqwest::Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    for root in roots {
        builder = builder.add_root_certificate(root.clone());
    }
    let builder = match http {
        Http::Negotiated => builder,
        Http::Http1 => builder.http1_only(),
        Http::Http2 => builder.http2_prior_knowledge(),
    };
    builder.build()
}

/// Runs the scenarios `target` selects against it with `client` ([`client`], or one of your
/// own that follows no redirects), one after the other.
pub async fn run(target: &Target, client: &reqwest::Client) -> Report {
    let mut run = scenarios::Run::new(target, client);
    let mut report = Report::default();
    for name in SCENARIOS {
        if target.runs(name) {
            report.scenarios.push(run.scenario(name).await);
        }
    }
    report
}

/// A value `{{key}}` and `{{n}}` expand to.
#[derive(Debug, Clone)]
pub(crate) struct Values<'a> {
    pub(crate) key: &'a str,
    pub(crate) n: u64,
}

/// `template` with `{{key}}` and `{{n}}` expanded.
pub(crate) fn expand(template: &str, values: &Values<'_>) -> String {
    template
        .replace("{{key}}", values.key)
        .replace("{{n}}", &values.n.to_string())
}

impl fmt::Display for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {} n {}", self.key, self.n)
    }
}

/// A header value of `text`, or none if it cannot be one.
pub(crate) fn value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_of_the_same_name_replaces_the_one_before() {
        let target = Target::new(Method::POST, "http://h/p")
            .header(http::header::CONTENT_TYPE, "text/plain")
            .header(HeaderName::from_static("x-tenant"), "{{key}}");
        let names: Vec<_> = target
            .headers
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(names, ["content-type", "x-tenant"]);
        assert_eq!(target.headers[0].1, "text/plain");
    }

    #[test]
    fn only_and_skip_choose_the_scenarios() {
        let all = Target::new(Method::POST, "http://h/p");
        assert!(SCENARIOS.iter().all(|name| all.runs(name)));
        let only = all.clone().only(["conflict", "bad_keys"]);
        let chosen: Vec<_> = SCENARIOS
            .into_iter()
            .filter(|name| only.runs(name))
            .collect();
        assert_eq!(chosen, ["conflict", "bad_keys"]);
        let skip = all.clone().skip(["conflict"]);
        assert!(!skip.runs("conflict") && skip.runs("bad_keys"));
        let both = all.only(["conflict", "bad_keys"]).skip(["conflict"]);
        assert!(!both.runs("conflict") && both.runs("bad_keys") && !both.runs("other_method"));
    }

    #[test]
    fn templates_expand_the_key_and_the_number() {
        let values = Values {
            key: "k-1",
            n: 1001,
        };
        assert_eq!(
            expand(r#"{"id":"{{key}}","n":{{n}},"again":"{{key}}"}"#, &values),
            r#"{"id":"k-1","n":1001,"again":"k-1"}"#
        );
        assert_eq!(values.to_string(), "key k-1 n 1001");
        assert!(value("ok").is_some() && value("bad\nvalue").is_none());
        let target = Target::new(Method::POST, "http://h/p")
            .concurrency(1)
            .timeout(Duration::ZERO);
        assert_eq!(target.concurrency, 2);
        assert_eq!(target.timeout, Duration::from_millis(1));
    }
}
