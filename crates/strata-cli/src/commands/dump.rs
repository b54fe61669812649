//! `strata dump`: one file of a snapshot to stdout, from whichever tier
//! holds it.

use super::tier;
use crate::select::{show_path, FilterArgs};
use crate::{open, Cli};
use anyhow::{bail, Result};
use clap::Args;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use strata_store::fsread::{find_stored, FileReader, RegionCache, DEFAULT_REGION_CACHE_BYTES};

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
    parts.extend(strata_store::tier::paths::part_snapshot(&s));
    for (i, part) in parts.into_iter().enumerate() {
        let Some(found) = find_stored(&repo, &part.recipe, want)? else {
            continue;
        };
        let data = tier::part_data(&repo, &part, i > 0)?;
        let cache = Arc::new(RegionCache::new(DEFAULT_REGION_CACHE_BYTES));
        let file = found.open(&data, &part, cache)?;
        let stdout = std::io::stdout();
        return match copy_out(&file, &mut stdout.lock()) {
            // `strata dump … | head`: the reader has what it wanted.
            Err(e)
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
            {
                Ok(0)
            }
            r => r.map(|_| 0),
        };
    }
    bail!(
        "no file {shown} in snapshot {} (see `strata ls {}`)",
        a.snapshot,
        a.snapshot
    )
}

/// Writes the whole of `file` to `out`, 4 MiB at a time.
fn copy_out(file: &FileReader, out: &mut impl Write) -> Result<()> {
    const STEP: usize = 4 << 20;
    let mut at = 0u64;
    while at < file.size() {
        let bytes = file.read_at(at, STEP)?;
        if bytes.is_empty() {
            bail!("{} ends before its size", file.path());
        }
        out.write_all(&bytes)?;
        at += bytes.len() as u64;
    }
    out.flush()?;
    Ok(())
}
