//! The keys of the memory store's maps: a key with its keyed hash, computed once per call, and
//! the hasher that hands that hash to the map.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

/// A key and its hash, as a shard's map holds it.
#[derive(Clone)]
pub(super) struct StoredKey {
    pub(super) hash: u64,
    pub(super) key: Arc<str>,
}

/// A key looked up: its hash, computed once for the whole call.
#[derive(Clone, Copy)]
pub(super) struct Probe<'a> {
    pub(super) hash: u64,
    pub(super) key: &'a str,
}

impl<'a> Probe<'a> {
    /// The probe as the shard's map looks it up.
    pub(super) fn lookup(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

/// What a shard's map is looked up by: a stored key or a probe, compared by key, hashed by
/// the hash they carry.
pub(super) trait Lookup {
    fn hash(&self) -> u64;
    fn key(&self) -> &str;
}

impl Lookup for StoredKey {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn key(&self) -> &str {
        &self.key
    }
}

impl Lookup for Probe<'_> {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn key(&self) -> &str {
        self.key
    }
}

impl<'a> Borrow<dyn Lookup + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(Lookup::hash(self));
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        Lookup::hash(self) == Lookup::hash(other) && self.key() == other.key()
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Hash::hash(self as &dyn Lookup, state);
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn Lookup) == (other as &dyn Lookup)
    }
}

impl Eq for StoredKey {}

/// The hasher of a shard's map: the keys carry their hash, so it passes it through.
#[derive(Clone, Copy, Default)]
pub(super) struct Prehashed;

impl BuildHasher for Prehashed {
    type Hasher = PassThrough;

    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

/// Passes through the one `u64` a key writes.
pub(super) struct PassThrough(pub(super) u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Never called: keys write their hash with `write_u64`. Folded in all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::store::MemoryStore;

    /// A key's hash in a shard's map is the hash it carries, computed once: stored keys and
    /// probes hash alike, and a growing table never hashes a key's bytes again.
    #[test]
    fn a_key_hashes_as_the_hash_it_carries() {
        let store = MemoryStore::new();
        let probe = store.probe("POST /labels k-1");
        let stored = StoredKey {
            hash: probe.hash,
            key: Arc::from("POST /labels k-1"),
        };
        assert_eq!(Prehashed.hash_one(probe.lookup()), probe.hash);
        assert_eq!(Prehashed.hash_one(&stored), probe.hash);
        assert_ne!(store.probe("POST /labels k-2").hash, probe.hash);
    }
    /// Anything else hashed with the map's hasher is folded byte by byte, in order.
    #[test]
    fn other_bytes_are_folded_in_order() {
        let hash = |bytes: &[u8]| {
            let mut hasher = Prehashed.build_hasher();
            hasher.write(bytes);
            hasher.finish()
        };
        assert_eq!(hash(b"\x01\x02"), 0x0102);
        assert_ne!(hash(b"ab"), hash(b"ba"));
        // Past eight bytes the first comes round again, and is folded with the ninth.
        assert_eq!(hash(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), 0);
    }
    /// Keys compare by their bytes: two keys whose hashes collide are still two keys.
    #[test]
    fn colliding_hashes_are_different_keys() {
        let a = Probe { hash: 7, key: "a" };
        let b = Probe { hash: 7, key: "b" };
        assert!((&a as &dyn Lookup) != (&b as &dyn Lookup));
        assert!((&a as &dyn Lookup) == (&Probe { hash: 7, key: "a" } as &dyn Lookup));
        let stored = StoredKey {
            hash: 7,
            key: Arc::from("a"),
        };
        let other = StoredKey {
            hash: 7,
            key: Arc::from("b"),
        };
        assert!(stored != other);
        assert!(stored == stored.clone());
        let mut map: HashMap<StoredKey, u8, Prehashed> = HashMap::default();
        map.insert(stored, 1);
        map.insert(other, 2);
        assert_eq!(map.get(&a as &dyn Lookup), Some(&1));
        assert_eq!(map.get(&b as &dyn Lookup), Some(&2));
    }
}
