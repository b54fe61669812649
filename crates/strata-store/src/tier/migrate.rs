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

use super::select::{versions, Selection};
use crate::copy::{copy_chunks_between, region_cache, rewrite_refs, CopySource, Target};
use crate::error::{Result, StoreError};
use crate::index::{put_index_object, ContainerTable, ExactIndex, RepoIndex};
use crate::lock;
use crate::progress::Progress;
use crate::recipe;
use crate::repo::Repository;
use crate::resolver::resolver_for;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{ContainerId, Node, RegionInfo, Snapshot, Tier};

#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrateReport {
    pub versions: Vec<String>,
    /// Chunk references of the migrated versions, and their bytes.
    pub chunks: u64,
    pub logical_bytes: u64,
    /// Distinct chunks the cloud tier lacked, sent (uncompressed bytes)…
    pub chunks_sent: u64,
    pub raw_bytes_sent: u64,
    /// …and the containers written for them in the bucket.
    pub containers_written: u64,
    pub stored_bytes_sent: u64,
    /// Distinct chunks the cloud tier had already (not sent).
    pub chunks_deduplicated: u64,
    pub seconds: f64,
}

/// Refuses a selection that would leave an active version whose indirect
/// references lead into a migrated one (tiers never share chunks).
fn check_chains(all: &[(String, Snapshot)], chosen: &HashSet<&str>) -> Result<()> {
    for (id, s) in all {
        if chosen.contains(id.as_str()) || s.tier != Tier::Active {
            continue;
        }
        let next = s.archival.as_ref().and_then(|a| a.next.as_deref());
        if let Some(n) = next.filter(|n| chosen.contains(n)) {
            return Err(StoreError::Invalid(format!(
                "{}@{} ({}) keeps chunks in {} (its next version) and would lose them: \
                 select it too (older versions of a series move first), or forget it",
                s.series,
                s.version,
                &id[..8.min(id.len())],
                &n[..8.min(n.len())]
            )));
        }
    }
    Ok(())
}

/// Moves the versions `sel` selects from `local` to its cloud tier `cloud`.
pub fn migrate(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
) -> Result<MigrateReport> {
    let started = std::time::Instant::now();
    if !sel.paths.is_empty() {
        return Err(StoreError::Invalid(
            "migrate moves whole versions; paths only narrow `tier estimate`".into(),
        ));
    }
    let _local_lock = lock::acquire(local, true, "tier migrate")?;
    let _cloud_lock = lock::acquire(cloud, true, "tier migrate")?;
    let chosen = versions(local, sel, Tier::Active)?;
    let all = local.list_snapshots()?;
    let ids: HashSet<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();
    check_chains(&all, &ids)?;

    // The cloud tier's fingerprint index.
    let table = ContainerTable::default();
    let index = ExactIndex::default();
    RepoIndex::load(cloud, |m| index.add_chunks(&table, m))?;

    let mut report = MigrateReport::default();
    progress.bytes_total.store(
        chosen.iter().map(|(_, s)| s.stats.logical_bytes).sum(),
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);
    let regions = region_cache(local);
    // Oldest first: an older version's indirect references lead into the
    // newer ones, still active while it is resolved; and newer versions
    // deduplicate against what the older ones sent.
    for (vid, v) in &chosen {
        migrate_one(local, cloud, vid, v, &index, &table, &regions, &mut report)?;
        progress
            .bytes_done
            .fetch_add(v.stats.logical_bytes, Ordering::Relaxed);
    }
    report.versions = chosen.iter().map(|(id, _)| id.clone()).collect();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn migrate_one(
    local: &Repository,
    cloud: &Repository,
    vid: &str,
    v: &Snapshot,
    index: &ExactIndex,
    table: &ContainerTable,
    regions: &dyn Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>>,
    report: &mut MigrateReport,
) -> Result<()> {
    let mut r = local.load_recipe(&v.recipe)?;
    let nodes: Vec<&Node> = r.nodes.iter().collect();
    let resolver = resolver_for(local, v, &r, &nodes)?;
    // What the bucket lacks, read from wherever the active tier has it.
    let mut wanted = HashSet::new();
    let mut sources = Vec::new();
    for n in &r.nodes {
        for c in n.segments.iter().flat_map(|s| &s.chunks) {
            if c.is_zero() {
                continue;
            }
            report.chunks += 1;
            report.logical_bytes += c.len as u64;
            if !wanted.insert(c.fp) {
                continue;
            }
            if index.lookup(&c.fp).is_some() {
                report.chunks_deduplicated += 1;
                continue;
            }
            let at = resolver.resolve(c, &n.path_str())?;
            sources.push(CopySource {
                fp: c.fp,
                container: at.container,
                region: at.region_idx,
                offset: at.offset,
                len: c.len,
            });
        }
    }
    drop(nodes);
    let (_, metas) = copy_chunks_between(local, cloud, regions, &sources, None, None)?;
    report.chunks_sent += sources.len() as u64;
    report.raw_bytes_sent += sources.iter().map(|s| s.len as u64).sum::<u64>();
    report.containers_written += metas.len() as u64;
    report.stored_bytes_sent += metas.iter().map(|m| m.data_len).sum::<u64>();
    for m in &metas {
        index.add_chunks(table, m);
    }
    if !metas.is_empty() {
        put_index_object(cloud, metas)?;
    }

    // The version's recipe in the cloud tier: every reference direct.
    rewrite_refs(&mut r, |c, _| {
        let loc = index.lookup(&c.fp).ok_or_else(|| {
            StoreError::Invalid(format!(
                "chunk {} was not placed in the cloud tier",
                c.fp.to_hex()
            ))
        })?;
        Ok(Target::At(table.get(loc.container), loc.region, loc.offset))
    })?;
    // The same objects on both sides: the bucket's copy first.
    let mut w = recipe::RecipeWriter::new(cloud).with_mirror(local);
    w.push_recipe(r)?;
    let (rid, _) = w.finish()?;
    let mut nv = v.clone();
    nv.tier = Tier::Cloud;
    nv.archival = None;
    let old_recipe = std::mem::replace(&mut nv.recipe, rid);
    // The bucket's namespace copy first, then the flip.
    cloud.replace_snapshot(vid, &nv)?;
    local.replace_snapshot(vid, &nv)?;
    if old_recipe != nv.recipe {
        recipe::delete_unused(local, [&old_recipe])?;
    }
    Ok(())
}
