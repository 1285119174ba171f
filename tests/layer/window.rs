//! The replay window advertised: every answer to a guarded request (the create, a replay, a
//! refusal) carries the store's retention in `Idempotency-TTL`, in whole seconds rounded up;
//! none where the store keeps records until forgotten, none on the label contract unless asked,
//! and under another name or none when the layer says.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::payments::*;
use common::*;
use http::HeaderName;
use tower::Layer as _;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::reply::IDEMPOTENCY_TTL;
use tower_idempotency::store::{DynStore, Store};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

const BODY: &str = r#"{"amount":1250,"currency":"EUR"}"#;
const OTHER: &str = r#"{"amount":9,"currency":"EUR"}"#;

fn retaining(retention: Duration) -> MemoryStore {
    MemoryStore::builder().retention(retention).build()
}

/// The `Idempotency-TTL` of each answer of a create, its replay, a conflict and a body the
/// operation refuses, on `store`.
async fn advertised<St: Store + Clone>(store: St) -> Vec<Option<String>> {
    let (service, _) = payments(store, Duration::ZERO);
    let mut seen = Vec::new();
    for (key, body) in [("w-1", BODY), ("w-1", BODY), ("w-1", OTHER), ("w-2", "{")] {
        let reply = send(&service, json_request("POST", "/payments", Some(key), body)).await;
        seen.push(
            reply
                .headers
                .get(&IDEMPOTENCY_TTL)
                .map(|value| value.to_str().unwrap().to_owned()),
        );
    }
    seen
}

#[tokio::test]
async fn every_answer_to_a_guarded_request_carries_the_stores_window() {
    let two = Some("2".to_owned());
    assert_eq!(
        advertised(retaining(Duration::from_secs(2))).await,
        [two.clone(), two.clone(), two.clone(), two]
    );
    let day = Some("86400".to_owned());
    assert_eq!(
        advertised(MemoryStore::new()).await,
        [day.clone(), day.clone(), day.clone(), day]
    );
    // Rounded down, so that a client retrying up to the advertised second is within the
    // window; at least one second; past what a store keeps (a hundred years), that.
    let rounded = advertised(retaining(Duration::from_millis(1_500))).await;
    assert_eq!(rounded[0].as_deref(), Some("1"));
    let short = advertised(retaining(Duration::from_millis(300))).await;
    assert_eq!(short[0].as_deref(), Some("1"));
    let endless = advertised(retaining(Duration::MAX)).await;
    let hundred_years = (100 * 365 * 24 * 60 * 60u64).to_string();
    assert_eq!(endless[0].as_deref(), Some(hundred_years.as_str()));
    // Through a boxed store too, which forwards the window.
    let boxed = DynStore::new(retaining(Duration::from_secs(7)));
    assert_eq!(advertised(boxed).await[1].as_deref(), Some("7"));
}

/// A path the layer does not guard is answered `404` without the header: no guarded request.
#[tokio::test]
async fn a_path_the_layer_does_not_guard_carries_no_window() {
    let creates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let service = IdempotencyLayer::new(retaining(Duration::from_secs(60)), payment_operation())
        .global_keys()
        .path("/payments")
        .layer(payment_create(creates, Duration::ZERO));
    let reply = send(
        &service,
        json_request("POST", "/refunds", Some("n-1"), BODY),
    )
    .await;
    assert_eq!(reply.status, 404);
    assert!(!reply.headers.contains_key(&IDEMPOTENCY_TTL));
}

#[tokio::test]
async fn a_store_that_keeps_records_for_good_advertises_no_window() {
    let forever = MemoryStore::builder().keep_forever().build();
    assert_eq!(advertised(forever).await, [None, None, None, None]);
}

#[tokio::test]
async fn the_layer_renames_the_header_or_sends_none() {
    let lifetime = HeaderName::from_static("idempotency-key-lifetime");
    let creates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let renamed = IdempotencyLayer::new(retaining(Duration::from_secs(60)), payment_operation())
        .global_keys()
        .window_header(Some(lifetime.clone()))
        .layer(payment_create(Arc::clone(&creates), Duration::ZERO));
    let reply = send(
        &renamed,
        json_request("POST", "/payments", Some("r-1"), BODY),
    )
    .await;
    assert_eq!(reply.headers[&lifetime], "60");
    assert!(!reply.headers.contains_key(&IDEMPOTENCY_TTL));

    let silent = IdempotencyLayer::new(retaining(Duration::from_secs(60)), payment_operation())
        .global_keys()
        .window_header(None)
        .layer(payment_create(creates, Duration::ZERO));
    let reply = send(
        &silent,
        json_request("POST", "/payments", Some("s-1"), BODY),
    )
    .await;
    assert_eq!(reply.status, 201);
    assert!(!reply.headers.contains_key(&IDEMPOTENCY_TTL));
}

#[tokio::test]
async fn the_label_contract_keeps_its_headers_unless_asked() {
    let store = retaining(Duration::from_secs(60));
    let (service, _) = labels_over(store.clone(), None);
    let first = send_to(&service, operation("l-1", "parcel-1")).await;
    let replay = send_to(&service, operation("l-1", "parcel-1")).await;
    assert_eq!((first.status.as_u16(), replay.status.as_u16()), (201, 201));
    assert!(!first.headers.contains_key(&IDEMPOTENCY_TTL));
    assert!(!replay.headers.contains_key(&IDEMPOTENCY_TTL));

    let (asked, _) = labels_over(store, Some(IDEMPOTENCY_TTL));
    let replay = send_to(&asked, operation("l-1", "parcel-1")).await;
    assert_eq!(replay.headers[&IDEMPOTENCY_TTL], "60");
}

/// The label contract's layer over `store`, its window header as `header` says when given.
fn labels_over(
    store: MemoryStore,
    header: Option<HeaderName>,
) -> (
    tower_idempotency::layer::Idempotency<Inner, MemoryStore, LabelContract>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let layer = IdempotencyLayer::new(store, LabelContract).global_keys();
    let layer = match header {
        Some(name) => layer.window_header(Some(name)),
        None => layer,
    };
    let creates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let create = timed_create(Journal::new(), Arc::clone(&creates));
    (layer.layer(create), creates)
}

/// `Repeatability-First-Sent` the given time ago, an HTTP date.
fn first_sent(ago: Duration) -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now() - ago)
}

/// With `refuse_past_window`, a retry whose first attempt is older than the store's window is
/// refused as expired before its claim, even where the store kept nothing: `409`, its own
/// problem type, no `Retry-After`, nothing created. A recent first attempt, none said, or one
/// that is not a date, is claimed as any other; without the option nothing is refused.
#[tokio::test]
async fn a_retry_whose_first_attempt_is_past_the_window_is_refused_as_expired() {
    let creates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(retaining(Duration::from_secs(60)), payment_operation())
        .global_keys()
        .refuse_past_window(true);
    let service = layer.layer(payment_create(Arc::clone(&creates), Duration::ZERO));
    let retry = |key: &str, sent: Option<String>| {
        let mut request = json_request("POST", "/payments", Some(key), BODY);
        if let Some(sent) = sent {
            let headers = request.headers_mut();
            headers.insert("repeatability-first-sent", sent.parse().unwrap());
        }
        request
    };
    let old = send(
        &service,
        retry("e-1", Some(first_sent(Duration::from_secs(120)))),
    )
    .await;
    assert_eq!(old.status, 409, "{:?}", old.body);
    assert_eq!(
        old.outcome,
        Some(tower_idempotency::reply::Outcome::Expired)
    );
    let problem: serde_json::Value = serde_json::from_slice(&old.body).unwrap();
    assert_eq!(
        problem["type"],
        "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#key_expired"
    );
    assert_eq!(problem["status"], 409);
    assert!(!old.headers.contains_key("retry-after"), "final");
    assert_eq!(old.headers[&IDEMPOTENCY_TTL], "60");
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 0);

    for (key, sent) in [
        ("e-2", Some(first_sent(Duration::from_secs(5)))),
        // Within the window, though the second an HTTP date cuts off may put it past.
        ("e-6", Some(first_sent(Duration::from_millis(59_500)))),
        ("e-3", None),
        ("e-4", Some("yesterday".to_owned())),
    ] {
        let reply = send(&service, retry(key, sent)).await;
        assert_eq!(reply.status, 201, "{key}: {:?}", reply.body);
    }
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 4);

    // A key whose record the store still keeps replays, however old its first attempt says
    // it is: only a retry that would create is refused.
    let first = send(&service, retry("e-7", None)).await;
    assert_eq!(first.status, 201);
    let late = send(
        &service,
        retry("e-7", Some(first_sent(Duration::from_secs(120)))),
    )
    .await;
    assert_eq!(
        (late.status, late.outcome),
        (
            first.status,
            Some(tower_idempotency::reply::Outcome::Replay)
        )
    );
    // The refused key was released: a request without the old date creates.
    let fresh = send(&service, retry("e-1", None)).await;
    assert_eq!(fresh.status, 201);

    let (lenient, created) = payments(retaining(Duration::from_secs(60)), Duration::ZERO);
    let reply = send(
        &lenient,
        retry("e-5", Some(first_sent(Duration::from_secs(120)))),
    )
    .await;
    assert_eq!(reply.status, 201);
    assert_eq!(created.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A store with a replay window of `retention` and a tombstone window of `tombstones`.
fn remembering(retention: Duration, tombstones: Duration) -> MemoryStore {
    MemoryStore::builder()
        .retention(retention)
        .tombstones(tombstones)
        .build()
}

/// Past its replay window, within its tombstone's, a key the store remembers is refused as
/// expired: `409`, its own problem type, the create's `Location` and completion time as
/// members, no `Retry-After`, nothing created; another body is `422` as before; a new key
/// still creates; past the tombstone window the key creates anew.
#[tokio::test]
async fn a_key_past_its_window_is_refused_as_expired_until_its_tombstone_ends() {
    let (retention, tombstones) = (Duration::from_millis(300), Duration::from_secs(2));
    let (service, creates) = payments(remembering(retention, tombstones), Duration::ZERO);
    let started = std::time::Instant::now();
    let before = std::time::SystemTime::now();
    let first = send(
        &service,
        json_request("POST", "/payments", Some("t-1"), BODY),
    )
    .await;
    assert_eq!(first.status, 201);
    let location = first.headers["location"].to_str().unwrap().to_owned();
    tokio::time::sleep_until((started + retention + Duration::from_millis(50)).into()).await;

    let late = send(
        &service,
        json_request("POST", "/payments", Some("t-1"), BODY),
    )
    .await;
    assert_eq!(late.status, 409, "{:?}", late.body);
    assert_eq!(
        late.outcome,
        Some(tower_idempotency::reply::Outcome::Expired)
    );
    assert_eq!(late.headers["content-type"], "application/problem+json");
    assert!(!late.headers.contains_key("retry-after"), "final");
    let problem: serde_json::Value = serde_json::from_slice(&late.body).unwrap();
    assert_eq!(
        problem["type"],
        "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#key_expired"
    );
    assert_eq!(problem["status"], 409);
    assert_eq!(problem["location"], location.as_str());
    let completed = httpdate::parse_http_date(problem["completed_at"].as_str().unwrap()).unwrap();
    let second = Duration::from_secs(1);
    assert!(
        completed + second >= before && completed <= std::time::SystemTime::now(),
        "{problem}"
    );
    let other = send(
        &service,
        json_request("POST", "/payments", Some("t-1"), OTHER),
    )
    .await;
    assert_eq!(other.status, 422, "{:?}", other.body);
    let fresh = send(
        &service,
        json_request("POST", "/payments", Some("t-2"), BODY),
    )
    .await;
    assert_eq!(fresh.status, 201);
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 2);

    tokio::time::sleep_until((started + retention + tombstones + Duration::from_millis(50)).into())
        .await;
    let anew = send(
        &service,
        json_request("POST", "/payments", Some("t-1"), BODY),
    )
    .await;
    assert_eq!(anew.status, 201, "past the tombstone: created anew");
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// The label contract knows no expired key: past its window a key it remembers is created
/// anew, its bytes as ever; asked, the layer answers `{"error":"key_expired"}` instead.
#[tokio::test]
async fn the_label_contract_creates_past_the_window_unless_asked_to_answer_expired() {
    let retention = Duration::from_millis(200);
    let store = remembering(retention, Duration::from_secs(60));
    let (service, creates) = labels_over(store.clone(), None);
    let started = std::time::Instant::now();
    for key in ["l-1", "l-2"] {
        let first = send_to(&service, operation(key, "parcel-1")).await;
        assert_eq!(first.status, 201);
    }
    tokio::time::sleep_until((started + retention + Duration::from_millis(50)).into()).await;
    let again = send_to(&service, operation("l-1", "parcel-1")).await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 3);

    let layer = IdempotencyLayer::new(store, LabelContract)
        .global_keys()
        .answer_expired(true);
    let asked = layer.layer(timed_create(Journal::new(), Arc::clone(&creates)));
    let refused = send_to(&asked, operation("l-2", "parcel-1")).await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.body, r#"{"error":"key_expired"}"#);
    assert!(!refused.headers.contains_key("retry-after"));
    assert_eq!(creates.load(std::sync::atomic::Ordering::SeqCst), 3);
}
