//! Index strategies as a repository's backups use them: each answers a
//! segment's chunks with stored locations and claims the new ones, so two
//! workers never store the same chunk. `exact` ([`ExactIndex`]: every
//! chunk fingerprint in RAM, the conventional baseline) and `segment`
//! ([`SegmentIndex`]: RevDedup's index of whole segments, the default)
//! live here; the repository's `silo` and `binning` strategies are
//! `strata-store`'s adapters of [`crate::silo`] and [`crate::binning`].
//!
//! A strategy's side work (`segment_done`, `finish`) fails with the
//! caller's error type `E` (the store's, where it persists tables in the
//! repository).

mod exact;
mod interface;
mod segment;
mod table;

pub use exact::ExactIndex;
pub use interface::{IndexStrategy, Learns};
pub use segment::{ChunkLists, SegmentIndex};
pub use table::{ChunkLoc, ContainerTable};
