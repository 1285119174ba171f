//! The layer in axum apps.

mod common;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{BODY, CREATED_BODY, KEY, Reply, key_of};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, LabelOperation, MemoryStore, OtherPaths};

async fn create_label(
    Json(op): Json<LabelOperation>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    assert_eq!(op.parcel_id, "parcel-42");
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(
            r#"{{"request_id":"{}","state":"created","label_id":"label-901"}}"#,
            op.request_id
        ),
    )
}

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
    // The README's example.
    let app: Router = Router::new()
        .route("/labels", post(create_label))
        .route_layer(IdempotencyLayer::new(store.clone()))
        .route("/health", get(|| async { "ok" }));

    let first = Reply::read(app.clone().oneshot(attempt()).await.unwrap()).await;
    first.exact(201, CREATED_BODY);
    let replay = Reply::read(app.clone().oneshot(attempt()).await.unwrap()).await;
    replay.exact(201, CREATED_BODY);
    assert_eq!(replay.outcome, Some(tower_idempotency::Outcome::Replay));
    assert!(store.completed(&key_of(KEY)).is_some());

    let health = Reply::read(
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
        .layer(IdempotencyLayer::new(MemoryStore::new()).other_paths(OtherPaths::PassThrough));
    Reply::read(app.clone().oneshot(attempt()).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    let health = Reply::read(
        app.clone()
            .oneshot(Request::get("/health").body(Body::empty()).unwrap())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(health.body, "ok");
    // The guarded path answers with the contract's bytes.
    let wrong = Request::post("/labels").body(Body::from(BODY)).unwrap();
    Reply::read(app.oneshot(wrong).await.unwrap())
        .await
        .exact(415, r#"{"error":"unsupported_media_type"}"#);
}
