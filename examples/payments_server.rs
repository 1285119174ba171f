//! The payments server: any JSON create endpoint behind the layer's generic `JsonOperation`,
//! per draft-ietf-httpapi-idempotency-key-header.
//!
//! ```text
//! cargo run --example payments_server -- [--addr HOST:PORT] [--create-delay-ms N]
//!     [--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N]
//!     [--metrics HOST:PORT (with --features metrics)]
//!     [--store memory|redis://…|redis-cluster://HOST:PORT,…|postgres://…|sqlite://PATH]
//! ```
//!
//! - `POST /payments` with `{"amount": <integer ≥ 1>, "currency": "<3 uppercase letters>"}`
//!   and an optional `"reference"` string → `201`, `Location: /payments/{payment_id}`,
//!   `{"payment_id":"…","amount":…,"currency":"…"}`.
//! - `POST /payments/{payment_id}/refunds` with `{"amount": <integer ≥ 1>}` → `201`,
//!   `{"refund_id":"…","payment_id":"…","amount":…}`.
//!
//! Each needs `Idempotency-Key` (bare or quoted). A retry with the same key and the same
//! payload, in any member order or spacing, replays the first response byte for byte; another
//! payload under the key is `422`; a retry while the first attempt runs is `409` (or, with
//! `--pending-wait-ms N`, waits up to N ms for its response); every refusal
//! is `application/problem+json`. Bodies are limited to 16 KiB (the generic default).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use common::Ids;
use serde::{Deserialize, Serialize};
use tower_idempotency::reply::Invalid;
use tower_idempotency::store::DynStore;
use tower_idempotency::{IdempotencyLayer, JsonOperation};

const USAGE: &str = "usage: payments_server [--addr HOST:PORT] [--create-delay-ms N] \
[--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N] \
[--metrics HOST:PORT (with --features metrics)] [--store memory|redis://…|redis-cluster://HOST:PORT,…|postgres://…|sqlite://PATH]";

/// The body of `POST /payments`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPayment {
    amount: u64,
    currency: String,
    #[serde(default)]
    #[allow(dead_code)]
    reference: Option<String>,
}

/// The body of `POST /payments/{payment_id}/refunds`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRefund {
    amount: u64,
}

#[derive(Serialize)]
struct Payment<'a> {
    payment_id: &'a str,
    amount: u64,
    currency: &'a str,
}

#[derive(Serialize)]
struct Refund<'a> {
    refund_id: &'a str,
    payment_id: &'a str,
    amount: u64,
}

struct Payments {
    payment_ids: Ids,
    refund_ids: Ids,
    create_delay: Duration,
}

/// A `201` with a JSON body and a `Location`.
fn created(body: &impl Serialize, location: String) -> Response {
    let body = serde_json::to_string(body).unwrap_or_default();
    let mut response = (StatusCode::CREATED, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(location) = HeaderValue::try_from(location) {
        headers.insert(header::LOCATION, location);
    }
    response
}

/// The payment create: the layer has checked the key, the body and the claim; the payment
/// arrives parsed and validated in the extensions.
async fn create_payment(
    State(payments): State<Arc<Payments>>,
    Extension(payment): Extension<NewPayment>,
) -> Response {
    if !payments.create_delay.is_zero() {
        tracing::info!(currency = %payment.currency, "create started");
        tokio::time::sleep(payments.create_delay).await;
    }
    let payment_id = payments.payment_ids.next();
    let body = Payment {
        payment_id: &payment_id,
        amount: payment.amount,
        currency: &payment.currency,
    };
    created(&body, format!("/payments/{payment_id}"))
}

/// The refund create.
async fn create_refund(
    State(payments): State<Arc<Payments>>,
    Path(payment_id): Path<String>,
    Extension(refund): Extension<NewRefund>,
) -> Response {
    tokio::time::sleep(payments.create_delay).await;
    let refund_id = payments.refund_ids.next();
    let body = Refund {
        refund_id: &refund_id,
        payment_id: &payment_id,
        amount: refund.amount,
    };
    created(&body, format!("/payments/{payment_id}/refunds/{refund_id}"))
}

fn at_least_one(amount: u64) -> Result<(), Invalid> {
    if amount >= 1 {
        Ok(())
    } else {
        Err(Invalid::at("/amount", "must be an integer of at least 1"))
    }
}

struct PaymentsApp {
    create_delay: Duration,
    pending_wait: Option<Duration>,
}

impl PaymentsApp {
    /// The app over the store `--store` chose.
    fn build(&self, store: DynStore) -> Router {
        let payments = Arc::new(Payments {
            payment_ids: Ids::new("pay"),
            refund_ids: Ids::new("refund"),
            create_delay: self.create_delay,
        });
        let payment = JsonOperation::<NewPayment>::typed().validate(|p| {
            at_least_one(p.amount)?;
            if p.currency.len() == 3 && p.currency.bytes().all(|b| b.is_ascii_uppercase()) {
                Ok(())
            } else {
                Err(Invalid::at("/currency", "must be three uppercase letters"))
            }
        });
        let refund = JsonOperation::<NewRefund>::typed().validate(|r| at_least_one(r.amount));
        // One key space for every client: this demo has no authentication. A real service
        // scopes keys by its authenticated client with `.scope(…)` instead.
        let payments_route = Router::new()
            .route("/payments", post(create_payment))
            .route_layer(common::with_wait_and_drain(
                common::labelled(
                    IdempotencyLayer::new(store.clone(), payment)
                        .global_keys()
                        .outcome_extension(true),
                    "payments",
                ),
                self.pending_wait,
            ));
        let refunds_route = Router::new()
            .route("/payments/{payment_id}/refunds", post(create_refund))
            .route_layer(common::with_wait_and_drain(
                common::labelled(
                    IdempotencyLayer::new(store, refund)
                        .global_keys()
                        .outcome_extension(true),
                    "refunds",
                ),
                self.pending_wait,
            ));
        payments_route.merge(refunds_route).with_state(payments)
    }
}

#[tokio::main]
async fn main() {
    common::init_tracing();
    let options = common::options_or_exit(common::Options::parse(
        std::env::args().skip(1),
        SocketAddr::from(([127, 0, 0, 1], 3001)),
        USAGE,
        |_, _| Ok(false),
    ));
    let app = PaymentsApp {
        create_delay: options.create_delay,
        pending_wait: options.pending_wait,
    };
    let router = common::open_store(&options)
        .await
        .map(|store| app.build(store));
    common::serve("payments server", &options, router).await;
}
