//! The operator's view of a memory store.

use std::time::Duration;

use super::MemoryStore;
use super::shard::{State, Tick, lock};
use crate::fingerprint::Fingerprint;
use crate::store::{
    Operator, RecordInfo, RecordState, StoreError, StoredResponse, Tombstone, codec,
};

impl Operator for MemoryStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        let (probe, shard) = self.locked(key);
        Ok(shard.get(probe).and_then(|record| {
            let fingerprint = Fingerprint::from_sha256(record.fingerprint);
            let (state, since, status, abandoned) = match &record.state {
                State::Pending { since, until, .. } => {
                    (RecordState::Pending, *since, None, now >= *until)
                }
                State::Completed { at, .. } => {
                    let response = record.response().unwrap_or_default();
                    // Past its replay window, not swept yet, on a store that keeps tombstones:
                    // expired within the tombstone's window, absent after, as to a claim.
                    if let Some(windows) = self.windows()
                        && windows.tombstones.is_some()
                        && now.since(*at) >= windows.retention
                    {
                        if now.since(*at) >= windows.remembered() {
                            return None;
                        }
                        if let Ok(tombstone) = codec::tombstone(&response, self.wall(*at)) {
                            let until = self.wall(*at).checked_add(windows.remembered());
                            let age = Some(now.since(*at));
                            return Some(RecordInfo::expired(fingerprint, age, tombstone, until));
                        }
                    }
                    let status = codec::decode(response).ok().map(|r| r.status());
                    (RecordState::Completed, *at, status, false)
                }
                State::Tombstone { at, .. } => {
                    let windows = self.windows();
                    // Past its window, not swept yet: absent, as to a claim.
                    if windows.is_some_and(|windows| now.since(*at) >= windows.remembered()) {
                        return None;
                    }
                    let tombstone = record.tombstone().unwrap_or_default();
                    let age = (*at != Tick::NEVER).then(|| now.since(*at));
                    if let Ok(tombstone) = Tombstone::from_bytes(&tombstone) {
                        let until = windows
                            .and_then(|windows| self.wall(*at).checked_add(windows.remembered()));
                        return Some(RecordInfo::expired(fingerprint, age, tombstone, until));
                    }
                    (RecordState::Expired, *at, None, false)
                }
            };
            Some(RecordInfo::new(
                state,
                fingerprint,
                (since != Tick::NEVER).then(|| now.since(since)),
                status,
                abandoned,
            ))
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
                    .filter_map(|record| match record.state {
                        State::Pending { since, .. } if now.since(since) >= age => {
                            Some(String::from_utf8_lossy(record.key()).into_owned())
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
        let bytes = shard.get(probe).map_or(0, super::shard::Record::bytes);
        let removed = shard.remove(probe);
        shard.wake(key);
        drop(shard);
        self.give_room(usize::from(removed), bytes);
        Ok(removed)
    }
}
