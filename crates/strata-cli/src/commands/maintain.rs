//! `strata maintain`: the RevDedup lifecycle out of line.

use crate::output::{fmt_bytes, Out};
use crate::{open, progress_for, Cli};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use strata_store::Repository;

#[derive(Args)]
pub struct MaintainArgs {
    /// Rewrite pool containers with more than this fraction of dead data.
    #[arg(long, default_value_t = 0.2)]
    threshold: f64,
    /// Also rewrite pool containers with more than this fraction of
    /// data dead or held by one archival version alone, moving such
    /// chunks into containers stamped with their version (expiring it
    /// later deletes them without a scan; the newest versions' containers
    /// stay dense). 1 turns it off.
    #[arg(long, default_value_t = 0.5)]
    separate: f64,
    /// Only report what would be done.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &MaintainArgs) -> Result<i32> {
    let repo = open(cli)?;
    if !(0.0..=1.0).contains(&a.separate) {
        bail!("--separate must be between 0 and 1");
    }
    let (rep, secs) = run_maintain(cli, &repo, (a.threshold, a.separate), a.dry_run)?;
    let mut v = serde_json::to_value(&rep)?;
    v["seconds"] = json!(secs);
    out.result(&v, || maintain_text(&rep, secs));
    Ok(0)
}

pub(super) fn run_maintain(
    cli: &Cli,
    repo: &Repository,
    (threshold, separate): (f64, f64),
    dry_run: bool,
) -> Result<(strata_store::revdedup::MaintainReport, f64)> {
    if !(0.0..=1.0).contains(&threshold) {
        bail!("--threshold must be between 0 and 1");
    }
    let pd = progress_for(cli, "maintain");
    let opts = strata_store::revdedup::MaintainOptions {
        threshold,
        separate,
        dry_run,
        progress: pd.progress.clone(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let res = strata_store::revdedup::maintain(repo, &opts);
    pd.finish();
    Ok((res?, started.elapsed().as_secs_f64()))
}

pub(super) fn maintain_text(rep: &strata_store::revdedup::MaintainReport, secs: f64) -> String {
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
