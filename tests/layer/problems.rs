//! The generic operations' refusals as problem details: the member named by JSON pointer, a problem type base of one's own, the Retry-After settings.

use crate::common;
use crate::generic::{BODY, post, rig};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::payments::*;
use common::*;
use http::{Method, StatusCode};
use tower_idempotency::admission::Refusal;
use tower_idempotency::reply::Invalid;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

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
        tower_idempotency::operation::Operation::parse(
            &op,
            &parts,
            &Bytes::from_static(BODY.as_bytes()),
        )
        .unwrap()
        .fingerprint
    };
    // The key pending in `store`: claimed through it, never completed.
    let pending = |store: RecordingStore| {
        let (key, fingerprint) = (key.clone(), fingerprint);
        async move {
            let claimed =
                tower_idempotency::store::Store::claim(store.inner(), &key, &fingerprint).await;
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
