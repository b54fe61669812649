//! What every strategy shares: its errors, the chunk keys and the
//! locations it maps them to, the hash maps it keeps them in, and how
//! their RAM is counted.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::hash::Hash;
use strata_core::Fingerprint;

/// Errors of the index strategies (their block store's, or a block that
/// does not decode).
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("index object {name}: {msg}")]
    Store { name: String, msg: String },
    #[error("index object {name} does not decode: {msg}")]
    Decode { name: String, msg: String },
}

pub type Result<T, E = IndexError> = std::result::Result<T, E>;

/// A chunk key: the full fingerprint in repositories, a 16-byte prefix in
/// trace mode (where fingerprints are uniformly random and a billion-chunk
/// trace must fit the disk).
pub trait ChunkKey:
    Copy + Eq + Hash + Ord + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
    /// Bytes of the key's fixed encoding in stored blocks and bins.
    const LEN: usize;
    /// 128 uniformly distributed bits of the key, for the similarity
    /// table. Two keys with the same prefix at worst make a lookup load an
    /// unrelated block; chunk matches always compare whole keys.
    fn prefix(&self) -> u128;
    /// The key's fixed encoding ([`ChunkKey::LEN`] bytes).
    fn bytes(&self) -> &[u8];
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.bytes());
    }
    /// Reads a key from exactly [`ChunkKey::LEN`] bytes.
    fn read(b: &[u8]) -> Self;
}

impl ChunkKey for Fingerprint {
    const LEN: usize = 32;
    fn prefix(&self) -> u128 {
        let mut b = [0u8; 16];
        b.copy_from_slice(&self.0[..16]);
        u128::from_le_bytes(b)
    }
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn read(b: &[u8]) -> Self {
        let mut f = [0u8; 32];
        f.copy_from_slice(&b[..32]);
        Fingerprint(f)
    }
}

impl ChunkKey for [u8; 16] {
    const LEN: usize = 16;
    fn prefix(&self) -> u128 {
        u128::from_le_bytes(*self)
    }
    fn bytes(&self) -> &[u8] {
        self
    }
    fn read(b: &[u8]) -> Self {
        let mut f = [0u8; 16];
        f.copy_from_slice(&b[..16]);
        f
    }
}

/// Hashes keys that are already uniformly random (cryptographic
/// fingerprints and their prefixes) by taking their first eight bytes
/// instead of running SipHash over them: the strategies do several table
/// operations per chunk, and hashing was a third of their time. Keys are
/// keyed BLAKE3 in encrypted repositories; forging many keys that share a
/// table's index bits costs a brute-force search per key and at worst
/// slows lookups.
#[derive(Clone, Copy, Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut x = [0u8; 8];
        let n = bytes.len().min(8);
        x[..n].copy_from_slice(&bytes[..n]);
        self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(x);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `BuildHasher` for [`KeyHasher`].
pub type KeyHash = std::hash::BuildHasherDefault<KeyHasher>;
/// A hash map keyed by chunk keys.
pub type KeyMap<K, V> = std::collections::HashMap<K, V, KeyHash>;

/// A chunk location the index keeps for each key, with a fixed-size
/// encoding (stored tables are used in place, without parsing).
pub trait Location: Copy + Send + Sync + std::fmt::Debug + 'static {
    const LEN: usize;
    fn put(&self, out: &mut Vec<u8>);
    /// Reads a location from exactly [`Location::LEN`] bytes.
    fn read(b: &[u8]) -> Self;
}

/// No location: trace mode only counts duplicates.
impl Location for () {
    const LEN: usize = 0;
    fn put(&self, _: &mut Vec<u8>) {}
    fn read(_: &[u8]) -> Self {}
}

impl Location for u64 {
    const LEN: usize = 8;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read(b: &[u8]) -> Self {
        u64::from_le_bytes(b[..8].try_into().unwrap_or_default())
    }
}

/// Where a chunk is stored in a repository: container id, region, offset
/// in the region's plaintext, length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PosLoc {
    pub container: [u8; 16],
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

impl Location for PosLoc {
    const LEN: usize = 28;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.container);
        out.extend_from_slice(&self.region.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }
    fn read(b: &[u8]) -> Self {
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let mut container = [0u8; 16];
        container.copy_from_slice(&b[..16]);
        PosLoc {
            container,
            region: u(16),
            offset: u(20),
            len: u(24),
        }
    }
}

/// RAM of a hash table with this capacity and entry size (key + value +
/// one control byte per slot, as hashbrown lays them out).
pub fn table_bytes(capacity: usize, entry: usize) -> u64 {
    capacity as u64 * (entry as u64 + 1)
}
