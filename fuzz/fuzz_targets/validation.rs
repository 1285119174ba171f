//! Arbitrary requests through the layer: every reply must be one of the contract's, and a
//! refused request must never reach the store or the create.
#![no_main]

use std::sync::atomic::Ordering;

use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, MemoryStore};
use tower_idempotency::operation::LabelContract;

const REPLIES: [(u16, &str); 6] = [
    (404, r#"{"error":"not_found"}"#),
    (405, r#"{"error":"method_not_allowed"}"#),
    (415, r#"{"error":"unsupported_media_type"}"#),
    (413, r#"{"error":"payload_too_large"}"#),
    (400, r#"{"error":"invalid_request"}"#),
    (201, "created"),
];

#[path = "request.rs"]
mod request;
use request::{counting_create, request};

fuzz_target!(|data: &[u8]| {
    let Some(request) = request(data) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = MemoryStore::new();
        let (creates, create) = counting_create(b"created");
        let service = tower::Layer::layer(&IdempotencyLayer::new(store.clone(), LabelContract).global_keys(), create);
        let response = service.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(
            REPLIES
                .iter()
                .any(|(s, b)| *s == status && body == b.as_bytes()),
            "not a contract reply: {status} {body:?}"
        );
        if status == 201 {
            assert_eq!(creates.load(Ordering::SeqCst), 1);
            assert_eq!(store.len(), 1);
        } else {
            assert_eq!(creates.load(Ordering::SeqCst), 0);
            assert!(store.is_empty(), "a refusal reached the store");
        }
    });
});
