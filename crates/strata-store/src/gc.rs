//! Forget, pool compaction and mark-and-sweep garbage collection
//! (DESIGN.md "Lifecycle": "mark-and-sweep GC remains for what stamps
//! cannot cover").
//!
//! Data lives in two domains. The *pool* holds the chunks that versions in
//! live form (not reverse-deduplicated) reference; it is shared by every
//! series and cleaned by marking. *Stamped* containers hold the direct
//! chunks of one archival version (RevDedup §2.5): only that version
//! references them directly, older versions of its series reach them
//! through indirect references, so they are deleted together with their
//! owner without scanning anything (see [`forget`]).
//!
//! Marking is by location — (container, region, offset) of every direct
//! reference — not by fingerprint, so a whole segment stays whole where it
//! is even when one of its chunks is also stored elsewhere. Whatever moves
//! chunks (copy-forward here, reverse dedup in `revdedup`) rewrites the
//! recipes that point at them, so references stay exact.
//!
//! Order for crash safety: new containers → index objects → recipes and
//! snapshot objects → old index objects deleted → old containers deleted.
//! A kill at any point leaves every snapshot restorable; what it leaves
//! behind is unreferenced and removed by the next gc.

use crate::container::{open_region, read_meta, ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::index::{edit_index, ChunkLoc, ContainerTable, RepoIndex};
use crate::lock;
use crate::repo::{container_id_of, data_name, meta_name, Repository};
use crate::restore::recipe_refs;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::crypto::Kind;
use strata_core::format::{
    Archival, ChunkRef, ContainerId, ContainerMeta, Recipe, RegionInfo, Snapshot, Stamp,
};
use strata_core::Fingerprint;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ForgetReport {
    pub removed_snapshots: Vec<String>,
    pub removed_recipes: u64,
    /// Archival versions whose indirect references led into a removed
    /// version and were re-pointed (copying what only it held).
    pub rebased: Vec<String>,
    /// Stamped containers deleted with their owners, and their bytes.
    pub stamped_containers_deleted: u64,
    pub stamped_bytes_freed: u64,
}

/// Removes snapshots (by id). An archival version's stamped containers go
/// at once, without scanning; what removed live-form versions held in the
/// shared pool is freed by the next `gc` (or `maintain`).
pub fn forget(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let _lock = lock::acquire(repo, true, "forget")?;
    forget_locked(repo, ids)
}

pub(crate) fn forget_locked(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    // A damaged snapshot object can only be dropped: its recipe and data
    // are unknown, and go at the next gc.
    let mut ids: Vec<String> = ids.to_vec();
    let mut report = ForgetReport::default();
    for (id, _) in &damaged {
        if let Some(p) = ids.iter().position(|x| x == id) {
            repo.backend().delete(&format!("snapshots/{id}"))?;
            report.removed_snapshots.push(ids.remove(p));
        }
    }
    if !damaged.is_empty() && !ids.is_empty() {
        return Err(StoreError::Invalid(format!(
            "snapshot {} cannot be read; forget it first (`strata forget {}`)",
            damaged[0].0, damaged[0].0
        )));
    }
    let ids = &ids[..];
    let by_id: HashMap<&str, &Snapshot> = all.iter().map(|(i, s)| (i.as_str(), s)).collect();
    for id in ids {
        if !by_id.contains_key(id.as_str()) {
            return Err(StoreError::NoSnapshot(id.clone()));
        }
    }
    let removing: HashSet<&str> = ids.iter().map(String::as_str).collect();

    // Survivors whose chain of indirect references passes through a
    // removed version are re-pointed first: until their new snapshot
    // object is committed, the removed versions still exist.
    for (uid, u) in &all {
        if removing.contains(uid.as_str()) {
            continue;
        }
        let through_removed = u
            .archival
            .as_ref()
            .and_then(|a| a.next.as_deref())
            .is_some_and(|n| removing.contains(n));
        if through_removed {
            rebase(repo, uid, u, &by_id, &removing)?;
            report.rebased.push(uid.clone());
        }
    }

    let mut dropped_recipes = HashSet::new();
    for id in ids {
        repo.backend().delete(&format!("snapshots/{id}"))?;
        dropped_recipes.insert(by_id[id.as_str()].recipe.clone());
        report.removed_snapshots.push(id.clone());
    }
    // From the snapshots as they are now: a rebase above may have given a
    // survivor a recipe object that a removed version also used.
    let (now, _) = repo.list_snapshots_tolerant()?;
    let still: HashSet<&String> = now
        .iter()
        .filter(|(i, _)| !removing.contains(i.as_str()))
        .map(|(_, s)| &s.recipe)
        .collect();
    for r in dropped_recipes {
        if !still.contains(&r) {
            repo.backend().delete(&format!("recipes/{r}"))?;
            report.removed_recipes += 1;
        }
    }

    // Stamped containers of the removed versions: found in the index by
    // their stamp, deleted without looking at anything else.
    let idx = RepoIndex::load_summaries(repo)?;
    let owned: HashSet<ContainerId> = ids.iter().flat_map(|id| idx.stamped_by(id)).collect();
    if !owned.is_empty() {
        report.stamped_bytes_freed = owned
            .iter()
            .filter_map(|c| idx.containers.get(c))
            .map(|c| c.data_len)
            .sum();
        report.stamped_containers_deleted = owned.len() as u64;
        edit_index(repo, &idx, &owned, vec![])?;
        delete_containers(repo, owned.iter())?;
    }
    Ok(report)
}

/// Deletes containers: metadata object first, so a metadata object always
/// implies its data exists and a kill in between leaves a plain orphan.
pub(crate) fn delete_containers<'a>(
    repo: &Repository,
    ids: impl Iterator<Item = &'a ContainerId>,
) -> Result<()> {
    for id in ids {
        repo.backend().delete(&meta_name(id))?;
        repo.backend().delete(&data_name(id))?;
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
    /// The source of a direct reference of `recipe`; `None` when the
    /// reference names a container the recipe does not list.
    pub(crate) fn of(recipe: &Recipe, c: &ChunkRef) -> Option<Self> {
        let container = *recipe.containers.get(c.container as usize)?;
        Some(CopySource {
            fp: c.fp,
            container,
            region: c.region,
            offset: c.offset,
            len: c.len,
        })
    }

    /// [`Self::of`], with the error that names the snapshot.
    pub(crate) fn of_snapshot(recipe: &Recipe, c: &ChunkRef, snapshot: &str) -> Result<Self> {
        Self::of(recipe, c).ok_or_else(|| {
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
    progress: Option<&crate::backup::Progress>,
) -> Result<(Placed, Vec<ContainerMeta>)> {
    let mut plan: BTreeMap<ContainerId, BTreeMap<u32, Vec<&CopySource>>> = BTreeMap::new();
    for s in sources {
        plan.entry(s.container)
            .or_default()
            .entry(s.region)
            .or_default()
            .push(s);
    }
    let table = Arc::new(ContainerTable::default());
    let sink = ContainerSink::start(repo);
    let mut placed: HashMap<Fingerprint, ChunkLoc> = HashMap::new();
    let copy_result: Result<()> = (|| {
        let mut writer = ContainerWriter::new(repo, table.clone(), sink.sender());
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
                let env = repo
                    .backend()
                    .get_range(&name, info.offset, info.stored_len as u64)?;
                let plain = open_region(repo, &name, &env, info)?;
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

/// Re-points an archival version whose next version is being removed: its
/// indirect references are followed through the removed versions.
///
/// When a newer version survives, chunks found direct in the removed ones
/// are copied into new containers stamped with this version and the rest
/// stay indirect to the first survivor. When none survives, the version
/// becomes the newest of its series and returns to live form instead:
/// chunks the removed versions held in the pool are referenced where they
/// are (no copy), and only archival data — its own stamped chunks and those
/// of removed archival versions — is copied into the pool. That keeps
/// forgetting the newest version cheap.
fn rebase(
    repo: &Repository,
    uid: &str,
    u: &Snapshot,
    by_id: &HashMap<&str, &Snapshot>,
    removing: &HashSet<&str>,
) -> Result<()> {
    let broken = |detail: String| StoreError::BrokenChain {
        snapshot: format!("{}@{}", u.series, u.version),
        detail,
    };
    let recipe = repo.load_recipe(&u.recipe)?;
    let mut want: HashSet<Fingerprint> = recipe_refs(&recipe)
        .filter(|c| c.is_indirect())
        .map(|c| c.fp)
        .collect();
    // Direct references met in removed versions, and whether the version
    // holding each was in live form (its chunk is in the pool).
    let mut found: Vec<(CopySource, bool)> = Vec::new();
    let mut next = u.archival.as_ref().and_then(|a| a.next.clone());
    let mut visited = HashSet::new();
    while let Some(id) = next.clone() {
        if !removing.contains(id.as_str()) || want.is_empty() {
            break;
        }
        if !visited.insert(id.clone()) {
            return Err(broken(format!("the chain loops at snapshot {id}")));
        }
        let x = by_id
            .get(id.as_str())
            .ok_or_else(|| broken(format!("snapshot {id} is missing")))?;
        let rx = repo.load_recipe(&x.recipe)?;
        for c in recipe_refs(&rx) {
            if c.is_direct() && want.remove(&c.fp) {
                let src = CopySource::of_snapshot(&rx, c, &id)?;
                found.push((src, x.archival.is_none()));
            }
        }
        next = x.archival.as_ref().and_then(|a| a.next.clone());
    }
    let next = next.filter(|n| !removing.contains(n.as_str()));
    if next.is_none() && !want.is_empty() {
        return Err(broken(format!(
            "{} indirect chunks are held by no remaining version",
            want.len()
        )));
    }
    let revive = next.is_none();
    let mut in_pool: HashMap<Fingerprint, CopySource> = HashMap::new();
    let mut sources: Vec<CopySource> = Vec::new();
    for (src, live_form) in found {
        if revive && live_form {
            in_pool.insert(src.fp, src);
        } else {
            sources.push(src);
        }
    }
    let own_stamped: Vec<ContainerId> = if revive {
        // Its own direct chunks leave the stamped containers for the pool.
        let mut seen = HashSet::new();
        for c in recipe_refs(&recipe) {
            if c.is_direct() && seen.insert(c.fp) {
                sources.extend(CopySource::of(&recipe, c));
            }
        }
        recipe.containers.clone()
    } else {
        Vec::new()
    };
    let cache: std::sync::Mutex<HashMap<ContainerId, Option<Arc<Vec<RegionInfo>>>>> =
        Default::default();
    let regions = |id: &ContainerId| -> Option<Arc<Vec<RegionInfo>>> {
        let mut g = cache.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(*id)
            .or_insert_with(|| read_meta(repo, id).ok().map(|m| Arc::new(m.regions)))
            .clone()
    };
    let stamp = (!revive).then(|| Stamp {
        owner: uid.to_string(),
        time_ns: u.time_ns,
    });
    let (placed, metas) = copy_chunks(repo, &regions, &sources, stamp, None)?;
    let idx = RepoIndex::load_summaries(repo)?;
    edit_index(repo, &idx, &HashSet::new(), metas)?;

    let mut recipe = recipe;
    if revive {
        // Rebuilt from scratch: nothing may point into stamped containers.
        recipe.containers.clear();
    }
    let mut table: HashMap<ContainerId, u32> = recipe
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, i as u32))
        .collect();
    let mut counts = Archival {
        next: next.clone(),
        converted_ns: u
            .archival
            .as_ref()
            .map(|a| a.converted_ns)
            .unwrap_or_default(),
        ..Default::default()
    };
    for n in &mut recipe.nodes {
        for s in &mut n.segments {
            for c in &mut s.chunks {
                let to = if c.is_indirect() || (revive && c.is_direct()) {
                    in_pool
                        .get(&c.fp)
                        .map(|p| (p.container, p.region, p.offset))
                        .or_else(|| {
                            placed
                                .get(&c.fp)
                                .map(|(cid, loc)| (*cid, loc.region, loc.offset))
                        })
                } else {
                    None
                };
                match to {
                    Some((cid, region, offset)) => {
                        let next_i = table.len() as u32;
                        let i = *table.entry(cid).or_insert_with(|| {
                            recipe.containers.push(cid);
                            next_i
                        });
                        *c = ChunkRef {
                            fp: c.fp,
                            len: c.len,
                            container: i,
                            region,
                            offset,
                        };
                    }
                    None if revive && !c.is_zero() => {
                        return Err(broken(format!(
                            "chunk {} could not be placed while returning to live form",
                            c.fp.to_hex()
                        )));
                    }
                    None => {}
                }
                count_ref(&mut counts, c);
            }
        }
    }
    let (rid, _) = repo.put_struct(Kind::Recipe, "recipes", &recipe)?;
    let mut nu = u.clone();
    let old_recipe = std::mem::replace(&mut nu.recipe, rid);
    nu.archival = (!revive).then_some(counts);
    // The switch; after it the old stamped containers are unreferenced.
    repo.replace_snapshot(uid, &nu)?;
    if old_recipe != nu.recipe
        && !by_id
            .iter()
            .any(|(id, s)| *id != uid && s.recipe == old_recipe)
    {
        repo.backend().delete(&format!("recipes/{old_recipe}"))?;
    }
    if revive {
        let idx = RepoIndex::load_summaries(repo)?;
        let stale: HashSet<ContainerId> = own_stamped
            .into_iter()
            .filter(|c| {
                idx.containers
                    .get(c)
                    .is_some_and(|s| s.stamp.as_ref().is_some_and(|st| st.owner == uid))
            })
            .collect();
        edit_index(repo, &idx, &stale, vec![])?;
        delete_containers(repo, stale.iter())?;
    }
    Ok(())
}

/// Adds one reference to the direct/indirect tallies of an archival version.
pub(crate) fn count_ref(a: &mut Archival, c: &ChunkRef) {
    if c.is_indirect() {
        a.indirect_chunks += 1;
        a.indirect_bytes += c.len as u64;
    } else if c.is_direct() {
        a.direct_chunks += 1;
        a.direct_bytes += c.len as u64;
    }
}

#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Containers with more than this fraction of dead bytes are rewritten.
    pub threshold: f64,
    pub dry_run: bool,
    pub progress: Arc<crate::backup::Progress>,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            threshold: 0.2,
            dry_run: false,
            progress: Arc::new(Default::default()),
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct GcReport {
    /// Chunk locations referenced directly by some snapshot.
    pub live_chunks: u64,
    pub containers_before: u64,
    pub containers_deleted: u64,
    pub containers_rewritten: u64,
    /// Of those rewritten, small containers merged into fuller ones.
    pub containers_merged: u64,
    pub containers_written: u64,
    /// Stamped containers whose owner is gone or never committed.
    pub stamped_deleted: u64,
    /// Recipes rewritten to point at copied-forward chunks.
    pub recipes_remapped: u64,
    pub orphans_deleted: u64,
    /// Recipe objects no snapshot uses, deleted.
    pub recipes_deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub bytes_freed: u64,
    pub dry_run: bool,
}

/// Live chunk locations: per container, the (region, offset) pairs that
/// direct references of the given snapshots point at.
pub type Marks = HashMap<ContainerId, HashSet<(u32, u32)>>;

/// Marks the direct references of every snapshot (`all`) or of those in
/// live form only (not reverse-deduplicated: the only ones that reference
/// the pool).
pub fn mark_live(repo: &Repository, all: bool) -> Result<Marks> {
    let mut marks: Marks = HashMap::new();
    let mut seen_recipes = HashSet::new();
    for (_, s) in repo.list_snapshots()? {
        if (!all && s.archival.is_some()) || !seen_recipes.insert(s.recipe.clone()) {
            continue;
        }
        mark_recipe(&mut marks, &repo.load_recipe(&s.recipe)?);
    }
    Ok(marks)
}

fn mark_recipe(marks: &mut Marks, r: &Recipe) {
    for c in recipe_refs(r) {
        if let (true, Some(cid)) = (c.is_direct(), r.containers.get(c.container as usize)) {
            marks.entry(*cid).or_default().insert((c.region, c.offset));
        }
    }
}

/// Whose references keep pool chunks alive in a compaction.
pub(crate) enum Scope {
    /// Every snapshot's (gc: the belt and braces of mark and sweep).
    All,
    /// Live-form snapshots' only (maintain): by construction the only ones
    /// that reference the pool, and few — the live windows.
    LiveForm,
}

/// Compacts the shared pool: containers with nothing marked are dropped,
/// those with a dead fraction above `threshold` have their live chunks
/// copied forward (whole segments stay whole, so segment dedup keeps
/// finding them), and the recipes pointing at moved chunks are rewritten.
pub(crate) fn compact_pool(
    repo: &Repository,
    scope: Scope,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<()> {
    let snaps = repo.list_snapshots()?;
    let mut marks: Marks = HashMap::new();
    // Containers each marked recipe points at, to find the ones to remap.
    let mut uses: HashMap<String, Vec<ContainerId>> = HashMap::new();
    for (_, s) in &snaps {
        let wanted = matches!(scope, Scope::All) || s.archival.is_none();
        if wanted && !uses.contains_key(&s.recipe) {
            let r = repo.load_recipe(&s.recipe)?;
            mark_recipe(&mut marks, &r);
            uses.insert(s.recipe.clone(), r.containers);
        }
    }
    report.live_chunks += marks.values().map(|m| m.len() as u64).sum::<u64>();
    // Every pool container is examined as the index loads (metadata only;
    // only those to drop or rewrite are kept).
    let mut drop: Vec<ContainerMeta> = Vec::new();
    let mut rewrite: Vec<(ContainerMeta, Vec<bool>)> = Vec::new();
    // Kept containers filled less than half: every backup leaves a couple
    // (one per worker), and a restore pays per container it opens.
    let target = repo.config().container_size as u64;
    let mut small: Vec<(ContainerMeta, Vec<bool>, u64)> = Vec::new();
    let idx = RepoIndex::load(repo, |m| {
        if m.stamp.is_some() {
            return;
        }
        let live_set = marks.get(&m.id);
        let live: Vec<bool> = m
            .chunks
            .iter()
            .map(|c| live_set.is_some_and(|s| s.contains(&(c.region, c.offset))))
            .collect();
        let raw = m.raw_bytes().max(1);
        let live_bytes: u64 = m
            .chunks
            .iter()
            .zip(&live)
            .filter(|(_, l)| **l)
            .map(|(c, _)| c.len as u64)
            .sum();
        if live_bytes == 0 {
            drop.push(m.clone());
        } else if (raw - live_bytes) as f64 / raw as f64 > opts.threshold {
            rewrite.push((m.clone(), live));
        } else if live_bytes < target / 2 {
            small.push((m.clone(), live, live_bytes));
        }
    })?;
    // Merge the small ones once together they fill at least half a
    // container, so the output is not small again (each byte is merged
    // about once, not at every run).
    let small_bytes: u64 = small.iter().map(|x| x.2).sum();
    if small.len() >= 2 && small_bytes >= target / 2 {
        report.containers_merged += small.len() as u64;
        rewrite.extend(small.into_iter().map(|(m, l, _)| (m, l)));
    }
    // Oldest first: the copies keep roughly the order backups wrote.
    rewrite.sort_by_key(|(m, _)| (m.created, m.id));
    report.containers_deleted += drop.len() as u64;
    report.containers_rewritten += rewrite.len() as u64;
    let freed_drop: u64 = drop.iter().map(|m| m.data_len).sum();
    let progress = &opts.progress;
    progress.bytes_total.fetch_add(
        rewrite.iter().map(|(m, _)| m.data_len).sum(),
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);
    if opts.dry_run {
        report.bytes_freed += freed_drop;
        return Ok(());
    }
    if drop.is_empty() && rewrite.is_empty() {
        return Ok(());
    }

    // Copy forward, container by container, in chunk order.
    let table = Arc::new(ContainerTable::default());
    let sink = ContainerSink::start(repo);
    let mut moved: HashMap<(ContainerId, u32, u32), ChunkLoc> = HashMap::new();
    let copy_result: Result<()> = (|| {
        let mut writer = ContainerWriter::new(repo, table.clone(), sink.sender());
        for (m, live) in &rewrite {
            copy_forward(repo, &mut writer, m, live, &mut moved)?;
            progress.bytes_done.fetch_add(m.data_len, Ordering::Relaxed);
        }
        writer.flush()
    })();
    let written = sink.finish()?;
    copy_result?;
    report.containers_written += written.metas.len() as u64;
    let added: u64 = written.metas.iter().map(|m| m.data_len).sum();

    let old: HashSet<ContainerId> = drop
        .iter()
        .map(|m| m.id)
        .chain(rewrite.iter().map(|(m, _)| m.id))
        .collect();
    // The copies join the index before any recipe points at them, and the
    // originals leave it only after no recipe does: a kill in between
    // leaves both indexed, and the next gc sorts out which is referenced.
    edit_index(repo, &idx, &HashSet::new(), written.metas)?;

    // Point the recipes at the new copies, one recipe object at a time
    // (snapshots with identical recipes share one object).
    let rewritten: HashSet<ContainerId> = rewrite.iter().map(|(m, _)| m.id).collect();
    let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, s) in &snaps {
        let affected = uses
            .get(&s.recipe)
            .is_some_and(|cs| cs.iter().any(|c| rewritten.contains(c)));
        if affected {
            users
                .entry(s.recipe.as_str())
                .or_default()
                .push(id.as_str());
        }
    }
    for (rid, ids) in users {
        let mut recipe = repo.load_recipe(rid)?;
        remap_recipe(&mut recipe, &rewritten, &moved, &table);
        let (new_rid, _) = repo.put_struct(Kind::Recipe, "recipes", &recipe)?;
        for id in ids {
            let mut s = repo.load_snapshot(id)?;
            s.recipe = new_rid.clone();
            repo.replace_snapshot(id, &s)?;
        }
        if new_rid != rid {
            repo.backend().delete(&format!("recipes/{rid}"))?;
        }
        report.recipes_remapped += 1;
    }
    let freed_rewrite: u64 = rewrite.iter().map(|(m, _)| m.data_len).sum();
    edit_index(repo, &idx, &old, vec![])?;
    delete_containers(repo, old.iter())?;
    report.bytes_freed += (freed_drop + freed_rewrite).saturating_sub(added);
    Ok(())
}

/// Copies the live chunks of one container: segments whose chunks are all
/// live are packed whole again, other live chunks one by one.
fn copy_forward(
    repo: &Repository,
    writer: &mut ContainerWriter,
    m: &ContainerMeta,
    live: &[bool],
    moved: &mut HashMap<(ContainerId, u32, u32), ChunkLoc>,
) -> Result<()> {
    let name = data_name(&m.id);
    let mut plains: HashMap<u32, Vec<u8>> = HashMap::new();
    let needed: std::collections::BTreeSet<u32> = m
        .chunks
        .iter()
        .zip(live)
        .filter(|(_, l)| **l)
        .map(|(c, _)| c.region)
        .collect();
    for r in needed {
        let info = m.regions.get(r as usize).ok_or_else(|| {
            StoreError::Invalid(format!("{name}: chunk in a region that does not exist"))
        })?;
        let env = repo
            .backend()
            .get_range(&name, info.offset, info.stored_len as u64)?;
        plains.insert(r, open_region(repo, &name, &env, info)?);
    }
    // Segment starting at each chunk index, when the whole segment is live.
    let mut whole: HashMap<usize, (Fingerprint, usize)> = HashMap::new();
    for s in &m.segments {
        let (a, n) = (s.first_chunk as usize, s.chunks as usize);
        if n > 0 && live.get(a..a + n).is_some_and(|l| l.iter().all(|x| *x)) {
            whole.insert(a, (s.fp, n));
        }
    }
    let data_of = |i: usize| -> Result<&[u8]> {
        let c = &m.chunks[i];
        plains
            .get(&c.region)
            .and_then(|p| p.get(c.offset as usize..(c.offset + c.len) as usize))
            .ok_or_else(|| StoreError::Invalid(format!("{name}: chunk outside its region")))
    };
    let mut i = 0;
    while i < m.chunks.len() {
        if let Some(&(fp, n)) = whole.get(&i) {
            let bytes: usize = m.chunks[i..i + n].iter().map(|c| c.len as usize).sum();
            writer.begin_segment(bytes)?;
            for j in i..i + n {
                let c = &m.chunks[j];
                let loc = writer.next_loc(c.len as usize)?;
                writer.append(c.fp, data_of(j)?);
                moved.insert((m.id, c.region, c.offset), loc);
            }
            writer.end_segment(fp, n as u32);
            i += n;
            continue;
        }
        if live[i] {
            let c = &m.chunks[i];
            let loc = writer.next_loc(c.len as usize)?;
            writer.append(c.fp, data_of(i)?);
            moved.insert((m.id, c.region, c.offset), loc);
        }
        i += 1;
    }
    Ok(())
}

/// Rewrites the direct references into `rewritten` containers to their
/// copies and rebuilds the container table with only what is used.
fn remap_recipe(
    recipe: &mut Recipe,
    rewritten: &HashSet<ContainerId>,
    moved: &HashMap<(ContainerId, u32, u32), ChunkLoc>,
    table: &ContainerTable,
) {
    let old_table = std::mem::take(&mut recipe.containers);
    let mut new_index: HashMap<ContainerId, u32> = HashMap::new();
    let mut intern = |id: ContainerId, containers: &mut Vec<ContainerId>| -> u32 {
        *new_index.entry(id).or_insert_with(|| {
            containers.push(id);
            containers.len() as u32 - 1
        })
    };
    let mut containers = Vec::new();
    for n in &mut recipe.nodes {
        for s in &mut n.segments {
            for c in &mut s.chunks {
                if !c.is_direct() {
                    continue;
                }
                let Some(&cid) = old_table.get(c.container as usize) else {
                    continue;
                };
                match moved.get(&(cid, c.region, c.offset)) {
                    Some(loc) if rewritten.contains(&cid) => {
                        c.container = intern(table.get(loc.container), &mut containers);
                        c.region = loc.region;
                        c.offset = loc.offset;
                    }
                    _ => c.container = intern(cid, &mut containers),
                }
            }
        }
    }
    recipe.containers = containers;
}

/// Runs mark-and-sweep garbage collection.
pub fn gc(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    let _lock = lock::acquire(repo, true, "gc")?;
    gc_locked(repo, opts)
}

pub(crate) fn gc_locked(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let idx = RepoIndex::load_summaries(repo)?;
    report.containers_before = idx.containers.len() as u64;
    report.bytes_before = idx.stored_bytes();

    // Stamped containers whose owner is gone, or does not use them (an
    // interrupted maintain or rebase left them).
    let snaps = repo.list_snapshots()?;
    let mut used_stamped: HashSet<ContainerId> = HashSet::new();
    for (_, s) in &snaps {
        if s.archival.is_some() {
            used_stamped.extend(repo.load_recipe(&s.recipe)?.containers);
        }
    }
    let stale: HashSet<ContainerId> = idx
        .containers
        .iter()
        .filter(|(id, c)| c.stamp.is_some() && !used_stamped.contains(*id))
        .map(|(id, _)| *id)
        .collect();
    report.stamped_deleted = stale.len() as u64;
    let stale_bytes: u64 = stale
        .iter()
        .filter_map(|c| idx.containers.get(c))
        .map(|c| c.data_len)
        .sum();

    let indexed: HashSet<_> = idx.containers.keys().copied().collect();
    let mut orphans = Vec::new();
    for o in repo
        .backend()
        .list("data/")?
        .into_iter()
        .chain(repo.backend().list("meta/")?)
    {
        if let Some(id) = container_id_of(&o.name) {
            if !indexed.contains(&id) {
                orphans.push(o.name);
            }
        }
    }
    report.orphans_deleted = orphans.len() as u64;

    if !opts.dry_run && !stale.is_empty() {
        edit_index(repo, &idx, &stale, vec![])?;
        delete_containers(repo, stale.iter())?;
    }
    compact_pool(repo, Scope::All, opts, &mut report)?;
    report.bytes_freed += stale_bytes;
    if !opts.dry_run {
        for o in &orphans {
            repo.backend().delete(o)?;
        }
        // Recipes no snapshot uses (left by interrupted commands).
        let used: HashSet<String> = repo
            .list_snapshots()?
            .into_iter()
            .map(|(_, s)| format!("recipes/{}", s.recipe))
            .collect();
        for o in repo.backend().list("recipes/")? {
            if !used.contains(&o.name) {
                repo.backend().delete(&o.name)?;
                report.recipes_deleted += 1;
            }
        }
        // One pool index object (and one per stamp owner) from here on.
        consolidate_index(repo)?;
    }
    report.bytes_after = report.bytes_before.saturating_sub(report.bytes_freed);
    if !opts.dry_run {
        report.bytes_after = RepoIndex::load_summaries(repo)?.stored_bytes();
    }
    Ok(report)
}

/// Rewrites the index as one object for the pool and one per stamp owner
/// (cheaper loading after many backups; expiry touches only its owner's).
fn consolidate_index(repo: &Repository) -> Result<()> {
    let mut metas = Vec::new();
    let idx = RepoIndex::load(repo, |m| metas.push(m.clone()))?;
    let written: HashSet<String> = crate::index::write_by_owner(repo, metas)?
        .into_iter()
        .collect();
    for o in &idx.objects {
        if !written.contains(o) {
            crate::index::delete_index_object(repo, o)?;
        }
    }
    crate::index::sweep_summaries(repo)?;
    Ok(())
}

/// Rebuilds the index objects from the containers' metadata (or, where a
/// metadata object is missing or damaged, from the data object itself).
pub fn repair_index(repo: &Repository) -> Result<(u64, Vec<String>)> {
    let _lock = lock::acquire(repo, true, "repair index")?;
    let mut metas = Vec::new();
    let mut problems = Vec::new();
    for o in repo.backend().list("data/")? {
        let Some(id) = container_id_of(&o.name) else {
            continue;
        };
        match read_meta(repo, &id).or_else(|_| crate::container::read_meta_from_data(repo, &id)) {
            Ok(m) => metas.push(m),
            Err(e) => problems.push(format!("{}: {e} (skipped)", o.name)),
        }
    }
    let old = repo.backend().list("index/")?;
    let n = metas.len() as u64;
    let new_name = if metas.is_empty() {
        None
    } else {
        Some(crate::index::put_index_object(repo, metas)?.0)
    };
    for o in old {
        if Some(&o.name) != new_name.as_ref() {
            crate::index::delete_index_object(repo, &o.name)?;
        }
    }
    // Group by stamp owner again, so expiry stays a matter of its own objects.
    consolidate_index(repo)?;
    Ok((n, problems))
}
