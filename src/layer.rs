//! [`IdempotencyLayer`]: the configuration, and the [`Layer`] that builds the service.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use tower::Layer;

use crate::admission::AlwaysAdmit;
use crate::operation::{LabelContract, Operation};
use crate::scope::Scope;
use crate::service::Idempotency;
use crate::store::{Lease, Store};

/// The default cap on requests of one layer waiting for a pending key at once
/// ([`IdempotencyLayer::max_waiting`]).
pub const DEFAULT_MAX_WAITING: usize = 1_000;

/// The default cap on a created response the layer buffers and stores, in bytes.
pub const DEFAULT_RESPONSE_LIMIT: usize = 64 * 1024;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StoredResponses {
    /// Every response of the create, whatever its status: the key is never free again. The
    /// default, and the only safe choice when a failed create may still have had an effect.
    #[default]
    Every,
    /// Only `2xx` responses. After any other response the key is released, so a retry creates
    /// anew, and the response goes to the client as it is, unstored. For services whose
    /// non-`2xx` answers provably leave no effect: nothing between the layer and the create
    /// may answer for it (a timeout inside that answers `408` or `503` after the create ran
    /// would let a retry create again). An error of the inner service is no answer: the key
    /// stays taken, as with [`Every`](Self::Every).
    Successful,
}

/// Which paths the layer guards.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathSetting {
    /// The operation's [`default_path`](Operation::default_path).
    OperationDefault,
    /// Every path: the layer sits on a route.
    Any,
    /// Exactly this path.
    Exact(String),
}

/// The configuration a layer holds before it builds services.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    path: PathSetting,
    body_limit: Option<usize>,
    response_limit: usize,
    other_paths: OtherPaths,
    scope: Option<Scope>,
    global_keys: bool,
    excluded_headers: Vec<HeaderName>,
    mark_replays: bool,
    outcome_extension: bool,
    value_extension: bool,
    trace_keys: bool,
    stored: StoredResponses,
    lease: Lease,
    pending_wait: Option<Duration>,
    /// Shared by every service the layer builds: the cap is the layer's.
    waiting: Arc<Waiting>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: PathSetting::OperationDefault,
            body_limit: None,
            response_limit: DEFAULT_RESPONSE_LIMIT,
            other_paths: OtherPaths::NotFound,
            scope: None,
            global_keys: false,
            excluded_headers: Vec::new(),
            mark_replays: false,
            outcome_extension: false,
            value_extension: true,
            trace_keys: false,
            stored: StoredResponses::Every,
            lease: Lease::default(),
            pending_wait: None,
            waiting: Arc::new(Waiting::new(DEFAULT_MAX_WAITING)),
        }
    }
}

/// What every service of one layer shares: the operation and the settings, resolved.
#[derive(Debug)]
pub(crate) struct Settings<O> {
    pub(crate) operation: O,
    pub(crate) path: Option<String>,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) other_paths: OtherPaths,
    pub(crate) scope: Option<Scope>,
    pub(crate) excluded_headers: Vec<HeaderName>,
    pub(crate) mark_replays: bool,
    pub(crate) outcome_extension: bool,
    pub(crate) value_extension: bool,
    pub(crate) trace_keys: bool,
    pub(crate) stored: StoredResponses,
    pub(crate) lease: Lease,
    /// How long a request whose key is pending waits for the first attempt, if at all.
    pub(crate) pending_wait: Option<Duration>,
    /// The requests of this layer waiting now, bounded.
    pub(crate) waiting: Arc<Waiting>,
}

/// The requests of one layer waiting for a pending key, bounded.
#[derive(Debug)]
pub(crate) struct Waiting {
    max: usize,
    now: AtomicUsize,
}

impl Waiting {
    fn new(max: usize) -> Self {
        Self {
            max,
            now: AtomicUsize::new(0),
        }
    }

    /// A place among the waiting requests, if there is one.
    pub(crate) fn enter(&self) -> Option<WaitingSlot<'_>> {
        let taken = self.now.fetch_add(1, Ordering::AcqRel);
        if taken < self.max {
            Some(WaitingSlot(self))
        } else {
            self.now.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }
}

/// One place among a layer's waiting requests, given back when dropped.
pub(crate) struct WaitingSlot<'a>(&'a Waiting);

impl Drop for WaitingSlot<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<O: Operation> Settings<O> {
    /// Resolves `config` for `operation`.
    ///
    /// # Panics
    ///
    /// If the operation requires a scope and neither a scope nor global keys is configured.
    pub(crate) fn new(operation: O, config: &Config) -> Self {
        assert!(
            !operation.requires_scope() || config.scope.is_some() || config.global_keys,
            "this operation's keys are chosen by clients: set IdempotencyLayer::scope (a tenant \
             per request) or opt into one key space for every client with \
             IdempotencyLayer::global_keys"
        );
        let path = match &config.path {
            PathSetting::OperationDefault => operation.default_path().map(str::to_owned),
            PathSetting::Any => None,
            PathSetting::Exact(path) => Some(path.clone()),
        };
        Self {
            path,
            body_limit: config
                .body_limit
                .unwrap_or_else(|| operation.default_body_limit()),
            response_limit: config.response_limit,
            other_paths: config.other_paths,
            scope: config.scope.clone(),
            excluded_headers: config.excluded_headers.clone(),
            mark_replays: config.mark_replays,
            outcome_extension: config.outcome_extension,
            value_extension: config.value_extension,
            trace_keys: config.trace_keys,
            stored: config.stored,
            lease: config.lease,
            pending_wait: config.pending_wait,
            waiting: Arc::clone(&config.waiting),
            operation,
        }
    }
}

/// A [`Layer`] that makes a create endpoint idempotent.
///
/// It holds only configuration: the [`Store`], the [`Admission`](crate::Admission) policy, the [`Operation`]
/// (what a create request means: [`JsonOperation`](crate::JsonOperation) for your own JSON
/// body, [`RawOperation`](crate::RawOperation), or the lesson's [`LabelContract`], the
/// default), the guarded path, the request body limit, the cap on a created response (default
/// 64 KiB), the key scope, and which responses are stored.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore, RequestBody};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|_: Request<RequestBody<String>>| async move {
///     Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(String::from("{}")).unwrap())
/// });
/// let layer = IdempotencyLayer::with_operation(MemoryStore::new(), JsonOperation::new())
///     .scope(|parts: &http::request::Parts| {
///         parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
///     })
///     .body_limit(8 * 1024);
/// let service = ServiceBuilder::new().layer(layer).service(create);
///
/// let attempt = Request::post("/orders")
///     .header("content-type", "application/json")
///     .header("idempotency-key", "order-1")
///     .header("x-tenant", "acme")
///     .body(String::from(r#"{"sku":"A-1"}"#))
///     .unwrap();
/// let response = service.oneshot(attempt).await.unwrap();
/// assert_eq!(response.status(), StatusCode::CREATED);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<St, A = AlwaysAdmit, O = LabelContract> {
    pub(crate) store: St,
    pub(crate) admission: A,
    pub(crate) operation: O,
    pub(crate) config: Config,
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store` for the lesson's [`LabelContract`] (`POST /labels`, every byte
    /// fixed), admitting every operation. For your own endpoint, use
    /// [`with_operation`](Self::with_operation).
    pub fn new(store: St) -> Self {
        Self::with_operation(store, LabelContract)
    }
}

impl<St: Store, O: Operation> IdempotencyLayer<St, AlwaysAdmit, O> {
    /// A layer over `store` for `operation`, admitting every operation.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::with_operation(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys();
    /// # drop(layer);
    /// ```
    pub fn with_operation(store: St, operation: O) -> Self {
        Self {
            store,
            admission: AlwaysAdmit,
            operation,
            config: Config::default(),
        }
    }
}

impl<St, A, O> IdempotencyLayer<St, A, O> {
    /// Sets the [`Admission`](crate::Admission) policy asked after every new claim.
    ///
    /// ```
    /// use tower_idempotency::admission::ConcurrencyLimit;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).admission(ConcurrencyLimit::new(4));
    /// # drop(layer);
    /// ```
    pub fn admission<B>(self, admission: B) -> IdempotencyLayer<St, B, O> {
        IdempotencyLayer {
            store: self.store,
            admission,
            operation: self.operation,
            config: self.config,
        }
    }

    /// Sets the [`Operation`]: what a create request means.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore, RawOperation};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).operation(RawOperation::new()).global_keys();
    /// # drop(layer);
    /// ```
    pub fn operation<P: Operation>(self, operation: P) -> IdempotencyLayer<St, A, P> {
        IdempotencyLayer {
            store: self.store,
            admission: self.admission,
            operation,
            config: self.config,
        }
    }

    /// Guards only `path`, compared exactly with the request's URI path; other paths get
    /// [`OtherPaths`]. The [`LabelContract`] guards `/labels` unless told otherwise; the generic
    /// operations guard every path (the layer sits on the route) unless a path is set.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).path("/v2/labels");
    /// # drop(layer);
    /// ```
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.config.path = PathSetting::Exact(path.into());
        self
    }

    /// Guards every path: for a layer on a route (axum's `route_layer`), where the router has
    /// matched already. The key space still holds the method and the concrete path.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).any_path();
    /// # drop(layer);
    /// ```
    pub fn any_path(mut self) -> Self {
        self.config.path = PathSetting::Any;
        self
    }

    /// Sets the request body limit in bytes. Default: the operation's (4096 for the
    /// [`LabelContract`], 16 KiB for the generic operations).
    ///
    /// A declared `Content-Length` over it is refused at once; otherwise at most one byte past
    /// it is read before the `413`.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).body_limit(1024);
    /// # drop(layer);
    /// ```
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = Some(limit);
        self
    }

    /// Sets the cap, in bytes, on a created response the layer buffers and stores. Default
    /// 64 KiB. A response over it is not stored: the key stays pending and the client gets
    /// `500 {"error":"response_too_large"}`.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).response_limit(16 * 1024);
    /// # drop(layer);
    /// ```
    pub fn response_limit(mut self, limit: usize) -> Self {
        self.config.response_limit = limit;
        self
    }

    /// Sets what happens on paths other than the guarded one, when one is set. Default
    /// [`OtherPaths::NotFound`].
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore, OtherPaths};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).other_paths(OtherPaths::PassThrough);
    /// # drop(layer);
    /// ```
    pub fn other_paths(mut self, other_paths: OtherPaths) -> Self {
        self.config.other_paths = other_paths;
        self
    }

    /// Takes a key scope (a tenant, an owner) from each request, so that every scope has a key
    /// space of its own; see the [`scope`](crate::scope) module. A request for which `scope`
    /// returns `None` is refused with `403 {"error":"scope_required"}` before the store is
    /// touched.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// #[derive(Clone)]
    /// struct Tenant(String);
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new())
    ///     .scope(|parts: &http::request::Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
    /// # drop(layer);
    /// ```
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.scope = Some(Scope(Arc::new(scope)));
        self
    }

    /// Opts into one key space for every client: a key sent by one client names the same
    /// operation for every other. Only safe when keys cannot collide across clients (they are
    /// random UUIDs, say) and a stored response may be read by anyone who knows its key.
    /// Operations with client-chosen keys require this or a [`scope`](Self::scope): without
    /// either, building the service panics.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::with_operation(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys();
    /// # drop(layer);
    /// ```
    pub fn global_keys(mut self) -> Self {
        self.config.global_keys = true;
        self
    }

    /// Which created responses are stored; default [`StoredResponses::Every`].
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore, StoredResponses};
    ///
    /// let layer = IdempotencyLayer::with_operation(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys()
    ///     .store_responses(StoredResponses::Successful);
    /// # drop(layer);
    /// ```
    pub fn store_responses(mut self, stored: StoredResponses) -> Self {
        self.config.stored = stored;
        self
    }

    /// Headers of a created response that are not stored, and so never replayed, beside the
    /// hop-by-hop ones that never are. Adds to the list.
    ///
    /// ```
    /// use http::header::SET_COOKIE;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).exclude_headers([SET_COOKIE]);
    /// # drop(layer);
    /// ```
    pub fn exclude_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.excluded_headers.extend(names);
        self
    }

    /// Adds `Idempotent-Replayed: true` to every replayed response. Off by default: the
    /// contract replays the stored headers exactly, and the marker is one header more.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).mark_replays(true);
    /// # drop(layer);
    /// ```
    pub fn mark_replays(mut self, mark: bool) -> Self {
        self.config.mark_replays = mark;
        self
    }

    /// Also puts each guarded response's [`Outcome`](crate::Outcome) into its extensions, for
    /// an outer layer that sees the response after its body was replaced (an axum
    /// middleware, say). Off by default: the outcome is always on the layer's own body
    /// ([`ResponseBody::outcome`](crate::ResponseBody::outcome)), for free, while the first
    /// extension of a response costs three allocations.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).outcome_extension(true);
    /// # drop(layer);
    /// ```
    pub fn outcome_extension(mut self, insert: bool) -> Self {
        self.config.outcome_extension = insert;
        self
    }

    /// Whether the inner service gets the operation's value (a
    /// [`LabelOperation`](crate::LabelOperation), a typed body) in the request extensions.
    /// On by default; an inner service that reads the body itself (axum's `Json`, say) can
    /// turn it off and save the three allocations of a request's first extension. An inner
    /// service that still expects the value (axum's `Extension`) then fails its create: a
    /// `500 create_failed`, the key left pending.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).value_extension(false);
    /// # drop(layer);
    /// ```
    pub fn value_extension(mut self, insert: bool) -> Self {
        self.config.value_extension = insert;
        self
    }

    /// Records the store key on each request's tracing span. Off by default: a key can be
    /// personal data, so traces carry only the fingerprint, never the body.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).trace_keys(true);
    /// # drop(layer);
    /// ```
    pub fn trace_keys(mut self, trace: bool) -> Self {
        self.config.trace_keys = trace;
        self
    }

    /// The lease of each reservation: while the create runs, the layer renews it every
    /// third of `lease` ([`Store::renew`]), so a pending key whose lease lapsed was abandoned
    /// (its process died mid-create) and one that did not is in progress; the
    /// `idempotency_keys` example and [`Operator::inspect`](crate::store::Operator::inspect)
    /// show which. Default [`Lease::DEFAULT`] (thirty seconds); at least [`Lease::MIN`]. A
    /// create that finishes within a third of the lease costs no renewal. Keep it at three
    /// times the store's timeout or more: a renewal may take that long. The renewals need
    /// Tokio's timer; without one the lease is not renewed (and a warning is logged).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(10));
    /// # drop(layer);
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        let take_over = self.config.lease.takes_over();
        self.config.lease = Lease::new(lease);
        if take_over {
            self.config.lease = self.config.lease.take_over_abandoned();
        }
        self
    }

    /// Lets a request take over a key whose first attempt was abandoned (no renewal within
    /// the [lease](Self::lease): its process died, or the create panicked): it creates anew.
    /// Off by default: an abandoned create may have taken effect, so by default its key stays
    /// pending (at most once) until an operator resolves it. Turn it on only for operations
    /// that are safe to run twice (at least once); a conflicting request is still a conflict,
    /// and the abandoned owner can no longer complete (every write is fenced by its
    /// reservation). A key is taken over only if the layer that claimed it allowed it too, so
    /// a layer without this setting sharing the store keeps its keys at most once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new())
    ///     .lease(Duration::from_secs(10))
    ///     .take_over_abandoned();
    /// # drop(layer);
    /// ```
    pub fn take_over_abandoned(mut self) -> Self {
        self.config.lease = self.config.lease.take_over_abandoned();
        self
    }

    /// Lets a request whose key is pending (its first attempt still creating, same
    /// operation) wait up to `wait` for that attempt to complete, and answer with its stored
    /// response exactly as a replay would. A wait that runs out answers `409
    /// request_pending` as without the setting; if the first attempt is released meanwhile
    /// (admission refused it), a waiting request claims the key anew and at most one of them
    /// creates. A conflicting request never waits. Off by default: the contract's immediate
    /// `409`.
    ///
    /// Waiting is woken by the completion itself where the store notifies
    /// ([`Store::changed`]: the memory, Redis and PostgreSQL stores do), else the store is
    /// looked at again every [`CHANGE_POLL_INTERVAL`](crate::store::CHANGE_POLL_INTERVAL).
    /// At most [`max_waiting`](Self::max_waiting) requests of a layer wait at once; beyond,
    /// the immediate `409`. A waiting request whose client goes away leaves nothing behind.
    ///
    /// The bound is on the waiting: a look at the store that began before it ran out is
    /// finished (it may claim), so a slow store can add up to its own timeout to `wait`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).pending_wait(Duration::from_secs(5));
    /// # drop(layer);
    /// ```
    pub fn pending_wait(mut self, wait: Duration) -> Self {
        self.config.pending_wait = Some(wait);
        self
    }

    /// The most requests of this layer waiting for a pending key at once
    /// ([`pending_wait`](Self::pending_wait)), across every service it builds (and the
    /// layer's clones). Default [`DEFAULT_MAX_WAITING`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new())
    ///     .pending_wait(Duration::from_secs(5))
    ///     .max_waiting(100);
    /// # drop(layer);
    /// ```
    pub fn max_waiting(mut self, max: usize) -> Self {
        self.config.waiting = Arc::new(Waiting::new(max));
        self
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }
}

/// # Panics
///
/// If the operation requires a scope and the layer has neither a [scope](IdempotencyLayer::scope)
/// nor [global keys](IdempotencyLayer::global_keys): a configuration error, found when the
/// service is built (at start-up), never on a request.
impl<S, St: Clone, A: Clone, O: Operation> Layer<S> for IdempotencyLayer<St, A, O> {
    type Service = Idempotency<S, St, A, O>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(
            inner,
            self.store.clone(),
            self.admission.clone(),
            Arc::new(Settings::new(self.operation.clone(), &self.config)),
        )
    }
}
