//! Migration of versions to the cloud tier (Data Domain Cloud Tier §6.1):
//! each selected version's chunks are looked up in the cloud tier's index
//! and only the chunks the bucket lacks are read from the active tier and
//! sent; then the version's recipe (all references direct, into the cloud
//! tier's containers) is written to both sides, the cloud tier's copy of
//! the snapshot object is written, and last the local snapshot object
//! flips to the cloud tier — the commit point. A kill before it leaves the
//! version wholly active (what was sent is unreferenced in the bucket and
//! a later migration reuses it); after it, the version is wholly in the
//! cloud, and the active tier's `gc` frees what only it held.

use super::paths;
use super::select::{check_chains, versions, versions_any, Selection};
use super::wanted::{MoveIndex, Visit};
use crate::engine::copy::{copy_chunks_between, region_cache, CopySource};
use crate::engine::resolver::{mark_needed, resolver_with};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::index::put_index_object;
use crate::repo::lock;
use crate::repo::recipe;
use crate::repo::recipe::refs::{rewrite_into, rewrite_refs, Target};
use crate::repo::snapshots::resolve_in;
use crate::repo::{now_ns, Repository};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{ChunkRef, ContainerId, Recipe, RegionInfo, Snapshot, Tier};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::Fingerprint;

#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrateReport {
    pub versions: Vec<SnapshotId>,
    /// Chunk references of the migrated versions, and their bytes.
    pub chunks: u64,
    pub logical_bytes: u64,
    /// Distinct chunks the cloud tier lacked, sent (uncompressed bytes)…
    pub chunks_sent: u64,
    pub raw_bytes_sent: u64,
    /// …and the containers written for them in the bucket.
    pub containers_written: u64,
    pub stored_bytes_sent: u64,
    /// Of those containers, the chunk data (compressed regions); the rest
    /// is their headers and metadata.
    pub data_bytes_sent: u64,
    /// Recipe objects (parts, indexes) the destination lacked, written.
    pub recipe_bytes_sent: u64,
    /// Distinct chunks the cloud tier had already (not sent).
    pub chunks_deduplicated: u64,
    /// Files moved with `--path` (or whose cloud part was recalled).
    pub files: u64,
    pub seconds: f64,
}

/// Which way a version moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// Active → cloud (migrate, §6.1): deduplicated against the cloud tier.
    ToCloud,
    /// Cloud → active (recall, §6.2): deduplicated against the active tier.
    ToActive,
}

/// Where the pool of `to` has the chunks of the recipes `rids` of `from`
/// (and only those: [`MoveIndex`]).
pub(crate) fn index_of_moving<'a>(
    from: &Repository,
    to: &Repository,
    rids: impl IntoIterator<Item = &'a RecipeId>,
) -> Result<MoveIndex> {
    let index = MoveIndex::default();
    for rid in rids {
        index.want(from, rid)?;
    }
    index.locate_in(to)?;
    Ok(index)
}

/// The recipe of version `v` that moves in direction `dir`: a recall
/// brings back a cloud version's recipe, or an active version's cloud
/// part.
fn moving_recipe(v: &Snapshot, dir: Direction) -> &RecipeId {
    match (dir, &v.cloud_part) {
        (Direction::ToActive, Some(p)) if v.tier == Tier::Active => &p.recipe,
        _ => &v.recipe,
    }
}

/// Moves the versions `sel` selects from `local` to its cloud tier `cloud`.
pub fn migrate(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
) -> Result<MigrateReport> {
    transfer(local, cloud, sel, progress, Direction::ToCloud, COPY_BATCH)
}

/// [`migrate`] copying `batch` chunks at a time (tests: several batches
/// of a small version).
#[doc(hidden)]
pub fn migrate_in_batches(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
    batch: usize,
) -> Result<MigrateReport> {
    transfer(
        local,
        cloud,
        sel,
        progress,
        Direction::ToCloud,
        batch.max(1),
    )
}

/// Brings the versions `sel` selects back from the cloud tier `cloud` to
/// `local`, reading from the bucket only the chunks the active tier lacks.
pub fn recall(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
) -> Result<MigrateReport> {
    transfer(local, cloud, sel, progress, Direction::ToActive, COPY_BATCH)
}

fn transfer(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
    dir: Direction,
    batch: usize,
) -> Result<MigrateReport> {
    let started = std::time::Instant::now();
    let globs = sel.path_set()?;
    if globs.is_some() && dir == Direction::ToActive {
        return Err(StoreError::Invalid(
            "recall brings versions back whole: drop --path".into(),
        ));
    }
    let what = match dir {
        Direction::ToCloud => "tier migrate",
        Direction::ToActive => "tier recall",
    };
    let _local_lock = lock::acquire(local, true, what)?;
    let _cloud_lock = lock::acquire(cloud, true, what)?;
    let (from, to) = match dir {
        Direction::ToCloud => (local, cloud),
        Direction::ToActive => (cloud, local),
    };
    let chosen = match dir {
        Direction::ToCloud => versions(local, sel, Tier::Active)?,
        Direction::ToActive => recallable(local, sel)?,
    };
    if dir == Direction::ToCloud && globs.is_none() {
        let all = local.list_snapshots()?;
        let ids: HashSet<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();
        check_chains(&all, &ids)?;
    }
    // Where the destination has the chunks that move (only those).
    let index = index_of_moving(from, to, chosen.iter().map(|(_, v)| moving_recipe(v, dir)))?;
    let mut report = MigrateReport::default();
    let regions = region_cache(from);
    let moved = Moved {
        from,
        to,
        index: &index,
        regions: &regions,
        batch,
    };
    if let Some(globs) = &globs {
        migrate_paths(
            local,
            cloud,
            &moved,
            &chosen,
            globs,
            &sel.paths,
            progress,
            &mut report,
        )?;
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }
    progress.bytes_total.store(
        chosen.iter().map(|(_, s)| s.stats.logical_bytes).sum(),
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);
    // Oldest first: an older version's indirect references lead into the
    // newer ones, still active while it is resolved; and newer versions
    // deduplicate against what the older ones sent.
    for (vid, v) in &chosen {
        if dir == Direction::ToActive && v.tier == Tier::Active {
            recall_part(local, cloud, &moved, vid, v, &mut report)?;
        } else if let (Direction::ToCloud, Some(p)) = (dir, &v.cloud_part) {
            // A version moving whole takes its cloud part along: the two
            // trees joined in memory (only after a `--path` migration).
            let r = moved.copy(v, from.load_recipe(&v.recipe)?, &mut report)?;
            let r = crate::repo::tiers::merge(r, local.load_recipe(&p.recipe)?)?;
            report.recipe_bytes_sent += commit(local, cloud, dir, vid, v, |w| w.push_recipe(r))?;
        } else {
            // A part of the recipe at a time: a disk image's version of
            // millions of chunks is never held whole.
            moved.send_stored(v, &v.recipe, &mut report)?;
            report.recipe_bytes_sent += commit(local, cloud, dir, vid, v, |w| {
                moved.rewrite_stored(&v.recipe, w)
            })?;
        }
        progress
            .bytes_done
            .fetch_add(v.stats.logical_bytes, Ordering::Relaxed);
    }
    report.versions = chosen.iter().map(|(id, _)| id.clone()).collect();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// What `tier recall` brings back: versions in the cloud tier and the
/// cloud parts of active versions.
fn recallable(local: &Repository, sel: &Selection) -> Result<Vec<(SnapshotId, Snapshot)>> {
    let in_cloud = |s: &Snapshot| s.tier == Tier::Cloud || s.cloud_part.is_some();
    let all = versions_any(local, sel)?;
    let wrong: Vec<String> = sel
        .snapshots
        .iter()
        .filter_map(|spec| resolve_in(&all, spec).ok())
        .filter(|(_, s)| !in_cloud(s))
        .map(|(id, s)| format!("{}@{} ({})", s.series, s.version, &id[..8.min(id.len())]))
        .collect();
    if !wrong.is_empty() {
        return Err(StoreError::Invalid(format!(
            "nothing of these is in the cloud tier: {}",
            wrong.join(", ")
        )));
    }
    Ok(all.into_iter().filter(|(_, s)| in_cloud(s)).collect())
}

/// Moves the files `globs` select out of each chosen version into its
/// cloud part ([`paths`]): every split is checked against the chains
/// first; then, version by version (oldest first), the files' chunks the
/// bucket lacks are sent, the part's recipe and the bucket's snapshot
/// object are written, and last the local snapshot object switches to the
/// smaller active recipe with its cloud part — the commit point.
#[allow(clippy::too_many_arguments)]
fn migrate_paths(
    local: &Repository,
    cloud: &Repository,
    moved: &Moved,
    chosen: &[(SnapshotId, Snapshot)],
    globs: &globset::GlobSet,
    patterns: &[String],
    progress: &Progress,
    report: &mut MigrateReport,
) -> Result<()> {
    let mut splits = Vec::new();
    for (vid, v) in chosen {
        if let Some(s) = paths::split(&local.load_recipe(&v.recipe)?, globs)? {
            splits.push((vid, v, s));
        }
    }
    // Along each chain, oldest first (times can be skewed).
    splits.sort_by(|a, b| (&a.1.series, a.1.version).cmp(&(&b.1.series, b.1.version)));
    let after: HashMap<SnapshotId, Recipe> = splits
        .iter()
        .map(|(id, _, s)| ((*id).clone(), s.rest.clone()))
        .collect();
    paths::check_chains(local, &after)?;
    drop(after);
    progress.bytes_total.store(
        splits.iter().map(|(_, _, s)| s.logical_bytes).sum(),
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);
    for (vid, v, s) in splits {
        let part = moved.copy(v, s.part, report)?;
        let (mut paths, files, logical_bytes) = match &v.cloud_part {
            Some(c) => (c.paths.clone(), c.files, c.logical_bytes),
            None => (Vec::new(), 0, 0),
        };
        let part = match &v.cloud_part {
            Some(old) => crate::repo::tiers::merge(local.load_recipe(&old.recipe)?, part)?,
            None => part,
        };
        for p in patterns {
            if !paths.contains(p) {
                paths.push(p.clone());
            }
        }
        let mut w = recipe::writer::RecipeWriter::new(cloud).with_mirror(local);
        w.push_recipe(part)?;
        let (pid, sent) = w.finish_primary()?;
        let cp = strata_core::format::CloudPart {
            recipe: pid.clone(),
            paths,
            files: files + s.files,
            logical_bytes: logical_bytes + s.logical_bytes,
            moved_ns: now_ns(),
        };
        // The bucket's copy of the version: just what it holds.
        let mut cv = v.clone();
        cv.tier = Tier::Cloud;
        cv.recipe = pid;
        cv.archival = None;
        cv.stats.files = cp.files;
        cv.stats.logical_bytes = cp.logical_bytes;
        cv.cloud_part = Some(cp.clone());
        cloud.replace_snapshot(vid, &cv)?;
        let mut nv = v.clone();
        recount(&mut nv, &s.rest);
        let (rid, _) = recipe::writer::put(local, s.rest)?;
        nv.recipe = rid;
        nv.cloud_part = Some(cp);
        // The commit.
        local.replace_snapshot(vid, &nv)?;
        recipe::delete_unused(local, v.recipes())?;
        if let Some(old) = &v.cloud_part {
            recipe::delete_unused(cloud, [&old.recipe])?;
        }
        report.recipe_bytes_sent += sent;
        report.files += s.files;
        report.versions.push(vid.clone());
        progress
            .bytes_done
            .fetch_add(s.logical_bytes, Ordering::Relaxed);
    }
    Ok(())
}

/// Brings an active version's cloud part back and joins it to the rest.
fn recall_part(
    local: &Repository,
    cloud: &Repository,
    moved: &Moved,
    vid: &SnapshotId,
    v: &Snapshot,
    report: &mut MigrateReport,
) -> Result<()> {
    let Some(part) = &v.cloud_part else {
        return Ok(());
    };
    let mut cv = v.clone();
    cv.archival = None;
    let back = moved.copy(&cv, cloud.load_recipe(&part.recipe)?, report)?;
    let joined = crate::repo::tiers::merge(local.load_recipe(&v.recipe)?, back)?;
    let mut nv = v.clone();
    recount(&mut nv, &joined);
    nv.cloud_part = None;
    let (rid, sent) = recipe::writer::put(local, joined)?;
    nv.recipe = rid;
    // The commit; then the bucket forgets its copy.
    local.replace_snapshot(vid, &nv)?;
    cloud.backend().delete(&format!("snapshots/{vid}"))?;
    recipe::delete_unused(cloud, [&part.recipe])?;
    recipe::delete_unused(local, v.recipes())?;
    report.recipe_bytes_sent += sent;
    report.files += part.files;
    Ok(())
}

/// Recounts an archival version's direct and indirect references after
/// its recipe changed.
fn recount(v: &mut Snapshot, r: &Recipe) {
    if let Some(a) = v.archival.as_mut() {
        (
            a.direct_chunks,
            a.direct_bytes,
            a.indirect_chunks,
            a.indirect_bytes,
        ) = (0, 0, 0, 0);
        for c in crate::engine::resolver::recipe_refs(r) {
            crate::ops::forget::count_ref(a, c);
        }
    }
}

/// One version's data going from one tier to the other.
struct Moved<'a> {
    from: &'a Repository,
    to: &'a Repository,
    index: &'a MoveIndex,
    regions: &'a dyn Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>>,
    /// Chunks copied at a time ([`COPY_BATCH`]).
    batch: usize,
}

impl Moved<'_> {
    /// Copies the chunks of `r` (of version `v`; the recipe is the same
    /// on both sides) the destination lacks and returns it with every
    /// reference direct into the destination.
    fn copy(&self, v: &Snapshot, mut r: Recipe, report: &mut MigrateReport) -> Result<Recipe> {
        let mut lacking = Lacking {
            containers: r.containers.len(),
            ..Lacking::new(self.index)
        };
        for n in &r.nodes {
            let path = n.path_str();
            for c in n.segments.iter().flat_map(|s| &s.chunks) {
                lacking.visit(c, &path, report);
            }
        }
        self.send(v, &r.containers, lacking, report)?;
        rewrite_refs(&mut r, |c, _| self.target(c))?;
        Ok(r)
    }

    /// [`Self::copy`] for the stored recipe `rid` of version `v`, read
    /// from the source tier a part at a time: sends what the destination
    /// lacks (its index then knows every chunk of the version).
    fn send_stored(&self, v: &Snapshot, rid: &RecipeId, report: &mut MigrateReport) -> Result<()> {
        let mut lacking = Lacking::new(self.index);
        let table = recipe::for_each_piece_in_part(self.from, rid, |n, _, _, table| {
            let path = n.path_str();
            lacking.containers = table.len();
            for c in n.segments.iter().flat_map(|s| &s.chunks) {
                lacking.visit(c, &path, report);
            }
            Ok(())
        })?;
        self.send(v, &table, lacking, report)
    }

    /// The stored recipe `rid`, every reference pointed into the
    /// destination (after [`Self::send_stored`]), into `w` a piece at a
    /// time.
    fn rewrite_stored(&self, rid: &RecipeId, w: &mut recipe::writer::RecipeWriter) -> Result<()> {
        rewrite_into(self.from, rid, |c, _| self.target(c), w)
    }

    /// Resolves the `lacking` chunks of version `v` (references numbered
    /// in `table`), copies them into the destination and adds them to its
    /// index.
    fn send(
        &self,
        v: &Snapshot,
        table: &[ContainerId],
        lacking: Lacking,
        report: &mut MigrateReport,
    ) -> Result<()> {
        let Lacking {
            refs,
            paths,
            mut used,
            indirect,
            ..
        } = lacking;
        used.resize(table.len(), false);
        let resolver = resolver_with(self.from, v, table, &used, indirect)?;
        // In batches, each copied and indexed before the next is
        // resolved: what the copy holds per chunk (its source, where it
        // went, the new containers' chunk lists) stays bounded.
        for batch in refs.chunks(self.batch) {
            let sources = batch
                .iter()
                .map(|(p, c)| {
                    let at = resolver.resolve(c, &paths[*p as usize])?;
                    Ok(CopySource {
                        fp: c.fp,
                        container: at.container,
                        region: at.region_idx,
                        offset: at.offset,
                        len: c.len,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let (_, metas) =
                copy_chunks_between(self.from, self.to, self.regions, &sources, None, None)?;
            report.chunks_sent += sources.len() as u64;
            report.raw_bytes_sent += sources.iter().map(|s| s.len as u64).sum::<u64>();
            report.containers_written += metas.len() as u64;
            report.stored_bytes_sent += metas.iter().map(|m| m.data_len).sum::<u64>();
            report.data_bytes_sent += metas.iter().map(|m| m.data_bytes()).sum::<u64>();
            for m in &metas {
                self.index.add_chunks(m);
            }
            if !metas.is_empty() {
                put_index_object(self.to, metas)?;
            }
        }
        Ok(())
    }

    /// Where a chunk of a moving version lies in the destination.
    fn target(&self, c: &ChunkRef) -> Result<Target> {
        placed(self.index, c).ok_or_else(|| {
            StoreError::Invalid(format!(
                "chunk {} was not placed in the destination tier",
                c.fp.to_hex()
            ))
        })
    }
}

/// Where `index` has chunk `c`, as a rewrite's target.
fn placed(index: &MoveIndex, c: &ChunkRef) -> Option<Target> {
    let (container, region, offset) = index.lookup(&c.fp)?;
    Some(Target::At(container, region, offset))
}

/// Chunks copied to the other tier at a time (1 GiB of 4 KiB chunks):
/// each batch is resolved, copied and indexed before the next.
const COPY_BATCH: usize = 1 << 18;

/// The chunks of a moving version the destination lacks, gathered as its
/// recipe is read: each distinct fingerprint once (a round of the
/// [`MoveIndex`]), with what resolving them needs (their containers, their
/// indirect fingerprints) and the path each came from (for errors).
struct Lacking<'a> {
    index: &'a MoveIndex,
    round: u32,
    refs: Vec<(u32, ChunkRef)>,
    paths: Vec<String>,
    used: Vec<bool>,
    indirect: HashSet<Fingerprint>,
    /// The length of the container table the references index (one
    /// past it is damage the resolver reports, not a table to grow).
    containers: usize,
}

impl<'a> Lacking<'a> {
    fn new(index: &'a MoveIndex) -> Self {
        Lacking {
            index,
            round: index.next_round(),
            refs: Vec::new(),
            paths: Vec::new(),
            used: Vec::new(),
            indirect: HashSet::new(),
            containers: 0,
        }
    }

    fn visit(&mut self, c: &ChunkRef, path: &str, report: &mut MigrateReport) {
        if c.is_zero() {
            return;
        }
        report.chunks += 1;
        report.logical_bytes += c.len as u64;
        match self.index.visit(&c.fp, self.round) {
            Visit::Again => return,
            Visit::Present => {
                report.chunks_deduplicated += 1;
                return;
            }
            Visit::Lacking => {}
        }
        if self.paths.last().is_none_or(|p| p != path) {
            self.paths.push(path.to_string());
        }
        // (An index past the table is damage the resolver reports.)
        self.used.resize(self.containers, false);
        mark_needed([c], &mut self.used, &mut self.indirect);
        self.refs.push((self.paths.len() as u32 - 1, *c));
    }
}

/// Flips version `v` to the cloud tier once every chunk it references is
/// in the cloud tier's `index` (after a seed): its recipe rewritten into
/// the cloud tier, written to both sides, then the commit.
pub(crate) fn flip_to_cloud(
    local: &Repository,
    cloud: &Repository,
    vid: &SnapshotId,
    v: &Snapshot,
    index: &MoveIndex,
) -> Result<()> {
    let target = |c: &ChunkRef, _| {
        placed(index, c).ok_or_else(|| {
            StoreError::Invalid(format!(
                "chunk {} of {}@{} is not in the cloud tier",
                c.fp.to_hex(),
                v.series,
                v.version
            ))
        })
    };
    let Some(p) = &v.cloud_part else {
        // A part at a time.
        return commit(local, cloud, Direction::ToCloud, vid, v, |w| {
            rewrite_into(local, &v.recipe, target, w)
        })
        .map(|_| ());
    };
    let mut r = local.load_recipe(&v.recipe)?;
    rewrite_refs(&mut r, target)?;
    // Its cloud part (already in the cloud tier) goes along.
    let r = crate::repo::tiers::merge(r, local.load_recipe(&p.recipe)?)?;
    commit(local, cloud, Direction::ToCloud, vid, v, |w| {
        w.push_recipe(r)
    })
    .map(|_| ())
}

/// Writes the moved version's recipe (`fill` pushes its nodes) and flips
/// its snapshot: the commit. Returns the bytes of recipe objects the
/// destination lacked.
fn commit(
    local: &Repository,
    cloud: &Repository,
    dir: Direction,
    vid: &SnapshotId,
    v: &Snapshot,
    fill: impl FnOnce(&mut recipe::writer::RecipeWriter) -> Result<()>,
) -> Result<u64> {
    let mut nv = v.clone();
    nv.archival = None;
    nv.cloud_part = None;
    let sent = match dir {
        Direction::ToCloud => {
            // The same objects on both sides, the bucket's first; then the
            // bucket's namespace copy; then the flip.
            let mut w = recipe::writer::RecipeWriter::new(cloud).with_mirror(local);
            fill(&mut w)?;
            let (rid, sent) = w.finish_primary()?;
            nv.tier = Tier::Cloud;
            nv.recipe = rid;
            cloud.replace_snapshot(vid, &nv)?;
            local.replace_snapshot(vid, &nv)?;
            recipe::delete_unused(local, v.recipes().filter(|r| **r != nv.recipe))?;
            if let Some(p) = &v.cloud_part {
                recipe::delete_unused(cloud, [&p.recipe])?;
            }
            sent
        }
        Direction::ToActive => {
            let mut w = recipe::writer::RecipeWriter::new(local);
            fill(&mut w)?;
            let (rid, sent) = w.finish()?;
            nv.tier = Tier::Active;
            nv.recipe = rid;
            // The flip; then the bucket forgets its copy.
            local.replace_snapshot(vid, &nv)?;
            cloud.backend().delete(&format!("snapshots/{vid}"))?;
            recipe::delete_unused(cloud, [&v.recipe])?;
            recipe::delete_unused(local, [&v.recipe])?;
            sent
        }
    };
    Ok(sent)
}
