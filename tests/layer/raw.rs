//! RawOperation: any body, fingerprinted by its exact bytes and content type.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::payments::*;
use common::*;
use http::{Method, Request, Response};
use http_body_util::Full;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::IdempotencyKey;
use tower_idempotency::operation::RawOperation;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[tokio::test]
async fn a_raw_operation_fingerprints_the_exact_bytes_and_content_type() {
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let create = {
        let keys = Arc::clone(&keys);
        Inner::new(tower::service_fn(
            move |request: Request<RequestBody<Chunks>>| {
                keys.lock()
                    .unwrap()
                    .push(request.extensions().get::<IdempotencyKey>().cloned());
                async {
                    Ok::<_, CreateError>(
                        Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap(),
                    )
                }
            },
        ))
    };
    let operation =
        RawOperation::new().media_types(["application/x-www-form-urlencoded", "text/plain"]);
    // A raw operation's value is its key, handed over when asked for.
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation)
        .global_keys()
        .value_extension(true);
    let service = tower::Layer::layer(&layer, create);
    let form = |key: &str, content_type: &str, body: &'static str| {
        request("POST", "/upload", Some(key), Some(content_type), body)
    };
    assert_eq!(
        outcome(
            &service,
            form("\"f\"", "application/x-www-form-urlencoded", "a=1&b=2")
        )
        .await,
        Some(Outcome::Created)
    );
    assert_eq!(
        outcome(
            &service,
            form("f", "application/x-www-form-urlencoded", "a=1&b=2")
        )
        .await,
        Some(Outcome::Replay)
    );
    send(
        &service,
        form("f", "application/x-www-form-urlencoded", "b=2&a=1"),
    )
    .await
    .problem(422, "idempotency_conflict", None);
    send(&service, form("f", "text/plain", "a=1&b=2"))
        .await
        .problem(422, "idempotency_conflict", None);
    send(&service, form("f", "application/json", "a=1&b=2"))
        .await
        .problem(415, "unsupported_media_type", None);
    send(
        &service,
        request("POST", "/upload", None, Some("text/plain"), "x"),
    )
    .await
    .problem(400, "invalid_idempotency_key", None);
    assert_eq!(
        keys.lock().unwrap().as_slice(),
        [Some(IdempotencyKey::parse(&"f".parse().unwrap()).unwrap())]
    );
}

#[tokio::test]
async fn a_raw_body_without_a_content_type_is_not_one_with_an_empty_one() {
    let layer = IdempotencyLayer::new(MemoryStore::new(), RawOperation::new()).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let none = send(&service, request("POST", "/u", Some("r"), None, "x")).await;
    assert_eq!(none.outcome, Some(Outcome::Created));
    send(&service, request("POST", "/u", Some("r"), Some(""), "x"))
        .await
        .problem(422, "idempotency_conflict", None);
}

#[tokio::test]
async fn a_raw_operation_guards_only_its_methods() {
    let (service, creates) = guarded(RawOperation::new().methods([Method::PUT]));
    let put = send(
        &service,
        request("PUT", "/files/1", Some("f"), Some("text/plain"), "x"),
    )
    .await;
    assert_eq!(put.outcome, Some(Outcome::Created));
    let again = send(
        &service,
        request("PUT", "/files/1", Some("f"), Some("text/plain"), "x"),
    )
    .await;
    assert_eq!(again.outcome, Some(Outcome::Replay));
    let post = send(&service, request("POST", "/files/1", None, None, "x")).await;
    assert_eq!(
        (post.status.as_u16(), post.outcome),
        (201, None),
        "passed through"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 2);
}
