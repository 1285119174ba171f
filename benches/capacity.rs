//! The capacity model's figures: the bytes a completed record costs in each store, and the
//! creates and replays a second each store sustains under concurrency, on this machine.
//!
//! ```text
//! cargo bench --all-features --bench capacity -- [--records N] [--body-bytes B]
//!     [--tasks C] [--seconds S] [--pool P] [--rounds R] [--expired E]
//!     [--stores memory,redis,redis-replicated,redis-cluster,postgres,mysql,sqlite]
//!     [--tombstones]
//! ```
//!
//! `--tombstones` measures only what tombstones cost each SQL store wanted
//! (`capacity/tombstones.rs`): bytes a record with and without its tombstone, bytes a
//! tombstone once the purge dropped its response, creates a second with and without, turn by
//! turn.
//!
//! `redis-replicated` and `redis-cluster` start their own servers on free ports (a primary
//! and its replica; a cluster of three primaries with a replica each, needing `redis-server`
//! and `redis-cli` on PATH) and measure the store twice on them: with its default, which
//! waits for a replica after every write, and with the wait off (`wait_for_replicas(0, _)`).
//!
//! Each SQL store is measured turn by turn with its own statements written plainly on the same
//! pool (`capacity/plain.rs`: the claim and the complete as the store sends them, without its
//! timeouts, kept connections or decoding), `--rounds` rounds (default 3): the floor of what a
//! store on that driver costs. PostgreSQL twice, in plaintext (`sslmode=disable`) and over TLS
//! (`sslmode=require`). `--expired E` adds E expired records in bulk before the purge, for a
//! long one (a million: `--expired 1000000`).
//!
//! Defaults: 100,000 records of the label contract's created response (201, four headers, a 59-byte
//! body: 154 bytes in all) under keys as clients send them (a UUID, 36 characters, on
//! `POST /labels`), 64 tasks on two workers for 5 seconds a figure, a PostgreSQL pool of 16.
//! Needs Redis at `REDIS_URL`, PostgreSQL at `DATABASE_URL` and MySQL at `MYSQL_URL` for
//! their rows; the memory
//! store is measured first, in a process that has allocated little yet.
//!
//! Bytes a record, by what each store holds them in: the growth of this process's resident
//! memory (memory store), Redis's `used_memory`, PostgreSQL's `pg_total_relation_size` of the
//! table and its indexes (right after the fill, and after `VACUUM FULL`: the complete's update
//! leaves a dead row version until vacuum reuses its room), and the SQLite file after a WAL
//! checkpoint. Then every record is made expired and the store's purge (PostgreSQL, MySQL,
//! SQLite) timed, with creates of new keys made beside it from as many tasks, for as long as it
//! runs: their rate against the creates/s without a purge, and how many failed. Each store gets its own namespace (a Redis prefix, a PostgreSQL table, a
//! SQLite file), removed at the end.

mod common;
#[path = "capacity/plain.rs"]
mod plain;
#[path = "capacity/servers.rs"]
mod servers;
#[path = "capacity/tombstones.rs"]
mod tombstones;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tower_idempotency::store::redis::redis;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use tower_idempotency::MemoryStore;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::scope::store_key;
use tower_idempotency::store::Store;
use tower_idempotency::store::postgres::sqlx;
use tower_idempotency::store::{
    Claim, MySqlStore, PostgresStore, Purge, RedisStore, Reservation, SqliteStore, StoredResponse,
};

use self::plain::Plain;
use self::servers::Servers;

struct Options {
    records: usize,
    body: Option<usize>,
    tasks: usize,
    seconds: u64,
    pool: usize,
    /// Rounds of a SQL store against its plain statements.
    rounds: usize,
    /// Expired records added in bulk before a SQL store's purge, beside the filled ones.
    expired: usize,
    stores: Vec<String>,
    /// Measure only what tombstones cost the SQL stores (`--tombstones`).
    tombstones: bool,
}

fn options() -> Options {
    let mut options = Options {
        records: 100_000,
        body: None,
        tasks: 64,
        seconds: 5,
        pool: 16,
        rounds: 3,
        expired: 0,
        tombstones: false,
        stores: [
            "memory",
            "redis",
            "redis-replicated",
            "redis-cluster",
            "postgres",
            "mysql",
            "sqlite",
        ]
        .map(String::from)
        .to_vec(),
    };
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = args.next() {
        if flag == "--tombstones" {
            options.tombstones = true;
            continue;
        }
        let value = args.next().unwrap_or_default();
        let number = || value.parse::<usize>().expect("a number");
        match flag.as_str() {
            "--records" => options.records = number().max(1),
            "--body-bytes" => options.body = Some(number()),
            "--tasks" => options.tasks = number().max(1),
            "--seconds" => options.seconds = number().max(1) as u64,
            "--pool" => options.pool = number().max(1),
            "--rounds" => options.rounds = number().max(1),
            "--expired" => options.expired = number(),
            "--stores" => options.stores = value.split(',').map(String::from).collect(),
            other => panic!("unknown flag {other}"),
        }
    }
    options
}

/// The label contract's created response, its body replaced by `body` bytes if given.
fn response(body: Option<usize>) -> StoredResponse {
    let created = common::created();
    let (parts, full) = created.into_parts();
    let created = match futures_executor(full.collect()) {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let body = match body {
        Some(n) => Bytes::from(vec![b'x'; n]),
        None => created,
    };
    StoredResponse::new(parts.status, parts.headers, body)
}

/// Runs a future that is ready at once (a `Full` body's collect).
fn futures_executor<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// The size of `response` as the layer counts it: status, header names and values, body.
fn response_bytes(response: &StoredResponse) -> usize {
    let headers: usize = response
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    3 + headers + response.body().len()
}

/// A client's key, as a UUID is written: 36 characters, distinct for `i` in this run.
fn client_key(run: u64, i: u64) -> String {
    let hex = format!("{run:016x}{i:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The store key of client key `i` of this run, on `POST /labels`.
fn key(run: u64, i: u64) -> String {
    store_key(None, &Method::POST, "/labels", &client_key(run, i))
}

/// A create as the layer makes it: a claim of a new key, then its complete.
async fn create<St: Store>(store: &St, key: &str, response: &StoredResponse) {
    let fingerprint = LabelContract::fingerprint(key, "parcel-42");
    match store.claim(key, &fingerprint).await {
        Ok(Claim::New(reservation)) => complete(store, key, &reservation, response).await,
        other => panic!("{key}: {:?}", other.map(|claim| claim_name(&claim))),
    }
}

async fn complete<St: Store>(
    store: &St,
    key: &str,
    reservation: &Reservation,
    response: &StoredResponse,
) {
    store
        .complete(key, reservation, response)
        .await
        .expect("the complete");
}

fn claim_name(claim: &Claim) -> &'static str {
    match claim {
        Claim::New(_) => "new",
        Claim::Replay(_) => "replay",
        Claim::Pending => "pending",
        Claim::Conflict => "conflict",
        Claim::Expired(_) => "expired",
    }
}

/// Fills `store` with `records` completed records, keys `0..records` of `run`, from `tasks`
/// tasks.
async fn fill<St: Store + Clone>(
    store: &St,
    run: u64,
    records: usize,
    tasks: usize,
    response: &StoredResponse,
) {
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, next, response) = (store.clone(), Arc::clone(&next), response.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= records as u64 {
                    break;
                }
                create(&store, &key(run, i), &response).await;
            }
        }));
    }
    for handle in handles {
        handle.await.expect("a fill task");
    }
}

/// What makes the creates and replays measured: a store through its API, or a SQL store's
/// statements written plainly (`plain`).
trait Contender: Clone + Send + Sync + 'static {
    /// A create of `key`, which must be new.
    fn create(&self, key: &str) -> impl std::future::Future<Output = ()> + Send;
    /// A replay of `key`, which must be completed.
    fn replay(&self, key: &str) -> impl std::future::Future<Output = ()> + Send;
}

/// A store through its API, as the layer calls it.
#[derive(Clone)]
struct Api<St> {
    store: St,
    response: StoredResponse,
}

impl<St: Store + Clone + 'static> Contender for Api<St> {
    async fn create(&self, key: &str) {
        create(&self.store, key, &self.response).await;
    }

    async fn replay(&self, key: &str) {
        let fingerprint = LabelContract::fingerprint(key, "parcel-42");
        match self.store.claim(key, &fingerprint).await {
            Ok(Claim::Replay(_)) => {}
            other => panic!("{key}: {:?}", other.map(|c| claim_name(&c))),
        }
    }
}

/// A SQL store's statements written plainly, storing a response of the encoded one's size.
#[derive(Clone)]
struct Statements {
    plain: Plain,
    response: Arc<[u8]>,
}

impl Contender for Statements {
    async fn create(&self, key: &str) {
        let fingerprint = LabelContract::fingerprint(key, "parcel-42").to_hex();
        self.plain
            .create(key, fingerprint.as_str(), &self.response)
            .await;
    }

    async fn replay(&self, key: &str) {
        let fingerprint = LabelContract::fingerprint(key, "parcel-42").to_hex();
        self.plain.replay(key, fingerprint.as_str()).await;
    }
}

/// Creates (new keys of `run` from `records` on) and then replays (of the keys `0..records`
/// of `filled`, which a fill made) a second, each for `seconds`, from `tasks` tasks.
async fn throughput<C: Contender>(
    contender: &C,
    run: u64,
    filled: u64,
    records: usize,
    options: &Options,
) -> (f64, f64) {
    let (from, replayable) = (records as u64, records as u64);
    let rate = |replay: bool| {
        let next = Arc::new(AtomicU64::new(from));
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for task in 0..options.tasks as u64 {
            let (contender, next, done, stop) = (
                contender.clone(),
                Arc::clone(&next),
                Arc::clone(&done),
                Arc::clone(&stop),
            );
            handles.push(tokio::spawn(async move {
                let mut i = task;
                while !stop.load(Ordering::Relaxed) {
                    if replay {
                        i = (i + 7919) % replayable;
                        contender.replay(&key(filled, i)).await;
                    } else {
                        let key = key(run, next.fetch_add(1, Ordering::Relaxed));
                        contender.create(&key).await;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    // The memory store answers without a pending await: let the timer run.
                    tokio::task::yield_now().await;
                }
            }));
        }
        let seconds = options.seconds;
        async move {
            let started = Instant::now();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            stop.store(true, Ordering::Relaxed);
            let counted = done.load(Ordering::Relaxed);
            let elapsed = started.elapsed().as_secs_f64();
            for handle in handles {
                handle.await.expect("a task");
            }
            counted as f64 / elapsed
        }
    };
    let creates = rate(false).await;
    let replays = rate(true).await;
    (creates, replays)
}

/// Creates and replays a second of `store` through its API, filled with the keys of `run`.
async fn api_throughput<St: Store + Clone + 'static>(
    store: &St,
    run: u64,
    options: &Options,
    response: &StoredResponse,
) -> (f64, f64) {
    let api = Api {
        store: store.clone(),
        response: response.clone(),
    };
    throughput(&api, run, run, options.records, options).await
}

/// The creates and replays a second of `store` (filled with the keys of `run`) and of its
/// statements written plainly on the same pool, turn by turn for `options.rounds` rounds:
/// the medians, and each round's figures.
async fn against_plain<St: Store + Clone + 'static>(
    store: &St,
    plain: Plain,
    run: u64,
    options: &Options,
    response: &StoredResponse,
) -> (f64, f64, Floor) {
    let api = Api {
        store: store.clone(),
        response: response.clone(),
    };
    let statements = Statements {
        plain,
        response: vec![0x5a; response_bytes(response) + 8].into(),
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..options.rounds as u64 {
        // Keys of runs of their own for each contender's creates in each round.
        let salt = (round + 1) << 48;
        ours.push(throughput(&api, run ^ salt, run, options.records, options).await);
        theirs.push(
            throughput(
                &statements,
                run ^ salt ^ (1 << 47),
                run,
                options.records,
                options,
            )
            .await,
        );
    }
    let median = |figures: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut picked: Vec<f64> = figures.iter().map(pick).collect();
        picked.sort_by(f64::total_cmp);
        picked[picked.len() / 2]
    };
    // Each round's store ÷ plain, creates and replays.
    let ratios: Vec<(f64, f64)> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| (o.0 / t.0, o.1 / t.1))
        .collect();
    let floor = Floor {
        creates: median(&theirs, |f| f.0),
        replays: median(&theirs, |f| f.1),
        creates_ratio: median(&ratios, |f| f.0),
        replays_ratio: median(&ratios, |f| f.1),
        rounds: ours.iter().zip(&theirs).map(|(o, t)| (*o, *t)).collect(),
    };
    (median(&ours, |f| f.0), median(&ours, |f| f.1), floor)
}

/// A SQL store's plain statements beside it: medians of the rounds, the ratios each round's.
struct Floor {
    creates: f64,
    replays: f64,
    /// The median of each round's store ÷ plain.
    creates_ratio: f64,
    replays_ratio: f64,
    /// Each round's (creates, replays) of the store, then of the plain statements.
    rounds: Vec<((f64, f64), (f64, f64))>,
}

/// The creates and replays a second of a Redis `store` on servers of the bench's own, filled
/// under a prefix of its own; bytes as in the Redis row.
async fn redis_throughput(
    name: &str,
    store: RedisStore,
    run: u64,
    options: &Options,
    response: &StoredResponse,
) -> Row {
    let store = store.prefix(format!("capacity-{run}-{}:", name.len()));
    println!("{name}: {}", store.replica_wait());
    fill(&store, run, options.records, options.tasks, response).await;
    let (creates, replays) = api_throughput(&store, run, options, response).await;
    Row {
        store: name.to_owned(),
        bytes: "as Redis".to_owned(),
        creates,
        replays,
        purged: None,
        floor: None,
    }
}

/// What tombstones cost each SQL store wanted (see `tombstones`): on two tables (files) of the
/// run's own, one keeping tombstones (the default) and one keeping none, removed at the end.
async fn tombstone_costs(
    options: &Options,
    run: u64,
    response: &StoredResponse,
) -> Vec<tombstones::Costs> {
    let wanted = |name: &str| options.stores.iter().any(|s| s == name);
    let retention = Duration::from_secs(3600);
    let mut costs = Vec::new();
    if wanted("postgres") {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(options.pool as u32)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .expect("PostgreSQL");
        let table = |on: bool| format!("tombstones_{}_{on}", run % 1_000_000_000);
        let store = |on: bool| {
            let store = PostgresStore::new(pool.clone())
                .table(&table(on))
                .expect("a table name")
                .retention(retention);
            if on {
                store
            } else {
                store.tombstones(Duration::ZERO)
            }
        };
        let (off, on) = (store(false), store(true));
        off.migrate().await.expect("the table");
        on.migrate().await.expect("the table");
        let sql = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
        let measure = async |on: bool| {
            let table = table(on);
            sql(format!("VACUUM FULL {table}"))
                .execute(&pool)
                .await
                .expect("VACUUM FULL");
            let row = sql(format!(
                "SELECT pg_total_relation_size('{table}'::regclass), \
                 (SELECT count(*) FROM {table})"
            ))
            .fetch_one(&pool)
            .await
            .expect("the size");
            (sqlx::Row::get(&row, 0), sqlx::Row::get(&row, 1))
        };
        let expire = async || {
            sql(format!(
                "UPDATE {} SET expires_at = now() - interval '1 hour' \
                 WHERE expires_at IS NOT NULL",
                table(true)
            ))
            .execute(&pool)
            .await
            .expect("the records expired");
        };
        costs.push(
            tombstones::costs(
                "PostgreSQL",
                (off, on),
                run,
                options,
                response,
                measure,
                expire,
            )
            .await,
        );
        for on in [false, true] {
            sql(format!("DROP TABLE {}", table(on)))
                .execute(&pool)
                .await
                .expect("DROP TABLE");
        }
    }
    if wanted("mysql") {
        let url = std::env::var("MYSQL_URL").unwrap_or("mysql://root@127.0.0.1:3306/test".into());
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(options.pool as u32)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .expect("MySQL");
        let table = |on: bool| format!("tombstones_{}_{on}", run % 1_000_000_000);
        let store = |on: bool| {
            let store = MySqlStore::new(pool.clone())
                .table(&table(on))
                .expect("a table name")
                .retention(retention);
            if on {
                store
            } else {
                store.tombstones(Duration::ZERO)
            }
        };
        let (off, on) = (store(false), store(true));
        off.migrate().await.expect("the table");
        on.migrate().await.expect("the table");
        let sql = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
        // Rebuilt, and InnoDB's own count of its pages brought up to date.
        let measure = async |on: bool| {
            let table = table(on);
            for statement in [
                format!("OPTIMIZE TABLE {table}"),
                format!("ANALYZE TABLE {table}"),
            ] {
                sql(statement).execute(&pool).await.expect("OPTIMIZE");
            }
            let row = sql(format!(
                "SELECT CAST(data_length + index_length AS SIGNED), \
                 (SELECT count(*) FROM {table}) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ))
            .fetch_one(&pool)
            .await
            .expect("the size");
            (sqlx::Row::get(&row, 0), sqlx::Row::get(&row, 1))
        };
        let expire = async || {
            sql(format!(
                "UPDATE {} SET expires_at = 1 WHERE expires_at IS NOT NULL",
                table(true)
            ))
            .execute(&pool)
            .await
            .expect("the records expired");
        };
        costs.push(
            tombstones::costs("MySQL", (off, on), run, options, response, measure, expire).await,
        );
        for on in [false, true] {
            sql(format!("DROP TABLE {}", table(on)))
                .execute(&pool)
                .await
                .expect("DROP TABLE");
        }
    }
    if wanted("sqlite") {
        use tower_idempotency::store::sqlite::sqlx as sqlite;
        let dir = std::env::temp_dir().join(format!("tower-idempotency-tombstones-{run}"));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let file = |on: bool| dir.join(format!("records-{on}.sqlite3"));
        let store = async |on: bool| {
            let store = SqliteStore::open(file(on))
                .await
                .expect("the SQLite file")
                .retention(retention);
            if on {
                store
            } else {
                store.tombstones(Duration::ZERO)
            }
        };
        let (off, on) = (store(false).await, store(true).await);
        let pools = (off.pool().clone(), on.pool().clone());
        let measure = async |on: bool| {
            use sqlite::Executor as _;
            let pool = if on { &pools.1 } else { &pools.0 };
            pool.execute("VACUUM").await.expect("VACUUM");
            pool.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                .await
                .expect("a checkpoint");
            let rows: i64 = sqlite::query_scalar("SELECT count(*) FROM idempotency_records")
                .fetch_one(pool)
                .await
                .expect("the rows");
            let bytes = std::fs::metadata(file(on)).expect("the file").len() as i64;
            (bytes, rows)
        };
        let expire = async || {
            sqlite::query(
                "UPDATE idempotency_records SET expires_at = 0 WHERE expires_at IS NOT NULL",
            )
            .execute(&pools.1)
            .await
            .expect("the records expired");
        };
        costs.push(
            tombstones::costs("SQLite", (off, on), run, options, response, measure, expire).await,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    costs
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

struct Row {
    store: String,
    bytes: String,
    creates: f64,
    replays: f64,
    /// The store's purge beside creates, where it has one.
    purged: Option<Purged>,
    /// A SQL store's statements written plainly on the same pool, measured beside it.
    floor: Option<Floor>,
}

/// Expired records a second the store's purge deleted, of `expected`, run again after each
/// failure as a purger would (each failure counted; at most 100); and beside it, from `tasks`
/// tasks for as long as it ran, creates of new keys of a run of their own: how many a second,
/// and how many failed (a claim not answered new, or an error: what a client would get as a
/// `503`).
async fn purge_beside_creates<St: Store + Purge + Clone>(
    store: &St,
    expected: u64,
    run: u64,
    tasks: usize,
    response: &StoredResponse,
) -> Purged {
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let next = Arc::new(AtomicU64::new(0));
    let beside = run ^ 0x5eed;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (store, stop, done, failed, next, response) = (
            store.clone(),
            Arc::clone(&stop),
            Arc::clone(&done),
            Arc::clone(&failed),
            Arc::clone(&next),
            response.clone(),
        );
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let key = key(beside, next.fetch_add(1, Ordering::Relaxed));
                let fingerprint = LabelContract::fingerprint(&key, "parcel-42");
                let created = match store.claim(&key, &fingerprint).await {
                    Ok(Claim::New(reservation)) => {
                        store.complete(&key, &reservation, &response).await.is_ok()
                    }
                    _ => false,
                };
                let counter = if created { &done } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }));
    }
    let started = Instant::now();
    // Until a run ends well: then none is left. A batch that timed out may have deleted its
    // records all the same, uncounted, so the count is checked against the table below.
    let (mut purged, mut purge_failures) = (0, 0);
    while purge_failures < 100 {
        let mut batch = 0;
        let result = store.purge_expired_counting(&mut batch).await;
        purged += batch;
        match result {
            Ok(()) => break,
            Err(error) => {
                purge_failures += 1;
                if purge_failures == 1 {
                    println!("a purge failed: {error}; run again");
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (created, failed) = (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    for handle in handles {
        handle.await.expect("a task");
    }
    assert!(purge_failures < 100, "the purge kept failing");
    assert!(purged <= expected, "no more purged than expired");
    Purged {
        rate: expected as f64 / elapsed,
        failures: purge_failures,
        creates: created as f64 / elapsed,
        failed,
    }
}

/// A purge beside creates.
struct Purged {
    /// Expired records a second the purge deleted.
    rate: f64,
    /// The purge's runs that failed before it was done.
    failures: u32,
    /// Creates a second beside it.
    creates: f64,
    /// Creates that failed beside it.
    failed: u64,
}

fn per_record(bytes: i64, records: usize) -> i64 {
    bytes / records as i64
}

async fn redis_used_memory(connection: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(connection)
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("used_memory")
}

fn main() {
    let options = options();
    let response = response(options.body);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64;
    let records = options.records;
    let mut rows = Vec::new();
    let wanted = |name: &str| options.stores.iter().any(|s| s == name);
    if options.tombstones {
        let costs = runtime.block_on(tombstone_costs(&options, run, &response));
        tombstones::print(&costs, &options);
        return;
    }
    runtime.block_on(async {
        if wanted("memory") {
            let store = MemoryStore::builder().unbounded().build();
            let before = resident_bytes() as i64;
            fill(&store, run, records, options.tasks, &response).await;
            let grown = resident_bytes() as i64 - before;
            let (creates, replays) = api_throughput(&store, run, &options, &response).await;
            rows.push(Row {
                store: "memory".into(),
                bytes: format!("{} resident", per_record(grown, records)),
                creates,
                replays,
                purged: None,
                floor: None,
            });
        }
        if wanted("redis") {
            let url = std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
            let prefix = format!("capacity-{run}:");
            let store = RedisStore::connect(&url)
                .await
                .expect("Redis")
                .prefix(&prefix);
            let client = redis::Client::open(url.as_str()).expect("a Redis URL");
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("Redis");
            let before = redis_used_memory(&mut connection).await;
            fill(&store, run, records, options.tasks, &response).await;
            let grown = redis_used_memory(&mut connection).await - before;
            let (creates, replays) = api_throughput(&store, run, &options, &response).await;
            rows.push(Row {
                store: "Redis".into(),
                bytes: format!("{} used_memory", per_record(grown, records)),
                creates,
                replays,
                purged: None,
                floor: None,
            });
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}*"))
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(&mut connection)
                    .await
                    .expect("SCAN");
                if !keys.is_empty() {
                    let _: () = redis::cmd("UNLINK")
                        .arg(keys)
                        .query_async(&mut connection)
                        .await
                        .expect("UNLINK");
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        if wanted("redis-replicated") {
            let servers = Servers::primary_and_replica();
            let store = RedisStore::connect(&servers.seeds[0])
                .await
                .expect("the primary");
            for (name, store) in [
                ("Redis + replica, waiting (default)", store.clone()),
                (
                    "Redis + replica, not waiting",
                    store.wait_for_replicas(0, Duration::ZERO),
                ),
            ] {
                rows.push(redis_throughput(name, store, run, &options, &response).await);
            }
        }
        if wanted("redis-cluster") {
            let servers = Servers::replicated_cluster();
            let store = RedisStore::connect_cluster(&servers.seeds)
                .await
                .expect("the cluster");
            for (name, store) in [
                (
                    "Redis Cluster 3 × (1 + 1), waiting (default)",
                    store.clone(),
                ),
                (
                    "Redis Cluster 3 × (1 + 1), not waiting",
                    store.wait_for_replicas(0, Duration::ZERO),
                ),
            ] {
                rows.push(redis_throughput(name, store, run, &options, &response).await);
            }
        }
        // Plaintext and TLS, each with the statements written plainly beside the store.
        for (name, sslmode) in [("PostgreSQL", "disable"), ("PostgreSQL over TLS", "require")] {
            if !wanted("postgres") {
                break;
            }
            let url = std::env::var("DATABASE_URL")
                .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into());
            let url = format!(
                "{url}{}sslmode={sslmode}",
                if url.contains('?') { '&' } else { '?' }
            );
            let table = format!("capacity_{}_{sslmode}", run % 1_000_000_000);
            // The application's pool as the store's docs advise it: no ping before each use.
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(options.pool as u32)
                .test_before_acquire(false)
                .connect(&url)
                .await
                .expect("PostgreSQL");
            let store = PostgresStore::new(pool.clone())
                .table(&table)
                .expect("a table name");
            store.migrate().await.expect("the table");
            let sql = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
            let size_sql = format!("SELECT pg_total_relation_size('{table}'::regclass)");
            let size = async || -> i64 {
                let row = sql(size_sql.clone())
                    .fetch_one(&pool)
                    .await
                    .expect("the size");
                sqlx::Row::get(&row, 0)
            };
            let before = size().await;
            fill(&store, run, records, options.tasks, &response).await;
            let filled = size().await - before;
            sql(format!("VACUUM FULL {table}"))
                .execute(&pool)
                .await
                .expect("VACUUM FULL");
            let compact = size().await - before;
            let plain = Plain::postgres(pool.clone(), &table);
            let (creates, replays, floor) =
                against_plain(&store, plain, run, &options, &response).await;
            let expired = sql(format!(
                "UPDATE {table} SET expires_at = now() - interval '1 hour' \
                 WHERE expires_at IS NOT NULL"
            ))
            .execute(&pool)
            .await
            .expect("the records expired")
            .rows_affected();
            // More, in bulk: expired records of about the same size, for a long purge.
            let expired = expired
                + sql(format!(
                    "INSERT INTO {table} (key, fingerprint, response, expires_at) \
                     SELECT 'expired-' || g, 'f', decode(repeat('5a', 170), 'hex'), \
                     now() - interval '1 hour' FROM generate_series(1, {}) g",
                    options.expired
                ))
                .execute(&pool)
                .await
                .expect("the expired records")
                .rows_affected();
            let purged = purge_beside_creates(&store, expired, run, options.tasks, &response).await;
            rows.push(Row {
                store: name.into(),
                bytes: format!(
                    "{} relation ({} after VACUUM FULL)",
                    per_record(filled, records),
                    per_record(compact, records)
                ),
                creates,
                replays,
                purged: Some(purged),
                floor: Some(floor),
            });
            sql(format!("DROP TABLE {table}"))
                .execute(&pool)
                .await
                .expect("DROP TABLE");
        }
        if wanted("mysql") {
            let url =
                std::env::var("MYSQL_URL").unwrap_or("mysql://root@127.0.0.1:3306/test".into());
            let table = format!("capacity_{}", run % 1_000_000_000);
            // The application's pool as the store's docs advise it: no ping before each use.
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(options.pool as u32)
                .test_before_acquire(false)
                .connect(&url)
                .await
                .expect("MySQL");
            let store = MySqlStore::new(pool.clone())
                .table(&table)
                .expect("a table name");
            store.migrate().await.expect("the table");
            let sql = |sql: String| sqlx::query(sqlx::AssertSqlSafe(sql));
            // InnoDB's own count of the table's and its index's pages, brought up to date.
            let size = async || -> i64 {
                sql(format!("ANALYZE TABLE {table}"))
                    .execute(&pool)
                    .await
                    .expect("ANALYZE");
                let row = sql(format!(
                    "SELECT CAST(data_length + index_length AS SIGNED) \
                     FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name = '{table}'"
                ))
                .fetch_one(&pool)
                .await
                .expect("the size");
                sqlx::Row::get(&row, 0)
            };
            let before = size().await;
            fill(&store, run, records, options.tasks, &response).await;
            let filled = size().await - before;
            let plain = Plain::mysql(pool.clone(), &table);
            let (creates, replays, floor) =
                against_plain(&store, plain, run, &options, &response).await;
            let expired = sql(format!(
                "UPDATE {table} SET expires_at = 1 WHERE expires_at IS NOT NULL"
            ))
            .execute(&pool)
            .await
            .expect("the records expired")
            .rows_affected();
            // More, in bulk (MariaDB's sequence engine): expired records of about the same
            // size, for a long purge.
            let expired = expired
                + if options.expired == 0 {
                    0
                } else {
                    sql(format!(
                        "INSERT INTO {table} (`key`, fingerprint, response, expires_at, changed_at) \
                         SELECT CONCAT('expired-', seq), 'f', REPEAT('Z', 170), 1, 0 \
                         FROM seq_1_to_{}",
                        options.expired
                    ))
                    .execute(&pool)
                    .await
                    .expect("the expired records")
                    .rows_affected()
                };
            let purged = purge_beside_creates(&store, expired, run, options.tasks, &response).await;
            rows.push(Row {
                store: "MySQL (MariaDB)".into(),
                bytes: format!("{} InnoDB pages", per_record(filled, records)),
                creates,
                replays,
                purged: Some(purged),
                floor: Some(floor),
            });
            sql(format!("DROP TABLE {table}"))
                .execute(&pool)
                .await
                .expect("DROP TABLE");
        }
        if wanted("sqlite") {
            let dir = std::env::temp_dir().join(format!("tower-idempotency-capacity-{run}"));
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            let file = dir.join("records.sqlite3");
            let store = SqliteStore::open(&file).await.expect("the SQLite file");
            let size = async || {
                use tower_idempotency::store::sqlite::sqlx::Executor as _;
                store
                    .pool()
                    .execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    .await
                    .expect("a checkpoint");
                std::fs::metadata(&file).expect("the file").len() as i64
            };
            let before = size().await;
            fill(&store, run, records, options.tasks, &response).await;
            let grown = size().await - before;
            // Pools as the store makes its own: one writer, four readers, no ping before use.
            let connect = tower_idempotency::store::sqlite::sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&file)
                .journal_mode(tower_idempotency::store::sqlite::sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(tower_idempotency::store::sqlite::sqlx::sqlite::SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(1));
            let pool = |connections: u32| {
                tower_idempotency::store::sqlite::sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(connections)
                    .test_before_acquire(false)
                    .connect_lazy_with(connect.clone())
            };
            let plain = Plain::sqlite(pool(1), pool(4));
            let (creates, replays, floor) =
                against_plain(&store, plain, run, &options, &response).await;
            let expired = tower_idempotency::store::sqlite::sqlx::query(
                "UPDATE idempotency_records SET expires_at = 0 WHERE expires_at IS NOT NULL",
            )
            .execute(store.pool())
            .await
            .expect("the records expired")
            .rows_affected();
            let expired = expired
                + tower_idempotency::store::sqlite::sqlx::query(
                    "WITH RECURSIVE g(n) AS (SELECT 1 WHERE ?1 > 0 UNION ALL \
                     SELECT n + 1 FROM g WHERE n < ?1) \
                     INSERT INTO idempotency_records \
                     (key, fingerprint, response, changed_at, expires_at) \
                     SELECT 'expired-' || n, 'f', zeroblob(170), 0, 0 FROM g",
                )
                .bind(options.expired as i64)
                .execute(store.pool())
                .await
                .expect("the expired records")
                .rows_affected();
            let purged = purge_beside_creates(&store, expired, run, options.tasks, &response).await;
            rows.push(Row {
                store: "SQLite".into(),
                bytes: format!("{} file", per_record(grown, records)),
                creates,
                replays,
                purged: Some(purged),
                floor: Some(floor),
            });
            drop(store);
            let _ = std::fs::remove_dir_all(&dir);
        }
    });
    println!(
        "{records} completed records, responses of {} bytes (status, headers, body), keys of {} bytes; \
         {} tasks on 2 workers, {} s a figure; PostgreSQL pool {}",
        response_bytes(&response),
        key(run, 0).len(),
        options.tasks,
        options.seconds,
        options.pool
    );
    println!();
    println!(
        "| store | bytes a completed record | creates/s | replays/s | expired purged/s \
         (failed purge runs) | creates/s beside the purge | of creates/s | failed beside it |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let purged = row
            .purged
            .as_ref()
            .map_or("— | — | — | —".to_owned(), |purged| {
                format!(
                    "{:.0} ({}) | {:.0} | {:.2}× | {}",
                    purged.rate,
                    purged.failures,
                    purged.creates,
                    purged.creates / row.creates,
                    purged.failed
                )
            });
        println!(
            "| {} | {} | {:.0} | {:.0} | {purged} |",
            row.store, row.bytes, row.creates, row.replays
        );
    }
    let floors: Vec<(&Row, &Floor)> = rows
        .iter()
        .filter_map(|row| row.floor.as_ref().map(|floor| (row, floor)))
        .collect();
    if floors.is_empty() {
        return;
    }
    println!();
    println!(
        "The SQL stores against their statements written plainly on the same pool, {} rounds \
         turn by turn (medians; the ratios are the medians of each round's):",
        options.rounds
    );
    println!();
    println!(
        "| store | creates/s | plain creates/s | creates, store ÷ plain | replays/s | plain replays/s \
         | replays, store ÷ plain | each round's ratios, creates / replays |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (row, floor) in floors {
        let rounds: Vec<String> = floor
            .rounds
            .iter()
            .map(|(ours, theirs)| format!("{:.2}/{:.2}", ours.0 / theirs.0, ours.1 / theirs.1))
            .collect();
        println!(
            "| {} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} | {:.2}× | {} |",
            row.store,
            row.creates,
            floor.creates,
            floor.creates_ratio,
            row.replays,
            floor.replays,
            floor.replays_ratio,
            rounds.join(" ")
        );
    }
}
