//! The generic operations' keys: quoted and bare, the key space, a body member beside the header or in its place, and the fingerprint's selections.

use crate::common;
use crate::generic::{BODY, post, rig};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::payments::*;
use common::*;
use http::Method;
use tower_idempotency::admission::Refusal;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

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

/// Where a request carries its key, for the IETF-mode cases run with each.
#[derive(Clone, Copy, Debug)]
enum Carrier {
    /// The `Idempotency-Key` header, as the draft says.
    Header,
    /// A body member (`key_from("/reference")`), no header.
    Body,
}

impl Carrier {
    fn operation(self) -> JsonOperation<NewPayment> {
        match self {
            Self::Header => payment_operation(),
            Self::Body => payment_operation().key_from("/reference").unwrap(),
        }
    }

    /// A payment of `amount` under `key`; the body names the key as its reference either way,
    /// so that both carriers send the same bytes.
    fn post(self, key: &str, amount: u32) -> http::Request<Chunks> {
        let body = format!(r#"{{"amount":{amount},"currency":"EUR","reference":"{key}"}}"#);
        let header = match self {
            Self::Header => Some(key),
            Self::Body => None,
        };
        json_request("POST", "/payments", header, &body)
    }
}

/// The IETF-mode cases rerun with the key in the body: created then replayed byte for byte,
/// pending while the first runs, a conflict for another payload, admission refusals that
/// release, a store failure, a failed create that keeps its key; each answers as it does with
/// the header.
#[tokio::test]
async fn the_ietf_cases_hold_with_the_key_in_the_body() {
    for carrier in [Carrier::Header, Carrier::Body] {
        let journal = Journal::new();
        let store = RecordingStore::new(MemoryStore::new(), journal.clone());
        let admission = ScriptedAdmission::new(journal.clone());
        let layer = IdempotencyLayer::new(store.clone(), carrier.operation())
            .admission(admission.clone())
            .global_keys();
        let gate = Arc::new(tokio::sync::Notify::new());
        let creates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let inner = {
            let (gate, creates) = (Arc::clone(&gate), Arc::clone(&creates));
            Inner::new(tower::service_fn(
                move |request: http::Request<tower_idempotency::layer::RequestBody<Chunks>>| {
                    let (gate, creates) = (Arc::clone(&gate), Arc::clone(&creates));
                    async move {
                        let held = request.headers().contains_key("x-hold");
                        if held {
                            gate.notified().await;
                        }
                        let n = creates.fetch_add(1, Ordering::SeqCst) + 1;
                        if request.headers().contains_key("x-fail") {
                            return Err(CreateError("down"));
                        }
                        let mut response = http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(format!(r#"{{"payment_id":"pay_{n}"}}"#)),
                        ));
                        *response.status_mut() = http::StatusCode::CREATED;
                        Ok(response)
                    }
                },
            ))
        };
        let service = tower::Layer::layer(&layer, inner);
        let case = format!("{carrier:?}");

        let created = send(&service, carrier.post("p-1", 1250)).await;
        assert_eq!(created.status, 201, "{case}");
        assert_eq!(created.outcome, Some(Outcome::Created), "{case}");
        let replay = send(&service, carrier.post("p-1", 1250)).await;
        assert_eq!(replay.outcome, Some(Outcome::Replay), "{case}");
        assert_eq!(replay.body, created.body, "{case}");
        send(&service, carrier.post("p-1", 1251))
            .await
            .problem(422, "idempotency_conflict", None);

        let first = tokio::spawn({
            let (service, mut request) = (service.clone(), carrier.post("p-2", 1250));
            request
                .headers_mut()
                .insert("x-hold", http::HeaderValue::from_static("1"));
            async move { send(&service, request).await }
        });
        wait_for(|| store.inner().is_pending("POST /payments p-2")).await;
        send(&service, carrier.post("p-2", 1250))
            .await
            .problem(409, "request_pending", None);
        gate.notify_one();
        assert_eq!(first.await.unwrap().status, 201, "{case}");

        for (refusal, status) in [
            (Refusal::TooManyRequests, 429),
            (Refusal::ServiceUnavailable, 503),
        ] {
            admission.refuse(Some(refusal));
            journal.take();
            send(&service, carrier.post("p-3", 1250))
                .await
                .problem(status, "not_admitted", None)
                .header("retry-after", &["2"]);
            assert_eq!(journal.take(), ["claim", "admit", "release"], "{case}");
        }
        admission.refuse(None);
        store.fail("claim");
        send(&service, carrier.post("p-3", 1250))
            .await
            .problem(503, "store_unavailable", None);
        store.recover();

        let mut failing = carrier.post("p-4", 1250);
        failing
            .headers_mut()
            .insert("x-fail", http::HeaderValue::from_static("1"));
        send(&service, failing)
            .await
            .problem(500, "create_failed", None);
        send(&service, carrier.post("p-4", 1250))
            .await
            .problem(409, "request_pending", None);
        assert_eq!(creates.load(Ordering::SeqCst), 3, "{case}");
    }
}

/// A bare key with a comma is two field lines a proxy folded without a space (`a1,a2`), as
/// `a1, a2` is: refused, while the same characters quoted are one Structured Field string.
#[tokio::test]
async fn a_bare_key_with_a_comma_is_refused_and_a_quoted_one_is_a_key() {
    let (service, _, _, _, creates) = rig(|l| l);
    for folded in ["key,with,commas", "a1,a2", "a1, a2", ",a", "a,"] {
        send(&service, post(Some(folded), BODY)).await.problem(
            400,
            "invalid_idempotency_key",
            None,
        );
    }
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    assert_eq!(
        send(&service, post(Some(r#""key,with,commas""#), BODY))
            .await
            .outcome,
        Some(Outcome::Created)
    );
}

/// The inner service gets the validated key, as the client meant it, in the request
/// extensions, whichever operation guards it and whatever the scope: a handler keeping the key
/// beside its own row needs no second parse of the header.
#[tokio::test]
async fn every_operation_hands_the_validated_key_to_the_inner_service() {
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::Full;
    use tower_idempotency::layer::RequestBody;
    use tower_idempotency::operation::IdempotencyKey;
    use tower_idempotency::operation::LabelContract;
    use tower_idempotency::operation::RawOperation;

    type Seen = Arc<std::sync::Mutex<Vec<Option<String>>>>;
    fn recording(seen: &Seen) -> Inner {
        let seen = Arc::clone(seen);
        Inner::new(tower::service_fn(
            move |request: Request<RequestBody<Chunks>>| {
                seen.lock().unwrap().push(
                    request
                        .extensions()
                        .get::<IdempotencyKey>()
                        .map(|key| key.as_str().to_owned()),
                );
                async {
                    Ok::<_, CreateError>(
                        Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from_static(b"{}")))
                            .unwrap(),
                    )
                }
            },
        ))
    }
    let seen = Seen::default();

    let untyped = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys();
    let service = tower::Layer::layer(&untyped, recording(&seen));
    send(&service, post(Some(r#""a\"b""#), BODY)).await;
    let typed = IdempotencyLayer::new(MemoryStore::new(), payment_operation())
        .scope(|_| Some("tenant 7".to_owned()));
    let service = tower::Layer::layer(&typed, recording(&seen));
    send(&service, post(Some("typed-1"), BODY)).await;
    let member = IdempotencyLayer::new(
        MemoryStore::new(),
        JsonOperation::new().key_from("/request_id").unwrap(),
    )
    .global_keys();
    let service = tower::Layer::layer(&member, recording(&seen));
    send(
        &service,
        post(None, r#"{"request_id":"in-body-1","amount":1}"#),
    )
    .await;
    let raw = IdempotencyLayer::new(MemoryStore::new(), RawOperation::new()).global_keys();
    let service = tower::Layer::layer(&raw, recording(&seen));
    send(&service, request("POST", "/u", Some("raw-1"), None, "x")).await;
    let labels = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys();
    let service = tower::Layer::layer(&labels, recording(&seen));
    send(&service, valid()).await;

    let expected = [r#"a"b"#, "typed-1", "in-body-1", "raw-1", KEY];
    assert_eq!(
        *seen.lock().unwrap(),
        expected.map(|key| Some(key.to_owned()))
    );
}
