//! The client layer against the server layer and scripted servers: one key per intent, the
//! same bytes every attempt, retries of exactly what is safe, within a budget.
#![cfg(feature = "client")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::retry::budget::TpsBudget;
use tower::{BoxError, Layer, ServiceExt, service_fn};
use tower_idempotency::client::{Attempts, ClientLayer};
use tower_idempotency::layer::RequestBody;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// A payment, as a client sends it: no key of its own.
pub(crate) fn intent(amount: u32) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"amount":{amount}}}"#))))
        .unwrap()
}

/// What a scripted server saw of each attempt: its key and its body.
pub(crate) type Seen = Arc<Mutex<Vec<(Option<String>, Bytes)>>>;

/// A scripted answer: its status, headers and body.
pub(crate) type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// A server that answers each attempt with the next of `answers` (the last again when they
/// run out), and records what it saw.
pub(crate) fn scripted(
    answers: Vec<Answer>,
) -> (
    impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<Full<Bytes>>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    Seen,
) {
    let seen: Seen = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(answers);
    let saw = Arc::clone(&seen);
    let server = service_fn(move |request: Request<Full<Bytes>>| {
        let (saw, next, answers) = (Arc::clone(&saw), Arc::clone(&next), Arc::clone(&answers));
        async move {
            let key = request
                .headers()
                .get("idempotency-key")
                .map(|key| key.to_str().unwrap().to_owned());
            let body = request.into_body().collect().await?.to_bytes();
            saw.lock().unwrap().push((key, body));
            let i = next.fetch_add(1, Ordering::SeqCst).min(answers.len() - 1);
            let (status, headers, body) = &answers[i];
            let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
            *response.status_mut() = StatusCode::from_u16(*status).unwrap();
            for (name, value) in headers {
                response.headers_mut().insert(*name, value.parse().unwrap());
            }
            Ok::<_, BoxError>(response)
        }
    });
    (server, seen)
}

pub(crate) async fn status_and_attempts<S>(client: S, request: Request<Full<Bytes>>) -> (u16, u32)
where
    S: tower::Service<Request<Full<Bytes>>, Error = BoxError>,
    S::Response: Into<Response<tower_idempotency::client::ClientBody<Full<Bytes>>>>,
{
    let response: Response<_> = client.oneshot(request).await.unwrap().into();
    let attempts = response.extensions().get::<Attempts>().unwrap().0;
    (response.status().as_u16(), attempts)
}

/// The reply is lost after the server answered (the connection cut on the way back) for the
/// first attempts of every intent: each intent still gets its 201, and the server creates
/// once per intent, because every attempt carries the intent's one key and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_lost_reply_is_retried_with_the_same_key_and_creates_once() {
    let creates = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&creates);
    let create = service_fn(move |_: Request<RequestBody<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            let mut response = Response::new(Full::new(Bytes::from_static(b"{\"id\":1}")));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, BoxError>(response)
        }
    });
    let server = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
        .global_keys()
        .layer(create);
    // Loses the answers of the first two attempts of each key, after the server made them.
    let lost: Arc<Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let lossy = service_fn(move |request: Request<Full<Bytes>>| {
        let (server, lost) = (server.clone(), Arc::clone(&lost));
        async move {
            let key = request.headers()["idempotency-key"].to_str()?.to_owned();
            let response = server.oneshot(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            let mut lost = lost.lock().unwrap();
            let times = lost.entry(key).or_default();
            *times += 1;
            if *times <= 2 {
                return Err::<Response<Full<Bytes>>, BoxError>("connection reset".into());
            }
            Ok(Response::from_parts(parts, Full::new(body)))
        }
    });
    let client = ClientLayer::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0))
        .layer(lossy);
    let intents = 20;
    let mut sent = Vec::new();
    for amount in 1..=intents {
        sent.push(tokio::spawn(status_and_attempts(
            client.clone(),
            intent(amount),
        )));
    }
    for reply in sent {
        assert_eq!(
            reply.await.unwrap(),
            (201, 3),
            "every intent created, on its third attempt"
        );
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        intents as usize,
        "one create an intent"
    );
}

/// Every attempt sends the intent's one key (the caller's when it set one) and the same
/// bytes; a `503` with `Retry-After: 2` waits two seconds (the clock paused) and is retried.
#[tokio::test(start_paused = true)]
pub(crate) async fn retry_after_is_honoured_and_every_attempt_is_the_same_request() {
    let (server, seen) = scripted(vec![
        (503, vec![("retry-after", "2")], ""),
        (429, vec![("retry-after", "2")], ""),
        (201, vec![], "{}"),
    ]);
    let client = ClientLayer::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .layer(server);
    let started = tokio::time::Instant::now();
    assert_eq!(
        status_and_attempts(client.clone(), intent(7)).await,
        (201, 3)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    let key = seen[0].0.clone().expect("a key");
    assert_eq!(key.len(), 32);
    assert!(
        seen.iter()
            .all(|(k, body)| k.as_deref() == Some(key.as_str())
                && body.as_ref() == br#"{"amount":7}"#)
    );
    // A key the caller set is the one sent.
    let (server, seen) = scripted(vec![(502, vec![], ""), (201, vec![], "{}")]);
    let mine = intent(8);
    let (mut parts, body) = mine.into_parts();
    parts
        .headers
        .insert("idempotency-key", "order-8".parse().unwrap());
    let client = ClientLayer::new().layer(server);
    assert_eq!(
        status_and_attempts(client, Request::from_parts(parts, body)).await,
        (201, 2)
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(k, _)| k.as_deref() == Some("order-8"))
    );
}

/// A pending first attempt's `409` is retried until the replay; a conflict, `422`, `400` and
/// other answers are the caller's at once, after one attempt.
#[tokio::test(start_paused = true)]
pub(crate) async fn a_pending_first_attempt_is_retried_and_refusals_are_final() {
    let pending = r#"{"type":"https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#request_pending"}"#;
    let (server, _) = scripted(vec![
        (409, vec![], pending),
        (409, vec![], r#"{"error":"request_pending"}"#),
        (201, vec![], "{}"),
    ]);
    let client = ClientLayer::new().layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (201, 3));
    for (status, body) in [
        (422, r#"{"type":"https://x/idempotency_conflict"}"#),
        (409, r#"{"error":"idempotency_conflict"}"#),
        (400, "{}"),
        (404, ""),
        (500, r#"{"error":"create_failed"}"#),
    ] {
        let (server, seen) = scripted(vec![(status, vec![], body), (201, vec![], "{}")]);
        let client = ClientLayer::new().layer(server);
        let response = client.oneshot(intent(1)).await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
        // The body read to decide is the caller's still.
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            body
        );
        assert_eq!(seen.lock().unwrap().len(), 1, "{status}: one attempt");
    }
    // A method the layer does not key is sent once, without a key, whatever the answer.
    let (server, seen) = scripted(vec![(503, vec![], ""), (200, vec![], "")]);
    let client = ClientLayer::new().layer(server);
    let get = Request::get("/payments")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(status_and_attempts(client, get).await, (503, 1));
    assert_eq!(seen.lock().unwrap()[0].0, None);
}

/// With the server down, concurrent intents retry at most the budget's share: 50 intents of
/// up to 5 attempts each send not 250 requests but their 50 and a fifth more, with a floor
/// of 10 retries for the budget's window.
#[tokio::test(start_paused = true)]
pub(crate) async fn the_budget_bounds_retries_when_the_server_is_down() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let down = service_fn(move |_: Request<Full<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<Full<Bytes>>, _>(std::io::Error::other("connection refused")) }
    });
    let client = ClientLayer::new()
        .budget(TpsBudget::new(Duration::from_secs(10), 1, 0.2))
        .layer(down);
    let mut sent = Vec::new();
    for amount in 0..50 {
        let client = client.clone();
        sent.push(tokio::spawn(
            async move { client.oneshot(intent(amount)).await },
        ));
    }
    for reply in sent {
        assert!(reply.await.unwrap().is_err(), "the failure is the caller's");
    }
    let calls = calls.load(Ordering::SeqCst);
    assert!((50..=50 + 10 + 10 + 2).contains(&calls), "{calls} requests");
}

/// The attempts stop at `max_attempts`, and at the deadline.
#[tokio::test(start_paused = true)]
pub(crate) async fn attempts_stop_at_the_cap_and_the_deadline() {
    let (server, seen) = scripted(vec![(503, vec![], "")]);
    let client = ClientLayer::new()
        .max_attempts(3)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        .layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (503, 3));
    assert_eq!(seen.lock().unwrap().len(), 3);
    let (server, seen) = scripted(vec![(503, vec![("retry-after", "5")], "")]);
    let client = ClientLayer::new()
        .deadline(Duration::from_secs(12))
        .layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (503, 3));
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "at 0 s, 5 s and 10 s; 15 s is past"
    );
    // An attempt that takes too long is given up and retried.
    let slow = Arc::new(AtomicUsize::new(0));
    let first = Arc::clone(&slow);
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        let first = first.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok::<_, BoxError>(Response::new(Full::new(Bytes::new())))
        }
    });
    let client = ClientLayer::new()
        .attempt_timeout(Duration::from_secs(1))
        .layer(server.clone());
    assert_eq!(status_and_attempts(client, intent(1)).await, (200, 2));
    // The deadline ends an attempt that outlasts it: the failure is the caller's, in time.
    slow.store(0, Ordering::SeqCst);
    let client = ClientLayer::new()
        .deadline(Duration::from_secs(3))
        .layer(server);
    let started = tokio::time::Instant::now();
    assert!(client.oneshot(intent(1)).await.is_err());
    assert_eq!(started.elapsed(), Duration::from_secs(3));
}

/// A body that is either whole or never comes: a server that stalls after its head.
pub(crate) enum Slow {
    Whole(Full<Bytes>),
    Stalled,
}

impl http_body::Body for Slow {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Slow::Whole(body) => std::pin::Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Slow::Stalled => std::task::Poll::Pending,
        }
    }
}

/// A `409` whose body stalls is given up at the attempt's timeout and retried with the key;
/// a `409` whose body is too long to be the layer's is the caller's, untouched; a
/// `Retry-After` longer than the cap is the caller's answer, not cut short.
#[tokio::test(start_paused = true)]
pub(crate) async fn a_stalled_or_long_409_and_a_long_retry_after_are_handled_in_time() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            let mut response = Response::new(if first {
                Slow::Stalled
            } else {
                Slow::Whole(Full::new(Bytes::from_static(b"{}")))
            });
            *response.status_mut() = if first {
                StatusCode::CONFLICT
            } else {
                StatusCode::CREATED
            };
            Ok::<_, BoxError>(response)
        }
    });
    let client = ClientLayer::new()
        .attempt_timeout(Duration::from_secs(1))
        .layer(server);
    let response = client.oneshot(intent(1)).await.unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(2)));

    let long = "x".repeat(70 * 1024);
    let long: &'static str = Box::leak(long.into_boxed_str());
    let (server, seen) = scripted(vec![(409, vec![], long), (201, vec![], "{}")]);
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        long
    );
    assert_eq!(seen.lock().unwrap().len(), 1);

    let (server, seen) = scripted(vec![
        (503, vec![("retry-after", "3600")], ""),
        (201, vec![], ""),
    ]);
    let client = ClientLayer::new().layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (503, 1));
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// The layer's settings each do what they say: the methods it keys, the `Retry-After` cap,
/// the body limit; a pending `409` of a few kilobytes is still read and retried.
#[tokio::test(start_paused = true)]
pub(crate) async fn the_settings_key_cap_and_limit_as_set() {
    // PUT keyed and retried when asked; POST then sent once, without a key.
    let (server, seen) = scripted(vec![(503, vec![], ""), (201, vec![], "{}")]);
    let client = ClientLayer::new()
        .methods([http::Method::PUT])
        .layer(server);
    let put = Request::put("/payments/7")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(status_and_attempts(client.clone(), put).await, (201, 2));
    assert!(seen.lock().unwrap().iter().all(|(key, _)| key.is_some()));
    let (server, seen) = scripted(vec![(503, vec![], "")]);
    let client = ClientLayer::new()
        .methods([http::Method::PUT])
        .layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (503, 1));
    assert_eq!(seen.lock().unwrap()[0].0, None);
    // A Retry-After past the cap set is final.
    let (server, _) = scripted(vec![
        (503, vec![("retry-after", "10")], ""),
        (201, vec![], ""),
    ]);
    let client = ClientLayer::new()
        .retry_after_cap(Duration::from_secs(5))
        .layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (503, 1));
    // A body over the limit is refused before any attempt.
    let (server, seen) = scripted(vec![(201, vec![], "")]);
    let client = ClientLayer::new().body_limit(4).layer(server);
    assert!(client.oneshot(intent(12345)).await.is_err());
    assert!(seen.lock().unwrap().is_empty());
    // A pending 409 of a few kilobytes (a problem with details) is read and retried.
    let padded: &'static str = Box::leak(
        format!(
            r#"{{"type":"https://x/request_pending","detail":"{}"}}"#,
            "x".repeat(4000)
        )
        .into_boxed_str(),
    );
    let (server, _) = scripted(vec![(409, vec![], padded), (201, vec![], "{}")]);
    let client = ClientLayer::new().layer(server);
    assert_eq!(status_and_attempts(client, intent(1)).await, (201, 2));
}

/// A service that is never ready.
#[derive(Clone)]
pub(crate) struct NeverReady;

impl tower::Service<Request<Full<Bytes>>> for NeverReady {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<Full<Bytes>>, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Pending
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        unreachable!("never ready, never called")
    }
}

/// The client is ready when the service under it is: its backpressure reaches the caller.
#[tokio::test(start_paused = true)]
pub(crate) async fn readiness_is_the_services() {
    let mut client = ClientLayer::new().layer(NeverReady);
    let ready = tokio::time::timeout(
        Duration::from_secs(1),
        ServiceExt::<Request<Full<Bytes>>>::ready(&mut client),
    )
    .await;
    assert!(ready.is_err(), "not ready while the service is not");
}

/// A service that never gets ready: the layer gives up at the deadline, after no attempt,
/// saying so, with the intent's key and the wait's error as its source.
#[tokio::test(start_paused = true)]
pub(crate) async fn a_service_never_ready_gives_up_at_the_deadline_after_no_attempt() {
    use tower_idempotency::client::{GaveUp, Stop};
    let mut client = ClientLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(NeverReady);
    let error = tower::Service::call(&mut client, intent(1))
        .await
        .expect_err("no answer");
    let gave_up = error.downcast_ref::<GaveUp>().expect("a GaveUp");
    assert_eq!((gave_up.attempts, gave_up.stop), (0, Stop::Deadline));
    assert!(gave_up.key.is_some());
    assert!(std::error::Error::source(gave_up).is_some());
}

/// An answer other than a `409` is given as it comes: its body is not read by the layer, so
/// one that streams slowly reaches the caller at once, after one attempt.
#[tokio::test(start_paused = true)]
pub(crate) async fn an_answer_is_given_without_its_body_being_read() {
    let server = service_fn(|_: Request<Full<Bytes>>| async {
        let mut response = Response::new(Slow::Stalled);
        *response.status_mut() = StatusCode::CREATED;
        Ok::<_, BoxError>(response)
    });
    let client = ClientLayer::new()
        .attempt_timeout(Duration::from_secs(1))
        .layer(server);
    let started = tokio::time::Instant::now();
    let response = client.oneshot(intent(1)).await.unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// A key set as the request's `IntentKey` extension is the one every attempt sends, unless
/// the request has an `Idempotency-Key` header, which wins; the key sent, made by the layer
/// too, is in the answer's extensions.
#[tokio::test(start_paused = true)]
pub(crate) async fn the_intent_key_is_sent_and_given_back() {
    use tower_idempotency::client::IntentKey;
    let key = |value: &'static str| IntentKey(http::HeaderValue::from_static(value));
    for (header, extension, sent) in [
        (None, Some("from-extension"), Some("from-extension")),
        (
            Some("from-header"),
            Some("from-extension"),
            Some("from-header"),
        ),
        (None, None, None),
    ] {
        let (server, seen) = scripted(vec![(503, vec![], ""), (201, vec![], "{}")]);
        let client = ClientLayer::new()
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .layer(server);
        let mut request = intent(1);
        if let Some(header) = header {
            request
                .headers_mut()
                .insert("idempotency-key", header.parse().unwrap());
        }
        if let Some(extension) = extension {
            request.extensions_mut().insert(key(extension));
        }
        let response = client.oneshot(request).await.unwrap();
        let seen: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], seen[1], "one key for both attempts");
        let given = response
            .extensions()
            .get::<IntentKey>()
            .expect("the key sent");
        assert_eq!(Some(given.0.to_str().unwrap()), seen[0].as_deref());
        match sent {
            Some(sent) => assert_eq!(seen[0].as_deref(), Some(sent)),
            None => assert_eq!(seen[0].as_ref().map(String::len), Some(32), "made"),
        }
    }
    // A request the layer does not key carries no key, and gets none back.
    let (server, seen) = scripted(vec![(200, vec![], "")]);
    let mut get = intent(1);
    *get.method_mut() = http::Method::GET;
    get.extensions_mut().insert(key("ignored"));
    let response = ClientLayer::new().layer(server).oneshot(get).await.unwrap();
    assert!(response.extensions().get::<IntentKey>().is_none());
    assert_eq!(seen.lock().unwrap()[0].0, None);
}

/// A body of the frames given, in order: data and trailers.
pub(crate) struct Frames(pub(crate) std::collections::VecDeque<http_body::Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// An outer `tower::retry` policy for the tests: retries a failed request up to `0` times,
/// cloning it whole.
#[derive(Clone)]
pub(crate) struct Again(pub(crate) usize);

impl<Res> tower::retry::Policy<Request<Full<Bytes>>, Res, BoxError> for Again {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<Full<Bytes>>,
        result: &mut Result<Res, BoxError>,
    ) -> Option<Self::Future> {
        (result.is_err() && self.0 > 0).then(|| {
            self.0 -= 1;
            std::future::ready(())
        })
    }

    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(request.body().clone());
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.headers_mut() = request.headers().clone();
        *clone.extensions_mut() = request.extensions().clone();
        Some(clone)
    }
}

/// A server that advertises a two-second replay window in its first answer (a `503` to retry),
/// then loses every answer (the connection cut): the client sends no attempt two seconds or
/// more after the first, gives up naming the window, and every retry says when the intent was
/// first sent.
#[tokio::test(start_paused = true)]
pub(crate) async fn no_attempt_goes_past_the_window_the_server_advertised() {
    use tower_idempotency::client::{GaveUp, Stop};
    /// Each attempt: when it came, and the first-sent time it carried.
    type Sent = Arc<Mutex<Vec<(tokio::time::Instant, Option<String>)>>>;
    let sent: Sent = Arc::default();
    let log = Arc::clone(&sent);
    let server = service_fn(move |request: Request<Full<Bytes>>| {
        let log = Arc::clone(&log);
        async move {
            let first_sent = request
                .headers()
                .get("repeatability-first-sent")
                .map(|value| value.to_str().unwrap().to_owned());
            let mut log = log.lock().unwrap();
            log.push((tokio::time::Instant::now(), first_sent));
            if log.len() > 1 {
                return Err::<Response<Full<Bytes>>, BoxError>("the connection was cut".into());
            }
            let response = Response::builder()
                .status(503)
                .header("idempotency-ttl", "2")
                .header("retry-after", "1")
                .body(Full::new(Bytes::new()))
                .unwrap();
            Ok(response)
        }
    });
    let client = ClientLayer::new()
        .max_attempts(1_000)
        .backoff(Duration::from_millis(100), Duration::from_millis(300))
        .layer(server);
    let error = client.oneshot(intent(9)).await.unwrap_err();
    let gave_up = error.downcast_ref::<GaveUp>().expect("the client gave up");
    let window = Duration::from_secs(2);
    assert_eq!(gave_up.stop, Stop::Lifetime { window });
    assert!(
        gave_up.to_string().contains("replay window of 2 s"),
        "{gave_up}"
    );
    let sent = sent.lock().unwrap().clone();
    assert!(sent.len() > 3, "retries were made: {}", sent.len());
    let first = sent[0].0;
    assert!(sent.iter().all(|(at, _)| *at - first < window), "{sent:?}");
    assert_eq!(sent[0].1, None, "the first attempt is no retry");
    let date = sent[1]
        .1
        .clone()
        .expect("a retry says when the intent was first sent");
    // An HTTP date: `Sat, 05 Dec 2026 13:30:00 GMT`.
    assert!(date.len() == 29 && date.ends_with(" GMT"), "{date}");
    assert!(
        sent[1..]
            .iter()
            .all(|(_, said)| said.as_deref() == Some(date.as_str()))
    );
}

/// A window known beforehand bounds the retries of a server that never answers.
#[tokio::test(start_paused = true)]
pub(crate) async fn a_window_set_beforehand_bounds_the_retries() {
    use tower_idempotency::client::{GaveUp, Stop};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let server = service_fn(move |_: Request<Full<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<Full<Bytes>>, BoxError>("the connection was cut".into()) }
    });
    let window = Duration::from_secs(1);
    let client = ClientLayer::new()
        .max_attempts(1_000)
        .replay_window(window)
        .backoff(Duration::from_millis(50), Duration::from_millis(100))
        .layer(server);
    let started = tokio::time::Instant::now();
    let error = client.oneshot(intent(10)).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<GaveUp>().map(|gave_up| gave_up.stop),
        Some(Stop::Lifetime { window })
    );
    assert!(started.elapsed() < window);
    assert!(calls.load(Ordering::SeqCst) > 3);
}
