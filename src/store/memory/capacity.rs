//! Room reserved up front: a memory store sized for what it holds at its fullest.

use super::MemoryStore;
use super::shard::{lock, shard_room};

impl MemoryStore {
    /// Reserves room for `records` records up front (see
    /// [`MemoryStoreBuilder::reserve`](super::MemoryStoreBuilder::reserve)).
    pub(super) fn reserve_room(&self, records: usize) {
        let room = shard_room(records);
        let refused = |error: String| -> ! { panic!("MemoryStore::reserve({records}): {error}") };
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
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::store::{Claim, Operator, Store, StoredResponse};

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
        let store = MemoryStore::builder()
            .retention(Duration::from_secs(3600))
            .reserve(records)
            .build();
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
            let fingerprint = crate::operation::LabelContract::fingerprint(&key, "p");
            let Claim::New(reservation) = store.claim(&key, &fingerprint).await.unwrap() else {
                panic!("a new key");
            };
            store.complete(&key, &reservation, &response).await.unwrap();
        }
        assert_eq!(store.len(), records);
        assert_eq!(room(&store), sized, "no table or queue grew");
        // Without a retention window there is no queue to size.
        let store = MemoryStore::builder()
            .keep_forever()
            .reserve(records)
            .build();
        let (tables, queues) = room(&store);
        assert!(tables >= records);
        assert_eq!(queues, 0);
        // The room with a bound, in either order, keeps both.
        for store in [
            MemoryStore::builder().max_records(records).reserve(records),
            MemoryStore::builder().reserve(records).max_records(records),
        ] {
            let store = store.retention(Duration::from_secs(3600)).build();
            assert_eq!(room(&store), sized);
            assert_eq!(store.shared.max_records, Some(records));
            assert_eq!(store.shared.retention, Some(Duration::from_secs(3600)));
        }
        // A store not sized takes no room up front.
        assert!(room(&MemoryStore::new()).0 < records);
    }

    /// A store sized for its records holds them under churn too: records dropped and new
    /// keys claimed in their place, ten times over what the store holds, neither grow a table
    /// nor make one be rehashed. A table's capacity is its records and its free slots; a slot
    /// marked deleted is neither, so a claim into one adds 1 to it, a removal that marks one
    /// takes 1 from it, and only a table grown or rehashed, its marks cleared, gains more.
    #[tokio::test]
    async fn a_store_sized_for_its_records_never_grows_under_churn() {
        let records = 20_000;
        let store = MemoryStore::builder().reserve(records).build();
        let tables = |store: &MemoryStore| {
            let shards = store.shared.shards.iter();
            shards
                .map(|shard| lock(shard).records.capacity())
                .collect::<Vec<_>>()
        };
        let sized = tables(&store);
        let capacity = |key: &str| lock(store.shard(key)).records.capacity();
        let fingerprint = crate::operation::LabelContract::fingerprint("k", "p");
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
        let refused =
            std::panic::catch_unwind(|| MemoryStore::builder().reserve(usize::MAX).build())
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
