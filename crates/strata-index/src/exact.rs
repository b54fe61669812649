//! The exact baseline over fingerprint streams (docs/design.md "Index
//! strategies": `exact`; SiLo §4 compares with ChunkStash, an exact
//! index): every chunk key → location in one RAM hash map. Finds every
//! duplicate; its RAM grows with the number of unique chunks.

use crate::key::{table_bytes, ChunkKey, KeyMap, Location};

/// Every chunk key in RAM.
pub struct ExactMap<K, L> {
    map: KeyMap<K, L>,
}

impl<K: ChunkKey, L: Location> Default for ExactMap<K, L> {
    fn default() -> Self {
        ExactMap {
            map: KeyMap::default(),
        }
    }
}

impl<K: ChunkKey, L: Location> ExactMap<K, L> {
    pub fn lookup(&self, k: &K) -> Option<L> {
        self.map.get(k).copied()
    }

    /// Inserts a new chunk; returns the location already known, if any.
    pub fn claim(&mut self, k: K, l: L) -> Option<L> {
        match self.map.entry(k) {
            std::collections::hash_map::Entry::Occupied(o) => Some(*o.get()),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(l);
                None
            }
        }
    }

    pub fn entries(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn ram_bytes(&self) -> u64 {
        table_bytes(
            self.map.capacity(),
            std::mem::size_of::<K>() + std::mem::size_of::<L>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_everything_once() {
        let mut m: ExactMap<[u8; 16], u64> = ExactMap::default();
        assert_eq!(m.claim([1; 16], 5), None);
        assert_eq!(m.claim([1; 16], 6), Some(5));
        assert_eq!(m.lookup(&[1; 16]), Some(5));
        assert_eq!(m.lookup(&[2; 16]), None);
        assert_eq!(m.entries(), 1);
        assert!(m.ram_bytes() >= 17);
    }
}
