//! `strata backup`: a new version of a series from files, directories or
//! standard input; then the incremental lifecycle.

use crate::cli::{open, progress_for, repo_location, Cli};
use crate::lifecycle::{lifecycle_text, maintain_options, maintain_progress, maintain_text};
use crate::output::{fmt_bytes, Out};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use std::path::{Path, PathBuf};
use strata_core::chunker::ChunkerParams;
use strata_store::backend::Location;
use strata_store::ops::backup::{BackupOptions, StdinSource};
use strata_store::revdedup::{After, BackedUp};
use strata_store::Repository;

#[derive(Clone, Copy, ValueEnum)]
enum ChunkerArg {
    Cdc,
    Fixed,
}

#[derive(Args)]
pub struct BackupArgs {
    /// Files and directories to back up.
    paths: Vec<PathBuf>,
    /// Series name (default: host and absolute paths).
    #[arg(long)]
    series: Option<String>,
    /// Tag the snapshot (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// Back up standard input as one file.
    #[arg(long)]
    stdin: bool,
    /// File name for --stdin.
    #[arg(long, default_value = "stdin")]
    stdin_name: String,
    /// Read every file even if unchanged since the previous version.
    #[arg(long)]
    force_read: bool,
    /// Chunker: content-defined (default) or fixed 4 KiB (disk images).
    #[arg(long, value_enum)]
    chunker: Option<ChunkerArg>,
    /// Worker threads (default: number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Leave out files matching this glob (name, or absolute path if it contains '/'; repeatable).
    #[arg(long, short = 'e')]
    exclude: Vec<String>,
    /// Read more exclude patterns from this file (one per line; blank
    /// lines and lines starting with `#` are skipped; repeatable).
    #[arg(long, value_name = "FILE")]
    exclude_file: Vec<PathBuf>,
    /// Leave out directories that contain a file of this name, e.g.
    /// CACHEDIR.TAG or .nobackup (repeatable).
    #[arg(long, value_name = "NAME")]
    exclude_if_present: Vec<String>,
    /// Read the paths to back up from this file (one per line; `#`
    /// comments; repeatable), in addition to those given.
    #[arg(long, value_name = "FILE")]
    files_from: Vec<PathBuf>,
    /// Stay on each path's file system: mount points below it are kept
    /// as empty directories.
    #[arg(long, short = 'x')]
    one_file_system: bool,
    /// Do everything but commit: read, chunk and deduplicate, then report
    /// what the snapshot would add; nothing is written to the repository.
    #[arg(long, short = 'n')]
    dry_run: bool,
    /// Run a full `strata maintain` after the backup (by default the
    /// backup runs the incremental lifecycle: reverse dedup of the version
    /// that left the live window, expiry, compaction once it pays).
    #[arg(long, conflicts_with = "no_lifecycle")]
    maintain: bool,
    /// Skip the lifecycle after the backup (`strata maintain` catches up).
    #[arg(long)]
    no_lifecycle: bool,
}

/// The process's peak resident memory so far (`VmHWM`), if the system
/// tells.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Lines of a list file: blank lines and `#` comments skipped.
fn list_file(f: &Path, what: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(f)
        .with_context(|| format!("cannot read the {what} file {}", f.display()))?;
    Ok(text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

/// The paths and excludes `a` gives (its list files read).
fn paths_and_excludes(a: &BackupArgs) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let mut paths = a.paths.clone();
    for f in &a.files_from {
        paths.extend(list_file(f, "--files-from")?.into_iter().map(PathBuf::from));
    }
    let mut excludes = a.exclude.clone();
    for f in &a.exclude_file {
        excludes.extend(list_file(f, "--exclude-file")?);
    }
    if paths.is_empty() && !a.stdin {
        bail!("nothing to back up: give one or more paths, --files-from, or --stdin");
    }
    Ok((paths, excludes))
}

/// The backup `a` asks for, of `paths` but `excludes` (never the
/// repository itself).
fn options(
    cli: &Cli,
    a: &BackupArgs,
    repo: &Repository,
    (paths, excludes): (Vec<PathBuf>, Vec<String>),
) -> Result<BackupOptions> {
    let mut opts = BackupOptions {
        paths,
        exclude_if_present: a.exclude_if_present.clone(),
        one_file_system: a.one_file_system,
        series: a.series.clone(),
        tags: a.tag.clone(),
        force_read: a.force_read,
        chunker: a.chunker.map(|c| match c {
            ChunkerArg::Cdc => repo.config().chunker,
            ChunkerArg::Fixed => ChunkerParams::fixed(),
        }),
        excludes,
        // Never back the repository up into itself.
        exclude_paths: match repo_location(cli)? {
            Location::Local(p) => std::fs::canonicalize(p).into_iter().collect(),
            Location::S3(_) => vec![],
        },
        ..Default::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    if a.stdin {
        opts.stdin = Some(StdinSource {
            reader: Box::new(std::io::stdin()),
            name: a.stdin_name.clone(),
        });
    }
    Ok(opts)
}

pub fn run(cli: &Cli, out: &Out, a: &BackupArgs) -> Result<i32> {
    // (Before a password is asked for.)
    let sources = paths_and_excludes(a)?;
    let repo = match a.dry_run {
        true => open(cli)?.dry_run(),
        false => open(cli)?,
    };
    let mut opts = options(cli, a, &repo, sources)?;
    let pd = progress_for(cli, "backup");
    opts.progress = pd.progress.clone();
    // After the commit (once it is noted: an interruption during the
    // lifecycle must not say that nothing was committed): the incremental
    // lifecycle, or (`--maintain`) a whole `maintain` run whose report
    // joins the backup's output.
    let after = match (a.dry_run, a.maintain, a.no_lifecycle) {
        (true, _, _) | (_, false, true) => After::Nothing,
        (false, true, _) => After::Maintain(maintain_options((0.2, 0.5), false)?),
        (false, false, false) => After::Lifecycle,
    };
    let maintaining = match &after {
        After::Maintain(o) => Some(o.progress.clone()),
        _ => None,
    };
    let mut pd = Some(pd);
    let mut md = None;
    let res = strata_store::revdedup::backup(&repo, opts, after, &mut |rep| {
        if let Some(pd) = pd.take() {
            pd.finish();
        }
        if !a.dry_run {
            crate::interrupt::committed(format!("snapshot {}", crate::output::short(&rep.id)));
        }
        if let Some(p) = &maintaining {
            md = Some(maintain_progress(cli, p.clone()));
        }
    });
    if let Some(pd) = pd {
        pd.finish();
    }
    if let Some(md) = md {
        md.finish();
    }
    let done = res?;
    for w in &done.report.warnings {
        out.warn(w);
    }
    if let Some((strata_store::revdedup::AfterBackup::Failed { error }, _)) = &done.lifecycle {
        out.warn(&format!("the lifecycle after the backup failed (the backup is committed): {error}; run `strata maintain`"));
    }
    out.result(&result_json(&done, a.dry_run)?, || {
        result_text(&done, a.dry_run, cli.verbose > 0)
    });
    let rep = &done.report;
    let code = if rep.warnings.is_empty() {
        0
    } else {
        if !out.json {
            eprintln!(
                "warning: {} files or directories could not be read (listed above)",
                rep.warnings.len()
            );
        }
        3
    };
    Ok(code)
}

/// `backup --json`'s result.
fn result_json(done: &BackedUp, dry_run: bool) -> Result<serde_json::Value> {
    let rep = &done.report;
    let s = &rep.snapshot;
    let secs = s.stats.duration_ms as f64 / 1000.0;
    let mut v = json!({"id": rep.id, "short_id": crate::output::short(&rep.id), "series": s.series, "version": s.version,
                "files": s.stats.files, "dirs": s.stats.dirs, "logical_bytes": s.stats.logical_bytes,
                "read_bytes": s.stats.read_bytes, "new_chunks": s.stats.new_chunks,
                "new_raw_bytes": s.stats.new_raw_bytes, "new_stored_bytes": s.stats.new_stored_bytes,
                "reused_files": rep.reused_files, "seconds": secs, "index_ram_bytes": rep.index_ram_bytes,
                "warnings": rep.warnings, "threads": rep.threads, "stages": rep.stages,
                "parent_bytes": rep.parent_bytes, "similar_bytes": rep.similar_bytes, "delta": rep.delta,
                "peak_rss_bytes": peak_rss_bytes(), "process": crate::cli::process_figures(),
                "dry_run": dry_run});
    if let Some((m, msecs)) = &done.maintained {
        v["maintain"] = serde_json::to_value(m)?;
        v["maintain"]["seconds"] = json!(msecs);
    }
    if let Some((l, lsecs)) = &done.lifecycle {
        v["lifecycle"] = serde_json::to_value(l)?;
        v["lifecycle"]["seconds"] = json!(lsecs);
    }
    Ok(v)
}

/// `backup`'s result as text (`stages`: the pipeline's stages too).
fn result_text(done: &BackedUp, dry_run: bool, stages: bool) -> String {
    let rep = &done.report;
    let s = &rep.snapshot;
    let secs = s.stats.duration_ms as f64 / 1000.0;
    let text = format!(
        "{}snapshot {} {}: {}@{}\n  {} files ({} unchanged), {} dirs, {} logical, {} read\n  {} new chunks, {} new data, {} added to the repository\n  {:.1}s ({}/s)",
        if dry_run { "(dry run) " } else { "" },
        crate::output::short(&rep.id),
        if dry_run { "would be saved" } else { "saved" },
        s.series,
        s.version,
        s.stats.files,
        rep.reused_files,
        s.stats.dirs,
        fmt_bytes(s.stats.logical_bytes),
        fmt_bytes(s.stats.read_bytes),
        s.stats.new_chunks,
        fmt_bytes(s.stats.new_raw_bytes),
        fmt_bytes(s.stats.new_stored_bytes),
        secs,
        fmt_bytes((s.stats.logical_bytes as f64 / secs.max(1e-3)) as u64)
    );
    let mut text = match &done.lifecycle {
        Some((l, lsecs)) => format!("{text}\n{}", lifecycle_text(l, *lsecs)),
        None => text,
    };
    if stages {
        text += &format!(
            "\n  stages ({} workers; busy seconds, busy/wall):",
            rep.threads
        );
        for st in &rep.stages {
            text += &format!(
                "\n    {:<9} {:>7.2}s {:>5.2}  {}",
                serde_json::to_value(st.stage)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                st.busy_seconds,
                st.busy_of_wall,
                fmt_bytes(st.bytes)
            );
        }
    }
    match &done.maintained {
        Some((m, msecs)) => format!("{text}\n{}", maintain_text(m, *msecs)),
        None => text,
    }
}
