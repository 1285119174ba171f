//! `DynStore`: the conformance suite through the type-erased wrapper, on the memory store and,
//! with their features, on Redis and PostgreSQL; and the layer over it.

use crate::common;

use std::time::Duration;

use common::*;
use tower_idempotency::MemoryStore;
use tower_idempotency::store::DynStore;
use tower_idempotency::store::Store;

async fn make_store(retention: Option<Duration>) -> DynStore {
    DynStore::new(match retention {
        Some(retention) => MemoryStore::with_retention(retention),
        None => MemoryStore::new(),
    })
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(100));

/// Over a store without `Operator`: every property but the operator's.
mod without_operator {
    use super::*;

    async fn make_store(retention: Option<Duration>) -> DynStore {
        DynStore::without_operator(match retention {
            Some(retention) => MemoryStore::with_retention(retention),
            None => MemoryStore::new(),
        })
    }

    tower_idempotency::store_conformance!(
        make_store,
        retention = Duration::from_millis(100),
        without_operator
    );
}

#[tokio::test]
async fn the_layer_over_a_dyn_store_creates_once_and_replays() {
    let store = make_store(None).await;
    assert!(format!("{store:?}").contains("MemoryStore"));
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store.clone(),
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        timed_create(Journal::default(), Default::default()),
    );
    let first = spawn_send(&service, operation("dyn", "p")).await.unwrap();
    first.is_created();
    let replay = spawn_send(&service, operation("dyn", "p")).await.unwrap();
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
}

/// The wrapped store is asked for `changed` when the wrapper is, not when it is first polled:
/// the memory store, which does not poll, still sees a change made in between.
#[tokio::test]
async fn changed_is_asked_of_the_wrapped_store_at_once() {
    let memory = MemoryStore::new();
    let store = DynStore::new(memory.clone());
    let fp = tower_idempotency::operation::LabelContract::fingerprint("k", "p");
    let Ok(tower_idempotency::store::Claim::New(reservation)) = store.claim("k", &fp).await else {
        panic!("a new claim");
    };
    let changed = store.changed("k");
    assert_eq!(memory.waited_keys(), 1);
    store.release("k", &reservation).await.unwrap();
    tokio::time::timeout(Duration::from_millis(200), changed)
        .await
        .expect("woken by the release");
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    async fn make_store(retention: Option<Duration>) -> DynStore {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let store = tower_idempotency::store::RedisStore::connect(&url)
            .await
            .expect("Redis at REDIS_URL")
            .prefix("tower-idempotency-test-dyn:");
        DynStore::new(match retention {
            Some(retention) => store.retention(retention),
            None => store,
        })
    }

    tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    async fn make_store(retention: Option<Duration>) -> DynStore {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let store = tower_idempotency::store::PostgresStore::connect(&url)
            .await
            .expect("PostgreSQL at DATABASE_URL")
            .table("tower_idempotency_test_dyn")
            .unwrap();
        store.migrate().await.unwrap();
        DynStore::new(match retention {
            Some(retention) => store.retention(retention),
            None => store,
        })
    }

    tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));
}

/// A claim the wrapped store answers at once is answered at once through the wrapper, so the
/// layer answers its replays with nothing allocated; a store that does not stays `None`.
#[tokio::test]
async fn a_claim_at_once_is_forwarded() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Store;
    use tower_idempotency::store::{Claim, Lease, Reservation};
    let fp = LabelContract::fingerprint("k", "p");
    let token = Reservation::generate();
    let memory = DynStore::new(MemoryStore::new());
    let claimed = memory.claim_now("k", &fp, token, Lease::default());
    assert_eq!(claimed.map(Result::unwrap), Some(Claim::New(token)));
    let again = memory.claim_now("k", &fp, Reservation::generate(), Lease::default());
    assert_eq!(again.map(Result::unwrap), Some(Claim::Pending));
    let recording = tower_idempotency::testing::RecordingStore::new(
        MemoryStore::new(),
        tower_idempotency::testing::Journal::new(),
    );
    let waiting = DynStore::without_operator(recording);
    assert!(
        waiting
            .claim_now("k", &fp, token, Lease::default())
            .is_none()
    );
}
