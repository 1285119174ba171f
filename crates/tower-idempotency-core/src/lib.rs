//! What a store of idempotency records is, and nothing of HTTP's serving: the [`Store`]
//! trait, its records ([`Claim`], [`Reservation`], [`Lease`], [`StoredResponse`]), the one
//! claim decision ([`decide`]), the stored-response format, [`StoreError`], [`Purge`], the
//! operator's view ([`Operator`]) and the operation's [`Fingerprint`].
//!
//! This is the crate a store author depends on. Applications depend on
//! [`tower-idempotency`](https://docs.rs/tower-idempotency), which re-exports all of it at
//! `tower_idempotency::store` (the fingerprint at `tower_idempotency::operation`) and puts a
//! store to work behind its layer; the built-in stores live in crates of their own
//! (`tower-idempotency-redis`, `tower-idempotency-sqlx`), turned on by the facade's features.
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
//!   [`decide`] is that decision, written once: read the record, ask it, write what it says.
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
//! - [`settle_claim`](Store::settle_claim) must act after a claim whose answer was lost: it
//!   may release the reservation only once it knows the lost claim can no longer write (it
//!   ran, or its deadline passed on a clock the backend checks under its lock, or the
//!   backend ended it). The default (a release) is right when one handle's calls reach the
//!   backend in order; a store whose calls may overtake each other (a pool) says how it
//!   knows.
//! - [`changed`](Store::changed) must see every change made after it is called; the default
//!   polls. A store whose backend can announce changes wakes waiters sooner.
//! - Every call fails with a [`StoreError`] rather than hanging (bound it with a timeout),
//!   and nothing a backend returns may panic: a record it cannot read is
//!   [`StoreErrorKind::Corrupt`].
//!
//! Then hold it to the same suite the built-in stores run, with the `test-util` feature:
//! `tower_idempotency::store_conformance!` in a test file (the suite is
//! `tower_idempotency::testing::conformance`). The repository's `examples/toy-store` crate is a complete
//! store written that way, with the public API alone.
//!
//! ```
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency_core::Store;
//! use tower_idempotency_core::Fingerprint;
//! use tower_idempotency_core::{Claim, StoredResponse};
//! use http::{HeaderMap, StatusCode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! let fp = Fingerprint::digest(["label-req-7", "parcel-42"]);
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

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::time::Duration;

/// The bytes a store keeps, re-exported so that a store speaks the version the core does.
pub use bytes;
/// The status and headers of a stored response, re-exported for the same reason.
pub use http;

pub mod backend;
pub mod codec;
mod decide;
mod error;
mod fingerprint;
mod operator;
mod options;
mod purge;
mod reservation;
mod response;
mod tombstone;

pub use self::decide::{Answer, Decision, Found, Write, decide};
pub use self::error::{StoreError, StoreErrorKind};
pub use self::fingerprint::{Fingerprint, FingerprintHex};
pub use self::operator::{Operator, RecordInfo, RecordState};
pub use self::options::StoreOptions;
pub use self::purge::{Purge, Purger};
pub use self::reservation::{Claim, Lease, Reservation};
pub use self::response::{IDEMPOTENT_BODY_OMITTED, StoredResponse};
pub use self::tombstone::Tombstone;

/// The default time a remote store call may take before it fails with
/// [`StoreErrorKind::Timeout`].
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a store without notifications of its own is looked at again by a request
/// waiting for a pending key ([`Store::changed`]).
pub const CHANGE_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How long every store keeps a completed record unless told otherwise: 24 hours, the retry
/// window of Stripe's API and of most peers. A retry within it replays; after it, a store that
/// keeps tombstones ([`DEFAULT_TOMBSTONES`]) refuses it as expired for the tombstone window,
/// and past that (or on a store that keeps none) the key is a new operation. Set another window with each store's `retention` (or
/// [`MemoryStore::with_retention`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.MemoryStore.html#method.with_retention)), or keep records for good with its `keep_forever`.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// The longest retention a remote store keeps: a hundred years. A longer one (up to
/// `Duration::MAX`) is clamped to it, since backends cannot add more to the current time.
pub const MAX_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How long a store that keeps tombstones remembers a completed operation past its replay
/// window unless told otherwise ([`StoreOptions::tombstones`]): seven days, so that a retry
/// that comes back a week after the create (a device back online, a queue backlog drained,
/// an agent resumed) is answered "expired" rather than created again, at the key and a dozen
/// bytes more (with the create's `Location`) a tombstone.
pub const DEFAULT_TOMBSTONES: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 60 * 60);

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
/// See [`MemoryStore`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.MemoryStore.html) for the reference implementation.
pub trait Store: Clone + Send + Sync + 'static {
    /// Looks at the record for `key` and decides atomically ([`decide`]):
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
    /// use tower_idempotency_core::{Lease, Reservation};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency_core::Store;
    /// use tower_idempotency_core::Fingerprint;
    /// use tower_idempotency_core::Claim;
    ///
    /// let store = MemoryStore::new();
    /// let fp = Fingerprint::digest(["label-req-7", "parcel-42"]);
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
    /// Afterwards `key` is not pending under `reservation`, and the lost claim can no longer
    /// make it so.
    ///
    /// The rule: release only once the lost claim can no longer write. A release that finds
    /// nothing proves nothing while the claim may still be queued (on another connection of
    /// a pool, behind a lock), since it would then write after the release. Each store knows
    /// it its own way: the claim carries a deadline the backend checks under its lock, and
    /// the settling waits past it (SQLite, PostgreSQL); the settling fences the reservation,
    /// and a claim of a fenced reservation writes nothing (Redis); or the calls of one handle
    /// reach the backend in order. The default releases `reservation` at once, which is right
    /// for the last (memory). A store that wraps another must forward it.
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
    /// deadline, when [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait) is set.
    ///
    /// The default ends after [`CHANGE_POLL_INTERVAL`], so a store without notifications is
    /// polled; [`MemoryStore`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.MemoryStore.html) wakes its waiters on the change itself. It must not end at
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

    /// How long a completed record is replayed (the store's retention), for the layer to
    /// advertise to clients (the `Idempotency-TTL` header): `None` when the store keeps records
    /// until they are forgotten, or does not say (the default). A store that wraps another
    /// must forward it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency_core::Store;
    ///
    /// let store = MemoryStore::builder().retention(Duration::from_secs(3600)).build();
    /// assert_eq!(store.replay_window(), Some(Duration::from_secs(3600)));
    /// assert_eq!(MemoryStore::builder().keep_forever().build().replay_window(), None);
    /// ```
    fn replay_window(&self) -> Option<Duration> {
        None
    }

    /// How long the store remembers a completed operation once its replay window passed (its
    /// [`Tombstone`]), answering a claim with the same fingerprint [`Claim::Expired`]: `None`
    /// when it keeps no tombstones, or does not say (the default). A store that wraps another
    /// must forward it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::StoreOptions;
    /// use tower_idempotency_core::Store;
    ///
    /// let day = Duration::from_secs(24 * 3600);
    /// let store = MemoryStore::builder().options(StoreOptions::new().tombstones(day)).build();
    /// assert_eq!(store.tombstone_window(), Some(day));
    /// let none = StoreOptions::new().tombstones(Duration::ZERO);
    /// assert_eq!(MemoryStore::builder().options(none).build().tombstone_window(), None);
    /// ```
    fn tombstone_window(&self) -> Option<Duration> {
        None
    }

    /// Whether a [`release`](Store::release) undoes what the create of the reservation wrote:
    /// a store whose create writes commit with the complete (the transactional stores). The
    /// layer then releases a create's server error (`5xx`) by default, rolling its writes
    /// back, rather than store and replay it (see
    /// [`StoredResponses`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html)). `false` by default; a store that wraps
    /// another must forward it.
    fn release_undoes_create(&self) -> bool {
        false
    }

    /// The create of `reservation` ended without a response to store: it failed, panicked,
    /// or its response broke off or went past the size it declared (a response merely over
    /// the cap is stored compact, and completes). In a plain store the key stays pending
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
