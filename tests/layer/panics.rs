//! Panics in the create or in admission: caught once, a 500 for the client, the key kept
//! pending (the create may have run), the admission permit freed, nothing polled after a panic.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use http::Request;
use tower::{Layer, ServiceExt};
use tower_idempotency::admission::{Admit, ConcurrencyLimit, admit_fn};
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// A create that panics in its future for `parcel_id` "boom", in its `call` for "bang", and
/// otherwise answers the label contract's 201 after `delay`.
fn panicking_create(calls: Arc<AtomicUsize>, delay: Duration) -> Inner {
    Inner::new(tower::service_fn(
        move |request: Request<RequestBody<Chunks>>| {
            calls.fetch_add(1, Ordering::SeqCst);
            let parcel = request
                .extensions()
                .get::<LabelOperation>()
                .map(|op| op.parcel_id.clone())
                .unwrap_or_default();
            assert_ne!(parcel, "bang", "the create panics in call");
            async move {
                tokio::time::sleep(delay).await;
                assert_ne!(parcel, "boom", "the create panics in its future");
                Ok::<_, CreateError>(created_response())
            }
        },
    ))
}

#[tokio::test]
async fn a_create_that_panics_is_a_500_once_and_the_key_stays_pending() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let limit = ConcurrencyLimit::new(1);
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .admission(limit.clone())
        .layer(panicking_create(Arc::clone(&calls), Duration::ZERO));
    for parcel in ["boom", "bang"] {
        let key = format!("panic-{parcel}");
        let reply = send_to_service(&service, operation(&key, parcel)).await;
        reply.exact(500, r#"{"error":"create_failed"}"#);
        assert_eq!(reply.outcome, Some(Outcome::CreateFailed));
        assert!(store.is_pending(&key_of(&key)), "the create may have run");
        assert_eq!(limit.available(), 1, "the admission permit is freed");
        send_to_service(&service, operation(&key, parcel))
            .await
            .exact(409, r#"{"error":"request_pending"}"#);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each create ran once");
    send_to_service(&service, operation("after", "fine"))
        .await
        .is_created();
}

#[tokio::test]
async fn a_create_that_panics_after_its_client_left_is_caught_in_the_task() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .layer(panicking_create(
            Arc::clone(&calls),
            Duration::from_millis(50),
        ));
    let mut held = service.clone();
    let future = call(&mut held, operation("left", "boom")).await;
    let mut future = Box::pin(future);
    tokio::select! {
        _ = &mut future => panic!("the create takes 50 ms"),
        () = wait_for(|| calls.load(Ordering::SeqCst) == 1) => {}
    }
    drop(future); // the client went away; the rest runs in a task, and its create panics
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store.is_pending(&key_of("left")));
    send_to_service(&service, operation("left", "boom"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_admission_that_panics_is_a_500_and_creates_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let admission = admit_fn(|op: &LabelOperation| {
        let panics = op.parcel_id == "boom";
        async move {
            assert!(!panics, "admission panics");
            Admit::Proceed(())
        }
    });
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .admission(admission)
        .layer(panicking_create(Arc::clone(&calls), Duration::ZERO));
    let reply = send_to_service(&service, operation("adm", "boom")).await;
    reply.exact(500, r#"{"error":"create_failed"}"#);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing created");
    assert!(store.is_pending(&key_of("adm")));
}

async fn send_to_service<S>(service: &S, request: Request<Chunks>) -> Reply
where
    S: tower::Service<
            Request<Chunks>,
            Response = http::Response<
                tower_idempotency::layer::ResponseBody<http_body_util::Full<bytes::Bytes>>,
            >,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    Reply::read(service.clone().oneshot(request).await.unwrap()).await
}

/// A response body that panics when read.
struct PanickingBody;

impl http_body::Body for PanickingBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        panic!("the created response's body panicked")
    }
}

std::thread_local! {
    /// Panics on this thread, counted by the hook `a_response_body_that_panics_panics_once`
    /// installs.
    static PANICS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A created response whose body panics while the layer reads it: the panic reaches the
/// caller once, and the decision it came from is not handed to a task to be polled again
/// (which would panic a second time) when the response future is dropped.
#[tokio::test(flavor = "current_thread")]
async fn a_response_body_that_panics_panics_once() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.with(|panics| panics.set(panics.get() + 1));
        previous(info);
    }));
    let create = tower::service_fn(|_: Request<RequestBody<Chunks>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(PanickingBody))
    });
    let store = MemoryStore::new();
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .layer(create);
    let mut future = Box::pin(service.oneshot(operation("p-1", "ok")));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let before = PANICS.with(std::cell::Cell::get);
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..100 {
            if future.as_mut().poll(&mut cx).is_ready() {
                return;
            }
        }
    }));
    assert!(polled.is_err(), "the panic reached the caller");
    drop(future);
    // Anything handed to a task runs on this thread: give it the chance.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(PANICS.with(std::cell::Cell::get) - before, 1);
}
