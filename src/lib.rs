//! Make "create" endpoints idempotent: a [tower] middleware after which a retried create never
//! creates twice.
//!
//! A client that creates something (a shipping label, a payment, an order) must be able to retry
//! when a reply is lost, without creating it twice. It stores the operation before its first
//! attempt and sends every attempt with the same `Idempotency-Key` and the same body. On the
//! server, [`IdempotencyLayer`] wraps the service that performs the create and owns everything
//! around it:
//!
//! 1. **Validation**, in a fixed order, before anything is touched: the path (`404`), the method
//!    (`405`, `Allow: POST`), `Content-Type: application/json` (`415`), the body limit read
//!    before any decoding (`413`), a strict JSON body `{"request_id":"…","parcel_id":"…"}` and
//!    an `Idempotency-Key` equal to `request_id` (`400`).
//! 2. **The fingerprint** of the operation, SHA-256 of its fields ([`fingerprint`]).
//! 3. **The claim** of the key in a [`Store`], atomic: *new*, *pending* (`409
//!    request_pending`), *conflict* (another operation under the key: `409
//!    idempotency_conflict`) or *replay* (the stored response, value for value).
//! 4. **Admission** of a new claim ([`admission`]): a refusal (429 or 503) releases the key and
//!    replies with `Retry-After: 2`.
//! 5. **The create**: the inner service's response is buffered and **completed into the store
//!    before it is written**, so a retry after a lost reply is a replay, never a second create.
//!
//! Every refusal is a response with `Content-Type: application/json` and exactly these bytes,
//! never an error of the service:
//!
//! | outcome | status | body | extra header |
//! |---|---|---|---|
//! | wrong path | 404 | `{"error":"not_found"}` | |
//! | wrong method | 405 | `{"error":"method_not_allowed"}` | `Allow: POST` |
//! | not JSON | 415 | `{"error":"unsupported_media_type"}` | |
//! | body over the limit | 413 | `{"error":"payload_too_large"}` | |
//! | invalid body or key | 400 | `{"error":"invalid_request"}` | |
//! | no [`scope`] where one is configured | 403 | `{"error":"scope_required"}` | |
//! | key taken by another operation | 409 | `{"error":"idempotency_conflict"}` | |
//! | operation pending | 409 | `{"error":"request_pending"}` | |
//! | admission refused | 429 / 503 | `{"error":"not_admitted"}` | `Retry-After: 2` |
//! | store failed to claim | 503 | `{"error":"store_unavailable"}` | `Retry-After: 2` |
//! | create failed (key stays pending) | 500 | `{"error":"create_failed"}` | |
//! | created response over the cap (key stays pending) | 500 | `{"error":"response_too_large"}` | |
//!
//! What the layer did is attached to every response it produces as an [`Outcome`] extension.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, LabelOperation, MemoryStore, RequestBody};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // The create: the only business work. It gets the validated operation in the extensions.
//! let create = service_fn(|request: Request<RequestBody<String>>| async move {
//!     let op = request.extensions().get::<LabelOperation>().unwrap();
//!     let body = format!(r#"{{"request_id":"{}","state":"created"}}"#, op.request_id);
//!     Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(body).unwrap())
//! });
//! let store = MemoryStore::new();
//! let service = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(store.clone()))
//!     .service(create);
//!
//! // The client stores the operation, then builds every attempt from it.
//! let op = LabelOperation::new("label-req-7", "parcel-42");
//! let first = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
//! let retry = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(
//!     retry.into_body().collect().await.unwrap().to_bytes(),
//!     r#"{"request_id":"label-req-7","state":"created"}"#,
//! );
//!
//! // The same key for another operation is a conflict.
//! let other = LabelOperation::new("label-req-7", "parcel-43");
//! let conflict = service.oneshot(other.attempt("/labels").unwrap()).await.unwrap();
//! assert_eq!(conflict.status(), StatusCode::CONFLICT);
//! # }
//! ```
//!
//! # Testing a service behind the layer
//!
//! Drive it with [`tower::ServiceExt::oneshot`] as above: build requests with
//! [`LabelOperation::attempt`], assert statuses and exact bytes, and read what the layer did
//! from the [`Outcome`] response extension. [`MemoryStore`] lets a test look into the registry
//! ([`MemoryStore::is_pending`], [`MemoryStore::completed`]). With the `test-util` feature,
//! the `testing` module records the calls in order (claim, admit, release, create,
//! complete), fails store calls on demand and scripts admission, so the contract's call traces
//! are one assertion each.
//!
//! # Composing with other middleware
//!
//! The layer is a plain [`tower::Layer`]: use it with `ServiceBuilder`, axum's `.layer()` and
//! `.route_layer()`, or as a router's `fallback_service` (every path then gets the contract's
//! replies). Its order among other layers matters:
//!
//! - **Outside** (before it in a `ServiceBuilder`): tracing, request ids, compression, timeouts.
//!   Compression outside means the stored response is the uncompressed one, compressed anew for
//!   each replay's `Accept-Encoding`; inside, one client's encoding would be stored and
//!   replayed to all. Request ids outside are per attempt and never stored. A timeout outside
//!   answers the client when it fires, but the claimed create goes on and completes, so the
//!   retry replays it.
//! - **Not inside** (between the layer and the create): a timeout there turns a slow create
//!   into a failed one from the layer's point of view, leaving the key pending for good
//!   (`500 create_failed`, then `request_pending`), though the create may have run.
//! - **tonic**: in a `tonic::transport::Server` stack, in [`OtherPaths::PassThrough`] mode, the
//!   layer guards the JSON route and hands gRPC calls on untouched. tonic-web answers `400` to
//!   an HTTP/1.1 request that is not gRPC-web, so a JSON route served over HTTP/1.1 must not sit
//!   behind `GrpcWebLayer`.
//! - **Body limits**: the layer enforces its own (4096 by default). A smaller limit outside
//!   refuses first (its own 413 for a declared length; a streamed body trips it inside the
//!   layer's read, which answers the contract's 413); a larger one changes nothing.
//!
//! # Stores
//!
//! | store | feature | shared by replicas | survives a restart |
//! |---|---|---|---|
//! | [`MemoryStore`] | (default) | no | no |
//! | `RedisStore` | `redis` | yes | with Redis persistence on |
//! | `PostgresStore` | `postgres` | yes | yes |
//!
//! The header alone deduplicates nothing: only a registry shared by every replica, with an
//! atomic claim, does. [`MemoryStore`] serves one process; the [`store`] module documents the
//! shared ones. A store that cannot answer makes the layer fail closed: `503
//! store_unavailable`, nothing created.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `redis` | `store::RedisStore`, and the `redis` driver re-exported |
//! | `postgres` | `store::PostgresStore`, and `tokio_postgres` and `deadpool_postgres` re-exported |
//! | `test-util` | `testing`: a call journal, a recording store and a scripted admission for your own tests |
//!
//! None is on by default; the in-memory store needs none. The minimum supported Rust version is
//! 1.88.
//!
//! # Observability
//!
//! Every guarded request runs in a `tracing` span named `idempotency` with its method, the
//! endpoint's path, the operation's fingerprint and, once decided, its outcome, and ends with
//! one debug event. The body is never traced; the store key only with
//! [`IdempotencyLayer::trace_keys`]. Store and create failures are logged at `warn` and
//! `error`. The [`Outcome`] is also a response extension, for metrics layers, and
//! [`IdempotencyLayer::mark_replays`] adds `Idempotent-Replayed: true` to replays (off by
//! default, since a replay is otherwise byte for byte the stored response).
//!
//! # What is promised
//!
//! *At most one create per key*, for as long as the reservation or record is held. Not
//! exactly-once: a crash between the create and the complete leaves the key pending, and a
//! pending retry never gets the right to create. A create that fails (an error, a response over
//! the cap) also leaves the key pending; only a confirmed admission refusal releases it.
//!
//! In production the key space must include the owner or tenant and the kind of operation, or
//! one client's key could reveal another's stored response.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod admission;
mod body;
mod future;
mod headers;
mod layer;
mod operation;
mod reply;
pub mod scope;
mod service;
pub mod store;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;
mod validation;

pub use crate::admission::Admission;
pub use crate::body::{RequestBody, ResponseBody};
pub use crate::future::ResponseFuture;
pub use crate::layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_PATH, DEFAULT_RESPONSE_LIMIT, IdempotencyLayer, OtherPaths,
};
pub use crate::operation::{
    Fingerprint, IDEMPOTENCY_KEY, InvalidOperation, LabelOperation, fingerprint,
};
pub use crate::reply::{IDEMPOTENT_REPLAYED, Outcome};
pub use crate::scope::store_key;
pub use crate::service::Idempotency;
/// The Redis driver the [`RedisStore`](store::RedisStore) is built on, re-exported so you get a
/// matching version.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis;

/// The PostgreSQL driver and pool the [`PostgresStore`](store::PostgresStore) is built on,
/// re-exported so you get matching versions.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use {deadpool_postgres, tokio_postgres};

pub use crate::store::{
    Claim, MemoryStore, Reservation, Store, StoreError, StoreErrorKind, StoredResponse,
};
