//! A backup and the lifecycle after it: the version committed (and the
//! backup's lock released), then the incremental lifecycle, or a whole
//! `maintain` run, or nothing.

use super::maintain::{after_backup, maintain, AfterBackup, MaintainOptions, MaintainReport};
use crate::error::Result;
use crate::ops::backup::{BackupOptions, BackupReport};
use crate::repo::Repository;
use std::time::Instant;

/// What runs once a backup is committed.
#[derive(Default)]
pub enum After {
    /// The incremental lifecycle ([`after_backup`]): reverse dedup of the
    /// version that left the live window, expiry, compaction once it pays.
    #[default]
    Lifecycle,
    /// A whole `maintain` run (compaction every time).
    Maintain(MaintainOptions),
    /// Nothing (`--no-lifecycle`, a dry run).
    Nothing,
}

/// What [`backup`] did.
#[derive(Debug, Clone)]
pub struct BackedUp {
    pub report: BackupReport,
    /// The incremental lifecycle's report, and its seconds.
    pub lifecycle: Option<(AfterBackup, f64)>,
    /// The `maintain` run's report, and its seconds.
    pub maintained: Option<(MaintainReport, f64)>,
}

/// Runs a backup, commits it, tells `committed` (before anything else
/// runs: an interruption from then on loses nothing of the backup), then
/// runs `after`. A failed incremental lifecycle is in its report (the
/// backup stands); a failed `maintain` run is this call's error.
pub fn backup(
    repo: &Repository,
    opts: BackupOptions,
    after: After,
    committed: &mut dyn FnMut(&BackupReport),
) -> Result<BackedUp> {
    // Everything the backup held (index, previous recipe, its lock) is
    // released before the lifecycle runs.
    let report = crate::ops::backup::backup(repo, opts)?;
    committed(&report);
    let mut done = BackedUp {
        report,
        lifecycle: None,
        maintained: None,
    };
    let t = Instant::now();
    match after {
        After::Nothing => {}
        After::Lifecycle => {
            let l = after_backup(repo, done.report.reverse_hint.clone());
            done.lifecycle = Some((l, t.elapsed().as_secs_f64()));
        }
        After::Maintain(opts) => {
            let m = maintain(repo, &opts)?;
            done.maintained = Some((m, t.elapsed().as_secs_f64()));
        }
    }
    done.report.restate_lost(repo)?;
    Ok(done)
}
