//! A claim's transaction on a pooled connection, shared by the transactional stores: the
//! connection it holds ([`Open`]), the handle the create gets ([`SqlTransaction`]), and the
//! open transactions of a store's claims in flight ([`OpenTransactions`]).

use std::time::Duration;

use super::acquire;
use tower_idempotency_core::{StoreError, StoreErrorKind};

/// The slot of a claim's open transaction: empty once the layer took it to commit or roll
/// back.
type Slot<DB> = Option<Open<DB>>;

/// A pooled connection inside a transaction a transactional store began: ended by the store
/// (committed or rolled back, then its session `reset`), or closed. A connection whose
/// transaction the store did not end (its claim cancelled, a commit or rollback failed or
/// timed out) never goes back to the pool: its session may still hold the transaction, its
/// locks or its settings, and an answer sqlx would wait for before its next use. The server
/// rolls back what the closed session left open.
pub(crate) struct Open<DB: sqlx::Database> {
    connection: sqlx::pool::PoolConnection<DB>,
    /// What puts the session back as the pool hands it out, after the transaction.
    reset: Option<&'static str>,
    ended: bool,
}

impl<DB: sqlx::Database> Drop for Open<DB> {
    fn drop(&mut self) {
        if !self.ended {
            self.connection.close_on_drop();
        }
    }
}

impl<DB: sqlx::Database> std::ops::Deref for Open<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.connection
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for Open<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.connection
    }
}

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
/// [`TransactionalPostgresStore`]: crate::TransactionalPostgresStore
/// [`TransactionalMySqlStore`]: crate::TransactionalMySqlStore
/// [`PgTransaction`]: crate::PgTransaction
/// [`MySqlTransaction`]: crate::MySqlTransaction
pub struct SqlTransaction<DB: sqlx::Database> {
    slot: std::sync::Arc<tokio::sync::Mutex<Slot<DB>>>,
}

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
/// store's timeout. A response over the [cap](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.response_limit) whose
/// body still holds it (streaming rows from it) cannot wait for it, since the body is read
/// after the commit: that create fails at once, `500 create_failed`, and nothing commits
/// ([`StoreErrorKind::ConnectionHeld`]).
pub struct SqlTransactionConnection<DB: sqlx::Database>(
    tokio::sync::OwnedMappedMutexGuard<Slot<DB>, DB::Connection>,
);

impl<DB: sqlx::Database> std::ops::Deref for SqlTransactionConnection<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.0
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for SqlTransactionConnection<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.0
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for SqlTransactionConnection<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransactionConnection")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for SqlTransaction<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransaction")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

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
    /// # async fn create(transaction: tower_idempotency_sqlx::PgTransaction) -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency_sqlx::postgres::sqlx;
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

    /// The transaction, taken out at once: `Err` while a holder has its connection.
    fn try_take(&self) -> Result<Slot<DB>, ()> {
        self.slot
            .try_lock()
            .map(|mut slot| slot.take())
            .map_err(drop)
    }
}

/// Rolls `transaction` back within `timeout`; past it, or on an error, its connection is
/// closed, which ends the transaction on the server.
pub(crate) async fn roll_back<DB: sqlx::Database>(transaction: Open<DB>, timeout: Duration)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    if let Err(error) = tower_idempotency_core::backend::within(timeout, async {
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
pub(crate) struct OpenTransactions<DB: sqlx::Database>(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u128, SqlTransaction<DB>>>>,
);

impl<DB: sqlx::Database> Clone for OpenTransactions<DB> {
    fn clone(&self) -> Self {
        Self(std::sync::Arc::clone(&self.0))
    }
}

impl<DB: sqlx::Database> Default for OpenTransactions<DB> {
    fn default() -> Self {
        Self(std::sync::Arc::default())
    }
}

/// Whether a server's error answer to a `COMMIT` (its SQLSTATE) leaves the commit's outcome
/// unknown: a connection exception (class `08`, MySQL's server shutdown among them), an
/// operator's intervention (class `57`: PostgreSQL's admin or crash shutdown, a cancel) or
/// MySQL's interrupted statement (`70100`, a kill while a semi-synchronous replica's
/// acknowledgement was awaited, after the commit was written). Any other error answer
/// refused the commit.
fn interrupted(sqlstate: Option<&str>) -> bool {
    sqlstate.is_some_and(|code| code.starts_with("08") || code.starts_with("57") || code == "70100")
}

/// The error of a complete that did not commit: nothing of the create may have happened.
fn uncommitted(source: Option<StoreError>) -> StoreError {
    match source {
        Some(source) => StoreError::with_source(StoreErrorKind::Uncommitted, source),
        None => StoreError::new(StoreErrorKind::Uncommitted),
    }
}

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
    pub(crate) fn insert(
        &self,
        reservation: &tower_idempotency_core::Reservation,
        transaction: Open<DB>,
    ) {
        self.lock()
            .insert(reservation.as_u128(), SqlTransaction::new(transaction));
    }

    /// A reservation's renewal: nothing to renew while its transaction is open (it holds the
    /// key for as long as the create runs); [`StoreErrorKind::ReservationLost`] once ended.
    pub(crate) fn renew(
        &self,
        reservation: &tower_idempotency_core::Reservation,
    ) -> Result<(), StoreError> {
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
        reservation: &tower_idempotency_core::Reservation,
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
        reservation: &tower_idempotency_core::Reservation,
        extensions: &mut http::Extensions,
    ) {
        if let Some(transaction) = self.lock().get(&reservation.as_u128()) {
            extensions.insert(transaction.clone());
        }
    }

    /// The open transaction of `reservation`, no longer open to anyone else.
    fn remove(
        &self,
        reservation: &tower_idempotency_core::Reservation,
    ) -> Option<SqlTransaction<DB>> {
        self.lock().remove(&reservation.as_u128())
    }

    /// Rolls back the transaction of `reservation`, if open; whether it was. A transaction
    /// whose connection a holder has now (the body of a `5xx` still to stream, a task the
    /// create spawned) is not waited for: no longer anyone's to commit, it ends with its
    /// holder, whose guard drops the last handle and closes the connection (the server rolls
    /// back).
    pub(crate) async fn roll_back(
        &self,
        reservation: &tower_idempotency_core::Reservation,
        timeout: Duration,
    ) -> bool {
        let Some(transaction) = self.remove(reservation) else {
            return false;
        };
        if let Ok(Some(transaction)) = transaction.try_take() {
            roll_back(transaction, timeout).await;
        }
        true
    }

    /// Runs `complete` (the statement that stores the response; the rows it changed) in the
    /// transaction of `reservation` and commits: the record, the create's writes and the
    /// response together. Anything but one row changed is [`StoreErrorKind::Uncommitted`],
    /// the transaction rolled back, and so is a commit the server refused; a commit sent whose
    /// answer was lost (its timeout, a broken connection) is
    /// [`StoreErrorKind::CommitUnknown`].
    pub(crate) async fn complete(
        &self,
        reservation: &tower_idempotency_core::Reservation,
        timeout: Duration,
        response: &tower_idempotency_core::StoredResponse,
        complete: impl AsyncFnOnce(&mut DB::Connection) -> Result<u64, sqlx::Error>,
    ) -> Result<(), StoreError> {
        let unavailable = |error| StoreError::with_source(StoreErrorKind::Unavailable, error);
        // No open transaction (never claimed here, or ended): nothing to commit.
        let transaction = self.remove(reservation).ok_or_else(|| uncommitted(None))?;
        // A response over the cap (its compact record) still has its body to stream, after
        // the complete: a holder of the connection now may be that body, which no wait frees.
        let streaming = response
            .headers()
            .contains_key(tower_idempotency_core::IDEMPOTENT_BODY_OMITTED);
        let taken = if streaming {
            transaction.try_take().map_err(|()| {
                StoreError::with_source(
                    StoreErrorKind::ConnectionHeld,
                    "the response over the cap holds the transaction's connection in its body",
                )
            })?
        } else {
            transaction.take(timeout).await
        };
        let mut transaction = taken.ok_or_else(|| uncommitted(None))?;
        let updated = tower_idempotency_core::backend::within(timeout, async {
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
        tower_idempotency_core::backend::within(timeout, async {
            transaction
                .commit_only()
                .await
                .map_err(|error| match &error {
                    // The server answered that it refused the commit.
                    sqlx::Error::Database(database) if !interrupted(database.code().as_deref()) => {
                        uncommitted(Some(unavailable(error)))
                    }
                    // Sent, and its answer lost, or the server interrupted while it waited
                    // (a shutdown, a kill during a replica's acknowledgement): it may have
                    // committed.
                    _ => StoreError::with_source(StoreErrorKind::CommitUnknown, error),
                })
        })
        .await
        .map_err(|error| match error.kind() {
            StoreErrorKind::Uncommitted | StoreErrorKind::CommitUnknown => error,
            // The commit did not answer in time: sent, its outcome unknown.
            _ => StoreError::with_source(StoreErrorKind::CommitUnknown, error),
        })?;
        // Committed: the answer stands whatever becomes of the session's reset (a connection
        // not reset in time is closed).
        let _ = tower_idempotency_core::backend::within(timeout, async {
            transaction.reset().await.map_err(unavailable)
        })
        .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::interrupted;

    /// A commit's error answer leaves its outcome unknown only when the server was interrupted
    /// (a connection exception, an operator's intervention, MySQL's killed statement); a
    /// refusal, such as a serialization failure or a deferred constraint, is known.
    #[test]
    fn an_interrupted_commit_is_unknown_and_a_refused_one_is_not() {
        for unknown in ["08006", "08S01", "57P01", "57P02", "57014", "70100"] {
            assert!(interrupted(Some(unknown)), "{unknown}");
        }
        for refused in ["40001", "40P01", "23505", "HY000", "25P02", "7010"] {
            assert!(!interrupted(Some(refused)), "{refused}");
        }
        assert!(!interrupted(None));
    }
}
