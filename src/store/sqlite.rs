//! The SQLite store: durable and embedded, one file shared by the processes of one host.

/// The SQLite binding the [`SqliteStore`] is built on, re-exported so you get the matching
/// version (to open its file for a look, say).
pub use ::rusqlite;

use std::future::Future;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::Purger;
use super::codec;
use super::waiting::{self, WaiterMap, Waiters};
use super::{
    CHANGE_POLL_INTERVAL, Claim, DEFAULT_TIMEOUT, Lease, Operator, RecordInfo, Reservation, Store,
    StoreError, StoreErrorKind, StoredResponse, retention_millis, within,
};
use crate::fingerprint::Fingerprint;

/// A registry in one SQLite file: it survives restarts, and every process of the host that
/// opens the same file shares it (SQLite's locking makes each claim atomic across them). No
/// server to run: the SQLite library is built into the crate.
///
/// - The file is in WAL mode with `synchronous = FULL`: a completed record is on disk before
///   the layer answers.
/// - A claim is one transaction: a read (a replay, a pending or a conflicting claim stops
///   there, writing nothing), and for a new key the insert, under SQLite's write lock
///   (`BEGIN IMMEDIATE`), so that two processes cannot both insert it.
/// - SQLite's calls block: each store runs them on a thread of its own, one at a time, in the
///   order they were made, and the async callers wait for their answer. Writes from every
///   process of the host take turns at the file's one write lock; a call that cannot get it
///   within the [timeout](SqliteStore::timeout) fails with [`StoreErrorKind::Timeout`].
/// - Completed records get an `expires_at` from the [retention](SqliteStore::retention), if
///   set; a claim treats expired ones as absent and
///   [`purge_expired`](SqliteStore::purge_expired) deletes them. Pending records never expire.
/// - A request waiting for a first attempt ([`pending_wait`](crate::IdempotencyLayer::pending_wait))
///   is woken at once by a change this store made, and looks again every
///   [`CHANGE_POLL_INTERVAL`] for a change another process made.
///
/// ```no_run
/// use tower_idempotency::store::SqliteStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let store = SqliteStore::open("idempotency.sqlite3").await?;
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    worker: Arc<Worker>,
    retention_ms: i64,
    timeout: Duration,
}

/// The thread that owns the connection, and the requests of this process waiting for a key.
struct Worker {
    jobs: mpsc::Sender<Job>,
    waiters: Mutex<WaiterMap>,
}

impl Waiters for Arc<Worker> {
    fn with_waiters<R>(&self, _: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R {
        f(&mut self.waiters.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A call to run on the connection's thread.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Expired records [`SqliteStore::purge_expired`] deletes in one write transaction at most: a
/// few milliseconds of the file's write lock.
pub const PURGE_BATCH: u64 = 5_000;

/// The longest pause between two batches of a purge.
const MAX_PURGE_PAUSE: Duration = Duration::from_millis(50);

/// The pause after a batch of a purge that took `batch`: four times as long, so that the
/// purge holds the file's write lock a fifth of the time, within a millisecond and
/// [`MAX_PURGE_PAUSE`].
fn purge_pause(batch: Duration) -> Duration {
    (batch * 4).clamp(Duration::from_millis(1), MAX_PURGE_PAUSE)
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempotency_records (
    key TEXT PRIMARY KEY NOT NULL,
    fingerprint TEXT NOT NULL,
    token BLOB,
    response BLOB,
    lease_until INTEGER,
    take_over INTEGER NOT NULL DEFAULT 0,
    changed_at INTEGER NOT NULL,
    expires_at INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at
    ON idempotency_records (expires_at) WHERE expires_at IS NOT NULL;";

const SELECT: &str = "SELECT fingerprint, token, response, lease_until, take_over, expires_at, \
    changed_at FROM idempotency_records WHERE key = ?1";

/// Puts the file in WAL mode and creates the table and its index, each only if it is not done already (a
/// file in use by other processes then takes no write lock to open).
fn prepare(connection: &Connection) -> rusqlite::Result<()> {
    // WAL lets readers go on while one process writes; a file system that cannot hold it
    // keeps the rollback journal, still correct.
    let mode: String = connection.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        connection.pragma_update(None, "journal_mode", "WAL")?;
    }
    // The table and its expiry index (which the purge's batches go by), both looked up.
    let present: i64 = connection.query_row(
        "SELECT count(*) FROM sqlite_master WHERE (type = 'table' \
         AND name = 'idempotency_records') OR (type = 'index' \
         AND name = 'idempotency_records_expires_at')",
        [],
        |row| row.get(0),
    )?;
    if present < 2 {
        connection.execute_batch(SCHEMA)?;
    }
    Ok(())
}

/// Checks the file holds a store's table, changing nothing: not a store's file is a
/// `CannotOpen` error (an invalid configuration).
fn existing(connection: &Connection) -> rusqlite::Result<()> {
    let tables: i64 = connection.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
         AND name = 'idempotency_records'",
        [],
        |row| row.get(0),
    )?;
    if tables == 1 {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some("the file holds no idempotency_records table: not a store's".to_owned()),
        ))
    }
}

/// A record as a claim reads it.
struct Row {
    fingerprint: String,
    token: Option<Vec<u8>>,
    response: Option<Vec<u8>>,
    lease_until: Option<i64>,
    take_over: bool,
    expires_at: Option<i64>,
    changed_at: i64,
}

fn read(connection: &Connection, key: &str) -> rusqlite::Result<Option<Row>> {
    connection
        .prepare_cached(SELECT)?
        .query_row(params![key], |row| {
            Ok(Row {
                fingerprint: row.get(0)?,
                token: row.get(1)?,
                response: row.get(2)?,
                lease_until: row.get(3)?,
                take_over: row.get(4)?,
                expires_at: row.get(5)?,
                changed_at: row.get(6)?,
            })
        })
        .optional()
}

/// What a claim does with the record it read.
enum Decision {
    /// Answer without writing.
    Answer(Result<Claim, StoreError>),
    /// Write the caller's pending reservation over the record (absent, expired or taken over).
    Reserve,
}

/// The claim's decision on `row` (contract §4): fingerprint first, then the status.
fn decide(
    row: Option<Row>,
    now: i64,
    fingerprint: &str,
    token: &[u8; 16],
    reservation: Reservation,
    lease: Lease,
) -> Decision {
    let Some(row) = row else {
        return Decision::Reserve;
    };
    let expired = row.response.is_some() && row.expires_at.is_some_and(|at| at <= now);
    if expired {
        return Decision::Reserve;
    }
    if row.fingerprint != fingerprint {
        return Decision::Answer(Ok(Claim::Conflict));
    }
    match (row.response, row.token) {
        (Some(response), _) => {
            Decision::Answer(codec::decode(Bytes::from(response)).map(Claim::Replay))
        }
        (None, Some(stored)) if stored[..] == token[..] => {
            Decision::Answer(Ok(Claim::New(reservation)))
        }
        (None, _)
            if row.take_over
                && lease.takes_over()
                && row.lease_until.is_none_or(|until| until <= now) =>
        {
            Decision::Reserve
        }
        (None, _) => Decision::Answer(Ok(Claim::Pending)),
    }
}

/// Now, in milliseconds since the Unix epoch: the clock every process of the host shares.
fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(retention_millis(duration)).unwrap_or(i64::MAX)
}

/// How long opening the file tries again while another process holds its lock.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest wait for the file's lock SQLite takes (its milliseconds are an `i32`).
const MAX_BUSY: Duration = Duration::from_millis(i32::MAX as u64);

/// Whether SQLite refused for a lock another connection holds.
fn busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A failed call: a lock not had in time is a timeout; a record or file that cannot be read
/// is corrupt; anything else, unavailable.
fn unavailable(error: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    let kind = match &error {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..) => StoreErrorKind::Corrupt,
        _ if busy(&error) => StoreErrorKind::Timeout,
        _ => match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Unavailable,
        },
    };
    StoreError::with_source(kind, error)
}

fn guarded(rows: usize) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::new(StoreErrorKind::ReservationLost))
    }
}

impl SqliteStore {
    /// Opens (or creates) the store in the file at `path`, in WAL mode, and creates its table
    /// if it is missing.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the file cannot be opened or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path.as_ref(), prepare).await
    }

    /// Opens the store in the existing file at `path` as it is: its journal mode unchanged,
    /// nothing created. For a tool that looks at a file another process made (the operator's
    /// `idempotency_keys`), which may not be a store's at all.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] if the file is missing or holds no store's table; a
    /// [`StoreError`] if it cannot be read.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// let store = tower_idempotency::store::SqliteStore::open_existing("/var/lib/app/keys.db").await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn open_existing(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                format!("{}: no such file", path.display()),
            ));
        }
        Self::open_with(path, existing).await
    }

    async fn open_with(
        path: &Path,
        prepare: fn(&Connection) -> rusqlite::Result<()>,
    ) -> Result<Self, StoreError> {
        let path = path.to_owned();
        let (opened, result) = tokio::sync::oneshot::channel();
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tower-idempotency-sqlite".to_owned())
            .spawn(move || {
                let connection = Connection::open(&path).and_then(|connection| {
                    connection.busy_timeout(DEFAULT_TIMEOUT)?;
                    connection.pragma_update(None, "synchronous", "FULL")?;
                    // Another process's writes may hold the file's lock, and SQLite answers
                    // "busy" at once in some of those cases: opening tries again for a while,
                    // since a store that fails to open fails its server.
                    let started = std::time::Instant::now();
                    loop {
                        match prepare(&connection) {
                            Err(error) if busy(&error) && started.elapsed() < OPEN_TIMEOUT => {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            other => break other.map(|()| connection),
                        }
                    }
                });
                let mut connection = match connection {
                    Ok(connection) => {
                        let _ = opened.send(Ok(()));
                        connection
                    }
                    Err(error) => {
                        let _ = opened.send(Err(error));
                        return;
                    }
                };
                // Until the last clone of the store is dropped.
                while let Ok(job) = queue.recv() {
                    job(&mut connection);
                }
            })
            .map_err(|e| StoreError::with_source(StoreErrorKind::Unavailable, e))?;
        result
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Unavailable))?
            .map_err(|error| match error.sqlite_error_code() {
                Some(rusqlite::ErrorCode::CannotOpen) => {
                    StoreError::with_source(StoreErrorKind::InvalidConfig, error)
                }
                _ => unavailable(error),
            })?;
        Ok(Self {
            worker: Arc::new(Worker {
                jobs,
                waiters: Mutex::default(),
            }),
            retention_ms: millis(super::DEFAULT_RETENTION),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Gives completed records an `expires_at` `retention` after they were completed; from
    /// then on a claim treats them as absent, and [`purge_expired`](Self::purge_expired)
    /// deletes them. Default: [`DEFAULT_RETENTION`](super::DEFAULT_RETENTION), 24 hours.
    /// Pending records never expire.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention_ms = millis(retention);
        self
    }

    /// Keeps completed records until they are forgotten (no `expires_at`), rather than for
    /// the retention window: the file then grows with every key it is sent.
    pub fn keep_forever(mut self) -> Self {
        self.retention_ms = 0;
        self
    }

    /// How long one call may take, waiting for its turn on the store's thread and for the
    /// file's write lock included: each call waits for the lock only as long as its caller
    /// still waits for it, and a call its caller gave up on before its turn is not run.
    /// Default one second.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Deletes the completed records past their retention, and returns how many: in batches
    /// of [`PURGE_BATCH`] records, oldest first by the expiry index, each its own write
    /// transaction well within the store's timeout, until none is left. So it finishes at
    /// any backlog, and the claims of every process of the host take their turns at the
    /// file's write lock between its batches (and this store's own between its jobs).
    /// Pending records are never deleted.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the file cannot be written; the records of the batches before it
    /// stay deleted.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut purged = 0;
        self.purge_expired_counting(&mut purged).await?;
        Ok(purged)
    }

    /// [`purge_expired`](Self::purge_expired), adding each batch's deletions to `purged` as
    /// it goes: after a failure it holds what the batches before it deleted.
    ///
    /// # Errors
    ///
    /// As [`purge_expired`](Self::purge_expired).
    ///
    /// ```no_run
    /// # async fn run(store: tower_idempotency::store::SqliteStore) {
    /// let mut purged = 0;
    /// if let Err(error) = store.purge_expired_counting(&mut purged).await {
    ///     eprintln!("purged {purged}, then: {error:#}");
    /// }
    /// # }
    /// ```
    pub async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        let batch = i64::try_from(PURGE_BATCH).unwrap_or(i64::MAX);
        loop {
            let started = std::time::Instant::now();
            let deleted = self
                .call(move |connection| {
                    connection
                        .prepare_cached(
                            "DELETE FROM idempotency_records WHERE key IN (SELECT key \
                             FROM idempotency_records WHERE expires_at <= ?1 \
                             ORDER BY expires_at LIMIT ?2)",
                        )?
                        .execute(params![now_millis(), batch])
                })
                .await
                .map(|rows| u64::try_from(rows).unwrap_or(u64::MAX))?;
            *purged += deleted;
            if deleted < PURGE_BATCH {
                return Ok(());
            }
            // SQLite's write lock is not fair: a writer of another process polls for it
            // (busy_timeout) and would miss it if the next batch took it at once. A pause of
            // four times the batch keeps the purge to a fifth of the lock's time.
            tokio::time::sleep(purge_pause(started.elapsed())).await;
        }
    }

    /// Purges the expired records every `interval` ([`purge_expired`](Self::purge_expired)),
    /// the first time at once, in a task of its own, until the returned [`Purger`] is
    /// dropped: keep it for as long as the store serves (bound to a name: `let _ = …` drops
    /// it at once, and the purge with it). One process of the host purging is
    /// enough.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] outside a
    /// Tokio runtime.
    pub fn purge_every(&self, interval: Duration) -> Result<Purger, StoreError> {
        let store = self.clone();
        Purger::spawn(interval, move || {
            let store = store.clone();
            async move { store.purge_expired().await }
        })
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](crate::IdempotencyLayer::pending_wait)), for metrics and tests.
    pub fn waited_keys(&self) -> usize {
        self.worker
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Runs `f` on the connection's thread, after every call made before, and waits for its
    /// answer up to the timeout.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.call_with(move |connection| f(connection).map_err(unavailable))
            .await
    }

    async fn call_with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let deadline = std::time::Instant::now().checked_add(self.timeout);
        self.worker
            .jobs
            .send(Box::new(move |connection| {
                // Its caller gave up (the timeout, or its request dropped): a claim not run
                // is settled as not made, anything else is looked at again by its caller.
                if answer.is_closed() {
                    return;
                }
                let left = deadline.map_or(MAX_BUSY, |deadline| {
                    deadline.saturating_duration_since(std::time::Instant::now())
                });
                if left.is_zero() {
                    return;
                }
                let result = match connection.busy_timeout(left.min(MAX_BUSY)) {
                    Ok(()) => {
                        // A panic in a call ends that call, not the store's thread.
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(connection)))
                            .unwrap_or_else(|_| Err(StoreError::new(StoreErrorKind::Unavailable)))
                    }
                    Err(error) => Err(unavailable(error)),
                };
                let _ = answer.send(result);
            }))
            .map_err(|_| StoreError::new(StoreErrorKind::Unavailable))?;
        within(self.timeout, async {
            answered
                .await
                .unwrap_or_else(|_| Err(StoreError::new(StoreErrorKind::Unavailable)))
        })
        .await
    }

    /// Completes the pending record of `key` with `response`: the one pending under `token`,
    /// or whichever is pending when there is no token (an operator's resolve).
    async fn store_response(
        &self,
        key: &str,
        token: Option<[u8; 16]>,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let owned = key.to_owned();
        let encoded = codec::encode(response);
        let retention = self.retention_ms;
        let rows = self
            .call(move |connection| {
                let now = now_millis();
                let expires = (retention > 0).then(|| now.saturating_add(retention));
                connection
                    .prepare_cached(
                        "UPDATE idempotency_records SET response = ?3, token = NULL, \
                         lease_until = NULL, changed_at = ?4, expires_at = ?5 \
                         WHERE key = ?1 AND token IS NOT NULL AND (?2 IS NULL OR token = ?2)",
                    )?
                    .execute(params![
                        owned,
                        token.as_ref().map(|token| &token[..]),
                        &encoded[..],
                        now,
                        expires
                    ])
            })
            .await?;
        guarded(rows)?;
        self.wake(key);
        Ok(())
    }

    /// Wakes this process's requests waiting for `key`.
    fn wake(&self, key: &str) {
        self.worker
            .with_waiters(key, |waiters| waiting::wake(waiters, key));
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("retention_ms", &self.retention_ms)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Store for SqliteStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let key = key.to_owned();
        let fingerprint = fingerprint.to_hex().as_str().to_owned();
        self.call_with(move |connection| {
            let token = reservation.as_u128().to_be_bytes();
            // A replay, a pending or a conflicting claim: decided on a read, nothing written.
            let row = read(connection, &key).map_err(unavailable)?;
            let now = now_millis();
            if let Decision::Answer(answer) =
                decide(row, now, &fingerprint, &token, reservation, lease)
            {
                return answer;
            }
            // Absent, expired or to be taken over: decided again under the write lock, which
            // no other process holds meanwhile.
            let transaction = connection
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let row = read(&transaction, &key).map_err(unavailable)?;
            let now = now_millis();
            if let Decision::Answer(answer) =
                decide(row, now, &fingerprint, &token, reservation, lease)
            {
                return answer;
            }
            transaction
                .prepare_cached(
                    "INSERT OR REPLACE INTO idempotency_records \
                     (key, fingerprint, token, response, lease_until, take_over, changed_at, \
                     expires_at) VALUES (?1, ?2, ?3, NULL, ?4, ?5, ?6, NULL)",
                )
                .and_then(|mut insert| {
                    insert.execute(params![
                        key,
                        fingerprint,
                        &token[..],
                        now.saturating_add(millis(lease.duration())),
                        lease.takes_over(),
                        now
                    ])
                })
                .map_err(unavailable)?;
            transaction.commit().map_err(unavailable)?;
            Ok(Claim::New(reservation))
        })
        .await
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = key.to_owned();
        let token = reservation.as_u128().to_be_bytes();
        let rows = self
            .call(move |connection| {
                connection
                    .prepare_cached(
                        "UPDATE idempotency_records SET lease_until = ?3 \
                         WHERE key = ?1 AND token = ?2",
                    )?
                    .execute(params![
                        key,
                        &token[..],
                        now_millis().saturating_add(millis(lease))
                    ])
            })
            .await?;
        guarded(rows)
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let token = reservation.as_u128().to_be_bytes();
        self.store_response(key, Some(token), response).await
    }

    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        let waiting = waiting::wait(Arc::clone(&self.worker), key);
        waiting::until(Some(waiting), CHANGE_POLL_INTERVAL)
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let owned = key.to_owned();
        let token = reservation.as_u128().to_be_bytes();
        let rows = self
            .call(move |connection| {
                connection
                    .prepare_cached(
                        "DELETE FROM idempotency_records WHERE key = ?1 AND token = ?2",
                    )?
                    .execute(params![owned, &token[..]])
            })
            .await?;
        guarded(rows)?;
        self.wake(key);
        Ok(())
    }
}

impl Operator for SqliteStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let key = key.to_owned();
        let row = self.call(move |connection| read(connection, &key)).await?;
        let Some(row) = row else { return Ok(None) };
        let now = now_millis();
        let fingerprint = Fingerprint::parse(&row.fingerprint)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?;
        let age = u64::try_from(now.saturating_sub(row.changed_at))
            .ok()
            .map(Duration::from_millis);
        Ok(Some(match row.response {
            Some(response) => RecordInfo::completed(
                fingerprint,
                age,
                codec::decode(Bytes::from(response))?.status(),
            ),
            None => RecordInfo::pending(
                fingerprint,
                age,
                row.lease_until.is_some_and(|until| until <= now),
            ),
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let age = i64::try_from(age.min(super::MAX_RETENTION).as_millis()).unwrap_or(i64::MAX);
        let before = now_millis().saturating_sub(age);
        self.call(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT key FROM idempotency_records WHERE token IS NOT NULL \
                 AND changed_at <= ?1 ORDER BY key",
            )?;
            let keys = statement.query_map(params![before], |row| row.get(0))?;
            keys.collect()
        })
        .await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.store_response(key, None, response).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let owned = key.to_owned();
        let rows = self
            .call(move |connection| {
                connection
                    .prepare_cached("DELETE FROM idempotency_records WHERE key = ?1")?
                    .execute(params![owned])
            })
            .await?;
        self.wake(key);
        Ok(rows > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge pauses four times its batch between batches, within a millisecond and the cap.
    #[test]
    fn a_purge_pauses_four_times_its_batch() {
        let ms = Duration::from_millis;
        assert_eq!(purge_pause(ms(5)), ms(20));
        assert_eq!(purge_pause(Duration::ZERO), ms(1));
        assert_eq!(purge_pause(ms(30)), MAX_PURGE_PAUSE);
    }
}
