//! The Redis store beside replicas: writes wait for the replicas asked for, or the one a server has.
#![cfg(feature = "redis")]

#[allow(unused_imports)]
use crate::redis_store::*;
use tower_idempotency::store::redis::redis;

use crate::common;

use std::time::Duration;

use common::servers::RedisServer;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::RedisStore;
use tower_idempotency::store::Store;

/// `redis-cli -p port args…`'s output.
fn cli(port: &str, args: &[&str]) -> String {
    let output = std::process::Command::new("redis-cli")
        .args(["-p", port])
        .args(args)
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A server of the test's own and a replica of it, once the replica is in sync.
async fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let replica_port = replica.port.to_string();
    while !cli(&replica_port, &["INFO", "replication"]).contains("master_link_status:up") {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (primary, replica)
}

/// By default the store finds the replica a server has and waits for it after each write: a
/// replica that stops acknowledging fails new claims, completes and replays (unknown
/// outcomes, never reported done) until it is back. A server without replicas is not waited
/// on, and a store over a connection of the caller's looks at its first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_waits_for_the_replica_a_server_has() {
    use tower_idempotency::store::redis::ReplicaWait;
    use tower_idempotency::store::{Operator as _, StoreErrorKind};
    let (primary, replica) = primary_and_replica().await;
    let store = RedisStore::connect(&primary.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    assert_eq!(
        store.replica_wait(),
        ReplicaWait::Detected {
            primaries: 1,
            replicated: 1
        }
    );
    assert_eq!(
        store.replica_wait().to_string(),
        "waits for 1 replica after each write on 1 of 1 primary (detected)"
    );
    let fp = LabelContract::fingerprint("default-wait", "p");
    let Claim::New(reservation) = store.claim("default-wait", &fp).await.unwrap() else {
        panic!("a new claim")
    };
    store
        .complete(
            "default-wait",
            &reservation,
            &common::conformance::awkward_response(),
        )
        .await
        .unwrap();
    let replica_port = replica.port.to_string();
    assert_eq!(
        cli(
            &replica_port,
            &["HEXISTS", "idempotency:default-wait", "resp"]
        )
        .trim(),
        "1",
        "acknowledged: the replica has the complete"
    );

    replica.pause();
    let unconfirmed = [
        (
            store.claim("default-wait", &fp).await.map(|_| ()),
            StoreErrorKind::Unreplicated,
        ),
        (
            store.claim("default-wait-2", &fp).await.map(|_| ()),
            StoreErrorKind::Unreplicated,
        ),
        (
            store.forget("default-wait-3").await.map(|_| ()),
            StoreErrorKind::Unavailable,
        ),
    ];
    for (answer, kind) in unconfirmed {
        assert_eq!(answer.map_err(|e| e.kind()), Err(kind));
    }
    // The new claim no replica confirmed was released at once: nothing left pending.
    assert!(store.inspect("default-wait-2").await.unwrap().is_none());
    replica.resume();
    // Back: the replay is served, and the lost claim is still the store's to settle.
    let mut replayed = store.claim("default-wait", &fp).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while replayed.is_err() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        replayed = store.claim("default-wait", &fp).await;
    }
    assert!(matches!(replayed, Ok(Claim::Replay(_))), "{replayed:?}");

    let alone = RedisServer::start();
    let store = RedisStore::connect(&alone.url()).await.unwrap();
    assert_eq!(
        store.replica_wait(),
        ReplicaWait::Detected {
            primaries: 1,
            replicated: 0
        }
    );
    let client = redis::Client::open(primary.url()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    let yours = RedisStore::from_manager(manager);
    assert_eq!(yours.replica_wait(), ReplicaWait::Undetected);
    let Claim::New(_) = yours.claim("yours", &fp).await.unwrap() else {
        panic!("a new claim")
    };
    assert_eq!(
        yours.replica_wait(),
        ReplicaWait::Detected {
            primaries: 1,
            replicated: 1
        }
    );
}

/// With `wait_for_replicas`, a write is acknowledged only once replicas have it; with fewer
/// replicas than asked for, the call fails (an unknown outcome the layer settles).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_the_replicas_asked_for() {
    let (primary, replica) = primary_and_replica().await;
    let one = RedisStore::connect(&primary.url())
        .await
        .unwrap()
        .wait_for_replicas(1, Duration::from_secs(2));
    let fp = LabelContract::fingerprint("replicated", "p");
    let Claim::New(reservation) = one.claim("replicated", &fp).await.unwrap() else {
        panic!("a new claim")
    };
    // Acknowledged means the replica has it already.
    let on_replica = cli(
        &replica.port.to_string(),
        &["HEXISTS", "idempotency:replicated", "token"],
    );
    assert_eq!(on_replica.trim(), "1");
    one.complete(
        "replicated",
        &reservation,
        &common::conformance::awkward_response(),
    )
    .await
    .unwrap();

    let two = RedisStore::connect(&primary.url())
        .await
        .unwrap()
        .wait_for_replicas(2, Duration::from_millis(200));
    let error = two.claim("short", &fp).await.unwrap_err();
    assert_eq!(
        error.kind(),
        tower_idempotency::store::StoreErrorKind::Unreplicated
    );
    assert!(
        format!("{error:#}").contains("1 of 2 replicas"),
        "{error:#}"
    );
}

/// Waits until `what` holds of the primary's `INFO replication`, polling, within 30 s.
async fn until_primary_says(port: &str, what: &str, holds: impl Fn(&str) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info = cli(port, &["INFO", "replication"]);
        if holds(&info) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A new claim, its complete and its replay, each answered.
async fn create_and_replay(store: &RedisStore, key: &str) {
    let fp = LabelContract::fingerprint(key, "p");
    let claim = store.claim(key, &fp).await;
    let Ok(Claim::New(reservation)) = claim else {
        panic!("{key}: a new claim, not {claim:?}")
    };
    store
        .complete(key, &reservation, &common::conformance::awkward_response())
        .await
        .unwrap_or_else(|error| panic!("{key}: the complete: {error:#}"));
    let replay = store.claim(key, &fp).await;
    assert!(matches!(replay, Ok(Claim::Replay(_))), "{key}: {replay:?}");
}

/// The default waits for online replicas only: a replica in its first sync (held there by the
/// primary's diskless sync delay), or one restarted and syncing again, fails no write, while
/// an explicit `wait_for_replicas(1, _)` still refuses them. Once the replica is online the
/// default waits for it again; a replica killed mid-run (its primary still counted it a moment
/// ago) fails no write either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_syncing_or_restarted_fails_no_write_under_the_default_wait() {
    use tower_idempotency::store::StoreErrorKind;
    use tower_idempotency::store::redis::ReplicaWait;
    let primary = RedisServer::start_with(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "600",
    ]);
    let port = primary.port.to_string();
    let mut replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let in_first_sync = |info: &str| info.contains("state=wait_bgsave");
    until_primary_says(&port, "the replica waits for its sync", in_first_sync).await;

    let store = RedisStore::connect(&primary.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    for i in 0..5 {
        create_and_replay(&store, &format!("first-sync-{i}")).await;
    }
    assert_eq!(
        store.replica_wait(),
        ReplicaWait::Detected {
            primaries: 1,
            replicated: 0
        },
        "a replica in its first sync is not waited for"
    );
    let explicit = RedisStore::connect(&primary.url())
        .await
        .unwrap()
        .wait_for_replicas(1, Duration::from_millis(100));
    let fp = LabelContract::fingerprint("explicit", "p");
    let refused = explicit.claim("explicit", &fp).await.map(|_| ());
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(StoreErrorKind::Unreplicated)
    );

    // Online: the default waits for it again.
    cli(&port, &["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    until_primary_says(&port, "the replica comes online", |info| {
        info.contains("state=online")
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    while store.replica_wait()
        != (ReplicaWait::Detected {
            primaries: 1,
            replicated: 1,
        })
    {
        assert!(std::time::Instant::now() < deadline, "never looked again");
        create_and_replay(&store, &format!("online-{i}")).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    create_and_replay(&store, "waited").await;
    assert_eq!(
        cli(
            &replica.port.to_string(),
            &["HEXISTS", "idempotency:waited", "resp"]
        )
        .trim(),
        "1",
        "acknowledged: the replica has the complete"
    );

    // Killed while the store still counts it, then restarted into a full sync.
    cli(&port, &["CONFIG", "SET", "repl-diskless-sync-delay", "600"]);
    replica.kill();
    for i in 0..5 {
        create_and_replay(&store, &format!("killed-{i}")).await;
    }
    replica.start_again();
    until_primary_says(
        &port,
        "the restarted replica waits for its sync",
        in_first_sync,
    )
    .await;
    for i in 0..5 {
        create_and_replay(&store, &format!("restarted-{i}")).await;
    }
    let refused = explicit.claim("explicit-2", &fp).await.map(|_| ());
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(StoreErrorKind::Unreplicated)
    );
}

/// Under the default wait, writes to a replicated server go in groups, one `WAIT` after
/// each: every caller of a crowd gets its own answer (its own replay, never a neighbour's),
/// and a flushed script cache is filled again on that path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_waited_writes_each_get_their_own_answer() {
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use tower_idempotency::store::StoredResponse;
    let (primary, replica) = primary_and_replica().await;
    let store = RedisStore::connect(&primary.url()).await.unwrap();
    cli(&primary.port.to_string(), &["SCRIPT", "FLUSH"]);
    let crowd = (0..200).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let key = format!("crowd-{i}");
            let fp = LabelContract::fingerprint(&key, "p");
            let Claim::New(reservation) = store.claim(&key, &fp).await.unwrap() else {
                panic!("{key}: a new claim")
            };
            let body = Bytes::from(format!("response {i}"));
            let response = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), body);
            store.complete(&key, &reservation, &response).await.unwrap();
            let Claim::Replay(replayed) = store.claim(&key, &fp).await.unwrap() else {
                panic!("{key}: a replay")
            };
            assert_eq!(replayed.body(), &format!("response {i}"), "{key}");
            let other = LabelContract::fingerprint(&key, "other");
            assert!(matches!(
                store.claim(&key, &other).await.unwrap(),
                Claim::Conflict
            ));
        })
    });
    for task in crowd.collect::<Vec<_>>() {
        task.await.unwrap();
    }
    let on_replica = cli(
        &replica.port.to_string(),
        &["EXISTS", "idempotency:crowd-199"],
    );
    assert_eq!(on_replica.trim(), "1");
}

/// A store kept across runtimes (a static one, or one per worker thread): its waiting
/// connections, whose group senders ran on a runtime that has shut down, are opened again on
/// the runtime of the next write, and every write goes through.
#[test]
fn waiting_connections_outlive_the_runtime_that_opened_them() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let (store, servers) = first.block_on(async {
        let servers = primary_and_replica().await;
        let store = RedisStore::connect(&servers.0.url()).await.unwrap();
        // Every waiting connection opened here.
        for i in 0..8 {
            create_and_replay(&store, &format!("first-runtime-{i}")).await;
        }
        (store, servers)
    });
    drop(first);
    runtime().block_on(async {
        for i in 0..8 {
            create_and_replay(&store, &format!("second-runtime-{i}")).await;
        }
    });
    drop(servers);
}
