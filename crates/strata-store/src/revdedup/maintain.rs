//! `maintain`: the lifecycle's work — expiry, conversion of versions that
//! left the live window into archival form, and pool compaction — and what
//! a backup runs of it.

use crate::engine::copy::delete_containers;
use crate::error::{Result, StoreError};
use crate::ops::backup::ReverseHint;
use crate::ops::forget::count_ref;
use crate::ops::gc::compact::compact_pool;
use crate::ops::gc::{GcOptions, GcReport};
use crate::progress::Progress;
use crate::repo::index::{edit_index, RepoIndex};
use crate::repo::lifecycle::{
    list_policies, load_state, store_state, version_states, VersionState,
};
use crate::repo::lock;
use crate::repo::recipe::refs::{rewrite_pieces, Target};
use crate::repo::recipe::writer::RecipeWriter;
use crate::repo::{now_ns, Repository};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{Archival, ChunkRef, ContainerId, Snapshot};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::Fingerprint;

#[derive(Clone, Debug)]
pub struct MaintainOptions {
    /// Pool containers with more than this fraction of dead bytes are
    /// copied forward.
    pub threshold: f64,
    /// Pool containers with more than this fraction of bytes dead or held
    /// by one archival version alone are copied forward too, separating
    /// those chunks into stamped containers (see [`GcOptions::separate`]).
    pub separate: f64,
    /// Only report what would be done.
    pub dry_run: bool,
    /// The time against which retention by age is judged (default: now).
    pub now_ns: Option<i64>,
    pub progress: Arc<Progress>,
    /// Whether versions that left the live window are reverse-deduplicated
    /// (expiry runs either way).
    pub reverse_dedup: bool,
    /// When the pool is compacted.
    pub compact: Compact,
    /// What the backup that just ran knows about the version before it.
    pub hint: Option<ReverseHint>,
}

/// When `maintain` compacts the pool.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compact {
    /// Every run (`strata maintain`).
    Always,
    /// Once the bytes the lifecycle released since the last compaction
    /// reach this fraction of the stored bytes (the incremental lifecycle
    /// after each backup: compaction reads and rewrites containers, so it
    /// waits until it pays).
    WhenReleased(f64),
}

/// Fraction of the stored bytes the incremental lifecycle lets accumulate
/// as released (possibly dead) pool bytes before it compacts.
pub const INCREMENTAL_COMPACT_AT: f64 = 0.02;

impl Default for MaintainOptions {
    fn default() -> Self {
        MaintainOptions {
            threshold: 0.2,
            separate: 0.5,
            dry_run: false,
            now_ns: None,
            progress: Arc::new(Progress::default()),
            reverse_dedup: true,
            compact: Compact::Always,
            hint: None,
        }
    }
}

impl MaintainOptions {
    /// The lifecycle a backup runs after its commit: reverse dedup where
    /// the index strategy relies on it (`segment`: new backups dedup only
    /// whole segments and the previous version of each file), expiry, and
    /// compaction once it pays.
    pub fn incremental(repo: &Repository) -> Self {
        MaintainOptions {
            reverse_dedup: repo.config().index == "segment",
            compact: Compact::WhenReleased(INCREMENTAL_COMPACT_AT),
            // Compaction after a backup frees dead space only; separating
            // archival data is `strata maintain`'s (it rewrites live data).
            separate: 1.0,
            ..Default::default()
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
    /// Plaintext bytes of references made indirect whose chunk the next
    /// version holds elsewhere: pool bytes the conversion may have freed
    /// (if no other version references them).
    pub released_bytes: u64,
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
    /// The pool compaction after reverse dedup (empty when it did not run).
    pub pool: GcReport,
    /// Whether the pool was compacted.
    pub compacted: bool,
    /// Bytes released since the last compaction (0 right after one).
    pub released_bytes: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub seconds_expire: f64,
    pub seconds_convert: f64,
    pub seconds_compact: f64,
    pub dry_run: bool,
}

/// What the lifecycle run after a backup did.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AfterBackup {
    Done(Box<MaintainReport>),
    /// Another command holds the repository; nothing is lost, the next
    /// backup (or `strata maintain`) catches up.
    Skipped {
        reason: String,
    },
    /// The backup is committed, the lifecycle failed.
    Failed {
        error: String,
    },
}

/// The incremental lifecycle a backup runs once its snapshot is committed
/// and its own lock released ([`MaintainOptions::incremental`]). It needs
/// the repository to itself and skips when another command holds it.
pub fn after_backup(repo: &Repository, hint: Option<ReverseHint>) -> AfterBackup {
    let _lock = match lock::acquire(repo, true, "lifecycle after backup") {
        Ok(l) => l,
        Err(StoreError::Locked { holder, .. }) => {
            return AfterBackup::Skipped {
                reason: format!(
                    "the repository is in use ({holder}); the next backup or `strata maintain` catches up"
                ),
            }
        }
        Err(e) => {
            return AfterBackup::Failed {
                error: e.to_string(),
            }
        }
    };
    let opts = MaintainOptions {
        hint,
        ..MaintainOptions::incremental(repo)
    };
    match maintain_locked(repo, &opts) {
        Ok(r) => AfterBackup::Done(Box::new(r)),
        Err(e) => AfterBackup::Failed {
            error: e.to_string(),
        },
    }
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
    let snaps = repo.list_active_snapshots()?;
    let idx = RepoIndex::load_summaries(repo)?;
    report.bytes_before = idx.stored_bytes();
    delete_leftovers(repo, &snaps, &idx, opts.dry_run, &mut report)?;

    // Expiry (§2.5).
    let t = std::time::Instant::now();
    let policies = list_policies(repo)?;
    let states = version_states(&snaps, &policies, opts.now_ns.unwrap_or_else(now_ns));
    let expired: Vec<&(SnapshotId, Snapshot)> = snaps
        .iter()
        .filter(|(id, _)| states.get(id) == Some(&VersionState::Expired))
        .collect();
    // What expired versions referenced in the pool may now be dead.
    let mut released: u64 = expired
        .iter()
        .map(|(_, s)| match &s.archival {
            Some(a) => a.direct_bytes,
            None => s.stats.new_raw_bytes,
        })
        .sum();
    report.expired = expired.iter().map(|(id, _)| id.to_string()).collect();
    if !report.expired.is_empty() && !opts.dry_run {
        let f = crate::ops::forget::forget_locked(repo, &report.expired)?;
        report.rebased = f.rebased;
        report.stamped_containers_deleted = f.stamped_containers_deleted;
        report.stamped_bytes_freed = f.stamped_bytes_freed;
    }
    report.seconds_expire = t.elapsed().as_secs_f64();

    // Reverse dedup of the versions that left the live window (§2.4).
    let t = std::time::Instant::now();
    opts.progress.totals_known.store(true, Ordering::Relaxed);
    if opts.reverse_dedup {
        report.converted = convert_due(repo, &states, opts.dry_run, opts.hint.as_ref())?;
        released += report
            .converted
            .iter()
            .map(|c| c.released_bytes)
            .sum::<u64>();
    }
    report.seconds_convert = t.elapsed().as_secs_f64();

    // Chunk removal (§2.4.3): the pool keeps what any version references.
    let t = std::time::Instant::now();
    let mut state = load_state(repo)?;
    state.released_bytes += released;
    report.compacted = match opts.compact {
        Compact::Always => true,
        Compact::WhenReleased(f) => state.released_bytes as f64 >= f * report.bytes_before as f64,
    };
    if report.compacted {
        let gc_opts = GcOptions {
            threshold: opts.threshold,
            separate: opts.separate,
            dry_run: opts.dry_run,
            progress: opts.progress.clone(),
            only: None,
        };
        compact_pool(repo, &gc_opts, &mut report.pool)?;
        state.released_bytes = 0;
    }
    report.released_bytes = state.released_bytes;
    if !opts.dry_run && (released > 0 || report.compacted) {
        store_state(repo, &state)?;
    }
    report.seconds_compact = t.elapsed().as_secs_f64();
    report.bytes_after = if opts.dry_run {
        report.bytes_before
    } else {
        RepoIndex::load_summaries(repo)?.stored_bytes()
    };
    Ok(report)
}

/// Deletes stamped containers whose owner is not (or no longer) in
/// archival form: leftovers of an interrupted run.
fn delete_leftovers(
    repo: &Repository,
    snaps: &[(SnapshotId, Snapshot)],
    idx: &RepoIndex,
    dry_run: bool,
    report: &mut MaintainReport,
) -> Result<()> {
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
    if !dry_run && !leftovers.is_empty() {
        edit_index(repo, idx, &leftovers, vec![])?;
        delete_containers(repo, leftovers.iter())?;
    }
    Ok(())
}

/// Reverse-deduplicates every live-form version that left its series'
/// live window, against the next version of its series.
fn convert_due(
    repo: &Repository,
    states: &HashMap<SnapshotId, VersionState>,
    dry_run: bool,
    hint: Option<&ReverseHint>,
) -> Result<Vec<Converted>> {
    let snaps = repo.list_active_snapshots()?;
    let mut series: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
    for s in &snaps {
        series.entry(s.1.series.as_str()).or_default().push(s);
    }
    type Entry = (SnapshotId, Snapshot);
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
    let mut recipe_users: HashMap<&str, usize> = HashMap::new();
    for (_, s) in &snaps {
        *recipe_users.entry(s.recipe.as_str()).or_default() += 1;
    }
    let mut out = Vec::new();
    for ((vid, v), (nid, n)) in todo {
        let cheap = hint.filter(|h| h.previous == *vid && h.next == *nid && h.negligible());
        if let Some(h) = cheap {
            out.push(mark_archival(repo, vid, v, h, dry_run)?);
            continue;
        }
        out.push(convert(
            repo,
            vid,
            v,
            nid,
            &n.recipe,
            dry_run,
            &recipe_users,
        )?);
    }
    Ok(out)
}

/// Puts version `v` in archival form without rewriting its recipe: every
/// reference stays direct (into the pool), its `next` is the version after
/// it. For a version the next one stored next to nothing of again (see
/// [`ReverseHint`]).
fn mark_archival(
    repo: &Repository,
    vid: &SnapshotId,
    v: &Snapshot,
    h: &ReverseHint,
    dry_run: bool,
) -> Result<Converted> {
    let started = std::time::Instant::now();
    let archival = Archival {
        next: Some(h.next.clone()),
        converted_ns: now_ns(),
        direct_chunks: h.direct_chunks,
        direct_bytes: h.direct_bytes,
        ..Default::default()
    };
    let mut out = Converted {
        id: vid.to_string(),
        series: v.series.clone(),
        version: v.version,
        next: h.next.to_string(),
        ..Default::default()
    };
    fill(&mut out, &archival);
    if !dry_run {
        let mut nv = v.clone();
        nv.archival = Some(archival);
        repo.replace_snapshot(vid, &nv)?;
    }
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

/// Reverse-deduplicates version `v` against `next`, the recipe of the next
/// version `nid` of its series, and commits the archival recipe. Nothing
/// is copied: the references left direct keep pointing where they are.
/// Both recipes are read a part at a time; what is held is the next
/// version's fingerprints (the paper's temporary table).
pub(crate) fn convert(
    repo: &Repository,
    vid: &SnapshotId,
    v: &Snapshot,
    nid: &SnapshotId,
    next: &RecipeId,
    dry_run: bool,
    recipe_users: &HashMap<&str, usize>,
) -> Result<Converted> {
    let started = std::time::Instant::now();
    // The temporary table of §2.4.1: every chunk fingerprint of the next
    // version, direct or indirect (both mean the next version holds it),
    // with where it is when direct.
    let mut next_fps: HashMap<Fingerprint, Option<(ContainerId, u32, u32)>> = HashMap::new();
    crate::repo::recipe::for_each_segment(repo, next, |sg, table| {
        for c in sg.chunks.iter().filter(|c| !c.is_zero()) {
            let at = table
                .get(c.container as usize)
                .filter(|_| c.is_direct())
                .map(|id| (*id, c.region, c.offset));
            let e = next_fps.entry(c.fp).or_insert(at);
            if e.is_none() {
                *e = at;
            }
        }
        Ok(())
    })?;
    let mut out = Converted {
        id: vid.to_string(),
        series: v.series.clone(),
        version: v.version,
        next: nid.to_string(),
        ..Default::default()
    };
    let mut archival = Archival {
        next: Some(nid.clone()),
        converted_ns: now_ns(),
        ..Default::default()
    };
    let mut released = 0u64;
    let mut writer = (!dry_run).then(|| RecipeWriter::new(repo));
    let reverse = |c: &ChunkRef, cid: Option<ContainerId>| {
        if c.is_indirect() {
            return Err(StoreError::Invalid(format!(
                "snapshot {vid} has indirect references but is not marked archival; run `strata check`"
            )));
        }
        Ok(match (cid, next_fps.get(&c.fp)) {
            (Some(id), Some(at)) => {
                if *at != Some((id, c.region, c.offset)) {
                    released += c.len as u64;
                }
                Target::Indirect
            }
            _ => Target::Keep,
        })
    };
    rewrite_pieces(repo, &v.recipe, reverse, |n, table| {
        for c in n.segments.iter().flat_map(|s| &s.chunks) {
            count_ref(&mut archival, c);
        }
        match &mut writer {
            Some(w) => w.push(n, |i| table.get(i as usize).copied()),
            None => Ok(()),
        }
    })?;
    archival.released_bytes = released;
    out.released_bytes = released;
    fill(&mut out, &archival);
    let Some(writer) = writer else {
        return Ok(out);
    };
    let (rid, _) = writer.finish()?;
    let mut nv = v.clone();
    let old_recipe = std::mem::replace(&mut nv.recipe, rid);
    nv.archival = Some(archival);
    // The atomic switch: from here on the version is archival.
    repo.replace_snapshot(vid, &nv)?;
    if old_recipe != nv.recipe && recipe_users.get(old_recipe.as_str()).copied() == Some(1) {
        crate::repo::recipe::delete_unused(repo, [&old_recipe])?;
    }
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

fn fill(out: &mut Converted, a: &Archival) {
    out.direct_chunks = a.direct_chunks;
    out.direct_bytes = a.direct_bytes;
    out.indirect_chunks = a.indirect_chunks;
    out.indirect_bytes = a.indirect_bytes;
}
