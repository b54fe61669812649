//! `strata find PATTERN…`: which snapshots hold matching paths.

use crate::cli::{open, Cli};
use crate::output::{fmt_bytes, fmt_time, json_time, Out};
use crate::select::{json_path, show_path, FilterArgs};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use strata_store::ops::treediff::{find_in, Matcher};

#[derive(Args)]
pub struct FindArgs {
    /// Glob patterns: without `/` they match a name, with a leading `/`
    /// the whole path from the snapshot root, otherwise a path ending at
    /// any depth (`*` stays within a name, `**` crosses directories).
    #[arg(required = true)]
    patterns: Vec<String>,
    /// Only these snapshots (ids, SERIES@VERSION, `latest`; repeatable).
    #[arg(long = "snapshot", short = 's')]
    snapshots: Vec<String>,
    /// Match without regard to case.
    #[arg(long, short = 'i')]
    ignore_case: bool,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(cli: &Cli, out: &Out, a: &FindArgs) -> Result<i32> {
    let repo = open(cli)?;
    let m = Matcher::new(&a.patterns, a.ignore_case)?;
    let f = a.filter.filter();
    let (all, damaged) = repo.list_snapshots_tolerant()?;
    for (id, e) in &damaged {
        out.warn(&format!("snapshot {id} cannot be read ({e}); skipped"));
    }
    let snaps: Vec<_> = if a.snapshots.is_empty() {
        all.iter().filter(|(_, s)| f.matches(s)).cloned().collect()
    } else {
        let host = strata_store::repo::lock::hostname();
        a.snapshots
            .iter()
            .map(|spec| strata_store::repo::snapshots::resolve(&all, spec, &f, &host))
            .collect::<Result<_, _>>()?
    };
    let mut hits = Vec::new();
    let mut unreadable = 0;
    for (id, s) in &snaps {
        match strata_store::repo::tiers::whole_skeleton(&repo, s) {
            Ok(r) => hits.extend(find_in(id, s, &r, &m)),
            Err(e) => {
                unreadable += 1;
                out.warn(&format!(
                    "snapshot {} cannot be read ({e}); skipped",
                    crate::output::short(id)
                ));
            }
        }
    }
    if hits.is_empty() {
        bail!(
            "no path matching {} in {} snapshots",
            a.patterns.join(" "),
            snaps.len() - unreadable
        );
    }
    if out.json {
        let v: Vec<_> = hits
            .iter()
            .map(|h| {
                let mut v = json!({"snapshot": h.snapshot_id, "series": h.series, "version": h.version,
                    "time": json_time(h.time_ns), "path": show_path(&h.path), "type": h.kind.id(),
                    "size": h.size, "mtime": json_time(h.mtime_ns)});
                json_path(&mut v, "path", &h.path);
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if !out.quiet {
        let mut last = None;
        for h in &hits {
            if last != Some(&h.snapshot_id) {
                println!(
                    "snapshot {} ({}@{}, {}):",
                    crate::output::short(&h.snapshot_id),
                    h.series,
                    h.version,
                    fmt_time(h.time_ns)
                );
                last = Some(&h.snapshot_id);
            }
            println!(
                "  {}{:>10}  {}  {}",
                h.kind.letter(),
                fmt_bytes(h.size),
                fmt_time(h.mtime_ns),
                show_path(&h.path)
            );
        }
    }
    Ok(0)
}
