//! A hash table frozen into bytes: how SiLo blocks and Extreme Binning
//! bins are stored. Loading one is reading it — no parsing and no table to
//! build per key — and lookups probe the bytes in place. Keys are uniformly
//! random, so the slot of a key is simply its first bytes scaled to the
//! table (multiply-shift); open addressing with linear probing, two thirds
//! full.
//!
//! Layout (little endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format version (1) |
//! | 1 | 8 | id (block or bin) |
//! | 9 | 4 | r: number of representatives |
//! | 13 | 16·r | representatives (u128) |
//! | … | 4 | n: entries |
//! | … | 4 | c: slots (⌈3n/2⌉, at least 8) |
//! | … | c/8 | occupancy bitmap |
//! | … | c·(K+L) | slots: key bytes then location bytes |
//!
//! The repository seals these bytes like every other object (checksum or
//! AEAD), so damage is caught before a table is used.

use crate::key::{ChunkKey, IndexError, Location, Result};
use std::marker::PhantomData;

const VERSION: u8 = 1;

/// A stored table, used in place.
pub struct Frozen<K, L> {
    bytes: Vec<u8>,
    id: u64,
    reps_at: usize,
    nreps: usize,
    n: usize,
    cap: usize,
    bitmap_at: usize,
    slots_at: usize,
    _p: PhantomData<(K, L)>,
}

fn slot_of<K: ChunkKey>(k: &K, cap: usize) -> usize {
    ((k.prefix() as u64 as u128 * cap as u128) >> 64) as usize
}

impl<K: ChunkKey, L: Location> Frozen<K, L> {
    const SLOT: usize = K::LEN + L::LEN;

    /// Freezes `n` distinct entries.
    pub fn build(
        id: u64,
        reps: &[u128],
        n: usize,
        entries: impl Iterator<Item = (K, L)>,
    ) -> Vec<u8> {
        let cap = (n + n.div_ceil(2)).max(8);
        let head = 1 + 8 + 4 + 16 * reps.len() + 8;
        let bitmap_at = head;
        let slots_at = bitmap_at + cap.div_ceil(8);
        let mut out = vec![0u8; slots_at + cap * Self::SLOT];
        out[0] = VERSION;
        out[1..9].copy_from_slice(&id.to_le_bytes());
        out[9..13].copy_from_slice(&(reps.len() as u32).to_le_bytes());
        let mut at = 13;
        for r in reps {
            out[at..at + 16].copy_from_slice(&r.to_le_bytes());
            at += 16;
        }
        out[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
        out[at + 4..at + 8].copy_from_slice(&(cap as u32).to_le_bytes());
        let mut slot = Vec::with_capacity(Self::SLOT);
        let mut placed = 0;
        for (k, l) in entries {
            let mut i = slot_of(&k, cap);
            while out[bitmap_at + i / 8] & (1 << (i % 8)) != 0 {
                i = if i + 1 == cap { 0 } else { i + 1 };
            }
            out[bitmap_at + i / 8] |= 1 << (i % 8);
            slot.clear();
            k.put(&mut slot);
            l.put(&mut slot);
            let s = slots_at + i * Self::SLOT;
            out[s..s + Self::SLOT].copy_from_slice(&slot);
            placed += 1;
        }
        debug_assert_eq!(placed, n);
        out
    }

    /// Checks the header and sizes of stored bytes.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        let bad = |msg: &str| IndexError::Decode {
            name: name.to_string(),
            msg: msg.to_string(),
        };
        let u32_at = |at: usize| -> Result<usize> {
            Ok(u32::from_le_bytes(
                bytes
                    .get(at..at + 4)
                    .ok_or_else(|| bad("truncated"))?
                    .try_into()
                    .map_err(|_| bad("truncated"))?,
            ) as usize)
        };
        if bytes.first() != Some(&VERSION) {
            return Err(bad("unknown table version"));
        }
        let id = u64::from_le_bytes(
            bytes
                .get(1..9)
                .ok_or_else(|| bad("truncated"))?
                .try_into()
                .map_err(|_| bad("truncated"))?,
        );
        let nreps = u32_at(9)?;
        let reps_at = 13;
        let at = reps_at + 16 * nreps;
        let n = u32_at(at)?;
        let cap = u32_at(at + 4)?;
        if cap < 8 || cap < n + n.div_ceil(2) {
            return Err(bad("bad table size"));
        }
        let bitmap_at = at + 8;
        let slots_at = bitmap_at + cap.div_ceil(8);
        if bytes.len() != slots_at + cap * Self::SLOT {
            return Err(bad("length does not match the table size"));
        }
        // Exactly `n` occupied slots (so, with `cap` ≥ 1.5 n, free ones
        // that end every probe): a crafted bitmap with every slot taken
        // would make lookups of absent keys go round forever.
        let taken = (0..cap)
            .filter(|i| bytes[bitmap_at + i / 8] & (1 << (i % 8)) != 0)
            .count();
        if taken != n {
            return Err(bad("occupied slots do not match the entry count"));
        }
        Ok(Frozen {
            bytes,
            id,
            reps_at,
            nreps,
            n,
            cap,
            bitmap_at,
            slots_at,
            _p: PhantomData,
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn reps(&self) -> impl Iterator<Item = u128> + '_ {
        (0..self.nreps).map(move |i| {
            let at = self.reps_at + 16 * i;
            u128::from_le_bytes(self.bytes[at..at + 16].try_into().unwrap_or_default())
        })
    }

    fn occupied(&self, i: usize) -> bool {
        self.bytes[self.bitmap_at + i / 8] & (1 << (i % 8)) != 0
    }

    pub fn get(&self, k: &K) -> Option<L> {
        let kb = k.bytes();
        let mut i = slot_of(k, self.cap);
        while self.occupied(i) {
            let s = self.slots_at + i * Self::SLOT;
            if &self.bytes[s..s + K::LEN] == kb {
                return Some(L::read(&self.bytes[s + K::LEN..s + Self::SLOT]));
            }
            i = if i + 1 == self.cap { 0 } else { i + 1 };
        }
        None
    }

    /// Every entry (for rewriting a bin).
    pub fn entries(&self) -> impl Iterator<Item = (K, L)> + '_ {
        (0..self.cap).filter(|i| self.occupied(*i)).map(move |i| {
            let s = self.slots_at + i * Self::SLOT;
            (
                K::read(&self.bytes[s..s + K::LEN]),
                L::read(&self.bytes[s + K::LEN..s + Self::SLOT]),
            )
        })
    }

    /// RAM held (the bytes themselves).
    pub fn ram_bytes(&self) -> u64 {
        self.bytes.capacity() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PosLoc;
    use strata_core::Fingerprint;

    #[test]
    fn frozen_tables_find_every_key_and_nothing_else() {
        let keys: Vec<Fingerprint> = (0..1000u64)
            .map(|i| Fingerprint(*blake3::hash(&i.to_le_bytes()).as_bytes()))
            .collect();
        let loc = |i: usize| PosLoc {
            container: [i as u8; 16],
            region: i as u32,
            offset: 2 * i as u32,
            len: 3 * i as u32,
        };
        let bytes = Frozen::<Fingerprint, PosLoc>::build(
            7,
            &[1, 2],
            keys.len(),
            keys.iter().enumerate().map(|(i, k)| (*k, loc(i))),
        );
        let f = Frozen::<Fingerprint, PosLoc>::from_bytes("t", bytes.clone()).unwrap();
        assert_eq!(f.id(), 7);
        assert_eq!(f.len(), 1000);
        assert_eq!(f.reps().collect::<Vec<_>>(), vec![1, 2]);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(f.get(k), Some(loc(i)));
        }
        assert_eq!(f.get(&Fingerprint([9; 32])), None);
        assert_eq!(f.entries().count(), 1000);
        // Damage is refused, not misread.
        assert!(
            Frozen::<Fingerprint, PosLoc>::from_bytes("t", bytes[..bytes.len() - 1].to_vec())
                .is_err()
        );
        let mut b = bytes.clone();
        b[0] = 9;
        assert!(Frozen::<Fingerprint, PosLoc>::from_bytes("t", b).is_err());
        // Every slot marked taken: refused (a lookup would never end).
        let (n, cap) = (f.n, f.cap);
        let mut full = bytes;
        for byte in &mut full[f.bitmap_at..f.bitmap_at + cap.div_ceil(8)] {
            *byte = 0xff;
        }
        assert!(n < cap);
        assert!(Frozen::<Fingerprint, PosLoc>::from_bytes("t", full).is_err());
        let empty = Frozen::<[u8; 16], ()>::build(1, &[], 0, std::iter::empty());
        let e = Frozen::<[u8; 16], ()>::from_bytes("e", empty).unwrap();
        assert!(e.is_empty() && e.get(&[1; 16]).is_none());
    }
}
