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
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Service as _, ServiceBuilder, ServiceExt};
use tower_idempotency::admission::Refusal;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::reply::Outcome;
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

pub(crate) const BODY: &str = r#"{"amount":1250,"currency":"EUR"}"#;
pub(crate) const CREATED: &str = r#"{"payment_id":"pay_1","amount":1250,"currency":"EUR"}"#;

type Layer =
    IdempotencyLayer<RecordingStore, JsonOperation<NewPayment>, ScriptedAdmission, GlobalKeys>;
type Service = tower_idempotency::layer::Idempotency<
    Inner,
    RecordingStore,
    JsonOperation<NewPayment>,
    ScriptedAdmission,
>;

/// The typed payment operation over a recording store and a scripted admission: the service,
/// the journal, the store, the admission and the create count.
pub(crate) fn rig(
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

pub(crate) fn post(key: Option<&str>, body: &str) -> Request<Chunks> {
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
        &layer.other_paths(tower_idempotency::layer::OtherPaths::PassThrough),
        payment_create(Arc::clone(&creates), Duration::ZERO),
    );
    let passed = send(&service, json_request("POST", "/other", None, "not json")).await;
    assert_eq!((passed.status.as_u16(), passed.outcome), (201, None));
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

/// The failed-create story, every case: for each `StoredResponses` setting, a create that
/// returns an error, one that answers `500`, and one that panics. The client's first answer,
/// and what a retry with the key gets: the key stays taken (`409`) after an error or a panic
/// under either setting; a `5xx` answer is stored and replayed under `Every`, and under
/// `Successful` passed on unstored with the key released, so the retry creates anew.
#[tokio::test]
async fn a_failed_create_under_every_setting_error_answer_and_panic() {
    use tower_idempotency::layer::StoredResponses;
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
        (
            StoredResponses::ExceptServerErrors,
            "/error",
            500,
            Outcome::CreateFailed,
            409,
            Outcome::Pending,
            1,
        ),
        (
            StoredResponses::ExceptServerErrors,
            "/answer",
            500,
            Outcome::Unstored,
            500,
            Outcome::Unstored,
            2,
        ),
        (
            StoredResponses::ExceptServerErrors,
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
