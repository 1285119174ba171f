//! The label server: `POST /labels` creates a shipping label, at most once per
//! `Idempotency-Key`, through the idempotency layer.
//!
//! ```text
//! cargo run --example label_server -- [--addr HOST:PORT] [--create-delay-ms N]
//!     [--admit-rate N] [--max-in-flight N] [--store memory|redis://…|postgres://…]
//! ```
//!
//! The shared stores need their features:
//! `cargo run --example label_server --features redis -- --store redis://127.0.0.1:6379`.
//!
//! `--admit-rate N` admits at most N creates per second (else 429), `--max-in-flight N` at
//! most N creates at once (else 503). One log line per request with its outcome.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use tower::Layer;
use tower_idempotency::admission::{Admission, Admit, ConcurrencyLimit, RateLimit};
use tower_idempotency::{
    IDEMPOTENCY_KEY, IdempotencyLayer, LabelOperation, MemoryStore, Outcome, Store,
};

const USAGE: &str = "usage: label_server [--addr HOST:PORT] [--create-delay-ms N] \
[--admit-rate N] [--max-in-flight N] [--store memory|redis://…|postgres://…]";

/// The command line.
#[derive(Debug)]
struct Options {
    addr: SocketAddr,
    create_delay: Duration,
    admit_rate: Option<u32>,
    max_in_flight: Option<usize>,
    store: String,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut options = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            create_delay: Duration::ZERO,
            admit_rate: None,
            max_in_flight: None,
            store: "memory".to_owned(),
        };
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.to_owned());
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}\n{USAGE}");
            match flag.as_str() {
                "--addr" => options.addr = value.parse().map_err(|e| bad(&e))?,
                "--create-delay-ms" => {
                    options.create_delay =
                        Duration::from_millis(value.parse().map_err(|e| bad(&e))?)
                }
                "--admit-rate" => options.admit_rate = Some(value.parse().map_err(|e| bad(&e))?),
                "--max-in-flight" => {
                    options.max_in_flight = Some(value.parse().map_err(|e| bad(&e))?)
                }
                "--store" => options.store = value,
                _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
            }
        }
        Ok(options)
    }
}

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

/// Label ids unique across processes and restarts: this process's start time and id, then a
/// counter.
struct LabelIds {
    prefix: String,
    next: AtomicU64,
}

impl LabelIds {
    fn new() -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            prefix: format!("label-{started:x}{:x}", std::process::id()),
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> String {
        format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

struct Labels {
    ids: LabelIds,
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
        tokio::time::sleep(labels.create_delay).await;
    }
    let label_id = labels.ids.next();
    let body = Created {
        request_id: &op.request_id,
        state: "created",
        label_id: &label_id,
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

/// One log line per request, with the outcome the layer reports.
async fn log(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let key = request
        .headers()
        .get(&IDEMPOTENCY_KEY)
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
    let response = next.run(request).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    tracing::info!(
        "{method} {path} key={} status={} outcome={outcome} {:?}",
        key.as_deref().unwrap_or("-"),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The whole app over any store.
fn app<St: Store>(store: St, options: &Options) -> Router {
    let labels = Arc::new(Labels {
        ids: LabelIds::new(),
        create_delay: options.create_delay,
    });
    let create = Router::new()
        .route("/labels", post(create_label))
        .with_state(labels);
    let policies = Policies {
        in_flight: options.max_in_flight.map(ConcurrencyLimit::new),
        rate: options.admit_rate.map(RateLimit::per_second),
    };
    let guarded = IdempotencyLayer::new(store)
        .admission(policies)
        .layer(create);
    Router::new()
        .fallback_service(guarded)
        .layer(middleware::from_fn(log))
}

/// The app on the store `--store` names: `memory`, `redis://…` or `postgres://…` (the shared
/// stores need the crate's `redis` and `postgres` features).
async fn open_store(options: &Options) -> Result<Router, String> {
    let url = options.store.as_str();
    if url == "memory" {
        return Ok(app(MemoryStore::new(), options));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        #[cfg(feature = "redis")]
        {
            let store = tower_idempotency::store::RedisStore::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(app(store, options));
        }
        #[cfg(not(feature = "redis"))]
        return Err("build with --features redis".to_owned());
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let store = tower_idempotency::store::PostgresStore::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            store.migrate().await.map_err(|e| e.to_string())?;
            return Ok(app(store, options));
        }
        #[cfg(not(feature = "postgres"))]
        return Err("build with --features postgres".to_owned());
    }
    Err(format!("unsupported store\n{USAGE}"))
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let app = match open_store(&options).await {
        Ok(app) => app,
        Err(message) => {
            eprintln!("--store {}: {message}", options.store);
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(options.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on {}: {error}", options.addr);
            std::process::exit(1);
        }
    };
    tracing::info!(
        "label server on http://{} (store: {})",
        options.addr,
        options.store
    );
    if let Err(error) = axum::serve(listener, app).await {
        eprintln!("server failed: {error}");
        std::process::exit(1);
    }
}
