//! The transactional PostgreSQL store: the claim, the create's own writes and the complete
//! commit together, or nothing happens. Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

use crate::common;
use crate::transactional_cases::{Create, TxDb, send, transactional_cases};

use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Chunks, operation};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row as _};
use tower::{Layer, ServiceExt};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::scope::store_key;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Store;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{
    Operator, PgTransaction, PostgresStore, TransactionalPostgresStore,
};

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A store on tables of the test's own: the records and the labels the creates insert.
pub(crate) struct Db {
    pub(crate) store: TransactionalPostgresStore,
    pub(crate) labels: String,
}

impl Db {
    pub(crate) async fn new(name: &str) -> Self {
        Self::retaining(name, Duration::from_secs(24 * 3600)).await
    }

    /// As [`Db::new`], completed records kept for `retention`.
    async fn retaining(name: &str, retention: Duration) -> Self {
        let store = PostgresStore::connect(&database_url())
            .await
            .expect("PostgreSQL at DATABASE_URL")
            .table(&format!("tx_records_{name}"))
            .unwrap()
            .retention(retention);
        store.migrate().await.unwrap();
        let labels = format!("tx_labels_{name}");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {labels}; \
             CREATE TABLE {labels} (label_id text PRIMARY KEY, request_id text NOT NULL); \
             TRUNCATE tx_records_{name};"
        )))
        .execute(store.pool())
        .await
        .unwrap();
        Self {
            store: TransactionalPostgresStore::new(store),
            labels,
        }
    }

    /// Waits until the committed record of `request_id` is past its retention.
    async fn expired(&self, request_id: &str) {
        let key = store_key(None, &http::Method::POST, "/labels", request_id);
        let sql = format!(
            "SELECT expires_at <= now() FROM {} WHERE key = $1",
            self.store.store().table_name()
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(&key)
                .fetch_one(self.store.store().pool())
                .await
                .unwrap();
            if row.get::<Option<bool>, _>(0) == Some(true) {
                return;
            }
            assert!(Instant::now() < deadline, "the record never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl TxDb for Db {
    type Store = TransactionalPostgresStore;

    async fn make(name: &str) -> Self {
        Self::new(name).await
    }

    fn store(&self) -> &Self::Store {
        &self.store
    }

    fn open_transactions(&self) -> usize {
        self.store.open_transactions()
    }

    async fn rows(&self, request_id: &str) -> i64 {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE request_id = $1",
            self.labels
        )))
        .bind(request_id)
        .fetch_one(self.store.store().pool())
        .await
        .unwrap()
        .get(0)
    }

    fn create(&self) -> Create {
        create(self.labels.clone())
    }
}

transactional_cases!();

fn create(labels: String) -> Create {
    let create = tower::service_fn(move |request: Request<RequestBody<Chunks>>| {
        let labels = labels.clone();
        async move {
            let transaction = request
                .extensions()
                .get::<PgTransaction>()
                .expect("the claim's transaction")
                .clone();
            let op = request
                .extensions()
                .get::<LabelOperation>()
                .expect("the operation")
                .clone();
            let parcel = op.parcel_id.to_string();
            if parcel == "slow" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let label_id = format!("label-{}", op.request_id);
            let mut connection = transaction.acquire().await.map_err(std::io::Error::other)?;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {labels} (label_id, request_id) VALUES ($1, $2)"
            )))
            .bind(&label_id)
            .bind(&*op.request_id)
            .execute(&mut *connection)
            .await
            .map_err(std::io::Error::other)?;
            // Its own row is visible to it, in its transaction, and to nobody else yet.
            let select = format!("SELECT label_id FROM {labels} WHERE request_id = $1");
            let row = sqlx::query(AssertSqlSafe(select.as_str()))
                .bind(&*op.request_id)
                .fetch_optional(&mut *connection)
                .await
                .map_err(std::io::Error::other)?
                .expect("its own row");
            let label_id: String = row.get(0);
            let rows = sqlx::query(AssertSqlSafe(select.as_str()))
                .bind(&*op.request_id)
                .fetch_all(&mut *connection)
                .await
                .map_err(std::io::Error::other)?;
            assert_eq!(rows.len(), 1);
            match parcel.as_str() {
                "fail" => return Err(std::io::Error::other("the create failed")),
                "panic" => panic!("the create panicked"),
                "commit" => {
                    sqlx::raw_sql("COMMIT")
                        .execute(&mut *connection)
                        .await
                        .unwrap();
                }
                "bad-sql" => {
                    let failed = sqlx::query("SELECT * FROM no_such_table")
                        .execute(&mut *connection)
                        .await;
                    assert!(failed.is_err());
                }
                _ => {}
            }
            // The transaction's connection goes back before the create answers.
            drop(connection);
            let mut response = Response::new(Full::new(Bytes::from(format!(
                r#"{{"label_id":"{label_id}"}}"#
            ))));
            *response.status_mut() = match parcel.as_str() {
                "server-error" => StatusCode::INTERNAL_SERVER_ERROR,
                "client-error" => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::CREATED,
            };
            Ok::<_, std::io::Error>(response)
        }
    });
    tower::util::BoxCloneSyncService::new(create)
}

#[tokio::test]
async fn a_transaction_that_cannot_commit_answers_503_and_leaves_nothing() {
    let db = Db::new("abort").await;
    let service = db.service();
    let failed = send(&service, "b-1", "bad-sql").await;
    assert_eq!(failed.status, 503, "{:?}", failed.body);
    assert!(
        std::str::from_utf8(&failed.body)
            .unwrap()
            .contains("store_unavailable"),
        "{:?}",
        failed.body
    );
    assert_eq!(db.rows("b-1").await, 0);
    assert!(!db.recorded("b-1").await);
    assert_eq!(send(&service, "b-1", "ok").await.status, 201);
}

/// A response body that panics when read.
struct Panicking;

impl http_body::Body for Panicking {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        panic!("the created response's body panicked")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_that_panics_rolls_back_and_frees_the_key() {
    let db = Db::new("body_panic").await;
    let labels = db.labels.clone();
    let create = tower::service_fn(move |request: Request<RequestBody<Chunks>>| {
        let labels = labels.clone();
        async move {
            let transaction = request.extensions().get::<PgTransaction>().unwrap().clone();
            let mut connection = transaction.acquire().await.map_err(std::io::Error::other)?;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {labels} (label_id, request_id) VALUES ('l', 'z-1')"
            )))
            .execute(&mut *connection)
            .await
            .map_err(std::io::Error::other)?;
            drop(connection);
            Ok::<_, std::io::Error>(Response::new(Panicking))
        }
    });
    let service = IdempotencyLayer::new(db.store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .layer(create);
    let sent = tokio::spawn(service.oneshot(operation("z-1", "ok")));
    assert!(sent.await.is_err(), "the panic reached the caller");
    // The transaction is rolled back, not left open holding the key and a connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.store.open_transactions() > 0 {
        assert!(Instant::now() < deadline, "the transaction stayed open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(db.rows("z-1").await, 0);
    assert!(!db.recorded("z-1").await);
    assert_eq!(send(&db.service(), "z-1", "ok").await.status, 201);
}

#[tokio::test]
async fn a_create_that_commits_by_itself_is_never_answered_as_created() {
    let db = Db::new("self_commit").await;
    let service = db.service();
    let reply = send(&service, "s-1", "commit").await;
    assert_eq!(reply.status, 503, "{:?}", reply.body);
    // Its own COMMIT made its row and the pending record durable: the key stays pending, as
    // in the plain store, never created twice.
    assert_eq!(db.rows("s-1").await, 1);
    assert_eq!(send(&service, "s-1", "ok").await.status, 409);
    assert_eq!(db.rows("s-1").await, 1);
}

#[tokio::test]
async fn a_claim_cancelled_mid_call_leaves_no_connection_in_a_transaction() {
    let db = Db::new("cancel").await;
    let options = PgConnectOptions::from_str(&database_url())
        .unwrap()
        .application_name("tx-cancel-test");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let store = TransactionalPostgresStore::new(
        PostgresStore::new(pool).table("tx_records_cancel").unwrap(),
    );
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("c-1", "p");
    let idle_in_transaction = || async {
        let row = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tx-cancel-test' \
             AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(db.store.store().pool())
        .await
        .unwrap();
        row.get::<i64, _>(0)
    };
    // How long a whole claim takes here, on a warm connection: the pool's one connection
    // made (its TLS handshake) and the statements prepared by a claim before.
    let Ok(Claim::New(reservation)) = store.claim("c-warm", &fingerprint).await else {
        panic!("a new claim")
    };
    store.release("c-warm", &reservation).await.unwrap();
    let started = Instant::now();
    let Ok(Claim::New(reservation)) = store.claim("c-warm", &fingerprint).await else {
        panic!("a new claim")
    };
    store.release("c-warm", &reservation).await.unwrap();
    let whole = started.elapsed();
    let (mut cancelled, mut claimed) = (0, 0);
    for attempt in 0..80u32 {
        let key = format!("c-{attempt}");
        // Cut short at points spread over a claim's time: before, during and after its
        // statements (a connection cut short is closed, so the next opens a new one); every
        // tenth attempt runs whole.
        let cut = if attempt % 10 == 9 {
            Duration::from_secs(5)
        } else {
            whole * (attempt % 10) / 6
        };
        // Every tenth from its first, cut at its first poll: a timeout shorter than the
        // timer's millisecond may never fire before a quick claim ends.
        if attempt % 10 == 0 {
            let mut claim = std::pin::pin!(store.claim(&key, &fingerprint));
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(claim.as_mut(), cx))
            })
            .await;
            match first {
                std::task::Poll::Pending => cancelled += 1,
                std::task::Poll::Ready(Ok(Claim::New(reservation))) => {
                    claimed += 1;
                    store.release(&key, &reservation).await.unwrap();
                }
                std::task::Poll::Ready(other) => panic!("{other:?}"),
            }
        } else {
            match tokio::time::timeout(cut, store.claim(&key, &fingerprint)).await {
                Err(_) => cancelled += 1,
                Ok(Ok(Claim::New(reservation))) => {
                    claimed += 1;
                    store.release(&key, &reservation).await.unwrap();
                }
                Ok(other) => panic!("{other:?}"),
            }
        }
        // No connection of the store's is left idle inside a transaction, in the pool or
        // anywhere (a closed one's session ends as soon as the server sees it go).
        let deadline = Instant::now() + Duration::from_secs(2);
        while idle_in_transaction().await > 0 {
            assert!(
                Instant::now() < deadline,
                "attempt {attempt}: a connection stayed in a transaction"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert!(
        cancelled > 0 && claimed > 0,
        "{cancelled} cut short, {claimed} claimed"
    );
}

#[tokio::test]
async fn renewing_holds_only_for_an_open_transaction() {
    let db = Db::new("renew").await;
    let store = &db.store;
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("n-1", "p");
    let lease = Duration::from_secs(5);
    let stranger = tower_idempotency::store::Reservation::generate();
    let lost = store.renew("n-1", &stranger, lease).await.unwrap_err();
    assert_eq!(
        lost.kind(),
        tower_idempotency::store::StoreErrorKind::ReservationLost
    );
    let Ok(Claim::New(reservation)) = store.claim("n-1", &fingerprint).await else {
        panic!("a new claim")
    };
    store.renew("n-1", &reservation, lease).await.unwrap();
    store.release("n-1", &reservation).await.unwrap();
    let ended = store.renew("n-1", &reservation, lease).await.unwrap_err();
    assert_eq!(
        ended.kind(),
        tower_idempotency::store::StoreErrorKind::ReservationLost
    );
    // Released twice: the second finds no transaction.
    let again = store.release("n-1", &reservation).await.unwrap_err();
    assert_eq!(
        again.kind(),
        tower_idempotency::store::StoreErrorKind::ReservationLost
    );
}

#[tokio::test]
async fn an_operator_sees_resolves_and_forgets_a_stuck_key_through_the_store() {
    use tower_idempotency::store::RecordState;
    use tower_idempotency::store::StoredResponse;

    let db = Db::new("operator").await;
    let service = db.service();
    // A create that commits by itself leaves its key pending for good: the operator's case.
    assert_eq!(send(&service, "o-1", "commit").await.status, 503);
    let key = store_key(None, &http::Method::POST, "/labels", "o-1");
    let store = &db.store;
    assert_eq!(
        store.pending_older_than(Duration::ZERO).await.unwrap(),
        std::slice::from_ref(&key)
    );
    let info = store.inspect(&key).await.unwrap().expect("its record");
    assert_eq!(info.state, RecordState::Pending);
    let resolved = StoredResponse::new(
        StatusCode::CREATED,
        http::HeaderMap::new(),
        Bytes::from_static(b"resolved by hand"),
    );
    store.resolve(&key, &resolved).await.unwrap();
    let replay = send(&service, "o-1", "commit").await;
    assert_eq!(
        (replay.status.as_u16(), &replay.body[..]),
        (201, &b"resolved by hand"[..])
    );
    assert!(store.forget(&key).await.unwrap());
    assert!(store.inspect(&key).await.unwrap().is_none());
    assert!(!store.forget(&key).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_an_expired_key_is_created_again_is_pending_not_its_old_response() {
    let db = Db::retaining("expired_mid_create", Duration::from_millis(500)).await;
    let service = db.service();
    let first = send(&service, "x-1", "slow").await;
    assert_eq!(first.status, 201);
    db.expired("x-1").await;
    // The first intent's label stands for a resource of its own; the key's new create makes
    // another.
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {}", db.labels)))
        .execute(db.store.store().pool())
        .await
        .unwrap();
    let again = {
        let service = service.clone();
        tokio::spawn(async move { send(&service, "x-1", "slow").await })
    };
    db.one_open(&again).await;
    // Its transaction holds the key and takes the expired record over: a retry is told the
    // key is in flight, neither given the old label nor refused as another body.
    let retry = send(&service, "x-1", "slow").await;
    assert_eq!(retry.status, 409, "{:?}", retry.body);
    assert!(
        std::str::from_utf8(&retry.body)
            .unwrap()
            .contains("request_pending"),
        "{:?}",
        retry.body
    );
    let other_body = send(&service, "x-1", "ok").await;
    assert_eq!(other_body.status, 409, "{:?}", other_body.body);
    assert!(
        std::str::from_utf8(&other_body.body)
            .unwrap()
            .contains("request_pending")
    );
    let again = again.await.unwrap();
    assert_eq!(again.status, 201);
    assert_eq!(send(&service, "x-1", "slow").await.body, again.body);
    assert_eq!(db.rows("x-1").await, 1);
}

#[tokio::test]
async fn retention_counts_from_the_complete_not_the_claim() {
    // The create runs two seconds, as long as the window: a record whose retention counted
    // from the claim's transaction would commit expired, and the retry would create again.
    let db = Db::retaining("retention_from_complete", Duration::from_secs(2)).await;
    let service = db.service();
    let first = send(&service, "r-1", "slow").await;
    assert_eq!(first.status, 201);
    let retry = send(&service, "r-1", "slow").await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, first.body);
    assert_eq!(
        retry.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    assert_eq!(db.rows("r-1").await, 1);
}

/// The default of which responses are stored is the store's, through the wrappers that forward
/// it too: a transactional store rolls a server error back, the plain one stores every answer.
#[tokio::test]
async fn the_stored_responses_default_is_the_stores_through_its_wrappers() {
    use tower_idempotency::layer::StoredResponses;
    use tower_idempotency::store::DynStore;
    use tower_idempotency::testing::{Journal, RecordingStore};

    let db = Db::new("stored_default").await;
    let except = StoredResponses::ExceptServerErrors;
    assert_eq!(StoredResponses::default_for(&db.store), except);
    assert_eq!(
        StoredResponses::default_for(&DynStore::new(db.store.clone())),
        except
    );
    let without = DynStore::without_operator(db.store.clone());
    assert_eq!(StoredResponses::default_for(&without), except);
    let recording = RecordingStore::new(db.store.clone(), Journal::new());
    assert_eq!(StoredResponses::default_for(&recording), except);
    assert_eq!(
        StoredResponses::default_for(db.store.store()),
        StoredResponses::Every
    );
}
