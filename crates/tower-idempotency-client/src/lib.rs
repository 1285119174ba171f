//! The client side of safe retries for [`tower-idempotency`](https://docs.rs/tower-idempotency)
//! (the facade's feature `client`, at `tower_idempotency_client`): what a client that keeps
//! one key per intent may retry with that key, and when.
//!
//! The server's layer guarantees at most one create per key; a client gets *exactly* one
//! effect only if it sends every attempt of an intent with the same key and body, retries the
//! answers that are safe to retry, and stops on the others. [`decision`] is that choice, one
//! table for HTTP answers, lost answers and gRPC statuses, for a retry loop of your own:
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, StatusCode};
//! use tower_idempotency_client::decision::{Decision, decide};
//!
//! // An attempt answered 503 with `Retry-After: 2`: wait at least two seconds, same key.
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "2".parse().unwrap());
//! match decide(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", true, Duration::from_secs(30)) {
//!     Decision::Retry { after } => assert_eq!(after, Some(Duration::from_secs(2))),
//!     Decision::Stop => unreachable!(),
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod body;
pub mod decision;
mod layer;
mod metrics;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
mod reqwest;
mod retries;

pub use self::body::ClientBody;
pub use self::layer::{Attempts, ClientFuture, ClientLayer, RetryClient};
pub use self::metrics::{CLIENT_ATTEMPTS, CLIENT_BUDGET_REFUSALS};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::reqwest::RetryMiddleware;
pub use self::retries::{GaveUp, IntentKey, SameKey, Stop};

/// The header the key is sent in.
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The header in which a server advertises how long it replays a completed create, in seconds.
const IDEMPOTENCY_TTL: http::HeaderName = http::HeaderName::from_static("idempotency-ttl");

/// The header every retry carries with the time the intent was first sent, an HTTP date (OASIS
/// repeatable requests).
const REPEATABILITY_FIRST_SENT: http::HeaderName =
    http::HeaderName::from_static("repeatability-first-sent");
