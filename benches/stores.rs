//! The layer on the durable stores, new and replay paths, against the bare service and the
//! memory store in the same run; needs Redis at `REDIS_URL` and PostgreSQL at `DATABASE_URL`
//! (SQLite needs nothing: its file is made in a temporary directory).
//!
//! `cargo bench --all-features --bench stores`. Prints the Redis commands per request as well
//! (from `INFO commandstats`); the PostgreSQL statements per request are counted exactly by the
//! test `postgres_store::round_trips_new_two_replay_pending_conflict_one`. The Redis Cluster
//! rows run on a three-primary cluster the bench starts on free ports and stops (it needs
//! `redis-server` and `redis-cli` on PATH).

mod common;
#[path = "../tests/common/proxy.rs"]
#[allow(dead_code)]
mod proxy;
#[path = "../tests/common/servers.rs"]
#[allow(dead_code)]
mod servers;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower_idempotency::store::redis::redis;

use common::{Create, valid};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::store::Store;
use tower_idempotency::store::{
    PostgresStore, RedisStore, SqliteStore, TransactionalPostgresStore,
};

fn run_id() -> String {
    format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn paths<St: Store>(c: &mut Criterion, runtime: &tokio::runtime::Runtime, name: &str, store: St) {
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Create,
    );
    let run = run_id();
    let next = AtomicU64::new(0);
    let mut group = c.benchmark_group(name);
    group.bench_function("new", |b| {
        b.to_async(runtime).iter_batched(
            || {
                valid(&format!(
                    "bench-{run}-{}",
                    next.fetch_add(1, Ordering::Relaxed)
                ))
            },
            |request| async {
                let response = service.clone().oneshot(request).await.unwrap();
                black_box(response.into_body().collect().await.unwrap().to_bytes())
            },
            BatchSize::SmallInput,
        );
    });
    common::replays(
        &mut group,
        runtime,
        "replay",
        &service,
        &format!("bench-{run}-replayed"),
    );
    group.finish();
}

/// Redis commands sent by clients (script-internal calls left out) per request of each path,
/// summed over the servers at `urls` (every node of a cluster).
fn redis_round_trips(
    runtime: &tokio::runtime::Runtime,
    name: &str,
    urls: &[String],
    store: RedisStore,
) {
    let total = || {
        runtime.block_on(async {
            let mut total = 0;
            for url in urls {
                total += evals(url).await;
            }
            total
        })
    };
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Create,
    );
    let run = run_id();
    let n = 200u64;
    let before = total();
    for i in 0..n {
        runtime
            .block_on(service.clone().oneshot(valid(&format!("rt-{run}-{i}"))))
            .unwrap();
    }
    let new = total() - before;
    let before = total();
    for i in 0..n {
        runtime
            .block_on(service.clone().oneshot(valid(&format!("rt-{run}-{i}"))))
            .unwrap();
    }
    let replay = total() - before;
    println!(
        "{name} round trips per request: new {:.2}, replay {:.2}",
        new as f64 / n as f64,
        replay as f64 / n as f64
    );
}

/// The scripts a Redis server ran for clients so far.
async fn evals(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter(|line| line.starts_with("evalsha:") || line.starts_with("eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum::<u64>()
}

fn stores(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    c.bench_function("bare", |b| {
        b.to_async(&runtime).iter_batched(
            || valid("bare").map(RequestBody::inner),
            |request| async {
                let response = Create.oneshot(request).await.unwrap();
                black_box(response.into_body().collect().await.unwrap().to_bytes())
            },
            BatchSize::SmallInput,
        );
    });
    paths(
        c,
        &runtime,
        "memory",
        tower_idempotency::MemoryStore::with_retention(Duration::from_secs(60)),
    );
    let dir = std::env::temp_dir().join(format!("tower-idempotency-bench-{}", run_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = runtime
        .block_on(SqliteStore::open(dir.join("records.sqlite3")))
        .expect("a SQLite file")
        .retention(Duration::from_secs(60));
    paths(c, &runtime, "sqlite", sqlite);
    let _ = std::fs::remove_dir_all(&dir);

    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = runtime
        .block_on(RedisStore::connect(&redis_url))
        .expect("Redis at REDIS_URL");
    let redis = redis
        .prefix("tower-idempotency-bench:")
        .retention(Duration::from_secs(60));
    redis_round_trips(&runtime, "redis", &[redis_url], redis.clone());
    paths(c, &runtime, "redis", redis);

    // Without persistence, as the Redis above runs: the two columns differ by the cluster.
    let cluster = servers::RedisCluster::start_with(&["--appendonly", "no"]);
    let redis_cluster = runtime
        .block_on(RedisStore::connect_cluster(cluster.seeds()))
        .expect("the bench's Redis Cluster")
        .retention(Duration::from_secs(60));
    redis_round_trips(
        &runtime,
        "redis cluster",
        &cluster.seeds(),
        redis_cluster.clone(),
    );
    paths(c, &runtime, "redis-cluster", redis_cluster);
    drop(cluster);

    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let postgres = runtime
        .block_on(PostgresStore::connect(&database_url))
        .expect("PostgreSQL at DATABASE_URL");
    let postgres = postgres.table("tower_idempotency_bench").unwrap();
    runtime.block_on(postgres.migrate()).unwrap();
    paths(c, &runtime, "postgres", postgres.clone());
    // The claim, the create and the complete in one transaction (the create here writes
    // nothing of its own): four round trips new, three replay (counted by the test
    // `postgres_store::transactional_round_trips_new_four_replay_three`).
    paths(
        c,
        &runtime,
        "postgres-transactional",
        TransactionalPostgresStore::new(postgres.clone()),
    );
    runtime.block_on(async {
        tower_idempotency::store::postgres::sqlx::raw_sql("TRUNCATE tower_idempotency_bench")
            .execute(postgres.pool())
            .await
            .unwrap();
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = stores
}
criterion_main!(benches);
