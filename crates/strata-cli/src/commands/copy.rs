//! `strata copy --from-repo SRC [SNAPSHOT…]`: versions of another
//! repository stored in this one, deduplicated against what it holds.
//! Versions already copied (same series, host and time) are skipped, so
//! the command can run again and again.

use crate::cli::{open, progress_for, Cli};
use crate::location;
use crate::output::{fmt_bytes, Out};
use crate::password::Sources;
use crate::select::FilterArgs;
use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use strata_core::id::SnapshotId;
use strata_store::ops::repo_copy::{already_copied, copy_version, out_of_order, CopyOptions};
use strata_store::Repository;

#[derive(Args)]
pub struct CopyArgs {
    /// The repository to copy from (a directory or s3://…).
    #[arg(long, value_name = "REPO", env = "STRATA_FROM_REPO")]
    from_repo: String,
    /// The source repository's password from this file (else
    /// $STRATA_FROM_PASSWORD, --from-password-command, or a prompt).
    #[arg(long, value_name = "FILE", env = "STRATA_FROM_PASSWORD_FILE")]
    from_password_file: Option<PathBuf>,
    /// A command printing the source repository's password.
    #[arg(long, value_name = "CMD", env = "STRATA_FROM_PASSWORD_COMMAND")]
    from_password_command: Option<String>,
    /// Snapshots to copy (default: all, or those the filter selects).
    snapshots: Vec<String>,
    /// Worker threads (default: number of cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    filter: FilterArgs,
}

fn open_source(a: &CopyArgs) -> Result<Repository> {
    let loc = location::location(Some(&a.from_repo))?;
    let backend = location::backend(&loc, false)?;
    let pw = Sources {
        file: a.from_password_file.as_deref(),
        command: a.from_password_command.as_deref(),
        env: "STRATA_FROM_PASSWORD",
        flags: "--from-password-file or --from-password-command",
        question: "source repository password: ",
    };
    Ok(Repository::open(backend, &|| pw.read(false))
        .with_context(|| format!("opening the source repository {}", loc))?
        .with_cache(location::cache_base())
        .with_volumes(strata_link::DirVolumes::of(&loc)))
}

pub fn run(cli: &Cli, out: &Out, a: &CopyArgs) -> Result<i32> {
    let src = open_source(a)?;
    let dst = open(cli)?;
    if src.config().id == dst.config().id && src.backend().describe() == dst.backend().describe() {
        anyhow::bail!("the source and the destination are the same repository");
    }
    let (all, _) = src.list_snapshots_tolerant()?;
    let f = a.filter.filter();
    let host = strata_store::repo::lock::hostname();
    let mut chosen: Vec<(SnapshotId, strata_core::format::Snapshot)> = if a.snapshots.is_empty() {
        all.iter().filter(|(_, s)| f.matches(s)).cloned().collect()
    } else {
        a.snapshots
            .iter()
            .map(|spec| strata_store::repo::snapshots::resolve(&all, spec, &f, &host))
            .collect::<Result<_, _>>()?
    };
    // Oldest first, so each version deduplicates against the one before.
    chosen.sort_by_key(|(_, s)| (s.series.clone(), s.version, s.time_ns));
    chosen.dedup_by(|x, y| x.0 == y.0);
    let mut copied = Vec::new();
    let mut skipped = 0;
    let mut refused = 0;
    let mut warnings = 0;
    for (id, s) in &chosen {
        let (have, _) = dst.list_snapshots_tolerant()?;
        if already_copied(&have, s) {
            skipped += 1;
            continue;
        }
        if let Some(why) = out_of_order(&have, s) {
            out.warn(&format!(
                "{} ({}@{}) not copied: {why}",
                crate::output::short(id),
                s.series,
                s.version
            ));
            refused += 1;
            continue;
        }
        let pd = progress_for(cli, &format!("copy {}@{}", s.series, s.version));
        let opts = CopyOptions {
            threads: a
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            progress: pd.progress.clone(),
        };
        let res = copy_version(&crate::cli::tiers(&src).sources(s)?, s, &dst, opts);
        pd.finish();
        let rep = res.with_context(|| {
            format!(
                "copying {} ({}@{})",
                crate::output::short(id),
                s.series,
                s.version
            )
        })?;
        for w in &rep.warnings {
            out.warn(w);
        }
        warnings += rep.warnings.len();
        crate::interrupt::committed(format!("copy of {}", crate::output::short(id)));
        if !out.json && !out.quiet {
            println!(
                "copied {} ({}@{}) as {}: {} logical, {} added",
                crate::output::short(id),
                s.series,
                s.version,
                crate::output::short(&rep.id),
                fmt_bytes(rep.snapshot.stats.logical_bytes),
                fmt_bytes(rep.snapshot.stats.new_stored_bytes)
            );
        }
        copied.push(
            json!({"from": id, "id": rep.id, "series": s.series, "version": rep.snapshot.version,
                           "logical_bytes": rep.snapshot.stats.logical_bytes,
                           "new_stored_bytes": rep.snapshot.stats.new_stored_bytes}),
        );
    }
    out.result(
        &json!({"copied": copied, "already_present": skipped, "refused": refused}),
        || {
            format!(
                "{} snapshots copied, {} already present{}",
                copied.len(),
                skipped,
                match refused {
                    0 => String::new(),
                    n => format!(", {n} refused (see above)"),
                }
            )
        },
    );
    // 3: finished, but not everything asked for is there.
    Ok(if warnings > 0 || refused > 0 { 3 } else { 0 })
}
