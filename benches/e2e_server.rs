//! The server for the end-to-end load run (`benches/load.sh`): one create handler, served
//! either bare or behind the layer on the memory store, on one worker thread.
//!
//! `e2e_server bare|layered|retained|floor HOST:PORT`: `retained` is the layer on a store that
//! keeps completed records for one second, as a deployment keeps them for its retry window;
//! `floor` the layer on a store that keeps nothing, the floor of what the layer costs with any
//! store.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

async fn create(
    Json(op): Json<LabelOperation>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let body = format!(
        r#"{{"request_id":"{}","state":"created","label_id":"label-1"}}"#,
        op.request_id
    );
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [mode, addr] = args.as_slice() else {
        eprintln!("usage: e2e_server bare|layered|retained|floor HOST:PORT");
        std::process::exit(2);
    };
    let router = Router::new().route("/labels", post(create));
    let app = match mode.as_str() {
        "bare" => router,
        // As the README puts it on a router: on its routes.
        "layered" | "retained" => {
            let store = match mode.as_str() {
                "layered" => MemoryStore::builder().keep_forever().unbounded().build(),
                _ => MemoryStore::with_retention(Duration::from_secs(1)),
            };
            router.route_layer(IdempotencyLayer::new(store, LabelContract).global_keys())
        }
        "floor" => router
            .route_layer(IdempotencyLayer::new(common::KeepsNothing, LabelContract).global_keys()),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr.as_str())
            .await
            .expect("a free address");
        axum::serve(listener, app).await.expect("serve");
    });
}
