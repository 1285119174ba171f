//! The generic operations: `JsonOperation` (draft-ietf-httpapi-idempotency-key-header, RFC 8785
//! fingerprints, RFC 9457 replies) and `RawOperation`, at the level of the contract tests.

use crate::common;

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use common::payments::*;
use common::*;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Service as _, ServiceBuilder, ServiceExt};
use tower_idempotency::admission::Refusal;
use tower_idempotency::body::RequestBody;
use tower_idempotency::operation::IdempotencyKey;
use tower_idempotency::reply::Invalid;
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::{
    IdempotencyLayer, JsonOperation, MemoryStore, Outcome, RawOperation, StoredResponses,
};

const BODY: &str = r#"{"amount":1250,"currency":"EUR"}"#;
const CREATED: &str = r#"{"payment_id":"pay_1","amount":1250,"currency":"EUR"}"#;

type Layer =
    IdempotencyLayer<RecordingStore, JsonOperation<NewPayment>, ScriptedAdmission, GlobalKeys>;
type Service = tower_idempotency::Idempotency<
    Inner,
    RecordingStore,
    JsonOperation<NewPayment>,
    ScriptedAdmission,
>;

/// The typed payment operation over a recording store and a scripted admission: the service,
/// the journal, the store, the admission and the create count.
fn rig(
    configure: impl FnOnce(Layer) -> Layer,
) -> (
    Service,
    Journal,
    RecordingStore,
    ScriptedAdmission,
    Arc<AtomicUsize>,
) {
    let journal = Journal::new();
    let store = RecordingStore::new(MemoryStore::new(), journal.clone());
    let admission = ScriptedAdmission::new(journal.clone());
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = configure(
        IdempotencyLayer::new(store.clone(), payment_operation())
            .admission(admission.clone())
            .global_keys(),
    );
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    (service, journal, store, admission, creates)
}

fn post(key: Option<&str>, body: &str) -> Request<Chunks> {
    json_request("POST", "/payments", key, body)
}

#[tokio::test]
async fn a_new_payment_is_created_then_replayed_byte_for_byte() {
    let (service, journal, ..) = rig(|l| l);
    let created = send(&service, post(Some("pay-1"), BODY)).await;
    assert_eq!(created.status, 201);
    assert_eq!(created.body, CREATED);
    assert_eq!(created.values("location"), ["/payments/pay_1"]);
    assert_eq!(created.outcome, Some(Outcome::Created));
    assert_eq!(journal.take(), ["claim", "admit", "complete"]);
    let replay = send(&service, post(Some("pay-1"), BODY)).await;
    assert_eq!(
        (replay.status, &replay.body),
        (created.status, &created.body)
    );
    assert_eq!(replay.headers, created.headers);
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    assert_eq!(journal.take(), ["claim"]);
}

#[tokio::test]
async fn every_refusal_before_the_claim_is_its_problem_and_touches_nothing() {
    let (service, journal, _, _, creates) = rig(|l| l.body_limit(64));
    let long_key = "k".repeat(256);
    let cases: Vec<(Request<Chunks>, u16, &str, Option<&str>)> = vec![
        (
            request("POST", "/payments", Some("k"), None, BODY),
            415,
            "unsupported_media_type",
            None,
        ),
        (
            request("POST", "/payments", Some("k"), Some("text/plain"), BODY),
            415,
            "unsupported_media_type",
            None,
        ),
        (post(None, BODY), 400, "invalid_idempotency_key", None),
        (post(Some(""), BODY), 400, "invalid_idempotency_key", None),
        (
            post(Some("\"\""), BODY),
            400,
            "invalid_idempotency_key",
            None,
        ),
        (
            post(Some(&long_key), BODY),
            400,
            "invalid_idempotency_key",
            None,
        ),
        (
            post(Some("a b"), BODY),
            400,
            "invalid_idempotency_key",
            None,
        ),
        (
            post(Some("\"unterminated"), BODY),
            400,
            "invalid_idempotency_key",
            None,
        ),
        (
            post(
                Some("k"),
                &format!(
                    r#"{{"amount":1,"currency":"EUR","reference":"{}"}}"#,
                    "x".repeat(64)
                ),
            ),
            413,
            "payload_too_large",
            None,
        ),
        (
            post(Some("k"), r#"{"amount":1,"#),
            400,
            "invalid_request",
            Some("the body is not one JSON value"),
        ),
        (
            post(Some("k"), r#"{"amount":1,"amount":2,"currency":"EUR"}"#),
            400,
            "invalid_request",
            Some("an object has a member name twice"),
        ),
        (
            post(Some("k"), r#"{"amount":"1","currency":"EUR"}"#),
            400,
            "invalid_request",
            Some(r#"/amount: invalid type: string "1", expected u64"#),
        ),
        (
            post(Some("k"), r#"{"currency":"EUR"}"#),
            400,
            "invalid_request",
            Some("/amount: missing field `amount`"),
        ),
        (
            post(Some("k"), r#"{"amount":0,"currency":"EUR"}"#),
            400,
            "invalid_request",
            Some("/amount: must be at least 1"),
        ),
        (
            post(Some("k"), r#"{"amount":1,"currency":"eur"}"#),
            400,
            "invalid_request",
            Some("currency must be three uppercase letters"),
        ),
    ];
    for (request, status, case, detail) in cases {
        let reply = send(&service, request).await;
        reply.problem(status, case, detail);
        assert_eq!(reply.outcome, Some(Outcome::Rejected(reply.status)));
    }
    let mut two_keys = post(Some("a"), BODY);
    two_keys
        .headers_mut()
        .append("idempotency-key", "a".parse().unwrap());
    send(&service, two_keys)
        .await
        .problem(400, "invalid_idempotency_key", None);
    let mut declared = post(Some("k"), BODY);
    declared
        .headers_mut()
        .insert("content-length", "65".parse().unwrap());
    send(&service, declared)
        .await
        .problem(413, "payload_too_large", None);
    assert_eq!(
        journal.take(),
        Vec::<&str>::new(),
        "nothing reached the store"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn conflict_pending_admission_and_store_failures_are_problems() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let journal = Journal::new();
    let store = RecordingStore::new(MemoryStore::new(), journal.clone());
    let admission = ScriptedAdmission::new(journal.clone());
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .admission(admission.clone())
        .global_keys();
    let held = {
        let gate = Arc::clone(&gate);
        Inner::new(tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
            let gate = Arc::clone(&gate);
            async move {
                gate.notified().await;
                Ok::<_, CreateError>(created_response())
            }
        }))
    };
    let service = tower::Layer::layer(&layer, held);
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post(Some("p"), BODY)).await }
    });
    wait_for(|| store.inner().is_pending("POST /payments p")).await;
    send(&service, post(Some("p"), BODY)).await.problem(
        409,
        "request_pending",
        Some("The first request with this key has not completed; retry later."),
    );
    send(
        &service,
        post(Some("p"), r#"{"amount":1,"currency":"EUR"}"#),
    )
    .await
    .problem(
        422,
        "idempotency_conflict",
        Some("The key was used for a different request payload."),
    );
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, 201);

    for (refusal, status) in [
        (Refusal::TooManyRequests, 429),
        (Refusal::ServiceUnavailable, 503),
    ] {
        admission.refuse(Some(refusal));
        journal.take();
        let reply = send(&service, post(Some("q"), BODY)).await;
        reply
            .problem(status, "not_admitted", None)
            .header("retry-after", &["2"]);
        assert_eq!(
            reply.outcome,
            Some(Outcome::NotAdmitted(StatusCode::from_u16(status).unwrap()))
        );
        assert_eq!(journal.take(), ["claim", "admit", "release"]);
    }
    admission.refuse(None);
    store.fail("claim");
    let reply = send(&service, post(Some("q"), BODY)).await;
    reply
        .problem(503, "store_unavailable", None)
        .header("retry-after", &["2"]);
    assert_eq!(reply.outcome, Some(Outcome::StoreUnavailable));
}

#[tokio::test]
async fn a_failed_create_is_a_500_problem_and_the_key_stays_taken() {
    let failing = Inner::new(tower::service_fn(|_: Request<RequestBody<Chunks>>| async {
        Err::<Response<Full<Bytes>>, _>(CreateError("down"))
    }));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation()).global_keys();
    let service = tower::Layer::layer(&layer, failing);
    send(&service, post(Some("f"), BODY))
        .await
        .problem(500, "create_failed", None);
    send(&service, post(Some("f"), BODY))
        .await
        .problem(409, "request_pending", None);
}

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

/// Re-serialisations of one payload are one operation; any change of a value is another.
#[tokio::test]
async fn the_fingerprint_is_the_canonical_json_of_the_body() {
    let (service, creates) = guarded(JsonOperation::new());
    let first = r#"{"a":1,"b":{"x":[1,2,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21}"#;
    let same = [
        // Member order, at every depth.
        r#"{"f":1e21,"e":0.5,"d":true,"c":"A/B","b":{"y":null,"x":[1,2,{"k":"é"}]},"a":1}"#,
        // Whitespace.
        " {\n\t\"a\" : 1 , \"b\" : { \"x\" : [ 1 , 2 , { \"k\" : \"é\" } ] , \"y\" : null } ,\r\n \"c\":\"A/B\",\"d\":true,\"e\":0.5,\"f\":1e21 } ",
        // Escapes of the same characters.
        r#"{"\u0061":1,"b":{"x":[1,2,{"k":"\u00e9"}],"y":null},"c":"\u0041\/B","d":true,"e":0.5,"f":1e21}"#,
        // Numbers spelled otherwise (RFC 8785: as the same double).
        r#"{"a":1.0,"b":{"x":[1e0,20E-1,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":5e-1,"f":1000000000000000000000}"#,
    ];
    let key = "canonical";
    let created = send(&service, json_request("POST", "/any", Some(key), first)).await;
    assert_eq!(created.status, 201);
    for body in same {
        let reply = send(&service, json_request("POST", "/any", Some(key), body)).await;
        assert_eq!(reply.outcome, Some(Outcome::Replay), "{body}");
        assert_eq!(reply.body, created.body);
    }
    let different = [
        // A value.
        r#"{"a":2,"b":{"x":[1,2,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21}"#,
        // Array order.
        r#"{"a":1,"b":{"x":[2,1,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21}"#,
        // A type: the string "1" is not the number 1.
        r#"{"a":"1","b":{"x":[1,2,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21}"#,
        // A member more.
        r#"{"a":1,"b":{"x":[1,2,{"k":"é"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21,"g":null}"#,
        // Another non-ASCII character (e with a combining accent is not é).
        r#"{"a":1,"b":{"x":[1,2,{"k":"e\u0301"}],"y":null},"c":"A/B","d":true,"e":0.5,"f":1e21}"#,
    ];
    for body in different {
        send(&service, json_request("POST", "/any", Some(key), body))
            .await
            .problem(422, "idempotency_conflict", None);
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn quoted_and_bare_keys_name_one_operation_within_the_length_bounds() {
    let (service, _, _, _, creates) = rig(|l| l);
    assert_eq!(
        send(&service, post(Some("abc"), BODY)).await.outcome,
        Some(Outcome::Created)
    );
    assert_eq!(
        send(&service, post(Some("\"abc\""), BODY)).await.outcome,
        Some(Outcome::Replay)
    );
    let longest = "k".repeat(255);
    assert_eq!(send(&service, post(Some(&longest), BODY)).await.status, 201);
    let quoted = format!("\"{longest}\"");
    assert_eq!(
        send(&service, post(Some(&quoted), BODY)).await.outcome,
        Some(Outcome::Replay)
    );
    send(&service, post(Some(&format!("{longest}k")), BODY))
        .await
        .problem(400, "invalid_idempotency_key", None);
    assert_eq!(
        send(&service, post(Some(r#""a\"b""#), BODY)).await.status,
        201
    );
    assert_eq!(
        send(&service, post(Some(r#"a"b"#), BODY)).await.outcome,
        Some(Outcome::Replay)
    );
    assert_eq!(creates.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_key_space_holds_the_method_and_the_concrete_path_and_the_fingerprint_the_query() {
    let operation = JsonOperation::new().methods([Method::POST, Method::PATCH]);
    let (service, creates) = guarded(operation);
    let refund = r#"{"amount":5}"#;
    let a = send(
        &service,
        json_request("POST", "/payments/a/refunds", Some("r1"), refund),
    )
    .await;
    let b = send(
        &service,
        json_request("POST", "/payments/b/refunds", Some("r1"), refund),
    )
    .await;
    assert_eq!(
        (a.outcome, b.outcome),
        (Some(Outcome::Created), Some(Outcome::Created))
    );
    assert_ne!(a.body, b.body);
    let patch = send(
        &service,
        json_request("PATCH", "/payments/a/refunds", Some("r1"), refund),
    )
    .await;
    assert_eq!(
        patch.outcome,
        Some(Outcome::Created),
        "another method, another operation"
    );
    send(
        &service,
        json_request("POST", "/payments/a/refunds?dry_run=1", Some("r1"), refund),
    )
    .await
    .problem(422, "idempotency_conflict", None);
    // A method not guarded passes through untouched, key or not.
    let get = send(
        &service,
        request("GET", "/payments/a/refunds", None, None, ""),
    )
    .await;
    assert_eq!((get.status.as_u16(), get.outcome), (201, None));
    assert_eq!(creates.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_path_restricts_the_layer_and_other_paths_get_a_404_problem_or_pass() {
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .global_keys()
        .path("/payments");
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    send(&service, json_request("POST", "/other", Some("k"), BODY))
        .await
        .problem(404, "not_found", None);
    let service = tower::Layer::layer(
        &layer.other_paths(tower_idempotency::OtherPaths::PassThrough),
        payment_create(Arc::clone(&creates), Duration::ZERO),
    );
    let passed = send(&service, json_request("POST", "/other", None, "not json")).await;
    assert_eq!((passed.status.as_u16(), passed.outcome), (201, None));
}

#[tokio::test]
async fn key_member_and_fingerprint_selections() {
    let operation = JsonOperation::new()
        .key_member("/request_id")
        .unwrap()
        .fingerprint_except(["/sent_at", "/meta/trace"])
        .unwrap();
    let (service, creates) = guarded(operation);
    let send_at = |at: &'static str, key: &'static str| {
        json_request(
            "POST",
            "/orders",
            Some(key),
            Box::leak(
                format!(
                    r#"{{"request_id":"o-1","sku":"A","sent_at":"{at}","meta":{{"trace":"{at}"}}}}"#
                )
                .into_boxed_str(),
            ),
        )
    };
    assert_eq!(
        send(&service, send_at("10:00", "o-1")).await.outcome,
        Some(Outcome::Created)
    );
    assert_eq!(
        send(&service, send_at("10:05", "o-1")).await.outcome,
        Some(Outcome::Replay)
    );
    send(&service, send_at("10:00", "o-2")).await.problem(
        400,
        "invalid_request",
        Some("/request_id: must be a string equal to the Idempotency-Key"),
    );

    let operation = JsonOperation::new()
        .fingerprint_only(["/amount", "/currency"])
        .unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let body = |note: &str, amount: u32| {
        format!(r#"{{"amount":{amount},"currency":"EUR","note":"{note}"}}"#)
    };
    assert_eq!(
        outcome(
            &service,
            json_request("POST", "/p", Some("k"), &body("a", 1))
        )
        .await,
        Some(Outcome::Created)
    );
    assert_eq!(
        outcome(
            &service,
            json_request("POST", "/p", Some("k"), &body("b", 1))
        )
        .await,
        Some(Outcome::Replay)
    );
    send(
        &service,
        json_request("POST", "/p", Some("k"), &body("a", 2)),
    )
    .await
    .problem(422, "idempotency_conflict", None);
    send(
        &service,
        json_request("POST", "/p", Some("k"), r#"{"currency":"EUR"}"#),
    )
    .await
    .problem(422, "idempotency_conflict", None);
}

/// A key carried in the body, as AdCP, MCP tool calls and AIP-155 carry it: the member is the
/// key, validated as a header's is; a header sent too must be valid and agree; the key space
/// and the fingerprint are as with the header.
#[tokio::test]
async fn a_key_taken_from_a_body_member() {
    let operation = JsonOperation::new().key_from("/idempotency_key").unwrap();
    let (service, creates) = guarded(operation);
    let buy =
        |key: &str, budget: u32| format!(r#"{{"idempotency_key":"{key}","budget":{budget}}}"#);
    let post =
        |path: &str, header: Option<&str>, body: &str| json_request("POST", path, header, body);
    let member = Some(
        "/idempotency_key: must be a string of 1 to 255 visible ASCII characters: the idempotency key",
    );
    assert_eq!(
        send(&service, post("/buys", None, &buy("buy-7", 500)))
            .await
            .outcome,
        Some(Outcome::Created)
    );
    assert_eq!(
        send(&service, post("/buys", None, &buy("buy-7", 500)))
            .await
            .outcome,
        Some(Outcome::Replay)
    );
    // The header may come too, and then agrees.
    assert_eq!(
        send(&service, post("/buys", Some("buy-7"), &buy("buy-7", 500)))
            .await
            .outcome,
        Some(Outcome::Replay)
    );
    send(&service, post("/buys", Some("buy-8"), &buy("buy-7", 500)))
        .await
        .problem(
            400,
            "invalid_request",
            Some("/idempotency_key: must equal the Idempotency-Key header, when sent"),
        );
    send(&service, post("/buys", Some("a b"), &buy("buy-7", 500)))
        .await
        .problem(400, "invalid_idempotency_key", None);
    // Another body under the key conflicts; another path is another operation.
    send(&service, post("/buys", None, &buy("buy-7", 600)))
        .await
        .problem(422, "idempotency_conflict", None);
    assert_eq!(
        send(&service, post("/other", None, &buy("buy-7", 500)))
            .await
            .outcome,
        Some(Outcome::Created)
    );
    // The member is required, and is a key.
    let long = "k".repeat(256);
    for body in [
        r#"{"budget":500}"#.to_owned(),
        r#"{"idempotency_key":7,"budget":500}"#.to_owned(),
        buy("", 500),
        buy("a b", 500),
        buy(&long, 500),
    ] {
        send(&service, post("/buys", Some("buy-7"), &body))
            .await
            .problem(400, "invalid_request", member);
    }
    assert_eq!(
        send(&service, post("/buys", None, &buy(&long[..255], 500)))
            .await
            .outcome,
        Some(Outcome::Created),
        "255 characters is a key"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 3);
    // The last of key_member and key_from decides.
    let (service, _) = guarded(
        JsonOperation::new()
            .key_from("/idempotency_key")
            .unwrap()
            .key_member("/idempotency_key")
            .unwrap(),
    );
    send(&service, post("/buys", None, &buy("buy-7", 500)))
        .await
        .problem(400, "invalid_idempotency_key", None);
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

// A layer without a key space does not compile: the `compile_fail` example on
// `IdempotencyLayer` holds it.

#[tokio::test]
async fn a_scope_gives_each_tenant_its_key_space_and_a_missing_one_is_a_403_problem() {
    let creates = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(store.clone(), payment_operation()).scope(
        |parts: &http::request::Parts| {
            parts
                .headers
                .get("x-tenant")?
                .to_str()
                .ok()
                .map(str::to_owned)
        },
    );
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let as_tenant = |tenant: &str| {
        let mut request = post(Some("same"), BODY);
        request
            .headers_mut()
            .insert("x-tenant", tenant.parse().unwrap());
        request
    };
    let acme = send(&service, as_tenant("acme")).await;
    let globex = send(&service, as_tenant("globex")).await;
    assert_eq!(
        (acme.outcome, globex.outcome),
        (Some(Outcome::Created), Some(Outcome::Created))
    );
    assert!(
        store
            .completed(&tower_idempotency::scope::store_key(
                Some("acme"),
                &Method::POST,
                "/payments",
                "same"
            ))
            .is_some()
    );
    send(&service, post(Some("same"), BODY))
        .await
        .problem(403, "scope_required", None);
    assert_eq!(creates.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_identical_generic_requests_create_once() {
    generic_mode_creates_once(MemoryStore::new(), 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_create_gets_it_completed() {
    generic_mode_survives_a_disconnect(MemoryStore::new()).await;
}

/// `poll_ready` is the inner service's: a concurrency limit inside pushes back on the caller
/// until the create in flight is done.
#[tokio::test]
async fn readiness_is_the_inner_services() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let create = {
        let gate = Arc::clone(&gate);
        tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
            let gate = Arc::clone(&gate);
            async move {
                let _pass = gate.acquire().await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
            }
        })
    };
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new(), payment_operation()).global_keys())
        .concurrency_limit(1)
        .service(create);
    let first = service.ready().await.unwrap().call(post(Some("one"), BODY));
    let first = tokio::spawn(first);
    tokio::task::yield_now().await;
    let readiness = poll_fn(|cx| Poll::Ready(service.poll_ready(cx).is_ready())).await;
    assert!(!readiness, "the inner limit is taken: not ready");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    tokio::time::timeout(Duration::from_secs(1), service.ready())
        .await
        .expect("ready once the create is done")
        .unwrap();
}

#[tokio::test]
async fn a_typed_axum_handler_gets_the_value_and_the_body() {
    use axum::routing::post as axum_post;
    use axum::{Extension, Json, Router};
    async fn create(
        Extension(parsed): Extension<NewPayment>,
        Json(body): Json<NewPayment>,
    ) -> (StatusCode, String) {
        assert_eq!(parsed, body, "parsed once by the layer, the body unchanged");
        (
            StatusCode::CREATED,
            format!("{}{}", body.amount, body.currency),
        )
    }
    let app: Router = Router::new()
        .route("/payments", axum_post(create).get(|| async { "list" }))
        .route_layer(IdempotencyLayer::new(MemoryStore::new(), payment_operation()).global_keys());
    let request = Request::post("/payments")
        .header("content-type", "application/json")
        .header("idempotency-key", "ax-1")
        .body(axum::body::Body::from(BODY))
        .unwrap();
    let reply = Reply::read_any(app.clone().oneshot(request).await.unwrap()).await;
    assert_eq!(
        (reply.status.as_u16(), &reply.body[..]),
        (201, &b"1250EUR"[..])
    );
    let list = Reply::read_any(
        app.oneshot(
            Request::get("/payments")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (list.status.as_u16(), &list.body[..], list.outcome),
        (200, &b"list"[..], None)
    );
}

#[tokio::test]
async fn a_raw_operation_fingerprints_the_exact_bytes_and_content_type() {
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let create = {
        let keys = Arc::clone(&keys);
        Inner::new(tower::service_fn(
            move |request: Request<RequestBody<Chunks>>| {
                keys.lock()
                    .unwrap()
                    .push(request.extensions().get::<IdempotencyKey>().cloned());
                async {
                    Ok::<_, CreateError>(
                        Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap(),
                    )
                }
            },
        ))
    };
    let operation =
        RawOperation::new().media_types(["application/x-www-form-urlencoded", "text/plain"]);
    // A raw operation's value is its key, handed over when asked for.
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation)
        .global_keys()
        .value_extension(true);
    let service = tower::Layer::layer(&layer, create);
    let form = |key: &str, content_type: &str, body: &'static str| {
        request("POST", "/upload", Some(key), Some(content_type), body)
    };
    assert_eq!(
        outcome(
            &service,
            form("\"f\"", "application/x-www-form-urlencoded", "a=1&b=2")
        )
        .await,
        Some(Outcome::Created)
    );
    assert_eq!(
        outcome(
            &service,
            form("f", "application/x-www-form-urlencoded", "a=1&b=2")
        )
        .await,
        Some(Outcome::Replay)
    );
    send(
        &service,
        form("f", "application/x-www-form-urlencoded", "b=2&a=1"),
    )
    .await
    .problem(422, "idempotency_conflict", None);
    send(&service, form("f", "text/plain", "a=1&b=2"))
        .await
        .problem(422, "idempotency_conflict", None);
    send(&service, form("f", "application/json", "a=1&b=2"))
        .await
        .problem(415, "unsupported_media_type", None);
    send(
        &service,
        request("POST", "/upload", None, Some("text/plain"), "x"),
    )
    .await
    .problem(400, "invalid_idempotency_key", None);
    assert_eq!(
        keys.lock().unwrap().as_slice(),
        [Some(IdempotencyKey::parse(&"f".parse().unwrap()).unwrap())]
    );
}

/// Found in review: two integers past 2^53 share a double, so they would share RFC 8785's
/// canonical form while a `u64` body reads two amounts; the media type changes what a body
/// means.
#[tokio::test]
async fn integers_past_two_to_the_53_keep_their_digits_and_the_media_type_is_fingerprinted() {
    let (service, ..) = rig(|l| l);
    let big = r#"{"amount":9007199254740993,"currency":"EUR"}"#;
    assert_eq!(send(&service, post(Some("big"), big)).await.status, 201);
    let near = r#"{"amount":9007199254740992,"currency":"EUR"}"#;
    send(&service, post(Some("big"), near))
        .await
        .problem(422, "idempotency_conflict", None);

    let operation = JsonOperation::new().methods([Method::PATCH]);
    let (service, _) = guarded(operation);
    let patch = |content_type: &str| {
        request(
            "PATCH",
            "/orders/1",
            Some("p"),
            Some(content_type),
            r#"{"a":null}"#,
        )
    };
    let merge = send(&service, patch("application/merge-patch+json")).await;
    assert_eq!(merge.outcome, Some(Outcome::Created));
    let again = send(
        &service,
        patch("Application/Merge-Patch+JSON; charset=utf-8"),
    )
    .await;
    assert_eq!(again.outcome, Some(Outcome::Replay));
    send(&service, patch("application/json"))
        .await
        .problem(422, "idempotency_conflict", None);
}

#[tokio::test]
async fn a_raw_body_without_a_content_type_is_not_one_with_an_empty_one() {
    let layer = IdempotencyLayer::new(MemoryStore::new(), RawOperation::new()).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let none = send(&service, request("POST", "/u", Some("r"), None, "x")).await;
    assert_eq!(none.outcome, Some(Outcome::Created));
    send(&service, request("POST", "/u", Some("r"), Some(""), "x"))
        .await
        .problem(422, "idempotency_conflict", None);
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

#[tokio::test]
async fn a_raw_operation_guards_only_its_methods() {
    let (service, creates) = guarded(RawOperation::new().methods([Method::PUT]));
    let put = send(
        &service,
        request("PUT", "/files/1", Some("f"), Some("text/plain"), "x"),
    )
    .await;
    assert_eq!(put.outcome, Some(Outcome::Created));
    let again = send(
        &service,
        request("PUT", "/files/1", Some("f"), Some("text/plain"), "x"),
    )
    .await;
    assert_eq!(again.outcome, Some(Outcome::Replay));
    let post = send(&service, request("POST", "/files/1", None, None, "x")).await;
    assert_eq!(
        (post.status.as_u16(), post.outcome),
        (201, None),
        "passed through"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 2);
}

/// A body refused for its type or by the `validate` hook names the member by JSON pointer,
/// in the detail (without the parser's line and column) and in `errors`: a wrong type, a
/// missing member, an unknown one, one deep in an array, a value the hook refuses with a
/// pointer of its own, and the key member. A reason about no member has no `errors`.
#[tokio::test]
async fn refusals_name_the_member_by_json_pointer() {
    #[derive(Debug, Clone, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
        quantity: u32,
    }
    #[derive(Debug, Clone, serde::Deserialize)]
    #[allow(dead_code)]
    struct Order {
        request_id: String,
        lines: Vec<Line>,
        #[serde(rename = "ship/to~")]
        ship_to: String,
    }
    let operation = JsonOperation::<Order>::typed()
        .key_member("/request_id")
        .unwrap()
        .validate(|order| {
            if order.lines.is_empty() {
                return Err("an order needs a line".into());
            }
            match order.lines.iter().position(|line| line.quantity == 0) {
                Some(i) => Err(Invalid::at(
                    format!("/lines/{i}/quantity"),
                    "must be at least 1",
                )),
                None => Ok(()),
            }
        });
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let order = |body: &str| post(Some("o-1"), body);
    let line = r#"{"sku":"A","quantity":1}"#;
    let cases: [(String, &str, &str); 6] = [
        (
            format!(
                r#"{{"request_id":"o-1","lines":[{line},{{"sku":"B","quantity":"2"}}],"ship/to~":"x"}}"#
            ),
            "/lines/1/quantity",
            r#"invalid type: string "2", expected u32"#,
        ),
        (
            format!(r#"{{"request_id":"o-1","lines":[{line}]}}"#),
            "/ship~1to~0",
            "missing field `ship/to~`",
        ),
        (
            r#"{"request_id":"o-1","lines":[{"sku":"A","quantity":1,"gift":true}],"ship/to~":"x"}"#
                .to_owned(),
            "/lines/0/gift",
            "unknown field `gift`, expected `sku` or `quantity`",
        ),
        (
            r#"{"request_id":"o-1","lines":[{"quantity":1}],"ship/to~":"x"}"#.to_owned(),
            "/lines/0/sku",
            "missing field `sku`",
        ),
        (
            format!(
                r#"{{"request_id":"o-1","lines":[{line},{{"sku":"B","quantity":0}}],"ship/to~":"x"}}"#
            ),
            "/lines/1/quantity",
            "must be at least 1",
        ),
        (
            format!(r#"{{"request_id":"o-2","lines":[{line}],"ship/to~":"x"}}"#),
            "/request_id",
            "must be a string equal to the Idempotency-Key",
        ),
    ];
    for (body, pointer, detail) in cases {
        let reply = send(&service, order(&body)).await;
        reply.invalid_at(pointer, detail);
        assert!(
            !reply.body.windows(5).any(|w| w == b" line"),
            "no parser position: {:?}",
            reply.body
        );
    }
    send(
        &service,
        order(r#"{"request_id":"o-1","lines":[],"ship/to~":"x"}"#),
    )
    .await
    .invalid("an order needs a line");
    // About the body as a whole: no member to point at.
    send(&service, order(r#"["o-1"]"#))
        .await
        .invalid("invalid length 1, expected struct Order with 3 elements");
    assert_eq!(
        creates.load(Ordering::SeqCst),
        0,
        "nothing refused was created"
    );
}

/// An operation given a problem type base of its own answers every refusal under it, through
/// the layer: a refused key before the claim, a conflict after it.
#[tokio::test]
async fn a_problem_type_base_of_ones_own_reaches_the_client() {
    let operation = JsonOperation::new().problem_type_base("https://api.example.com/problems/");
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    let type_of = |reply: &Reply| {
        let problem: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        problem["type"].as_str().unwrap().to_owned()
    };
    let no_key = send(&service, post(None, BODY)).await;
    assert_eq!(no_key.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        type_of(&no_key),
        "https://api.example.com/problems/invalid_idempotency_key"
    );
    let created = send(&service, post(Some("k"), BODY)).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let other = send(
        &service,
        post(Some("k"), r#"{"amount":2,"currency":"EUR"}"#),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        type_of(&other),
        "https://api.example.com/problems/idempotency_conflict"
    );
}

/// The failed-create story, every case: for each `StoredResponses` setting, a create that
/// returns an error, one that answers `500`, and one that panics. The client's first answer,
/// and what a retry with the key gets: the key stays taken (`409`) after an error or a panic
/// under either setting; a `5xx` answer is stored and replayed under `Every`, and under
/// `Successful` passed on unstored with the key released, so the retry creates anew.
#[tokio::test]
async fn a_failed_create_under_every_setting_error_answer_and_panic() {
    use tower_idempotency::StoredResponses;
    let expected = [
        // (setting, path, first status, first outcome, retry status, retry outcome, creates)
        (
            StoredResponses::Every,
            "/error",
            500,
            Outcome::CreateFailed,
            409,
            Outcome::Pending,
            1,
        ),
        (
            StoredResponses::Every,
            "/answer",
            500,
            Outcome::Created,
            500,
            Outcome::Replay,
            1,
        ),
        (
            StoredResponses::Every,
            "/panic",
            500,
            Outcome::CreateFailed,
            409,
            Outcome::Pending,
            1,
        ),
        (
            StoredResponses::Successful,
            "/error",
            500,
            Outcome::CreateFailed,
            409,
            Outcome::Pending,
            1,
        ),
        (
            StoredResponses::Successful,
            "/answer",
            500,
            Outcome::Unstored,
            500,
            Outcome::Unstored,
            2,
        ),
        (
            StoredResponses::Successful,
            "/panic",
            500,
            Outcome::CreateFailed,
            409,
            Outcome::Pending,
            1,
        ),
    ];
    for (setting, path, status, outcome, retry_status, retry_outcome, creates) in expected {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let create = Inner::new(tower::service_fn(
            move |request: Request<RequestBody<Chunks>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                let path = request.uri().path().to_owned();
                async move {
                    match path.as_str() {
                        "/error" => Err(CreateError("the create failed")),
                        "/panic" => panic!("the create panics"),
                        _ => Ok(Response::builder()
                            .status(500)
                            .body(Full::new(Bytes::from_static(b"{\"oops\":1}")))
                            .unwrap()),
                    }
                }
            },
        ));
        let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
            .global_keys()
            .store_responses(setting);
        let service = tower::Layer::layer(&layer, create);
        let attempt = || json_request("POST", path, Some("k"), r#"{"a":1}"#);
        let case = format!("{setting:?} {path}");
        let first = send(&service, attempt()).await;
        assert_eq!(
            (first.status.as_u16(), first.outcome),
            (status, Some(outcome)),
            "{case}: first"
        );
        let retry = send(&service, attempt()).await;
        assert_eq!(
            (retry.status.as_u16(), retry.outcome),
            (retry_status, Some(retry_outcome)),
            "{case}: retry"
        );
        assert_eq!(calls.load(Ordering::SeqCst), creates, "{case}: creates");
    }
}

/// A text that is not a JSON pointer is an error where it is given, naming the text: for the
/// key member and for either fingerprint selection.
#[test]
fn a_bad_json_pointer_is_an_error_that_names_it() {
    let refusals = [
        JsonOperation::new().key_member("request_id").err(),
        JsonOperation::new()
            .fingerprint_only(["/amount", "amount"])
            .err(),
        JsonOperation::new().fingerprint_except(["/a~2"]).err(),
    ];
    let texts: Vec<_> = refusals
        .iter()
        .map(|refusal| refusal.as_ref().expect("refused").text().to_owned())
        .collect();
    assert_eq!(texts, ["request_id", "amount", "/a~2"]);
    assert_eq!(
        refusals[0].as_ref().unwrap().to_string(),
        r#""request_id" is not a JSON pointer (RFC 6901): write "/member""#
    );
    assert!(
        JsonOperation::new().key_member("").is_ok(),
        "the whole body"
    );
}

/// A shutdown strands no key: 20 creates of two seconds each are in flight when the drain
/// starts; each is answered by its create and completed, and a request arriving meanwhile is
/// refused before its claim with `Retry-After`.
#[tokio::test(start_paused = true)]
async fn a_drain_completes_every_create_in_flight_and_refuses_new_claims() {
    let drain = tower_idempotency::drain::Drain::new();
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .drain(&drain);
    let service = tower::Layer::layer(
        &layer,
        payment_create(Arc::clone(&creates), Duration::from_secs(2)),
    );
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let service = service.clone();
            tokio::spawn(async move { send(&service, post(Some(&format!("d{i}")), BODY)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(drain.in_flight(), 20);
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(30)).await }
    });
    drain.closed().await;
    let late = send(&service, post(Some("late"), BODY)).await;
    late.problem(503, "store_unavailable", None)
        .header("retry-after", &["2"]);
    assert_eq!(late.outcome, Some(Outcome::StoreUnavailable));
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, 201);
        assert_eq!(reply.outcome, Some(Outcome::Created));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 20);
    for i in 0..20 {
        let key =
            tower_idempotency::scope::store_key(None, &Method::POST, "/payments", &format!("d{i}"));
        assert!(!store.is_pending(&key), "{key} completed");
    }
    assert!(!store.is_pending(&tower_idempotency::scope::store_key(
        None,
        &Method::POST,
        "/payments",
        "late"
    )));
    assert_eq!(store.len(), 20, "the late request claimed nothing");
}

/// A complete whose answer was lost is settled by a task of its own: the drain waits for it,
/// so a shutdown does not end the process with the key pending.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_a_lost_complete_to_be_settled() {
    let drain = tower_idempotency::drain::Drain::new();
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone(), payment_operation())
        .global_keys()
        .drain(&drain);
    let service = tower::Layer::layer(&layer, payment_create(creates, Duration::ZERO));
    store.fail("complete");
    let reply = send(&service, post(Some("lost-complete"), BODY)).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    let key =
        tower_idempotency::scope::store_key(None, &Method::POST, "/payments", "lost-complete");
    assert!(store.inner().is_pending(&key));
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(60)).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!shutdown.is_finished(), "the settling is still trying");
    store.recover();
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    assert!(
        !store.inner().is_pending(&key),
        "settled before the shutdown ended"
    );
}

/// A request waiting for a first attempt stops waiting when the drain closes (it answers
/// pending at once), and never claims after the close.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_stops_waiting_when_the_drain_closes() {
    let drain = tower_idempotency::drain::Drain::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .global_keys()
        .pending_wait(Duration::from_secs(60))
        .drain(&drain);
    let service = tower::Layer::layer(
        &layer,
        payment_create(Arc::clone(&creates), Duration::from_secs(10)),
    );
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post(Some("w"), BODY)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = tokio::spawn({
        let service = service.clone();
        async move { send(&service, post(Some("w"), BODY)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "waits for the first attempt");
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.shutdown(Duration::from_secs(60)).await }
    });
    let waited = waiting.await.unwrap();
    waited.problem(409, "request_pending", None);
    assert!(
        !first.is_finished(),
        "answered before the first attempt ended"
    );
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(shutdown.await.unwrap(), Ok(()));
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// A pending key's `409` says when to come back (`Retry-After: 1` by default), and both that
/// value and the refusals' are the layer's settings.
#[tokio::test]
async fn retry_after_of_a_pending_key_and_of_the_refusals_are_settings() {
    let (service, _, store, _, _) = rig(|l| l);
    let gate_key = "pending-one";
    // A pending key: claimed through the store, never completed.
    let key = tower_idempotency::scope::store_key(None, &Method::POST, "/payments", gate_key);
    let fingerprint = {
        let op = payment_operation();
        let parts = post(Some(gate_key), BODY).into_parts().0;
        tower_idempotency::Operation::parse(&op, &parts, &Bytes::from_static(BODY.as_bytes()))
            .unwrap()
            .fingerprint
    };
    // The key pending in `store`: claimed through it, never completed.
    let pending = |store: RecordingStore| {
        let (key, fingerprint) = (key.clone(), fingerprint);
        async move {
            let claimed = tower_idempotency::Store::claim(store.inner(), &key, &fingerprint).await;
            assert!(matches!(
                claimed,
                Ok(tower_idempotency::store::Claim::New(_))
            ));
        }
    };
    pending(store).await;
    send(&service, post(Some(gate_key), BODY))
        .await
        .problem(409, "request_pending", None)
        .header("retry-after", &["1"]);

    let (service, _, store, admission, _) = rig(|l| {
        l.pending_retry_after(Duration::from_millis(2500))
            .retry_after(Duration::from_secs(7))
    });
    pending(store).await;
    send(&service, post(Some(gate_key), BODY))
        .await
        .problem(409, "request_pending", None)
        .header("retry-after", &["3"]);
    admission.refuse(Some(Refusal::TooManyRequests));
    send(&service, post(Some("refused"), BODY))
        .await
        .problem(429, "not_admitted", None)
        .header("retry-after", &["7"]);
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
    let drain = tower_idempotency::drain::Drain::new();
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
