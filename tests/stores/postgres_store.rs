//! The PostgreSQL store: the conformance suite, migrations, replicas, a pool reconnect, an
//! outage and round trips. Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

use crate::common;

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::conformance::{awkward_response, unique_key};
use common::servers::Proxy;
use common::*;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions, PgSslMode};
use sqlx::{AssertSqlSafe, Connection as _, Row as _};
use tower_idempotency::Store;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::PostgresStore;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{Claim, Purge, StoreErrorKind};

const TABLE: &str = "tower_idempotency_test";

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn make_store(retention: Option<Duration>) -> PostgresStore {
    let store = PostgresStore::connect(&database_url())
        .await
        .expect("PostgreSQL at DATABASE_URL")
        .table(TABLE)
        .unwrap()
        // Generous: beside this binary's heavier tests a loaded server once took a second
        // for a conformance claim; the tests about time make stores of their own.
        .timeout(Duration::from_secs(5));
    store.migrate().await.unwrap();
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_generic_json_operation_creates_once_for_a_thousand_identical_requests() {
    payments::generic_mode_creates_once(make_store(None).await, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_json_operation_completes_a_create_whose_client_went_away() {
    payments::generic_mode_survives_a_disconnect(make_store(None).await).await;
}

/// The connect options of `DATABASE_URL`.
fn database_options() -> PgConnectOptions {
    PgConnectOptions::from_str(&database_url()).expect("DATABASE_URL")
}

/// A store that reaches the database through `proxy`: `DATABASE_URL`'s user, password and
/// database at the proxy's address, in the clear (the proxy reads the protocol's messages to
/// count round trips; a TLS session would hide them).
async fn store_through(proxy: &Proxy) -> PostgresStore {
    let options = database_options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(PgSslMode::Disable);
    // One connection, so that every call finds its statements prepared once warm, and each
    // call's ping is sent before the next call has the connection.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_lazy_with(options);
    let store = PostgresStore::new(pool).table(TABLE).unwrap();
    store.migrate().await.unwrap();
    store
}

async fn database_addr() -> SocketAddr {
    let options = database_options();
    let host = match options.get_socket() {
        Some(_) => "127.0.0.1",
        None => options.get_host(),
    };
    tokio::net::lookup_host((host, options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// Runs `sql`, one statement or several, as one simple query on `executor`.
async fn batch<'e, E>(executor: E, sql: impl Into<String>)
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::raw_sql(AssertSqlSafe(sql.into()))
        .execute(executor)
        .await
        .unwrap();
}

#[tokio::test]
async fn migrate_is_idempotent_and_table_names_are_checked() {
    let store = make_store(None).await;
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    for bad in ["", "1abc", "a-b", "a\"b", "a;drop table x", &"x".repeat(49)] {
        let error = make_store(None).await.table(bad).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::InvalidConfig, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_with_their_own_pools_create_once() {
    replicas_create_once(make_store(None).await, make_store(None).await, 500).await;
}

/// `pending_wait` on this store: the waiting retries, on this replica and on another with its
/// own pools, are woken by the completion announced on the table's channel (each makes one
/// claim on arrival, one before it waits and one after the wake, no polling) and answer with
/// the first attempt's bytes within tens of milliseconds of its completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_retries_get_the_first_attempts_bytes_on_every_replica() {
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

/// Waits until `store` listens for announced changes.
async fn listening(store: &PostgresStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store.notifications_listening() {
        assert!(std::time::Instant::now() < deadline, "never listening");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A store on a table of its own, so that its listening connection can be told apart.
async fn store_on_own_table() -> PostgresStore {
    let table = format!(
        "tidem_listen_{:x}",
        tower_idempotency::store::Reservation::generate().as_u128()
    );
    // A timeout for a loaded server: these tests are about listening and migrating, not time.
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::from_secs(5));
    store.migrate().await.unwrap();
    store
}

/// A pool for the tests' own looks and changes, with no statement timeout: beside the
/// heavier tests of this file a loaded server takes longer than a store's.
async fn admin_pool() -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(database_options())
        .await
        .unwrap()
}

/// The backends listening on `store`'s table channel.
async fn listeners(admin: &sqlx::PgPool, table: &str) -> Vec<i32> {
    let rows = sqlx::query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = \
         'tower-idempotency listener' AND query = $1",
    )
    .bind(format!("LISTEN \"{table}_changed\""))
    .fetch_all(admin)
    .await
    .unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// One listening connection per store however many wait, ended with the store; a store on
/// the application's pool listens too, on a connection of its own outside that pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listening_connection_per_store_ended_with_it() {
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
async fn waiters_look_again_when_the_listener_loses_its_connection() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_and_pending_records_survive_a_new_pool() {
    let key = unique_key("durable");
    let creates = Arc::new(AtomicUsize::new(0));
    let pending_key = unique_key("durable-pending");
    {
        let store = make_store(None).await;
        let service = counting_service(store.clone(), Arc::clone(&creates), Duration::ZERO);
        send_to(&service, operation(&key, "parcel-42"))
            .await
            .exact(201, CREATED_BODY);
        let fp = LabelContract::fingerprint(&pending_key, "parcel-42");
        assert!(matches!(
            store.claim(&key_of(&pending_key), &fp).await,
            Ok(Claim::New(_))
        ));
    } // every connection of that pool is closed here

    let store = make_store(None).await;
    let service = counting_service(store, Arc::clone(&creates), Duration::ZERO);
    let replay = send_to(&service, operation(&key, "parcel-42")).await;
    replay.is_created();
    assert_eq!(replay.outcome, Some(tower_idempotency::Outcome::Replay));
    send_to(&service, operation(&pending_key, "parcel-42"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fails_closed_within_the_timeout_and_traffic_recovers() {
    let proxy = Proxy::start(database_addr().await, false).await;
    let timeout = Duration::from_millis(300);
    let store = store_through(&proxy).await.timeout(timeout);
    outage_fails_closed_and_recovers(store, timeout, || proxy.cut(), || proxy.restore()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_new_two_replay_pending_conflict_one() {
    let proxy = Proxy::start(database_addr().await, true).await;
    let store = store_through(&proxy).await;
    let service = counting_service(store.clone(), Arc::default(), Duration::ZERO);
    // Warm one connection and its prepared statements, as a long-running server has.
    let warm = unique_key("warm");
    send_to(&service, operation(&warm, "p")).await;
    send_to(&service, operation(&warm, "p")).await;
    let fp = LabelContract::fingerprint(&warm, "q");
    let Ok(Claim::Conflict) = store.claim(&key_of(&warm), &fp).await else {
        panic!()
    };
    let pending = unique_key("pending");
    let Ok(Claim::New(reservation)) = store
        .claim(
            &key_of(&pending),
            &LabelContract::fingerprint(&pending, "p"),
        )
        .await
    else {
        panic!()
    };
    let _ = store.release(&key_of(&pending), &reservation).await;
    let Ok(Claim::New(_)) = store
        .claim(
            &key_of(&pending),
            &LabelContract::fingerprint(&pending, "p"),
        )
        .await
    else {
        panic!()
    };

    let key = unique_key("counted");
    let pings = proxy.pings.load(Ordering::SeqCst);
    let cases = [
        (operation(&key, "p"), 2, 201, "new: claim + complete"),
        (operation(&key, "p"), 1, 201, "replay: claim"),
        (operation(&key, "q"), 1, 409, "conflict: claim"),
        (operation(&pending, "p"), 1, 409, "pending: claim"),
        (
            request("POST", "/labels", Some(&key), Some("text/plain"), BODY),
            0,
            415,
            "refused: nothing",
        ),
    ];
    let started = std::time::Instant::now();
    for (request, round_trips, status, what) in cases {
        let before = proxy.round_trips.load(Ordering::SeqCst);
        let reply = send_to(&service, request).await;
        assert_eq!(reply.status, status, "{what}");
        assert_eq!(
            proxy.round_trips.load(Ordering::SeqCst) - before,
            round_trips,
            "{what}"
        );
    }
    // Each call found the connection the one before it kept: none went back to the pool,
    // whose ping is a round trip more. A kept connection goes back once per turn of 50 ms,
    // so a machine that took longer over the calls may show that many pings, no more.
    let turns = started.elapsed().as_millis() / 50;
    let pinged = proxy.pings.load(Ordering::SeqCst) - pings;
    assert!(
        pinged as u128 <= turns,
        "{pinged} pings between calls in {turns} turns"
    );
    // Once the calls stop, the kept connection goes back to the pool.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.pool().num_idle() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn transactional_round_trips_new_four_replay_three() {
    let proxy = Proxy::start(database_addr().await, true).await;
    let store =
        tower_idempotency::store::TransactionalPostgresStore::new(store_through(&proxy).await);
    let service = counting_service(store.clone(), Arc::default(), Duration::ZERO);
    // Warm one connection and its prepared statements, as a long-running server has.
    let warm = unique_key("tx-warm");
    send_to(&service, operation(&warm, "p")).await;
    send_to(&service, operation(&warm, "p")).await;

    let key = unique_key("tx-counted");
    let cases = [
        (
            operation(&key, "p"),
            4,
            201,
            "new: begin and lock, claim, complete, commit",
        ),
        (
            operation(&key, "p"),
            3,
            201,
            "replay: begin and lock, claim, rollback",
        ),
        (
            operation(&key, "q"),
            3,
            409,
            "conflict: begin and lock, claim, rollback",
        ),
    ];
    for (request, round_trips, status, what) in cases {
        let before = proxy.round_trips.load(Ordering::SeqCst);
        let reply = send_to(&service, request).await;
        assert_eq!(reply.status, status, "{what}");
        assert_eq!(
            proxy.round_trips.load(Ordering::SeqCst) - before,
            round_trips,
            "{what}"
        );
    }
}

#[tokio::test]
async fn purge_deletes_expired_completed_records_only() {
    let store = make_store(Some(Duration::from_millis(50))).await;
    let done = unique_key("purge-done");
    let open = unique_key("purge-open");
    let fp = LabelContract::fingerprint("x", "y");
    let Ok(Claim::New(reservation)) = store.claim(&done, &fp).await else {
        panic!()
    };
    store.claim(&open, &fp).await.unwrap();
    store
        .complete(&done, &reservation, &awkward_response())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(store.purge_expired().await.unwrap() >= 1);
    assert_eq!(store.claim(&open, &fp).await.unwrap(), Claim::Pending);
    assert!(matches!(
        store.claim(&done, &fp).await.unwrap(),
        Claim::New(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_between_create_and_complete_leaves_the_key_pending() {
    let proxy = Arc::new(Proxy::start(database_addr().await, false).await);
    let store = store_through(&proxy)
        .await
        .timeout(Duration::from_millis(300));
    let cutter = Arc::clone(&proxy);
    crash_between_create_and_complete(store, move || cutter.cut(), || proxy.restore()).await;
}

/// A claim that waits on a table lock past its timeout must not commit later with a token
/// nobody holds: the key would be pending for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_time_out_on_a_locked_table_strand_no_key() {
    let table = "tower_idempotency_lock_test";
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(table)
        .unwrap()
        .timeout(Duration::from_millis(300));
    store.migrate().await.unwrap();
    let mut locker = PgConnection::connect(&database_url()).await.unwrap();
    let locked = Arc::new(tokio::sync::Notify::new());
    let stall = {
        let held = Arc::clone(&locked);
        async move {
            tokio::spawn(async move {
                batch(
                    &mut locker,
                    format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
                )
                .await;
                held.notify_one();
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                batch(&mut locker, "COMMIT").await;
            });
            locked.notified().await;
        }
    };
    lost_claim_answers_strand_no_key(store, stall).await;
}

/// Every pooled connection gets the store's timeout as its `statement_timeout`, so a statement
/// whose caller gave up is cancelled by the server instead of committing later, and before
/// the caller gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_carry_the_store_timeout_as_statement_timeout() {
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(250));
    let mut connection = store.pool().acquire().await.unwrap();
    let row = sqlx::query("SHOW statement_timeout")
        .fetch_one(&mut *connection)
        .await
        .unwrap();
    // Four fifths of it: the server ends a slow statement before the store gives up.
    assert_eq!(row.get::<String, _>(0), "200ms");
    let slow = sqlx::raw_sql("SELECT pg_sleep(1)")
        .execute(&mut *connection)
        .await
        .unwrap_err();
    let sqlx::Error::Database(slow) = slow else {
        panic!("not the server's error: {slow:?}")
    };
    // query_canceled
    assert_eq!(slow.code().as_deref(), Some("57014"), "{slow}");
}

/// A timeout past what PostgreSQL's `statement_timeout` takes (about 24.8 days), up to
/// `Duration::MAX`, is clamped to its largest value: every connection still opens and claims.
#[tokio::test]
async fn a_timeout_past_the_statement_timeouts_range_is_clamped() {
    for timeout in [Duration::from_secs(40 * 24 * 3600), Duration::MAX] {
        let store = PostgresStore::connect(&database_url())
            .await
            .unwrap()
            .timeout(timeout)
            .table(TABLE)
            .unwrap();
        // Its own table, made here: on a new database nothing else has made one yet.
        store.migrate().await.unwrap();
        let mut connection = store.pool().acquire().await.expect("a connection");
        let row = sqlx::query("SHOW statement_timeout")
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        assert_eq!(row.get::<String, _>(0), "2147483647ms");
        drop(connection);
        let key = format!(
            "clamped-{}",
            tower_idempotency::store::Reservation::generate()
        );
        let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("clamped", "p");
        let claimed = store.claim(&key, &fingerprint).await;
        assert!(
            matches!(claimed, Ok(tower_idempotency::store::Claim::New(_))),
            "{claimed:?}"
        );
    }
}

/// The operator's listing of pending keys gets ten store timeouts, as its docs say, on the
/// database's side too: here it waits out a table lock held six times the store's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_listing_gets_ten_timeouts_on_the_database_too() {
    use tower_idempotency::store::Operator;
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(200))
        .table("pending_listing_time")
        .unwrap();
    store.migrate().await.unwrap();
    let mut lock = store.pool().begin().await.unwrap();
    batch(
        &mut *lock,
        "LOCK TABLE pending_listing_time IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let listing = tokio::spawn({
        let store = store.clone();
        async move { store.pending_older_than(Duration::ZERO).await }
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    lock.commit().await.unwrap();
    let listed = listing.await.unwrap();
    assert!(listed.is_ok(), "{listed:?}");
}

/// A table whose expiry index is missing gets it built concurrently, outside the store's
/// timeout: writers go on while the build waits for a transaction open on the table, and a
/// build longer than the timeout completes (before, it was cancelled by the timeout and
/// started again, about thirty times, and `migrate` failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_expiry_index_is_built_concurrently_and_writers_go_on() {
    let table = "missing_expiry_index";
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(table)
        .unwrap();
    store.migrate().await.unwrap();
    batch(
        store.pool(),
        format!(
            "SET statement_timeout = 0; TRUNCATE {table}; \
             DROP INDEX IF EXISTS \"{table}_expires_at\"; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'row-' || i, 'f', '\\x00', now() + i * interval '1 second' \
             FROM generate_series(1, 1000000) i"
        ),
    )
    .await;
    let mut open = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (key, fingerprint) VALUES ('held', 'f')"
    )))
    .execute(&mut *open)
    .await
    .unwrap();
    // Two replicas starting at once: one builds, the other waits for it (a lock waited for
    // in a statement would hold a snapshot the build waits for: a deadlock).
    let mut migrations = Vec::new();
    for _ in 0..2 {
        let quick = PostgresStore::connect(&database_url())
            .await
            .unwrap()
            .table(table)
            .unwrap()
            .timeout(Duration::from_millis(100));
        migrations.push(tokio::spawn(async move { quick.migrate().await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The build waits for the open transaction; claims do not wait for the build.
    for i in 0..5 {
        let key = format!("while-building-{i}");
        let fingerprint = LabelContract::fingerprint(&key, "p");
        assert!(matches!(
            store.claim(&key, &fingerprint).await,
            Ok(Claim::New(_))
        ));
    }
    open.commit().await.unwrap();
    for migrating in migrations {
        migrating.await.unwrap().expect("the index built");
    }
    let valid: bool = sqlx::query(AssertSqlSafe(format!(
        "SELECT indisvalid FROM pg_index \
         WHERE indexrelid = to_regclass('\"{table}_expires_at\"')"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
    .get(0);
    assert!(valid);
    batch(store.pool(), format!("DROP TABLE {table}")).await;
}

/// A claim that reached the database and committed, whose answer was lost (dropped by the
/// proxy, then the connection cut): settled, so the retry creates once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answer_lost_after_the_send_strands_no_key() {
    let proxy = Proxy::start(database_addr().await, false).await;
    let store = store_through(&proxy)
        .await
        .timeout(Duration::from_millis(300));
    answers_lost_after_the_send_strand_no_key(
        store,
        || proxy.mute(),
        || proxy.cut(),
        || proxy.restore(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_waiters_on_two_replicas_get_the_same_201_and_leave_nothing() {
    fifty_waiters_on_two_replicas(
        make_store(None).await,
        make_store(None).await,
        PostgresStore::waited_keys,
    )
    .await;
}

/// A table made by the first release (no `changed_at`, `lease_until`, `take_over` or `waited`
/// columns) gets them from `migrate`, keeps its records, and serves every call after it; a
/// waiter on it is woken by the completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release() {
    let store = store_on_own_table().await;
    let table = store.table_name().to_owned();
    batch(
        store.pool(),
        format!(
            "DROP TABLE \"{table}\"; CREATE TABLE \"{table}\" (key text PRIMARY KEY, \
             fingerprint text NOT NULL, token bytea, response bytea, expires_at timestamptz); \
             INSERT INTO \"{table}\" (key, fingerprint, token) VALUES ('old', '{}', '\\x00')",
            LabelContract::fingerprint("old", "p").to_hex().as_str()
        ),
    )
    .await;
    store.migrate().await.unwrap();
    assert!(matches!(
        store
            .claim("old", &LabelContract::fingerprint("old", "p"))
            .await,
        Ok(Claim::Pending)
    ));
    let fp = LabelContract::fingerprint("new", "p");
    let Ok(Claim::New(reservation)) = store.claim("new", &fp).await else {
        panic!("a new claim");
    };
    drop(store.changed("warm-up"));
    listening(&store).await;
    let started = std::time::Instant::now();
    let complete = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store
            .complete("new", &reservation, &awkward_response())
            .await
            .unwrap();
    };
    let ((), woken) = tokio::join!(complete, async {
        store.changed("new").await;
        started.elapsed()
    });
    assert!(
        woken >= Duration::from_millis(100) && woken < Duration::from_millis(500),
        "woken by the completion, not a poll: {woken:?}"
    );
    assert!(matches!(
        store.claim("new", &fp).await,
        Ok(Claim::Replay(_))
    ));
    drop_table(&store).await;
}

async fn drop_table(store: &PostgresStore) {
    let table = store.table_name();
    batch(store.pool(), format!("DROP TABLE \"{table}\"")).await;
}

/// Found in review: a notification that cannot be sent (here the store's role may not run
/// `pg_notify`; a full notification queue fails the same way) fails neither the complete nor
/// the release it announces. The waiter, not woken, looks again within its fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_that_cannot_be_sent_fails_no_change() {
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
fn the_listener_starts_again_from_the_next_runtime() {
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

/// A store not told otherwise keeps a completed record for [`DEFAULT_RETENTION`]: its
/// `expires_at` is the window away, a claim within it replays, and one past it (the record's
/// expiry moved back by the window, as the clock moving on would) is new. `keep_forever`
/// gives no expiry.
#[tokio::test]
async fn a_completed_record_lives_for_the_default_window() {
    use tower_idempotency::store::DEFAULT_RETENTION;
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(TABLE)
        .unwrap();
    store.migrate().await.unwrap();
    let session = Session::open().await;
    let left = |key: String| {
        let session = &session;
        async move {
            let row = sqlx::query(AssertSqlSafe(format!(
                "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM {TABLE} \
                 WHERE key = $1"
            )))
            .bind(key)
            .fetch_one(&mut *session.connection().await)
            .await
            .unwrap();
            row.get::<Option<f64>, _>(0)
        }
    };
    let key = unique_key("default-window");
    complete_new(&store, &key).await;
    let window = DEFAULT_RETENTION.as_secs_f64();
    let seconds = left(key.clone()).await.expect("an expiry");
    assert!(seconds > window - 60.0 && seconds <= window, "{seconds}");
    assert_eq!(claimed_again(&store, &key).await, "replay");
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {TABLE} SET expires_at = expires_at - interval '24 hours 1 second' WHERE key = $1"
    )))
    .bind(&key)
    .execute(&mut *session.connection().await)
    .await
    .unwrap();
    assert_eq!(claimed_again(&store, &key).await, "new");

    let forever = store.clone().keep_forever();
    let key = unique_key("forever");
    complete_new(&forever, &key).await;
    assert_eq!(left(key.clone()).await, None);
    assert_eq!(claimed_again(&forever, &key).await, "replay");
}

/// A session of the test's own on the database: one connection, outside every store's pool,
/// whose session state (an open transaction, a lock) is its own.
struct Session(tokio::sync::Mutex<PgConnection>);

impl Session {
    async fn open() -> Self {
        let connection = PgConnection::connect(&database_url()).await.unwrap();
        Self(tokio::sync::Mutex::new(connection))
    }

    /// The session's connection, for a statement.
    async fn connection(&self) -> tokio::sync::MutexGuard<'_, PgConnection> {
        self.0.lock().await
    }

    /// Runs `sql`, one statement or several, as one simple query.
    async fn batch(&self, sql: impl Into<String>) {
        batch(&mut *self.connection().await, sql).await;
    }

    /// The `count(*)` (or any `bigint`) of `sql`, with `bind` as `$1` if given.
    async fn count(&self, sql: String, bind: Option<String>) -> i64 {
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(bind) = bind {
            query = query.bind(bind);
        }
        query
            .fetch_one(&mut *self.connection().await)
            .await
            .unwrap()
            .get(0)
    }
}

/// A table of this test's own (`name` and the process id), migrated by a store on it, set up
/// by `configure`, and a session of the test's own to look at it.
async fn own_table(
    name: &str,
    configure: impl FnOnce(PostgresStore) -> PostgresStore,
) -> (String, PostgresStore, Session) {
    let table = format!("tower_idempotency_{name}_{}", std::process::id());
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    let store = configure(store);
    store.migrate().await.unwrap();
    (table, store, Session::open().await)
}

/// Whether some session waits for a lock on `table` now.
async fn a_lock_is_awaited(watcher: &Session, table: &str) -> bool {
    let waiting = watcher
        .count(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass($1::text)"
                .to_owned(),
            Some(table.to_owned()),
        )
        .await;
    waiting > 0
}

/// Claims a new key named `name` through `store`, and checks it is new within `limit`.
async fn a_new_claim_within(store: &PostgresStore, name: &str, limit: Duration) {
    let claimed_at = std::time::Instant::now();
    let key = unique_key(name);
    let claim = store
        .claim(&key, &LabelContract::fingerprint(&key, "p"))
        .await;
    assert!(matches!(claim, Ok(Claim::New(_))), "{claim:?}");
    assert!(
        claimed_at.elapsed() < limit,
        "the claim waited {:?}",
        claimed_at.elapsed()
    );
}

/// A replica starting while another session holds a writing transaction open on the table (as
/// the transactional store does for every create): its `migrate` finds nothing to change and
/// takes no lock that waits on that transaction, so it finishes at once, and a claim made
/// meanwhile is not queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_nothing_to_change_stalls_no_claim() {
    let (table, store, writer) =
        own_table("start", |store| store.timeout(Duration::from_secs(3))).await;
    writer
        .batch(format!(
            "BEGIN; INSERT INTO {table} (key, fingerprint) VALUES ('held-open', 'x')"
        ))
        .await;
    let started = std::time::Instant::now();
    let starting = tokio::spawn({
        let store = store.clone();
        async move { store.migrate().await }
    });
    // Until the start is done, or waits on a lock: either way a claim goes in now.
    let watcher = Session::open().await;
    while !starting.is_finished() && started.elapsed() < Duration::from_secs(2) {
        if a_lock_is_awaited(&watcher, &table).await {
            break;
        }
        tokio::task::yield_now().await;
    }
    a_new_claim_within(&store, "during-start", Duration::from_millis(500)).await;
    starting.await.unwrap().expect("the start finishes");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the start waited {:?}",
        started.elapsed()
    );
    writer.batch("ROLLBACK").await;
    writer.batch(format!("DROP TABLE {table}")).await;
}

/// A start with something to change (here the expiry index, missing) while a writing
/// transaction is open on the table: it waits for its lock no longer than a tenth of a second
/// at a time, so a claim meanwhile is answered long before the store's timeout, and it tries
/// again until the transaction ends, then makes the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_a_change_waits_in_short_turns_and_then_makes_it() {
    let (table, store, writer) =
        own_table("change", |store| store.timeout(Duration::from_secs(3))).await;
    writer
        .batch(format!("DROP INDEX \"{table}_expires_at\""))
        .await;
    writer
        .batch(format!(
            "BEGIN; INSERT INTO {table} (key, fingerprint) VALUES ('held-open', 'x')"
        ))
        .await;
    let starting = tokio::spawn({
        let store = store.clone();
        async move { store.migrate().await }
    });
    // The start has asked for its lock at least once.
    let watcher = Session::open().await;
    let asked = std::time::Instant::now();
    while !a_lock_is_awaited(&watcher, &table).await && asked.elapsed() < Duration::from_secs(5) {
        tokio::task::yield_now().await;
    }
    a_new_claim_within(&store, "during-change", Duration::from_secs(1)).await;
    assert!(
        !starting.is_finished(),
        "the change waits for the transaction"
    );
    writer.batch("COMMIT").await;
    starting
        .await
        .unwrap()
        .expect("the start finishes once the lock is free");
    let index: Option<String> = sqlx::query("SELECT to_regclass($1::text)::text")
        .bind(format!("{table}_expires_at"))
        .fetch_one(&mut *watcher.connection().await)
        .await
        .unwrap()
        .get(0);
    assert!(index.is_some(), "the index was made");
    writer.batch(format!("DROP TABLE {table}")).await;
}

/// A backlog of expired records one statement cannot delete within the store's timeout: the
/// purge finishes anyway (in batches), claims made while it runs keep answering within their
/// timeout, and nothing pending and nothing unexpired is deleted. The timeout is thirty times
/// what one batch takes on this machine now (at least 300 ms), measured first, while the
/// backlog is 240 batches; a batch that a loaded machine still holds past it fails its run,
/// and the next run goes on, as a purger's does (each run must delete something).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_finishes_at_any_backlog_and_claims_keep_answering() {
    let batch = {
        let (table, store, client) = own_table("purge_baseline", |store| store).await;
        client
            .batch(format!(
                "INSERT INTO {table} (key, fingerprint, response, expires_at) \
                 SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
                 FROM generate_series(1, 5000) AS i; ANALYZE {table}"
            ))
            .await;
        let started = std::time::Instant::now();
        assert_eq!(store.purge_expired().await.unwrap(), 5000);
        let took = started.elapsed();
        client.batch(format!("DROP TABLE {table}")).await;
        took
    };
    let timeout = (batch * 30).max(Duration::from_millis(300));
    let (table, store, client) = own_table("purge", |store| store.timeout(timeout)).await;
    // The claims go through a store of the default timeout, as a replica's would.
    let claiming = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    // Over a million rows: one statement takes longer than the timeout here (about 450 ms on
    // an idle machine), and each batch a few milliseconds, with room for a loaded one.
    let expired: i64 = 1_200_000;
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
             FROM generate_series(1, {expired}) AS i; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'kept-' || i, 'x', '\\x00', now() + interval '1 hour' \
             FROM generate_series(1, 100) AS i; \
             INSERT INTO {table} (key, fingerprint, token) \
             SELECT 'pending-' || i, 'x', '\\x01' FROM generate_series(1, 100) AS i; \
             ANALYZE {table}"
        ))
        .await;
    let claims = claims_meanwhile(claiming, 40);
    // As a purger does: a batch that a loaded machine held past the timeout fails the run,
    // whose earlier batches stay deleted, and the next run goes on from there. One statement
    // for the whole backlog would fail every run with nothing deleted; a run that a loaded
    // machine stalls at its first batch deletes nothing, and the next goes on.
    let (mut purged, mut runs, mut stalled) = (0, 0, 0);
    loop {
        let before = purged;
        let Err(error) = store.purge_expired_counting(&mut purged).await else {
            break;
        };
        runs += 1;
        stalled += usize::from(purged == before);
        assert!(
            runs < 30 && stalled < 10,
            "the purge makes progress: {error:#}, {purged} purged in {runs} runs, {stalled} stalled"
        );
    }
    assert_eq!(purged, u64::try_from(expired).unwrap());
    assert_eq!(
        claims.await.unwrap(),
        40,
        "every claim answered within its timeout"
    );
    let left = |prefix: &'static str| {
        client.count(
            format!("SELECT count(*) FROM {table} WHERE key LIKE $1"),
            Some(format!("{prefix}%")),
        )
    };
    assert_eq!(left("expired-").await, 0);
    assert_eq!(left("kept-").await, 100, "nothing unexpired is deleted");
    assert_eq!(left("pending-").await, 100, "nothing pending is deleted");
    client.batch(format!("DROP TABLE {table}")).await;
}

/// The built-in purger keeps a table at a steady size under a steady stream of creates with
/// a short retention: at the end of the run it holds about a window's records, not the run's,
/// and once the stream stops it empties of completed records; dropped, it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purger_keeps_a_table_at_a_steady_size() {
    let (table, store, client) = own_table("purger", |store| {
        store.retention(Duration::from_millis(100))
    })
    .await;
    let count = || client.count(format!("SELECT count(*) FROM {table}"), None);
    let purger = store.purge_every(Duration::from_millis(50)).unwrap();
    purger_holds_steady(&store, count).await;
    drop(purger);
    complete_new(&store, &unique_key("after-the-purger")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count().await, 1, "a purger dropped purges no more");
    client.batch(format!("DROP TABLE {table}")).await;
}

/// A start whose database cannot be reached fails at once with the store's error, not after
/// the attempts a held lock gets.
#[tokio::test]
async fn a_start_with_the_database_away_fails_at_once() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let options = PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("test");
    // Connecting says why: the connection is refused.
    let error = PostgresStore::connect_with(options.clone())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error:#}");
    // A store that connects lazily: its pool tries the address again until the call's
    // timeout, and then the migrate fails, with no attempts of its own after that.
    let store = PostgresStore::connect_lazy_with(options);
    let started = std::time::Instant::now();
    let error = store.migrate().await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Timeout);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// The operator's tool (`idempotency_keys`, feature `cli`) on PostgreSQL: `purge` deletes the
/// expired records of its table and nothing else, and a store failure exits 3 with the
/// database's own words, not only the driver's "db error".
#[cfg(feature = "cli")]
#[tokio::test]
async fn the_operators_tool_purges_a_table_and_says_why_it_failed() {
    let table = format!("tool_{}", std::process::id());
    let store = make_store(None)
        .await
        .table(&table)
        .unwrap()
        .retention(Duration::from_secs(3600));
    store.migrate().await.unwrap();
    for key in ["old", "kept"] {
        complete_new(&store, key).await;
    }
    let pending = tower_idempotency::operation::LabelContract::fingerprint("pending", "p");
    store.claim("pending", &pending).await.unwrap();
    let client = Session::open().await;
    client
        .batch(format!(
            "UPDATE {table} SET expires_at = now() - interval '1 hour' WHERE key = 'old'"
        ))
        .await;
    let tool = common::operator_tool;
    let url = database_url();
    let purged = tool(&["--store", &url, "--table", &table, "purge"]);
    assert_eq!((purged.0, purged.1.as_str()), (Some(0), "purged 1\n"));
    let left: Vec<String> = sqlx::query(AssertSqlSafe(format!(
        "SELECT key FROM {table} ORDER BY key"
    )))
    .fetch_all(&mut *client.connection().await)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(left, ["kept", "pending"]);
    // A key over 512 bytes is kept as its digest, which `pending` prints and the other
    // commands take as it is printed.
    let long = "k".repeat(600);
    let long_key = tower_idempotency::scope::store_key(None, &http::Method::POST, "/labels", &long);
    store
        .claim(
            &long_key,
            &tower_idempotency::operation::LabelContract::fingerprint("long", "p"),
        )
        .await
        .unwrap();
    let listed = tool(&[
        "--store",
        &url,
        "--table",
        &table,
        "pending",
        "--older-than",
        "0s",
    ]);
    let digest = listed
        .1
        .lines()
        .find(|line| line.starts_with("sha256:"))
        .expect("the long key's digest")
        .to_owned();
    let shown = tool(&["--store", &url, "--table", &table, "show", &digest]);
    assert_eq!(
        (shown.0, shown.1.lines().next()),
        (Some(0), Some("state pending"))
    );
    let forgot = tool(&["--store", &url, "--table", &table, "forget", &digest]);
    assert_eq!(forgot.0, Some(0), "{}", forgot.2);
    assert!(
        tower_idempotency::store::Operator::inspect(&store, &long_key)
            .await
            .unwrap()
            .is_none()
    );
    let missing = tool(&["--store", &url, "--table", "no_such_table_here", "purge"]);
    assert_eq!(missing.0, Some(3));
    let said = missing.2;
    assert!(said.contains("does not exist"), "{said}");
    // A purge that fails after its first batch says what that batch deleted.
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'f', '\\x00', now() - interval '2 hours' \
             FROM generate_series(1, 5000) i; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             VALUES ('poison', 'f', '\\x00', now() - interval '1 hour'); \
             CREATE OR REPLACE FUNCTION {table}_poison() RETURNS trigger AS $$ BEGIN \
             IF OLD.key = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF; \
             RETURN OLD; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER poison BEFORE DELETE ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_poison();"
        ))
        .await;
    let failed = tool(&[
        "--store",
        &url,
        "--table",
        &table,
        "--timeout-s",
        "10",
        "purge",
    ]);
    assert_eq!((failed.0, failed.1.as_str()), (Some(3), "purged 5000\n"));
    assert!(failed.2.contains("poisoned row"), "{}", failed.2);
    client
        .batch(format!(
            "DROP TABLE {table}; DROP FUNCTION {table}_poison()"
        ))
        .await;
}

/// `DATABASE_URL` with `parameters` added to its query.
fn with_parameters(parameters: &str) -> String {
    let url = database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{parameters}")
}

/// With `sslmode=require` the store's sessions are encrypted, as PostgreSQL itself sees them
/// (`pg_stat_ssl`), and the store works over them: a claim, its complete, the replay.
#[tokio::test]
async fn sslmode_require_encrypts_the_stores_sessions() {
    let store = PostgresStore::connect(&with_parameters("sslmode=require"))
        .await
        .expect("PostgreSQL with TLS (the server runs with ssl = on)")
        .table(&format!("tls_{}", std::process::id()))
        .unwrap();
    store.migrate().await.unwrap();
    let row = sqlx::query("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(row.get::<bool, _>(0), "the session is not encrypted");
    let version: Option<String> = row.get(1);
    assert!(
        version.is_some_and(|v| v.starts_with("TLS")),
        "no TLS version"
    );
    let key = unique_key("tls");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fingerprint).await else {
        panic!("a new key");
    };
    let response = awkward_response();
    store.complete(&key, &reservation, &response).await.unwrap();
    let Ok(Claim::Replay(replayed)) = store.claim(&key, &fingerprint).await else {
        panic!("a replay");
    };
    assert_eq!(replayed, response);
    drop_table(&store).await;
}

/// A CA that did not sign the server's certificate fails the connect, with the TLS error in
/// the chain, rather than a session in plaintext or unverified. Shown through the operator's
/// tool, whose roots are the CA `SSL_CERT_FILE` names (in place of the system's, which on a
/// machine whose server has a self-signed certificate may hold that certificate itself); the
/// server's own certificate as the root verifies, as a control.
#[cfg(feature = "cli")]
#[tokio::test]
async fn a_certificate_that_does_not_verify_fails_the_connect() {
    let tls = common::servers::TlsFiles::make();
    let empty = common::servers::TempDir::new("no-certs");
    let store = make_store(None)
        .await
        .table(&format!("tls_roots_{}", std::process::id()))
        .unwrap();
    store.migrate().await.unwrap();
    let server_cert: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let url = with_parameters("sslmode=verify-ca");
    let show = [
        "--store",
        url.as_str(),
        "--table",
        store.table_name(),
        "show",
        "no-such-key",
    ];
    let empty_dir = empty.0.display().to_string();
    let with_roots = |file: &str| {
        common::operator_tool_with(
            &show,
            &[("SSL_CERT_FILE", file), ("SSL_CERT_DIR", &empty_dir)],
        )
    };
    let (code, _, said) = with_roots(&tls.path("ca.pem"));
    assert_ne!(code, Some(0), "{said}");
    let said = said.to_lowercase();
    assert!(
        said.contains("certificate") || said.contains("unknownissuer"),
        "{said}"
    );
    if std::fs::metadata(&server_cert).is_ok() {
        let (code, printed, said) = with_roots(&server_cert);
        assert_eq!(code, Some(1), "the key is absent: {printed} {said}");
    }
    drop_table(&store).await;
}

/// Found when a clean run's outage test kept a key pending: the store kept the one connection
/// of its pool for its next call as long as calls kept coming, so that the pool's line (a
/// transaction of the store settling a lost claim, an application's handler) waited for the
/// calls to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_line_gets_a_turn_while_store_calls_go_on() {
    drop(make_store(None).await);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(database_options())
        .await
        .unwrap();
    let store = PostgresStore::new(pool.clone()).table(TABLE).unwrap();
    common::the_pools_line_gets_a_turn_while_store_calls_go_on(store, pool).await;
}
