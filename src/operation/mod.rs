//! What a create request means: the [`Operation`] trait and its implementations.
//!
//! The layer is generic over an [`Operation`]: the part that reads a request and answers, from
//! its head and its body up to the limit, whether it is guarded at all, whether it is valid,
//! its idempotency key, its fingerprint, and the value handed to the inner service in the
//! request extensions. Everything else is the layer's, shared by every operation: the body
//! limit, the claim, admission, the create, the complete and the replay.
//!
//! | operation | for | key | fingerprint | refusals |
//! |---|---|---|---|---|
//! | [`JsonOperation`] | any JSON create endpoint, typed or not | the `Idempotency-Key` header of the IETF draft | method, path and query, body in canonical JSON, RFC 8785 | `application/problem+json` |
//! | [`RawOperation`] | form or binary bodies, any content type | the `Idempotency-Key` header | method, path and query, content type, exact body bytes | `application/problem+json` |
//! | [`GrpcOperation`] | unary gRPC calls of the methods it names | the `idempotency-key` metadata entry | the method's path and the framed request message | gRPC statuses in an HTTP 200 |
//! | [`LabelContract`] | `POST /labels`, every byte fixed by `LABEL_CONTRACT.md` | `request_id`, equal to the header | `request_id` and `parcel_id` | `{"error":"…"}` |
//!
//! Write your own by implementing [`Operation`]:
//!
//! ```
//! use bytes::Bytes;
//! use http::request::Parts;
//! use http::{Method, Response};
//! use tower_idempotency::operation::{Head, Operation, Parsed};
//! use tower_idempotency::operation::Fingerprint;
//! use tower_idempotency::reply::Rejection;
//!
//! /// Orders keyed by an `Order-Id` header, fingerprinted by their exact body.
//! #[derive(Clone)]
//! struct Orders;
//!
//! impl Operation for Orders {
//!     type Value = ();
//!
//!     fn head(&self, parts: &Parts) -> Head {
//!         if parts.method != Method::POST {
//!             Head::PassThrough
//!         } else if parts.headers.contains_key("order-id") {
//!             Head::Guard
//!         } else {
//!             Head::Reject(Rejection::InvalidKey)
//!         }
//!     }
//!
//!     fn parse<'a>(&self, parts: &'a Parts, body: &Bytes) -> Result<Parsed<'a, ()>, Rejection> {
//!         let key = parts.headers["order-id"].to_str().map_err(|_| Rejection::InvalidKey)?;
//!         Ok(Parsed {
//!             key: key.into(),
//!             fingerprint: Fingerprint::digest([parts.uri.path().as_bytes(), body]),
//!             value: (),
//!         })
//!     }
//! }
//! # let _ = tower_idempotency::IdempotencyLayer::new(
//! #     tower_idempotency::MemoryStore::new(), Orders).global_keys();
//! ```

use std::borrow::Cow;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, header};

use crate::rejection::Rejection;

mod grpc;
pub(crate) mod jcs;
mod json;
mod key;
mod label;
pub(crate) mod media;
mod raw;

pub use self::grpc::{GrpcCall, GrpcOperation};
pub use self::json::{InvalidPointer, JsonOperation};
pub(crate) use self::key::is_key;
pub use self::key::{IdempotencyKey, MAX_KEY_LEN};
pub use self::label::{InvalidOperation, LabelContract, LabelOperation, SharedStr};
pub use self::raw::RawOperation;
pub use crate::fingerprint::{Fingerprint, FingerprintHex};

/// The canonical form (RFC 8785, JCS) of a JSON text, as [`JsonOperation`] fingerprints it:
/// members sorted by their UTF-16 code units, no insignificant whitespace, the shortest
/// escapes, numbers as ECMAScript writes them.
///
/// # Errors
///
/// [`Rejection::InvalidRequest`] with the reason: not one JSON value, a member name twice, a
/// lone surrogate, a number out of the range of a double, nesting deeper than 128.
///
/// ```
/// use tower_idempotency::operation::canonical_json;
///
/// let canonical = canonical_json(br#"{ "b": [1.0, "\u00e9"], "a": 1e21 }"#).unwrap();
/// assert_eq!(canonical, r#"{"a":1e+21,"b":[1,"é"]}"#.as_bytes());
/// assert!(canonical_json(br#"{"a":1,"a":2}"#).is_err());
/// ```
pub fn canonical_json(input: &[u8]) -> Result<Vec<u8>, Rejection> {
    jcs::canonicalize(input).map_err(|why| Rejection::invalid(why.to_string()))
}

/// The name of the header that carries the idempotency key: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: header::HeaderName = header::HeaderName::from_static("idempotency-key");

/// The default request body limit of an operation that does not set its own, in bytes: 16 KiB,
/// the limit of the generic operations [`JsonOperation`] and [`RawOperation`].
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// A kind of create request: how the layer tells whether a request is guarded, valid, which key
/// it claims and which fingerprint it carries.
///
/// The layer calls [`head`](Operation::head) before it reads the body, then
/// [`parse`](Operation::parse) on the whole body, which is at most the body limit, and writes
/// every refusal with [`reply`](Operation::reply). Nothing an operation refuses reaches the
/// store, admission or the inner service.
///
/// See the [module docs](self) for the built-in operations and an example of your own.
pub trait Operation: Clone + Send + Sync + 'static {
    /// The parsed operation: what [`Admission`](crate::admission::Admission) sees, and what
    /// the inner service gets in the request extensions when the operation
    /// [hands it over](Operation::hands_over_value) or the layer says
    /// [`value_extension(true)`](crate::IdempotencyLayer::value_extension).
    type Value: Clone + Send + Sync + 'static;

    /// Decides from the request head alone, before the body is read: guard the request, refuse
    /// it, or pass it to the inner service untouched, as for a method that is not a create.
    fn head(&self, parts: &Parts) -> Head;

    /// Validates a guarded request whose whole body is `body`, and yields its key, its
    /// fingerprint and its value.
    ///
    /// # Errors
    ///
    /// The [`Rejection`] the client gets, for an invalid body or an invalid key.
    fn parse<'a>(
        &self,
        parts: &'a Parts,
        body: &Bytes,
    ) -> Result<Parsed<'a, Self::Value>, Rejection>;

    /// The response for a refusal or failure of the layer. The default writes RFC 9457
    /// `application/problem+json`, as [`JsonOperation`] does.
    fn reply(&self, rejection: &Rejection) -> Response<Bytes> {
        crate::problem::reply(rejection)
    }

    /// The path the layer guards when none is configured: `None` guards every path, and the
    /// layer then sits on a route, e.g. with axum's `route_layer`.
    fn default_path(&self) -> Option<&'static str> {
        None
    }

    /// The request body limit when none is configured, in bytes.
    fn default_body_limit(&self) -> usize {
        DEFAULT_BODY_LIMIT
    }

    /// Whether the inner service gets the [`Value`](Operation::Value) in the request extensions
    /// when the layer does not say with
    /// [`IdempotencyLayer::value_extension`](crate::IdempotencyLayer::value_extension). `false`
    /// by default: a request's first extension costs three allocations, and most handlers read
    /// the body themselves. An operation whose value is what its handler wants, such as
    /// [`JsonOperation::typed`], says `true`.
    fn hands_over_value(&self) -> bool {
        false
    }

    /// Whether the layer advertises the store's replay window on this operation's answers
    /// (the `Idempotency-TTL` header), unless it says otherwise
    /// with [`IdempotencyLayer::window_header`](crate::IdempotencyLayer::window_header). `true`
    /// by default; a contract that fixes its answers' headers, such as [`LabelContract`], says
    /// `false`.
    fn advertises_window(&self) -> bool {
        true
    }

    /// Whether a key whose replay window passed, and which the store remembers (its
    /// [`Tombstone`](crate::store::Tombstone)), is answered *key expired* rather than created
    /// again, unless the layer says otherwise with
    /// [`IdempotencyLayer::answer_expired`](crate::IdempotencyLayer::answer_expired). `true`
    /// by default; a contract that treats a key past its window as new, such as
    /// [`LabelContract`], says `false`.
    fn answers_expired(&self) -> bool {
        true
    }
}

/// What [`Operation::head`] decided.
#[derive(Debug)]
pub enum Head {
    /// A create the layer guards: read the body, then [`Operation::parse`].
    Guard,
    /// Not a guarded request, such as a `GET` beside the create: the inner service gets it
    /// untouched.
    PassThrough,
    /// Refused before the body is read.
    Reject(Rejection),
}

/// A valid operation, as [`Operation::parse`] yields it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a, T> {
    /// The idempotency key as the client meant it, borrowed from the request head where it can
    /// be. The layer claims it within the scope, the method and the path; see
    /// [`store_key`](crate::scope::store_key).
    pub key: Cow<'a, str>,
    /// What two attempts must share to be the same operation.
    pub fingerprint: Fingerprint,
    /// Handed to admission, and to the inner service in the request extensions when it is
    /// handed over; see [`Operation::hands_over_value`].
    pub value: T,
}
