//! The transactional PostgreSQL store: the claim, the create's own writes and the complete
//! commit together, or nothing happens. Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

use crate::common;

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Chunks, Reply, operation};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row as _};
use tower::{Layer, ServiceExt};
use tower_idempotency::admission::{Admit, Refusal, admit_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::scope::store_key;
use tower_idempotency::store::Claim;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{
    Operator, PgTransaction, PostgresStore, TransactionalPostgresStore,
};
use tower_idempotency::{Idempotency, IdempotencyLayer, Store};

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

    /// The label rows of `request_id`.
    pub(crate) async fn rows(&self, request_id: &str) -> i64 {
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

    /// Whether the record of `request_id` exists (committed).
    async fn recorded(&self, request_id: &str) -> bool {
        let key = store_key(None, &http::Method::POST, "/labels", request_id);
        self.store.store().inspect(&key).await.unwrap().is_some()
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

    /// Waits until a create holds a transaction open.
    async fn one_open(&self, first: &tokio::task::JoinHandle<Reply>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.store.open_transactions() == 0 {
            assert!(!first.is_finished(), "the attempt ended before its create");
            assert!(Instant::now() < deadline, "the attempt never claimed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The layer over [`create`] on this store.
    fn service(&self) -> Guarded {
        tower::Layer::layer(
            &tower_idempotency::IdempotencyLayer::new(
                self.store.clone(),
                tower_idempotency::operation::LabelContract,
            )
            .global_keys()
            // The create reads the operation from the request extensions.
            .value_extension(true),
            create(self.labels.clone()),
        )
    }
}

/// The layer over [`create`].
type Guarded = Idempotency<Create, TransactionalPostgresStore, LabelContract>;

/// A create that inserts its label in the claim's transaction, then does what its parcel
/// says: `ok`, `fail` (an error), `panic`, `bad-sql` (a failed statement, then 201 all the
/// same), `commit` (a `COMMIT` of its own, then 201), `slow` (two seconds before inserting).
/// What [`create`] is, named.
type Create = tower::util::BoxCloneSyncService<
    Request<RequestBody<Chunks>>,
    Response<Full<Bytes>>,
    std::io::Error,
>;

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

async fn send<S>(service: &S, request_id: &str, parcel: &str) -> Reply
where
    S: tower::Service<
            Request<Chunks>,
            Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
            Error = std::io::Error,
        > + Clone,
{
    let response = service
        .clone()
        .oneshot(operation(request_id, parcel))
        .await
        .unwrap();
    Reply::read(response).await
}

#[tokio::test]
async fn the_record_and_the_creates_row_commit_together_and_replay() {
    let db = Db::new("commit").await;
    let service = db.service();
    let first = send(&service, "t-1", "ok").await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(db.rows("t-1").await, 1);
    assert!(db.recorded("t-1").await);
    let replay = send(&service, "t-1", "ok").await;
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));
    assert_eq!(db.rows("t-1").await, 1);
    assert_eq!(db.store.open_transactions(), 0);
}

#[tokio::test]
async fn a_create_that_fails_or_panics_leaves_no_row_and_a_free_key() {
    let db = Db::new("fail").await;
    let service = db.service();
    for (request_id, how) in [("f-1", "fail"), ("f-2", "panic")] {
        let failed = send(&service, request_id, how).await;
        assert_eq!(failed.status, 500, "{how}: {:?}", failed.body);
        assert_eq!(db.rows(request_id).await, 0, "{how}: rolled back");
        assert!(!db.recorded(request_id).await, "{how}: the key is free");
        assert_eq!(db.store.open_transactions(), 0);
    }
    // The same operation again (another parcel would conflict, were anything recorded).
    let retry = send(&service, "f-1", "ok").await;
    assert_eq!(retry.status, 201);
    assert_eq!(db.rows("f-1").await, 1);
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

#[tokio::test]
async fn an_admission_refusal_rolls_the_claim_back() {
    let db = Db::new("admit").await;
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = refuse.clone();
    let admission = admit_fn(move |_: &LabelOperation| {
        let refused = flag.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            if refused {
                Admit::Refuse(Refusal::TooManyRequests)
            } else {
                Admit::Proceed(())
            }
        }
    });
    let service = IdempotencyLayer::new(db.store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .admission(admission)
        .layer(create(db.labels.clone()));
    let refused = send(&service, "a-1", "ok").await;
    assert_eq!(refused.status, 429);
    assert!(!db.recorded("a-1").await);
    assert_eq!(db.store.open_transactions(), 0);
    refuse.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(send(&service, "a-1", "ok").await.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_attempt_while_the_first_is_open_is_pending_at_once() {
    let db = Db::new("pending").await;
    let service = db.service();
    let first = {
        let service = service.clone();
        tokio::spawn(async move { send(&service, "p-1", "slow").await })
    };
    // The first claims, then creates for two seconds in its open transaction.
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.store.open_transactions() == 0 {
        if first.is_finished() {
            panic!(
                "the first attempt ended before its create: {:?}",
                first.await
            );
        }
        assert!(Instant::now() < deadline, "the first attempt never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = Instant::now();
    let pending = send(&service, "p-1", "slow").await;
    assert_eq!(pending.status, 409, "{:?}", pending.body);
    assert!(
        std::str::from_utf8(&pending.body)
            .unwrap()
            .contains("request_pending")
    );
    assert!(
        asked.elapsed() < Duration::from_millis(900),
        "not blocked on the open row"
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let replay = send(&service, "p-1", "slow").await;
    assert_eq!(replay.body, first.body);
    assert_eq!(db.rows("p-1").await, 1);
}

#[tokio::test]
async fn a_response_over_the_cap_commits_with_its_compact_record() {
    let db = Db::new("cap").await;
    let service = IdempotencyLayer::new(db.store.clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .response_limit(4)
        .layer(create(db.labels.clone()));
    let over = send(&service, "c-1", "ok").await;
    assert_eq!(over.status, 201, "{:?}", over.body);
    assert_eq!(&over.body[..], br#"{"label_id":"label-c-1"}"#);
    assert_eq!(db.rows("c-1").await, 1);
    assert!(db.recorded("c-1").await);
    assert_eq!(db.store.open_transactions(), 0);
    let retry = send(&service, "c-1", "ok").await;
    assert_eq!(retry.status, 201);
    assert!(retry.body.is_empty());
    assert_eq!(retry.headers["idempotent-body-omitted"], "true");
    assert_eq!(db.rows("c-1").await, 1);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replays_and_conflicts_of_a_completed_key_are_never_pending() {
    let db = Db::new("replays").await;
    let service = db.service();
    let first = send(&service, "r-1", "ok").await;
    assert_eq!(first.status, 201);
    let replays: Vec<_> = (0..50)
        .map(|i| {
            let service = service.clone();
            let parcel = if i % 5 == 0 { "other" } else { "ok" };
            tokio::spawn(async move { (parcel, send(&service, "r-1", parcel).await) })
        })
        .collect();
    for replay in replays {
        let (parcel, reply) = replay.await.unwrap();
        if parcel == "ok" {
            assert_eq!((reply.status.as_u16(), &reply.body), (201, &first.body));
        } else {
            assert_eq!(
                (reply.status.as_u16(), &reply.body[..]),
                (409, &br#"{"error":"idempotency_conflict"}"#[..])
            );
        }
    }
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
        match tokio::time::timeout(cut, store.claim(&key, &fingerprint)).await {
            Err(_) => cancelled += 1,
            Ok(Ok(Claim::New(reservation))) => {
                claimed += 1;
                store.release(&key, &reservation).await.unwrap();
            }
            Ok(other) => panic!("{other:?}"),
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
    assert_eq!(retry.outcome, Some(tower_idempotency::Outcome::Replay));
    assert_eq!(db.rows("r-1").await, 1);
}

/// By default a handler that wrote its row in the claim's transaction and then answered a
/// server error leaves nothing: the `500` is passed on unstored, the transaction rolled back,
/// the key free (a retry runs the create again, and another payload may take the key); a
/// client error commits with its row and is replayed. `StoredResponses::Every` keeps the
/// `500` too, committed with its row.
#[tokio::test]
async fn a_server_error_rolls_back_by_default_and_every_keeps_it() {
    use tower_idempotency::StoredResponses;

    let db = Db::new("server_error").await;
    // The default is the store's, through the wrappers that forward it too.
    use tower_idempotency::store::DynStore;
    use tower_idempotency::testing::{Journal, RecordingStore};
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
    let service = db.service();
    for _ in 0..2 {
        let failed = send(&service, "se-1", "server-error").await;
        assert_eq!(failed.status, 500);
        assert_eq!(failed.outcome, Some(tower_idempotency::Outcome::Unstored));
        assert_eq!(db.rows("se-1").await, 0, "rolled back");
    }
    assert_eq!(
        send(&service, "se-1", "ok").await.status,
        201,
        "the key is free"
    );
    assert_eq!(db.rows("se-1").await, 1);

    let refused = send(&service, "ce-1", "client-error").await;
    assert_eq!(refused.status, 422);
    assert_eq!(db.rows("ce-1").await, 1, "committed with its answer");
    let again = send(&service, "ce-1", "client-error").await;
    assert_eq!(
        (again.status, again.outcome),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(tower_idempotency::Outcome::Replay)
        )
    );
    assert_eq!(db.rows("ce-1").await, 1);
    assert_eq!(db.store.open_transactions(), 0);

    let every = tower::Layer::layer(
        &IdempotencyLayer::new(db.store.clone(), LabelContract)
            .global_keys()
            .value_extension(true)
            .store_responses(StoredResponses::Every),
        create(db.labels.clone()),
    );
    assert_eq!(send(&every, "se-2", "server-error").await.status, 500);
    assert_eq!(db.rows("se-2").await, 1, "committed with its 500");
    let replayed = send(&every, "se-2", "server-error").await;
    assert_eq!(
        (replayed.status, replayed.outcome),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(tower_idempotency::Outcome::Replay)
        )
    );
}
