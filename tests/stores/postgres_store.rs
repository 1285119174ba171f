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
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::PostgresStore;
use tower_idempotency::store::Store;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{Claim, Purge, StoreErrorKind};

pub(crate) const TABLE: &str = "tower_idempotency_test";

pub(crate) fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub(crate) async fn make_store(retention: Option<Duration>) -> PostgresStore {
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

async fn make_with(options: tower_idempotency::store::StoreOptions) -> PostgresStore {
    make_store(None)
        .await
        .with_options(options.timeout(Duration::from_secs(5)))
}

tower_idempotency::tombstone_conformance!(
    make_with,
    retention = Duration::from_millis(300),
    tombstones = Duration::from_secs(3),
);

/// The transactional mode keeps tombstones as the plain store does: a claim in its own
/// transaction finds the tombstone and answers expired, never a new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_transactional_store_refuses_an_expired_key_until_its_tombstone_ends() {
    let options = tower_idempotency::store::StoreOptions::new()
        .retention(Duration::from_millis(300))
        .tombstones(Duration::from_secs(3));
    let store = tower_idempotency::store::TransactionalPostgresStore::new(make_with(options).await);
    tower_idempotency::testing::conformance::an_expired_key_is_refused_until_its_tombstone_ends(
        store,
        Duration::from_millis(300),
        Duration::from_secs(3),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn the_generic_json_operation_creates_once_for_a_thousand_identical_requests() {
    payments::generic_mode_creates_once(make_store(None).await, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_generic_json_operation_completes_a_create_whose_client_went_away() {
    payments::generic_mode_survives_a_disconnect(make_store(None).await).await;
}

/// The connect options of `DATABASE_URL`.
pub(crate) fn database_options() -> PgConnectOptions {
    PgConnectOptions::from_str(&database_url()).expect("DATABASE_URL")
}

/// `DATABASE_URL`'s user, password and database at `proxy`'s address, in the clear (the proxy
/// reads the protocol's messages to count round trips; a TLS session would hide them).
pub(crate) fn options_through(proxy: &Proxy) -> PgConnectOptions {
    database_options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(PgSslMode::Disable)
}

/// A store that reaches the database through `proxy` ([`options_through`]).
pub(crate) async fn store_through(proxy: &Proxy) -> PostgresStore {
    let options = options_through(proxy);
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

pub(crate) async fn database_addr() -> SocketAddr {
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
pub(crate) async fn batch<'e, E>(executor: E, sql: impl Into<String>)
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::raw_sql(AssertSqlSafe(sql.into()))
        .execute(executor)
        .await
        .unwrap();
}

#[tokio::test]
pub(crate) async fn migrate_is_idempotent_and_table_names_are_checked() {
    let store = make_store(None).await;
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    for bad in ["", "1abc", "a-b", "a\"b", "a;drop table x", &"x".repeat(49)] {
        let error = make_store(None).await.table(bad).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::InvalidConfig, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn two_replicas_with_their_own_pools_create_once() {
    replicas_create_once(make_store(None).await, make_store(None).await, 500).await;
}

/// Waits until `store` listens for announced changes.
pub(crate) async fn listening(store: &PostgresStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store.notifications_listening() {
        assert!(std::time::Instant::now() < deadline, "never listening");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A store on a table of its own, so that its listening connection can be told apart.
pub(crate) async fn store_on_own_table() -> PostgresStore {
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
pub(crate) async fn admin_pool() -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(database_options())
        .await
        .unwrap()
}

/// The backends listening on `store`'s table channel.
pub(crate) async fn listeners(admin: &sqlx::PgPool, table: &str) -> Vec<i32> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn completed_and_pending_records_survive_a_new_pool() {
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
    assert_eq!(
        replay.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    send_to(&service, operation(&pending_key, "parcel-42"))
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn an_outage_fails_closed_within_the_timeout_and_traffic_recovers() {
    let proxy = Proxy::start(database_addr().await, false).await;
    let timeout = Duration::from_millis(300);
    let store = store_through(&proxy).await.timeout(timeout);
    outage_fails_closed_and_recovers(store, timeout, || proxy.cut(), || proxy.restore()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn round_trips_new_two_replay_pending_conflict_one() {
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
pub(crate) async fn transactional_round_trips_new_four_replay_three() {
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
pub(crate) async fn purge_deletes_expired_completed_records_only() {
    let store = make_store(Some(Duration::from_millis(50)))
        .await
        .tombstones(Duration::ZERO);
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
pub(crate) async fn a_connection_lost_between_create_and_complete_leaves_the_key_pending() {
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
pub(crate) async fn claims_that_time_out_on_a_locked_table_strand_no_key() {
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
pub(crate) async fn pooled_connections_carry_the_store_timeout_as_statement_timeout() {
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
pub(crate) async fn a_timeout_past_the_statement_timeouts_range_is_clamped() {
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
pub(crate) async fn a_pending_listing_gets_ten_timeouts_on_the_database_too() {
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

/// A claim that reached the database and committed, whose answer was lost (dropped by the
/// proxy, then the connection cut): settled, so the retry creates once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_answer_lost_after_the_send_strands_no_key() {
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

pub(crate) async fn drop_table(store: &PostgresStore) {
    let table = store.table_name();
    batch(store.pool(), format!("DROP TABLE \"{table}\"")).await;
}

/// A store not told otherwise keeps a completed record for [`DEFAULT_RETENTION`]: its
/// `expires_at` is the window away, a claim within it replays, and one past it (the record's
/// expiry moved back by the window, as the clock moving on would) is new. `keep_forever`
/// gives no expiry.
#[tokio::test]
pub(crate) async fn a_completed_record_lives_for_the_default_window() {
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
    assert_eq!(
        claimed_again(&store, &key).await,
        "expired",
        "its tombstone kept for the default window after"
    );
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT EXTRACT(EPOCH FROM tombstone_until - now())::float8 FROM {TABLE} WHERE key = $1"
    )))
    .bind(&key)
    .fetch_one(&mut *session.connection().await)
    .await
    .unwrap();
    let remembered: f64 = row.get(0);
    let until = window + tower_idempotency::store::DEFAULT_TOMBSTONES.as_secs_f64();
    assert!(
        remembered > until - 60.0 && remembered <= until,
        "{remembered}"
    );
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {TABLE} SET tombstone_until = expires_at WHERE key = $1"
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
pub(crate) struct Session(tokio::sync::Mutex<PgConnection>);

impl Session {
    pub(crate) async fn open() -> Self {
        let connection = PgConnection::connect(&database_url()).await.unwrap();
        Self(tokio::sync::Mutex::new(connection))
    }

    /// The session's connection, for a statement.
    pub(crate) async fn connection(&self) -> tokio::sync::MutexGuard<'_, PgConnection> {
        self.0.lock().await
    }

    /// Runs `sql`, one statement or several, as one simple query.
    pub(crate) async fn batch(&self, sql: impl Into<String>) {
        batch(&mut *self.connection().await, sql).await;
    }

    /// The `count(*)` (or any `bigint`) of `sql`, with `bind` as `$1` if given.
    pub(crate) async fn count(&self, sql: String, bind: Option<String>) -> i64 {
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
pub(crate) async fn own_table(
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
pub(crate) async fn a_lock_is_awaited(watcher: &Session, table: &str) -> bool {
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
pub(crate) async fn a_new_claim_within(store: &PostgresStore, name: &str, limit: Duration) {
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

/// `DATABASE_URL` with `parameters` added to its query.
pub(crate) fn with_parameters(parameters: &str) -> String {
    let url = database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{parameters}")
}

/// Found when a clean run's outage test kept a key pending: the store kept the one connection
/// of its pool for its next call as long as calls kept coming, so that the pool's line (a
/// transaction of the store settling a lost claim, an application's handler) waited for the
/// calls to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_pools_line_gets_a_turn_while_store_calls_go_on() {
    drop(make_store(None).await);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(database_options())
        .await
        .unwrap();
    let store = PostgresStore::new(pool.clone()).table(TABLE).unwrap();
    common::the_pools_line_gets_a_turn_while_store_calls_go_on(store, pool).await;
}

/// A lost claim queued behind another transaction's insert of its key, on the application's
/// pool (no `statement_timeout`): its settling's insert queues behind the same insert, and
/// when that transaction rolls back the two go on together. Whichever goes first, the key
/// must not be left pending under the lost claim's reservation: the claim's write checks its
/// deadline after it waited, on the server's clock, and the settling acts past it. Eight
/// rounds at once, each rolled back once both wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_lost_claim_queued_behind_a_rolled_back_insert_strands_no_key() {
    use tower_idempotency::store::{Lease, Reservation};

    async fn round(store: PostgresStore, watcher: Arc<Session>, n: usize) -> i64 {
        let table = store.table_name().to_owned();
        let key = unique_key(&format!("queued-{n}"));
        let fingerprint = LabelContract::fingerprint(&key, "p");
        let holder = Session::open().await;
        holder.batch("BEGIN").await;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (key, fingerprint) VALUES ($1, 'held')"
        )))
        .bind(&key)
        .execute(&mut *holder.connection().await)
        .await
        .unwrap();
        let xid = holder
            .count("SELECT txid_current() % 4294967296".to_owned(), None)
            .await;
        let reservation = Reservation::generate();
        let lost = store
            .claim_with(&key, &fingerprint, reservation, Lease::default())
            .await;
        assert_eq!(lost.unwrap_err().kind(), StoreErrorKind::Timeout);
        let settling = {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.settle_claim(&key, &fingerprint, reservation).await })
        };
        // Both the lost claim and the settling wait for the holder's insert.
        let waiting = || {
            watcher.count(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' \
                 AND NOT granted AND transactionid::text = $1"
                    .to_owned(),
                Some(xid.to_string()),
            )
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while waiting().await < 2 {
            assert!(tokio::time::Instant::now() < deadline, "nobody waits");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        holder.batch("ROLLBACK").await;
        settling.await.unwrap().unwrap();
        // The lost claim's statement has ended too.
        let running = || {
            watcher.count(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND pid <> pg_backend_pid() AND strpos(query, $1) > 0"
                    .to_owned(),
                Some(table.clone()),
            )
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while running().await > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        watcher
            .count(
                format!("SELECT count(*) FROM \"{table}\" WHERE key = $1 AND token IS NOT NULL"),
                Some(key),
            )
            .await
    }

    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(database_options())
        .await
        .unwrap();
    let table = format!("tower_idempotency_queued_{}", std::process::id());
    let store = PostgresStore::new(pool)
        .table(&table)
        .unwrap()
        .timeout(Duration::from_millis(300));
    store.migrate().await.unwrap();
    let watcher = Arc::new(Session::open().await);
    let rounds: Vec<_> = (0..8)
        .map(|n| tokio::spawn(round(store.clone(), Arc::clone(&watcher), n)))
        .collect();
    let mut stranded = 0;
    for round in rounds {
        stranded += round.await.unwrap();
    }
    drop_table(&store).await;
    assert_eq!(stranded, 0, "keys left pending over 8 rounds");
}

/// A lost claim delayed on its way to the server past its caller's timeout (held by a proxy,
/// as a lost packet or a slow network would), so that its settling runs first and finds
/// nothing: the claim's write must still be refused, its deadline counted from when it was
/// sent (on the server's clock, which the store learns from its answers), not from when the
/// server began it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_delayed_past_its_settling_writes_nothing() {
    use tower_idempotency::store::{Lease, Reservation};

    let proxy = Proxy::start(database_addr().await, false).await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options_through(&proxy))
        .await
        .unwrap();
    let table = format!("tower_idempotency_delayed_{}", std::process::id());
    let store = PostgresStore::new(pool)
        .table(&table)
        .unwrap()
        .timeout(Duration::from_millis(300));
    store.migrate().await.unwrap();
    // Warm: statements prepared, the server's clock learnt.
    a_new_claim_within(&store, "delayed-warm", Duration::from_secs(30)).await;

    let key = unique_key("delayed");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let reservation = Reservation::generate();
    proxy.hold_next(Duration::from_millis(1_500));
    let lost = store
        .claim_with(&key, &fingerprint, reservation, Lease::default())
        .await;
    assert_eq!(lost.unwrap_err().kind(), StoreErrorKind::Timeout);
    store
        .settle_claim(&key, &fingerprint, reservation)
        .await
        .unwrap();
    // The held claim reaches the server after the settling and runs; then the proxy closes
    // its connection (its client gave up), so the backends on the table are one fewer.
    let watcher = Session::open().await;
    let backends = || {
        watcher.count(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
             AND strpos(query, $1) > 0"
                .to_owned(),
            Some(table.clone()),
        )
    };
    let rows = || {
        watcher.count(
            format!("SELECT count(*) FROM \"{table}\" WHERE key = $1"),
            Some(key.clone()),
        )
    };
    let before = backends().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while backends().await >= before && rows().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held claim never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pending = watcher
        .count(
            format!("SELECT count(*) FROM \"{table}\" WHERE key = $1 AND token IS NOT NULL"),
            Some(key.clone()),
        )
        .await;
    drop_table(&store).await;
    assert_eq!(
        pending, 0,
        "the late claim wrote a reservation nobody holds"
    );
}

/// Options are a value: a clone given another timeout makes its own pool, with that timeout
/// as its connections' `statement_timeout`, and the store it was cloned from keeps its pool and
/// its connections' setting (a setter once wrote a handle the clones shared, so every store on
/// the pool got the last timeout set).
#[tokio::test]
pub(crate) async fn new_options_leave_the_pool_of_the_stores_cloned_before_as_it_was() {
    async fn statement_timeout(store: &PostgresStore) -> String {
        let row = sqlx::query("SHOW statement_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap();
        row.get(0)
    }
    let first = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(500));
    let options = tower_idempotency::store::StoreOptions::new()
        .timeout(Duration::from_secs(3))
        .keep_forever();
    let second = first.clone().with_options(options);
    assert_eq!(second.options(), options);
    assert_eq!(first.options().call_timeout(), Duration::from_millis(500));
    assert!(first.options().retention_window().is_some());
    assert_eq!(statement_timeout(&second).await, "2400ms");
    assert_eq!(statement_timeout(&first).await, "400ms");
    // New options with the same timeout keep the pool, and its connections.
    let third = first.clone().retention(Duration::from_secs(60));
    assert_eq!(third.pool().size(), first.pool().size());
    third.pool().close().await;
    assert!(first.pool().is_closed(), "the same pool");
}
