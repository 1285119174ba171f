//! The one configuration room: what a layer is configured with ([`Config`], the decision's
//! [`Options`] nested in it), what every service of the layer shares once it is built
//! ([`Settings`], behind one `Arc`), and what a decision reads, whoever runs it ([`Rules`]:
//! the layer's services, or [`Idempotent`](crate::Idempotent)). A new option is a field of
//! `Config` (or of `Options`, if the decision reads it), with its default, and the method that
//! sets it.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::body::ResponseBody;
use crate::drain::Drain;
use crate::metrics::Metrics;
use crate::operation::Operation;
use crate::reply::{Rejection, RetryAfter};
use crate::scope::Scope;
use crate::store::Lease;
use crate::tally::{Bounded, Tally};

/// The default cap on requests of one layer waiting for a pending key at once
/// ([`IdempotencyLayer::max_waiting`](crate::IdempotencyLayer::max_waiting)).
pub const DEFAULT_MAX_WAITING: usize = 1_000;

/// The most lost store answers one layer settles at once (each a task that holds a key and
/// maybe a response, and calls the store every second, then every five seconds, for up to
/// five minutes), so that a long outage under load cannot pile them up: past it, a lost
/// answer is not settled and its key is left to the operator.
pub(crate) const MAX_SETTLING: usize = 10_000;

/// The default cap on a created response the layer buffers and stores, in bytes.
pub const DEFAULT_RESPONSE_LIMIT: usize = 1024 * 1024;

/// The default `Retry-After` of the refusals that ask a client to come back: admission's
/// (`429`, `503`) and the store's (`503 store_unavailable`).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The default `Retry-After` of a pending key's `409`, where the operation sends one (the
/// generic operations do; the label contract's reply has none).
pub const DEFAULT_PENDING_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `duration` as a `Retry-After` value: whole seconds, rounded up.
fn seconds(duration: Duration) -> HeaderValue {
    let whole = duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0));
    HeaderValue::from(whole)
}

/// What the layer does with a request on a path other than the guarded one, when a path is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OtherPaths {
    /// Reply `404`, as the contract says. The default, for a layer that wraps only the create
    /// endpoint.
    #[default]
    NotFound,
    /// Hand the request to the inner service untouched, for a stack-wide `.layer()` where other
    /// routes live.
    PassThrough,
}

/// Which created responses the layer stores (and so replays).
///
/// # A create that fails
///
/// A create that fails without an answer (the inner service returns an error or panics, or
/// its response body fails within the cap) leaves its key taken under every setting, since it
/// may have taken effect, and the client gets the operation's *create failed* answer (`500`)
/// (only a store that undoes the create, `TransactionalPostgresStore` (feature `postgres`) or
/// `TransactionalMySqlStore` (feature `mysql`), frees the key of a create that failed, since
/// nothing of it remains). A create that answers is stored and replayed, whatever its status,
/// under [`Every`](Self::Every); under [`Successful`](Self::Successful) an answer other than
/// `2xx`, and under [`ExceptServerErrors`](Self::ExceptServerErrors) a `5xx`, is passed on
/// unstored and its key released, so a retry creates anew.
///
/// The default is [`Every`](Self::Every), except on a store whose release undoes the
/// create's writes ([`Store::release_undoes_create`](crate::store::Store::release_undoes_create):
/// the transactional stores), where it is [`ExceptServerErrors`](Self::ExceptServerErrors):
/// a handler that wrote its row in the claim's transaction and then answered `500` leaves
/// nothing, and the key is free; a `2xx` or a `4xx` commits and is replayed. A rollback undoes
/// only what went through the transaction: a handler whose `5xx` may follow an effect outside
/// it (a payment API that timed out, a mail sent) answers otherwise, or keeps
/// [`Every`](Self::Every), so that its retry replays rather than repeats that effect.
/// [`IdempotencyLayer::store_responses`](crate::IdempotencyLayer::store_responses) chooses
/// otherwise (`Every` keeps a transactional store's `5xx` too, committed with its writes).
///
/// # A response over the cap
///
/// A create that answers with a response over the
/// [cap](crate::IdempotencyLayer::response_limit) succeeded, and is stored and answered as
/// one: the client gets the response whole (streamed past the cap, not buffered), and the key
/// is completed with a compact record, its status and headers with an empty body and
/// [`Idempotent-Body-Omitted: true`](crate::reply::IDEMPOTENT_BODY_OMITTED), which a retry
/// gets: the original status and `Location`, never a second create nor a pending key. The
/// transactional store commits it as any other. The key is completed before the rest of the
/// body is read: a body that fails past the cap breaks off the first client's transfer, while
/// its key is completed already and a retry gets the compact record. So a create's effects
/// must be done when it answers: in the transactional store, a write made through its
/// `PgTransaction` while the body streams fails, the transaction having committed, and a body
/// that holds the transaction's connection while it streams is a failed create at once
/// (`500 create_failed`, nothing committed, the key free), never a wait for the store's
/// timeout. Only a
/// body that goes past the size its own size hint declared is a failed create (*response too
/// large*, `500`, the key pending).
///
/// (This is the one place that says it; the crate's tests hold every case:
/// `a_failed_create_under_every_setting_error_answer_and_panic`.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredResponses {
    /// Every response of the create, whatever its status: the key is never free again. The
    /// default, and the only safe choice when a failed create may still have had an effect.
    #[default]
    Every,
    /// Only `2xx` responses; see [a create that fails](Self#a-create-that-fails). For
    /// services whose non-`2xx` answers provably leave no effect: nothing between the layer
    /// and the create may answer for it (a timeout inside that answers `408` or `503` after the
    /// create ran would let a retry create again).
    Successful,
    /// Every response but a server error (`5xx`), which is passed on unstored and its key
    /// released. The default on a store whose release undoes the create's writes (the
    /// transactional stores), where a `5xx` then leaves nothing; on any other store, only for
    /// services whose `5xx` answers provably leave no effect.
    ExceptServerErrors,
}

impl StoredResponses {
    /// The default on `store`: [`ExceptServerErrors`](Self::ExceptServerErrors) where a
    /// release undoes the create's writes, [`Every`](Self::Every) elsewhere.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::layer::StoredResponses;
    ///
    /// assert_eq!(StoredResponses::default_for(&MemoryStore::new()), StoredResponses::Every);
    /// ```
    pub fn default_for<St: crate::store::Store>(store: &St) -> Self {
        if store.release_undoes_create() {
            Self::ExceptServerErrors
        } else {
            Self::Every
        }
    }

    /// Whether a created response of `status` is stored.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_idempotency::layer::StoredResponses;
    ///
    /// assert!(StoredResponses::ExceptServerErrors.stores(StatusCode::CONFLICT));
    /// assert!(!StoredResponses::ExceptServerErrors.stores(StatusCode::BAD_GATEWAY));
    /// assert!(!StoredResponses::Successful.stores(StatusCode::CONFLICT));
    /// assert!(StoredResponses::Every.stores(StatusCode::BAD_GATEWAY));
    /// ```
    pub fn stores(self, status: http::StatusCode) -> bool {
        match self {
            Self::Every => true,
            Self::Successful => status.is_success(),
            Self::ExceptServerErrors => !status.is_server_error(),
        }
    }
}

/// Which paths the layer guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathSetting {
    /// The operation's [`default_path`](Operation::default_path).
    OperationDefault,
    /// Every path: the layer sits on a route.
    Any,
    /// Exactly this path.
    Exact(String),
}

/// The configuration a layer holds before it builds services. A new option is a field here,
/// with its default below, and the layer's method that sets it; an option the decision reads
/// (the lease, the wait for a pending key) is a field of the decision's `Options` instead, which this
/// holds as `decision`.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) path: PathSetting,
    pub(crate) body_limit: Option<usize>,
    pub(crate) response_limit: usize,
    pub(crate) other_paths: OtherPaths,
    pub(crate) scope: Option<Scope>,
    pub(crate) excluded_headers: Vec<HeaderName>,
    pub(crate) mark_replays: bool,
    pub(crate) outcome_extension: bool,
    /// Whether the value goes into the request extensions; `None`: as the operation says
    /// ([`Operation::hands_over_value`]).
    pub(crate) value_extension: Option<bool>,
    pub(crate) trace_keys: bool,
    /// `None`: as the store says ([`StoredResponses::default_for`]).
    pub(crate) stored: Option<StoredResponses>,
    /// What the decision reads as set: the lease, the wait for a pending key.
    pub(crate) decision: Options,
    /// Shared by every service the layer builds: the cap is the layer's.
    pub(crate) waiting: Arc<Bounded>,
    /// The layer's lost store answers being settled, bounded, shared as `waiting` is.
    pub(crate) settling: Arc<Bounded>,
    /// The layer's series, by its label.
    pub(crate) metrics: Metrics,
    /// The shutdown handle, if one is set.
    pub(crate) drain: Option<Drain>,
    /// The `Retry-After` of the refusals that say to come back (admission, store).
    pub(crate) retry_after: Duration,
    /// The `Retry-After` of a pending key's reply, where the operation sends one.
    pub(crate) pending_retry_after: Duration,
    /// Whether a retry whose first attempt (`Repeatability-First-Sent`) is older than the
    /// store's replay window is refused as expired.
    pub(crate) refuse_past_window: bool,
    /// The header that advertises the store's replay window: `None` as the operation says
    /// ([`Operation::advertises_window`]), `Some(None)` none, `Some(Some(name))` this one.
    pub(crate) window_header: Option<Option<HeaderName>>,
    /// Whether a key the store remembers past its replay window is answered expired: `None`
    /// as the operation says ([`Operation::answers_expired`]).
    pub(crate) answer_expired: Option<bool>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: PathSetting::OperationDefault,
            body_limit: None,
            response_limit: DEFAULT_RESPONSE_LIMIT,
            other_paths: OtherPaths::NotFound,
            scope: None,
            excluded_headers: Vec::new(),
            mark_replays: false,
            outcome_extension: false,
            value_extension: None,
            trace_keys: false,
            stored: None,
            decision: Options::default(),
            waiting: Arc::new(Bounded::waiting(DEFAULT_MAX_WAITING)),
            settling: Arc::new(Bounded::settling(MAX_SETTLING)),
            metrics: Metrics::default(),
            drain: None,
            retry_after: DEFAULT_RETRY_AFTER,
            pending_retry_after: DEFAULT_PENDING_RETRY_AFTER,
            window_header: None,
            refuse_past_window: false,
            answer_expired: None,
        }
    }
}

/// What every service of one layer shares: the operation, the layer's [`Config`] as it was
/// set, and what of it depends on the operation or is made once for every service.
#[derive(Debug)]
pub(crate) struct Settings<O> {
    pub(crate) operation: O,
    /// The options as the layer set them: a new option is read from here.
    pub(crate) config: Config,
    /// The guarded path: the one set, the operation's default, or any (`None`).
    pub(crate) path: Option<String>,
    /// The body limit set, or the operation's default.
    pub(crate) body_limit: usize,
    /// Whether the value goes into the request extensions, or the operation's default.
    pub(crate) value_extension: bool,
    /// What the decision reads: the lease, the wait, the series, the drain, and this layer's
    /// requests waiting and lost store answers being settled now, bounded.
    pub(crate) rules: Rules,
    /// The `Retry-After` values of the layer's replies, as header values.
    pub(crate) retry_after: RetryAfter,
    /// The header that advertises the store's replay window and its value, if the layer
    /// advertises it.
    pub(crate) window: Option<(HeaderName, HeaderValue)>,
    /// How long the store replays a completed create, if it says.
    pub(crate) replay_window: Option<Duration>,
}

impl<O: Operation> Settings<O> {
    /// `rejection` as this layer's operation writes it, with the layer's `Retry-After`.
    pub(crate) fn refuse<B>(&self, rejection: Rejection) -> http::Response<ResponseBody<B>> {
        // A path the layer does not guard is no guarded request: no window to advertise.
        let guarded = !matches!(rejection, Rejection::NotFound);
        let mut response = rejection.into_response(&self.operation, &self.retry_after);
        if guarded {
            self.advertise(&mut response);
        }
        response
    }

    /// Whether a request is a retry whose first attempt, as its `Repeatability-First-Sent` says
    /// (an HTTP date), is older than the store's replay window, when the layer refuses those.
    /// A request without the header, or with one that is not a date, is not.
    pub(crate) fn past_window(&self, headers: &http::HeaderMap) -> bool {
        let Some(window) = self
            .replay_window
            .filter(|_| self.config.refuse_past_window)
        else {
            return false;
        };
        headers
            .get(&crate::reply::REPEATABILITY_FIRST_SENT)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| httpdate::parse_http_date(value).ok())
            .and_then(|first| std::time::SystemTime::now().duration_since(first).ok())
            // An HTTP date is whole seconds, cut down: a second more before it counts as past.
            .is_some_and(|age| age > window.saturating_add(std::time::Duration::from_secs(1)))
    }

    /// Adds the replay window's header to an answer to a guarded request, if the layer
    /// advertises it.
    pub(crate) fn advertise<B>(&self, response: &mut http::Response<B>) {
        if let Some((name, value)) = &self.window {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
}

impl<O: Operation> Settings<O> {
    /// Resolves `config` for `operation`, over a store that replays completed records for
    /// `replay_window` (`None`: until they are forgotten, or it does not say).
    pub(crate) fn new(operation: O, config: &Config, replay_window: Option<Duration>) -> Self {
        let header = match &config.window_header {
            Some(header) => header.clone(),
            None => operation
                .advertises_window()
                .then_some(crate::reply::IDEMPOTENCY_TTL),
        };
        let window = header.zip(replay_window).map(|(name, window)| {
            // Whole seconds, rounded down (a client that retries up to the advertised second
            // is within the window), at least one; past what a store keeps, what it keeps.
            let seconds = window
                .min(tower_idempotency_core::MAX_RETENTION)
                .as_secs()
                .max(1);
            (name, HeaderValue::from(seconds))
        });
        let path = match &config.path {
            PathSetting::OperationDefault => operation.default_path().map(str::to_owned),
            PathSetting::Any => None,
            PathSetting::Exact(path) => Some(path.clone()),
        };
        let mut options = config.decision.clone();
        if !config
            .answer_expired
            .unwrap_or_else(|| operation.answers_expired())
        {
            options.lease = options.lease.forget_expired();
        }
        Self {
            path,
            body_limit: config
                .body_limit
                .unwrap_or_else(|| operation.default_body_limit()),
            value_extension: config
                .value_extension
                .unwrap_or_else(|| operation.hands_over_value()),
            rules: Rules {
                options,
                metrics: config.metrics.clone(),
                drain: config.drain.clone(),
                watch_client: true,
                waiting: Tally::new(&config.waiting, &config.metrics),
                settling: Tally::new(&config.settling, &config.metrics)
                    .with_drain(config.drain.clone()),
            },
            retry_after: RetryAfter {
                pending: seconds(config.pending_retry_after),
                refused: seconds(config.retry_after),
            },
            config: config.clone(),
            operation,
            window,
            replay_window,
        }
    }
}

/// The options a decision reads as they were set: a layer's, which its `Config` holds, or a
/// run's. An option the decision reads is a field here, with its default, and the method that
/// sets it (`IdempotencyLayer`'s, and `Idempotent`'s if runs take it too).
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// How long a claim holds its key, and whether an abandoned key is taken over.
    pub(crate) lease: Lease,
    /// How long a decision waits for a pending key's first attempt; `None`: not at all.
    pub(crate) pending_wait: Option<Duration>,
}

/// What the decision's steps read, whoever runs them: the options as set, the series, the
/// drain, and the bounded counts of waits and settlements.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) options: Options,
    pub(crate) metrics: Metrics,
    pub(crate) drain: Option<Drain>,
    /// Whether a wait for a pending key stops when the layer's client went away
    /// (the task-local `CLIENT_LEFT` the layer sets): the layer's decisions, not a run of
    /// the function API, which may be called from a guarded handler whose client left.
    pub(crate) watch_client: bool,
    /// The decisions waiting now for a pending key, bounded.
    pub(crate) waiting: Tally,
    /// The lost store answers being settled now, bounded.
    pub(crate) settling: Tally,
}
