//! The admission policies, through the layer.

use crate::common;

use std::sync::Arc;

use common::*;
use tower::Layer;
use tower_idempotency::admission::{ConcurrencyLimit, RateLimit};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[tokio::test]
async fn a_concurrency_limit_refuses_with_503_while_creates_are_in_flight() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let (rig, creates) = rig_with_gated_create(Arc::clone(&gate));
    let limit = ConcurrencyLimit::new(1);
    let store = MemoryStore::new();
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
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
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
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

/// An inner service that records in the journal when an instance of it is dropped.
#[derive(Clone)]
struct DropRecorded(tower_idempotency::testing::Journal);

impl Drop for DropRecorded {
    fn drop(&mut self) {
        self.0.record("inner dropped");
    }
}

impl<B> tower::Service<http::Request<B>> for DropRecorded {
    type Response = http::Response<String>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(String::new())))
    }
}

/// A refused request lets go of the inner service it was given (and of its request) before
/// the key is released: an inner service's slot (a `ConcurrencyLimit` of tower's, say) is not
/// held across the store's round trip.
#[tokio::test]
async fn a_refused_request_drops_its_inner_service_before_the_release() {
    use tower_idempotency::admission::Refusal;
    use tower_idempotency::testing::{Journal, RecordingStore, ScriptedAdmission};

    let journal = Journal::new();
    let admission = ScriptedAdmission::new(journal.clone());
    admission.refuse(Some(Refusal::TooManyRequests));
    let store = RecordingStore::new(MemoryStore::new(), journal.clone());
    let mut service = IdempotencyLayer::new(store, LabelContract)
        .global_keys()
        .admission(admission)
        .layer(DropRecorded(journal.clone()));
    let future = tower::Service::call(&mut service, operation("op-1", "p"));
    journal.take(); // the clones made to call
    let refused = Reply::read(future.await.unwrap()).await;
    assert_eq!(refused.status, 429);
    let calls = journal.take();
    let dropped = calls.iter().position(|c| *c == "inner dropped");
    let released = calls.iter().position(|c| *c == "release");
    assert!(
        matches!((dropped, released), (Some(d), Some(r)) if d < r),
        "{calls:?}"
    );
}
