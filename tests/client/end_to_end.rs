//! The client layer against the server layer over a proxy that loses replies: one create per intent, on the memory store and PostgreSQL, and under an outer tower retry.
#![cfg(feature = "client")]

#[allow(unused_imports)]
use crate::client::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::retry::budget::TpsBudget;
use tower::{BoxError, Layer, ServiceExt};
use tower_idempotency::client::{Attempts, ClientLayer};
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// A loopback TCP proxy of the test's own that loses the reply of its first `lose`
/// connections: it forwards the request, waits until the server has answered (its first
/// bytes back), and cuts both ends without passing the answer on. Later connections are
/// forwarded both ways. Returns its address and how many replies it lost.
pub(crate) async fn losing_proxy(
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
pub(crate) async fn serve<St: tower_idempotency::store::Store>(
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
pub(crate) async fn answer_of<S, B>(
    client: S,
    request: Request<Full<Bytes>>,
) -> (StatusCode, u32, Bytes)
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
pub(crate) async fn lost_replies_end_to_end<St: tower_idempotency::store::Store>(store: St) {
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
pub(crate) async fn lost_replies_end_to_end_on_the_memory_store() {
    lost_replies_end_to_end(MemoryStore::new()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn lost_replies_end_to_end_on_postgresql() {
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

/// `tower::retry::Retry` outside the client layer, whose own attempts run out at the first
/// lost reply: with `SameKey` every outer retry is the same intent (one create an intent);
/// with the plain policy each is a new key, and a reply lost after the server created is a
/// second create. The layer's error says how many attempts it made and why it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn an_outer_tower_retry_with_same_key_creates_once_an_intent() {
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
