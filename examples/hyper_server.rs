//! The layer on a raw hyper server, no framework: every request goes through the layer, which
//! answers the contract's replies itself and calls the create for `POST /labels` only.
//!
//! ```text
//! cargo run --example hyper_server -- [HOST:PORT]    # default 127.0.0.1:3002
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::Layer;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

static NEXT_LABEL: AtomicU64 = AtomicU64::new(1);

/// The create: reads the validated operation the layer put into the extensions.
async fn create(
    request: Request<RequestBody<Incoming>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let Some(op) = request.extensions().get::<LabelOperation>() else {
        // Not reachable behind the layer, which only calls the create with a valid operation.
        return Ok(Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Full::default())
            .unwrap_or_default());
    };
    let label_id = format!("label-{}", NEXT_LABEL.fetch_add(1, Ordering::Relaxed));
    let body = format!(
        r#"{{"request_id":"{}","state":"created","label_id":"{label_id}"}}"#,
        op.request_id
    );
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::LOCATION, format!("/labels/{label_id}"))
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3002".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let service = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
        .global_keys()
        // The create reads the operation from the request extensions.
        .value_extension(true)
        .layer(tower::service_fn(create));
    println!("hyper label server on http://{addr}");
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection failed: {error}");
            }
        });
    }
}
