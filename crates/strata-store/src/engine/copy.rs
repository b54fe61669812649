//! Copying chunks between containers, and deleting containers: the two
//! moves every lifecycle command (maintain, forget's rebase, compaction,
//! gc) makes with stored data.

use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::engine::writer::{ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::container::read_region;
use crate::repo::recipe::RecipeWriter;
use crate::repo::{data_name, meta_name, Repository};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{ChunkRef, ContainerId, ContainerMeta, Node, Recipe, RegionInfo, Stamp};
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

/// Where [`rewrite_refs`] points a chunk reference.
pub(crate) enum Target {
    /// Unchanged.
    Keep,
    /// Indirect: the chunk with the same fingerprint in the next version.
    Indirect,
    /// Direct, at (container, region, offset).
    At(ContainerId, u32, u32),
}

/// Rewrites every chunk reference of `recipe` with `f` — given the
/// reference and, for a direct one, its container — and rebuilds the
/// container table with only the containers still used.
pub(crate) fn rewrite_refs(
    recipe: &mut Recipe,
    mut f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<()> {
    let old = std::mem::take(&mut recipe.containers);
    let mut table = NewTable::default();
    for n in &mut recipe.nodes {
        rewrite_node(n, &old, &mut table, &mut f)?;
    }
    recipe.containers = table.ids;
    Ok(())
}

/// A container table in the making: ids in order of first use.
#[derive(Default)]
struct NewTable {
    ids: Vec<ContainerId>,
    index: HashMap<ContainerId, u32>,
}

/// [`rewrite_refs`] for one node whose direct references index `old`; the
/// new references index `table`.
fn rewrite_node(
    n: &mut Node,
    old: &[ContainerId],
    table: &mut NewTable,
    f: &mut impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<()> {
    for s in &mut n.segments {
        for c in &mut s.chunks {
            if c.is_zero() {
                continue;
            }
            let cid = match c.is_direct() {
                true => Some(*old.get(c.container as usize).ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "a recipe references container {} of {}",
                        c.container,
                        old.len()
                    ))
                })?),
                false => None,
            };
            let (id, region, offset) = match f(c, cid)? {
                Target::Keep => match cid {
                    Some(id) => (id, c.region, c.offset),
                    None => continue,
                },
                Target::Indirect => {
                    *c = ChunkRef::indirect(c.fp, c.len);
                    continue;
                }
                Target::At(id, region, offset) => (id, region, offset),
            };
            let i = *table.index.entry(id).or_insert_with(|| {
                table.ids.push(id);
                table.ids.len() as u32 - 1
            });
            *c = ChunkRef {
                fp: c.fp,
                len: c.len,
                container: i,
                region,
                offset,
            };
        }
    }
    Ok(())
}

/// [`rewrite_refs`] for the stored recipe `id`, a part at a time: each
/// node (a file's piece) is rewritten as it is read and handed to `sink`
/// with its own container table — typically into a [`RecipeWriter`]
/// ([`store_rewritten`]), whose parts that come out as they were are not
/// written again. Neither recipe is held whole: a disk image's version of
/// millions of chunks costs a part.
pub(crate) fn rewrite_pieces(
    repo: &Repository,
    id: &str,
    mut f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
    mut sink: impl FnMut(Node, &[ContainerId]) -> Result<()>,
) -> Result<()> {
    if crate::repo::recipe::part_ids(repo, id)?.is_empty() {
        // A version-1 recipe is one object whose nodes are in byte order,
        // not the path order a writer takes: sorted whole, as `put` sorts.
        let mut r = crate::repo::recipe::load_whole(repo, id)?;
        r.nodes
            .sort_by(|a, b| strata_core::format::path_cmp(&a.path, &b.path));
        for mut n in r.nodes {
            let mut table = NewTable::default();
            rewrite_node(&mut n, &r.containers, &mut table, &mut f)?;
            sink(n, &table.ids)?;
        }
        return Ok(());
    }
    crate::repo::recipe::for_each_piece_in_part(repo, id, |mut n, _, _, old| {
        let mut table = NewTable::default();
        rewrite_node(&mut n, old, &mut table, &mut f)?;
        sink(n, &table.ids)
    })?;
    Ok(())
}

/// [`rewrite_pieces`] stored as a new recipe: its id and the bytes
/// written.
pub(crate) fn store_rewritten(
    repo: &Repository,
    id: &str,
    f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<(String, u64)> {
    let mut w = RecipeWriter::new(repo);
    rewrite_into(repo, id, f, &mut w)?;
    w.finish()
}

/// [`rewrite_pieces`] of the stored recipe `id` pushed into `w` (another
/// tier's writer, one with a mirror): the caller finishes it.
pub(crate) fn rewrite_into(
    repo: &Repository,
    id: &str,
    f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
    w: &mut RecipeWriter,
) -> Result<()> {
    rewrite_pieces(repo, id, f, |n, table| {
        w.push(n, |i| table.get(i as usize).copied())
    })
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
