//! The toy store against the facade's public conformance suite, as a third party runs it.

use std::time::Duration;

use toy_idempotency_store::ToyStore;

async fn make_store(retention: Option<Duration>) -> ToyStore {
    ToyStore::new(retention)
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(100));
