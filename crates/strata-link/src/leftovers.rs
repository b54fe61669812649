//! What a killed `volume snapshot` leaves linked: containers no version
//! references, whose blocks the volume keeps held. Each linking snapshot
//! records itself beside the volume (`.NAME.snapshot-PID`: its host and
//! pid) and removes the record when it ends well; a record whose process
//! on this host is gone tells the next snapshot of the volume to release
//! what no index lists ([`crate::sweep_unindexed`]) before it
//! begins, instead of leaving it to gc — unless another snapshot of the
//! volume may be running (a record of a live process, or of another
//! host): the sweep would take its containers, not yet indexed, for
//! leftovers.

use crate::error::{LinkError, Result};
use std::path::{Path, PathBuf};
use strata_store::Repository;

/// This snapshot's record: removed when dropped, unless kept.
pub struct Running(Option<PathBuf>);

impl Running {
    /// Leaves the record in place (the snapshot failed: what it linked
    /// is released by the next one).
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The records of snapshots of volume `name` (`.NAME.snapshot-PID`; with
/// `tmp`, also those a kill left half written, `.NAME.snapshot-PID.tmp`).
/// The pid must be all digits: volume `a.snapshot-1`'s records are not
/// volume `a`'s.
fn records(root: &Path, name: &str, tmp: bool) -> Vec<PathBuf> {
    let prefix = format!(".{name}.snapshot-");
    let ours = |n: &str| {
        let Some(rest) = n.strip_prefix(&prefix) else {
            return false;
        };
        let pid = match rest.strip_suffix(".tmp") {
            Some(p) if tmp => p,
            Some(_) => return false,
            None => rest,
        };
        !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
    };
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| ours(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect()
}

/// Whether the process of this host that wrote `pid` in a name or record
/// is gone (one with this process's own pid is an earlier one's).
pub fn gone(pid: u32) -> bool {
    pid == std::process::id() || !strata_store::repo::lock::pid_alive(pid)
}

/// Removes every record of a snapshot of volume `name` (deleted).
pub fn forget(root: &Path, name: &str) {
    for p in records(root, name, true) {
        let _ = std::fs::remove_file(p);
    }
}

/// The records of snapshots of volume `name` whose process is gone, or
/// None when another snapshot of it may be running (a record of a live
/// process on this host, or of another host).
fn stale_records(root: &Path, name: &str) -> Option<Vec<PathBuf>> {
    let host = strata_store::repo::lock::hostname();
    let mut stale = Vec::new();
    for p in records(root, name, false) {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let mut lines = text.lines();
        let (h, pid) = (
            lines.next(),
            lines.next().and_then(|p| p.parse::<u32>().ok()),
        );
        match (h, pid) {
            (Some(h), Some(pid)) if h == host && gone(pid) => stale.push(p),
            // A record cut short (written whole by a rename: garbage)
            // says nothing.
            (Some(_), Some(_)) => return None,
            _ => {}
        }
    }
    Some(stale)
}

/// Before a linking snapshot of volume `name`: what killed ones left is
/// released (when no other snapshot of it may be running and the
/// repository's exclusive lock can be had now; else it waits for the
/// next snapshot, or gc; a failure is a warning), and this one recorded.
/// Returns the record and the containers released.
pub fn start(
    warn: &mut Vec<String>,
    root: &Path,
    name: &str,
    repo: &Repository,
) -> Result<(Running, u64)> {
    let mut released = 0;
    if let Some(stale) = stale_records(root, name).filter(|s| !s.is_empty()) {
        match crate::unlink::sweep_unindexed(repo, name) {
            Ok(Some(n)) => {
                released = n;
                for p in &stale {
                    let _ = std::fs::remove_file(p);
                }
            }
            Ok(None) => {}
            Err(e) => warn.push(format!(
                "what a killed snapshot of volume {name} left linked stays until gc: {e}"
            )),
        }
    }
    let me = root.join(format!(".{name}.snapshot-{}", std::process::id()));
    let tmp = root.join(format!(".{name}.snapshot-{}.tmp", std::process::id()));
    let text = format!(
        "{}\n{}\n",
        strata_store::repo::lock::hostname(),
        std::process::id()
    );
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, &me))
        .map_err(LinkError::io(format!("writing {}", me.display())))?;
    Ok((Running(Some(me)), released))
}

#[cfg(test)]
mod tests {
    /// A volume's records are its own (`.NAME.snapshot-DIGITS`), not those
    /// of a volume whose name begins like them; half-written ones only
    /// when asked for.
    #[test]
    fn records_are_the_volume_s_own() {
        let root = tempfile::tempdir().unwrap();
        for n in [
            ".a.snapshot-12",
            ".a.snapshot-13.tmp",
            ".a.snapshot-1.snapshot-14",
            ".a.snapshot-x",
            ".a.snapshot-",
            ".b.snapshot-12",
        ] {
            std::fs::write(root.path().join(n), "h\n1\n").unwrap();
        }
        let names = |tmp| {
            let mut v: Vec<String> = super::records(root.path(), "a", tmp)
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(false), [".a.snapshot-12"]);
        assert_eq!(names(true), [".a.snapshot-12", ".a.snapshot-13.tmp"]);
        super::forget(root.path(), "a");
        assert!(root.path().join(".a.snapshot-1.snapshot-14").exists());
        assert!(!root.path().join(".a.snapshot-13.tmp").exists());
    }
}
