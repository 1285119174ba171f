//! What a create request means: the [`Operation`] trait and its implementations.
//!
//! The layer is generic over an [`Operation`]: the part that reads a request and answers, from
//! its head and its (limited) body, whether it is guarded at all, whether it is valid, its
//! idempotency key, its fingerprint, and the value handed to the inner service in the request
//! extensions. Everything else (the body limit, the claim, admission, the create, the complete
//! and the replay) is the layer's, shared by every operation.
//!
//! | operation | for | key | fingerprint | refusals |
//! |---|---|---|---|---|
//! | [`JsonOperation`] | any JSON create endpoint, typed or not | the `Idempotency-Key` header (IETF draft) | method, path and query, body in canonical JSON (RFC 8785) | `application/problem+json` |
//! | [`RawOperation`] | form or binary bodies, any content type | the `Idempotency-Key` header | method, path and query, content type, exact body bytes | `application/problem+json` |
//! | [`GrpcOperation`] | unary gRPC calls of the methods it names | the `idempotency-key` metadata entry | the method's path and the framed request message | gRPC statuses in an HTTP 200 |
//! | [`LabelContract`] | the lesson's `POST /labels`, every byte fixed | `request_id`, equal to the header | `request_id` and `parcel_id` | `{"error":"…"}` |
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
use std::fmt;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, header};
use sha2::{Digest, Sha256};

use crate::reply::Rejection;

mod grpc;
pub(crate) mod jcs;
mod json;
mod key;
mod label;
pub(crate) mod media;
mod raw;

pub use self::grpc::{GrpcCall, GrpcOperation};
pub use self::json::{InvalidPointer, JsonOperation};
pub use self::key::{IdempotencyKey, MAX_KEY_LEN};
pub use self::label::{InvalidOperation, LabelContract, LabelOperation, SharedStr};
pub use self::raw::RawOperation;

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
/// the limit of the generic operations ([`JsonOperation`], [`RawOperation`]).
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// A kind of create request: how the layer tells whether a request is guarded, valid, which key
/// it claims and which fingerprint it carries.
///
/// The layer calls [`head`](Operation::head) before it reads the body, then
/// [`parse`](Operation::parse) on the whole body (at most the body limit), and writes every
/// refusal with [`reply`](Operation::reply). Nothing an operation refuses reaches the store,
/// admission or the inner service.
///
/// See the [module docs](self) for the built-in operations and an example of your own.
pub trait Operation: Clone + Send + Sync + 'static {
    /// What the inner service receives in the request extensions, and what
    /// [`Admission`](crate::admission::Admission) sees: the parsed operation.
    type Value: Clone + Send + Sync + 'static;

    /// Decides from the request head alone, before the body is read: guard the request, pass
    /// it to the inner service untouched (a method that is not a create), or refuse it.
    fn head(&self, parts: &Parts) -> Head;

    /// Validates a guarded request whose whole body is `body`, and yields its key, its
    /// fingerprint and its value.
    ///
    /// # Errors
    ///
    /// The [`Rejection`] the client gets (an invalid body, an invalid key).
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

    /// The path the layer guards when none is configured: `None` guards every path (the layer
    /// then sits on a route, e.g. with axum's `route_layer`).
    fn default_path(&self) -> Option<&'static str> {
        None
    }

    /// The request body limit when none is configured, in bytes.
    fn default_body_limit(&self) -> usize {
        DEFAULT_BODY_LIMIT
    }
}

/// What [`Operation::head`] decided.
#[derive(Debug)]
pub enum Head {
    /// A create the layer guards: read the body, then [`Operation::parse`].
    Guard,
    /// Not a guarded request (a `GET` beside the create, say): the inner service gets it
    /// untouched.
    PassThrough,
    /// Refused before the body is read.
    Reject(Rejection),
}

/// A valid operation, as [`Operation::parse`] yields it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a, T> {
    /// The idempotency key as the client meant it, borrowed from the request head where it
    /// can be. The layer claims it within the scope, the method and the path
    /// ([`store_key`](crate::scope::store_key)).
    pub key: Cow<'a, str>,
    /// What two attempts must share to be the same operation.
    pub fingerprint: Fingerprint,
    /// Handed to admission and then to the inner service in the request extensions.
    pub value: T,
}

/// The SHA-256 fingerprint of an operation: its 32-byte digest, shown as 64 lowercase
/// hexadecimal characters ([`to_hex`](Fingerprint::to_hex), `Display`).
///
/// Held inline as the digest itself: computing, comparing and storing it allocates nothing,
/// and the hexadecimal form is written only where it is shown (a trace, a remote store's
/// record).
///
/// ```
/// use tower_idempotency::operation::Fingerprint;
///
/// let fp = Fingerprint::digest([&b"POST /payments"[..], b"{}"]);
/// assert_eq!(fp.to_hex().len(), 64);
/// assert_eq!(fp.to_string(), fp.to_hex().as_str());
/// assert_eq!(fp.as_bytes().len(), 32);
/// assert_ne!(fp, Fingerprint::digest([&b"POST /payments{}"[..]]));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a SHA-256 digest.
    pub fn from_sha256(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// SHA-256 over `parts`, each prefixed with its length so that no two lists of parts share
    /// a digest.
    pub fn digest<P: AsRef<[u8]>>(parts: impl IntoIterator<Item = P>) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            let part = part.as_ref();
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self::from_sha256(hasher.finalize().into())
    }

    /// The SHA-256 digest, as a store may keep it.
    ///
    /// ```
    /// use tower_idempotency::operation::Fingerprint;
    ///
    /// let fp = Fingerprint::from_sha256([7; 32]);
    /// assert_eq!(fp.as_bytes(), &[7; 32]);
    /// ```
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The fingerprint as 64 lowercase hexadecimal characters, written on the stack.
    ///
    /// ```
    /// use tower_idempotency::operation::Fingerprint;
    ///
    /// let fp = Fingerprint::from_sha256([0xab; 32]);
    /// assert_eq!(fp.to_hex().as_str(), "ab".repeat(32));
    /// ```
    pub fn to_hex(&self) -> FingerprintHex {
        let mut digits = [0u8; 64];
        // The buffer is exactly twice the digest length, so encoding cannot fail.
        let _ = hex::encode_to_slice(self.0, &mut digits);
        FingerprintHex(digits)
    }

    /// Parses a fingerprint from its 64-character lowercase hexadecimal form, as a store reads
    /// it back.
    ///
    /// ```
    /// use tower_idempotency::LabelContract;
    /// use tower_idempotency::operation::Fingerprint;
    ///
    /// let fp = LabelContract::fingerprint("a", "b");
    /// assert_eq!(Fingerprint::parse(&fp.to_hex()), Some(fp));
    /// assert_eq!(Fingerprint::parse(&fp.to_hex().to_uppercase()), None);
    /// assert_eq!(Fingerprint::parse("not hex"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let digits: &[u8; 64] = text.as_bytes().try_into().ok()?;
        if !digits
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let mut digest = [0; 32];
        hex::decode_to_slice(digits, &mut digest).ok()?;
        Some(Self(digest))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex().as_str())
    }
}

/// A [`Fingerprint`]'s 64 lowercase hexadecimal characters, held inline; it derefs to `str`.
///
/// ```
/// use tower_idempotency::LabelContract;
///
/// let hex = LabelContract::fingerprint("label-req-7", "parcel-42").to_hex();
/// assert!(hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
/// assert_eq!(&*hex, hex.as_str());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FingerprintHex([u8; 64]);

impl FingerprintHex {
    /// The characters.
    pub fn as_str(&self) -> &str {
        // Only ever filled with ASCII hex digits by `Fingerprint::to_hex`, so this never
        // falls back to the empty string.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for FingerprintHex {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for FingerprintHex {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for FingerprintHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for FingerprintHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;

    #[test]
    fn a_fingerprint_gives_back_its_digest_for_every_byte() {
        for start in [0u8, 32, 64, 96, 128, 160, 192, 224] {
            let digest: [u8; 32] = std::array::from_fn(|i| start.wrapping_add(i as u8));
            let fp = Fingerprint::from_sha256(digest);
            assert_eq!(fp.as_bytes(), &digest);
            assert_eq!(fp.to_hex().as_str(), hex::encode(digest));
            assert_eq!(fp.to_hex().as_ref(), hex::encode(digest));
            assert_eq!(Fingerprint::parse(&fp.to_hex()), Some(fp));
        }
    }
}
