//! [`IdempotencyLayer`]: the configuration, and the [`Layer`] that builds the service.

use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use tower::Layer;

use crate::admission::{Admission, AlwaysAdmit};
use crate::scope::Scope;
use crate::service::Idempotency;
use crate::store::Store;

/// The default path of the guarded create endpoint.
pub const DEFAULT_PATH: &str = "/labels";
/// The default request body limit, in bytes.
pub const DEFAULT_BODY_LIMIT: usize = 4096;
/// The default cap on a created response the layer buffers and stores, in bytes.
pub const DEFAULT_RESPONSE_LIMIT: usize = 64 * 1024;

/// What the layer does with a request on a path other than the guarded one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OtherPaths {
    /// Reply `404 {"error":"not_found"}`, as the contract says. The default, for a layer that
    /// wraps only the create endpoint.
    #[default]
    NotFound,
    /// Hand the request to the inner service untouched, for a stack-wide `.layer()` where other
    /// routes live.
    PassThrough,
}

/// The configuration every service of one layer shares.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) path: String,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) other_paths: OtherPaths,
    pub(crate) scope: Option<Scope>,
    pub(crate) excluded_headers: Vec<HeaderName>,
    pub(crate) mark_replays: bool,
    pub(crate) trace_keys: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: DEFAULT_PATH.to_owned(),
            body_limit: DEFAULT_BODY_LIMIT,
            response_limit: DEFAULT_RESPONSE_LIMIT,
            other_paths: OtherPaths::NotFound,
            scope: None,
            excluded_headers: Vec::new(),
            mark_replays: false,
            trace_keys: false,
        }
    }
}

/// A [`Layer`] that makes a create endpoint idempotent.
///
/// It holds only configuration: the [`Store`], the [`Admission`] policy, the guarded path
/// (default `/labels`), the request body limit (default 4096 bytes), the cap on a created
/// response (default 64 KiB), and what happens on [other paths](OtherPaths).
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, LabelOperation, MemoryStore, RequestBody};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|request: Request<RequestBody<String>>| async move {
///     let op = request.extensions().get::<LabelOperation>().unwrap().clone();
///     let mut response = Response::new(format!(r#"{{"request_id":"{}"}}"#, op.request_id));
///     *response.status_mut() = StatusCode::CREATED;
///     Ok::<_, Infallible>(response)
/// });
/// let service = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(MemoryStore::new()).path("/labels").body_limit(4096))
///     .service(create);
///
/// let attempt = LabelOperation::new("label-req-7", "parcel-42").attempt("/labels").unwrap();
/// let response = service.oneshot(attempt).await.unwrap();
/// assert_eq!(response.status(), StatusCode::CREATED);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<St, A = AlwaysAdmit> {
    pub(crate) store: St,
    pub(crate) admission: A,
    pub(crate) config: Config,
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store`, admitting every operation, with the contract's defaults.
    pub fn new(store: St) -> Self {
        Self {
            store,
            admission: AlwaysAdmit,
            config: Config::default(),
        }
    }
}

impl<St, A> IdempotencyLayer<St, A> {
    /// Sets the [`Admission`] policy asked after every new claim.
    ///
    /// ```
    /// use tower_idempotency::admission::ConcurrencyLimit;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).admission(ConcurrencyLimit::new(4));
    /// # drop(layer);
    /// ```
    pub fn admission<B: Admission>(self, admission: B) -> IdempotencyLayer<St, B> {
        IdempotencyLayer {
            store: self.store,
            admission,
            config: self.config,
        }
    }

    /// Sets the guarded path, compared exactly with the request's URI path. Default `/labels`.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).path("/v2/labels");
    /// # drop(layer);
    /// ```
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.config.path = path.into();
        self
    }

    /// Sets the request body limit in bytes. Default 4096.
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
        self.config.body_limit = limit;
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

    /// Sets what happens on paths other than the guarded one. Default [`OtherPaths::NotFound`].
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

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<S, St: Clone, A: Clone> Layer<S> for IdempotencyLayer<St, A> {
    type Service = Idempotency<S, St, A>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(
            inner,
            self.store.clone(),
            self.admission.clone(),
            Arc::new(self.config.clone()),
        )
    }
}
