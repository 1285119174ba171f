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
use tower_idempotency::body::RequestBody;
use tower_idempotency::client::{Attempts, ClientLayer};
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// A payment, as a client sends it: no key of its own.
fn intent(amount: u32) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"amount":{amount}}}"#))))
        .unwrap()
}

/// What a scripted server saw of each attempt: its key and its body.
type Seen = Arc<Mutex<Vec<(Option<String>, Bytes)>>>;

/// A scripted answer: its status, headers and body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// A server that answers each attempt with the next of `answers` (the last again when they
/// run out), and records what it saw.
fn scripted(
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

async fn status_and_attempts<S>(client: S, request: Request<Full<Bytes>>) -> (u16, u32)
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
async fn a_lost_reply_is_retried_with_the_same_key_and_creates_once() {
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
async fn retry_after_is_honoured_and_every_attempt_is_the_same_request() {
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
async fn a_pending_first_attempt_is_retried_and_refusals_are_final() {
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
async fn the_budget_bounds_retries_when_the_server_is_down() {
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
async fn attempts_stop_at_the_cap_and_the_deadline() {
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
enum Slow {
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
async fn a_stalled_or_long_409_and_a_long_retry_after_are_handled_in_time() {
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
async fn the_settings_key_cap_and_limit_as_set() {
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
struct NeverReady;

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
async fn readiness_is_the_services() {
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
async fn a_service_never_ready_gives_up_at_the_deadline_after_no_attempt() {
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
async fn an_answer_is_given_without_its_body_being_read() {
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

/// A loopback TCP proxy of the test's own that loses the reply of its first `lose`
/// connections: it forwards the request, waits until the server has answered (its first
/// bytes back), and cuts both ends without passing the answer on. Later connections are
/// forwarded both ways. Returns its address and how many replies it lost.
async fn losing_proxy(
    upstream: std::net::SocketAddr,
    lose: usize,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let lost = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&lost);
    tokio::spawn(async move {
        for n in 0.. {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                if n >= lose {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    return;
                }
                let (mut client_read, _client_write) = client.split();
                let (mut server_read, mut server_write) = server.split();
                let mut answer = [0u8; 1];
                // The request goes through until the server's answer starts: then both ends
                // are dropped, the answer with them.
                tokio::select! {
                    _ = tokio::io::copy(&mut client_read, &mut server_write) => {}
                    read = server_read.read(&mut answer) => {
                        if matches!(read, Ok(1)) {
                            counted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    (addr, lost)
}

/// Serves `store` behind the server layer on loopback, a JSON create that counts its calls
/// and answers `201`; returns the address and the count.
async fn serve<St: tower_idempotency::Store>(
    store: St,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let creates = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&creates);
    let create = move |body: Bytes| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = format!(
                r#"{{"payment":{n},"request":{}}}"#,
                String::from_utf8_lossy(&body)
            );
            (StatusCode::CREATED, body)
        }
    };
    let router = axum::Router::new().route(
        "/payments",
        axum::routing::post(create)
            .route_layer(IdempotencyLayer::new(store, JsonOperation::new()).global_keys()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, creates)
}

/// The status, the attempts and the body of `request`'s answer through `client`.
async fn answer_of<S, B>(client: S, request: Request<Full<Bytes>>) -> (StatusCode, u32, Bytes)
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = BoxError>,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = client.oneshot(request).await.expect("an answer");
    let attempts = response.extensions().get::<Attempts>().unwrap().0;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, attempts, body)
}

/// End to end over loopback: the client layer on a hyper client, through a proxy that loses
/// the replies of the first attempts after the server made them, to the server layer on
/// `store`. Every intent gets its `201`, and the server creates once an intent.
async fn lost_replies_end_to_end<St: tower_idempotency::Store>(store: St) {
    let intents: u32 = 12;
    let (server, creates) = serve(store).await;
    let (proxy, lost) = losing_proxy(server, intents as usize).await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let http = tower::ServiceBuilder::new()
        .map_err(|error: hyper_util::client::legacy::Error| -> BoxError { Box::new(error) })
        .service(http);
    let client = ClientLayer::new()
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .attempt_timeout(Duration::from_secs(10))
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0))
        .layer(http);
    let sent: Vec<_> = (1..=intents)
        .map(|amount| {
            let mut request = intent(amount);
            *request.uri_mut() = format!("http://{proxy}/payments").parse().unwrap();
            tokio::spawn(answer_of(client.clone(), request))
        })
        .collect();
    let mut payments = std::collections::HashSet::new();
    let mut attempted = 0;
    for (amount, reply) in (1..=intents).zip(sent) {
        let (status, attempts, body) = reply.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "intent {amount}");
        attempted += attempts as usize;
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.ends_with(&format!(r#""request":{{"amount":{amount}}}}}"#)),
            "{body}"
        );
        payments.insert(body);
    }
    // Each of the first connections carried an attempt whose reply was lost (one may have
    // been opened for an attempt another connection took, and carry none); each loss took
    // its intent one more attempt.
    let lost = lost.load(Ordering::SeqCst);
    assert!(lost + 1 >= intents as usize, "replies lost: {lost}");
    assert!(attempted >= intents as usize + lost, "{attempted} attempts");
    assert_eq!(
        creates.load(Ordering::SeqCst),
        intents as usize,
        "one create an intent"
    );
    assert_eq!(payments.len(), intents as usize, "one payment an intent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_end_to_end_on_the_memory_store() {
    lost_replies_end_to_end(MemoryStore::new()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_end_to_end_on_postgresql() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let store = tower_idempotency::store::PostgresStore::connect(&url)
        .await
        .expect("PostgreSQL at DATABASE_URL")
        .table("tower_idempotency_client_test")
        .unwrap();
    store.migrate().await.unwrap();
    lost_replies_end_to_end(store).await;
}

/// A key set as the request's `IntentKey` extension is the one every attempt sends, unless
/// the request has an `Idempotency-Key` header, which wins; the key sent, made by the layer
/// too, is in the answer's extensions.
#[tokio::test(start_paused = true)]
async fn the_intent_key_is_sent_and_given_back() {
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
struct Frames(std::collections::VecDeque<http_body::Frame<Bytes>>);

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

/// A gRPC answer: `grpc-status` `code` in the headers (trailers only) or after a message in
/// the trailers, or no status at all (`None`: the answer was cut short).
fn grpc_answer(code: Option<&str>, trailers_only: bool, web: bool) -> Response<Frames> {
    let mut frames = std::collections::VecDeque::new();
    let mut response = Response::builder().header(
        "content-type",
        if web {
            "application/grpc-web+proto"
        } else {
            "application/grpc"
        },
    );
    match (code, trailers_only) {
        (Some(code), true) => response = response.header("grpc-status", code),
        (code, _) => {
            frames.push_back(http_body::Frame::data(Bytes::from_static(
                b"\0\0\0\0\x02hi",
            )));
            if let Some(code) = code {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", code.parse().unwrap());
                frames.push_back(http_body::Frame::trailers(trailers));
            }
        }
    }
    response.body(Frames(frames)).unwrap()
}

/// gRPC answers are decided by their `grpc-status`, in the headers or the trailers:
/// `UNAVAILABLE` and `ABORTED` retried, every other code final, an answer without a status a
/// lost one (retried); the answer read for its trailers is given whole, message and trailers.
/// gRPC-web answers are decided by their HTTP status.
#[tokio::test(start_paused = true)]
async fn grpc_answers_are_decided_by_their_status_in_headers_or_trailers() {
    type Script = Vec<(Option<&'static str>, bool, bool)>;
    let run = |script: Script| async move {
        let next = Arc::new(AtomicUsize::new(0));
        let served = Arc::clone(&next);
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            let i = served.fetch_add(1, Ordering::SeqCst).min(script.len() - 1);
            let (code, trailers_only, web) = script[i];
            async move { Ok::<_, BoxError>(grpc_answer(code, trailers_only, web)) }
        });
        let client = ClientLayer::new()
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .layer(server);
        let mut call = intent(1);
        call.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        let response = client.oneshot(call).await.unwrap();
        let attempts = response.extensions().get::<Attempts>().unwrap().0;
        let read = response.into_body().collect().await.unwrap();
        let status = read
            .trailers()
            .and_then(|trailers| trailers.get("grpc-status"))
            .map(|code| code.to_str().unwrap().to_owned());
        (attempts, read.to_bytes(), status)
    };
    // Retried in the trailers and in the headers, then OK in the trailers: given whole.
    let (attempts, message, status) = run(vec![
        (Some("14"), false, false),
        (Some("10"), true, false),
        (None, false, false),
        (Some("0"), false, false),
    ])
    .await;
    assert_eq!(attempts, 4);
    assert_eq!(message.as_ref(), b"\0\0\0\0\x02hi");
    assert_eq!(status.as_deref(), Some("0"));
    // Final at once: INVALID_ARGUMENT, FAILED_PRECONDITION, OK in the headers.
    for code in ["3", "9", "0"] {
        for trailers_only in [false, true] {
            let (attempts, _, _) = run(vec![(Some(code), trailers_only, false)]).await;
            assert_eq!(attempts, 1, "{code} {trailers_only}");
        }
    }
    // gRPC-web: its status is in its body; the HTTP status (200) decides.
    let (attempts, _, _) = run(vec![(Some("14"), false, true)]).await;
    assert_eq!(attempts, 1);
}

/// The same lost replies through `reqwest` with the client layer's middleware: every intent
/// gets its 201, the server creates once an intent, and a conflict is the caller's at once.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_through_reqwest_create_once() {
    use tower_idempotency::client::IntentKey;
    let intents: u32 = 12;
    let (server, creates) = serve(MemoryStore::new()).await;
    let (proxy, lost) = losing_proxy(server, intents as usize).await;
    let retries = ClientLayer::new()
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .attempt_timeout(Duration::from_secs(10))
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0))
        .reqwest_middleware();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(retries)
        .build();
    let sent: Vec<_> = (1..=intents)
        .map(|amount| {
            let request = client
                .post(format!("http://{proxy}/payments"))
                .header("content-type", "application/json")
                .body(format!(r#"{{"amount":{amount}}}"#));
            tokio::spawn(async move {
                let response = request.send().await.expect("an answer");
                let attempts = response.extensions().get::<Attempts>().unwrap().0;
                let key = response.extensions().get::<IntentKey>().cloned().unwrap();
                let status = response.status();
                (status, attempts, key, response.text().await.unwrap())
            })
        })
        .collect();
    let mut attempted = 0;
    let mut keys = std::collections::HashSet::new();
    for (amount, reply) in (1..=intents).zip(sent) {
        let (status, attempts, key, body) = reply.await.unwrap();
        assert_eq!(status, 201, "intent {amount}");
        assert!(
            body.ends_with(&format!(r#""request":{{"amount":{amount}}}}}"#)),
            "{body}"
        );
        attempted += attempts as usize;
        keys.insert(key);
    }
    let lost = lost.load(Ordering::SeqCst);
    assert!(lost + 1 >= intents as usize, "replies lost: {lost}");
    assert!(attempted >= intents as usize + lost, "{attempted} attempts");
    assert_eq!(keys.len(), intents as usize, "a key an intent");
    assert_eq!(
        creates.load(Ordering::SeqCst),
        intents as usize,
        "one create an intent"
    );
    // A key reused for another body: the server's 422 is final, after one attempt.
    let reused = client
        .post(format!("http://{proxy}/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", keys.iter().next().unwrap().0.clone())
        .body(r#"{"amount":999}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(reused.extensions().get::<Attempts>(), Some(&Attempts(1)));
}

/// An answer too long for the layer to decide on (a gRPC answer over 4 MiB, a `409` over
/// 64 KiB, neither saying its length) is final, after one attempt, and given whole: what the
/// layer read, then the rest, then the trailers.
#[tokio::test(start_paused = true)]
async fn an_answer_too_long_to_decide_on_is_final_and_given_whole() {
    let chunk = Bytes::from(vec![b'x'; 1024 * 1024]);
    for (content_type, status, chunks) in [
        ("application/grpc", 200, 5),
        ("application/problem+json", 409, 1),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let sent = chunk.clone();
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut frames: std::collections::VecDeque<_> = (0..chunks)
                .map(|_| http_body::Frame::data(sent.clone()))
                .collect();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            frames.push_back(http_body::Frame::trailers(trailers));
            let response = Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Frames(frames))
                .unwrap();
            async move { Ok::<_, BoxError>(response) }
        });
        let response = ClientLayer::new()
            .layer(server)
            .oneshot(intent(1))
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
        let read = response.into_body().collect().await.unwrap();
        let trailers = read.trailers().cloned();
        assert_eq!(
            read.to_bytes().len(),
            chunks * chunk.len(),
            "{content_type}"
        );
        assert_eq!(
            trailers.and_then(|t| t.get("grpc-status").cloned()),
            Some("0".parse().unwrap())
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{content_type}: not retried"
        );
    }
}

/// A server that answers every request `status` with a chunked body whose first chunk it
/// sends, then stalls, the connection open.
#[cfg(feature = "reqwest")]
async fn stalling(status: u16) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 {status} Stalled\r\ncontent-type: application/json\r\n\
                     transfer-encoding: chunked\r\n\r\n5\r\n{{\"err\r\n"
                );
                let _ = socket.write_all(head.as_bytes()).await;
                // Stalls: read until the client goes away.
                let _ = socket.read(&mut request).await;
            });
        }
    });
    addr
}

/// Through `reqwest`, a `409` whose body stalls is given up by the attempt's time, and the
/// request ends by its deadline; a body that cannot be sent twice is sent once, within the
/// deadline too, with its key and its one attempt on the answer.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_answers_are_read_within_the_attempts_time() {
    use tower_idempotency::client::IntentKey;
    let stalling = stalling(409).await;
    let layer = ClientLayer::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .attempt_timeout(Duration::from_millis(200))
        .deadline(Duration::from_secs(1))
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(layer.reqwest_middleware())
        .build();
    let started = std::time::Instant::now();
    let stalled = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .post(format!("http://{stalling}/payments"))
            .body(r#"{"amount":1}"#)
            .send(),
    )
    .await
    .expect("ended by the deadline");
    assert!(stalled.is_err(), "no answer in time");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A body that cannot be cloned: sent once, within the deadline.
    let once = || reqwest::Body::wrap(Full::new(Bytes::from_static(br#"{"amount":2}"#)));
    let started = std::time::Instant::now();
    let stalled = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .post(format!("http://{stalling}/payments"))
            .body(once())
            .send(),
    )
    .await
    .expect("ended by the deadline");
    assert!(stalled.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (server, creates) = serve(MemoryStore::new()).await;
    let response = client
        .post(format!("http://{server}/payments"))
        .header("content-type", "application/json")
        .body(once())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
    assert_eq!(
        response
            .extensions()
            .get::<IntentKey>()
            .map(|key| key.0.len()),
        Some(32),
        "the key the middleware made"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// A body of `len` bytes in chunks of at most 1 MiB, then `trailers` if any: no declared
/// length.
fn long_body(len: usize, trailers: Option<http::HeaderMap>) -> Frames {
    let mut frames = std::collections::VecDeque::new();
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1024 * 1024);
        frames.push_back(http_body::Frame::data(Bytes::from(vec![b' '; chunk])));
        left -= chunk;
    }
    if let Some(trailers) = trailers {
        frames.push_back(http_body::Frame::trailers(trailers));
    }
    Frames(frames)
}

/// The limits are inclusive: a gRPC answer of exactly 4 MiB and its frame header, or a `409`
/// of exactly 64 KiB, is read whole and decided on (here: retried, as `UNAVAILABLE` and a
/// pending first attempt say); one byte more is final, however it would have been decided.
#[tokio::test(start_paused = true)]
async fn the_limits_of_what_is_read_to_decide_are_inclusive() {
    let pending = br#"{"error":"request_pending"}"#;
    for (grpc, limit) in [(true, 4 * 1024 * 1024 + 5), (false, 64 * 1024)] {
        for (len, retried) in [(limit, true), (limit + 1, false)] {
            let calls = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&calls);
            let server = service_fn(move |_: Request<Full<Bytes>>| {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                let response = if !first {
                    Response::builder().status(201).body(long_body(0, None))
                } else if grpc {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "14".parse().unwrap());
                    Response::builder()
                        .header("content-type", "application/grpc")
                        .body(long_body(len, Some(trailers)))
                } else {
                    // A pending answer padded with spaces after its JSON, to `len` bytes.
                    let mut body = long_body(len - pending.len(), None);
                    body.0
                        .push_front(http_body::Frame::data(Bytes::from_static(pending)));
                    Response::builder().status(409).body(body)
                };
                async move { Ok::<_, BoxError>(response.unwrap()) }
            });
            let response = ClientLayer::new()
                .backoff(Duration::from_millis(1), Duration::from_millis(1))
                .layer(server)
                .oneshot(intent(1))
                .await
                .unwrap();
            let attempts = response.extensions().get::<Attempts>().unwrap().0;
            assert_eq!(
                attempts,
                if retried { 2 } else { 1 },
                "grpc {grpc}, {len} bytes"
            );
            if !retried {
                // What the layer read first, then the rest: not over until the rest is.
                use http_body::Body as _;
                let mut body = std::pin::pin!(response.into_body());
                let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
                assert!(!body.is_end_stream(), "the rest to come");
                let rest = body.collect().await.unwrap().to_bytes();
                assert_eq!(first.len() + rest.len(), len, "given whole");
            }
        }
    }
}

/// A body the layer read whole ends when its data and trailers are out, not before; the
/// server's body, streamed, ends when the server's does.
#[tokio::test(start_paused = true)]
async fn a_read_body_ends_with_its_last_frame() {
    use http_body::Body as _;
    let server = service_fn(|_: Request<Full<Bytes>>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "3".parse().unwrap());
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .body(long_body(10, Some(trailers)))
            .unwrap();
        Ok::<_, BoxError>(response)
    });
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    let mut body = std::pin::pin!(response.into_body());
    assert!(!body.is_end_stream(), "data and trailers to come");
    assert_eq!(body.size_hint().exact(), Some(10));
    let data = body.frame().await.unwrap().unwrap();
    assert_eq!(data.data_ref().map(Bytes::len), Some(10));
    assert!(!body.is_end_stream(), "the trailers to come");
    let trailers = body.frame().await.unwrap().unwrap();
    assert!(trailers.is_trailers());
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    // Streamed: the server's own.
    let (server, _) = scripted(vec![(201, vec![], "")]);
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    assert!(response.body().is_end_stream(), "an empty Full");
    let (server, _) = scripted(vec![(201, vec![], "{}")]);
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    assert!(!response.body().is_end_stream());
}

/// Through `reqwest`, only an error that may have lost an answer is retried: a redirect loop
/// (reqwest's own error, not a connection's) and another middleware's error are final, after
/// one attempt.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_errors_that_lost_no_answer_are_final() {
    use std::sync::atomic::AtomicUsize;
    // A server that redirects every request to itself.
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&seen);
    let router = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { (StatusCode::FOUND, [("location", "/again")]) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let layer = ClientLayer::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(layer.reqwest_middleware())
        .build();
    let looped = client
        .post(format!("http://{addr}/payments"))
        .body("{}")
        .send()
        .await;
    assert!(looped.is_err(), "too many redirects");
    let one_attempt = seen.load(Ordering::SeqCst);
    assert!(
        (2..=20).contains(&one_attempt),
        "one attempt's redirects: {one_attempt}"
    );
    // Another middleware's error.
    struct Refuses(Arc<AtomicUsize>);
    #[async_trait::async_trait]
    impl reqwest_middleware::Middleware for Refuses {
        async fn handle(
            &self,
            _: reqwest::Request,
            _: &mut http::Extensions,
            _: reqwest_middleware::Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("refused"),
            ))
        }
    }
    let refusals = Arc::new(AtomicUsize::new(0));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(layer.reqwest_middleware())
        .with(Refuses(Arc::clone(&refusals)))
        .build();
    let refused = client
        .post(format!("http://{addr}/payments"))
        .body("{}")
        .send()
        .await;
    assert!(refused.is_err());
    assert_eq!(refusals.load(Ordering::SeqCst), 1, "not retried");
}

/// Through `reqwest`: an attempt that runs out of its time is retried with the same key, and
/// a cloneable request funds the retry budget (a budget of no free retries allows it); an
/// answer other than a `409` is given without its body being read, one that stalls included.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_retries_a_timed_out_attempt_on_the_intents_own_budget() {
    use tower_idempotency::client::IntentKey;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&keys);
    let router = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        let key = headers["idempotency-key"].to_str().unwrap().to_owned();
        seen.lock().unwrap().push(key);
        async move {
            if first {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            StatusCode::CREATED
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let layer = ClientLayer::new()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .attempt_timeout(Duration::from_millis(300))
        // No retry but those the intents fund.
        .budget(TpsBudget::new(Duration::from_secs(10), 0, 1.0));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(layer.reqwest_middleware())
        .build();
    let response = client
        .post(format!("http://{addr}/payments"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(2)));
    let key = response.extensions().get::<IntentKey>().unwrap().0.clone();
    assert_eq!(*keys.lock().unwrap(), [key.to_str().unwrap(); 2]);
    // A 201 whose body stalls: given at once, its body the caller's to read.
    let stalling = stalling(201).await;
    let started = std::time::Instant::now();
    let response = client
        .post(format!("http://{stalling}/payments"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

/// An outer `tower::retry` policy for the tests: retries a failed request up to `0` times,
/// cloning it whole.
#[derive(Clone)]
struct Again(usize);

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

/// `tower::retry::Retry` outside the client layer, whose own attempts run out at the first
/// lost reply: with `SameKey` every outer retry is the same intent (one create an intent);
/// with the plain policy each is a new key, and a reply lost after the server created is a
/// second create. The layer's error says how many attempts it made and why it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outer_tower_retry_with_same_key_creates_once_an_intent() {
    use tower_idempotency::client::{GaveUp, SameKey, Stop};
    let intents = 3;
    let lose = 3;
    for same_key in [true, false] {
        let (server, creates) = serve(MemoryStore::new()).await;
        let (proxy, lost) = losing_proxy(server, lose).await;
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<Bytes>>();
        let http = tower::ServiceBuilder::new()
            .map_err(|error: hyper_util::client::legacy::Error| -> BoxError { Box::new(error) })
            .service(http);
        let inner = ClientLayer::new().max_attempts(1).layer(http);
        // What the layer says when it gives up.
        let mut first = intent(1);
        *first.uri_mut() = format!("http://{proxy}/payments").parse().unwrap();
        let error = inner
            .clone()
            .oneshot(first)
            .await
            .expect_err("a lost reply");
        let gave_up = error.downcast_ref::<GaveUp>().expect("a GaveUp");
        assert_eq!((gave_up.attempts, gave_up.stop), (1, Stop::AttemptCap));
        assert!(gave_up.key.is_some());
        for amount in 1..=intents {
            let mut request = intent(amount);
            *request.uri_mut() = format!("http://{proxy}/payments").parse().unwrap();
            let status = if same_key {
                let client = tower::retry::Retry::new(SameKey(Again(lose)), inner.clone());
                client.oneshot(request).await.expect("an answer").status()
            } else {
                let client = tower::retry::Retry::new(Again(lose), inner.clone());
                client.oneshot(request).await.expect("an answer").status()
            };
            assert_eq!(status, StatusCode::CREATED, "intent {amount}");
        }
        assert_eq!(lost.load(Ordering::SeqCst), lose);
        // The first request's intent created once, its key then dropped: one create more.
        let created = creates.load(Ordering::SeqCst);
        if same_key {
            assert_eq!(created, 1 + intents as usize, "one create an intent");
        } else {
            assert!(
                created > 1 + intents as usize,
                "a new key each retry: {created}"
            );
        }
    }
}

/// reqwest-retry outside the middleware, whose own attempts run out at the first lost reply:
/// the key the middleware made is written back to the request's extensions, which
/// reqwest-middleware hands every attempt, so each outer retry is the same intent.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_retry_outside_the_middleware_creates_once_an_intent() {
    use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};
    let intents = 3;
    let lose = 3;
    let (server, creates) = serve(MemoryStore::new()).await;
    let (proxy, lost) = losing_proxy(server, lose).await;
    let ours = ClientLayer::new().max_attempts(1).reqwest_middleware();
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(20))
        .build_with_max_retries(lose as u32);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .with(ours)
        .build();
    for amount in 1..=intents {
        let response = client
            .post(format!("http://{proxy}/payments"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{amount}}}"#))
            .send()
            .await
            .expect("an answer");
        assert_eq!(response.status(), 201, "intent {amount}");
    }
    assert_eq!(lost.load(Ordering::SeqCst), lose);
    assert_eq!(
        creates.load(Ordering::SeqCst),
        intents as usize,
        "one create an intent"
    );
}
