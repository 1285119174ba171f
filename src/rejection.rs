//! Every refusal the layer answers itself, declared once: the [`Rejection`] and, for each, its
//! code, title, status, detail, and whether it carries `Retry-After`. The formats read this table and override only what
//! differs: the problem details (the `problem` module) take every row as it is, the label
//! contract and gRPC change a few (each says which, and why, where it does).
//!
//! A new refusal is a variant of [`Rejection`] and a row here, in this file alone: the row's
//! doc comment is its section of the problem page. The problem details follow, and the label
//! contract and gRPC answer the row too unless their `match` says otherwise. The reply tables
//! in the docs and the README are rendered from the code: `UPDATE_REPLY_TABLES=1 cargo test
//! --lib documented` writes them anew.

use std::borrow::Cow;

use http::StatusCode;

use crate::admission::Refusal;
use crate::outcome::{Invalid, Outcome};

/// A refusal or failure the layer answers itself, in the words of the contract. Each
/// [`Operation`](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/trait.Operation.html) writes it in its own format with [`Operation::reply`]: the
/// label contract as `{"error":"…"}`, the generic operations as RFC 9457 problem details.
///
/// [`Operation::reply`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/trait.Operation.html#method.reply
///
/// ```
/// use tower_idempotency::JsonOperation;
/// use tower_idempotency::operation::Operation;
/// use tower_idempotency::operation::LabelContract;
/// use tower_idempotency::reply::Rejection;
///
/// let label = LabelContract.reply(&Rejection::Conflict);
/// assert_eq!((label.status().as_u16(), &label.body()[..]), (409, &br#"{"error":"idempotency_conflict"}"#[..]));
/// let problem = JsonOperation::new().reply(&Rejection::Conflict);
/// assert_eq!(problem.status(), 422);
/// assert_eq!(problem.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The request is not on the guarded path.
    NotFound,
    /// The method is not the create's.
    MethodNotAllowed,
    /// The body's `Content-Type` is not one the operation reads.
    UnsupportedMediaType,
    /// The body is over the limit.
    PayloadTooLarge,
    /// The `Idempotency-Key` header is missing, repeated or invalid.
    InvalidKey,
    /// The body is not a valid operation: why, and the member it is about.
    InvalidRequest(Invalid),
    /// A scope is configured and the request has none.
    ScopeRequired,
    /// The key belongs to another operation, with another fingerprint.
    Conflict,
    /// The operation's first attempt has not completed.
    Pending,
    /// Admission refused; the key was released.
    NotAdmitted(Refusal),
    /// The store failed to claim; nothing was created.
    StoreUnavailable,
    /// The create failed.
    CreateFailed,
    /// The created response body went past the size its own size hint declared. A response
    /// merely over the cap is given whole and stored compact: see
    /// [`StoredResponses`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#a-response-over-the-cap).
    ResponseTooLarge,
    /// The create's transaction may or may not have committed: its `COMMIT` went unanswered.
    OutcomeUnknown,
    /// The key's replay window has passed: the operation took effect, or may have, and is not
    /// created again. With what the store remembers of it (its
    /// [`Tombstone`](crate::store::Tombstone): when it completed, its `Location`), which the
    /// problem details carry as the members `completed_at` (an HTTP date) and `location`; or
    /// `None` for a retry whose first attempt is older than the window and of which the store
    /// kept nothing (see
    /// [`IdempotencyLayer::refuse_past_window`](crate::IdempotencyLayer::refuse_past_window)).
    KeyExpired(Option<crate::store::Tombstone>),
}

impl Rejection {
    /// An invalid request with a detail for the client.
    ///
    /// ```
    /// use tower_idempotency::reply::{Invalid, Rejection};
    /// assert_eq!(
    ///     Rejection::invalid("amount must be positive"),
    ///     Rejection::InvalidRequest(Invalid::new("amount must be positive")),
    /// );
    /// ```
    pub fn invalid(detail: impl Into<Cow<'static, str>>) -> Self {
        Self::InvalidRequest(Invalid::new(detail))
    }

    /// What the layer reports for this rejection.
    pub fn outcome(&self, status: StatusCode) -> Outcome {
        match self {
            Self::Conflict => Outcome::Conflict,
            Self::Pending => Outcome::Pending,
            Self::NotAdmitted(refusal) => Outcome::NotAdmitted(refusal.status()),
            Self::StoreUnavailable => Outcome::StoreUnavailable,
            Self::CreateFailed | Self::ResponseTooLarge => Outcome::CreateFailed,
            Self::OutcomeUnknown => Outcome::Unknown,
            Self::KeyExpired(_) => Outcome::Expired,
            _ => Outcome::Rejected(status),
        }
    }

    /// One of each rejection, in the order the checks run, for tables and tests.
    #[cfg(test)]
    pub(crate) fn every() -> Vec<Self> {
        vec![
            Self::NotFound,
            Self::MethodNotAllowed,
            Self::UnsupportedMediaType,
            Self::PayloadTooLarge,
            Self::InvalidKey,
            Self::invalid("what is wrong"),
            Self::ScopeRequired,
            Self::Conflict,
            Self::Pending,
            Self::NotAdmitted(Refusal::TooManyRequests),
            Self::NotAdmitted(Refusal::ServiceUnavailable),
            Self::StoreUnavailable,
            Self::CreateFailed,
            Self::ResponseTooLarge,
            Self::OutcomeUnknown,
            Self::KeyExpired(None),
        ]
    }
}

/// The base of every problem type unless an operation has its own: the problem page, so
/// that a type is the address of its case's heading.
macro_rules! default_base {
    () => {
        "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#"
    };
}
pub(crate) use default_base;

/// A problem type under the default base.
macro_rules! problem_type {
    ($code:literal) => {
        concat!($crate::rejection::default_base!(), $code)
    };
}

/// Whether, and which of the layer's `Retry-After` values, a refusal carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// None: retrying the same request cannot help.
    Never,
    /// The pending key's (`1` second by default): the first attempt is still running.
    Pending,
    /// The refusals' (`2` seconds by default): admission or the store said not now.
    Refused,
}

impl Retry {
    /// The header's value unless the layer sets its own.
    pub(crate) fn default_value(self) -> Option<&'static str> {
        match self {
            Self::Never => None,
            Self::Pending => Some("1"),
            Self::Refused => Some("2"),
        }
    }
}

/// One row of the table.
#[derive(Debug)]
pub(crate) struct Declared {
    /// The refusal's name: the problem type's fragment, the label contract's `error`, the
    /// gRPC message.
    pub(crate) code: &'static str,
    /// The problem's title.
    pub(crate) title: &'static str,
    /// The status unless a format says otherwise.
    pub(crate) status: StatusCode,
    /// The problem details body, made from the row when the crate is compiled.
    pub(crate) problem: &'static [u8],
    /// The label contract's body, `{"error":"<code>"}`.
    pub(crate) error: &'static [u8],
    /// The `Retry-After` it carries.
    pub(crate) retry: Retry,
    /// What the refusal means, the row's doc comment: the problem page's section under the
    /// code's heading.
    #[cfg(test)]
    pub(crate) about: &'static str,
}

macro_rules! declare {
    ($(
        $(#[doc = $about:literal])*
        $name:ident: $code:literal, $title:literal, $status:literal $constant:ident,
        $detail:literal, $retry:ident;
    )*) => {
        $(
            $(#[doc = $about])*
            pub(crate) const $name: Declared = Declared {
                code: $code,
                title: $title,
                status: StatusCode::$constant,
                problem: concat!(
                    r#"{"type":""#, problem_type!($code),
                    r#"","title":""#, $title,
                    r#"","status":"#, $status,
                    r#","detail":""#, $detail, r#""}"#
                )
                .as_bytes(),
                error: concat!(r#"{"error":""#, $code, r#""}"#).as_bytes(),
                retry: Retry::$retry,
                #[cfg(test)]
                about: concat!($($about, "\n"),*),
            };
        )*
    };
}

declare! {
    /// No create endpoint is guarded at the request's path (a layer with a path set).
    NOT_FOUND: "not_found", "Not found", 404 NOT_FOUND,
        "No create endpoint is guarded at this path.", Never;
    /// The method is not the create's.
    METHOD_NOT_ALLOWED: "method_not_allowed", "Method not allowed", 405 METHOD_NOT_ALLOWED,
        "The method is not the create's.", Never;
    /// The body's content type is not one the operation reads.
    UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type", "Unsupported media type",
        415 UNSUPPORTED_MEDIA_TYPE,
        "The body must be sent with the content type this endpoint reads.", Never;
    /// The body is over the limit.
    PAYLOAD_TOO_LARGE: "payload_too_large", "Payload too large", 413 PAYLOAD_TOO_LARGE,
        "The body is over this endpoint's limit.", Never;
    /// The `Idempotency-Key` header is missing, repeated, empty, longer than 255 characters, or
    /// not visible ASCII.
    INVALID_KEY: "invalid_idempotency_key", "Invalid Idempotency-Key", 400 BAD_REQUEST,
        "Send one Idempotency-Key header of 1 to 255 visible ASCII characters, bare or as a quoted string.",
        Never;
    /// The body is not a valid operation; the detail says why. When the reason is about one member
    /// of the body (a wrong type, a missing member, a value the operation's check refuses), the
    /// detail starts with its JSON pointer and an `errors` member (RFC 9457 §3.2) carries it
    /// machine-readably: `"errors":[{"pointer":"/quantity","detail":"must be at least 1"}]`.
    INVALID_REQUEST: "invalid_request", "Invalid request", 400 BAD_REQUEST,
        "The body is not a valid request.", Never;
    /// A scope is configured and the request carries none.
    SCOPE_REQUIRED: "scope_required", "Scope required", 403 FORBIDDEN,
        "The request carries no scope (tenant, client) for its key.", Never;
    /// The key was used for a different payload (another fingerprint).
    CONFLICT: "idempotency_conflict", "Idempotency-Key reused", 422 UNPROCESSABLE_ENTITY,
        "The key was used for a different request payload.", Never;
    /// The first attempt with the key has not completed.
    PENDING: "request_pending", "Request pending", 409 CONFLICT,
        "The first request with this key has not completed; retry later.", Pending;
    /// Admission refused (429 or 503); nothing was created and the key is free again.
    TOO_MANY_REQUESTS: "not_admitted", "Not admitted", 429 TOO_MANY_REQUESTS,
        "Too many creates right now; nothing was created. Retry after the delay.", Refused;
    /// Admission refused (429 or 503); nothing was created and the key is free again.
    OVER_CAPACITY: "not_admitted", "Not admitted", 503 SERVICE_UNAVAILABLE,
        "Over capacity right now; nothing was created. Retry after the delay.", Refused;
    /// The store did not answer the claim; nothing was created.
    STORE_UNAVAILABLE: "store_unavailable", "Store unavailable", 503 SERVICE_UNAVAILABLE,
        "The idempotency store cannot take the request now; nothing was created. Retry after the delay.",
        Refused;
    /// The create failed without an answer; whether it took effect is unknown. What happens to the
    /// key: [a create that fails](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#a-create-that-fails).
    CREATE_FAILED: "create_failed", "Create failed", 500 INTERNAL_SERVER_ERROR,
        "The create failed; whether it took effect is unknown.", Never;
    /// The created response's body went past the size it declared (its size hint), and was
    /// not stored; the key stays taken. A response merely over the cap is no refusal: it is
    /// given whole and stored compact ([a response over the
    /// cap](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#a-response-over-the-cap)).
    RESPONSE_TOO_LARGE: "response_too_large", "Response too large", 500 INTERNAL_SERVER_ERROR,
        "The created response went past the size it declared and was not stored; the key stays taken.",
        Never;
    /// On a transactional store, the create's transaction was sent its `COMMIT` and the answer
    /// was lost (a timeout, a broken connection): the create and its record may have committed,
    /// or not. Retry after the delay with the same key: it replays the response if they did,
    /// and creates if not.
    OUTCOME_UNKNOWN: "outcome_unknown", "Outcome unknown", 503 SERVICE_UNAVAILABLE,
        "The create's commit went unanswered: whether it took effect is unknown. Retry after the delay with the same key; it replays the response if it did, and creates if not.",
        Refused;
    /// The key's replay window has passed: the first attempt with it, sent longer ago than
    /// the store replays a completed create, took effect (or may have), so the layer creates
    /// nothing again. Final: no `Retry-After`, and a retry with the same key gets the same
    /// answer. When the store remembers the operation (its tombstone), the problem carries
    /// `completed_at`, when it completed, as an HTTP date, and `location`, the created
    /// resource's `Location`, left out when the create had none (or one that is not text):
    /// `{…,"completed_at":"Tue, 14 Nov 2023 22:13:20 GMT","location":"/payments/7"}`. A client
    /// fetches the resource there; one that knows the first attempt never took effect sends a
    /// new request under a new key.
    KEY_EXPIRED: "key_expired", "Idempotency-Key expired", 409 CONFLICT,
        "The key's replay window has passed: its first request may have taken effect, and is not created again.",
        Never;
}

impl Rejection {
    /// This refusal's row of the table.
    pub(crate) fn declared(&self) -> &'static Declared {
        match self {
            Self::NotFound => &NOT_FOUND,
            Self::MethodNotAllowed => &METHOD_NOT_ALLOWED,
            Self::UnsupportedMediaType => &UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge => &PAYLOAD_TOO_LARGE,
            Self::InvalidKey => &INVALID_KEY,
            Self::InvalidRequest(_) => &INVALID_REQUEST,
            Self::ScopeRequired => &SCOPE_REQUIRED,
            Self::Conflict => &CONFLICT,
            Self::Pending => &PENDING,
            Self::NotAdmitted(Refusal::TooManyRequests) => &TOO_MANY_REQUESTS,
            Self::NotAdmitted(Refusal::ServiceUnavailable) => &OVER_CAPACITY,
            Self::StoreUnavailable => &STORE_UNAVAILABLE,
            Self::CreateFailed => &CREATE_FAILED,
            Self::ResponseTooLarge => &RESPONSE_TOO_LARGE,
            Self::OutcomeUnknown => &OUTCOME_UNKNOWN,
            Self::KeyExpired(_) => &KEY_EXPIRED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row's problem body is valid JSON that says the row's code, title and status, and
    /// a refusal of admission has its refusal's status.
    #[test]
    fn every_row_agrees_with_itself() {
        for rejection in Rejection::every() {
            let row = rejection.declared();
            let problem: serde_json::Value = serde_json::from_slice(row.problem).unwrap();
            assert_eq!(
                problem["type"],
                format!("{}{}", default_base!(), row.code),
                "{rejection:?}"
            );
            assert_eq!(problem["title"], row.title, "{rejection:?}");
            assert_eq!(problem["status"], row.status.as_u16(), "{rejection:?}");
            let error: serde_json::Value = serde_json::from_slice(row.error).unwrap();
            assert_eq!(error, serde_json::json!({ "error": row.code }));
            if let Rejection::NotAdmitted(refusal) = rejection {
                assert_eq!(row.status, refusal.status());
            }
        }
    }
}
