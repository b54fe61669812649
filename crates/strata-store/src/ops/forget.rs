//! Forgetting versions (docs/design.md "Lifecycle": expiry by stamp).
//!
//! A removed archival version's stamped containers go at once, found by
//! their stamp without scanning anything; what removed versions referenced
//! in the shared pool is freed by the next compaction (`maintain`, `gc`).
//! Survivors whose indirect references lead through a removed version are
//! *rebased* first.

use crate::engine::copy::{copy_chunks, delete_containers, region_cache, CopySource, Placed};
use crate::error::{Result, StoreError};
use crate::repo::index::{edit_index, RepoIndex};
use crate::repo::lock;
use crate::repo::recipe::refs::{rewrite_pieces, Target};
use crate::repo::recipe::writer::RecipeWriter;
use crate::repo::Repository;
use std::collections::{HashMap, HashSet};
use strata_core::format::{Archival, ChunkRef, ContainerId, Snapshot, Stamp};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::Fingerprint;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ForgetReport {
    pub removed_snapshots: Vec<String>,
    pub removed_recipes: u64,
    /// Archival versions whose indirect references led into a removed
    /// version and were re-pointed (copying what only its stamped
    /// containers held).
    pub rebased: Vec<String>,
    /// Stamped containers deleted with their owners, and their bytes.
    pub stamped_containers_deleted: u64,
    pub stamped_bytes_freed: u64,
}

/// Removes snapshots (by id). An archival version's stamped containers go
/// at once, without scanning; what removed versions held in the shared
/// pool is freed by the next compaction (`maintain` or `gc`).
pub fn forget(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let _lock = lock::acquire(repo, true, "forget")?;
    forget_locked(repo, ids)
}

pub(crate) fn forget_locked(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    // A damaged snapshot object can only be dropped: its recipe and data
    // are unknown, and go at the next gc. Everything is checked before
    // anything is deleted, so a refusal changes nothing.
    let damaged_ids: HashSet<&str> = damaged.iter().map(|(id, _)| id.as_str()).collect();
    let (drop, ids): (Vec<String>, Vec<String>) = ids
        .iter()
        .cloned()
        .partition(|id| damaged_ids.contains(id.as_str()));
    // Unreadable snapshots not named block the rest: their chains are
    // unknown.
    if let Some((bad, _)) = damaged.iter().find(|(id, _)| !drop.contains(id)) {
        if !ids.is_empty() {
            return Err(StoreError::Invalid(format!(
                "snapshot {bad} cannot be read; forget it first (`strata forget {bad}`)"
            )));
        }
    }
    let ids = &ids[..];
    let by_id: HashMap<&str, &Snapshot> = all.iter().map(|(i, s)| (i.as_str(), s)).collect();
    for id in ids {
        match by_id.get(id.as_str()) {
            None => return Err(StoreError::NoSnapshot(id.clone())),
            Some(s) if s.tier == strata_core::format::Tier::Cloud => {
                return Err(StoreError::Invalid(format!(
                    "snapshot {id} is in the cloud tier: forgetting it removes it from the bucket too \
                     (`strata forget` does, with the cloud tier reachable)"
                )))
            }
            Some(_) => {}
        }
    }
    let mut report = ForgetReport::default();
    for id in drop {
        repo.backend().delete(&format!("snapshots/{id}"))?;
        report.removed_snapshots.push(id);
    }
    let removing: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let idx = RepoIndex::load_summaries(repo)?;
    let pool: HashSet<ContainerId> = idx
        .containers
        .iter()
        .filter(|(_, c)| c.stamp.is_none())
        .map(|(id, _)| *id)
        .collect();

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
            rebase(repo, uid, u, &by_id, &removing, &pool)?;
            report.rebased.push(uid.to_string());
        }
    }

    let mut dropped_recipes = HashSet::new();
    for id in ids {
        repo.backend().delete(&format!("snapshots/{id}"))?;
        dropped_recipes.extend(by_id[id.as_str()].recipes().cloned());
        report.removed_snapshots.push(id.clone());
    }
    // From the snapshots as they are now: a rebase above may have given a
    // survivor a recipe object that a removed version also used.
    let (now, _) = repo.list_snapshots_tolerant()?;
    let still: HashSet<&RecipeId> = now
        .iter()
        .filter(|(i, _)| !removing.contains(i.as_str()))
        .flat_map(|(_, s)| s.recipes())
        .collect();
    let dropped: Vec<RecipeId> = dropped_recipes
        .into_iter()
        .filter(|r| !still.contains(r))
        .collect();
    report.removed_recipes += crate::repo::recipe::delete_unused(repo, &dropped)?;

    // Stamped containers of the removed versions: found in the index by
    // their stamp, deleted without looking at anything else.
    let idx = RepoIndex::load_summaries(repo)?;
    let owned: HashSet<ContainerId> = ids.iter().flat_map(|id| idx.stamped_by(id)).collect();
    if !owned.is_empty() {
        report.stamped_bytes_freed = owned
            .iter()
            .filter_map(|c| idx.containers.get(c))
            .map(|c| c.data_bytes())
            .sum();
        report.stamped_containers_deleted = owned.len() as u64;
        edit_index(repo, &idx, &owned, vec![])?;
        delete_containers(repo, owned.iter())?;
    }
    Ok(report)
}

/// Re-points an archival version whose next version is being removed: its
/// indirect references are followed through the removed versions.
///
/// Chunks found direct in the removed versions' *pool* containers are
/// referenced where they are (the pool keeps what any version references);
/// chunks found in their *stamped* containers, which go with them, are
/// copied. When a newer version survives, the copies go into new
/// containers stamped with this version and the rest stay indirect to the
/// first survivor. When none survives, the version becomes the newest of
/// its series and returns to live form: its own stamped chunks and the
/// removed ones' are copied into the pool (a live-form version references
/// only the pool), so forgetting the newest version stays cheap.
fn rebase(
    repo: &Repository,
    uid: &SnapshotId,
    u: &Snapshot,
    by_id: &HashMap<&str, &Snapshot>,
    removing: &HashSet<&str>,
    pool: &HashSet<ContainerId>,
) -> Result<()> {
    // The version's recipe is read a part at a time (what it wants, what
    // it holds of its own when it returns to live form, then rewritten):
    // a disk image's version is never held whole.
    let (mut want, own_stamped) = wanted(repo, u, pool)?;
    // Direct references met in removed versions.
    let (found, next) = follow_chain(repo, u, by_id, removing, &mut want)?;
    if next.is_none() && !want.is_empty() {
        return Err(broken(
            u,
            format!(
                "{} indirect chunks are held by no remaining version",
                want.len()
            ),
        ));
    }
    let revive = next.is_none();
    let (in_pool, mut sources): (Vec<CopySource>, Vec<CopySource>) =
        found.into_iter().partition(|s| pool.contains(&s.container));
    let in_pool: HashMap<Fingerprint, CopySource> =
        in_pool.into_iter().map(|s| (s.fp, s)).collect();
    if revive {
        // Its own stamped chunks move to the pool.
        own_stamped_sources(repo, u, pool, &in_pool, &mut sources)?;
    }
    let placed = copy_sources(repo, uid, u, revive, &sources)?;

    let rebased = |c: &ChunkRef, cid: Option<ContainerId>| {
        let moved = c.is_indirect() || (revive && cid.is_some_and(|id| !pool.contains(&id)));
        if !moved {
            return Ok(Target::Keep);
        }
        if let Some(p) = in_pool.get(&c.fp) {
            return Ok(Target::At(p.container, p.region, p.offset));
        }
        match placed.get(&c.fp) {
            Some((cid, loc)) => Ok(Target::At(*cid, loc.region, loc.offset)),
            None if revive => Err(broken(
                u,
                format!(
                    "chunk {} could not be placed while returning to live form",
                    c.fp.to_hex()
                ),
            )),
            // Held by the first surviving version.
            None => Ok(Target::Keep),
        }
    };
    let (rid, counts) = rewrite_recipe(repo, u, next, rebased)?;
    switch_recipe(repo, uid, u, rid, (!revive).then_some(counts), by_id)?;
    if revive {
        delete_own_stamped(repo, uid, own_stamped)?;
    }
    Ok(())
}

/// The error for version `u` whose chain of references cannot be followed.
fn broken(u: &Snapshot, detail: String) -> StoreError {
    StoreError::BrokenChain {
        snapshot: format!("{}@{}", u.series, u.version),
        detail,
    }
}

/// The chunks `u` references indirectly, and the containers outside the
/// pool its recipe names (its own stamped ones).
fn wanted(
    repo: &Repository,
    u: &Snapshot,
    pool: &HashSet<ContainerId>,
) -> Result<(HashSet<Fingerprint>, Vec<ContainerId>)> {
    let mut want: HashSet<Fingerprint> = HashSet::new();
    let table = crate::repo::recipe::for_each_segment(repo, &u.recipe, |sg, _| {
        want.extend(sg.chunks.iter().filter(|c| c.is_indirect()).map(|c| c.fp));
        Ok(())
    })?;
    let own_stamped: Vec<ContainerId> = table
        .iter()
        .filter(|c| !pool.contains(c))
        .copied()
        .collect();
    Ok((want, own_stamped))
}

/// Follows `u`'s chain through the removed versions, taking out of `want`
/// the chunks they reference directly: those references, and the first
/// surviving version of the chain (`None`: no newer version survives).
fn follow_chain(
    repo: &Repository,
    u: &Snapshot,
    by_id: &HashMap<&str, &Snapshot>,
    removing: &HashSet<&str>,
    want: &mut HashSet<Fingerprint>,
) -> Result<(Vec<CopySource>, Option<SnapshotId>)> {
    let mut found: Vec<CopySource> = Vec::new();
    let mut next = u.archival.as_ref().and_then(|a| a.next.clone());
    let mut visited = HashSet::new();
    while let Some(id) = next.clone() {
        if !removing.contains(id.as_str()) || want.is_empty() {
            break;
        }
        if !visited.insert(id.clone()) {
            return Err(broken(u, format!("the chain loops at snapshot {id}")));
        }
        let x = by_id
            .get(id.as_str())
            .ok_or_else(|| broken(u, format!("snapshot {id} is missing")))?;
        crate::repo::recipe::for_each_segment(repo, &x.recipe, |sg, table| {
            for c in &sg.chunks {
                if c.is_direct() && want.remove(&c.fp) {
                    found.push(CopySource::of_snapshot(table, c, &id)?);
                }
            }
            Ok(())
        })?;
        next = x.archival.as_ref().and_then(|a| a.next.clone());
    }
    let next = next.filter(|n| !removing.contains(n.as_str()));
    Ok((found, next))
}

/// Adds to `sources` the chunks `u` holds directly outside the pool (and
/// not found in it), once each: what it takes back into the pool.
fn own_stamped_sources(
    repo: &Repository,
    u: &Snapshot,
    pool: &HashSet<ContainerId>,
    in_pool: &HashMap<Fingerprint, CopySource>,
    sources: &mut Vec<CopySource>,
) -> Result<()> {
    let mut seen = HashSet::new();
    crate::repo::recipe::for_each_segment(repo, &u.recipe, |sg, table| {
        for c in sg.chunks.iter().filter(|c| c.is_direct()) {
            let Some(src) = CopySource::of(table, c) else {
                continue;
            };
            if !pool.contains(&src.container) && !in_pool.contains_key(&c.fp) && seen.insert(c.fp) {
                sources.push(src);
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// Copies `sources` into new containers (stamped with `u`, unless it
/// returns to live form) and indexes them: where each chunk went.
fn copy_sources(
    repo: &Repository,
    uid: &SnapshotId,
    u: &Snapshot,
    revive: bool,
    sources: &[CopySource],
) -> Result<Placed> {
    let stamp = (!revive).then(|| Stamp {
        owner: uid.to_string(),
        time_ns: u.time_ns,
    });
    let regions = region_cache(repo);
    let (placed, metas) = copy_chunks(repo, &regions, sources, stamp, None)?;
    let idx = RepoIndex::load_summaries(repo)?;
    edit_index(repo, &idx, &HashSet::new(), metas)?;
    Ok(placed)
}

/// Stores `u`'s recipe again with its references re-pointed by `rebased`:
/// the new recipe's id, and its tallies as an archival version before `next`.
fn rewrite_recipe(
    repo: &Repository,
    u: &Snapshot,
    next: Option<SnapshotId>,
    rebased: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<(RecipeId, Archival)> {
    let mut counts = Archival {
        next,
        converted_ns: u
            .archival
            .as_ref()
            .map(|a| a.converted_ns)
            .unwrap_or_default(),
        released_bytes: u.archival.as_ref().map_or(0, |a| a.released_bytes),
        ..Default::default()
    };
    let mut w = RecipeWriter::new(repo);
    rewrite_pieces(repo, &u.recipe, rebased, |n, table| {
        for c in n.segments.iter().flat_map(|s| &s.chunks) {
            count_ref(&mut counts, c);
        }
        w.push(n, |i| table.get(i as usize).copied())
    })?;
    let (rid, _) = w.finish()?;
    Ok((rid, counts))
}

/// Commits `u` with recipe `rid` and `archival`, then deletes its old
/// recipe object unless another snapshot uses it.
fn switch_recipe(
    repo: &Repository,
    uid: &SnapshotId,
    u: &Snapshot,
    rid: RecipeId,
    archival: Option<Archival>,
    by_id: &HashMap<&str, &Snapshot>,
) -> Result<()> {
    let mut nu = u.clone();
    let old_recipe = std::mem::replace(&mut nu.recipe, rid);
    nu.archival = archival;
    // The switch; after it the old stamped containers are unreferenced.
    repo.replace_snapshot(uid, &nu)?;
    if old_recipe != nu.recipe
        && !by_id
            .iter()
            .any(|(id, s)| *id != uid.as_str() && s.recipe == old_recipe)
    {
        crate::repo::recipe::delete_unused(repo, [&old_recipe])?;
    }
    Ok(())
}

/// Deletes those of `own_stamped` still stamped with `uid`, from the index
/// first (a version back in live form references only the pool).
fn delete_own_stamped(repo: &Repository, uid: &str, own_stamped: Vec<ContainerId>) -> Result<()> {
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
