//! The RevDedup lifecycle as `backup` and `maintain` report it, and the
//! `maintain` options both take.

use crate::cli::{progress_shown, Cli};
use crate::output::fmt_bytes;
use crate::output::ProgressDisplay;
use anyhow::{bail, Result};
use std::sync::Arc;
use strata_store::progress::Progress;
use strata_store::revdedup::{MaintainOptions, MaintainReport};

/// `maintain`'s options (`--threshold`, `--separate`, `--dry-run`), checked.
pub fn maintain_options(
    (threshold, separate): (f64, f64),
    dry_run: bool,
) -> Result<MaintainOptions> {
    if !(0.0..=1.0).contains(&threshold) {
        bail!("--threshold must be between 0 and 1");
    }
    if !(0.0..=1.0).contains(&separate) {
        bail!("--separate must be between 0 and 1");
    }
    Ok(MaintainOptions {
        threshold,
        separate,
        dry_run,
        ..Default::default()
    })
}

/// The progress display of a `maintain` run (its options' `progress`).
pub fn maintain_progress(cli: &Cli, progress: Arc<Progress>) -> ProgressDisplay {
    ProgressDisplay::watch("maintain", progress_shown(cli), progress)
}

/// One line on what the lifecycle after a backup did.
pub fn lifecycle_text(l: &strata_store::revdedup::AfterBackup, secs: f64) -> String {
    use strata_store::revdedup::AfterBackup;
    match l {
        AfterBackup::Done(m) => {
            let mut parts = Vec::new();
            for c in &m.converted {
                parts.push(format!(
                    "{}@{} reverse-deduplicated ({} now indirect)",
                    c.series,
                    c.version,
                    fmt_bytes(c.indirect_bytes)
                ));
            }
            if !m.expired.is_empty() {
                parts.push(format!("{} versions expired", m.expired.len()));
            }
            if m.compacted {
                parts.push(format!(
                    "pool compacted ({} freed)",
                    fmt_bytes(m.bytes_before.saturating_sub(m.bytes_after))
                ));
            }
            if parts.is_empty() {
                parts.push("nothing to do".into());
            }
            format!("  lifecycle: {} ({secs:.1}s)", parts.join("; "))
        }
        AfterBackup::Skipped { reason } => format!("  lifecycle skipped: {reason}"),
        AfterBackup::Failed { error } => format!("  lifecycle failed: {error}"),
    }
}

pub fn maintain_text(rep: &MaintainReport, secs: f64) -> String {
    let mut t = String::new();
    let pre = if rep.dry_run { "(dry run) " } else { "" };
    for c in &rep.converted {
        t += &format!(
            "{pre}reverse-deduplicated {}@{} against the next version: {} indirect, {} kept direct\n",
            c.series,
            c.version,
            fmt_bytes(c.indirect_bytes),
            fmt_bytes(c.direct_bytes),
        );
    }
    if !rep.expired.is_empty() {
        t += &format!(
            "{pre}expired {} versions: {} of archival data freed without scanning ({} stamped containers)\n",
            rep.expired.len(),
            fmt_bytes(rep.stamped_bytes_freed),
            rep.stamped_containers_deleted
        );
    }
    if rep.leftovers_deleted > 0 {
        t += &format!(
            "removed {} containers left by an interrupted run\n",
            rep.leftovers_deleted
        );
    }
    t += &format!(
        "{pre}pool: {} containers dropped, {} rewritten into {} ({} moved to stamped containers); {} -> {} ({secs:.1}s)",
        rep.pool.containers_deleted,
        rep.pool.containers_rewritten,
        rep.pool.containers_written,
        fmt_bytes(rep.pool.bytes_separated),
        fmt_bytes(rep.bytes_before),
        fmt_bytes(rep.bytes_after),
    );
    t
}
