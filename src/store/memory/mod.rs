//! The in-memory store: one process, lost on restart.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

mod bound;
mod builder;
mod capacity;
mod key;
mod operator;
mod shard;

pub use self::builder::MemoryStoreBuilder;
use self::key::Probe;
use self::shard::{LARGEST_IN_PLACE, Record, Shard, State, Swept, Tick, Windows, lock};
use super::codec;
use super::waiting::{self, WaiterMap, Waiters};
use super::{
    Answer, Claim, Decision, Found, Lease, Purge, Reservation, Store, StoreError, StoreErrorKind,
    StoredResponse, Tombstone, decide,
};
use crate::fingerprint::Fingerprint;

/// Number of independently locked shards; a power of two.
const SHARDS: usize = 64;

/// Entries of its shard's expiry queue a claim looks at, at most. Every completed record
/// enters a queue once and leaves it once, and each completion follows a claim in its shard,
/// so a few a claim keep up; the work under the lock stays small and bounded.
const SWEEP_PER_CLAIM: usize = 4;

/// Entries of each shard's expiry queue a claim refused by a full store looks at before it
/// tries again: enough to find room wherever a record expired, few enough that a flood of
/// refused claims, or the first claim after an idle spell, does a bounded amount of work.
const SWEEP_WHEN_FULL: usize = 64;

/// The embedded default store: a sharded map in this process.
///
/// Concurrent and lock-striped: a key's shard is locked only for the few instructions a claim,
/// complete or release takes, never across an `.await`, so distinct keys rarely contend. The
/// claim is atomic because it decides and reserves under one shard lock.
///
/// It is **not** shared between replicas and does **not** survive a restart: use it for one
/// process, tests and examples, and a shared store (Redis, PostgreSQL) in a real deployment.
///
/// It holds at most [`DEFAULT_MAX_RECORDS`](crate::store::DEFAULT_MAX_RECORDS) records (one
/// million) of at most [`DEFAULT_MAX_BYTES`](crate::store::DEFAULT_MAX_BYTES) in all (1 GiB) unless
/// its [builder](MemoryStore::builder) sets other bounds or none: a flood of distinct keys, or of
/// large responses, gets the operation's *store unavailable* answer once it is full, not the
/// process's memory.
///
/// Pending records never expire. *Completed* records older than the retention window
/// ([`DEFAULT_RETENTION`](crate::store::DEFAULT_RETENTION), 24 hours, unless
/// [`MemoryStore::with_retention`] sets another or [`MemoryStoreBuilder::keep_forever`] none) give
/// their response up, and are kept as a [`Tombstone`] (when the operation completed, its status
/// and `Location`) for the tombstone window
/// ([`DEFAULT_TOMBSTONES`](crate::store::DEFAULT_TOMBSTONES), seven days, unless
/// [`MemoryStoreBuilder::tombstones`] sets another or none), during which a retry is answered
/// *expired*; then dropped, so a long-running process does not grow with every key it ever saw;
/// a retry after that is a new operation. Expiry is amortised: each shard keeps its completed records in completion
/// order, and every claim drops the few oldest that expired, so no claim ever scans a shard.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
///
/// let store = MemoryStore::with_retention(Duration::from_secs(24 * 60 * 60));
/// let layer = IdempotencyLayer::new(store.clone(), JsonOperation::new()).global_keys();
/// assert_eq!(store.len(), 0);
/// # drop(layer);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Box<[Mutex<Shard>]>,
    /// The keyed, flood-resistant hash of every key: computed once per call, it picks the
    /// shard and is the key's hash in the shard's map, kept with the key so that a growing
    /// table never hashes a key again.
    hasher: RandomState,
    retention: Option<Duration>,
    /// How long a completed record is remembered as a tombstone once its retention passed
    /// (only with a retention).
    tombstones: Option<Duration>,
    /// The most records held at once, if bounded.
    max_records: Option<usize>,
    /// Records held, pending and completed (kept only when bounded).
    records: AtomicUsize,
    /// The most bytes the records take at once, if bounded.
    max_bytes: Option<usize>,
    /// The bytes the records take ([`Record::bytes`]), pending and completed (kept only when
    /// bounded).
    bytes: AtomicUsize,
    /// The bytes of the last response completed, encoded: the room a claim makes after its
    /// key for the response to come, so that the record takes one allocation.
    response_room: AtomicUsize,
    /// The moment every [`Tick`] counts from.
    epoch: Instant,
    /// The time of day at [`epoch`](Self::epoch): a tombstone's completion time.
    wall: SystemTime,
    /// How far a test moved this store's clock on, in nanoseconds.
    #[cfg(test)]
    skew: std::sync::atomic::AtomicU64,
}

impl MemoryStore {
    /// An empty store that replays completed records for
    /// [`DEFAULT_RETENTION`](crate::store::DEFAULT_RETENTION) (24 hours), then keeps their
    /// tombstones for [`DEFAULT_TOMBSTONES`](crate::store::DEFAULT_TOMBSTONES) (seven days),
    /// bounded by
    /// [`DEFAULT_MAX_RECORDS`](crate::store::DEFAULT_MAX_RECORDS) and
    /// [`DEFAULT_MAX_BYTES`](crate::store::DEFAULT_MAX_BYTES). Retention is the
    /// store's, as on every store: [`with_retention`](Self::with_retention) sets another
    /// window, and [`builder`](Self::builder) every setting.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::DEFAULT_RETENTION;
    ///
    /// assert_eq!(MemoryStore::new().retention_window(), Some(DEFAULT_RETENTION));
    /// ```
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// An empty store that replays completed records for `retention`, then keeps their
    /// tombstones for the default tombstone window: the same as
    /// `MemoryStore::builder().retention(retention).build()`.
    ///
    /// Pending records are kept however old they are.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    ///
    /// let hour = Duration::from_secs(3600);
    /// assert_eq!(MemoryStore::with_retention(hour).retention_window(), Some(hour));
    /// ```
    pub fn with_retention(retention: Duration) -> Self {
        Self::builder().retention(retention).build()
    }

    /// The settings of a new store: its retention, its bounds, the room it reserves. A
    /// store's settings are fixed once it is built, so every clone of it (held by a layer,
    /// say) has the same.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    ///
    /// let store = MemoryStore::builder().keep_forever().unbounded().build();
    /// assert_eq!((store.retention_window(), store.record_bound()), (None, None));
    /// ```
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// How long completed records are kept, `None` for the life of the process.
    pub fn retention_window(&self) -> Option<Duration> {
        self.shared.retention
    }

    /// How long a completed operation is remembered once its replay window passed, `None`
    /// when it is not.
    pub fn tombstone_window(&self) -> Option<Duration> {
        self.shared.tombstones
    }

    fn build(
        retention: Option<Duration>,
        tombstones: Option<Duration>,
        max_records: Option<usize>,
        max_bytes: Option<usize>,
    ) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self {
            shared: Arc::new(Shared {
                shards,
                hasher: RandomState::new(),
                retention,
                tombstones: tombstones.filter(|_| retention.is_some()),
                max_records,
                records: AtomicUsize::new(0),
                max_bytes,
                bytes: AtomicUsize::new(0),
                response_room: AtomicUsize::new(0),
                epoch: Instant::now(),
                wall: SystemTime::now(),
                #[cfg(test)]
                skew: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The claim, decided and reserved under one shard lock.
    fn decide(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let fingerprint = *fingerprint.as_bytes();
        // The clock is read only when the claim needs it: with a retention window, or to
        // reserve. A replay, a conflict or a pending key read none.
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(|| self.now());
        let (probe, mut shard) = self.locked(key);
        let windows = self.windows();
        if let Some(windows) = windows {
            let swept = shard.sweep(now(), windows, |at| self.wall(at), SWEEP_PER_CLAIM);
            self.give_swept(swept);
        }
        let Some(record) = shard.get_mut(probe) else {
            let room = self.shared.response_room.load(Ordering::Relaxed);
            let record = Record::pending(probe, fingerprint, reservation, now(), lease, room);
            if let Err(full) = self.take_room(record.bytes()) {
                // Full: what is remembered last goes first, this shard's oldest tombstone,
                // under the lock held already.
                let dropped = shard.drop_oldest_tombstone(SWEEP_WHEN_FULL);
                self.give_swept(dropped);
                if dropped.dropped == 0 {
                    return Err(full);
                }
                self.take_room(record.bytes())?;
            }
            shard.insert(record);
            return Ok(Claim::New(reservation));
        };
        let same_fingerprint = record.fingerprint == fingerprint;
        let found = match &record.state {
            State::Pending {
                reservation: held,
                until,
                take_over,
                ..
            } => Found::Pending {
                same_fingerprint,
                mine: *held == reservation.halves(),
                // The clock only when the lease decides.
                abandoned: *take_over && lease.takes_over() && now() >= *until,
            },
            State::Completed { at, .. } | State::Tombstone { at, .. } => {
                // Not yet swept: where its windows say it is.
                match windows.map(|windows| (windows, now().since(*at))) {
                    Some((windows, age)) if age >= windows.remembered() => Found::Completed {
                        same_fingerprint,
                        expired: true,
                        response: (),
                    },
                    // A tombstone is past its retention, with a tombstone window, as is
                    // every record found so.
                    Some((windows, age))
                        if age >= windows.retention && windows.tombstones.is_some() =>
                    {
                        Found::Expired {
                            same_fingerprint,
                            tombstone: (),
                        }
                    }
                    windows => Found::Completed {
                        same_fingerprint,
                        expired: windows.is_some_and(|(windows, age)| age >= windows.retention),
                        response: (),
                    },
                }
            }
        };
        let kept = match decide(Some(found), lease) {
            Decision::Write(_) => {
                let before = record.bytes();
                record.reclaim(fingerprint, reservation, now(), lease);
                self.resize(before, record.bytes());
                return Ok(Claim::New(reservation));
            }
            Decision::Answer(Answer::Replay(())) => {
                Kept::Response(record.response().unwrap_or_default())
            }
            Decision::Answer(Answer::Expired(())) => match (&record.state, record.tombstone()) {
                (_, Some(tombstone)) => Kept::Tombstone(tombstone),
                (State::Completed { at, .. }, None) => {
                    Kept::Buried(record.response().unwrap_or_default(), self.wall(*at))
                }
                // Only completed records and tombstones are found expired.
                _ => return Err(StoreError::new(StoreErrorKind::Corrupt)),
            },
            Decision::Answer(Answer::Mine) => return Ok(Claim::New(reservation)),
            Decision::Answer(Answer::Conflict) => return Ok(Claim::Conflict),
            Decision::Answer(Answer::Pending) => return Ok(Claim::Pending),
        };
        drop(shard);
        // Decoded outside the lock: the shard waits for nobody's header map.
        match kept {
            Kept::Response(stored) => Ok(Claim::Replay(codec::decode(stored)?)),
            Kept::Tombstone(bytes) => Ok(Claim::Expired(Tombstone::from_bytes(&bytes)?)),
            Kept::Buried(stored, at) => Ok(Claim::Expired(codec::tombstone(&stored, at)?)),
        }
    }

    /// The replay window and the tombstone window, with a retention.
    fn windows(&self) -> Option<Windows> {
        self.shared.retention.map(|retention| Windows {
            retention,
            tombstones: self.shared.tombstones,
        })
    }

    /// The time of day at `tick`.
    fn wall(&self, tick: Tick) -> SystemTime {
        self.shared.wall + Duration::from_nanos(tick.0)
    }

    /// The claim; when the store is full, once more after dropping expired records of every
    /// shard (they may hold the room in other shards).
    fn claim_at_once(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        match self.decide(key, fingerprint, reservation, lease) {
            Err(full) if full.kind() == StoreErrorKind::CapacityExceeded => {
                // Tried again whatever this sweep dropped: another claim's sweep, a release
                // or a forget may have made room meanwhile.
                self.sweep_every_shard(SWEEP_WHEN_FULL);
                match self.decide(key, fingerprint, reservation, lease) {
                    // Still full, and no tombstone in its own shard: one of another shard's
                    // goes, the oldest there, before a claim is refused.
                    Err(full) if full.kind() == StoreErrorKind::CapacityExceeded => {
                        if self.drop_a_tombstone() == 0 {
                            return Err(full);
                        }
                        self.decide(key, fingerprint, reservation, lease)
                    }
                    claimed => claimed,
                }
            }
            claimed => claimed,
        }
    }

    /// Completes the pending `key`: under `reservation`, or under any reservation if `None`
    /// (an operator's resolve).
    fn complete_now(
        &self,
        key: &str,
        reservation: Option<&Reservation>,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let reservation = reservation.map(Reservation::halves);
        // A response no claim's room can hold is encoded before the lock, in a buffer of its
        // own: the shard waits for no large copy.
        let encoded = codec::encoded_len(response);
        let large =
            (encoded > LARGEST_IN_PLACE).then(|| codec::encode_after(key.as_bytes(), response));
        let (probe, mut shard) = self.locked(key);
        let Some(record) = shard.get_mut(probe) else {
            return Err(StoreError::new(StoreErrorKind::ReservationLost));
        };
        let owned = match &record.state {
            State::Pending {
                reservation: held, ..
            } => reservation.is_none_or(|r| r == *held),
            State::Completed { .. } | State::Tombstone { .. } => false,
        };
        if !owned {
            return Err(StoreError::new(StoreErrorKind::ReservationLost));
        }
        // Read under the lock, so that each shard's expiry queue is in order.
        let at = match self.shared.retention {
            Some(_) => self.now(),
            None => Tick::NEVER,
        };
        // Encoded under the lock, into the room the claim made after the key: the record's one
        // allocation. The next claims make as much room (rounded up to the allocator's step,
        // which leaves room for a response a few bytes longer at no cost): a room of its own
        // per key would be memory too, and a larger one memory every record keeps.
        let before = record.bytes();
        record.complete_with(response, encoded, large, at);
        self.resize(before, record.bytes());
        self.shared.response_room.store(encoded, Ordering::Relaxed);
        shard.wake(key);
        // Only with a retention window: the queue finds the record by its hash and `at`.
        if self.shared.retention.is_some() {
            shard.expiry.push_back((at, probe.hash));
        }
        Ok(())
    }

    /// Now, as a tick of this store.
    fn now(&self) -> Tick {
        let now =
            Tick(u64::try_from(self.shared.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1));
        #[cfg(test)]
        let now = now.after(Duration::from_nanos(
            self.shared.skew.load(Ordering::Relaxed),
        ));
        now
    }

    /// The number of records, pending and completed (expired ones not yet purged included).
    pub fn len(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| lock(s).records.len())
            .sum()
    }

    /// The keys requests are waiting on ([`IdempotencyLayer::pending_wait`]), for metrics
    /// and tests: zero once every waiter got its answer or gave up.
    ///
    /// [`IdempotencyLayer::pending_wait`]: crate::IdempotencyLayer::pending_wait
    pub fn waited_keys(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| lock(s).waiters.len())
            .sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is held by a pending reservation.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::Store;
    /// use tower_idempotency::operation::Fingerprint;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new();
    /// store.claim("k", &Fingerprint::digest(["k", "p"])).await.unwrap();
    /// assert!(store.is_pending("k"));
    /// # }
    /// ```
    pub fn is_pending(&self, key: &str) -> bool {
        let (probe, shard) = self.locked(key);
        matches!(
            shard.get(probe),
            Some(Record {
                state: State::Pending { .. },
                ..
            })
        )
    }

    /// The completed response stored for `key`, if any (expired ones included until purged).
    pub fn completed(&self, key: &str) -> Option<StoredResponse> {
        let (probe, shard) = self.locked(key);
        let response = shard.get(probe).and_then(Record::response);
        drop(shard);
        codec::decode(response?).ok()
    }

    /// Drops the expired records of every shard, looking at `limit` entries of each expiry
    /// queue at most, and returns how many it dropped.
    fn sweep_every_shard(&self, limit: usize) -> usize {
        let Some(windows) = self.windows() else {
            return 0;
        };
        let now = self.now();
        let wall = |at| self.wall(at);
        // Each shard's counts given while its lock is held: a call on a record it changed
        // (a forget) counts from what the sweep made of it.
        let swept = self
            .shared
            .shards
            .iter()
            .map(|shard| {
                let mut shard = lock(shard);
                let swept = shard.sweep(now, windows, wall, limit);
                self.give_swept(swept);
                swept
            })
            .fold(Swept::default(), Swept::add);
        swept.dropped
    }

    /// Drops one tombstone, the oldest of the first shard that has one, whatever its window,
    /// and returns how many it dropped (one, or none).
    fn drop_a_tombstone(&self) -> usize {
        for shard in &self.shared.shards {
            let mut shard = lock(shard);
            let dropped = shard.drop_oldest_tombstone(SWEEP_WHEN_FULL);
            self.give_swept(dropped);
            if dropped.dropped > 0 {
                return dropped.dropped;
            }
        }
        0
    }

    /// Counts what a sweep did: what its tombstones took beyond the records they replaced
    /// first, then the room of what it dropped given back (so the count never goes below
    /// what the records take).
    fn give_swept(&self, swept: Swept) {
        self.resize(0, swept.grown);
        self.give_room(swept.dropped, swept.freed);
    }

    /// `key` with its hash: one keyed hash for the whole call.
    fn probe<'a>(&self, key: &'a str) -> Probe<'a> {
        Probe {
            hash: self.shared.hasher.hash_one(key),
            key,
        }
    }

    /// The shard of a key. Picked by bits of its hash that a shard's map does not use (it
    /// takes the lowest for the slot and the highest seven for its tags), so that the keys of
    /// one shard still spread over its whole table.
    fn shard_of(&self, probe: Probe<'_>) -> &Mutex<Shard> {
        &self.shared.shards[(probe.hash >> 32) as usize & (SHARDS - 1)]
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        self.shard_of(self.probe(key))
    }

    /// `key` with its hash, and its shard, locked.
    fn locked<'a>(&self, key: &'a str) -> (Probe<'a>, MutexGuard<'_, Shard>) {
        let probe = self.probe(key);
        (probe, lock(self.shard_of(probe)))
    }
}

/// What a claim answers with, read under the lock and decoded after it.
enum Kept {
    /// A completed record's response: a replay.
    Response(Bytes),
    /// A tombstone's bytes: expired.
    Tombstone(Bytes),
    /// The response of a record past its replay window not yet buried, and when it
    /// completed: expired.
    Buried(Bytes, SystemTime),
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("retention", &self.shared.retention)
            .field("max_records", &self.shared.max_records)
            .finish_non_exhaustive()
    }
}

impl Waiters for MemoryStore {
    fn with_waiters<R>(&self, key: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R {
        f(&mut lock(self.shard(key)).waiters)
    }
}

/// Drops every completed record older than the retention window now, in one pass that never
/// fails; without a retention window it drops nothing. Claims drop the expired records of
/// their own shard as they go, so purging is optional: it frees the memory of shards no claim
/// touches. It walks only the expired records, never a whole shard.
impl Purge for MemoryStore {
    async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        let dropped = self.sweep_every_shard(usize::MAX);
        *purged += u64::try_from(dropped).unwrap_or(u64::MAX);
        Ok(())
    }
}

impl Store for MemoryStore {
    fn replay_window(&self) -> Option<Duration> {
        self.retention_window()
    }

    fn tombstone_window(&self) -> Option<Duration> {
        MemoryStore::tombstone_window(self)
    }

    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        self.claim_at_once(key, fingerprint, reservation, lease)
    }

    /// Answered at once: the claim takes a shard's lock for in-memory work (with a retention
    /// window, it drops a few expired records of its shard as it goes; a full store drops every
    /// expired record once before it refuses), never I/O.
    fn claim_now(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Option<Result<Claim, StoreError>> {
        Some(self.claim_at_once(key, fingerprint, reservation, lease))
    }

    /// Ends on the change itself: a complete, release, resolve or forget of `key` wakes every
    /// request waiting for it.
    fn changed(&self, key: &str) -> impl Future<Output = ()> + Send {
        waiting::wait(self.clone(), key)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let (probe, mut shard) = self.locked(key);
        match shard.get_mut(probe).map(|record| &mut record.state) {
            Some(State::Pending {
                reservation: held,
                until,
                ..
            }) if *held == reservation.halves() => {
                *until = now.after(lease);
                Ok(())
            }
            _ => Err(StoreError::new(StoreErrorKind::ReservationLost)),
        }
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.complete_now(key, Some(reservation), response)
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let (probe, mut shard) = self.locked(key);
        match shard.get(probe) {
            Some(Record {
                state: State::Pending {
                    reservation: held, ..
                },
                ..
            }) if *held == reservation.halves() => {
                let bytes = shard.get(probe).map_or(0, Record::bytes);
                shard.remove(probe);
                shard.wake(key);
                self.give_room(1, bytes);
                Ok(())
            }
            _ => Err(StoreError::new(StoreErrorKind::ReservationLost)),
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// Moves `store`'s clock on to `at` after its epoch's now.
    fn skew(store: &MemoryStore, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap();
        store.shared.skew.store(nanos, Ordering::Relaxed);
    }

    /// Every setting of the builder reads back from the store it builds, whatever the order,
    /// and a window sizes the expiry queues the room is reserved in; none keeps no queue.
    #[test]
    fn a_built_store_has_every_setting_it_was_given() {
        let hour = Duration::from_secs(3600);
        let store = MemoryStore::builder()
            .max_records(5)
            .keep_forever()
            .reserve(1_000)
            .retention(hour)
            .max_bytes(7)
            .build();
        assert_eq!(
            (
                store.retention_window(),
                store.record_bound(),
                store.byte_bound()
            ),
            (Some(hour), Some(5), Some(7))
        );
        let queue = |store: &MemoryStore| lock(&store.shared.shards[0]).expiry.capacity();
        assert!(queue(&store) > 0);
        let forever = MemoryStore::builder().reserve(1_000).keep_forever().build();
        assert_eq!(queue(&forever), 0);
        assert!(lock(&forever.shared.shards[0]).records.capacity() > 0);
        let unbounded = MemoryStore::builder().max_records(5).unbounded().build();
        assert_eq!(
            (unbounded.record_bound(), unbounded.byte_bound()),
            (None, None)
        );
        // Tombstones: the default, another window, none; none without a retention.
        assert_eq!(
            MemoryStore::new().tombstone_window(),
            Some(crate::store::DEFAULT_TOMBSTONES)
        );
        let kept = MemoryStore::builder().tombstones(hour).build();
        assert_eq!(Store::tombstone_window(&kept), Some(hour));
        assert_eq!(
            MemoryStore::builder()
                .tombstones(Duration::ZERO)
                .build()
                .tombstone_window(),
            None
        );
        assert_eq!(
            MemoryStore::builder()
                .keep_forever()
                .build()
                .tombstone_window(),
            None
        );
    }

    /// A completed record no sweep has reached yet (five older ones of its shard ahead of it
    /// in its queue, more than a claim's sweep looks at) is decided by its own windows: past
    /// the replay window, expired; past the tombstone window too, new.
    #[tokio::test]
    async fn a_record_no_sweep_reached_is_decided_by_its_windows() {
        let (retention, tombstones) = (Duration::from_secs(60), Duration::from_secs(600));
        let store = MemoryStore::builder()
            .retention(retention)
            .tombstones(tombstones)
            .build();
        let key = "k";
        let ahead = same_shard(&store, key, 2 * SWEEP_PER_CLAIM + 1);
        // Completed an hour into the store's life: its tombstone says so.
        let hour = Duration::from_secs(3600);
        skew(&store, hour);
        complete_each(&store, ahead.iter().map(String::as_str).chain([key])).await;
        let fingerprint = crate::operation::LabelContract::fingerprint(key, "p");
        skew(&store, hour + retention + Duration::from_secs(1));
        let past = store.claim(key, &fingerprint).await;
        let Ok(Claim::Expired(tombstone)) = past else {
            panic!("expired, not {past:?}");
        };
        completed_near(&tombstone, store.shared.wall + hour);
        assert!(
            store.completed(key).is_some(),
            "not swept yet: still completed"
        );
        skew(
            &store,
            hour + retention + tombstones + Duration::from_secs(1),
        );
        let forgotten = store.claim(key, &fingerprint).await;
        assert!(matches!(forgotten, Ok(Claim::New(_))), "{forgotten:?}");
        // Every tombstone past its window goes at the next sweep: the key's new claim is
        // all that is left.
        store.sweep_every_shard(usize::MAX);
        assert_eq!(store.len(), 1);
    }

    /// A full store looks past the stale entries of its tombstone queue (keys claimed anew
    /// since they were buried) for a tombstone to drop, rather than refuse.
    #[tokio::test]
    async fn a_full_store_finds_a_tombstone_behind_stale_entries() {
        let retention = Duration::from_secs(60);
        let store = MemoryStore::builder()
            .retention(retention)
            .tombstones(Duration::from_secs(600))
            .max_records(4)
            .build();
        let keys = same_shard(&store, "b", 3);
        let fingerprint = |key: &str| crate::operation::LabelContract::fingerprint(key, "p");
        complete_each(&store, keys.iter().map(String::as_str).chain(["b"])).await;
        skew(&store, retention + Duration::from_secs(1));
        store.sweep_every_shard(usize::MAX);
        // Claimed anew in place: their tombstones' entries, ahead of b's, are stale.
        let lease = Lease::default().forget_expired();
        for key in &keys {
            let again = store
                .claim_with(key, &fingerprint(key), Reservation::generate(), lease)
                .await;
            assert!(matches!(again, Ok(Claim::New(_))), "{again:?}");
        }
        let new = store.claim("c", &fingerprint("c")).await;
        assert!(matches!(new, Ok(Claim::New(_))), "{new:?}");
        assert!(store.completed("b").is_none());
        assert_eq!(store.len(), 4);
    }

    /// A key claimed anew before any sweep reached its old completion keeps its new pending
    /// record when the sweep gets there: the queue's entry for the old completion is stale.
    #[tokio::test]
    async fn a_stale_expiry_entry_leaves_the_record_claimed_in_its_place() {
        let retention = Duration::from_secs(60);
        for tombstones in [Duration::ZERO, Duration::from_secs(600)] {
            let store = MemoryStore::builder()
                .retention(retention)
                .tombstones(tombstones)
                .build();
            let key = "k";
            let ahead = same_shard(&store, key, 2 * SWEEP_PER_CLAIM + 1);
            complete_each(&store, ahead.iter().map(String::as_str).chain([key])).await;
            skew(&store, retention + Duration::from_secs(1));
            // Past its window, not yet swept: claimed anew in place (a tombstone forgotten).
            let fingerprint = crate::operation::LabelContract::fingerprint(key, "p");
            let lease = Lease::default().forget_expired();
            let again = store
                .claim_with(key, &fingerprint, Reservation::generate(), lease)
                .await;
            assert!(matches!(again, Ok(Claim::New(_))), "{again:?}");
            // Sweeps reach its old entry.
            store.sweep_every_shard(usize::MAX);
            assert!(store.is_pending(key), "tombstones {tombstones:?}");
        }
        // The same for a tombstone's entry: buried, claimed anew, then its window passes.
        let store = MemoryStore::builder()
            .retention(retention)
            .tombstones(retention)
            .build();
        let fingerprint = crate::operation::LabelContract::fingerprint("t", "p");
        complete_each(&store, ["t"]).await;
        skew(&store, retention + Duration::from_secs(1));
        store.sweep_every_shard(usize::MAX);
        let lease = Lease::default().forget_expired();
        let again = store
            .claim_with("t", &fingerprint, Reservation::generate(), lease)
            .await;
        assert!(matches!(again, Ok(Claim::New(_))), "{again:?}");
        skew(&store, 3 * retention);
        store.sweep_every_shard(usize::MAX);
        assert!(store.is_pending("t"), "the tombstone's stale entry left it");
    }

    /// Asserts that `tombstone` says it completed within a few seconds of `at`.
    fn completed_near(tombstone: &Tombstone, at: SystemTime) {
        let off = tombstone
            .completed_at()
            .duration_since(at)
            .unwrap_or_else(|early| early.duration());
        assert!(
            off < Duration::from_secs(5),
            "completed {off:?} from {at:?}"
        );
    }

    /// Claims and completes each of `keys`, with a small `201`.
    async fn complete_each(store: &MemoryStore, keys: impl IntoIterator<Item = &str>) {
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"{}"),
        );
        for key in keys {
            let fingerprint = crate::operation::LabelContract::fingerprint(key, "p");
            let Ok(Claim::New(reservation)) = store.claim(key, &fingerprint).await else {
                panic!("{key}: new");
            };
            store.complete(key, &reservation, &response).await.unwrap();
        }
    }

    /// `n` keys of the same shard as `key`.
    fn same_shard(store: &MemoryStore, key: &str, n: usize) -> Vec<String> {
        let shard = std::ptr::from_ref(store.shard(key));
        (0..)
            .map(|i| format!("ahead-{i}"))
            .filter(|other| std::ptr::eq(store.shard(other), shard))
            .take(n)
            .collect()
    }

    /// A claim makes room after its key for a response as large as the last one completed:
    /// the next record of such a response is completed in the allocation
    /// its claim made.
    #[tokio::test]
    async fn a_claim_makes_room_for_a_response_like_the_last() {
        let store = MemoryStore::new();
        let fingerprint = crate::operation::LabelContract::fingerprint("k", "p");
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"{\"label_id\":\"lbl_1\"}"),
        );
        let needed = codec::encoded_len(&response);
        let data = |key: &str| {
            let (probe, shard) = store.locked(key);
            match &shard.get(probe).expect("a record").state {
                State::Pending { data, .. } => (data.as_ptr(), data.capacity()),
                State::Completed { data, .. } | State::Tombstone { data, .. } => {
                    (data.as_ptr(), data.len())
                }
            }
        };
        for (key, room) in [("a", 0), ("b", needed)] {
            let Ok(Claim::New(reservation)) = store.claim(key, &fingerprint).await else {
                panic!("new");
            };
            let (at, capacity) = data(key);
            assert!(capacity >= key.len() + room, "{key}: room for {room}");
            assert!(capacity < key.len() + room + 16, "{key}: no more than that");
            store
                .complete(key, &reservation, &response)
                .await
                .expect("completed");
            assert_eq!(data(key).0 == at, room > 0, "{key}: in place");
            assert_eq!(store.completed(key).expect("kept").body(), response.body());
        }
        // A response larger than any room: encoded on its own, kept exactly; the room the
        // next claim makes is capped.
        let large = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from(vec![7u8; 4 * LARGEST_IN_PLACE]),
        );
        for key in ["c", "d"] {
            let Ok(Claim::New(reservation)) = store.claim(key, &fingerprint).await else {
                panic!("new");
            };
            let (_, capacity) = data(key);
            assert!(
                capacity <= key.len() + LARGEST_IN_PLACE,
                "{key}: {capacity}"
            );
            store
                .complete(key, &reservation, &large)
                .await
                .expect("completed");
            assert_eq!(store.completed(key).expect("kept").body(), large.body());
        }
    }

    /// A new store keeps a completed record for the default window: a claim within it
    /// replays, one past it is expired until the default tombstone window passed too, then
    /// new; a store told to keep records forever replays years later.
    #[tokio::test]
    async fn a_new_store_keeps_a_completed_record_for_the_default_window() {
        let fingerprint = crate::operation::LabelContract::fingerprint("k", "p");
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"{}"),
        );
        for (store, forever) in [
            (MemoryStore::new(), false),
            (MemoryStore::builder().keep_forever().build(), true),
        ] {
            let Ok(Claim::New(reservation)) = store.claim("k", &fingerprint).await else {
                panic!("a new key is new");
            };
            store.complete("k", &reservation, &response).await.unwrap();
            skew(
                &store,
                crate::store::DEFAULT_RETENTION - Duration::from_secs(1),
            );
            assert!(matches!(
                store.claim("k", &fingerprint).await,
                Ok(Claim::Replay(_))
            ));
            skew(
                &store,
                crate::store::DEFAULT_RETENTION + Duration::from_secs(1),
            );
            let past = store.claim("k", &fingerprint).await;
            if forever {
                skew(&store, Duration::from_secs(10 * 365 * 24 * 3600));
                assert!(matches!(past, Ok(Claim::Replay(_))));
                assert!(matches!(
                    store.claim("k", &fingerprint).await,
                    Ok(Claim::Replay(_))
                ));
            } else {
                // Past the window, within the tombstones': expired, what it was remembered.
                let Ok(Claim::Expired(tombstone)) = past else {
                    panic!("past the window: expired, not {past:?}");
                };
                assert_eq!(tombstone.status(), http::StatusCode::CREATED);
                completed_near(&tombstone, store.shared.wall);
                let other = crate::operation::LabelContract::fingerprint("k", "q");
                assert!(matches!(
                    store.claim("k", &other).await,
                    Ok(Claim::Conflict)
                ));
                // Past both windows: a new operation.
                skew(
                    &store,
                    crate::store::DEFAULT_RETENTION
                        + crate::store::DEFAULT_TOMBSTONES
                        + Duration::from_secs(1),
                );
                assert!(
                    matches!(store.claim("k", &fingerprint).await, Ok(Claim::New(_))),
                    "past the tombstone's window: a new operation"
                );
            }
        }
    }

    /// Keys spread over every shard, so that distinct keys rarely share a lock.
    #[test]
    fn keys_spread_over_the_shards() {
        let store = MemoryStore::new();
        let shards: std::collections::HashSet<*const Mutex<Shard>> = (0..2_000)
            .map(|i| std::ptr::from_ref(store.shard(&format!("POST /labels k-{i}"))))
            .collect();
        assert_eq!(shards.len(), SHARDS);
    }
}
