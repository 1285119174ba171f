//! The stored response: what a complete stores and a replay writes back, byte for byte.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::{StoreError, codec};

/// A completed response as the store holds it: status, every header value in order, and the
/// exact body bytes.
///
/// Replaying it writes what the store holds, value for value: a header with two values, such as
/// two `ETag`s, is replayed with both, in order.
///
/// ```
/// use tower_idempotency_core::StoredResponse;
/// use http::{header, HeaderMap, HeaderValue, StatusCode};
///
/// let mut headers = HeaderMap::new();
/// headers.append(header::ETAG, HeaderValue::from_static("\"label-901-v1\""));
/// headers.append(header::ETAG, HeaderValue::from_static("\"backup\""));
/// let stored = StoredResponse::new(StatusCode::CREATED, headers, "{}".into());
///
/// let etags: Vec<_> = stored.headers().get_all(header::ETAG).iter().collect();
/// assert_eq!(etags, ["\"label-901-v1\"", "\"backup\""]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// Boxed: most responses have none, and a claim's answer stays small.
    trailers: Option<Box<HeaderMap>>,
}

impl StoredResponse {
    /// A stored response from its parts.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            trailers: None,
            body,
        }
    }

    /// The stored status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Every stored header value, in order.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The exact stored body bytes.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// This response with trailers after its body, such as a gRPC response's `grpc-status`,
    /// stored and replayed with it, every value in order.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use tower_idempotency_core::StoredResponse;
    ///
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", HeaderValue::from_static("0"));
    /// let stored = StoredResponse::new(StatusCode::OK, HeaderMap::new(), "message".into())
    ///     .with_trailers(trailers.clone());
    /// assert_eq!(stored.trailers(), Some(&trailers));
    /// assert_eq!(StoredResponse::from_bytes(stored.to_bytes()).unwrap(), stored);
    /// ```
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(Box::new(trailers));
        self
    }

    /// The stored trailers, if the response had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }

    /// The parts, to build a reply from; see
    /// [`into_parts_with_trailers`](Self::into_parts_with_trailers) for the trailers.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, Bytes) {
        (self.status, self.headers, self.body)
    }

    /// The parts and the trailers, if any.
    pub fn into_parts_with_trailers(self) -> (StatusCode, HeaderMap, Bytes, Option<HeaderMap>) {
        (
            self.status,
            self.headers,
            self.body,
            self.trailers.map(|t| *t),
        )
    }

    /// The response as one buffer, in the format the built-in remote stores keep, for a store
    /// of your own that keeps bytes. [`from_bytes`](Self::from_bytes) reads it back exactly:
    /// the status, every header value in order and the body. Header bytes that are not
    /// UTF-8 are kept too.
    ///
    /// The format, version 1 for a response without trailers; all integers are big-endian:
    ///
    /// ```text
    /// version  u8   1
    /// status   u16
    /// count    u16  the number of header values (at most 65,535 are kept)
    /// count ×  name length u16, name (lowercase ASCII), value length u32, value bytes
    /// body     every remaining byte
    /// ```
    ///
    /// Version 2, for a response with trailers: the version byte 2, the status and the headers
    /// as above, then the body's length as a u32 and the body, then the trailers as the headers
    /// are: a count u16, then each value.
    ///
    /// A later version of this crate may write a later version of the format, with more parts
    /// of a response, and still reads every earlier one.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode, header};
    /// use tower_idempotency_core::StoredResponse;
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    /// let created = StoredResponse::new(StatusCode::CREATED, headers, "{}".into());
    ///
    /// let bytes = created.to_bytes();
    /// assert_eq!(&bytes[..3], &[1, 0, 201]);
    /// assert_eq!(StoredResponse::from_bytes(bytes).unwrap(), created);
    /// ```
    pub fn to_bytes(&self) -> Bytes {
        codec::encode(self)
    }

    /// Reads a response written by [`to_bytes`](Self::to_bytes) of this version of the crate or
    /// an earlier one. The body shares `bytes`, without a copy.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Corrupt`](crate::StoreErrorKind::Corrupt) for anything else: a version it does not know, a status out
    /// of range, a header name or value that is not valid, a length past the end. It never
    /// panics, whatever the bytes.
    ///
    /// ```
    /// use tower_idempotency_core::{StoreErrorKind, StoredResponse};
    ///
    /// let error = StoredResponse::from_bytes(bytes::Bytes::from_static(b"\x09junk")).unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Corrupt);
    /// ```
    pub fn from_bytes(bytes: Bytes) -> Result<Self, StoreError> {
        codec::decode(bytes)
    }
}

/// The header of a stored response whose body was not kept, because the created response
/// was over the cap (the layer's `response_limit`):
/// `Idempotent-Body-Omitted: true`. The first client got the response whole; a retry gets its
/// status and headers (`Location`, `ETag`, …), an empty body, and this header. The headers
/// that describe the body (`Content-Length`, `Content-Encoding`, `Content-Range` and the
/// digests) are not kept.
///
/// ```
/// assert_eq!(tower_idempotency::reply::IDEMPOTENT_BODY_OMITTED, "idempotent-body-omitted");
/// ```
pub const IDEMPOTENT_BODY_OMITTED: http::HeaderName =
    http::HeaderName::from_static("idempotent-body-omitted");
