//! The admission policies, through the layer.

mod common;

use std::sync::Arc;

use common::*;
use tower::Layer;
use tower_idempotency::admission::{ConcurrencyLimit, RateLimit};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[tokio::test]
async fn a_concurrency_limit_refuses_with_503_while_creates_are_in_flight() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let (rig, creates) = rig_with_gated_create(Arc::clone(&gate));
    let limit = ConcurrencyLimit::new(1);
    let store = MemoryStore::new();
    let service = IdempotencyLayer::new(store.clone())
        .admission(limit.clone())
        .layer(rig.service.get_ref().clone());

    let mut first_service = service.clone();
    let first = tokio::spawn(call(&mut first_service, operation("op-1", "p")).await);
    wait_for(|| creates.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    assert_eq!(limit.available(), 0);

    let refused = Reply::read(
        tower::ServiceExt::oneshot(service.clone(), operation("op-2", "p"))
            .await
            .unwrap(),
    )
    .await;
    refused
        .exact(503, r#"{"error":"not_admitted"}"#)
        .header("retry-after", &["2"]);
    assert!(
        !store.is_pending(&key_of("op-2")),
        "the refused key is released"
    );

    gate.notify_one();
    Reply::read(first.await.unwrap().unwrap())
        .await
        .is_created();
    assert_eq!(
        limit.available(),
        1,
        "the slot frees once create and complete are done"
    );

    gate.notify_one();
    let admitted = Reply::read(
        tower::ServiceExt::oneshot(service, operation("op-2", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(admitted.status, 201);
}

#[tokio::test]
async fn a_rate_limit_refuses_with_429_beyond_its_rate() {
    let rig = Rig::new();
    let store = MemoryStore::new();
    let service = IdempotencyLayer::new(store.clone())
        .admission(RateLimit::per_second(3))
        .layer(rig.service.get_ref().clone());
    let mut statuses = Vec::new();
    for i in 0..5 {
        let request = operation(&format!("op-{i}"), "p");
        let reply = Reply::read(
            tower::ServiceExt::oneshot(service.clone(), request)
                .await
                .unwrap(),
        )
        .await;
        if reply.status == 429 {
            reply
                .exact(429, r#"{"error":"not_admitted"}"#)
                .header("retry-after", &["2"]);
        }
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [201, 201, 201, 429, 429]);
    assert_eq!(store.len(), 3, "refused keys are released");
    // Replays are not admissions: they pass whatever the rate.
    let replay = Reply::read(
        tower::ServiceExt::oneshot(service.clone(), operation("op-0", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(replay.status, 201);
    // The bucket refills.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let later = Reply::read(
        tower::ServiceExt::oneshot(service, operation("op-9", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(later.status, 201);
}
