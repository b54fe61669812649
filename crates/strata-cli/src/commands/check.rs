//! `strata check`: the repository's structure, and with --read-data
//! every byte of data.

use crate::cli::{open, progress_for, Cli};
use crate::output::{fmt_bytes, Out};
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct CheckArgs {
    /// Read and verify every region and chunk.
    #[arg(long)]
    read_data: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &CheckArgs) -> Result<i32> {
    let read_data = &a.read_data;
    let repo = open(cli)?;
    let pd = progress_for(cli, "check");
    let opts = strata_store::ops::check::CheckOptions {
        read_data: *read_data,
        progress: pd.progress.clone(),
    };
    let res = strata_store::ops::check::check(&repo, &opts);
    pd.finish();
    let rep = res?;
    for w in &rep.warnings {
        out.warn(w);
    }
    if !out.json {
        for e in &rep.errors {
            eprintln!("error: {e}");
        }
        for (id, paths) in &rep.damaged_paths {
            eprintln!(
                "snapshot {}: {} paths with unavailable data:",
                crate::output::short(id),
                paths.len()
            );
            for p in paths.iter().take(20) {
                eprintln!("  {p}");
            }
            if paths.len() > 20 {
                eprintln!("  … (all of them with --json)");
            }
        }
        if !rep.damaged_snapshots.is_empty() {
            eprintln!(
                "`strata repair snapshots --read-data` stores what the damaged snapshots still hold"
            );
        }
    }
    out.result(&serde_json::to_value(&rep)?, || {
        if rep.ok() {
            format!(
                "no errors: {} snapshots, {} containers, {} chunks{}",
                rep.snapshots,
                rep.containers,
                rep.chunks,
                if *read_data {
                    format!(
                        ", {} regions and {} read and verified",
                        rep.regions_read,
                        fmt_bytes(rep.bytes_read)
                    )
                } else {
                    String::new()
                }
            )
        } else {
            format!(
                "{} errors; damaged snapshots: {}",
                rep.errors.len(),
                rep.damaged_snapshots
                    .iter()
                    .map(|s| crate::output::short(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    });
    Ok(if rep.ok() { 0 } else { 1 })
}
