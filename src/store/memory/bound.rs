//! The bounds: the most records a memory store holds and the most bytes they take, and the
//! room each record takes of them.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::MemoryStore;
use crate::store::{StoreError, StoreErrorKind};

impl MemoryStore {
    /// The bytes the records take now, as [`max_bytes`](super::MemoryStoreBuilder::max_bytes)
    /// counts them; `0` for a store without a byte bound, which does not count them.
    ///
    /// ```
    /// assert_eq!(tower_idempotency::MemoryStore::new().held_bytes(), 0);
    /// ```
    pub fn held_bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::Acquire)
    }

    /// The most bytes this store's records take at once, `None` without a byte bound.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::DEFAULT_MAX_BYTES;
    ///
    /// assert_eq!(MemoryStore::new().byte_bound(), Some(DEFAULT_MAX_BYTES));
    /// assert_eq!(MemoryStore::builder().unbounded().build().byte_bound(), None);
    /// ```
    pub fn byte_bound(&self) -> Option<usize> {
        self.shared.max_bytes
    }

    /// The most records this store holds at once, `None` without a bound.
    pub fn record_bound(&self) -> Option<usize> {
        self.shared.max_records
    }

    /// Takes room for one more record of `bytes` bytes, if the store has it under both of its
    /// bounds; none of either if not.
    ///
    /// The two are taken one after the other: a claim refused by the second holds the first
    /// for a moment, in which another claim may find it taken (only with both bounds all
    /// but reached).
    pub(super) fn take_room(&self, bytes: usize) -> Result<(), StoreError> {
        let shared = &*self.shared;
        take(&shared.records, shared.max_records, 1)?;
        if let Err(full) = take(&shared.bytes, shared.max_bytes, bytes) {
            give(&shared.records, shared.max_records, 1);
            return Err(full);
        }
        Ok(())
    }

    /// Gives back the room of `records` records dropped, which took `bytes` bytes.
    pub(super) fn give_room(&self, records: usize, bytes: usize) {
        give(&self.shared.records, self.shared.max_records, records);
        give(&self.shared.bytes, self.shared.max_bytes, bytes);
    }

    /// A record that took `before` bytes takes `after` now: never refused (a complete, or a
    /// record claimed anew in its own place), so the count may go past the bound.
    pub(super) fn resize(&self, before: usize, after: usize) {
        if self.shared.max_bytes.is_none() {
            return;
        }
        if after > before {
            self.shared
                .bytes
                .fetch_add(after - before, Ordering::AcqRel);
        } else {
            give(&self.shared.bytes, self.shared.max_bytes, before - after);
        }
    }
}

/// Takes `n` of `held` if that stays within `max` (none to take without a bound): in one step,
/// since an add undone on refusal would count a refused claim for a moment, and another claim
/// could then be refused while there is room.
fn take(held: &AtomicUsize, max: Option<usize>, n: usize) -> Result<(), StoreError> {
    let Some(max) = max else {
        return Ok(());
    };
    held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
        now.checked_add(n).filter(|after| *after <= max)
    })
    .map(drop)
    .map_err(|_| StoreError::new(StoreErrorKind::CapacityExceeded))
}

/// Gives back `n` of `held`, when it is counted (a bound is set).
fn give(held: &AtomicUsize, max: Option<usize>, n: usize) {
    if max.is_some() && n > 0 {
        held.fetch_sub(n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::LabelContract;
    use crate::store::Store;
    use crate::store::memory::shard::{RECORD_BYTES, lock};
    use crate::store::{Claim, Operator, StoredResponse};

    /// Claims, completes of every size (in a claim's room, past it, past the room's
    /// kilobyte, and a few bytes, smaller than its tombstone), releases, forgets, take-overs
    /// of expired keys and expiries racing on four threads, with tombstones and without (and
    /// claims that write over a tombstone, and purges beside): the bytes counted are those the
    /// records take, exactly, at the end; and a claim past the bound is refused, room given
    /// back lets it in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_bytes_counted_are_the_records_bytes_under_racing_calls() {
        use crate::store::{Lease, Purge as _, Reservation};
        for tombstones in [
            std::time::Duration::from_millis(3),
            std::time::Duration::ZERO,
        ] {
            let store = MemoryStore::builder()
                .retention(std::time::Duration::from_millis(2))
                .tombstones(tombstones)
                .max_bytes(usize::MAX / 2)
                .build();
            let tasks: Vec<_> = (0..4)
                .map(|task| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        for i in 0..2_000usize {
                            // A small key space: keys come back, expired or pending.
                            let key = format!("k{}", (i * 7 + task) % 300);
                            let fingerprint = LabelContract::fingerprint(&key, "p");
                            // Every other claim writes over a tombstone.
                            let lease = match i % 2 {
                                0 => Lease::default().forget_expired(),
                                _ => Lease::default(),
                            };
                            let claimed = store
                                .claim_with(&key, &fingerprint, Reservation::generate(), lease)
                                .await;
                            let Ok(Claim::New(reservation)) = claimed else {
                                if i % 97 == 0 {
                                    drop(store.purge_expired().await);
                                }
                                continue;
                            };
                            match i % 5 {
                                0 => drop(store.release(&key, &reservation).await),
                                1 => drop(store.forget(&key).await),
                                size => {
                                    let len = match size {
                                        2 => i % 4,
                                        _ => (size - 1) * 900 + i % 50,
                                    };
                                    let response = StoredResponse::new(
                                        http::StatusCode::CREATED,
                                        http::HeaderMap::new(),
                                        bytes::Bytes::from(vec![b'x'; len]),
                                    );
                                    drop(store.complete(&key, &reservation, &response).await);
                                }
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(
                store.held_bytes(),
                shard_records_bytes(&store),
                "tombstones {tombstones:?}"
            );
            assert_eq!(
                store.shared.records.load(Ordering::Acquire),
                store.len(),
                "tombstones {tombstones:?}"
            );
        }
        let store = MemoryStore::builder()
            .retention(std::time::Duration::from_millis(2))
            .max_bytes(usize::MAX / 2)
            .build();
        let fingerprint = LabelContract::fingerprint("k", "p");
        let Ok(Claim::New(reservation)) = store.claim("k", &fingerprint).await else {
            panic!("new")
        };
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            "x".into(),
        );
        store.complete("k", &reservation, &response).await.unwrap();
        assert!(store.held_bytes() > 0);
        assert_eq!(store.held_bytes(), shard_records_bytes(&store));

        // A bound just over one record: the next new key is refused until room is given back.
        let store = MemoryStore::builder().max_bytes(RECORD + 200).build();
        assert_eq!(store.held_bytes(), 0);
        let fingerprint = LabelContract::fingerprint("a", "p");
        let Ok(Claim::New(first)) = store.claim("a", &fingerprint).await else {
            panic!("room for one")
        };
        let held = store.held_bytes();
        assert_eq!(held, shard_records_bytes(&store));
        let refused = store.claim("b", &fingerprint).await.unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::CapacityExceeded);
        assert_eq!(store.held_bytes(), held, "a refused claim takes nothing");
        store.release("a", &first).await.unwrap();
        assert_eq!(store.held_bytes(), 0);
        assert!(matches!(
            store.claim("b", &fingerprint).await,
            Ok(Claim::New(_))
        ));
    }

    /// A store full of tombstones drops one for each new key, the oldest of the key's shard
    /// or else of another shard, and no more: the other tombstones still answer expired.
    #[tokio::test]
    async fn a_full_store_drops_one_tombstone_a_new_key() {
        let retention = std::time::Duration::from_millis(20);
        let store = MemoryStore::builder()
            .retention(retention)
            .tombstones(std::time::Duration::from_secs(600))
            .max_records(3)
            .build();
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            "x".into(),
        );
        let keys = ["a", "b", "c"];
        for key in keys {
            let fingerprint = LabelContract::fingerprint(key, "p");
            let Ok(Claim::New(reservation)) = store.claim(key, &fingerprint).await else {
                panic!("room for three")
            };
            store.complete(key, &reservation, &response).await.unwrap();
        }
        std::thread::sleep(retention * 2);
        for (i, new) in ["d", "e"].into_iter().enumerate() {
            let fingerprint = LabelContract::fingerprint(new, "p");
            let claimed = store.claim(new, &fingerprint).await;
            assert!(matches!(claimed, Ok(Claim::New(_))), "{new}: {claimed:?}");
            assert_eq!(store.len(), 3, "one tombstone dropped for {new}");
            // Kept: a tombstone, or a completed record past its window no sweep reached yet
            // (which shards the keys fall in varies by store): each answers expired.
            let expired = keys
                .iter()
                .filter(|key| {
                    let (probe, shard) = store.locked(key);
                    shard.get(probe).is_some()
                })
                .count();
            assert_eq!(expired, 2 - i, "the others kept after {new}");
            assert_eq!(store.held_bytes(), shard_records_bytes(&store));
        }
        // Pending keys hold the rest: nothing left to drop, a new key is refused.
        let fingerprint = LabelContract::fingerprint("f", "p");
        store.claim("f", &fingerprint).await.unwrap();
        let refused = store.claim("g", &fingerprint).await.unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::CapacityExceeded);
    }

    /// A full store drops the expired records of every shard before it refuses, and gives
    /// back their bytes too; the bounds read back as set.
    #[tokio::test]
    async fn a_full_store_sweeping_every_shard_gives_back_their_bytes() {
        assert_eq!(
            MemoryStore::new().byte_bound(),
            Some(crate::store::DEFAULT_MAX_BYTES)
        );
        assert_eq!(
            MemoryStore::builder().max_bytes(7).build().byte_bound(),
            Some(7)
        );
        assert_eq!(
            MemoryStore::builder().unbounded().build().byte_bound(),
            None
        );
        // Without bounds nothing is counted, nor given back.
        let unbounded = MemoryStore::builder().unbounded().build();
        let fingerprint = LabelContract::fingerprint("free", "p");
        let Ok(Claim::New(reservation)) = unbounded.claim("free", &fingerprint).await else {
            panic!("a new key")
        };
        unbounded.release("free", &reservation).await.unwrap();
        assert_eq!(unbounded.held_bytes(), 0);
        assert_eq!(unbounded.shared.records.load(Ordering::Acquire), 0);
        let response = StoredResponse::new(
            http::StatusCode::CREATED,
            http::HeaderMap::new(),
            bytes::Bytes::from_static(b"done"),
        );
        // Several rounds: the ninth key's own shard may hold one of the eight, whose sweep
        // would make room without the sweep of every shard.
        for _ in 0..6 {
            let store = MemoryStore::builder()
                .retention(std::time::Duration::from_millis(1))
                .max_records(8)
                .max_bytes(1 << 20)
                .build();
            for i in 0..8 {
                let key = format!("swept-{i}");
                let fingerprint = LabelContract::fingerprint(&key, "p");
                let Ok(Claim::New(reservation)) = store.claim(&key, &fingerprint).await else {
                    panic!("room for eight")
                };
                store.complete(&key, &reservation, &response).await.unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let fingerprint = LabelContract::fingerprint("ninth", "p");
            let ninth = store.claim("ninth", &fingerprint).await;
            assert!(matches!(ninth, Ok(Claim::New(_))), "{ninth:?}");
            assert_eq!(store.held_bytes(), shard_records_bytes(&store));
        }
    }

    /// A pending record's place, as the bound counts it.
    const RECORD: usize = RECORD_BYTES;

    /// The bytes of every record the store holds, counted anew.
    fn shard_records_bytes(store: &MemoryStore) -> usize {
        store
            .shared
            .shards
            .iter()
            .map(|shard| lock(shard).records.iter().map(|r| r.bytes()).sum::<usize>())
            .sum()
    }

    /// Claims and releases racing at the bound never count more records than the bound, not
    /// even for a moment: a count past it would refuse a claim while a place is free.
    #[test]
    fn the_count_never_passes_the_bound_under_racing_claims() {
        let store = MemoryStore::builder().max_records(4).build();
        for _ in 0..4 {
            store.take_room(0).unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racers: Vec<_> = (0..3)
            .map(|_| {
                let (store, stop) = (store.clone(), std::sync::Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if store.take_room(0).is_ok() {
                            store.give_room(1, 0);
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
