//! The PostgreSQL store's waits: the table's notifications, one listening connection per store, waiters across replicas, a listener that loses its connection or its runtime.
#![cfg(feature = "postgres")]

#[allow(unused_imports)]
use crate::postgres_store::*;

use crate::common;

use std::time::Duration;

use common::conformance::{awkward_response, unique_key};
use common::*;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::PostgresStore;
use tower_idempotency::store::Store;
use tower_idempotency::store::postgres::sqlx;

/// `pending_wait` on this store: the waiting retries, on this replica and on another with its
/// own pools, are woken by the completion announced on the table's channel (each makes one
/// claim on arrival, one before it waits and one after the wake, no polling) and answer with
/// the first attempt's bytes within tens of milliseconds of its completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn waiting_retries_get_the_first_attempts_bytes_on_every_replica() {
    use tower_idempotency::testing::{Journal, RecordingStore};
    let journal = Journal::default();
    let a = RecordingStore::new(make_store(None).await, journal.clone());
    let b = RecordingStore::new(make_store(None).await, journal.clone());
    // Listening before the first attempt, as a long-running replica is.
    for store in [&a, &b] {
        drop(store.changed("warm-up"));
        listening(store.inner()).await;
    }
    waiting_retries_get_the_first_attempts_bytes(a, b, Duration::from_millis(250)).await;
    let claims = journal.take().iter().filter(|c| **c == "claim").count();
    assert_eq!(
        claims,
        1 + 3 + 3,
        "woken by the notification, not by polling"
    );
}

/// One listening connection per store however many wait, ended with the store; a store on
/// the application's pool listens too, on a connection of its own outside that pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn one_listening_connection_per_store_ended_with_it() {
    let admin = admin_pool().await;
    let store = store_on_own_table().await;
    let keys: Vec<_> = (0..20).map(|i| format!("k{i}")).collect();
    let waits: Vec<_> = keys.iter().map(|key| store.changed(key)).collect();
    listening(&store).await;
    assert_eq!(store.waited_keys(), 20);
    let table = store.table_name().to_owned();
    assert_eq!(listeners(&admin, &table).await.len(), 1, "one connection");
    drop_table(&store).await;
    drop(waits);
    assert_eq!(store.waited_keys(), 0, "dropped waiters leave nothing");
    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !listeners(&admin, &table).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // On the application's pool (here one of the test's own), the store listens all the
    // same: one connection, made with the pool's connect options, none of the pool's.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&database_url())
        .await
        .unwrap();
    let own = PostgresStore::new(pool.clone())
        .table(&format!(
            "tidem_listen_{:x}",
            tower_idempotency::store::Reservation::generate().as_u128()
        ))
        .unwrap();
    own.migrate().await.unwrap();
    let table = own.table_name().to_owned();
    let in_pool = pool.size();
    drop(own.changed("k"));
    listening(&own).await;
    assert_eq!(own.waited_keys(), 0);
    assert_eq!(listeners(&admin, &table).await.len(), 1, "one connection");
    assert_eq!(
        pool.size(),
        in_pool,
        "the listener is not one of the pool's"
    );
    drop_table(&own).await;
    drop(own);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !listeners(&admin, &table).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the listening connection is lost, a change may go unheard: every waiter is woken at
/// once to look again, well before its one-second fallback poll; the store listens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn waiters_look_again_when_the_listener_loses_its_connection() {
    let admin = admin_pool().await;
    let store = store_on_own_table().await;
    drop(store.changed("warm-up"));
    listening(&store).await;
    let changed = store.changed("k");
    let started = std::time::Instant::now();
    for pid in listeners(&admin, store.table_name()).await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&admin)
            .await
            .unwrap();
    }
    tokio::time::timeout(Duration::from_millis(700), changed)
        .await
        .expect("woken by the lost connection");
    assert!(started.elapsed() < Duration::from_millis(700));
    listening(&store).await;
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn fifty_waiters_on_two_replicas_get_the_same_201_and_leave_nothing() {
    fifty_waiters_on_two_replicas(
        make_store(None).await,
        make_store(None).await,
        PostgresStore::waited_keys,
    )
    .await;
}

/// Found in review: a notification that cannot be sent (here the store's role may not run
/// `pg_notify`; a full notification queue fails the same way) fails neither the complete nor
/// the release it announces. The waiter, not woken, looks again within its fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_notification_that_cannot_be_sent_fails_no_change() {
    // A connection of its own, with no statement timeout: making a database takes its time on
    // a loaded machine.
    let mut admin = PgConnection::connect_with(&database_options())
        .await
        .unwrap();
    let database = format!(
        "tower_idempotency_quiet_{:x}",
        tower_idempotency::store::Reservation::generate().as_u128()
    );
    batch(&mut admin, format!("CREATE DATABASE {database}")).await;
    batch(
        &mut admin,
        "DO $$ BEGIN CREATE ROLE tower_idempotency_quiet LOGIN; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    )
    .await;
    let options = database_options().database(&database);
    let owner = PostgresStore::connect_lazy_with(options.clone());
    batch(
        owner.pool(),
        "REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC; \
         GRANT ALL ON SCHEMA public TO tower_idempotency_quiet",
    )
    .await;
    drop(owner);
    let store = PostgresStore::connect_lazy_with(options.username("tower_idempotency_quiet"));
    store.migrate().await.unwrap();
    for complete in [true, false] {
        let key = unique_key("quiet");
        let fp = LabelContract::fingerprint(&key, "p");
        let Ok(Claim::New(reservation)) = store.claim(&key, &fp).await else {
            panic!("a new claim");
        };
        let started = std::time::Instant::now();
        let change = async {
            listening(&store).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            if complete {
                store
                    .complete(&key, &reservation, &awkward_response())
                    .await
            } else {
                store.release(&key, &reservation).await
            }
        };
        let (changed, ()) = tokio::join!(change, store.changed(&key));
        changed.expect("the change commits");
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "the waiter looked again only after the change"
        );
        let after = store.claim(&key, &fp).await;
        if complete {
            assert!(matches!(after, Ok(Claim::Replay(_))));
        } else {
            assert!(matches!(after, Ok(Claim::New(_))), "released: free again");
        }
    }
    drop(store);
    batch(&mut admin, format!("DROP DATABASE {database} WITH (FORCE)")).await;
}

/// The listener belongs to the store, not to the runtime it started on: once that runtime has
/// shut down (its task dropped), the next wait from another runtime starts it again there.
#[test]
pub(crate) fn the_listener_starts_again_from_the_next_runtime() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let store = first.block_on(async {
        let store = store_on_own_table().await;
        drop(store.changed("warm-up"));
        listening(&store).await;
        store
    });
    drop(first);
    runtime().block_on(async {
        let admin = admin_pool().await;
        let table = store.table_name().to_owned();
        drop(store.changed("again"));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while listeners(&admin, &table).await.len() != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "no listener in the new runtime"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(store.notifications_listening());
        batch(&admin, format!("DROP TABLE \"{table}\"")).await;
    });
}
