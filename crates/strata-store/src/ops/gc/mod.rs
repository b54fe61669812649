//! Mark-and-sweep garbage collection (docs/design.md "Lifecycle": "mark-and-sweep
//! GC remains for what stamps cannot cover") and index repair.
//!
//! Data lives in two domains. The *pool* holds every chunk some version
//! references directly; it is shared by every series and cleaned by
//! marking ([`crate::ops::gc::compact`]). *Stamped* containers hold chunks that one
//! archival version alone references (RevDedup §2.5): older versions of its
//! series reach them through indirect references, so they are deleted
//! together with their owner without scanning anything
//! ([`crate::ops::forget`]). gc sweeps what neither covers: stamped containers
//! of owners that are gone, containers no index object lists, recipes no
//! snapshot uses.

pub mod compact;
pub mod options;

pub use options::{GcOptions, GcReport, TEMPORARY_AGE};

use crate::engine::copy::delete_containers;
use crate::error::{Result, StoreError};
use crate::repo::container::read_meta;
use crate::repo::index::{edit_index, RepoIndex};
use crate::repo::lock;
use crate::repo::{container_id_of, data_name, Repository};
use compact::compact_pool;
use std::collections::{HashMap, HashSet};
use strata_core::format::ContainerId;
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

/// Runs mark-and-sweep garbage collection. A dry run is the real thing
/// on a what-if copy of the repository ([`simulate`]): its figures are
/// exactly what a run would do.
pub fn gc(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    if opts.dry_run {
        let _lock = lock::acquire(repo, false, "gc --dry-run")?;
        return simulate(repo, opts, |_| Ok(()));
    }
    let _lock = lock::acquire(repo, true, "gc")?;
    let mut report = gc_locked(repo, opts)?;
    match repo.backend().sweep_temporaries(TEMPORARY_AGE) {
        Ok(swept) => {
            report.temporaries_deleted = swept.files;
            report.temporary_bytes_deleted = swept.bytes;
        }
        // (Space, not data: the collection itself is done.)
        Err(e) => tracing::warn!("deleting leftover temporary files: {e}"),
    }
    Ok(report)
}

/// What gc would do after `change` (run on a what-if copy of `repo`, such
/// as versions moved away or forgotten): gc itself runs on the copy, so
/// the report is exact to the byte, while `repo` is not touched. It reads
/// what a real run would read (the containers it copies forward) and
/// writes nothing. The caller holds a lock.
pub fn simulate(
    repo: &Repository,
    opts: &GcOptions,
    change: impl FnOnce(&Repository) -> Result<()>,
) -> Result<GcReport> {
    let what_if = repo.dry_run();
    change(&what_if)?;
    let mut o = opts.clone();
    o.dry_run = false;
    let mut report = gc_locked(&what_if, &o)?;
    report.dry_run = true;
    Ok(report)
}

/// A container no index object lists is garbage unless a snapshot needs
/// it: references chunks there that no listed container holds. (A gc
/// interrupted after re-indexing a rewritten container leaves recipes
/// pointing at the old one, whose chunks live on in the new: garbage.)
/// One that is needed means an index object is missing or damaged:
/// deleting it would lose data, so gc stops and says to run
/// `strata repair index`. Costs nothing unless a snapshot references an
/// unlisted container.
pub fn refuse_needed_orphans(repo: &Repository, orphans: &[String]) -> Result<()> {
    let orphan_ids: HashSet<ContainerId> =
        orphans.iter().filter_map(|n| container_id_of(n)).collect();
    if orphan_ids.is_empty() {
        return Ok(());
    }
    // Chunk references into orphans, and who makes them.
    let mut wanted: HashMap<Fingerprint, (ContainerId, SnapshotId)> = HashMap::new();
    for (sid, s) in repo.list_snapshots()? {
        for r in s.recipes() {
            let table = crate::repo::recipe::containers(repo, r)?;
            if !table.iter().any(|c| orphan_ids.contains(c)) {
                continue;
            }
            crate::repo::recipe::for_each_segment(repo, r, |sg, table| {
                for c in sg.chunks.iter().filter(|c| c.is_direct()) {
                    match table.get(c.container as usize) {
                        Some(cid) if orphan_ids.contains(cid) => {
                            wanted.insert(c.fp, (*cid, sid.clone()));
                        }
                        _ => {}
                    }
                }
                Ok(())
            })?;
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    RepoIndex::load(repo, |m| {
        for c in &m.chunks {
            wanted.remove(&c.fp);
        }
    })?;
    match wanted.values().next() {
        None => Ok(()),
        Some((cid, sid)) => Err(StoreError::Invalid(format!(
            "{} is in no index object but snapshot {} needs chunks only it holds: an index object is missing or damaged; run `strata repair index` before gc",
            data_name(cid),
            &sid[..8.min(sid.len())]
        ))),
    }
}

pub(crate) fn gc_locked(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let idx = RepoIndex::load_summaries(repo)?;
    report.containers_before = idx.containers.len() as u64;
    report.bytes_before = idx.stored_bytes();

    let stale = stale_stamped(repo, &idx)?;
    report.stamped_deleted = stale.len() as u64;
    let stale_bytes: u64 = stale
        .iter()
        .filter_map(|c| idx.containers.get(c))
        .map(|c| c.data_bytes())
        .sum();

    let indexed: HashSet<_> = idx.containers.keys().copied().collect();
    let orphans = unindexed(repo, &indexed)?;
    report.orphans_deleted = orphans.len() as u64;
    refuse_needed_orphans(repo, &orphans)?;

    if !opts.dry_run && !stale.is_empty() {
        edit_index(repo, &idx, &stale, vec![])?;
        delete_containers(repo, stale.iter())?;
    }
    compact_pool(repo, opts, &mut report)?;
    report.bytes_freed += stale_bytes;
    if !opts.dry_run {
        delete_orphans(repo, &orphans)?;
        release_gone_links(repo, &indexed)?;
        delete_unused_recipes(repo, &mut report)?;
        tidy_index(repo, &idx, &report)?;
        // Whatever the lifecycle released is collected now.
        crate::repo::lifecycle::store_state(repo, &Default::default())?;
    }
    report.bytes_after = report.bytes_before.saturating_sub(report.bytes_freed);
    if !opts.dry_run {
        report.bytes_after = RepoIndex::load_summaries(repo)?.stored_bytes();
        report.bytes_freed = report.bytes_before.saturating_sub(report.bytes_after);
    }
    Ok(report)
}

/// The stamped containers of `idx` that no archival version uses.
fn stale_stamped(repo: &Repository, idx: &RepoIndex) -> Result<HashSet<ContainerId>> {
    // Stamped containers whose owner is gone, or does not use them (an
    // interrupted maintain or rebase left them).
    let snaps = repo.list_active_snapshots()?;
    let mut used_stamped: HashSet<ContainerId> = HashSet::new();
    for (_, s) in &snaps {
        if s.archival.is_some() {
            used_stamped.extend(crate::repo::recipe::containers(repo, &s.recipe)?);
        }
    }
    Ok(idx
        .containers
        .iter()
        .filter(|(id, c)| c.stamp.is_some() && !used_stamped.contains(*id))
        .map(|(id, _)| *id)
        .collect())
}

/// The names of the container objects (data and metadata) of containers
/// not in `indexed`.
fn unindexed(repo: &Repository, indexed: &HashSet<ContainerId>) -> Result<Vec<String>> {
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
    Ok(orphans)
}

/// Deletes the orphaned container objects.
fn delete_orphans(repo: &Repository, orphans: &[String]) -> Result<()> {
    for o in orphans {
        match (o.starts_with("data/"), container_id_of(o)) {
            // A linked one gives its blocks back to its volume.
            (true, Some(id)) => crate::repo::links::delete_data(repo, &id)?,
            _ => repo.backend().delete(o)?,
        }
    }
    Ok(())
}

/// Releases and deletes the link markers of containers not in `indexed`.
fn release_gone_links(repo: &Repository, indexed: &HashSet<ContainerId>) -> Result<()> {
    // Markers of linked containers no longer there.
    for o in repo.backend().list("links/")? {
        let id = o
            .name
            .strip_prefix("links/")
            .and_then(ContainerId::from_hex);
        // (Their holds released first.)
        if let Some(id) = id.filter(|id| !indexed.contains(id)) {
            crate::repo::links::release_by_marker(repo, &id)?;
            repo.backend().delete(&o.name)?;
        }
    }
    Ok(())
}

/// Deletes the recipes no snapshot uses, then the recipe parts no
/// remaining recipe uses, counting them in `report`.
fn delete_unused_recipes(repo: &Repository, report: &mut GcReport) -> Result<()> {
    // Recipes no snapshot uses (left by interrupted commands), then
    // parts no remaining recipe uses.
    let snaps = repo.list_snapshots()?;
    let used: HashSet<String> = snaps
        .iter()
        .flat_map(|(_, s)| s.recipes())
        .map(|r| format!("recipes/{r}"))
        .collect();
    for o in repo.backend().list("recipes/")? {
        if !used.contains(&o.name) {
            repo.backend().delete(&o.name)?;
            report.recipes_deleted += 1;
        }
    }
    let parts = crate::repo::recipe::live_parts(repo, snaps.iter().flat_map(|(_, s)| s.recipes()))?;
    for o in repo
        .backend()
        .list(&format!("{}/", crate::repo::recipe::PARTS))?
    {
        let id = o.name.rsplit('/').next().unwrap_or_default();
        if !parts.contains(id) {
            repo.backend().delete(&o.name)?;
            report.parts_deleted += 1;
        }
    }
    Ok(())
}

/// Consolidates the index objects when the gc changed anything or there
/// are more than needed; otherwise sweeps leftover summaries.
fn tidy_index(repo: &Repository, idx: &RepoIndex, report: &GcReport) -> Result<()> {
    // One pool index object (and one per stamp owner) from here on —
    // unless it is so already and nothing changed (on a bucket,
    // rewriting the index is the bulk of a gc that found nothing).
    let changed = report.containers_deleted
        + report.containers_written
        + report.stamped_deleted
        + report.orphans_deleted
        > 0;
    if changed || idx.objects.len() > consolidated_objects(idx) {
        consolidate_index(repo)?;
    } else {
        // Summaries left by a crash between two deletes.
        crate::repo::index::sweep_summaries(repo)?;
    }
    Ok(())
}

/// How many index objects [`consolidate_index`] leaves for `idx`'s
/// containers, at most.
fn consolidated_objects(idx: &RepoIndex) -> usize {
    let mut groups: std::collections::HashMap<Option<&str>, usize> = Default::default();
    for c in idx.containers.values() {
        *groups
            .entry(c.stamp.as_ref().map(|s| s.owner.as_str()))
            .or_default() += (c.chunks as usize).max(1);
    }
    groups
        .values()
        .map(|n| n.div_ceil(crate::repo::index::MAX_INDEX_OBJECT_CHUNKS))
        .sum()
}

/// Rewrites the index as one object for the pool and one per stamp owner
/// (cheaper loading after many backups; expiry touches only its owner's).
fn consolidate_index(repo: &Repository) -> Result<()> {
    // Each container's metadata goes on to its owner's object as the index
    // is read (one object at a time): the index is never held whole.
    let mut w = crate::repo::index::ByOwner::new(repo);
    let mut failed = None;
    let idx = RepoIndex::load(repo, |m| {
        if failed.is_none() {
            failed = w.push(m.clone()).err();
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let written: HashSet<String> = w.finish()?.into_iter().collect();
    for o in &idx.objects {
        if !written.contains(o) {
            crate::repo::index::delete_index_object(repo, o)?;
        }
    }
    crate::repo::index::sweep_summaries(repo)?;
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
        match read_meta(repo, &id)
            .or_else(|_| crate::repo::container::read_meta_from_data(repo, &id))
        {
            Ok(m) => metas.push(m),
            Err(e) => problems.push(format!("{}: {e} (skipped)", o.name)),
        }
    }
    let old = repo.backend().list("index/")?;
    let n = metas.len() as u64;
    let new_name = if metas.is_empty() {
        None
    } else {
        Some(crate::repo::index::put_index_object(repo, metas)?.0)
    };
    for o in old {
        if Some(&o.name) != new_name.as_ref() {
            crate::repo::index::delete_index_object(repo, &o.name)?;
        }
    }
    // Group by stamp owner again, so expiry stays a matter of its own objects.
    consolidate_index(repo)?;
    Ok((n, problems))
}
