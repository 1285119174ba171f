//! The client side of the contract: store the operation before the first attempt, then build
//! every attempt from it, so every retry carries the same `Idempotency-Key` and the same body.
//!
//! ```text
//! cargo run --example label_server &
//! cargo run --example client_retry -- [URL] [PARCEL_ID] [REQUEST_ID]
//! ```
//!
//! Give a `REQUEST_ID` to resume an operation stored earlier: its attempts replay the
//! original result instead of creating again.
//!
//! Retries on a lost connection, `409 request_pending`, and `429`/`503` (after their
//! `Retry-After`), up to a fixed number of attempts; stops at anything else.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_idempotency::operation::LabelOperation;

const ATTEMPTS: u32 = 8;

/// A new operation id: this process's start time and id. A real client persists the whole
/// operation (in its database, say) before the first attempt.
fn new_request_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("label-req-{nanos:x}-{}", std::process::id())
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:3000/labels".to_owned());
    let parcel_id = args.next().unwrap_or_else(|| "parcel-42".to_owned());
    // 1. Store the operation before the first attempt (or resume a stored one).
    let request_id = args.next().unwrap_or_else(new_request_id);
    let op = LabelOperation::new(request_id, parcel_id);
    println!("operation {}", op.to_json());

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    for attempt in 1..=ATTEMPTS {
        // 2. Every attempt is built from the stored operation: same key, same bytes.
        let request = match op.attempt(url.as_str()) {
            Ok(request) => request.map(|body| Full::new(Bytes::from(body))),
            Err(error) => {
                eprintln!("cannot build a request for {url}: {error}");
                std::process::exit(2);
            }
        };
        let wait = match client.request(request).await {
            Err(error) => {
                println!("attempt {attempt}: no answer ({error}); retrying with the same key");
                Duration::from_millis(200 * u64::from(attempt))
            }
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let body = String::from_utf8_lossy(&body);
                println!("attempt {attempt}: {} {body}", status.as_u16());
                match status.as_u16() {
                    409 if body.contains("request_pending") => {
                        Duration::from_millis(200 * u64::from(attempt))
                    }
                    429 | 503 => Duration::from_secs(retry_after.unwrap_or(2)),
                    _ => return, // created (or replayed), or a final refusal
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
    println!("gave up after {ATTEMPTS} attempts; the operation is stored and can be retried later");
}
