//! Scenarios every store's tests run: a crash between create and complete, an outage, lost store answers, waiters across replicas, the pool's line, a purger's steady state.

#[allow(unused_imports)]
use super::*;

/// The gap between create and complete (`LABEL_CONTRACT.md` §5): the store connection drops after the create and before the complete
/// (`cut` is called inside the create). The client still gets the created response, and
/// retries, once the store is back (`restore`), get `request_pending` or, once the lost
/// complete is settled, its replay; never a second create.
pub async fn crash_between_create_and_complete<St: Store>(
    store: St,
    cut: impl Fn() + Send + Sync + 'static,
    restore: impl Fn(),
) {
    // A connection made and the claim prepared, as on a server that has been running: the
    // first claim through a cold pool can outlast a short timeout on a loaded machine.
    let warm = conformance::unique_key("crash-warm");
    if let Ok(Claim::New(reservation)) = store
        .claim(
            &warm,
            &tower_idempotency::operation::LabelContract::fingerprint(&warm, "p"),
        )
        .await
    {
        let _ = store.release(&warm, &reservation).await;
    }
    let creates = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&creates);
    let cut = Arc::new(cut);
    let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        cut(); // the store is gone before the complete
        async { Ok::<_, CreateError>(created_response()) }
    });
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Inner::new(create),
    );
    let key = conformance::unique_key("crash");
    let first = send_to(&service, operation(&key, "parcel-42")).await;
    assert_eq!(
        first.status, 201,
        "the create happened: its response is the reply"
    );
    assert_eq!(
        first.outcome,
        Some(tower_idempotency::reply::Outcome::CompleteFailed)
    );

    restore();
    // The lost complete is settled in the background once the store is back: a retry gets
    // request_pending until then, the first attempt's response as a replay after.
    let pending_or_replay = |reply: Reply| {
        if reply.status == 409 {
            reply.exact(409, r#"{"error":"request_pending"}"#);
        } else {
            assert_eq!(
                reply.outcome,
                Some(tower_idempotency::reply::Outcome::Replay)
            );
            assert_eq!(reply.body, first.body, "the first attempt's response");
        }
    };
    pending_or_replay(send_until_answered(&service, || operation(&key, "parcel-42")).await);
    pending_or_replay(send_to(&service, operation(&key, "parcel-42")).await);
    assert_eq!(creates.load(Ordering::SeqCst), 1, "no second create");
}

/// A store outage: with the backend away (`cut`), requests fail closed with `503
/// store_unavailable` within three timeouts and create nothing; once it is back (`restore`),
/// traffic recovers by itself, with no new service.
pub async fn outage_fails_closed_and_recovers<St: Store>(
    store: St,
    timeout: std::time::Duration,
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let warmed = warm_up(&service, &creates).await;
    let key = conformance::unique_key("outage");
    cut();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        send_to(&service, operation(&key, "parcel-42"))
            .await
            .exact(503, r#"{"error":"store_unavailable"}"#)
            .header("retry-after", &["2"]);
        assert!(
            started.elapsed() < timeout * 3,
            "failed in {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        warmed,
        "nothing created while the store is away"
    );
    restore();
    // A claim cut off mid-flight may have landed: the key is then pending until the process
    // that lost the answer settles it (a release, once the store answers), and a retry gets
    // request_pending meanwhile. Within seconds the retry creates, once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = send_to(&service, operation(&key, "parcel-42")).await;
        if reply.status == 201 || std::time::Instant::now() > deadline {
            reply.exact(201, CREATED_BODY);
            break;
        }
        match reply.status.as_u16() {
            409 => assert_eq!(reply.body, r#"{"error":"request_pending"}"#),
            503 => {}
            other => panic!("unexpected {other} after the store came back"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(creates.load(Ordering::SeqCst), warmed + 1);
}

/// A store on an application's pool of one connection, called back to back by a task: someone
/// else in the pool's line (the application's handler, the store's own transaction settling
/// a lost claim) gets the connection while the calls go on, not only once they stop.
pub async fn the_pools_line_gets_a_turn_while_store_calls_go_on<St: Store, DB: sqlx::Database>(
    store: St,
    pool: sqlx::Pool<DB>,
) {
    use std::sync::atomic::AtomicBool;
    let fp = LabelContract::fingerprint("x", "y");
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let caller = tokio::spawn({
        let (store, answered, stop) = (store.clone(), Arc::clone(&answered), Arc::clone(&stop));
        async move {
            // Bounded: on a store that never gives the connection up, the line gets it when
            // the calls stop, and the assertions below say so.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                let key = conformance::unique_key("turn");
                if store.claim(&key, &fp).await.is_ok() {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    let calls_going = || {
        let answered = &answered;
        let before = answered.load(Ordering::SeqCst);
        async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            while answered.load(Ordering::SeqCst) < before + 3 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no store call answered"
                );
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    };
    calls_going().await;
    let connection = pool.acquire().await;
    assert!(connection.is_ok(), "{:?}", connection.err());
    assert!(
        !caller.is_finished(),
        "the application's handler got the connection only once the store's calls stopped"
    );
    drop(connection);
    // The store's own transaction: settling a claim whose answer was lost.
    let key = conformance::unique_key("turn-settle");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fp).await else {
        panic!("a new claim");
    };
    calls_going().await;
    let settled = store.settle_claim(&key, &fp, reservation).await;
    assert!(settled.is_ok(), "{settled:?}");
    assert!(
        !caller.is_finished(),
        "the store's transaction got the connection only once the store's calls stopped"
    );
    stop.store(true, Ordering::SeqCst);
    caller.await.unwrap();
    // Calls that pause: the connection the last call kept goes back to the pool within its
    // turn, not after the second for which an unused connection used to be kept (found by a
    // review: a settling transaction waiting behind it timed out).
    assert!(
        store
            .claim(&conformance::unique_key("turn-pause"), &fp)
            .await
            .is_ok()
    );
    let started = std::time::Instant::now();
    let connection = pool.acquire().await;
    assert!(connection.is_ok(), "{:?}", connection.err());
    assert!(
        started.elapsed() < std::time::Duration::from_millis(900),
        "the pool had its connection back after {:?}",
        started.elapsed()
    );
}

/// Warms `service`: the pool's first connection is made within the store's short timeout,
/// which a loaded machine can miss; a warm-up refused so is tried again, under another key.
/// Returns the creates made.
pub async fn warm_up<St: Store>(
    service: &Idempotency<Inner, St, LabelContract>,
    creates: &AtomicUsize,
) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let warm = send_to(service, operation(&conformance::unique_key("warm"), "p")).await;
        if warm.status == 201 {
            warm.exact(201, CREATED_BODY);
            return creates.load(Ordering::SeqCst);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never warm: {}",
            warm.status
        );
    }
}

/// Sends until the store answers again (a reconnect takes a moment): the first reply that is
/// not `503`, or the last one after ten seconds.
pub async fn send_until_answered<St: Store>(
    service: &Idempotency<Inner, St, LabelContract>,
    request: impl Fn() -> Request<Chunks>,
) -> Reply {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = send_to(service, request()).await;
        if reply.status != 503 || std::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Claims whose answers are lost: `stall` (once it is in effect) holds the store for about 1.5 s (a paused Redis,
/// a locked table), longer than its timeout. Twenty requests meanwhile get `503
/// store_unavailable`; once the store answers again, each client's retry (it was told
/// `Retry-After: 2`) gets a 201 within a few seconds, and each key is created exactly once.
pub async fn lost_claim_answers_strand_no_key<St: Store>(
    store: St,
    stall: impl std::future::Future<Output = ()>,
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let keys: Vec<String> = (0..20)
        .map(|i| conformance::unique_key(&format!("lost-{i}")))
        .collect();
    // Warm: scripts loaded, statements prepared, as on a server that has been running.
    let warm: Vec<_> = (0..keys.len())
        .map(|i| {
            let service = service.clone();
            let request = operation(&conformance::unique_key(&format!("warm-{i}")), "p");
            tokio::spawn(async move { send_to(&service, request).await })
        })
        .collect();
    for task in warm {
        task.await.unwrap().exact(201, CREATED_BODY);
    }
    creates.store(0, Ordering::SeqCst);
    stall.await;
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (service, request) = (service.clone(), operation(key, "parcel-42"));
            tokio::spawn(async move { send_to(&service, request).await })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .exact(503, r#"{"error":"store_unavailable"}"#)
            .header("retry-after", &["2"]);
    }
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await; // Retry-After: 2
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    for key in &keys {
        loop {
            let reply = send_to(&service, operation(key, "parcel-42")).await;
            if reply.status == 201 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{key} stranded: {} {:?}",
                reply.status,
                reply.body
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        keys.len(),
        "one create per key"
    );
}

/// Answers lost after the send: the claim reaches the store and takes effect, its answer is
/// dropped (`mute`), the connection is then cut and restored. The client got `503`; after
/// `Retry-After` its retry gets a 201, and the key is created exactly once.
pub async fn answers_lost_after_the_send_strand_no_key<St: Store>(
    store: St,
    mute: impl FnOnce(),
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let warmed = warm_up(&service, &creates).await;
    let key = conformance::unique_key("muted");
    mute();
    send_to(&service, operation(&key, "parcel-42"))
        .await
        .exact(503, r#"{"error":"store_unavailable"}"#);
    cut();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    restore();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await; // Retry-After: 2
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    loop {
        let reply = send_to(&service, operation(&key, "parcel-42")).await;
        if reply.status == 201 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stranded: {} {:?}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        warmed + 1,
        "the warm-up and one create"
    );
}

/// `pending_wait` on any store: a retry waiting for a first attempt that takes 300 ms answers
/// with the same bytes soon after it completes (within `within`: the store's poll interval and
/// a round trip where it does not notify), and a waiter on a second layer instance (its own
/// service, as another replica would have) is answered as well. One create.
pub async fn waiting_retries_get_the_first_attempts_bytes<St: Store>(
    replica_a: St,
    replica_b: St,
    within: std::time::Duration,
) {
    use tower::Layer;
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = |store: St| {
        IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .pending_wait(Duration::from_secs(5))
            .layer(timed_create(Journal::default(), Arc::clone(&creates)))
    };
    let (a, b) = (layer(replica_a), layer(replica_b));
    let key = format!("wait-{}", Reservation::generate());
    let first = spawn_send(&a, operation(&key, "slow-300"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let same = spawn_send(&a, operation(&key, "slow-300"));
    let other = spawn_send(&b, operation(&key, "slow-300"));
    let first = first.await.unwrap();
    let completed = std::time::Instant::now();
    for waiter in [same, other] {
        let reply = waiter.await.unwrap();
        assert!(completed.elapsed() < within, "{:?}", completed.elapsed());
        reply.is_created();
        assert_eq!(reply.body, first.body);
        assert_eq!(
            reply.outcome,
            Some(tower_idempotency::reply::Outcome::Replay)
        );
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// `pending_wait` on a store two replicas share: fifty waiters on one key, split over both,
/// all answer with the first attempt's 201; while they wait each replica's store holds one
/// waited key however many wait on it (`waited` counts them), and none once they are answered.
/// A waiter whose client leaves mid-wait leaves nothing behind either.
pub async fn fifty_waiters_on_two_replicas<St: Store + Clone>(
    replica_a: St,
    replica_b: St,
    waited: impl Fn(&St) -> usize,
) {
    use tower::Layer;
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = |store: St| {
        IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .pending_wait(Duration::from_secs(5))
            .layer(timed_create(Journal::default(), Arc::clone(&creates)))
    };
    let (a, b) = (layer(replica_a.clone()), layer(replica_b.clone()));
    let key = format!("fifty-{}", Reservation::generate());
    let first = spawn_send(&a, operation(&key, "slow-400"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiters: Vec<_> = (0..50)
        .map(|i| {
            spawn_send(
                if i % 2 == 0 { &a } else { &b },
                operation(&key, "slow-400"),
            )
        })
        .collect();
    let left = b.clone().oneshot(operation(&key, "slow-400"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), left)
            .await
            .is_err(),
        "still waiting when its client leaves"
    );
    assert_eq!(waited(&replica_a), 1, "one waited key on replica a");
    assert_eq!(waited(&replica_b), 1, "one waited key on replica b");
    let first = first.await.unwrap();
    first.is_created();
    for waiter in waiters {
        let reply = waiter.await.unwrap();
        reply.is_created();
        assert_eq!(reply.body, first.body);
        assert_eq!(
            reply.outcome,
            Some(tower_idempotency::reply::Outcome::Replay)
        );
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
    wait_for(|| waited(&replica_a) == 0 && waited(&replica_b) == 0).await;
}

/// Under a steady stream of 400 completed keys through `store` (one every few milliseconds),
/// a purger with a short retention (and tombstone window) holds the store steady: in the last quarter of the stream
/// `count` (the records it holds) stays under half the stream, and once the stream stops the
/// store empties of them.
pub async fn purger_holds_steady<St, F, Fut>(store: &St, count: F)
where
    St: Store,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let creates = 400;
    let mut most = 0;
    for i in 0..creates {
        let key = conformance::unique_key(&format!("steady-{i}"));
        complete_new(store, &key).await;
        if i >= creates * 3 / 4 && i % 10 == 0 {
            most = most.max(count().await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    assert!(
        most < 200,
        "{most} of {creates} records held at the end of the run"
    );
    let emptied = std::time::Instant::now();
    while count().await > 0 {
        assert!(
            emptied.elapsed() < std::time::Duration::from_secs(10),
            "the purger empties the store"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `claims` claims of new keys through `store`, one every few milliseconds, in a task of their
/// own: each must be new (answered within the store's timeout); the task yields how many were.
pub fn claims_meanwhile<St: Store>(store: St, claims: usize) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut answered = 0;
        for i in 0..claims {
            let key = conformance::unique_key(&format!("meanwhile-{i}"));
            let claim = store
                .claim(&key, &LabelContract::fingerprint(&key, "p"))
                .await;
            assert!(
                matches!(claim, Ok(tower_idempotency::store::Claim::New(_))),
                "{claim:?}"
            );
            answered += 1;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        answered
    })
}

/// On a store whose own changes wake its waiters (the memory, MySQL and SQLite stores): a
/// waiter registered on a key (`waited` counts it) ends as soon as this process releases the
/// key, not at the next poll, and leaves nothing once it ended.
pub async fn a_local_change_wakes_its_waiters_at_once<St: Store>(
    store: St,
    waited: impl Fn(&St) -> usize,
) {
    let key = conformance::unique_key("woken");
    let fingerprint = LabelContract::fingerprint(&key, "p");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fingerprint).await else {
        panic!("a new claim")
    };
    let mut changed = std::pin::pin!(store.changed(&key));
    let polled = futures_poll_once(changed.as_mut()).await;
    assert!(polled.is_pending(), "nothing changed yet");
    assert_eq!(waited(&store), 1);
    store.release(&key, &reservation).await.unwrap();
    // Polled at once, before the store's poll interval could have run out: only the wake of
    // the release ends it. (A release slower than the interval proves nothing either way.)
    let started = std::time::Instant::now();
    let polled = futures_poll_once(changed.as_mut()).await;
    if polled.is_pending() {
        assert!(
            started.elapsed() >= tower_idempotency::store::CHANGE_POLL_INTERVAL,
            "the release woke the waiter"
        );
        changed.await;
    }
    assert_eq!(waited(&store), 0, "an ended wait leaves nothing");
}

/// Polls `future` once.
async fn futures_poll_once<F: std::future::Future + Unpin>(
    mut future: F,
) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx)))
        .await
}
