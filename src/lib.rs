//! Make "create" endpoints idempotent: a [tower] middleware after which a retried create never
//! creates twice.
//!
//! A client that creates something, such as a payment, an order or a shipping label, must be
//! able to retry when a reply is lost, without creating it twice. It sends every attempt with
//! the same `Idempotency-Key` and the same body. On the server, [`IdempotencyLayer`] wraps the
//! service that performs the create and owns everything around it:
//!
//! 1. **The head**: the path, the method, the content type, a declared length over the body
//!    limit; then the body, read up to the limit before any decoding.
//! 2. **The [`Operation`]**: it validates the request and yields its key, its fingerprint and
//!    the value the inner service gets. [`JsonOperation`] serves any JSON body, typed or not,
//!    as draft-ietf-httpapi-idempotency-key-header describes it, with the fingerprint over the
//!    body in canonical JSON, RFC 8785. [`RawOperation`] serves any bytes and [`GrpcOperation`]
//!    unary gRPC calls. An operation of your own implements the trait: [`operation`] shows how,
//!    and [`operation::LabelContract`] is a strict contract written that way.
//! 3. **The claim** of the key in a [`Store`], atomic: *new*, *pending*, *conflict* for another
//!    payload under the key, or *replay* of the stored response, value for value.
//! 4. **Admission** of a new claim by the [`admission`] policy: a 429 or 503 refusal releases
//!    the key and replies with `Retry-After: 2`.
//! 5. **The create**: the inner service's response is buffered and **completed into the store
//!    before it is written**, so a retry after a lost reply is a replay, never a second create.
//!
//! Every refusal is a response written by the operation, never an error of the service, and
//! nothing refused before the claim touches the store, admission or the create. The generic
//! operations answer RFC 9457 problem details, which [`problem`] documents:
//!
#![doc = include_str!("reply/problem.md")]
//!
//! What the layer did, an [`Outcome`], is on the body of every response it produces as
//! [`ResponseBody::outcome`](body::ResponseBody::outcome), and in its extensions with
//! [`IdempotencyLayer::outcome_extension`].
//!
//! # Example: your own JSON body
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use serde::Deserialize;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
//! use tower_idempotency::layer::RequestBody;
//!
//! #[derive(Clone, Deserialize)]
//! struct NewPayment { amount: u64, currency: String }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // The create: the only business work. It gets the validated payment in the extensions.
//! let create = service_fn(|request: Request<RequestBody<String>>| async move {
//!     let payment = request.extensions().get::<NewPayment>().unwrap();
//!     let body = format!(r#"{{"payment_id":"pay_1","amount":{}}}"#, payment.amount);
//!     Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(body).unwrap())
//! });
//! let operation = JsonOperation::<NewPayment>::typed()
//!     .validate(|p| if p.amount >= 1 { Ok(()) } else { Err("amount must be at least 1".into()) });
//! let service = ServiceBuilder::new()
//!     .layer(
//!         IdempotencyLayer::new(MemoryStore::new(), operation)
//!             // Each tenant its own key space, from what authentication put in front.
//!             .scope(|parts: &http::request::Parts| {
//!                 parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
//!             }),
//!     )
//!     .service(create);
//!
//! let attempt = |body: &str| {
//!     Request::post("/payments")
//!         .header("content-type", "application/json")
//!         .header("idempotency-key", "8e03978e-40d5-43e8")
//!         .header("x-tenant", "acme")
//!         .body(body.to_owned())
//!         .unwrap()
//! };
//! let first = service.clone().oneshot(attempt(r#"{"amount":5,"currency":"EUR"}"#)).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//!
//! // A retry is a replay, even with its members in another order.
//! let retry = service.clone().oneshot(attempt(r#"{"currency":"EUR","amount":5}"#)).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.into_body().collect().await.unwrap().to_bytes(), r#"{"payment_id":"pay_1","amount":5}"#);
//!
//! // The same key for another payload is refused.
//! let reused = service.oneshot(attempt(r#"{"amount":6,"currency":"EUR"}"#)).await.unwrap();
//! assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! assert_eq!(reused.headers()["content-type"], "application/problem+json");
//! # }
//! ```
//!
//! # Methods, paths and keys
//!
//! The generic operations guard `POST`, or the methods they are given, on every path: put the
//! layer on the route, as with axum's `route_layer`, where the router has matched already;
//! other methods pass through. [`IdempotencyLayer::path`] restricts it to one path. The key
//! space always holds the method and the concrete path, so the same key on
//! `/payments/a/refunds` and `/payments/b/refunds` is two operations, and the [`scope`], such
//! as a tenant, when one is set; see [`store_key`](scope::store_key). Operations whose keys
//! clients choose require a scope or an explicit [`IdempotencyLayer::global_keys`].
//!
//! # Testing a service behind the layer
//!
//! Drive it with [`tower::ServiceExt::oneshot`] as above, assert statuses and exact bytes, and
//! read what the layer did, an [`Outcome`]. The layer's own response body carries it as
//! [`ResponseBody::outcome`](body::ResponseBody::outcome), for a test that calls the layered
//! service directly. An axum `Router`, or any middleware that maps the body, replaces that
//! body: behind one, turn on [`IdempotencyLayer::outcome_extension`] and read the outcome from
//! the response extensions, `response.extensions().get::<Outcome>()`. [`MemoryStore`] lets a
//! test look into the registry with [`MemoryStore::is_pending`] and [`MemoryStore::completed`].
//! With the `test-util` feature, the `testing` module records the calls in order: claim, admit,
//! release, create, complete. It also fails store calls on demand and scripts admission, so the
//! contract's call traces are one assertion each.
//!
//! # Composing with other middleware
//!
//! The layer is a plain [`tower::Layer`]: use it with `ServiceBuilder`, axum's `.layer()` and
//! `.route_layer()`, or as a router's `fallback_service`. Its order among other layers
//! matters:
//!
//! - **Outside**, before it in a `ServiceBuilder`: tracing, request ids, compression, timeouts.
//!   Compression outside means the stored response is the uncompressed one, compressed anew for
//!   each replay's `Accept-Encoding`; inside, one client's encoding would be stored and
//!   replayed to all. Request ids outside are per attempt and never stored. A timeout outside
//!   answers the client when it fires, but the claimed create goes on and completes, so the
//!   retry replays it.
//! - **Not inside**, between the layer and the create: a timeout there turns a slow create into
//!   a failed one from the layer's point of view, leaving the key pending for good, though the
//!   create may have run. The answers are `500 create_failed`, then `request_pending`.
//! - **Readiness**: the service's `poll_ready` is the inner service's, so a concurrency limit
//!   inside pushes back on the caller.
//! - **tonic**: in a `tonic::transport::Server` stack, in [`OtherPaths::PassThrough`] mode, the
//!   layer guards the JSON route and hands gRPC calls on untouched. tonic-web answers `400` to
//!   an HTTP/1.1 request that is not gRPC-web, so a JSON route served over HTTP/1.1 must not sit
//!   behind `GrpcWebLayer`.
//! - **Body limits**: the layer enforces its own. A smaller limit outside refuses first: its
//!   own 413 for a declared length, while a streamed body trips it inside the layer's read,
//!   which answers the operation's 413. A larger one changes nothing.
//!
//! # Stores
//!
//! | store | feature | shared by replicas | survives a restart |
//! |---|---|---|---|
//! | [`MemoryStore`] | none | no | no |
//! | `RedisStore` | `redis` | yes | with Redis persistence on |
//! | `PostgresStore` | `postgres` | yes | yes |
//! | `TransactionalPostgresStore`: the create's writes and the complete in the claim's transaction, exactly once | `postgres` | yes | yes |
//! | `MySqlStore`, for MySQL 8 and MariaDB 10.5+ | `mysql` | yes | yes |
//! | `TransactionalMySqlStore`: the same, exactly once, in one InnoDB transaction | `mysql` | yes | yes |
//! | `SqliteStore` | `sqlite` | the processes of one host | yes |
//!
//! The header alone deduplicates nothing: only a registry shared by every replica, with an
//! atomic claim, does. [`MemoryStore`] serves one process; the [`store`] module documents the
//! shared ones. A store that cannot answer makes the layer fail closed: `503`
//! (`store_unavailable`), nothing created. The store does not know the operation: every
//! operation works on every store.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `redis` | `store::RedisStore`, and the `redis` driver re-exported |
//! | `postgres` | `store::PostgresStore` and `store::TransactionalPostgresStore` on sqlx with TLS by rustls, and `sqlx` re-exported |
//! | `mysql` | `store::MySqlStore` and `store::TransactionalMySqlStore` on sqlx with TLS by rustls, and `sqlx` re-exported |
//! | `sqlite` | `store::SqliteStore` on sqlx with the SQLite library built in, and `sqlx` re-exported |
//! | `test-util` | `testing`: a call journal, a recording store and a scripted admission for your own tests |
//! | `client` | `client`: the retry decision of a client that keeps one key per intent: which answers to retry with the same key, and when |
//! | `metrics` | `metrics`: the layer's outcomes, store call times, waiting and settling tasks and the client layer's attempts, through the `metrics` 0.24 facade, for any exporter |
//! | `reqwest` | `client::reqwest`: the client layer's retries as a `reqwest-middleware` 0.5 middleware for `reqwest` 0.13; turns `client` on |
//! | `check` | `check`, the library of the `idempotency-check` crate (whose command is `cargo install idempotency-check`): a black-box checker of any create endpoint over HTTP; turns on reqwest's rustls without a crypto provider (a process building reqwest clients of its own installs one, as `check::client` does) |
//!
//! None is on by default; the in-memory store needs none. The minimum supported Rust version is
//! 1.94, which sqlx 0.9 needs; sqlx is behind `postgres`, `mysql` and `sqlite`.
//!
//! # Observability
//!
//! Every guarded request runs in a `tracing` span named `idempotency` with its method, its
//! path, the operation's fingerprint and, once decided, its outcome, and ends with one debug
//! event. The body is never traced; the store key only with [`IdempotencyLayer::trace_keys`].
//! Store and create failures are logged at `warn` and `error`. The [`Outcome`] is on the
//! response body for an outer layer, and in the response extensions with
//! [`IdempotencyLayer::outcome_extension`] for one that sees the response after its body was
//! replaced. [`IdempotencyLayer::mark_replays`] adds `Idempotent-Replayed: true` to replays. It
//! is off by default, since a replay is otherwise byte for byte the stored response.
//!
//! # What is promised
//!
//! *At most one create per key*, for as long as the reservation or record is held. Not
//! exactly-once: a crash between the create and the complete leaves the key pending, and a
//! pending retry never gets the right to create. A confirmed admission refusal releases the
//! key; for a create that fails, see [a create that fails](layer::StoredResponses#a-create-that-fails).
//!
//! [`Operation`]: operation::Operation
//! [`RawOperation`]: operation::RawOperation
//! [`GrpcOperation`]: operation::GrpcOperation
//! [`Store`]: store::Store
//! [`Outcome`]: reply::Outcome
//! [`OtherPaths::PassThrough`]: layer::OtherPaths::PassThrough
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod admission;
mod body;
mod config;
#[cfg(feature = "check")]
#[cfg_attr(docsrs, doc(cfg(feature = "check")))]
pub use idempotency_check as check;
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub use tower_idempotency_client as client;
mod drain;
/// The operation's fingerprint, defined with the store contract.
mod fingerprint {
    pub use tower_idempotency_core::{Fingerprint, FingerprintHex};
}
mod future;
mod headers;
pub mod idempotent;
pub mod layer;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
// Without the feature, the same file reports nothing: each report compiles to nothing.
#[cfg(not(feature = "metrics"))]
#[allow(dead_code, unreachable_pub)]
mod metrics;
pub mod operation;
mod outcome;
mod pipeline;
pub mod problem;
mod rejection;
pub mod reply;
pub mod scope;
mod service;
pub mod store;
mod tally;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

pub use crate::idempotent::Idempotent;
pub use crate::layer::IdempotencyLayer;
pub use crate::operation::JsonOperation;
pub use crate::store::MemoryStore;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    /// The crate docs' feature table has a row for every feature of the manifest, and no
    /// other.
    #[test]
    fn the_feature_table_is_the_manifests() {
        let manifest = include_str!("../Cargo.toml");
        let features = manifest
            .split("\n[features]\n")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .expect("a [features] table");
        let mut declared: Vec<&str> = features
            .lines()
            .filter(|line| !line.starts_with('#') && line.contains(" = "))
            .filter_map(|line| line.split(" = ").next())
            .filter(|name| *name != "default")
            .collect();
        let docs = include_str!("lib.rs");
        let mut documented: Vec<&str> = docs
            .lines()
            .skip_while(|line| *line != "//! | feature | what it adds |")
            .skip(2)
            .take_while(|line| line.starts_with("//! | `"))
            .filter_map(|line| line.split('`').nth(1))
            .collect();
        declared.sort_unstable();
        documented.sort_unstable();
        assert_eq!(documented, declared);
    }
}
