//! [`TransactionalMySqlStore`]: the claim, the create's own writes and the complete in one
//! InnoDB transaction.

use std::sync::Arc;

use sqlx::SqlStr;
use sqlx::mysql::{MySql, MySqlConnection, MySqlRow};

use super::claim::{Bound, decode, found, taking_over};
use super::{CLAIM_ATTEMPTS, MySqlStore, Query, unavailable};
use crate::dialect::{Claiming, Completion, Token};
use crate::pooled::{Open, OpenTransactions, SqlTransaction, SqlTransactionConnection};
use tower_idempotency_core::{Answer, Claim, Decision, Lease, StoreError, StoreErrorKind, decide};

/// A [`MySqlStore`] whose claim, the create's own writes and the complete commit in **one
/// InnoDB transaction**: exactly once where the create's effect lives in the same database.
///
/// For a new claim the store begins a transaction on a pooled connection and claims in it;
/// the inner service finds a [`MySqlTransaction`] in its request's extensions, and its
/// writes, in plain sqlx on the connection [`acquire`](SqlTransaction::acquire) gives it
/// (`sqlx::query(…).execute(&mut *connection)`), are in that same transaction; the complete
/// stores the response in it and commits, all before the reply's first byte. So:
///
/// - a crash, a lost connection or a failed commit anywhere before the commit leaves nothing:
///   no record, none of the create's rows, and the retry creates (once);
/// - a create that fails or panics rolls back: the key is free again and nothing happened; so
///   does one that answers a server error (`5xx`), by default
///   ([`StoredResponses::ExceptServerErrors`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#variant.ExceptServerErrors)),
///   while a `2xx` or `4xx` answer commits and is replayed;
/// - a create that answers over the response cap succeeded: it commits as any other, with its
///   compact record (status and headers, `Idempotent-Body-Omitted: true`, no body), so its
///   retry replays that; rolling it back would make every retry create and fail again;
/// - a commit the server refuses is answered `503 store_unavailable`, never with the response
///   of writes that did not commit; one whose answer is lost is `503 outcome_unknown`: it may
///   have committed, and the retry with the same key finds out which.
///
/// The transaction runs at `READ COMMITTED` (set for it alone, the connection's own level
/// untouched): the claim takes no gap locks, so claims of other keys never wait for it or
/// deadlock with it. The claim reads the key's record `FOR UPDATE NOWAIT`: while another
/// transaction holds the key (its create in flight), the claim does not wait, it answers from
/// the committed record: a replay or a conflict if one is there within its retention,
/// `request_pending` otherwise (a record past its retention is being created again, never
/// replayed), at once (or it waits, with
/// [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait), polling every
/// [`CHANGE_POLL_INTERVAL`](tower_idempotency_core::CHANGE_POLL_INTERVAL)). Two claims of a free key that read it at the same moment both
/// insert: on MariaDB the second's insert waits for no lock (`SET STATEMENT
/// innodb_lock_wait_timeout = 0`) and it answers `request_pending` at once too; on MySQL,
/// which has no such statement, it waits for the first's transaction up to the connection's
/// `innodb_lock_wait_timeout` (the store's own pool: its timeout in whole seconds), then
/// answers `request_pending`, or `503` if the store's timeout came first. Needs what the
/// crate's MySQL store needs: MySQL 8 or MariaDB 10.5 and later.
///
/// Each create in flight holds one pooled connection for its whole life: **the pool's size
/// bounds the creates in flight**, and a claim that cannot get a connection within the
/// timeout answers `503 store_unavailable`. Put admission
/// ([`ConcurrencyLimit`](https://docs.rs/tower-idempotency/latest/tower_idempotency/admission/struct.ConcurrencyLimit.html)) in front to refuse early, and
/// size the pool for it.
///
/// InnoDB rolls a whole transaction back on a deadlock (and on a lock wait timeout with
/// `innodb_rollback_on_timeout`): the claim's record goes with it. The transaction runs with
/// `autocommit` off (set back to the session's own value when the store ends it, kept in the
/// session variable `@tower_idempotency_autocommit`; a connection whose transaction it did not
/// end is closed, never pooled), so whatever the create writes after such a rollback waits
/// for a commit that never comes: the complete finds no record of the claim's, rolls it all
/// back, and the answer is `503`, nothing created, the key free. Keep a create's writes on the [`MySqlTransaction`]'s
/// connection, and never end its transaction yourself (a `COMMIT` sent as SQL commits the
/// pending record with the create's rows, which the complete then completes outside any
/// transaction); sqlx's own `begin()` on the connection is a savepoint inside it.
///
/// ```no_run
/// // sqlx as the crate re-exports it (or your own dependency on the same version).
/// use tower_idempotency_sqlx::mysql::sqlx;
/// use tower_idempotency_sqlx::{MySqlStore, MySqlTransaction, TransactionalMySqlStore};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(TransactionalMySqlStore::new(store), JsonOperation::new())
///     .global_keys();
/// // In the create: its writes in the claim's transaction, in plain sqlx.
/// async fn create(transaction: &MySqlTransaction) -> Result<(), Box<dyn std::error::Error>> {
///     let mut connection = transaction.acquire().await?;
///     sqlx::query("INSERT INTO labels (label_id) VALUES (?)")
///         .bind("label-1")
///         .execute(&mut *connection)
///         .await?;
///     Ok(())
/// }
/// # drop(layer); Ok(()) }
/// ```
#[derive(Clone)]
pub struct TransactionalMySqlStore {
    store: MySqlStore,
    /// Whether the server is MariaDB, looked up on the first claim: its inserts can wait for
    /// no lock.
    mariadb: Arc<tokio::sync::OnceCell<bool>>,
    /// The open transaction of each new claim in flight, by reservation.
    open: OpenTransactions<MySql>,
}

/// The transaction of a new claim of a [`TransactionalMySqlStore`], in the inner service's
/// request extensions ([`SqlTransaction`] on MySQL): its connection is a [`MySqlConnection`].
///
/// Unlike PostgreSQL's, a MySQL transaction goes on after a statement that failed (a missing
/// table, a duplicate key): the create decides. If it answers `2xx` or `4xx`, the answer is
/// stored and commits with whatever the transaction wrote before; a `5xx` answer rolls back
/// and frees the key (the default on this store,
/// [`StoredResponses::ExceptServerErrors`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#variant.ExceptServerErrors); see
/// [`StoredResponses`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html) for the other choices). If it fails without an answer (an
/// error, a panic), the transaction rolls back and the key is free again. On PostgreSQL the
/// failed statement ends the transaction, so the complete fails (`503`) and the key is free.
pub type MySqlTransaction = SqlTransaction<MySql>;

/// The connection of a claim's open transaction on MySQL, while a create holds it
/// ([`SqlTransaction::acquire`]): a [`MySqlConnection`].
pub type MySqlTransactionConnection = SqlTransactionConnection<MySql>;

/// What begins each claim's transaction: the session's own `autocommit` kept in a session
/// variable (read in the same round trip); a transaction the session left open (autocommit
/// off, after a read of the application's) committed, as MySQL's own `BEGIN` would do, since
/// `SET TRANSACTION` is refused inside one; `READ COMMITTED` for the transaction alone; and
/// autocommit off for as long as it runs. InnoDB rolls a whole transaction back on a deadlock (and on a lock
/// wait timeout with `innodb_rollback_on_timeout`) and leaves the session outside any: with
/// autocommit on, a create that carried on would commit each later statement by itself, with
/// the claim's record gone and the key free for a second create. With it off, they wait for a
/// commit that never comes: the complete finds no record, and everything is rolled back.
const BEGIN: &str = "SET @tower_idempotency_autocommit = @@SESSION.autocommit; COMMIT; \
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET SESSION autocommit = 0; BEGIN";

/// What puts the session back once the store ended the transaction: its own `autocommit`, as
/// [`BEGIN`] kept it; a connection whose transaction the store did not end is closed instead.
const RESET: &str = "SET SESSION autocommit = @tower_idempotency_autocommit";

/// Whether `error` says a row lock was not had: `NOWAIT` on a key another transaction holds
/// (MySQL's 3572; MariaDB answers 1205), or a lock wait that timed out (1205).
fn lock_not_had(error: &sqlx::Error) -> bool {
    error_number(error).is_some_and(|number| number == 1205 || number == 3572)
}

/// The server's error number of `error`, if the server sent one.
pub(super) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(database) => database
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(sqlx::mysql::MySqlDatabaseError::number),
        _ => None,
    }
}

/// A duplicate key (1062): another transaction committed the key since this one read it.
fn duplicate(error: &sqlx::Error) -> bool {
    error_number(error) == Some(1062)
}

/// What the committed record answers while another transaction holds the key: a replay or a
/// conflict if one is there within its retention, pending otherwise.
fn committed(row: Option<MySqlRow>, fingerprint: &str, lease: Lease) -> Result<Claim, StoreError> {
    let found = row
        .as_ref()
        .map(|row| found(row, &[0; 16], fingerprint))
        .transpose()?;
    // No token is the caller's, and no take-over while another transaction holds the key.
    match decide(found, crate::dialect::while_held(lease)) {
        Decision::Answer(Answer::Conflict) => Ok(Claim::Conflict),
        Decision::Answer(Answer::Replay(response)) => decode(response).map(Claim::Replay),
        // Remembered past its window: the transaction holding the key cannot create it again
        // (a claim that forgets expired operations finds it absent).
        Decision::Answer(Answer::Expired(tombstone)) => {
            tower_idempotency_core::Tombstone::from_bytes(tombstone).map(Claim::Expired)
        }
        _ => Ok(Claim::Pending),
    }
}

impl TransactionalMySqlStore {
    /// The transactional mode of `store`: the same pool, table, retention and timeout.
    pub fn new(store: MySqlStore) -> Self {
        Self {
            store,
            mariadb: Arc::default(),
            open: OpenTransactions::default(),
        }
    }

    /// The claim in the transaction on `connection`: the record read under its row lock,
    /// tried; then the insert of the reservation, or the take-over of the record.
    async fn claim_in(
        &self,
        connection: &mut MySqlConnection,
        claiming: Claiming<'_>,
    ) -> Result<Claim, StoreError> {
        let sql = &self.store.sql;
        let bound = Bound::new(claiming);
        let (key, fingerprint, token) = (bound.key(), bound.fingerprint(), &bound.token);
        let reservation = claiming.reservation;
        let lease = crate::dialect::lease_on(&self.store.base.options, claiming.lease);
        let mariadb = *self
            .mariadb
            .get_or_try_init(|| async {
                sqlx::query_scalar::<_, String>("SELECT VERSION()")
                    .fetch_one(&mut *connection)
                    .await
                    .map(|version| version.contains("MariaDB"))
                    .map_err(unavailable)
            })
            .await?;
        // On MySQL, an insert that meets another transaction's insert of the key (made since
        // this one's read) waits for it, up to `innodb_lock_wait_timeout`.
        let insert = if mariadb {
            &sql.insert_nowait
        } else {
            &sql.insert_locked
        };
        for _ in 0..CLAIM_ATTEMPTS {
            let read = sqlx::query(sql.read_locked.clone())
                .bind(key)
                .fetch_optional(&mut *connection)
                .await;
            let row = match read {
                Ok(row) => row,
                // Another transaction holds the key: its create is in flight.
                Err(error) if lock_not_had(&error) => {
                    return self.in_flight(connection, key, fingerprint, lease).await;
                }
                Err(error) => return Err(unavailable(error)),
            };
            let write = match &row {
                None => {
                    let inserted = bound.insert(insert).execute(&mut *connection).await;
                    match inserted {
                        Ok(_) => return Ok(Claim::New(reservation)),
                        // Committed by another claim since the read: read it again.
                        Err(error) if duplicate(&error) => continue,
                        // Inserted by another claim since the read, its create in flight.
                        Err(error) if lock_not_had(&error) => {
                            return self.in_flight(connection, key, fingerprint, lease).await;
                        }
                        Err(error) => return Err(unavailable(error)),
                    }
                }
                Some(row) => match decide(Some(found(row, token, fingerprint)?), lease) {
                    Decision::Answer(answer) => {
                        return answer.claim(
                            reservation,
                            decode,
                            tower_idempotency_core::Tombstone::from_bytes,
                        );
                    }
                    Decision::Write(write) => write,
                },
            };
            // The record is this transaction's (its row lock): a take-over changes it.
            let taken = taking_over(sql, write, key, fingerprint, token, lease)
                .execute(&mut *connection)
                .await
                .map_err(unavailable)?;
            if taken.rows_affected() == 1 {
                return Ok(Claim::New(reservation));
            }
        }
        Err(StoreError::new(StoreErrorKind::Unavailable))
    }

    /// The answer while another transaction holds the key: from the committed record.
    async fn in_flight(
        &self,
        connection: &mut MySqlConnection,
        key: &str,
        fingerprint: &str,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let row = sqlx::query(self.store.sql.read.clone())
            .bind(key)
            .fetch_optional(connection)
            .await
            .map_err(unavailable)?;
        committed(row, fingerprint, lease)
    }

    /// Begins a claim's transaction (one round trip; see [`BEGIN`]).
    async fn begin(&self) -> Result<Open<MySql>, StoreError> {
        let begin = Some(SqlStr::from_static(BEGIN));
        Open::begin(self.store.pool(), begin, Some(RESET)).await
    }

    /// The statement that stores the response in the claim's transaction.
    fn completing<'q>(
        &'q self,
        key: &'q str,
        token: &'q Token,
        completion: &'q Completion,
    ) -> Query<'q> {
        let retention = self.store.base.retention_ms();
        let complete = sqlx::query(self.store.sql.complete.clone());
        super::bind_completion(complete, completion, retention)
            .bind(key)
            .bind(&token[..])
    }
}

crate::pooled::transactional_store!(TransactionalMySqlStore, MySqlStore);
