//! The SQLite store's upkeep: the purge at any backlog, the purger, starts beside another process, the expiry index, and the operator's tool.
#![cfg(feature = "sqlite")]

#[allow(unused_imports)]
use crate::sqlite_store::*;

use crate::common;

use std::time::Duration;

use tower_idempotency::store::sqlite::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tower_idempotency::store::sqlite::sqlx::{self, Connection as _, Executor as _};
use tower_idempotency::store::{Purge, SqliteStore};

/// A backlog of expired records one statement cannot delete within the store's timeout: the
/// purge finishes anyway (in batches), claims made while it runs (through another connection
/// to the file, as another process's) keep answering, and nothing pending and nothing
/// unexpired is deleted. The timeout is thirty times what one batch takes on this machine
/// now (at least 100 ms), measured first, while the backlog is sixty batches. A batch that a
/// loaded machine still holds past the timeout fails its run, as a purger's would, and the
/// next run goes on from the rows left (SQLite finishes a statement whose caller gave up, so
/// progress is read from the file, not from the runs' counts): the backlog must shrink, ten
/// runs in a row without progress fail. A clean run on a slow machine once failed when the
/// purge had to finish in one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_finishes_at_any_backlog_and_claims_keep_answering() {
    let batch = {
        let (dir, file) = fresh_file("purge-baseline");
        let store = SqliteStore::open(&file).await.unwrap();
        // One record fewer than a batch: the purge ends after its first statement, with no
        // pause after it, so this is one batch's time.
        expire_rows(&file, 4_999).await;
        let started = std::time::Instant::now();
        assert_eq!(store.purge_expired().await.unwrap(), 4_999);
        let took = started.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        took
    };
    let (dir, file) = fresh_file("purge");
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .timeout((batch * 30).max(Duration::from_millis(100)));
    let claiming = SqliteStore::open(&file).await.unwrap();
    let expired: i64 = 300_000;
    {
        // In one statement: a recursive count makes the rows, fast in a debug build.
        let now = now_millis();
        let mut connection = connect(&file).await;
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1) \
             INSERT INTO idempotency_records (key, fingerprint, token, response, changed_at, \
             expires_at) SELECT 'expired-' || i, 'x', NULL, x'00', 0, ?2 FROM n",
        )
        .bind(expired)
        .bind(now - 3_600_000)
        .execute(&mut connection)
        .await
        .unwrap();
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < 100) \
             INSERT INTO idempotency_records (key, fingerprint, token, response, changed_at, \
             expires_at) SELECT 'kept-' || i, 'x', NULL, x'00', 0, ?1 FROM n \
             UNION ALL SELECT 'pending-' || i, 'x', x'01', NULL, 0, NULL FROM n",
        )
        .bind(now + 3_600_000)
        .execute(&mut connection)
        .await
        .unwrap();
    }
    let claims = common::claims_meanwhile(claiming, 40);
    let mut connection = connect(&file).await;
    let mut left = async |prefix: &str| -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE key LIKE ?1")
            .bind(format!("{prefix}%"))
            .fetch_one(&mut connection)
            .await
            .unwrap()
    };
    let (mut backlog, mut runs, mut stalled) = (expired, 0, 0);
    while let Err(error) = store.purge_expired().await {
        runs += 1;
        let now = left("expired-").await;
        stalled = if now < backlog { 0 } else { stalled + 1 };
        backlog = now;
        assert!(
            runs < 60 && stalled < 10,
            "the purge makes progress: {error:#}, {backlog} left after {runs} runs"
        );
    }
    assert_eq!(claims.await.unwrap(), 40, "every claim answered");
    assert_eq!(left("expired-").await, 0);
    assert_eq!(left("kept-").await, 100, "nothing unexpired is deleted");
    assert_eq!(left("pending-").await, 100, "nothing pending is deleted");
    drop(connection);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The built-in purger keeps a file at a steady size under a steady stream of creates with a
/// short retention, and empties it of completed records once the stream stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purger_keeps_a_file_at_a_steady_size() {
    let (dir, file) = fresh_file("purger");
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .retention(Duration::from_millis(100))
        .tombstones(Duration::from_millis(100));
    let count = || {
        let file = file.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idempotency_records")
                .fetch_one(&mut connect(&file).await)
                .await
                .unwrap()
        }
    };
    let purger = store.purge_every(Duration::from_millis(50)).unwrap();
    common::purger_holds_steady(&store, count).await;
    drop(purger);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A purger asked for outside a Tokio runtime is a configuration error, not a panic.
#[tokio::test]
async fn a_purger_outside_a_runtime_is_an_error() {
    let store = make_store(None).await;
    let outside = std::thread::spawn(move || {
        store
            .purge_every(Duration::from_secs(1))
            .map(drop)
            .map_err(|error| error.kind())
    })
    .join()
    .unwrap();
    assert_eq!(
        outside,
        Err(tower_idempotency::store::StoreErrorKind::InvalidConfig)
    );
}

/// A store opened on a file in use while another connection holds the file's write lock (a
/// replica starting while another process writes): the open finishes without waiting for the
/// lock, since a file already set up needs no write to open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_while_another_process_writes_waits_for_no_lock() {
    let (dir, file) = fresh_file("start");
    drop(SqliteStore::open(&file).await.unwrap());
    let mut writer = connect(&file).await;
    let mut transaction = writer.begin_with("BEGIN IMMEDIATE").await.unwrap();
    transaction
        .execute(
            "INSERT INTO idempotency_records (key, fingerprint, changed_at) VALUES ('held', 'x', 0)",
        )
        .await
        .unwrap();
    // Opening waits up to ten seconds for a lock it needs; this one needs none.
    let opened = tokio::time::timeout(Duration::from_secs(5), SqliteStore::open(&file)).await;
    assert!(
        matches!(opened, Ok(Ok(_))),
        "the open finished while the lock was held"
    );
    transaction.rollback().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file whose expiry index is gone (dropped by hand, say) gets it back at the next open: the
/// purge's batches go by it.
#[tokio::test]
async fn an_open_puts_back_a_missing_expiry_index() {
    let (dir, file) = fresh_file("index");
    drop(SqliteStore::open(&file).await.unwrap());
    let mut connection = connect(&file).await;
    let indexed = async |connection: &mut SqliteConnection| -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' \
             AND name = 'idempotency_records_expires_at')",
        )
        .fetch_one(connection)
        .await
        .unwrap()
    };
    assert!(indexed(&mut connection).await);
    connection
        .execute("DROP INDEX idempotency_records_expires_at")
        .await
        .unwrap();
    assert!(!indexed(&mut connection).await);
    drop(SqliteStore::open(&file).await.unwrap());
    assert!(
        indexed(&mut connection).await,
        "the open made the index again"
    );
    drop(connection);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Inserts `count` records of `file` that expired an hour ago.
async fn expire_rows(file: &std::path::Path, count: i64) {
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1) \
         INSERT INTO idempotency_records (key, fingerprint, token, response, changed_at, \
         expires_at) SELECT 'baseline-' || i, 'x', NULL, x'00', 0, ?2 FROM n",
    )
    .bind(count)
    .bind(now_millis() - 3_600_000)
    .execute(&mut connect(file).await)
    .await
    .unwrap();
}

/// The operator's tool on another application's SQLite file: refused as not a store's (exit
/// 2), and the file left as it was: its journal mode kept, no table made.
#[tokio::test]
async fn the_operators_tool_leaves_another_applications_file_as_it_was() {
    let (dir, file) = fresh_file("foreign");
    let mut connection = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true),
    )
    .await
    .unwrap();
    connection
        .execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .await
        .unwrap();
    assert_eq!(journal_mode(&file).await, "delete");
    drop(connection);
    let url = format!("sqlite://{}", file.display());
    for command in [
        &["show", "k"][..],
        &["pending", "--older-than", "0s"],
        &["purge"],
    ] {
        let mut args = vec!["--store", url.as_str()];
        args.extend_from_slice(command);
        let (code, _, said) = common::operator_tool(&args);
        assert_eq!(code, Some(2), "{command:?}: {said}");
        assert!(said.contains("not a store's"), "{said}");
    }
    assert_eq!(
        journal_mode(&file).await,
        "delete",
        "the journal mode as it was"
    );
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name LIKE 'idempotency%'")
            .fetch_one(&mut connect(&file).await)
            .await
            .unwrap();
    assert_eq!(tables, 0, "no table made");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The operator's tool (`idempotency_keys`) on a SQLite file: its help, its
/// exit codes, and `purge`, which deletes the expired records and nothing else.
#[tokio::test]
async fn the_operators_tool_purges_and_keeps_its_exit_codes() {
    use tower_idempotency::store::{Claim, Store, StoredResponse};
    let tool = common::operator_tool;
    let (code, help, _) = tool(&["--help"]);
    assert_eq!(code, Some(0));
    for word in [
        "show",
        "pending",
        "forget",
        "resolve",
        "purge",
        "EXIT CODES",
    ] {
        assert!(help.contains(word), "the help names {word}: {help}");
    }
    let (code, _, usage) = tool(&["--store", "sqlite://x", "frobnicate"]);
    assert_eq!(code, Some(2), "a bad command line");
    assert!(usage.contains("Usage: idempotency_keys"), "{usage}");
    let (code, _, _) = tool(&["purge"]);
    assert_eq!(code, Some(2), "no store");

    let (dir, file) = fresh_file("tool");
    let url = format!("sqlite://{}", file.display());
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .retention(Duration::from_secs(3600));
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("k", "p");
    let response = StoredResponse::new(http::StatusCode::CREATED, Default::default(), "{}".into());
    for key in ["old-1", "old-2", "kept", "pending"] {
        let Ok(Claim::New(reservation)) = store.claim(key, &fingerprint).await else {
            panic!("a new key");
        };
        if key != "pending" {
            store.complete(key, &reservation, &response).await.unwrap();
        }
    }
    let mut connection = connect(&file).await;
    connection
        .execute("UPDATE idempotency_records SET expires_at = 0, tombstone_until = 0 WHERE key LIKE 'old-%'")
        .await
        .unwrap();
    let (code, out, _) = tool(&["--store", &url, "purge"]);
    assert_eq!((code, out.as_str()), (Some(0), "purged 2\n"));
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM idempotency_records ORDER BY key")
        .fetch_all(&mut connection)
        .await
        .unwrap();
    assert_eq!(keys, ["kept", "pending"]);
    let (code, out, _) = tool(&["--store", &url, "purge"]);
    assert_eq!((code, out.as_str()), (Some(0), "purged 0\n"));
    let (code, _, missing) = tool(&["--store", &url, "show", "nothing-here"]);
    assert_eq!(code, Some(1), "no such record: {missing}");
    // A key that begins with a dash, after `--`.
    let (code, _, _) = tool(&["--store", &url, "show", "--", "--dashed"]);
    assert_eq!(code, Some(1), "a key, not a flag");
    // Every command but purge names its endpoint: the tool does not guess one.
    let as_given = |args: &[&str]| common::operator_tool_as_given(args, &[]);
    for command in [
        &["show", "k"][..],
        &["forget", "k"],
        &["pending", "--older-than", "0s"],
    ] {
        let args: Vec<&str> = ["--store", url.as_str()]
            .iter()
            .chain(command)
            .copied()
            .collect();
        let (code, _, said) = as_given(&args);
        assert_eq!(code, Some(2), "{command:?}: {said}");
        assert!(said.contains("--path PATH is required"), "{said}");
    }
    let (code, out, _) = as_given(&["--store", &url, "purge"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "purged 0\n"),
        "purge needs no path"
    );
    // A path that names no file is a bad command line, and makes no file.
    let typo = dir.join("records.sqlite3x");
    let typo_url = format!("sqlite://{}", typo.display());
    let (code, _, said) = tool(&["--store", &typo_url, "purge"]);
    assert_eq!(code, Some(2), "no such file: {said}");
    assert!(said.contains("no such file"), "{said}");
    assert!(!typo.exists(), "no file made");
    let (code, _, said) = tool(&["--store", "mongodb://x", "purge"]);
    assert_eq!(code, Some(2), "not a store URL: {said}");
    // A file that is not a database: the store failed.
    let not_a_database = dir.join("not-a-database");
    std::fs::write(&not_a_database, vec![b'x'; 4096]).unwrap();
    let broken = format!("sqlite://{}", not_a_database.display());
    let (code, _, failed) = tool(&["--store", &broken, "--timeout-s", "2", "purge"]);
    assert_eq!(code, Some(3), "the store failed: {failed}");
    drop(connection);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every command of the operator's tool on a SQLite file, with the endpoint's flags: `show`
/// of a completed and a pending key, `pending` by age and abandoned, `resolve` into a replay
/// with its headers and retention, `forget`, and durations in every unit.
#[tokio::test]
async fn the_operators_tool_shows_lists_resolves_and_forgets() {
    use tower_idempotency::scope::store_key;
    use tower_idempotency::store::{Claim, Lease, Reservation, Store};
    let tool = |args: &[&str]| {
        let (code, out, _) = common::operator_tool(args);
        (code, out)
    };
    let (dir, file) = fresh_file("tool-commands");
    let url = format!("sqlite://{}", file.display());
    let store = SqliteStore::open(&file).await.unwrap();
    let labels = |key: &str| store_key(None, &http::Method::POST, "/labels", key);
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("k", "p");
    complete_new_at(&store, &labels("done"), &fingerprint).await;
    // Pending: one whose lease lapses at once (its server died), one still renewed.
    let lapsed = Lease::new(Lease::MIN_DURATION);
    store
        .claim_with(
            &labels("stuck"),
            &fingerprint,
            Reservation::generate(),
            lapsed,
        )
        .await
        .unwrap();
    store.claim(&labels("running"), &fingerprint).await.unwrap();
    // Another endpoint, in a tenant's key space.
    let orders = store_key(Some("acme"), &http::Method::PUT, "/orders", "o-1");
    store.claim(&orders, &fingerprint).await.unwrap();
    let run = |args: &[&str]| {
        let mut all = vec!["--store", url.as_str()];
        all.extend_from_slice(args);
        tool(&all)
    };

    let (code, shown) = run(&["show", "done"]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "state completed");
    assert!(
        lines[1].starts_with("age ") && lines[1].ends_with('s'),
        "{shown}"
    );
    assert_eq!(
        lines[2],
        format!("fingerprint {}", fingerprint.to_hex().as_str())
    );
    assert_eq!(lines[3], "status 201");
    assert_eq!(lines.len(), 4, "{shown}");
    // Lapsed once its lease has passed.
    tokio::time::sleep(Lease::MIN_DURATION * 2).await;
    let (code, shown) = run(&["show", "stuck"]);
    assert_eq!(code, Some(0));
    assert_eq!(shown.lines().next(), Some("state pending"));
    assert_eq!(shown.lines().last(), Some("lease abandoned"));
    let (_, shown) = run(&["show", "running"]);
    assert_eq!(shown.lines().last(), Some("lease in-progress"));

    for age in ["0s", "0ms", "0m", "0h", "0d"] {
        assert_eq!(
            run(&["pending", "--older-than", age]),
            (Some(0), "running\nstuck\n".to_owned()),
            "{age}"
        );
    }
    assert_eq!(
        run(&["pending", "--older-than", "0s", "--abandoned"]),
        (Some(0), "stuck\n".to_owned())
    );
    for age in ["1h", "1d", "100s", "5m", "60000ms"] {
        assert_eq!(
            run(&["pending", "--older-than", age]),
            (Some(0), String::new()),
            "{age}"
        );
    }
    for bad in ["5", "5x", "x5s"] {
        assert_eq!(run(&["pending", "--older-than", bad]).0, Some(2), "{bad}");
    }
    assert_eq!(run(&["pending"]).0, Some(2), "pending needs --older-than");
    // The tenant's endpoint, named by its flags.
    let scoped = ["--method", "PUT", "--path", "/orders", "--scope", "acme"];
    let mut args = scoped.to_vec();
    args.extend(["pending", "--older-than", "0s"]);
    assert_eq!(run(&args), (Some(0), "o-1\n".to_owned()));
    let mut args = scoped.to_vec();
    args.extend(["show", "o-1"]);
    assert_eq!(run(&args).0, Some(0));
    assert_eq!(run(&["show", "o-1"]).0, Some(1), "not on POST /labels");

    // Resolved into a replay: its status, headers and body, kept for the retention given.
    let body = dir.join("label.json");
    std::fs::write(&body, r#"{"label_id":"by-hand"}"#).unwrap();
    let body = body.display().to_string();
    let resolve = |key: &'static str, retention: &'static str| {
        run(&[
            "--retention-s",
            retention,
            "resolve",
            key,
            "--status",
            "201",
            "--body-file",
            &body,
            "--header",
            "Content-Type: application/json",
            "--header",
            "ETag: \"v1\"",
        ])
    };
    assert_eq!(
        resolve("stuck", "86400"),
        (Some(0), "resolved stuck\n".to_owned())
    );
    let Ok(Claim::Replay(replay)) = store.claim(&labels("stuck"), &fingerprint).await else {
        panic!("a replay");
    };
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.body().as_ref(), br#"{"label_id":"by-hand"}"#);
    assert_eq!(replay.headers()["content-type"], "application/json");
    assert_eq!(replay.headers()["etag"], "\"v1\"");
    assert_eq!(
        resolve("running", "0"),
        (Some(0), "resolved running\n".to_owned())
    );
    let mut connection = connect(&file).await;
    let mut expires = async |key: String| -> Option<i64> {
        sqlx::query_scalar("SELECT expires_at FROM idempotency_records WHERE key = ?1")
            .bind(key)
            .fetch_one(&mut connection)
            .await
            .unwrap()
    };
    let now = now_millis();
    let day = expires(labels("stuck")).await.expect("a retention") - now;
    assert!((86_390_000..=86_400_000).contains(&day), "{day}");
    assert_eq!(expires(labels("running")).await, None, "kept for good");
    assert_eq!(resolve("stuck", "86400").0, Some(1), "not pending any more");
    assert_eq!(
        run(&["resolve", "done", "--status", "201"]).0,
        Some(2),
        "no body"
    );
    assert_eq!(
        run(&["resolve", "done", "--status", "abc", "--body-file", &body]).0,
        Some(2)
    );
    assert_eq!(
        run(&[
            "resolve",
            "done",
            "--status",
            "201",
            "--body-file",
            &body,
            "--header",
            "bad"
        ])
        .0,
        Some(2)
    );

    // Not a command, and not a flag: nothing is done.
    assert_eq!(
        run(&[
            "frobnicate",
            "done",
            "--status",
            "201",
            "--body-file",
            &body
        ])
        .0,
        Some(2)
    );
    assert_eq!(run(&["show", "--bogus"]).0, Some(2), "an unknown flag");
    // A store that fails the resolve: the store failed, not "not pending".
    let mut refusing = connect(&file).await;
    refusing
        .execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON idempotency_records \
             BEGIN SELECT RAISE(ABORT, 'refused'); END;",
        )
        .await
        .unwrap();
    store.claim(&labels("refused"), &fingerprint).await.unwrap();
    assert_eq!(resolve("refused", "0").0, Some(3));
    refusing.execute("DROP TRIGGER refuse").await.unwrap();
    assert_eq!(
        run(&["forget", "done"]),
        (Some(0), "forgotten done\n".to_owned())
    );
    assert_eq!(run(&["show", "done"]).0, Some(1));
    assert_eq!(run(&["forget", "done"]).0, Some(1));
    assert!(matches!(
        store.claim(&labels("done"), &fingerprint).await,
        Ok(Claim::New(_))
    ));
    drop(connection);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A completed record of `key`, with the label contract's created response.
async fn complete_new_at(
    store: &SqliteStore,
    key: &str,
    fingerprint: &tower_idempotency::operation::Fingerprint,
) {
    use tower_idempotency::store::{Claim, Store, StoredResponse};
    let Ok(Claim::New(reservation)) = store.claim(key, fingerprint).await else {
        panic!("a new key");
    };
    let response = StoredResponse::new(http::StatusCode::CREATED, Default::default(), "{}".into());
    store.complete(key, &reservation, &response).await.unwrap();
}

/// The operator's tool on a key past its replay window (issue "after the window"): `show`
/// says it is expired, when it completed, its `Location` and until when it is remembered;
/// `forget` drops the tombstone, and the key is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_tool_shows_an_expired_key_and_forgets_it() {
    use tower_idempotency::scope::store_key;
    use tower_idempotency::store::{Claim, Store};
    let (dir, file) = fresh_file("tool-expired");
    let url = format!("sqlite://{}", file.display());
    let retention = Duration::from_millis(200);
    let store = SqliteStore::open(&file)
        .await
        .unwrap()
        .retention(retention)
        .tombstones(Duration::from_secs(3600));
    let key = store_key(None, &http::Method::POST, "/labels", "old");
    let fingerprint = tower_idempotency::operation::LabelContract::fingerprint("k", "p");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fingerprint).await else {
        panic!("a new key");
    };
    let completed = std::time::Instant::now();
    let response = common::conformance::awkward_response();
    store.complete(&key, &reservation, &response).await.unwrap();
    tokio::time::sleep_until((completed + retention + Duration::from_millis(50)).into()).await;
    let run = |args: &[&str]| {
        let mut all = vec!["--store", url.as_str()];
        all.extend_from_slice(args);
        let (code, out, _) = common::operator_tool(&all);
        (code, out)
    };
    let (code, shown) = run(&["show", "old"]);
    assert_eq!(code, Some(0), "{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "state expired", "{shown}");
    assert_eq!(
        lines[3],
        format!("status {}", response.status().as_u16()),
        "{shown}"
    );
    assert!(
        lines[4].starts_with("completed_at ") && lines[4].ends_with(" GMT"),
        "{shown}"
    );
    assert_eq!(lines[5], "location /labels/label-901", "{shown}");
    assert!(
        lines[6].starts_with("remembered_until ") && lines[6].ends_with(" GMT"),
        "{shown}"
    );
    assert_eq!(lines.len(), 7, "{shown}");
    assert_eq!(
        run(&["forget", "old"]),
        (Some(0), "forgotten old\n".to_owned())
    );
    assert_eq!(run(&["show", "old"]).0, Some(1), "no record left");
    let Ok(Claim::New(_)) = store.claim(&key, &fingerprint).await else {
        panic!("forgotten: the key is new");
    };
    // A key resolved by hand keeps a tombstone as the servers were told: by default a week's,
    // none with `--tombstone-s 0`.
    let body = dir.join("body.json");
    std::fs::write(&body, "{}").unwrap();
    let body = body.display().to_string();
    for (name, flags) in [("kept", &[][..]), ("unkept", &["--tombstone-s", "0"][..])] {
        let key = store_key(None, &http::Method::POST, "/labels", name);
        store.claim(&key, &fingerprint).await.unwrap();
        let mut args = flags.to_vec();
        args.extend(["resolve", name, "--status", "201", "--body-file", &body]);
        assert_eq!(run(&args).0, Some(0), "{name}");
        let kept: Option<i64> = sqlx::query_scalar(
            "SELECT tombstone_until - expires_at FROM idempotency_records WHERE key = ?1",
        )
        .bind(&key)
        .fetch_one(&mut connect(&file).await)
        .await
        .unwrap();
        let week = i64::try_from(tower_idempotency::store::DEFAULT_TOMBSTONES.as_millis()).unwrap();
        assert_eq!(kept, (name == "kept").then_some(week), "{name}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
