//! A key looked up in the memory store: the key with its keyed hash, computed once per call.

/// A key and its keyed hash, computed once for the whole call: the hash picks the shard and
/// the slot, the key's bytes tell two keys of one hash apart.
#[derive(Clone, Copy)]
pub(super) struct Probe<'a> {
    pub(super) hash: u64,
    pub(super) key: &'a str,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::memory::shard::{Record, Shard, Tick};
    use crate::store::{Lease, Reservation};

    /// Keys compare by their bytes: two keys whose hashes collide are still two keys, each
    /// found, and removed, as itself.
    #[test]
    fn colliding_hashes_are_different_keys() {
        let a = Probe { hash: 7, key: "a" };
        let b = Probe { hash: 7, key: "b" };
        let mut shard = Shard::default();
        let lease = Lease::new(Duration::from_secs(1));
        for (probe, byte) in [(a, 1), (b, 2)] {
            let reservation = Reservation::generate();
            shard.insert(Record::pending(
                probe,
                [byte; 32],
                reservation,
                Tick(0),
                lease,
                0,
            ));
        }
        assert_eq!(shard.get(a).map(|r| r.fingerprint), Some([1; 32]));
        assert_eq!(shard.get(b).map(|r| r.fingerprint), Some([2; 32]));
        assert_eq!(shard.get(a).map(Record::key), Some(&b"a"[..]));
        assert!(
            shard.get(Probe { hash: 8, key: "a" }).is_none(),
            "another hash"
        );
        assert!(
            shard.get(Probe { hash: 7, key: "c" }).is_none(),
            "another key"
        );
        assert!(shard.remove(a));
        assert!(!shard.remove(a));
        assert_eq!(shard.get(b).map(|r| r.fingerprint), Some([2; 32]));
    }

    /// A record is its table slot (with the slot's control byte, the 121 bytes the sizing
    /// docs count) and one allocation: the key, then the response.
    #[test]
    fn a_record_is_a_slot_of_120_bytes_and_a_queue_entry_16() {
        assert_eq!(std::mem::size_of::<Record>(), 120);
        assert_eq!(std::mem::size_of::<(Tick, u64)>(), 16);
    }
}
