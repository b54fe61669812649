//! `strata unlock`: remove stale locks.

use crate::cli::{open, Cli};
use crate::output::Out;
use anyhow::Result;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct UnlockArgs {
    /// Remove all locks, even of running processes.
    #[arg(long)]
    all: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &UnlockArgs) -> Result<i32> {
    let all = &a.all;
    let repo = open(cli)?;
    let removed = strata_store::repo::lock::unlock(&repo, *all)?;
    out.result(&json!({ "removed": removed }), || {
        format!("removed {} locks", removed.len())
    });
    Ok(0)
}
