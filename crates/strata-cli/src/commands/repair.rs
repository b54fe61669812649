//! `strata repair`: rebuild derived structures.

use crate::output::Out;
use crate::{open, Cli};
use anyhow::Result;
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand)]
pub enum RepairWhat {
    /// Rebuild the index from the containers' metadata.
    Index,
}

pub fn run(cli: &Cli, out: &Out, what: &RepairWhat) -> Result<i32> {
    match what {
        RepairWhat::Index => {
            let repo = open(cli)?;
            let (n, problems) = strata_store::gc::repair_index(&repo)?;
            for p in &problems {
                out.warn(p);
            }
            out.result(&json!({"containers": n, "problems": problems}), || {
                format!("index rebuilt from {n} containers")
            });
            Ok(if problems.is_empty() { 0 } else { 3 })
        }
    }
}
