//! The memory store: the conformance suite, and what only it offers.

use crate::common;

use std::time::Duration;

use tower_idempotency::MemoryStore;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Purge;
use tower_idempotency::store::Store;

async fn make_store(retention: Option<Duration>) -> MemoryStore {
    match retention {
        Some(retention) => MemoryStore::with_retention(retention),
        None => MemoryStore::new(),
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(100));

async fn make_with(options: tower_idempotency::store::StoreOptions) -> MemoryStore {
    MemoryStore::builder().options(options).build()
}

tower_idempotency::tombstone_conformance!(
    make_with,
    retention = Duration::from_millis(200),
    tombstones = Duration::from_secs(2),
);

#[tokio::test]
async fn purge_drops_expired_completed_records_and_keeps_pending_ones() {
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(20))
        // No tombstones: the record itself goes at its expiry.
        .tombstones(Duration::ZERO)
        .build();
    let fp = LabelContract::fingerprint("a", "b");
    let tower_idempotency::store::Claim::New(reservation) = store.claim("done", &fp).await.unwrap()
    else {
        panic!()
    };
    store.claim("open", &fp).await.unwrap();
    store
        .complete(
            "done",
            &reservation,
            &common::conformance::awkward_response(),
        )
        .await
        .unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(store.len(), 1);
    assert!(store.is_pending("open"));
    assert_eq!(MemoryStore::new().purge_expired().await.unwrap(), 0);
}

/// A bounded store refuses a new key when full (the layer answers 503 and creates nothing),
/// and makes room again as records are released or expire; replays of what it holds go on.
#[tokio::test]
async fn a_bounded_store_refuses_new_keys_when_full_and_makes_room_again() {
    use common::*;
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(50))
        .tombstones(Duration::ZERO)
        .max_records(2)
        .build();
    let creates = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let service = counting_service(
        store.clone(),
        std::sync::Arc::clone(&creates),
        Duration::ZERO,
    );
    send_to(&service, operation("one", "p"))
        .await
        .exact(201, CREATED_BODY);
    send_to(&service, operation("two", "p"))
        .await
        .exact(201, CREATED_BODY);
    send_to(&service, operation("three", "p"))
        .await
        .exact(503, r#"{"error":"store_unavailable"}"#)
        .header("retry-after", &["2"]);
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 2);
    send_to(&service, operation("one", "p"))
        .await
        .exact(201, CREATED_BODY); // a replay needs no room
    assert_eq!(store.len(), 2);

    // A release gives its room back.
    let fp = LabelContract::fingerprint("x", "p");
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(
        store.purge_expired().await.unwrap(),
        2,
        "both completed records expired"
    );
    let tower_idempotency::store::Claim::New(reservation) = store.claim("a", &fp).await.unwrap()
    else {
        panic!()
    };
    store.claim("b", &fp).await.unwrap();
    let full = store.claim("c", &fp).await.unwrap_err();
    assert_eq!(
        full.kind(),
        tower_idempotency::store::StoreErrorKind::CapacityExceeded
    );
    store.release("a", &reservation).await.unwrap();
    assert!(matches!(
        store.claim("c", &fp).await,
        Ok(tower_idempotency::store::Claim::New(_))
    ));
}

/// Found in review: a full store whose room is held by expired records in other shards makes
/// room for a new key instead of refusing it.
#[tokio::test]
async fn a_full_store_purges_expired_records_of_every_shard_before_refusing() {
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(30))
        .max_records(1)
        .build();
    let fp = LabelContract::fingerprint("x", "p");
    let tower_idempotency::store::Claim::New(reservation) = store.claim("a", &fp).await.unwrap()
    else {
        panic!()
    };
    store
        .complete("a", &reservation, &common::conformance::awkward_response())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    // "b" falls in another shard than "a"; the expired "a" makes room all the same.
    assert!(matches!(
        store.claim("b", &fp).await,
        Ok(tower_idempotency::store::Claim::New(_))
    ));
    let full = store.claim("z", &fp).await.unwrap_err();
    assert_eq!(
        full.kind(),
        tower_idempotency::store::StoreErrorKind::CapacityExceeded
    );
}

/// Expiry is amortised: each claim drops the expired records at the front of its shard's
/// queue, so records expire without `purge_expired` and without a scan of the shard.
#[tokio::test]
async fn claims_drop_expired_records_as_they_go() {
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(30))
        // No tombstones: the record itself goes at its expiry.
        .tombstones(Duration::ZERO)
        .build();
    let fp = LabelContract::fingerprint("x", "p");
    let response = common::conformance::awkward_response();
    for i in 0..64 {
        let key = format!("old-{i}");
        let tower_idempotency::store::Claim::New(reservation) =
            store.claim(&key, &fp).await.unwrap()
        else {
            panic!()
        };
        store.complete(&key, &reservation, &response).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    for i in 0..640 {
        store.claim(&format!("new-{i}"), &fp).await.unwrap();
    }
    assert_eq!(
        store.len(),
        640,
        "every expired record was dropped by a claim"
    );
    assert_eq!(store.purge_expired().await.unwrap(), 0);
}

/// A key completed, forgotten and completed again is dropped when its second completion
/// expires, not its first.
#[tokio::test]
async fn a_record_completed_again_expires_from_its_last_completion() {
    use tower_idempotency::store::Operator;
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(150))
        // No tombstones: the record itself goes at its expiry.
        .tombstones(Duration::ZERO)
        .build();
    let fp = LabelContract::fingerprint("x", "p");
    let response = common::conformance::awkward_response();
    let complete = |store: MemoryStore| {
        let response = response.clone();
        async move {
            let tower_idempotency::store::Claim::New(reservation) =
                store.claim("k", &fp).await.unwrap()
            else {
                panic!()
            };
            store.complete("k", &reservation, &response).await.unwrap();
        }
    };
    complete(store.clone()).await;
    assert!(store.forget("k").await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    complete(store.clone()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "the first completion's entry is stale"
    );
    assert!(store.completed("k").is_some());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert!(store.completed("k").is_none());
}

/// A record further back in its shard's expiry queue than a claim looks is expired all the
/// same: the claim treats it as absent.
#[tokio::test]
async fn an_expired_record_not_yet_dropped_is_absent_to_a_claim() {
    let store = MemoryStore::builder()
        .retention(Duration::from_millis(30))
        // No tombstones: the record itself goes at its expiry.
        .tombstones(Duration::ZERO)
        .build();
    assert!(store.is_empty());
    let fp = LabelContract::fingerprint("x", "p");
    let response = common::conformance::awkward_response();
    for i in 0..400 {
        let key = format!("k{i}");
        let tower_idempotency::store::Claim::New(reservation) =
            store.claim(&key, &fp).await.unwrap()
        else {
            panic!()
        };
        store.complete(&key, &reservation, &response).await.unwrap();
        assert!(!store.is_pending(&key));
    }
    assert!(!store.is_empty());
    tokio::time::sleep(Duration::from_millis(40)).await;
    // Newest first: most are behind older expired entries no claim has reached yet.
    for i in (0..400).rev() {
        let claim = store.claim(&format!("k{i}"), &fp).await.unwrap();
        assert!(
            matches!(claim, tower_idempotency::store::Claim::New(_)),
            "k{i}: {claim:?}"
        );
    }
}

/// `pending_wait` on the memory store: two layers over one store (two services of one
/// process), woken by the completion itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_retries_get_the_first_attempts_bytes_on_every_layer() {
    let store = MemoryStore::new();
    common::waiting_retries_get_the_first_attempts_bytes(
        store.clone(),
        store.clone(),
        Duration::from_millis(100),
    )
    .await;
    assert_eq!(store.waited_keys(), 0);
}

/// Resident memory of this process, in bytes (Linux's `/proc/self/statm`, in pages).
#[cfg(target_os = "linux")]
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// A flood of distinct keys, four times the bound, through the layer: past the bound every new
/// key gets the store-unavailable answer with `Retry-After` and creates nothing, the process's
/// resident memory grows by no more than the bound's worth (a kilobyte a record; the flood's
/// worth without the bound), and replays of earlier keys and a pending key keep their answers.
/// Run in a process of its own (this test binary again, this test alone), so that the other
/// tests' memory is not counted.
#[cfg(target_os = "linux")]
#[test]
fn a_flood_of_distinct_keys_past_the_bound_is_refused_within_the_bounds_memory() {
    const ALONE: &str = "TOWER_IDEMPOTENCY_FLOOD_ALONE";
    if std::env::var_os(ALONE).is_none() {
        // The test's name in its binary: its module's path below the binary's, then its own.
        let name = "a_flood_of_distinct_keys_past_the_bound_is_refused_within_the_bounds_memory";
        let name = match module_path!().split_once("::") {
            Some((_, module)) => format!("{module}::{name}"),
            None => name.to_owned(),
        };
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &name, "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .expect("the test binary runs again");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "the flood in a process of its own: {stdout}"
        );
        assert!(
            stdout.contains("1 passed"),
            "the flood ran, alone, in its own process: {stdout}"
        );
        return;
    }
    use common::*;
    const BOUND: usize = 5_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = MemoryStore::builder().max_records(BOUND).build();
        let creates = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let service = counting_service(
            store.clone(),
            std::sync::Arc::clone(&creates),
            Duration::ZERO,
        );
        // The first request warms what every request needs once; a second stays pending.
        send_to(&service, operation("warm", "p")).await.is_created();
        let stalled =
            counting_service(store.clone(), Default::default(), Duration::from_secs(3600));
        let held = tokio::spawn(async move { send_to(&stalled, operation("held", "p")).await });
        while store.len() < 2 {
            tokio::task::yield_now().await;
        }
        let before = resident_bytes();
        let mut refused = 0;
        for i in 0..4 * BOUND {
            let reply = send_to(&service, operation(&format!("flood-{i}"), "p")).await;
            match reply.status.as_u16() {
                201 => {}
                503 => {
                    reply
                        .exact(503, r#"{"error":"store_unavailable"}"#)
                        .header("retry-after", &["2"]);
                    refused += 1;
                }
                other => panic!("request {i}: {other}"),
            }
        }
        let grown = resident_bytes().saturating_sub(before);
        assert_eq!(refused, 3 * BOUND + 2, "every key past the bound refused");
        assert_eq!(store.len(), BOUND);
        assert_eq!(
            creates.load(std::sync::atomic::Ordering::SeqCst),
            BOUND - 1,
            "nothing created for a refused key"
        );
        assert!(
            grown <= BOUND * 1024,
            "resident memory grew by {grown} bytes for {BOUND} records"
        );
        // What the store holds keeps its answers.
        send_to(&service, operation("flood-0", "p"))
            .await
            .is_created();
        send_to(&service, operation("warm", "p")).await.is_created();
        send_to(&service, operation("held", "p"))
            .await
            .exact(409, r#"{"error":"request_pending"}"#);
        assert_eq!(
            creates.load(std::sync::atomic::Ordering::SeqCst),
            BOUND - 1,
            "replays"
        );
        held.abort();
    });
}

/// A new store is bounded at a million records; `max_records` sets another bound and
/// `unbounded` takes it away, a bound set before included.
#[tokio::test]
async fn the_default_bound_is_a_million_records_and_unbounded_opts_out() {
    use tower_idempotency::store::{Claim, DEFAULT_MAX_RECORDS};
    assert_eq!(DEFAULT_MAX_RECORDS, 1_000_000);
    assert_eq!(MemoryStore::new().record_bound(), Some(DEFAULT_MAX_RECORDS));
    assert_eq!(
        MemoryStore::with_retention(Duration::from_secs(1)).record_bound(),
        Some(DEFAULT_MAX_RECORDS)
    );
    let bounded = MemoryStore::builder().max_records(3);
    assert_eq!(bounded.clone().build().record_bound(), Some(3));
    let unbounded = bounded.unbounded().build();
    assert_eq!(unbounded.record_bound(), None);
    let fp = LabelContract::fingerprint("x", "p");
    for i in 0..10 {
        assert!(matches!(
            unbounded.claim(&format!("k-{i}"), &fp).await,
            Ok(Claim::New(_))
        ));
    }
}
