//! The client layer through reqwest-middleware: lost replies, attempt times, errors that lost no answer, budgets and retries outside the middleware.
#![cfg(feature = "client")]

#[allow(unused_imports)]
use crate::client::*;
#[allow(unused_imports)]
use crate::end_to_end::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower::retry::budget::TpsBudget;
use tower_idempotency::MemoryStore;
use tower_idempotency::client::{Attempts, ClientLayer};

/// A plain reqwest client. With the feature `check` on too, reqwest's TLS is rustls without a
/// crypto provider of its own, so one is installed for the process first, as an application
/// with both would.
fn http_client() -> reqwest::Client {
    #[cfg(feature = "check")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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
    let client = reqwest_middleware::ClientBuilder::new(http_client())
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

/// Through `reqwest`, a server that advertises a one-second window and keeps answering `503`:
/// the middleware learns the window from the first answer and sends no attempt a second or
/// more after the first (its cap of attempts would have gone on far longer), every retry
/// saying when the intent was first sent.
#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_sends_no_attempt_past_the_advertised_window() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<(std::time::Instant, bool)>>> = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut request = vec![0u8; 8192];
                loop {
                    let Ok(read) = socket.read(&mut request).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    let head = String::from_utf8_lossy(&request[..read]).to_lowercase();
                    let retry = head.contains("repeatability-first-sent:");
                    log.lock().unwrap().push((std::time::Instant::now(), retry));
                    let answer = "HTTP/1.1 503 Service Unavailable\r\nidempotency-ttl: 1\r\n\
                                  retry-after: 0\r\ncontent-length: 0\r\n\r\n";
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let retries = ClientLayer::new()
        .max_attempts(10_000)
        .backoff(Duration::from_millis(20), Duration::from_millis(40))
        .budget(TpsBudget::new(Duration::from_secs(10), 10_000, 1.0))
        .reqwest_middleware();
    let client = reqwest_middleware::ClientBuilder::new(http_client())
        .with(retries)
        .build();
    let response = client
        .post(format!("http://{addr}/payments"))
        .header("content-type", "application/json")
        .body(r#"{"amount":1}"#)
        .send()
        .await
        .expect("the last answer");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let attempts = response.extensions().get::<Attempts>().unwrap().0;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), attempts as usize);
    assert!(attempts > 2, "retries were made: {attempts}");
    assert!(
        attempts < 100,
        "stopped by the window, not the cap: {attempts}"
    );
    let first = seen[0].0;
    assert!(
        seen.iter()
            .all(|(at, _)| at.duration_since(first) < Duration::from_secs(1))
    );
    assert!(!seen[0].1 && seen[1..].iter().all(|(_, retry)| *retry));
}
