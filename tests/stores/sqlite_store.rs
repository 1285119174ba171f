//! The SQLite store: the conformance suite on one file shared by every store of the run, and
//! what only it offers. Needs nothing installed: the SQLite library is built in.
#![cfg(feature = "sqlite")]

use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use tower_idempotency::store::SqliteStore;
use tower_idempotency::store::sqlite::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tower_idempotency::store::sqlite::sqlx::{self, Connection as _};

/// A connection to `file` of the test's own, as another process's would be.
pub(crate) async fn connect(file: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(file))
        .await
        .expect("a connection to the file")
}

/// One file for the whole run, in a fresh temporary directory: every store opened on it is
/// another connection, as another process's would be.
pub(crate) fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fresh_dir("sqlite").join("records.sqlite3"))
}

/// Now, in milliseconds since 1970, as the store writes its times.
pub(crate) fn now_millis() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(since.unwrap().as_millis()).unwrap()
}

/// A fresh temporary directory of this run's own, named after `name`, and the path of a
/// records file in it.
pub(crate) fn fresh_file(name: &str) -> (PathBuf, PathBuf) {
    let dir = fresh_dir(name);
    let file = dir.join("records.sqlite3");
    (dir, file)
}

/// A fresh temporary directory of this run's own, named after `name`.
pub(crate) fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-idempotency-{name}-{}-{}",
        std::process::id(),
        tower_idempotency::store::Reservation::generate()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

pub(crate) async fn make_store(retention: Option<Duration>) -> SqliteStore {
    let store = SqliteStore::open(path()).await.expect("the SQLite file");
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(200));

async fn make_with(options: tower_idempotency::store::StoreOptions) -> SqliteStore {
    let store = SqliteStore::open(path()).await.expect("the SQLite file");
    store.with_options(options)
}

tower_idempotency::tombstone_conformance!(
    make_with,
    retention = Duration::from_millis(300),
    tombstones = Duration::from_secs(3),
);

/// The whole suite again on the application's own pool (its sqlx, not the store's
/// re-export): several connections, the pool's settings as they are.
mod on_the_applications_pool {
    use super::*;

    async fn make_store(retention: Option<Duration>) -> SqliteStore {
        static POOL: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        POOL.get_or_init(|| async { drop(SqliteStore::open(path()).await.unwrap()) })
            .await;
        let options = ::sqlx::sqlite::SqliteConnectOptions::new().filename(path());
        let pool: ::sqlx::SqlitePool = ::sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("the application's pool");
        let store = SqliteStore::new(pool);
        store.migrate().await.expect("the table");
        match retention {
            Some(retention) => store.retention(retention),
            None => store,
        }
    }

    tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(200));
}

/// Found in the port to sqlx, where a pool's connections no longer run one call at a time: a
/// claim still waiting for the file's write lock when its caller gave up wrote its
/// reservation once the lock was free, after its settling had released nothing, and the key
/// stayed pending for good. The claim's write carries its deadline: it writes nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_whose_caller_gave_up_writes_nothing_after() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Store;
    use tower_idempotency::store::StoreErrorKind;
    let (dir, file) = fresh_file("late-claim");
    drop(SqliteStore::open(&file).await.unwrap());
    // The application's pool, one connection that waits long for the lock.
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .busy_timeout(Duration::from_secs(60));
    let pool = ::sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone()).timeout(Duration::from_millis(300));
    let mut writer = connect(&file).await;
    let held = writer.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let key = "late";
    let error = store
        .claim(key, &LabelContract::fingerprint(key, "p"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Timeout);
    held.rollback().await.unwrap();
    // The pool's one connection comes back once the claim's statement has run (sqlx pings it
    // on its way back, behind that statement).
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE key = ?1")
        .bind(key)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the claim wrote nothing after its caller gave up");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Claims of one key from separate stores on one file (each its own connection and thread,
/// as separate processes have), released together: exactly one is new, over many keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn claims_from_separate_connections_give_exactly_one_new() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Claim;
    use tower_idempotency::store::Store;
    let stores = futures_stores(8).await;
    for round in 0..20 {
        let key = format!(
            "{}-{round}",
            tower_idempotency::store::Reservation::generate()
        );
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(stores.len()));
        let tasks: Vec<_> = stores
            .iter()
            .map(|store| {
                let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .claim(&key, &LabelContract::fingerprint(&key, "p"))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut new = 0;
        for task in tasks {
            match task.await.unwrap() {
                Claim::New(_) => new += 1,
                Claim::Pending => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(new, 1, "round {round}");
    }
}

pub(crate) async fn futures_stores(n: usize) -> Vec<SqliteStore> {
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(make_store(None).await);
    }
    stores
}

/// Found in review: a timeout past SQLite's own limit (about 24 days in milliseconds) made
/// the store's thread panic, and every later call failed. Any timeout is accepted.
#[tokio::test]
pub(crate) async fn any_timeout_is_accepted() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Claim;
    use tower_idempotency::store::Store;
    let store = make_store(None).await.timeout(Duration::MAX);
    let key = tower_idempotency::store::Reservation::generate().to_string();
    assert!(matches!(
        store
            .claim(&key, &LabelContract::fingerprint(&key, "p"))
            .await,
        Ok(Claim::New(_))
    ));
}

/// Found in review: a record the store cannot read is `Corrupt`, not `Unavailable`.
#[tokio::test]
pub(crate) async fn an_unreadable_record_is_corrupt() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Store;
    use tower_idempotency::store::StoreErrorKind;
    let store = make_store(None).await;
    let key = format!(
        "corrupt-{}",
        tower_idempotency::store::Reservation::generate()
    );
    sqlx::query(
        "INSERT INTO idempotency_records (key, fingerprint, token, response, take_over, \
         changed_at) VALUES (?1, ?2, NULL, x'00ff', 'yes', 0)",
    )
    .bind(&key)
    .bind(LabelContract::fingerprint(&key, "p").to_hex().as_str())
    .execute(&mut connect(path()).await)
    .await
    .unwrap();
    let error = store
        .claim(&key, &LabelContract::fingerprint(&key, "p"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Corrupt);
}

/// A store not told otherwise keeps a completed record for the default window: its
/// `expires_at` is the window away, a claim within it replays, and one past it (the record's
/// expiry moved back by the window, as the clock moving on would) is new. `keep_forever`
/// gives no expiry.
#[tokio::test]
pub(crate) async fn a_completed_record_lives_for_the_default_window() {
    use common::{claimed_again, complete_new};
    use tower_idempotency::store::{DEFAULT_RETENTION, DEFAULT_TOMBSTONES};
    let store = SqliteStore::open(path()).await.expect("the SQLite file");
    let window = i64::try_from(DEFAULT_RETENTION.as_millis()).unwrap();
    let expiry = async |key: &str| -> (Option<i64>, i64) {
        let expires: Option<i64> =
            sqlx::query_scalar("SELECT expires_at FROM idempotency_records WHERE key = ?1")
                .bind(key)
                .fetch_one(&mut connect(path()).await)
                .await
                .unwrap();
        (expires, now_millis())
    };
    let key = format!(
        "window-{}",
        tower_idempotency::store::Reservation::generate()
    );
    complete_new(&store, &key).await;
    let (expires, now) = expiry(&key).await;
    let left = expires.expect("an expiry") - now;
    assert!(left > window - 60_000 && left <= window, "{left}");
    assert_eq!(claimed_again(&store, &key).await, "replay");
    sqlx::query(
        "UPDATE idempotency_records SET expires_at = expires_at - ?2 - 1000 WHERE key = ?1",
    )
    .bind(&key)
    .bind(window)
    .execute(&mut connect(path()).await)
    .await
    .unwrap();
    assert_eq!(
        claimed_again(&store, &key).await,
        "expired",
        "its tombstone kept for the default window after"
    );
    let remembered: i64 = sqlx::query_scalar(
        "SELECT tombstone_until - expires_at FROM idempotency_records WHERE key = ?1",
    )
    .bind(&key)
    .fetch_one(&mut connect(path()).await)
    .await
    .unwrap();
    let tombstones = i64::try_from(DEFAULT_TOMBSTONES.as_millis()).unwrap();
    assert!(
        (tombstones + window + 1000 - remembered).abs() < 60_000,
        "{remembered}"
    );
    sqlx::query("UPDATE idempotency_records SET tombstone_until = expires_at WHERE key = ?1")
        .bind(&key)
        .execute(&mut connect(path()).await)
        .await
        .unwrap();
    assert_eq!(claimed_again(&store, &key).await, "new");

    let forever = store.keep_forever();
    let key = format!(
        "forever-{}",
        tower_idempotency::store::Reservation::generate()
    );
    complete_new(&forever, &key).await;
    assert_eq!(expiry(&key).await.0, None);
    assert_eq!(claimed_again(&forever, &key).await, "replay");
}

/// A new file is put in WAL mode (readers go on while a process writes), and stays in it.
#[tokio::test]
pub(crate) async fn a_new_file_is_in_wal_mode() {
    let (dir, file) = fresh_file("wal");
    drop(SqliteStore::open(&file).await.unwrap());
    assert_eq!(journal_mode(&file).await, "wal");
    drop(SqliteStore::open(&file).await.unwrap());
    assert_eq!(journal_mode(&file).await, "wal");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The journal mode of `file`, read on a connection of the test's own.
pub(crate) async fn journal_mode(file: &std::path::Path) -> String {
    sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut connect(file).await)
        .await
        .unwrap()
}

/// Found in review of the port to sqlx: the claim's write was read for its returned row, and
/// its commit, which SQLite makes when the statement is reset after that row, could fail
/// unseen (here: a rollback-journal file another connection reads past the pool's
/// `busy_timeout`), so the claim answered new with nothing written, and a retry would create
/// again. A write whose commit fails is an error, and leaves no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_whose_commit_fails_is_an_error_not_new() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Store;
    use tower_idempotency::store::StoreErrorKind;
    let (dir, file) = fresh_file("commit-fails");
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(::sqlx::sqlite::SqliteJournalMode::Delete)
        .busy_timeout(Duration::from_millis(200));
    let pool = ::sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone()).timeout(Duration::from_secs(10));
    store.migrate().await.unwrap();
    // A reader holding the file's shared lock: a writer can take its reserved lock and write,
    // but not commit.
    let mut reader = connect(&file).await;
    let mut reading = reader.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(&mut *reading)
        .await
        .unwrap();
    let key = "uncommitted";
    let claimed = store
        .claim(key, &LabelContract::fingerprint(key, "p"))
        .await;
    assert!(
        matches!(&claimed, Err(error) if error.kind() == StoreErrorKind::Timeout),
        "{claimed:?}"
    );
    reading.rollback().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing recorded");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The store keeps a connection for its next call as long as calls keep coming: the pool's
/// line (an application's handler, a transaction of the store) still gets its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_pools_line_gets_a_turn_while_store_calls_go_on() {
    drop(SqliteStore::open(path()).await.unwrap());
    let options = ::sqlx::sqlite::SqliteConnectOptions::new().filename(path());
    let pool: ::sqlx::SqlitePool = ::sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone());
    common::the_pools_line_gets_a_turn_while_store_calls_go_on(store, pool).await;
}

/// A run dropped while its claim waits for the file's write lock, on the application's pool of
/// several connections: its settling's release runs on another connection of the pool, beside
/// the claim still waiting in SQLite's busy handler. Whichever gets the lock first, no key may
/// be left pending under a reservation nobody holds: the settling must act after the claim's
/// deadline, past which the claim writes nothing. The lock is freed at a different moment each
/// round (300 to 775 ms after the claim), so the two waiters' busy-handler sleeps line up both
/// ways; each round has a file of its own, all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_run_dropped_mid_claim_on_a_shared_pool_strands_no_key() {
    use std::convert::Infallible;
    use tower_idempotency::idempotent::{self, Idempotent};

    async fn round(round: u64) -> (PathBuf, i64) {
        let (dir, file) = fresh_file(&format!("dropped-claim-{round}"));
        drop(SqliteStore::open(&file).await.unwrap());
        let pool = ::sqlx::sqlite::SqlitePoolOptions::new()
            .min_connections(4)
            .max_connections(4)
            .connect_with(::sqlx::sqlite::SqliteConnectOptions::new().filename(&file))
            .await
            .unwrap();
        let runs = Idempotent::new(SqliteStore::new(pool));
        let mut blocker = connect(&file).await;
        let held = blocker.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let key = format!("dropped-{round}");
        let started = tokio::time::Instant::now();
        let run = runs.run(&key, idempotent::fingerprint(&key).unwrap(), async |_| {
            Ok::<_, Infallible>(1)
        });
        let dropped = tokio::time::timeout(Duration::from_millis(100), run).await;
        assert!(dropped.is_err(), "the run waited for the write lock");
        tokio::time::sleep_until(started + Duration::from_millis(300 + 25 * round)).await;
        held.commit().await.unwrap();
        // Past the claim's deadline (the store's timeout from its start) the claim has written
        // or never will: from then on a pending key is settled soon or stranded for good. The
        // bound is far past the settling's first tries.
        let deadline = tower_idempotency::store::DEFAULT_TIMEOUT + Duration::from_millis(100);
        tokio::time::sleep_until(started + deadline).await;
        let mut look = connect(&file).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM idempotency_records WHERE response IS NULL",
            )
            .fetch_one(&mut look)
            .await
            .unwrap();
            if pending == 0 || tokio::time::Instant::now() >= deadline {
                return (dir, pending);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let rounds: Vec<_> = (0..20).map(|n| tokio::spawn(round(n))).collect();
    let mut stranded = 0;
    for task in rounds {
        let (dir, pending) = task.await.unwrap();
        stranded += pending;
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert_eq!(stranded, 0, "keys left pending over 20 rounds");
}

/// A settling whose release fails (not one that finds nothing) says so, at once: a closed pool
/// fails the first release, and the settling does not wait for the claim's deadline first; a
/// pool closed while it waits fails the second release, which is not taken for done either.
#[tokio::test]
pub(crate) async fn a_settling_whose_release_fails_says_so() {
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::store::Reservation;
    use tower_idempotency::store::Store;

    let (dir, file) = fresh_file("settle-fails");
    drop(SqliteStore::open(&file).await.unwrap());
    let pool = || async {
        ::sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(::sqlx::sqlite::SqliteConnectOptions::new().filename(&file))
            .await
            .unwrap()
    };
    let fingerprint = LabelContract::fingerprint("k", "p");

    // Closed before: the first release fails; answered long before the 30 s it would wait.
    let closed = pool().await;
    let store = SqliteStore::new(closed.clone()).timeout(Duration::from_secs(30));
    closed.close().await;
    let started = std::time::Instant::now();
    let settled = store
        .settle_claim("k", &fingerprint, Reservation::generate())
        .await;
    assert!(settled.is_err(), "{settled:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    // Closed while it waits past the deadline: the second release fails.
    let open = pool().await;
    let store = SqliteStore::new(open.clone()).timeout(Duration::from_secs(2));
    let settling = tokio::spawn(async move {
        store
            .settle_claim("k", &fingerprint, Reservation::generate())
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    open.close().await;
    let settled = settling.await.unwrap();
    assert!(settled.is_err(), "{settled:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Options are a value: a clone given another timeout makes its own pools, with that timeout
/// as their connections' `busy_timeout`, and the store it was cloned from keeps its pools' (a
/// setter once wrote a handle the clones shared).
#[tokio::test]
async fn new_options_leave_the_pools_of_the_stores_cloned_before_as_they_were() {
    async fn busy_timeout(store: &SqliteStore) -> i64 {
        sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap()
    }
    let dir = fresh_dir("options");
    let first = SqliteStore::open(dir.join("keys.db"))
        .await
        .unwrap()
        .timeout(Duration::from_millis(700));
    let second = first.clone().timeout(Duration::from_millis(2_500));
    assert_eq!(
        second.options().call_timeout(),
        Duration::from_millis(2_500)
    );
    assert_eq!(busy_timeout(&second).await, 2_500);
    assert_eq!(busy_timeout(&first).await, 700);
    let third = first.clone().retention(Duration::from_secs(9));
    assert_eq!(
        third.options().retention_window(),
        Some(Duration::from_secs(9))
    );
    third.pool().close().await;
    assert!(first.pool().is_closed(), "the same pool");
    std::fs::remove_dir_all(dir).ok();
}

/// A release by this process wakes the waiters of its key at once, not at the next poll.
#[tokio::test]
async fn a_local_change_wakes_its_waiters_at_once() {
    let store = make_store(None).await;
    common::scenarios::a_local_change_wakes_its_waiters_at_once(store, SqliteStore::waited_keys)
        .await;
}

/// Found in review: a store that keeps no tombstones ignores one a record holds (written by a
/// store that keeps them, on the same file): past its replay window the key is new there, as
/// its options say, not refused as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_tombstones_ignores_the_ones_a_record_holds() {
    use common::{claimed_again, complete_new};
    use tower_idempotency::store::{Claim, Store, StoreOptions};
    let retention = Duration::from_millis(200);
    let keeping = make_with(
        StoreOptions::new()
            .retention(retention)
            .tombstones(Duration::from_secs(60)),
    )
    .await;
    let ignoring = make_with(
        StoreOptions::new()
            .retention(retention)
            .tombstones(Duration::ZERO),
    )
    .await;
    let key = format!(
        "ignored-tombstone-{}",
        tower_idempotency::store::Reservation::generate()
    );
    let started = std::time::Instant::now();
    complete_new(&keeping, &key).await;
    tokio::time::sleep_until((started + retention + Duration::from_millis(50)).into()).await;
    assert_eq!(claimed_again(&keeping, &key).await, "expired");
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint(&key, "p");
    assert!(matches!(
        ignoring.claim(&key, &fingerprint).await.unwrap(),
        Claim::New(_)
    ));
}

/// Found in review: one purge handles records to bury and records to delete however they
/// interleave in the expiry index, each batch reading at most a batch of it: every record
/// past both windows is deleted, every one within its tombstone's kept as a tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_purge_buries_and_deletes_records_however_they_interleave() {
    use common::{claimed_again, complete_new};
    use tower_idempotency::store::Purge;
    let (dir, file) = fresh_file("interleaved");
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .retention(Duration::from_secs(3600));
    let keys: Vec<String> = (0..300).map(|i| format!("interleaved-{i}")).collect();
    for key in &keys {
        complete_new(&store, key).await;
    }
    // Every record past its replay window, interleaved in the index: the even ones past their
    // tombstone's too.
    sqlx::query(
        "UPDATE idempotency_records SET expires_at = 1000 + CAST(substr(key, 13) AS INTEGER), \
         tombstone_until = CASE WHEN CAST(substr(key, 13) AS INTEGER) % 2 = 0 THEN 1 \
         ELSE tombstone_until END",
    )
    .execute(&mut connect(&file).await)
    .await
    .unwrap();
    let purged = store.purge_expired().await.unwrap();
    assert_eq!(purged, 300, "150 buried and 150 deleted");
    let left: Vec<(String, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT key, response FROM idempotency_records ORDER BY key")
            .fetch_all(&mut connect(&file).await)
            .await
            .unwrap();
    assert_eq!(left.len(), 150);
    for (key, response) in &left {
        let i: usize = key["interleaved-".len()..].parse().unwrap();
        assert_eq!(i % 2, 1, "{key}: only the remembered ones are left");
        assert_eq!(*response, None, "{key}: its response dropped");
        assert_eq!(claimed_again(&store, key).await, "expired");
    }
    // A tombstone past its window that no purge reached yet is absent to the operator, as to
    // a claim.
    sqlx::query(
        "UPDATE idempotency_records SET expires_at = 1, tombstone_until = 1 \
         WHERE key = 'interleaved-1'",
    )
    .execute(&mut connect(&file).await)
    .await
    .unwrap();
    use tower_idempotency::store::Operator as _;
    assert_eq!(store.inspect("interleaved-1").await.unwrap(), None);
    assert_eq!(claimed_again(&store, "interleaved-1").await, "new");
    let _ = std::fs::remove_dir_all(dir);
}

/// A file made by a release before tombstones: opening it adds their columns (and a second
/// open, or `migrate`, finds them and changes nothing), and the store keeps tombstones on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_an_earlier_release_gains_the_tombstone_columns() {
    use common::{claimed_again, complete_new};
    use tower_idempotency::store::sqlite::sqlx::Executor as _;
    let (dir, file) = fresh_file("earlier-release");
    let mut old = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true),
    )
    .await
    .unwrap();
    old.execute(include_str!(
        "../../crates/tower-idempotency-sqlx/migrations/sqlite/0001_idempotency_records.sql"
    ))
    .await
    .unwrap();
    old.execute(
        "INSERT INTO idempotency_records (key, fingerprint, response, changed_at, expires_at) \
         VALUES ('before', 'f', x'00', 0, 1)",
    )
    .await
    .unwrap();
    let columns = async |connection: &mut SqliteConnection| -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pragma_table_info('idempotency_records') \
             WHERE name IN ('tombstone', 'tombstone_until')",
        )
        .fetch_one(connection)
        .await
        .unwrap()
    };
    assert_eq!(columns(&mut old).await, 0, "the earlier release's table");
    let retention = Duration::from_millis(200);
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .retention(retention)
        .tombstones(Duration::from_secs(60));
    assert_eq!(columns(&mut old).await, 2, "both columns added");
    store.migrate().await.unwrap();
    SqliteStore::open(&file)
        .await
        .expect("opened again as it is");
    let key = format!(
        "upgraded-{}",
        tower_idempotency::store::Reservation::generate()
    );
    let started = std::time::Instant::now();
    complete_new(&store, &key).await;
    tokio::time::sleep_until((started + retention + Duration::from_millis(50)).into()).await;
    assert_eq!(claimed_again(&store, &key).await, "expired");
    let _ = std::fs::remove_dir_all(dir);
}

/// A pending record is pending whatever else its row holds: a claim never answers expired (or
/// replays) a key whose reservation is held, even beside a tombstone left in its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_record_is_pending_beside_a_stray_tombstone() {
    use tower_idempotency::store::{Claim, Store};
    let store = make_store(Some(Duration::from_secs(3600))).await;
    let key = format!(
        "stray-{}",
        tower_idempotency::store::Reservation::generate()
    );
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint(&key, "p");
    let Ok(Claim::New(_)) = store.claim(&key, &fingerprint).await else {
        panic!("a new key");
    };
    let tombstone = tower_idempotency::store::Tombstone::new(
        std::time::SystemTime::now(),
        http::StatusCode::CREATED,
        None,
    );
    sqlx::query(
        "UPDATE idempotency_records SET tombstone = ?2, tombstone_until = ?3, expires_at = 1 \
         WHERE key = ?1",
    )
    .bind(&key)
    .bind(&tombstone.to_bytes()[..])
    .bind(now_millis() + 3_600_000)
    .execute(&mut connect(path()).await)
    .await
    .unwrap();
    assert_eq!(
        store.claim(&key, &fingerprint).await.unwrap(),
        Claim::Pending
    );
}
