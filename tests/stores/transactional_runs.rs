//! The function API on the transactional stores: the work writes in the claim's transaction
//! ([`Attempt::get`]), and its writes commit with the stored value or not at all, so a message
//! is consumed exactly once. Needs PostgreSQL at `DATABASE_URL` and MySQL at `MYSQL_URL`
//! (each behind its feature).
#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::future::Future;

use tower_idempotency::Store;
use tower_idempotency::idempotent::{self, Attempt, Failures, Idempotent, Ran, RunError};

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
    use crate::postgres_store::{database_addr, database_options};
    use tower_idempotency::store::postgres::sqlx::postgres::{PgPoolOptions, PgSslMode};
    use tower_idempotency::store::postgres::sqlx::{self, AssertSqlSafe};
    use tower_idempotency::store::{PgTransaction, PostgresStore, TransactionalPostgresStore};

    let db = crate::postgres_transactional::Db::new("lost_answer").await;
    let proxy = Proxy::start(database_addr().await, false).await;
    let options = database_options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(PgSslMode::Disable);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
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
