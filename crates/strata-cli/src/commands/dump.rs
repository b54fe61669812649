//! `strata dump`: one file of a snapshot to stdout, from whichever tier
//! holds it.

use super::tier;
use crate::select::{show_path, FilterArgs};
use crate::{open, Cli};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use strata_core::format::NodeKind;

#[derive(Args)]
pub struct DumpArgs {
    /// Snapshot: id (prefix), `latest`, SERIES@VERSION or SERIES@latest.
    snapshot: String,
    /// The file, as `strata ls` shows it (need not be UTF-8).
    path: OsString,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(cli: &Cli, a: &DumpArgs) -> Result<i32> {
    let repo = open(cli)?;
    let (_, s) = repo.resolve_snapshot_in(&a.snapshot, &a.filter.filter())?;
    let mut want = a.path.as_bytes();
    while let [b'/', rest @ ..] = want {
        want = rest;
    }
    let shown = show_path(want);
    if let Some((part, r, cloud_part)) = tier::locate(&repo, &s, want)? {
        let node = r
            .nodes
            .iter()
            .find(|n| n.path == want)
            .ok_or_else(|| anyhow!("{shown} left the recipe"))?;
        // A further name of a hard-linked file: dump the first name's content.
        let node = match (node.kind, &node.target) {
            (NodeKind::Hardlink, Some(t)) => {
                r.nodes.iter().find(|n| &n.path == t).ok_or_else(|| {
                    anyhow!("{shown} is a hard link to a file missing from the snapshot")
                })?
            }
            _ => node,
        };
        if node.kind != NodeKind::File {
            bail!("{shown} is {}, not a file", node.kind.noun());
        }
        let data = tier::part_data(&repo, &part, cloud_part)?;
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
        return match strata_store::restore::dump(&data, &part, &r, node, &mut w) {
            // `strata dump … | head`: the reader has what it wanted.
            Err(strata_store::StoreError::Io { cause, .. })
                if cause.kind() == std::io::ErrorKind::BrokenPipe =>
            {
                Ok(0)
            }
            r => r.map(|_| 0).map_err(Into::into),
        };
    }
    bail!(
        "no file {shown} in snapshot {} (see `strata ls {}`)",
        a.snapshot,
        a.snapshot
    )
}
