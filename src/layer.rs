//! [`IdempotencyLayer`]: the configuration, and the [`Layer`] that builds the service.

pub use crate::body::{RequestBody, ResponseBody};
pub use crate::config::{
    DEFAULT_MAX_WAITING, DEFAULT_PENDING_RETRY_AFTER, DEFAULT_RESPONSE_LIMIT, DEFAULT_RETRY_AFTER,
    OtherPaths, StoredResponses,
};
pub use crate::drain::{Drain, Unfinished};
pub use crate::future::ResponseFuture;
pub use crate::service::Idempotency;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::request::Parts;
use tower::Layer;

use crate::admission::AlwaysAdmit;
use crate::config::{Config, PathSetting, Settings};
use crate::operation::Operation;
use crate::scope::{GlobalKeys, KeySpace, Scope, Scoped, Unscoped};
use crate::store::{Lease, Store};
use crate::tally::Bounded;

/// A [`Layer`] that makes a create endpoint idempotent.
///
/// It holds only configuration: the [`Store`], the [`Operation`], the
/// [`Admission`](crate::admission::Admission) policy, the key space, the guarded path, the
/// request body limit, the cap on a created response and which responses are stored. The
/// operation is what a create request means: [`JsonOperation`](crate::JsonOperation) for your
/// own JSON body, [`RawOperation`](crate::operation::RawOperation) for any bytes,
/// [`GrpcOperation`](crate::operation::GrpcOperation) for unary gRPC, or a strict contract such as
/// [`LabelContract`](crate::operation::LabelContract). The cap is 1 MiB by default.
///
/// # The key space is chosen, never assumed
///
/// Keys are chosen by clients, so two clients may pick the same one. Every layer says whose
/// keys they are before it can wrap a service: [`scope`](Self::scope) gives each tenant, owner
/// or client a key space of its own, and [`global_keys`](Self::global_keys) opts into one space
/// for everyone. The choice is a type, the last parameter `K`: a layer on which neither was
/// called does not implement [`Layer`], so forgetting it fails to compile rather than at
/// start-up.
///
/// ```compile_fail
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tower::{ServiceBuilder, service_fn};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
/// use tower_idempotency::layer::RequestBody;
///
/// let create = service_fn(|_: Request<RequestBody<String>>| async {
///     Ok::<_, Infallible>(Response::new(String::new()))
/// });
/// // Neither `.scope(…)` nor `.global_keys()`: this does not compile.
/// let service = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()))
///     .service(create);
/// ```
///
/// # Example
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
/// use tower_idempotency::layer::RequestBody;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|_: Request<RequestBody<String>>| async move {
///     Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(String::from("{}")).unwrap())
/// });
/// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
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
pub struct IdempotencyLayer<St, O, A = AlwaysAdmit, K = Unscoped> {
    store: St,
    operation: O,
    admission: A,
    keys: K,
    config: Config,
}

impl<St: Store, O: Operation> IdempotencyLayer<St, O> {
    /// A layer over `store` for `operation`, admitting every operation. Choose its key space
    /// next: [`scope`](Self::scope) or [`global_keys`](Self::global_keys).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// #[derive(Clone, serde::Deserialize)]
    /// struct NewOrder { sku: String }
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::<NewOrder>::typed())
    ///     .global_keys();
    /// # drop(layer);
    /// ```
    pub fn new(store: St, operation: O) -> Self {
        Self {
            store,
            operation,
            admission: AlwaysAdmit,
            keys: Unscoped,
            config: Config::default(),
        }
    }
}

impl<St, O, A> IdempotencyLayer<St, O, A, Unscoped> {
    /// Takes a key scope, such as a tenant or an owner, from each request, so that every scope
    /// has a key space of its own; see the [`scope`](crate::scope) module. A request for which
    /// `scope` returns `None` is refused with the operation's *scope required* answer, `403`,
    /// before the store is touched.
    ///
    /// The middleware that puts the scope into the request, such as authentication, must run
    /// before this layer, that is wrap it: with axum, add it with `.layer(…)` after
    /// `.route_layer(idempotency)`; added before, it runs inside the route layer, after the
    /// scope was read, and every request is refused.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// /// Put into the request extensions by an authentication layer in front.
    /// #[derive(Clone)]
    /// struct Tenant(String);
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .scope(|parts: &http::request::Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
    /// # drop(layer);
    /// ```
    pub fn scope<F>(mut self, scope: F) -> IdempotencyLayer<St, O, A, Scoped>
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.scope = Some(Scope(Arc::new(scope)));
        self.with_keys(Scoped)
    }

    /// Opts into one key space for every client: a key sent by one client names the same
    /// operation for every other. Only safe when keys cannot collide across clients, as when
    /// they are random UUIDs, and a stored response may be read by anyone who knows its key.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys();
    /// # drop(layer);
    /// ```
    pub fn global_keys(self) -> IdempotencyLayer<St, O, A, GlobalKeys> {
        self.with_keys(GlobalKeys)
    }

    fn with_keys<K>(self, keys: K) -> IdempotencyLayer<St, O, A, K> {
        IdempotencyLayer {
            store: self.store,
            operation: self.operation,
            admission: self.admission,
            keys,
            config: self.config,
        }
    }
}

impl<St, O, A, K> IdempotencyLayer<St, O, A, K> {
    /// Sets the [`Admission`](crate::admission::Admission) policy asked after every new claim.
    ///
    /// ```
    /// use tower_idempotency::admission::ConcurrencyLimit;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys()
    ///     .admission(ConcurrencyLimit::new(4));
    /// # drop(layer);
    /// ```
    pub fn admission<B>(self, admission: B) -> IdempotencyLayer<St, O, B, K> {
        IdempotencyLayer {
            store: self.store,
            operation: self.operation,
            admission,
            keys: self.keys,
            config: self.config,
        }
    }

    /// Guards only `path`, compared exactly with the request's URI path; other paths get
    /// [`OtherPaths`]. The generic operations guard every path unless a path is set: the layer
    /// sits on the route. A strict contract may have a path of its own:
    /// [`LabelContract`](crate::operation::LabelContract) guards `/labels` unless told
    /// otherwise.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).path("/v2/labels");
    /// # drop(layer);
    /// ```
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.config.path = PathSetting::Exact(path.into());
        self
    }

    /// Guards every path: for a layer on a route, as with axum's `route_layer`, where the
    /// router has matched already. The key space still holds the method and the concrete path.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).any_path();
    /// # drop(layer);
    /// ```
    pub fn any_path(mut self) -> Self {
        self.config.path = PathSetting::Any;
        self
    }

    /// Sets the request body limit in bytes. Default: the operation's, which is 16 KiB for the
    /// generic operations and 4096 for the [`LabelContract`](crate::operation::LabelContract).
    ///
    /// A declared `Content-Length` over it is refused at once; otherwise at most one byte past
    /// it is read before the `413`.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).body_limit(1024);
    /// # drop(layer);
    /// ```
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.config.body_limit = Some(limit);
        self
    }

    /// Sets the `Retry-After` of the refusals that ask a client to come back: admission's `429`
    /// and `503` and the store's `503 store_unavailable`, rounded up to whole seconds. Default
    /// [`DEFAULT_RETRY_AFTER`], 2 s, the label contract's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).retry_after(Duration::from_secs(5));
    /// # drop(layer);
    /// ```
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config.retry_after = after;
        self
    }

    /// Sets the `Retry-After` of a pending key's `409 request_pending`, rounded up to whole
    /// seconds, where the operation sends one. The generic operations do, as the IETF draft's
    /// peers and the payment protocols that cite it send one; the label contract's reply has
    /// none. Default [`DEFAULT_PENDING_RETRY_AFTER`], 1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).pending_retry_after(Duration::from_secs(3));
    /// # drop(layer);
    /// ```
    pub fn pending_retry_after(mut self, after: Duration) -> Self {
        self.config.pending_retry_after = after;
        self
    }

    /// Sets the shutdown handle of the layer's services: once the drain closes, a request that
    /// reaches its claim is refused with the operation's *store unavailable* answer, a `503`
    /// with `Retry-After`, and [`Drain::shutdown`](crate::layer::Drain::shutdown) waits for the
    /// requests past their claim to complete. See [`Drain`].
    ///
    /// ```
    /// use tower_idempotency::layer::Drain;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let drain = Drain::new();
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).drain(&drain);
    /// # drop(layer);
    /// ```
    pub fn drain(mut self, drain: &crate::drain::Drain) -> Self {
        self.config.drain = Some(drain.clone());
        self
    }

    /// Sets the cap, in bytes, on a created response the layer buffers and stores. Default
    /// 1 MiB, [`DEFAULT_RESPONSE_LIMIT`].
    ///
    /// A created response over the cap was a create that succeeded, and is answered so: the
    /// client gets it whole, its first bytes from the buffer and the rest streamed from the
    /// inner service, never buffered past the cap. Its key is completed, before the reply,
    /// with a compact record: the status and headers, no body, marked
    /// [`IDEMPOTENT_BODY_OMITTED`](crate::reply::IDEMPOTENT_BODY_OMITTED), which is what a
    /// retry gets. See [`StoredResponses`] for everything a create leaves.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).response_limit(16 * 1024);
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
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    /// use tower_idempotency::layer::OtherPaths;
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).other_paths(OtherPaths::PassThrough);
    /// # drop(layer);
    /// ```
    pub fn other_paths(mut self, other_paths: OtherPaths) -> Self {
        self.config.other_paths = other_paths;
        self
    }

    /// Which created responses are stored; default [`StoredResponses::Every`], or
    /// [`StoredResponses::ExceptServerErrors`] on a transactional store (see
    /// [`StoredResponses::default_for`]).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    /// use tower_idempotency::layer::StoredResponses;
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys()
    ///     .store_responses(StoredResponses::Successful);
    /// # drop(layer);
    /// ```
    pub fn store_responses(mut self, stored: StoredResponses) -> Self {
        self.config.stored = Some(stored);
        self
    }

    /// Headers of a created response that are not stored, and so never replayed, beside the
    /// hop-by-hop ones that never are. Adds to the list.
    ///
    /// ```
    /// use http::header::SET_COOKIE;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).exclude_headers([SET_COOKIE]);
    /// # drop(layer);
    /// ```
    pub fn exclude_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.excluded_headers.extend(names);
        self
    }

    /// Advertises the store's replay window on every answer to a guarded request (the create,
    /// a replay, a refusal) in the header `name`, in whole seconds, rounded down (at least one); `None` sends
    /// none. By default the operation says
    /// ([`Operation::advertises_window`]): the
    /// generic operations send [`IDEMPOTENCY_TTL`](crate::reply::IDEMPOTENCY_TTL), the label
    /// contract none. The window is the store's retention
    /// ([`Store::replay_window`]); a store that keeps
    /// records until they are forgotten has none to advertise. Publish the same window where
    /// clients read an API's rules before they call it, in its OpenAPI description (the
    /// header on each create's responses, and the window in its description).
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderName;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let store = MemoryStore::builder().retention(Duration::from_secs(3600)).build();
    /// // `Idempotency-Key-Lifetime: 3600` on every answer, in place of `Idempotency-TTL`.
    /// let name = HeaderName::from_static("idempotency-key-lifetime");
    /// let layer = IdempotencyLayer::new(store, JsonOperation::new()).window_header(Some(name));
    /// # drop(layer);
    /// ```
    pub fn window_header(mut self, name: Option<HeaderName>) -> Self {
        self.config.window_header = Some(name);
        self
    }

    /// Refuses a retry whose first attempt is older than the store's replay window with the
    /// operation's *key expired* answer (`409`, problem type `key_expired`, no `Retry-After`)
    /// where it would create: when the store kept nothing of the key, such a retry is never
    /// created a second time (its claim is released). A key whose record the store still keeps
    /// answers as ever (a replay, a conflict). A retry says when its intent was first sent in
    /// [`REPEATABILITY_FIRST_SENT`](crate::reply::REPEATABILITY_FIRST_SENT), an HTTP date, as
    /// the crate's client layer does on every retry; a request without it, or with one that is
    /// not a date, is claimed as any other. Off by default; a store that keeps records until
    /// they are forgotten has no window to refuse by.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .refuse_past_window(true);
    /// # drop(layer);
    /// ```
    pub fn refuse_past_window(mut self, refuse: bool) -> Self {
        self.config.refuse_past_window = refuse;
        self
    }

    /// Whether a key whose replay window passed, and which the store still remembers (its
    /// [`Tombstone`](crate::store::Tombstone), kept for the store's
    /// [tombstone window](crate::store::StoreOptions::tombstones)), is answered *key expired*
    /// (`409`, problem type `key_expired` with the members `completed_at` and `location`, no
    /// `Retry-After`: final) rather than created again. As the operation says by default
    /// ([`Operation::answers_expired`]): `true`,
    /// except for the label contract, whose keys are new past their window. With `false`,
    /// a claim treats the tombstone as no record and creates.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::operation::LabelContract;
    ///
    /// // The label contract, answering `{"error":"key_expired"}` for a key it remembers.
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).answer_expired(true);
    /// # drop(layer);
    /// ```
    pub fn answer_expired(mut self, answer: bool) -> Self {
        self.config.answer_expired = Some(answer);
        self
    }

    /// Adds `Idempotent-Replayed: true` to every replayed response. Off by default: the
    /// contract replays the stored headers exactly, and the marker is one header more.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).mark_replays(true);
    /// # drop(layer);
    /// ```
    pub fn mark_replays(mut self, mark: bool) -> Self {
        self.config.mark_replays = mark;
        self
    }

    /// Also puts each guarded response's [`Outcome`](crate::reply::Outcome) into its extensions, for
    /// an outer layer that sees the response after its body was replaced, such as an axum
    /// middleware. Off by default: the outcome is always on the layer's own body, as
    /// [`ResponseBody::outcome`](crate::body::ResponseBody::outcome), for free, while the first
    /// extension of a response costs three allocations.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).outcome_extension(true);
    /// # drop(layer);
    /// ```
    pub fn outcome_extension(mut self, insert: bool) -> Self {
        self.config.outcome_extension = insert;
        self
    }

    /// Whether the inner service gets the operation's value, such as a typed body or a
    /// [`LabelOperation`](crate::operation::LabelOperation), in the request extensions.
    ///
    /// By default the operation decides, with [`Operation::hands_over_value`]. A body typed
    /// with [`JsonOperation::typed`](crate::JsonOperation::typed) is handed over, and its
    /// handler writes `Extension<T>`. [`JsonOperation::new`](crate::JsonOperation::new),
    /// [`RawOperation`](crate::operation::RawOperation), [`GrpcOperation`](crate::operation::GrpcOperation) and the
    /// [`LabelContract`](crate::operation::LabelContract) hand no value over: their handlers
    /// read the body, and a request's first extension costs three allocations. (The validated
    /// [`IdempotencyKey`](crate::operation::IdempotencyKey) is in the extensions whatever this
    /// says.) `true` hands the
    /// value over whatever the operation says, so the label contract's handler can then take
    /// `Extension<LabelOperation>`; `false` never. An inner service that expects a value it is
    /// not given, such as axum's `Extension`, fails its create: a `500 create_failed`, the key
    /// left pending.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    /// use tower_idempotency::operation::LabelContract;
    ///
    /// // The handler takes `Extension<LabelOperation>`.
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).value_extension(true);
    /// # drop(layer);
    /// ```
    pub fn value_extension(mut self, insert: bool) -> Self {
        self.config.value_extension = Some(insert);
        self
    }

    /// Records the store key on each request's tracing span. Off by default: a key can be
    /// personal data, so traces carry only the fingerprint, never the body.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).trace_keys(true);
    /// # drop(layer);
    /// ```
    pub fn trace_keys(mut self, trace: bool) -> Self {
        self.config.trace_keys = trace;
        self
    }

    /// The lease of each reservation: while the create runs, the layer renews it with
    /// [`Store::renew`] every third of `lease`. So a pending key whose lease lapsed was
    /// abandoned, its process having died mid-create, and one whose lease did not lapse is in
    /// progress; the `idempotency_keys` tool (the `idempotency-keys` crate) and
    /// [`Operator::inspect`](crate::store::Operator::inspect) show which. Default
    /// [`Lease::DEFAULT_DURATION`], thirty seconds; at least [`Lease::MIN_DURATION`]. A create
    /// that finishes within a third of the lease costs no renewal. Keep it at three times the
    /// store's timeout or more: a renewal may take that long. The renewals need Tokio's timer;
    /// without one the lease is not renewed, and a warning is logged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).lease(Duration::from_secs(10));
    /// # drop(layer);
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        let take_over = self.config.decision.lease.takes_over();
        self.config.decision.lease = Lease::new(lease);
        if take_over {
            self.config.decision.lease = self.config.decision.lease.take_over_abandoned();
        }
        self
    }

    /// Lets a request take over a key whose first attempt was abandoned, and create anew.
    /// Abandoned means no renewal within the [lease](Self::lease): its process died, or the
    /// create panicked. Off by default: an abandoned create may have taken effect, so by
    /// default its key stays pending until an operator resolves it, and the create runs at most
    /// once. Turn it on only for operations that are safe to run twice; with it, a create runs
    /// at least once. A conflicting request is still a conflict, and the abandoned owner can no
    /// longer complete: every write is fenced by its reservation. A key is taken over only if
    /// the layer that claimed it allowed it too, so a layer without this setting sharing the
    /// store keeps its keys at most once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .lease(Duration::from_secs(10))
    ///     .take_over_abandoned();
    /// # drop(layer);
    /// ```
    pub fn take_over_abandoned(mut self) -> Self {
        self.config.decision.lease = self.config.decision.lease.take_over_abandoned();
        self
    }

    /// Lets a request whose key is pending, with the first attempt of the same operation still
    /// creating, wait up to `wait` for that attempt to complete, and answer with its stored
    /// response exactly as a replay would. A wait that runs out answers `409 request_pending`
    /// as without the setting; if the first attempt is released meanwhile, because admission
    /// refused it, a waiting request claims the key anew and at most one of them creates. A
    /// conflicting request never waits. Off by default: the contract's immediate `409`.
    ///
    /// Waiting is woken by the completion itself where the store notifies through
    /// [`Store::changed`], as the memory, Redis and PostgreSQL stores do; else the store is
    /// looked at again every [`CHANGE_POLL_INTERVAL`](crate::store::CHANGE_POLL_INTERVAL). At
    /// most [`max_waiting`](Self::max_waiting) requests of a layer wait at once; beyond, the
    /// immediate `409`. A waiting request whose client goes away leaves nothing behind.
    ///
    /// The bound is on the waiting: a look at the store that began before it ran out is
    /// finished, and may claim, so a slow store can add up to its own timeout to `wait`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).pending_wait(Duration::from_secs(5));
    /// # drop(layer);
    /// ```
    pub fn pending_wait(mut self, wait: Duration) -> Self {
        self.config.decision.pending_wait = Some(wait);
        self
    }

    /// The most requests of this layer that [`pending_wait`](Self::pending_wait) lets wait for
    /// a pending key at once, across every service it builds and the layer's clones. Default
    /// [`DEFAULT_MAX_WAITING`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .pending_wait(Duration::from_secs(5))
    ///     .max_waiting(100);
    /// # drop(layer);
    /// ```
    pub fn max_waiting(mut self, max: usize) -> Self {
        self.config.waiting = Arc::new(Bounded::waiting(max));
        self
    }

    /// The `layer` label of this layer's [metrics](crate::metrics), with the feature `metrics`:
    /// `"default"` unless set. Give each guarded endpoint its own, to tell their series apart.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
    ///     .global_keys()
    ///     .metrics_label("payments");
    /// # drop(layer);
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.config.metrics = crate::metrics::Metrics::new(label.into());
        self
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }
}

/// Only a layer whose key space was chosen, with [`scope`](IdempotencyLayer::scope) or
/// [`global_keys`](IdempotencyLayer::global_keys), wraps services.
impl<S, St, O, A, K> Layer<S> for IdempotencyLayer<St, O, A, K>
where
    St: Store + Clone,
    O: Operation,
    A: Clone,
    K: KeySpace,
{
    type Service = Idempotency<S, St, O, A>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(
            inner,
            self.store.clone(),
            self.admission.clone(),
            Arc::new(Settings::new(
                self.operation.clone(),
                &self.config,
                self.store.replay_window(),
            )),
        )
    }
}
