//! The label server: `POST /labels` creates a shipping label, at most once per
//! `Idempotency-Key`, through the idempotency layer with `LabelContract`.
//!
//! ```text
//! cargo run --example label_server -- [--addr HOST:PORT] [--create-delay-ms N]
//!     [--admit-rate N] [--max-in-flight N] [--lease-ms N] [--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N]
//!     [--metrics HOST:PORT (with --features metrics)]
//!     [--store memory|redis://…|redis-cluster://HOST:PORT,…|postgres://…|mysql://…|sqlite://PATH]
//!     [--transactional (with postgres://… or mysql://…)]
//! ```
//!
//! The shared stores need their features:
//! `cargo run --example label_server --features redis -- --store redis://127.0.0.1:6379`.
//!
//! `--admit-rate N` admits at most N creates per second (else 429), `--max-in-flight N` at
//! most N creates at once (else 503). `--lease-ms N` sets the lease a running create renews
//! (default 30 s), after which a key whose server died shows as abandoned. One log line per
//! request with its outcome. `--pending-wait-ms N` lets a retry wait up to N ms for a first
//! attempt still running and replay its response; 0 (the default) is the contract's
//! immediate `409 request_pending`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use common::Ids;
use tower::Layer;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::admission::{Admission, Admit, ConcurrencyLimit, RateLimit};
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::LabelOperation;
use tower_idempotency::store::DynStore;
#[cfg(feature = "mysql")]
use tower_idempotency::store::MySqlTransaction;
#[cfg(feature = "postgres")]
use tower_idempotency::store::PgTransaction;
#[cfg(all(feature = "mysql", not(feature = "postgres")))]
use tower_idempotency::store::mysql::sqlx;
#[cfg(feature = "postgres")]
use tower_idempotency::store::postgres::sqlx;

const USAGE: &str = "usage: label_server [--addr HOST:PORT] [--create-delay-ms N] \
[--admit-rate N] [--max-in-flight N] [--lease-ms N] [--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N] \
[--metrics HOST:PORT (with --features metrics)] \
[--store memory|redis://…|redis-cluster://HOST:PORT,…|postgres://…|mysql://…|sqlite://PATH] \
[--transactional (with postgres://… or mysql://…: the create's row in the claim's transaction)]";

/// Both optional policies in one: the in-flight limit first (503), then the rate (429).
#[derive(Clone)]
struct Policies {
    in_flight: Option<ConcurrencyLimit>,
    rate: Option<RateLimit>,
}

impl Admission<LabelOperation> for Policies {
    type Permit = Option<<ConcurrencyLimit as Admission<LabelOperation>>::Permit>;

    async fn admit(&self, operation: &LabelOperation) -> Admit<Self::Permit> {
        let permit = match &self.in_flight {
            Some(limit) => match limit.admit(operation).await {
                Admit::Proceed(permit) => Some(permit),
                Admit::Refuse(refusal) => return Admit::Refuse(refusal),
            },
            None => None,
        };
        if let Some(rate) = &self.rate
            && let Admit::Refuse(refusal) = rate.admit(operation).await
        {
            return Admit::Refuse(refusal);
        }
        Admit::Proceed(permit)
    }
}

struct Labels {
    ids: Ids,
    create_delay: Duration,
}

/// The created label, fields in this order.
#[derive(serde::Serialize)]
struct Created<'a> {
    request_id: &'a str,
    state: &'a str,
    label_id: &'a str,
}

/// The create: the only business work, behind the layer.
async fn create_label(
    State(labels): State<Arc<Labels>>,
    Json(op): Json<LabelOperation>,
) -> Response {
    if !labels.create_delay.is_zero() {
        tracing::info!(request_id = %op.request_id, "create started");
        tokio::time::sleep(labels.create_delay).await;
    }
    created(&op, &labels.ids.next())
}

/// With `--transactional`: the create inserts its row into `labels` in the claim's
/// transaction, then waits the delay (a kill then finds the row written, not committed), so
/// the row commits with the stored response or not at all.
#[cfg(feature = "postgres")]
async fn create_label_in_transaction(
    State(labels): State<Arc<Labels>>,
    axum::Extension(transaction): axum::Extension<PgTransaction>,
    Json(op): Json<LabelOperation>,
) -> Response {
    let label_id = labels.ids.next();
    let inserted = async {
        let mut connection = transaction.acquire().await?;
        sqlx::query("INSERT INTO labels (label_id, request_id, parcel_id) VALUES ($1, $2, $3)")
            .bind(&label_id)
            .bind(&*op.request_id)
            .bind(&*op.parcel_id)
            .execute(&mut *connection)
            .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    if let Err(error) = inserted {
        tracing::error!(%error, "inserting the label failed");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    if !labels.create_delay.is_zero() {
        tracing::info!(request_id = %op.request_id, "label inserted, uncommitted");
        tokio::time::sleep(labels.create_delay).await;
    }
    created(&op, &label_id)
}

/// [`create_label_in_transaction`] on MySQL: the same row, in the claim's InnoDB transaction.
#[cfg(feature = "mysql")]
async fn create_label_in_mysql_transaction(
    State(labels): State<Arc<Labels>>,
    axum::Extension(transaction): axum::Extension<MySqlTransaction>,
    Json(op): Json<LabelOperation>,
) -> Response {
    let label_id = labels.ids.next();
    let inserted = async {
        let mut connection = transaction.acquire().await?;
        sqlx::query("INSERT INTO labels (label_id, request_id, parcel_id) VALUES (?, ?, ?)")
            .bind(&label_id)
            .bind(&*op.request_id)
            .bind(&*op.parcel_id)
            .execute(&mut *connection)
            .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    if let Err(error) = inserted {
        tracing::error!(%error, "inserting the label failed");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    if !labels.create_delay.is_zero() {
        tracing::info!(request_id = %op.request_id, "label inserted, uncommitted");
        tokio::time::sleep(labels.create_delay).await;
    }
    created(&op, &label_id)
}

/// The label contract's 201 for `op`, labelled `label_id`.
fn created(op: &LabelOperation, label_id: &str) -> Response {
    let body = Created {
        request_id: &op.request_id,
        state: "created",
        label_id,
    };
    let body = serde_json::to_string(&body).unwrap_or_default();
    let mut response = (StatusCode::CREATED, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in [
        (header::LOCATION, format!("/labels/{label_id}")),
        (header::ETAG, format!("\"{label_id}-v1\"")),
    ] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The label app: its policies and create, over any store.
struct LabelApp {
    create_delay: Duration,
    admit_rate: Option<u32>,
    max_in_flight: Option<usize>,
    lease: Option<Duration>,
    pending_wait: Option<Duration>,
    /// The database of a transactional store: the create then writes its row in the claim's
    /// transaction.
    transactional: Option<common::Database>,
}

impl LabelApp {
    /// The app over the store `--store` chose.
    fn build(&self, store: DynStore) -> Router {
        let labels = Arc::new(Labels {
            ids: Ids::new("label"),
            create_delay: self.create_delay,
        });
        let route = match self.transactional {
            #[cfg(feature = "postgres")]
            Some(common::Database::Postgres) => post(create_label_in_transaction),
            #[cfg(feature = "mysql")]
            Some(common::Database::MySql) => post(create_label_in_mysql_transaction),
            // Without the database's feature there is no transactional store: it failed
            // earlier.
            _ => post(create_label),
        };
        let create = Router::new().route("/labels", route).with_state(labels);
        let policies = Policies {
            in_flight: self.max_in_flight.map(ConcurrencyLimit::new),
            rate: self.admit_rate.map(RateLimit::per_second),
        };
        // The log middleware outside reads each outcome from the response extensions.
        let layer = IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .admission(policies)
            .outcome_extension(true);
        let mut layer = common::labelled(layer, "labels");
        if let Some(lease) = self.lease {
            layer = layer.lease(lease);
        }
        let guarded = common::with_wait_and_drain(layer, self.pending_wait).layer(create);
        Router::new().fallback_service(guarded)
    }
}

#[tokio::main]
async fn main() {
    common::init_tracing();
    let (mut admit_rate, mut max_in_flight, mut lease) = (None, None, None);
    let transactional = std::env::args().any(|arg| arg == "--transactional");
    let options = common::options_or_exit(common::Options::parse(
        std::env::args()
            .skip(1)
            .filter(|arg| arg != "--transactional"),
        SocketAddr::from(([127, 0, 0, 1], 3000)),
        USAGE,
        |flag, value| {
            match flag {
                "--admit-rate" => admit_rate = Some(value.parse().map_err(|e| format!("{e}"))?),
                "--max-in-flight" => {
                    max_in_flight = Some(value.parse().map_err(|e| format!("{e}"))?)
                }
                "--lease-ms" => {
                    lease = Some(Duration::from_millis(
                        value.parse().map_err(|e| format!("{e}"))?,
                    ))
                }
                _ => return Ok(false),
            }
            Ok(true)
        },
    ));
    let app = LabelApp {
        create_delay: options.create_delay,
        admit_rate,
        max_in_flight,
        lease,
        pending_wait: options.pending_wait,
        transactional: transactional.then(|| common::Database::of(&options.store)),
    };
    let store = if transactional {
        common::open_transactional_store(&options).await
    } else {
        common::open_store(&options).await
    };
    let router = store.map(|store| app.build(store));
    common::serve("label server", &options, router).await;
}
