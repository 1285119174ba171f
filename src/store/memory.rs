//! The in-memory store: one process, lost on restart.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::codec;
use super::waiting::{self, WaiterMap, Waiters};
use super::{
    Claim, DEFAULT_RETENTION, Lease, Operator, RecordInfo, RecordState, Reservation, Store,
    StoreError, StoreErrorKind, StoredResponse,
};
use crate::operation::Fingerprint;

/// Number of independently locked shards; a power of two.
const SHARDS: usize = 64;

/// Entries of its shard's expiry queue a claim looks at, at most. Every completed record
/// enters a queue once and leaves it once, and each completion follows a claim in its shard,
/// so a few a claim keep up; the work under the lock stays small and bounded.
const SWEEP_PER_CLAIM: usize = 4;

/// The embedded default store: a sharded map in this process.
///
/// Concurrent and lock-striped: a key's shard is locked only for the few instructions a claim,
/// complete or release takes, never across an `.await`, so distinct keys rarely contend. The
/// claim is atomic because it decides and reserves under one shard lock.
///
/// It is **not** shared between replicas and does **not** survive a restart: use it for one
/// process, tests and examples, and a shared store (Redis, PostgreSQL) in a real deployment.
///
/// Pending records never expire. *Completed* records older than the retention window
/// ([`DEFAULT_RETENTION`], 24 hours, unless [`MemoryStore::with_retention`] sets another or
/// [`MemoryStore::keep_forever`] none) are dropped, so a long-running process does not grow
/// with every key it ever saw; a retry after that is a new operation. Expiry is amortised: each shard keeps its completed
/// records in completion order, and every claim drops the few oldest that expired, so no
/// claim ever scans a shard.
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
    /// The most records held at once, if bounded.
    max_records: Option<usize>,
    /// Records held, pending and completed (kept only when bounded).
    records: AtomicUsize,
    /// The most records [`MemoryStore::with_capacity`] was asked to make room for, so that
    /// a store bounded while shared gets the same room (not what its tables hold now, which
    /// slots marked deleted take from).
    sized_for: AtomicUsize,
    /// The moment every [`Tick`] counts from.
    epoch: Instant,
    /// How far a test moved this store's clock on, in nanoseconds.
    #[cfg(test)]
    skew: std::sync::atomic::AtomicU64,
}

/// A moment, as nanoseconds since the store's epoch: half the size of an `Instant`, and
/// enough for 584 years.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Tick(u64);

impl Tick {
    /// Later than any moment: a lease that never lapses, a time not kept.
    const NEVER: Self = Self(u64::MAX);

    /// `duration` after this moment, or [`Tick::NEVER`] past what a tick holds.
    fn after(self, duration: Duration) -> Self {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }

    /// The time from `earlier` to this moment, zero if `earlier` is later.
    fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

#[derive(Default)]
struct Shard {
    records: HashMap<StoredKey, Record, Prehashed>,
    /// With a retention window: the completed records of this shard in the order they were
    /// completed, with when. An entry whose record was completed again, taken over or
    /// forgotten since is stale, and skipped.
    expiry: VecDeque<(Tick, StoredKey)>,
    /// Requests waiting for a pending key of this shard to change, by key: woken and
    /// removed when it does; removed by the last waiter that gives up.
    waiters: WaiterMap,
}

/// A key and its hash, as a shard's map holds it.
#[derive(Clone)]
struct StoredKey {
    hash: u64,
    key: Arc<str>,
}

/// A key looked up: its hash, computed once for the whole call.
#[derive(Clone, Copy)]
struct Probe<'a> {
    hash: u64,
    key: &'a str,
}

impl<'a> Probe<'a> {
    /// The probe as the shard's map looks it up.
    fn lookup(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

/// What a shard's map is looked up by: a stored key or a probe, compared by key, hashed by
/// the hash they carry.
trait Lookup {
    fn hash(&self) -> u64;
    fn key(&self) -> &str;
}

impl Lookup for StoredKey {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn key(&self) -> &str {
        &self.key
    }
}

impl Lookup for Probe<'_> {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn key(&self) -> &str {
        self.key
    }
}

impl<'a> Borrow<dyn Lookup + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(Lookup::hash(self));
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        Lookup::hash(self) == Lookup::hash(other) && self.key() == other.key()
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Hash::hash(self as &dyn Lookup, state);
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn Lookup) == (other as &dyn Lookup)
    }
}

impl Eq for StoredKey {}

/// The hasher of a shard's map: the keys carry their hash, so it passes it through.
#[derive(Clone, Copy, Default)]
struct Prehashed;

impl BuildHasher for Prehashed {
    type Hasher = PassThrough;

    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

/// Passes through the one `u64` a key writes.
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Never called: keys write their hash with `write_u64`. Folded in all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

struct Record {
    /// The fingerprint's digest: half the size of its hexadecimal form.
    fingerprint: [u8; 32],
    state: State,
}

enum State {
    /// Reserved under this token.
    Pending {
        reservation: [u64; 2],
        /// When it was claimed.
        since: Tick,
        /// When its lease lapses unless renewed.
        until: Tick,
        /// Whether its owner lets a claim take it over once abandoned.
        take_over: bool,
    },
    Completed {
        /// The response in the stores' one encoding: a single buffer, a fraction of the size
        /// of a header map.
        response: Bytes,
        /// When it was completed; only kept with a retention window, else
        /// [`Tick::NEVER`].
        at: Tick,
    },
}

impl MemoryStore {
    /// An empty store that drops completed records after [`DEFAULT_RETENTION`] (24 hours).
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::DEFAULT_RETENTION;
    ///
    /// assert_eq!(MemoryStore::new().retention(), Some(DEFAULT_RETENTION));
    /// assert_eq!(MemoryStore::new().keep_forever().retention(), None);
    /// ```
    pub fn new() -> Self {
        Self::build(Some(DEFAULT_RETENTION))
    }

    /// Keeps every completed record for the life of the process, rather than for the
    /// retention window: the store then grows with every key it is sent (bound it with
    /// [`max_records`](Self::max_records)). Set it on a new store, before it is shared, as
    /// [`max_records`](Self::max_records); its bound and reserved room are kept.
    pub fn keep_forever(mut self) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.retention = None;
            for shard in &mut shared.shards {
                let shard = shard.get_mut().unwrap_or_else(PoisonError::into_inner);
                shard.expiry.clear();
            }
            return self;
        }
        let sized_for = self.shared.sized_for.load(Ordering::Relaxed);
        let store = Self::build(None);
        match self.shared.max_records {
            Some(max) => store.max_records(max),
            None => store,
        }
        .with_capacity(sized_for)
    }

    /// How long completed records are kept, `None` for the life of the process.
    pub fn retention(&self) -> Option<Duration> {
        self.shared.retention
    }

    /// An empty store that drops completed records older than `retention`.
    ///
    /// Pending records are kept however old they are.
    pub fn with_retention(retention: Duration) -> Self {
        Self::build(Some(retention))
    }

    fn build(retention: Option<Duration>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self {
            shared: Arc::new(Shared {
                shards,
                hasher: RandomState::new(),
                retention,
                max_records: None,
                records: AtomicUsize::new(0),
                sized_for: AtomicUsize::new(0),
                epoch: Instant::now(),
                #[cfg(test)]
                skew: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// Holds at most `max` records, pending and completed: when full, a claim of a new key
    /// fails with [`StoreErrorKind::CapacityExceeded`] (the layer answers `503`,
    /// `store_unavailable`, and creates nothing) until releases or the retention make room.
    /// Unbounded by default. Set it on a new store, before it is shared; the room reserved
    /// with [`MemoryStore::with_capacity`] is kept.
    ///
    /// ```
    /// use tower_idempotency::{LabelContract, MemoryStore, Store};
    /// use tower_idempotency::store::StoreErrorKind;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new().max_records(1);
    /// store.claim("a", &LabelContract::fingerprint("a", "p")).await.unwrap();
    /// let full = store.claim("b", &LabelContract::fingerprint("b", "p")).await.unwrap_err();
    /// assert_eq!(full.kind(), StoreErrorKind::CapacityExceeded);
    /// # }
    /// ```
    pub fn max_records(mut self, max: usize) -> Self {
        // Not shared: bounded in place, a store made new (emptied) with the room reserved in
        // its shards kept.
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            for shard in &mut shared.shards {
                let shard = shard.get_mut().unwrap_or_else(PoisonError::into_inner);
                shard.records.clear();
                shard.expiry.clear();
                shard.waiters.clear();
            }
            shared.max_records = Some(max);
            *shared.records.get_mut() = 0;
            return self;
        }
        // Shared: a new store, beside the one its clones hold, with the same room.
        let sized_for = self.shared.sized_for.load(Ordering::Relaxed);
        Self::build(self.shared.retention)
            .max_records(max)
            .with_capacity(sized_for)
    }

    /// Reserves room for `records` records, pending and completed, up front: a store sized
    /// for what it holds at its fullest (the keys of one retention window) does not grow a
    /// table until it holds more. A table grows under its shard's lock, moving every record
    /// of the shard, so the claim that makes it grow waits for that, and so does every claim
    /// of the shard behind it; on a store of millions of keys that is milliseconds, and the
    /// allocator's work of the larger tables besides. With a retention window the shards'
    /// expiry queues are sized alike. A store not sized grows its tables as they fill
    /// (amortised, as a `HashMap`'s do).
    ///
    /// The room is spread over the shards with a margin for keys that do not spread evenly
    /// (six standard deviations of a shard's share), so a store sized for `records` holds that
    /// many without growing a table, but for about one store in ten million. Each table is
    /// given twice that room, because records come and go: a record removed (expired,
    /// forgotten, or released after a refused admission) leaves its slot marked deleted when
    /// its neighbours are full, a table whose free slots are all used up so is rehashed, and
    /// a table more than half full grows to twice its size instead. At most half full, a
    /// table never grows: it keeps most removed records' slots free, and is rehashed in place
    /// (every record of its shard moved, under its lock) only when the few marked deleted
    /// have used up its free slots, after churn of many times what it holds, as a store not
    /// sized is once it has grown to the same size. (An expiry queue also keeps the entries
    /// of records forgotten, or expired and claimed again, until the sweep passes them:
    /// under such churn a queue may still grow.) It is memory held from the start, whether
    /// the records come or not: a table's slot is 105 bytes, and a table of twice the room
    /// rounds its slots up to a power of two (240 to 480 bytes a record of room, about what
    /// a store not sized reaches under churn; a small store's room is mostly its margin, and
    /// `with_capacity(1)` takes about 430 KB); a queue's entry is 32 bytes more. The first
    /// write to each page of it faults the page in, so the first claims into a sized store
    /// are a little slower, and none waits for a table to grow (`cargo bench --bench
    /// claim_tail`). Call it on a new store; with [`MemoryStore::max_records`], in either
    /// order.
    ///
    /// # Panics
    ///
    /// If the room cannot be had (more than the address space holds, or memory the allocator
    /// refuses), with a message that says so, as a `HashMap::with_capacity` that large would.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// // An hour of retention at up to 25 creates a second.
    /// let store = MemoryStore::with_retention(Duration::from_secs(60 * 60)).with_capacity(90_000);
    /// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
    /// # drop(layer);
    /// ```
    pub fn with_capacity(self, records: usize) -> Self {
        let room = shard_room(records);
        let refused = |error| panic!("MemoryStore::with_capacity({records}): {error}");
        self.shared.sized_for.fetch_max(records, Ordering::Relaxed);
        for shard in self.shared.shards.iter() {
            let mut shard = lock(shard);
            // Twice the room: a table at most half full keeps the slot of a record removed
            // (expired, forgotten, released) empty rather than marked deleted, almost always;
            // one fuller fills with deleted marks under churn and then grows to twice its
            // size anyway, under the shard's lock.
            let table = room.saturating_mul(2);
            shard.records.try_reserve(table).unwrap_or_else(refused);
            if self.shared.retention.is_some() {
                shard.expiry.try_reserve(room).unwrap_or_else(refused);
            }
        }
        self
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
        if let Some(retention) = self.shared.retention {
            let dropped = shard.sweep(now(), retention, SWEEP_PER_CLAIM);
            self.give_room(dropped);
        }
        let retention = self.shared.retention;
        let stored = match shard.records.get_mut(probe.lookup()) {
            Some(record) if !retention.is_some_and(|r| record.is_expired(now(), r)) => {
                if record.fingerprint != fingerprint {
                    return Ok(Claim::Conflict);
                }
                match &record.state {
                    State::Pending {
                        reservation: held, ..
                    } if *held == reservation.halves() => return Ok(Claim::New(reservation)),
                    State::Pending {
                        until, take_over, ..
                    } if *take_over && lease.takes_over() && now() >= *until => {
                        *record = Record::pending(fingerprint, reservation, now(), lease);
                        return Ok(Claim::New(reservation));
                    }
                    State::Pending { .. } => return Ok(Claim::Pending),
                    State::Completed { response, .. } => response.clone(),
                }
            }
            // Expired: a new operation.
            Some(record) => {
                *record = Record::pending(fingerprint, reservation, now(), lease);
                return Ok(Claim::New(reservation));
            }
            None => {
                self.take_room()?;
                let key = StoredKey {
                    hash: probe.hash,
                    key: key.into(),
                };
                let record = Record::pending(fingerprint, reservation, now(), lease);
                shard.records.insert(key, record);
                return Ok(Claim::New(reservation));
            }
        };
        drop(shard);
        // Decoded outside the lock: the shard waits for nobody's header map.
        Ok(Claim::Replay(codec::decode(stored)?))
    }

    /// The claim; when the store is full, once more after dropping every expired record (they
    /// may hold the room in other shards).
    fn claim_at_once(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        match self.decide(key, fingerprint, reservation, lease) {
            Err(full) if full.kind() == StoreErrorKind::CapacityExceeded => {
                if self.purge_expired() == 0 {
                    return Err(full);
                }
                self.decide(key, fingerprint, reservation, lease)
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
        // Encoded before the lock: the copy of the body is not the shard's to wait for.
        let response = codec::encode(response);
        let reservation = reservation.map(Reservation::halves);
        let (probe, mut shard) = self.locked(key);
        let Some(record) = shard.records.get_mut(probe.lookup()) else {
            return Err(StoreError::new(StoreErrorKind::ReservationLost));
        };
        let owned = match &record.state {
            State::Pending {
                reservation: held, ..
            } => reservation.is_none_or(|r| r == *held),
            State::Completed { .. } => false,
        };
        if !owned {
            return Err(StoreError::new(StoreErrorKind::ReservationLost));
        }
        // Read under the lock, so that each shard's expiry queue is in order.
        let at = match self.shared.retention {
            Some(_) => self.now(),
            None => Tick::NEVER,
        };
        record.state = State::Completed { response, at };
        shard.wake(key);
        // Only with a retention window: the queue shares the map's key.
        if self.shared.retention.is_some()
            && let Some((key, _)) = shard.records.get_key_value(probe.lookup())
        {
            let key = key.clone();
            shard.expiry.push_back((at, key));
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

    /// Takes room for one more record, if the store is bounded and has it.
    fn take_room(&self) -> Result<(), StoreError> {
        let Some(max) = self.shared.max_records else {
            return Ok(());
        };
        let held = self.shared.records.fetch_add(1, Ordering::AcqRel);
        if held < max {
            Ok(())
        } else {
            self.shared.records.fetch_sub(1, Ordering::AcqRel);
            Err(StoreError::new(StoreErrorKind::CapacityExceeded))
        }
    }

    /// Gives back the room of `n` records dropped.
    fn give_room(&self, n: usize) {
        if self.shared.max_records.is_some() && n > 0 {
            self.shared.records.fetch_sub(n, Ordering::AcqRel);
        }
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
    /// use tower_idempotency::{LabelContract, MemoryStore, Store};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new();
    /// store.claim("k", &LabelContract::fingerprint("k", "p")).await.unwrap();
    /// assert!(store.is_pending("k"));
    /// # }
    /// ```
    pub fn is_pending(&self, key: &str) -> bool {
        let (probe, shard) = self.locked(key);
        matches!(
            shard.records.get(probe.lookup()),
            Some(Record {
                state: State::Pending { .. },
                ..
            })
        )
    }

    /// The completed response stored for `key`, if any (expired ones included until purged).
    pub fn completed(&self, key: &str) -> Option<StoredResponse> {
        let (probe, shard) = self.locked(key);
        match shard.records.get(probe.lookup()) {
            Some(Record {
                state: State::Completed { response, .. },
                ..
            }) => codec::decode(response.clone()).ok(),
            _ => None,
        }
    }

    /// Drops every completed record older than the retention window now, and returns how many
    /// were dropped. Without a retention window it drops nothing.
    ///
    /// Claims drop the expired records of their own shard as they go, so calling this is
    /// optional: it frees the memory of shards no claim touches. It walks only the expired
    /// records, never a whole shard.
    pub fn purge_expired(&self) -> usize {
        let Some(retention) = self.shared.retention else {
            return 0;
        };
        let now = self.now();
        let dropped = self
            .shared
            .shards
            .iter()
            .map(|shard| lock(shard).sweep(now, retention, usize::MAX))
            .sum();
        self.give_room(dropped);
        dropped
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

/// The records one shard makes room for, of `records` spread over the shards: none for none;
/// else its share, six standard deviations of the share a shard gets of uniformly hashed keys
/// beyond it, and a few more for small stores (a store with a shard over that, holding
/// `records`, is under one in ten million at every size).
fn shard_room(records: usize) -> usize {
    let share = records.div_ceil(SHARDS);
    if share == 0 {
        return 0;
    }
    share + 6 * share.isqrt() + 16
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

impl Shard {
    /// Wakes the requests waiting for `key`, if any.
    fn wake(&mut self, key: &str) {
        waiting::wake(&mut self.waiters, key);
    }

    /// Drops the expired records at the front of the expiry queue, looking at `limit` entries
    /// at most, and returns how many records it dropped.
    fn sweep(&mut self, now: Tick, retention: Duration, limit: usize) -> usize {
        let mut dropped = 0;
        for _ in 0..limit {
            match self.expiry.front() {
                Some((at, _)) if now.since(*at) >= retention => {}
                _ => break,
            }
            let Some((at, key)) = self.expiry.pop_front() else {
                break;
            };
            // The record, unless completed again, taken over or forgotten since.
            let current = matches!(
                self.records.get(&key),
                Some(Record { state: State::Completed { at: completed, .. }, .. })
                    if *completed == at
            );
            if current {
                self.records.remove(&key);
                dropped += 1;
            }
        }
        dropped
    }
}

impl State {
    /// A new reservation and its lease, from `now`.
    fn pending(reservation: Reservation, now: Tick, lease: Lease) -> Self {
        Self::Pending {
            reservation: reservation.halves(),
            since: now,
            until: now.after(lease.duration()),
            take_over: lease.takes_over(),
        }
    }
}

impl Record {
    /// A record pending under `reservation` from `now`.
    fn pending(fingerprint: [u8; 32], reservation: Reservation, now: Tick, lease: Lease) -> Self {
        Self {
            fingerprint,
            state: State::pending(reservation, now, lease),
        }
    }

    fn is_expired(&self, now: Tick, retention: Duration) -> bool {
        matches!(self.state, State::Completed { at, .. } if at != Tick::NEVER && now.since(at) >= retention)
    }
}

impl Waiters for MemoryStore {
    fn with_waiters<R>(&self, key: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R {
        f(&mut lock(self.shard(key)).waiters)
    }
}

/// Locks a shard. A panic elsewhere while holding it cannot leave a record half-written (every
/// update is a single assignment), so a poisoned lock is still sound to use.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for MemoryStore {
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
        match shard
            .records
            .get_mut(probe.lookup())
            .map(|record| &mut record.state)
        {
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
        match shard.records.get(probe.lookup()) {
            Some(Record {
                state: State::Pending {
                    reservation: held, ..
                },
                ..
            }) if *held == reservation.halves() => {
                shard.records.remove(probe.lookup());
                shard.wake(key);
                self.give_room(1);
                Ok(())
            }
            _ => Err(StoreError::new(StoreErrorKind::ReservationLost)),
        }
    }
}

impl Operator for MemoryStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        let (probe, shard) = self.locked(key);
        Ok(shard.records.get(probe.lookup()).map(|record| {
            let (state, since, status, abandoned) = match &record.state {
                State::Pending { since, until, .. } => {
                    (RecordState::Pending, *since, None, now >= *until)
                }
                State::Completed { response, at } => {
                    let status = codec::decode(response.clone()).ok().map(|r| r.status());
                    (RecordState::Completed, *at, status, false)
                }
            };
            RecordInfo {
                state,
                age: (since != Tick::NEVER).then(|| now.since(since)),
                fingerprint: Fingerprint::from_sha256(record.fingerprint),
                status,
                abandoned,
            }
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let now = self.now();
        let mut keys = Vec::new();
        for shard in self.shared.shards.iter() {
            let shard = lock(shard);
            keys.extend(
                shard
                    .records
                    .iter()
                    .filter_map(|(key, record)| match record.state {
                        State::Pending { since, .. } if now.since(since) >= age => {
                            Some(key.key.to_string())
                        }
                        _ => None,
                    }),
            );
        }
        keys.sort_unstable();
        Ok(keys)
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.complete_now(key, None, response)
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let (probe, mut shard) = self.locked(key);
        let removed = shard.records.remove(probe.lookup()).is_some();
        shard.wake(key);
        drop(shard);
        self.give_room(usize::from(removed));
        Ok(removed)
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

    /// A new store keeps a completed record for the default window: a claim within it
    /// replays, one past it is new; a store told to keep records forever replays years later.
    #[tokio::test]
    async fn a_new_store_keeps_a_completed_record_for_the_default_window() {
        let fingerprint = crate::LabelContract::fingerprint("k", "p");
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"{}"),
        );
        for (store, forever) in [
            (MemoryStore::new(), false),
            (MemoryStore::new().keep_forever(), true),
        ] {
            let Ok(Claim::New(reservation)) = store.claim("k", &fingerprint).await else {
                panic!("a new key is new");
            };
            store.complete("k", &reservation, &response).await.unwrap();
            skew(&store, DEFAULT_RETENTION - Duration::from_secs(1));
            assert!(matches!(
                store.claim("k", &fingerprint).await,
                Ok(Claim::Replay(_))
            ));
            skew(&store, DEFAULT_RETENTION + Duration::from_secs(1));
            let past = store.claim("k", &fingerprint).await;
            if forever {
                skew(&store, Duration::from_secs(10 * 365 * 24 * 3600));
                assert!(matches!(past, Ok(Claim::Replay(_))));
                assert!(matches!(
                    store.claim("k", &fingerprint).await,
                    Ok(Claim::Replay(_))
                ));
            } else {
                assert!(
                    matches!(past, Ok(Claim::New(_))),
                    "past the window: a new operation"
                );
            }
        }
    }

    /// A key's hash in a shard's map is the hash it carries, computed once: stored keys and
    /// probes hash alike, and a growing table never hashes a key's bytes again.
    #[test]
    fn a_key_hashes_as_the_hash_it_carries() {
        let store = MemoryStore::new();
        let probe = store.probe("POST /labels k-1");
        let stored = StoredKey {
            hash: probe.hash,
            key: Arc::from("POST /labels k-1"),
        };
        assert_eq!(Prehashed.hash_one(probe.lookup()), probe.hash);
        assert_eq!(Prehashed.hash_one(&stored), probe.hash);
        assert_ne!(store.probe("POST /labels k-2").hash, probe.hash);
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

    /// Anything else hashed with the map's hasher is folded byte by byte, in order.
    #[test]
    fn other_bytes_are_folded_in_order() {
        let hash = |bytes: &[u8]| {
            let mut hasher = Prehashed.build_hasher();
            hasher.write(bytes);
            hasher.finish()
        };
        assert_eq!(hash(b"\x01\x02"), 0x0102);
        assert_ne!(hash(b"ab"), hash(b"ba"));
        // Past eight bytes the first comes round again, and is folded with the ninth.
        assert_eq!(hash(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), 0);
    }

    /// The room of every table and queue of `store`, summed.
    fn room(store: &MemoryStore) -> (usize, usize) {
        let shards = store.shared.shards.iter().map(|shard| {
            let shard = lock(shard);
            (shard.records.capacity(), shard.expiry.capacity())
        });
        shards.fold((0, 0), |(r, q), (records, queue)| (r + records, q + queue))
    }

    /// A store sized for its records holds them without growing a table or a queue, and
    /// takes no more than a few times the room it was asked for (twice, and the margin, each
    /// table rounded up to a power of two).
    #[tokio::test]
    async fn a_store_sized_for_its_records_never_grows() {
        let records = 20_000;
        let store = MemoryStore::with_retention(Duration::from_secs(3600)).with_capacity(records);
        let sized = room(&store);
        assert!(sized.0 >= records && sized.1 >= records, "{sized:?}");
        assert!(
            sized.0 <= 4 * records && sized.1 <= 2 * records,
            "{sized:?}"
        );
        let response =
            StoredResponse::new(http::StatusCode::CREATED, Default::default(), Bytes::new());
        for i in 0..records {
            let key = format!("POST /labels k-{i}");
            let fingerprint = crate::LabelContract::fingerprint(&key, "p");
            let Claim::New(reservation) = store.claim(&key, &fingerprint).await.unwrap() else {
                panic!("a new key");
            };
            store.complete(&key, &reservation, &response).await.unwrap();
        }
        assert_eq!(store.len(), records);
        assert_eq!(room(&store), sized, "no table or queue grew");
        // Without a retention window there is no queue to size.
        let store = MemoryStore::new().keep_forever().with_capacity(records);
        let (tables, queues) = room(&store);
        assert!(tables >= records);
        assert_eq!(queues, 0);
        // A bound set after the room keeps it, and the bound; the store is made new.
        let used = MemoryStore::with_retention(Duration::from_secs(3600)).with_capacity(records);
        used.claim("k", &crate::LabelContract::fingerprint("k", "p"))
            .await
            .unwrap();
        let store = used.max_records(records);
        assert_eq!(room(&store), sized);
        assert!(store.is_empty());
        assert_eq!(store.shared.max_records, Some(records));
        assert_eq!(store.shared.retention, Some(Duration::from_secs(3600)));
        let fingerprint = crate::LabelContract::fingerprint("k", "p");
        assert!(matches!(
            store.claim("k", &fingerprint).await,
            Ok(Claim::New(_))
        ));
        // Bounded while shared: a new store with the same room, its clones' store unchanged.
        let shared = MemoryStore::with_retention(Duration::from_secs(3600)).with_capacity(records);
        shared.claim("k", &fingerprint).await.unwrap();
        let bounded = shared.clone().max_records(1);
        assert_eq!(room(&bounded), sized);
        assert!(bounded.is_empty() && shared.is_pending("k"));
        assert_eq!(bounded.shared.max_records, Some(1));
        assert_eq!(shared.shared.max_records, None);
        bounded.claim("a", &fingerprint).await.unwrap();
        let full = bounded.claim("b", &fingerprint).await.unwrap_err();
        assert_eq!(full.kind(), StoreErrorKind::CapacityExceeded);
        // The room kept is the room asked for, not what the tables hold: a store not sized,
        // its tables grown, is bounded as a new store.
        let grown = MemoryStore::new();
        for i in 0..records {
            grown.claim(&format!("k-{i}"), &fingerprint).await.unwrap();
        }
        let bounded = grown.clone().max_records(10);
        assert_eq!(room(&bounded), room(&MemoryStore::new()));
        assert!(room(&grown).0 >= records);
    }

    /// A store sized for its records holds them under churn too: records dropped and new
    /// keys claimed in their place, ten times over what the store holds, neither grow a table
    /// nor make one be rehashed. A table's capacity is its records and its free slots; a slot
    /// marked deleted is neither, so a claim into one adds 1 to it, a removal that marks one
    /// takes 1 from it, and only a table grown or rehashed, its marks cleared, gains more.
    #[tokio::test]
    async fn a_store_sized_for_its_records_never_grows_under_churn() {
        let records = 20_000;
        let store = MemoryStore::new().with_capacity(records);
        let tables = |store: &MemoryStore| {
            let shards = store.shared.shards.iter();
            shards
                .map(|shard| lock(shard).records.capacity())
                .collect::<Vec<_>>()
        };
        let sized = tables(&store);
        let capacity = |key: &str| lock(store.shard(key)).records.capacity();
        let fingerprint = crate::LabelContract::fingerprint("k", "p");
        for i in 0..10 * records {
            let key = format!("POST /labels k-{i}");
            let before = capacity(&key);
            assert!(matches!(
                store.claim(&key, &fingerprint).await,
                Ok(Claim::New(_))
            ));
            assert!(
                capacity(&key) <= before + 1,
                "claim {i}: {before} to {}",
                capacity(&key)
            );
            if let Some(old) = i.checked_sub(records - 1) {
                let old = format!("POST /labels k-{old}");
                let before = capacity(&old);
                assert!(store.forget(&old).await.unwrap());
                assert!(capacity(&old) <= before, "forget {old}");
            }
        }
        assert_eq!(store.len(), records - 1);
        for (shard, (now, then)) in tables(&store).iter().zip(&sized).enumerate() {
            assert!(now <= then, "shard {shard}'s table grew: {then} to {now}");
        }
    }

    /// Room beyond what can be had is a panic that names it, not an abort.
    #[test]
    fn room_that_cannot_be_had_is_a_panic_that_says_so() {
        let refused = std::panic::catch_unwind(|| MemoryStore::new().with_capacity(usize::MAX))
            .expect_err("no table holds that many");
        let message = refused.downcast_ref::<String>().expect("a message");
        let named = format!("MemoryStore::with_capacity({}): ", usize::MAX);
        assert!(message.starts_with(&named), "{message}");
    }

    /// A shard's room is its share and a margin that grows as the share's square root.
    #[test]
    fn a_shard_makes_room_for_its_share_and_a_margin() {
        assert_eq!(shard_room(0), 0);
        assert_eq!(shard_room(1), 1 + 6 + 16);
        assert_eq!(shard_room(64 * 100), 100 + 60 + 16);
        assert_eq!(shard_room(64 * 100 + 1), 101 + 60 + 16);
        assert_eq!(shard_room(64 * 10_000), 10_000 + 600 + 16);
    }

    /// Keys compare by their bytes: two keys whose hashes collide are still two keys.
    #[test]
    fn colliding_hashes_are_different_keys() {
        let a = Probe { hash: 7, key: "a" };
        let b = Probe { hash: 7, key: "b" };
        assert!((&a as &dyn Lookup) != (&b as &dyn Lookup));
        assert!((&a as &dyn Lookup) == (&Probe { hash: 7, key: "a" } as &dyn Lookup));
        let stored = StoredKey {
            hash: 7,
            key: Arc::from("a"),
        };
        let other = StoredKey {
            hash: 7,
            key: Arc::from("b"),
        };
        assert!(stored != other);
        assert!(stored == stored.clone());
        let mut map: HashMap<StoredKey, u8, Prehashed> = HashMap::default();
        map.insert(stored, 1);
        map.insert(other, 2);
        assert_eq!(map.get(&a as &dyn Lookup), Some(&1));
        assert_eq!(map.get(&b as &dyn Lookup), Some(&2));
    }
}
