//! [`Idempotency`]: the service that guards the create.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use crate::admission::{Admission, AlwaysAdmit};
use crate::body::{Collector, RequestBody, ResponseBody};
use crate::config::Settings;
use crate::future::ResponseFuture;
use crate::operation::Head;
use crate::operation::Operation;
use crate::pipeline::{self, Pipeline};
use tower::BoxError;

use crate::store::Store;

/// The middleware service built by [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// It checks the request head, reads the body up to the limit, has the [`Operation`] parse it
/// into a key, a fingerprint and a value, claims the key in the store, asks admission, calls
/// the inner service to create, completes the record, and only then replies with the stored
/// response. The inner service receives the body bytes and the operation's value in the
/// request extensions.
///
/// Every refusal, store failure and create failure is a response, never an error: the service's
/// error is the inner service's, and only a passed-through request can yield it.
///
/// Once the claim has started, it and everything after it run to their end even if the
/// response future is dropped (a client that went away): the rest moves to a Tokio task, so a
/// disconnect can neither leave a key pending nor cause a second create.
///
/// `poll_ready` is the inner service's: its backpressure reaches the caller.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_idempotency::layer::RequestBody;
/// use tower_idempotency::operation::LabelOperation;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::operation::LabelContract;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|_: Request<RequestBody<String>>| async {
///     Ok::<_, Infallible>(Response::builder().status(201).body(String::from("{}")).unwrap())
/// });
/// let service = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
///     .global_keys()
///     .layer(create);
///
/// let op = LabelOperation::new("label-req-7", "parcel-42");
/// let first = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// let again = service.oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// assert_eq!(first.status(), StatusCode::CREATED);
/// assert_eq!(again.status(), StatusCode::CREATED); // replayed, not created twice
/// # }
/// ```
#[derive(Debug)]
pub struct Idempotency<S, St, O, A = AlwaysAdmit> {
    inner: S,
    store: St,
    admission: A,
    settings: Arc<Settings<O>>,
}

impl<S: Clone, St: Clone, O, A: Clone> Clone for Idempotency<S, St, O, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: self.store.clone(),
            admission: self.admission.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S, St, O, A> Idempotency<S, St, O, A> {
    pub(crate) fn from_parts(
        inner: S,
        store: St,
        admission: A,
        settings: Arc<Settings<O>>,
    ) -> Self {
        Self {
            inner,
            store,
            admission,
            settings,
        }
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, O, A, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, St, O, A>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    St: Store,
    A: Admission<O::Value>,
    O: Operation,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, O, A, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let settings = &self.settings;
        let start = pipeline::head(settings, &parts);
        if let Head::PassThrough = start {
            let request = Request::from_parts(parts, RequestBody::inner(body));
            return ResponseFuture::pass_through(self.inner.call(request));
        }
        let span = tracing::debug_span!(
            "idempotency",
            method = %parts.method,
            path = settings.path.as_deref().unwrap_or_else(|| parts.uri.path()),
            fingerprint = tracing::field::Empty,
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // No subscriber wants it: a span without metadata, whose enters, exits and records
        // cost nothing (a disabled span still reports each to `log` when tracing's `log`
        // feature is on, as axum's default features turn it on).
        let span = if span.is_disabled() {
            tracing::Span::none()
        } else {
            span
        };
        if let Head::Reject(rejection) = start {
            let response = settings.refuse(rejection);
            let metrics = settings.config.metrics.clone();
            return ResponseFuture::ready(
                response,
                span,
                settings.config.outcome_extension,
                metrics,
            );
        }
        // The instance that was polled ready is the one that will be called.
        let clone = self.inner.clone();
        let pipeline = Pipeline {
            inner: std::mem::replace(&mut self.inner, clone),
            store: self.store.clone(),
            admission: self.admission.clone(),
            settings: Arc::clone(settings),
        };
        let collector = Collector::new(settings.body_limit);
        let extension = settings.config.outcome_extension;
        let metrics = settings.config.metrics.clone();
        ResponseFuture::reading(body, parts, pipeline, collector, span, extension, metrics)
    }
}
