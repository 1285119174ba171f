//! RFC 9457 problem details: the replies of the generic operations
//! ([`JsonOperation`](crate::JsonOperation), [`RawOperation`](crate::RawOperation), and any
//! [`Operation`](crate::Operation) that keeps the default [`reply`](crate::Operation::reply)),
//! per draft-ietf-httpapi-idempotency-key-header.
//!
//! Every body is `{"type":…,"title":…,"status":…,"detail":…}` with
//! `Content-Type: application/problem+json`. The `type` of each case is this page with the
//! case's name as its fragment, one of the headings below.
//!
#![doc = include_str!("reply/problem.md")]
//!
//! # not_found
//! No create endpoint is guarded at the request's path (a layer with a path set).
//! # method_not_allowed
//! The method is not the create's.
//! # unsupported_media_type
//! The body's content type is not one the operation reads.
//! # payload_too_large
//! The body is over the limit.
//! # invalid_idempotency_key
//! The `Idempotency-Key` header is missing, repeated, empty, longer than 255 characters, or
//! not visible ASCII.
//! # invalid_request
//! The body is not a valid operation; the detail says why. When the reason is about one member
//! of the body (a wrong type, a missing member, a value the operation's check refuses), the
//! detail starts with its JSON pointer and an `errors` member (RFC 9457 §3.2) carries it
//! machine-readably: `"errors":[{"pointer":"/quantity","detail":"must be at least 1"}]`.
//! # scope_required
//! A scope is configured and the request carries none.
//! # idempotency_conflict
//! The key was used for a different payload (another fingerprint).
//! # request_pending
//! The first attempt with the key has not completed.
//! # not_admitted
//! Admission refused (429 or 503); nothing was created and the key is free again.
//! # store_unavailable
//! The store did not answer the claim; nothing was created.
//! # create_failed
//! The create failed; the key stays taken unless only successful responses are stored.
//! # response_too_large
//! The created response is over the cap and was not stored; the key stays taken.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::admission::Refusal;
use crate::reply::{Invalid, Rejection};

/// The media type of every problem reply.
pub const PROBLEM_JSON: &str = "application/problem+json";

macro_rules! problem_type {
    ($code:literal) => {
        concat!(
            "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#",
            $code
        )
    };
}

macro_rules! problem {
    ($code:literal, $title:literal, $status:literal, $detail:literal) => {
        concat!(
            r#"{"type":""#,
            problem_type!($code),
            r#"","title":""#,
            $title,
            r#"","status":"#,
            $status,
            r#","detail":""#,
            $detail,
            r#""}"#
        )
        .as_bytes()
    };
}

/// The problem reply for `rejection`.
pub(crate) fn reply(rejection: &Rejection) -> Response<Bytes> {
    let (status, body): (StatusCode, Bytes) = match rejection {
        Rejection::NotFound => fixed(
            StatusCode::NOT_FOUND,
            problem!(
                "not_found",
                "Not found",
                404,
                "No create endpoint is guarded at this path."
            ),
        ),
        Rejection::MethodNotAllowed => fixed(
            StatusCode::METHOD_NOT_ALLOWED,
            problem!(
                "method_not_allowed",
                "Method not allowed",
                405,
                "The method is not the create's."
            ),
        ),
        Rejection::UnsupportedMediaType => fixed(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            problem!(
                "unsupported_media_type",
                "Unsupported media type",
                415,
                "The body must be sent with the content type this endpoint reads."
            ),
        ),
        Rejection::PayloadTooLarge => fixed(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem!(
                "payload_too_large",
                "Payload too large",
                413,
                "The body is over this endpoint's limit."
            ),
        ),
        Rejection::InvalidKey => fixed(
            StatusCode::BAD_REQUEST,
            problem!(
                "invalid_idempotency_key",
                "Invalid Idempotency-Key",
                400,
                "Send one Idempotency-Key header of 1 to 255 visible ASCII characters, bare or as a quoted string."
            ),
        ),
        Rejection::InvalidRequest(why) => (StatusCode::BAD_REQUEST, invalid(why)),
        Rejection::ScopeRequired => fixed(
            StatusCode::FORBIDDEN,
            problem!(
                "scope_required",
                "Scope required",
                403,
                "The request carries no scope (tenant, client) for its key."
            ),
        ),
        Rejection::Conflict => fixed(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem!(
                "idempotency_conflict",
                "Idempotency-Key reused",
                422,
                "The key was used for a different request payload."
            ),
        ),
        Rejection::Pending => fixed(
            StatusCode::CONFLICT,
            problem!(
                "request_pending",
                "Request pending",
                409,
                "The first request with this key has not completed; retry later."
            ),
        ),
        Rejection::NotAdmitted(Refusal::TooManyRequests) => fixed(
            StatusCode::TOO_MANY_REQUESTS,
            problem!(
                "not_admitted",
                "Not admitted",
                429,
                "Too many creates right now; nothing was created. Retry after the delay."
            ),
        ),
        Rejection::NotAdmitted(Refusal::ServiceUnavailable) => fixed(
            StatusCode::SERVICE_UNAVAILABLE,
            problem!(
                "not_admitted",
                "Not admitted",
                503,
                "Over capacity right now; nothing was created. Retry after the delay."
            ),
        ),
        Rejection::StoreUnavailable => fixed(
            StatusCode::SERVICE_UNAVAILABLE,
            problem!(
                "store_unavailable",
                "Store unavailable",
                503,
                "The idempotency store did not answer; nothing was created. Retry after the delay."
            ),
        ),
        Rejection::CreateFailed => fixed(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem!(
                "create_failed",
                "Create failed",
                500,
                "The create failed; whether it took effect is unknown."
            ),
        ),
        Rejection::ResponseTooLarge => fixed(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem!(
                "response_too_large",
                "Response too large",
                500,
                "The created response is over the cap and was not stored; the key stays taken."
            ),
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if matches!(
        rejection,
        Rejection::NotAdmitted(_) | Rejection::StoreUnavailable
    ) {
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
    }
    response
}

fn fixed(status: StatusCode, body: &'static [u8]) -> (StatusCode, Bytes) {
    (status, Bytes::from_static(body))
}

/// The one problem with a detail of the operation's: an invalid body, and the member it is
/// about in `errors` (RFC 9457 §3.2's extension) when it names one.
fn invalid(why: &Invalid) -> Bytes {
    // Serialising a string cannot fail.
    let json = |text: &str| serde_json::to_string(text).unwrap_or_default();
    let detail = json(&why.to_string());
    let errors = match why.pointer() {
        Some(pointer) => format!(
            r#","errors":[{{"pointer":{},"detail":{}}}]"#,
            json(pointer),
            json(why.detail())
        ),
        None => String::new(),
    };
    Bytes::from(format!(
        r#"{{"type":"{}","title":"Invalid request","status":400,"detail":{detail}{errors}}}"#,
        problem_type!("invalid_request")
    ))
}
