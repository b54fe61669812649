//! Deduplicated block volumes served over NBD (docs/design.md "Volume",
//! iDedup §3–§5).
//!
//! * [`nbd`] — the NBD server (fixed newstyle, structured replies).
//! * [`tls`] — TLS for NBD connections (`NBD_OPT_STARTTLS`).
//! * [`volume`] — the volume: journal-backed write buffer, block map,
//!   reference counts, free space; [`destage`] runs iDedup on each batch.
//! * [`idedup`] — the dedup-metadata cache and the sequence algorithm.
//! * [`journal`] — the write-ahead journal's records.
//! * [`changes`] — the segments written since the last snapshot.
//! * [`holds`] — disk blocks kept for the repository (linked snapshots).
//! * [`check`] — a stopped volume's files checked against one another
//!   (and its data against its fingerprints).
//! * [`import`] — a raw image (or another volume's) copied into a new
//!   volume through its write path; [`defrag`] — a stopped volume
//!   written again in its own block order.
//! * [`crypt`] — encryption of a volume in an encrypted repository.
//! * `blockmap` — the block map, its new entries held until their data
//!   is synced.
//! * `resize` — a stopped volume made larger or smaller.
//! * `readahead` — reading ahead in the volume's block order.
//! * [`stats`], [`report`] — latency, fragmentation and dedup figures.

mod blockmap;
pub mod changes;
pub mod check;
pub mod config;
mod conn;
pub mod control;
pub mod crypt;
pub mod defrag;
pub mod destage;
pub mod error;
pub mod files;
pub mod holds;
pub mod idedup;
pub mod import;
pub mod journal;
mod mutex;
pub mod nbd;
mod readahead;
pub mod report;
mod resize;
pub mod state;
pub mod stats;
pub mod tls;
pub mod volume;

pub use changes::ChangeSet;
pub use config::{Threshold, VolumeConfig};
pub use crypt::{Encryption, VolumeKey};
pub use error::VolumeError;
pub use state::Volume;
pub use volume::{Frozen, FrozenMap, ImageReader, ImageSource};

impl nbd::BlockDevice for Volume {
    fn size(&self) -> u64 {
        Volume::size(self)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<Vec<(u64, u64)>> {
        self.read_at(offset, buf)
    }
    fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> std::io::Result<()> {
        self.write_owned(offset, data, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        Volume::flush(self)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> std::io::Result<()> {
        self.zero_range(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> std::io::Result<()> {
        self.zero_range(offset, len, fua)
    }
    fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, bool)>> {
        Volume::extents(self, offset, len)
    }
}
