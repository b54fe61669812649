//! `strata forget`: remove snapshots (both tiers).

use super::tier;
use crate::output::{fmt_bytes, Out};
use crate::{open, Cli};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use strata_core::format::Tier;

#[derive(Args)]
pub struct ForgetArgs {
    /// Snapshots: ids (prefixes), SERIES@VERSION, `latest`.
    #[arg(required = true)]
    snapshots: Vec<String>,
    /// Run gc afterwards.
    #[arg(long)]
    prune: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &ForgetArgs) -> Result<i32> {
    let (snapshots, prune) = (&a.snapshots, &a.prune);
    let repo = open(cli)?;
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    let mut ids = Vec::new();
    for s in snapshots {
        // A damaged snapshot can be named by its full id.
        match damaged.iter().find(|(id, _)| id == s) {
            Some((id, _)) => ids.push(id.clone()),
            None => ids.push(strata_store::repo::resolve_in(&all, s)?.0),
        }
    }
    ids.sort();
    ids.dedup();
    let started = std::time::Instant::now();
    let (cloud_ids, ids): (Vec<String>, Vec<String>) = ids
        .into_iter()
        .partition(|id| all.iter().any(|(i, s)| i == id && s.tier == Tier::Cloud));
    let mut cloud_forgotten = 0;
    if !cloud_ids.is_empty() {
        let c = tier::cloud(&repo)?;
        cloud_forgotten = strata_store::tier::forget_cloud(&repo, &c, &cloud_ids)?;
    }
    // Active versions some of whose files are in the cloud tier:
    // the bucket forgets those parts once the versions are gone.
    let parts: Vec<(String, String)> = all
        .iter()
        .filter(|(i, s)| ids.contains(i) && s.tier == Tier::Active)
        .filter_map(|(i, s)| Some((i.clone(), s.cloud_part.as_ref()?.recipe.clone())))
        .collect();
    let part_tier = match parts.is_empty() {
        true => None,
        false => Some(tier::cloud(&repo)?),
    };
    let mut rep = if ids.is_empty() {
        Default::default()
    } else {
        strata_store::forget::forget(&repo, &ids)?
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
        return super::gc::gc(cli, out, &repo, 0.2, false);
    }
    Ok(0)
}
