//! A shard of the memory store: its records, its expiry queue and its waiters, and the clock
//! the store reads.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hashbrown::HashTable;

use super::SHARDS;
use super::key::Probe;
use crate::store::waiting::{self, WaiterMap};
use crate::store::{Lease, Reservation};

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
    /// Requests waiting for a pending key of this shard to change, by key: woken and
    /// removed when it does; removed by the last waiter that gives up.
    pub(super) waiters: WaiterMap,
}

/// A record: its key and, once completed, its response in one allocation, and what a claim
/// decides by beside them.
pub(super) struct Record {
    /// The keyed hash of the key, computed once per call: the record's hash in the table.
    pub(super) hash: u64,
    /// The key, then, once completed, the response in the stores' one encoding: the
    /// record's one allocation (a replay shares it).
    data: Bytes,
    /// How many of `data`'s bytes are the key.
    key_len: usize,
    /// The fingerprint's digest: half the size of its hexadecimal form.
    pub(super) fingerprint: [u8; 32],
    pub(super) state: State,
}

pub(super) enum State {
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
    /// Completed: the response follows the key in the record's data.
    Completed {
        /// When it was completed; only kept with a retention window, else
        /// [`Tick::NEVER`].
        at: Tick,
    },
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

    /// Drops the expired records at the front of the expiry queue, looking at `limit` entries
    /// at most, and returns how many records it dropped.
    pub(super) fn sweep(&mut self, now: Tick, retention: Duration, limit: usize) -> usize {
        let mut dropped = 0;
        for _ in 0..limit {
            match self.expiry.front() {
                Some((at, _)) if now.since(*at) >= retention => {}
                _ => break,
            }
            let Some((at, hash)) = self.expiry.pop_front() else {
                break;
            };
            // The record completed then, unless completed again, taken over or forgotten
            // since: found by its hash and that moment.
            let completed_then = |record: &Record| {
                record.hash == hash
                    && matches!(record.state, State::Completed { at: completed } if completed == at)
            };
            if let Ok(entry) = self.records.find_entry(hash, completed_then) {
                entry.remove();
                dropped += 1;
            }
        }
        dropped
    }
}

impl State {
    /// A new reservation and its lease, from `now`.
    pub(super) fn pending(reservation: Reservation, now: Tick, lease: Lease) -> Self {
        Self::Pending {
            reservation: reservation.halves(),
            since: now,
            until: now.after(lease.duration()),
            take_over: lease.takes_over(),
        }
    }
}

impl Record {
    /// A record of `key` pending under `reservation` from `now`.
    pub(super) fn pending(
        probe: Probe<'_>,
        fingerprint: [u8; 32],
        reservation: Reservation,
        now: Tick,
        lease: Lease,
    ) -> Self {
        Self {
            hash: probe.hash,
            data: Bytes::copy_from_slice(probe.key.as_bytes()),
            key_len: probe.key.len(),
            fingerprint,
            state: State::pending(reservation, now, lease),
        }
    }

    /// Pending again, under a new reservation, with the same key: a take-over, or an expired
    /// record claimed anew. The key stays where it is, with nothing allocated.
    pub(super) fn reclaim(
        &mut self,
        fingerprint: [u8; 32],
        reservation: Reservation,
        now: Tick,
        lease: Lease,
    ) {
        // A response left in `data` is no longer read, and goes at the next complete.
        self.fingerprint = fingerprint;
        self.state = State::pending(reservation, now, lease);
    }

    /// Completed at `at` with `data`: the key, then the encoded response
    /// ([`codec::encode_after`](crate::store::codec::encode_after) with this key).
    pub(super) fn complete(&mut self, data: Bytes, at: Tick) {
        debug_assert_eq!(data.get(..self.key_len), Some(self.key()));
        self.data = data;
        self.state = State::Completed { at };
    }

    /// The record's key.
    pub(super) fn key(&self) -> &[u8] {
        &self.data[..self.key_len]
    }

    /// Whether this is the record of `probe`'s key.
    fn is(&self, probe: Probe<'_>) -> bool {
        self.hash == probe.hash && self.key() == probe.key.as_bytes()
    }

    /// The encoded response of a completed record, sharing the record's allocation.
    pub(super) fn response(&self) -> Option<Bytes> {
        match self.state {
            State::Completed { .. } => Some(self.data.slice(self.key_len..)),
            State::Pending { .. } => None,
        }
    }

    pub(super) fn is_expired(&self, now: Tick, retention: Duration) -> bool {
        matches!(self.state, State::Completed { at } if at != Tick::NEVER && now.since(at) >= retention)
    }
}

/// Locks a shard. A panic elsewhere while holding it cannot leave a record half-written (every
/// update is a single assignment), so a poisoned lock is still sound to use.
pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
