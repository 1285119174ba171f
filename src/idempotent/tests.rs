//! What the conformance suite does not hold on every store: bad keys never reach the store,
//! values that cannot be stored or read back, the run's future is `Send`, the lease is
//! renewed while the work runs.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::MemoryStore;
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
    assert!(!ran.is_replayed());
    assert_eq!(ran.into_inner(), 3);
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
