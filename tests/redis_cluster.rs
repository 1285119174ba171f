//! The Redis store on a Redis Cluster: the conformance suite, records spread over every
//! primary, round trips as on one server, and a primary restarted mid-run. Every cluster here
//! is the test's own: three `redis-server`s on free ports in temp dirs (needs `redis-server`
//! and `redis-cli` on PATH), stopped by the test, or when the test process ends.
#![cfg(feature = "redis")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::servers::{RedisCluster, pause_redis};
use common::*;
use tower_idempotency::store::RedisStore;

/// One cluster for the conformance suite, shared by its tests.
fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

async fn make_store(retention: Option<Duration>) -> RedisStore {
    let seeds = tokio::task::spawn_blocking(|| shared_cluster().seeds())
        .await
        .unwrap();
    let store = RedisStore::connect_cluster(&seeds)
        .await
        .expect("the test's cluster")
        .prefix("tower-idempotency-test:");
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));

/// A connection to each node of `cluster`, by port.
async fn node_connections(cluster: &RedisCluster) -> Vec<(u16, redis::aio::MultiplexedConnection)> {
    let mut connections = Vec::new();
    for node in &cluster.nodes {
        let client = redis::Client::open(node.url()).unwrap();
        connections.push((
            node.port,
            client.get_multiplexed_async_connection().await.unwrap(),
        ));
    }
    connections
}

/// The scripts clients ran on the whole cluster (`EVALSHA`, and `EVAL` for a node that did
/// not have a script yet), as `INFO commandstats` counts them on every node: the store's one
/// command per round trip. The cluster client's own topology queries are not counted.
async fn commands_sent(nodes: &mut [(u16, redis::aio::MultiplexedConnection)]) -> u64 {
    let mut total = 0;
    for (_, connection) in nodes.iter_mut() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(connection)
            .await
            .unwrap();
        total += info
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("cmdstat_")?;
                let (name, stats) = rest.split_once(':')?;
                if name != "evalsha" && name != "eval" {
                    return None;
                }
                stats
                    .split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    total
}

/// Through the layer: records of distinct keys land on all three primaries, a new key costs
/// two round trips (claim, complete) and a replay, a conflict and a pending key one each, as
/// on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_every_primary_and_round_trips_are_as_on_one_server() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisStore::connect_cluster(cluster.seeds()).await.unwrap();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store.clone(), Arc::clone(&creates), Duration::ZERO);
    for i in 0..60 {
        send_to(&service, operation(&format!("spread-{i}"), "parcel-42"))
            .await
            .is_created();
    }
    let mut nodes = node_connections(&cluster).await;
    for (port, connection) in &mut nodes {
        let records: u64 = redis::cmd("DBSIZE").query_async(connection).await.unwrap();
        assert!(records > 0, "no record on the primary at port {port}");
    }

    let before = commands_sent(&mut nodes).await;
    send_to(&service, operation("round-trips", "parcel-42"))
        .await
        .is_created();
    assert_eq!(
        commands_sent(&mut nodes).await - before,
        2,
        "new: claim + complete"
    );
    let before = commands_sent(&mut nodes).await;
    send_to(&service, operation("round-trips", "parcel-42"))
        .await
        .is_created();
    assert_eq!(commands_sent(&mut nodes).await - before, 1, "replay: claim");
    let before = commands_sent(&mut nodes).await;
    send_to(&service, operation("round-trips", "parcel-43"))
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    assert_eq!(
        commands_sent(&mut nodes).await - before,
        1,
        "conflict: claim"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 61);
}

/// A cluster of the test's own with 30 keys created through the layer over a store with
/// `timeout`: the cluster, the service, its create counter, and each key with the port of the
/// primary that holds its record.
async fn cluster_with_created_keys(
    timeout: Duration,
) -> (
    RedisCluster,
    tower_idempotency::Idempotency<Inner, RedisStore, tower_idempotency::LabelContract>,
    Arc<AtomicUsize>,
    Vec<(String, u16)>,
) {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisStore::connect_cluster(cluster.seeds())
        .await
        .unwrap()
        .timeout(timeout);
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), Duration::ZERO);
    let mut nodes = node_connections(&cluster).await;
    let mut keys = Vec::new();
    for i in 0..30 {
        let key = format!("key-{i}");
        send_to(&service, operation(&key, "parcel-42"))
            .await
            .is_created();
        let mut owners = Vec::new();
        for (port, connection) in &mut nodes {
            // A primary that does not serve the key's slot answers MOVED.
            let exists: redis::RedisResult<bool> = redis::cmd("EXISTS")
                .arg(format!("idempotency:{}", key_of(&key)))
                .query_async(connection)
                .await;
            if exists.unwrap_or(false) {
                owners.push(*port);
            }
        }
        assert_eq!(owners.len(), 1, "{key}: on one primary");
        keys.push((key, owners[0]));
    }
    assert_eq!(creates.load(Ordering::SeqCst), keys.len());
    (cluster, service, creates, keys)
}

/// The keys held by the primary at `port`, and the others.
fn held_by(keys: &[(String, u16)], port: u16) -> (Vec<&str>, Vec<&str>) {
    let mut held = Vec::new();
    let mut others = Vec::new();
    for (key, owner) in keys {
        if *owner == port {
            held.push(key.as_str());
        } else {
            others.push(key.as_str());
        }
    }
    (held, others)
}

/// A primary killed mid-run: its keys answer `503 store_unavailable` (fast, within the
/// store's timeout) while the other primaries' keys keep working; restarted on the same data,
/// its keys replay again without restarting the application, and nothing is created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_mid_run_answers_503_for_its_keys_then_recovers() {
    let timeout = Duration::from_millis(300);
    let (mut cluster, service, creates, keys) = cluster_with_created_keys(timeout).await;
    let (on_down, elsewhere) = held_by(&keys, cluster.nodes[0].port);
    assert!(!on_down.is_empty() && !elsewhere.is_empty());

    cluster.nodes[0].kill();
    for key in on_down.iter().take(3) {
        let started = Instant::now();
        send_to(&service, operation(key, "parcel-42"))
            .await
            .exact(503, r#"{"error":"store_unavailable"}"#)
            .header("retry-after", &["2"]);
        assert!(
            started.elapsed() < timeout * 5,
            "answered in {:?}",
            started.elapsed()
        );
    }
    for key in elsewhere.iter().take(3) {
        send_to(&service, operation(key, "parcel-42"))
            .await
            .is_created();
    }

    let restarted = tokio::task::spawn_blocking(move || {
        cluster.nodes[0].start_again();
        cluster.wait_until_ok();
        cluster
    });
    let cluster = restarted.await.unwrap();
    for key in &on_down {
        send_until_answered(&service, || operation(key, "parcel-42"))
            .await
            .is_created();
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        keys.len(),
        "no second create: every retry replayed"
    );
    drop(cluster);
}

/// A primary restarted (its script cache empty) while another primary hangs serves its keys
/// within moments: a node's answer is waited for a bounded time, so the hung node cannot hold
/// up the client's view of the cluster, and a missing script is sent whole to the key's own
/// node only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_serves_its_keys_while_another_hangs() {
    let (cluster, service, creates, keys) =
        cluster_with_created_keys(Duration::from_millis(500)).await;
    let (on_restarted, _) = held_by(&keys, cluster.nodes[1].port);
    assert!(!on_restarted.is_empty());

    let mut cluster = cluster;
    let cluster = tokio::task::spawn_blocking(move || {
        pause_redis(cluster.nodes[0].port, 10_000, "ALL");
        cluster.nodes[1].restart();
        cluster
    })
    .await
    .unwrap();
    let started = Instant::now();
    for key in &on_restarted {
        send_until_answered(&service, || operation(key, "parcel-42"))
            .await
            .is_created();
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the restarted primary's keys answered only after {:?}",
        started.elapsed()
    );
    assert_eq!(
        creates.load(Ordering::SeqCst),
        keys.len(),
        "every retry replayed"
    );
    drop(cluster);
}

/// Waiters hear changes through the first seed that answers: with the first seed hung, the
/// store subscribes through another within moments (each seed gets a share of the listener's
/// one-second bound, not all of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_skips_a_hung_seed() {
    use tower_idempotency::Store;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisStore::connect_cluster(cluster.seeds()).await.unwrap();
    pause_redis(cluster.nodes[0].port, 8_000, "ALL");
    drop(store.changed("warm-up"));
    let started = Instant::now();
    while !store.notifications_subscribed() {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "not subscribed through another seed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(cluster);
}
