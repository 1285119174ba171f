//! Concurrency and cancellation: at most one create per key, whatever the client does.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tower_idempotency::MemoryStore;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::reply::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_identical_requests_create_once() {
    let rig = Rig::around(|journal| {
        tower::service_fn(move |_| {
            journal.record("create");
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, CreateError>(created_response())
            }
        })
    });
    let rig = Arc::new(rig);
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let rig = Arc::clone(&rig);
            tokio::spawn(async move { rig.send(valid()).await })
        })
        .collect();
    let (mut created, mut replayed, mut pending) = (0, 0, 0);
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.outcome {
            Some(Outcome::Created) => {
                reply.is_created();
                created += 1;
            }
            Some(Outcome::Replay) => {
                reply.is_created();
                replayed += 1;
            }
            Some(Outcome::Pending) => {
                reply.exact(409, r#"{"error":"request_pending"}"#);
                pending += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let creates = rig
        .journal
        .take()
        .iter()
        .filter(|c| **c == "create")
        .count();
    assert_eq!(creates, 1, "exactly one create");
    assert_eq!(created, 1);
    assert_eq!(created + replayed + pending, 1000);
    assert!(
        pending > 0,
        "the create was slow enough for pending replies"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_distinct_keys_each_create_once() {
    let rig = Arc::new(Rig::new());
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let rig = Arc::clone(&rig);
            // 100 keys, each sent four times.
            tokio::spawn(async move { rig.send(operation(&format!("req-{}", i % 100), "p")).await })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap().status.as_u16();
        assert!(status == 201 || status == 409, "{status}");
    }
    assert_eq!(rig.creates(), 100);
    assert_eq!(rig.memory.len(), 100);
}

/// Drops the response future once `reached` holds, then lets the create go on.
async fn disconnect_when(rig: &Rig, gate: &tokio::sync::Notify, reached: impl Fn(&Rig) -> bool) {
    let mut service = rig.service.clone();
    let mut future = Box::pin(call(&mut service, valid()).await);
    tokio::select! {
        _ = &mut future => panic!("the create is gated; the reply cannot be ready"),
        () = wait_for(|| reached(rig)) => {}
    }
    drop(future); // the client goes away
    gate.notify_one();
    wait_for(|| rig.memory.completed(&key_of(KEY)).is_some()).await;
}

#[tokio::test]
async fn a_client_that_disconnects_after_the_claim_still_gets_its_create_completed() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let (rig, creates) = rig_with_gated_create(Arc::clone(&gate));
    disconnect_when(&rig, &gate, |rig| rig.memory.is_pending(&key_of(KEY))).await;
    assert_eq!(creates.load(Ordering::SeqCst), 1);
    rig.send_expecting(valid(), &["claim", "write"])
        .await
        .is_created();
    assert_eq!(creates.load(Ordering::SeqCst), 1, "the retry replays");
}

#[tokio::test]
async fn a_client_that_disconnects_during_the_create_still_gets_it_completed() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let (rig, creates) = rig_with_gated_create(Arc::clone(&gate));
    let started = Arc::clone(&creates);
    disconnect_when(&rig, &gate, move |_| started.load(Ordering::SeqCst) == 1).await;
    rig.send(valid()).await.is_created();
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_while_admission_waits_still_gets_an_answer_stored() {
    // Admission that waits at a gate before proceeding.
    let gate = Arc::new(tokio::sync::Notify::new());
    let admitted = Arc::clone(&gate);
    let rig = Rig::new();
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(rig.memory.clone(), LabelContract)
            .global_keys()
            .admission(tower_idempotency::admission::admit_fn(move |_| {
                let gate = Arc::clone(&admitted);
                async move {
                    gate.notified().await;
                    tower_idempotency::admission::Admit::Proceed(())
                }
            })),
        rig.service.get_ref().clone(),
    );
    let mut held = service.clone();
    let mut future = Box::pin(call(&mut held, valid()).await);
    tokio::select! {
        _ = &mut future => panic!("admission is gated"),
        () = wait_for(|| rig.memory.is_pending(&key_of(KEY))) => {}
    }
    drop(future);
    gate.notify_one();
    wait_for(|| rig.memory.completed(&key_of(KEY)).is_some()).await;
    assert_eq!(rig.creates(), 1);
    let reply = Reply::read(tower::ServiceExt::oneshot(service, valid()).await.unwrap()).await;
    reply.is_created();
    assert_eq!(rig.creates(), 1);
}

/// Drops the response future while the store is at the gate, then opens it: the create is
/// done once and completed, and the retry replays it.
async fn disconnect_at_store_gate(at_claim: bool) {
    let memory = MemoryStore::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let store = GatedStore {
        inner: memory.clone(),
        claim_gate: if at_claim {
            OnceGate::new(&gate)
        } else {
            OnceGate::default()
        },
        complete_gate: if at_claim {
            OnceGate::default()
        } else {
            OnceGate::new(&gate)
        },
    };
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), Duration::ZERO);
    let mut held = service.clone();
    let mut future = Box::pin(call(&mut held, valid()).await);
    tokio::select! {
        _ = &mut future => panic!("the store is gated; the reply cannot be ready"),
        () = wait_for(|| memory.is_pending(&key_of(KEY))) => {}
    }
    if !at_claim {
        wait_for(|| creates.load(Ordering::SeqCst) == 1).await;
    }
    drop(future); // the client goes away
    gate.notify_one();
    wait_for(|| memory.completed(&key_of(KEY)).is_some()).await;
    assert_eq!(creates.load(Ordering::SeqCst), 1);
    let replay = send_to(&service, valid()).await;
    replay.is_created();
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_client_that_disconnects_while_the_claim_answer_is_in_flight_still_gets_its_create() {
    disconnect_at_store_gate(true).await;
}

#[tokio::test]
async fn a_client_that_disconnects_while_the_complete_is_in_flight_still_gets_it_stored() {
    disconnect_at_store_gate(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_mixed_requests_through_several_instances_create_once_per_key() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let instances: Vec<_> = (0..4)
        .map(|_| {
            counting_service(
                store.clone(),
                Arc::clone(&creates),
                Duration::from_millis(2),
            )
        })
        .collect();
    let tasks: Vec<_> = (0..4000)
        .map(|i| {
            let service = instances[i % instances.len()].clone();
            // 200 keys; every tenth request is a conflicting operation under its key.
            let key = format!("key-{}", i % 200);
            let parcel = if i % 10 == 9 {
                "other-parcel"
            } else {
                "parcel-42"
            };
            tokio::spawn(async move { send_to(&service, operation(&key, parcel)).await })
        })
        .collect();
    let all = async {
        let mut outcomes = std::collections::BTreeMap::new();
        for task in tasks {
            let reply = task.await.unwrap();
            *outcomes.entry(format!("{:?}", reply.outcome)).or_insert(0) += 1;
        }
        outcomes
    };
    let outcomes = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("no deadlock: every request answered in bounded time");
    let created = creates.load(Ordering::SeqCst);
    assert!(created <= 200, "at most one create per key: {created}");
    assert_eq!(outcomes.get("Some(Created)"), Some(&created));
    let answered: usize = outcomes.values().sum();
    assert_eq!(answered, 4000);
    for outcome in outcomes.keys() {
        assert!(
            [
                "Some(Created)",
                "Some(Replay)",
                "Some(Pending)",
                "Some(Conflict)"
            ]
            .contains(&outcome.as_str()),
            "{outcome}"
        );
    }
    assert_eq!(store.len(), created);
}
