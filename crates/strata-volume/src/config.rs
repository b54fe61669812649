//! A volume's settings (`volume.json`), its state file (`state.json`),
//! and the constants its write path and checkpoints go by.

use crate::crypt::Encryption;
use crate::error::{Result, VolumeError};
use crate::files::read_json;
use crate::stats::Persistent;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// The volume's block: strata-core's [`strata_core::BLOCK_SIZE`].
pub const BLOCK: usize = strata_core::BLOCK_SIZE;
pub(crate) const FORMAT: u32 = 1;
/// The format of an encrypted volume: builds before encryption refuse it
/// (they would read its blocks as plain and write plain ones among them).
pub const FORMAT_ENCRYPTED: u32 = 2;
/// The buffer is destaged once it holds this much, or after a second.
pub(crate) const DESTAGE_AT: usize = 32 << 20;
/// Writers wait while the buffer holds this much (the batch being
/// destaged is not counted).
pub(crate) const BUFFER_MAX: usize = 256 << 20;
/// How often a batch that waits for disk space looks again.
pub(crate) const SPACE_RETRY: Duration = Duration::from_millis(500);
/// Room kept free beyond what a batch may need (journals, state files).
pub(crate) const SPACE_MARGIN: u64 = 1 << 20;
/// Destaged batches become durable together at a checkpoint, after this
/// many bytes of their journals or this long.
pub(crate) const CHECKPOINT_BYTES: u64 = 512 << 20;
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
/// ... or this many map entries wait for one (about 40 bytes each;
/// placed writes put their data in no journal). At twice as many, destage
/// waits for one.
pub(crate) const CHECKPOINT_ENTRIES: usize = 1 << 19;
/// ... or once this many blocks wait for one to be written in place
/// (`Mem::recent`: 1 GiB of first writes without dedup, whose journal
/// records are small).
pub(crate) const RECENT_MAX: usize = 1 << 18;
/// Longest extent the sequence algorithm looks at in one go.
pub(crate) const EXTENT_BLOCKS: usize = 1024;

/// The sequence threshold: a number, or chosen from how the volume is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Threshold {
    Fixed(u32),
    Auto,
}

impl std::str::FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(Threshold::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(Threshold::Fixed(n)),
            _ => Err(format!("{s:?}: a threshold is 1..=1024 blocks or `auto`")),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VolumeConfig {
    pub format: u32,
    pub size: u64,
    pub block_size: u32,
    pub threshold: Threshold,
    /// Bytes of dedup metadata cache.
    pub cache_bytes: u64,
    /// False: every block is written anew (the baseline of §5).
    pub dedup: bool,
    /// How the volume's blocks, journal and fingerprints are encrypted
    /// (a volume in an encrypted repository; see [`crate::crypt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// The counters and clean flag of the volume in `dir`.
pub(crate) fn read_state(dir: &Path) -> Result<State> {
    read_json(&dir.join("state.json"))
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct State {
    pub(crate) clean: bool,
    #[serde(default)]
    pub(crate) counters: Persistent,
}

/// The largest volume: 2^32 − 1 blocks of 4 KiB (≈ 16 TiB), so that a
/// disk block's reference count (32 bits) cannot wrap.
pub const MAX_SIZE: u64 = u32::MAX as u64 * BLOCK as u64;

/// A volume size: a positive multiple of 4 KiB, at most [`MAX_SIZE`].
pub(crate) fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(BLOCK as u64) || size > MAX_SIZE {
        return Err(VolumeError::Invalid(format!(
            "a size of {size} bytes: a volume's size is a positive multiple of {BLOCK} bytes, at most {MAX_SIZE} (16 TiB)"
        )));
    }
    Ok(())
}

/// The most bytes one [`Volume::extents`] tells (256 MiB: 64 Ki blocks).
pub const EXTENTS_MAX: u64 = 256 << 20;
/// Blocks of the write buffer [`Volume::extents`] looks at under one hold
/// of its lock.
pub(crate) const EXTENTS_LOCKED: usize = 4096;
