//! A drain over the generic operations: creates in flight complete, new claims are refused,
//! and waits and lost completes end.

use crate::common;
use crate::generic::{BODY, post};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::payments::*;
use common::*;
use http::Method;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// A shutdown strands no key: 20 creates of two seconds each are in flight when the drain
/// starts; each is answered by its create and completed, and a request arriving meanwhile is
/// refused before its claim with `Retry-After`.
#[tokio::test(start_paused = true)]
async fn a_drain_completes_every_create_in_flight_and_refuses_new_claims() {
    let drain = tower_idempotency::layer::Drain::new();
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .drain(&drain);
    let service = tower::Layer::layer(
        &layer,
        payment_create(Arc::clone(&creates), Duration::from_secs(2)),
    );
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let service = service.clone();
            tokio::spawn(async move { send(&service, post(Some(&format!("d{i}")), BODY)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(drain.in_flight(), 20);
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(30)).await }
    });
    drain.closed().await;
    let late = send(&service, post(Some("late"), BODY)).await;
    late.problem(503, "store_unavailable", None)
        .header("retry-after", &["2"]);
    assert_eq!(late.outcome, Some(Outcome::StoreUnavailable));
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, 201);
        assert_eq!(reply.outcome, Some(Outcome::Created));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 20);
    for i in 0..20 {
        let key =
            tower_idempotency::scope::store_key(None, &Method::POST, "/payments", &format!("d{i}"));
        assert!(!store.is_pending(&key), "{key} completed");
    }
    assert!(!store.is_pending(&tower_idempotency::scope::store_key(
        None,
        &Method::POST,
        "/payments",
        "late"
    )));
    assert_eq!(store.len(), 20, "the late request claimed nothing");
}

/// A complete whose answer was lost is settled by a task of its own: the drain waits for it,
/// so a shutdown does not end the process with the key pending.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_a_lost_complete_to_be_settled() {
    let drain = tower_idempotency::layer::Drain::new();
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .drain(&drain);
    let service = tower::Layer::layer(&layer, payment_create(creates, Duration::ZERO));
    store.fail("complete");
    let reply = send(&service, post(Some("lost-complete"), BODY)).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    let key =
        tower_idempotency::scope::store_key(None, &Method::POST, "/payments", "lost-complete");
    assert!(store.inner().is_pending(&key));
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(60)).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!shutdown.is_finished(), "the settling is still trying");
    store.recover();
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    assert!(
        !store.inner().is_pending(&key),
        "settled before the shutdown ended"
    );
}

/// A request waiting for a first attempt stops waiting when the drain closes (it answers
/// pending at once), and never claims after the close.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_stops_waiting_when_the_drain_closes() {
    let drain = tower_idempotency::layer::Drain::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .global_keys()
        .pending_wait(Duration::from_secs(60))
        .drain(&drain);
    let service = tower::Layer::layer(
        &layer,
        payment_create(Arc::clone(&creates), Duration::from_secs(10)),
    );
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post(Some("w"), BODY)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post(Some("w"), BODY)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "waits for the first attempt");
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(60)).await }
    });
    let waited = waiting.await.unwrap();
    waited.problem(409, "request_pending", None);
    assert!(
        !first.is_finished(),
        "answered before the first attempt ended"
    );
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}
