//! Bounded resources: a body is never read past the limit, a stalled body holds no
//! reservation, a created response is capped.

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body::{Body, Frame, SizeHint};
use tower::ServiceExt;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// An endless body of 64 KiB chunks that counts the bytes it handed out.
struct Endless {
    pulled: Arc<AtomicUsize>,
    chunk: Bytes,
}

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.pulled.fetch_add(self.chunk.len(), Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A body that never delivers anything.
struct Stalled;

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

fn create_service<B>(
    store: MemoryStore,
    creates: Arc<AtomicUsize>,
) -> impl tower::Service<
    http::Request<B>,
    Response = http::Response<tower_idempotency::layer::ResponseBody<http_body_util::Full<Bytes>>>,
    Error = CreateError,
    Future: Send,
> + Clone
where
    B: Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    tower::Layer::layer(
        &IdempotencyLayer::new(store, LabelContract).global_keys(),
        tower::service_fn(move |_: http::Request<RequestBody<B>>| {
            creates.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, CreateError>(created_response()) }
        }),
    )
}

#[tokio::test]
async fn an_endless_body_is_read_no_further_than_one_chunk_past_the_limit() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let body = Endless {
        pulled: Arc::clone(&pulled),
        chunk: Bytes::from(vec![b' '; 64 * 1024]),
    };
    let request = http::Request::post("/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(body)
        .unwrap();
    let response = create_service(store.clone(), Arc::clone(&creates))
        .oneshot(request)
        .await
        .unwrap();
    Reply::read(response)
        .await
        .exact(413, r#"{"error":"payload_too_large"}"#);
    // An endless (terabytes, if it were sent) body cost one chunk: memory stays flat.
    assert_eq!(pulled.load(Ordering::SeqCst), 64 * 1024);
    assert!(store.is_empty());
    assert_eq!(creates.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_small_chunked_stream_past_the_limit_stops_at_limit_plus_one_chunk() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let body = Endless {
        pulled: Arc::clone(&pulled),
        chunk: Bytes::from_static(b"          "), // 10 bytes a frame
    };
    let request = http::Request::post("/labels")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let service = create_service(MemoryStore::new(), Arc::default());
    Reply::read(service.oneshot(request).await.unwrap())
        .await
        .exact(413, r#"{"error":"payload_too_large"}"#);
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        4100,
        "4096 + one 10-byte frame"
    );
}

#[tokio::test]
async fn a_declared_oversize_body_is_not_read_at_all() {
    let pulled = Arc::new(AtomicUsize::new(0));
    let body = Endless {
        pulled: Arc::clone(&pulled),
        chunk: Bytes::from_static(b"x"),
    };
    let request = http::Request::post("/labels")
        .header("content-type", "application/json")
        .header("content-length", "1099511627776")
        .body(body)
        .unwrap();
    let service = create_service(MemoryStore::new(), Arc::default());
    Reply::read(service.oneshot(request).await.unwrap())
        .await
        .exact(413, r#"{"error":"payload_too_large"}"#);
    assert_eq!(pulled.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_stalled_body_holds_no_reservation() {
    let store = MemoryStore::new();
    let request = http::Request::post("/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(Stalled)
        .unwrap();
    let service = create_service(store.clone(), Arc::default());
    let stalled = tokio::time::timeout(Duration::from_millis(100), service.oneshot(request)).await;
    assert!(stalled.is_err(), "still waiting for the body");
    assert!(
        store.is_empty(),
        "nothing claimed while the body is incomplete"
    );
    // The abandoned attempt left nothing behind: the operation is new.
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store.clone(), Arc::clone(&creates), Duration::ZERO);
    send_to(&service, valid()).await.is_created();
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}
