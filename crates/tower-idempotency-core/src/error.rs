//! A store's failure, and its kind.

use std::fmt;

/// What a store error may carry as its cause.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or failed to answer.
    Unavailable,
    /// The backend did not answer within the configured time.
    Timeout,
    /// The key is not pending under the given reservation: it was completed, released, or never
    /// claimed by this attempt. Nothing was changed.
    ReservationLost,
    /// A record in the backend could not be decoded.
    Corrupt,
    /// The store's configuration is invalid (a malformed URL or table name, say).
    InvalidConfig,
    /// The store holds as many records as it may
    /// ([`MemoryStoreBuilder::max_records`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.MemoryStoreBuilder.html#method.max_records)); nothing was claimed.
    CapacityExceeded,
    /// The store does not offer this call (an [`Operator`](crate::Operator) call on a
    /// [`DynStore::without_operator`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.DynStore.html#method.without_operator)).
    Unsupported,
    /// A complete whose transaction did not commit: the server refused the commit, or it was
    /// never sent. The response is not stored and the create's own writes in that
    /// transaction did not happen. The layer answers `503 store_unavailable` instead of the
    /// response.
    Uncommitted,
    /// A complete whose transaction's `COMMIT` was sent and its answer lost (a timeout, a
    /// connection that broke), or answered by an interruption (a server shutting down, a
    /// session killed while a replica's acknowledgement was awaited): the transaction may
    /// have committed, with the create's writes
    /// and the record, or not. Nothing is settled; the layer answers `503 outcome_unknown`
    /// and the function API [`RunError::Unknown`](https://docs.rs/tower-idempotency/latest/tower_idempotency/idempotent/enum.RunError.html#variant.Unknown): a
    /// retry with the same key replays if it committed, and creates if not.
    CommitUnknown,
    /// A transactional store's complete found the claim's transaction's connection held, and
    /// could not wait for it: the create answered a response over the cap whose body, still
    /// to be streamed, holds the connection (a `SqlTransactionConnection` inside the body).
    /// Nothing commits (the transaction ends with the body); the layer answers
    /// `500 create_failed` at once. Read what the response needs before answering, and drop
    /// the connection.
    ConnectionHeld,
    /// A claim no replica confirmed in time (a Redis store's
    /// [replica wait](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/redis/struct.RedisStore.html#method.wait_for_replicas) fell short): a new claim
    /// was released again on the primary, a replay not served. The layer answers
    /// `503 store_unavailable` and settles the claim as a lost one
    /// ([`Store::settle_claim`](crate::Store::settle_claim)): a replica may hold the claim
    /// without its undo, and be promoted.
    Unreplicated,
}

/// The one error type of every [`Store`](crate::Store).
///
/// Backends convert their driver errors into it, keeping the original as its
/// [`source`](std::error::Error::source). Its `Display` says what went wrong, not its source
/// (an error chain would print the cause twice); the alternate form (`{:#}`) adds every
/// cause of the chain.
///
/// ```
/// use tower_idempotency_core::{StoreError, StoreErrorKind};
///
/// let error = StoreError::new(StoreErrorKind::Timeout);
/// assert_eq!(error.kind(), StoreErrorKind::Timeout);
/// assert_eq!(error.to_string(), "store timed out");
///
/// let error = StoreError::with_source(StoreErrorKind::Unavailable, "connection refused");
/// assert_eq!(error.to_string(), "store unavailable");
/// assert_eq!(format!("{error:#}"), "store unavailable: connection refused");
///
/// // A cause that quotes its own source is not followed by it again.
/// #[derive(Debug)]
/// struct Quoting(std::io::Error);
/// impl std::fmt::Display for Quoting {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "creating a connection: {}", self.0)
///     }
/// }
/// impl std::error::Error for Quoting {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let refused = std::io::Error::other("refused");
/// let error = StoreError::with_source(StoreErrorKind::Unavailable, Quoting(refused));
/// assert_eq!(format!("{error:#}"), "store unavailable: creating a connection: refused");
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
}

impl StoreError {
    /// An error of the given kind with no further cause.
    pub fn new(kind: StoreErrorKind) -> Self {
        Self { kind, source: None }
    }

    /// An error of the given kind caused by a backend error.
    pub fn with_source(kind: StoreErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::Timeout => "store timed out",
            StoreErrorKind::ReservationLost => "reservation lost",
            StoreErrorKind::Corrupt => "corrupt store record",
            StoreErrorKind::InvalidConfig => "invalid store configuration",
            StoreErrorKind::CapacityExceeded => "store full",
            StoreErrorKind::Unsupported => "not supported by this store",
            StoreErrorKind::Uncommitted => "store transaction not committed",
            StoreErrorKind::CommitUnknown => "store transaction's commit unanswered",
            StoreErrorKind::ConnectionHeld => {
                "store transaction's connection held by the response body past the cap"
            }
            StoreErrorKind::Unreplicated => "store claim not confirmed by a replica",
        };
        if !f.alternate() {
            return f.write_str(what);
        }
        // The causes in order, each unless the text so far ends with it already (a cause
        // that quotes its own source).
        let mut text = what.to_owned();
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            let said = error.to_string();
            if !text.ends_with(&said) {
                text.push_str(": ");
                text.push_str(&said);
            }
            cause = error.source();
        }
        f.write_str(&text)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
