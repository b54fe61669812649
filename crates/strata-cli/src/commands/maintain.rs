//! `strata maintain`: the RevDedup lifecycle out of line.

use crate::cli::{open, Cli};
use crate::lifecycle::{maintain_options, maintain_progress, maintain_text};
use crate::output::Out;
use anyhow::Result;
use clap::Args;
use serde_json::json;

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
    let opts = maintain_options((a.threshold, a.separate), a.dry_run)?;
    let pd = maintain_progress(cli, opts.progress.clone());
    let started = std::time::Instant::now();
    let res = strata_store::revdedup::maintain(&repo, &opts);
    pd.finish();
    let (rep, secs) = (res?, started.elapsed().as_secs_f64());
    let mut v = serde_json::to_value(&rep)?;
    v["seconds"] = json!(secs);
    out.result(&v, || maintain_text(&rep, secs));
    Ok(0)
}
