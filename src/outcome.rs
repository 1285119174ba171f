//! The vocabulary every layer of the crate shares: the [`Outcome`], what the layer did with a
//! request, and an [`Invalid`] request, one of the rejections (declared in the `rejection`
//! module). A leaf: it imports no other module of the crate, so the operations, the stores,
//! the replies and the bodies may all use it.

use std::borrow::Cow;

use http::StatusCode;

/// What the layer did with a request. It is on the body of every response the layer returns, as
/// `ResponseBody::outcome`, and in its extensions with
/// [`IdempotencyLayer::outcome_extension`](crate::IdempotencyLayer::outcome_extension), so an
/// outer layer such as metrics or logs can count it.
///
/// ```
/// use tower_idempotency::reply::Outcome;
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
    /// The operation is pending: the operation's *request pending* answer, `409`.
    Pending,
    /// The key belongs to another operation: the operation's *conflict* answer, `422` for the
    /// generic operations and `409` for the label contract.
    Conflict,
    /// Admission refused with this status, 429 or 503; the key was released.
    NotAdmitted(StatusCode),
    /// The request failed validation with this status: 404, 405, 415, 413, 400, or 403 for a
    /// missing scope.
    Rejected(StatusCode),
    /// The store failed to claim, or a transactional store's transaction did not commit (the
    /// server refused the commit): the operation's *store unavailable* answer, `503`; nothing
    /// created.
    StoreUnavailable,
    /// The create failed without an answer: an error, a panic, or a response body that failed
    /// within the cap. See [a create that fails](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#a-create-that-fails).
    CreateFailed,
    /// The create answered what the layer does not store (a non-`2xx` under
    /// `StoredResponses::Successful`, a `5xx` under `StoredResponses::ExceptServerErrors`),
    /// passed on unstored and its key released; see
    /// [a create that fails](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html#a-create-that-fails).
    Unstored,
    /// The create's transaction (a transactional store's) may or may not have committed: its
    /// `COMMIT` went unanswered. The operation's *outcome unknown* answer, `503`; a retry with
    /// the same key replays if it committed and creates if not.
    Unknown,
    /// The key's replay window had passed: the operation's *key expired* answer, `409`,
    /// nothing created.
    Expired,
}

impl Outcome {
    /// A short lowercase name, for logs and metrics labels: `created`, `complete_failed`,
    /// `replay`, `pending`, `conflict`, `not_admitted`, `rejected`, `store_unavailable`,
    /// `create_failed`, `unstored`, `unknown`, `expired`. The enum is `#[non_exhaustive]`: a `match` on
    /// it keeps a wildcard arm.
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
            Self::Unstored => "unstored",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
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

/// Why a request is invalid: the detail the client reads, and the member of the body it is
/// about as an RFC 6901 JSON pointer, when there is one.
///
/// [`JsonOperation`](crate::JsonOperation) names the member of every body it refuses for its
/// type: a wrong type, a missing member, an unknown one. A
/// [`validate`](crate::JsonOperation::validate) hook may name one of its own with
/// [`Invalid::at`]. The problem body carries both, the pointer first in the `detail` and each
/// in the `errors` member of RFC 9457 §3.2, so a client can match on them:
///
/// ```text
/// {"type":"…#invalid_request","title":"Invalid request","status":400,
///  "detail":"/quantity: must be at least 1",
///  "errors":[{"pointer":"/quantity","detail":"must be at least 1"}]}
/// ```
///
/// A plain string converts into one without a member: `Err("must be at least 1".into())`.
///
/// ```
/// use tower_idempotency::reply::Invalid;
///
/// let invalid = Invalid::at("/items/0/sku", "must not be empty");
/// assert_eq!(invalid.pointer(), Some("/items/0/sku"));
/// assert_eq!(invalid.detail(), "must not be empty");
/// assert_eq!(invalid.to_string(), "/items/0/sku: must not be empty");
/// assert_eq!(Invalid::from("no member").pointer(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    detail: Cow<'static, str>,
    pointer: Option<Cow<'static, str>>,
}

impl Invalid {
    /// A reason about the request as a whole.
    pub fn new(detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            detail: detail.into(),
            pointer: None,
        }
    }

    /// A reason about the member at `pointer`, a JSON pointer into the body such as `/quantity`
    /// or `/items/0/sku`; `""` is the whole body.
    pub fn at(pointer: impl Into<Cow<'static, str>>, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            detail: detail.into(),
            pointer: Some(pointer.into()),
        }
    }

    /// What is wrong, without the member.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The member it is about, as a JSON pointer, if any.
    pub fn pointer(&self) -> Option<&str> {
        self.pointer.as_deref()
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pointer {
            Some(pointer) => write!(f, "{pointer}: {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}

impl From<&'static str> for Invalid {
    fn from(detail: &'static str) -> Self {
        Self::new(detail)
    }
}

impl From<String> for Invalid {
    fn from(detail: String) -> Self {
        Self::new(detail)
    }
}

impl From<Cow<'static, str>> for Invalid {
    fn from(detail: Cow<'static, str>) -> Self {
        Self::new(detail)
    }
}
