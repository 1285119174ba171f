//! The transactional PostgreSQL store: the claim, the create's own writes and the complete
//! commit together, or nothing happens. Needs PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`).
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Chunks, Reply, operation};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_idempotency::admission::{Admit, Refusal, admit_fn};
use tower_idempotency::store::{
    Operator, PgTransaction, PostgresStore, TransactionalPostgresStore,
};
use tower_idempotency::{Idempotency, IdempotencyLayer, LabelOperation, RequestBody, store_key};

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A store on tables of the test's own: the records and the labels the creates insert.
struct Db {
    store: TransactionalPostgresStore,
    labels: String,
}

impl Db {
    async fn new(name: &str) -> Self {
        let store = PostgresStore::connect(&database_url())
            .await
            .expect("PostgreSQL at DATABASE_URL")
            .table(&format!("tx_records_{name}"))
            .unwrap();
        store.migrate().await.unwrap();
        let labels = format!("tx_labels_{name}");
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {labels}; \
                 CREATE TABLE {labels} (label_id text PRIMARY KEY, request_id text NOT NULL); \
                 TRUNCATE tx_records_{name};"
            ))
            .await
            .unwrap();
        Self {
            store: TransactionalPostgresStore::new(store),
            labels,
        }
    }

    /// The label rows of `request_id`.
    async fn rows(&self, request_id: &str) -> i64 {
        let client = self.store.store().pool().get().await.unwrap();
        client
            .query_one(
                &format!("SELECT count(*) FROM {} WHERE request_id = $1", self.labels),
                &[&request_id],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Whether the record of `request_id` exists (committed).
    async fn recorded(&self, request_id: &str) -> bool {
        let key = store_key(None, &http::Method::POST, "/labels", request_id);
        self.store.store().inspect(&key).await.unwrap().is_some()
    }

    /// The layer over [`create`] on this store.
    fn service(&self) -> Guarded {
        Idempotency::new(create(self.labels.clone()), self.store.clone())
    }
}

/// The layer over [`create`].
type Guarded = Idempotency<Create, TransactionalPostgresStore>;

/// A create that inserts its label in the claim's transaction, then does what its parcel
/// says: `ok`, `fail` (an error), `panic`, `bad-sql` (a failed statement, then 201 all the
/// same), `slow` (two seconds before inserting).
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
            transaction
                .execute(
                    &format!("INSERT INTO {labels} (label_id, request_id) VALUES ($1, $2)"),
                    &[&label_id, &&*op.request_id],
                )
                .await
                .map_err(std::io::Error::other)?;
            match parcel.as_str() {
                "fail" => return Err(std::io::Error::other("the create failed")),
                "panic" => panic!("the create panicked"),
                "bad-sql" => {
                    let failed = transaction
                        .execute("SELECT * FROM no_such_table", &[])
                        .await;
                    assert!(failed.is_err());
                }
                _ => {}
            }
            let mut response = Response::new(Full::new(Bytes::from(format!(
                r#"{{"label_id":"{label_id}"}}"#
            ))));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, std::io::Error>(response)
        }
    });
    tower::util::BoxCloneSyncService::new(create)
}

async fn send<S>(service: &S, request_id: &str, parcel: &str) -> Reply
where
    S: tower::Service<
            Request<Chunks>,
            Response = Response<tower_idempotency::ResponseBody<Full<Bytes>>>,
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
    let service = IdempotencyLayer::new(db.store.clone())
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
async fn a_response_over_the_cap_rolls_back() {
    let db = Db::new("cap").await;
    let service = IdempotencyLayer::new(db.store.clone())
        .response_limit(4)
        .layer(create(db.labels.clone()));
    let over = send(&service, "c-1", "ok").await;
    assert_eq!(over.status, 500, "{:?}", over.body);
    assert_eq!(db.rows("c-1").await, 0);
    assert!(!db.recorded("c-1").await);
    assert_eq!(db.store.open_transactions(), 0);
}
