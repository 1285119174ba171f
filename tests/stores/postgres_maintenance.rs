//! The PostgreSQL store's upkeep: migrations at start under load, the expiry index, the
//! purge at any backlog, the operator's tool, TLS.
#![cfg(feature = "postgres")]

#[allow(unused_imports)]
use crate::postgres_store::*;

use crate::common;

use std::time::Duration;

use common::conformance::{awkward_response, unique_key};
use common::*;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Row as _};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::PostgresStore;
use tower_idempotency::store::Store;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{Claim, Purge, StoreErrorKind};

/// A table whose expiry index is missing gets it built concurrently, outside the store's
/// timeout: writers go on while the build waits for a transaction open on the table, and a
/// build longer than the timeout completes (before, it was cancelled by the timeout and
/// started again, about thirty times, and `migrate` failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_expiry_index_is_built_concurrently_and_writers_go_on() {
    let table = "missing_expiry_index";
    let store = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(table)
        .unwrap();
    store.migrate().await.unwrap();
    batch(
        store.pool(),
        format!(
            "SET statement_timeout = 0; TRUNCATE {table}; \
             DROP INDEX IF EXISTS \"{table}_expires_at\"; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'row-' || i, 'f', '\\x00', now() + i * interval '1 second' \
             FROM generate_series(1, 1000000) i"
        ),
    )
    .await;
    let mut open = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (key, fingerprint) VALUES ('held', 'f')"
    )))
    .execute(&mut *open)
    .await
    .unwrap();
    // Two replicas starting at once: one builds, the other waits for it (a lock waited for
    // in a statement would hold a snapshot the build waits for: a deadlock).
    let mut migrations = Vec::new();
    for _ in 0..2 {
        let quick = PostgresStore::connect(&database_url())
            .await
            .unwrap()
            .table(table)
            .unwrap()
            .timeout(Duration::from_millis(100));
        migrations.push(tokio::spawn(async move { quick.migrate().await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The build waits for the open transaction; claims do not wait for the build.
    for i in 0..5 {
        let key = format!("while-building-{i}");
        let fingerprint = LabelContract::fingerprint(&key, "p");
        assert!(matches!(
            store.claim(&key, &fingerprint).await,
            Ok(Claim::New(_))
        ));
    }
    open.commit().await.unwrap();
    for migrating in migrations {
        migrating.await.unwrap().expect("the index built");
    }
    let valid: bool = sqlx::query(AssertSqlSafe(format!(
        "SELECT indisvalid FROM pg_index \
         WHERE indexrelid = to_regclass('\"{table}_expires_at\"')"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
    .get(0);
    assert!(valid);
    batch(store.pool(), format!("DROP TABLE {table}")).await;
}

/// A table made by the first release (no `changed_at`, `lease_until`, `take_over` or `waited`
/// columns) gets them from `migrate`, keeps its records, and serves every call after it; a
/// waiter on it is woken by the completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_table_of_the_first_release() {
    let store = store_on_own_table().await;
    let table = store.table_name().to_owned();
    batch(
        store.pool(),
        format!(
            "DROP TABLE \"{table}\"; CREATE TABLE \"{table}\" (key text PRIMARY KEY, \
             fingerprint text NOT NULL, token bytea, response bytea, expires_at timestamptz); \
             INSERT INTO \"{table}\" (key, fingerprint, token) VALUES ('old', '{}', '\\x00')",
            LabelContract::fingerprint("old", "p").to_hex().as_str()
        ),
    )
    .await;
    store.migrate().await.unwrap();
    assert!(matches!(
        store
            .claim("old", &LabelContract::fingerprint("old", "p"))
            .await,
        Ok(Claim::Pending)
    ));
    let fp = LabelContract::fingerprint("new", "p");
    let Ok(Claim::New(reservation)) = store.claim("new", &fp).await else {
        panic!("a new claim");
    };
    drop(store.changed("warm-up"));
    listening(&store).await;
    let started = std::time::Instant::now();
    let complete = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store
            .complete("new", &reservation, &awkward_response())
            .await
            .unwrap();
    };
    let ((), woken) = tokio::join!(complete, async {
        store.changed("new").await;
        started.elapsed()
    });
    assert!(
        woken >= Duration::from_millis(100) && woken < Duration::from_millis(500),
        "woken by the completion, not a poll: {woken:?}"
    );
    assert!(matches!(
        store.claim("new", &fp).await,
        Ok(Claim::Replay(_))
    ));
    drop_table(&store).await;
}

/// A replica starting while another session holds a writing transaction open on the table (as
/// the transactional store does for every create): its `migrate` finds nothing to change and
/// takes no lock that waits on that transaction, so it finishes at once, and a claim made
/// meanwhile is not queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_nothing_to_change_stalls_no_claim() {
    let (table, store, writer) =
        own_table("start", |store| store.timeout(Duration::from_secs(3))).await;
    writer
        .batch(format!(
            "BEGIN; INSERT INTO {table} (key, fingerprint) VALUES ('held-open', 'x')"
        ))
        .await;
    let started = std::time::Instant::now();
    let starting = tokio::spawn({
        let store = store.clone();
        async move { store.migrate().await }
    });
    // Until the start is done, or waits on a lock: either way a claim goes in now.
    let watcher = Session::open().await;
    while !starting.is_finished() && started.elapsed() < Duration::from_secs(2) {
        if a_lock_is_awaited(&watcher, &table).await {
            break;
        }
        tokio::task::yield_now().await;
    }
    a_new_claim_within(&store, "during-start", Duration::from_millis(500)).await;
    starting.await.unwrap().expect("the start finishes");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the start waited {:?}",
        started.elapsed()
    );
    writer.batch("ROLLBACK").await;
    writer.batch(format!("DROP TABLE {table}")).await;
}

/// A start with something to change (here the expiry index, missing) while a writing
/// transaction is open on the table: it waits for its lock no longer than a tenth of a second
/// at a time, so a claim meanwhile is answered long before the store's timeout, and it tries
/// again until the transaction ends, then makes the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_a_change_waits_in_short_turns_and_then_makes_it() {
    let (table, store, writer) =
        own_table("change", |store| store.timeout(Duration::from_secs(3))).await;
    writer
        .batch(format!("DROP INDEX \"{table}_expires_at\""))
        .await;
    writer
        .batch(format!(
            "BEGIN; INSERT INTO {table} (key, fingerprint) VALUES ('held-open', 'x')"
        ))
        .await;
    let starting = tokio::spawn({
        let store = store.clone();
        async move { store.migrate().await }
    });
    // The start has asked for its lock at least once.
    let watcher = Session::open().await;
    let asked = std::time::Instant::now();
    while !a_lock_is_awaited(&watcher, &table).await && asked.elapsed() < Duration::from_secs(5) {
        tokio::task::yield_now().await;
    }
    a_new_claim_within(&store, "during-change", Duration::from_secs(1)).await;
    assert!(
        !starting.is_finished(),
        "the change waits for the transaction"
    );
    writer.batch("COMMIT").await;
    starting
        .await
        .unwrap()
        .expect("the start finishes once the lock is free");
    let index: Option<String> = sqlx::query("SELECT to_regclass($1::text)::text")
        .bind(format!("{table}_expires_at"))
        .fetch_one(&mut *watcher.connection().await)
        .await
        .unwrap()
        .get(0);
    assert!(index.is_some(), "the index was made");
    writer.batch(format!("DROP TABLE {table}")).await;
}

/// A batch whose statement runs past the store's timeout is tried again smaller, and the purge
/// finishes: here a trigger holds any statement that deletes more than 1,000 records for ten
/// seconds, past the store's timeout (the server cancels it at its `statement_timeout`, which
/// the store's own pool sets, and it deletes nothing), so the batches of 5,000, 2,500 and
/// 1,250 time out and those of 625 go through. Before, the first batch's timeout failed the
/// purge, every run, and nothing was ever purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_the_timeout_is_tried_again_smaller_and_the_purge_finishes() {
    let (table, store, client) = own_table("purge_slow_batch", |store| {
        store.timeout(Duration::from_millis(500))
    })
    .await;
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
             FROM generate_series(1, 3000) AS i; \
             CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS $slow$ \
             BEGIN IF (SELECT count(*) FROM gone) > 1000 THEN PERFORM pg_sleep(10); END IF; \
             RETURN NULL; END $slow$; \
             CREATE TRIGGER {table}_slow AFTER DELETE ON {table} \
             REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {table}_slow()"
        ))
        .await;
    let purged = store.purge_expired().await.expect("the purge finishes");
    let left = client
        .count(format!("SELECT count(*) FROM {table}"), None)
        .await;
    client
        .batch(format!("DROP TABLE {table}; DROP FUNCTION {table}_slow()"))
        .await;
    assert_eq!(left, 0, "every expired record purged");
    assert_eq!(
        purged, 3000,
        "each counted once, by the batches that went through"
    );
}

/// A purge whose batch fails otherwise than by its time (here a trigger refuses every delete)
/// fails at once, after one statement: only a batch that ran too long is tried again smaller.
/// The statements are counted by a sequence the trigger advances, which the refusal does not
/// roll back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_refused_otherwise_than_by_time_fails_after_one_statement() {
    let (table, store, client) = own_table("purge_refused", |store| store).await;
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
             FROM generate_series(1, 10) AS i; \
             CREATE SEQUENCE {table}_calls; \
             CREATE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql AS $refuse$ \
             BEGIN PERFORM nextval('{table}_calls'); RAISE EXCEPTION 'refused'; END $refuse$; \
             CREATE TRIGGER {table}_refuse BEFORE DELETE ON {table} \
             FOR EACH STATEMENT EXECUTE FUNCTION {table}_refuse()"
        ))
        .await;
    let refused = store.purge_expired().await;
    let calls = client
        .count(
            format!("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {table}_calls"),
            None,
        )
        .await;
    client
        .batch(format!(
            "DROP TABLE {table}; DROP FUNCTION {table}_refuse(); DROP SEQUENCE {table}_calls"
        ))
        .await;
    let error = refused.expect_err("the purge is refused");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert_eq!(calls, 1, "one statement, not tried again");
}

/// A backlog of expired records one statement cannot delete within the store's timeout: the
/// purge finishes anyway (in batches), claims made while it runs keep answering within their
/// timeout, and nothing pending and nothing unexpired is deleted. The timeout is thirty times
/// what one batch takes on this machine now (at least 300 ms), measured first, while the
/// backlog is 240 batches; a batch that a loaded machine still holds past it fails its run,
/// and the next run goes on, as a purger's does (each run must delete something).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_finishes_at_any_backlog_and_claims_keep_answering() {
    let batch = {
        let (table, store, client) = own_table("purge_baseline", |store| store).await;
        client
            .batch(format!(
                "INSERT INTO {table} (key, fingerprint, response, expires_at) \
                 SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
                 FROM generate_series(1, 4999) AS i; ANALYZE {table}"
            ))
            .await;
        // One record fewer than a batch: the purge ends after its first statement, with no
        // pause after it, so this is one batch's time.
        let started = std::time::Instant::now();
        assert_eq!(store.purge_expired().await.unwrap(), 4999);
        let took = started.elapsed();
        client.batch(format!("DROP TABLE {table}")).await;
        took
    };
    let timeout = (batch * 30).max(Duration::from_millis(300));
    let (table, store, client) = own_table("purge", |store| store.timeout(timeout)).await;
    // The claims go through a store of the default timeout, as a replica's would.
    let claiming = PostgresStore::connect(&database_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    // Over a million rows: one statement takes longer than the timeout here (about 450 ms on
    // an idle machine), and each batch a few milliseconds, with room for a loaded one.
    let expired: i64 = 1_200_000;
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'x', '\\x00', now() - interval '1 hour' \
             FROM generate_series(1, {expired}) AS i; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'kept-' || i, 'x', '\\x00', now() + interval '1 hour' \
             FROM generate_series(1, 100) AS i; \
             INSERT INTO {table} (key, fingerprint, token) \
             SELECT 'pending-' || i, 'x', '\\x01' FROM generate_series(1, 100) AS i; \
             ANALYZE {table}"
        ))
        .await;
    let claims = claims_meanwhile(claiming, 40);
    // As a purger does: a batch that a loaded machine held past the timeout fails the run,
    // whose earlier batches stay deleted, and the next run goes on from there. One statement
    // for the whole backlog would fail every run with nothing deleted; a run that a loaded
    // machine stalls at its first batch deletes nothing, and the next goes on.
    let (mut purged, mut runs, mut stalled) = (0, 0, 0);
    loop {
        let before = purged;
        let Err(error) = store.purge_expired_counting(&mut purged).await else {
            break;
        };
        runs += 1;
        stalled += usize::from(purged == before);
        assert!(
            runs < 30 && stalled < 10,
            "the purge makes progress: {error:#}, {purged} purged in {runs} runs, {stalled} stalled"
        );
    }
    assert_eq!(purged, u64::try_from(expired).unwrap());
    assert_eq!(
        claims.await.unwrap(),
        40,
        "every claim answered within its timeout"
    );
    let left = |prefix: &'static str| {
        client.count(
            format!("SELECT count(*) FROM {table} WHERE key LIKE $1"),
            Some(format!("{prefix}%")),
        )
    };
    assert_eq!(left("expired-").await, 0);
    assert_eq!(left("kept-").await, 100, "nothing unexpired is deleted");
    assert_eq!(left("pending-").await, 100, "nothing pending is deleted");
    client.batch(format!("DROP TABLE {table}")).await;
}

/// The built-in purger keeps a table at a steady size under a steady stream of creates with
/// a short retention: at the end of the run it holds about a window's records, not the run's,
/// and once the stream stops it empties of completed records; dropped, it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purger_keeps_a_table_at_a_steady_size() {
    let (table, store, client) = own_table("purger", |store| {
        store
            .retention(Duration::from_millis(100))
            .tombstones(Duration::from_millis(100))
    })
    .await;
    let count = || client.count(format!("SELECT count(*) FROM {table}"), None);
    let purger = store.purge_every(Duration::from_millis(50)).unwrap();
    purger_holds_steady(&store, count).await;
    drop(purger);
    complete_new(&store, &unique_key("after-the-purger")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count().await, 1, "a purger dropped purges no more");
    client.batch(format!("DROP TABLE {table}")).await;
}

/// A start whose database cannot be reached fails at once with the store's error, not after
/// the attempts a held lock gets.
#[tokio::test]
async fn a_start_with_the_database_away_fails_at_once() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let options = PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("test");
    // Connecting says why: the connection is refused.
    let error = PostgresStore::connect_with(options.clone())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error:#}");
    // A store that connects lazily: its pool tries the address again until the call's
    // timeout, and then the migrate fails, with no attempts of its own after that.
    let store = PostgresStore::connect_lazy_with(options);
    let started = std::time::Instant::now();
    let error = store.migrate().await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Timeout);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// The operator's tool (`idempotency_keys`) on PostgreSQL: `purge` deletes the
/// expired records of its table and nothing else, and a store failure exits 3 with the
/// database's own words, not only the driver's "db error".
#[tokio::test]
async fn the_operators_tool_purges_a_table_and_says_why_it_failed() {
    let table = format!("tool_{}", std::process::id());
    let store = make_store(None)
        .await
        .table(&table)
        .unwrap()
        .retention(Duration::from_secs(3600));
    store.migrate().await.unwrap();
    for key in ["old", "kept"] {
        complete_new(&store, key).await;
    }
    let pending = tower_idempotency::operation::LabelContract::fingerprint("pending", "p");
    store.claim("pending", &pending).await.unwrap();
    let client = Session::open().await;
    client
        .batch(format!(
            "UPDATE {table} SET expires_at = now() - interval '1 hour', \
             tombstone_until = now() - interval '1 hour' WHERE key = 'old'"
        ))
        .await;
    let tool = common::operator_tool;
    let url = database_url();
    let purged = tool(&["--store", &url, "--table", &table, "purge"]);
    assert_eq!((purged.0, purged.1.as_str()), (Some(0), "purged 1\n"));
    let left: Vec<String> = sqlx::query(AssertSqlSafe(format!(
        "SELECT key FROM {table} ORDER BY key"
    )))
    .fetch_all(&mut *client.connection().await)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(left, ["kept", "pending"]);
    // A key over 512 bytes is kept as its digest, which `pending` prints and the other
    // commands take as it is printed.
    let long = "k".repeat(600);
    let long_key = tower_idempotency::scope::store_key(None, &http::Method::POST, "/labels", &long);
    store
        .claim(
            &long_key,
            &tower_idempotency::operation::LabelContract::fingerprint("long", "p"),
        )
        .await
        .unwrap();
    let listed = tool(&[
        "--store",
        &url,
        "--table",
        &table,
        "pending",
        "--older-than",
        "0s",
    ]);
    let digest = listed
        .1
        .lines()
        .find(|line| line.starts_with("sha256:"))
        .expect("the long key's digest")
        .to_owned();
    let shown = tool(&["--store", &url, "--table", &table, "show", &digest]);
    assert_eq!(
        (shown.0, shown.1.lines().next()),
        (Some(0), Some("state pending"))
    );
    let forgot = tool(&["--store", &url, "--table", &table, "forget", &digest]);
    assert_eq!(forgot.0, Some(0), "{}", forgot.2);
    assert!(
        tower_idempotency::store::Operator::inspect(&store, &long_key)
            .await
            .unwrap()
            .is_none()
    );
    let missing = tool(&["--store", &url, "--table", "no_such_table_here", "purge"]);
    assert_eq!(missing.0, Some(3));
    let said = missing.2;
    assert!(said.contains("does not exist"), "{said}");
    // A purge that fails after its first batch says what that batch deleted.
    client
        .batch(format!(
            "INSERT INTO {table} (key, fingerprint, response, expires_at) \
             SELECT 'expired-' || i, 'f', '\\x00', now() - interval '2 hours' \
             FROM generate_series(1, 5000) i; \
             INSERT INTO {table} (key, fingerprint, response, expires_at) \
             VALUES ('poison', 'f', '\\x00', now() - interval '1 hour'); \
             CREATE OR REPLACE FUNCTION {table}_poison() RETURNS trigger AS $$ BEGIN \
             IF OLD.key = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF; \
             RETURN OLD; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER poison BEFORE DELETE ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_poison();"
        ))
        .await;
    let failed = tool(&[
        "--store",
        &url,
        "--table",
        &table,
        "--timeout-s",
        "10",
        "purge",
    ]);
    assert_eq!((failed.0, failed.1.as_str()), (Some(3), "purged 5000\n"));
    assert!(failed.2.contains("poisoned row"), "{}", failed.2);
    client
        .batch(format!(
            "DROP TABLE {table}; DROP FUNCTION {table}_poison()"
        ))
        .await;
}

/// With `sslmode=require` the store's sessions are encrypted, as PostgreSQL itself sees them
/// (`pg_stat_ssl`), and the store works over them: a claim, its complete, the replay.
#[tokio::test]
async fn sslmode_require_encrypts_the_stores_sessions() {
    let store = PostgresStore::connect(&with_parameters("sslmode=require"))
        .await
        .expect("PostgreSQL with TLS (the server runs with ssl = on)")
        .table(&format!("tls_{}", std::process::id()))
        .unwrap();
    store.migrate().await.unwrap();
    let row = sqlx::query("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(row.get::<bool, _>(0), "the session is not encrypted");
    let version: Option<String> = row.get(1);
    assert!(
        version.is_some_and(|v| v.starts_with("TLS")),
        "no TLS version"
    );
    let key = unique_key("tls");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fingerprint).await else {
        panic!("a new key");
    };
    let response = awkward_response();
    store.complete(&key, &reservation, &response).await.unwrap();
    let Ok(Claim::Replay(replayed)) = store.claim(&key, &fingerprint).await else {
        panic!("a replay");
    };
    assert_eq!(replayed, response);
    drop_table(&store).await;
}

/// A CA that did not sign the server's certificate fails the connect, with the TLS error in
/// the chain, rather than a session in plaintext or unverified. Shown through the operator's
/// tool, whose roots are the CA `SSL_CERT_FILE` names (in place of the system's, which on a
/// machine whose server has a self-signed certificate may hold that certificate itself); the
/// server's own certificate as the root verifies, as a control.
#[tokio::test]
async fn a_certificate_that_does_not_verify_fails_the_connect() {
    let tls = common::servers::TlsFiles::make();
    let empty = common::servers::TempDir::new("no-certs");
    let store = make_store(None)
        .await
        .table(&format!("tls_roots_{}", std::process::id()))
        .unwrap();
    store.migrate().await.unwrap();
    let server_cert: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let url = with_parameters("sslmode=verify-ca");
    let show = [
        "--store",
        url.as_str(),
        "--table",
        store.table_name(),
        "show",
        "no-such-key",
    ];
    let empty_dir = empty.0.display().to_string();
    let with_roots = |file: &str| {
        common::operator_tool_with(
            &show,
            &[("SSL_CERT_FILE", file), ("SSL_CERT_DIR", &empty_dir)],
        )
    };
    let (code, _, said) = with_roots(&tls.path("ca.pem"));
    assert_ne!(code, Some(0), "{said}");
    let said = said.to_lowercase();
    assert!(
        said.contains("certificate") || said.contains("unknownissuer"),
        "{said}"
    );
    if std::fs::metadata(&server_cert).is_ok() {
        let (code, printed, said) = with_roots(&server_cert);
        assert_eq!(code, Some(1), "the key is absent: {printed} {said}");
    }
    drop_table(&store).await;
}
