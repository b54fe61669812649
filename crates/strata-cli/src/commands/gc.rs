//! `strata gc`: mark and sweep of data no snapshot references.

use crate::cli::{open, Cli};
use crate::output::Out;
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct GcArgs {
    /// Rewrite containers with more than this fraction of dead data.
    #[arg(long, default_value_t = 0.2)]
    threshold: f64,
    /// Only report what would be freed.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &GcArgs) -> Result<i32> {
    let repo = open(cli)?;
    crate::prune::gc(cli, out, &repo, a.threshold, a.dry_run)
}
