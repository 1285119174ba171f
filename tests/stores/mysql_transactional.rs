//! The transactional MySQL store: the claim, the create's own writes and the complete commit
//! together in one InnoDB transaction, or nothing happens. Needs MySQL or MariaDB at
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`).
#![cfg(feature = "mysql")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Chunks, Reply, operation};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sqlx::{AssertSqlSafe, Connection as _, Executor as _, Row as _};
use tower::{Layer, ServiceExt};
use tower_idempotency::admission::{Admit, Refusal, admit_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::scope::store_key;
use tower_idempotency::store::mysql::sqlx;
use tower_idempotency::store::{MySqlStore, MySqlTransaction, Operator, TransactionalMySqlStore};
use tower_idempotency::{Idempotency, IdempotencyLayer};

fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A store on tables of the test's own: the records and the labels the creates insert.
pub(crate) struct Db {
    pub(crate) store: TransactionalMySqlStore,
    pub(crate) labels: String,
}

impl Db {
    pub(crate) async fn new(name: &str) -> Self {
        Self::retaining(name, Duration::from_secs(24 * 3600)).await
    }

    /// As [`Db::new`], completed records kept for `retention`.
    async fn retaining(name: &str, retention: Duration) -> Self {
        let records = format!("tx_records_{name}");
        let labels = format!("tx_labels_{name}");
        let mut connection = sqlx::MySqlConnection::connect(&mysql_url())
            .await
            .expect("MySQL at MYSQL_URL");
        for statement in [
            format!("DROP TABLE IF EXISTS {records}"),
            format!("DROP TABLE IF EXISTS {labels}"),
            format!(
                "CREATE TABLE {labels} (label_id VARCHAR(200) PRIMARY KEY, \
                 request_id VARCHAR(200) NOT NULL) ENGINE = InnoDB"
            ),
            format!("DROP TABLE IF EXISTS {labels}_hot"),
            // Rows a deadlock is made on: the test's transaction updates 300 of them, so
            // that the create's is the lighter one, InnoDB's victim.
            format!(
                "CREATE TABLE {labels}_hot (id INT PRIMARY KEY, n INT NOT NULL) ENGINE = InnoDB"
            ),
            format!(
                "INSERT INTO {labels}_hot (id, n) WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL \
                 SELECT i + 1 FROM s WHERE i < 300) SELECT i, 0 FROM s"
            ),
        ] {
            connection.execute(AssertSqlSafe(statement)).await.unwrap();
        }
        let store = MySqlStore::connect(&mysql_url())
            .await
            .unwrap()
            .table(&records)
            .unwrap()
            .retention(retention);
        store.migrate().await.unwrap();
        Self {
            store: TransactionalMySqlStore::new(store),
            labels,
        }
    }

    /// The label rows of `request_id`, committed.
    pub(crate) async fn rows(&self, request_id: &str) -> i64 {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE request_id = ?",
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
            &IdempotencyLayer::new(self.store.clone(), LabelContract)
                .global_keys()
                // The create reads the operation from the request extensions.
                .value_extension(true),
            create(self.labels.clone()),
        )
    }
}

/// The layer over [`create`].
type Guarded = Idempotency<Create, TransactionalMySqlStore, LabelContract>;

/// A create that inserts its label in the claim's transaction, in plain sqlx, then does what
/// its parcel says: `ok`, `fail` (an error), `panic`, `bad-sql` (a failed statement, then 201
/// all the same: MySQL rolls back the statement alone), `rollback` (a `ROLLBACK` of its own,
/// then 201), `killed` (its connection killed by the server, then 201), `slow` (two seconds
/// before inserting).
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
                .get::<MySqlTransaction>()
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
                "INSERT INTO {labels} (label_id, request_id) VALUES (?, ?)"
            )))
            .bind(&label_id)
            .bind(&*op.request_id)
            .execute(&mut *connection)
            .await
            .map_err(std::io::Error::other)?;
            // Its own row is visible to it, in its transaction.
            let select = format!("SELECT label_id FROM {labels} WHERE request_id = ?");
            let row = sqlx::query(AssertSqlSafe(select))
                .bind(&*op.request_id)
                .fetch_optional(&mut *connection)
                .await
                .map_err(std::io::Error::other)?
                .expect("its own row");
            let label_id: String = row.get(0);
            match parcel.as_str() {
                "fail" => return Err(std::io::Error::other("the create failed")),
                "panic" => panic!("the create panicked"),
                "rollback" => {
                    connection.execute("ROLLBACK").await.unwrap();
                }
                "killed" => {
                    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                        .fetch_one(&mut *connection)
                        .await
                        .unwrap();
                    let mut killer = sqlx::MySqlConnection::connect(&mysql_url()).await.unwrap();
                    killer
                        .execute(AssertSqlSafe(format!("KILL {id}")))
                        .await
                        .unwrap();
                }
                "deadlock" => {
                    // Made the victim of a deadlock with a heavier transaction of the test's,
                    // then carrying on as a careless create would: its label again.
                    let hot = format!("{labels}_hot");
                    sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {hot} SET n = n + 1 WHERE id = 1"
                    )))
                    .execute(&mut *connection)
                    .await
                    .unwrap();
                    let other = tokio::spawn(async move {
                        let mut other = sqlx::MySqlConnection::connect(&mysql_url()).await.unwrap();
                        for statement in [
                            "BEGIN".to_owned(),
                            format!("UPDATE {hot} SET n = n + 1 WHERE id > 1"),
                            format!("UPDATE {hot} SET n = n + 1 WHERE id = 1"),
                            "COMMIT".to_owned(),
                        ] {
                            other.execute(AssertSqlSafe(statement)).await.unwrap();
                        }
                    });
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let victim = sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {labels}_hot SET n = n + 1 WHERE id = 2"
                    )))
                    .execute(&mut *connection)
                    .await;
                    assert!(victim.is_err(), "the create is the deadlock's victim");
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO {labels} (label_id, request_id) VALUES (?, ?)"
                    )))
                    .bind(&label_id)
                    .bind(&*op.request_id)
                    .execute(&mut *connection)
                    .await
                    .map_err(std::io::Error::other)?;
                    other.await.unwrap();
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
    let retry = send(&service, "f-1", "ok").await;
    assert_eq!(retry.status, 201);
    assert_eq!(db.rows("f-1").await, 1);
}

/// A transaction that cannot commit its record (ended by the create's own `ROLLBACK`, or
/// by the server killing its connection) is answered `503`, never `201`, and leaves nothing;
/// the retry creates once.
#[tokio::test]
async fn a_transaction_that_cannot_commit_answers_503_and_leaves_nothing() {
    let db = Db::new("abort").await;
    let service = db.service();
    for (request_id, how) in [("b-1", "rollback"), ("b-2", "killed")] {
        let failed = send(&service, request_id, how).await;
        assert_eq!(failed.status, 503, "{how}: {:?}", failed.body);
        assert!(
            std::str::from_utf8(&failed.body)
                .unwrap()
                .contains("store_unavailable"),
            "{:?}",
            failed.body
        );
        assert_eq!(db.rows(request_id).await, 0, "{how}");
        assert!(!db.recorded(request_id).await, "{how}");
        assert_eq!(send(&service, request_id, "ok").await.status, 201, "{how}");
        assert_eq!(db.rows(request_id).await, 1, "{how}");
    }
}

/// MySQL rolls a failed statement back alone, the transaction going on: a create that answers
/// 201 after one commits its rows with its record.
#[tokio::test]
async fn a_failed_statement_the_create_survives_commits_with_it() {
    let db = Db::new("bad_sql").await;
    let service = db.service();
    assert_eq!(send(&service, "s-1", "bad-sql").await.status, 201);
    assert_eq!(db.rows("s-1").await, 1);
    assert!(db.recorded("s-1").await);
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

/// While the first attempt's transaction holds the key, a second is told `request_pending`
/// at once (`FOR UPDATE NOWAIT`), not held on the open row; afterwards it replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_attempt_while_the_first_is_open_is_pending_at_once() {
    let db = Db::new("pending").await;
    let service = db.service();
    let first = {
        let service = service.clone();
        tokio::spawn(async move { send(&service, "p-1", "slow").await })
    };
    db.one_open(&first).await;
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

/// Concurrent retries of keys under way and completed: one row per key answered, every answer
/// the key's one 201 or `request_pending`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_make_one_row_per_key() {
    let db = Db::new("concurrent").await;
    let service = db.service();
    let tasks: Vec<_> = (0..120)
        .map(|i| {
            let service = service.clone();
            let request_id = format!("c-{}", i % 6);
            tokio::spawn(
                async move { (request_id.clone(), send(&service, &request_id, "ok").await) },
            )
        })
        .collect();
    let mut created = std::collections::HashMap::new();
    for task in tasks {
        let (request_id, reply) = task.await.unwrap();
        match reply.status.as_u16() {
            201 => {
                let body = created
                    .entry(request_id)
                    .or_insert_with(|| reply.body.clone());
                assert_eq!(*body, reply.body, "one 201 per key, replayed");
            }
            409 => assert!(
                std::str::from_utf8(&reply.body)
                    .unwrap()
                    .contains("request_pending"),
                "{:?}",
                reply.body
            ),
            other => panic!("{other}: {:?}", reply.body),
        }
    }
    for i in 0..6 {
        let request_id = format!("c-{i}");
        assert_eq!(db.rows(&request_id).await, 1, "{request_id}");
    }
    assert_eq!(db.store.open_transactions(), 0);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_an_expired_key_is_created_again_is_pending_not_its_old_response() {
    let db = Db::retaining("expired_mid_create", Duration::from_millis(500)).await;
    let service = db.service();
    let first = send(&service, "x-1", "ok").await;
    assert_eq!(first.status, 201);
    tokio::time::sleep(Duration::from_millis(700)).await;
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {}", db.labels)))
        .execute(db.store.store().pool())
        .await
        .unwrap();
    let again = {
        let service = service.clone();
        tokio::spawn(async move { send(&service, "x-1", "slow").await })
    };
    db.one_open(&again).await;
    let retry = send(&service, "x-1", "slow").await;
    assert_eq!(retry.status, 409, "{:?}", retry.body);
    assert!(
        std::str::from_utf8(&retry.body)
            .unwrap()
            .contains("request_pending"),
        "{:?}",
        retry.body
    );
    let again = again.await.unwrap();
    assert_eq!(again.status, 201);
    assert_eq!(send(&service, "x-1", "slow").await.body, again.body);
    assert_eq!(db.rows("x-1").await, 1);
}

/// First attempts of a free key all at once, the create slow: the one that inserts creates,
/// and every other is `request_pending` at once, the ones whose insert met the first's
/// included (on MariaDB the insert waits for no lock), never held until a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_first_attempts_are_pending_at_once_but_one() {
    let db = Db::new("simultaneous").await;
    let service = db.service();
    for round in 0..3 {
        let request_id = format!("s-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(40));
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let (service, barrier, request_id) =
                    (service.clone(), barrier.clone(), request_id.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let asked = Instant::now();
                    let reply = send(&service, &request_id, "slow").await;
                    (reply, asked.elapsed())
                })
            })
            .collect();
        let mut created = 0;
        for task in tasks {
            let (reply, took) = task.await.unwrap();
            match reply.status.as_u16() {
                201 => created += 1,
                409 => assert!(
                    took < Duration::from_millis(900),
                    "pending after {took:?}, held on the open row"
                ),
                other => panic!("{other}: {:?}", reply.body),
            }
        }
        assert_eq!(created, 1, "round {round}");
        assert_eq!(db.rows(&request_id).await, 1);
    }
}

/// A create made the victim of a deadlock (InnoDB rolls its whole transaction back, the
/// claim's record with it) that carries on and writes again: nothing it wrote after commits,
/// the answer is `503`, and the retry creates once. Before, the session fell back to
/// autocommit and the create's later write committed on its own: the retry made a second row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_carries_on_after_a_deadlock_commits_nothing() {
    let db = Db::new("deadlock").await;
    let service = db.service();
    let failed = send(&service, "d-1", "deadlock").await;
    assert_eq!(failed.status, 503, "{:?}", failed.body);
    assert_eq!(db.rows("d-1").await, 0, "nothing of the create's committed");
    assert!(!db.recorded("d-1").await);
    assert_eq!(send(&service, "d-1", "ok").await.status, 201);
    assert_eq!(db.rows("d-1").await, 1, "created once");
}

/// The session a claim's transaction ran in goes back to the pool as it was handed out
/// (autocommit on), whatever became of the create: created, failed, panicked or rolled back
/// by itself.
#[tokio::test]
async fn a_pooled_session_comes_back_with_autocommit_on() {
    let db = Db::new("autocommit").await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .unwrap();
    let store = MySqlStore::new(pool.clone())
        .table(db.store.store().table_name())
        .unwrap();
    let service = IdempotencyLayer::new(TransactionalMySqlStore::new(store), LabelContract)
        .global_keys()
        .value_extension(true)
        .layer(create(db.labels.clone()));
    for (request_id, how, status) in [
        ("m-1", "ok", 201),
        ("m-2", "fail", 500),
        ("m-3", "panic", 500),
        ("m-4", "rollback", 503),
    ] {
        assert_eq!(
            send(&service, request_id, how).await.status,
            status,
            "{how}"
        );
        let autocommit: i64 = sqlx::query_scalar("SELECT @@session.autocommit")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(autocommit, 1, "after {how}");
    }
}

/// A pool whose sessions run with autocommit off (its `after_connect` says so) gets them back
/// that way: the store restores the session's own setting, not autocommit on.
#[tokio::test]
async fn a_pooled_session_comes_back_with_its_own_autocommit() {
    let db = Db::new("autocommit_off").await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|connection, _| {
            Box::pin(async move {
                connection.execute("SET SESSION autocommit = 0").await?;
                Ok(())
            })
        })
        .connect(&mysql_url())
        .await
        .unwrap();
    let store = MySqlStore::new(pool.clone())
        .table(db.store.store().table_name())
        .unwrap();
    let service = IdempotencyLayer::new(TransactionalMySqlStore::new(store), LabelContract)
        .global_keys()
        .value_extension(true)
        .layer(create(db.labels.clone()));
    // A read the application left its implicit transaction open after, as autocommit off
    // does: the claim's transaction still begins (that one is committed first, as MySQL's own
    // BEGIN would).
    let mut connection = pool.acquire().await.unwrap();
    sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {}", db.labels)))
        .execute(&mut *connection)
        .await
        .unwrap();
    drop(connection);
    for (request_id, how, status) in [
        ("n-1", "ok", 201),
        ("n-2", "fail", 500),
        ("n-3", "rollback", 503),
    ] {
        assert_eq!(
            send(&service, request_id, how).await.status,
            status,
            "{how}"
        );
        let mut connection = pool.acquire().await.unwrap();
        let autocommit: i64 = sqlx::query_scalar("SELECT @@session.autocommit")
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        // End the implicit transaction the look opened, as the pool's user would.
        connection.execute("ROLLBACK").await.unwrap();
        assert_eq!(autocommit, 0, "after {how}");
    }
    assert_eq!(db.rows("n-1").await, 1);
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

/// A create that answers over the response cap succeeded: it commits with its compact record,
/// and its retry replays that (status, headers, no body), one row.
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
