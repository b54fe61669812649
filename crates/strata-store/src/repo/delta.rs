//! Delta regions (docs/design.md "Delta compression"): a region whose
//! chunks zstd compressed with the plaintexts of chunks stored whole
//! elsewhere — its *bases* — as the reference prefix. Its container's
//! metadata lists the bases ([`DeltaRegion`]); opening it reads them
//! (checked against their fingerprints), then the frame.
//!
//! Every reader of regions comes through [`crate::repo::region`], which
//! sends delta regions here, so restore, dump, mount, copy, check
//! and the lifecycle read them without knowing. A base is never itself in
//! a delta region (chains are one deep), so a delta region costs at most
//! one more read per base region — and the bases of one region mostly lie
//! in one or two regions of the version before, which [`DeltaCache`]
//! keeps.

use crate::error::{Result, StoreError};
use crate::repo::container::read_meta;
use crate::repo::{container_id_of, data_name, Repository};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{BaseRef, ContainerId, ContainerMeta, DeltaRegion, RegionInfo};
use strata_core::CoreError;

/// Most bases one delta region lists.
pub const MAX_BASES: usize = strata_core::format::MAX_DELTA_BASES;
/// Most bytes of bases one delta region's prefix holds.
pub const MAX_PREFIX: usize = strata_core::format::MAX_DELTA_PREFIX as usize;

/// Entries kept per generation of a [`Generations`] map.
const METAS_KEPT: usize = 256;
/// Bytes of base regions kept per generation.
const REGION_BYTES_KEPT: usize = 16 << 20;

/// A bounded map in two generations: lookups see both; when the newer
/// fills (by the weight of its entries), the older is dropped and the
/// newer takes its place. What is used keeps being found; memory stays at
/// most two generations.
struct Generations<K, V> {
    new: HashMap<K, (V, usize)>,
    old: HashMap<K, (V, usize)>,
    weight: usize,
    limit: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Generations<K, V> {
    fn new(limit: usize) -> Self {
        Generations {
            new: HashMap::new(),
            old: HashMap::new(),
            weight: 0,
            limit,
        }
    }

    fn get(&mut self, k: &K) -> Option<V> {
        if let Some((v, _)) = self.new.get(k) {
            return Some(v.clone());
        }
        // Used again: into the newer generation, with its weight.
        let (v, weight) = self.old.remove(k)?;
        self.put(k.clone(), v.clone(), weight);
        Some(v)
    }

    fn put(&mut self, k: K, v: V, weight: usize) {
        if self.weight + weight > self.limit {
            self.old = std::mem::take(&mut self.new);
            self.weight = 0;
        }
        self.weight += weight;
        self.new.insert(k, (v, weight));
    }
}

/// A region of a container.
type RegionKey = (ContainerId, u32);

/// Reads a region stored whole (given by [`crate::repo::region`]).
pub type PlainReader = dyn Fn(&Repository, &ContainerId, &RegionInfo) -> Result<Vec<u8>>;

/// Container metadata and base regions recently used by delta regions,
/// and how many base regions were read (a figure backups and restores
/// report). One per repository handle.
pub struct DeltaCache {
    metas: Mutex<Generations<ContainerId, Arc<ContainerMeta>>>,
    regions: Mutex<Generations<RegionKey, Arc<Vec<u8>>>>,
    /// Base regions read from storage (not found in the cache).
    pub base_reads: AtomicU64,
    /// Delta regions opened.
    pub opened: AtomicU64,
}

impl Default for DeltaCache {
    fn default() -> Self {
        DeltaCache {
            metas: Mutex::new(Generations::new(METAS_KEPT)),
            regions: Mutex::new(Generations::new(REGION_BYTES_KEPT)),
            base_reads: AtomicU64::new(0),
            opened: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeltaCache {
    /// Container `id`'s metadata, cached.
    pub fn meta(&self, repo: &Repository, id: &ContainerId) -> Result<Arc<ContainerMeta>> {
        if let Some(m) = lock(&self.metas).get(id) {
            return Ok(m);
        }
        let m = Arc::new(read_meta(repo, id)?);
        lock(&self.metas).put(*id, m.clone(), 1);
        Ok(m)
    }

    /// The plaintext of region `region` of container `id`, which must be
    /// stored whole (a base's region), cached.
    fn base_region(
        &self,
        (repo, read): (&Repository, &PlainReader),
        id: &ContainerId,
        meta: &ContainerMeta,
        region: u32,
    ) -> Result<Arc<Vec<u8>>> {
        let key = (*id, region);
        if let Some(r) = lock(&self.regions).get(&key) {
            return Ok(r);
        }
        let info = meta.regions.get(region as usize).ok_or_else(|| {
            StoreError::Invalid(format!(
                "{}: a delta's base names region {region}, which it does not have",
                data_name(id)
            ))
        })?;
        if meta.delta_of(region).is_some() {
            return Err(StoreError::Invalid(format!(
                "{}: a delta's base lies in region {region}, itself a delta region (chains are one deep)",
                data_name(id)
            )));
        }
        self.base_reads.fetch_add(1, Ordering::Relaxed);
        let plain = Arc::new(read(repo, id, info)?);
        lock(&self.regions).put(key, plain.clone(), plain.len());
        Ok(plain)
    }

    /// The plaintext of base `b` (its region read by `read`, or cached),
    /// checked against its fingerprint.
    pub fn base(&self, repo: &Repository, b: &BaseRef, read: &PlainReader) -> Result<Vec<u8>> {
        let meta = self.meta(repo, &b.container).map_err(|e| match e {
            StoreError::NotFound(_) => StoreError::Invalid(format!(
                "{} is gone, but a delta region needs a base it held",
                data_name(&b.container)
            )),
            e => e,
        })?;
        let region = self.base_region((repo, read), &b.container, &meta, b.region)?;
        let start = b.offset as usize;
        let bytes = region
            .get(start..start + b.len as usize)
            .filter(|s| repo.hasher().hash(s) == b.fp)
            .ok_or_else(|| {
                StoreError::corrupt(
                    format!("{} (region {})", data_name(&b.container), b.region),
                    CoreError::Damaged(format!(
                        "a delta's base {} is not what is stored at offset {}",
                        &b.fp.to_hex()[..16],
                        b.offset
                    )),
                )
            })?;
        Ok(bytes.to_vec())
    }

    /// The reference prefix of delta region `d`: its bases' plaintexts in
    /// order.
    fn prefix(&self, repo: &Repository, d: &DeltaRegion, read: &PlainReader) -> Result<Vec<u8>> {
        let mut prefix = Vec::new();
        for b in &d.bases {
            prefix.extend_from_slice(&self.base(repo, b, read)?);
        }
        Ok(prefix)
    }
}

/// Opens the delta region envelope `env` of data object `name` (at
/// `r`): its metadata's bases, read and checked, then the frame decoded
/// to the length the metadata says. Bases are read by `read`.
pub fn open_delta_region(
    repo: &Repository,
    name: &str,
    env: &[u8],
    r: &RegionInfo,
    read: &PlainReader,
) -> Result<Vec<u8>> {
    let what = || format!("{name} (region at offset {})", r.offset);
    let id = container_id_of(name)
        .ok_or_else(|| StoreError::Invalid(format!("{name} is not a data container's name")))?;
    let cache = repo.deltas();
    cache.opened.fetch_add(1, Ordering::Relaxed);
    let meta = cache.meta(repo, &id)?;
    let d = meta
        .regions
        .iter()
        .position(|x| x == r)
        .and_then(|i| meta.delta_of(i as u32))
        .ok_or_else(|| {
            StoreError::corrupt(
                what(),
                CoreError::Damaged("a delta region its container's metadata does not list".into()),
            )
        })?;
    // A base that is damaged or gone takes this region down: said as
    // damage of this region (so readers look for other copies of its
    // chunks, and check names it), with the base's own error.
    let prefix = cache.prefix(repo, d, read).map_err(|e| match e {
        StoreError::Corrupt { .. } | StoreError::NotFound(_) | StoreError::Invalid(_) => {
            StoreError::corrupt(
                what(),
                CoreError::Damaged(format!("a delta region whose base cannot be read: {e}")),
            )
        }
        e => e,
    })?;
    let frame = repo
        .sealer()
        .open_within(Kind::DeltaRegion, env, env.len() as u64)
        .map_err(|e| StoreError::corrupt(what(), e))?;
    strata_core::delta::decode(&frame, &prefix, r.raw_len as usize)
        .map_err(|e| StoreError::corrupt(what(), e))
}
