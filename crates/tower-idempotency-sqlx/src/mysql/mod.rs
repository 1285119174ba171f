//! The MySQL store: shared by every replica and durable, on MySQL 8 or MariaDB 10.5 and later
//! (InnoDB), through sqlx.

/// The SQL toolkit the [`MySqlStore`] is built on, re-exported so you get a matching version.
pub use ::sqlx;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Connection as _, Executor as _, Row as _};

use crate::dialect::{
    Base, Claiming, Completion, Dialect, LocalWaiters, Rows, Token, millis, options_methods,
    sql_store,
};
use crate::pacing::Pacing;
use crate::pooled::{Connections, Open, OwnSession, on_connection, table_key, valid_table};
use tower_idempotency_core::Fingerprint;
use tower_idempotency_core::Purge;
use tower_idempotency_core::backend::within;
use tower_idempotency_core::codec;
use tower_idempotency_core::{
    Claim, DEFAULT_TIMEOUT, Decision, Found, Lease, RecordInfo, StoreError, StoreErrorKind,
    StoredResponse, decide,
};

mod claim;
mod operator;
mod sql;
mod transactional;

use self::sql::Sql;

pub use crate::pooled::{SqlTransaction, SqlTransactionConnection};
pub use transactional::{MySqlTransaction, MySqlTransactionConnection, TransactionalMySqlStore};

/// A registry in a MySQL or MariaDB table (InnoDB), shared by every replica that uses the same
/// database, and durable.
///
/// - A claim of a new key is **one statement**, an `INSERT IGNORE` of the pending
///   reservation: one round trip on a warm connection. A key with a record takes a second
///   statement, the read of that record (a replay, a pending or a conflicting claim writes
///   nothing), and the take-over of a completed record past its retention, or of an abandoned
///   reservation when the claim's [`Lease`] asks for it, a third.
/// - Complete is an `UPDATE` and release a `DELETE`, both guarded by this request's
///   reservation token.
/// - Times are the server's (milliseconds since 1970), so replicas' clocks do not matter.
///   Completed records get an `expires_at` from the [retention](Self::retention), if set, and
///   keep a tombstone for the [tombstone window](Self::tombstones) after it: a claim answers
///   expired until then and treats the record as absent after;
///   [`purge_expired`](Self::purge_expired) drops the response, then the record, in batches.
///   Pending records never expire.
/// - A request waiting for a first attempt ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait))
///   is woken at once by a change this process made, and looks again every
///   [`CHANGE_POLL_INTERVAL`](tower_idempotency_core::CHANGE_POLL_INTERVAL) for a change another replica made (MySQL has no notifications).
/// - The key and the fingerprint are stored as bytes, compared exactly: keys differing only in
///   case are different keys, whatever the database's collation. A key longer than 512 bytes
///   is kept as its SHA-256.
///
/// Every call fails with a [`StoreError`] after the [timeout](Self::timeout) (default one
/// second), so the layer fails closed while the database is away; the pool reconnects when it
/// returns.
///
/// ```no_run
/// use tower_idempotency_sqlx::MySqlStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
///
/// # On the application's pool
///
/// [`new`](Self::new) takes the application's own [`MySqlPool`], so one pool, sized once,
/// serves the application and the store; the store sets nothing on its connections and
/// bounds each call by its [timeout](Self::timeout) on the client's side. A statement the
/// store gave up on is not cancelled on the server: a claim waiting there for a row lock (a
/// transaction of the application's holding the key's record) waits up to the connection's
/// `innodb_lock_wait_timeout` (50 seconds by default), and sqlx waits for its answer before
/// the connection serves again. Give the pool's connections a short one, as the pool the
/// store makes itself does:
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::str::FromStr;
/// use tower_idempotency_sqlx::MySqlStore;
/// use tower_idempotency_sqlx::mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
///
/// let options = MySqlConnectOptions::from_str("mysql://root@127.0.0.1:3306/test")?;
/// let pool = MySqlPoolOptions::new()
///     .test_before_acquire(false)
///     .after_connect(|connection, _| {
///         use tower_idempotency_sqlx::mysql::sqlx::Executor as _;
///         Box::pin(async move {
///             connection
///                 .execute("SET SESSION innodb_lock_wait_timeout = 1, lock_wait_timeout = 1")
///                 .await
///                 .map(drop)
///         })
///     })
///     .connect_with(options)
///     .await?;
/// let store = MySqlStore::new(pool);
/// store.migrate().await?;
/// # Ok(()) }
/// ```
///
/// The store's own pool also bounds the wait for a table's metadata lock
/// (`lock_wait_timeout`, behind an `ALTER` queued after a long transaction); set it too.
///
/// sqlx pings every connection that goes back to its pool (a round trip): so a call that ends
/// well keeps its connection for the store's next call, and the store gives it back to the
/// pool once no call used it for a second; idle, the store holds none. A connection whose call
/// failed goes back at once, and one whose call timed out is closed (sqlx would wait, with no
/// bound, for the answer to the statement given up on).
///
/// A lost claim (its answer never came back) is settled after one timeout, in a transaction
/// that waits for any insert of the key still in flight: see [`Store::settle_claim`](tower_idempotency_core::Store::settle_claim). How the
/// settling knows the lost claim can no longer write after it: a claim still waiting for
/// another transaction's row lock on the key when the settling queues behind the same lock
/// was queued first, and InnoDB grants the waiting requests of one record in their order, so
/// the claim inserts first and the settling's insert then waits for it; a settling chosen as
/// a deadlock's victim is tried again. (A test rolls back such a holder while both wait,
/// over rounds: no key is left pending.)
///
/// # TLS
///
/// By URL, as MySQL's clients take it: `ssl-mode=REQUIRED` encrypts (and trusts any
/// certificate), `VERIFY_CA` also verifies the server's certificate against the trusted
/// roots, and `VERIFY_IDENTITY` its host name too; `ssl-ca=PATH` names the CA. A certificate
/// that does not verify fails the connect, with the TLS error in the [`StoreError`]'s chain.
#[derive(Clone)]
pub struct MySqlStore {
    base: Base<sqlx::MySql>,
    sql: Arc<Sql>,
    waiters: LocalWaiters,
    /// Whether the store made its pool, whose connections carry its timeout as their
    /// `innodb_lock_wait_timeout`: new options with another timeout make the pool afresh.
    own_pool: bool,
}

/// Expired records [`MySqlStore::purge_expired`] deletes in one statement at most. Each batch
/// after the first is sized to take about 20 ms: halved after a longer one (down to 100
/// records), doubled after a quick one (up to this). One that runs past the store's timeout
/// fails the purge (MySQL runs it on).
pub const PURGE_BATCH: u64 = 5_000;

/// Passes of the claim before giving up: another pass only when the record read was gone
/// (released in between) or another claim took it over first.
const CLAIM_ATTEMPTS: usize = 4;

/// The `innodb_lock_wait_timeout` of the store's own connections for its `timeout`: whole
/// seconds, at least one (InnoDB's least), at most a year.
fn lock_wait_seconds(timeout: Duration) -> u64 {
    timeout.as_secs().clamp(1, 365 * 24 * 3600)
}

/// The store's own pool of connections made with `options`, each with `timeout` (whole
/// seconds, at least one) as its `innodb_lock_wait_timeout` and `lock_wait_timeout`. No ping
/// before each use (a round trip more on every call), and no acquire timeout of the pool's own
/// beyond sqlx's: each call is bounded by the store's timeout.
fn own_pool(options: MySqlConnectOptions, timeout: Duration) -> MySqlPool {
    let seconds = lock_wait_seconds(timeout);
    MySqlPoolOptions::new()
        .test_before_acquire(false)
        .after_connect(move |connection, _| {
            Box::pin(async move {
                connection
                    .execute(AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {seconds}, \
                         lock_wait_timeout = {seconds}"
                    )))
                    .await
                    .map(drop)
            })
        })
        .connect_lazy_with(options)
}

/// A driver's error as the store's: a pool that had no connection in time, or a row lock not
/// had in time (1205), is a timeout; a value that cannot be read is corrupt; anything else
/// unavailable.
pub(super) fn unavailable(error: sqlx::Error) -> StoreError {
    let kind = match &error {
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Database(database) if database.code().as_deref() == Some("HY000") => {
            match database.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                Some(mysql) if mysql.number() == 1205 => StoreErrorKind::Timeout,
                _ => StoreErrorKind::Unavailable,
            }
        }
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::with_source(kind, error)
}

/// A value the database sent that is not what the table holds.
fn corrupt(error: sqlx::Error) -> StoreError {
    StoreError::with_source(StoreErrorKind::Corrupt, error)
}

/// Attempts of [`MySqlStore::migrate`] at adding a column whose table's metadata lock stays
/// held, each waiting [`MIGRATE_LOCK_WAIT`] for it: about half a minute in all.
const MIGRATE_ATTEMPTS: usize = 20;

/// How long an attempt of [`MySqlStore::migrate`] at adding a column waits for the table's
/// metadata lock (`lock_wait_timeout`, whole seconds).
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(1);

impl MySqlStore {
    /// The default table name.
    pub const DEFAULT_TABLE: &'static str = "idempotency_records";

    /// A store on the application's own pool: it shares the pool's connections and leaves
    /// their session state alone (see [On the application's pool](Self#on-the-applications-pool)).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency_sqlx::MySqlStore;
    /// use tower_idempotency_sqlx::mysql::sqlx::MySqlPool;
    ///
    /// let pool = MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
    /// let store = MySqlStore::new(pool);
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            base: Base::new(pool),
            sql: Arc::new(Sql::new(Self::DEFAULT_TABLE)),
            waiters: LocalWaiters::default(),
            own_pool: false,
        }
    }

    /// A store on a pool of its own, of connections to `url` (`mysql://user:password@host:
    /// port/database`, with `?ssl-mode=…` for TLS, see [TLS](Self#tls)).
    ///
    /// Connects once to check the database can be reached (and its certificate verifies).
    /// The pool holds at most sqlx's default of 10 connections, made as needed; each gets the
    /// store's timeout (in whole seconds, at least one) as its `innodb_lock_wait_timeout`.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] if the URL is invalid; a [`StoreError`] if the
    /// database cannot be reached within the timeout, or refuses.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| StoreError::with_source(StoreErrorKind::InvalidConfig, e))?;
        Self::connect_with(options).await
    }

    /// [`connect`](Self::connect) with sqlx's connect options.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(options: MySqlConnectOptions) -> Result<Self, StoreError> {
        // A connection of its own, not the pool's: the pool tries a refused address again
        // until the call's timeout, and would say only that it timed out.
        let connection = within(DEFAULT_TIMEOUT.max(Duration::from_secs(5)), async {
            MySqlConnection::connect_with(&options)
                .await
                .map_err(unavailable)
        })
        .await?;
        drop(connection.close().await);
        Ok(Self::connect_lazy_with(options))
    }

    /// A store on a pool of its own that connects on first use.
    pub fn connect_lazy_with(options: MySqlConnectOptions) -> Self {
        Self {
            own_pool: true,
            ..Self::new(own_pool(options, DEFAULT_TIMEOUT))
        }
    }

    /// Makes the store's own pool afresh, its connections carrying `timeout`.
    fn remake_pools(&mut self, timeout: Duration) {
        let connect = (*self.pool().connect_options()).clone();
        self.base.connections = Connections::new(own_pool(connect, timeout));
    }

    options_methods!(
        MySqlStore,
        "On the store's own pool ([`connect`](Self::connect)) the timeout is also every \
         connection's `innodb_lock_wait_timeout` (whole seconds, at least one).",
        "On the store's own pool it is also the connections' `innodb_lock_wait_timeout` (see \
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
        Ok(self)
    }

    /// The DDL that makes the table `table` and its expiry index, for the migration tool you
    /// run yourself (sqlx-migrate, refinery, Flyway, Atlas): what [`migrate`](Self::migrate)
    /// makes on a new database. For the default table it is the files
    /// `migrations/mysql/0001_idempotency_records.sql` and
    /// `0002_tombstones.sql` shipped with the crate, one after the other (less their comments).
    ///
    /// ```
    /// # #[cfg(feature = "mysql")] {
    /// use tower_idempotency_sqlx::MySqlStore;
    ///
    /// let ddl = MySqlStore::schema("label_idempotency").unwrap();
    /// assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS `label_idempotency`"));
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

    /// Creates the table and its expiry index if the table does not exist. Idempotent, and
    /// safe to run from several replicas at once; a start with the table in place only reads
    /// the catalog, so it waits for no open transaction and no claim waits for it.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be reached or refuses (the right to create
    /// tables, say).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // Making a connection may take longer than a short store timeout (TLS, a loaded
        // server): at least a second and a half.
        let timeout = self.base.timeout().max(Duration::from_millis(1_500));
        on_connection(&self.base.connections, timeout, async |connection| {
            let present: i64 = sqlx::query_scalar(self.sql.exists.clone())
                .fetch_one(&mut *connection)
                .await
                .map_err(unavailable)?;
            if present == 0 {
                connection
                    .execute(self.sql.create.clone())
                    .await
                    .map_err(unavailable)?;
            }
            Ok(())
        })
        .await?;
        for (column, add) in &self.sql.later_columns {
            self.add_column(column, add, timeout).await?;
        }
        Ok(())
    }

    /// Adds `column` (by `add`) if the table lacks it (MySQL has no `ADD COLUMN IF NOT
    /// EXISTS`; an addition that fails because another replica's made it since the look is
    /// done). On a session of its own whose wait for the table's metadata lock is a second:
    /// claims queue behind a waiting `ALTER TABLE`, so no longer than that, and behind a
    /// transaction open on the table (the transactional store holds one for every create) it
    /// is tried again, with pauses growing to a second, [`MIGRATE_ATTEMPTS`] times.
    async fn add_column(
        &self,
        column: &str,
        add: &sqlx::SqlStr,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let mut pause = Duration::from_millis(100);
        for _ in 0..MIGRATE_ATTEMPTS {
            let mut session = OwnSession::take(&self.base.connections, timeout).await?;
            let added = within(timeout + MIGRATE_LOCK_WAIT, async {
                let connection = session.connection();
                if self.has_column(connection, column).await? {
                    return Ok(true);
                }
                sqlx::raw_sql(AssertSqlSafe("SET SESSION lock_wait_timeout = 1"))
                    .execute(&mut *connection)
                    .await
                    .map_err(unavailable)?;
                match connection.execute(add.clone()).await {
                    Ok(_) => Ok(true),
                    Err(_) if self.has_column(connection, column).await? => Ok(true),
                    // ER_LOCK_WAIT_TIMEOUT: the metadata lock was held all the while.
                    Err(error) if transactional::error_number(&error) == Some(1205) => Ok(false),
                    Err(error) => Err(unavailable(error)),
                }
            })
            .await;
            match added {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(error) if error.kind() == StoreErrorKind::Timeout => {}
                Err(error) => return Err(error),
            }
            drop(session);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        Err(StoreError::with_source(
            StoreErrorKind::Timeout,
            format!("the table's metadata lock stayed held: {column} not added"),
        ))
    }

    /// Whether the table has `column`.
    async fn has_column(
        &self,
        connection: &mut MySqlConnection,
        column: &str,
    ) -> Result<bool, StoreError> {
        let columns: Vec<Vec<u8>> = sqlx::query_scalar(self.sql.columns.clone())
            .fetch_all(connection)
            .await
            .map_err(unavailable)?;
        Ok(columns
            .iter()
            .any(|name| name.eq_ignore_ascii_case(column.as_bytes())))
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)), for metrics and tests.
    pub fn waited_keys(&self) -> usize {
        self.waiters.len()
    }

    /// The pool the store runs on: the application's, or its own.
    pub fn pool(&self) -> &MySqlPool {
        self.base.connections.pool()
    }

    /// The table the store uses.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Runs one statement on a pooled connection, bounded by the timeout, and returns the
    /// rows it matched.
    async fn execute(&self, query: Query<'_>) -> Rows {
        let execute = async |connection: &mut MySqlConnection| query.execute(connection).await;
        Ok(self.base.call(unavailable, execute).await?.rows_affected())
    }

    /// Runs one statement that returns at most one row, bounded by the timeout.
    async fn fetch_optional(&self, query: Query<'_>) -> Result<Option<MySqlRow>, StoreError> {
        let fetch = async |connection: &mut MySqlConnection| query.fetch_optional(connection).await;
        self.base.call(unavailable, fetch).await
    }
}

/// A statement with its parameters bound.
type Query<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.base.debug(f, "MySqlStore", &self.sql.table)
    }
}

/// Records past their replay window and within their tombstone's become tombstones (their
/// response dropped, counted as purged); records past both, or with no tombstone, are
/// deleted. In batches of at most [`PURGE_BATCH`] records, oldest first by the expiry index,
/// each batch two statements (the tombstones, then the deletions) on its first records, each
/// statement well within the store's timeout, until none is left. So it finishes at any
/// backlog. The batches run on a connection of the purge's own, at `READ COMMITTED`: they lock
/// the records they delete and no gap, so a claim beside them, whose new row has no expiry
/// yet, is not held up even by a batch that waits for a row. Between batches the purge pauses
/// four times a batch's time, so that it takes about a fifth of the database's time. The
/// connection is closed after the purge, its isolation with it. With binary logging on, that
/// isolation needs `binlog_format` `ROW` or `MIXED` (the defaults); under `STATEMENT` the
/// server refuses the batches. One replica's purger is enough.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// use std::time::Duration;
/// use tower_idempotency_sqlx::MySqlStore;
/// use tower_idempotency_core::Purge;
///
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// let purger = store.purge_every(Duration::from_secs(3600))?;
/// // … serve; the purger stops when dropped.
/// # drop(purger);
/// # Ok(()) }
/// ```
impl Purge for MySqlStore {
    async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        // A session of the purge's own, reading committed rows: at `REPEATABLE READ` a batch's
        // scan locks the gap before its first record too, where the rows of new claims go (no
        // expiry yet sorts first), and held every claim until the batch ended. The session
        // is closed after the purge, so its isolation reaches no other call and no other user
        // of the pool.
        let timeout = self.base.timeout();
        let mut session = OwnSession::take(&self.base.connections, timeout).await?;
        let read_committed = sqlx::raw_sql(AssertSqlSafe(
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ));
        within(timeout, async {
            read_committed
                .execute(session.connection())
                .await
                .map_err(unavailable)
        })
        .await?;
        // A batch past the timeout fails the purge, unlike on the other stores (`paced`):
        // MySQL goes on with a statement whose client gave up, holding its rows, so a smaller
        // batch sent after it would wait for them and time out in turn.
        let mut pacing = Pacing::new(PURGE_BATCH);
        loop {
            let asked = pacing.batch();
            let batch = i64::try_from(asked).unwrap_or(i64::MAX);
            let started = std::time::Instant::now();
            // Its tombstones first, then its deletions (see `Sql::bury`).
            let mut changed = 0;
            for statement in [&self.sql.bury, &self.sql.purge] {
                let step = sqlx::query(statement.clone()).bind(batch);
                changed += within(timeout, async {
                    step.execute(session.connection())
                        .await
                        .map_err(unavailable)
                })
                .await?
                .rows_affected();
            }
            *purged += changed;
            if changed < asked {
                return Ok(());
            }
            // The claims beside it get four times the batch's time (see `Pacing`).
            tokio::time::sleep(pacing.pause(started.elapsed())).await;
        }
    }
}

/// `complete` (the statement that completes a record, or resolves it) with `completion`'s
/// values bound, up to the key: the response, the retention, the tombstone and how long it is
/// kept.
pub(super) fn bind_completion<'q>(
    complete: Query<'q>,
    completion: &'q Completion,
    retention_ms: i64,
) -> Query<'q> {
    complete
        .bind(&completion.response[..])
        .bind(retention_ms)
        .bind(retention_ms)
        .bind(completion.tombstone())
        .bind(completion.tombstone_ms)
        .bind(completion.tombstone_ms)
}

sql_store!(MySqlStore);

impl Dialect for MySqlStore {
    fn store_options(&self) -> &tower_idempotency_core::StoreOptions {
        &self.base.options
    }

    async fn claim(&self, claiming: Claiming<'_>) -> Result<Claim, StoreError> {
        let claim =
            async |connection: &mut MySqlConnection| self.claim_on(connection, claiming).await;
        on_connection(&self.base.connections, self.base.timeout(), claim).await
    }

    async fn renew_rows(&self, key: &str, token: &Token, lease: Duration) -> Rows {
        let renew = sqlx::query(self.sql.renew.clone())
            .bind(millis(lease))
            .bind(&*table_key(key))
            .bind(&token[..]);
        self.execute(renew).await
    }

    async fn complete_rows(
        &self,
        key: &str,
        token: Option<&Token>,
        completion: &Completion,
    ) -> Rows {
        let statement = match token {
            Some(_) => &self.sql.complete,
            None => &self.sql.resolve,
        };
        let complete = bind_completion(
            sqlx::query(statement.clone()),
            completion,
            self.base.retention_ms(),
        )
        .bind(&*table_key(key));
        let complete = match token {
            Some(token) => complete.bind(&token[..]),
            None => complete,
        };
        self.execute(complete).await
    }

    async fn release_rows(&self, key: &str, token: &Token) -> Rows {
        let release = sqlx::query(self.sql.release.clone())
            .bind(&*table_key(key))
            .bind(&token[..]);
        self.execute(release).await
    }

    async fn forget_rows(&self, key: &str) -> Rows {
        let forget = sqlx::query(self.sql.forget.clone()).bind(&*table_key(key));
        self.execute(forget).await
    }

    /// A lost claim may still be in flight on another pooled connection, so a plain release
    /// could run first and find nothing. After one timeout (by then the lost claim has run,
    /// unless a row lock held it), in one transaction this inserts the key (which waits for
    /// any insert of it in flight, then does nothing if one committed) and deletes it under
    /// the reservation: the lost claim's row, or this one's, never visible to anyone.
    async fn settle(&self, claiming: Claiming<'_>) -> Result<(), StoreError> {
        let stored = &*table_key(claiming.key);
        let token = crate::dialect::token(&claiming.reservation);
        let timeout = self.base.timeout();
        tokio::time::sleep(timeout).await;
        within(timeout, async {
            let mut transaction = Open::begin(self.pool(), None, None).await?;
            sqlx::query(self.sql.hold.clone())
                .bind(stored)
                .bind(claiming.fingerprint.to_hex().as_str())
                .bind(&token[..])
                .execute(&mut *transaction)
                .await
                .map_err(unavailable)?;
            sqlx::query(self.sql.release.clone())
                .bind(stored)
                .bind(&token[..])
                .execute(&mut *transaction)
                .await
                .map_err(unavailable)?;
            transaction.commit().await.map_err(unavailable)
        })
        .await?;
        Dialect::wake(self, claiming.key);
        Ok(())
    }

    fn local_waiters(&self) -> Option<&LocalWaiters> {
        Some(&self.waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migration files shipped for the default table make what `schema` gives: the
    /// first its table less the later columns, the second those columns.
    #[test]
    fn the_shipped_migration_is_the_schema_of_the_default_table() {
        let first = include_str!("../../migrations/mysql/0001_idempotency_records.sql");
        let later = include_str!("../../migrations/mysql/0002_tombstones.sql");
        let body: String = first
            .lines()
            .filter(|line| !line.starts_with("--"))
            .map(|line| format!("{line}\n"))
            .collect();
        let schema = MySqlStore::schema(MySqlStore::DEFAULT_TABLE).unwrap();
        let mut without = schema.clone();
        for (column, kind) in sql::LATER_COLUMNS {
            let line = format!("    {column} {kind},\n");
            assert!(schema.contains(&line), "{line}");
            without = without.replace(&line, "");
            assert!(
                later.contains(&format!("ADD COLUMN {column} {kind};")),
                "{column}"
            );
        }
        assert_eq!(body, without);
        assert_eq!(
            MySqlStore::schema("bad`name").unwrap_err().kind(),
            StoreErrorKind::InvalidConfig
        );
    }

    /// InnoDB's lock wait is whole seconds, at least one.
    #[test]
    fn the_lock_wait_is_whole_seconds_from_one() {
        assert_eq!(lock_wait_seconds(Duration::from_millis(100)), 1);
        assert_eq!(lock_wait_seconds(Duration::from_millis(2_500)), 2);
        assert_eq!(lock_wait_seconds(Duration::MAX), 365 * 24 * 3600);
    }
}
