//! Building a memory store: its retention, its bounds and the room it reserves, all set
//! before the store exists, so that no setting ever meets a store whose clones are held.

use std::time::Duration;

use super::MemoryStore;
use crate::store::{DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_RETENTION};

/// The settings of a [`MemoryStore`] to be built: from [`MemoryStore::builder`], each setting
/// a method, then [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
///
/// let store = MemoryStore::builder()
///     .retention(Duration::from_secs(60 * 60))
///     .max_records(100_000)
///     .build();
/// assert_eq!(store.record_bound(), Some(100_000));
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until it is built"]
pub struct MemoryStoreBuilder {
    retention: Option<Duration>,
    tombstones: Option<Duration>,
    max_records: Option<usize>,
    max_bytes: Option<usize>,
    room: usize,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            retention: Some(DEFAULT_RETENTION),
            tombstones: Some(crate::store::DEFAULT_TOMBSTONES),
            max_records: Some(DEFAULT_MAX_RECORDS),
            max_bytes: Some(DEFAULT_MAX_BYTES),
            room: 0,
        }
    }
}

impl MemoryStoreBuilder {
    /// Takes the retention and the tombstone window of `options`, the type every store is
    /// configured with (a memory store's calls never wait, so it has no use for the timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::StoreOptions;
    ///
    /// let options = StoreOptions::new().retention(Duration::from_secs(90));
    /// let store = MemoryStore::builder().options(options).build();
    /// assert_eq!(store.retention_window(), Some(Duration::from_secs(90)));
    /// let forever = MemoryStore::builder().options(options.keep_forever()).build();
    /// assert_eq!(forever.retention_window(), None);
    /// ```
    pub fn options(mut self, options: crate::store::StoreOptions) -> Self {
        self.retention = options.retention_window();
        self.tombstones = options.tombstone_window();
        self
    }

    /// Replays completed records for `retention` (default [`DEFAULT_RETENTION`]), then keeps
    /// their [tombstones](Self::tombstones) for the tombstone window; pending records are kept
    /// however old they are. A zero window drops a record as it is
    /// completed, so every retry creates again: [`keep_forever`](Self::keep_forever) is the
    /// setting for records that never expire.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    ///
    /// let hour = Duration::from_secs(3600);
    /// let store = MemoryStore::builder().retention(hour).build();
    /// assert_eq!(store.retention_window(), Some(hour));
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Keeps every completed record for the life of the process, rather than for the
    /// retention window: the store then fills with every key it is sent, up to its
    /// [bound](Self::max_records), and refuses new keys once full.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    ///
    /// let store = MemoryStore::builder().keep_forever().build();
    /// assert_eq!(store.retention_window(), None);
    /// ```
    pub fn keep_forever(mut self) -> Self {
        self.retention = None;
        self
    }

    /// Once a completed record's retention passed, keeps its
    /// [`Tombstone`](crate::store::Tombstone) for `tombstones` more (default
    /// [`DEFAULT_TOMBSTONES`](crate::store::DEFAULT_TOMBSTONES), seven days): a retry with the
    /// same fingerprint is answered *key expired* rather than created again.
    /// `Duration::ZERO` keeps none. A tombstone is the key and about a dozen bytes more
    /// (with the create's `Location`), in an allocation of its own, and takes a place under
    /// the store's [bounds](Self::max_records) as a record does: a full store drops a
    /// tombstone (the oldest of the new key's shard, else of another shard) for each claim it
    /// would refuse, so tombstones never cost a create; a store that runs full of them keeps
    /// them for less than their window. Size the bound for the keys of both windows (a
    /// million records hold a week and a day of keys at 1.4 new keys a second).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    ///
    /// let store = MemoryStore::builder().tombstones(Duration::from_secs(3600)).build();
    /// assert_eq!(store.tombstone_window(), Some(Duration::from_secs(3600)));
    /// let none = MemoryStore::builder().tombstones(Duration::ZERO).build();
    /// assert_eq!(none.tombstone_window(), None);
    /// ```
    pub fn tombstones(mut self, tombstones: Duration) -> Self {
        self.tombstones = (!tombstones.is_zero()).then_some(tombstones);
        self
    }

    /// Holds at most `max` records, pending and completed (default
    /// [`DEFAULT_MAX_RECORDS`](crate::store::DEFAULT_MAX_RECORDS), one million): when full, a claim
    /// of a new key fails with
    /// [`StoreErrorKind::CapacityExceeded`](crate::store::StoreErrorKind::CapacityExceeded) (the
    /// layer answers `503`, `store_unavailable`, with `Retry-After`, and creates nothing) until
    /// releases or the retention make room. Before it refuses, a full store drops expired records
    /// of every shard. A replay and a claim of a pending key need no room: they keep their answers
    /// when the store is full.
    ///
    /// Pending records count, and never expire: a create that fails without an answer (the
    /// inner service's error or panic) keeps its key pending, since it may have taken effect.
    /// So while the create's downstream fails every request, a bounded store fills with such
    /// keys and then refuses every new key, until they are resolved or forgotten (the
    /// store's [`Operator`](crate::store::Operator) view) or the process restarts (which
    /// forgets every key of a memory store). [`MemoryStore::len`] tells how full it is.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::Store;
    /// use tower_idempotency::operation::Fingerprint;
    /// use tower_idempotency::store::StoreErrorKind;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::builder().max_records(1).build();
    /// store.claim("a", &Fingerprint::digest(["a", "p"])).await.unwrap();
    /// let full = store.claim("b", &Fingerprint::digest(["b", "p"])).await.unwrap_err();
    /// assert_eq!(full.kind(), StoreErrorKind::CapacityExceeded);
    /// # }
    /// ```
    pub fn max_records(mut self, max: usize) -> Self {
        self.max_records = Some(max);
        self
    }

    /// Holds records of at most `max` bytes in all, pending and completed (default
    /// [`DEFAULT_MAX_BYTES`](crate::store::DEFAULT_MAX_BYTES), 1 GiB), beside the bound on their
    /// number: when a new key's record would take the store past it, the claim fails with
    /// [`StoreErrorKind::CapacityExceeded`](crate::store::StoreErrorKind::CapacityExceeded) (`503`,
    /// `store_unavailable`, with `Retry-After`) until releases or the retention make room.
    ///
    /// A record counts its data (the key, then its response, or while pending the room made
    /// for the response to come, up to a kilobyte) and 256 bytes for its place in the store's
    /// table and expiry queue. The count is exact: every claim, complete, release, expiry and
    /// forget moves it by what the record took and takes. Only a new key is refused: a
    /// complete is never refused for its size (the create ran; its response is stored), so a
    /// large response can take the store past the bound, and new keys wait until it is back
    /// under. With the [response cap](crate::IdempotencyLayer::response_limit), a record
    /// takes at most about 1 MiB.
    ///
    /// Why 1 GiB: the default bound of a million records takes about 350 MB when its
    /// responses are a few hundred bytes; a gigabyte leaves room for responses of a few
    /// kilobytes at that count, while a million keys kept pending (which never expire)
    /// reserving their kilobyte each, or a few thousand responses near the cap, cannot take
    /// the process's memory with them.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::Store;
    /// use tower_idempotency::operation::Fingerprint;
    /// use tower_idempotency::store::StoreErrorKind;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::builder().max_bytes(300).build();
    /// store.claim("a", &Fingerprint::digest(["a", "p"])).await.unwrap();
    /// assert!(store.held_bytes() > 256);
    /// let full = store.claim("b", &Fingerprint::digest(["b", "p"])).await.unwrap_err();
    /// assert_eq!(full.kind(), StoreErrorKind::CapacityExceeded);
    /// # }
    /// ```
    pub fn max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = Some(max);
        self
    }

    /// Holds every record it is sent, without a bound on their number or their bytes: the
    /// process then grows with every
    /// distinct key its clients send, until it runs out of memory. For a store whose keys
    /// the server chooses, or that something in front of it bounds.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::DEFAULT_MAX_RECORDS;
    ///
    /// assert_eq!(MemoryStore::new().record_bound(), Some(DEFAULT_MAX_RECORDS));
    /// assert_eq!(MemoryStore::builder().max_records(10).build().record_bound(), Some(10));
    /// assert_eq!(MemoryStore::builder().unbounded().build().record_bound(), None);
    /// ```
    pub fn unbounded(mut self) -> Self {
        self.max_records = None;
        self.max_bytes = None;
        self
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
    /// The room is spread over the shards with a margin for keys that do not spread evenly,
    /// and each table is given twice it, so that records coming and going leave it at most
    /// half full: a store sized for `records` holds that many without growing a table. It
    /// is memory held from the start, whether the records come or not: 240 to 480 bytes a
    /// record of room, and 16 more with a retention window. BENCHMARKS.md ("A memory store
    /// sized up front") has how the room is made and what it saves (`cargo bench --bench
    /// claim_tail`). A later call sets another number in place of this one.
    ///
    /// [`build`](Self::build) panics if the room cannot be had (more than the address space
    /// holds, or memory the allocator refuses), with a message that says so, as a
    /// `HashMap::with_capacity` that large would.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    ///
    /// // An hour of retention at up to 25 creates a second.
    /// let store = MemoryStore::builder()
    ///     .retention(Duration::from_secs(60 * 60))
    ///     .reserve(90_000)
    ///     .build();
    /// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
    /// # drop(layer);
    /// ```
    pub fn reserve(mut self, records: usize) -> Self {
        self.room = records;
        self
    }

    /// The store, empty, with these settings.
    ///
    /// # Panics
    ///
    /// If the room [reserved](Self::reserve) cannot be had.
    pub fn build(self) -> MemoryStore {
        let store = MemoryStore::build(
            self.retention,
            self.tombstones,
            self.max_records,
            self.max_bytes,
        );
        store.reserve_room(self.room);
        store
    }
}
