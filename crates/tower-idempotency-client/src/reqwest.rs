//! The client layer's retries for `reqwest`, behind the feature `reqwest`: a
//! `reqwest-middleware` middleware with the same key per intent, decision table, backoff, cap,
//! deadline and budget as [`ClientLayer`], whose settings it takes.

use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};

use super::body::{ReadUpTo, read_up_to};
use super::decision::{Decision, Failure, decide, decide_failure};
use super::layer::{Attempts, ClientLayer, PENDING_BODY_LIMIT};
use super::retries::{Retries, Settings, intent_key};

/// A [`reqwest_middleware::Middleware`] that makes each request an intent with one
/// `Idempotency-Key` and retries what is safe to retry with it, as [`ClientLayer`] does for a
/// tower client. It is built from a `ClientLayer` with [`ClientLayer::reqwest_middleware`], and
/// has its settings and its budget, shared with the layer's clones.
///
/// A request whose body cannot be cloned, such as a stream, is sent once, with its key, within
/// the attempt's time and the deadline. The answer carries [`Attempts`] and the
/// [`IntentKey`](super::IntentKey) sent in its extensions; to choose the key, set the header or
/// an `IntentKey` with `reqwest_middleware::RequestBuilder::with_extension`.
///
/// A request it gives up on without an answer fails with the last attempt's error as it came,
/// not with the tower layer's [`GaveUp`](super::GaveUp). For a connection that failed, that is
/// a `reqwest_middleware::Error::Reqwest`, so that a retrier outside it still reads it. To keep
/// the key for a later try, choose it and set it before sending.
///
/// Built against `reqwest` 0.13 and `reqwest-middleware` 0.5. It is the only retrying
/// middleware a client needs: another, such as `reqwest-retry`, in the same stack would retry
/// again, outside this one's budget. If one is there all the same, outside this one, its
/// retries are the same intent: the key made here is written back to the request's extensions,
/// which reqwest-middleware hands every attempt, as an [`IntentKey`](super::IntentKey).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_client::ClientLayer;
///
/// let retries = ClientLayer::new()
///     .max_attempts(5)
///     .attempt_timeout(Duration::from_secs(2))
///     .reqwest_middleware();
/// # // Built beside the checker, reqwest's rustls needs a process-wide provider.
/// # let _ = rustls::crypto::ring::default_provider().install_default();
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(retries)
///     .build();
/// # drop(client);
/// ```
#[derive(Clone)]
pub struct RetryMiddleware {
    settings: Arc<Settings>,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware").finish_non_exhaustive()
    }
}

impl ClientLayer {
    /// This layer's retries as a `reqwest-middleware` middleware, with the feature `reqwest`:
    /// its settings as they are now, and the same budget, shared with the layer's clones.
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
    pub fn reqwest_middleware(&self) -> RetryMiddleware {
        RetryMiddleware {
            settings: Arc::clone(self.shared()),
        }
    }
}

/// Why an attempt of the middleware's own got no answer.
#[derive(Debug)]
enum Lost {
    /// A `409`'s body, read to decide on it, broke off.
    Broken(String),
    /// The attempt ran out of its time.
    TimedOut(Duration),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Broken(error) => write!(f, "the answer broke off: {error}"),
            Self::TimedOut(after) => write!(f, "the attempt timed out after {after:?}"),
        }
    }
}

impl std::error::Error for Lost {}

/// Why a `reqwest` error got no answer, if the request may have reached the server: its
/// connection failed or broke, reqwest's own timeouts of the connect, the request or the body
/// among them. Any other error is final, such as a request that could not be built, a redirect
/// loop or another middleware's.
fn failure(error: &reqwest_middleware::Error) -> Option<Failure> {
    match error {
        reqwest_middleware::Error::Reqwest(error)
            if error.is_connect() || error.is_request() || error.is_body() =>
        {
            Some(Failure::Connection)
        }
        // The middleware's own attempt timeout is decided where it happens.
        _ => None,
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let settings = &*self.settings;
        // A body that cannot be sent twice (a stream) is sent once, with its key if keyed, but
        // funds no retry.
        let once = request.try_clone().is_none();
        let keyed = settings.keys(request.method());
        let key = keyed.then(|| {
            let key = intent_key(request.headers_mut(), extensions);
            // Written back where a retrier outside this middleware finds it: reqwest-middleware
            // hands every middleware's attempts the same extensions, so an outer retry of
            // this request (reqwest-retry's, say) sends it with this key again.
            extensions.insert(key.clone());
            if !once {
                settings.fund();
            }
            key
        });
        let mut retries = Retries::start(settings);
        loop {
            // The request is kept for the next attempt if it can be sent again.
            let (mut attempt, kept) = match request.try_clone() {
                Some(attempt) => (attempt, Some(request)),
                None => (request, None),
            };
            if keyed {
                retries.mark(attempt.headers_mut());
            }
            let timeout = retries.send();
            // The attempt and, for a `409`, the read of its body, within the attempt's time.
            let attempted = async {
                match next.clone().run(attempt, extensions).await {
                    Ok(response) => judge(response, keyed, settings.retry_after_cap).await,
                    Err(error) => {
                        let decision = failure(&error)
                            .map_or(Decision::Stop, |failure| decide_failure(failure, keyed));
                        (decision, Err(error))
                    }
                }
            };
            let (decision, answer) = match timeout {
                Some(timeout) => match tokio::time::timeout(timeout, attempted).await {
                    Ok(attempted) => attempted,
                    Err(_) => {
                        let error = reqwest_middleware::Error::middleware(Lost::TimedOut(timeout));
                        (decide_failure(Failure::Timeout, keyed), Err(error))
                    }
                },
                None => attempted.await,
            };
            if let Ok(response) = &answer {
                retries.learn(response.headers());
            }
            let next_attempt = match kept {
                Some(kept) => retries.wait_after(decision).ok().map(|wait| (wait, kept)),
                None => None,
            };
            let Some((wait, kept)) = next_attempt else {
                let attempts = Attempts(retries.attempt());
                return answer.map(|mut response| {
                    response.extensions_mut().insert(attempts);
                    if let Some(key) = key {
                        response.extensions_mut().insert(key);
                    }
                    response
                });
            };
            drop(answer);
            retries.next(wait).await;
            request = kept;
        }
    }
}

/// The decision on a `reqwest` answer, and the answer to give: a `409` to a keyed request has
/// its body read, up to a limit, to tell a pending first attempt from a conflict, and is given
/// back whole; a longer one is final, given as it came. Any other answer is decided by its
/// status and headers.
async fn judge(
    response: Response,
    keyed: bool,
    cap: Duration,
) -> (Decision, reqwest_middleware::Result<Response>) {
    if response.status() != StatusCode::CONFLICT || !keyed {
        let decision = decide(response.status(), response.headers(), b"", keyed, cap);
        return (decision, Ok(response));
    }
    let url = response.url().clone();
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let (decision, body) = match read_up_to(body, PENDING_BODY_LIMIT).await {
        Ok(ReadUpTo::Whole(read, _)) => {
            let decision = decide(parts.status, &parts.headers, &read, keyed, cap);
            (decision, reqwest::Body::from(read))
        }
        Ok(ReadUpTo::Over(body)) => (Decision::Stop, reqwest::Body::wrap(body)),
        // Cut short: a lost answer.
        Err(error) => {
            let error = reqwest_middleware::Error::middleware(Lost::Broken(error.to_string()));
            return (decide_failure(Failure::Connection, keyed), Err(error));
        }
    };
    let mut rebuilt = http::Response::builder()
        .status(parts.status)
        .version(parts.version);
    if let Some(headers) = rebuilt.headers_mut() {
        *headers = parts.headers;
    }
    if let Some(extensions) = rebuilt.extensions_mut() {
        *extensions = parts.extensions;
    }
    let answer = rebuilt
        .url(url)
        .body(body)
        .map(Response::from)
        .map_err(reqwest_middleware::Error::middleware);
    (decision, answer)
}
