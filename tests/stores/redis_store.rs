//! The Redis store: the conformance suite, replicas, restart, outage and round trips.
//! Needs a Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`) and `redis-server` on PATH.
#![cfg(feature = "redis")]

use crate::common;
use tower_idempotency::store::redis::redis;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::servers::{RedisServer, pause_redis};
use common::*;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::RedisStore;
use tower_idempotency::store::Store;

pub(crate) fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub(crate) async fn make_store(retention: Option<Duration>) -> RedisStore {
    let store = RedisStore::connect(&redis_url())
        .await
        .expect("Redis at REDIS_URL")
        .prefix("tower-idempotency-test:");
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));

/// Over TLS: a server of the test's own that speaks TLS only, its certificate signed by a CA
/// the test made. The conformance suite runs over `rediss://` with that CA; without it the
/// connect is refused.
mod tls {
    use std::sync::OnceLock;

    use super::*;
    use common::servers::TlsFiles;
    use tower_idempotency::store::redis::redis::{Client, TlsCertificates};

    fn server() -> &'static (TlsFiles, RedisServer) {
        static SERVER: OnceLock<(TlsFiles, RedisServer)> = OnceLock::new();
        SERVER.get_or_init(|| {
            let tls = TlsFiles::make();
            let server = RedisServer::start_tls(&tls);
            (tls, server)
        })
    }

    async fn make_store(retention: Option<Duration>) -> RedisStore {
        let (tls, server) = server();
        let certificates = TlsCertificates {
            client_tls: None,
            root_cert: Some(tls.ca()),
        };
        let client = Client::build_with_tls(server.tls_url(), certificates).unwrap();
        let store = RedisStore::connect_client(client)
            .await
            .expect("the TLS server, its CA trusted")
            .prefix("tower-idempotency-test-tls:");
        match retention {
            Some(retention) => store.retention(retention),
            None => store,
        }
    }

    tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));

    /// Without the CA, the server's certificate does not verify: the connect fails, saying
    /// why, and nothing falls back to plaintext (the server has no plaintext port).
    #[tokio::test]
    async fn a_certificate_that_does_not_verify_fails_the_connect() {
        let (_, server) = server();
        let error = RedisStore::connect(&server.tls_url())
            .await
            .expect_err("a certificate signed by an unknown CA");
        let chain = format!("{error:#}").to_lowercase();
        assert!(
            chain.contains("certificate") || chain.contains("unknownissuer"),
            "{chain}"
        );
        // The plaintext scheme to the same port gets no answer it can use either.
        assert!(RedisStore::connect(&server.url()).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn the_generic_json_operation_creates_once_for_a_thousand_identical_requests() {
    payments::generic_mode_creates_once(make_store(None).await, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_generic_json_operation_completes_a_create_whose_client_went_away() {
    payments::generic_mode_survives_a_disconnect(make_store(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(crate) async fn two_replicas_with_their_own_connections_create_once() {
    replicas_create_once(make_store(None).await, make_store(None).await, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn completed_and_pending_records_survive_a_server_crash_and_restart() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store.clone(), Arc::clone(&creates), Duration::ZERO);
    let created = send_to(&service, valid()).await;
    created.is_created();
    // A pending reservation, as a crash between create and complete leaves it.
    let pending = operation("pending-op", "parcel-42");
    let fp = LabelContract::fingerprint("pending-op", "parcel-42");
    assert!(matches!(
        store.claim(&key_of("pending-op"), &fp).await,
        Ok(Claim::New(_))
    ));

    server.restart();

    let replay = send_until_answered(&service, valid).await;
    replay.is_created();
    assert_eq!(
        replay.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    send_to(&service, pending)
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(
        creates.load(Ordering::SeqCst),
        1,
        "no second create after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn an_outage_fails_closed_within_the_timeout_and_traffic_recovers() {
    let server = std::cell::RefCell::new(RedisServer::start());
    let timeout = Duration::from_millis(300);
    let url = server.borrow().url();
    let store = RedisStore::connect(&url).await.unwrap().timeout(timeout);
    outage_fails_closed_and_recovers(
        store,
        timeout,
        || server.borrow_mut().kill(),
        || server.borrow_mut().start_again(),
    )
    .await;
}

/// Counts the commands clients sent, from `INFO commandstats` over one connection of its own
/// (opened before counting starts), without the `INFO`s themselves.
///
/// Redis counts the commands a script runs inside it too; the store's scripts use only
/// `HMGET`, `HSET`, `HGET`, `HDEL`, `HEXISTS`, `EXISTS`, `PEXPIRE`, `PERSIST`, `DEL`, `TIME`
/// and `PUBLISH`, and the store sends
/// those itself only to forget a key (not counted here), so they are left out: what remains
/// is one per round trip.
pub(crate) struct CommandCounter(pub(crate) redis::aio::MultiplexedConnection);

impl CommandCounter {
    pub(crate) async fn new(url: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        Self(client.get_multiplexed_async_connection().await.unwrap())
    }

    pub(crate) async fn total(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.0)
            .await
            .unwrap();
        info.lines()
            .filter(|line| line.starts_with("cmdstat_"))
            .filter(|line| {
                let name = &line["cmdstat_".len()..line.find(':').unwrap_or(line.len())];
                !matches!(
                    name,
                    "info"
                        | "hmget"
                        | "hset"
                        | "hget"
                        | "hdel"
                        | "pexpire"
                        | "persist"
                        | "hexists"
                        | "exists"
                        | "del"
                        | "time"
                        | "publish"
                )
            })
            .filter_map(|line| {
                let calls = line.split("calls=").nth(1)?;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// Asserts that `request` costs exactly `expected` commands.
    async fn expect<St: Store>(
        &mut self,
        service: &tower_idempotency::layer::Idempotency<
            Inner,
            St,
            tower_idempotency::operation::LabelContract,
        >,
        request: http::Request<Chunks>,
        expected: u64,
        what: &str,
    ) -> Reply {
        let before = self.total().await;
        let reply = send_to(service, request).await;
        assert_eq!(self.total().await - before, expected, "{what}");
        reply
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn round_trips_new_two_replay_pending_conflict_one() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let service = counting_service(store.clone(), Arc::default(), Duration::ZERO);
    // Load the scripts once, as a long-running server has.
    send_to(&service, operation("warm-up", "p")).await;
    send_to(&service, operation("warm-up", "p")).await;
    let mut counter = CommandCounter::new(&server.url()).await;

    counter
        .expect(&service, valid(), 2, "new: claim + complete")
        .await
        .is_created();
    counter
        .expect(&service, valid(), 1, "replay: claim")
        .await
        .is_created();
    counter
        .expect(&service, operation(KEY, "parcel-43"), 1, "conflict: claim")
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    let fp = LabelContract::fingerprint("pending-op", "parcel-42");
    assert!(matches!(
        store.claim(&key_of("pending-op"), &fp).await,
        Ok(Claim::New(_))
    ));
    counter
        .expect(
            &service,
            operation("pending-op", "parcel-42"),
            1,
            "pending: claim",
        )
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    let refused = request("POST", "/labels", Some(KEY), Some("text/plain"), BODY);
    counter
        .expect(&service, refused, 0, "refused before the claim: nothing")
        .await
        .exact(415, r#"{"error":"unsupported_media_type"}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_connection_lost_between_create_and_complete_leaves_the_key_pending() {
    let server = RedisServer::start();
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], server.port));
    let proxy = Arc::new(common::servers::Proxy::start(upstream, false).await);
    let url = format!("redis://{}", proxy.addr);
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    let cutter = Arc::clone(&proxy);
    crash_between_create_and_complete(store, move || cutter.cut(), || proxy.restore()).await;
}

/// The configured timeout is the one that counts, above the connection's own one second too,
/// and a call that runs out of it reports `Timeout`. The test's own server is paused, so other
/// tests are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn the_configured_timeout_is_honoured_and_reported_as_a_timeout() {
    let server = RedisServer::start();
    let pause = |millis: u64| pause_redis(server.port, millis, "WRITE");
    let patient = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(4));
    let fp = LabelContract::fingerprint("timeout", "p");
    pause(1_500);
    let started = std::time::Instant::now();
    let claim = patient.claim("patient", &fp).await;
    assert!(matches!(claim, Ok(Claim::New(_))), "{claim:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1_000),
        "it waited for the pause"
    );

    let hasty = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    pause(1_000);
    let error = hasty.claim("hasty", &fp).await.unwrap_err();
    assert_eq!(
        error.kind(),
        tower_idempotency::store::StoreErrorKind::Timeout
    );
}

/// A claim queued behind `CLIENT PAUSE … WRITE` runs after its caller timed out, with a token
/// nobody holds; the layer settles it, so no key is stranded pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn claims_whose_answers_are_lost_in_a_pause_strand_no_key() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    let port = server.port;
    lost_claim_answers_strand_no_key(store, async move {
        pause_redis(port, 1_500, "WRITE");
    })
    .await;
}

/// A server that may evict records (completed ones carry a TTL) is refused at connect, unless
/// explicitly allowed: an evicted record lets a retry create again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_server_that_may_evict_records_is_refused_unless_allowed() {
    for policy in ["volatile-lru", "allkeys-lru"] {
        let server =
            RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let error = RedisStore::connect(&server.url()).await.unwrap_err();
        assert_eq!(
            error.kind(),
            tower_idempotency::store::StoreErrorKind::InvalidConfig
        );
        assert!(format!("{error:#}").contains(policy), "{error:#}");
        let allowed = RedisStore::connect_allowing_eviction(&server.url())
            .await
            .unwrap();
        assert_eq!(
            allowed.eviction_policy().await.unwrap().as_deref(),
            Some(policy)
        );
    }
    let safe = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let store = RedisStore::connect(&safe.url()).await.unwrap();
    assert!(matches!(
        store
            .claim("k", &LabelContract::fingerprint("k", "p"))
            .await,
        Ok(Claim::New(_))
    ));
}

/// A server that does not answer `CONFIG GET` (renamed, as some managed services do) does not
/// say its policy: it is accepted, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_server_without_config_is_accepted() {
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(store.eviction_policy().await.unwrap(), None);
    assert!(matches!(
        store
            .claim("k", &LabelContract::fingerprint("k", "p"))
            .await,
        Ok(Claim::New(_))
    ));
    // A server that cannot be reached does not say "nothing": it fails.
    drop(server);
    assert!(store.eviction_policy().await.is_err());
}

/// A script that fails (here on a record key that holds another type) is sent once: only a
/// server that does not have the script yet gets it again, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_failing_script_is_sent_once() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let fp = LabelContract::fingerprint("warm", "p");
    // The script loaded, as on a long-running server.
    assert!(matches!(store.claim("warm", &fp).await, Ok(Claim::New(_))));
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("idempotency:not-a-hash")
        .arg("x")
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut counter = CommandCounter::new(&server.url()).await;
    let before = counter.total().await;
    let error = store.claim("not-a-hash", &fp).await.unwrap_err();
    assert_eq!(
        error.kind(),
        tower_idempotency::store::StoreErrorKind::Unavailable
    );
    assert_eq!(
        counter.total().await - before,
        1,
        "one EVALSHA, no EVAL after it"
    );
}

/// A claim that reached Redis and took effect, whose answer was lost (dropped by a proxy,
/// then the connection cut): settled, so the retry creates once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_claim_answer_lost_after_the_send_strands_no_key() {
    let server = RedisServer::start();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let proxy = common::servers::Proxy::start(upstream, false).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr))
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    answers_lost_after_the_send_strand_no_key(
        store,
        || proxy.mute(),
        || proxy.cut(),
        || proxy.restore(),
    )
    .await;
}

/// Found in review: a record whose lease deadline is not a number (written by hand, or by
/// something else) is pending to a taking-over claim, never a script error that would be
/// retried for ever; inspect shows it in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn a_malformed_lease_deadline_is_pending_not_an_error() {
    use tower_idempotency::store::Operator;
    use tower_idempotency::store::{Lease, Reservation};
    let store = make_store(None).await;
    let key = common::conformance::unique_key("bad-deadline");
    let fp = LabelContract::fingerprint("bad", "deadline");
    let take_over = Lease::new(Duration::from_millis(50)).take_over_abandoned();
    let owner = Reservation::generate();
    let claimed = store.claim_with(&key, &fp, owner, take_over).await.unwrap();
    assert_eq!(claimed, Claim::New(owner));
    let mut connection = store.connection().expect("one server").clone();
    let _: () = redis::cmd("HSET")
        .arg(format!("tower-idempotency-test:{key}"))
        .arg("until")
        .arg("soon")
        .query_async(&mut connection)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let next = Reservation::generate();
    let claimed = store.claim_with(&key, &fp, next, take_over).await.unwrap();
    assert_eq!(claimed, Claim::Pending);
    assert!(!store.inspect(&key).await.unwrap().unwrap().abandoned);
    store.release(&key, &owner).await.unwrap();
}

/// A store not told otherwise lets a completed record expire after [`DEFAULT_RETENTION`]:
/// Redis holds it with that time to live (and drops it then), and a claim within it replays.
/// `keep_forever` gives it none.
#[tokio::test]
pub(crate) async fn a_completed_record_lives_for_the_default_window() {
    use tower_idempotency::store::DEFAULT_RETENTION;
    let store = make_store(None).await;
    let client = redis::Client::open(redis_url()).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    let ttl = |key: String| {
        let mut connection = connection.clone();
        async move {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(format!("tower-idempotency-test:{key}"))
                .query_async(&mut connection)
                .await
                .unwrap();
            ttl
        }
    };
    let key = common::conformance::unique_key("default-window");
    complete_new(&store, &key).await;
    let left = ttl(key.clone()).await;
    let window = i64::try_from(DEFAULT_RETENTION.as_millis()).unwrap();
    assert!(left > window - 60_000 && left <= window, "{left}");
    assert_eq!(claimed_again(&store, &key).await, "replay");

    let forever = make_store(None).await.keep_forever();
    let key = common::conformance::unique_key("forever");
    complete_new(&forever, &key).await;
    assert_eq!(ttl(key.clone()).await, -1, "no time to live");
    assert_eq!(claimed_again(&forever, &key).await, "replay");
}

/// What a Redis store keeps, request by request, through the layer: a completed record
/// carries the retention as its time to live; a conflict and a refused body write nothing;
/// only a create that failed without an answer (which may have taken effect) leaves a pending
/// record, with no time to live, since expiring it could let a retry create twice. Those are
/// what can pile up, one per such failure (and one per create a killed process was running):
/// the operator's view lists each, abandoned once its lease lapsed, and forgetting them leaves
/// nothing without a time to live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn only_failed_creates_leave_records_without_a_time_to_live_and_the_operator_lists_them()
 {
    use tower_idempotency::scope::store_key;
    use tower_idempotency::store::{Lease, Operator};
    let prefix = format!("{}:", common::conformance::unique_key("accumulate"));
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .prefix(&prefix)
        .retention(Duration::from_secs(3600));
    let layer = tower_idempotency::IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .lease(Lease::MIN_DURATION);
    let created = tower::Layer::layer(
        &layer,
        Inner::new(tower::service_fn(
            |_: http::Request<tower_idempotency::layer::RequestBody<Chunks>>| async {
                Ok::<_, CreateError>(created_response())
            },
        )),
    );
    let failing = tower::Layer::layer(
        &layer,
        Inner::new(tower::service_fn(
            |_: http::Request<tower_idempotency::layer::RequestBody<Chunks>>| async {
                Err::<http::Response<http_body_util::Full<bytes::Bytes>>, _>(CreateError(
                    "the downstream is down",
                ))
            },
        )),
    );
    for i in 0..20 {
        send_to(&created, operation(&format!("ok-{i}"), "p"))
            .await
            .is_created();
        send_to(&created, operation(&format!("ok-{i}"), "other"))
            .await
            .exact(409, r#"{"error":"idempotency_conflict"}"#);
    }
    for i in 0..10 {
        let reply = send_to(&failing, operation(&format!("failed-{i}"), "p")).await;
        assert_eq!(reply.status, 500);
    }
    let client = redis::Client::open(redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let ttls = |pattern: String| {
        let mut connection = connection.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query_async(&mut connection)
                .await
                .unwrap();
            let mut ttls = Vec::new();
            for key in keys {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                ttls.push((key, ttl));
            }
            ttls.sort();
            ttls
        }
    };
    let kept = ttls(format!("{prefix}*")).await;
    assert_eq!(kept.len(), 30, "{kept:?}");
    let without: Vec<&String> = kept
        .iter()
        .filter(|(_, ttl)| *ttl < 0)
        .map(|(key, _)| key)
        .collect();
    assert_eq!(without.len(), 10, "only the failed creates: {without:?}");
    assert!(without.iter().all(|key| key.contains("failed-")));
    let window = 3_600_000;
    assert!(
        kept.iter()
            .filter(|(key, _)| key.contains("ok-"))
            .all(|(_, ttl)| *ttl > window - 60_000 && *ttl <= window),
        "{kept:?}"
    );
    // The operator lists them, and shows each abandoned once its lease lapsed.
    let failed: Vec<String> = (0..10)
        .map(|i| store_key(None, &http::Method::POST, "/labels", &format!("failed-{i}")))
        .collect();
    let mut listed = store.pending_older_than(Duration::ZERO).await.unwrap();
    listed.sort();
    let mut expected = failed.clone();
    expected.sort();
    assert_eq!(listed, expected);
    for key in &failed {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let record = store.inspect(key).await.unwrap().expect("the record");
            if record.abandoned {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{key} abandoned");
            tokio::time::sleep(Lease::MIN_DURATION).await;
        }
        assert!(store.forget(key).await.unwrap());
    }
    let left = ttls(format!("{prefix}*")).await;
    assert_eq!(left.len(), 20);
    assert!(left.iter().all(|(_, ttl)| *ttl > 0), "{left:?}");
    let _: () = redis::cmd("DEL")
        .arg(left.iter().map(|(key, _)| key.as_str()).collect::<Vec<_>>())
        .query_async(&mut connection)
        .await
        .unwrap();
}

/// The operator's tool (`idempotency_keys`) on Redis: `purge` has nothing to
/// do (Redis expires records by their time to live) and says so; `show` finds a record.
#[tokio::test]
pub(crate) async fn the_operators_tool_on_redis_purges_nothing_and_shows_a_record() {
    use tower_idempotency::store::Operator;
    let tool = common::operator_tool;
    let url = redis_url();
    let (code, out, note) = tool(&["--store", &url, "purge"]);
    assert_eq!((code, out.as_str()), (Some(0), "purged 0\n"));
    assert!(note.contains("time to live"), "{note}");
    let key = common::conformance::unique_key("tool");
    let store = RedisStore::connect(&url).await.unwrap();
    let store_key = tower_idempotency::scope::store_key(None, &http::Method::POST, "/labels", &key);
    complete_new(&store, &store_key).await;
    let (code, out, _) = tool(&["--store", &url, "show", &key]);
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().next(), Some("state completed"));
    // A forget that waits for a replica the server does not have fails as the store's
    // failure, and forgets nothing the tool reports as done.
    let (code, _, note) = tool(&["--store", &url, "--wait-for-replicas", "1", "forget", &key]);
    assert_eq!(code, Some(3), "{note}");
    assert!(note.contains("0 of 1 replicas"), "{note}");
    complete_new(&store, &store_key).await;
    // The method in any case is the endpoint's.
    let (code, out, _) = tool(&["--store", &url, "--method", "post", "show", &key]);
    assert_eq!(
        (code, out.lines().next()),
        (Some(0), Some("state completed"))
    );
    assert!(store.forget(&store_key).await.unwrap());

    // A store under a prefix of its own, as the README's example sets one.
    let prefixed = RedisStore::connect(&url)
        .await
        .unwrap()
        .prefix("tool-test:idempotency:");
    complete_new(&prefixed, &store_key).await;
    let (code, _, _) = tool(&["--store", &url, "show", &key]);
    assert_eq!(code, Some(1), "not under the default prefix");
    let shown = tool(&[
        "--store",
        &url,
        "--prefix",
        "tool-test:idempotency:",
        "show",
        &key,
    ]);
    assert_eq!(
        (shown.0, shown.1.lines().next()),
        (Some(0), Some("state completed"))
    );
    let forgot = tool(&[
        "--store",
        &url,
        "--prefix",
        "tool-test:idempotency:",
        "forget",
        &key,
    ]);
    assert_eq!(forgot.0, Some(0));
    assert!(prefixed.inspect(&store_key).await.unwrap().is_none());
}

/// A lost claim that reaches Redis only after its settling (queued on a connection the store
/// replaced, whose bytes the network delivers late): it must write nothing, or its key would
/// stay pending under a reservation nobody holds. The settling fences the reservation in the
/// record's hash; the late claim finds the fence. Another reservation's claim, and the
/// key's life after, are as before: new, completed, replayed.
#[tokio::test]
pub(crate) async fn a_claim_that_arrives_after_its_settling_writes_nothing() {
    use tower_idempotency::store::{Lease, Reservation, StoreErrorKind};

    let store = make_store(None).await;
    let key = common::conformance::unique_key("late-claim");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let lost = Reservation::generate();
    store.settle_claim(&key, &fingerprint, lost).await.unwrap();
    let late = store
        .claim_with(&key, &fingerprint, lost, Lease::default())
        .await;
    assert_eq!(
        late.map_err(|error| error.kind()).err(),
        Some(StoreErrorKind::ReservationLost),
        "the late claim is refused"
    );
    assert_eq!(claimed_again(&store, &key).await, "new", "nothing pending");

    // The same after a claim that took effect before its settling released it.
    let key = common::conformance::unique_key("late-claim-2");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let lost = Reservation::generate();
    let claimed = store
        .claim_with(&key, &fingerprint, lost, Lease::default())
        .await;
    assert!(matches!(claimed, Ok(Claim::New(_))));
    store.settle_claim(&key, &fingerprint, lost).await.unwrap();
    let late = store
        .claim_with(&key, &fingerprint, lost, Lease::default())
        .await;
    assert!(late.is_err(), "{late:?}");
    complete_new(&store, &key).await;
    assert_eq!(claimed_again(&store, &key).await, "replay");

    // A fence outlives a completed record's shorter retention: the key's retry completes with
    // 200 ms of retention, and the lost claim arriving past it still writes nothing.
    let short = make_store(Some(Duration::from_millis(200))).await;
    let key = common::conformance::unique_key("late-claim-3");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let lost = Reservation::generate();
    short.settle_claim(&key, &fingerprint, lost).await.unwrap();
    complete_new(&short, &key).await;
    let completed = std::time::Instant::now();
    while completed.elapsed() < Duration::from_millis(400) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = short
        .claim_with(&key, &fingerprint, lost, Lease::default())
        .await;
    assert_eq!(
        late.map_err(|error| error.kind()).err(),
        Some(StoreErrorKind::ReservationLost),
        "the fence outlived the retention"
    );
}

/// An explicit replica wait a primary cannot meet says so where a user meets it: the wait's
/// own line (the example servers' start line) says a write fewer acknowledge is refused, and a
/// refused write's error names the primary, the replicas it lacks, and why every write of it
/// is refused. The run's server has no replica.
#[tokio::test]
pub(crate) async fn an_explicit_replica_wait_that_cannot_be_met_says_so() {
    use tower_idempotency::store::StoreErrorKind;

    let store = make_store(None)
        .await
        .wait_for_replicas(1, Duration::from_millis(50));
    let said = store.replica_wait().to_string();
    assert!(said.contains("refused (503)"), "{said}");
    let key = common::conformance::unique_key("unmet-wait");
    let error = store
        .claim(&key, &LabelContract::fingerprint(&key, "p"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unreplicated);
    let chain = format!("{error:#}");
    let url = redis_url();
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    // As the client prints it: an IPv6 host without its brackets.
    let address = authority
        .rsplit('@')
        .next()
        .unwrap()
        .replace(['[', ']'], "");
    assert!(chain.contains(&format!("the primary {address}")), "{chain}");
    assert!(chain.contains("it lacks 1"), "{chain}");
    assert!(chain.contains("explicit wait_for_replicas"), "{chain}");
}
