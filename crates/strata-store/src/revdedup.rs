//! The RevDedup lifecycle (DESIGN.md "Lifecycle"; RevDedup §2.4, §2.5):
//! out-of-line reverse deduplication of versions that left the live
//! window, and expiry of versions past retention.
//!
//! New backups are deduplicated inline at segment level only (the
//! `segment` index strategy): they reference whole segments in the shared
//! *pool* and restore fast, but keep the duplicates that segments miss.
//! `maintain` then turns every version that left its series' live window
//! into *archival* form against the next version of the same series:
//!
//! 1. the next version's chunk fingerprints go into a temporary in-memory
//!    table (§2.4.1);
//! 2. each chunk reference of the old version whose fingerprint is in the
//!    table becomes *indirect* (resolved through the next version at
//!    restore); the others stay *direct* and their chunks are copied into
//!    new containers *stamped* with the old version (§2.4.3, §2.5);
//! 3. the new recipe and the snapshot object that points at it are
//!    committed (the atomic switch);
//! 4. the pool is compacted: chunk locations that no live-form version
//!    references any more are removed — whole containers dropped, partly
//!    dead ones copied forward with their live segments kept whole.
//!
//! Two-level reference management, as built here: a pool segment is
//! *shared* while a live-form version references it (that is its
//! refcount), and only non-shared segments lose chunks. The paper's
//! per-chunk "direct reference flag" becomes ownership: a chunk an archival
//! version keeps direct is copied into that version's own stamped
//! containers, so a chunk is removable from the pool exactly when no
//! live-form version references it, and a stamped container is deleted
//! with its owner. Versions of a series expire oldest first and indirect
//! references only point to newer versions, so expiry (§2.5) deletes the
//! owner's stamped containers without scanning anything else. The price of
//! ownership over flags: a chunk kept direct by archival versions of two
//! series (or reverted content within one) is stored once per owner.
//!
//! Every step is resumable: a kill before a version's snapshot object is
//! replaced leaves it in live form (its stamped containers are leftovers
//! that the next run deletes); a kill during compaction leaves duplicates
//! the next run removes.

use crate::backup::Progress;
use crate::container::read_meta;
use crate::error::{Result, StoreError};
use crate::gc::{
    compact_pool, copy_chunks, count_ref, delete_containers, CopySource, GcOptions, GcReport, Scope,
};
use crate::index::{edit_index, RepoIndex};
use crate::lifecycle::{list_policies, version_states, VersionState};
use crate::lock;
use crate::repo::{now_ns, Repository};
use crate::restore::recipe_refs;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{Archival, ChunkRef, ContainerId, RegionInfo, Snapshot, Stamp};
use strata_core::Fingerprint;

#[derive(Clone, Debug)]
pub struct MaintainOptions {
    /// Pool containers with more than this fraction of dead bytes are
    /// copied forward.
    pub threshold: f64,
    /// Only report what would be done.
    pub dry_run: bool,
    /// The time against which retention by age is judged (default: now).
    pub now_ns: Option<i64>,
    pub progress: Arc<Progress>,
}

impl Default for MaintainOptions {
    fn default() -> Self {
        MaintainOptions {
            threshold: 0.2,
            dry_run: false,
            now_ns: None,
            progress: Arc::new(Progress::default()),
        }
    }
}

/// One version turned into archival form.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Converted {
    pub id: String,
    pub series: String,
    pub version: u32,
    /// The version its indirect references point into.
    pub next: String,
    pub direct_chunks: u64,
    pub direct_bytes: u64,
    pub indirect_chunks: u64,
    pub indirect_bytes: u64,
    /// Stamped containers written for its direct chunks, and their size.
    pub stamped_containers: u64,
    pub stamped_bytes: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MaintainReport {
    /// Versions reverse-deduplicated (or, in a dry run, that would be).
    pub converted: Vec<Converted>,
    /// Versions past retention, deleted (or that would be).
    pub expired: Vec<String>,
    /// Archival versions re-pointed because the version they referenced
    /// expired out of order.
    pub rebased: Vec<String>,
    /// Stamped containers deleted with expired versions, and their bytes.
    pub stamped_containers_deleted: u64,
    pub stamped_bytes_freed: u64,
    /// Stamped containers left by an interrupted run, deleted.
    pub leftovers_deleted: u64,
    /// The pool compaction after reverse dedup.
    pub pool: GcReport,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub seconds_expire: f64,
    pub seconds_convert: f64,
    pub seconds_compact: f64,
    pub dry_run: bool,
}

/// Runs the lifecycle: leftovers, expiry, reverse dedup, pool compaction.
pub fn maintain(repo: &Repository, opts: &MaintainOptions) -> Result<MaintainReport> {
    let _lock = lock::acquire(repo, true, "maintain")?;
    maintain_locked(repo, opts)
}

pub(crate) fn maintain_locked(repo: &Repository, opts: &MaintainOptions) -> Result<MaintainReport> {
    let mut report = MaintainReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let snaps = repo.list_snapshots()?;
    let idx = RepoIndex::load_summaries(repo)?;
    report.bytes_before = idx.stored_bytes();

    // Stamped containers whose owner is not (or no longer) in archival form.
    let archival: HashSet<&str> = snaps
        .iter()
        .filter(|(_, s)| s.archival.is_some())
        .map(|(i, _)| i.as_str())
        .collect();
    let leftovers: HashSet<ContainerId> = idx
        .containers
        .iter()
        .filter(|(_, c)| {
            c.stamp
                .as_ref()
                .is_some_and(|s| !archival.contains(s.owner.as_str()))
        })
        .map(|(id, _)| *id)
        .collect();
    report.leftovers_deleted = leftovers.len() as u64;
    if !opts.dry_run && !leftovers.is_empty() {
        edit_index(repo, &idx, &leftovers, vec![])?;
        delete_containers(repo, leftovers.iter())?;
    }

    // Expiry (§2.5).
    let t = std::time::Instant::now();
    let policies = list_policies(repo)?;
    let states = version_states(&snaps, &policies, opts.now_ns.unwrap_or_else(now_ns));
    let expired: Vec<String> = snaps
        .iter()
        .filter(|(id, _)| states.get(id) == Some(&VersionState::Expired))
        .map(|(id, _)| id.clone())
        .collect();
    if !expired.is_empty() && !opts.dry_run {
        let f = crate::gc::forget_locked(repo, &expired)?;
        report.rebased = f.rebased;
        report.stamped_containers_deleted = f.stamped_containers_deleted;
        report.stamped_bytes_freed = f.stamped_bytes_freed;
    }
    report.expired = expired;
    report.seconds_expire = t.elapsed().as_secs_f64();

    // Reverse dedup of the versions that left the live window (§2.4).
    let t = std::time::Instant::now();
    let snaps = repo.list_snapshots()?;
    let mut series: BTreeMap<&str, Vec<&(String, Snapshot)>> = BTreeMap::new();
    for s in &snaps {
        series.entry(s.1.series.as_str()).or_default().push(s);
    }
    type Entry = (String, Snapshot);
    let mut todo: Vec<(&Entry, &Entry)> = Vec::new();
    for list in series.values_mut() {
        list.sort_by_key(|(_, s)| (s.version, s.time_ns));
        for w in list.windows(2) {
            let (v, n) = (w[0], w[1]);
            if v.1.archival.is_none() && states.get(&v.0) == Some(&VersionState::Archival) {
                todo.push((v, n));
            }
        }
    }
    let progress = &opts.progress;
    progress.totals_known.store(true, Ordering::Relaxed);
    let mut recipe_users: HashMap<&str, usize> = HashMap::new();
    for (_, s) in &snaps {
        *recipe_users.entry(s.recipe.as_str()).or_default() += 1;
    }
    let cache: Mutex<HashMap<ContainerId, Option<Arc<Vec<RegionInfo>>>>> = Default::default();
    let regions = |id: &ContainerId| -> Option<Arc<Vec<RegionInfo>>> {
        let mut g = cache.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(*id)
            .or_insert_with(|| read_meta(repo, id).ok().map(|m| Arc::new(m.regions)))
            .clone()
    };
    for ((vid, v), (nid, n)) in todo {
        let c = convert(repo, &regions, vid, v, nid, n, opts, &recipe_users)?;
        report.converted.push(c);
    }
    report.seconds_convert = t.elapsed().as_secs_f64();

    // Chunk removal (§2.4.3): the pool keeps what live-form versions use.
    let t = std::time::Instant::now();
    let gc_opts = GcOptions {
        threshold: opts.threshold,
        dry_run: opts.dry_run,
        progress: opts.progress.clone(),
    };
    compact_pool(repo, Scope::LiveForm, &gc_opts, &mut report.pool)?;
    report.seconds_compact = t.elapsed().as_secs_f64();
    report.bytes_after = if opts.dry_run {
        report.bytes_before
    } else {
        RepoIndex::load_summaries(repo)?.stored_bytes()
    };
    Ok(report)
}

/// Reverse-deduplicates version `v` against the next version `n` of its
/// series and commits the archival recipe.
#[allow(clippy::too_many_arguments)]
fn convert(
    repo: &Repository,
    regions: &dyn Fn(&ContainerId) -> Option<Arc<Vec<RegionInfo>>>,
    vid: &str,
    v: &Snapshot,
    nid: &str,
    n: &Snapshot,
    opts: &MaintainOptions,
    recipe_users: &HashMap<&str, usize>,
) -> Result<Converted> {
    let started = std::time::Instant::now();
    let recipe = repo.load_recipe(&v.recipe)?;
    // The temporary table of §2.4.1: every chunk fingerprint of the next
    // version, direct or indirect (both mean the next version holds it).
    let next_fps: HashSet<Fingerprint> = {
        let rn = repo.load_recipe(&n.recipe)?;
        recipe_refs(&rn)
            .filter(|c| !c.is_zero())
            .map(|c| c.fp)
            .collect()
    };
    let mut sources = Vec::new();
    let mut seen = HashSet::new();
    for c in recipe_refs(&recipe) {
        if c.is_indirect() {
            return Err(StoreError::Invalid(format!(
                "snapshot {vid} has indirect references but is not marked archival; run `strata check`"
            )));
        }
        if c.is_direct() && !next_fps.contains(&c.fp) && seen.insert(c.fp) {
            sources.push(CopySource::of_snapshot(&recipe, c, vid)?);
        }
    }
    let mut out = Converted {
        id: vid.to_string(),
        series: v.series.clone(),
        version: v.version,
        next: nid.to_string(),
        ..Default::default()
    };
    let mut archival = Archival {
        next: Some(nid.to_string()),
        converted_ns: now_ns(),
        ..Default::default()
    };
    if opts.dry_run {
        for c in recipe_refs(&recipe) {
            let r = if c.is_direct() && next_fps.contains(&c.fp) {
                ChunkRef::indirect(c.fp, c.len)
            } else {
                *c
            };
            count_ref(&mut archival, &r);
        }
        fill(&mut out, &archival);
        return Ok(out);
    }
    opts.progress.bytes_total.fetch_add(
        sources.iter().map(|s| s.len as u64).sum(),
        Ordering::Relaxed,
    );
    let stamp = Stamp {
        owner: vid.to_string(),
        time_ns: v.time_ns,
    };
    let (placed, metas) = copy_chunks(repo, regions, &sources, Some(stamp), Some(&opts.progress))?;
    out.stamped_containers = metas.len() as u64;
    out.stamped_bytes = metas.iter().map(|m| m.data_len).sum();
    edit_index(repo, &RepoIndex::default(), &HashSet::new(), metas)?;

    let mut recipe = recipe;
    let mut table: HashMap<ContainerId, u32> = HashMap::new();
    let mut containers = Vec::new();
    for node in &mut recipe.nodes {
        for s in &mut node.segments {
            for c in &mut s.chunks {
                if c.is_zero() {
                    continue;
                }
                if next_fps.contains(&c.fp) {
                    *c = ChunkRef::indirect(c.fp, c.len);
                } else {
                    let (cid, loc) = placed.get(&c.fp).ok_or_else(|| {
                        StoreError::Invalid(format!("chunk {} was not copied", c.fp.to_hex()))
                    })?;
                    let i = *table.entry(*cid).or_insert_with(|| {
                        containers.push(*cid);
                        containers.len() as u32 - 1
                    });
                    *c = ChunkRef {
                        fp: c.fp,
                        len: c.len,
                        container: i,
                        region: loc.region,
                        offset: loc.offset,
                    };
                }
                count_ref(&mut archival, c);
            }
        }
    }
    recipe.containers = containers;
    let (rid, _) = repo.put_struct(Kind::Recipe, "recipes", &recipe)?;
    let mut nv = v.clone();
    let old_recipe = std::mem::replace(&mut nv.recipe, rid);
    nv.archival = Some(archival.clone());
    // The atomic switch: from here on the version is archival.
    repo.replace_snapshot(vid, &nv)?;
    if old_recipe != nv.recipe && recipe_users.get(old_recipe.as_str()).copied() == Some(1) {
        repo.backend().delete(&format!("recipes/{old_recipe}"))?;
    }
    fill(&mut out, &archival);
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

fn fill(out: &mut Converted, a: &Archival) {
    out.direct_chunks = a.direct_chunks;
    out.direct_bytes = a.direct_bytes;
    out.indirect_chunks = a.indirect_chunks;
    out.indirect_bytes = a.indirect_bytes;
}
