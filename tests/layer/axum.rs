//! The layer in axum apps.

use crate::common;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use common::{BODY, CREATED_BODY, KEY, Reply, axum_create_label as create_label, key_of};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::layer::OtherPaths;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

fn attempt() -> Request<Body> {
    Request::post("/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(Body::from(BODY))
        .unwrap()
}

#[tokio::test]
async fn route_layer_guards_the_create_route_and_leaves_others_alone() {
    let store = MemoryStore::new();
    // The README's example, with the outcome in the extensions, where axum keeps it.
    let app: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(
            IdempotencyLayer::new(store.clone(), LabelContract)
                .global_keys()
                .outcome_extension(true),
        )
        .route("/health", get(|| async { "ok" }));

    let first = Reply::read_any(app.clone().oneshot(attempt()).await.unwrap()).await;
    first.exact(201, CREATED_BODY);
    let replay = Reply::read_any(app.clone().oneshot(attempt()).await.unwrap()).await;
    replay.exact(201, CREATED_BODY);
    assert_eq!(
        replay.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    assert!(store.completed(&key_of(KEY)).is_some());

    let health = Reply::read_any(
        app.oneshot(Request::get("/health").body(Body::empty()).unwrap())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (health.status, &health.body[..]),
        (StatusCode::OK, &b"ok"[..])
    );
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn stack_wide_layer_in_pass_through_mode() {
    let app: Router = Router::new()
        .route("/labels", post(create_label))
        .route("/health", get(|| async { "ok" }))
        .layer(
            IdempotencyLayer::new(MemoryStore::new(), LabelContract)
                .global_keys()
                .other_paths(OtherPaths::PassThrough),
        );
    Reply::read_any(app.clone().oneshot(attempt()).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    let health = Reply::read_any(
        app.clone()
            .oneshot(Request::get("/health").body(Body::empty()).unwrap())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(health.body, "ok");
    // The guarded path answers with the contract's bytes.
    let wrong = Request::post("/labels").body(Body::from(BODY)).unwrap();
    Reply::read_any(app.oneshot(wrong).await.unwrap())
        .await
        .exact(415, r#"{"error":"unsupported_media_type"}"#);
}

#[tokio::test]
async fn a_handler_can_read_the_operation_from_the_extensions() {
    use axum::Extension;
    async fn from_extensions(Extension(op): Extension<LabelOperation>) -> (StatusCode, String) {
        (
            StatusCode::CREATED,
            format!("created {} for {}", op.request_id, op.parcel_id),
        )
    }
    let app: Router = Router::new()
        .route("/labels", post(from_extensions))
        .route_layer(
            IdempotencyLayer::new(MemoryStore::new(), LabelContract)
                .global_keys()
                .value_extension(true),
        );
    let reply = Reply::read_any(app.clone().oneshot(attempt()).await.unwrap()).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, "created label-req-7 for parcel-42");
    let replay = Reply::read_any(app.oneshot(attempt()).await.unwrap()).await;
    assert_eq!((replay.status, replay.body), (reply.status, reply.body));
}

#[tokio::test]
async fn in_a_nested_router_the_layer_sees_the_path_axum_passes_in() {
    let store = MemoryStore::new();
    // Nested under /v1, the inner router (and the layer on its route) sees /labels.
    let api: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(IdempotencyLayer::new(store.clone(), LabelContract).global_keys());
    let app: Router = Router::new().nest("/v1", api);
    let request = Request::post("/v1/labels")
        .header("content-type", "application/json")
        .header("idempotency-key", KEY)
        .body(Body::from(BODY))
        .unwrap();
    Reply::read_any(app.clone().oneshot(request).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    assert!(
        store.completed(&key_of(KEY)).is_some(),
        "claimed under the endpoint /labels"
    );
    let other = Request::get("/v1/other").body(Body::empty()).unwrap();
    assert_eq!(
        app.oneshot(other).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn as_the_fallback_service_every_path_gets_the_contracts_replies() {
    let guarded = tower::Layer::layer(
        &IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys(),
        Router::new().route("/labels", post(create_label)),
    );
    let app: Router = Router::new().fallback_service(guarded);
    Reply::read_any(app.clone().oneshot(attempt()).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    let other = Request::get("/other").body(Body::empty()).unwrap();
    Reply::read_any(app.clone().oneshot(other).await.unwrap())
        .await
        .exact(404, r#"{"error":"not_found"}"#);
    let get = Request::get("/labels").body(Body::empty()).unwrap();
    Reply::read_any(app.oneshot(get).await.unwrap())
        .await
        .exact(405, r#"{"error":"method_not_allowed"}"#)
        .header("allow", &["POST"]);
}
