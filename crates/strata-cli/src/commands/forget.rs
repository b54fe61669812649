//! `strata forget`: remove snapshots (both tiers).

use crate::cli::{open, Cli};
use crate::output::{fmt_bytes, fmt_time, Out};
use crate::select::FilterArgs;
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use strata_core::format::{Snapshot, Tier};
use strata_core::id::{RecipeId, SnapshotId};
use strata_store::ops::retention::{self, KeepCount, KeepPolicy, KeepWithin};

#[derive(Args)]
#[command(
    after_help = "Either name snapshots, or give --keep-* rules (restic's): per series, \
    the snapshots no rule keeps are removed. `strata policy` sets a series' retention to be applied \
    after every backup instead."
)]
pub struct ForgetArgs {
    /// Snapshots: ids (prefixes), SERIES@VERSION, `latest`.
    #[arg(required_unless_present_any = ["keep_last", "keep_hourly", "keep_daily", "keep_weekly",
        "keep_monthly", "keep_yearly", "keep_within", "keep_tag"])]
    snapshots: Vec<String>,
    /// Keep the N newest snapshots of each series (`unlimited` or -1: all).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_last: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N hours that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_hourly: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N days that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_daily: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N weeks that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_weekly: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N months that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_monthly: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N years that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    keep_yearly: Option<KeepCount>,
    /// Keep snapshots within this duration of the series' newest
    /// (e.g. `1y6m`, `14d`, `36h`).
    #[arg(long, value_name = "DURATION")]
    keep_within: Option<KeepWithin>,
    /// Keep snapshots with this tag (repeatable).
    #[arg(long, value_name = "TAG")]
    keep_tag: Vec<String>,
    /// Only say what would be removed.
    #[arg(long, short = 'n')]
    dry_run: bool,
    /// Run gc afterwards.
    #[arg(long)]
    prune: bool,
    #[command(flatten)]
    filter: FilterArgs,
}

impl ForgetArgs {
    fn policy(&self) -> KeepPolicy {
        KeepPolicy {
            last: self.keep_last,
            hourly: self.keep_hourly,
            daily: self.keep_daily,
            weekly: self.keep_weekly,
            monthly: self.keep_monthly,
            yearly: self.keep_yearly,
            within: self.keep_within,
            tags: self.keep_tag.clone(),
        }
    }
}

/// The snapshots `a` names, or those its policy does not keep (the
/// decisions are printed).
fn chosen(
    out: &Out,
    a: &ForgetArgs,
    all: &[(SnapshotId, Snapshot)],
    damaged: &[(String, strata_store::StoreError)],
) -> Result<Vec<String>> {
    let policy = a.policy();
    let mut ids = Vec::new();
    if !a.snapshots.is_empty() {
        if !policy.is_empty() {
            bail!("name snapshots or give --keep-* rules, not both");
        }
        for s in &a.snapshots {
            // A damaged snapshot can be named by its full id.
            match damaged.iter().find(|(id, _)| id == s) {
                Some((id, _)) => ids.push(id.clone()),
                None => ids.push(
                    strata_store::repo::snapshots::resolve(
                        all,
                        s,
                        &a.filter.filter(),
                        &strata_store::repo::lock::hostname(),
                    )?
                    .0
                    .to_string(),
                ),
            }
        }
    } else {
        if policy.is_empty() {
            bail!("the --keep-* rules keep nothing (all zero): refusing to remove every snapshot");
        }
        let f = a.filter.filter();
        let scope: Vec<_> = all.iter().filter(|(_, s)| f.matches(s)).cloned().collect();
        let tz = jiff::tz::TimeZone::system();
        let decisions = retention::apply(&scope, &policy, strata_store::repo::now_ns(), &tz);
        if !out.json && !out.quiet {
            for d in &decisions {
                println!(
                    "{} {} {}@{}  {}  {}",
                    if d.keep { "keep  " } else { "remove" },
                    crate::output::short(&d.id),
                    d.series,
                    d.version,
                    fmt_time(d.time_ns),
                    d.reasons.join(", ")
                );
            }
        }
        ids = decisions
            .into_iter()
            .filter(|d| !d.keep)
            .map(|d| d.id.to_string())
            .collect();
    }
    ids.sort();
    ids.dedup();
    Ok(ids)
}

pub fn run(cli: &Cli, out: &Out, a: &ForgetArgs) -> Result<i32> {
    let prune = &a.prune;
    let repo = open(cli)?;
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    let ids = chosen(out, a, &all, &damaged)?;
    if a.dry_run {
        out.result(&json!({"dry_run": true, "would_remove": ids}), || {
            format!("(dry run) would remove {} snapshots", ids.len())
        });
        return Ok(0);
    }
    let started = std::time::Instant::now();
    let in_cloud: Vec<SnapshotId> = all
        .iter()
        .filter(|(i, s)| s.tier == Tier::Cloud && ids.iter().any(|id| i == id))
        .map(|(i, _)| i.clone())
        .collect();
    let (cloud_ids, ids): (Vec<String>, Vec<String>) = ids
        .into_iter()
        .partition(|id| in_cloud.iter().any(|i| i == id));
    let mut cloud_forgotten = 0;
    if !cloud_ids.is_empty() {
        let c = crate::cli::tiers(&repo).cloud()?;
        cloud_forgotten = strata_store::tier::forget_cloud(&repo, &c, &in_cloud)?;
    }
    // Active versions some of whose files are in the cloud tier:
    // the bucket forgets those parts once the versions are gone.
    let parts: Vec<(SnapshotId, RecipeId)> = all
        .iter()
        .filter(|(i, s)| ids.iter().any(|id| i == id) && s.tier == Tier::Active)
        .filter_map(|(i, s)| Some((i.clone(), s.cloud_part.as_ref()?.recipe.clone())))
        .collect();
    let part_tier = match parts.is_empty() {
        true => None,
        false => Some(crate::cli::tiers(&repo).cloud()?),
    };
    let mut rep = if ids.is_empty() {
        Default::default()
    } else {
        strata_store::ops::forget::forget(&repo, &ids)?
    };
    if let Some(c) = &part_tier {
        cloud_forgotten += strata_store::tier::forget_cloud_parts(c, &parts)?;
    }
    rep.removed_snapshots.extend(cloud_ids);
    let mut v = serde_json::to_value(&rep)?;
    v["cloud_snapshots_removed"] = json!(cloud_forgotten);
    v["seconds"] = json!(started.elapsed().as_secs_f64());
    out.result(&v, || {
        let mut t = format!("removed {} snapshots", rep.removed_snapshots.len());
        if rep.stamped_containers_deleted > 0 {
            t += &format!(
                "; freed {} of archival data ({} stamped containers)",
                fmt_bytes(rep.stamped_bytes_freed),
                rep.stamped_containers_deleted
            );
        }
        if !rep.rebased.is_empty() {
            t += &format!(
                "; re-pointed {} archival versions that referenced them",
                rep.rebased.len()
            );
        }
        t
    });
    if *prune {
        return crate::prune::gc(cli, out, &repo, 0.2, false);
    }
    Ok(0)
}
