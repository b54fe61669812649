//! A deduplicated block volume: iDedup's write path (§3.3) on files.
//!
//! Files in the volume's directory: `volume.json` (size, block size,
//! threshold, cache size), `journal.N` (acknowledged writes not yet on
//! disk), `data` (disk blocks, DBN × block size), `map` (logical block →
//! DBN + 1, 0 = zeros; u64 each), `refs` (u32 reference count per DBN),
//! `fps` (16-byte fingerprint per DBN, to warm the cache on open),
//! `state.json` (clean shutdown flag, counters) and `live.json` (the
//! running server's latency, cache and fragmentation figures).
//!
//! Writes are appended to the journal and kept in a buffer that reads see
//! at once; a background thread destages the buffer extent by extent,
//! in the order the extents were first written: fingerprints, dup-lists from the metadata
//! cache, `find_sequences` at the threshold, references for the runs
//! kept and new disk blocks for the rest — written, not synced. A
//! checkpoint (every 512 MiB of journal or 5 s, and on sync and close)
//! syncs data, fingerprints, map and reference counts, then deletes the
//! journal files of the batches it covers: until then a crash replays
//! them over the map, rewriting every block they touched. After an unclean
//! stop the reference counts are recounted from the map. Blocks freed by
//! a batch (overwrites, TRIM) are reused only after the next checkpoint,
//! so no map entry on disk can point at reused data.
//!
//! The volume's types are in `config`, `error`, `files` and `state`; its
//! methods here, by concern: [`open`], [`read`], [`write`], [`background`]
//! (destage, checkpoints, close), [`image`] (what snapshots read).

pub mod background;
pub mod image;
pub mod open;
pub mod read;
pub mod write;

#[cfg(test)]
mod tests;

pub use crate::config::{Threshold, VolumeConfig, BLOCK, EXTENTS_MAX, MAX_SIZE};
pub use crate::error::VolumeError;
pub use crate::files::next_data;
pub use crate::state::{LiveStats, RecentReads, Volume, RECENT_READS};
pub use image::{Frozen, FrozenMap, ImageReader, ImageSource};
