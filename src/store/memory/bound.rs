//! The bound: the most records a memory store holds, and the room each record takes of it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::MemoryStore;
use crate::store::{StoreError, StoreErrorKind};

impl MemoryStore {
    /// Holds at most `max` records, pending and completed (default [`DEFAULT_MAX_RECORDS`](crate::store::DEFAULT_MAX_RECORDS),
    /// one million): when full, a claim of a new key fails with
    /// [`StoreErrorKind::CapacityExceeded`] (the layer answers `503`, `store_unavailable`,
    /// with `Retry-After`, and creates nothing) until releases or the retention make room.
    /// Before it refuses, a full store drops expired records of every shard. A replay and a
    /// claim of a pending key need no room: they keep their answers when the store is full.
    ///
    /// Pending records count, and never expire: a create that fails without an answer (the
    /// inner service's error or panic) keeps its key pending, since it may have taken effect.
    /// So while the create's downstream fails every request, a bounded store fills with such
    /// keys and then refuses every new key, until they are resolved or forgotten (the
    /// store's [`Operator`](crate::store::Operator) view) or the process restarts (which
    /// forgets every key of a memory store). [`len`](Self::len) tells how full it is.
    ///
    /// Like [`retention`](Self::retention), it returns an **empty** store: set it on a new
    /// one, before it is shared; the room reserved with [`MemoryStore::with_capacity`] is
    /// kept.
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
    pub fn max_records(self, max: usize) -> Self {
        self.with_bound(Some(max))
    }

    /// Holds every record it is sent, without a bound: the process then grows with every
    /// distinct key its clients send, until it runs out of memory. For a store whose keys
    /// the server chooses, or that something in front of it bounds. Like
    /// [`max_records`](Self::max_records), it returns an empty store.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::DEFAULT_MAX_RECORDS;
    ///
    /// assert_eq!(MemoryStore::new().record_bound(), Some(DEFAULT_MAX_RECORDS));
    /// assert_eq!(MemoryStore::new().max_records(10).record_bound(), Some(10));
    /// assert_eq!(MemoryStore::new().unbounded().record_bound(), None);
    /// ```
    pub fn unbounded(self) -> Self {
        self.with_bound(None)
    }

    /// The most records this store holds at once, `None` without a bound.
    pub fn record_bound(&self) -> Option<usize> {
        self.shared.max_records
    }

    /// This store with the bound `max`: made new in place when not shared yet, else a new
    /// store beside the one its clones hold, with the same retention and room.
    pub(super) fn with_bound(mut self, max: Option<usize>) -> Self {
        // Not shared: bounded in place, a store made new (emptied) with the room reserved in
        // its shards kept.
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            for shard in &mut shared.shards {
                let shard = shard.get_mut().unwrap_or_else(PoisonError::into_inner);
                shard.records.clear();
                shard.expiry.clear();
                shard.waiters.clear();
            }
            shared.max_records = max;
            *shared.records.get_mut() = 0;
            return self;
        }
        // Shared: a new store, beside the one its clones hold, with the same room.
        self.beside(self.shared.retention, max)
    }

    /// Takes room for one more record, if the store is bounded and has it.
    pub(super) fn take_room(&self) -> Result<(), StoreError> {
        let Some(max) = self.shared.max_records else {
            return Ok(());
        };
        // Taken only if there is room, in one step: an add undone on refusal would count a
        // refused claim for a moment, and another claim could then be refused while a place
        // is free.
        self.shared
            .records
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .map(drop)
            .map_err(|_| StoreError::new(StoreErrorKind::CapacityExceeded))
    }

    /// Gives back the room of `n` records dropped.
    pub(super) fn give_room(&self, n: usize) {
        if self.shared.max_records.is_some() && n > 0 {
            self.shared.records.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims and releases racing at the bound never count more records than the bound, not
    /// even for a moment: a count past it would refuse a claim while a place is free.
    #[test]
    fn the_count_never_passes_the_bound_under_racing_claims() {
        let store = MemoryStore::new().max_records(4);
        for _ in 0..4 {
            store.take_room().unwrap();
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racers: Vec<_> = (0..3)
            .map(|_| {
                let (store, stop) = (store.clone(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if store.take_room().is_ok() {
                            store.give_room(1);
                        }
                    }
                })
            })
            .collect();
        let mut most = 0;
        for _ in 0..200_000 {
            most = most.max(store.shared.records.load(Ordering::Acquire));
        }
        stop.store(true, Ordering::Relaxed);
        for racer in racers {
            racer.join().unwrap();
        }
        assert!(most <= 4, "counted {most} records of a bound of 4");
    }
}
