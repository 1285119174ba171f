//! The client side of safe retries (feature `client`): what a client that keeps one key per
//! intent may retry with that key, and when.
//!
//! The server's layer guarantees at most one create per key; a client gets *exactly* one
//! effect only if it sends every attempt of an intent with the same key and body, retries the
//! answers that are safe to retry, and stops on the others. [`decision`] is that choice, one
//! table for HTTP answers, lost answers and gRPC statuses, for a retry loop of your own:
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, StatusCode};
//! use tower_idempotency::client::decision::{Decision, decide};
//!
//! // An attempt answered 503 with `Retry-After: 2`: wait at least two seconds, same key.
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "2".parse().unwrap());
//! match decide(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", true, Duration::from_secs(30)) {
//!     Decision::Retry { after } => assert_eq!(after, Some(Duration::from_secs(2))),
//!     Decision::Stop => unreachable!(),
//! }
//! ```

mod body;
pub mod decision;
mod layer;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
mod reqwest;
mod retries;

pub use self::body::ClientBody;
pub use self::layer::{Attempts, ClientFuture, ClientLayer, RetryClient};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use self::reqwest::RetryMiddleware;
pub use self::retries::{GaveUp, IntentKey, SameKey, Stop};
