//! Every line of the contract, through the layer, with the call journal of §6.

use crate::common;

use common::*;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::reply::Outcome;

// §6: admission refuses, then proceeds, then replays.

async fn refusal_then_success_then_replay(status: u16) {
    let rig = Rig::new();
    rig.admission.refuse(Some(refusal(status)));
    rig.send_expecting(valid(), &["claim", "admit", "release", "write"])
        .await
        .exact(status, r#"{"error":"not_admitted"}"#)
        .header("retry-after", &["2"]);
    assert_eq!(rig.creates(), 0, "a refusal creates nothing");
    assert!(rig.memory.is_empty(), "a refusal releases the key");

    rig.admission.refuse(None);
    rig.send_expecting(valid(), &["claim", "admit", "create", "complete", "write"])
        .await
        .is_created();
    assert_eq!(rig.creates(), 1);
    assert_eq!(rig.memory.len(), 1);
    assert!(
        rig.memory.completed(&key_of(KEY)).is_some(),
        "one completed record"
    );

    let replay = rig.send_expecting(valid(), &["claim", "write"]).await;
    replay.is_created();
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    assert_eq!(rig.creates(), 1, "replay creates nothing");
    assert!(rig.memory.completed(&key_of(KEY)).is_some());
}

#[tokio::test]
async fn refused_with_429_then_created_then_replayed() {
    refusal_then_success_then_replay(429).await;
}

#[tokio::test]
async fn refused_with_503_then_created_then_replayed() {
    refusal_then_success_then_replay(503).await;
}

#[tokio::test]
async fn complete_happens_before_the_reply_and_the_reply_cannot_change_the_store() {
    let rig = Rig::new();
    let mut first = rig.send(valid()).await;
    first.is_created();
    assert_eq!(first.outcome, Some(Outcome::Created));
    // Whatever the reply path does to what it writes...
    first.headers.clear();
    first.body = "tampered".into();
    // ...the store keeps its own copy.
    let stored = rig.memory.completed(&key_of(KEY)).unwrap();
    assert_eq!(stored.body(), CREATED_BODY.as_bytes());
    assert_eq!(stored.headers().get_all("etag").iter().count(), 2);
    rig.send(valid()).await.is_created();
}

// §2: validation, in its fixed order, touching nothing.

async fn refused(request: http::Request<Chunks>, status: u16, body: &str) -> Reply {
    let rig = Rig::new();
    let reply = rig.send_expecting(request, &["write"]).await;
    reply.exact(status, body);
    assert!(rig.memory.is_empty(), "a refusal never reaches the store");
    assert_eq!(rig.creates(), 0);
    reply
}

const NOT_FOUND: &str = r#"{"error":"not_found"}"#;
const METHOD: &str = r#"{"error":"method_not_allowed"}"#;
const MEDIA: &str = r#"{"error":"unsupported_media_type"}"#;
const TOO_LARGE: &str = r#"{"error":"payload_too_large"}"#;
const INVALID: &str = r#"{"error":"invalid_request"}"#;

#[tokio::test]
async fn step_1_wrong_path_is_404_whatever_else_is_wrong() {
    refused(
        request("GET", "/other", None, Some("text/plain"), "{{{"),
        404,
        NOT_FOUND,
    )
    .await;
    refused(
        request("POST", "/other", Some(KEY), Some("application/json"), BODY),
        404,
        NOT_FOUND,
    )
    .await;
    refused(
        request(
            "POST",
            "/labels/",
            Some(KEY),
            Some("application/json"),
            BODY,
        ),
        404,
        NOT_FOUND,
    )
    .await;
    refused(
        request("POST", "/Labels", Some(KEY), Some("application/json"), BODY),
        404,
        NOT_FOUND,
    )
    .await;
    let big = vec![b'x'; 10_000];
    refused(request("PUT", "/", None, None, big), 404, NOT_FOUND).await;
}

#[tokio::test]
async fn step_2_wrong_method_is_405_with_allow() {
    for method in ["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] {
        refused(
            request(method, "/labels", None, Some("text/plain"), "{{{"),
            405,
            METHOD,
        )
        .await
        .header("allow", &["POST"]);
    }
}

#[tokio::test]
async fn step_3_content_type_must_be_json() {
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/xml"),
        Some("application/json-seq"),
        Some("application/jsonx"),
        Some("json"),
        Some("application/json; charset"),
        Some("application/json; charset=\"utf-8"),
    ] {
        let big = vec![b'x'; 10_000];
        refused(
            request("POST", "/labels", None, content_type, big),
            415,
            MEDIA,
        )
        .await;
    }
}

#[tokio::test]
async fn step_3_accepts_parameters_and_any_case() {
    for content_type in [
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "Application/Json;charset=UTF-8",
    ] {
        let rig = Rig::new();
        rig.send(request(
            "POST",
            "/labels",
            Some(KEY),
            Some(content_type),
            BODY,
        ))
        .await
        .is_created();
    }
}

#[tokio::test]
async fn step_4_declared_length_over_the_limit_is_413_at_once() {
    let mut request = request("POST", "/labels", None, Some("application/json"), "{}");
    request
        .headers_mut()
        .insert("content-length", "4097".parse().unwrap());
    refused(request, 413, TOO_LARGE).await;
}

#[tokio::test]
async fn step_4_a_4097_byte_invalid_body_is_413_not_400() {
    let body = vec![b'!'; 4097];
    refused(
        request("POST", "/labels", None, Some("application/json"), body),
        413,
        TOO_LARGE,
    )
    .await;
    let chunks = Chunks::many((0..5).map(|_| vec![b'!'; 1000]));
    let chunked = http::Request::post("/labels")
        .header("content-type", "application/json")
        .body(chunks)
        .unwrap();
    refused(chunked, 413, TOO_LARGE).await;
}

#[tokio::test]
async fn step_4_exactly_4096_bytes_is_accepted() {
    let mut body = BODY.as_bytes().to_vec();
    body.resize(4096, b' ');
    let rig = Rig::new();
    rig.send(request(
        "POST",
        "/labels",
        Some(KEY),
        Some("application/json"),
        body,
    ))
    .await
    .is_created();
    let mut body = BODY.as_bytes().to_vec();
    body.resize(4097, b' ');
    refused(
        request("POST", "/labels", Some(KEY), Some("application/json"), body),
        413,
        TOO_LARGE,
    )
    .await;
}

#[tokio::test]
async fn step_4_the_limit_is_configurable() {
    let rig = Rig::with_layer(|layer| layer.body_limit(16));
    rig.send_expecting(valid(), &["write"])
        .await
        .exact(413, TOO_LARGE);
}

#[tokio::test]
async fn chunked_bodies_are_read_whole() {
    let rig = Rig::new();
    let chunks = Chunks::many(BODY.as_bytes().chunks(5).map(|c| c.to_vec()));
    let request = http::Request::post("/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(chunks)
        .unwrap();
    rig.send(request).await.is_created();
    rig.send(valid()).await.is_created();
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn step_5_body_must_be_exactly_the_operation() {
    for body in [
        "",
        " ",
        "null",
        "[]",
        "\"label-req-7\"",
        "{}",
        r#"{"request_id":"label-req-7"}"#,
        r#"{"parcel_id":"parcel-42"}"#,
        r#"{"request_id":null,"parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":null}"#,
        r#"{"request_id":7,"parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":42}"#,
        r#"{"request_id":true,"parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":false}"#,
        r#"{"request_id":"","parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":""}"#,
        r#"{"request_id":"label req 7","parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel/42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42\n"}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcél-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42","extra":1}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42","extra":null}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}{}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42"} {"request_id":"label-req-7","parcel_id":"parcel-42"}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42"} x"#,
        r#"{"request_id":"label-req-7","parcel_id":["parcel-42"]}"#,
        r#"{"request_id":"label-req-7","parcel_id":{"id":"parcel-42"}}"#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42""#,
        r#"{"request_id":"label-req-7","parcel_id":"parcel-42",}"#,
        // An array is not an object, even one whose items would fill the fields in order.
        r#"["label-req-7","parcel-42"]"#,
        r#" [ "label-req-7" , "parcel-42" ] "#,
    ] {
        refused(
            request("POST", "/labels", Some(KEY), Some("application/json"), body),
            400,
            INVALID,
        )
        .await;
    }
    // Not valid UTF-8.
    let mut bytes = BODY.as_bytes().to_vec();
    bytes[20] = 0xff;
    refused(
        request(
            "POST",
            "/labels",
            Some(KEY),
            Some("application/json"),
            bytes,
        ),
        400,
        INVALID,
    )
    .await;
}

#[tokio::test]
async fn step_5_whitespace_and_field_order_are_free() {
    let rig = Rig::new();
    let body = "\n { \"parcel_id\" : \"parcel-42\" ,\t\"request_id\":\"label-req-7\" } \r\n";
    rig.send(request(
        "POST",
        "/labels",
        Some(KEY),
        Some("application/json"),
        body,
    ))
    .await
    .is_created();
    rig.send_expecting(valid(), &["claim", "write"])
        .await
        .is_created();
}

#[tokio::test]
async fn step_6_key_must_be_present_and_equal_to_request_id() {
    for key in [
        None,
        Some(""),
        Some("label-req-8"),
        Some("LABEL-REQ-7"),
        Some(" label-req-7"),
    ] {
        refused(
            request("POST", "/labels", key, Some("application/json"), BODY),
            400,
            INVALID,
        )
        .await;
    }
    let mut twice = valid();
    twice
        .headers_mut()
        .append("idempotency-key", KEY.parse().unwrap());
    refused(twice, 400, INVALID).await;
}

#[tokio::test]
async fn the_first_failing_step_decides() {
    // Method before content type, content type before size, size before JSON, JSON before key.
    let big_bad = vec![b'!'; 5000];
    refused(
        request("GET", "/labels", None, None, big_bad.clone()),
        405,
        METHOD,
    )
    .await;
    refused(
        request("POST", "/labels", None, None, big_bad.clone()),
        415,
        MEDIA,
    )
    .await;
    refused(
        request("POST", "/labels", None, Some("application/json"), big_bad),
        413,
        TOO_LARGE,
    )
    .await;
    refused(
        request("POST", "/labels", None, Some("application/json"), "{"),
        400,
        INVALID,
    )
    .await;
}

// §3: the fingerprint.

#[test]
fn fingerprint_vector_and_normal_form() {
    assert_eq!(
        LabelContract::fingerprint("label-req-7", "parcel-42")
            .to_hex()
            .as_str(),
        "9c2dc67e4c22f75bcc63a19e384876bc7f83fd8f117cb45df4aa1ec13e49ae3a"
    );
    let a = LabelOperation::from_json(br#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#)
        .unwrap();
    let b =
        LabelOperation::from_json(br#"{"parcel_id":"parcel-42", "request_id" : "label-req-7"}"#)
            .unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(
        LabelContract::fingerprint("ab", "cd"),
        LabelContract::fingerprint("a", "bcd")
    );
}

// §4: the claim.

#[tokio::test]
async fn conflict_is_decided_before_pending_and_changes_nothing() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let (rig, _) = rig_with_gated_create(gate.clone());
    // The first request is pending: its create waits at the gate.
    let mut service = rig.service.clone();
    let first = tokio::spawn(call(&mut service, valid()).await);
    wait_for(|| rig.memory.is_pending(&key_of(KEY))).await;

    rig.send_expecting(operation(KEY, "parcel-43"), &["claim", "write"])
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    rig.send_expecting(valid(), &["claim", "write"])
        .await
        .exact(409, r#"{"error":"request_pending"}"#)
        // The contract's pending reply has no Retry-After, whatever the generic ones send.
        .header("retry-after", &[]);
    assert!(
        rig.memory.is_pending(&key_of(KEY)),
        "conflict and pending change nothing"
    );

    gate.notify_one();
    Reply::read(first.await.unwrap().unwrap())
        .await
        .is_created();
    rig.send_expecting(operation(KEY, "parcel-43"), &["claim", "write"])
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    rig.send(valid()).await.is_created();
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn another_request_id_for_the_same_parcel_is_another_operation() {
    let rig = Rig::new();
    rig.send(operation("label-req-7", "parcel-42"))
        .await
        .is_created();
    rig.send(operation("label-req-8", "parcel-42"))
        .await
        .exact(201, CREATED_BODY);
    assert_eq!(rig.creates(), 2);
}

#[tokio::test]
async fn replay_writes_exactly_what_the_store_holds() {
    let rig = Rig::new();
    rig.send(valid()).await;
    let replay = rig.send_expecting(valid(), &["claim", "write"]).await;
    let stored = rig.memory.completed(&key_of(KEY)).unwrap();
    assert_eq!(replay.status, stored.status());
    assert_eq!(&replay.headers, stored.headers());
    assert_eq!(&replay.body, stored.body());
    replay.is_created();
}

// §5: failures of the create leave the key pending.

#[tokio::test]
async fn a_failed_create_is_500_and_the_key_stays_pending() {
    let rig = Rig::around(|journal| {
        tower::service_fn(move |_| {
            journal.record("create");
            async { Err::<http::Response<_>, CreateError>("boom".into()) }
        })
    });
    // The store is told the create ended without a response (a plain store keeps the key).
    rig.send_expecting(valid(), &["claim", "admit", "create", "abandon", "write"])
        .await
        .exact(500, r#"{"error":"create_failed"}"#);
    assert!(
        rig.memory.is_pending(&key_of(KEY)),
        "no release after a failed create"
    );
    rig.send_expecting(valid(), &["claim", "write"])
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
}

/// A create that succeeded is never answered as failed: over the cap, its response is given
/// whole, and the key completed with its status and headers, no body.
#[tokio::test]
async fn a_created_response_over_the_cap_is_given_whole_and_its_key_completed() {
    let rig = Rig::with_layer(|layer| layer.response_limit(16));
    rig.send_expecting(valid(), &["claim", "admit", "create", "complete", "write"])
        .await
        .exact(201, CREATED_BODY);
    assert!(!rig.memory.is_pending(&key_of(KEY)));
    let retry = rig.send_expecting(valid(), &["claim", "write"]).await;
    assert_eq!(retry.status, 201);
    assert!(retry.body.is_empty());
    retry
        .header("idempotent-body-omitted", &["true"])
        .header("content-type", &["application/json"]);
    assert_eq!(
        retry.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn any_status_from_the_create_is_stored_and_replayed() {
    let rig = Rig::around(|journal| {
        tower::service_fn(move |_| {
            journal.record("create");
            async {
                let mut response = http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"no"),
                ));
                *response.status_mut() = http::StatusCode::UNPROCESSABLE_ENTITY;
                Ok::<_, CreateError>(response)
            }
        })
    });
    let first = rig.send(valid()).await;
    assert_eq!(first.status, 422);
    let again = rig.send_expecting(valid(), &["claim", "write"]).await;
    assert_eq!((again.status, again.body), (first.status, first.body));
}

// Store failures: fail closed, never create twice.

#[tokio::test]
async fn a_failed_claim_is_503_store_unavailable_and_creates_nothing() {
    let rig = Rig::new();
    rig.store.fail("claim");
    let reply = rig.send_expecting(valid(), &["claim", "write"]).await;
    reply
        .exact(503, r#"{"error":"store_unavailable"}"#)
        .header("retry-after", &["2"]);
    assert_eq!(reply.outcome, Some(Outcome::StoreUnavailable));
    assert_eq!(rig.creates(), 0);
    rig.store.recover();
    rig.send(valid()).await.is_created();
}

#[tokio::test]
async fn a_failed_complete_still_replies_the_created_response_and_leaves_the_key_pending() {
    let rig = Rig::new();
    rig.store.fail("complete");
    let reply = rig
        .send_expecting(valid(), &["claim", "admit", "create", "complete", "write"])
        .await;
    reply.is_created();
    assert_eq!(reply.outcome, Some(Outcome::CompleteFailed));
    assert!(rig.memory.is_pending(&key_of(KEY)));
    rig.store.recover();
    rig.send(valid())
        .await
        .exact(409, r#"{"error":"request_pending"}"#);
    assert_eq!(rig.creates(), 1);
}

#[tokio::test]
async fn a_failed_release_still_replies_not_admitted() {
    let rig = Rig::new();
    rig.admission.refuse(Some(refusal(429)));
    rig.store.fail("release");
    rig.send_expecting(valid(), &["claim", "admit", "release", "write"])
        .await
        .exact(429, r#"{"error":"not_admitted"}"#)
        .header("retry-after", &["2"]);
    assert_eq!(rig.creates(), 0);
}

// Configuration.

#[tokio::test]
async fn other_paths_can_pass_through_untouched() {
    let rig = Rig::with_layer(|layer| {
        layer.other_paths(tower_idempotency::layer::OtherPaths::PassThrough)
    });
    let reply = rig
        .send_expecting(
            request("GET", "/health", None, None, "ping"),
            &["create", "write"],
        )
        .await;
    assert_eq!(reply.status, 201, "the inner service answered");
    assert_eq!(reply.outcome, None);
    // The guarded path is still guarded.
    rig.send_expecting(request("GET", "/labels", None, None, ""), &["write"])
        .await
        .exact(405, METHOD);
}

#[tokio::test]
async fn the_guarded_path_is_configurable() {
    let rig = Rig::with_layer(|layer| layer.path("/v2/labels"));
    rig.send_expecting(valid(), &["write"])
        .await
        .exact(404, NOT_FOUND);
    let request = request(
        "POST",
        "/v2/labels",
        Some(KEY),
        Some("application/json"),
        BODY,
    );
    rig.send(request).await.is_created();
}

/// The inner service gets the body, and the operation too when the layer hands it over.
#[tokio::test]
async fn the_inner_service_gets_the_validated_body_and_the_operation() {
    let journal = Journal::default();
    let create = {
        let journal = journal.clone();
        tower::service_fn(
            move |request: http::Request<tower_idempotency::layer::RequestBody<Chunks>>| {
                journal.record("create");
                async move {
                    use http_body_util::BodyExt;
                    let op = request
                        .extensions()
                        .get::<LabelOperation>()
                        .cloned()
                        .unwrap();
                    assert_eq!(op, LabelOperation::new(KEY, "parcel-42"));
                    assert_eq!(request.headers()["idempotency-key"], KEY);
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(body, BODY.as_bytes());
                    Ok::<_, CreateError>(created_response())
                }
            },
        )
    };
    let rig = Rig::build(journal, Default::default(), Inner::new(create), |layer| {
        layer.value_extension(true)
    });
    rig.send(valid()).await.is_created();
}
