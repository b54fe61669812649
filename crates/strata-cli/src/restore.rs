//! `strata restore` and `strata dump`: read a version from whichever tier
//! holds it — and, for a version some of whose files moved to the cloud
//! tier (`tier migrate --path`), from both.

use crate::output::{fmt_bytes, Out};
use crate::{open, progress_for, tier, Cli};
use anyhow::{anyhow, bail, Result};
use serde_json::json;
use std::path::Path;
use strata_core::format::{NodeKind, Recipe};
use strata_store::restore::{RestoreOptions, RestoreReport};

pub fn dump(cli: &Cli, snapshot: &str, path: &str) -> Result<i32> {
    let repo = open(cli)?;
    let (_, s) = repo.resolve_snapshot(snapshot)?;
    let want = path.trim_start_matches('/').as_bytes();
    // The active recipe first; its cloud part only when the file moved.
    let mut parts = vec![s.clone()];
    parts.extend(strata_store::tier::paths::part_snapshot(&s));
    for (i, part) in parts.iter().enumerate() {
        let r = repo.load_recipe(&part.recipe)?;
        let Some(node) = r.nodes.iter().find(|n| n.path == want) else {
            continue;
        };
        // A further name of a hard-linked file: dump the first name's content.
        let node = match (node.kind, &node.target) {
            (NodeKind::Hardlink, Some(t)) => {
                r.nodes.iter().find(|n| &n.path == t).ok_or_else(|| {
                    anyhow!("{path} is a hard link to a file missing from the snapshot")
                })?
            }
            _ => node,
        };
        if node.kind != NodeKind::File {
            bail!("{path} is a {:?}, not a file", node.kind);
        }
        let data = match i {
            0 => tier::data_repo(&repo, part)?,
            _ => tier::cloud(&repo)?,
        };
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
        strata_store::restore::dump(&data, part, &r, node, &mut w)?;
        return Ok(0);
    }
    bail!("no file {path} in snapshot {snapshot} (see `strata ls {snapshot}`)")
}

pub fn restore(
    cli: &Cli,
    out: &Out,
    snapshot: &str,
    target: &Path,
    include: &[String],
    readers: Option<usize>,
) -> Result<i32> {
    let repo = open(cli)?;
    let (id, s) = repo.resolve_snapshot(snapshot)?;
    if !include.is_empty() {
        all_matched(
            &strata_store::tier::paths::whole_recipe(&repo, &s)?,
            include,
            snapshot,
        )?;
    }
    let mut opts = RestoreOptions::new(target);
    opts.include = include.to_vec();
    let pd = progress_for(cli, "restore");
    opts.progress = pd.progress.clone();
    let started = std::time::Instant::now();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut rep = RestoreReport::default();
    let mut res = Ok(());
    let sources = tier::sources(&repo, &s)?;
    let n = sources.len();
    for (i, (data, part)) in sources.into_iter().enumerate() {
        opts.dir_metadata = i + 1 == n;
        opts.readers = readers.unwrap_or(if data.backend().describe().starts_with("s3://") {
            (2 * cores).max(4)
        } else {
            0
        });
        let r = repo.load_recipe(&part.recipe)?;
        match strata_store::restore::restore(&data, &part, &r, &opts) {
            Ok(x) => add(&mut rep, x, i + 1 == n),
            Err(e) => {
                res = Err(e);
                break;
            }
        }
    }
    pd.finish();
    res?;
    let secs = started.elapsed().as_secs_f64();
    for w in &rep.warnings {
        out.warn(w);
    }
    out.result(
        &json!({"snapshot": id, "target": target, "files": rep.files, "dirs": rep.dirs, "bytes": rep.bytes,
                "seconds": secs, "containers_read": rep.containers_read, "regions_read": rep.regions_read,
                "bytes_read": rep.bytes_read, "chain_hops": rep.chain_hops,
                "tier": tier::tier_name(&s), "warnings": rep.warnings}),
        || {
            format!(
                "restored {} ({}@{}) to {}: {} files, {} in {:.1}s ({}/s), {} containers read",
                &id[..8],
                s.series,
                s.version,
                target.display(),
                rep.files,
                fmt_bytes(rep.bytes),
                secs,
                fmt_bytes((rep.bytes as f64 / secs.max(1e-6)) as u64),
                rep.containers_read
            )
        },
    );
    Ok(0)
}

/// Adds a part's restore to the total; a cloud part's directories are
/// the active part's too and count once (the last pass's).
fn add(total: &mut RestoreReport, r: RestoreReport, last: bool) {
    total.files += r.files;
    if last {
        total.dirs = r.dirs;
    }
    total.bytes += r.bytes;
    total.containers_read += r.containers_read;
    total.regions_read += r.regions_read;
    total.bytes_read += r.bytes_read;
    total.chain_hops += r.chain_hops;
    total.warnings.extend(r.warnings);
}

/// Whether `path` (a recipe node's) is `pattern` or below it (`/` and a
/// trailing `/` ignored, as `ls` and `restore --include` take them).
pub fn under(path: &[u8], pattern: &str) -> bool {
    let p = pattern
        .trim_start_matches('/')
        .trim_end_matches('/')
        .as_bytes();
    p.is_empty() || (path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/'))
}

/// Refuses paths that select nothing in the snapshot (a typo would
/// otherwise print or restore nothing and succeed).
pub fn all_matched(r: &Recipe, paths: &[String], snapshot: &str) -> Result<()> {
    let unmatched: Vec<&str> = paths
        .iter()
        .filter(|p| !r.nodes.iter().any(|n| under(&n.path, p)))
        .map(String::as_str)
        .collect();
    if !unmatched.is_empty() {
        bail!(
            "nothing in snapshot {snapshot} matches {} (paths as `strata ls {snapshot}` shows them)",
            unmatched.join(", ")
        );
    }
    Ok(())
}
