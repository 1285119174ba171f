//! Owner leases: a running create renews its reservation's lease, so its key shows as in
//! progress however long it takes; a key whose owner stopped renewing (a panic, a dead
//! process) is abandoned, stays pending by default, and is taken over only by a layer that
//! allows it; the abandoned owner can no longer complete.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tower::ServiceExt;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::store::Lease;
use tower_idempotency::store::Operator;

fn rig(
    configure: impl FnOnce(
        RigLayer,
    ) -> IdempotencyLayer<
        RecordingStore,
        LabelContract,
        ScriptedAdmission,
        GlobalKeys,
    >,
) -> Rig {
    let journal = Journal::default();
    let creates = Arc::new(AtomicUsize::new(0));
    let create = timed_create(journal.clone(), Arc::clone(&creates));
    Rig::build(journal, creates, create, configure)
}

#[tokio::test]
async fn a_long_create_renews_its_lease_and_stays_in_progress() {
    let rig = rig(|layer| {
        layer
            .lease(Duration::from_millis(150))
            .take_over_abandoned()
    });
    let first = spawn_send(&rig.service, operation("long", "slow-600"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let info = rig.memory.inspect(&key_of("long")).await.unwrap().unwrap();
    assert!(!info.abandoned, "renewed: in progress");
    rig.send(operation("long", "slow-600"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    first.await.unwrap().is_created();
    assert_eq!(rig.creates(), 1, "never taken over while it runs");
    let calls = rig.journal.take();
    let renewals = calls.iter().filter(|call| **call == "renew").count();
    assert!(
        (6..=13).contains(&renewals),
        "about every 50 ms for 600 ms: {calls:?}"
    );
    assert_eq!(calls.last(), Some(&"complete"));
    assert_eq!(calls.iter().filter(|call| **call == "write").count(), 1);
}

#[tokio::test]
async fn a_quick_create_costs_no_renewal() {
    let rig = rig(|layer| layer.lease(Lease::MIN_DURATION));
    rig.send_expecting(
        operation("quick", "p"),
        &["claim", "admit", "create", "complete", "write"],
    )
    .await
    .is_created();
    rig.send_expecting(
        operation("waits", "slow-5"),
        &["claim", "admit", "create", "complete", "write"],
    )
    .await
    .is_created();
}

#[tokio::test]
async fn an_abandoned_key_stays_pending_by_default() {
    let rig = rig(|layer| layer.lease(Duration::from_millis(60)));
    rig.send(operation("died", "boom"))
        .await
        .exact(500, r#"{"error":"create_failed"}"#);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let info = rig.memory.inspect(&key_of("died")).await.unwrap().unwrap();
    assert!(info.abandoned, "nobody renews it");
    rig.send(operation("died", "boom"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(rig.creates(), 1, "at most once");
}

#[tokio::test]
async fn a_layer_that_allows_it_takes_over_an_abandoned_key_once() {
    // Long enough for the panic's backtrace to be printed within it.
    let rig = rig(|layer| {
        layer
            .lease(Duration::from_millis(400))
            .take_over_abandoned()
    });
    rig.send(operation("died", "boom"))
        .await
        .exact(500, r#"{"error":"create_failed"}"#);
    rig.send(operation("died", "boom"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    rig.send(operation("died", "other"))
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.send(operation("died", "other"))
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    rig.send(operation("died", "boom")).await.is_created();
    assert_eq!(rig.creates(), 2, "at least once: created anew");
    rig.send(operation("died", "boom")).await.is_created();
    assert_eq!(rig.creates(), 2, "then replayed");
    let info = rig.memory.inspect(&key_of("died")).await.unwrap().unwrap();
    assert!(!info.abandoned);
}

/// An owner whose lease lapsed (its renewals failed) is fenced out: once another attempt
/// took the key over, the late owner stops renewing at its first refused renewal, and its
/// complete changes nothing.
#[tokio::test]
async fn an_owner_whose_lease_lapsed_is_fenced_out() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Store;
    use tower_idempotency::store::{Claim, Reservation};
    let rig = rig(|layer| layer.lease(Duration::from_millis(60)).take_over_abandoned());
    rig.store.fail("renew");
    let late = spawn_send(&rig.service, operation("late", "slow-300"));
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Another replica takes the abandoned key over, straight in the shared store.
    let next = Reservation::generate();
    let take_over = Lease::default().take_over_abandoned();
    let fp = LabelContract::fingerprint("late", "slow-300");
    let key = key_of("late");
    let claim = rig.memory.claim_with(&key, &fp, next, take_over);
    assert_eq!(claim.await.unwrap(), Claim::New(next));
    rig.journal.take();
    rig.store.recover();
    let late = late.await.unwrap();
    assert_eq!(
        late.outcome,
        Some(tower_idempotency::reply::Outcome::CompleteFailed)
    );
    let renewals = rig.journal.take().iter().filter(|c| **c == "renew").count();
    assert_eq!(renewals, 1, "it stops at the first refused renewal");
    assert!(
        rig.memory.is_pending(&key_of("late")),
        "the take-over's, untouched"
    );
    let stored = tower_idempotency::store::StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        "taken over".into(),
    );
    rig.memory
        .complete(&key_of("late"), &next, &stored)
        .await
        .unwrap();
}

/// A renewal that fails for a while does not stop the heartbeat: once the store answers
/// again the lease is renewed, and the key is never taken over while its create runs.
#[tokio::test]
async fn renewals_go_on_after_a_failed_one() {
    let rig = rig(|layer| {
        layer
            .lease(Duration::from_millis(150))
            .take_over_abandoned()
    });
    rig.store.fail("renew");
    let first = spawn_send(&rig.service, operation("flaky", "slow-700"));
    tokio::time::sleep(Duration::from_millis(80)).await;
    rig.store.recover();
    tokio::time::sleep(Duration::from_millis(420)).await;
    rig.send(operation("flaky", "slow-700"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    first.await.unwrap().is_created();
    assert_eq!(rig.creates(), 1);
}

/// Found in review: the lease is renewed from the claim on, through a slow admission too, so
/// a retry meanwhile cannot take over a live owner.
#[tokio::test]
async fn a_slow_admission_is_covered_by_the_lease() {
    use tower::Layer;
    use tower_idempotency::MemoryStore;
    use tower_idempotency::admission::{Admit, admit_fn};
    let creates = Arc::new(AtomicUsize::new(0));
    let slow = admit_fn(|_: &LabelOperation| async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Admit::Proceed(())
    });
    let service = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
        .global_keys()
        .lease(Duration::from_millis(150))
        .take_over_abandoned()
        .admission(slow)
        .layer(timed_create(Journal::default(), Arc::clone(&creates)));
    let first = spawn_send(&service, operation("admit", "p"));
    tokio::time::sleep(Duration::from_millis(250)).await;
    Reply::read(service.oneshot(operation("admit", "p")).await.unwrap())
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    first.await.unwrap().is_created();
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}
