//! A shard of the memory store: its records, its expiry queue and its waiters, and the clock
//! the store reads.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hashbrown::HashTable;

use super::SHARDS;
use super::key::Probe;
use crate::store::{Lease, Reservation, StoredResponse, codec};
use tower_idempotency_core::backend::waiting::{self, WaiterMap};

/// A moment, as nanoseconds since the store's epoch: half the size of an `Instant`, and
/// enough for 584 years.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Tick(pub(super) u64);

impl Tick {
    /// Later than any moment: a lease that never lapses, a time not kept.
    pub(super) const NEVER: Self = Self(u64::MAX);

    /// `duration` after this moment, or [`Tick::NEVER`] past what a tick holds.
    pub(super) fn after(self, duration: Duration) -> Self {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }

    /// The time from `earlier` to this moment, zero if `earlier` is later.
    pub(super) fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

#[derive(Default)]
pub(super) struct Shard {
    /// The records, each found by the keyed hash of its key and compared by the key itself.
    pub(super) records: HashTable<Record>,
    /// With a retention window: the completed records of this shard in the order they were
    /// completed, with when, by their key's hash. An entry whose record was completed again,
    /// taken over or forgotten since is stale, and skipped.
    pub(super) expiry: VecDeque<(Tick, u64)>,
    /// With a tombstone window: the tombstones of this shard in the order their records were
    /// completed, with when, by their key's hash; stale entries are skipped as above.
    pub(super) tombstones: VecDeque<(Tick, u64)>,
    /// Requests waiting for a pending key of this shard to change, by key: woken and
    /// removed when it does; removed by the last waiter that gives up.
    pub(super) waiters: WaiterMap,
}

/// A record: its key and, once completed, its response in one allocation, and what a claim
/// decides by beside them.
pub(super) struct Record {
    /// The keyed hash of the key, computed once per call: the record's hash in the table.
    pub(super) hash: u64,
    /// How many of the record's bytes are the key.
    key_len: usize,
    /// The fingerprint's digest: half the size of its hexadecimal form.
    pub(super) fingerprint: [u8; 32],
    /// The state, with the record's bytes.
    pub(super) state: State,
}

/// The most bytes a record's one allocation is made with beyond its key when claimed, for the
/// response to come: a response larger than that takes an allocation of its own at the
/// complete.
const MAX_RESPONSE_ROOM: usize = 1024;

/// The largest encoded response a claim's room may hold (its room, rounded up to the
/// allocator's step): a larger one is encoded before the shard's lock is taken, so that the
/// shard waits for no large copy.
pub(super) const LARGEST_IN_PLACE: usize = MAX_RESPONSE_ROOM + 16;

/// What a record's place costs beside its data, as the byte bound counts it: its slot in the
/// table (121 bytes, in a table kept at most half full) and an expiry entry.
pub(super) const RECORD_BYTES: usize = 256;

/// The most unused bytes a completed record keeps at the end of its allocation: a response
/// that leaves more of the room made at the claim is copied into an allocation of its size.
const MAX_SLACK: usize = 64;

pub(super) enum State {
    /// Reserved under this token.
    Pending {
        /// The key, with room after it for the response: the record's one allocation,
        /// written in place at the complete if the response fits.
        data: BytesMut,
        reservation: [u64; 2],
        /// When it was claimed.
        since: Tick,
        /// When its lease lapses unless renewed.
        until: Tick,
        /// Whether its owner lets a claim take it over once abandoned.
        take_over: bool,
    },
    /// Completed: the response follows the key in the record's data.
    Completed {
        /// The key, then the response in the stores' one encoding, then `slack` unused
        /// bytes: the record's one allocation (a replay shares it).
        data: Bytes,
        /// When it was completed; only kept with a retention window, else
        /// [`Tick::NEVER`].
        at: Tick,
        /// How many bytes at the end of `data` are not the response: room made at the claim
        /// and not taken.
        slack: u8,
    },
    /// Completed, its replay window passed: the key, then its
    /// [`Tombstone`](crate::store::Tombstone)'s bytes, in one allocation of their size.
    Tombstone {
        data: Bytes,
        /// When it was completed.
        at: Tick,
    },
}

/// What a sweep did to the bounds' counts: records dropped, and the bytes freed and grown
/// ([`Record::bytes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Swept {
    pub(super) dropped: usize,
    pub(super) freed: usize,
    pub(super) grown: usize,
}

impl Swept {
    /// Both sweeps' counts.
    pub(super) fn add(self, other: Self) -> Self {
        Self {
            dropped: self.dropped + other.dropped,
            freed: self.freed + other.freed,
            grown: self.grown + other.grown,
        }
    }
}

/// How long a shard keeps what: the store's replay window, and its tombstone window after it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Windows {
    pub(super) retention: Duration,
    pub(super) tombstones: Option<Duration>,
}

impl Windows {
    /// How long after its completion a record is remembered at all: its replay window, and its
    /// tombstone window after it.
    pub(super) fn remembered(self) -> Duration {
        self.retention
            .saturating_add(self.tombstones.unwrap_or(Duration::ZERO))
    }
}

/// The records one shard makes room for, of `records` spread over the shards: none for none;
/// else its share, six standard deviations of the share a shard gets of uniformly hashed keys
/// beyond it, and a few more for small stores (a store with a shard over that, holding
/// `records`, is under one in ten million at every size).
pub(super) fn shard_room(records: usize) -> usize {
    let share = records.div_ceil(SHARDS);
    if share == 0 {
        return 0;
    }
    share + 6 * share.isqrt() + 16
}

impl Shard {
    /// Wakes the requests waiting for `key`, if any.
    pub(super) fn wake(&mut self, key: &str) {
        waiting::wake(&mut self.waiters, key);
    }

    /// The record of `probe`'s key, if there is one.
    pub(super) fn get(&self, probe: Probe<'_>) -> Option<&Record> {
        self.records.find(probe.hash, |record| record.is(probe))
    }

    /// The record of `probe`'s key, to change, if there is one.
    pub(super) fn get_mut(&mut self, probe: Probe<'_>) -> Option<&mut Record> {
        self.records.find_mut(probe.hash, |record| record.is(probe))
    }

    /// Adds a record for a key the shard does not hold.
    pub(super) fn insert(&mut self, record: Record) {
        self.records
            .insert_unique(record.hash, record, |record| record.hash);
    }

    /// Removes the record of `probe`'s key; whether there was one.
    pub(super) fn remove(&mut self, probe: Probe<'_>) -> bool {
        match self
            .records
            .find_entry(probe.hash, |record| record.is(probe))
        {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Ends the replay window of the records at the front of the expiry queue whose window
    /// passed (each becomes a tombstone with a tombstone window, else goes), then drops the
    /// tombstones at the front of their queue whose window passed too, looking at `limit`
    /// entries of each queue at most. `wall` is the time of day of a moment.
    pub(super) fn sweep(
        &mut self,
        now: Tick,
        windows: Windows,
        wall: impl Fn(Tick) -> std::time::SystemTime,
        limit: usize,
    ) -> Swept {
        let mut swept = Swept::default();
        for _ in 0..limit {
            match self.expiry.front() {
                Some((at, _)) if now.since(*at) >= windows.retention => {}
                _ => break,
            }
            let Some((at, hash)) = self.expiry.pop_front() else {
                break;
            };
            // The record completed then, unless completed again, taken over or forgotten
            // since: found by its hash and that moment.
            let completed_then = |record: &Record| {
                record.hash == hash
                    && matches!(record.state, State::Completed { at: completed, .. } if completed == at)
            };
            let Ok(mut entry) = self.records.find_entry(hash, completed_then) else {
                continue;
            };
            let before = entry.get().bytes();
            let remembered = windows.tombstones.is_some() && now.since(at) < windows.remembered();
            if remembered && entry.get_mut().bury(wall(at)) {
                // A tombstone is smaller than its record, unless the response was smaller
                // than the tombstone's dozen bytes.
                let after = entry.get().bytes();
                swept.freed += before.saturating_sub(after);
                swept.grown += after.saturating_sub(before);
                self.tombstones.push_back((at, hash));
            } else {
                swept.freed += before;
                swept.dropped += 1;
                entry.remove();
            }
        }
        for _ in 0..limit {
            match self.tombstones.front() {
                Some((at, _)) if now.since(*at) >= windows.remembered() => {}
                _ => break,
            }
            let Some((at, hash)) = self.tombstones.pop_front() else {
                break;
            };
            swept = swept.add(self.drop_tombstone(at, hash));
        }
        swept
    }

    /// Drops the oldest tombstone, whatever its window, looking at `limit` entries of its
    /// queue at most (stale ones skipped): a full store makes room for a new claim from what
    /// it remembers last, one tombstone a claim.
    pub(super) fn drop_oldest_tombstone(&mut self, limit: usize) -> Swept {
        for _ in 0..limit {
            let Some((at, hash)) = self.tombstones.pop_front() else {
                break;
            };
            let swept = self.drop_tombstone(at, hash);
            if swept.dropped > 0 {
                return swept;
            }
        }
        Swept::default()
    }

    /// Drops the tombstone of the record completed at `at` with the key hash `hash`, unless the
    /// key was claimed or forgotten since.
    fn drop_tombstone(&mut self, at: Tick, hash: u64) -> Swept {
        let buried_then = |record: &Record| {
            record.hash == hash
                && matches!(record.state, State::Tombstone { at: buried, .. } if buried == at)
        };
        match self.records.find_entry(hash, buried_then) {
            Ok(entry) => {
                let freed = entry.get().bytes();
                entry.remove();
                Swept {
                    dropped: 1,
                    freed,
                    grown: 0,
                }
            }
            Err(_) => Swept::default(),
        }
    }
}

impl State {
    /// A new reservation of `data` (the key, with room after it) and its lease, from `now`.
    fn pending(data: BytesMut, reservation: Reservation, now: Tick, lease: Lease) -> Self {
        Self::Pending {
            data,
            reservation: reservation.halves(),
            since: now,
            until: now.after(lease.duration()),
            take_over: lease.takes_over(),
        }
    }
}

/// The size to allocate for `len` bytes: `len` rounded up to what the allocator hands out
/// anyway (glibc's chunks: 16-byte steps, 8 bytes of each kept for its size), so that the
/// room a record is made with beyond its need costs no memory of its own.
fn allocated(len: usize) -> usize {
    len.checked_add(8)
        .and_then(|len| len.checked_next_multiple_of(16))
        .map_or(len, |size| size - 8)
}

impl Record {
    /// A record of `key` pending under `reservation` from `now`, made with room for a response
    /// of `response_room` bytes after its key.
    pub(super) fn pending(
        probe: Probe<'_>,
        fingerprint: [u8; 32],
        reservation: Reservation,
        now: Tick,
        lease: Lease,
        response_room: usize,
    ) -> Self {
        let key = probe.key.as_bytes();
        let room = response_room.min(MAX_RESPONSE_ROOM);
        let mut data = BytesMut::with_capacity(allocated(key.len().saturating_add(room)));
        data.put_slice(key);
        Self {
            hash: probe.hash,
            key_len: key.len(),
            fingerprint,
            state: State::pending(data, reservation, now, lease),
        }
    }

    /// Pending again, under a new reservation, with the same key: a take-over, or an expired
    /// record claimed anew. The key stays where it is, with nothing allocated unless a replay
    /// still shares the record's bytes.
    pub(super) fn reclaim(
        &mut self,
        fingerprint: [u8; 32],
        reservation: Reservation,
        now: Tick,
        lease: Lease,
    ) {
        let placeholder = State::Completed {
            data: Bytes::new(),
            at: Tick::NEVER,
            slack: 0,
        };
        let mut data = match std::mem::replace(&mut self.state, placeholder) {
            State::Pending { data, .. } => data,
            // The response or tombstone left in it is no longer read: only the key is kept.
            State::Completed { data, .. } | State::Tombstone { data, .. } => data
                .try_into_mut()
                .unwrap_or_else(|shared| BytesMut::from(&shared[..self.key_len])),
        };
        data.truncate(self.key_len);
        self.fingerprint = fingerprint;
        self.state = State::pending(data, reservation, now, lease);
    }

    /// Completed at `at` with `response`, encoded after the key: in the room the claim made
    /// for it when it fits that room closely, else in an allocation of its own. A record
    /// that is not pending is left as it is (the caller checked it is).
    #[cfg(test)]
    pub(super) fn complete(&mut self, response: &StoredResponse, at: Tick) {
        self.complete_with(response, codec::encoded_len(response), None, at);
    }

    /// [`complete`](Self::complete), with the key and the response already encoded into a
    /// buffer of their own if `encoded` is given (one too large for any claim's room, encoded
    /// before the shard's lock).
    /// `encoded_len` is the response's [`codec::encoded_len`], computed once by the caller.
    pub(super) fn complete_with(
        &mut self,
        response: &StoredResponse,
        encoded_len: usize,
        encoded: Option<Bytes>,
        at: Tick,
    ) {
        let State::Pending { data, .. } = &mut self.state else {
            return;
        };
        if let Some(encoded) = encoded {
            self.state = State::Completed {
                data: encoded,
                at,
                slack: 0,
            };
            return;
        }
        let needed = self.key_len.saturating_add(encoded_len);
        let slack = data
            .capacity()
            .checked_sub(needed)
            .filter(|slack| *slack <= MAX_SLACK)
            .and_then(|slack| u8::try_from(slack).ok());
        let (data, slack) = match slack {
            Some(_) => {
                let mut data = std::mem::take(data);
                codec::encode_into(&mut data, response);
                // Filled up to its capacity: frozen whole, the buffer is shared as it is, with
                // no allocation of its own for its count.
                let slack = data.capacity().saturating_sub(data.len());
                let slack = u8::try_from(slack).unwrap_or(u8::MAX);
                data.put_bytes(0, usize::from(slack));
                (data.freeze(), slack)
            }
            None => (codec::encode_after(&data[..self.key_len], response), 0),
        };
        self.state = State::Completed { data, at, slack };
    }

    /// The record's key.
    pub(super) fn key(&self) -> &[u8] {
        let data = match &self.state {
            State::Pending { data, .. } => &data[..],
            State::Completed { data, .. } | State::Tombstone { data, .. } => &data[..],
        };
        &data[..self.key_len]
    }

    /// Turns a completed record into its tombstone, completed at `completed_at`: the key and
    /// the tombstone's bytes in an allocation of their size, the response gone (a replay that
    /// shares it keeps its own bytes). Whether it did: a record that is not completed, or
    /// whose response does not read back, is left as it is.
    pub(super) fn bury(&mut self, completed_at: std::time::SystemTime) -> bool {
        let State::Completed { at, .. } = self.state else {
            return false;
        };
        // Read in place: no header map is built under the shard's lock.
        let response = self.response().unwrap_or_default();
        let Ok(tombstone) = codec::tombstone(&response, completed_at) else {
            return false;
        };
        let mut data = BytesMut::with_capacity(self.key_len + tombstone.encoded_len());
        data.put_slice(self.key());
        tombstone.encode_into(&mut data);
        self.state = State::Tombstone {
            data: data.freeze(),
            at,
        };
        true
    }

    /// The tombstone's bytes of a record whose replay window passed.
    pub(super) fn tombstone(&self) -> Option<Bytes> {
        match &self.state {
            State::Tombstone { data, .. } => Some(data.slice(self.key_len..)),
            _ => None,
        }
    }

    /// The bytes this record takes, as a memory store's byte bound counts them: its data (the
    /// key, and the response or the room for it) and [`RECORD_BYTES`] for its place in the
    /// table and the expiry queue.
    pub(super) fn bytes(&self) -> usize {
        let data = match &self.state {
            State::Pending { data, .. } => data.capacity(),
            State::Completed { data, .. } | State::Tombstone { data, .. } => data.len(),
        };
        data.saturating_add(RECORD_BYTES)
    }

    /// Whether this is the record of `probe`'s key.
    fn is(&self, probe: Probe<'_>) -> bool {
        self.hash == probe.hash && self.key() == probe.key.as_bytes()
    }

    /// The encoded response of a completed record, sharing the record's allocation.
    pub(super) fn response(&self) -> Option<Bytes> {
        match &self.state {
            State::Completed { data, slack, .. } => {
                Some(data.slice(self.key_len..data.len().saturating_sub(usize::from(*slack))))
            }
            State::Pending { .. } | State::Tombstone { .. } => None,
        }
    }
}

/// Locks a shard. A panic elsewhere while holding it cannot leave a record half-written (every
/// update is a single assignment), so a poisoned lock is still sound to use.
pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;

    const KEY: &str = "POST /labels label-req-7";

    fn response(body: &'static str) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        StoredResponse::new(
            StatusCode::CREATED,
            headers,
            Bytes::from_static(body.as_bytes()),
        )
    }

    fn pending(room: usize) -> Record {
        let probe = Probe { hash: 7, key: KEY };
        let lease = Lease::new(Duration::from_secs(1));
        Record::pending(
            probe,
            [1; 32],
            Reservation::generate(),
            Tick(0),
            lease,
            room,
        )
    }

    /// The record's bytes while pending: where they are and how many it may hold.
    fn pending_data(record: &Record) -> (*const u8, usize) {
        let State::Pending { data, .. } = &record.state else {
            panic!("pending");
        };
        assert_eq!(&data[..], KEY.as_bytes(), "the key alone");
        (data.as_ptr(), data.capacity())
    }

    fn completed_data(record: &Record) -> (*const u8, usize, u8) {
        let State::Completed { data, slack, .. } = &record.state else {
            panic!("completed");
        };
        (data.as_ptr(), data.len(), *slack)
    }

    /// A response that fits the room the claim made is written in place: the record keeps
    /// the one allocation it was claimed with, filled to its end, and reads back exact.
    #[test]
    fn a_response_that_fits_is_written_in_the_claims_allocation() {
        let stored = response("{\"label_id\":\"lbl_1\"}");
        let needed = codec::encoded_len(&stored);
        let mut record = pending(needed + 20);
        let (at, capacity) = pending_data(&record);
        assert!(capacity >= KEY.len() + needed + 20, "room for it made");
        assert!(capacity - (KEY.len() + needed) <= MAX_SLACK);
        record.complete(&stored, Tick(5));
        let (completed, len, slack) = completed_data(&record);
        assert_eq!(completed, at, "the same allocation");
        assert_eq!(len, capacity, "filled to its capacity");
        assert_eq!(usize::from(slack), capacity - KEY.len() - needed);
        assert_eq!(record.key(), KEY.as_bytes());
        let read = codec::decode(record.response().expect("completed")).expect("decodes");
        assert_eq!(read.body(), stored.body());
        assert_eq!(read.headers(), stored.headers());
        assert!(matches!(record.state, State::Completed { at: Tick(5), .. }));
    }

    /// A response larger than the room, or one that would leave more than
    /// [`MAX_SLACK`] bytes of it unused, takes an allocation of its size.
    #[test]
    fn a_response_that_does_not_fit_closely_takes_an_allocation_of_its_size() {
        let stored = response("{\"label_id\":\"lbl_1\"}");
        let needed = codec::encoded_len(&stored);
        // The most room that is still a byte short, once rounded up to the allocator's step.
        let short = (0..needed)
            .rev()
            .find(|room| allocated(KEY.len() + room) < KEY.len() + needed)
            .expect("a room too small");
        assert!(allocated(KEY.len() + short + 1) >= KEY.len() + needed);
        for room in [0, short, needed + MAX_SLACK + 16] {
            let mut record = pending(room);
            let (at, _) = pending_data(&record);
            record.complete(&stored, Tick(5));
            let (completed, len, slack) = completed_data(&record);
            assert_ne!(completed, at, "room {room}: another allocation");
            assert_eq!((len, slack), (KEY.len() + needed, 0), "room {room}");
            let read = codec::decode(record.response().expect("completed")).expect("decodes");
            assert_eq!(read.body(), stored.body(), "room {room}");
        }
        // The room made for a response is capped.
        let record = pending(usize::MAX);
        let (_, capacity) = pending_data(&record);
        assert!(capacity <= allocated(KEY.len() + MAX_RESPONSE_ROOM));
    }

    /// A response encoded before the lock is the record's as given: its own buffer, no slack.
    #[test]
    fn a_response_encoded_before_the_lock_is_kept_as_given() {
        let stored = response("{\"label_id\":\"lbl_1\"}");
        let mut record = pending(codec::encoded_len(&stored));
        let (at, _) = pending_data(&record);
        let encoded = codec::encode_after(KEY.as_bytes(), &stored);
        let given = encoded.as_ptr();
        let len = codec::encoded_len(&stored);
        record.complete_with(&stored, len, Some(encoded), Tick(5));
        let (completed, len, slack) = completed_data(&record);
        assert_eq!(completed, given, "the buffer given");
        assert_ne!(completed, at);
        assert_eq!((len, slack), (KEY.len() + codec::encoded_len(&stored), 0));
        let read = codec::decode(record.response().expect("completed")).expect("decodes");
        assert_eq!(read.body(), stored.body());
    }

    /// Only a pending record completes.
    #[test]
    fn a_completed_record_does_not_complete_again() {
        let mut record = pending(0);
        record.complete(&response("first"), Tick(5));
        record.complete(&response("second"), Tick(6));
        let read = codec::decode(record.response().expect("completed")).expect("decodes");
        assert_eq!(read.body(), "first");
        assert!(matches!(record.state, State::Completed { at: Tick(5), .. }));
    }

    /// Claimed anew, a completed record keeps its key, in its own allocation when no replay
    /// shares it, and completes again with the new response.
    #[test]
    fn a_reclaimed_record_keeps_its_key() {
        let lease = Lease::new(Duration::from_secs(1));
        let stored = response("{\"label_id\":\"lbl_1\"}");
        for shared in [false, true] {
            let mut record = pending(codec::encoded_len(&stored));
            record.complete(&stored, Tick(5));
            let (at, _, _) = completed_data(&record);
            let replay = shared.then(|| record.response());
            record.reclaim([2; 32], Reservation::generate(), Tick(9), lease);
            let (now, _) = pending_data(&record);
            assert_eq!(now == at, !shared, "shared {shared}");
            assert!(record.response().is_none());
            assert_eq!(record.fingerprint, [2; 32]);
            record.complete(&response("second"), Tick(10));
            let read = codec::decode(record.response().expect("completed")).expect("decodes");
            assert_eq!(read.body(), "second");
            if let Some(Some(replay)) = replay {
                let read = codec::decode(replay).expect("decodes");
                assert_eq!(read.body(), stored.body(), "the replay keeps its bytes");
            }
        }
        // A take-over of a pending record keeps its allocation.
        let mut record = pending(64);
        let (at, _) = pending_data(&record);
        record.reclaim([3; 32], Reservation::generate(), Tick(9), lease);
        assert_eq!(pending_data(&record).0, at);
    }

    /// What is allocated for `len` bytes: at least `len`, up to the allocator's next step.
    #[test]
    fn the_size_allocated_rounds_up_to_the_allocators_step() {
        for (len, size) in [
            (0, 8),
            (8, 8),
            (9, 24),
            (24, 24),
            (25, 40),
            (usize::MAX, usize::MAX),
        ] {
            assert_eq!(allocated(len), size, "{len}");
        }
    }
}
