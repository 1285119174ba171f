//! The operation a create request carries, its strict validation and its fingerprint.
//!
//! A client stores a [`LabelOperation`] *before* its first attempt and builds every attempt from
//! it with [`LabelOperation::attempt`], so that every attempt carries the same `Idempotency-Key`
//! and the same body bytes. The server side parses the body with [`LabelOperation::from_json`] and
//! compares intents with [`fingerprint`].
//!
//! ```
//! use tower_idempotency::{fingerprint, LabelOperation};
//!
//! let op = LabelOperation::new("label-req-7", "parcel-42");
//! let attempt = op.attempt("/labels").unwrap();
//! assert_eq!(attempt.headers()["idempotency-key"], "label-req-7");
//! assert_eq!(attempt.body(), r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#);
//!
//! let parsed = LabelOperation::from_json(br#"{"parcel_id":"parcel-42", "request_id" : "label-req-7"}"#).unwrap();
//! assert_eq!(parsed, op);
//! assert_eq!(
//!     fingerprint(&parsed.request_id, &parsed.parcel_id).as_str(),
//!     "9c2dc67e4c22f75bcc63a19e384876bc7f83fd8f117cb45df4aa1ec13e49ae3a",
//! );
//! ```

use std::fmt;

use http::{HeaderValue, Method, Request, Uri, header};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The name of the header that carries the idempotency key: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: header::HeaderName = header::HeaderName::from_static("idempotency-key");

/// One create operation: the intent (`request_id`) and the object it acts on (`parcel_id`).
///
/// Its JSON form is exactly `{"request_id":"…","parcel_id":"…"}`. `request_id` names the
/// operation, not the parcel: two different `request_id`s with the same `parcel_id` are two
/// operations, not a retry.
///
/// On the server side the layer puts the validated operation into the request extensions, so
/// the inner service can read it without parsing the body again.
///
/// ```
/// use tower_idempotency::LabelOperation;
///
/// let op = LabelOperation::new("label-req-7", "parcel-42");
/// assert_eq!(
///     serde_json::to_string(&op).unwrap(),
///     r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#,
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelOperation {
    /// The operation's identity; also the value of every attempt's `Idempotency-Key`.
    pub request_id: String,
    /// The parcel the label is created for.
    pub parcel_id: String,
}

/// The body or key of a request is not a valid operation (contract §2, steps 5 and 6).
///
/// ```
/// use tower_idempotency::LabelOperation;
///
/// assert!(LabelOperation::from_json(br#"{"request_id":"","parcel_id":"p"}"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidOperation(());

impl fmt::Display for InvalidOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid label operation")
    }
}

impl std::error::Error for InvalidOperation {}

impl LabelOperation {
    /// Creates an operation from its two identifiers.
    ///
    /// No validation happens here; a server validates with [`LabelOperation::from_json`].
    ///
    /// ```
    /// use tower_idempotency::LabelOperation;
    ///
    /// let op = LabelOperation::new("label-req-7", "parcel-42");
    /// assert_eq!(op.request_id, "label-req-7");
    /// ```
    pub fn new(request_id: impl Into<String>, parcel_id: impl Into<String>) -> Self {
        Self {
            request_id: request_id.into(),
            parcel_id: parcel_id.into(),
        }
    }

    /// Parses and validates a request body strictly.
    ///
    /// The body must be exactly one JSON object with exactly the fields `request_id` and
    /// `parcel_id`, each a non-empty string of `[A-Za-z0-9_-]`, followed by nothing but
    /// whitespace.
    ///
    /// # Errors
    ///
    /// [`InvalidOperation`] for anything else: a missing or extra field, `null`, a number, a
    /// boolean, an empty string, a character outside the alphabet, a second JSON value.
    ///
    /// ```
    /// use tower_idempotency::LabelOperation;
    ///
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b"}"#).is_ok());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b","x":1}"#).is_err());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b"} {}"#).is_err());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a b","parcel_id":"b"}"#).is_err());
    /// ```
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidOperation> {
        let op: Self = serde_json::from_slice(body).map_err(|_| InvalidOperation(()))?;
        if is_identifier(&op.request_id) && is_identifier(&op.parcel_id) {
            Ok(op)
        } else {
            Err(InvalidOperation(()))
        }
    }

    /// The fingerprint of this operation; see [`fingerprint`].
    ///
    /// ```
    /// use tower_idempotency::{fingerprint, LabelOperation};
    ///
    /// let op = LabelOperation::new("a", "b");
    /// assert_eq!(op.fingerprint(), fingerprint("a", "b"));
    /// ```
    pub fn fingerprint(&self) -> Fingerprint {
        fingerprint(&self.request_id, &self.parcel_id)
    }

    /// The JSON body of every attempt: `{"request_id":"…","parcel_id":"…"}`.
    ///
    /// ```
    /// use tower_idempotency::LabelOperation;
    ///
    /// assert_eq!(
    ///     LabelOperation::new("r", "p").to_json(),
    ///     r#"{"request_id":"r","parcel_id":"p"}"#,
    /// );
    /// ```
    pub fn to_json(&self) -> String {
        // Serialising two strings into a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Builds one attempt of this operation: `POST uri`, `Content-Type: application/json`,
    /// `Idempotency-Key: <request_id>` and the JSON body.
    ///
    /// Every call with the same operation gives the same header and the same body bytes: the key
    /// is bound to the intent, not to the delivery.
    ///
    /// # Errors
    ///
    /// An [`http::Error`] if `uri` is not a valid URI or `request_id` is not a valid header
    /// value.
    ///
    /// ```
    /// use tower_idempotency::LabelOperation;
    ///
    /// let op = LabelOperation::new("label-req-7", "parcel-42");
    /// let first = op.attempt("http://127.0.0.1:3000/labels").unwrap();
    /// let second = op.attempt("http://127.0.0.1:3000/labels").unwrap();
    /// assert_eq!(first.method(), "POST");
    /// assert_eq!(first.headers()["content-type"], "application/json");
    /// assert_eq!(first.headers(), second.headers());
    /// assert_eq!(first.body(), second.body());
    /// ```
    pub fn attempt<U>(&self, uri: U) -> Result<Request<String>, http::Error>
    where
        Uri: TryFrom<U>,
        <Uri as TryFrom<U>>::Error: Into<http::Error>,
    {
        let key = HeaderValue::try_from(self.request_id.as_str())?;
        Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .header(IDEMPOTENCY_KEY, key)
            .body(self.to_json())
    }
}

/// A validated field: non-empty, only `[A-Za-z0-9_-]`.
fn is_identifier(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The SHA-256 fingerprint of an operation, as 64 lowercase hexadecimal characters.
///
/// Held inline: computing, comparing and storing it allocates nothing.
///
/// ```
/// use tower_idempotency::fingerprint;
///
/// let fp = fingerprint("label-req-7", "parcel-42");
/// assert_eq!(fp.as_str().len(), 64);
/// assert_eq!(fp.to_string(), fp.as_str());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 64]);

impl Fingerprint {
    /// The fingerprint as 64 lowercase hexadecimal characters.
    pub fn as_str(&self) -> &str {
        // Only ever filled with ASCII hex digits, by `fingerprint` or `parse`, so this never
        // falls back to the empty string.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Parses a fingerprint from its 64-character lowercase hexadecimal form, as a store reads
    /// it back.
    ///
    /// ```
    /// use tower_idempotency::{fingerprint, Fingerprint};
    ///
    /// let fp = fingerprint("a", "b");
    /// assert_eq!(Fingerprint::parse(fp.as_str()), Some(fp));
    /// assert_eq!(Fingerprint::parse("not hex"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let bytes: [u8; 64] = text.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(Self(bytes))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.as_str())
    }
}

/// `lowercase_hex(sha256(request_id + "\n" + parcel_id))`: the contract's fingerprint (§3).
///
/// It is computed from validated field values, not from the raw body, so field order and
/// whitespace do not change it. It compares intents; it proves nothing about who sent them.
///
/// ```
/// use tower_idempotency::fingerprint;
///
/// assert_eq!(
///     fingerprint("label-req-7", "parcel-42").as_str(),
///     "9c2dc67e4c22f75bcc63a19e384876bc7f83fd8f117cb45df4aa1ec13e49ae3a",
/// );
/// ```
pub fn fingerprint(request_id: &str, parcel_id: &str) -> Fingerprint {
    let digest = Sha256::new()
        .chain_update(request_id.as_bytes())
        .chain_update(b"\n")
        .chain_update(parcel_id.as_bytes())
        .finalize();
    let mut hex_digits = [0u8; 64];
    // The buffer is exactly twice the digest length, so encoding cannot fail.
    let _ = hex::encode_to_slice(digest, &mut hex_digits);
    Fingerprint(hex_digits)
}
