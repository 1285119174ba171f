//! The client layer: one key per intent, the body buffered once, every attempt the same
//! request, retried by [`decide`](super::decision::decide) within a budget.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tower::retry::budget::TpsBudget;
use tower::{BoxError, Layer, Service, ServiceExt};
use tracing::Instrument;

use super::body::{ClientBody, ReadUpTo, read_up_to};
use super::decision::{Decision, Failure, decide, decide_failure, decide_grpc};
use super::retries::{GaveUp, Retries, Settings, Stop, intent_key};

use crate::metrics::Metrics;

/// How many attempts an answer took, in its response extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts(pub u32);

/// The most of a `409`'s body read to tell a pending first attempt from a conflict.
pub(super) const PENDING_BODY_LIMIT: usize = 64 * 1024;

/// The most of a unary gRPC answer read to find its status in its trailers: tonic's default
/// largest message, and its frame's header.
const GRPC_BODY_LIMIT: usize = 4 * 1024 * 1024 + 5;

/// A [`Layer`] for an HTTP client service, such as a hyper-util client or a server stack in
/// tests, that makes each request an intent with one `Idempotency-Key`, kept for every attempt,
/// and retries what is safe to retry with it.
///
/// - The key: the request's own `Idempotency-Key` if it has one, else its
///   [`IntentKey`](super::IntentKey) extension, else one the layer makes before the first
///   attempt: 128 bits, 32 hexadecimal characters.
/// - The body is read once, up to [`body_limit`](Self::body_limit), and every attempt sends the
///   same bytes.
/// - Retried, with the key: a connection cut, an attempt's timeout, `502`/`503`/`504`, `429`, a
///   pending first attempt's `409`, as [`decide`] and [`decide_failure`] say. A retry waits out
///   a backoff with full jitter: a random wait up to [`backoff`](Self::backoff)'s base, doubled
///   each attempt and capped. It never comes before a `Retry-After`.
/// - Bounded: [`max_attempts`](Self::max_attempts) a request, a [`deadline`](Self::deadline)
///   for all of them, and a retry budget shared by the layer's clones. The budget is tower's
///   `TpsBudget`: retries at most a share of first attempts, so that retries cannot multiply an
///   outage. The last answer is the caller's when any runs out.
/// - Only requests whose method the layer keys get a key and retries, and fund the budget: see
///   [`methods`](Self::methods), default `POST`. Others are sent once, their body buffered
///   alike, within the limit.
/// - A `Retry-After` longer than [`retry_after_cap`](Self::retry_after_cap) is not cut short:
///   that answer is the caller's.
///
/// - Unary gRPC, with a tonic `Channel` under the layer and its requests' bodies mapped to
///   `Full<Bytes>`: the key goes in the `idempotency-key` metadata entry, which is the same
///   header. An answer is decided by its `grpc-status` with [`decide_grpc`]: in its headers, or
///   in its trailers, for which its body is read whole, up to 4 MiB. Put the layer on unary
///   calls only: a streaming answer would be read to its end before the caller sees it.
///   gRPC-web answers carry their status in their body, and are decided by their HTTP status.
///
/// The response carries [`Attempts`] in its extensions, and the [`IntentKey`](super::IntentKey) sent.
///
/// The service under the layer takes `http::Request<Full<Bytes>>`, with the buffered body, and
/// may answer with any body. The layer answers with a [`ClientBody`] over it, and its errors
/// are `tower::BoxError`: a [`GaveUp`](super::GaveUp) when it gives up without an answer. With
/// hyper-util's client and its features `client-legacy`, `http1` and `tokio`:
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::{Layer, ServiceExt};
/// use tower_idempotency_client::{Attempts, ClientLayer, IntentKey};
///
/// # async fn run() -> Result<(), tower::BoxError> {
/// let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
/// let client = ClientLayer::new()
///     .max_attempts(5)
///     .attempt_timeout(Duration::from_secs(2))
///     .layer(http);
/// let order = http::Request::post("http://127.0.0.1:3001/payments")
///     .header("content-type", "application/json")
///     .body(Full::new(Bytes::from_static(br#"{"amount":1250,"currency":"EUR"}"#)))?;
/// let response = client.oneshot(order).await?;
/// let key = response.extensions().get::<IntentKey>().cloned();
/// let attempts = response.extensions().get::<Attempts>().map_or(1, |a| a.0);
/// let body = response.into_body().collect().await?.to_bytes();
/// println!("{key:?} after {attempts} attempts: {body:?}");
/// # Ok(()) }
/// ```
///
/// A service under the layer whose error is `tower::BoxError`, such as a stack with tower's
/// `Timeout`, may make the compiler refuse a `tokio::spawn` of an `async` block that calls the
/// client, with "implementation of `From` is not general enough". This is a limit of the
/// compiler's reasoning about such blocks, not of the layer. Make the call in an `async fn`
/// generic over the service, or map the service's errors to a concrete type.
#[derive(Clone)]
pub struct ClientLayer {
    settings: Arc<Settings>,
}

impl Default for ClientLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClientLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("ClientLayer")
            .field("methods", &s.methods)
            .field("max_attempts", &s.max_attempts)
            .field("attempt_timeout", &s.attempt_timeout)
            .field("deadline", &s.deadline)
            .field("backoff", &s.backoff)
            .field("retry_after_cap", &s.retry_after_cap)
            .field("replay_window", &s.replay_window)
            .field("body_limit", &s.body_limit)
            .finish()
    }
}

impl ClientLayer {
    /// Keys `POST` requests; 5 attempts at most, no attempt timeout or deadline of its own,
    /// backoff from 100 ms doubling to 10 s, `Retry-After` honoured up to 30 s, bodies up to
    /// 1 MiB, and a budget of 20% of first attempts in retries, at least 10 a second, over the
    /// last 10 seconds.
    pub fn new() -> Self {
        Self {
            settings: Arc::new(Settings {
                methods: vec![Method::POST],
                max_attempts: 5,
                attempt_timeout: None,
                deadline: None,
                backoff: (Duration::from_millis(100), Duration::from_secs(10)),
                retry_after_cap: Duration::from_secs(30),
                replay_window: None,
                body_limit: 1024 * 1024,
                budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
                metrics: Metrics::default(),
            }),
        }
    }

    /// The settings its services and middleware share.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(super) fn shared(&self) -> &Arc<Settings> {
        &self.settings
    }

    fn settings(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The methods whose requests get a key and retries.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings().methods = methods.into_iter().collect();
        self
    }

    /// The most attempts a request makes, the first included; at least 1.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings().max_attempts = attempts.max(1);
        self
    }

    /// How long one attempt may take before it is given up and, with its key, retried.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.settings().attempt_timeout = Some(timeout);
        self
    }

    /// How long a request may take over all its attempts and waits: an attempt still running
    /// when it passes is given up as by [`attempt_timeout`](Self::attempt_timeout), no new
    /// attempt starts, and the last answer or failure is the caller's.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.settings().deadline = Some(deadline);
        self
    }

    /// The first backoff's ceiling, doubled each retry up to `max`; each wait is a random share
    /// of it: full jitter.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings().backoff = (base, max.max(base));
        self
    }

    /// The longest `Retry-After` waited for; an answer that asks for longer is the caller's.
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.settings().retry_after_cap = cap;
        self
    }

    /// The server's replay window, when it is known beforehand (from its API's description): no
    /// attempt of an intent is sent once that long has passed since its first, and the request
    /// ends with [`Stop::Lifetime`](crate::Stop::Lifetime). A window a server advertises in its
    /// answers (`Idempotency-TTL`) is honoured without it; the shorter of the two counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency_client::ClientLayer;
    ///
    /// let layer = ClientLayer::new().replay_window(Duration::from_secs(24 * 3600));
    /// # drop(layer);
    /// ```
    pub fn replay_window(mut self, window: Duration) -> Self {
        self.settings().replay_window = Some(window);
        self
    }

    /// The largest request body buffered for the attempts; a larger one fails the request.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.settings().body_limit = limit;
        self
    }

    /// The retry budget, shared by every clone of this layer and the services it builds:
    /// retries take from it, first attempts add to it. See tower's `TpsBudget::new`.
    pub fn budget(mut self, budget: TpsBudget) -> Self {
        self.settings().budget = Arc::new(budget);
        self
    }

    /// The `layer` label of this layer's metrics, with the feature `metrics`:
    /// [`CLIENT_ATTEMPTS`](crate::CLIENT_ATTEMPTS) and
    /// [`CLIENT_BUDGET_REFUSALS`](crate::CLIENT_BUDGET_REFUSALS); `"default"` unless
    /// set.
    ///
    /// ```
    /// use tower_idempotency_client::ClientLayer;
    ///
    /// let layer = ClientLayer::new().metrics_label("payments-client");
    /// # drop(layer);
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.settings().metrics = Metrics::new(label.into());
        self
    }
}

impl<S> Layer<S> for ClientLayer {
    type Service = RetryClient<S>;

    fn layer(&self, inner: S) -> RetryClient<S> {
        RetryClient {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service of a [`ClientLayer`].
#[derive(Clone)]
pub struct RetryClient<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S: fmt::Debug> fmt::Debug for RetryClient<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryClient")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The response future of a [`RetryClient`].
pub type ClientFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<ClientBody<B>>, BoxError>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RetryClient<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ClientBody<ResBody>>;
    type Error = BoxError;
    type Future = ClientFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service made ready is the first attempt's; later attempts wait on clones.
        let ready = self.inner.clone();
        let first = std::mem::replace(&mut self.inner, ready);
        let settings = Arc::clone(&self.settings);
        Box::pin(send(first, settings, request))
    }
}

/// Every attempt of one request.
async fn send<S, ReqBody, ResBody>(
    ready: S,
    settings: Arc<Settings>,
    request: Request<ReqBody>,
) -> Result<Response<ClientBody<ResBody>>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    let mut retries = Retries::start(&settings);
    // A service made ready holds what readiness took (a buffer's slot, a concurrency
    // permit): let it go while the body is read, and be made ready again after.
    let mut inner = ready.clone();
    drop(ready);
    let (mut parts, body) = request.into_parts();
    let body = Limited::new(body, settings.body_limit).collect();
    let body = retries
        .within("reading the request body", body)
        .await?
        .map_err(|error| -> BoxError { format!("the request body: {error}").into() })?
        .to_bytes();
    let keyed = settings.keys(&parts.method);
    let key = keyed.then(|| {
        settings.fund();
        let key = intent_key(&mut parts.headers, &parts.extensions);
        // In the request's extensions too, as every attempt carries them.
        parts.extensions.insert(key.clone());
        key
    });
    let gave_up = |attempts: u32, stop: Stop, source: BoxError| -> BoxError {
        Box::new(GaveUp {
            attempts,
            stop,
            key: key.clone(),
            source,
        })
    };
    loop {
        let made = retries.attempt() - 1;
        match retries
            .within("waiting for the service", inner.ready())
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(gave_up(made, Stop::Final, error.into())),
            Err(error) => return Err(gave_up(made, Stop::Deadline, error)),
        }
        let mut request = Request::new(Full::new(body.clone()));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.version_mut() = parts.version;
        *request.headers_mut() = parts.headers.clone();
        *request.extensions_mut() = parts.extensions.clone();
        if keyed {
            retries.mark(request.headers_mut());
        }
        // An attempt ends by its own timeout or the request's deadline, whichever is first;
        // a `409`'s body, read to decide, is within the same time.
        let timeout = retries.send();
        let cap = settings.retry_after_cap;
        let attempted = async {
            let response = inner
                .call(request)
                .await
                .map_err(|error| (decide_failure(Failure::Connection, keyed), error.into()))?;
            judge(response, keyed, cap).await
        };
        let attempt = retries.attempt();
        let attempted = match timeout {
            Some(timeout) => tokio::time::timeout(timeout, attempted)
                .instrument(tracing::debug_span!("attempt", attempt))
                .await
                .unwrap_or_else(|elapsed| {
                    Err((decide_failure(Failure::Timeout, keyed), elapsed.into()))
                }),
            None => {
                attempted
                    .instrument(tracing::debug_span!("attempt", attempt))
                    .await
            }
        };
        let (decision, answer) = match attempted {
            Ok((decision, response)) => {
                retries.learn(response.headers());
                (decision, Ok(response))
            }
            Err((decision, error)) => (decision, Err(error)),
        };
        let wait = match retries.wait_after(decision) {
            Ok(wait) => wait,
            Err(stop) => {
                return match answer {
                    Ok(mut response) => {
                        response.extensions_mut().insert(Attempts(attempt));
                        if let Some(key) = key {
                            response.extensions_mut().insert(key);
                        }
                        Ok(response)
                    }
                    Err(source) => Err(gave_up(attempt, stop, source)),
                };
            }
        };
        // The answer is let go before the wait: its connection goes back to the pool.
        drop(answer);
        retries.next(wait).await;
        inner = inner.clone();
    }
}

/// The decision on an answer, and the answer to give; or, for an answer that broke off, the
/// decision on it and why.
///
/// - A unary gRPC answer, `application/grpc`, is decided by its `grpc-status` with
///   [`decide_grpc`]: in its headers for a trailers-only answer, or in its trailers, for which
///   its body is read whole, up to a limit. One that ends without a status was cut short, a
///   lost answer.
/// - A `409` to a keyed request has its body read, up to a limit, to tell a pending first
///   attempt from a conflict; one cut short is a lost answer.
/// - Any other answer is decided by its status and headers, its body not read.
///
/// An answer longer than the limit is final, as it is not the layer's, and is given whole: what
/// was read, then the rest.
async fn judge<ResBody>(
    response: Response<ResBody>,
    keyed: bool,
    cap: Duration,
) -> Result<(Decision, Response<ClientBody<ResBody>>), (Decision, BoxError)>
where
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    if !keyed {
        // Nothing is retried without a key: the answer is the caller's, as it streams.
        return Ok((Decision::Stop, response.map(ClientBody::streamed)));
    }
    let lost = |error: BoxError| (decide_failure(Failure::Connection, keyed), error);
    let grpc = is_grpc(response.headers());
    if grpc && let Some(code) = grpc_status(response.headers()) {
        return Ok((decide_grpc(code, keyed), response.map(ClientBody::streamed)));
    }
    let limit = match response.status() {
        _ if grpc => GRPC_BODY_LIMIT,
        StatusCode::CONFLICT => PENDING_BODY_LIMIT,
        status => {
            let decision = decide(status, response.headers(), b"", keyed, cap);
            return Ok((decision, response.map(ClientBody::streamed)));
        }
    };
    let (parts, body) = response.into_parts();
    let (data, trailers) = match read_up_to(body, limit).await.map_err(lost)? {
        ReadUpTo::Whole(data, trailers) => (data, trailers),
        ReadUpTo::Over(body) => return Ok((Decision::Stop, Response::from_parts(parts, body))),
    };
    let decision = if grpc {
        let Some(code) = trailers.as_ref().and_then(grpc_status) else {
            return Err(lost("the gRPC answer ended without its status".into()));
        };
        decide_grpc(code, keyed)
    } else {
        decide(parts.status, &parts.headers, &data, keyed, cap)
    };
    let body = ClientBody::read(data, trailers);
    Ok((decision, Response::from_parts(parts, body)))
}

/// Whether `headers` are a gRPC answer's, over HTTP/2. gRPC-web carries its status in its body,
/// and is decided by its HTTP status.
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value.starts_with("application/grpc") && !value.starts_with("application/grpc-web")
        })
}

/// The `grpc-status` in `headers`, if there is a readable one.
fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}
