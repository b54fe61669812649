//! The gc that `gc` and `forget --prune` run, and its report.

use crate::cli::{progress_for, Cli};
use crate::output::{fmt_bytes, Out};
use anyhow::{bail, Result};
use serde_json::json;
use strata_store::Repository;

/// Collects what no snapshot references (containers with more than
/// `threshold` dead rewritten) and prints the report.
pub fn gc(cli: &Cli, out: &Out, repo: &Repository, threshold: f64, dry_run: bool) -> Result<i32> {
    if !(0.0..=1.0).contains(&threshold) {
        bail!("--threshold must be between 0 and 1");
    }
    let pd = progress_for(cli, "gc");
    let opts = strata_store::ops::gc::GcOptions {
        threshold,
        dry_run,
        progress: pd.progress.clone(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let res = strata_store::ops::gc::gc(repo, &opts);
    pd.finish();
    let rep = res?;
    let mut v = serde_json::to_value(&rep)?;
    v["seconds"] = json!(started.elapsed().as_secs_f64());
    out.result(&v, || {
        let mut t = format!(
            "{}{} freed: {} containers deleted, {} rewritten into {}, {} orphans removed; {} -> {}",
            if dry_run { "(dry run) " } else { "" },
            fmt_bytes(rep.bytes_freed),
            rep.containers_deleted,
            rep.containers_rewritten,
            rep.containers_written,
            rep.orphans_deleted,
            fmt_bytes(rep.bytes_before),
            fmt_bytes(rep.bytes_after)
        );
        if rep.temporaries_deleted > 0 {
            t += &format!(
                "\n{} left by interrupted writers deleted ({} temporary files)",
                fmt_bytes(rep.temporary_bytes_deleted),
                rep.temporaries_deleted
            );
        }
        t
    });
    Ok(0)
}
