//! What the stores on a sqlx pool of a server (PostgreSQL, MySQL) share: how a connection is
//! had, and the key as their tables hold it.

use std::borrow::Cow;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{StoreError, StoreErrorKind};

/// The longest key kept as it is, in bytes. An index row holds a few thousand bytes at most
/// (about 2,700 in a PostgreSQL btree, 3,072 in InnoDB), so a longer key is kept as `sha256:`
/// and its digest: any key a request can carry works.
pub(crate) const MAX_KEY_BYTES: usize = 512;

/// The key as the table holds it: itself, or the digest of a long one. A digest form never
/// equals a key the layer makes (those start with a method or a scope's length).
pub(crate) fn table_key(key: &str) -> Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES {
        Cow::Borrowed(key)
    } else {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        Cow::Owned(format!("sha256:{}", hex::encode(digest)))
    }
}

/// The longest a connection is waited for in a task of its own ([`acquire`]).
const DETACHED_ACQUIRE: Duration = Duration::from_secs(5);

/// A connection of `pool`. When none is idle the pool makes one, in a task of its own: a
/// caller that gives up (its timeout) then leaves the connection to the pool rather than
/// throwing it away half made. Under a timeout shorter than a connection takes to make
/// (TLS, a loaded server), every call would throw its one away, and the pool, emptied by an
/// outage, would never fill again.
pub(crate) async fn acquire<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, StoreError> {
    let unavailable = |error: sqlx::Error| match error {
        sqlx::Error::PoolTimedOut => StoreError::with_source(StoreErrorKind::Timeout, error),
        error => StoreError::with_source(StoreErrorKind::Unavailable, error),
    };
    if pool.num_idle() > 0 {
        return pool.acquire().await.map_err(unavailable);
    }
    let pool = pool.clone();
    // Bounded, so that callers that gave up during an outage leave no queue of waiting
    // tasks ahead of later ones for longer than this.
    tokio::spawn(async move {
        tokio::time::timeout(DETACHED_ACQUIRE, pool.acquire())
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    })
    .await
    .map_err(|error| StoreError::with_source(StoreErrorKind::Unavailable, error))?
    .map_err(unavailable)
}

/// Refuses a table name that is not letters, digits and `_`, not starting with a digit, at
/// most 48 characters: it is written into the statements.
pub(crate) fn valid_table(name: &str) -> Result<(), StoreError> {
    let valid = !name.is_empty()
        && name.len() <= 48
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::with_source(
            StoreErrorKind::InvalidConfig,
            format!(
                "table {name:?}: letters, digits and _, not starting with a digit, at most 48 \
                 characters"
            ),
        ))
    }
}

/// The slot of a claim's open transaction: empty once the layer took it to commit or roll
/// back.
#[cfg(any(feature = "postgres", feature = "mysql"))]
type Slot<DB> = Option<Open<DB>>;

/// A pooled connection inside a transaction a transactional store began: ended by the store
/// (committed or rolled back, then its session `reset`), or closed. A connection whose
/// transaction the store did not end (its claim cancelled, a commit or rollback failed or
/// timed out) never goes back to the pool: its session may still hold the transaction, its
/// locks or its settings, and an answer sqlx would wait for before its next use. The server
/// rolls back what the closed session left open.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct Open<DB: sqlx::Database> {
    connection: sqlx::pool::PoolConnection<DB>,
    /// What puts the session back as the pool hands it out, after the transaction.
    reset: Option<&'static str>,
    ended: bool,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> Drop for Open<DB> {
    fn drop(&mut self) {
        if !self.ended {
            self.connection.close_on_drop();
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::ops::Deref for Open<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.connection
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::ops::DerefMut for Open<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.connection
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> Open<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Begins a transaction with `statement` (sqlx's `BEGIN` if `None`) on a connection of
    /// `pool`, `reset` to run after it ends. The connection is waited for in the caller's
    /// future, the begin runs in a task of its own: a begin cancelled halfway closes its
    /// connection there, never leaving it in the pool inside a transaction.
    pub(crate) async fn begin(
        pool: &sqlx::Pool<DB>,
        statement: Option<sqlx::SqlStr>,
        reset: Option<&'static str>,
    ) -> Result<Self, StoreError> {
        use sqlx_core::transaction::TransactionManager as _;
        let connection = acquire(pool).await?;
        tokio::spawn(async move {
            let mut open = Self {
                connection,
                reset,
                ended: false,
            };
            DB::TransactionManager::begin(&mut open.connection, statement)
                .await
                .map(|()| open)
        })
        .await
        .map_err(|error| StoreError::with_source(StoreErrorKind::Unavailable, error))?
        .map_err(|error| StoreError::with_source(StoreErrorKind::Unavailable, error))
    }

    /// Commits, then resets the session; the connection goes back to the pool.
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.commit_only().await?;
        self.reset().await
    }

    /// Rolls back, then resets the session; the connection goes back to the pool.
    pub(crate) async fn rollback(mut self) -> Result<(), sqlx::Error> {
        use sqlx_core::transaction::TransactionManager as _;
        DB::TransactionManager::rollback(&mut self.connection).await?;
        self.reset().await
    }

    /// Commits, the session not reset yet: the commit's own answer.
    pub(crate) async fn commit_only(&mut self) -> Result<(), sqlx::Error> {
        use sqlx_core::transaction::TransactionManager as _;
        DB::TransactionManager::commit(&mut self.connection).await
    }

    /// Resets the session of a transaction ended; the connection goes back to the pool (if
    /// the reset fails, or is given up on, it is closed).
    pub(crate) async fn reset(mut self) -> Result<(), sqlx::Error> {
        if let Some(reset) = self.reset {
            sqlx::raw_sql(reset).execute(&mut *self.connection).await?;
        }
        self.ended = true;
        Ok(())
    }
}

/// The transaction of a new claim of a transactional store ([`TransactionalPostgresStore`],
/// [`TransactionalMySqlStore`]), in the inner service's request extensions: the create's own
/// writes go through it, and commit with its stored response, or not at all. Named by its
/// database: [`PgTransaction`], [`MySqlTransaction`].
///
/// [`acquire`](Self::acquire) gives the transaction's connection, a `&mut` sqlx connection
/// for any sqlx call (`sqlx::query(…).execute(&mut *connection)`, `query_as`, `query!`).
/// Cloning it shares the one transaction; one holder at a time has the connection. Once the
/// layer commits or rolls it back, `acquire` fails with
/// [`StoreErrorKind::ReservationLost`].
///
/// With axum, take it as `axum::Extension<PgTransaction>` (or `MySqlTransaction`).
///
/// [`TransactionalPostgresStore`]: crate::store::TransactionalPostgresStore
/// [`TransactionalMySqlStore`]: crate::store::TransactionalMySqlStore
/// [`PgTransaction`]: crate::store::PgTransaction
/// [`MySqlTransaction`]: crate::store::MySqlTransaction
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub struct SqlTransaction<DB: sqlx::Database> {
    slot: std::sync::Arc<tokio::sync::Mutex<Slot<DB>>>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> Clone for SqlTransaction<DB> {
    fn clone(&self) -> Self {
        Self {
            slot: std::sync::Arc::clone(&self.slot),
        }
    }
}

/// The connection of a claim's open transaction, while a create holds it
/// ([`SqlTransaction::acquire`]): it dereferences to sqlx's connection of its database
/// (`PgConnection`, `MySqlConnection`), so `&mut *connection` is an executor of every sqlx
/// query. Drop it before the create answers: the layer's complete waits for it, up to the
/// store's timeout.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub struct SqlTransactionConnection<DB: sqlx::Database>(
    tokio::sync::OwnedMappedMutexGuard<Slot<DB>, DB::Connection>,
);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::ops::Deref for SqlTransactionConnection<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.0
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::ops::DerefMut for SqlTransactionConnection<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.0
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::fmt::Debug for SqlTransactionConnection<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransactionConnection")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> std::fmt::Debug for SqlTransaction<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransaction")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> SqlTransaction<DB> {
    pub(crate) fn new(transaction: Open<DB>) -> Self {
        Self {
            slot: std::sync::Arc::new(tokio::sync::Mutex::new(Some(transaction))),
        }
    }

    /// The transaction's connection, for the create's statements; waits while another holder
    /// of the same transaction has it.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn create(transaction: tower_idempotency::store::PgTransaction) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::store::postgres::sqlx;
    ///
    /// let mut connection = transaction.acquire().await?;
    /// let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM labels")
    ///     .fetch_one(&mut *connection)
    ///     .await?;
    /// # let _ = count; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] once the layer committed or rolled the transaction
    /// back.
    pub async fn acquire(&self) -> Result<SqlTransactionConnection<DB>, StoreError> {
        let slot = std::sync::Arc::clone(&self.slot).lock_owned().await;
        tokio::sync::OwnedMutexGuard::try_map(slot, |slot| slot.as_deref_mut())
            .map(SqlTransactionConnection)
            .map_err(|_| StoreError::new(StoreErrorKind::ReservationLost))
    }

    /// The transaction, taken out: nobody can use it after this. Waits, up to `timeout`, for a
    /// holder of its connection (a task the create spawned).
    pub(crate) async fn take(&self, timeout: Duration) -> Slot<DB> {
        tokio::time::timeout(timeout, self.slot.lock())
            .await
            .ok()?
            .take()
    }
}

/// Rolls `transaction` back within `timeout`; past it, or on an error, its connection is
/// closed, which ends the transaction on the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn roll_back<DB: sqlx::Database>(transaction: Open<DB>, timeout: Duration)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    if let Err(error) = super::within(timeout, async {
        transaction
            .rollback()
            .await
            .map_err(|error| StoreError::with_source(StoreErrorKind::Unavailable, error))
    })
    .await
    {
        tracing::warn!(
            error = &error as &dyn std::error::Error,
            "rollback failed; the connection is closed, which ends its transaction"
        );
    }
}

/// The open transaction of each new claim in flight of a transactional store, by reservation;
/// never locked across an `.await`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct OpenTransactions<DB: sqlx::Database>(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u128, SqlTransaction<DB>>>>,
);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> Clone for OpenTransactions<DB> {
    fn clone(&self) -> Self {
        Self(std::sync::Arc::clone(&self.0))
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> Default for OpenTransactions<DB> {
    fn default() -> Self {
        Self(std::sync::Arc::default())
    }
}

/// The error of a complete that did not commit: nothing of the create may have happened.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn uncommitted(source: Option<StoreError>) -> StoreError {
    match source {
        Some(source) => StoreError::with_source(StoreErrorKind::Uncommitted, source),
        None => StoreError::new(StoreErrorKind::Uncommitted),
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> OpenTransactions<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u128, SqlTransaction<DB>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Transactions open now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Keeps `transaction` open as `reservation`'s.
    pub(crate) fn insert(&self, reservation: &super::Reservation, transaction: Open<DB>) {
        self.lock()
            .insert(reservation.as_u128(), SqlTransaction::new(transaction));
    }

    /// A reservation's renewal: nothing to renew while its transaction is open (it holds the
    /// key for as long as the create runs); [`StoreErrorKind::ReservationLost`] once ended.
    pub(crate) fn renew(&self, reservation: &super::Reservation) -> Result<(), StoreError> {
        if self.lock().contains_key(&reservation.as_u128()) {
            Ok(())
        } else {
            Err(StoreError::new(StoreErrorKind::ReservationLost))
        }
    }

    /// A reservation's release: its transaction rolled back, the key free as before the claim;
    /// [`StoreErrorKind::ReservationLost`] if it had ended.
    pub(crate) async fn release(
        &self,
        reservation: &super::Reservation,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        if self.roll_back(reservation, timeout).await {
            Ok(())
        } else {
            Err(StoreError::new(StoreErrorKind::ReservationLost))
        }
    }

    /// Puts `reservation`'s transaction, if open, in `extensions` for the create.
    pub(crate) fn attach(
        &self,
        reservation: &super::Reservation,
        extensions: &mut http::Extensions,
    ) {
        if let Some(transaction) = self.lock().get(&reservation.as_u128()) {
            extensions.insert(transaction.clone());
        }
    }

    /// The open transaction of `reservation`, no longer open to anyone else.
    fn remove(&self, reservation: &super::Reservation) -> Option<SqlTransaction<DB>> {
        self.lock().remove(&reservation.as_u128())
    }

    /// Rolls back the transaction of `reservation`, if open; whether it was.
    pub(crate) async fn roll_back(
        &self,
        reservation: &super::Reservation,
        timeout: Duration,
    ) -> bool {
        let Some(transaction) = self.remove(reservation) else {
            return false;
        };
        if let Some(transaction) = transaction.take(timeout).await {
            roll_back(transaction, timeout).await;
        }
        true
    }

    /// Runs `complete` (the statement that stores the response; the rows it changed) in the
    /// transaction of `reservation` and commits: the record, the create's writes and the
    /// response together. Anything but one row changed and a commit is
    /// [`StoreErrorKind::Uncommitted`], the transaction rolled back.
    pub(crate) async fn complete(
        &self,
        reservation: &super::Reservation,
        timeout: Duration,
        complete: impl AsyncFnOnce(&mut DB::Connection) -> Result<u64, sqlx::Error>,
    ) -> Result<(), StoreError> {
        let unavailable = |error| StoreError::with_source(StoreErrorKind::Unavailable, error);
        // No open transaction (never claimed here, or ended): nothing to commit.
        let transaction = self.remove(reservation).ok_or_else(|| uncommitted(None))?;
        let mut transaction = transaction
            .take(timeout)
            .await
            .ok_or_else(|| uncommitted(None))?;
        let updated = super::within(timeout, async {
            complete(&mut transaction).await.map_err(unavailable)
        })
        .await;
        match updated {
            Ok(1) => {}
            Ok(_) => {
                roll_back(transaction, timeout).await;
                return Err(uncommitted(None));
            }
            Err(error) => {
                roll_back(transaction, timeout).await;
                return Err(uncommitted(Some(error)));
            }
        }
        super::within(timeout, async {
            transaction.commit_only().await.map_err(unavailable)
        })
        .await
        .map_err(|error| uncommitted(Some(error)))?;
        // Committed: the answer stands whatever becomes of the session's reset (a connection
        // not reset in time is closed).
        let _ = super::within(timeout, async {
            transaction.reset().await.map_err(unavailable)
        })
        .await;
        Ok(())
    }
}

/// How often a call waiting for a connection while every one is the store's looks at the
/// pool again (a connection a failed call gave back goes there).
const SATURATED_POLL: Duration = Duration::from_millis(5);

/// The length of the line of waiting calls past which those that stopped waiting are dropped
/// from it.
const WAITING_SWEEP: usize = 64;

/// The least time a call must have left to start on a connection it was handed: with less, it
/// would time out mid-statement and close a sound connection; the connection goes to the next
/// call instead.
const LEAST_LEFT: Duration = Duration::from_millis(10);

/// How long the store's calls hold one of the pool's connections, handing it from call to
/// call or keeping it for the next one, before it goes back to the pool: whoever waits in
/// the pool's line (an application's handler, a transaction of the store's own) gets a turn
/// within about twice this, whether the store's calls go on or pause. sqlx tells no one who
/// waits in its line, so every connection goes back once its turn is over.
const TURN: Duration = Duration::from_millis(50);

/// A store's pool, and the connections its calls keep between them while calls keep coming.
///
/// sqlx checks every connection that goes back to its pool with a ping, a round trip (this
/// cannot be turned off), so a call that took a connection and gave it back cost two round
/// trips: half the store's rate. A call that ends well keeps its connection here instead, for
/// the next call: handed to the store's calls waiting for one, in their order, or kept idle
/// for the next call (unless the pool is out of connections and others hold some: then the
/// pool's line may hold theirs, and it goes back). Each goes back to the pool (and its ping)
/// once the store has held it for a [`TURN`], idle or not. So under load the store holds the
/// connections its calls use at once, as it would anyway, and once idle it holds none. A
/// connection whose call failed, was cancelled or timed out is never kept.
pub(crate) struct Connections<DB: sqlx::Database>(std::sync::Arc<Kept<DB>>);

impl<DB: sqlx::Database> Clone for Connections<DB> {
    fn clone(&self) -> Self {
        Self(std::sync::Arc::clone(&self.0))
    }
}

pub(crate) struct Kept<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    state: std::sync::Mutex<KeptState<DB>>,
    /// Whether a task gives back the connections not used again in time.
    reaping: std::sync::atomic::AtomicBool,
    /// The pool's connections the store's calls have now, in a call or kept.
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A connection of the pool a store call has (in a call, or kept): counted while it is.
pub(crate) struct Held<DB: sqlx::Database> {
    connection: sqlx::pool::PoolConnection<DB>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// When the store took it from the pool.
    since: tokio::time::Instant,
}

impl<DB: sqlx::Database> Held<DB> {
    fn new(
        connection: sqlx::pool::PoolConnection<DB>,
        held: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        held.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self {
            connection,
            held: std::sync::Arc::clone(held),
            since: tokio::time::Instant::now(),
        }
    }
}

impl<DB: sqlx::Database> Drop for Held<DB> {
    fn drop(&mut self) {
        self.held.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl<DB: sqlx::Database> std::ops::Deref for Held<DB> {
    type Target = sqlx::pool::PoolConnection<DB>;

    fn deref(&self) -> &sqlx::pool::PoolConnection<DB> {
        &self.connection
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for Held<DB> {
    fn deref_mut(&mut self) -> &mut sqlx::pool::PoolConnection<DB> {
        &mut self.connection
    }
}

struct KeptState<DB: sqlx::Database> {
    /// The connections kept, the most recently used last.
    idle: Vec<Held<DB>>,
    /// The calls waiting for a connection while every one the pool may make is out, first
    /// come first; a call that stopped waiting leaves its sender closed.
    waiting: std::collections::VecDeque<tokio::sync::oneshot::Sender<Held<DB>>>,
}

impl<DB: sqlx::Database> Connections<DB> {
    pub(crate) fn new(pool: sqlx::Pool<DB>) -> Self {
        Self(std::sync::Arc::new(Kept {
            pool,
            state: std::sync::Mutex::new(KeptState {
                idle: Vec::new(),
                waiting: std::collections::VecDeque::new(),
            }),
            reaping: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::Arc::default(),
        }))
    }

    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.0.pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptState<DB>> {
        self.0
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether every connection the pool may make is out.
    fn saturated(&self) -> bool {
        let pool = &self.0.pool;
        pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections()
    }

    /// Whether every connection the pool may make is out and some are others' (the
    /// application's, a transaction's): then others may be in the pool's line.
    fn others_wait(&self) -> bool {
        self.saturated() && self.others_hold()
    }

    /// Whether some of the pool's connections are others'.
    fn others_hold(&self) -> bool {
        self.0.held.load(std::sync::atomic::Ordering::Acquire)
            < usize::try_from(self.0.pool.size()).unwrap_or(usize::MAX)
    }

    /// A kept connection, the most recently used; else the first one a call keeps (in line
    /// with the other calls waiting) or one of the pool (in sqlx's line, with everyone else
    /// who uses the pool), whichever comes first.
    pub(crate) async fn take(&self) -> Result<Held<DB>, StoreError> {
        let mut waiting = {
            let mut state = self.lock();
            // The most recently used first; one whose turn is over goes back to the pool.
            while let Some(connection) = state.idle.pop() {
                if connection.since.elapsed() < TURN {
                    return Ok(connection);
                }
            }
            // The calls that stopped waiting, dropped once the line grows.
            if state.waiting.len() >= WAITING_SWEEP {
                state.waiting.retain(|waiting| !waiting.is_closed());
            }
            let (handed, waiting) = tokio::sync::oneshot::channel();
            state.waiting.push_back(handed);
            waiting
        };
        // While every connection is the store's, one comes back through this line; a call
        // that failed gives its back to the pool, looked at again every `SATURATED_POLL`.
        while self.saturated() && !self.others_hold() {
            match tokio::time::timeout(SATURATED_POLL, &mut waiting).await {
                Ok(Ok(connection)) => return Ok(connection),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
        let held = &self.0.held;
        let mut acquiring = std::pin::pin!(async {
            acquire(&self.0.pool)
                .await
                .map(|connection| Held::new(connection, held))
        });
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(Ok(connection)) =
                std::pin::Pin::new(&mut waiting).poll(cx)
            {
                return std::task::Poll::Ready(Ok(connection));
            }
            acquiring.as_mut().poll(cx)
        })
        .await
    }

    /// Hands `connection` to the first call waiting for one, or keeps it for the next call,
    /// up to the pool's size, until its [`TURN`] is over: a task gives back the kept ones
    /// whose turn is over. One whose turn is over goes back to the pool at once.
    pub(crate) fn keep(&self, connection: Held<DB>) {
        if connection.since.elapsed() >= TURN {
            return;
        }
        let limit = usize::try_from(self.0.pool.options().get_max_connections()).unwrap_or(0);
        let mut connection = connection;
        {
            let mut state = self.lock();
            while let Some(waiting) = state.waiting.pop_front() {
                match waiting.send(connection) {
                    Ok(()) => return,
                    // That call stopped waiting: the next.
                    Err(back) => connection = back,
                }
            }
            // Full, or others wait in the pool's line (the application's handlers, a
            // transaction's begin): theirs.
            if state.idle.len() >= limit || self.others_wait() {
                drop(state);
                return;
            }
            state.idle.push(connection);
        }
        if !self
            .0
            .reaping
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let kept = std::sync::Arc::downgrade(&self.0);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TURN).await;
                    let Some(kept) = kept.upgrade() else { return };
                    let connections = Connections(kept);
                    let (over, done) = {
                        let mut state = connections.lock();
                        let (over, current) = std::mem::take(&mut state.idle)
                            .into_iter()
                            .partition::<Vec<_>, _>(|kept| kept.since.elapsed() >= TURN);
                        state.idle = current;
                        let done = state.idle.is_empty();
                        if done {
                            connections
                                .0
                                .reaping
                                .store(false, std::sync::atomic::Ordering::Release);
                        }
                        (over, done)
                    };
                    // Back to the pool, outside the lock.
                    drop(over);
                    if done {
                        return;
                    }
                }
            });
        }
    }
}

/// Runs `call` on a connection of `connections`, both within `timeout`; the connection is
/// kept for the next call if the call answered. A call that times out closes its connection
/// rather than putting it back in the pool: sqlx would first wait, with no bound, for the
/// answer to the statement the call gave up on, and a server that went away without a word
/// would hold that pool slot for good.
pub(crate) async fn on_connection<DB: sqlx::Database, T>(
    connections: &Connections<DB>,
    timeout: Duration,
    call: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let started = tokio::time::Instant::now();
    let mut connection = super::within(timeout, connections.take()).await?;
    let left = timeout.saturating_sub(started.elapsed());
    if left < LEAST_LEFT.min(timeout) {
        connections.keep(connection);
        return Err(StoreError::new(StoreErrorKind::Timeout));
    }
    match tokio::time::timeout(left, call(&mut connection)).await {
        Ok(Ok(answer)) => {
            connections.keep(connection);
            Ok(answer)
        }
        // Back to the pool, which checks it.
        Ok(Err(error)) => Err(error),
        Err(_) => {
            connection.close_on_drop();
            Err(StoreError::new(StoreErrorKind::Timeout))
        }
    }
}
