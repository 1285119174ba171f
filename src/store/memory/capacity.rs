//! Room reserved up front: a memory store sized for what it holds at its fullest.

use std::sync::atomic::Ordering;

use super::MemoryStore;
use super::shard::{lock, shard_room};

impl MemoryStore {
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
    /// the records come or not: a table's slot is 121 bytes, and a table of twice the room
    /// rounds its slots up to a power of two (240 to 480 bytes a record of room, about what
    /// a store not sized reaches under churn; a small store's room is mostly its margin, and
    /// `reserve(1)` takes about 500 KB); a queue's entry is 16 bytes more. The first
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
    /// let store = MemoryStore::with_retention(Duration::from_secs(60 * 60)).reserve(90_000);
    /// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
    /// # drop(layer);
    /// ```
    pub fn reserve(self, records: usize) -> Self {
        let room = shard_room(records);
        let refused = |error: String| -> ! { panic!("MemoryStore::reserve({records}): {error}") };
        self.shared.sized_for.fetch_max(records, Ordering::Relaxed);
        for shard in self.shared.shards.iter() {
            let mut shard = lock(shard);
            // Twice the room: a table at most half full keeps the slot of a record removed
            // (expired, forgotten, released) empty rather than marked deleted, almost always;
            // one fuller fills with deleted marks under churn and then grows to twice its
            // size anyway, under the shard's lock.
            let table = room.saturating_mul(2);
            shard
                .records
                .try_reserve(table, |record| record.hash)
                .unwrap_or_else(|error| refused(format!("{error:?}")));
            if self.shared.retention.is_some() {
                shard
                    .expiry
                    .try_reserve(room)
                    .unwrap_or_else(|error| refused(error.to_string()));
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::store::{Claim, Operator, Store, StoreErrorKind, StoredResponse};

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
        let store = MemoryStore::with_retention(Duration::from_secs(3600)).reserve(records);
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
        let store = MemoryStore::new().keep_forever().reserve(records);
        let (tables, queues) = room(&store);
        assert!(tables >= records);
        assert_eq!(queues, 0);
        // A bound set after the room keeps it, and the bound; the store is made new.
        let used = MemoryStore::with_retention(Duration::from_secs(3600)).reserve(records);
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
        let shared = MemoryStore::with_retention(Duration::from_secs(3600)).reserve(records);
        shared.claim("k", &fingerprint).await.unwrap();
        let bounded = shared.clone().max_records(1);
        assert_eq!(room(&bounded), sized);
        assert!(bounded.is_empty() && shared.is_pending("k"));
        assert_eq!(bounded.shared.max_records, Some(1));
        assert_eq!(
            shared.shared.max_records,
            Some(crate::store::DEFAULT_MAX_RECORDS)
        );
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
        let store = MemoryStore::new().reserve(records);
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
        let refused = std::panic::catch_unwind(|| MemoryStore::new().reserve(usize::MAX))
            .expect_err("no table holds that many");
        let message = refused.downcast_ref::<String>().expect("a message");
        let named = format!("MemoryStore::reserve({}): ", usize::MAX);
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
}
