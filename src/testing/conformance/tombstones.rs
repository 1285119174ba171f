//! Tombstones: once its replay window passed, a completed operation is remembered (when it
//! completed, its status and `Location`) for the tombstone window, refused as expired and
//! never created again; past that window its key is new. Run by
//! [`tombstone_conformance!`](crate::tombstone_conformance) for a store that keeps them.

use std::time::{Duration, Instant, SystemTime};

use super::{awkward_response, claim, fp, new, unique_key};
use crate::store::{Claim, Operator, Purge, RecordState, Store, Tombstone};

/// A short way past `window` after `from`, to be sure it passed on the store's clock too.
async fn past(from: Instant, window: Duration) {
    let at = from + window + Duration::from_millis(50);
    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
}

/// Completes `key` with the awkward response, and says when, as a window between two
/// times of day and as the test's own moment before the complete.
async fn completed(store: &impl Store, key: &str) -> (SystemTime, SystemTime, Instant) {
    let reservation = new(store, key, &fp("a")).await;
    let (started, before) = (Instant::now(), SystemTime::now());
    store
        .complete(key, &reservation, &awkward_response())
        .await
        .unwrap();
    (before, SystemTime::now(), started)
}

/// The tombstone a claim answered, checked against the response it stands for.
fn checked(answer: Claim, between: (SystemTime, SystemTime)) -> Tombstone {
    let Claim::Expired(tombstone) = answer else {
        panic!("past its replay window, within its tombstone's: expired, not {answer:?}")
    };
    assert_eq!(tombstone.status(), awkward_response().status());
    assert_eq!(
        tombstone.location().expect("its Location"),
        "/labels/label-901"
    );
    // Kept to the millisecond, on the store's clock: a second either side of the test's.
    let second = Duration::from_secs(1);
    let at = tombstone.completed_at();
    assert!(
        at + second >= between.0 && at <= between.1 + second,
        "completed at {at:?}, not between {between:?}"
    );
    tombstone
}

/// Past its replay window, a completed key with the same fingerprint is refused as expired
/// (its tombstone says when it completed, its status and its `Location`), with another
/// fingerprint is a conflict, and 16 concurrent retries all get the expired answer: none is a
/// new claim. Past the tombstone window the key is new again.
pub async fn an_expired_key_is_refused_until_its_tombstone_ends(
    store: impl Store,
    retention: Duration,
    tombstones: Duration,
) {
    assert_eq!(store.replay_window(), Some(retention), "the replay window");
    assert_eq!(
        store.tombstone_window(),
        Some(tombstones),
        "the tombstone window"
    );
    let key = unique_key("tombstone");
    let (before, after, started) = completed(&store, &key).await;
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Replay(awkward_response()),
        "within its window: a replay"
    );
    past(started, retention).await;
    checked(claim(&store, &key, &fp("a")).await, (before, after));
    assert_eq!(
        claim(&store, &key, &fp("b")).await,
        Claim::Conflict,
        "another fingerprint is a conflict, as within the window"
    );
    let retries: Vec<_> = (0..16)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.claim(&key, &fp("a")).await.unwrap() })
        })
        .collect();
    for retry in retries {
        checked(retry.await.unwrap(), (before, after));
    }
    assert!(
        started.elapsed() < retention + tombstones,
        "the checks ran within the tombstone window; give the suite a longer one"
    );
    past(started, retention + tombstones).await;
    assert!(
        matches!(claim(&store, &key, &fp("b")).await, Claim::New(_)),
        "past the tombstone window the key is new"
    );
}

/// The purge turns nothing it must keep away: a tombstone within its window stays (the
/// operator sees it as expired, a retry is refused), and goes at the first purge past it.
pub async fn purge_keeps_tombstones_until_their_window_ends(
    store: impl Operator + Purge,
    retention: Duration,
    tombstones: Duration,
) {
    let key = unique_key("tombstone-purged");
    let (before, after, started) = completed(&store, &key).await;
    past(started, retention).await;
    let unpurged = store.inspect(&key).await.unwrap().expect("a record");
    assert_eq!(
        unpurged.state,
        RecordState::Expired,
        "past its window, before any purge: expired"
    );
    store.purge_expired().await.unwrap();
    let info = store
        .inspect(&key)
        .await
        .unwrap()
        .expect("a tombstone kept");
    assert_eq!(info.state, RecordState::Expired);
    assert_eq!(info.fingerprint, fp("a"));
    assert_eq!(info.status, Some(awkward_response().status()));
    // What the operator reads of it: the tombstone, and when its window ends.
    let kept = info.tombstone.expect("the tombstone, read back");
    assert_eq!(kept.location().expect("its Location"), "/labels/label-901");
    let until = info.remembered_until.expect("when its window ends");
    let (window, second) = (retention + tombstones, Duration::from_secs(1));
    assert!(
        until + second >= before + window && until <= after + window + second,
        "remembered until {until:?}, not {window:?} after {before:?}"
    );
    checked(claim(&store, &key, &fp("a")).await, (before, after));
    past(started, retention + tombstones).await;
    assert_eq!(
        store.inspect(&key).await.unwrap(),
        None,
        "past its window, before the purge: absent, as to a claim"
    );
    store.purge_expired().await.unwrap();
    assert_eq!(
        store.inspect(&key).await.unwrap(),
        None,
        "past its window, the purge drops the tombstone"
    );
}
