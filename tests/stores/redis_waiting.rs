//! The Redis store's waits: its subscriber, which ends with the store and comes back after a lost connection, a user without channel rights, and waiters across replicas.
#![cfg(feature = "redis")]

#[allow(unused_imports)]
use crate::redis_store::*;
use tower_idempotency::store::redis::redis;

use crate::common;

use std::time::Duration;

use common::servers::RedisServer;
use common::*;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::RedisStore;
use tower_idempotency::store::Store;

/// `pending_wait` on this store: the waiting retries, on this replica and on another with its
/// own connections, are woken by the completion published on the store's channel (each makes
/// one claim on arrival, one before it waits and one after the wake, no polling) and answer with
/// the first attempt's bytes within tens of milliseconds of its completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn waiting_retries_get_the_first_attempts_bytes_on_every_replica() {
    use tower_idempotency::testing::{Journal, RecordingStore};
    let journal = Journal::default();
    let a = RecordingStore::new(make_store(None).await, journal.clone());
    let b = RecordingStore::new(make_store(None).await, journal.clone());
    // Subscribed before the first attempt, as a long-running replica is.
    for store in [&a, &b] {
        drop(store.changed("warm-up"));
        subscribed(store.inner()).await;
    }
    waiting_retries_get_the_first_attempts_bytes(a, b, Duration::from_millis(250)).await;
    let claims = journal.take().iter().filter(|c| **c == "claim").count();
    assert_eq!(
        claims,
        1 + 3 + 3,
        "woken by the notification, not by polling"
    );
}

/// When the subscriber's connection is lost, a change may go unheard: every waiter is woken
/// at once to look again, well before its one-second fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn waiters_look_again_when_the_subscriber_loses_its_connection() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    drop(store.changed("warm-up"));
    subscribed(&store).await;
    let changed = store.changed("k");
    let started = std::time::Instant::now();
    server.kill();
    tokio::time::timeout(Duration::from_millis(700), changed)
        .await
        .expect("woken by the lost subscription");
    assert!(started.elapsed() < Duration::from_millis(700));
}

/// Waits until `store` listens for published changes.
pub(crate) async fn subscribed(store: &RedisStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store.notifications_subscribed() {
        assert!(std::time::Instant::now() < deadline, "never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The subscriber of a store ends with the store, and a store made on a connection manager
/// of its own does not listen (its waiters poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_subscriber_ends_with_its_store() {
    // A server of its own: no other test's subscribers in its client list.
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    drop(store.changed("warm-up"));
    subscribed(&store).await;
    let counter = CommandCounter::new(&server.url()).await;
    let clients = || async {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut counter.0.clone())
            .await
            .unwrap();
        list.lines()
            .filter(|line| line.contains("cmd=subscribe") || line.contains("sub=1"))
            .count()
    };
    assert_eq!(clients().await, 1, "one subscriber connection");
    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while clients().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the subscriber outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let manager = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .connection()
        .expect("one server")
        .clone();
    let own = RedisStore::from_manager(manager);
    drop(own.changed("k"));
    assert!(!own.notifications_subscribed());
}

/// Found in review: a user without the right to publish (Redis 7 users get no channel by
/// default) still completes, releases and forgets; only the wake-ups are lost (waiters poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_user_without_channel_rights_still_completes_releases_and_forgets() {
    use tower_idempotency::store::Operator;
    let server = RedisServer::start();
    let admin = redis::Client::open(server.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "app",
                "on",
                ">secret",
                "~*",
                "+@all",
                "resetchannels",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = server.url().replacen("redis://", "redis://app:secret@", 1);
    let store = RedisStore::connect(&url).await.unwrap();
    let fp = LabelContract::fingerprint("acl", "p");
    let Claim::New(done) = store.claim("done", &fp).await.unwrap() else {
        panic!("new")
    };
    let response = common::conformance::awkward_response();
    store.complete("done", &done, &response).await.unwrap();
    assert_eq!(
        store.claim("done", &fp).await.unwrap(),
        Claim::Replay(response)
    );
    let Claim::New(released) = store.claim("released", &fp).await.unwrap() else {
        panic!("new")
    };
    store.release("released", &released).await.unwrap();
    assert!(store.forget("done").await.unwrap());
    assert!(matches!(
        store.claim("done", &fp).await.unwrap(),
        Claim::New(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn fifty_waiters_on_two_replicas_get_the_same_201_and_leave_nothing() {
    fifty_waiters_on_two_replicas(
        make_store(None).await,
        make_store(None).await,
        RedisStore::waited_keys,
    )
    .await;
}
