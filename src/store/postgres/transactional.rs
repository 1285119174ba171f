//! [`TransactionalPostgresStore`]: the claim, the create's own writes and the complete in one
//! PostgreSQL transaction.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::Object;
use sha2::{Digest, Sha256};
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::types::ToSql;

use bytes::Bytes;

use super::{PostgresStore, execute_on, query_opt_on, table_key, unavailable};
use crate::fingerprint::Fingerprint;
use crate::store::{
    CHANGE_POLL_INTERVAL, Claim, Lease, Operator, RecordInfo, Reservation, Store, StoreError,
    StoreErrorKind, StoredResponse, codec, within,
};

/// A [`PostgresStore`] whose claim, the create's own writes and the complete commit in **one
/// transaction**: exactly once where the create's effect lives in the same database.
///
/// For a new claim the store opens a transaction on a pooled connection and claims in it; the
/// inner service finds a [`PgTransaction`] in its request's extensions and makes its writes
/// in that same transaction; the complete stores the response in it and commits, all before
/// the reply's first byte. So:
///
/// - a crash, a lost connection or a failed commit anywhere before the commit leaves nothing:
///   no record, none of the create's rows, and the retry creates (once);
/// - a create that fails, panics, or answers over the response cap rolls back: the key is free
///   again and nothing happened, unlike the plain store, where such a key stays pending
///   because the create may have taken effect;
/// - a commit that fails, or whose answer is lost, is answered `503 store_unavailable`, never
///   with the response of writes that may not have committed; the retry finds out which.
///
/// While a transaction is open its record is invisible to other connections. A second attempt
/// at the key does not wait on it: an advisory lock taken with the claim
/// (`pg_try_advisory_xact_lock` on 64 bits of the SHA-256 of the table and the key) tells it
/// the key is in flight, and it answers from the committed record: a replay or a conflict if
/// one is there and within its retention, `request_pending` otherwise (a record past its
/// retention is being created again, never replayed), at once (or it waits, with
/// [`pending_wait`](crate::IdempotencyLayer::pending_wait), polling every
/// [`CHANGE_POLL_INTERVAL`]). So while the first attempt runs, another body under its key is
/// `request_pending` too, not a conflict: its fingerprint is not committed yet. Two keys whose
/// lock numbers collide answer pending for each other while one's transaction is open.
///
/// Each create in flight holds one pooled connection for its whole life: **the pool's size
/// bounds the creates in flight**, and a claim that cannot get a connection within the
/// timeout answers `503 store_unavailable`. Put admission
/// ([`ConcurrencyLimit`](crate::admission::ConcurrencyLimit)) in front to refuse early, and
/// size the pool for it. Every statement of the create runs under the pool's
/// `statement_timeout` (the store's timeout) if the store built the pool.
///
/// Replicas in this mode share the table with each other. A plain [`PostgresStore`] on the
/// same table works too, but its claim of a key whose transaction is open waits on the
/// uncommitted row, up to its timeout (then `503`). A reservation is not renewed (the open
/// transaction holds the key), and the conformance suite's lost-claim cases do not apply: a
/// claim whose answer is lost closes its connection, and the server rolls it back.
///
/// Keep a create's writes on the [`PgTransaction`], and never end it yourself: a write made
/// elsewhere is not part of the transaction; after a `COMMIT` sent on it the complete finds no
/// record of the claim's transaction, so the reply is `503` and the key stays pending (its
/// record was committed by that `COMMIT`), as in the plain store; after a `ROLLBACK` the
/// create's later writes are not in any transaction of the layer's. Use `SET LOCAL`, not
/// `SET`: the connection goes back to the pool after the commit with its session settings.
///
/// ```no_run
/// use tower_idempotency::store::{PgTransaction, PostgresStore, TransactionalPostgresStore};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(TransactionalPostgresStore::new(store), JsonOperation::new()).global_keys();
/// // In the create: its writes in the claim's transaction.
/// async fn create(transaction: &PgTransaction) -> Result<(), tower_idempotency::store::StoreError> {
///     transaction
///         .execute("INSERT INTO labels (label_id) VALUES ($1)", &[&"label-1"])
///         .await?;
///     Ok(())
/// }
/// # drop(layer); Ok(()) }
/// ```
#[derive(Clone)]
pub struct TransactionalPostgresStore {
    store: PostgresStore,
    /// The open transaction of each new claim in flight, by reservation; never locked across
    /// an `.await`.
    open: Arc<Mutex<HashMap<u128, PgTransaction>>>,
}

/// A pooled connection inside a transaction: back to the pool only once the transaction ended
/// cleanly ([`end`]); dropped any other way (an error, a timeout, a future cancelled
/// mid-call), it is closed instead, and the server rolls back whatever it had open.
struct Connection(Option<Object>);

impl Connection {
    fn client(&self) -> &deadpool_postgres::ClientWrapper {
        // Taken only by `Drop` and `end`, which consume it.
        self.0.as_deref().expect("a connection until it ends")
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(Object::take(object));
        }
    }
}

/// The transaction of a new claim of a [`TransactionalPostgresStore`], in the inner service's
/// request extensions: the create's own writes go through it, and commit with its stored
/// response, or not at all.
///
/// Cloning it shares the one transaction. Once the layer commits or rolls it back, every call
/// fails with [`StoreErrorKind::ReservationLost`]. A failed statement is a
/// [`StoreErrorKind::Unavailable`] whose [`source`](std::error::Error::source) is the
/// driver's [`tokio_postgres::Error`] (its SQLSTATE with `code()`); after one, PostgreSQL
/// refuses the transaction's further statements, and the complete fails (`503`).
#[derive(Clone)]
pub struct PgTransaction {
    connection: Arc<tokio::sync::Mutex<Option<Connection>>>,
}

impl std::fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransaction").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TransactionalPostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalPostgresStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl PgTransaction {
    fn new(connection: Connection) -> Self {
        Self {
            connection: Arc::new(tokio::sync::Mutex::new(Some(connection))),
        }
    }

    /// Runs `sql` in the transaction; the rows it affected.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] once the transaction ended; the driver's error as
    /// [`StoreErrorKind::Unavailable`].
    pub async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let connection = self.connection.lock().await;
        let client = connection.as_ref().ok_or_else(ended)?.client();
        client.execute(sql, params).await.map_err(unavailable)
    }

    /// Runs `sql` in the transaction; the rows it returned.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let connection = self.connection.lock().await;
        let client = connection.as_ref().ok_or_else(ended)?.client();
        client.query(sql, params).await.map_err(unavailable)
    }

    /// Runs `sql` in the transaction; the one row it returned, if any.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute); more than one row is an error of the driver.
    pub async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        let connection = self.connection.lock().await;
        let client = connection.as_ref().ok_or_else(ended)?.client();
        client.query_opt(sql, params).await.map_err(unavailable)
    }

    /// The connection, taken out: nobody can use the transaction after this. Waits, up to
    /// `timeout`, for a statement of the create still running on it (a task it spawned).
    async fn take(&self, timeout: Duration) -> Option<Connection> {
        tokio::time::timeout(timeout, self.connection.lock())
            .await
            .ok()?
            .take()
    }
}

fn ended() -> StoreError {
    StoreError::new(StoreErrorKind::ReservationLost)
}

/// Ends the transaction on `connection` with `statement` (`COMMIT` or `ROLLBACK`), within
/// `timeout`: the connection goes back to the pool if it did, and is closed otherwise (the
/// server then rolls back whatever is open).
async fn end(
    mut connection: Connection,
    statement: &str,
    timeout: Duration,
) -> Result<(), StoreError> {
    within(timeout, async {
        connection
            .client()
            .batch_execute(statement)
            .await
            .map_err(unavailable)
    })
    .await?;
    // Ended cleanly: pooled again.
    drop(connection.0.take());
    Ok(())
}

impl TransactionalPostgresStore {
    /// The transactional mode of `store`: the same pool, table, retention and timeout.
    pub fn new(store: PostgresStore) -> Self {
        Self {
            store,
            open: Arc::default(),
        }
    }

    /// The plain store underneath: for [`migrate`](PostgresStore::migrate), the operator's
    /// calls and the pool.
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    /// Transactions open now: one per create in flight.
    pub fn open_transactions(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, PgTransaction>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open transaction of `reservation`, no longer open to anyone else.
    fn remove(&self, reservation: &Reservation) -> Option<PgTransaction> {
        self.lock().remove(&reservation.as_u128())
    }

    /// Rolls back and returns the connection of `reservation`'s transaction, if open.
    async fn roll_back(&self, reservation: &Reservation) -> bool {
        let Some(transaction) = self.remove(reservation) else {
            return false;
        };
        if let Some(connection) = transaction.take(self.store.timeout).await
            && let Err(error) = end(connection, "ROLLBACK", self.store.timeout).await
        {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "rollback failed; the connection was closed instead"
            );
        }
        true
    }

    /// Begins a transaction on `connection` and takes the key's lock, in one round trip, then
    /// claims in it. A lock held by another transaction answers from the committed record:
    /// a replay or a conflict if there is one within its retention, pending otherwise.
    async fn claim_in(
        &self,
        connection: &Connection,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let timeout = self.store.timeout;
        let client = connection.client();
        // The simple protocol runs both statements in one round trip; the lock's number is
        // from a digest, so the statement holds no text of the client's.
        let begin = format!(
            "BEGIN; SELECT pg_try_advisory_xact_lock({})",
            lock_id(&self.store.sql.table, key)
        );
        let answers = within(timeout, async {
            client.simple_query(&begin).await.map_err(unavailable)
        })
        .await?;
        let locked = answers.iter().find_map(|answer| match answer {
            SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        });
        match locked {
            Some("t") => {
                self.store
                    .claim_on(client, key, fingerprint, reservation, lease)
                    .await
            }
            Some("f") => self.committed(client, key, fingerprint).await,
            _ => Err(StoreError::new(StoreErrorKind::Corrupt)),
        }
    }

    /// What the committed record of `key` answers while another transaction holds its lock.
    async fn committed(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> Result<Claim, StoreError> {
        let key = &*table_key(key);
        let params: [&(dyn ToSql + Sync); 1] = [&key];
        let committed = query_opt_on(client, &self.store.sql.committed, &params);
        let Some(row) = within(self.store.timeout, committed).await? else {
            return Ok(Claim::Pending);
        };
        let corrupt = |e| StoreError::with_source(StoreErrorKind::Corrupt, e);
        let stored_fingerprint: &str = row.try_get(0).map_err(corrupt)?;
        let response: Option<Vec<u8>> = row.try_get(1).map_err(corrupt)?;
        let expired: bool = row.try_get(2).map_err(corrupt)?;
        // Past its retention, the record is absent: the transaction holding the key is
        // creating it again, so neither its old response nor its old fingerprint answers.
        if expired {
            return Ok(Claim::Pending);
        }
        if stored_fingerprint != fingerprint.to_hex().as_str() {
            return Ok(Claim::Conflict);
        }
        match response {
            Some(response) => codec::decode(Bytes::from(response)).map(Claim::Replay),
            None => Ok(Claim::Pending),
        }
    }
}

/// The advisory lock of `key` in `table`: 64 bits of their digest.
fn lock_id(table: &str, key: &str) -> i64 {
    let mut digest = Sha256::new();
    digest.update(table.as_bytes());
    digest.update([0]);
    digest.update(key.as_bytes());
    let digest = digest.finalize();
    let mut first = [0; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

impl Store for TransactionalPostgresStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let connection = Connection(Some(within(self.store.timeout, self.store.client()).await?));
        // Any error or cancellation below drops the connection: closed, not pooled, so the
        // server rolls back what the claim began.
        let claim = self
            .claim_in(&connection, key, fingerprint, reservation, lease)
            .await?;
        match claim {
            Claim::New(reservation) => {
                self.lock()
                    .insert(reservation.as_u128(), PgTransaction::new(connection));
                Ok(Claim::New(reservation))
            }
            claim => {
                // Nothing was written: a replay, pending or conflicting claim only read.
                end(connection, "ROLLBACK", self.store.timeout).await?;
                Ok(claim)
            }
        }
    }

    /// Nothing to renew: the open transaction holds the key for as long as the create runs.
    async fn renew(
        &self,
        _key: &str,
        reservation: &Reservation,
        _lease: Duration,
    ) -> Result<(), StoreError> {
        if self.lock().contains_key(&reservation.as_u128()) {
            Ok(())
        } else {
            Err(ended())
        }
    }

    /// Stores the response in the claim's transaction and commits: the record, the create's
    /// writes and the response together. Any failure is [`StoreErrorKind::Uncommitted`].
    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let uncommitted = |source: Option<StoreError>| match source {
            Some(source) => StoreError::with_source(StoreErrorKind::Uncommitted, source),
            None => StoreError::new(StoreErrorKind::Uncommitted),
        };
        // No open transaction (never claimed here, or ended): nothing to commit.
        let transaction = self.remove(reservation).ok_or_else(|| uncommitted(None))?;
        let timeout = self.store.timeout;
        let connection = transaction
            .take(timeout)
            .await
            .ok_or_else(|| uncommitted(None))?;
        let table_key = &*table_key(key);
        let token = reservation.as_u128().to_be_bytes();
        let encoded = codec::encode(response);
        let params: [&(dyn ToSql + Sync); 4] = [
            &table_key,
            &&token[..],
            &&encoded[..],
            &self.store.retention_ms,
        ];
        // The record is updated only in the claim's own transaction: a failed statement of
        // the create's aborted it (the update fails), and a `COMMIT` sent by the create ended
        // it (the update finds no record of this transaction's).
        let sql = &self.store.sql.complete_in_transaction;
        match within(timeout, execute_on(connection.client(), sql, &params)).await {
            Ok(1) => {}
            Ok(_) => {
                drop(end(connection, "ROLLBACK", timeout).await);
                return Err(uncommitted(None));
            }
            Err(error) => {
                drop(end(connection, "ROLLBACK", timeout).await);
                return Err(uncommitted(Some(error)));
            }
        }
        end(connection, "COMMIT", timeout)
            .await
            .map_err(|error| uncommitted(Some(error)))
    }

    /// Nothing to settle: a claim whose answer was lost ran on a connection that was then
    /// closed, so the server rolled it back.
    async fn settle_claim(
        &self,
        _key: &str,
        _fingerprint: &Fingerprint,
        _reservation: Reservation,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Polls: an open transaction's end is not announced.
    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        let _ = key;
        tokio::time::sleep(CHANGE_POLL_INTERVAL)
    }

    /// Rolls the claim back: the key is free, as before the claim.
    async fn release(&self, _key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        if self.roll_back(reservation).await {
            Ok(())
        } else {
            Err(ended())
        }
    }

    fn attach(&self, _key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        if let Some(transaction) = self.lock().get(&reservation.as_u128()) {
            extensions.insert(transaction.clone());
        }
    }

    /// Rolls back: the create's writes with the claim, so the key is free again.
    async fn abandon(&self, _key: &str, reservation: &Reservation) {
        self.roll_back(reservation).await;
    }
}

/// The operator's calls act on the committed records, as on the plain store: a transaction in
/// flight is not a record yet.
impl Operator for TransactionalPostgresStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.store.inspect(key).await
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        self.store.pending_older_than(age).await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.store.resolve(key, response).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        self.store.forget(key).await
    }
}
