//! Index strategies that work on fingerprint streams alone (docs/design.md
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
pub mod frozen;
pub mod key;
pub mod silo;
pub mod store;
pub mod strategy;

pub use key::{
    table_bytes, ChunkKey, IndexError, KeyHash, KeyHasher, KeyMap, Location, PosLoc, Result,
};
pub use store::{AsyncStore, BlockStore, DirStore, MemStore, StoreStats};
