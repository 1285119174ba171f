//! Waiting for the first attempt: with `pending_wait`, a request whose key is pending waits
//! for the first attempt's completion and answers with its stored bytes, bounded in time and in
//! count, woken by the completion itself on the memory store; without it, the immediate 409.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tower::{Layer, ServiceExt};
use tower_idempotency::admission::{Admit, Refusal, admit_fn};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

fn rig(wait: Duration) -> Rig {
    let journal = Journal::default();
    let creates = Arc::new(AtomicUsize::new(0));
    let create = timed_create(journal.clone(), Arc::clone(&creates));
    Rig::build(journal, creates, create, |layer| layer.pending_wait(wait))
}

#[tokio::test]
async fn a_waiting_retry_answers_with_the_first_attempts_bytes_at_its_completion() {
    let rig = rig(Duration::from_secs(5));
    let first = spawn_send(&rig.service, operation("wait", "slow-300"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retry = spawn_send(&rig.service, operation("wait", "slow-300"));
    let first = first.await.unwrap();
    let completed = Instant::now();
    let retry = retry.await.unwrap();
    let woken = completed.elapsed();
    first.is_created();
    retry.is_created();
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.outcome, Some(Outcome::Replay));
    assert!(woken < Duration::from_millis(100), "woken {woken:?} after");
    // Woken by the completion, not polling: the retry claimed on arrival, once more before
    // it waited, and once after it was woken.
    let claims = rig.journal.take().iter().filter(|c| **c == "claim").count();
    assert_eq!(
        claims,
        1 + 3,
        "the first attempt's claim and the retry's three"
    );
    assert_eq!(rig.creates(), 1);
    assert_eq!(rig.memory.waited_keys(), 0);
}

#[tokio::test]
async fn a_wait_that_runs_out_answers_request_pending_after_about_the_wait() {
    let rig = rig(Duration::from_millis(150));
    let first = spawn_send(&rig.service, operation("long", "slow-800"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    rig.send(operation("long", "slow-800"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_millis(400),
        "{waited:?}"
    );
    assert_eq!(
        rig.memory.waited_keys(),
        0,
        "the waiter left nothing behind"
    );
    first.await.unwrap().is_created();
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn fifty_waiters_all_get_the_same_201() {
    let rig = rig(Duration::from_secs(5));
    let first = spawn_send(&rig.service, operation("many", "slow-300"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiters: Vec<_> = (0..50)
        .map(|_| spawn_send(&rig.service, operation("many", "slow-300")))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.memory.waited_keys(), 1, "fifty waiters on one key");
    let first = first.await.unwrap();
    for waiter in waiters {
        let reply = waiter.await.unwrap();
        reply.is_created();
        assert_eq!(reply.body, first.body);
    }
    assert_eq!(rig.creates(), 1);
    assert_eq!(rig.memory.waited_keys(), 0);
}

#[tokio::test]
async fn a_conflict_is_never_waited_on() {
    let rig = rig(Duration::from_secs(5));
    let first = spawn_send(&rig.service, operation("conflict", "slow-500"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    rig.send(operation("conflict", "other"))
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    assert!(started.elapsed() < Duration::from_millis(200));
    first.await.unwrap().is_created();
}

#[tokio::test]
async fn beyond_the_cap_a_request_does_not_wait() {
    let journal = Journal::default();
    let creates = Arc::new(AtomicUsize::new(0));
    let create = timed_create(journal.clone(), Arc::clone(&creates));
    let rig = Rig::build(journal, creates, create, |layer| {
        layer.pending_wait(Duration::from_secs(5)).max_waiting(1)
    });
    let first = spawn_send(&rig.service, operation("cap", "slow-400"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiting = spawn_send(&rig.service, operation("cap", "slow-400"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    rig.send(operation("cap", "slow-400"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert!(started.elapsed() < Duration::from_millis(200), "immediate");
    first.await.unwrap().is_created();
    waiting.await.unwrap().is_created();
    // The place is given back: another request waits.
    let next = spawn_send(&rig.service, operation("cap-next", "slow-200"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    rig.send(operation("cap-next", "slow-200"))
        .await
        .is_created();
    next.await.unwrap().is_created();
}

/// A waiting layer over `store` whose admission refuses the first attempt after 200 ms
/// (releasing its key) and admits every later one; the creates counted.
fn first_refused<St: tower_idempotency::store::Store>(
    store: St,
) -> (
    tower_idempotency::layer::Idempotency<
        Inner,
        St,
        tower_idempotency::operation::LabelContract,
        impl tower_idempotency::admission::Admission<LabelOperation>,
    >,
    Arc<AtomicUsize>,
) {
    let admissions = Arc::new(AtomicUsize::new(0));
    let first_refused = admit_fn(move |_: &LabelOperation| {
        let first = admissions.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Admit::Refuse(Refusal::ServiceUnavailable)
            } else {
                Admit::Proceed(())
            }
        }
    });
    let creates = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::new(store, LabelContract)
        .global_keys()
        .pending_wait(Duration::from_secs(5))
        .admission(first_refused)
        .layer(timed_create(Journal::default(), Arc::clone(&creates)));
    (service, creates)
}

/// The first attempt is refused by admission (its key released) while others wait: one of
/// them claims the key anew and creates, the rest get its response.
#[tokio::test]
async fn a_released_first_attempt_lets_exactly_one_waiter_create() {
    let store = MemoryStore::new();
    let (service, creates) = first_refused(store.clone());
    let first = spawn_send(&service, operation("released", "slow-50"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiters: Vec<_> = (0..10)
        .map(|_| spawn_send(&service, operation("released", "slow-50")))
        .collect();
    assert_eq!(first.await.unwrap().status.as_u16(), 503);
    let mut created = None;
    for waiter in waiters {
        let reply = waiter.await.unwrap();
        reply.is_created();
        assert_eq!(
            created.get_or_insert_with(|| reply.body.clone()),
            &reply.body
        );
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        1,
        "at most one of them creates"
    );
    assert_eq!(store.waited_keys(), 0);
}

/// A waiting request whose client goes away: once the first attempt completes, nothing of it
/// is left (no waiter entry), and the first attempt's answer is untouched.
#[tokio::test]
async fn a_dropped_waiter_leaves_nothing_behind() {
    let rig = rig(Duration::from_secs(5));
    let first = spawn_send(&rig.service, operation("gone", "slow-300"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiter = rig.service.clone().oneshot(operation("gone", "slow-300"));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), waiter)
            .await
            .is_err(),
        "still waiting when its client leaves"
    );
    first.await.unwrap().is_created();
    wait_for(|| rig.memory.waited_keys() == 0).await;
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn without_the_setting_the_answer_is_the_immediate_409() {
    let journal = Journal::default();
    let creates = Arc::new(AtomicUsize::new(0));
    let create = timed_create(journal.clone(), Arc::clone(&creates));
    let rig = Rig::build(journal, creates, create, |layer| layer);
    let first = spawn_send(&rig.service, operation("now", "slow-300"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    rig.send(operation("now", "slow-300"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(rig.memory.waited_keys(), 0, "nobody waits");
    first.await.unwrap().is_created();
}

/// Found in review: a waiter whose client left stops waiting at once; if the first attempt
/// is released afterwards, nobody creates for the client that left, and the key is free.
#[tokio::test]
async fn a_waiter_whose_client_left_never_creates() {
    let store = MemoryStore::new();
    let (service, creates) = first_refused(store.clone());
    let first = spawn_send(&service, operation("left", "p"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiter = service.clone().oneshot(operation("left", "p"));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), waiter)
            .await
            .is_err()
    );
    assert_eq!(first.await.unwrap().status.as_u16(), 503);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        creates.load(Ordering::SeqCst),
        0,
        "nobody creates for a client that left"
    );
    assert!(store.is_empty(), "the key is free");
    assert_eq!(store.waited_keys(), 0);
}

/// Found in review: the cap is the layer's, however many services it builds.
#[tokio::test]
async fn the_cap_holds_across_the_services_of_one_layer() {
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
        .global_keys()
        .pending_wait(Duration::from_secs(5))
        .max_waiting(1);
    let a = layer.layer(timed_create(Journal::default(), Arc::clone(&creates)));
    let b = layer.layer(timed_create(Journal::default(), Arc::clone(&creates)));
    let first = spawn_send(&a, operation("shared-cap", "slow-400"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiting = spawn_send(&a, operation("shared-cap", "slow-400"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let reply = Reply::read(
        b.oneshot(operation("shared-cap", "slow-400"))
            .await
            .unwrap(),
    )
    .await;
    reply.exact(409, r#"{"error":"request_pending"}"#);
    assert!(started.elapsed() < Duration::from_millis(200), "immediate");
    first.await.unwrap().is_created();
    waiting.await.unwrap().is_created();
}

/// Found in review: any wait is accepted, the longest included.
#[tokio::test]
async fn the_longest_wait_is_accepted() {
    let rig = rig(Duration::MAX);
    let first = spawn_send(&rig.service, operation("forever", "slow-200"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let retry = rig.send(operation("forever", "slow-200")).await;
    retry.is_created();
    first.await.unwrap().is_created();
}

/// One of two waiters on a key goes away: the other is still woken by the completion.
#[tokio::test]
async fn a_waiter_leaving_does_not_take_the_others_wake_up() {
    let rig = rig(Duration::from_secs(5));
    let first = spawn_send(&rig.service, operation("two", "slow-300"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let staying = spawn_send(&rig.service, operation("two", "slow-300"));
    let leaving = rig.service.clone().oneshot(operation("two", "slow-300"));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), leaving)
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        rig.memory.waited_keys(),
        1,
        "the staying waiter's entry is kept"
    );
    let first = first.await.unwrap();
    let completed = Instant::now();
    let staying = staying.await.unwrap();
    assert!(
        completed.elapsed() < Duration::from_millis(30),
        "{:?}",
        completed.elapsed()
    );
    assert_eq!(staying.body, first.body);
    assert_eq!(rig.memory.waited_keys(), 0);
}

/// A memory store whose claims, once `hold` is set, take 100 ms after they took effect (their
/// answer on its way back).
#[derive(Clone)]
struct HoldingStore {
    inner: MemoryStore,
    hold: Arc<std::sync::atomic::AtomicBool>,
}

impl tower_idempotency::store::Store for HoldingStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &tower_idempotency::operation::Fingerprint,
        reservation: tower_idempotency::store::Reservation,
        lease: tower_idempotency::store::Lease,
    ) -> Result<tower_idempotency::store::Claim, tower_idempotency::store::StoreError> {
        let claim = self
            .inner
            .claim_with(key, fingerprint, reservation, lease)
            .await;
        if self.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        claim
    }

    fn changed<'a>(&'a self, key: &'a str) -> impl std::future::Future<Output = ()> + Send + 'a {
        self.inner.changed(key)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        lease: Duration,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.renew(key, reservation, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        response: &tower_idempotency::store::StoredResponse,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.complete(key, reservation, response).await
    }

    async fn release(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.inner.release(key, reservation).await
    }
}

/// The client of a waiter leaves while the waiter's claim of the released key is on its way
/// back: the key it got is released at once, and nobody creates.
#[tokio::test]
async fn a_key_claimed_for_a_client_that_left_is_released() {
    let store = HoldingStore {
        inner: MemoryStore::new(),
        hold: Arc::default(),
    };
    let (service, creates) = first_refused(store.clone());
    let first = spawn_send(&service, operation("in-flight", "p"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiter = service.clone().oneshot(operation("in-flight", "p"));
    let leave = async {
        tokio::time::sleep(Duration::from_millis(70)).await;
        store.hold.store(true, Ordering::SeqCst);
        // The release comes at about 200 ms; the waiter's claim then holds until about 300.
        tokio::time::sleep(Duration::from_millis(180)).await;
    };
    tokio::select! {
        _ = waiter => panic!("the waiter is still waiting or claiming"),
        () = leave => {}
    }
    assert_eq!(first.await.unwrap().status.as_u16(), 503);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        creates.load(Ordering::SeqCst),
        0,
        "nobody creates for a client that left"
    );
    assert!(store.inner.is_empty(), "the key it got is released");
}

/// A store that keeps everything in a `MemoryStore` but has no `changed` of its own: its
/// waiters poll, through the trait's default.
#[derive(Clone, Default)]
struct PollingStore(MemoryStore);

impl tower_idempotency::store::Store for PollingStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &tower_idempotency::operation::Fingerprint,
        reservation: tower_idempotency::store::Reservation,
        lease: tower_idempotency::store::Lease,
    ) -> Result<tower_idempotency::store::Claim, tower_idempotency::store::StoreError> {
        self.0
            .claim_with(key, fingerprint, reservation, lease)
            .await
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        lease: Duration,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.0.renew(key, reservation, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        response: &tower_idempotency::store::StoredResponse,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.0.complete(key, reservation, response).await
    }

    async fn release(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.0.release(key, reservation).await
    }
}

/// Found in review: the default `changed` started its poll interval when it was made, and the
/// layer makes it before its claim, so behind a claim as slow as the interval it ended at once
/// and the waiter claimed back to back. The interval runs from its first poll.
#[tokio::test]
async fn the_default_poll_interval_runs_from_the_first_poll() {
    use tower_idempotency::store::Store;
    let store = PollingStore::default();
    let changed = store.changed("k");
    tokio::time::sleep(tower_idempotency::store::CHANGE_POLL_INTERVAL).await;
    let polled = Instant::now();
    changed.await;
    assert!(
        polled.elapsed() >= tower_idempotency::store::CHANGE_POLL_INTERVAL / 2,
        "{:?}",
        polled.elapsed()
    );
}
