//! [`TransactionalPostgresStore`]: the claim, the create's own writes and the complete in one
//! PostgreSQL transaction.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use sqlx::postgres::Postgres;
use sqlx::{AssertSqlSafe, SqlSafeStr as _};

use super::{PostgresStore, Query, server_side};
use crate::dialect::{Claiming, Completion, Token};
use crate::pooled::{Open, OpenTransactions, SqlTransaction, SqlTransactionConnection};
use sqlx::postgres::PgConnection;
use tower_idempotency_core::{Claim, StoreError};

/// A [`PostgresStore`] whose claim, the create's own writes and the complete commit in **one
/// transaction**: exactly once where the create's effect lives in the same database.
///
/// For a new claim the store opens a transaction on a pooled connection and claims in it; the
/// inner service finds a [`PgTransaction`] in its request's extensions, and its writes, in
/// plain sqlx on the connection [`acquire`](PgTransaction::acquire) gives it
/// (`sqlx::query(…).execute(&mut *connection)`), are in that same transaction; the complete
/// stores the response in it and commits, all before the reply's first byte. So:
///
/// - a crash, a lost connection or a failed commit anywhere before the commit leaves nothing:
///   no record, none of the create's rows, and the retry creates (once);
/// - a create that fails or panics rolls back: the key is free again and nothing happened,
///   unlike the plain store, where such a key stays pending because the create may have
///   taken effect; so does one that answers a server error (`5xx`), by default
///   ([`StoredResponses::ExceptServerErrors`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#variant.ExceptServerErrors)),
///   while a `2xx` or `4xx` answer commits and is replayed;
/// - a create that answers over the response cap succeeded: it commits as any other, with its
///   compact record (status and headers, `Idempotent-Body-Omitted: true`, no body), so its
///   retry replays that; rolling it back would make every retry create and fail again;
/// - a commit the server refuses is answered `503 store_unavailable`, never with the response
///   of writes that did not commit; one whose answer is lost is `503 outcome_unknown`: it may
///   have committed, and the retry with the same key finds out which.
///
/// While a transaction is open its record is invisible to other connections. A second attempt
/// at the key does not wait on it: an advisory lock taken with the claim
/// (`pg_try_advisory_xact_lock` on 64 bits of the SHA-256 of the table and the key) tells it
/// the key is in flight, and it answers from the committed record: a replay or a conflict if
/// one is there and within its retention, `request_pending` otherwise (a record past its
/// retention is being created again, never replayed), at once (or it waits, with
/// [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait), polling every
/// [`CHANGE_POLL_INTERVAL`](tower_idempotency_core::CHANGE_POLL_INTERVAL)). So while the first attempt runs, another body under its key is
/// `request_pending` too, not a conflict: its fingerprint is not committed yet. Two keys whose
/// lock numbers collide answer pending for each other while one's transaction is open.
///
/// Each create in flight holds one pooled connection for its whole life: **the pool's size
/// bounds the creates in flight**, and a claim that cannot get a connection within the
/// timeout answers `503 store_unavailable`. Put admission
/// ([`ConcurrencyLimit`](https://docs.rs/tower-idempotency/latest/tower_idempotency/admission/struct.ConcurrencyLimit.html)) in front to refuse early, and
/// size the pool for it. Every statement of the create runs under four fifths of the store's
/// timeout as its `statement_timeout`, set with `SET LOCAL` when the transaction begins (so the
/// pool's connections keep their own settings): a create whose statements take longer needs a
/// longer [`timeout`](PostgresStore::timeout).
///
/// Replicas in this mode share the table with each other. A plain [`PostgresStore`] on the
/// same table works too, but its claim of a key whose transaction is open waits on the
/// uncommitted row, up to its timeout (then `503`). A reservation is not renewed (the open
/// transaction holds the key), and the conformance suite's lost-claim cases do not apply: the
/// transaction of a claim whose answer is lost is rolled back when it is dropped (or by the
/// server, when its connection is closed).
///
/// Keep a create's writes on the [`PgTransaction`]'s connection, and never end its
/// transaction yourself: a write made elsewhere is not part of the transaction. sqlx's own
/// `begin()` on the connection is a savepoint inside it, as sqlx nests transactions, and its
/// `commit()` releases the savepoint only. A `COMMIT` sent as SQL ends the claim's
/// transaction: the complete then finds no record of the claim's transaction, so the reply is
/// `503` and the key stays pending (its record was committed by that `COMMIT`), as in the
/// plain store; after a `ROLLBACK` sent as SQL the create's later writes are not in any
/// transaction of the layer's. Use `SET LOCAL`, not `SET`: the connection goes back to the
/// pool after the commit with its session settings.
///
/// ```no_run
/// // sqlx as the crate re-exports it (or your own dependency on the same version).
/// use tower_idempotency_sqlx::postgres::sqlx;
/// use tower_idempotency_sqlx::{PgTransaction, PostgresStore, TransactionalPostgresStore};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// store.migrate().await?;
/// let layer = IdempotencyLayer::new(TransactionalPostgresStore::new(store), JsonOperation::new()).global_keys();
/// // In the create: its writes in the claim's transaction, in plain sqlx.
/// async fn create(transaction: &PgTransaction) -> Result<(), Box<dyn std::error::Error>> {
///     let mut connection = transaction.acquire().await?;
///     sqlx::query("INSERT INTO labels (label_id) VALUES ($1)")
///         .bind("label-1")
///         .execute(&mut *connection)
///         .await?;
///     Ok(())
/// }
/// # drop(layer); Ok(()) }
/// ```
#[derive(Clone)]
pub struct TransactionalPostgresStore {
    store: PostgresStore,
    /// What begins each claim's transaction: `BEGIN`, and the store's timeout as its
    /// `statement_timeout`.
    begin: Arc<str>,
    /// The open transaction of each new claim in flight, by reservation.
    open: OpenTransactions<Postgres>,
}

/// The transaction of a new claim of a [`TransactionalPostgresStore`], in the inner service's
/// request extensions ([`SqlTransaction`] on PostgreSQL): its connection is a
/// [`PgConnection`](sqlx::postgres::PgConnection). After a failed statement PostgreSQL refuses the transaction's further
/// statements, and the complete fails (`503`).
pub type PgTransaction = SqlTransaction<Postgres>;

/// The connection of a claim's open transaction on PostgreSQL, while a create holds it
/// ([`SqlTransaction::acquire`]): a [`PgConnection`](sqlx::postgres::PgConnection).
pub type PgTransactionConnection = SqlTransactionConnection<Postgres>;

impl TransactionalPostgresStore {
    /// The transactional mode of `store`: the same pool, table, retention and timeout.
    pub fn new(store: PostgresStore) -> Self {
        let begin = format!(
            "BEGIN; SET LOCAL statement_timeout = {}",
            server_side(store.base.timeout())
        );
        Self {
            store,
            begin: Arc::from(begin),
            open: OpenTransactions::default(),
        }
    }

    /// Begins a claim's transaction, with its `statement_timeout` (one round trip).
    async fn begin(&self) -> Result<Open<Postgres>, StoreError> {
        let begin = AssertSqlSafe(Arc::clone(&self.begin)).into_sql_str();
        Open::begin(self.store.pool(), Some(begin), None).await
    }

    /// The claim in the transaction on `connection`, the key's advisory lock tried first (one
    /// round trip more): a lock another transaction holds answers from the committed record,
    /// a replay or a conflict if there is one within its retention, pending otherwise.
    async fn claim_in(
        &self,
        connection: &mut PgConnection,
        claiming: Claiming<'_>,
    ) -> Result<Claim, StoreError> {
        let lock = lock_id(&self.store.sql.table, claiming.key);
        self.store.claim_on(connection, claiming, Some(lock)).await
    }

    /// The statement that completes the record in the claim's own transaction only: a failed
    /// statement of the create's aborted it (the update fails), and a `COMMIT` sent by the
    /// create ended it (the update finds no record of this transaction's).
    fn completing<'q>(
        &'q self,
        key: &'q str,
        token: &'q Token,
        completion: &'q Completion,
    ) -> Query<'q> {
        sqlx::query(self.store.sql.complete_in_transaction.clone())
            .bind(key)
            .bind(&token[..])
            .bind(&completion.response[..])
            .bind(self.store.base.retention_ms())
            .bind(completion.tombstone())
            .bind(completion.tombstone_ms)
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

crate::pooled::transactional_store!(TransactionalPostgresStore, PostgresStore);
