//! Opening a SQLite store on a file: its own pool, WAL mode, the table made if missing.

use super::*;

/// How long opening the file tries again while another process holds its lock.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Puts the file in WAL mode and creates the table and its index, each only if it is not
/// done already (a file in use by other processes then takes no write lock to open).
async fn prepare(connection: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    // WAL lets readers go on while one process writes; a file system that cannot hold it
    // keeps the rollback journal, still correct.
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *connection)
        .await?;
    if !mode.eq_ignore_ascii_case("wal") {
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut *connection)
            .await?;
    }
    make_table(connection).await
}

/// The table, its expiry index and its columns of later releases, each made only if missing:
/// a file that has them all takes no write lock.
pub(super) async fn make_table(connection: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    if present(connection).await? < 2 {
        connection.execute(SqliteStore::SCHEMA).await?;
    }
    for (column, add) in LATER_COLUMNS {
        if !has_column(connection, column).await? {
            // Another process may have added it since the look: then it is there.
            if let Err(error) = connection.execute(add).await
                && !has_column(connection, column).await?
            {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// Whether the table has `column`.
async fn has_column(connection: &mut SqliteConnection, column: &str) -> Result<bool, sqlx::Error> {
    let found: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pragma_table_info('idempotency_records') WHERE name = ?1",
    )
    .bind(column)
    .fetch_one(connection)
    .await?;
    Ok(found > 0)
}

/// The columns of later releases, each with the statement that adds it (the shipped migration
/// `0002_tombstones.sql`, a statement a line).
pub(super) const LATER_COLUMNS: [(&str, &str); 2] = [
    (
        "tombstone",
        "ALTER TABLE idempotency_records ADD COLUMN tombstone BLOB;",
    ),
    (
        "tombstone_until",
        "ALTER TABLE idempotency_records ADD COLUMN tombstone_until INTEGER;",
    ),
];

/// How many of the table and its expiry index the file holds.
pub(super) async fn present(connection: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE (type = 'table' \
         AND name = 'idempotency_records') OR (type = 'index' \
         AND name = 'idempotency_records_expires_at')",
    )
    .fetch_one(connection)
    .await
}

/// Checks the file holds a store's table, changing nothing: not a store's file is an
/// `InvalidConfig` error.
async fn existing(connection: &mut SqliteConnection) -> Result<(), StoreError> {
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
         AND name = 'idempotency_records'",
    )
    .fetch_one(connection)
    .await
    .map_err(unavailable)?;
    if tables == 1 {
        Ok(())
    } else {
        Err(StoreError::with_source(
            StoreErrorKind::InvalidConfig,
            "the file holds no idempotency_records table: not a store's",
        ))
    }
}

/// `busy_timeout`'s milliseconds: SQLite takes an `i32`.
pub(super) fn busy_millis(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).map_or(i32::MAX as u64, |ms| ms.min(i32::MAX as u64))
}

impl SqliteStore {
    /// The DDL of the store's table with every column and its expiry index, safe to run
    /// again: what [`open`](Self::open) and [`migrate`](Self::migrate) make on a new file. For
    /// a migration tool that runs each file once, the crate ships the same as
    /// `migrations/sqlite/0001_idempotency_records.sql` (the table as the first release made
    /// it) and `0002_tombstones.sql` (its later columns, which `open` and `migrate` add to a
    /// table made before).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use tower_idempotency_sqlx::SqliteStore;
    ///
    /// assert!(SqliteStore::SCHEMA.contains("CREATE TABLE IF NOT EXISTS idempotency_records"));
    /// # }
    /// ```
    pub const SCHEMA: &'static str = "\
CREATE TABLE IF NOT EXISTS idempotency_records (
    key TEXT PRIMARY KEY NOT NULL,
    fingerprint TEXT NOT NULL,
    token BLOB,
    response BLOB,
    lease_until INTEGER,
    take_over INTEGER NOT NULL DEFAULT 0,
    changed_at INTEGER NOT NULL,
    expires_at INTEGER,
    tombstone BLOB,
    tombstone_until INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at
    ON idempotency_records (expires_at) WHERE expires_at IS NOT NULL;
";

    /// Opens (or creates) the store in the file at `path`, in WAL mode with
    /// `synchronous = FULL`, and creates its table if it is missing. The store's own pool
    /// holds one connection: this process's calls take their turns on it, in order, and the
    /// processes of the host take turns at the file's write lock.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] if the file cannot be opened; a [`StoreError`] if it
    /// cannot be read or written.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path.as_ref())
            .create_if_missing(true);
        Self::connect_with(options).await
    }

    /// [`open`](Self::open) by URL: `sqlite://path/to/file.db` (`sqlite:` and sqlx's query
    /// parameters as [`SqliteConnectOptions`] reads them); the file is made if missing.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] for a URL sqlx refuses; otherwise as
    /// [`open`](Self::open).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store = tower_idempotency_sqlx::SqliteStore::connect("sqlite://keys.db").await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::with_source(StoreErrorKind::InvalidConfig, e))?
            .create_if_missing(true);
        Self::connect_with(options).await
    }

    /// [`open`](Self::open) with sqlx's connect options, as they are but for
    /// `synchronous = FULL`, the store's `busy_timeout` and WAL mode: the file is put in WAL
    /// mode, and its table made if missing.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn connect_with(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        Self::open_with(options, true).await
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
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store = tower_idempotency_sqlx::SqliteStore::open_existing("/var/lib/app/keys.db").await?;
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
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false);
        Self::open_with(options, false).await
    }

    async fn open_with(
        options: SqliteConnectOptions,
        prepare_file: bool,
    ) -> Result<Self, StoreError> {
        let options = options
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(DEFAULT_TIMEOUT)
            .thread_name(|id| format!("tower-idempotency-sqlite-{id}"));
        // The file is prepared on a connection of its own, closed after: the pool's own are
        // made on first use, with the timeout set by then.
        let mut connection = SqliteConnection::connect_with(&options)
            .await
            .map_err(not_opened)?;
        let prepared = if prepare_file {
            // Another process's writes may hold the file's lock, and SQLite answers "busy" at
            // once in some of those cases: opening tries again for a while, since a store
            // that fails to open fails its server.
            let started = std::time::Instant::now();
            loop {
                match prepare(&mut connection).await {
                    Err(error) if busy(&error) && started.elapsed() < OPEN_TIMEOUT => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    other => break other.map_err(unavailable),
                }
            }
        } else {
            existing(&mut connection).await
        };
        drop(connection.close().await);
        prepared?;
        let (writes, reads) = own_pools(&options, DEFAULT_TIMEOUT);
        let mut store = Self::new(writes.pool().clone());
        store.base.connections = writes;
        store.reads = reads;
        store.own_pool = true;
        Ok(store)
    }
}

/// The store's own pools on the file of `options`, their connections made on first use with
/// `timeout` as their `busy_timeout`: the writes on one connection (this process's writes in
/// order, without polling each other for the write lock), the reads on a few more, beside it
/// (WAL). No ping before each use (a round trip more on every call), and no acquire timeout of
/// the pool's own beyond sqlx's: each call is bounded by the store's timeout.
pub(super) fn own_pools(
    options: &SqliteConnectOptions,
    timeout: Duration,
) -> (Connections<Sqlite>, Connections<Sqlite>) {
    let options = options
        .clone()
        .busy_timeout(Duration::from_millis(busy_millis(timeout)));
    let pool = |connections: u32| {
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        Connections::new(pool)
    };
    (pool(1), pool(READERS))
}
