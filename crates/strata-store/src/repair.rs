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

use crate::check::{check, CheckOptions};
use crate::error::Result;
use crate::forget::forget;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::repo_copy::{store_version, CopyOptions, Stored};
use std::collections::HashSet;
use std::sync::Arc;

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
    pub dry_run: bool,
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
    let (all, _) = repo.list_snapshots_tolerant()?;
    let damaged: HashSet<&str> = rep.damaged_snapshots.iter().map(String::as_str).collect();
    // Oldest first: each repaired series is written in time order.
    let mut readable: Vec<_> = all
        .iter()
        .filter(|(id, _)| damaged.contains(id.as_str()))
        .collect();
    readable.sort_by_key(|(_, s)| (s.series.clone(), s.time_ns, s.version));
    let mut out = RepairReport {
        check_errors: rep.errors.clone(),
        dry_run: opts.dry_run,
        ..Default::default()
    };
    // Snapshot objects that do not read at all.
    for id in &rep.damaged_snapshots {
        if !all.iter().any(|(i, _)| i == id) {
            out.snapshots.push(SnapshotRepair {
                id: id.clone(),
                lost_entirely: true,
                error: Some("the snapshot object cannot be read".into()),
                ..Default::default()
            });
        }
    }
    for (id, s) in readable {
        let mut r = SnapshotRepair {
            id: id.clone(),
            series: Some(s.series.clone()),
            version: Some(s.version),
            ..Default::default()
        };
        let Some(lost) = rep.damaged_raw.get(id) else {
            r.lost_entirely = true;
            r.error = Some("its recipe cannot be read".into());
            out.snapshots.push(r);
            continue;
        };
        let mut lost_paths: Vec<String> = lost
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        lost_paths.sort();
        r.lost_paths = lost_paths;
        let series = format!("{}.repaired", s.series);
        r.repaired_series = Some(series.clone());
        if !opts.dry_run {
            let how = Stored {
                series: Some(series),
                tags: vec!["repaired".into()],
                skip: Some(lost),
            };
            let copy = CopyOptions {
                threads: opts.threads,
                progress: opts.progress.clone(),
            };
            match store_version(&[(repo.clone(), s.clone())], s, repo, copy, &how) {
                Ok(b) => {
                    r.kept_entries = b.snapshot.stats.files + b.snapshot.stats.dirs;
                    r.repaired_as = Some(b.id);
                }
                Err(e) => r.error = Some(format!("storing the salvage failed: {e}")),
            }
        }
        out.snapshots.push(r);
    }
    if opts.forget && !opts.dry_run {
        // Only originals whose salvage is stored, or with nothing to salvage.
        let ids: Vec<String> = out
            .snapshots
            .iter()
            .filter(|r| r.repaired_as.is_some() || r.lost_entirely)
            .map(|r| r.id.clone())
            .collect();
        if !ids.is_empty() {
            let f = forget(repo, &ids)?;
            for r in &mut out.snapshots {
                r.forgotten = f.removed_snapshots.contains(&r.id);
            }
        }
    }
    Ok(out)
}
