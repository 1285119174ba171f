//! The function API on the transactional stores: the work writes in the claim's transaction
//! ([`Attempt::get`]), and its writes commit with the stored value or not at all, so a message
//! is consumed exactly once. Needs PostgreSQL at `DATABASE_URL` and MySQL at `MYSQL_URL`
//! (each behind its feature).
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::transactional_cases::TxDb as _;
use std::future::Future;

use tower_idempotency::idempotent::{self, Attempt, Failures, Idempotent, Ran, RunError};
use tower_idempotency::store::Store;

/// Each case on one store: `insert` writes the label row of a key in the attempt's
/// transaction (and, given `"bad-sql"`, leaves the transaction unable to commit, where the
/// database can), `rows` counts a key's committed rows.
async fn exactly_once<St, I, IF, R, RF>(store: St, insert: I, rows: R, aborts: bool)
where
    St: Store,
    I: Fn(Attempt, String, &'static str) -> IF,
    IF: Future<Output = Result<String, String>>,
    R: Fn(String) -> RF,
    RF: Future<Output = i64>,
{
    let run = tower_idempotency::store::Reservation::generate().to_string();
    let key = |name: &str| format!("{name}-{run}");
    let fingerprint =
        |key: &str| idempotent::fingerprint(&serde_json::json!({ "id": key })).unwrap();
    for failures in [Failures::Keep, Failures::Release] {
        let labels = Idempotent::new(store.clone())
            .scope("labels")
            .on_failure(failures);

        // Done: one row, committed with the value; the replay writes nothing.
        let done = key(&format!("done-{failures:?}"));
        let first = labels
            .run(&done, fingerprint(&done), |attempt| {
                insert(attempt, done.clone(), "ok")
            })
            .await;
        assert_eq!(first.unwrap(), Ran::Done(format!("label-{done}")));
        assert_eq!(rows(done.clone()).await, 1);
        let again = labels
            .run(&done, fingerprint(&done), |attempt| {
                insert(attempt, done.clone(), "ok")
            })
            .await;
        assert_eq!(again.unwrap(), Ran::Replayed(format!("label-{done}")));
        assert_eq!(rows(done.clone()).await, 1);

        // Failed or panicked after its insert: rolled back, the key free whatever the policy.
        for how in ["fail", "panic"] {
            let failed = key(&format!("{how}-{failures:?}"));
            let answer = labels
                .run(&failed, fingerprint(&failed), |attempt| {
                    insert(attempt, failed.clone(), how)
                })
                .await;
            match how {
                "fail" => assert!(matches!(answer, Err(RunError::Failed(_))), "{answer:?}"),
                _ => assert!(matches!(answer, Err(RunError::Panicked)), "{answer:?}"),
            }
            assert_eq!(rows(failed.clone()).await, 0);
            let retried = labels
                .run(&failed, fingerprint(&failed), |attempt| {
                    insert(attempt, failed.clone(), "ok")
                })
                .await;
            assert_eq!(retried.unwrap(), Ran::Done(format!("label-{failed}")));
            assert_eq!(rows(failed.clone()).await, 1);
        }

        // A transaction that cannot commit: nothing happened, the key is free.
        if aborts {
            let aborted = key(&format!("abort-{failures:?}"));
            let answer = labels
                .run(&aborted, fingerprint(&aborted), |attempt| {
                    insert(attempt, aborted.clone(), "bad-sql")
                })
                .await;
            assert!(
                matches!(answer, Err(RunError::StoreUnavailable)),
                "{answer:?}"
            );
            assert_eq!(rows(aborted.clone()).await, 0);
            let retried = labels
                .run(&aborted, fingerprint(&aborted), |attempt| {
                    insert(attempt, aborted.clone(), "ok")
                })
                .await;
            assert_eq!(retried.unwrap(), Ran::Done(format!("label-{aborted}")));
            assert_eq!(rows(aborted).await, 1);
        }
    }
}

/// What the work does after its insert: `"fail"` returns an error, `"panic"` panics.
fn after_insert(label_id: String, how: &str) -> Result<String, String> {
    match how {
        "fail" => Err("the printer is offline".to_owned()),
        "panic" => panic!("the printer caught fire"),
        _ => Ok(label_id),
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_run_on_postgres_writes_in_the_claims_transaction_exactly_once() {
    use tower_idempotency::store::PgTransaction;
    use tower_idempotency::store::postgres::sqlx::{self, AssertSqlSafe};

    let db = crate::postgres_transactional::Db::new("runs").await;
    let insert_sql = format!(
        "INSERT INTO {} (label_id, request_id) VALUES ($1, $2)",
        db.labels
    );
    let insert = |attempt: Attempt, key: String, how: &'static str| {
        let insert_sql = insert_sql.clone();
        async move {
            let transaction = attempt
                .get::<PgTransaction>()
                .expect("the claim's transaction");
            let mut connection = transaction.acquire().await.map_err(|e| e.to_string())?;
            let label_id = format!("label-{key}");
            sqlx::query(AssertSqlSafe(insert_sql))
                .bind(&label_id)
                .bind(&key)
                .execute(&mut *connection)
                .await
                .map_err(|e| e.to_string())?;
            if how == "bad-sql" {
                let failed = sqlx::query("SELECT * FROM no_such_table")
                    .execute(&mut *connection)
                    .await;
                assert!(failed.is_err());
            }
            drop(connection);
            after_insert(label_id, how)
        }
    };
    let rows = |key: String| {
        let db = &db;
        async move { db.rows(&key).await }
    };
    exactly_once(db.store.clone(), insert, rows, true).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_run_on_mysql_writes_in_the_claims_transaction_exactly_once() {
    use tower_idempotency::store::MySqlTransaction;
    use tower_idempotency::store::mysql::sqlx::{self, AssertSqlSafe};

    let db = crate::mysql_transactional::Db::new("runs").await;
    let insert_sql = format!(
        "INSERT INTO {} (label_id, request_id) VALUES (?, ?)",
        db.labels
    );
    let insert = |attempt: Attempt, key: String, how: &'static str| {
        let insert_sql = insert_sql.clone();
        async move {
            let transaction = attempt
                .get::<MySqlTransaction>()
                .expect("the claim's transaction");
            let mut connection = transaction.acquire().await.map_err(|e| e.to_string())?;
            let label_id = format!("label-{key}");
            sqlx::query(AssertSqlSafe(insert_sql))
                .bind(&label_id)
                .bind(&key)
                .execute(&mut *connection)
                .await
                .map_err(|e| e.to_string())?;
            drop(connection);
            after_insert(label_id, how)
        }
    };
    let rows = |key: String| {
        let db = &db;
        async move { db.rows(&key).await }
    };
    // A failed statement leaves an InnoDB transaction able to commit: no abort case here (the
    // layer's tests make one with a deadlock).
    exactly_once(db.store.clone(), insert, rows, false).await;
}

/// A run whose transaction's `COMMIT` reaches the server and commits there, its answer lost (a
/// proxy drops the server's answers from the `COMMIT` on): the run cannot know whether the
/// work happened, so it answers `Unknown`, never "nothing was done"; the row and the completed
/// record are there, and the retry with the same key replays.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_commit_goes_unanswered_is_unknown_and_its_retry_replays() {
    use crate::common::servers::Proxy;
    use crate::postgres_store::{database_addr, options_through};
    use tower_idempotency::store::postgres::sqlx::postgres::PgPoolOptions;
    use tower_idempotency::store::postgres::sqlx::{self, AssertSqlSafe};
    use tower_idempotency::store::{PgTransaction, PostgresStore, TransactionalPostgresStore};

    let db = crate::postgres_transactional::Db::new("lost_answer").await;
    let proxy = Proxy::start(database_addr().await, false).await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options_through(&proxy))
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .table(db.store.store().table_name())
        .unwrap()
        .timeout(std::time::Duration::from_millis(500));
    let runs = Idempotent::new(TransactionalPostgresStore::new(store)).scope("labels");
    let insert_sql = format!(
        "INSERT INTO {} (label_id, request_id) VALUES ($1, $2)",
        db.labels
    );
    let key = format!("lost-{}", tower_idempotency::store::Reservation::generate());
    let fingerprint = idempotent::fingerprint(&key).unwrap();
    let insert = |attempt: Attempt| {
        let (insert_sql, key) = (insert_sql.clone(), key.clone());
        async move {
            let transaction = attempt.get::<PgTransaction>().expect("the transaction");
            let mut connection = transaction.acquire().await.map_err(|e| e.to_string())?;
            sqlx::query(AssertSqlSafe(insert_sql))
                .bind(format!("label-{key}"))
                .bind(&key)
                .execute(&mut *connection)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(format!("label-{key}"))
        }
    };

    proxy.mute_on(b"COMMIT");
    let answer = runs.run(&key, fingerprint, insert).await;
    assert!(matches!(answer, Err(RunError::Unknown)), "{answer:?}");
    assert!(answer.unwrap_err().is_transient());
    proxy.restore();
    assert_eq!(db.rows(&key).await, 1, "the commit took effect");
    let again = runs.run(&key, fingerprint, insert).await;
    assert_eq!(again.unwrap(), Ran::Replayed(format!("label-{key}")));
    assert_eq!(db.rows(&key).await, 1);
}

/// A response body that holds a transaction's connection while it streams (ten chunks of ten
/// bytes), as a handler streaming rows from it would: the layer's complete cannot have it.
pub(crate) struct HoldingBody<DB: sqlx::Database> {
    pub(crate) connection: Option<tower_idempotency::store::SqlTransactionConnection<DB>>,
    pub(crate) left: usize,
}

impl<DB: sqlx::Database> http_body::Body for HoldingBody<DB> {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        if self.left == 0 {
            self.connection = None;
            return std::task::Poll::Ready(None);
        }
        self.left -= 1;
        let chunk = bytes::Bytes::from_static(b"0123456789");
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }
}

/// A create that writes its row in the claim's transaction (`insert`, given the transaction
/// and the request id, gives its connection back) and answers `201` with a body over a 4-byte cap that holds the
/// transaction's connection while it streams: the layer answers `500 create_failed` at once
/// (well within the store's timeout, which it would otherwise wait out and answer `503`, for
/// every retry alike), nothing commits, and the key is free: a create that drops the
/// connection before answering then creates.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn a_body_holding_the_connection<St, DB, I>(
    store: St,
    timeout: std::time::Duration,
    insert: I,
    rows: impl AsyncFn(&str) -> i64,
) where
    St: Store + Clone,
    DB: sqlx::Database,
    I: Fn(
            tower_idempotency::store::SqlTransaction<DB>,
            String,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = tower_idempotency::store::SqlTransactionConnection<DB>> + Send>,
        > + Clone
        + Send
        + Sync
        + 'static,
{
    use http::{Request, Response};
    use tower::ServiceExt;
    use tower_idempotency::layer::RequestBody;
    use tower_idempotency::operation::{LabelContract, LabelOperation};
    use tower_idempotency::store::SqlTransaction;

    let create = move |hold: bool, status: u16| {
        let insert = insert.clone();
        tower::service_fn(
            move |request: Request<RequestBody<crate::common::Chunks>>| {
                let insert = insert.clone();
                async move {
                    let transaction = request
                        .extensions()
                        .get::<SqlTransaction<DB>>()
                        .expect("the transaction")
                        .clone();
                    let op = request
                        .extensions()
                        .get::<LabelOperation>()
                        .unwrap()
                        .clone();
                    let connection = insert(transaction, op.request_id.to_string()).await;
                    let connection = if hold { Some(connection) } else { None };
                    let body = HoldingBody::<DB> {
                        connection,
                        left: 10,
                    };
                    Ok::<_, std::io::Error>(Response::builder().status(status).body(body).unwrap())
                }
            },
        )
    };
    let layer = tower_idempotency::IdempotencyLayer::new(store, LabelContract)
        .global_keys()
        .value_extension(true)
        .response_limit(4);
    let key = format!("held-{}", tower_idempotency::store::Reservation::generate());
    let started = std::time::Instant::now();
    let response = tower::Layer::layer(&layer, create(true, 201))
        .oneshot(crate::common::operation(&key, "p"))
        .await
        .unwrap();
    let reply = crate::common::Reply::read(response).await;
    assert!(
        started.elapsed() < timeout,
        "answered after {:?}",
        started.elapsed()
    );
    reply.exact(500, r#"{"error":"create_failed"}"#);
    assert_eq!(rows(&key).await, 0, "nothing committed");
    let response = tower::Layer::layer(&layer, create(false, 201))
        .oneshot(crate::common::operation(&key, "p"))
        .await
        .unwrap();
    assert_eq!(crate::common::Reply::read(response).await.status, 201);
    assert_eq!(rows(&key).await, 1);

    // A server error, released by default: its body holds the connection too, and the
    // release does not wait for it (the transaction ends with the body).
    let key = format!(
        "held-5xx-{}",
        tower_idempotency::store::Reservation::generate()
    );
    let started = std::time::Instant::now();
    let response = tower::Layer::layer(&layer, create(true, 500))
        .oneshot(crate::common::operation(&key, "p"))
        .await
        .unwrap();
    let reply = crate::common::Reply::read(response).await;
    assert!(
        started.elapsed() < timeout,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(reply.status, 500);
    assert_eq!(rows(&key).await, 0, "nothing committed");
    let response = tower::Layer::layer(&layer, create(false, 201))
        .oneshot(crate::common::operation(&key, "p"))
        .await
        .unwrap();
    assert_eq!(crate::common::Reply::read(response).await.status, 201);
    assert_eq!(rows(&key).await, 1);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_holding_the_connection_fails_at_once_on_postgres() {
    use tower_idempotency::store::postgres::sqlx::{self, AssertSqlSafe, Postgres};
    use tower_idempotency::store::{
        SqlTransaction, SqlTransactionConnection, TransactionalPostgresStore,
    };

    let db = crate::postgres_transactional::Db::new("held").await;
    let timeout = std::time::Duration::from_secs(10);
    let store = TransactionalPostgresStore::new(db.store.store().clone().timeout(timeout));
    let sql = format!(
        "INSERT INTO {} (label_id, request_id) VALUES ($1, $2)",
        db.labels
    );
    let insert = move |transaction: SqlTransaction<Postgres>, id: String| {
        let sql = sql.clone();
        Box::pin(async move {
            let mut connection = transaction.acquire().await.unwrap();
            sqlx::query(AssertSqlSafe(sql))
                .bind(format!("label-{id}"))
                .bind(&id)
                .execute(&mut *connection)
                .await
                .unwrap();
            connection
        })
            as std::pin::Pin<Box<dyn Future<Output = SqlTransactionConnection<Postgres>> + Send>>
    };
    a_body_holding_the_connection::<_, Postgres, _>(store, timeout, insert, async |key: &str| {
        db.rows(key).await
    })
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_holding_the_connection_fails_at_once_on_mysql() {
    use tower_idempotency::store::mysql::sqlx::{self, AssertSqlSafe, MySql};
    use tower_idempotency::store::{
        SqlTransaction, SqlTransactionConnection, TransactionalMySqlStore,
    };

    let db = crate::mysql_transactional::Db::new("held").await;
    let timeout = std::time::Duration::from_secs(10);
    let store = TransactionalMySqlStore::new(db.store.store().clone().timeout(timeout));
    let sql = format!(
        "INSERT INTO {} (label_id, request_id) VALUES (?, ?)",
        db.labels
    );
    let insert = move |transaction: SqlTransaction<MySql>, id: String| {
        let sql = sql.clone();
        Box::pin(async move {
            let mut connection = transaction.acquire().await.unwrap();
            sqlx::query(AssertSqlSafe(sql))
                .bind(format!("label-{id}"))
                .bind(&id)
                .execute(&mut *connection)
                .await
                .unwrap();
            connection
        })
            as std::pin::Pin<Box<dyn Future<Output = SqlTransactionConnection<MySql>> + Send>>
    };
    a_body_holding_the_connection::<_, MySql, _>(store, timeout, insert, async |key: &str| {
        db.rows(key).await
    })
    .await;
}
