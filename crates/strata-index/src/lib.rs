//! Index strategies that work on fingerprint streams alone (DESIGN.md
//! "Index strategies"): SiLo's similarity + locality index ([`silo`], SiLo
//! §3), the Extreme Binning baseline it is compared with ([`binning`]), and
//! a plain exact map ([`exact`]). They know nothing about containers: each
//! chunk carries an opaque location `L` (a container position in a
//! repository, `()` in trace mode), and their on-disk parts (SiLo blocks,
//! bins) go through a [`BlockStore`]. The repository (`strata-store`) and
//! the benchmark harness's trace mode drive the very same code.
//!
//! Every structure reports the bytes its in-RAM parts hold
//! (`ram_bytes`), counted as allocated capacity times entry size, so that
//! strategies can be compared at terabyte scale.

pub mod binning;
pub mod exact;
pub mod silo;
pub mod store;

pub use store::{BlockStore, DirStore, MemStore, StoreStats};

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
    /// 128 uniformly distributed bits of the key, for the similarity
    /// table. Two keys with the same prefix at worst make a lookup load an
    /// unrelated block; chunk matches always compare whole keys.
    fn prefix(&self) -> u128;
}

impl ChunkKey for Fingerprint {
    fn prefix(&self) -> u128 {
        let mut b = [0u8; 16];
        b.copy_from_slice(&self.0[..16]);
        u128::from_le_bytes(b)
    }
}

impl ChunkKey for [u8; 16] {
    fn prefix(&self) -> u128 {
        u128::from_le_bytes(*self)
    }
}

/// A chunk location the index keeps for each key.
pub trait Location:
    Copy + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static
{
}
impl<T: Copy + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static> Location
    for T
{
}

/// RAM of a hash table with this capacity and entry size (key + value +
/// one control byte per slot, as hashbrown lays them out).
pub fn table_bytes(capacity: usize, entry: usize) -> u64 {
    capacity as u64 * (entry as u64 + 1)
}
