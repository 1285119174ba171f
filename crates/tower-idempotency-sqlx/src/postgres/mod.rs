//! The PostgreSQL store: shared by every replica and durable.

/// The SQL toolkit the [`PostgresStore`] is built on, re-exported so you get a matching
/// version.
pub use ::sqlx;

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Connection as _, Executor as _, Row as _, SqlSafeStr as _};

use crate::dialect::deleting;
use crate::dialect::{
    Base, Claiming, Completion, Dialect, LocalWaiters, Rows, Token, millis, options_methods,
    sql_store,
};
use crate::pooled::Open;
pub(super) use crate::pooled::{Connections, table_key, valid_table};
use tower_idempotency_core::Purge;
use tower_idempotency_core::backend::notifier::{self, Notifier};
use tower_idempotency_core::backend::waiting;
use tower_idempotency_core::backend::within;
use tower_idempotency_core::codec;
use tower_idempotency_core::{
    Claim, DEFAULT_TIMEOUT, Decision, Found, Lease, Reservation, StoreError, StoreErrorKind,
    StoredResponse, decide,
};

mod claim;
mod clock;
mod listener;
mod migrate;
mod operator;
mod sql;
mod transactional;

use self::listener::Listener;
use self::sql::Sql;

pub use transactional::{PgTransaction, PgTransactionConnection, TransactionalPostgresStore};

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
/// drops the response of the expired ones within their [tombstone window](PostgresStore::tombstones)
/// and deletes the others; schedule it as you like. Pending records never expire.
///
/// With [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait), a waiting request marks the
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
/// # On the application's pool
///
/// The store is built on [`sqlx`]: [`new`](Self::new) takes the application's own
/// [`PgPool`], so one pool, sized once, serves the application and the store. On such a pool
/// the store leaves its connections' session state alone: it sets nothing on them (no
/// `SET`, no `LISTEN`), bounds each call by its [timeout](Self::timeout) on the client's side,
/// sets `statement_timeout` with `SET LOCAL` only inside the transactions it opens itself (the
/// [transactional mode](TransactionalPostgresStore)), and listens for changes on a connection
/// of its own, made with the pool's connect options, outside the pool. A statement the store
/// gave up on is not cancelled on the server, and a call cut off in the middle of its answer
/// can leave sqlx's connection waiting for good: give the pool's connections a
/// `statement_timeout` below the store's timeout (`PgConnectOptions::options([(
/// "statement_timeout", "800ms")])` for the default second), so that the server ends a slow
/// statement first. It is a setting of the connections, so it bounds the application's own
/// statements on the pool too: a report or a migration that runs longer needs a pool of its
/// own, or `SET LOCAL statement_timeout` in its transaction. (Without it the store stays
/// correct: a claim's write checks its own deadline on the server, see
/// [`Store::settle_claim`](tower_idempotency_core::Store::settle_claim); the setting frees the connection sooner.)
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::str::FromStr;
/// use tower_idempotency_sqlx::PostgresStore;
/// use tower_idempotency_sqlx::postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
///
/// let options = PgConnectOptions::from_str("postgres://postgres@127.0.0.1/test?sslmode=require")?
///     .options([("statement_timeout", "800ms")]);
/// let pool = PgPoolOptions::new()
///     .test_before_acquire(false)
///     .connect_with(options)
///     .await?;
/// let store = PostgresStore::new(pool);
/// # Ok(()) }
/// ```
///
/// Statements built at run time (`format!`) need sqlx's `AssertSqlSafe` around them; the
/// store's own are built once per table. A pool the store makes itself ([`connect`](Self::connect),
/// [`connect_with`](Self::connect_with)) gives each of its connections four fifths of the
/// store's timeout as `statement_timeout`.
///
/// sqlx pings a pooled connection each time it hands it out unless the pool is built with
/// `PgPoolOptions::test_before_acquire(false)`: a round trip more on every store call (the
/// capacity bench measures both). The pool the store makes itself turns it off. sqlx also
/// pings every connection that goes back to its pool, which cannot be turned off: so a call
/// that ends well keeps its connection for the store's next call, and the store gives it back
/// to the pool once no call used it for a second. Under load the store holds the connections
/// its calls use at once (never more than the pool's size), and idle it holds none; calls
/// waiting for a connection while every one is out get the kept ones in their order. A
/// connection whose call failed or timed out goes back at once (one that timed out is closed:
/// sqlx would wait, with no bound, for the answer to the statement given up on).
///
/// Behind PgBouncer in transaction mode, statements run on whichever server connection is
/// free: the store works, since it keeps no session state and its transactions are whole
/// transactions, but `LISTEN` does not reach the server's notifications there, so give the
/// listener a direct address, or let waiters poll (they look again every second while the
/// listener is away). Prepared statements need PgBouncer 1.21 or later
/// (`max_prepared_statements`).
///
/// # TLS
///
/// By URL, as libpq takes it: `sslmode=require` encrypts (and trusts any certificate),
/// `sslmode=verify-ca` also verifies the server's certificate against the trusted roots, and
/// `verify-full` its host name too. The trusted roots are the system's (on Linux the files of
/// `/etc/ssl/certs`), or, when `SSL_CERT_FILE` or `SSL_CERT_DIR` is set, the certificates
/// they name in place of the system's; `sslrootcert=PATH` adds the CA of that file to them
/// (sqlx adds it, where libpq would trust it alone). A certificate that does not verify fails
/// the connect, with the TLS error in the [`StoreError`]'s chain; a server without TLS fails
/// any mode but `disable`, `allow` and `prefer`.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency_sqlx::PostgresStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // The application's own pool.
/// use tower_idempotency_sqlx::postgres::sqlx::PgPool;
///
/// let pool = PgPool::connect("postgres://postgres@127.0.0.1:5432/test?sslmode=require").await?;
/// let store = PostgresStore::new(pool.clone())
///     .table("label_idempotency")?
///     .retention(Duration::from_secs(24 * 60 * 60));
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    base: Base<sqlx::Postgres>,
    sql: Arc<Sql>,
    /// Whether the store made its pool, whose connections carry its timeout as their
    /// `statement_timeout`: new options with another timeout make the pool afresh.
    own_pool: bool,
    /// Wakes the requests of this process waiting for a key, from the changes announced on
    /// the table's channel.
    notifier: Arc<Notifier<Listener>>,
    /// The server's clock, for the deadline a claim's write carries.
    clock: Arc<clock::ServerClock>,
}

/// Expired records [`PostgresStore::purge_expired`] deletes in one statement at most. Each batch
/// after the first is sized to take about 20 ms: halved after a longer one (down to 100
/// records), doubled after a quick one (up to this), and halved and tried again after one
/// that ran past the store's timeout.
pub const PURGE_BATCH: u64 = 5_000;

/// Passes of the claim statement before giving up; see [`PostgresStore::claim`].
const CLAIM_ATTEMPTS: usize = 4;

/// What a lost claim's settling waits beyond the timeout: for the claim's statement, sent
/// before its caller gave up, to have reached the server, whose clock its deadline runs on.
const SETTLE_MARGIN: Duration = Duration::from_millis(100);

impl PostgresStore {
    /// The default table name.
    pub const DEFAULT_TABLE: &'static str = "idempotency_records";

    /// A store on the application's own pool: it shares the pool's connections, and leaves
    /// their session state alone (see [On the application's pool](Self#on-the-applications-pool)).
    /// Its listener, made on the first wait for a first attempt, is one connection more, made
    /// with the pool's connect options.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency_sqlx::PostgresStore;
    /// use tower_idempotency_sqlx::postgres::sqlx::postgres::PgPoolOptions;
    ///
    /// let pool = PgPoolOptions::new()
    ///     .max_connections(20)
    ///     .connect("postgres://postgres@127.0.0.1/test")
    ///     .await?;
    /// let store = PostgresStore::new(pool);
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        let sql = Arc::new(Sql::new(Self::DEFAULT_TABLE));
        let notifier = Notifier::new(Listener::new(&pool, &sql));
        Self {
            base: Base::new(pool),
            sql,
            own_pool: false,
            notifier,
            clock: Arc::default(),
        }
    }

    /// A store on a pool of its own, of connections to `url` (`postgres://user@host:port/db`,
    /// with `?sslmode=…` for TLS, see [TLS](Self#tls)).
    ///
    /// Connects once to check the database can be reached (and its certificate verifies).
    /// The pool holds at most sqlx's default of 10 connections, made as needed, and a store
    /// whose layer waits for first attempts
    /// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)) one more, its listener: N
    /// replicas take up to N × 11 of the server's `max_connections`. For another size, or to
    /// share the application's pool, build the pool yourself and use [`new`](Self::new). A
    /// claim that waits for a connection longer than the [timeout](Self::timeout) fails like
    /// any store call that times out.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] if the URL is invalid; a [`StoreError`] if the
    /// database cannot be reached within the timeout, or refuses (a certificate that does not
    /// verify, a password that does not match).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::with_source(StoreErrorKind::InvalidConfig, e))?;
        Self::connect_with(options).await
    }

    /// [`connect`](Self::connect) with sqlx's connect options.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self, StoreError> {
        // A connection of its own, not the pool's: the pool tries a refused address again
        // until the call's timeout, and would say only that it timed out.
        let connection = within(DEFAULT_TIMEOUT, async {
            PgConnection::connect_with(&options)
                .await
                .map_err(unavailable)
        })
        .await?;
        drop(connection.close().await);
        Ok(Self::connect_lazy_with(options))
    }

    /// A store on a pool of its own that connects on first use.
    pub fn connect_lazy_with(options: PgConnectOptions) -> Self {
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("tower-idempotency"),
        };
        Self {
            own_pool: true,
            ..Self::new(own_pool(options, DEFAULT_TIMEOUT))
        }
    }

    /// Makes the store's own pool afresh, its connections carrying `timeout`.
    fn remake_pools(&mut self, timeout: Duration) {
        let pool = own_pool((*self.pool().connect_options()).clone(), timeout);
        self.notifier = Notifier::new(Listener::new(&pool, &self.sql));
        self.base.connections = Connections::new(pool);
    }

    options_methods!(
        PostgresStore,
        "On a pool the store made itself ([`connect`](Self::connect)) the timeout is also \
         every connection's `statement_timeout` (four fifths of it), so that a statement whose \
         caller gave up cannot commit much later. On the application's pool \
         ([`new`](Self::new)) it bounds the store's calls on the client's side, and the \
         transactional mode's transactions with `SET LOCAL statement_timeout`.",
        "On a pool the store made itself it is also the connections' `statement_timeout` (see \
         [`with_options`](Self::with_options))."
    );

    /// Uses the table `name`: letters, digits and `_`, not starting with a digit, at most 48
    /// characters. Default `idempotency_records`.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] for any other name.
    pub fn table(mut self, name: &str) -> Result<Self, StoreError> {
        valid_table(name)?;
        self.sql = Arc::new(Sql::new(name));
        self.notifier = Notifier::new(Listener::new(self.pool(), &self.sql));
        Ok(self)
    }

    /// The DDL that makes the table `table` and its expiry index, for the migration tool you
    /// run yourself (sqlx-migrate, refinery, Flyway, Atlas): what [`migrate`](Self::migrate)
    /// makes on a new database. For the default table it is the files
    /// `migrations/postgres/0001_idempotency_records.sql` and
    /// `0002_tombstones.sql` shipped with the crate, one after the other (less their comments).
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// use tower_idempotency_sqlx::PostgresStore;
    ///
    /// let ddl = PostgresStore::schema("label_idempotency").unwrap();
    /// assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS \"label_idempotency\""));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] for a name [`table`](Self::table) refuses.
    pub fn schema(table: &str) -> Result<String, StoreError> {
        valid_table(table)?;
        Ok(sql::schema(table))
    }

    /// Whether this store listens for the changes any replica announces right now, so that a
    /// request waiting for a first attempt is woken by its completion (see
    /// [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)); the listening starts on the
    /// first wait, on a connection of its own outside the pool.
    pub fn notifications_listening(&self) -> bool {
        self.notifier.listening()
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)), for metrics and tests: a key
    /// counts once however many wait on it, and a request that stops waiting leaves nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store =
    ///     tower_idempotency_sqlx::PostgresStore::connect("postgres://postgres@127.0.0.1/test")
    ///         .await?;
    /// assert_eq!(store.waited_keys(), 0);
    /// # Ok(()) }
    /// ```
    pub fn waited_keys(&self) -> usize {
        self.notifier.waited_keys()
    }

    /// The connection pool: the application's, or the one the store made.
    pub fn pool(&self) -> &PgPool {
        self.base.connections.pool()
    }

    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Runs one statement that changes the records of `key` and returns, for each, whether a
    /// request waits on it; announces the change if one does, and returns the rows changed.
    async fn change(&self, query: Query<'_>, key: &str) -> Result<u64, StoreError> {
        let rows = self
            .base
            .call(unavailable, async |connection| {
                query.fetch_all(connection).await
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
        let announce = sqlx::query(self.sql.announce.clone()).bind(key);
        if let Err(error) = self.execute(announce).await {
            tracing::debug!(
                error = &error as &dyn std::error::Error,
                "cannot announce a change; its waiters poll"
            );
        }
    }

    /// Marks the pending record of `key` as waited on, unless it is already (a read then, no
    /// write); `false` when `key` is not pending.
    async fn mark_waited(&self, key: &str) -> Result<bool, StoreError> {
        let waited = sqlx::query(self.sql.waited.clone()).bind(key);
        let Some(row) = self.fetch_optional(waited).await? else {
            return Ok(false);
        };
        if row.try_get(0).unwrap_or(false) {
            return Ok(true);
        }
        let mark = sqlx::query(self.sql.mark_waited.clone()).bind(key);
        Ok(self.execute(mark).await? > 0)
    }

    /// Runs one statement (prepared once per connection) that returns at most one row.
    async fn fetch_optional(&self, query: Query<'_>) -> Result<Option<PgRow>, StoreError> {
        let fetch = async |connection: &mut PgConnection| query.fetch_optional(connection).await;
        self.base.call(unavailable, fetch).await
    }

    /// Runs one statement (prepared once per connection) and returns the rows it affected.
    async fn execute(&self, query: Query<'_>) -> Rows {
        let execute = async |connection: &mut PgConnection| query.execute(connection).await;
        Ok(self.base.call(unavailable, execute).await?.rows_affected())
    }
}

/// Begins a transaction on a connection of `pool` with `statement`, its `BEGIN` in a task
/// of its own ([`Open::begin`]); a transaction not ended by a commit or a rollback closes its
/// connection.
pub(super) async fn begin_on(
    pool: &PgPool,
    statement: sqlx::SqlStr,
) -> Result<Open<sqlx::Postgres>, StoreError> {
    Open::begin(pool, Some(statement), None).await
}

/// A statement with its parameters bound.
type Query<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.base.debug(f, "PostgresStore", &self.sql.table)
    }
}

/// The store's own pool of connections made with `options`, each with four fifths of
/// `timeout` as its `statement_timeout`. No acquire timeout of the pool's own beyond sqlx's
/// default: each call is bounded by the store's timeout. No ping before each use: it would be a
/// round trip more on every call, and a call on a dead connection fails like any other.
fn own_pool(options: PgConnectOptions, timeout: Duration) -> PgPool {
    let millis = server_side(timeout);
    PgPoolOptions::new()
        .test_before_acquire(false)
        .after_connect(move |connection, _| {
            Box::pin(async move {
                connection
                    .execute(AssertSqlSafe(format!("SET statement_timeout = {millis}")))
                    .await
                    .map(drop)
            })
        })
        .connect_lazy_with(options)
}

/// A value the database sent that is not what the table holds.
fn corrupt(error: sqlx::Error) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, error)
}

/// SQLSTATE `lock_not_available`: a `lock_timeout` passed.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Whether `error` is one the server sent with SQLSTATE `code`.
pub(super) fn has_code(error: &sqlx::Error, code: &str) -> bool {
    matches!(error, sqlx::Error::Database(error) if error.code().as_deref() == Some(code))
}

/// `timeout` as a `statement_timeout`: whole milliseconds from 1 (0 would turn it off) to the
/// largest PostgreSQL takes (`i32::MAX`, about 24.8 days), past which it refuses the setting
/// and with it every connection.
pub(super) fn statement_timeout_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, i32::MAX as u64)
}

/// The `statement_timeout` of a store's connections for its `timeout`: four fifths of it, so
/// that a statement past it ends on the server, answered with its error, before the store gives
/// up on the caller's side. A call cut off on the client's side in the middle of its answer
/// can leave sqlx's connection waiting for an answer that never comes; the server's own
/// cancellation leaves it clean.
pub(super) fn server_side(timeout: Duration) -> u64 {
    statement_timeout_ms(timeout.saturating_sub(timeout / 5))
}

/// A driver's error as the store's: a pool that had no connection for the call in time is a
/// timeout, anything else unavailable.
pub(super) fn unavailable(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::PoolTimedOut => StoreError::with_source(StoreErrorKind::Timeout, error),
        // A claim's write past its deadline (see `Sql::claim`): it wrote nothing.
        sqlx::Error::Database(ref database) if database.code().as_deref() == Some("22012") => {
            StoreError::with_source(StoreErrorKind::Timeout, error)
        }
        error => StoreError::with_source(StoreErrorKind::Unavailable, error),
    }
}

/// Whether a request waits on any of the records a changing statement returned (`RETURNING
/// waited`); an unreadable flag counts as waited on, so the change is announced.
fn any_waited(rows: &[PgRow]) -> bool {
    rows.iter().any(|row| row.try_get(0).unwrap_or(true))
}

/// Records past their replay window and within their tombstone's become tombstones (their
/// response dropped, counted as purged); records past both, or with no tombstone, are
/// deleted. In batches of at most [`PURGE_BATCH`] records, oldest first by the expiry index,
/// each batch one statement that does both to the records it picks,
/// statement well within the store's timeout, until none is left. So it finishes at any
/// backlog (one statement for millions of rows would outlast the timeout every time, and the
/// table would grow while the purge kept failing), and claims between and beside its batches
/// are not held up: each batch locks only its own rows, and the purge pauses four times a
/// batch's time between them, so that it takes about a fifth of the database's time. Several
/// replicas' purgers share the work (each batch skips the rows another holds).
///
/// ```no_run
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// use std::time::Duration;
/// use tower_idempotency_sqlx::PostgresStore;
/// use tower_idempotency_core::Purge;
///
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// store.migrate().await?;
/// let purger = store.purge_every(Duration::from_secs(3600))?;
/// // … serve; the purger stops when dropped.
/// # drop(purger);
/// # Ok(()) }
/// ```
impl Purge for PostgresStore {
    async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        // A statement past the timeout, cancelled by the server or given up on, is tried
        // again halved; rows it may still hold are skipped (`SKIP LOCKED`), left for the next
        // run if it is undone.
        let timed_out =
            |error: &StoreError| error.kind() == StoreErrorKind::Timeout || cancelled(error);
        let purge = deleting::<sqlx::Postgres, _>(|connection, batch| {
            let statement = sqlx::query_scalar::<_, i64>(self.sql.purge.clone()).bind(batch);
            Box::pin(async move {
                let changed = statement.fetch_one(connection).await?;
                Ok(u64::try_from(changed).unwrap_or(0))
            })
        });
        let base = &self.base;
        base.purge_paced(purged, PURGE_BATCH, unavailable, timed_out, purge)
            .await
    }
}

/// Whether `error` is the server's cancelling of a statement (SQLSTATE 57014: its
/// `statement_timeout`, which the store's own pool sets a little under the store's timeout):
/// a statement that ran too long, and was undone.
fn cancelled(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .and_then(sqlx::Error::as_database_error)
        .and_then(|error| error.code())
        .is_some_and(|code| code == "57014")
}

sql_store!(PostgresStore);

impl Dialect for PostgresStore {
    fn store_options(&self) -> &tower_idempotency_core::StoreOptions {
        &self.base.options
    }

    async fn claim(&self, claiming: Claiming<'_>) -> Result<Claim, StoreError> {
        let connections = &self.base.connections;
        let mut connection = within(self.base.timeout(), connections.take()).await?;
        let claimed = self.claim_on(&mut connection, claiming, None).await;
        match &claimed {
            // Kept for the next call (see `pooled::Connections`).
            Ok(_) => connections.keep(connection),
            // A statement given up on: its connection is closed, not pooled (see
            // `pooled::on_connection`).
            Err(error) if error.kind() == StoreErrorKind::Timeout => connection.close_on_drop(),
            Err(_) => {}
        }
        claimed
    }

    async fn renew_rows(&self, key: &str, token: &Token, lease: Duration) -> Rows {
        let renew = sqlx::query(self.sql.renew.clone())
            .bind(&*table_key(key))
            .bind(&token[..])
            .bind(millis(lease));
        self.execute(renew).await
    }

    async fn complete_rows(
        &self,
        key: &str,
        token: Option<&Token>,
        completion: &Completion,
    ) -> Rows {
        let key = &*table_key(key);
        let complete = match token {
            Some(token) => sqlx::query(self.sql.complete.clone())
                .bind(key)
                .bind(&token[..]),
            None => sqlx::query(self.sql.resolve.clone()).bind(key),
        };
        let complete = complete
            .bind(&completion.response[..])
            .bind(self.base.retention_ms())
            .bind(completion.tombstone())
            .bind(completion.tombstone_ms);
        self.change(complete, key).await
    }

    async fn release_rows(&self, key: &str, token: &Token) -> Rows {
        let key = &*table_key(key);
        let release = sqlx::query(self.sql.release.clone())
            .bind(key)
            .bind(&token[..]);
        self.change(release, key).await
    }

    async fn forget_rows(&self, key: &str) -> Rows {
        let key = &*table_key(key);
        let forget = sqlx::query(self.sql.forget.clone()).bind(key);
        self.change(forget, key).await
    }

    /// A lost claim may still be in flight on another pooled connection, even queued behind
    /// another transaction's lock on the key, or delayed on its way, so a plain release could
    /// run first and find nothing. The claim's write checks, after any such wait, that it is
    /// before its deadline on the server's clock (its send time moved there, plus one
    /// timeout), or writes nothing: so this waits one timeout and a margin of 100 ms (for the
    /// error of the clocks' offset), and then, in one
    /// transaction, inserts the key (which waits for any insert of it in flight, then does
    /// nothing if one committed) and deletes it under the reservation: the lost claim's row,
    /// or this one's, never visible to anyone.
    async fn settle(&self, claiming: Claiming<'_>) -> Result<(), StoreError> {
        let key = &*table_key(claiming.key);
        let token = crate::dialect::token(&claiming.reservation);
        let timeout = self.base.timeout();
        // The lost claim was sent before this call: one timeout after it reached the server,
        // its write has committed or can no longer.
        tokio::time::sleep(timeout.saturating_add(SETTLE_MARGIN)).await;
        let waited = within(timeout, async {
            let mut transaction = begin_on(self.pool(), sqlx::SqlStr::from_static("BEGIN")).await?;
            sqlx::query(self.sql.wait_for_claim.clone())
                .bind(key)
                .bind(claiming.fingerprint.to_hex().as_str())
                .bind(&token[..])
                .execute(&mut *transaction)
                .await
                .map_err(unavailable)?;
            let released = sqlx::query(self.sql.release.clone())
                .bind(key)
                .bind(&token[..])
                .fetch_all(&mut *transaction)
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

    /// Ends when another process announces a change of `key` (the statements that complete,
    /// release, resolve or forget a record someone waits on notify the table's channel, which
    /// one connection per store listens to), or after a poll interval:
    /// [`CHANGE_POLL_INTERVAL`](tower_idempotency_core::CHANGE_POLL_INTERVAL) until the store
    /// listens, a second while it does. While it listens it first marks the record as waited
    /// on (a read, and a write only if no waiter marked it yet), and ends at once if the
    /// record is no longer pending.
    fn changes<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        let key = table_key(key).into_owned();
        let (waiting, listening) = self.notifier.wait(&key);
        let store = self.clone();
        async move {
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

    /// None: every change is announced to every replica's listener, this one's too.
    fn local_waiters(&self) -> Option<&LocalWaiters> {
        None
    }
}
