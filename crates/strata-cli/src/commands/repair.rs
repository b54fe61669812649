//! `strata repair`: rebuild derived structures, salvage damaged snapshots.

use crate::cli::{open, progress_for, Cli};
use crate::output::{short, Out};
use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

#[derive(Subcommand)]
pub enum RepairWhat {
    /// Rebuild the index from the containers' metadata.
    Index,
    /// Store what damaged snapshots still hold, without their lost paths.
    ///
    /// Each is saved again without the paths whose data is lost, in the series
    /// `SERIES.repaired` (same time, host and paths, tag `repaired`); the lost
    /// paths are listed. Refused while the index needs `strata repair index`;
    /// snapshots with data in the cloud tier are left alone; a second run
    /// stores nothing twice.
    Snapshots(SnapshotsArgs),
}

#[derive(Args)]
pub struct SnapshotsArgs {
    /// Read every byte to find damage (else only missing or truncated
    /// containers and unreadable objects are found).
    #[arg(long)]
    read_data: bool,
    /// Remove the damaged originals once their salvage is stored (and
    /// snapshots with nothing left to salvage).
    #[arg(long)]
    forget: bool,
    /// Only say what would be salvaged and lost.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(cli: &Cli, out: &Out, what: &RepairWhat) -> Result<i32> {
    match what {
        RepairWhat::Index => {
            let repo = open(cli)?;
            let (n, problems) = strata_store::ops::gc::repair_index(&repo)?;
            for p in &problems {
                out.warn(p);
            }
            out.result(&json!({"containers": n, "problems": problems}), || {
                format!("index rebuilt from {n} containers")
            });
            Ok(if problems.is_empty() { 0 } else { 3 })
        }
        RepairWhat::Snapshots(a) => snapshots(cli, out, a),
    }
}

/// Exit 0: nothing damaged, or everything salvaged without loss; 3: paths
/// or snapshots were lost (listed), or a salvage failed.
fn snapshots(cli: &Cli, out: &Out, a: &SnapshotsArgs) -> Result<i32> {
    let repo = open(cli)?;
    let pd = progress_for(cli, "repair");
    let opts = strata_store::ops::repair::RepairOptions {
        read_data: a.read_data,
        forget: a.forget,
        dry_run: a.dry_run,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        progress: pd.progress.clone(),
    };
    let res = strata_store::ops::repair::repair_snapshots(&repo, &opts);
    pd.finish();
    let rep = res?;
    let mut lossy = false;
    for r in &rep.snapshots {
        lossy |= r.lost_entirely || !r.lost_paths.is_empty() || r.error.is_some();
        if let Some(e) = &r.error {
            out.warn(&format!("snapshot {}: {e}", short(&r.id)));
        }
    }
    if let Some(e) = &rep.forget_error {
        lossy = true;
        out.warn(e);
    }
    out.result(&serde_json::to_value(&rep)?, || repair_text(&rep));
    Ok(if lossy { 3 } else { 0 })
}

fn repair_text(rep: &strata_store::ops::repair::RepairReport) -> String {
    if rep.snapshots.is_empty() {
        return "no damaged snapshots".into();
    }
    let mut lines = Vec::new();
    for r in &rep.snapshots {
        let name = match (&r.series, r.version) {
            (Some(s), Some(v)) => format!("{} ({s}@{v})", short(&r.id)),
            _ => short(&r.id).to_string(),
        };
        let fate = if r.lost_entirely {
            "nothing to salvage".to_string()
        } else if let Some(new) = &r.repaired_as {
            format!(
                "saved as {} in {} ({} entries)",
                short(new),
                r.repaired_series.as_deref().unwrap_or(""),
                r.kept_entries
            )
        } else if rep.dry_run {
            format!(
                "would be saved in {}",
                r.repaired_series.as_deref().unwrap_or("")
            )
        } else {
            "not saved".into()
        };
        let forgotten = if r.forgotten {
            "; original forgotten"
        } else {
            ""
        };
        lines.push(format!("snapshot {name}: {fate}{forgotten}"));
        if !r.lost_paths.is_empty() {
            lines.push(format!("  {} paths lost:", r.lost_paths.len()));
            for p in &r.lost_paths {
                lines.push(format!("    {p}"));
            }
        }
    }
    lines.join("\n")
}
