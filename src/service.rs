//! [`Idempotency`]: the service that guards the create.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response};
use http_body::Body;
use tower::Service;

use crate::admission::{Admission, Admit, AlwaysAdmit};
use crate::body::{RequestBody, ResponseBody};
use crate::future::{Reading, ResponseFuture};
use crate::headers;
use crate::layer::{Config, IdempotencyLayer, OtherPaths};
use crate::operation::{Fingerprint, LabelOperation};
use crate::reply::{self, IDEMPOTENT_REPLAYED, Outcome, Reply};
use crate::scope::store_key;
use crate::store::{BoxError, Claim, Store, StoredResponse};
use crate::validation::{self, Collector, ReadError};

/// The middleware service built by [`IdempotencyLayer`].
///
/// It validates the request in the contract's order, claims the key in the store, asks
/// admission, calls the inner service to create, completes the record, and only then replies
/// with the stored response. The inner service receives the validated body bytes and the
/// [`LabelOperation`] in the request extensions.
///
/// Every refusal, store failure and create failure is a response, never an error: the service's
/// error is the inner service's, and only a passed-through request can yield it.
///
/// Once the claim has started, it and everything after it run to their end even if the
/// response future is dropped (a client that went away): the rest moves to a Tokio task, so a
/// disconnect can neither leave a key pending nor cause a second create.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceExt, service_fn};
/// use tower_idempotency::{Idempotency, LabelOperation, MemoryStore, RequestBody};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|_: Request<RequestBody<String>>| async {
///     Ok::<_, Infallible>(Response::builder().status(201).body(String::from("{}")).unwrap())
/// });
/// let service = Idempotency::new(create, MemoryStore::new());
///
/// let op = LabelOperation::new("label-req-7", "parcel-42");
/// let first = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// let again = service.oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// assert_eq!(first.status(), StatusCode::CREATED);
/// assert_eq!(again.status(), StatusCode::CREATED); // replayed, not created twice
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Idempotency<S, St, A = AlwaysAdmit> {
    inner: S,
    store: St,
    admission: A,
    config: Arc<Config>,
}

impl<S, St: Store> Idempotency<S, St> {
    /// Wraps `inner` with the contract's defaults over `store`.
    pub fn new(inner: S, store: St) -> Self {
        Self::from_parts(inner, store, AlwaysAdmit, Arc::default())
    }

    /// A layer that wraps services over `store`; see [`IdempotencyLayer`].
    pub fn layer(store: St) -> IdempotencyLayer<St> {
        IdempotencyLayer::new(store)
    }
}

impl<S, St, A> Idempotency<S, St, A> {
    pub(crate) fn from_parts(inner: S, store: St, admission: A, config: Arc<Config>) -> Self {
        Self {
            inner,
            store,
            admission,
            config,
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

impl<S, St, A, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, St, A>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    St: Store,
    A: Admission,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, A, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = &self.config;
        let on_path = request.uri().path() == config.path;
        if !on_path && config.other_paths == OtherPaths::PassThrough {
            return ResponseFuture::pass_through(self.inner.call(request.map(RequestBody::inner)));
        }
        let span = tracing::debug_span!(
            "idempotency",
            method = %request.method(),
            path = %config.path,
            fingerprint = tracing::field::Empty,
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // Contract §2, steps 1 to 3 and the declared half of step 4: no body read yet.
        let early = if !on_path {
            Some(Reply::NotFound)
        } else if request.method() != Method::POST {
            Some(Reply::MethodNotAllowed)
        } else if !validation::is_json(request.headers()) {
            Some(Reply::UnsupportedMediaType)
        } else if validation::declares_over(request.headers(), config.body_limit) {
            Some(Reply::PayloadTooLarge)
        } else {
            None
        };
        if let Some(reply) = early {
            return ResponseFuture::ready(reply.into_response(), span);
        }
        // The instance that was polled ready is the one that will be called.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let guard = Guard {
            inner,
            store: self.store.clone(),
            admission: self.admission.clone(),
            config: Arc::clone(&self.config),
        };
        let (parts, body) = request.into_parts();
        let collector = Collector::new(guard.config.body_limit);
        ResponseFuture::reading(
            body,
            Reading {
                parts,
                guard,
                collector,
            },
            span,
        )
    }
}

/// Everything the guarded path needs, moved into its future.
pub(crate) struct Guard<S, St, A> {
    inner: S,
    store: St,
    admission: A,
    config: Arc<Config>,
}

impl<S, St, A> Guard<S, St, A> {
    /// Steps 5 and 6 and the scope, on the complete body: nothing is claimed until the body is
    /// complete and valid, so a slow or stalled body holds no reservation.
    pub(crate) fn validate(self, parts: Parts, body: Bytes) -> Result<Claimed<S, St, A>, Reply> {
        let operation = LabelOperation::from_json(&body).map_err(|_| Reply::InvalidRequest)?;
        if !validation::key_matches(&parts.headers, &operation.request_id) {
            return Err(Reply::InvalidRequest);
        }
        let scope = match &self.config.scope {
            Some(scope) => Some((scope.0)(&parts).ok_or(Reply::ScopeRequired)?),
            None => None,
        };
        let key = store_key(&self.config.path, &operation.request_id, scope.as_deref());
        Ok(Claimed {
            fingerprint: operation.fingerprint(),
            guard: self,
            key,
            operation,
            parts,
            body,
        })
    }
}

/// A valid request about to be claimed.
pub(crate) struct Claimed<S, St, A> {
    guard: Guard<S, St, A>,
    key: String,
    fingerprint: Fingerprint,
    operation: LabelOperation,
    parts: Parts,
    body: Bytes,
}

impl<S, St, A> Claimed<S, St, A> {
    /// Records the fingerprint, and the key if configured, on the request's span.
    pub(crate) fn trace(&self, span: &tracing::Span) {
        span.record("fingerprint", self.fingerprint.as_str());
        if self.guard.config.trace_keys {
            span.record("key", self.key.as_str());
        }
    }

    /// Contract §4 and §5: the claim decides; a new claim gets admission (and a release on
    /// refusal), the create, the complete, and only then the reply.
    pub(crate) async fn decide<ReqBody, ResBody>(self) -> Response<ResponseBody<ResBody>>
    where
        S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
        St: Store,
        A: Admission,
        ResBody: Body<Data = Bytes>,
    {
        let Self {
            guard:
                Guard {
                    mut inner,
                    store,
                    admission,
                    config,
                },
            key,
            fingerprint,
            operation,
            parts,
            body,
        } = self;
        let reservation = match store.claim(&key, &fingerprint).await {
            Ok(Claim::New(reservation)) => reservation,
            Ok(Claim::Replay(stored)) => {
                let mut response = reply::stored(stored, Outcome::Replay);
                if config.mark_replays {
                    response
                        .headers_mut()
                        .insert(IDEMPOTENT_REPLAYED, http::HeaderValue::from_static("true"));
                }
                return response;
            }
            Ok(Claim::Pending) => return Reply::Pending.into_response(),
            Ok(Claim::Conflict) => return Reply::Conflict.into_response(),
            Err(error) => {
                tracing::warn!(%error, "claim failed; nothing created");
                return Reply::StoreUnavailable.into_response();
            }
        };
        let permit = match admission.admit(&operation).await {
            Admit::Proceed(permit) => permit,
            Admit::Refuse(refusal) => {
                if let Err(error) = store.release(&key, &reservation).await {
                    tracing::warn!(%error, "release after an admission refusal failed; the key stays pending");
                }
                return Reply::NotAdmitted(refusal.status()).into_response();
            }
        };
        let mut request = Request::from_parts(parts, RequestBody::full(body));
        request.extensions_mut().insert(operation);
        let Ok(response) = inner.call(request).await else {
            tracing::error!("create failed; the key stays pending");
            return Reply::CreateFailed.into_response();
        };
        let (mut parts, body) = response.into_parts();
        let body = match validation::read_limited(body, config.response_limit).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                tracing::error!("created response over the cap; the key stays pending");
                return Reply::ResponseTooLarge.into_response();
            }
            Err(ReadError::Broken) => {
                tracing::error!("created response body failed; the key stays pending");
                return Reply::CreateFailed.into_response();
            }
        };
        headers::retain_storable(&mut parts.headers, &config.excluded_headers);
        let stored = StoredResponse::new(parts.status, parts.headers, body);
        let outcome = match store.complete(&key, &reservation, &stored).await {
            Ok(()) => Outcome::Created,
            Err(error) => {
                tracing::error!(%error, "complete failed after the create; the key stays pending");
                Outcome::CompleteFailed
            }
        };
        drop(permit);
        reply::stored(stored, outcome)
    }
}
