//! The registry of operations: the [`Store`] trait and its backends.
//!
//! A store keeps one record per idempotency key: the fingerprint of the operation that claimed
//! it and either a *pending* reservation or the *completed* response. [`Store::claim`] is the one
//! atomic entry to it; [`Store::complete`] and [`Store::release`] act only on the reservation
//! the claim handed out, so a stale attempt can never overwrite a completed record or delete
//! someone else's reservation.
//!
//! [`MemoryStore`] is the reference implementation and the embedded default. The shared,
//! durable backends live behind cargo features. [`DynStore`] puts any of them behind one type,
//! for an application that picks its store from its configuration.
//!
//! # Writing a store
//!
//! A store for another backend (DynamoDB, etcd, FoundationDB, …) implements [`Store`], and
//! [`Operator`] for the operator's tools. What each method must guarantee:
//!
//! - [`claim_with`](Store::claim_with) decides in **one atomic step** of the backend (a
//!   conditional write, a transaction, a script): no record → create it pending under the
//!   caller's reservation and lease, [`Claim::New`]; another fingerprint → [`Claim::Conflict`]
//!   (decided first, whatever the record's state); pending under the same reservation →
//!   [`Claim::New`] again (a retried claim); pending, its lease lapsed, and both its claimer and
//!   this claim allow it ([`Lease::takes_over`]) → take it over, [`Claim::New`]; pending →
//!   [`Claim::Pending`]; completed → [`Claim::Replay`] with the stored response. A completed
//!   record past the store's retention counts as absent; pending records never expire.
//! - [`renew`](Store::renew), [`complete`](Store::complete) and [`release`](Store::release) act
//!   only on a record pending under the caller's reservation (compare all 128 bits), else
//!   [`StoreErrorKind::ReservationLost`] and no change: a stale attempt never overwrites a
//!   completed record nor frees someone else's key.
//! - [`complete`](Store::complete) keeps the response exactly: status, every header value in
//!   order (bytes that are not UTF-8 included), the body. A store that keeps bytes can keep
//!   [`StoredResponse::to_bytes`] and read it back with [`StoredResponse::from_bytes`].
//! - [`claim_now`](Store::claim_now), if a store answers claims at once, must answer as
//!   [`claim_with`](Store::claim_with) would, with the same effect, and must not block: it runs
//!   inside the response future's `poll`. A store that must wait for its backend leaves it
//!   `None`.
//! - [`settle_claim`](Store::settle_claim) must act after a claim whose answer was lost; the
//!   default (a release) is right when one handle's calls reach the backend in order.
//! - [`changed`](Store::changed) must see every change made after it is called; the default
//!   polls. A store whose backend can announce changes wakes waiters sooner.
//! - Every call fails with a [`StoreError`] rather than hanging (bound it with a timeout),
//!   and nothing a backend returns may panic: a record it cannot read is
//!   [`StoreErrorKind::Corrupt`].
//!
//! Then hold it to the same suite the built-in stores run, with the `test-util` feature:
//! `tower_idempotency::store_conformance!` in a test file (the suite is
//! `tower_idempotency::testing::conformance`). The crate's `tests/toy_store.rs` is a complete
//! store written that way, with the public API alone.
//!
//! ```
//! use tower_idempotency::{LabelContract, MemoryStore, Store};
//! use tower_idempotency::store::{Claim, StoredResponse};
//! use http::{HeaderMap, StatusCode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! let fp = LabelContract::fingerprint("label-req-7", "parcel-42");
//!
//! let Ok(Claim::New(reservation)) = store.claim("label-req-7", &fp).await else { panic!() };
//! assert!(matches!(store.claim("label-req-7", &fp).await, Ok(Claim::Pending)));
//!
//! let created = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "{}".into());
//! store.complete("label-req-7", &reservation, &created).await.unwrap();
//! let Ok(Claim::Replay(replayed)) = store.claim("label-req-7", &fp).await else { panic!() };
//! assert_eq!(replayed, created);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use tower::BoxError;

use crate::fingerprint::Fingerprint;

mod codec;
mod dynamic;
mod memory;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod notifier;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod waiting;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub use dynamic::DynStore;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgTransaction, PostgresStore, TransactionalPostgresStore};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;

/// The default time a remote store call may take before it fails with
/// [`StoreErrorKind::Timeout`].
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a store without notifications of its own is looked at again by a request
/// waiting for a pending key ([`Store::changed`]).
pub const CHANGE_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Runs one remote store call, failing with [`StoreErrorKind::Timeout`] past `timeout`.
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
pub(crate) async fn within<T>(
    timeout: std::time::Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(StoreError::new(StoreErrorKind::Timeout)))
}

/// How long every store keeps a completed record unless told otherwise: 24 hours, the retry
/// window of Stripe's API and of most peers. A retry within it replays; after it, the key is
/// a new operation. Set another window with each store's `retention` (or
/// [`MemoryStore::with_retention`]), or keep records for good with its `keep_forever`.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// The longest retention a remote store keeps: a hundred years. A longer one (up to
/// `Duration::MAX`) is clamped to it, since backends cannot add more to the current time.
pub const MAX_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A retention window in whole milliseconds, at least one and at most [`MAX_RETENTION`], as
/// remote stores keep it.
#[cfg(any(feature = "redis", feature = "postgres", feature = "sqlite"))]
pub(crate) fn retention_millis(retention: std::time::Duration) -> u64 {
    let millis = retention.min(MAX_RETENTION).as_millis();
    u64::try_from(millis).unwrap_or(u64::MAX).max(1)
}

/// The registry the layer claims keys in.
///
/// Implementations must decide [`claim`](Store::claim) atomically *in the backend*: two
/// concurrent claims of one key can never both be [`Claim::New`]. The fingerprint is compared
/// before the status, so a different operation under a taken key is always a
/// [`Claim::Conflict`], pending or completed. Pending records never expire on their own: expiring
/// one could allow a second create after the first succeeded.
///
/// Stores are cheap handles (`Clone`) onto shared state.
///
/// See [`MemoryStore`] for the reference implementation.
pub trait Store: Clone + Send + Sync + 'static {
    /// Looks at the record for `key` and decides atomically (contract §4):
    ///
    /// | record | fingerprint | result |
    /// |---|---|---|
    /// | none | — | [`Claim::New`], a pending reservation `reservation` is created |
    /// | pending under `reservation` | equal | [`Claim::New`] again |
    /// | pending or completed | differs | [`Claim::Conflict`], nothing changes |
    /// | pending, lease lapsed, both leases [take over](Lease::take_over_abandoned) | equal | [`Claim::New`], the record is reserved anew under `reservation` |
    /// | pending | equal | [`Claim::Pending`] |
    /// | completed | equal | [`Claim::Replay`] with the stored response |
    ///
    /// The reservation is the caller's: a claim that finds `key` pending under the same
    /// `reservation` (and fingerprint) answers [`Claim::New`] again, so a claim whose answer
    /// was lost can be repeated, or released with the token, without stranding the key.
    ///
    /// A new reservation carries `lease`: it counts as in progress until the lease's duration
    /// has passed since the claim or the last [`renew`](Store::renew), and as *abandoned*
    /// after. Only a claim whose own `lease` takes over abandoned records may reserve one
    /// anew, and only one whose owner's lease allowed it too (the record keeps that); every
    /// other claim answers [`Claim::Pending`] however old it is.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the backend cannot answer; the layer then creates nothing, and
    /// when the outcome is unknown ([`StoreErrorKind::Timeout`],
    /// [`StoreErrorKind::Unavailable`]) it releases `reservation` afterwards.
    fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// [`claim_with`](Store::claim_with) answered at once, if this store can answer without
    /// waiting: a store in this process, whose claim takes a lock and no I/O. The layer asks it
    /// first, and answers a replay, a conflict or a pending key from it with no state
    /// allocated for the request; only a new claim goes on to the create (and a pending key to
    /// the wait for its first attempt, where the layer waits). It runs inside the response
    /// future's `poll`, so it must not block: take a lock held only for in-memory work, never
    /// do I/O.
    ///
    /// The answer must be the one [`claim_with`](Store::claim_with) would give, with the same
    /// effect on the store. The default is `None`, for a store that must wait for its backend:
    /// the layer then awaits [`claim_with`](Store::claim_with). A store that wraps another
    /// forwards it only if it adds nothing of its own to a claim; `None` is always correct.
    ///
    /// ```
    /// use tower_idempotency::store::{Lease, Reservation};
    /// use tower_idempotency::{LabelContract, MemoryStore, Store};
    /// use tower_idempotency::store::Claim;
    ///
    /// let store = MemoryStore::new();
    /// let fp = LabelContract::fingerprint("label-req-7", "parcel-42");
    /// let claimed = store.claim_now("label-req-7", &fp, Reservation::generate(), Lease::default());
    /// assert!(matches!(claimed, Some(Ok(Claim::New(_)))));
    /// let again = store.claim_now("label-req-7", &fp, Reservation::generate(), Lease::default());
    /// assert!(matches!(again, Some(Ok(Claim::Pending))));
    /// ```
    fn claim_now(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Option<Result<Claim, StoreError>> {
        let _ = (key, fingerprint, reservation, lease);
        None
    }

    /// [`claim_with`](Store::claim_with) a new reservation and the default [`Lease`].
    ///
    /// # Errors
    ///
    /// As [`claim_with`](Store::claim_with).
    fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        self.claim_with(key, fingerprint, Reservation::generate(), Lease::default())
    }

    /// Renews the lease of the pending reservation `reservation` of `key` for another
    /// `lease` from now: its owner is alive and still creating. The layer calls it every
    /// third of the lease while the create runs.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] if `key` is not pending under `reservation` (it
    /// was taken over, resolved or forgotten); otherwise a backend failure.
    fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores `response` as the completed result of the reservation `reservation` of `key`.
    ///
    /// The store keeps its own copy: nothing the caller does with `response` afterwards changes
    /// what is stored.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] if `key` is not pending under `reservation` (it was
    /// completed, released or never claimed by this attempt); otherwise a backend failure.
    fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Undoes a [`claim_with`](Store::claim_with) of `reservation` whose answer was lost: the
    /// claim may have taken effect, or may still, so this must act after it, whatever it did.
    /// Afterwards `key` is not pending under `reservation`. The default releases
    /// `reservation`, which is right for a store whose calls from one handle reach the backend
    /// in order (memory, Redis on its one connection); a store whose calls may overtake each
    /// other (a pool of connections) waits for the lost claim first. A store that wraps
    /// another must forward it.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the backend cannot answer; the layer tries again later.
    fn settle_claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = fingerprint;
        async move {
            match self.release(key, &reservation).await {
                Err(error) if error.kind() != StoreErrorKind::ReservationLost => Err(error),
                _ => Ok(()),
            }
        }
    }

    /// A future that ends when `key` may have changed: completed, released, resolved or
    /// forgotten. It must see every such change made after this call returns, even one made
    /// before it is first polled; it may also end without a change (a timeout of its own, a
    /// poll interval), so the caller looks again. The layer waits on it, bounded by its own
    /// deadline, when [`pending_wait`](crate::IdempotencyLayer::pending_wait) is set.
    ///
    /// The default ends after [`CHANGE_POLL_INTERVAL`], so a store without notifications is
    /// polled; [`MemoryStore`] wakes its waiters on the change itself. It must not end at
    /// once every time: the layer would claim back to back until its deadline. The layer makes
    /// it before it looks at the key again and polls it after, so an interval of its own should
    /// run from its first poll, as the default's does.
    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        let _ = key;
        async { tokio::time::sleep(CHANGE_POLL_INTERVAL).await }
    }

    /// Deletes the pending reservation `reservation` of `key`, after a confirmed admission
    /// refusal, so that a later request with the key is new again.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] if `key` is not pending under `reservation`;
    /// otherwise a backend failure.
    fn release(
        &self,
        key: &str,
        reservation: &Reservation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Puts what the create of `reservation` needs from the store into its request's
    /// extensions, just before the inner service is called: a transactional store's handle to
    /// the claim's open transaction, for the create's own writes. The default adds nothing.
    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        let _ = (key, reservation, extensions);
    }

    /// The create of `reservation` ended without a response to store: it failed, panicked,
    /// or its response was over the cap or broke off. In a plain store the key stays pending
    /// (the create may have taken effect), so the default does nothing; a store whose create
    /// writes commit with the complete rolls them back, and the key is free again.
    fn abandon<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
    ) -> impl Future<Output = ()> + Send + 'a {
        let _ = (key, reservation);
        async {}
    }
}

/// What an operator does with keys a crash left pending: look one up, list the old ones,
/// resolve one with the response the create gave (it becomes a replay), or forget one (it
/// becomes free). Every built-in store implements it; the `idempotency_keys` example is a
/// command line over it.
///
/// Keys are store keys, as [`store_key`](crate::scope::store_key) derives them from what a client
/// sends.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_idempotency::store::{Operator, RecordState};
/// use tower_idempotency::{LabelContract, MemoryStore, Store};
/// use tower_idempotency::store::StoredResponse;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// store.claim("k", &LabelContract::fingerprint("k", "p")).await.unwrap(); // then the process crashed
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
    /// The record of `key`, if there is one.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the backend cannot answer or a record cannot be decoded.
    fn inspect(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<RecordInfo>, StoreError>> + Send;

    /// The keys pending for at least `age`, sorted. It reads every record: an operator's
    /// tool, not a request's.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the backend cannot answer.
    fn pending_older_than(
        &self,
        age: Duration,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Completes the pending `key` with `response`, whoever reserved it: retries get it as a
    /// replay. For a create the business system shows happened.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::ReservationLost`] if `key` is not pending; otherwise a backend
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
    /// A [`StoreError`] when the backend cannot answer.
    fn forget(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Whether a record is pending or completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Reserved: the create is running, or its process died before completing.
    Pending,
    /// Completed: its response is stored and replayed.
    Completed,
}

impl RecordState {
    /// `pending` or `completed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Completed => "completed",
        }
    }
}

/// One record, as [`Operator::inspect`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// Pending or completed.
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
}

impl RecordInfo {
    /// A pending record, for a store of your own: claimed `age` ago (if the store keeps it)
    /// by the operation `fingerprint`, `abandoned` if its owner's lease lapsed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::LabelContract;
    /// use tower_idempotency::store::{RecordInfo, RecordState};
    ///
    /// let info = RecordInfo::pending(LabelContract::fingerprint("k", "p"), Some(Duration::from_secs(5)), false);
    /// assert_eq!((info.state, info.status, info.abandoned), (RecordState::Pending, None, false));
    /// ```
    pub fn pending(fingerprint: Fingerprint, age: Option<Duration>, abandoned: bool) -> Self {
        Self {
            state: RecordState::Pending,
            age,
            fingerprint,
            status: None,
            abandoned,
        }
    }

    /// A completed record, for a store of your own: completed `age` ago (if the store keeps
    /// it) with a response of status `status`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_idempotency::LabelContract;
    /// use tower_idempotency::store::{RecordInfo, RecordState};
    ///
    /// let info = RecordInfo::completed(LabelContract::fingerprint("k", "p"), None, StatusCode::CREATED);
    /// assert_eq!((info.state, info.status), (RecordState::Completed, Some(StatusCode::CREATED)));
    /// ```
    pub fn completed(fingerprint: Fingerprint, age: Option<Duration>, status: StatusCode) -> Self {
        Self {
            state: RecordState::Completed,
            age,
            fingerprint,
            status: Some(status),
            abandoned: false,
        }
    }
}

/// The lease a new reservation carries, and whether a claim may take over an abandoned one.
///
/// A pending reservation counts as *in progress* while its owner renews it
/// ([`Store::renew`]); once a whole lease passes without a renewal, as *abandoned*: its owner
/// most likely died mid-create. By default an abandoned key stays pending (at most once: the
/// create may have run). [`take_over_abandoned`](Lease::take_over_abandoned) lets a claim
/// reserve it anew, for operations that are safe to run again (at least once).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::Lease;
///
/// let lease = Lease::new(Duration::from_secs(10)).take_over_abandoned();
/// assert_eq!(lease.duration(), Duration::from_secs(10));
/// assert!(lease.takes_over());
/// assert!(!Lease::default().takes_over());
/// assert_eq!(Lease::new(Duration::ZERO).duration(), Lease::MIN);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    duration: Duration,
    take_over: bool,
}

impl Lease {
    /// The default lease: thirty seconds.
    pub const DEFAULT: Duration = Duration::from_secs(30);

    /// The shortest lease; a shorter one is raised to it.
    pub const MIN: Duration = Duration::from_millis(30);

    /// A lease of `duration` (at least [`Lease::MIN`]; past [`MAX_RETENTION`] remote stores
    /// clamp it) that never takes over.
    pub fn new(duration: Duration) -> Self {
        Self {
            duration: duration.max(Self::MIN),
            take_over: false,
        }
    }

    /// Lets the claim take over a pending record whose lease lapsed (at least once).
    pub fn take_over_abandoned(mut self) -> Self {
        self.take_over = true;
        self
    }

    /// How long a reservation counts as in progress without a renewal.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Whether the claim takes over an abandoned record.
    pub fn takes_over(&self) -> bool {
        self.take_over
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self::new(Self::DEFAULT)
    }
}

/// The outcome of [`Store::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// There was no record: a pending reservation now holds the key for this attempt.
    New(Reservation),
    /// The operation is reserved or unfinished. A pending retry never gets the right to create.
    Pending,
    /// The operation completed; this is its stored response, to be written as it is.
    Replay(StoredResponse),
    /// The key belongs to a different operation (another fingerprint).
    Conflict,
}

/// The token of one pending reservation, handed out with [`Claim::New`].
///
/// [`Store::complete`] and [`Store::release`] act only when the record is still pending under
/// this token. Tokens are unique within a process and random across processes.
///
/// ```
/// use tower_idempotency::store::Reservation;
///
/// let a = Reservation::generate();
/// let b = Reservation::generate();
/// assert_ne!(a, b);
/// assert_eq!(Reservation::from_u128(a.as_u128()), a);
/// assert_eq!(a.to_string().len(), 32);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
// Two halves, not a `u128`: a `u128` is 16-aligned, and would make every future and record
// that holds a token 16-aligned too, with the padding that brings.
pub struct Reservation([u64; 2]);

impl Reservation {
    /// A new token, never equal to another one generated by this process.
    pub fn generate() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(process_seed);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self([seed, count])
    }

    /// The token as a number, for a store to persist.
    pub fn as_u128(&self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// The token as its two halves, high first.
    pub(crate) fn halves(&self) -> [u64; 2] {
        self.0
    }

    /// A token read back from a store.
    pub fn from_u128(value: u128) -> Self {
        Self([(value >> 64) as u64, value as u64])
    }
}

/// A random 64-bit value, different for every process.
fn process_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(since_epoch) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since_epoch.as_nanos());
    }
    hasher.finish()
}

impl fmt::Display for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reservation({self})")
    }
}

/// A completed response as the store holds it: status, every header value in order, and the
/// exact body bytes.
///
/// Replaying it writes what the store holds, value for value: a header with two values (two
/// `ETag`s, say) is replayed with both, in order.
///
/// ```
/// use tower_idempotency::store::StoredResponse;
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

    /// This response with trailers after its body (a gRPC response's `grpc-status`, say),
    /// stored and replayed with it, every value in order.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use tower_idempotency::store::StoredResponse;
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

    /// The response as one buffer, in the format the built-in remote stores keep, for a
    /// store of your own that keeps bytes. [`from_bytes`](Self::from_bytes) reads it back
    /// exactly: the status, every header value in order (bytes that are not UTF-8 included)
    /// and the body.
    ///
    /// The format, version 1 for a response without trailers (all integers big-endian):
    ///
    /// ```text
    /// version  u8   1
    /// status   u16
    /// count    u16  the number of header values (at most 65,535 are kept)
    /// count ×  name length u16, name (lowercase ASCII), value length u32, value bytes
    /// body     every remaining byte
    /// ```
    ///
    /// Version 2, for a response with trailers: the version byte 2, the status and the
    /// headers as above, then the body's length (u32) and the body, then the trailers as the
    /// headers are (a count u16, then each value).
    ///
    /// A later version of this crate may write a later version of the format (with more
    /// parts of a response) and still reads every earlier one.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode, header};
    /// use tower_idempotency::store::StoredResponse;
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

    /// Reads a response written by [`to_bytes`](Self::to_bytes) (of this version of the
    /// crate or an earlier one). The body shares `bytes`, without a copy.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Corrupt`] for anything else: a version it does not know, a status out
    /// of range, a header name or value that is not valid, a length past the end. It never
    /// panics, whatever the bytes.
    ///
    /// ```
    /// use tower_idempotency::store::{StoreErrorKind, StoredResponse};
    ///
    /// let error = StoredResponse::from_bytes(bytes::Bytes::from_static(b"\x09junk")).unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Corrupt);
    /// ```
    pub fn from_bytes(bytes: Bytes) -> Result<Self, StoreError> {
        codec::decode(bytes)
    }
}

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
    /// ([`MemoryStore::max_records`](crate::MemoryStore::max_records)); nothing was claimed.
    CapacityExceeded,
    /// The store does not offer this call (an [`Operator`] call on a
    /// [`DynStore::without_operator`]).
    Unsupported,
    /// A complete whose transaction did not commit, or may not have (its answer was lost):
    /// the response is not stored and the create's own writes in that transaction are not
    /// known to have happened. The layer answers `503 store_unavailable` instead of the
    /// response, and a retry finds out which it was.
    Uncommitted,
}

/// The one error type of every [`Store`].
///
/// Backends convert their driver errors into it, keeping the original as its
/// [`source`](std::error::Error::source).
///
/// ```
/// use tower_idempotency::store::{StoreError, StoreErrorKind};
///
/// let error = StoreError::new(StoreErrorKind::Timeout);
/// assert_eq!(error.kind(), StoreErrorKind::Timeout);
/// assert_eq!(error.to_string(), "store timed out");
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
        };
        match &self.source {
            Some(source) => write!(f, "{what}: {source}"),
            None => f.write_str(what),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::Reservation;

    /// A token's number is its high half, then its low half, both ways.
    #[test]
    fn a_reservation_is_its_two_halves() {
        let value = (5_u128 << 64) | 7;
        let reservation = Reservation::from_u128(value);
        assert_eq!(reservation.halves(), [5, 7]);
        assert_eq!(reservation.as_u128(), value);
        let generated = Reservation::generate();
        assert_eq!(Reservation::from_u128(generated.as_u128()), generated);
        assert_eq!(generated.as_u128() >> 64, u128::from(generated.halves()[0]));
    }
}
