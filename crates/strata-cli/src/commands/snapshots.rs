//! `strata snapshots`: the versions, their lifecycle state and tier.

use crate::cli::{open, Cli};
use crate::output::{fmt_bytes, fmt_time, json_time, Out};
use crate::select::FilterArgs;
use anyhow::Result;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct SnapshotsArgs {
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(cli: &Cli, out: &Out, a: &SnapshotsArgs) -> Result<i32> {
    let filter = a.filter.filter();
    let repo = open(cli)?;
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    for (id, e) in &damaged {
        out.warn(&format!(
            "snapshot {id} cannot be read ({e}); `strata forget {id}` drops it"
        ));
    }
    let policies = strata_store::repo::lifecycle::list_policies(&repo)?;
    let states = strata_store::repo::lifecycle::display_states(
        &all,
        &policies,
        strata_store::repo::now_ns(),
    );
    let state = |id: &str| states.get(id).cloned().unwrap_or_default();
    let list: Vec<_> = all.iter().filter(|(_, s)| filter.matches(s)).collect();
    if out.json {
        let v: Vec<_> = list
            .iter()
            .map(|(id, s)| {
                json!({"id": id, "short_id": crate::output::short(id), "series": s.series, "version": s.version,
                       "time": json_time(s.time_ns), "time_ns": s.time_ns, "host": s.host, "paths": s.paths,
                       "tags": s.tags, "logical_bytes": s.stats.logical_bytes,
                       "new_stored_bytes": s.stats.new_stored_bytes, "files": s.stats.files,
                       "duration_ms": s.stats.duration_ms, "state": state(id),
                       "reverse_deduplicated": s.archival.is_some(),
                       "archival": s.archival,
                       "tier": strata_store::tier::tier_name(s), "cloud_part": s.cloud_part})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if !out.quiet {
        println!(
            "{:<10} {:<40} {:>4}  {:<20} {:>10} {:>10}  {:<8} {:<12} tags",
            "id", "series", "ver", "time", "size", "new", "state", "tier"
        );
        for (id, s) in &list {
            println!(
                "{:<10} {:<40} {:>4}  {:<20} {:>10} {:>10}  {:<8} {:<12} {}",
                crate::output::short(id),
                s.series,
                s.version,
                fmt_time(s.time_ns),
                fmt_bytes(s.stats.logical_bytes),
                fmt_bytes(s.stats.new_stored_bytes),
                state(id),
                strata_store::tier::tier_name(s),
                s.tags.join(",")
            );
        }
        println!("{} snapshots", list.len());
        if list.iter().any(|(id, _)| state(id) == "archival*") {
            println!("archival* = left the live window; the next backup or `strata maintain` reverse-deduplicates it");
        }
    }
    Ok(0)
}
