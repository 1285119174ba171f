//! The MySQL store: the conformance suite (on its own pool and on an application's),
//! migrations, replicas, waits, the purge, an outage, a cut connection and lost answers.
//! Needs MySQL or MariaDB at `MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`).
#![cfg(feature = "mysql")]

use crate::common;

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use common::conformance::unique_key;
use common::servers::Proxy;
use common::*;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection as _, Executor as _};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::MySqlStore;
use tower_idempotency::store::Store;
use tower_idempotency::store::mysql::sqlx;
use tower_idempotency::store::{Claim, StoreErrorKind};

pub(crate) const TABLE: &str = "tower_idempotency_test";

pub(crate) fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

pub(crate) fn mysql_options() -> MySqlConnectOptions {
    MySqlConnectOptions::from_str(&mysql_url()).expect("MYSQL_URL")
}

pub(crate) async fn make_store(retention: Option<Duration>) -> MySqlStore {
    let store = MySqlStore::connect(&mysql_url())
        .await
        .expect("MySQL at MYSQL_URL")
        .table(TABLE)
        .unwrap()
        // Generous: beside this binary's heavier tests a loaded server once took a second
        // for a conformance claim; the tests about time make stores of their own.
        .timeout(Duration::from_secs(5));
    store.migrate().await.unwrap();
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));

async fn make_with(options: tower_idempotency::store::StoreOptions) -> MySqlStore {
    make_store(None)
        .await
        .with_options(options.timeout(Duration::from_secs(5)))
}

tower_idempotency::tombstone_conformance!(
    make_with,
    retention = Duration::from_millis(300),
    tombstones = Duration::from_secs(3),
);

/// The transactional mode keeps tombstones as the plain store does: a claim in its own
/// transaction finds the tombstone and answers expired, never a new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_transactional_store_refuses_an_expired_key_until_its_tombstone_ends() {
    let options = tower_idempotency::store::StoreOptions::new()
        .retention(Duration::from_millis(300))
        .tombstones(Duration::from_secs(3));
    let store = tower_idempotency::store::TransactionalMySqlStore::new(make_with(options).await);
    tower_idempotency::testing::conformance::an_expired_key_is_refused_until_its_tombstone_ends(
        store,
        Duration::from_millis(300),
        Duration::from_secs(3),
    )
    .await;
}

/// The whole suite again on the application's own pool, as it is (no session setting of the
/// store's), in a table of its own.
mod on_the_applications_pool {
    use super::*;

    async fn make_store(retention: Option<Duration>) -> MySqlStore {
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .connect_with(mysql_options())
            .await
            .expect("the application's pool");
        let store = MySqlStore::new(pool)
            .table("tower_idempotency_app_pool_test")
            .unwrap();
        store.migrate().await.unwrap();
        match retention {
            Some(retention) => store.retention(retention),
            None => store,
        }
    }

    tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));
}

/// A connection of the test's own.
pub(crate) async fn session() -> MySqlConnection {
    MySqlConnection::connect_with(&mysql_options())
        .await
        .expect("MySQL at MYSQL_URL")
}

/// Runs `sql` on `connection`.
pub(crate) async fn run(connection: &mut MySqlConnection, sql: impl Into<String>) {
    connection
        .execute(AssertSqlSafe(sql.into()))
        .await
        .expect("a statement of the test's");
}

/// A store on a table of its own, `tower_idempotency_<name>`, made anew.
pub(crate) async fn own_table(name: &str) -> (String, MySqlStore) {
    let table = format!("tower_idempotency_{name}");
    run(
        &mut session().await,
        format!("DROP TABLE IF EXISTS {table}"),
    )
    .await;
    let store = MySqlStore::connect(&mysql_url())
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    (table, store)
}

/// How many rows `sql` counts.
pub(crate) async fn count(sql: String) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_one(&mut session().await)
        .await
        .unwrap()
}

pub(crate) async fn mysql_addr() -> SocketAddr {
    let options = mysql_options();
    tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// A store that reaches the database through `proxy`, on a pool of one connection.
pub(crate) async fn store_through(proxy: &Proxy) -> MySqlStore {
    let options = mysql_options().host("127.0.0.1").port(proxy.addr.port());
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_lazy_with(options);
    let store = MySqlStore::new(pool).table(TABLE).unwrap();
    store.migrate().await.unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn the_generic_json_operation_creates_once_for_a_thousand_identical_requests() {
    payments::generic_mode_creates_once(make_store(None).await, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_generic_json_operation_completes_a_create_whose_client_went_away() {
    payments::generic_mode_survives_a_disconnect(make_store(None).await).await;
}

#[tokio::test]
pub(crate) async fn migrate_is_idempotent_and_table_names_are_checked() {
    let store = make_store(None).await;
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    for bad in ["", "1abc", "a-b", "a`b", "a;drop table x", &"x".repeat(49)] {
        let error = make_store(None).await.table(bad).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::InvalidConfig, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn two_replicas_with_their_own_pools_create_once() {
    replicas_create_once(make_store(None).await, make_store(None).await, 500).await;
}

/// `pending_wait` on this store: the waiting retries, on this replica and on another with its
/// own pool, get the first attempt's bytes (this replica's woken at once, the other's by its
/// poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn waiting_retries_get_the_first_attempts_bytes_on_every_replica() {
    waiting_retries_get_the_first_attempts_bytes(
        make_store(None).await,
        make_store(None).await,
        Duration::from_millis(250),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn fifty_waiters_on_two_replicas_get_the_same_201_and_leave_nothing() {
    fifty_waiters_on_two_replicas(
        make_store(None).await,
        make_store(None).await,
        MySqlStore::waited_keys,
    )
    .await;
}

/// The digits 0 to 9 as `n(i)`, for rows made by cross joins (a recursive count stops at
/// MariaDB's 1,000 iterations).
pub(crate) const DIGITS: &str = "n(i) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
    SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
    UNION ALL SELECT 8 UNION ALL SELECT 9)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn an_outage_fails_closed_within_the_timeout_and_traffic_recovers() {
    let proxy = Proxy::start(mysql_addr().await, false).await;
    let timeout = Duration::from_millis(300);
    let store = store_through(&proxy).await.timeout(timeout);
    outage_fails_closed_and_recovers(store, timeout, || proxy.cut(), || proxy.restore()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_connection_lost_between_create_and_complete_leaves_the_key_pending() {
    let proxy = Arc::new(Proxy::start(mysql_addr().await, false).await);
    let store = store_through(&proxy)
        .await
        .timeout(Duration::from_millis(300));
    let cutter = Arc::clone(&proxy);
    crash_between_create_and_complete(store, move || cutter.cut(), || proxy.restore()).await;
}

/// A claim that reached the database and committed, whose answer was lost (dropped by the
/// proxy, then the connection cut): settled, so the retry creates once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_answer_lost_after_the_send_strands_no_key() {
    let proxy = Proxy::start(mysql_addr().await, false).await;
    let store = store_through(&proxy)
        .await
        .timeout(Duration::from_millis(300));
    answers_lost_after_the_send_strand_no_key(
        store,
        || proxy.mute(),
        || proxy.cut(),
        || proxy.restore(),
    )
    .await;
}

/// Claims that wait on a locked table past their timeout must not commit later with a token
/// nobody holds: the key would be pending for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn claims_that_time_out_on_a_locked_table_strand_no_key() {
    let (table, store) = own_table("lock").await;
    let store = store.timeout(Duration::from_millis(300));
    let locked = Arc::new(tokio::sync::Notify::new());
    let stall = {
        let held = Arc::clone(&locked);
        let table = table.clone();
        async move {
            tokio::spawn(async move {
                let mut locker = session().await;
                run(&mut locker, format!("LOCK TABLES {table} WRITE")).await;
                held.notify_one();
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                run(&mut locker, "UNLOCK TABLES").await;
            });
            locked.notified().await;
        }
    };
    lost_claim_answers_strand_no_key(store, stall).await;
    run(&mut session().await, format!("DROP TABLE {table}")).await;
}

/// The key and the fingerprint are bytes: keys that a case-insensitive collation would call
/// equal are two keys.
#[tokio::test]
pub(crate) async fn keys_that_differ_in_case_alone_are_two_keys() {
    let store = make_store(None).await;
    let key = unique_key("Case");
    let fp = LabelContract::fingerprint("x", "y");
    assert!(matches!(store.claim(&key, &fp).await, Ok(Claim::New(_))));
    assert!(matches!(
        store.claim(&key.to_lowercase(), &fp).await,
        Ok(Claim::New(_))
    ));
}

/// A MariaDB server of the test's own on a free port, in a temporary directory, serving TLS
/// with the certificate `tls` signed; no grant tables (any user, no password): the test is
/// about the connection's encryption.
pub(crate) struct TlsMariaDb {
    port: u16,
    server: std::process::Child,
    _dir: common::servers::TempDir,
}

impl TlsMariaDb {
    fn start(tls: &common::servers::TlsFiles) -> Self {
        use std::process::{Command, Stdio};
        let dir = common::servers::TempDir::new("mariadb");
        let data = dir.0.join("data");
        let installed = Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg(format!("--datadir={}", data.display()))
            .output()
            .expect("mariadb-install-db must be on PATH for this test");
        assert!(
            installed.status.success(),
            "{}",
            String::from_utf8_lossy(&installed.stderr)
        );
        let port = common::servers::free_port();
        let server = Command::new("mariadbd")
            .args([
                "--no-defaults",
                "--user=root",
                "--skip-grant-tables",
                "--bind-address=127.0.0.1",
                "--innodb-buffer-pool-size=16M",
            ])
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", dir.0.join("mariadb.sock").display()))
            .arg(format!(
                "--pid-file={}",
                dir.0.join("mariadb.pid").display()
            ))
            .arg(format!("--ssl-ca={}", tls.path("ca.pem")))
            .arg(format!("--ssl-cert={}", tls.path("server.pem")))
            .arg(format!("--ssl-key={}", tls.path("server.key")))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("mariadb.log")).unwrap())
            .spawn()
            .expect("mariadbd must be on PATH for this test");
        let mut server = Self {
            port,
            server,
            _dir: dir,
        };
        // Up once it answers a ping, however long the start takes on a loaded machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let pinged = Command::new("mysqladmin")
                .args(["--protocol=tcp", "-h", "127.0.0.1", "-u", "root", "ping"])
                .arg(format!("-P{port}"))
                .output()
                .is_ok_and(|out| out.status.success());
            if pinged {
                break;
            }
            if let Ok(Some(status)) = server.server.try_wait() {
                panic!("mariadbd exited: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "mariadbd did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server.sql("CREATE DATABASE IF NOT EXISTS test");
        server
    }

    fn sql(&mut self, statement: &str) {
        let done = std::process::Command::new("mysql")
            .args([
                "--protocol=tcp",
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "-e",
                statement,
            ])
            .arg(format!("-P{}", self.port))
            .output()
            .expect("mysql on PATH");
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }

    fn url(&self, parameters: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/test?{parameters}", self.port)
    }
}

impl Drop for TlsMariaDb {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// TLS to MySQL by URL: with `ssl-mode=VERIFY_IDENTITY` and the CA that signed the server's
/// certificate, the store's sessions are encrypted (`Ssl_cipher`) and serve claims and
/// replays; with a CA that did not sign it, the connect fails with the TLS error, never a
/// plaintext session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn tls_by_url_encrypts_the_stores_sessions_and_a_foreign_ca_fails_the_connect() {
    let tls = common::servers::TlsFiles::make();
    let server = TlsMariaDb::start(&tls);
    let verified = server.url(&format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        tls.path("ca.pem")
    ));
    let store = MySqlStore::connect(&verified)
        .await
        .expect("a verified TLS session");
    store.migrate().await.unwrap();
    let key = unique_key("tls");
    complete_new(&store, &key).await;
    assert_eq!(claimed_again(&store, &key).await, "replay");
    let cipher: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(
        !cipher.1.is_empty(),
        "the store's session is encrypted: {cipher:?}"
    );

    let other = common::servers::TlsFiles::make();
    let foreign = server.url(&format!(
        "ssl-mode=VERIFY_CA&ssl-ca={}",
        other.path("ca.pem")
    ));
    let error = MySqlStore::connect(&foreign)
        .await
        .expect_err("a certificate that does not verify");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    let chain = format!("{error:#}").to_lowercase();
    assert!(
        chain.contains("certificate") || chain.contains("tls"),
        "the TLS error in the chain: {chain}"
    );
}

/// The store's own pool gives each connection its timeout (whole seconds, at least one) as
/// the wait for a row lock and for a table's metadata lock, so that no statement a call gave
/// up on waits on the server past its settling (an `ALTER` queued behind a long transaction
/// holds every statement on the table).
#[tokio::test]
pub(crate) async fn the_own_pools_connections_wait_for_locks_no_longer_than_the_timeout() {
    let store = MySqlStore::connect(&mysql_url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(2_500));
    let waits: (u64, u64) =
        sqlx::query_as("SELECT @@session.innodb_lock_wait_timeout, @@session.lock_wait_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(waits, (2, 2));
}

/// Found in review: a call that timed out put its connection back in the pool, and sqlx
/// first waits for the answer of the statement given up on, with no bound. Behind a server
/// that went silent (its answers lost, the connection still open) that pool slot was held for
/// good, and with a pool of one every later call failed after the server came back. A call
/// that times out closes its connection instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_call_that_times_out_on_a_silent_server_holds_no_pool_slot() {
    let proxy = Proxy::start(mysql_addr().await, false).await;
    let store = store_through(&proxy)
        .await
        .timeout(Duration::from_millis(300));
    let fp = LabelContract::fingerprint("x", "y");
    assert!(matches!(
        store.claim(&unique_key("silent-warm"), &fp).await,
        Ok(Claim::New(_))
    ));
    // Back in the pool (sqlx pings it on the way: a ping whose answer is lost holds its slot
    // until TCP gives up, which no store call can shorten).
    wait_for(|| store.pool().num_idle() == 1).await;
    proxy.mute();
    let lost = store.claim(&unique_key("silent-lost"), &fp).await;
    assert!(
        matches!(&lost, Err(error) if error.kind() == StoreErrorKind::Timeout),
        "{lost:?}"
    );
    proxy.restore();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match store.claim(&unique_key("silent-after"), &fp).await {
            Ok(Claim::New(_)) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the pool never served again: {other:?}"
            ),
        }
    }
}

/// Found in review: on the application's pool, a store call that found every connection out
/// waited only for one another store call kept, looking at the pool now and then, while each
/// connection the application's own users gave back went to the next of them in the pool's
/// line: the store's calls timed out though connections came back all the time. A store call
/// waits in the pool's line too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn store_calls_get_their_turn_on_a_busy_application_pool() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect_with(mysql_options())
        .await
        .unwrap();
    // The table made elsewhere: this store has used no connection yet, and keeps none.
    drop(make_store(None).await);
    let store = MySqlStore::new(pool.clone()).table(TABLE).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Twelve users of the application's pool, each holding a connection for a moment, back to
    // back, so that the pool always has someone in its line.
    let users: Vec<_> = (0..12)
        .map(|_| {
            let (pool, stop) = (pool.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let mut connection = pool.acquire().await.unwrap();
                    sqlx::query("SELECT SLEEP(0.02)")
                        .execute(&mut *connection)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    // Every connection out, the users' line formed.
    wait_for(|| pool.size() == 2 && pool.num_idle() == 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fp = LabelContract::fingerprint("x", "y");
    for i in 0..20 {
        let claimed = store.claim(&unique_key(&format!("busy-{i}")), &fp).await;
        assert!(matches!(claimed, Ok(Claim::New(_))), "{i}: {claimed:?}");
    }
    stop.store(true, Ordering::SeqCst);
    for user in users {
        user.await.unwrap();
    }
}

/// Found when a clean run's outage test kept a key pending: the store kept the one connection
/// of its pool for its next call as long as calls kept coming, so that the pool's line (a
/// transaction of the store settling a lost claim, an application's handler) waited for the
/// calls to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_pools_line_gets_a_turn_while_store_calls_go_on() {
    drop(make_store(None).await);
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(mysql_options())
        .await
        .unwrap();
    let store = MySqlStore::new(pool.clone()).table(TABLE).unwrap();
    common::the_pools_line_gets_a_turn_while_store_calls_go_on(store, pool).await;
}

/// A lost claim queued behind another transaction's insert of its key: the store's timeout
/// (300 ms) is shorter than the lock wait InnoDB allows its statement (a second at least), so
/// its settling could queue behind the same insert, and when that transaction rolls back the
/// two go on together. Whichever goes first, the key must not be left pending under the lost
/// claim's reservation: the settling waits out the claim's lock wait first. Six rounds at
/// once, each on a table of its own; each holder rolls back once both wait, or after three
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_lost_claim_queued_behind_a_rolled_back_insert_strands_no_key() {
    use tower_idempotency::store::{Lease, Reservation};

    async fn round(n: usize) -> i64 {
        let (table, store) = own_table(&format!("queued_{n}_{}", std::process::id())).await;
        let store = store.timeout(Duration::from_millis(300));
        let key = unique_key(&format!("queued-{n}"));
        let fingerprint = LabelContract::fingerprint(&key, "p");
        let mut holder = session().await;
        run(&mut holder, "BEGIN").await;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{table}` (`key`, fingerprint, changed_at) VALUES (?, 'held', 0)"
        )))
        .bind(&key)
        .execute(&mut holder)
        .await
        .unwrap();
        let started = tokio::time::Instant::now();
        let reservation = Reservation::generate();
        let lost = store
            .claim_with(&key, &fingerprint, reservation, Lease::default())
            .await;
        assert_eq!(lost.unwrap_err().kind(), StoreErrorKind::Timeout);
        let settling = {
            let (store, key) = (store.clone(), key.clone());
            // Tried again on a failure (a deadlock with the claim), as the layer does.
            tokio::spawn(async move {
                let mut tries = 0;
                loop {
                    tries += 1;
                    match store.settle_claim(&key, &fingerprint, reservation).await {
                        Err(error) if tries < 10 => drop(error),
                        settled => return settled,
                    }
                }
            })
        };
        // Statements on the table other than the holder's, running or waiting.
        let on_table = || {
            count(format!(
                "SELECT count(*) FROM information_schema.processlist \
                 WHERE info LIKE '%{table}%' AND info NOT LIKE '%processlist%'"
            ))
        };
        while on_table().await < 2 && started.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run(&mut holder, "ROLLBACK").await;
        settling.await.unwrap().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while on_table().await > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = count(format!(
            "SELECT count(*) FROM `{table}` WHERE `key` = '{key}' AND token IS NOT NULL"
        ))
        .await;
        run(&mut session().await, format!("DROP TABLE `{table}`")).await;
        pending
    }

    let rounds: Vec<_> = (0..6).map(|n| tokio::spawn(round(n))).collect();
    let mut stranded = 0;
    for round in rounds {
        stranded += round.await.unwrap();
    }
    assert_eq!(stranded, 0, "keys left pending over 6 rounds");
}

/// Options are a value: a clone given another timeout makes its own pool, with that timeout as
/// its connections' lock waits, and the store it was cloned from keeps its pool's (a setter once
/// wrote a handle the clones shared).
#[tokio::test]
pub(crate) async fn new_options_leave_the_pool_of_the_stores_cloned_before_as_it_was() {
    async fn lock_wait(store: &MySqlStore) -> u64 {
        sqlx::query_scalar("SELECT @@session.innodb_lock_wait_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap()
    }
    let first = MySqlStore::connect(&mysql_url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let second = first.clone().timeout(Duration::from_secs(4));
    assert_eq!(second.options().call_timeout(), Duration::from_secs(4));
    assert_eq!(lock_wait(&second).await, 4);
    assert_eq!(lock_wait(&first).await, 2);
    let third = first.clone().keep_forever();
    assert_eq!(third.options().retention_window(), None);
    third.pool().close().await;
    assert!(first.pool().is_closed(), "the same pool");
}

/// A release by this process wakes the waiters of its key at once, not at the next poll.
#[tokio::test]
pub(crate) async fn a_local_change_wakes_its_waiters_at_once() {
    let store = make_store(None).await;
    common::scenarios::a_local_change_wakes_its_waiters_at_once(store, MySqlStore::waited_keys)
        .await;
}
