//! Unary gRPC calls through the layer with `GrpcOperation`, driven with gRPC frames built by
//! hand: create, replay (the same message bytes and trailers), conflict, missing key, invalid
//! message, pending, a create that answers a non-OK status, and calls that are not guarded.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::{Chunks, Trailing};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::GrpcOperation;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

const CREATE: &str = "/labels.v1.Labels/CreateLabel";

/// One framed message.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// A unary call of `path` with `key` (if any) and the framed `message`.
fn call(path: &str, key: Option<&str>, body: Vec<u8>) -> Request<Chunks> {
    let mut request = Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Chunks::one(body)).unwrap()
}

fn trailers(status: &'static str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    trailers.insert("x-label", HeaderValue::from_static("label-901"));
    trailers
}

/// The operation guarding [`CREATE`].
fn guarded() -> GrpcOperation {
    GrpcOperation::new().method(CREATE)
}

/// The layer with `operation` over a create that answers as tonic does (HTTP 200, one message,
/// then trailers with `grpc-status`), after `gate` opens if given.
fn service_with(
    operation: GrpcOperation,
    store: MemoryStore,
    creates: Arc<AtomicUsize>,
    grpc_status: &'static str,
    gate: Option<Arc<tokio::sync::Notify>>,
) -> impl tower::Service<
    Request<Chunks>,
    Response = Response<tower_idempotency::layer::ResponseBody<Trailing>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        creates.fetch_add(1, Ordering::SeqCst);
        let gate = gate.clone();
        async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            let body = Trailing {
                data: Some(Bytes::from(framed(b"\x12\x09label-901"))),
                trailers: [trailers(grpc_status)].into(),
            };
            let mut response = Response::new(body);
            response
                .headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    tower::Layer::layer(
        &IdempotencyLayer::new(store, operation).global_keys(),
        create,
    )
}

/// Status, `grpc-status` of the headers (a trailers-only reply), body, trailers.
async fn read<B>(response: Response<B>) -> (u16, Option<String>, Bytes, Option<HeaderMap>)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let status = response.status().as_u16();
    let header = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (status, header, collected.to_bytes(), trailers)
}

#[tokio::test]
async fn a_unary_create_is_stored_with_its_trailers_and_replayed_exactly() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(guarded(), store.clone(), Arc::clone(&creates), "0", None);
    let message = framed(b"\x0a\x0bk-1\x12\x03p-1");
    let first = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("k-1"), message.clone()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(first.0, 200);
    assert_eq!(first.2, framed(b"\x12\x09label-901"));
    assert_eq!(first.3, Some(trailers("0")));
    let again = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("k-1"), message))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(again, first, "the same message bytes and trailers");
    assert_eq!(creates.load(Ordering::SeqCst), 1);

    // The key with another message: FAILED_PRECONDITION, nothing created.
    let other = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("k-1"), framed(b"other")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((other.0, other.1.as_deref()), (200, Some("9")));
    assert!(other.2.is_empty());
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missing_key_or_an_invalid_message_is_invalid_argument_and_reaches_nothing() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(guarded(), store.clone(), Arc::clone(&creates), "0", None);
    let mut proto = call(CREATE, None, framed(b"m"));
    proto.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/grpc+proto"),
    );
    for request in [
        call(CREATE, None, framed(b"m")),
        proto,
        call(CREATE, Some("k"), vec![0, 0, 0, 0, 9, 1]),
        call(CREATE, Some("k"), [framed(b"a"), framed(b"b")].concat()),
    ] {
        let reply = read(service.clone().oneshot(request).await.unwrap()).await;
        assert_eq!((reply.0, reply.1.as_deref()), (200, Some("3")));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    assert!(store.is_empty());
}

#[tokio::test]
async fn a_call_while_the_first_runs_is_aborted_and_a_non_ok_status_is_replayed() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(
        guarded(),
        MemoryStore::new(),
        Arc::clone(&creates),
        "5",
        Some(Arc::clone(&gate)),
    );
    let first = tokio::spawn(
        service
            .clone()
            .oneshot(call(CREATE, Some("k"), framed(b"m"))),
    );
    while creates.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let pending = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("k"), framed(b"m")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((pending.0, pending.1.as_deref()), (200, Some("10")));
    gate.notify_one();
    let first = read(first.await.unwrap().unwrap()).await;
    assert_eq!(
        first.3,
        Some(trailers("5")),
        "NOT_FOUND, as the create answered"
    );
    let replay = read(
        service
            .oneshot(call(CREATE, Some("k"), framed(b"m")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(replay, first);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn calls_that_are_not_guarded_pass_through_untouched() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(guarded(), store.clone(), Arc::clone(&creates), "0", None);
    for request in [
        call("/grpc.health.v1.Health/Check", None, framed(b"")),
        call("/labels.v1.Labels/WatchLabels", Some("k"), framed(b"m")),
    ] {
        let reply = read(service.clone().oneshot(request).await.unwrap()).await;
        assert_eq!(reply.3, Some(trailers("0")), "the inner service answered");
    }
    assert_eq!(creates.load(Ordering::SeqCst), 2);
    assert!(store.is_empty(), "nothing guarded reached the store");
}

/// A server routes by path alone: a guarded method reached other than as a gRPC `POST` would
/// run the create unguarded, so it is refused.
#[tokio::test]
async fn a_guarded_method_not_called_as_grpc_is_unimplemented() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(guarded(), store.clone(), Arc::clone(&creates), "0", None);
    let mut json = call(CREATE, Some("k"), framed(b"m"));
    json.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    let mut put = call(CREATE, Some("k"), framed(b"m"));
    *put.method_mut() = http::Method::PUT;
    let mut web = call(CREATE, Some("k"), framed(b"m"));
    web.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/grpc-web+proto"),
    );
    for (request, message) in [
        (json, "unsupported_media_type"),
        (put, "method_not_allowed"),
        (web, "unsupported_media_type"),
    ] {
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.headers()["grpc-message"], message);
        let reply = read(response).await;
        assert_eq!((reply.0, reply.1.as_deref()), (200, Some("12")));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    assert!(store.is_empty());
}

#[tokio::test]
async fn validate_sees_the_key_the_message_and_its_flag_and_its_refusal_claims_nothing() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let operation = GrpcOperation::new().method(CREATE).validate(
        move |call: &tower_idempotency::operation::GrpcCall<'_>| {
            record.lock().unwrap().push((
                call.key().to_owned(),
                call.message().to_vec(),
                call.is_compressed(),
                call.parts().uri.path().to_owned(),
            ));
            if call.message() == b"good" {
                Ok(())
            } else {
                Err("not good")
            }
        },
    );
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(operation, store.clone(), creates.clone(), "0", None);

    let (status, header, ..) = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("v-1"), framed(b"bad")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, header.as_deref()), (200, Some("3")));
    assert_eq!(store.len(), 0, "a refused call claims nothing");

    let mut compressed = framed(b"good");
    compressed[0] = 1;
    let (_, header, ..) = read(
        service
            .clone()
            .oneshot(call(CREATE, Some("v-2"), compressed))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        header, None,
        "accepted: a reply with trailers, not trailers-only"
    );

    let (_, header, ..) = read(
        service
            .oneshot(call(CREATE, Some("v-3"), framed(b"good")))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(header, None);
    assert_eq!(creates.load(Ordering::SeqCst), 2);
    let seen = seen.lock().unwrap().clone();
    let path = CREATE.to_owned();
    assert_eq!(
        seen,
        [
            ("v-1".to_owned(), b"bad".to_vec(), false, path.clone()),
            ("v-2".to_owned(), b"good".to_vec(), true, path.clone()),
            ("v-3".to_owned(), b"good".to_vec(), false, path),
        ]
    );
}

#[tokio::test]
async fn a_validation_that_panics_refuses_the_call_and_claims_nothing() {
    let operation = GrpcOperation::new().method(CREATE).validate(
        |call: &tower_idempotency::operation::GrpcCall<'_>| -> Result<(), &'static str> {
            // A check that indexes an empty message.
            if call.message()[0] == 0 {
                Ok(())
            } else {
                Err("no")
            }
        },
    );
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = service_with(operation, store.clone(), creates.clone(), "0", None);
    let response = service
        .oneshot(call(CREATE, Some("e-1"), framed(b"")))
        .await
        .unwrap();
    let (status, header, body, _) = read(response).await;
    assert_eq!((status, header.as_deref()), (200, Some("3")));
    assert!(body.is_empty());
    assert_eq!(store.len(), 0);
    assert_eq!(creates.load(Ordering::SeqCst), 0);
}
