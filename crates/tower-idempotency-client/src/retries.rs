//! What every client of the crate shares, the tower layer and the `reqwest` middleware alike:
//! the settings, an intent's key, and the policy between attempts. That policy is the backoff
//! with full jitter, the attempt cap, the deadline and the budget.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::header::HeaderValue;
use http::{Extensions, HeaderMap, Method};
use tower::BoxError;
use tower::retry::budget::{Budget, TpsBudget};

use super::decision::Decision;
use crate::IDEMPOTENCY_KEY;
use crate::metrics::Metrics;

/// An intent's `Idempotency-Key`. Set in a request's extensions, it is the key the layer sends
/// with every attempt, unless the request has an `Idempotency-Key` header already, which wins.
/// The layer puts the key it sent into the response's extensions, whichever it was, so that a
/// caller that let the layer make one can log it or store it.
///
/// The layer's error when it gave up without an answer, [`GaveUp`], carries the key too, and
/// the reqwest middleware writes it back to the request's extensions; a retrier outside the
/// tower layer reuses it through [`SameKey`]. An intent that may be tried again much later,
/// after the process that made its key is gone, must keep its key: set it here or as the
/// header, and store it with the intent before the first attempt, so that a later try is the
/// same intent, not a second create.
///
/// ```
/// use http::{HeaderValue, Request};
/// use tower_idempotency_client::IntentKey;
///
/// let mut request = Request::post("http://127.0.0.1:3001/payments").body(()).unwrap();
/// request
///     .extensions_mut()
///     .insert(IntentKey(HeaderValue::from_static("order-7-payment")));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IntentKey(pub HeaderValue);

/// Why a client layer made no more attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The last answer, or failure, is final: it may not be retried. It is a failure of a
    /// request without a key, one that cannot have reached the server, or an answer that
    /// decides.
    Final,
    /// [`max_attempts`](super::ClientLayer::max_attempts) were made.
    AttemptCap,
    /// The [`deadline`](super::ClientLayer::deadline) passed, or would have before the next
    /// attempt.
    Deadline,
    /// The retry [`budget`](super::ClientLayer::budget) had nothing left.
    Budget,
    /// The next attempt would come after the server's replay window, counted from the first
    /// attempt: the window the server advertised (`Idempotency-TTL`), or the one set with
    /// [`replay_window`](super::ClientLayer::replay_window). Past it the server may have
    /// forgotten the key, and a retry could create a second time.
    Lifetime {
        /// The window.
        window: Duration,
    },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Final => "the failure is final",
            Self::AttemptCap => "the attempts ran out",
            Self::Deadline => "the deadline passed",
            Self::Budget => "the retry budget ran out",
            Self::Lifetime { window } => {
                return write!(
                    f,
                    "the key's replay window of {} s would pass before the next attempt",
                    window.as_secs_f64()
                );
            }
        })
    }
}

/// The error of a request the client layer gave up on without an answer: how many attempts
/// it made, why it stopped, the intent's key if it had one, and the last attempt's error as
/// its [`source`](std::error::Error::source). A caller finds it in the layer's
/// `tower::BoxError` with `downcast_ref`.
///
/// The key is the one to retry the intent with later, by hand or by a retrier outside the layer
/// with [`SameKey`](super::SameKey): under another key, a request whose answer was lost after
/// the server created would create again.
///
/// ```
/// use tower_idempotency_client::{GaveUp, Stop};
///
/// fn explain(error: &tower::BoxError) -> String {
///     match error.downcast_ref::<GaveUp>() {
///         Some(gave_up) if gave_up.stop == Stop::Deadline => {
///             format!("out of time after {} attempts", gave_up.attempts)
///         }
///         Some(gave_up) => gave_up.to_string(),
///         None => error.to_string(),
///     }
/// }
/// # drop(explain);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct GaveUp {
    /// The attempts made, the first included; 0 if none could be sent.
    pub attempts: u32,
    /// Why no more were made.
    pub stop: Stop,
    /// The intent's key, if its request was keyed.
    pub key: Option<IntentKey>,
    /// The last attempt's error.
    pub source: BoxError,
}

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no answer after {} attempt", self.attempts)?;
        if self.attempts != 1 {
            f.write_str("s")?;
        }
        write!(f, " ({})", self.stop)
    }
}

impl std::error::Error for GaveUp {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// A `tower::retry::Policy` for a retrier outside a [`ClientLayer`](super::ClientLayer):
/// `policy`, and before each retry the intent's key, from the answer's extensions or the
/// layer's [`GaveUp`] error, set as the retried request's [`IntentKey`], so that every outer
/// retry is the same intent. A request that has an `Idempotency-Key` header keeps it.
///
/// `tower::retry::Retry` clones a request before the layer inside it makes the key, so a plain
/// policy would retry under a new key each time: a request whose answer was lost after the
/// server created, once the layer's own attempts ran out, would then create again. A layer
/// between the retrier and the client layer that fails with an error of its own, such as a
/// `tower::timeout::Timeout` outside `ClientLayer`, hides the key the same way: put such limits
/// on the client layer itself, with [`attempt_timeout`](super::ClientLayer::attempt_timeout)
/// and [`deadline`](super::ClientLayer::deadline). `ServiceBuilder::retry` needs tower's
/// feature `retry`, which the crate's `client` turns on.
///
/// ```
/// use tower::retry::Policy;
/// use tower_idempotency_client::{ClientLayer, SameKey};
///
/// # fn build<P: Clone, S>(policy: P, http: S) {
/// // `policy` is the outer retrier's own `tower::retry::Policy`.
/// let client = tower::ServiceBuilder::new()
///     .retry(SameKey(policy))
///     .layer(ClientLayer::new())
///     .service(http);
/// # drop(client);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SameKey<P>(pub P);

impl<P, B, Res> tower::retry::Policy<http::Request<B>, http::Response<Res>, BoxError> for SameKey<P>
where
    P: tower::retry::Policy<http::Request<B>, http::Response<Res>, BoxError>,
{
    type Future = P::Future;

    fn retry(
        &mut self,
        request: &mut http::Request<B>,
        result: &mut Result<http::Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let key = match result {
            Ok(response) => response.extensions().get::<IntentKey>().cloned(),
            Err(error) => error
                .downcast_ref::<GaveUp>()
                .and_then(|gave_up| gave_up.key.clone()),
        };
        if let Some(key) = key {
            request.extensions_mut().insert(key);
        }
        self.0.retry(request, result)
    }

    fn clone_request(&mut self, request: &http::Request<B>) -> Option<http::Request<B>> {
        self.0.clone_request(request)
    }
}

/// A client layer's settings, shared by its clones and the services it builds.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) methods: Vec<Method>,
    pub(super) max_attempts: u32,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) deadline: Option<Duration>,
    pub(super) backoff: (Duration, Duration),
    pub(super) retry_after_cap: Duration,
    /// The server's replay window, when it is known beforehand.
    pub(super) replay_window: Option<Duration>,
    pub(super) body_limit: usize,
    pub(super) budget: Arc<TpsBudget>,
    pub(super) metrics: Metrics,
}

impl Settings {
    /// Whether requests of `method` get a key and retries.
    pub(super) fn keys(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Counts an intent that may be retried into the budget: only those fund retries.
    pub(super) fn fund(&self) {
        self.budget.deposit();
    }
}

/// The key of a keyed request's intent, set in `headers` for every attempt: its own
/// `Idempotency-Key` header, else its [`IntentKey`] extension, else one made now.
pub(super) fn intent_key(headers: &mut HeaderMap, extensions: &Extensions) -> IntentKey {
    if let Some(header) = headers.get(&IDEMPOTENCY_KEY) {
        return IntentKey(header.clone());
    }
    let key = extensions
        .get::<IntentKey>()
        .map_or_else(new_key, |key| key.0.clone());
    headers.insert(IDEMPOTENCY_KEY, key.clone());
    IntentKey(key)
}

/// The attempts of one request: which one is next, and whether and when there is one.
pub(super) struct Retries<'a> {
    settings: &'a Settings,
    started: tokio::time::Instant,
    /// When the first attempt was sent, as every retry says it.
    first_sent: std::time::SystemTime,
    attempt: u32,
    /// The server's replay window: advertised by its latest answer, or set.
    window: Option<Duration>,
}

impl<'a> Retries<'a> {
    /// The first attempt, now.
    pub(super) fn start(settings: &'a Settings) -> Self {
        Self {
            settings,
            started: tokio::time::Instant::now(),
            first_sent: std::time::SystemTime::now(),
            attempt: 1,
            window: settings.replay_window,
        }
    }

    /// Reads the replay window an answer advertises (`Idempotency-TTL`, whole seconds); the
    /// shorter of it and the one set is kept.
    pub(super) fn learn(&mut self, headers: &HeaderMap) {
        let advertised = headers
            .get(&crate::IDEMPOTENCY_TTL)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        if let Some(advertised) = advertised {
            self.window = Some(match self.settings.replay_window {
                Some(set) => set.min(advertised),
                None => advertised,
            });
        }
    }

    /// Sets, on a retry of a keyed request, when the intent was first sent
    /// (`Repeatability-First-Sent`, an HTTP date): a server that keeps nothing past its window
    /// can still refuse a retry that comes after it.
    pub(super) fn mark(&self, headers: &mut HeaderMap) {
        // A clock before 1970 has no HTTP date (the formatter would panic): nothing is said.
        let dated = self
            .first_sent
            .duration_since(std::time::UNIX_EPOCH)
            .is_ok();
        if self.attempt > 1 && dated {
            let date = httpdate::fmt_http_date(self.first_sent);
            if let Ok(date) = HeaderValue::try_from(date) {
                headers.insert(crate::REPEATABILITY_FIRST_SENT, date);
            }
        }
    }

    /// The attempt being made, from 1.
    pub(super) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The time left before the deadline, if there is one.
    pub(super) fn left(&self) -> Option<Duration> {
        let deadline = self.settings.deadline?;
        Some(deadline.saturating_sub(self.started.elapsed()))
    }

    /// The time this attempt may take: its own timeout or the rest of the deadline, whichever
    /// is shorter. Counts the attempt as sent.
    pub(super) fn send(&self) -> Option<Duration> {
        self.settings.metrics.attempt(self.attempt > 1);
        match (self.settings.attempt_timeout, self.left()) {
            (Some(own), Some(left)) => Some(own.min(left)),
            (own, left) => own.or(left),
        }
    }

    /// After an attempt decided so, the wait before the next one, or why there is none: the
    /// answer is final, the attempts or the time ran out, or the budget refused.
    pub(super) fn wait_after(&self, decision: Decision) -> Result<Duration, Stop> {
        let Decision::Retry { after } = decision else {
            return Err(Stop::Final);
        };
        let settings = self.settings;
        let wait = jitter(settings.backoff, self.attempt).max(after.unwrap_or_default());
        if let Some(window) = self.window
            && self.started.elapsed().saturating_add(wait) >= window
        {
            return Err(Stop::Lifetime { window });
        }
        // The budget is asked last: a retry the cap or the deadline forbids takes nothing.
        if self.attempt >= settings.max_attempts {
            return Err(Stop::AttemptCap);
        }
        if self.left().is_some_and(|left| wait >= left) {
            return Err(Stop::Deadline);
        }
        if !settings.budget.withdraw() {
            settings.metrics.budget_refused();
            return Err(Stop::Budget);
        }
        Ok(wait)
    }

    /// Waits `wait` for the next attempt.
    pub(super) async fn next(&mut self, wait: Duration) {
        tracing::debug!(attempt = self.attempt, ?wait, "retrying with the same key");
        tokio::time::sleep(wait).await;
        self.attempt += 1;
    }

    /// `future`'s output, unless the deadline passes first: then the request's end, saying
    /// what it was `doing`.
    pub(super) async fn within<F: Future>(
        &self,
        doing: &'static str,
        future: F,
    ) -> Result<F::Output, BoxError> {
        match self.left() {
            Some(left) => tokio::time::timeout(left, future)
                .await
                .map_err(|_| format!("the deadline passed {doing}").into()),
            None => Ok(future.await),
        }
    }
}

/// A random share of the backoff's ceiling for `attempt`, which is 1 for the first retry: full
/// jitter.
fn jitter((base, max): (Duration, Duration), attempt: u32) -> Duration {
    let ceiling = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(max);
    let share = (random() >> 11) as f64 / (1u64 << 53) as f64;
    ceiling.mul_f64(share)
}

/// A new key: 128 random bits as 32 hexadecimal characters.
fn new_key() -> HeaderValue {
    let bits = (u128::from(random()) << 64) | u128::from(random());
    let text = format!("{bits:032x}");
    HeaderValue::try_from(text).expect("hexadecimal digits are a header value")
}

/// 64 random bits: the process's keyed hash of a counter, with a fresh secret key per process
/// from the operating system's randomness.
fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static STATE: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    let state = STATE.get_or_init(std::hash::RandomState::new);
    state.hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_under_a_ceiling_that_doubles_up_to_the_cap() {
        let backoff = (Duration::from_millis(100), Duration::from_secs(1));
        for attempt in 1..30 {
            let ceiling = Duration::from_millis(100 << (attempt - 1).min(20)).min(backoff.1);
            let waits: Vec<_> = (0..200).map(|_| jitter(backoff, attempt)).collect();
            assert!(waits.iter().all(|wait| *wait <= ceiling), "{attempt}");
            assert!(
                waits.iter().any(|wait| *wait > ceiling / 2),
                "{attempt}: spread"
            );
            assert!(
                waits.iter().any(|wait| *wait < ceiling / 2),
                "{attempt}: spread"
            );
        }
    }

    #[test]
    fn keys_are_128_bits_in_hex_and_new_each_time() {
        let keys: std::collections::HashSet<_> = (0..1000).map(|_| new_key()).collect();
        assert_eq!(keys.len(), 1000);
        // Both halves random: the high one is not all zeros.
        let high_zero = |key: &HeaderValue| key.to_str().unwrap().starts_with("0000000000000000");
        assert!(!keys.iter().all(high_zero));
        assert!(
            keys.iter().all(|key| key.len() == 32
                && key.to_str().unwrap().bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }
}
