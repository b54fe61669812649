//! Pool compaction: RevDedup's two-level reference management and chunk
//! removal (§2.4.2, §2.4.3), shared by `maintain` and `gc`.
//!
//! The *pool* (unstamped containers) keeps every chunk location that some
//! version references directly — a live-form version (whole segments, for
//! segment dedup) or an archival one (the chunks reverse dedup left
//! direct). That is the paper's per-chunk direct-reference flag, derived by
//! marking: a chunk is removable exactly when no retained version of any
//! series references its location. So reverse dedup never copies anything
//! and can never make the repository grow: a chunk another series still
//! holds simply stays where it is.
//!
//! Compaction drops containers nothing references and copies forward the
//! live chunks of containers whose dead fraction is above a threshold.
//! While copying, a chunk that exactly one archival version references
//! (and no live one) moves into a container *stamped* with that version
//! (§2.5), so expiring it later deletes the container without scanning;
//! `separate` also rewrites containers that are mostly such chunks, which
//! keeps the newest versions' containers dense.
//!
//! Marking is by location — (container, region, offset) of every direct
//! reference — not by fingerprint, so a whole segment stays whole where it
//! is even when one of its chunks is also stored elsewhere. Whatever moves
//! chunks rewrites the recipes that point at them, so references stay
//! exact.
//!
//! Order for crash safety: new containers → index objects → recipes and
//! snapshot objects → old index objects deleted → old containers deleted.
//! A kill at any point leaves every snapshot restorable; what it leaves
//! behind is unreferenced and removed by the next compaction or gc.

use super::options::{GcOptions, GcReport};
use crate::engine::copy::delete_containers;
use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::engine::writer::{ContainerSink, ContainerWriter, SinkResult};
use crate::error::{Result, StoreError};
use crate::repo::index::{edit_index, RepoIndex};
use crate::repo::recipe::refs::{store_rewritten, Target};
use crate::repo::region::read_region;
use crate::repo::{data_name, Repository};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{ChunkRef, ContainerId, ContainerMeta, Snapshot, Stamp};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::Fingerprint;

/// Live chunk locations: per container, the (region, offset) pairs that
/// direct references point at.
pub type Marks = HashMap<ContainerId, HashSet<(u32, u32)>>;

/// Marks the direct references of every snapshot.
pub fn mark_live(repo: &Repository) -> Result<Marks> {
    let mut marks: Marks = HashMap::new();
    let mut seen_recipes = HashSet::new();
    for (_, s) in repo.list_active_snapshots()? {
        if !seen_recipes.insert(s.recipe.clone()) {
            continue;
        }
        crate::repo::recipe::for_each_segment(repo, &s.recipe, |sg, table| {
            for c in &sg.chunks {
                if let (true, Some(cid)) = (c.is_direct(), table.get(c.container as usize)) {
                    marks.entry(*cid).or_default().insert((c.region, c.offset));
                }
            }
            Ok(())
        })?;
    }
    Ok(marks)
}

/// Who references a chunk location directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    /// A live-form version, or several versions: the chunk stays in the pool.
    Shared,
    /// Exactly one archival version (an index into [`Holders::owners`]).
    Only(u32),
}

/// Every snapshot's direct references, by location, with their holders.
struct Holders {
    marks: HashMap<ContainerId, HashMap<(u32, u32), Holder>>,
    /// Archival versions holding chunks alone: snapshot id and stamp.
    owners: Vec<Stamp>,
    /// Containers each recipe points at, to find the ones to remap.
    uses: HashMap<RecipeId, Vec<ContainerId>>,
}

impl Holders {
    fn collect(repo: &Repository, snaps: &[(SnapshotId, Snapshot)]) -> Result<Self> {
        let mut by_recipe: BTreeMap<&RecipeId, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
        for s in snaps {
            by_recipe.entry(&s.1.recipe).or_default().push(s);
        }
        let mut h = Holders {
            marks: HashMap::new(),
            owners: Vec::new(),
            uses: HashMap::new(),
        };
        for (rid, users) in by_recipe {
            let holder = match users.as_slice() {
                [(id, s)] if s.archival.is_some() => {
                    h.owners.push(Stamp {
                        owner: id.to_string(),
                        time_ns: s.time_ns,
                    });
                    Holder::Only(h.owners.len() as u32 - 1)
                }
                _ => Holder::Shared,
            };
            let marks = &mut h.marks;
            let table = crate::repo::recipe::for_each_segment(repo, rid, |sg, table| {
                for c in &sg.chunks {
                    let Some(cid) = c.is_direct().then(|| table.get(c.container as usize)) else {
                        continue;
                    };
                    let Some(cid) = cid else { continue };
                    let slot = marks.entry(*cid).or_default();
                    slot.entry((c.region, c.offset))
                        .and_modify(|x| {
                            if *x != holder {
                                *x = Holder::Shared
                            }
                        })
                        .or_insert(holder);
                }
                Ok(())
            })?;
            h.uses.insert(rid.clone(), table);
        }
        Ok(h)
    }

    /// The holder of each chunk of a container (`None`: dead).
    fn of(&self, m: &ContainerMeta) -> Vec<Option<Holder>> {
        let set = self.marks.get(&m.id);
        m.chunks
            .iter()
            .map(|c| set.and_then(|s| s.get(&(c.region, c.offset)).copied()))
            .collect()
    }
}

/// A pool container to copy forward, with the holder of each chunk.
struct Rewrite {
    meta: ContainerMeta,
    holders: Vec<Option<Holder>>,
}

/// Compacts the shared pool: containers with nothing marked are dropped;
/// those with a dead fraction above `opts.threshold`, or with more than
/// `opts.separate` of their bytes dead or held by one archival version
/// alone, have their live chunks copied forward (whole segments stay
/// whole, so segment dedup keeps finding them; single-holder chunks go to
/// the holder's stamped containers); the recipes pointing at moved chunks
/// are rewritten.
pub fn compact_pool(repo: &Repository, opts: &GcOptions, report: &mut GcReport) -> Result<()> {
    let snaps = repo.list_active_snapshots()?;
    let holders = Holders::collect(repo, &snaps)?;
    report.live_chunks += holders.marks.values().map(|m| m.len() as u64).sum::<u64>();
    let (idx, drop, rewrite) = select(repo, opts, &holders, report)?;
    let freed_drop: u64 = drop.iter().map(|m| m.data_bytes()).sum();
    let progress = &opts.progress;
    progress.bytes_total.fetch_add(
        rewrite.iter().map(|r| r.meta.data_len).sum(),
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
    let (moved, written) = copy_all(repo, opts, &holders.owners, &rewrite, &table, report)?;
    report.containers_written += written.metas.len() as u64;
    let added: u64 = written.metas.iter().map(|m| m.data_bytes()).sum();

    let old: HashSet<ContainerId> = drop
        .iter()
        .map(|m| m.id)
        .chain(rewrite.iter().map(|r| r.meta.id))
        .collect();
    // The copies join the index before any recipe points at them, and the
    // originals leave it only after no recipe does: a kill in between
    // leaves both indexed, and the next gc sorts out which is referenced.
    edit_index(repo, &idx, &HashSet::new(), written.metas)?;

    // Point the recipes at the new copies, one recipe object at a time
    // (snapshots with identical recipes share one object).
    let rewritten: HashSet<ContainerId> = rewrite.iter().map(|r| r.meta.id).collect();
    let users = recipe_users(&snaps, &holders.uses, &rewritten);
    remap_users(repo, users, &rewritten, &moved, &table, report)?;
    let freed_rewrite: u64 = rewrite.iter().map(|r| r.meta.data_bytes()).sum();
    edit_index(repo, &idx, &old, vec![])?;
    delete_containers(repo, old.iter())?;
    report.bytes_freed += (freed_drop + freed_rewrite).saturating_sub(added);
    Ok(())
}

/// What compaction does with one pool container.
enum Verdict {
    Keep,
    Drop,
    Rewrite,
    /// Kept but filled less than half: its live bytes, to merge.
    Small(u64),
}

/// Decides the fate of pool container `m`, given the holder of each of
/// its chunks and `target`, the container size.
fn verdict(m: &ContainerMeta, of: &[Option<Holder>], opts: &GcOptions, target: u64) -> Verdict {
    let (mut shared, mut only) = (0u64, 0u64);
    for (c, h) in m.chunks.iter().zip(of) {
        match h {
            Some(Holder::Shared) => shared += c.len as u64,
            Some(Holder::Only(_)) => only += c.len as u64,
            None => {}
        }
    }
    let raw = m.raw_bytes().max(1);
    let live = shared + only;
    if let Some(these) = &opts.only {
        return match (these.contains(&m.id), live) {
            (false, _) => Verdict::Keep,
            (true, 0) => Verdict::Drop,
            (true, _) => Verdict::Rewrite,
        };
    }
    if live == 0 {
        Verdict::Drop
    } else if (raw - live) as f64 / raw as f64 > opts.threshold
        || (raw - shared) as f64 / raw as f64 > opts.separate
    {
        Verdict::Rewrite
    } else if live < target / 2 {
        Verdict::Small(live)
    } else {
        Verdict::Keep
    }
}

/// Loads the index and picks the pool containers to drop and to rewrite
/// (oldest first), counting them in `report`.
fn select(
    repo: &Repository,
    opts: &GcOptions,
    holders: &Holders,
    report: &mut GcReport,
) -> Result<(RepoIndex, Vec<ContainerMeta>, Vec<Rewrite>)> {
    // Every pool container is examined as the index loads (metadata only;
    // only those to drop or rewrite are kept).
    let mut drop: Vec<ContainerMeta> = Vec::new();
    let mut rewrite: Vec<Rewrite> = Vec::new();
    // Kept containers filled less than half: every backup leaves a couple
    // (one per worker), and a restore pays per container it opens.
    let target = repo.config().container_size as u64;
    let mut small: Vec<(Rewrite, u64)> = Vec::new();
    // The bases live deltas need, by container: marked live too, and
    // their containers never moved (docs/design.md "Delta compression").
    let mut bases: HashMap<ContainerId, HashSet<(u32, u32)>> = HashMap::new();
    let idx = RepoIndex::load(repo, |m| {
        if m.stamp.is_some() {
            return;
        }
        let of = holders.of(m);
        if !m.deltas.is_empty() {
            for (b, h) in m.chunk_bases().into_iter().zip(&of) {
                if let (Some(b), Some(_)) = (b, h) {
                    bases
                        .entry(b.container)
                        .or_default()
                        .insert((b.region, b.offset));
                }
            }
        }
        let verdict = verdict(m, &of, opts, target);
        let r = Rewrite {
            meta: m.clone(),
            holders: of,
        };
        match verdict {
            Verdict::Keep => {}
            Verdict::Drop => drop.push(r.meta),
            Verdict::Rewrite => rewrite.push(r),
            Verdict::Small(live) => small.push((r, live)),
        }
    })?;
    // A container holding a live delta's base stays as it is.
    let pinned = |m: &ContainerMeta| bases.contains_key(&m.id);
    report.containers_pinned += drop.iter().filter(|m| pinned(m)).count() as u64
        + rewrite.iter().filter(|r| pinned(&r.meta)).count() as u64;
    drop.retain(|m| !pinned(m));
    rewrite.retain(|r| !pinned(&r.meta));
    small.retain(|(r, _)| !pinned(&r.meta));
    report.live_chunks += bases.values().map(|s| s.len() as u64).sum::<u64>();
    // Merge the small ones once there are [`SMALL_TO_MERGE`] of them and
    // together they fill at least half a container, so the output is not
    // small again (each byte is merged about once, not at every run, and
    // a prune after a few backups does not rewrite their leftovers).
    let small_bytes: u64 = small.iter().map(|x| x.1).sum();
    if small.len() >= SMALL_TO_MERGE && small_bytes >= target / 2 {
        report.containers_merged += small.len() as u64;
        rewrite.extend(small.into_iter().map(|(r, _)| r));
    }
    // Oldest first: the copies keep roughly the order backups wrote.
    rewrite.sort_by_key(|r| (r.meta.created, r.meta.id));
    report.containers_deleted += drop.len() as u64;
    report.containers_rewritten += rewrite.len() as u64;
    Ok((idx, drop, rewrite))
}

/// Small containers (filled less than half) that gc merges at once: every
/// backup leaves about one per worker; a few cost a restore little, while
/// merging them costs a decryption, a compression and a write of each.
pub const SMALL_TO_MERGE: usize = 8;

/// Where copied-forward chunks went, by their former (container, region, offset).
type Moved = HashMap<(ContainerId, u32, u32), ChunkLoc>;

/// Copies the live chunks of the `rewrite` containers into new ones:
/// where each chunk went, and the containers written.
fn copy_all(
    repo: &Repository,
    opts: &GcOptions,
    owners: &[Stamp],
    rewrite: &[Rewrite],
    table: &Arc<ContainerTable>,
    report: &mut GcReport,
) -> Result<(Moved, SinkResult)> {
    let progress = &opts.progress;
    let sink = ContainerSink::start(repo);
    let mut moved: Moved = HashMap::new();
    let copy_result: Result<()> = (|| {
        let mut out = Outputs {
            pool: ContainerWriter::new(repo, table.clone(), sink.sender()),
            pool_last: None,
            stamped: HashMap::new(),
            make: &|| ContainerWriter::new(repo, table.clone(), sink.sender()),
            owners,
            separated: 0,
        };
        for r in rewrite {
            copy_forward(repo, &mut out, r, &mut moved)?;
            progress
                .bytes_done
                .fetch_add(r.meta.data_len, Ordering::Relaxed);
        }
        report.bytes_separated += out.separated;
        out.pool.flush()?;
        for (w, _) in out.stamped.values_mut() {
            w.flush()?;
        }
        Ok(())
    })();
    let written = sink.finish()?;
    copy_result?;
    Ok((moved, written))
}

/// The ids of the snapshots using each recipe that points into a
/// `rewritten` container, by recipe.
fn recipe_users<'s>(
    snaps: &'s [(SnapshotId, Snapshot)],
    uses: &HashMap<RecipeId, Vec<ContainerId>>,
    rewritten: &HashSet<ContainerId>,
) -> BTreeMap<&'s RecipeId, Vec<&'s SnapshotId>> {
    let mut users: BTreeMap<&RecipeId, Vec<&SnapshotId>> = BTreeMap::new();
    for (id, s) in snaps {
        let affected = uses
            .get(&s.recipe)
            .is_some_and(|cs| cs.iter().any(|c| rewritten.contains(c)));
        if affected {
            users.entry(&s.recipe).or_default().push(id);
        }
    }
    users
}

/// Stores each of `users`' recipes again pointing at the moved chunks,
/// switches its snapshots to it and deletes the old recipe object.
fn remap_users(
    repo: &Repository,
    users: BTreeMap<&RecipeId, Vec<&SnapshotId>>,
    rewritten: &HashSet<ContainerId>,
    moved: &Moved,
    table: &ContainerTable,
    report: &mut GcReport,
) -> Result<()> {
    for (rid, ids) in users {
        let (new_rid, _) = remap_recipe(repo, rid, rewritten, moved, table)?;
        for id in ids {
            let mut s = repo.load_snapshot(id)?;
            s.recipe = new_rid.clone();
            repo.replace_snapshot(id, &s)?;
        }
        if new_rid != *rid {
            crate::repo::recipe::delete_unused(repo, [rid])?;
        }
        report.recipes_remapped += 1;
    }
    Ok(())
}

/// Where copied-forward chunks go: the pool, or the stamped containers of
/// the archival version that alone holds them.
struct Outputs<'a> {
    pool: ContainerWriter,
    /// The source region the pool writer's current region comes from.
    pool_last: Option<(ContainerId, u32)>,
    stamped: HashMap<u32, (ContainerWriter, Option<(ContainerId, u32)>)>,
    make: &'a dyn Fn() -> ContainerWriter,
    owners: &'a [Stamp],
    /// Plaintext bytes moved into stamped containers.
    separated: u64,
}

impl Outputs<'_> {
    /// Appends a chunk read from `source` (container, region) for holder
    /// `h`, starting a new region whenever the source region changes.
    fn put(
        &mut self,
        h: Holder,
        source: (ContainerId, u32),
        fp: Fingerprint,
        data: &[u8],
    ) -> Result<ChunkLoc> {
        let (w, last) = match h {
            Holder::Shared => (&mut self.pool, &mut self.pool_last),
            Holder::Only(o) => {
                let (make, owners) = (self.make, self.owners);
                let e = self.stamped.entry(o).or_insert_with(|| {
                    let mut w = make();
                    w.set_stamp(owners.get(o as usize).cloned());
                    (w, None)
                });
                (&mut e.0, &mut e.1)
            }
        };
        if *last != Some(source) {
            w.end_region()?;
            *last = Some(source);
        }
        let loc = w.next_loc(data.len())?;
        w.append(fp, data);
        Ok(loc)
    }
}

/// Copies the live chunks of one container: segments whose chunks all stay
/// in the pool are packed whole again, other live chunks one by one, each
/// to the pool or to its single holder's stamped containers.
fn copy_forward(
    repo: &Repository,
    out: &mut Outputs,
    r: &Rewrite,
    moved: &mut HashMap<(ContainerId, u32, u32), ChunkLoc>,
) -> Result<()> {
    let m = &r.meta;
    let name = data_name(&m.id);
    let mut plains: HashMap<u32, Vec<u8>> = HashMap::new();
    let needed: BTreeSet<u32> = m
        .chunks
        .iter()
        .zip(&r.holders)
        .filter(|(_, h)| h.is_some())
        .map(|(c, _)| c.region)
        .collect();
    for reg in needed {
        let info = m.regions.get(reg as usize).ok_or_else(|| {
            StoreError::Invalid(format!("{name}: chunk in a region that does not exist"))
        })?;
        plains.insert(reg, read_region(repo, &m.id, info)?);
    }
    // Segment starting at each chunk index, when the whole segment stays
    // in the pool.
    let mut whole: HashMap<usize, (Fingerprint, usize)> = HashMap::new();
    for s in &m.segments {
        let (a, n) = (s.first_chunk as usize, s.chunks as usize);
        let all_shared = r
            .holders
            .get(a..a + n)
            .is_some_and(|h| h.iter().all(|x| *x == Some(Holder::Shared)));
        if n > 0 && all_shared {
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
            out.pool.begin_segment(bytes)?;
            for j in i..i + n {
                let c = &m.chunks[j];
                let loc = out.put(Holder::Shared, (m.id, c.region), c.fp, data_of(j)?)?;
                moved.insert((m.id, c.region, c.offset), loc);
            }
            let _ = out.pool.end_segment(fp, n as u32);
            i += n;
            continue;
        }
        if let Some(h) = r.holders[i] {
            let c = &m.chunks[i];
            if matches!(h, Holder::Only(_)) {
                out.separated += c.len as u64;
            }
            let loc = out.put(h, (m.id, c.region), c.fp, data_of(i)?)?;
            moved.insert((m.id, c.region, c.offset), loc);
        }
        i += 1;
    }
    Ok(())
}

/// Stores recipe `rid` again, a part at a time, with its direct references
/// into `rewritten` containers pointing at their copies.
fn remap_recipe(
    repo: &Repository,
    rid: &RecipeId,
    rewritten: &HashSet<ContainerId>,
    moved: &HashMap<(ContainerId, u32, u32), ChunkLoc>,
    table: &ContainerTable,
) -> Result<(RecipeId, u64)> {
    let remap = |c: &ChunkRef, cid: Option<ContainerId>| {
        Ok(match cid {
            Some(cid) if rewritten.contains(&cid) => match moved.get(&(cid, c.region, c.offset)) {
                Some(loc) => Target::At(table.get(loc.container), loc.region, loc.offset),
                None => Target::Keep,
            },
            _ => Target::Keep,
        })
    };
    store_rewritten(repo, rid, remap)
}
