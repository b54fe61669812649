//! What a tier command works on: versions (ids, `SERIES@VERSION`,
//! `latest`), whole series, versions older than some days, and — for the
//! estimate — paths within them (globs on the path as `strata ls` shows
//! it, e.g. `/home/*/cache/**`).

use crate::error::{Result, StoreError};
use crate::repo::snapshots::resolve_in;
use crate::repo::{now_ns, Repository};
use globset::{Glob, GlobSet, GlobSetBuilder};
use std::collections::BTreeMap;
use std::collections::HashSet;
use strata_core::format::{Snapshot, Tier};
use strata_core::id::SnapshotId;

#[derive(Clone, Debug, Default)]
pub struct Selection {
    pub snapshots: Vec<String>,
    pub series: Vec<String>,
    /// Versions at least this many days old (alone: all of them; with
    /// snapshots or series: those of them).
    pub older_than_days: Option<u64>,
    /// Only these paths of the selected versions.
    pub paths: Vec<String>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.series.is_empty() && self.older_than_days.is_none()
    }

    /// The path globs, if any.
    pub fn path_set(&self) -> Result<Option<GlobSet>> {
        if self.paths.is_empty() {
            return Ok(None);
        }
        let mut b = GlobSetBuilder::new();
        for p in &self.paths {
            let g = Glob::new(&format!("/{}", p.trim_start_matches('/')))
                .map_err(|e| StoreError::Invalid(format!("path pattern {p:?}: {e}")))?;
            b.add(g);
        }
        Ok(Some(
            b.build().map_err(|e| StoreError::Invalid(e.to_string()))?,
        ))
    }
}

/// The versions of `tier` that `sel` selects, oldest first.
pub fn versions(
    repo: &Repository,
    sel: &Selection,
    tier: Tier,
) -> Result<Vec<(SnapshotId, Snapshot)>> {
    select(repo, sel, Some(tier))
}

/// The versions `sel` selects in either tier (a job that moved some of
/// them before it was interrupted names them all).
pub fn versions_any(repo: &Repository, sel: &Selection) -> Result<Vec<(SnapshotId, Snapshot)>> {
    select(repo, sel, None)
}

fn select(
    repo: &Repository,
    sel: &Selection,
    tier: Option<Tier>,
) -> Result<Vec<(SnapshotId, Snapshot)>> {
    let in_tier = |s: &Snapshot| tier.is_none_or(|t| s.tier == t);
    if sel.is_empty() {
        return Err(StoreError::Invalid(
            "select versions: snapshot ids or SERIES@VERSION, --series, or --older-than DAYS"
                .into(),
        ));
    }
    let all = repo.list_snapshots()?;
    let mut out: BTreeMap<SnapshotId, Snapshot> = BTreeMap::new();
    for spec in &sel.snapshots {
        let (id, s) = resolve_in(&all, spec)?;
        out.insert(id, s);
    }
    // Named versions must be in the tier; series and ages mean those of
    // their versions that are.
    let wrong: Vec<String> = out
        .iter()
        .filter(|(_, s)| !in_tier(s))
        .map(|(id, s)| format!("{}@{} ({})", s.series, s.version, &id[..8.min(id.len())]))
        .collect();
    if !wrong.is_empty() {
        return Err(StoreError::Invalid(format!(
            "not in the {} tier: {}",
            match tier {
                Some(Tier::Cloud) => "cloud",
                _ => "active",
            },
            wrong.join(", ")
        )));
    }
    for series in &sel.series {
        if !all.iter().any(|(_, s)| &s.series == series) {
            return Err(StoreError::Invalid(format!("no series {series:?}")));
        }
        for (id, s) in all
            .iter()
            .filter(|(_, s)| &s.series == series && in_tier(s))
        {
            out.insert(id.clone(), s.clone());
        }
    }
    if let Some(days) = sel.older_than_days {
        let cutoff = now_ns() - days as i64 * 86_400 * 1_000_000_000;
        if sel.snapshots.is_empty() && sel.series.is_empty() {
            out = all
                .iter()
                .filter(|(_, s)| in_tier(s))
                .map(|(i, s)| (i.clone(), s.clone()))
                .collect();
        }
        out.retain(|_, s| s.time_ns <= cutoff);
    }
    let mut v: Vec<(SnapshotId, Snapshot)> = out.into_iter().collect();
    v.sort_by(|a, b| (a.1.time_ns, &a.0).cmp(&(b.1.time_ns, &b.0)));
    Ok(v)
}

/// Refuses a selection that would leave an active version whose indirect
/// references lead into a migrated one (tiers never share chunks).
pub(crate) fn check_chains(all: &[(SnapshotId, Snapshot)], chosen: &HashSet<&str>) -> Result<()> {
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
