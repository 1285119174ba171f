//! The SQLite store: durable and embedded, one file shared by the processes of one host, on
//! sqlx.

/// The SQL toolkit the [`SqliteStore`] is built on, re-exported so you get a matching
/// version (to make the pool you hand to [`SqliteStore::new`], or to open the file for a
/// look).
pub use ::sqlx;

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection as _, Executor as _};

use crate::dialect::{
    Base, Claiming, Completion, Dialect, LocalWaiters, Rows, Token, completed, millis,
    options_methods, sql_store,
};
use crate::pooled::{Connections, on_connection};
use tower_idempotency_core::Purge;
use tower_idempotency_core::backend::within;
use tower_idempotency_core::codec;
use tower_idempotency_core::{
    Claim, DEFAULT_TIMEOUT, Decision, Found, RecordInfo, Store, StoreError, StoreErrorKind, decide,
};

mod open;
mod operator;
mod purge;

pub use self::purge::PURGE_BATCH;

/// A registry in one SQLite file: it survives restarts, and every process of the host that
/// opens the same file shares it (SQLite's locking makes each claim atomic across them). No
/// server to run: the SQLite library is built in (sqlx's bundled SQLite, so an application
/// on sqlx or SeaORM links one SQLite, not two).
///
/// - [`open`](Self::open) puts the file in WAL mode with `synchronous = FULL` (a completed
///   record is on disk before the layer answers) and makes the table if it is missing.
///   [`new`](Self::new) takes the application's own [`SqlitePool`] instead, as it is.
/// - A claim first reads the record: a replay, a pending or a conflicting claim stops there,
///   writing nothing. A new key (or one to take over) is then one statement,
///   `INSERT … ON CONFLICT DO UPDATE … WHERE …`, atomic under the file's write lock, so that
///   two processes cannot both reserve it.
/// - **A claim never lands after its caller gave up.** The claim's write carries its
///   deadline (the call's start plus the [timeout](Self::timeout)) and SQLite checks it
///   under the write lock, on the host's clock the caller shares: a statement still waiting
///   for the lock when its caller timed out writes nothing, whatever the pool's
///   `busy_timeout`. A lost claim's settling ([`Store::settle_claim`]) releases at once what
///   the claim wrote; if it finds nothing, the claim may still be waiting for the lock on
///   another of the pool's connections (a run dropped early, before its claim's deadline),
///   so it waits until that deadline has passed on the same clock (one timeout from the
///   settling's start at most) and releases again: after it, the claim can no longer write,
///   and a key is never left pending by an answer nobody read.
/// - Completed records get an `expires_at` from the [retention](Self::retention), if set, and
///   keep a tombstone for the [tombstone window](Self::tombstones) after it: a claim answers
///   expired until then and treats the record as absent after;
///   [`purge_expired`](Self::purge_expired) drops the response, then the record. Pending
///   records never expire.
/// - A request waiting for a first attempt ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait))
///   is woken at once by a change this store made, and looks again every
///   [`CHANGE_POLL_INTERVAL`](tower_idempotency_core::CHANGE_POLL_INTERVAL) for a change another process made.
///
/// ```no_run
/// use tower_idempotency_sqlx::SqliteStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// let store = SqliteStore::open("idempotency.sqlite3").await?;
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
///
/// # On the application's pool
///
/// [`SqliteStore::new`] shares the pool's connections and changes none of their settings: the
/// file's journal mode, `synchronous` and `busy_timeout` are the pool's. For the store's
/// guarantees, open the pool on a file in WAL mode with `synchronous = FULL` (SQLite's
/// default; sqlx's [`SqliteConnectOptions`] keep it unless told otherwise). The pool's
/// `busy_timeout` (sqlx's default five seconds) only bounds how long a connection stays busy
/// with a call its caller gave up on: each call is bounded by the store's own timeout.
#[derive(Clone)]
pub struct SqliteStore {
    /// The connections of writes (the store's own pool of one, or the application's), and
    /// the options.
    base: Base<Sqlite>,
    /// The connections of reads (a claim's first look, the operator's): a pool of a few of
    /// the store's own, since WAL lets readers go on beside the writer, or the application's.
    reads: Connections<Sqlite>,
    waiters: LocalWaiters,
    /// Whether the store made its pools, whose connections carry its timeout as their
    /// `busy_timeout`: new options with another timeout make them afresh.
    own_pool: bool,
}

const SELECT: &str = "SELECT fingerprint, token, response, lease_until, take_over, expires_at, \
    changed_at, tombstone, tombstone_until FROM idempotency_records WHERE key = ?1";

/// The claim's write: the caller's pending reservation, over an absent record, a completed
/// one past its replay window (and its tombstone's, unless the claim forgets expired
/// operations, `?9`), or an abandoned reservation the caller may take over; only while the
/// caller's deadline (`?7`) is ahead on SQLite's clock, read under the write lock. One row changed: the
/// key is the caller's. Run to its end, not read for a returned row: in autocommit SQLite
/// commits when the statement ends, and a commit that fails (a reader holding a
/// rollback-journal file, a full disk) rolls the write back, which only the statement's own
/// result says.
const RESERVE: &str = "INSERT INTO idempotency_records \
    (key, fingerprint, token, response, lease_until, take_over, changed_at, expires_at) \
    SELECT ?1, ?2, ?3, NULL, ?4, ?5, ?6, NULL \
    WHERE CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) < ?7 \
    ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, \
    token = excluded.token, response = NULL, lease_until = excluded.lease_until, \
    take_over = excluded.take_over, changed_at = excluded.changed_at, expires_at = NULL, \
    tombstone = NULL, tombstone_until = NULL \
    WHERE (token IS NULL AND (response IS NULL OR expires_at <= ?6) \
    AND (?9 OR tombstone_until IS NULL OR tombstone_until <= ?6)) \
    OR (token IS NOT NULL AND take_over AND ?8 AND fingerprint = excluded.fingerprint \
    AND (lease_until IS NULL OR lease_until <= ?6) AND token IS NOT ?3)";

/// Passes of a claim's read and write before it gives up: each pass that writes nothing
/// found the record changed by another claim since its read.
const CLAIM_ATTEMPTS: usize = 4;

/// The connections of reads in the store's own pool.
const READERS: u32 = 4;

/// A record as a claim reads it: fingerprint, token, response, lease_until, take_over,
/// expires_at, changed_at, tombstone, tombstone_until.
type Row = (
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
    bool,
    Option<i64>,
    i64,
    Option<Vec<u8>>,
    Option<i64>,
);

/// The record a claim read, as the claim's decision takes it.
fn found(
    row: Option<Row>,
    now: i64,
    fingerprint: &str,
    token: &[u8; 16],
) -> Option<Found<Vec<u8>>> {
    let row = row?;
    let (stored_fingerprint, stored_token, response, lease_until, take_over, expires_at, _) =
        (row.0, row.1, row.2, row.3, row.4, row.5, row.6);
    let (tombstone, tombstone_until) = (row.7, row.8);
    let same_fingerprint = stored_fingerprint == fingerprint;
    let expired = expires_at.is_some_and(|at| at <= now);
    let remembered = tombstone_until.is_some_and(|until| until > now);
    let completed = completed(same_fingerprint, response, tombstone, expired, remembered);
    Some(match (stored_token, completed) {
        (None, Some(completed)) => completed,
        (stored_token, _) => Found::Pending {
            same_fingerprint,
            mine: stored_token.is_some_and(|stored| stored[..] == token[..]),
            abandoned: take_over && lease_until.is_none_or(|until| until <= now),
        },
    })
}

/// Now, in milliseconds since the Unix epoch: the clock every process of the host shares.
fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

/// SQLite's primary result code of a failed statement, if it is one.
fn sqlite_code(error: &sqlx::Error) -> Option<i64> {
    match error {
        sqlx::Error::Database(error) => error
            .code()
            .and_then(|code| code.parse::<i64>().ok())
            .map(|code| code & 0xff),
        _ => None,
    }
}

/// SQLITE_BUSY and SQLITE_LOCKED: a lock another connection holds.
fn busy(error: &sqlx::Error) -> bool {
    matches!(sqlite_code(error), Some(5 | 6))
}

/// A failed call: a lock not had in time is a timeout; a record or file that cannot be read
/// is corrupt; anything else, unavailable.
fn unavailable(error: sqlx::Error) -> StoreError {
    let kind = match &error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        _ if busy(&error) => StoreErrorKind::Timeout,
        // SQLITE_CORRUPT, SQLITE_NOTADB.
        _ => match sqlite_code(&error) {
            Some(11 | 26) => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Unavailable,
        },
    };
    StoreError::with_source(kind, error)
}

/// A failed open: a file that cannot be opened (SQLITE_CANTOPEN) is a configuration error.
fn not_opened(error: sqlx::Error) -> StoreError {
    match sqlite_code(&error) {
        Some(14) => StoreError::with_source(StoreErrorKind::InvalidConfig, error),
        _ => unavailable(error),
    }
}

impl SqliteStore {
    /// A store on the application's own pool, as it is: it shares the pool's connections and
    /// changes none of their settings (see [On the application's pool](Self#on-the-applications-pool)).
    /// Make the table with [`migrate`](Self::migrate), or with your migrations from
    /// [`SCHEMA`](Self::SCHEMA).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency_sqlx::SqliteStore;
    /// use tower_idempotency_sqlx::sqlite::sqlx::sqlite::{
    ///     SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions,
    /// };
    ///
    /// let options = SqliteConnectOptions::new()
    ///     .filename("app.db")
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal);
    /// let pool = SqlitePoolOptions::new().connect_with(options).await?;
    /// let store = SqliteStore::new(pool);
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn new(pool: SqlitePool) -> Self {
        let base = Base::new(pool);
        Self {
            reads: base.connections.clone(),
            base,
            waiters: LocalWaiters::default(),
            own_pool: false,
        }
    }

    /// Makes the store's table and its expiry index, each if it is missing, and adds the
    /// columns of later releases to a table made before ([`SCHEMA`](Self::SCHEMA)), leaving
    /// the file's journal mode as it is. Idempotent, and a file that has them all takes no
    /// write lock.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the file cannot be written.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut connection = self.pool().acquire().await.map_err(unavailable)?;
        open::make_table(&mut connection).await.map_err(unavailable)
    }

    /// The pool the store runs on: the application's, or its own.
    pub fn pool(&self) -> &SqlitePool {
        self.base.connections.pool()
    }

    /// Makes the store's own pools afresh, their connections carrying `timeout`.
    fn remake_pools(&mut self, timeout: Duration) {
        let connect = (*self.pool().connect_options()).clone();
        (self.base.connections, self.reads) = open::own_pools(&connect, timeout);
    }

    options_methods!(
        SqliteStore,
        "The timeout bounds each call, its wait for a connection of the pool and for the \
         file's write lock included: a claim that has not written by then writes nothing \
         afterwards. On the store's own pools ([`open`](Self::open)) it is also the \
         connections' `busy_timeout` (SQLite's wait for the lock).",
        "It also bounds the wait for the file's write lock; on the store's own pools it is the \
         connections' `busy_timeout` (see [`with_options`](Self::with_options))."
    );

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)), for metrics and tests.
    pub fn waited_keys(&self) -> usize {
        self.waiters.len()
    }

    /// Runs `f` on a connection for writes, bounded by the timeout.
    async fn call<T>(
        &self,
        f: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        self.base.call(unavailable, f).await
    }

    /// Runs `f` on a connection for reads, bounded by the timeout.
    async fn look<T>(
        &self,
        f: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        on_connection(&self.reads, self.base.timeout(), async |connection| {
            f(connection).await.map_err(unavailable)
        })
        .await
    }
}

/// The record of `key`, if any.
async fn read(connection: &mut SqliteConnection, key: &str) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(SELECT)
        .bind(key)
        .fetch_optional(connection)
        .await
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.base.debug(f, "SqliteStore", "idempotency_records")
    }
}

sql_store!(SqliteStore);

impl Dialect for SqliteStore {
    fn store_options(&self) -> &tower_idempotency_core::StoreOptions {
        &self.base.options
    }

    async fn claim(&self, claiming: Claiming<'_>) -> Result<Claim, StoreError> {
        let Claiming {
            key,
            fingerprint,
            reservation,
            lease,
        } = claiming;
        let timeout = self.base.timeout();
        let lease = crate::dialect::lease_on(&self.base.options, lease);
        let fingerprint = fingerprint.to_hex();
        let fingerprint = fingerprint.as_str();
        let token = reservation.as_u128().to_be_bytes();
        let deadline = now_millis().saturating_add(millis(timeout));
        within(timeout, async {
            for _ in 0..CLAIM_ATTEMPTS {
                // A replay, a pending or a conflicting claim: decided on a read, nothing
                // written.
                let row = self
                    .look(async |connection| read(connection, key).await)
                    .await?;
                let now = now_millis();
                let decision = decide(found(row, now, fingerprint, &token), lease);
                if let Decision::Answer(answer) = decision {
                    let decode = |response: Vec<u8>| codec::decode(Bytes::from(response));
                    return answer.claim(reservation, decode, |kept: Vec<u8>| {
                        tower_idempotency_core::Tombstone::from_bytes(&kept)
                    });
                }
                // Absent, expired or to be taken over: written in one statement that checks
                // the same again under the file's write lock, and the caller's deadline.
                let reserved = self
                    .call(async |connection| {
                        sqlx::query(RESERVE)
                            .bind(key)
                            .bind(fingerprint)
                            .bind(&token[..])
                            .bind(now.saturating_add(millis(lease.duration())))
                            .bind(lease.takes_over())
                            .bind(now)
                            .bind(deadline)
                            .bind(lease.takes_over())
                            .bind(lease.forgets_expired())
                            .execute(connection)
                            .await
                            .map(|done| done.rows_affected())
                    })
                    .await?;
                if reserved == 1 {
                    return Ok(Claim::New(reservation));
                }
                if now_millis() >= deadline {
                    break;
                }
            }
            Err(StoreError::new(StoreErrorKind::Timeout))
        })
        .await
    }

    async fn renew_rows(&self, key: &str, token: &Token, lease: Duration) -> Rows {
        self.call(async |connection| {
            sqlx::query(
                "UPDATE idempotency_records SET lease_until = ?3 \
                 WHERE key = ?1 AND token = ?2",
            )
            .bind(key)
            .bind(&token[..])
            .bind(now_millis().saturating_add(millis(lease)))
            .execute(connection)
            .await
            .map(|done| done.rows_affected())
        })
        .await
    }

    async fn complete_rows(
        &self,
        key: &str,
        token: Option<&Token>,
        completion: &Completion,
    ) -> Rows {
        let now = now_millis();
        let retention_ms = self.base.retention_ms();
        let expires = (retention_ms > 0).then(|| now.saturating_add(retention_ms));
        let remembered =
            (completion.tombstone_ms > 0).then(|| now.saturating_add(completion.tombstone_ms));
        self.call(async |connection| {
            sqlx::query(
                "UPDATE idempotency_records SET response = ?3, token = NULL, \
                 lease_until = NULL, changed_at = ?4, expires_at = ?5, tombstone = ?6, \
                 tombstone_until = ?7 \
                 WHERE key = ?1 AND token IS NOT NULL AND (?2 IS NULL OR token = ?2)",
            )
            .bind(key)
            .bind(token.map(|token| &token[..]))
            .bind(&completion.response[..])
            .bind(now)
            .bind(expires)
            .bind(completion.tombstone())
            .bind(remembered)
            .execute(connection)
            .await
            .map(|done| done.rows_affected())
        })
        .await
    }

    async fn release_rows(&self, key: &str, token: &Token) -> Rows {
        self.call(async |connection| {
            sqlx::query("DELETE FROM idempotency_records WHERE key = ?1 AND token = ?2")
                .bind(key)
                .bind(&token[..])
                .execute(connection)
                .await
                .map(|done| done.rows_affected())
        })
        .await
    }

    async fn forget_rows(&self, key: &str) -> Rows {
        self.call(async |connection| {
            sqlx::query("DELETE FROM idempotency_records WHERE key = ?1")
                .bind(key)
                .execute(connection)
                .await
                .map(|done| done.rows_affected())
        })
        .await
    }

    /// A lost claim may still wait for the file's write lock on another connection (the
    /// application's pool), so a release that finds nothing may have overtaken it. Its
    /// deadline, which it checks under the lock, is at most one timeout from now (it started
    /// before this call): once past it on the host's clock the claim can no longer write, and
    /// a second release takes what it wrote.
    async fn settle(&self, claiming: Claiming<'_>) -> Result<(), StoreError> {
        let (key, reservation) = (claiming.key, &claiming.reservation);
        let past = now_millis().saturating_add(millis(self.base.timeout()));
        match self.release(key, reservation).await {
            Err(error) if error.kind() == StoreErrorKind::ReservationLost => {}
            released => return released,
        }
        loop {
            let left = past.saturating_sub(now_millis());
            if left < 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(left.unsigned_abs() + 1)).await;
        }
        match self.release(key, reservation).await {
            Err(error) if error.kind() == StoreErrorKind::ReservationLost => Ok(()),
            released => released,
        }
    }

    fn local_waiters(&self) -> Option<&LocalWaiters> {
        Some(&self.waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's `busy_timeout` takes an `i32` of milliseconds: a longer timeout is clamped.
    #[test]
    fn the_busy_timeout_is_clamped_to_sqlites_range() {
        assert_eq!(open::busy_millis(Duration::from_millis(250)), 250);
        assert_eq!(open::busy_millis(Duration::MAX), i32::MAX as u64);
        assert_eq!(
            open::busy_millis(Duration::from_millis(i32::MAX as u64 + 1)),
            i32::MAX as u64
        );
    }

    /// The shipped migrations are the schema the store makes: the table, its index, and each
    /// later column as the store adds it to a table made before.
    #[test]
    fn the_shipped_migration_makes_the_table_and_its_index() {
        let later = include_str!("../../migrations/sqlite/0002_tombstones.sql");
        for (column, add) in open::LATER_COLUMNS {
            assert!(add.contains(column));
            assert!(later.contains(add), "{add}");
            assert!(
                SqliteStore::SCHEMA.contains(&format!("    {column} ")),
                "{column}"
            );
        }
        let first = include_str!("../../migrations/sqlite/0001_idempotency_records.sql");
        for line in first.lines().filter(|line| line.starts_with("    ")) {
            let line = line.trim_end_matches(',');
            assert!(SqliteStore::SCHEMA.contains(line), "{line}");
        }
        assert!(SqliteStore::SCHEMA.contains("CREATE TABLE IF NOT EXISTS idempotency_records"));
        assert!(
            SqliteStore::SCHEMA
                .contains("CREATE INDEX IF NOT EXISTS idempotency_records_expires_at")
        );
    }
}
