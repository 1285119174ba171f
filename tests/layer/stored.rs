//! What the generic operations store: only successful responses when told, a created response within or over the cap, the body limit, and a settle that stops once the reservation is lost.

use crate::common;
use crate::generic::{BODY, post};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::payments::*;
use common::*;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::layer::StoredResponses;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// A created response over the cap is the create's answer, given whole; its retry gets its
/// status and headers with no body, never a pending key nor a second create.
#[tokio::test]
async fn an_oversized_created_response_is_given_whole_and_its_retry_gets_its_head() {
    let creates = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&creates);
    let big = Inner::new(tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            let mut response = Response::new(Full::new(Bytes::from(vec![b'x'; 100])));
            *response.status_mut() = StatusCode::CREATED;
            response
                .headers_mut()
                .insert("location", HeaderValue::from_static("/payments/big"));
            Ok::<_, CreateError>(response)
        }
    }));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .global_keys()
        .response_limit(99);
    let service = tower::Layer::layer(&layer, big);
    let first = send(&service, post(Some("big"), BODY)).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body, vec![b'x'; 100]);
    assert_eq!(first.outcome, Some(Outcome::Created));
    let retry = send(&service, post(Some("big"), BODY)).await;
    assert_eq!(retry.status, 201);
    assert!(retry.body.is_empty());
    retry
        .header("location", &["/payments/big"])
        .header("idempotent-body-omitted", &["true"]);
    assert_eq!(retry.outcome, Some(Outcome::Replay));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn storing_only_successful_responses_releases_the_key_after_any_other_answer() {
    let statuses = Arc::new(std::sync::Mutex::new(vec![
        Ok(StatusCode::CREATED),
        Err(()),
        Ok(StatusCode::UNPROCESSABLE_ENTITY),
    ]));
    let creates = Arc::new(AtomicUsize::new(0));
    let create = {
        let creates = Arc::clone(&creates);
        Inner::new(tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
            creates.fetch_add(1, Ordering::SeqCst);
            let status = statuses.lock().unwrap().pop().unwrap();
            async move {
                let status = status.map_err(|()| CreateError("down"))?;
                Ok(Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::from(status.as_str().to_owned())))
                    .unwrap())
            }
        }))
    };
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .store_responses(StoredResponses::Successful);
    let service = tower::Layer::layer(&layer, create);
    let rejected = send(&service, post(Some("s"), BODY)).await;
    assert_eq!(
        (rejected.status.as_u16(), &rejected.body[..]),
        (422, &b"422"[..])
    );
    assert_eq!(rejected.outcome, Some(Outcome::Unstored));
    assert!(store.is_empty(), "released");
    send(&service, post(Some("s"), BODY))
        .await
        .problem(500, "create_failed", None);
    assert!(
        store.is_pending("POST /payments s"),
        "an error is no answer: kept"
    );
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .global_keys()
        .store_responses(StoredResponses::Successful);
    let service = tower::Layer::layer(&layer, service.into_inner());
    let created = send(&service, post(Some("s"), BODY)).await;
    assert_eq!(created.outcome, Some(Outcome::Created));
    assert_eq!(
        send(&service, post(Some("s"), BODY)).await.outcome,
        Some(Outcome::Replay)
    );
    assert_eq!(creates.load(Ordering::SeqCst), 3);
}

/// The generic operations' default body limit is 16 KiB, checked on the bytes read.
#[tokio::test]
async fn the_default_body_limit_of_the_generic_operations_is_16_kib() {
    let (service, _) = guarded(JsonOperation::new());
    let padded = |len: usize| {
        let filler = "x".repeat(len - r#"{"p":""}"#.len());
        format!(r#"{{"p":"{filler}"}}"#)
    };
    assert_eq!(tower_idempotency::operation::DEFAULT_BODY_LIMIT, 16 * 1024);
    let fits = json_request("POST", "/any", Some("fits"), &padded(16 * 1024));
    assert_eq!(send(&service, fits).await.status, 201);
    let over = json_request("POST", "/any", Some("over"), &padded(16 * 1024 + 1));
    send(&service, over)
        .await
        .problem(413, "payload_too_large", None);
}

/// The default cap on a created response is 1 MiB: a response of a million bytes is stored
/// whole and replayed byte for byte.
#[tokio::test]
async fn a_response_within_the_default_cap_of_a_mebibyte_is_stored_whole() {
    let big = Inner::new(tower::service_fn(|_: Request<RequestBody<Chunks>>| async {
        let mut response = Response::new(Full::new(Bytes::from(vec![b'y'; 1_000_000])));
        *response.status_mut() = StatusCode::CREATED;
        Ok::<_, CreateError>(response)
    }));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation()).global_keys();
    let service = tower::Layer::layer(&layer, big);
    assert_eq!(
        send(&service, post(Some("mib"), BODY)).await.body.len(),
        1_000_000
    );
    let replay = send(&service, post(Some("mib"), BODY)).await;
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    assert_eq!(replay.body, vec![b'y'; 1_000_000]);
    assert!(replay.headers.get("idempotent-body-omitted").is_none());
}

/// A lost complete whose record another hand changed meanwhile (an operator forgot it): the
/// settling stops at its first `ReservationLost`, and the drain waits no longer for it.
#[tokio::test(start_paused = true)]
async fn settling_stops_once_the_reservation_is_lost() {
    use tower_idempotency::store::Operator;
    let drain = tower_idempotency::layer::Drain::new();
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .drain(&drain);
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(creates, Duration::ZERO));
    store.fail("complete");
    let reply = send(&service, post(Some("forgotten"), BODY)).await;
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    let key = tower_idempotency::scope::store_key(None, &Method::POST, "/payments", "forgotten");
    assert!(store.inner().forget(&key).await.unwrap());
    store.recover();
    let started = tokio::time::Instant::now();
    assert_eq!(drain.shutdown(Duration::from_secs(60)).await, Ok(()));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "settled at its first try: {:?}",
        started.elapsed()
    );
}

/// A lost complete whose store stays away for two minutes, longer than a failover on a loaded
/// host takes, is still settled once the store is back: the settling goes on trying, every
/// five seconds after its first half minute, so the retry replays rather than finding the key
/// pending for good.
#[tokio::test(start_paused = true)]
async fn a_lost_complete_is_settled_after_a_store_away_for_two_minutes() {
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    let layer = IdempotencyLayer::new(store.clone(), payment_operation()).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    store.fail("complete");
    let reply = send(&service, post(Some("away"), BODY)).await;
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    tokio::time::sleep(Duration::from_secs(120)).await;
    store.recover();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let retry = send(&service, post(Some("away"), BODY)).await;
    assert_eq!(retry.outcome, Some(Outcome::Replay));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// The settling ends five minutes after it began: a store away for longer, even by half a
/// second, leaves the key pending, to the operator, rather than a task that tries for ever.
#[tokio::test(start_paused = true)]
async fn a_lost_complete_is_left_to_the_operator_after_about_five_minutes() {
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    let layer = IdempotencyLayer::new(store.clone(), payment_operation()).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    store.fail("complete");
    let reply = send(&service, post(Some("gone"), BODY)).await;
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    // Back half a second past the five minutes: the last try (at 295.75 s) found it away,
    // and none is made after the deadline.
    tokio::time::sleep(Duration::from_millis(300_500)).await;
    store.recover();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let retry = send(&service, post(Some("gone"), BODY)).await;
    assert_eq!(retry.outcome, Some(Outcome::Pending));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// A store whose complete answers only after ten seconds (a store cut off, each call
/// answered at its timeout), failing while told to.
#[derive(Clone)]
struct SlowStore(RecordingStore);

impl tower_idempotency::store::Store for SlowStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &tower_idempotency::operation::Fingerprint,
        reservation: tower_idempotency::store::Reservation,
        lease: tower_idempotency::store::Lease,
    ) -> Result<tower_idempotency::store::Claim, tower_idempotency::store::StoreError> {
        self.0
            .claim_with(key, fingerprint, reservation, lease)
            .await
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        lease: Duration,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.0.renew(key, reservation, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
        response: &tower_idempotency::store::StoredResponse,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        self.0.complete(key, reservation, response).await
    }

    async fn release(
        &self,
        key: &str,
        reservation: &tower_idempotency::store::Reservation,
    ) -> Result<(), tower_idempotency::store::StoreError> {
        self.0.release(key, reservation).await
    }
}

/// The settling's five minutes are a clock's, not a count of tries: with a store whose every
/// call takes ten seconds, it still ends about five minutes after it began (a count would
/// go on for twenty), leaving the key to the operator.
#[tokio::test(start_paused = true)]
async fn the_settling_ends_five_minutes_after_it_began_however_slow_the_store() {
    let recording = RecordingStore::new(MemoryStore::new(), Journal::new());
    let store = SlowStore(recording.clone());
    let layer = IdempotencyLayer::new(store, payment_operation()).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    recording.fail("complete");
    let reply = send(&service, post(Some("slow"), BODY)).await;
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    tokio::time::sleep(Duration::from_secs(6 * 60)).await;
    recording.recover();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let retry = send(&service, post(Some("slow"), BODY)).await;
    assert_eq!(retry.outcome, Some(Outcome::Pending));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}
