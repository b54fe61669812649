//! The delta stage of a backup (docs/design.md "Delta compression"): a
//! new chunk of a file that has a previous version is compared with the
//! chunk the previous version held at the same place. When that chunk
//! (or, if it is itself a delta, the base it was stored against)
//! resembles the new one enough — zstd with it as the prefix takes at
//! most [`KEEP`] of what zstd alone takes — the new chunk is stored as a
//! delta against it. Its base is read through the repository's delta
//! cache: a file's changed chunks mostly sit in a region or two of the
//! version before, so a base region is read once for many of them.

use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::error::Result;
use crate::repo::Repository;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::format::BaseRef;
use strata_core::Fingerprint;

/// A delta is kept when it is at most this fraction of the chunk
/// compressed alone (measured on real release series: keeping deltas up
/// to 0.9 stores less than up to 0.5, see docs/benchmarks.md).
pub const KEEP: f64 = 0.9;

/// What the delta stage did in one backup.
#[derive(Default)]
pub(crate) struct DeltaCounters {
    /// New chunks that had a chunk of the previous version at their place.
    pub candidates: AtomicU64,
    /// Chunks stored as deltas, and their bytes.
    pub chunks: AtomicU64,
    pub bytes: AtomicU64,
    /// Compressed bytes those chunks would have taken alone, and took as
    /// deltas (before their region's compression).
    pub alone: AtomicU64,
    pub encoded: AtomicU64,
}

/// Picks bases for new chunks; shared by the backup's workers.
pub(crate) struct DeltaPicker {
    repo: Repository,
    table: Arc<ContainerTable>,
    level: i32,
    pub counters: DeltaCounters,
}

/// A chunk's base: where it is, and its plaintext.
pub(crate) type Base = (BaseRef, Arc<Vec<u8>>);

impl DeltaPicker {
    pub fn new(repo: &Repository, table: Arc<ContainerTable>) -> Self {
        DeltaPicker {
            repo: repo.clone(),
            table,
            level: repo.config().zstd_level,
            counters: DeltaCounters::default(),
        }
    }

    /// The base `chunk` is to be stored against, given the chunk `near`
    /// (fingerprint and location) the previous version had at its place;
    /// None when there is none worth it. A base that cannot be read is no
    /// base: the chunk is stored whole.
    pub fn base_for(&self, chunk: &[u8], near: (Fingerprint, ChunkLoc)) -> Option<Base> {
        self.counters.candidates.fetch_add(1, Ordering::Relaxed);
        let base = self.locate(near).ok().flatten()?;
        let read = &crate::repo::region::read_plain_region;
        let bytes = self.repo.deltas().base(&self.repo, &base, read).ok()?;
        let delta = strata_core::delta::encode(chunk, &bytes, self.level).ok()?;
        // A delta of an eighth of the chunk or less beats zstd alone on
        // anything but data zstd alone shrinks eightfold: the second
        // compression is left out (it is the costlier half of the test).
        let alone = match delta.len() * 8 <= chunk.len() {
            true => chunk.len().div_ceil(8),
            false => zstd::bulk::compress(chunk, self.level).ok()?.len(),
        };
        if delta.len() as f64 > KEEP * alone as f64 {
            return None;
        }
        let c = &self.counters;
        c.chunks.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        c.alone.fetch_add(alone as u64, Ordering::Relaxed);
        c.encoded.fetch_add(delta.len() as u64, Ordering::Relaxed);
        Some((base, Arc::new(bytes)))
    }

    /// The counters as a report, with the recipe parts stored as deltas.
    pub fn report(&self, repo: &Repository, parts: &AtomicU64) -> super::DeltaReport {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        super::DeltaReport {
            candidates: get(&c.candidates),
            chunks: get(&c.chunks),
            raw_bytes: get(&c.bytes),
            alone_bytes: get(&c.alone),
            delta_bytes: get(&c.encoded),
            base_reads: get(&repo.deltas().base_reads),
            recipe_parts: get(parts),
        }
    }

    /// Where the base standing for `near` is: `near` itself when it is
    /// stored whole, else the base it was stored against. Never a chunk of
    /// a stamped container (it is deleted with its owner version, whatever
    /// else needs it).
    fn locate(&self, (fp, loc): (Fingerprint, ChunkLoc)) -> Result<Option<BaseRef>> {
        let Some(id) = self.table.try_get(loc.container) else {
            return Ok(None);
        };
        let meta = self.repo.deltas().meta(&self.repo, &id)?;
        if meta.stamp.is_some() {
            return Ok(None);
        }
        if meta.delta_of(loc.region).is_some() {
            let Some(b) = meta.base_of(loc.region, loc.offset) else {
                return Ok(None);
            };
            // (Its own container's stamp is checked when it is read as a
            // base: a stamped one is refused below.)
            let bm = self.repo.deltas().meta(&self.repo, &b.container)?;
            return Ok(bm.stamp.is_none().then_some(*b));
        }
        Ok(Some(BaseRef {
            fp,
            container: id,
            region: loc.region,
            offset: loc.offset,
            len: loc.len,
        }))
    }
}
