//! The memory store: the conformance suite, and what only it offers.

mod common;

use std::time::Duration;

use tower_idempotency::{MemoryStore, Store, fingerprint};

async fn make_store(retention: Option<Duration>) -> MemoryStore {
    match retention {
        Some(retention) => MemoryStore::with_retention(retention),
        None => MemoryStore::new(),
    }
}

store_conformance!(make_store, retention = Duration::from_millis(100));

#[tokio::test]
async fn purge_drops_expired_completed_records_and_keeps_pending_ones() {
    let store = MemoryStore::with_retention(Duration::from_millis(20));
    let fp = fingerprint("a", "b");
    let tower_idempotency::Claim::New(reservation) = store.claim("done", &fp).await.unwrap() else {
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
    assert_eq!(store.purge_expired(), 0);
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(store.purge_expired(), 1);
    assert_eq!(store.len(), 1);
    assert!(store.is_pending("open"));
    assert_eq!(MemoryStore::new().purge_expired(), 0);
}
