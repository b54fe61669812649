//! What a killed `volume snapshot` leaves linked: containers no version
//! references, whose blocks the volume keeps held. Each linking snapshot
//! records itself beside the volume (`.NAME.snapshot-PID`: its host and
//! pid) and removes the record when it ends; a record whose process on
//! this host is gone tells the next snapshot of the volume to release
//! what no index lists (`strata_store::link::sweep_unindexed`) before it
//! begins, instead of leaving it to gc.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use strata_store::Repository;

/// This snapshot's record; removed when dropped.
pub(super) struct Running(PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Removes every record of a snapshot of volume `name` (deleted).
pub(super) fn forget(root: &Path, name: &str) {
    let prefix = format!(".{name}.snapshot-");
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Records of snapshots of volume `name` whose process on this host is
/// gone.
fn stale_records(root: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!(".{name}.snapshot-");
    let host = strata_store::lock::hostname();
    let mut stale = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let mut lines = text.lines();
        let (h, pid) = (lines.next(), lines.next().and_then(|p| p.parse().ok()));
        // (A record another host wrote, or one cut short, says nothing.)
        if let (Some(h), Some(pid)) = (h, pid) {
            if h == host && !strata_store::lock::pid_alive(pid) {
                stale.push(e.path());
            }
        }
    }
    stale
}

/// Before a linking snapshot of volume `name`: what killed ones left is
/// released (when the repository's exclusive lock can be had now; else
/// it waits for the next snapshot, or gc), and this one recorded.
/// Returns the record and the containers released.
pub(super) fn start(root: &Path, name: &str, repo: &Repository) -> Result<(Running, u64)> {
    let stale = stale_records(root, name);
    let mut released = 0;
    if !stale.is_empty() {
        let swept = strata_store::link::sweep_unindexed(repo, name).with_context(|| {
            format!("releasing what a killed snapshot of volume {name} left linked")
        })?;
        if let Some(n) = swept {
            released = n;
            for p in &stale {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let me = root.join(format!(".{name}.snapshot-{}", std::process::id()));
    let text = format!(
        "{}\n{}\n",
        strata_store::lock::hostname(),
        std::process::id()
    );
    std::fs::write(&me, text).with_context(|| format!("writing {}", me.display()))?;
    Ok((Running(me), released))
}
