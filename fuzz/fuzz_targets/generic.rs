//! Arbitrary requests through the generic JSON operation: every reply is the create's 201 or
//! one of the problem replies, a refused request never reaches the store or the create, and
//! the canonical form of any body that has one is a fixed point.
#![no_main]

use std::sync::atomic::Ordering;

use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use tower_idempotency::operation::canonical_json;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

const PROBLEMS: [(u16, &str); 6] = [
    (415, "unsupported_media_type"),
    (413, "payload_too_large"),
    (400, "invalid_idempotency_key"),
    (400, "invalid_request"),
    (404, "not_found"),
    (405, "method_not_allowed"),
];

#[path = "request.rs"]
mod request;
use request::{counting_create, request};

fuzz_target!(|data: &[u8]| {
    if let Some(body) = data.rsplit(|b| *b == b'\n').next()
        && let Ok(canonical) = canonical_json(body)
    {
        assert_eq!(canonical_json(&canonical).ok(), Some(canonical));
    }
    let Some(request) = request(data) else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = MemoryStore::new();
        let (creates, create) = counting_create(b"");
        let layer = IdempotencyLayer::new(store.clone(), JsonOperation::new())
            .global_keys()
            .body_limit(4096);
        let guarded = request.method() == http::Method::POST;
        let service = tower::Layer::layer(&layer, create);
        let response = service.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers().get("content-type").cloned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        if status == 201 {
            assert_eq!(creates.load(Ordering::SeqCst), 1);
            assert_eq!(store.len(), usize::from(guarded));
            return;
        }
        assert_eq!(content_type.unwrap(), "application/problem+json");
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let kind = problem["type"].as_str().unwrap();
        let case = &kind[kind.find('#').unwrap() + 1..];
        assert!(
            PROBLEMS.iter().any(|(s, c)| *s == status && *c == case),
            "not a refusal before the claim: {status} {case}"
        );
        assert_eq!(problem["status"], status);
        assert_eq!(creates.load(Ordering::SeqCst), 0);
        assert!(store.is_empty(), "a refusal reached the store");
    });
});
