//! The layer in tower stacks with tower-http middleware, outside and inside it.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::{Json, Router};
use common::{BODY, CREATED_BODY, KEY, Reply, axum_create_label as create_label, key_of};
use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

fn attempt(body: impl Into<Body>) -> Request<Body> {
    Request::post("/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .header("accept-encoding", "identity")
        .body(body.into())
        .unwrap()
}

#[tokio::test]
async fn the_contract_holds_inside_a_stack_of_tower_http_layers() {
    let store = MemoryStore::new();
    let app: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(
            ServiceBuilder::new()
                // Outside the layer: tracing, request ids, a timeout, compression.
                .layer(TraceLayer::new_for_http())
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::GATEWAY_TIMEOUT,
                    Duration::from_secs(5),
                ))
                .layer(CompressionLayer::new())
                .layer(IdempotencyLayer::new(store.clone(), LabelContract).global_keys()),
        );
    let first = Reply::read_any(app.clone().oneshot(attempt(BODY)).await.unwrap()).await;
    first.exact(201, CREATED_BODY);
    assert_eq!(first.values("x-request-id").len(), 1);
    let replay = Reply::read_any(app.clone().oneshot(attempt(BODY)).await.unwrap()).await;
    replay.exact(201, CREATED_BODY);
    assert_ne!(
        first.values("x-request-id"),
        replay.values("x-request-id"),
        "ids are per request, not replayed"
    );
    assert!(store.completed(&key_of(KEY)).is_some());
    let stored = store.completed(&key_of(KEY)).unwrap();
    assert!(
        !stored.headers().contains_key("x-request-id"),
        "outer headers are not stored"
    );
}

#[tokio::test]
async fn a_body_limit_outside_the_layer_decides_first_and_one_inside_applies_to_the_create() {
    // A smaller limit outside refuses before the layer sees the request (its own 413 reply).
    let outer_small: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(
            ServiceBuilder::new()
                .layer(RequestBodyLimitLayer::new(16))
                .layer(IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys()),
        );
    let response = outer_small.oneshot(attempt(BODY)).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // A larger limit outside leaves the layer's 4096 in charge, with the contract's bytes.
    let outer_large: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(
            ServiceBuilder::new()
                .layer(RequestBodyLimitLayer::new(1 << 20))
                .layer(IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys()),
        );
    let big = format!("{BODY}{}", " ".repeat(5000));
    Reply::read_any(outer_large.clone().oneshot(attempt(big)).await.unwrap())
        .await
        .exact(413, r#"{"error":"payload_too_large"}"#);
    Reply::read_any(outer_large.oneshot(attempt(BODY)).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
}

#[tokio::test]
async fn a_timeout_outside_the_layer_answers_the_client_but_the_create_still_completes() {
    let store = MemoryStore::new();
    async fn slow_create(Json(op): Json<LabelOperation>) -> (StatusCode, String) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (StatusCode::CREATED, String::from(op.request_id))
    }
    let app: Router = Router::new()
        .route("/labels", post(slow_create))
        .route_layer(
            ServiceBuilder::new()
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::GATEWAY_TIMEOUT,
                    Duration::from_millis(50),
                ))
                .layer(IdempotencyLayer::new(store.clone(), LabelContract).global_keys()),
        );
    let timed_out = app.clone().oneshot(attempt(BODY)).await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::GATEWAY_TIMEOUT);
    // The timeout dropped the layer's future mid-create; the create goes on and completes.
    assert!(store.is_pending(&key_of(KEY)));
    common::wait_for(|| store.completed(&key_of(KEY)).is_some()).await;
    let retry = Reply::read_any(app.oneshot(attempt(BODY)).await.unwrap()).await;
    assert_eq!(
        (retry.status.as_u16(), &retry.body[..]),
        (201, KEY.as_bytes())
    );
}

#[tokio::test]
async fn compression_outside_the_layer_compresses_the_replay_too() {
    let app: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(
            ServiceBuilder::new()
                .layer(CompressionLayer::new().gzip(true))
                .layer(IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys()),
        );
    let gzip = |body: &'static str| {
        let mut request = attempt(body);
        request
            .headers_mut()
            .insert("accept-encoding", "gzip".parse().unwrap());
        request
    };
    let first = app.clone().oneshot(gzip(BODY)).await.unwrap();
    let replay = app.oneshot(gzip(BODY)).await.unwrap();
    for response in [first, replay] {
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["content-encoding"], "gzip");
    }
}

/// The inner service gets the operation's value in the request extensions when the layer
/// says so, and by default only when the operation hands it over: the label contract does
/// not (its handlers read the body).
#[tokio::test]
async fn the_operation_value_is_in_the_extensions_when_asked_for() {
    use common::{Chunks, CreateError, created_response, valid};
    use std::sync::Arc;
    use tower_idempotency::layer::RequestBody;
    for (insert, expected) in [
        (Some(true), Some(LabelOperation::new(KEY, "parcel-42"))),
        (Some(false), None),
        (None, None),
    ] {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let saw = Arc::clone(&seen);
        let create = tower::service_fn(move |request: http::Request<RequestBody<Chunks>>| {
            *saw.lock().unwrap() = Some(request.extensions().get::<LabelOperation>().cloned());
            async move { Ok::<_, CreateError>(created_response()) }
        });
        let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys();
        let layer = match insert {
            Some(insert) => layer.value_extension(insert),
            None => layer,
        };
        let service = tower::Layer::layer(&layer, create);
        Reply::read(service.oneshot(valid()).await.unwrap())
            .await
            .is_created();
        assert_eq!(
            seen.lock().unwrap().take(),
            Some(expected),
            "value_extension({insert:?})"
        );
    }
}

/// A typed JSON operation hands its value over by default, an untyped one does not; the
/// layer's setting wins over both.
#[tokio::test]
async fn a_typed_json_body_is_handed_over_by_default_an_untyped_one_is_not() {
    use common::{Chunks, CreateError, created_response};
    use std::sync::Arc;
    use tower_idempotency::JsonOperation;
    use tower_idempotency::layer::RequestBody;
    use tower_idempotency::operation::Operation;
    #[derive(Clone, Debug, PartialEq, serde::Deserialize)]
    struct Order {
        sku: String,
    }
    assert!(JsonOperation::<Order>::typed().hands_over_value());
    assert!(!JsonOperation::new().hands_over_value());
    assert!(!LabelContract.hands_over_value());
    let order = || {
        http::Request::post("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", "order-1")
            .body(Chunks::one(r#"{"sku":"a-1"}"#))
            .unwrap()
    };
    for (insert, expected) in [(None, true), (Some(false), false), (Some(true), true)] {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let saw = Arc::clone(&seen);
        let create = tower::service_fn(move |request: http::Request<RequestBody<Chunks>>| {
            *saw.lock().unwrap() = Some(request.extensions().get::<Order>().cloned());
            async move { Ok::<_, CreateError>(created_response()) }
        });
        let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::<Order>::typed())
            .global_keys();
        let layer = match insert {
            Some(insert) => layer.value_extension(insert),
            None => layer,
        };
        let service = tower::Layer::layer(&layer, create);
        let reply = Reply::read(service.oneshot(order()).await.unwrap()).await;
        assert_eq!(reply.status, 201);
        let expected = expected.then(|| Order {
            sku: "a-1".to_owned(),
        });
        assert_eq!(seen.lock().unwrap().take(), Some(expected), "{insert:?}");
    }
}
