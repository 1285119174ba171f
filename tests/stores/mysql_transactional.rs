//! The transactional MySQL store: the claim, the create's own writes and the complete commit
//! together in one InnoDB transaction, or nothing happens. Needs MySQL or MariaDB at
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`).
#![cfg(feature = "mysql")]

use crate::common;
use crate::transactional_cases::{Create, TxDb, send, transactional_cases};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Chunks;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sqlx::{AssertSqlSafe, Connection as _, Executor as _, Row as _};
use tower::Layer;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::store::mysql::sqlx;
use tower_idempotency::store::{MySqlStore, MySqlTransaction, TransactionalMySqlStore};

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
}

impl TxDb for Db {
    type Store = TransactionalMySqlStore;

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
            "SELECT count(*) FROM {} WHERE request_id = ?",
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
