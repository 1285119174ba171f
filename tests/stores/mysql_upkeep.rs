//! The MySQL store's upkeep: the purge at any backlog, the purger, a start with the table in place, and the operator's tool.
#![cfg(feature = "mysql")]

#[allow(unused_imports)]
use crate::mysql_store::*;

use crate::common;

use std::time::Duration;

use common::conformance::{awkward_response, unique_key};
use common::*;

use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::MySqlStore;
use tower_idempotency::store::Store;
use tower_idempotency::store::mysql::sqlx;
use tower_idempotency::store::{Claim, Purge};

#[tokio::test]
async fn purge_deletes_expired_completed_records_only() {
    let store = make_store(Some(Duration::from_millis(50)))
        .await
        .tombstones(Duration::ZERO);
    let done = unique_key("purge-done");
    let open = unique_key("purge-open");
    let fp = LabelContract::fingerprint("x", "y");
    let Ok(Claim::New(reservation)) = store.claim(&done, &fp).await else {
        panic!()
    };
    store.claim(&open, &fp).await.unwrap();
    store
        .complete(&done, &reservation, &awkward_response())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(store.purge_expired().await.unwrap() >= 1);
    assert_eq!(store.claim(&open, &fp).await.unwrap(), Claim::Pending);
    assert!(matches!(
        store.claim(&done, &fp).await.unwrap(),
        Claim::New(_)
    ));
}

/// A purge batch held up on a row stalls no claim. Another transaction holds the newest
/// expired record, so the purge's batch waits on it; meanwhile new keys are claimed. Their
/// rows, not expiring yet (a `NULL` expiry), go in the expiry index before every expired
/// record, in the gap a `REPEATABLE READ` scan locks with its first record: there every
/// claim waited for the purge's batch, past its timeout (2 s; a claim takes milliseconds).
/// The purge's own batches read committed rows and lock gaps no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_held_up_on_a_row_stalls_no_claim() {
    let (table, _) = own_table("purge_beside_claims").await;
    // A pool of the test's own: the server's lock wait (50 s), which outlasts every bound
    // here, so that a claim held up by the purge runs out of its own timeout.
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .connect(&mysql_url())
        .await
        .unwrap();
    let store = MySqlStore::new(pool).table(&table).unwrap();
    let mut connection = session().await;
    run(
        &mut connection,
        format!(
            "INSERT INTO {table} (`key`, fingerprint, token, response, changed_at, expires_at) \
             WITH {DIGITS} SELECT CONCAT('expired-', a.i + 10 * b.i), 'x', NULL, x'00', 0, \
             1 + a.i + 10 * b.i FROM n a, n b"
        ),
    )
    .await;
    let mut holder = session().await;
    run(&mut holder, "BEGIN").await;
    run(
        &mut holder,
        format!("SELECT * FROM {table} WHERE `key` = 'expired-99' FOR UPDATE"),
    )
    .await;
    let purging = store.clone().timeout(Duration::from_secs(60));
    let purge = tokio::spawn(async move { purging.purge_expired().await });
    // The purge's batch (its tombstones', or its deletion's) is under way (the server lists
    // its statement) and cannot end before
    // the held row is given back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count(
        "SELECT count(*) FROM information_schema.processlist \
         WHERE info LIKE 'DELETE FROM `tower_idempotency_purge_beside_claims`%' \
         OR info LIKE 'UPDATE `tower_idempotency_purge_beside_claims`%'"
            .to_owned(),
    )
    .await
        == 0
    {
        assert!(!purge.is_finished(), "the purge ended without waiting");
        assert!(
            std::time::Instant::now() < deadline,
            "the purge's batch never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claiming = store.timeout(Duration::from_secs(2));
    let fp = LabelContract::fingerprint("x", "y");
    for i in 0..5 {
        let key = unique_key(&format!("beside-purge-{i}"));
        let claim = claiming.claim(&key, &fp).await;
        assert!(matches!(claim, Ok(Claim::New(_))), "{key}: {claim:?}");
    }
    run(&mut holder, "ROLLBACK").await;
    assert_eq!(purge.await.unwrap().expect("the purge finishes"), 100);
    run(&mut connection, format!("DROP TABLE {table}")).await;
}

/// The purge's isolation stays with the purge: it runs on a session of its own, closed after
/// it whether it ended well or failed (here: a table that does not exist), so the pool's next
/// user gets a new session at the server's own isolation, never one the purge changed.
#[tokio::test]
async fn the_purges_isolation_reaches_no_other_user_of_the_pool() {
    let (table, _) = own_table("purge_isolation").await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .unwrap();
    let pooled = async || -> (u64, String) {
        let row = sqlx::query("SELECT CONNECTION_ID(), @@SESSION.tx_isolation")
            .fetch_one(&pool)
            .await
            .unwrap();
        (sqlx::Row::get(&row, 0), sqlx::Row::get(&row, 1))
    };
    for table in [table.as_str(), "tower_idempotency_no_such_table"] {
        let (before, isolation) = pooled().await;
        assert_eq!(isolation, "REPEATABLE-READ", "the server's default here");
        let store = MySqlStore::new(pool.clone()).table(table).unwrap();
        let purged = store.purge_expired().await;
        assert_eq!(purged.is_ok(), table != "tower_idempotency_no_such_table");
        let (after, isolation) = pooled().await;
        assert_ne!(after, before, "{table}: the purge's session was closed");
        assert_eq!(isolation, "REPEATABLE-READ", "{table}");
    }
    run(&mut session().await, format!("DROP TABLE {table}")).await;
}

/// A backlog of expired records larger than many batches: the purge finishes (in batches,
/// each within the timeout), claims made meanwhile keep answering, and nothing pending or
/// unexpired is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_finishes_at_any_backlog_and_claims_keep_answering() {
    let (table, store) = own_table("purge_backlog").await;
    let mut connection = session().await;
    // 60,000 expired rows, 100 unexpired and 100 pending, made by the server in a few
    // statements.
    run(
        &mut connection,
        format!(
            "INSERT INTO {table} (`key`, fingerprint, token, response, changed_at, expires_at) \
             WITH {DIGITS} SELECT CONCAT('expired-', a.i + 10 * b.i + 100 * c.i + 1000 * d.i \
             + 10000 * e.i), 'x', NULL, x'00', 0, 1 FROM n a, n b, n c, n d, n e WHERE e.i < 6"
        ),
    )
    .await;
    run(
        &mut connection,
        format!(
            "INSERT INTO {table} (`key`, fingerprint, token, response, changed_at, expires_at) \
             WITH {DIGITS} SELECT CONCAT('kept-', a.i + 10 * b.i), 'x', NULL, x'00', 0, \
             9000000000000 FROM n a, n b UNION ALL SELECT CONCAT('pending-', a.i + 10 * b.i), \
             'x', x'00000000000000000000000000000001', NULL, 0, NULL FROM n a, n b"
        ),
    )
    .await;
    let claims = claims_meanwhile(store.clone(), 40);
    let purged = store.purge_expired().await.expect("the purge finishes");
    assert_eq!(purged, 60_000);
    assert_eq!(claims.await.unwrap(), 40, "every claim answered");
    let left = |prefix: &str| {
        count(format!(
            "SELECT count(*) FROM {table} WHERE `key` LIKE '{prefix}%'"
        ))
    };
    assert_eq!(left("expired-").await, 0);
    assert_eq!(left("kept-").await, 100, "nothing unexpired is deleted");
    assert_eq!(left("pending-").await, 100, "nothing pending is deleted");
    run(&mut connection, format!("DROP TABLE {table}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purger_keeps_a_table_at_a_steady_size() {
    let (table, _) = own_table("purger").await;
    // A timeout for a loaded server, set before its pool's first connection (which takes it
    // as its lock wait): this test is about the table's size, not time; a claim beside a
    // purge batch once waited past the default second in a run beside the other tests.
    let store = MySqlStore::connect(&mysql_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::from_secs(5))
        .retention(Duration::from_millis(100))
        .tombstones(Duration::from_millis(100));
    let counted = table.clone();
    let rows = move || count(format!("SELECT count(*) FROM {counted}"));
    let purger = store.purge_every(Duration::from_millis(50)).unwrap();
    purger_holds_steady(&store, rows).await;
    drop(purger);
    run(&mut session().await, format!("DROP TABLE {table}")).await;
}

/// A start with the table in place while another transaction holds one of its rows (a
/// transactional create in flight) reads the catalog only: it ends at once, and claims go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_the_table_in_place_stalls_no_claim() {
    let (table, store) = own_table("start").await;
    let mut holder = session().await;
    run(&mut holder, "BEGIN").await;
    run(
        &mut holder,
        format!("INSERT INTO {table} (`key`, fingerprint, changed_at) VALUES ('held', 'x', 0)"),
    )
    .await;
    let started = tokio::time::timeout(Duration::from_secs(5), store.migrate()).await;
    assert!(matches!(started, Ok(Ok(()))), "{started:?}");
    let fp = LabelContract::fingerprint("x", "y");
    assert!(matches!(
        store.claim(&unique_key("beside"), &fp).await,
        Ok(Claim::New(_))
    ));
    run(&mut holder, "ROLLBACK").await;
    run(&mut holder, format!("DROP TABLE {table}")).await;
}

/// The operator's tool (`idempotency_keys`) on a MySQL table: `purge` deletes
/// the expired record only, `pending` lists a pending key (a long one as the digest it is
/// kept as), `show`, `resolve` into a replay and `forget` act on it.
#[tokio::test]
async fn the_operators_tool_purges_lists_resolves_and_forgets() {
    let (table, store) = own_table("tool").await;
    let store = store.retention(Duration::from_secs(3600));
    for key in ["old", "kept"] {
        complete_new(&store, key).await;
    }
    let long = "k".repeat(600);
    let key =
        |key: &str| tower_idempotency::scope::store_key(None, &http::Method::POST, "/labels", key);
    let fp = LabelContract::fingerprint("pending", "p");
    store.claim(&key(&long), &fp).await.unwrap();
    run(
        &mut session().await,
        format!("UPDATE {table} SET expires_at = 1, tombstone_until = 1 WHERE `key` = 'old'"),
    )
    .await;
    let url = mysql_url();
    let tool = |args: &[&str]| {
        let mut all = vec!["--store", url.as_str(), "--table", table.as_str()];
        all.extend_from_slice(args);
        let (code, out, _) = common::operator_tool(&all);
        (code, out)
    };
    assert_eq!(tool(&["purge"]), (Some(0), "purged 1\n".to_owned()));
    let left = count(format!("SELECT count(*) FROM {table}")).await;
    assert_eq!(left, 2, "the kept record and the pending one");
    let (code, listed) = tool(&["pending", "--older-than", "0s"]);
    assert_eq!(code, Some(0));
    let digest = listed.trim_end().to_owned();
    assert!(digest.starts_with("sha256:"), "{listed}");
    let (code, shown) = tool(&["show", &digest]);
    assert_eq!(code, Some(0));
    assert_eq!(shown.lines().next(), Some("state pending"), "{shown}");
    let body = std::env::temp_dir().join(format!("tower-idempotency-mysql-{}", std::process::id()));
    std::fs::write(&body, r#"{"label_id":"by-hand"}"#).unwrap();
    let body_path = body.display().to_string();
    let (code, _) = tool(&[
        "resolve",
        &digest,
        "--status",
        "201",
        "--body-file",
        &body_path,
    ]);
    assert_eq!(code, Some(0));
    let Ok(Claim::Replay(replay)) = store.claim(&key(&long), &fp).await else {
        panic!("a replay of the resolved key");
    };
    assert_eq!(replay.body().as_ref(), br#"{"label_id":"by-hand"}"#);
    assert_eq!(tool(&["forget", &digest]).0, Some(0));
    assert_eq!(tool(&["show", &digest]).0, Some(1), "forgotten");
    let _ = std::fs::remove_file(&body);
    run(&mut session().await, format!("DROP TABLE {table}")).await;
}

/// Found in review: `migrate` adding a later release's column to a table made before waited
/// for the table's metadata lock as long as the server lets it (a year by default), behind any
/// transaction open on the table (the transactional store holds one for every create), and
/// every claim queued behind its waiting request. It waits a second at a time and tries again
/// with pauses, so claims go on meanwhile, and it adds the column once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_column_beside_an_open_transaction_stalls_no_claim() {
    let (table, store) = own_table("add_column").await;
    run(
        &mut session().await,
        format!("ALTER TABLE {table} DROP COLUMN tombstone, DROP COLUMN tombstone_until"),
    )
    .await;
    let mut holder = session().await;
    run(&mut holder, "BEGIN").await;
    // Holds the table's shared metadata lock until the transaction ends.
    run(&mut holder, format!("SELECT count(*) FROM {table}")).await;
    let migrating = store.clone();
    let migrate = tokio::spawn(async move { migrating.migrate().await });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count(format!(
        "SELECT count(*) FROM information_schema.processlist \
         WHERE info LIKE 'ALTER TABLE `{table}`%'"
    ))
    .await
        == 0
    {
        assert!(!migrate.is_finished(), "migrate ended without waiting");
        assert!(
            std::time::Instant::now() < deadline,
            "the ALTER never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New keys are claimed (an insert, which the old table takes) while it tries.
    let claiming = store.clone().timeout(Duration::from_secs(4));
    let fp = LabelContract::fingerprint("x", "y");
    for i in 0..3 {
        let key = unique_key(&format!("beside-alter-{i}"));
        let claim = claiming.claim(&key, &fp).await;
        assert!(matches!(claim, Ok(Claim::New(_))), "{key}: {claim:?}");
    }
    run(&mut holder, "ROLLBACK").await;
    migrate
        .await
        .unwrap()
        .expect("the column added once the lock is free");
    let added = count(format!(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() \
         AND table_name = '{table}' AND column_name IN ('tombstone', 'tombstone_until')"
    ))
    .await;
    assert_eq!(added, 2);
    run(&mut session().await, format!("DROP TABLE {table}")).await;
}
