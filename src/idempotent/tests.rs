//! What the conformance suite does not hold on every store: bad keys never reach the store,
//! values that cannot be stored or read back, the run's future is `Send`, the lease is
//! renewed while the work runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::MemoryStore;
use crate::testing::wrapped::{Around, Wrapped};
use crate::testing::{Journal, RecordingStore};

fn fp() -> Fingerprint {
    fingerprint(&serde_json::json!({ "parcel_id": "parcel-42" })).unwrap()
}

#[tokio::test]
async fn a_bad_key_never_reaches_the_store() {
    let journal = Journal::new();
    let labels = Idempotent::new(RecordingStore::new(MemoryStore::new(), journal.clone()));
    let long = "k".repeat(256);
    for key in ["", "two words", "caf\u{e9}", "tab\there", long.as_str()] {
        let answer = labels.run(key, fp(), |_| async { Ok::<_, ()>(1) }).await;
        assert!(
            matches!(answer, Err(RunError::InvalidKey)),
            "{key:?}: {answer:?}"
        );
    }
    assert!(journal.take().is_empty());
    let longest = "k".repeat(255);
    let answer = labels
        .run(&longest, fp(), |_| async { Ok::<_, ()>(1) })
        .await;
    assert_eq!(answer.unwrap(), Ran::Done(1));
}

/// Past its replay window, a run the store remembers is refused as expired with its
/// tombstone (final: not transient), and its work does not run again.
#[tokio::test]
async fn a_run_past_its_window_is_expired_and_does_not_run_again() {
    let retention = Duration::from_millis(100);
    let store = MemoryStore::builder()
        .retention(retention)
        .tombstones(Duration::from_secs(60))
        .build();
    let labels = Idempotent::new(store);
    let runs = std::sync::atomic::AtomicUsize::new(0);
    let work = |_| async {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, ()>(7)
    };
    let started = tokio::time::Instant::now();
    assert_eq!(labels.run("k", fp(), work).await.unwrap(), Ran::Done(7));
    tokio::time::sleep_until(started + retention + Duration::from_millis(50)).await;
    let late = labels.run("k", fp(), work).await;
    let Err(RunError::Expired(tombstone)) = &late else {
        panic!("expired, not {late:?}");
    };
    assert_eq!(tombstone.status(), http::StatusCode::OK);
    assert!(!late.as_ref().unwrap_err().is_transient());
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_value_that_cannot_be_stored_keeps_its_key_and_one_that_cannot_be_read_is_an_error() {
    let labels = Idempotent::new(MemoryStore::new()).on_failure(Failures::Release);
    // JSON has no map with keys that are not strings.
    let unstorable = labels
        .run("k-1", fp(), |_| async {
            Ok::<_, ()>(BTreeMap::from([((1, 2), "a".to_owned())]))
        })
        .await;
    assert!(
        matches!(unstorable, Err(RunError::Unstorable(_))),
        "{unstorable:?}"
    );
    let after = labels.run("k-1", fp(), |_| async { Ok::<_, ()>(1) }).await;
    assert!(matches!(after, Err(RunError::Pending)), "{after:?}");

    labels
        .run("k-2", fp(), |_| async { Ok::<_, ()>("label-1".to_owned()) })
        .await
        .unwrap();
    let undecodable = labels
        .run("k-2", fp(), |_| async { Ok::<u64, ()>(1) })
        .await;
    assert!(
        matches!(undecodable, Err(RunError::Undecodable(_))),
        "{undecodable:?}"
    );
}

#[tokio::test]
async fn a_run_renews_its_lease_while_the_work_runs() {
    let journal = Journal::new();
    let store = RecordingStore::new(MemoryStore::new(), journal.clone());
    let labels = Idempotent::new(store).lease(Duration::from_millis(60));
    let answer = labels
        .run("k", fp(), |_| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, ()>(1)
        })
        .await;
    assert_eq!(answer.unwrap(), Ran::Done(1));
    let calls = journal.take();
    assert!(
        calls.iter().filter(|c| **c == "renew").count() >= 2,
        "{calls:?}"
    );
    assert_eq!(calls.first(), Some(&"claim"));
    assert_eq!(calls.last(), Some(&"complete"));
}

#[test]
fn a_run_is_send_and_its_idempotent_clone_and_sync() {
    fn send<T: Send>(_: &T) {}
    fn shared<T: Clone + Send + Sync>() {}
    shared::<Idempotent<MemoryStore>>();
    let labels = Idempotent::new(MemoryStore::new());
    let run = labels.run("k", fp(), |_| async { Ok::<_, std::io::Error>(1) });
    send(&run);
}

#[test]
fn errors_say_what_happened_and_keep_their_source() {
    use std::error::Error as _;
    let failed = RunError::Failed(std::io::Error::other("printer offline"));
    assert_eq!(failed.to_string(), "the work failed: printer offline");
    assert_eq!(failed.source().unwrap().to_string(), "printer offline");
    assert!(!failed.is_transient());
    assert!(RunError::<std::io::Error>::StoreUnavailable.is_transient());
    assert!(RunError::<std::io::Error>::Pending.source().is_none());
    let ran = Ran::Done(3);
    assert!(!ran.is_replayed() && ran.is_stored());
    assert_eq!(ran.into_inner(), 3);
    assert!(Ran::Replayed(3).is_replayed());
    assert!(!Ran::Unrecorded(3).is_stored() && !Ran::Unrecorded(3).is_replayed());
    assert_eq!(Ran::Unrecorded(4).into_inner(), 4);
    let undecodable = serde_json::from_str::<u8>("x").unwrap_err();
    let undecodable = RunError::<std::io::Error>::Undecodable(undecodable);
    assert!(undecodable.source().is_some());
    assert!(
        undecodable
            .to_string()
            .starts_with("the stored value cannot be read: ")
    );
}

#[test]
fn the_fingerprint_is_of_the_canonical_json_and_run_keys_are_their_own() {
    let digest = Fingerprint::from_sha256(Sha256::digest(br#"{"a":1,"b":[true,null]}"#).into());
    assert_eq!(
        fingerprint(&serde_json::json!({ "b": [true, null], "a": 1.0 })).unwrap(),
        digest
    );
    let deep = (0..200).fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
    assert!(fingerprint(&deep).is_err());
    let labels = Idempotent::new(MemoryStore::new()).scope("ab");
    assert_eq!(labels.store_key("c"), "run:2:abc");
    assert_ne!(
        Idempotent::new(MemoryStore::new())
            .scope("a")
            .store_key("bc"),
        labels.store_key("c")
    );
}

/// A store whose next call named hangs, before or after it reaches the memory store it wraps,
/// until its caller gives up.
type Hanging = Wrapped<MemoryStore, Hangs>;

/// The call to hang next, and the completes: how many were called, and whether they answer as
/// a transactional store's whose transaction ended.
#[derive(Clone, Default)]
struct Hangs {
    hang: Arc<std::sync::Mutex<Option<(&'static str, bool)>>>,
    completes: Arc<std::sync::atomic::AtomicUsize>,
    uncommitted: Arc<std::sync::atomic::AtomicBool>,
}

impl Hanging {
    fn new() -> Self {
        let around = Hangs::default();
        Self {
            inner: MemoryStore::new(),
            around,
        }
    }

    /// Hangs the next `call`, after it took effect if `applied`.
    fn hang(&self, call: &'static str, applied: bool) {
        *self.around.hang.lock().unwrap() = Some((call, applied));
    }
}

impl Around for Hangs {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        call: &'static str,
        run: impl Future<Output = Result<T, crate::store::StoreError>> + Send + 'a,
    ) -> Result<T, crate::store::StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let uncommitted = call == "complete" && {
            self.completes.fetch_add(1, SeqCst);
            self.uncommitted.load(SeqCst)
        };
        let apply = async {
            if uncommitted {
                let kind = crate::store::StoreErrorKind::Uncommitted;
                Err(crate::store::StoreError::new(kind))
            } else {
                run.await
            }
        };
        let hang = {
            let mut hang = self.hang.lock().unwrap();
            match *hang {
                Some((name, applied)) if name == call => hang.take().map(|_| applied),
                _ => None,
            }
        };
        match hang {
            None => apply.await,
            Some(true) => {
                drop(apply.await);
                std::future::pending().await
            }
            Some(false) => std::future::pending().await,
        }
    }

    /// What a transactional store attaches, its transaction, here the claim's key.
    fn attach(&self, key: &str, extensions: &mut http::Extensions) -> bool {
        extensions.insert(Attached(key.to_owned()));
        true
    }
}

/// What [`Hanging`] attaches to a claim.
#[derive(Debug, Clone, PartialEq)]
struct Attached(String);

#[tokio::test]
async fn the_work_gets_what_the_store_attached_to_its_claim() {
    let labels = Idempotent::new(Hanging::new()).scope("labels");
    let seen = labels
        .run("k", fp(), |attempt| async move {
            let attached = attempt.get::<Attached>().cloned();
            let all = attempt.extensions().len();
            Ok::<_, ()>((attached.map(|a| a.0), all))
        })
        .await
        .unwrap();
    assert_eq!(seen, Ran::Done((Some("run:6:labelsk".to_owned()), 1)));
    let plain = Idempotent::new(MemoryStore::new())
        .run("k", fp(), |attempt| async move {
            Ok::<_, ()>((
                attempt.get::<Attached>().is_none(),
                attempt.extensions().len(),
            ))
        })
        .await
        .unwrap();
    assert_eq!(plain, Ran::Done((true, 0)));
}

/// Runs until it answers other than pending, for at most ten seconds.
async fn settled(labels: &Idempotent<Hanging>, key: &str, value: u32) -> Ran<u32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match labels
            .run(key, fp(), |_| async move { Ok::<_, ()>(value) })
            .await
        {
            Err(RunError::Pending) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => return answer.unwrap(),
        }
    }
}

/// Drops a run while its `call` hangs, before and after it took effect, and answers what a
/// later run of the key gets, each time.
async fn dropped_while_hanging(call: &'static str) -> Vec<Ran<u32>> {
    let store = Hanging::new();
    // No take-over: only the settling of the dropped call can free or complete the key.
    let labels = Idempotent::new(store.clone());
    let mut later = Vec::new();
    for applied in [false, true] {
        let key = format!("{call}-{applied}");
        store.hang(call, applied);
        let dropped = tokio::time::timeout(
            Duration::from_millis(50),
            labels.run(&key, fp(), |_| async { Ok::<_, ()>(1) }),
        )
        .await;
        assert!(dropped.is_err(), "the {call} hung");
        later.push(settled(&labels, &key, 2).await);
    }
    later
}

#[tokio::test]
async fn a_run_dropped_while_its_claim_is_in_flight_leaves_its_key_free() {
    assert_eq!(
        dropped_while_hanging("claim").await,
        [Ran::Done(2), Ran::Done(2)]
    );
}

#[tokio::test]
async fn a_run_dropped_while_its_complete_is_in_flight_gets_its_key_completed() {
    assert_eq!(
        dropped_while_hanging("complete").await,
        [Ran::Replayed(1), Ran::Replayed(1)]
    );
}

/// A run of `k` on `labels`, spawned, whose work answers 1 once `finish` is notified; returned
/// once its work started.
async fn run_held<St: Store + Clone + 'static>(
    labels: &Idempotent<St>,
) -> (
    tokio::task::JoinHandle<Result<Ran<i32>, RunError<()>>>,
    Arc<tokio::sync::Notify>,
) {
    let (started, finish) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let first = tokio::spawn({
        let (labels, started, finish) = (labels.clone(), Arc::clone(&started), Arc::clone(&finish));
        async move {
            labels
                .run("k", fp(), |_| async move {
                    started.notify_one();
                    finish.notified().await;
                    Ok::<_, ()>(1)
                })
                .await
        }
    });
    started.notified().await;
    (first, finish)
}

#[tokio::test]
async fn a_run_whose_key_was_taken_over_meanwhile_is_unrecorded() {
    let journal = Journal::new();
    let store = RecordingStore::new(MemoryStore::new(), journal);
    let lease = Duration::from_millis(60);
    let labels = Idempotent::new(store.clone())
        .lease(lease)
        .take_over_abandoned();
    // The first run's renewals fail: its lease lapses while its work runs, and a second run
    // takes the key over and completes it.
    store.fail("renew");
    let (first, finish) = run_held(&labels).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let second = loop {
        match labels.run("k", fp(), |_| async { Ok::<_, ()>(2) }).await {
            Err(RunError::Pending) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => break answer,
        }
    };
    assert_eq!(second.unwrap(), Ran::Done(2));
    store.recover();
    finish.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), Ran::Unrecorded(1));
    let again = labels.run("k", fp(), |_| async { Ok::<_, ()>(3) }).await;
    assert_eq!(again.unwrap(), Ran::Replayed(2));
}

#[tokio::test]
async fn a_run_called_where_the_layers_client_left_still_waits() {
    let labels = Idempotent::new(MemoryStore::new()).pending_wait(Duration::from_secs(10));
    let (first, finish) = run_held(&labels).await;
    // A guarded handler whose client went away calls a run: the run is not the layer's.
    let waiting = tokio::spawn(crate::pipeline::CLIENT_LEFT.scope((), {
        let labels = labels.clone();
        async move { labels.run("k", fp(), |_| async { Ok::<_, ()>(2) }).await }
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    finish.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), Ran::Done(1));
    assert_eq!(waiting.await.unwrap().unwrap(), Ran::Replayed(1));
}

#[tokio::test]
async fn a_dropped_complete_whose_transaction_ended_is_not_repeated() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Hanging::new();
    store.around.uncommitted.store(true, SeqCst);
    store.hang("complete", false);
    let labels = Idempotent::new(store.clone());
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        labels.run("k", fp(), |_| async { Ok::<_, ()>(1) }),
    )
    .await;
    assert!(dropped.is_err(), "the complete hung");
    // The settling's first repetition answers that the transaction ended: it stops there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.around.completes.load(SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the complete was not repeated"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its next repetitions would come 100, 200 and 400 ms later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.around.completes.load(SeqCst), 2);
}

#[tokio::test]
async fn a_complete_that_did_not_commit_answers_store_unavailable() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Hanging::new();
    store.around.uncommitted.store(true, SeqCst);
    let labels = Idempotent::new(store.clone());
    let answer = labels.run("k", fp(), |_| async { Ok::<_, ()>(1) }).await;
    assert!(
        matches!(answer, Err(RunError::StoreUnavailable)),
        "{answer:?}"
    );
    assert_eq!(
        store.around.completes.load(SeqCst),
        1,
        "not settled: nothing to repeat"
    );
}

#[tokio::test]
async fn a_run_dropped_while_its_work_runs_abandons_its_key() {
    let journal = Journal::new();
    let labels = Idempotent::new(RecordingStore::new(MemoryStore::new(), journal.clone()));
    let started = Arc::new(tokio::sync::Notify::new());
    let running = tokio::spawn({
        let (labels, started) = (labels.clone(), Arc::clone(&started));
        async move {
            labels
                .run("k", fp(), |_| async move {
                    started.notify_one();
                    std::future::pending::<Result<u32, ()>>().await
                })
                .await
        }
    });
    started.notified().await;
    running.abort();
    let _ = running.await;
    // A transactional store rolls the work back on abandon; a plain one keeps the key.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !journal.take().contains(&"abandon") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key was not abandoned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
