//! A shard of the memory store: its records, its expiry queue and its waiters, and the clock
//! the store reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;

use super::SHARDS;
use super::key::{Prehashed, StoredKey};
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
    pub(super) records: HashMap<StoredKey, Record, Prehashed>,
    /// With a retention window: the completed records of this shard in the order they were
    /// completed, with when. An entry whose record was completed again, taken over or
    /// forgotten since is stale, and skipped.
    pub(super) expiry: VecDeque<(Tick, StoredKey)>,
    /// Requests waiting for a pending key of this shard to change, by key: woken and
    /// removed when it does; removed by the last waiter that gives up.
    pub(super) waiters: WaiterMap,
}

pub(super) struct Record {
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
    Completed {
        /// The response in the stores' one encoding: a single buffer, a fraction of the size
        /// of a header map.
        response: Bytes,
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

    /// Drops the expired records at the front of the expiry queue, looking at `limit` entries
    /// at most, and returns how many records it dropped.
    pub(super) fn sweep(&mut self, now: Tick, retention: Duration, limit: usize) -> usize {
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
    /// A record pending under `reservation` from `now`.
    pub(super) fn pending(
        fingerprint: [u8; 32],
        reservation: Reservation,
        now: Tick,
        lease: Lease,
    ) -> Self {
        Self {
            fingerprint,
            state: State::pending(reservation, now, lease),
        }
    }

    pub(super) fn is_expired(&self, now: Tick, retention: Duration) -> bool {
        matches!(self.state, State::Completed { at, .. } if at != Tick::NEVER && now.since(at) >= retention)
    }
}

/// Locks a shard. A panic elsewhere while holding it cannot leave a record half-written (every
/// update is a single assignment), so a poisoned lock is still sound to use.
pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
