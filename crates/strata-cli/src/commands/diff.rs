//! `strata diff SNAP1 SNAP2`: what changed between two versions, from
//! their recipes alone (no data is read).

use crate::cli::{open, Cli};
use crate::output::{fmt_bytes, Out};
use crate::select::{json_path, show_path, FilterArgs};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use strata_store::ops::treediff::{diff_snapshots, Change};

#[derive(Args)]
pub struct DiffArgs {
    /// The older snapshot: id (prefix), SERIES@VERSION, `latest`.
    old: String,
    /// The newer snapshot.
    new: String,
    /// Leave out directories whose only change is their own metadata
    /// (their times change whenever an entry does).
    #[arg(long)]
    no_dir_metadata: bool,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(cli: &Cli, out: &Out, a: &DiffArgs) -> Result<i32> {
    let repo = open(cli)?;
    let f = a.filter.filter();
    let (oid, old) = repo.resolve_snapshot_in(&a.old, &f)?;
    let (nid, new) = repo.resolve_snapshot_in(&a.new, &f)?;
    let (mut entries, mut summary) = diff_snapshots(&repo, &old, &new)?;
    if a.no_dir_metadata {
        let before = entries.len();
        entries.retain(|e| {
            !(e.change == Change::Metadata && e.kind == strata_core::format::NodeKind::Dir)
        });
        summary.metadata -= (before - entries.len()) as u64;
    }
    if out.json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                json_path(&mut v, "path", &e.path);
                v
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"old": oid, "new": nid, "changes": v, "summary": summary})
            )?
        );
        return Ok(0);
    }
    if !out.quiet {
        println!(
            "comparing {} ({}@{}) to {} ({}@{})",
            crate::output::short(&oid),
            old.series,
            old.version,
            crate::output::short(&nid),
            new.series,
            new.version
        );
        for e in &entries {
            let mark = match e.change {
                Change::Added => '+',
                Change::Removed => '-',
                Change::Modified => 'M',
                Change::Metadata => 'U',
            };
            let sizes = match (e.old_size, e.new_size) {
                (Some(a), Some(b)) if a != b => format!("  {} -> {}", fmt_bytes(a), fmt_bytes(b)),
                (None, Some(b)) | (Some(b), None) => format!("  {}", fmt_bytes(b)),
                _ => String::new(),
            };
            let what = match e.change {
                Change::Metadata => format!("  ({})", e.what.join(", ")),
                _ => String::new(),
            };
            println!("{mark}    {}{sizes}{what}", show_path(&e.path));
        }
        println!(
            "\n{} added ({}), {} removed ({}), {} modified, {} metadata only",
            summary.added,
            fmt_bytes(summary.added_bytes),
            summary.removed,
            fmt_bytes(summary.removed_bytes),
            summary.modified,
            summary.metadata
        );
    }
    Ok(0)
}
