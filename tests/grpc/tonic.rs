//! The layer in a tonic server stack: gRPC routes pass through untouched, the JSON create route
//! is guarded. (tonic-web answers `400` to HTTP/1.1 requests that are not gRPC-web, so in a
//! tonic-web stack a JSON route belongs outside `GrpcWebLayer`.)

use crate::common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use common::{BODY, CREATED_BODY, KEY, Reply, axum_create_label as create_label, key_of};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::layer::OtherPaths;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// The health service next to the JSON create route, as one router.
async fn routes() -> Router {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::service::Routes::new(health)
        .into_axum_router()
        .route("/labels", post(create_label))
}

#[tokio::test]
async fn grpc_routes_pass_through_and_the_create_route_is_guarded() {
    let store = MemoryStore::new();
    // Stack-wide, in pass-through mode: it guards /labels and hands every other path on.
    let app = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(store.clone(), LabelContract)
                .global_keys()
                .other_paths(OtherPaths::PassThrough),
        )
        .service(routes().await);

    // A gRPC call of Health/Check: an empty request message in one frame.
    let check = Request::post("/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::from(vec![0u8, 0, 0, 0, 0]))
        .unwrap();
    let response = app.clone().oneshot(check).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/grpc");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    // One frame: HealthCheckResponse { status: SERVING (1) }.
    assert_eq!(&body[..], &[0, 0, 0, 0, 2, 0x08, 0x01]);
    assert!(store.is_empty(), "gRPC never reaches the store");

    let create = || {
        Request::post("/labels")
            .header("content-type", "application/json")
            .header("idempotency-key", KEY)
            .body(Body::from(BODY))
            .unwrap()
    };
    Reply::read(app.clone().oneshot(create()).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    let replay = Reply::read(app.oneshot(create()).await.unwrap()).await;
    assert_eq!(
        replay.outcome,
        Some(tower_idempotency::reply::Outcome::Replay)
    );
    assert!(store.completed(&key_of(KEY)).is_some());
}

/// A gRPC health check over HTTP/2 against `addr`.
async fn health_check(addr: std::net::SocketAddr) -> i32 {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut client = HealthClient::new(channel);
    let check = client.check(request);
    let reply = tokio::time::timeout(Duration::from_secs(5), check)
        .await
        .unwrap();
    reply.unwrap().into_inner().status
}

#[tokio::test]
async fn a_tonic_server_with_tonic_web_and_the_layer_answers_grpc_clients() {
    let store = MemoryStore::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(
            IdempotencyLayer::new(store.clone(), LabelContract)
                .global_keys()
                .other_paths(OtherPaths::PassThrough),
        )
        .add_service(health)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    let server = tokio::spawn(server);
    assert_eq!(health_check(addr).await, ServingStatus::Serving as i32);
    assert!(store.is_empty());
    server.abort();
}

#[tokio::test]
async fn a_tonic_server_serves_grpc_and_the_guarded_json_route_side_by_side() {
    let store = MemoryStore::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .layer(
            IdempotencyLayer::new(store.clone(), LabelContract)
                .global_keys()
                .other_paths(OtherPaths::PassThrough),
        )
        .add_routes(tonic::service::Routes::from(routes().await))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    let server = tokio::spawn(server);

    // JSON over HTTP/1.1 to the same server: guarded.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let create = || {
        Request::post(format!("http://{addr}/labels"))
            .header("content-type", "application/json")
            .header("idempotency-key", KEY)
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                BODY.as_bytes(),
            )))
            .unwrap()
    };
    Reply::read_any(client.request(create()).await.unwrap())
        .await
        .exact(201, CREATED_BODY);
    let replay = Reply::read_any(client.request(create()).await.unwrap()).await;
    replay.exact(201, CREATED_BODY);
    assert!(store.completed(&key_of(KEY)).is_some());
    // gRPC over HTTP/2 to the same server: untouched.
    assert_eq!(health_check(addr).await, ServingStatus::Serving as i32);
    assert_eq!(store.len(), 1);
    server.abort();
}
