//! `strata repair snapshots`: salvages what damaged snapshots still hold.
//!
//! A check (structure, or every byte with `read_data`) names the damaged
//! snapshots and, for each whose recipe still reads, the paths whose data
//! is unavailable. Each such snapshot is stored again without those paths
//! (and hard links to them) — every other file read back, verified by its
//! chunks' fingerprints on the way, and deduplicated against the
//! repository, so it costs little space — in the series `SERIES.repaired`
//! with the original's time, host, paths and tags plus `repaired`. A
//! snapshot whose own object or recipe cannot be read has nothing left to
//! salvage. With `forget`, the damaged originals are removed afterwards.
//! The report says exactly which paths were lost.
//!
//! It refuses to run while an index object is damaged or missing (data
//! would only look lost: `repair index` first); a transient read error
//! stops it rather than counting a snapshot as lost; snapshots with data in
//! the cloud tier are left alone; a version already salvaged by an earlier
//! run is not stored again.

use crate::error::{Result, StoreError};
use crate::ops::check::{check, CheckOptions};
use crate::ops::forget::forget;
use crate::ops::repo_copy::{copy_of, out_of_order, store_version, CopyOptions, Stored};
use crate::progress::Progress;
use crate::repo::Repository;
use std::collections::HashSet;
use std::sync::Arc;
use strata_core::format::{NodeKind, Snapshot, Tier};
use strata_core::id::SnapshotId;

/// Settings of one repair.
#[derive(Clone, Debug, Default)]
pub struct RepairOptions {
    /// Read every byte to find damage (else the structure only: missing or
    /// truncated containers, unreadable objects).
    pub read_data: bool,
    /// Remove the damaged originals once their salvage is stored.
    pub forget: bool,
    /// Only say what would be done.
    pub dry_run: bool,
    pub threads: usize,
    pub progress: Arc<Progress>,
}

/// What became of one damaged snapshot.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SnapshotRepair {
    pub id: String,
    /// Unknown when the snapshot object itself cannot be read.
    pub series: Option<String>,
    pub version: Option<u32>,
    /// The salvaged copy, when one was stored.
    pub repaired_as: Option<String>,
    pub repaired_series: Option<String>,
    /// Files (and other entries) carried over.
    pub kept_entries: u64,
    /// Paths left out because their data is unavailable.
    pub lost_paths: Vec<String>,
    /// Nothing could be salvaged (the snapshot or its recipe is unreadable).
    pub lost_entirely: bool,
    /// Why, for a snapshot lost entirely or whose salvage failed.
    pub error: Option<String>,
    pub forgotten: bool,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairReport {
    /// Errors the check found (they remain in the original snapshots until
    /// those are forgotten, and in containers until gc drops them).
    pub check_errors: Vec<String>,
    pub snapshots: Vec<SnapshotRepair>,
    /// Why forgetting the originals failed, if it did (nothing else is
    /// undone: the salvaged copies stay).
    pub forget_error: Option<String>,
    pub dry_run: bool,
}

/// Damage that loses the object for good (as opposed to a transient or
/// permission error, which must not make a snapshot count as lost).
fn is_loss(e: &StoreError) -> bool {
    matches!(e, StoreError::Corrupt { .. } | StoreError::NotFound(_))
}

/// Finds damaged snapshots and stores what they still hold (see the module
/// documentation).
pub fn repair_snapshots(repo: &Repository, opts: &RepairOptions) -> Result<RepairReport> {
    let rep = check(
        repo,
        &CheckOptions {
            read_data: opts.read_data,
            progress: opts.progress.clone(),
        },
    )?;
    if rep.index_repair_needed {
        return Err(StoreError::Invalid(
            "an index object is damaged or missing, so data may only look lost: run `strata repair index` first, then this again".into(),
        ));
    }
    let (all, unreadable) = repo.list_snapshots_tolerant()?;
    let mut out = RepairReport {
        check_errors: rep.errors.clone(),
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let damaged: HashSet<&str> = rep.damaged_snapshots.iter().map(String::as_str).collect();
    // Snapshot objects that do not read at all: lost only if damaged.
    for (id, e) in unreadable
        .iter()
        .filter(|(id, _)| damaged.contains(id.as_str()))
    {
        if !is_loss(e) {
            return Err(StoreError::Invalid(format!(
                "snapshot {id} could not be read ({e}); nothing was changed"
            )));
        }
        out.snapshots.push(SnapshotRepair {
            id: id.clone(),
            lost_entirely: true,
            error: Some(format!("the snapshot object cannot be read: {e}")),
            ..Default::default()
        });
    }
    // Oldest first: each repaired series is written in time order.
    let mut readable: Vec<&(SnapshotId, Snapshot)> = all
        .iter()
        .filter(|(id, _)| damaged.contains(id.as_str()))
        .collect();
    readable.sort_by_key(|(_, s)| (s.series.clone(), s.time_ns, s.version));
    for (id, s) in readable {
        let r = salvage(repo, opts, &rep, &all, (id, s))?;
        out.snapshots.push(r);
    }
    if opts.forget && !opts.dry_run {
        forget_originals(repo, &mut out);
    }
    Ok(out)
}

/// One damaged snapshot whose object reads: stored again without its lost
/// paths, unless it is (partly) in the cloud tier, its recipe is lost, or
/// a copy is already stored.
fn salvage(
    repo: &Repository,
    opts: &RepairOptions,
    rep: &crate::ops::check::CheckReport,
    all: &[(SnapshotId, Snapshot)],
    (id, s): (&SnapshotId, &Snapshot),
) -> Result<SnapshotRepair> {
    let mut r = SnapshotRepair {
        id: id.to_string(),
        series: Some(s.series.clone()),
        version: Some(s.version),
        ..Default::default()
    };
    if s.tier == Tier::Cloud || s.cloud_part.is_some() {
        r.error = Some(
            "its data is (partly) in the cloud tier: `strata tier check` looks at it; not salvaged here".into(),
        );
        return Ok(r);
    }
    let recipe = match repo.load_recipe(&s.recipe) {
        Ok(recipe) => recipe,
        Err(e) if is_loss(&e) => {
            r.lost_entirely = true;
            r.error = Some(format!("its recipe cannot be read: {e}"));
            return Ok(r);
        }
        Err(e) => return Err(e),
    };
    let Some(lost) = rep.damaged_raw.get(id.as_str()) else {
        return Err(StoreError::Invalid(format!(
            "the recipe of snapshot {id} could not be read during the check but can now: run this again"
        )));
    };
    // Hard links to a lost file go with it.
    let mut lost = lost.clone();
    for n in &recipe.nodes {
        if n.kind == NodeKind::Hardlink && n.target.as_ref().is_some_and(|t| lost.contains(t)) {
            lost.insert(n.path.clone());
        }
    }
    let mut lost_paths: Vec<String> = lost
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    lost_paths.sort();
    r.lost_paths = lost_paths;
    let series = format!("{}.repaired", s.series);
    r.repaired_series = Some(series.clone());
    let probe = Snapshot {
        series: series.clone(),
        ..s.clone()
    };
    if let Some(done) = copy_of(all, &probe) {
        // A run before stored it already.
        r.repaired_as = Some(done.to_string());
        return Ok(r);
    }
    if let Some(why) = out_of_order(all, &probe) {
        r.error = Some(why);
        return Ok(r);
    }
    if opts.dry_run {
        return Ok(r);
    }
    let how = Stored {
        series: Some(series),
        tags: vec!["repaired".into()],
        skip: Some(&lost),
        // Chunks of damaged containers are stored again, or read from
        // another copy, never referenced where they are damaged.
        avoid: Some(&rep.damaged_containers),
    };
    let copy = CopyOptions {
        threads: opts.threads,
        progress: opts.progress.clone(),
    };
    match store_version(&[(repo.clone(), s.clone())], s, repo, copy, &how) {
        Ok(b) => {
            r.kept_entries = b.snapshot.stats.files + b.snapshot.stats.dirs;
            r.repaired_as = Some(b.id.to_string());
        }
        Err(e) => r.error = Some(format!("storing the salvage failed: {e}")),
    }
    Ok(r)
}

/// Forgets the originals whose salvage is stored (or that had nothing to
/// salvage); a failure is reported, not raised, so the report survives.
fn forget_originals(repo: &Repository, out: &mut RepairReport) {
    let ids: Vec<String> = out
        .snapshots
        .iter()
        .filter(|r| r.repaired_as.is_some() || r.lost_entirely)
        .map(|r| r.id.clone())
        .collect();
    if ids.is_empty() {
        return;
    }
    match forget(repo, &ids) {
        Ok(f) => {
            for r in &mut out.snapshots {
                r.forgotten = f.removed_snapshots.contains(&r.id);
            }
        }
        Err(e) => out.forget_error = Some(format!("forgetting the originals failed: {e}")),
    }
}
