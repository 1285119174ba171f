//! The PostgreSQL store: shared by every replica and durable.

/// The PostgreSQL driver and pool the [`PostgresStore`] is built on, re-exported so you get
/// matching versions.
pub use {::deadpool_postgres, ::tokio_postgres};

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::Purger;
use super::codec;
use super::notifier::{self, Notifier};
use super::waiting;
use super::{
    CHANGE_POLL_INTERVAL, Claim, DEFAULT_TIMEOUT, Lease, Reservation, Store, StoreError,
    StoreErrorKind, StoredResponse, retention_millis, within,
};
use crate::fingerprint::Fingerprint;

mod listener;
mod operator;
mod sql;
mod transactional;

use self::listener::Listener;
use self::sql::Sql;

pub use transactional::{PgTransaction, TransactionalPostgresStore};

/// A registry in a PostgreSQL table, shared by every replica that uses the same database, and
/// durable.
///
/// Every operation is **one statement**, so one round trip on a warm connection:
///
/// - the claim is one statement, an `INSERT … ON CONFLICT (key) DO NOTHING` that atomically
///   creates the pending reservation, joined with a read of the record as it stands when the key
///   is taken. A replay, a pending or a conflicting claim writes nothing. (Three rare cases take
///   a second statement: a claim that raced another for the same key and committed in between,
///   the take-over of a completed record past its retention, and the take-over of an abandoned
///   reservation, when the claim's [`Lease`] asks for it.)
/// - complete is an `UPDATE` and release a `DELETE`, both guarded by this request's
///   reservation token.
///
/// The table is created by [`migrate`](PostgresStore::migrate), which is idempotent and safe to
/// run from several replicas at once. Completed records get an `expires_at` from the
/// [retention](PostgresStore::retention), if set, and [`purge_expired`](PostgresStore::purge_expired)
/// deletes the expired ones; schedule it as you like. Pending records never expire.
///
/// With [`pending_wait`](crate::IdempotencyLayer::pending_wait), a waiting request marks the
/// record it waits on, and once a marked record is completed, released, resolved or forgotten
/// the change is announced with `pg_notify` on the table's channel (`<table>_changed`), in a
/// statement of its own after the change committed. One connection per store, outside the
/// pool and opened on the first wait, `LISTEN`s there and wakes the waiters of this process,
/// whichever replica made the change. Records nobody waits on are never announced.
///
/// Every call fails with a [`StoreError`] after the [timeout](PostgresStore::timeout) (default
/// one second), so the layer fails closed while the database is away; the pool reconnects when
/// it returns.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::PostgresStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test")
///     .await?
///     .table("label_idempotency")?
///     .retention(Duration::from_secs(24 * 60 * 60));
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    retention_ms: i64,
    timeout: Duration,
    /// The `statement_timeout` new pooled connections get, in ms, when the store built the
    /// pool: the store's timeout, so that no statement outlives its caller for long.
    statement_timeout: Option<Arc<AtomicU64>>,
    /// Wakes the requests of this process waiting for a key, from the changes announced on
    /// the table's channel; `None` on a pool of the caller's (then they poll).
    notifier: Option<Arc<Notifier<Listener>>>,
}

/// The longest [`PostgresStore::migrate`] waits for a lock it needs to change the table, at a
/// time: claims queue behind a waiting lock request, so no longer than this.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// Attempts of [`PostgresStore::migrate`] at a change whose lock stays held, with
/// [`migrate_pauses`] between them: about half a minute in all.
const MIGRATE_ATTEMPTS: usize = 30;

/// The longest a missing expiry index's build may take, its wait for older transactions
/// included: [`PostgresStore::migrate`] fails past it, saying so.
const INDEX_BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest pause between two attempts of [`PostgresStore::migrate`].
const MAX_MIGRATE_PAUSE: Duration = Duration::from_secs(1);

/// The pauses between the attempts of [`PostgresStore::migrate`]: from the lock wait,
/// doubling, to a second.
fn migrate_pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(MIGRATE_LOCK_WAIT), |pause| {
        Some((*pause * 2).min(MAX_MIGRATE_PAUSE))
    })
}

/// Expired records [`PostgresStore::purge_expired`] deletes in one statement at most: a few
/// milliseconds of work, well within any store timeout.
pub const PURGE_BATCH: u64 = 5_000;

/// Passes of the claim statement before giving up; see [`PostgresStore::claim`].
const CLAIM_ATTEMPTS: usize = 4;

impl PostgresStore {
    /// The default table name.
    pub const DEFAULT_TABLE: &'static str = "idempotency_records";

    /// A store on a pool of connections to `url` (`postgres://user@host:port/db`).
    ///
    /// Connects once to check the database can be reached. The pool holds at most twice the
    /// machine's logical CPUs (deadpool's default), made as needed, and a store whose layer
    /// waits for first attempts ([`pending_wait`](crate::IdempotencyLayer::pending_wait))
    /// one more, its listener: N replicas take up to N × (pool + 1) of the server's
    /// `max_connections`. Change the size with `store.pool().resize(n)`, or bring a pool of
    /// your own with [`from_pool`](Self::from_pool). A claim that waits for a connection
    /// longer than the [timeout](Self::timeout) fails like any store call that times out.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the URL is invalid or the database cannot be reached within the
    /// timeout.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::with_source(StoreErrorKind::InvalidConfig, e))?;
        let store = Self::from_config(config)?;
        let client = store.client().await?;
        // Not kept: connections made after the timeout is set get its statement_timeout.
        drop(deadpool_postgres::Object::take(client));
        Ok(store)
    }

    /// A store on a pool built from a `tokio_postgres` configuration, without TLS. Connects
    /// lazily.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the pool cannot be built.
    pub fn from_config(mut config: tokio_postgres::Config) -> Result<Self, StoreError> {
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_TIMEOUT);
        }
        let mut listener = config.clone();
        if listener.get_application_name().is_none() {
            listener.application_name("tower-idempotency listener");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let statement_timeout = Arc::new(AtomicU64::new(statement_timeout_ms(DEFAULT_TIMEOUT)));
        let for_new_connections = Arc::clone(&statement_timeout);
        let pool = Pool::builder(manager)
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let millis = for_new_connections.load(Ordering::Relaxed);
                Box::pin(async move {
                    client
                        .batch_execute(&format!("SET statement_timeout = {millis}"))
                        .await
                        .map_err(deadpool_postgres::HookError::Backend)
                })
            }))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(DEFAULT_TIMEOUT))
            .create_timeout(Some(DEFAULT_TIMEOUT))
            .recycle_timeout(Some(DEFAULT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::with_source(StoreErrorKind::InvalidConfig, e))?;
        let store = Self::from_pool(pool);
        Ok(Self {
            statement_timeout: Some(statement_timeout),
            notifier: Some(Notifier::new(Listener {
                config: listener,
                sql: Arc::clone(&store.sql),
            })),
            ..store
        })
    }

    /// A store on a pool you built yourself.
    pub fn from_pool(pool: Pool) -> Self {
        Self {
            pool,
            sql: Arc::new(Sql::new(Self::DEFAULT_TABLE)),
            retention_ms: i64::try_from(retention_millis(super::DEFAULT_RETENTION))
                .unwrap_or(i64::MAX),
            timeout: DEFAULT_TIMEOUT,
            statement_timeout: None,
            notifier: None,
        }
    }

    /// Uses the table `name`: letters, digits and `_`, not starting with a digit, at most 48
    /// characters. Default `idempotency_records`.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] for any other name.
    pub fn table(mut self, name: &str) -> Result<Self, StoreError> {
        let valid = !name.is_empty()
            && name.len() <= 48
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                format!(
                    "table {name:?}: letters, digits and _, not starting with a digit, at most \
                     48 characters"
                ),
            ));
        }
        self.sql = Arc::new(Sql::new(name));
        if let Some(notifier) = &self.notifier {
            self.notifier = Some(Notifier::new(Listener {
                config: notifier.source().config.clone(),
                sql: Arc::clone(&self.sql),
            }));
        }
        Ok(self)
    }

    /// Gives completed records an `expires_at` `retention` after they were completed; from
    /// then on a claim treats them as absent, and [`purge_expired`](Self::purge_expired)
    /// deletes them. Default: [`DEFAULT_RETENTION`](super::DEFAULT_RETENTION), 24 hours.
    /// Pending records never expire. Any duration is accepted; past
    /// [`MAX_RETENTION`](super::MAX_RETENTION) (a hundred years) it is clamped.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention_ms = i64::try_from(retention_millis(retention)).unwrap_or(i64::MAX);
        self
    }

    /// Keeps completed records until they are forgotten (no `expires_at`), rather than for
    /// the retention window: the table then grows with every key it is sent.
    pub fn keep_forever(mut self) -> Self {
        self.retention_ms = 0;
        self
    }

    /// Sets how long one store call may take, waiting for a connection included. Default one
    /// second. On a pool the store built ([`connect`](Self::connect),
    /// [`from_config`](Self::from_config)) it is also every connection's `statement_timeout`,
    /// so a statement whose caller gave up cannot commit much later; set it before the store
    /// is used. On a pool of your own ([`from_pool`](Self::from_pool)) set `statement_timeout`
    /// yourself.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        if let Some(statement_timeout) = &self.statement_timeout {
            statement_timeout.store(statement_timeout_ms(timeout), Ordering::Relaxed);
        }
        self
    }

    /// Whether this store listens for the changes any replica announces right now, so that a
    /// request waiting for a first attempt is woken by its completion (see
    /// [`pending_wait`](crate::IdempotencyLayer::pending_wait)); the listening starts on the
    /// first wait, on a connection of its own outside the pool. `false` on a pool of your own
    /// ([`from_pool`](Self::from_pool)): waiters then poll.
    pub fn notifications_listening(&self) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|notifier| notifier.listening())
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](crate::IdempotencyLayer::pending_wait)), for metrics and tests: a key
    /// counts once however many wait on it, and a request that stops waiting leaves nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// let store =
    ///     tower_idempotency::store::PostgresStore::connect("postgres://postgres@127.0.0.1/test")
    ///         .await?;
    /// assert_eq!(store.waited_keys(), 0);
    /// # Ok(()) }
    /// ```
    pub fn waited_keys(&self) -> usize {
        self.notifier
            .as_ref()
            .map_or(0, |notifier| notifier.waited_keys())
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Creates the table and its index if they do not exist, and adds the columns of later
    /// releases. Idempotent, and safe to run from several replicas at once.
    ///
    /// Safe to run on every start under load: it looks the table, its columns and its index up
    /// in the catalog first, so a start with nothing to change takes no lock on the table and
    /// waits for no open transaction (the transactional store holds one for every create),
    /// and no claim waits for it. A change waits for its lock a tenth of a second at a time,
    /// so claims queue behind it no longer than that, and is tried again, with pauses growing
    /// to a second, for about half a minute. A missing (or invalid) expiry index is built
    /// with `CREATE INDEX CONCURRENTLY` on a connection of its own, unbounded by the store's
    /// timeout: writers go on while it builds, one replica builds it while the others wait,
    /// and `migrate` returns when it is built (such a build waits for the database's
    /// transactions older than it, at most ten minutes in all, then fails saying so).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be reached or refuses, or
    /// [`StoreErrorKind::Timeout`] if a change found its lock held for every attempt.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // Each attempt waits at most `MIGRATE_LOCK_WAIT` for a lock it needs (only a change
        // needs one), so claims queue behind it no longer than that; a change whose lock is
        // held longer (a writing transaction open on the table) is tried again, for as long as
        // `MIGRATE_ATTEMPTS` allow.
        let mut pauses = migrate_pauses();
        for attempt in 1..=MIGRATE_ATTEMPTS {
            let tried = within(self.timeout, async {
                let mut client = self.client().await?;
                let transaction = client.transaction().await.map_err(unavailable)?;
                let lock_wait = MIGRATE_LOCK_WAIT.as_millis();
                transaction
                    .batch_execute(&format!("SET LOCAL lock_timeout = {lock_wait}"))
                    .await
                    .map_err(unavailable)?;
                transaction
                    .batch_execute(&self.sql.migrate)
                    .await
                    .map_err(|error| match error.code() {
                        Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                            StoreError::with_source(StoreErrorKind::Timeout, error)
                        }
                        _ => unavailable(error),
                    })?;
                let indexed = transaction
                    .query_one(&self.sql.expiry_index, &[])
                    .await
                    .map_err(unavailable)
                    .and_then(index_valid)?;
                transaction.commit().await.map_err(unavailable)?;
                Ok(indexed)
            })
            .await;
            match tried {
                Err(error)
                    if error.kind() == StoreErrorKind::Timeout && attempt < MIGRATE_ATTEMPTS =>
                {
                    tracing::debug!(
                        error = &error as &dyn std::error::Error,
                        attempt,
                        "migrate waits for the table's lock; trying again"
                    );
                    tokio::time::sleep(pauses.next().unwrap_or(MAX_MIGRATE_PAUSE)).await;
                }
                Err(error) => return Err(error),
                Ok(true) => return Ok(()),
                Ok(false) => return self.build_expiry_index().await,
            }
        }
        Err(StoreError::new(StoreErrorKind::Timeout))
    }

    /// Builds the expiry index if it is missing, or invalid (a build interrupted), with
    /// `CREATE INDEX CONCURRENTLY`: the table's writers go on while it builds, however long
    /// the table. It runs outside any transaction, on a connection taken out of the pool for
    /// it (its session settings are its own, and it is closed after), one replica at a time
    /// (the others wait for a session lock, tried every so often), within
    /// [`INDEX_BUILD_TIMEOUT`] rather than the store's timeout. Such a build waits for every
    /// transaction of the database that began before it (an idle one left open anywhere
    /// holds it up), so past that time it fails, saying so, and the next `migrate` drops the
    /// invalid index it left and builds it again.
    async fn build_expiry_index(&self) -> Result<(), StoreError> {
        let connection = within(self.timeout, self.client()).await?;
        let connection = deadpool_postgres::Object::take(connection);
        let bounded = format!(
            "SET statement_timeout = {}; SET lock_timeout = 0",
            statement_timeout_ms(INDEX_BUILD_TIMEOUT)
        );
        connection
            .batch_execute(&bounded)
            .await
            .map_err(unavailable)?;
        let valid = || async {
            connection
                .query_one(&self.sql.expiry_index, &[])
                .await
                .map_err(unavailable)
                .and_then(index_valid)
        };
        let started = tokio::time::Instant::now();
        let mut pause = MIGRATE_LOCK_WAIT;
        loop {
            let row = connection
                .query_one(&self.sql.lock_for_index, &[])
                .await
                .map_err(unavailable)?;
            if row
                .try_get::<_, bool>(0)
                .map_err(|e| StoreError::with_source(StoreErrorKind::Corrupt, e))?
            {
                break;
            }
            // Another replica builds it: done when it is valid.
            if valid().await? {
                return Ok(());
            }
            if started.elapsed() >= INDEX_BUILD_TIMEOUT {
                return Err(StoreError::with_source(
                    StoreErrorKind::Timeout,
                    "another replica's build of the expiry index did not end in time",
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_MIGRATE_PAUSE);
        }
        // Built by another replica while this one waited for the lock.
        if valid().await? {
            return Ok(());
        }
        tracing::info!(
            table = %self.sql.table,
            "building the expiry index concurrently; writers go on meanwhile"
        );
        connection
            .batch_execute(&self.sql.drop_expiry_index)
            .await
            .map_err(unavailable)?;
        connection
            .batch_execute(&self.sql.build_expiry_index)
            .await
            .map_err(unavailable)?;
        // One made meanwhile without the lock (a replica of an earlier version) is taken
        // only if it is valid.
        if valid().await? {
            Ok(())
        } else {
            Err(StoreError::with_source(
                StoreErrorKind::Unavailable,
                "the expiry index was left invalid; migrate again to build it anew",
            ))
        }
    }

    /// Deletes the completed records past their retention, and returns how many: in batches
    /// of [`PURGE_BATCH`] records, oldest first by the expiry index, each one statement well
    /// within the store's timeout, until none is left. So it finishes at any backlog (one
    /// statement for millions of rows would outlast the timeout every time, and the table
    /// would grow while the purge kept failing), and claims between and beside its batches
    /// are not held up: each batch locks only its own rows, and the purge yields between
    /// them. Pending records are never deleted.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be reached or refuses; the records of the
    /// batches before it stay deleted.
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
    /// # async fn run(store: tower_idempotency::store::PostgresStore) {
    /// let mut purged = 0;
    /// if let Err(error) = store.purge_expired_counting(&mut purged).await {
    ///     eprintln!("purged {purged}, then: {error:#}");
    /// }
    /// # }
    /// ```
    pub async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        let batch = i64::try_from(PURGE_BATCH).unwrap_or(i64::MAX);
        loop {
            let deleted = within(self.timeout, async {
                let client = self.client().await?;
                client
                    .execute(&self.sql.purge, &[&batch])
                    .await
                    .map_err(unavailable)
            })
            .await?;
            *purged += deleted;
            if deleted < PURGE_BATCH {
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
    }

    /// Purges the expired records every `interval` ([`purge_expired`](Self::purge_expired)),
    /// the first time at once, in a task of its own, until the returned [`Purger`] is
    /// dropped: keep it for as long as the store serves (bound to a name: `let _ = …` drops
    /// it at once, and the purge with it). One replica's purger is enough; more
    /// share the work (each batch skips the rows another holds).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// use std::time::Duration;
    /// use tower_idempotency::store::PostgresStore;
    ///
    /// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// store.migrate().await?;
    /// let purger = store.purge_every(Duration::from_secs(3600))?;
    /// // … serve; the purger stops when dropped.
    /// # drop(purger);
    /// # Ok(()) }
    /// ```
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

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|error| match error {
            PoolError::Timeout(_) => StoreError::with_source(StoreErrorKind::Timeout, error),
            other => StoreError::with_source(StoreErrorKind::Unavailable, other),
        })
    }

    /// Runs one statement that changes the records of `key` and returns, for each, whether a
    /// request waits on it; announces the change if one does, and returns the rows changed.
    async fn change(
        &self,
        sql: &str,
        key: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let rows = within(self.timeout, async {
            let client = self.client().await?;
            let statement = client.prepare_cached(sql).await.map_err(unavailable)?;
            client.query(&statement, params).await.map_err(unavailable)
        })
        .await?;
        if any_waited(&rows) {
            self.announce(key).await;
        }
        Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
    }

    /// Announces a change of `key` to the waiters of every replica, after the change
    /// committed, in a statement of its own: a notification that cannot be sent (no right to
    /// `pg_notify`, a full notification queue) fails only itself, and the change's commit
    /// does not take the lock that serializes notifying commits. Best effort: a waiter not
    /// woken looks again within a second.
    async fn announce(&self, key: &str) {
        if let Err(error) = self.execute(&self.sql.announce, &[&key]).await {
            tracing::debug!(
                error = &error as &dyn std::error::Error,
                "cannot announce a change; its waiters poll"
            );
        }
    }

    /// Marks the pending record of `key` as waited on, unless it is already (a read then, no
    /// write); `false` when `key` is not pending.
    async fn mark_waited(&self, key: &str) -> Result<bool, StoreError> {
        let Some(row) = self.query_opt(&self.sql.waited, &[&key]).await? else {
            return Ok(false);
        };
        if row.try_get(0).unwrap_or(false) {
            return Ok(true);
        }
        Ok(self.execute(&self.sql.mark_waited, &[&key]).await? > 0)
    }

    /// Runs one prepared (and cached) statement that returns at most one row.
    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        within(self.timeout, async {
            query_opt_on(&*self.client().await?, sql, params).await
        })
        .await
    }

    /// Runs one prepared (and cached) statement and returns the rows it affected.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        within(self.timeout, async {
            execute_on(&*self.client().await?, sql, params).await
        })
        .await
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.table)
            .field("retention_ms", &self.retention_ms)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A duration in whole milliseconds, as PostgreSQL settings take it.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whether the expiry index is there and valid, from the row of `Sql::expiry_index`.
fn index_valid(row: tokio_postgres::Row) -> Result<bool, StoreError> {
    row.try_get(0)
        .map_err(|e| StoreError::with_source(StoreErrorKind::Corrupt, e))
}

/// `timeout` as a `statement_timeout`: whole milliseconds from 1 (0 would turn it off) to the
/// largest PostgreSQL takes (`i32::MAX`, about 24.8 days), past which it refuses the setting
/// and with it every connection.
pub(super) fn statement_timeout_ms(timeout: Duration) -> u64 {
    millis(timeout).clamp(1, i32::MAX as u64)
}

/// A lease in whole milliseconds, as the statements take it.
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(retention_millis(lease)).unwrap_or(i64::MAX)
}

fn unavailable(error: tokio_postgres::Error) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unavailable, error)
}

/// Whether a request waits on any of the records a changing statement returned (`RETURNING
/// waited`); an unreadable flag counts as waited on, so the change is announced.
fn any_waited(rows: &[tokio_postgres::Row]) -> bool {
    rows.iter().any(|row| row.try_get(0).unwrap_or(true))
}

fn guarded(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::new(StoreErrorKind::ReservationLost))
    }
}

/// The longest key kept as it is, in bytes. A btree index row holds about 2,700 bytes, so a
/// longer key is kept as `sha256:` and its digest: any key a request can carry works.
const MAX_KEY_BYTES: usize = 512;

/// The key as the table holds it: itself, or the digest of a long one. A digest form never
/// equals a key the layer makes (those start with a method or a scope's length).
fn table_key(key: &str) -> Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES {
        Cow::Borrowed(key)
    } else {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        Cow::Owned(format!("sha256:{}", hex::encode(digest)))
    }
}

impl PostgresStore {
    /// The claim, on `client`: one statement, rarely two (see [`CLAIM_ATTEMPTS`]), each
    /// bounded by the timeout. Inside a transaction of `client`'s, the claim is that
    /// transaction's.
    pub(super) async fn claim_on(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let key = &*table_key(key);
        let fingerprint = fingerprint.to_hex();
        let token = reservation.as_u128().to_be_bytes();
        let lease_ms = lease_millis(lease.duration());
        let take_over = lease.takes_over();
        let params: [&(dyn ToSql + Sync); 5] = [
            &key,
            &fingerprint.as_str(),
            &&token[..],
            &lease_ms,
            &take_over,
        ];
        // Almost always one pass. Another pass only when a concurrent claim committed the key
        // between this statement's snapshot and its insert (the statement then sees no row),
        // or when the record found had expired or was abandoned and another claim took it
        // over first.
        for _ in 0..CLAIM_ATTEMPTS {
            let row = within(self.timeout, query_opt_on(client, &self.sql.claim, &params)).await?;
            let Some(row) = row else { continue };
            let corrupt = |e| StoreError::with_source(StoreErrorKind::Corrupt, e);
            let stored_token: Option<&[u8]> = row.try_get(0).map_err(corrupt)?;
            let stored_fingerprint: &str = row.try_get(1).map_err(corrupt)?;
            let response: Option<Vec<u8>> = row.try_get(2).map_err(corrupt)?;
            let expired: bool = row.try_get(3).map_err(corrupt)?;
            // Pending, its lease lapsed, and its owner lets it be taken over.
            let lapsed: bool = row.try_get(4).map_err(corrupt)?;
            // Inserted by this statement, or pending under this token already (a repeated
            // claim): the reservation is the caller's.
            if stored_token == Some(&token[..]) && stored_fingerprint == fingerprint.as_str() {
                return Ok(Claim::New(reservation));
            }
            // A completed record past its retention is absent, and a pending one whose lease
            // lapsed may be taken over if the caller asks: take it over, once.
            let take_over_sql = if expired {
                Some(&self.sql.take_over)
            } else if lapsed
                && take_over
                && response.is_none()
                && stored_fingerprint == fingerprint.as_str()
            {
                Some(&self.sql.take_over_abandoned)
            } else {
                None
            };
            if let Some(sql) = take_over_sql {
                if within(self.timeout, execute_on(client, sql, &params)).await? == 1 {
                    return Ok(Claim::New(reservation));
                }
                continue;
            }
            return if stored_fingerprint != fingerprint.as_str() {
                Ok(Claim::Conflict)
            } else {
                match response {
                    Some(response) => codec::decode(Bytes::from(response)).map(Claim::Replay),
                    None => Ok(Claim::Pending),
                }
            };
        }
        Err(StoreError::new(StoreErrorKind::Unavailable))
    }
}

/// Runs one prepared (and cached) statement on `client` that returns at most one row; the
/// caller bounds it with its timeout.
async fn query_opt_on(
    client: &deadpool_postgres::ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<tokio_postgres::Row>, StoreError> {
    let statement = client.prepare_cached(sql).await.map_err(unavailable)?;
    client
        .query_opt(&statement, params)
        .await
        .map_err(unavailable)
}

/// Runs one prepared (and cached) statement on `client`; the rows it affected. The caller
/// bounds it with its timeout.
async fn execute_on(
    client: &deadpool_postgres::ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = client.prepare_cached(sql).await.map_err(unavailable)?;
    client
        .execute(&statement, params)
        .await
        .map_err(unavailable)
}

impl Store for PostgresStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let client = within(self.timeout, self.client()).await?;
        self.claim_on(&client, key, fingerprint, reservation, lease)
            .await
    }

    /// Ends when another process announces a change of `key` (the statements that complete,
    /// release, resolve or forget a record someone waits on notify the table's channel, which
    /// one connection per store listens to), or after a poll interval: [`CHANGE_POLL_INTERVAL`]
    /// until the store listens (or on a pool of your own), a second while it does. While it
    /// listens it first marks the record as waited on (a read, and a write only if no waiter
    /// marked it yet), and ends at once if the record is no longer pending.
    fn changed(&self, key: &str) -> impl Future<Output = ()> + Send {
        let key = table_key(key).into_owned();
        let waiting = self.notifier.as_ref().map(|notifier| notifier.wait(&key));
        let store = self.clone();
        async move {
            let Some((waiting, listening)) = waiting else {
                return tokio::time::sleep(CHANGE_POLL_INTERVAL).await;
            };
            // After the registration above, a change announced wakes this waiter; the change
            // of a marked record is announced. Not listening, the waiter polls, unmarked.
            let listening = listening
                && match store.mark_waited(&key).await {
                    // Completed, released or gone already: look again now.
                    Ok(false) => return,
                    Ok(true) => true,
                    Err(_) => false,
                };
            waiting::until(Some(waiting), notifier::poll_interval(listening)).await;
        }
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let token = reservation.as_u128().to_be_bytes();
        let rows = self
            .execute(&self.sql.renew, &[&key, &&token[..], &lease_millis(lease)])
            .await?;
        guarded(rows)
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let token = reservation.as_u128().to_be_bytes();
        let encoded = codec::encode(response);
        let rows = self
            .change(
                &self.sql.complete,
                key,
                &[&key, &&token[..], &&encoded[..], &self.retention_ms],
            )
            .await?;
        guarded(rows)
    }

    /// A lost claim may still be in flight on another pooled connection, so a plain release
    /// could run first and find nothing. In one transaction this inserts the key (which waits
    /// for any insert of it in flight, then does nothing if one committed) and deletes it under
    /// the reservation: the lost claim's row, or this one's, never visible to anyone.
    async fn settle_claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let token = reservation.as_u128().to_be_bytes();
        // The lost claim may have waited for a connection and then run for up to the
        // statement_timeout: by one timeout from now it has committed or been cancelled.
        tokio::time::sleep(self.timeout).await;
        let waited = within(self.timeout, async {
            let mut client = self.client().await?;
            let transaction = client.transaction().await.map_err(unavailable)?;
            transaction
                .execute(
                    &self.sql.wait_for_claim,
                    &[&key, &fingerprint.to_hex().as_str(), &&token[..]],
                )
                .await
                .map_err(unavailable)?;
            let released = transaction
                .query(&self.sql.release, &[&key, &&token[..]])
                .await
                .map_err(unavailable)?;
            transaction.commit().await.map_err(unavailable)?;
            Ok(any_waited(&released))
        })
        .await?;
        if waited {
            self.announce(key).await;
        }
        Ok(())
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let token = reservation.as_u128().to_be_bytes();
        let rows = self
            .change(&self.sql.release, key, &[&key, &&token[..]])
            .await?;
        guarded(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses double from the lock wait to a second, and the attempts take about half a
    /// minute in all.
    #[test]
    fn migrate_pauses_double_to_a_second() {
        let pauses: Vec<_> = migrate_pauses().take(MIGRATE_ATTEMPTS).collect();
        let millis: Vec<_> = pauses.iter().take(6).map(Duration::as_millis).collect();
        assert_eq!(millis, [100, 200, 400, 800, 1_000, 1_000]);
        let total: Duration = pauses.iter().sum();
        assert!(
            total > Duration::from_secs(20) && total < Duration::from_secs(40),
            "{total:?}"
        );
    }
}
