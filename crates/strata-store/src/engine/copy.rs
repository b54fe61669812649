//! Copying chunks between containers, and deleting containers: the two
//! moves every lifecycle command (maintain, forget's rebase, compaction,
//! gc) makes with stored data.

use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::engine::writer::{ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::region::read_region;
use crate::repo::{data_name, meta_name, Repository};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{ChunkRef, ContainerId, ContainerMeta, RegionInfo, Stamp};
use strata_core::Fingerprint;

/// Deletes containers: metadata object first, so a metadata object always
/// implies its data exists and a kill in between leaves a plain orphan.
pub(crate) fn delete_containers<'a>(
    repo: &Repository,
    ids: impl Iterator<Item = &'a ContainerId>,
) -> Result<()> {
    for id in ids {
        repo.backend().delete(&meta_name(id))?;
        // (A linked container's blocks are given back to its volume.)
        crate::repo::links::delete_data(repo, id)?;
    }
    Ok(())
}

/// A chunk to copy: fingerprint and where it is stored now.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopySource {
    pub fp: Fingerprint,
    pub container: ContainerId,
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

impl CopySource {
    /// The source of a direct reference indexing container table `table`;
    /// `None` when the reference names a container the table does not
    /// list.
    pub(crate) fn of(table: &[ContainerId], c: &ChunkRef) -> Option<Self> {
        let container = *table.get(c.container as usize)?;
        Some(CopySource {
            fp: c.fp,
            container,
            region: c.region,
            offset: c.offset,
            len: c.len,
        })
    }

    /// [`Self::of`], with the error that names the snapshot.
    pub(crate) fn of_snapshot(table: &[ContainerId], c: &ChunkRef, snapshot: &str) -> Result<Self> {
        Self::of(table, c).ok_or_else(|| {
            StoreError::Invalid(format!(
                "recipe of snapshot {snapshot} references an unknown container"
            ))
        })
    }
}

/// Where [`copy_chunks`] put each fingerprint.
pub(crate) type Placed = HashMap<Fingerprint, (ContainerId, ChunkLoc)>;

/// Copies chunks into new containers carrying `stamp`, reading each
/// region once (sources grouped by container and region). Returns the new
/// location of every fingerprint and the metadata of the new containers.
pub(crate) fn copy_chunks(
    repo: &Repository,
    regions: &dyn Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>>,
    sources: &[CopySource],
    stamp: Option<Stamp>,
    progress: Option<&Progress>,
) -> Result<(Placed, Vec<ContainerMeta>)> {
    copy_chunks_between(repo, repo, regions, sources, stamp, progress)
}

/// [`copy_chunks`] from the containers of `src` into new containers of
/// `dst` (another tier: a repository with the same keys).
pub(crate) fn copy_chunks_between(
    src: &Repository,
    dst: &Repository,
    regions: &dyn Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>>,
    sources: &[CopySource],
    stamp: Option<Stamp>,
    progress: Option<&Progress>,
) -> Result<(Placed, Vec<ContainerMeta>)> {
    let repo = src;
    let mut plan: BTreeMap<ContainerId, BTreeMap<u32, Vec<&CopySource>>> = BTreeMap::new();
    for s in sources {
        plan.entry(s.container)
            .or_default()
            .entry(s.region)
            .or_default()
            .push(s);
    }
    let table = Arc::new(ContainerTable::default());
    let sink = ContainerSink::start(dst);
    let mut placed: HashMap<Fingerprint, ChunkLoc> = HashMap::new();
    let copy_result: Result<()> = (|| {
        let mut writer = ContainerWriter::new(dst, table.clone(), sink.sender());
        writer.set_stamp(stamp.clone());
        for (cid, regs) in &plan {
            let name = data_name(cid);
            let infos = regions(cid).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name} is missing or unreadable, so its chunks cannot be copied; run `strata check`"
                ))
            })?;
            for (r, chunks) in regs {
                let info = infos.get(*r as usize).ok_or_else(|| {
                    StoreError::Invalid(format!("{name}: chunk in a region that does not exist"))
                })?;
                let plain = read_region(repo, cid, info)?;
                for s in chunks {
                    if placed.contains_key(&s.fp) {
                        continue;
                    }
                    let data = plain
                        .get(s.offset as usize..(s.offset + s.len) as usize)
                        .ok_or_else(|| {
                            StoreError::Invalid(format!("{name}: chunk outside its region"))
                        })?;
                    let loc = writer.next_loc(data.len())?;
                    writer.append(s.fp, data);
                    placed.insert(s.fp, loc);
                    if let Some(p) = progress {
                        p.bytes_done.fetch_add(s.len as u64, Ordering::Relaxed);
                    }
                }
            }
        }
        writer.flush()
    })();
    // The writer thread's error comes first: when it fails, the copy loop
    // only sees a closed channel.
    let written = sink.finish()?;
    copy_result?;
    let out = placed
        .into_iter()
        .map(|(fp, loc)| (fp, (table.get(loc.container), loc)))
        .collect();
    Ok((out, written.metas))
}

/// Region tables of containers, read from their metadata objects once each
/// (a missing or unreadable one is `None`).
pub(crate) fn region_cache(
    repo: &Repository,
) -> impl Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>> + '_ {
    let cache: std::sync::Mutex<HashMap<ContainerId, Option<Arc<Vec<RegionInfo>>>>> =
        Default::default();
    move |id: &ContainerId| {
        let mut g = cache.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(*id)
            .or_insert_with(|| {
                crate::repo::container::read_meta(repo, id)
                    .ok()
                    .map(|m| Arc::new(m.regions))
            })
            .clone()
    }
}
