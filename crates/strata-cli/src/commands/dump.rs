//! `strata dump`: one file of a snapshot to stdout, from whichever tier
//! holds it.

use crate::cli::{open, Cli};
use crate::select::{show_path, FilterArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use strata_store::engine::fsread::{find_stored, RegionCache};

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
    // The active part first, then the cloud part (where moved files are);
    // the recipe read a part at a time, only the file's chunk runs kept.
    let mut parts = vec![s.clone()];
    parts.extend(strata_store::repo::tiers::part_snapshot(&s));
    for (i, part) in parts.into_iter().enumerate() {
        let Some(found) = find_stored(&repo, &part.recipe, want)? else {
            continue;
        };
        let data = crate::cli::tiers(&repo).part_data(&part, i > 0)?;
        // (Read once from start to end: no region cache.)
        let file = found.open(&data, &part, Arc::new(RegionCache::new(0)))?;
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
        return match file.copy_to(&mut w) {
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
