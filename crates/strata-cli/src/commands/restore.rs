//! `strata restore`: read a version from whichever tier holds it — and,
//! for a version some of whose files moved to the cloud tier (`tier
//! migrate --path`), from both.

use crate::cli::{open, progress_for, Cli};
use crate::output::{fmt_bytes, Out};
use crate::select::{path_bytes, show_path, FilterArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use strata_store::ops::restore::{Overwrite, RestoreOptions};

#[derive(Args)]
pub struct RestoreArgs {
    /// Snapshot: id (prefix), `latest`, SERIES@VERSION or SERIES@latest.
    snapshot: String,
    /// Directory to restore into (created if missing).
    #[arg(long, short)]
    target: PathBuf,
    /// Restore only these paths and what is below them (repeatable).
    #[arg(long, short)]
    include: Vec<OsString>,
    /// Leave out these paths and what is below them (repeatable).
    #[arg(long, short)]
    exclude: Vec<OsString>,
    /// What to do with files that already exist in the target. Without
    /// it, a target that is not empty is refused.
    #[arg(long, value_enum)]
    overwrite: Option<OverwriteArg>,
    /// Only say what would be restored.
    #[arg(long)]
    dry_run: bool,
    /// After restoring, read the restored files back and compare them
    /// with the snapshot's content.
    #[arg(long)]
    verify: bool,
    /// Containers read at once (default: the cores; from a bucket,
    /// twice the cores and at least 4, as reads wait on the network).
    #[arg(long)]
    readers: Option<usize>,
    /// Leave out device nodes and FIFOs (for a snapshot you do not trust).
    #[arg(long)]
    no_special: bool,
    /// Restore no set-user-id or set-group-id bit and no file
    /// capability (`security.capability`).
    #[arg(long)]
    no_setuid: bool,
    #[command(flatten)]
    filter: FilterArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum OverwriteArg {
    /// Replace existing files.
    Always,
    /// Replace files whose size or modification time differ.
    IfChanged,
    /// Replace files older than the snapshot's.
    IfNewer,
    /// Keep every existing file.
    Never,
}

impl From<OverwriteArg> for Overwrite {
    fn from(o: OverwriteArg) -> Self {
        match o {
            OverwriteArg::Always => Overwrite::Always,
            OverwriteArg::IfChanged => Overwrite::IfChanged,
            OverwriteArg::IfNewer => Overwrite::IfNewer,
            OverwriteArg::Never => Overwrite::Never,
        }
    }
}

/// Warnings printed one by one before the rest are summed up.
const WARNINGS_SHOWN: usize = 10;

pub fn run(cli: &Cli, out: &Out, a: &RestoreArgs) -> Result<i32> {
    let repo = open(cli)?;
    let (id, s) = repo.resolve_snapshot_in(&a.snapshot, &a.filter.filter())?;
    let (include, exclude) = (path_bytes(&a.include), path_bytes(&a.exclude));
    let whole = strata_store::repo::tiers::whole_skeleton(&repo, &s)?;
    let unmatched = strata_store::ops::restore::unmatched(&whole, &include);
    if !unmatched.is_empty() {
        bail!(
            "nothing in snapshot {} matches {} (paths as `strata ls {}` shows them)",
            a.snapshot,
            unmatched
                .iter()
                .map(|p| show_path(p.strip_prefix(b"/").unwrap_or(p)))
                .collect::<Vec<_>>()
                .join(", "),
            a.snapshot
        );
    }
    if a.overwrite.is_none() && !a.dry_run {
        refuse_non_empty(&a.target)?;
    }
    if a.dry_run {
        return dry_run(out, &id, &s, &whole, a, &include, &exclude);
    }
    drop(whole);
    let target = &a.target;
    let readers = a.readers;
    let mut opts = RestoreOptions::new(target);
    opts.include = include;
    opts.exclude = exclude;
    opts.overwrite = a.overwrite.map_or(Overwrite::Always, Overwrite::from);
    opts.no_special = a.no_special;
    opts.no_setuid = a.no_setuid;
    let pd = progress_for(cli, "restore");
    opts.progress = pd.progress.clone();
    let started = std::time::Instant::now();
    let tiers = crate::cli::tiers(&repo);
    let res = tiers.restore(&s, &mut opts, readers);
    pd.finish();
    let rep = res?;
    let secs = started.elapsed().as_secs_f64();
    let verified = match a.verify {
        true => Some(tiers.verify(&s, &opts)?),
        false => None,
    };
    for w in rep.warnings.iter().take(WARNINGS_SHOWN) {
        out.warn(w);
    }
    if rep.warnings.len() > WARNINGS_SHOWN {
        out.warn(&format!(
            "… and {} more warnings (all of them in --json)",
            rep.warnings.len() - WARNINGS_SHOWN
        ));
    }
    let mut v = json!({"snapshot": id, "target": target, "files": rep.files, "dirs": rep.dirs, "bytes": rep.bytes,
            "seconds": secs, "containers_read": rep.containers_read, "regions_read": rep.regions_read,
            "bytes_read": rep.bytes_read, "chain_hops": rep.chain_hops, "skipped": rep.skipped,
            "specials_left_out": rep.specials_left_out, "privileges_dropped": rep.privileges_dropped,
            "second_copies": rep.second_copies, "phases": rep.phases,
            "process": crate::cli::process_figures(),
            "tier": strata_store::tier::tier_name(&s), "warnings": rep.warnings});
    if let Some(ver) = &verified {
        v["verify"] = serde_json::to_value(ver)?;
    }
    out.result(&v, || {
        let mut t = format!(
            "restored {} ({}@{}) to {}: {} files, {} in {:.1}s ({}/s), {} containers read",
            crate::output::short(&id),
            s.series,
            s.version,
            target.display(),
            rep.files,
            fmt_bytes(rep.bytes),
            secs,
            fmt_bytes((rep.bytes as f64 / secs.max(1e-6)) as u64),
            rep.containers_read
        );
        if rep.skipped > 0 {
            t += &format!("; {} existing names left as they were", rep.skipped);
        }
        if rep.specials_left_out > 0 {
            t += &format!(
                "; {} device nodes and FIFOs left out",
                rep.specials_left_out
            );
        }
        if rep.privileges_dropped > 0 {
            t += &format!(
                "; {} set-id bits or capabilities dropped",
                rep.privileges_dropped
            );
        }
        if !rep.warnings.is_empty() {
            t += &format!("; {} warnings", rep.warnings.len());
        }
        if let Some(ver) = &verified {
            t += &format!(
                "\nverified {} files ({}): {}",
                ver.files,
                fmt_bytes(ver.bytes),
                match ver.mismatches.len() {
                    0 => "all match the snapshot".to_string(),
                    n => format!("{n} differ"),
                }
            );
        }
        t
    });
    if let Some(ver) = &verified {
        for m in &ver.mismatches {
            out.warn(m);
        }
        if !ver.mismatches.is_empty() {
            return Ok(1);
        }
    }
    Ok(0)
}

/// Without `--overwrite`, restore goes into a new or empty directory only:
/// merging into a populated tree is a choice to make explicitly.
fn refuse_non_empty(target: &std::path::Path) -> Result<()> {
    match std::fs::read_dir(target).map(|mut d| d.next().is_some()) {
        Ok(true) => bail!(
            "{} is not empty: restore into a new directory, or choose what happens to existing files with --overwrite always|if-changed|if-newer|never",
            target.display()
        ),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            Err(e).with_context(|| format!("cannot use {} as the restore target", target.display()))
        }
    }
}

/// `--dry-run`: what would be restored, nothing written.
fn dry_run(
    out: &Out,
    id: &str,
    s: &strata_core::format::Snapshot,
    whole: &strata_core::format::Recipe,
    a: &RestoreArgs,
    include: &[Vec<u8>],
    exclude: &[Vec<u8>],
) -> Result<i32> {
    // The nodes restore would write (a hard link whose first name is left
    // out becomes a file).
    let nodes = strata_store::ops::restore::select_nodes(whole, include, exclude);
    let files = nodes
        .iter()
        .filter(|n| n.kind == strata_core::format::NodeKind::File)
        .count();
    let bytes: u64 = nodes.iter().map(|n| n.size).sum();
    let existing = nodes
        .iter()
        .filter(|n| {
            n.kind != strata_core::format::NodeKind::Dir
                && std::fs::symlink_metadata(a.target.join(std::ffi::OsStr::from_bytes(&n.path)))
                    .is_ok()
        })
        .count();
    out.result(
        &json!({"snapshot": id, "target": a.target, "dry_run": true, "entries": nodes.len(),
                "files": files, "bytes": bytes, "existing": existing}),
        || {
            format!(
                "(dry run) would restore {} ({}@{}) to {}: {} entries, {} files, {}; {} names already exist there",
                crate::output::short(id),
                s.series,
                s.version,
                a.target.display(),
                nodes.len(),
                files,
                fmt_bytes(bytes),
                existing
            )
        },
    );
    Ok(0)
}
