//! The replies the layer writes itself, byte for byte, and the outcome it reports.
//!
//! Every reply has `Content-Type: application/json` and exactly its body bytes, with no
//! trailing newline; the crate docs list them all.

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::body::ResponseBody;

/// What the layer did with a request, attached to every response it returns as a response
/// extension, so an outer layer (metrics, logs) can count it.
///
/// ```
/// use tower_idempotency::Outcome;
///
/// assert_eq!(Outcome::Replay.as_str(), "replay");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// A new operation was created and completed; the reply is its stored response.
    Created,
    /// A new operation was created, but storing its response failed: the key stays pending.
    CompleteFailed,
    /// The stored response of a completed operation was replayed.
    Replay,
    /// The operation is pending: `409 request_pending`.
    Pending,
    /// The key belongs to another operation: `409 idempotency_conflict`.
    Conflict,
    /// Admission refused with this status (429 or 503); the key was released.
    NotAdmitted(StatusCode),
    /// The request failed validation with this status (404, 405, 415, 413, 400, or 403 for a
    /// missing scope).
    Rejected(StatusCode),
    /// The store failed to claim: `503 store_unavailable`, nothing created.
    StoreUnavailable,
    /// The inner service failed or its response was over the cap: 500, the key stays pending.
    CreateFailed,
}

impl Outcome {
    /// A short lowercase name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::CompleteFailed => "complete_failed",
            Self::Replay => "replay",
            Self::Pending => "pending",
            Self::Conflict => "conflict",
            Self::NotAdmitted(_) => "not_admitted",
            Self::Rejected(_) => "rejected",
            Self::StoreUnavailable => "store_unavailable",
            Self::CreateFailed => "create_failed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAdmitted(status) | Self::Rejected(status) => {
                write!(f, "{} {}", self.as_str(), status.as_u16())
            }
            _ => f.write_str(self.as_str()),
        }
    }
}

/// The replay marker header, sent on replays only when
/// [`IdempotencyLayer::mark_replays`](crate::IdempotencyLayer::mark_replays) is on:
/// `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// One fixed reply of the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    NotFound,
    MethodNotAllowed,
    UnsupportedMediaType,
    PayloadTooLarge,
    InvalidRequest,
    ScopeRequired,
    Conflict,
    Pending,
    NotAdmitted(StatusCode),
    StoreUnavailable,
    CreateFailed,
    ResponseTooLarge,
}

impl Reply {
    fn parts(self) -> (StatusCode, &'static [u8], Outcome) {
        match self {
            Self::NotFound => (
                StatusCode::NOT_FOUND,
                br#"{"error":"not_found"}"#,
                Outcome::Rejected(StatusCode::NOT_FOUND),
            ),
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                br#"{"error":"method_not_allowed"}"#,
                Outcome::Rejected(StatusCode::METHOD_NOT_ALLOWED),
            ),
            Self::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                br#"{"error":"unsupported_media_type"}"#,
                Outcome::Rejected(StatusCode::UNSUPPORTED_MEDIA_TYPE),
            ),
            Self::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                br#"{"error":"payload_too_large"}"#,
                Outcome::Rejected(StatusCode::PAYLOAD_TOO_LARGE),
            ),
            Self::InvalidRequest => (
                StatusCode::BAD_REQUEST,
                br#"{"error":"invalid_request"}"#,
                Outcome::Rejected(StatusCode::BAD_REQUEST),
            ),
            Self::ScopeRequired => (
                StatusCode::FORBIDDEN,
                br#"{"error":"scope_required"}"#,
                Outcome::Rejected(StatusCode::FORBIDDEN),
            ),
            Self::Conflict => (
                StatusCode::CONFLICT,
                br#"{"error":"idempotency_conflict"}"#,
                Outcome::Conflict,
            ),
            Self::Pending => (
                StatusCode::CONFLICT,
                br#"{"error":"request_pending"}"#,
                Outcome::Pending,
            ),
            Self::NotAdmitted(status) => (
                status,
                br#"{"error":"not_admitted"}"#,
                Outcome::NotAdmitted(status),
            ),
            Self::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"error":"store_unavailable"}"#,
                Outcome::StoreUnavailable,
            ),
            Self::CreateFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                br#"{"error":"create_failed"}"#,
                Outcome::CreateFailed,
            ),
            Self::ResponseTooLarge => (
                StatusCode::INTERNAL_SERVER_ERROR,
                br#"{"error":"response_too_large"}"#,
                Outcome::CreateFailed,
            ),
        }
    }

    /// The reply as a response, with its outcome attached.
    pub(crate) fn into_response<B>(self) -> Response<ResponseBody<B>> {
        let (status, body, outcome) = self.parts();
        let mut response = Response::new(ResponseBody::full(Bytes::from_static(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match self {
            Self::MethodNotAllowed => {
                headers.insert(ALLOW, HeaderValue::from_static("POST"));
            }
            Self::NotAdmitted(_) | Self::StoreUnavailable => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
            }
            _ => {}
        }
        response.extensions_mut().insert(outcome);
        response
    }
}

/// A stored response as a reply, value for value.
pub(crate) fn stored<B>(
    stored: crate::StoredResponse,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
    let (status, headers, body) = stored.into_parts();
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(outcome);
    response
}
