//! What an operator's tools need of a store: a record's state, the pending keys, and resolving
//! or forgetting a stuck key.

use std::future::Future;
use std::time::{Duration, SystemTime};

use http::StatusCode;

use super::{Store, StoreError, StoredResponse, Tombstone};
use crate::fingerprint::Fingerprint;

/// What an operator does with keys a crash left pending: look one up, list the old ones,
/// resolve one with the response the create gave (it becomes a replay), or forget one (it
/// becomes free). Every built-in store implements it; the `idempotency_keys` tool (the `idempotency-keys` crate) is a
/// command line over it.
///
/// Keys are store keys, as [`store_key`](https://docs.rs/tower-idempotency/latest/tower_idempotency/scope/fn.store_key.html) derives them from what a client
/// sends.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_idempotency_core::{Operator, RecordState};
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency_core::Store;
/// use tower_idempotency_core::Fingerprint;
/// use tower_idempotency_core::StoredResponse;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// store.claim("k", &Fingerprint::digest(["k", "p"])).await.unwrap(); // then the process crashed
/// assert_eq!(store.pending_older_than(Duration::ZERO).await.unwrap(), ["k"]);
/// assert_eq!(store.inspect("k").await.unwrap().unwrap().state, RecordState::Pending);
///
/// let created = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "{}".into());
/// store.resolve("k", &created).await.unwrap(); // the business system says it was created
/// assert_eq!(store.inspect("k").await.unwrap().unwrap().status, Some(StatusCode::CREATED));
/// assert!(store.forget("k").await.unwrap());
/// # }
/// ```
pub trait Operator: Store {
    /// The record of `key`, if there is one: pending, completed, or
    /// [`Expired`](RecordState::Expired) once its replay window passed while its tombstone is
    /// kept (its `status` the create's; whether or not a purge dropped its response yet). A
    /// record past both windows is `None`, as to a claim, on the stores that keep tombstones.
    ///
    /// # Errors
    ///
    /// A [`StoreError`](crate::StoreError) when the backend cannot answer or a record cannot be decoded.
    fn inspect(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<RecordInfo>, StoreError>> + Send;

    /// The keys pending for at least `age`, sorted. It reads every record: an operator's
    /// tool, not a request's.
    ///
    /// # Errors
    ///
    /// A [`StoreError`](crate::StoreError) when the backend cannot answer.
    fn pending_older_than(
        &self,
        age: Duration,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Completes the pending `key` with `response`, whoever reserved it: retries get it as a
    /// replay. For a create the business system shows happened. The record gets this store's
    /// retention, as a complete does: open the store with the servers' window (or
    /// `keep_forever`), or a retry after this one's window creates again.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`](crate::StoreErrorKind::ReservationLost) if `key` is not pending; otherwise a backend
    /// failure.
    fn resolve(
        &self,
        key: &str,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes the record of `key`, pending or completed: the next request with it is new.
    /// For a create the business system shows never happened. Answers whether there was one.
    ///
    /// # Errors
    ///
    /// A [`StoreError`](crate::StoreError) when the backend cannot answer.
    fn forget(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Whether a record is pending, completed, or remembered past its replay window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Reserved: the create is running, or its process died before completing.
    Pending,
    /// Completed: its response is stored and replayed.
    Completed,
    /// Completed, its replay window passed: only its [`Tombstone`](crate::Tombstone) is kept,
    /// and a retry is answered expired until the tombstone window ends.
    Expired,
}

impl RecordState {
    /// `pending`, `completed` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Completed => "completed",
            Self::Expired => "expired",
        }
    }
}

/// One record, as [`Operator::inspect`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// Pending, completed, or expired (its tombstone kept).
    pub state: RecordState,
    /// Since it was claimed (pending) or completed; `None` where the store does not keep it
    /// (a memory store's completed records without a retention).
    pub age: Option<Duration>,
    /// The fingerprint of the operation that claimed it.
    pub fingerprint: Fingerprint,
    /// The stored status of a completed record.
    pub status: Option<StatusCode>,
    /// Pending, and its owner's lease lapsed: nobody renewed it within the lease, so its
    /// owner most likely died. A pending record that is not abandoned is in progress.
    pub abandoned: bool,
    /// An expired record's tombstone (when it completed, its status and `Location`), where
    /// the store reads it back.
    pub tombstone: Option<Tombstone>,
    /// When an expired record's tombstone window ends (then its key is new), where the store
    /// keeps it.
    pub remembered_until: Option<SystemTime>,
}

impl RecordInfo {
    /// A pending record, for a store of your own: claimed `age` ago (if the store keeps it)
    /// by the operation `fingerprint`, `abandoned` if its owner's lease lapsed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency_core::Fingerprint;
    /// use tower_idempotency_core::{RecordInfo, RecordState};
    ///
    /// let info = RecordInfo::pending(Fingerprint::digest(["k", "p"]), Some(Duration::from_secs(5)), false);
    /// assert_eq!((info.state, info.status, info.abandoned), (RecordState::Pending, None, false));
    /// ```
    pub fn pending(fingerprint: Fingerprint, age: Option<Duration>, abandoned: bool) -> Self {
        Self {
            state: RecordState::Pending,
            age,
            fingerprint,
            status: None,
            abandoned,
            tombstone: None,
            remembered_until: None,
        }
    }

    /// An expired record, for a store of your own: its replay window passed, its
    /// `tombstone` kept (the status is the tombstone's) until `remembered_until`, if the store
    /// knows when.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use http::StatusCode;
    /// use tower_idempotency_core::{Fingerprint, RecordInfo, RecordState, Tombstone};
    ///
    /// let completed = SystemTime::now();
    /// let tombstone = Tombstone::new(completed, StatusCode::CREATED, None);
    /// let until = completed + Duration::from_secs(8 * 24 * 3600);
    /// let fp = Fingerprint::digest(["k", "p"]);
    /// let info = RecordInfo::expired(fp, None, tombstone.clone(), Some(until));
    /// assert_eq!((info.state, info.status), (RecordState::Expired, Some(StatusCode::CREATED)));
    /// assert_eq!((info.tombstone, info.remembered_until), (Some(tombstone), Some(until)));
    /// ```
    pub fn expired(
        fingerprint: Fingerprint,
        age: Option<Duration>,
        tombstone: Tombstone,
        remembered_until: Option<SystemTime>,
    ) -> Self {
        Self {
            state: RecordState::Expired,
            age,
            fingerprint,
            status: Some(tombstone.status()),
            abandoned: false,
            tombstone: Some(tombstone),
            remembered_until,
        }
    }

    /// A record as a store reads it back: [`pending`](Self::pending) (`abandoned` if its
    /// owner's lease lapsed) or [`completed`](Self::completed) with `status`, `None` when the
    /// store could not read the stored response's status.
    ///
    /// ```
    /// use tower_idempotency_core::Fingerprint;
    /// use tower_idempotency_core::{RecordInfo, RecordState};
    ///
    /// let fp = Fingerprint::digest(["k", "p"]);
    /// let info = RecordInfo::new(RecordState::Completed, fp, None, None, false);
    /// assert_eq!((info.state, info.status), (RecordState::Completed, None));
    /// assert!(RecordInfo::new(RecordState::Pending, fp, None, None, true).abandoned);
    /// let expired = RecordInfo::new(RecordState::Expired, fp, None, None, false);
    /// assert_eq!(expired.state, RecordState::Expired);
    /// ```
    pub fn new(
        state: RecordState,
        fingerprint: Fingerprint,
        age: Option<Duration>,
        status: Option<StatusCode>,
        abandoned: bool,
    ) -> Self {
        match state {
            RecordState::Pending => Self::pending(fingerprint, age, abandoned),
            RecordState::Completed | RecordState::Expired => Self {
                state,
                status,
                ..Self::completed(fingerprint, age, StatusCode::OK)
            },
        }
    }

    /// A completed record, for a store of your own: completed `age` ago (if the store keeps
    /// it) with a response of status `status`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_idempotency_core::Fingerprint;
    /// use tower_idempotency_core::{RecordInfo, RecordState};
    ///
    /// let info = RecordInfo::completed(Fingerprint::digest(["k", "p"]), None, StatusCode::CREATED);
    /// assert_eq!((info.state, info.status), (RecordState::Completed, Some(StatusCode::CREATED)));
    /// ```
    pub fn completed(fingerprint: Fingerprint, age: Option<Duration>, status: StatusCode) -> Self {
        Self {
            state: RecordState::Completed,
            age,
            fingerprint,
            status: Some(status),
            abandoned: false,
            tombstone: None,
            remembered_until: None,
        }
    }
}
