//! What a restore is asked to do.

use super::plan::PLAN_PIECES;
use crate::progress::Progress;
use std::path::PathBuf;
use std::sync::Arc;

/// What restore does with a name that already exists in the target
/// (restic's `--overwrite`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overwrite {
    /// Replace it.
    Always,
    /// Replace it unless it already is the same kind with the same size
    /// and modification time (a symlink: the same target).
    IfChanged,
    /// Replace it only when the snapshot's version is newer.
    IfNewer,
    /// Leave it as it is.
    Never,
}

#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub target: PathBuf,
    /// Restore only these paths (and what is below them).
    pub include: Vec<Vec<u8>>,
    /// Leave out these paths (and what is below them).
    pub exclude: Vec<Vec<u8>>,
    /// What to do with files that already exist in the target.
    pub overwrite: Overwrite,
    /// Restore ownership (default: when running as root).
    pub owner: bool,
    pub progress: Arc<Progress>,
    /// Reads in flight at once (0: one per core). Reads from a remote
    /// store wait on the network, so more than the cores keep them busy.
    pub readers: usize,
    /// Set directories' metadata (mode, times) at the end. Off for the
    /// first of two passes into one tree (a version's cloud part): a
    /// read-only directory would refuse the second pass's files.
    pub dir_metadata: bool,
    /// Most pieces (a region's chunks going to one place in one file) a
    /// read plan holds before it is read: what bounds restore's memory
    /// ([`PLAN_PIECES`], at most about 40 MB). A region two plans use is
    /// read twice.
    pub plan_pieces: usize,
    /// Leave out device nodes and FIFOs (tar's and rsync's `--no-devices
    /// --no-specials`): for restoring a snapshot one does not trust.
    pub no_special: bool,
    /// Drop the privileges a file can carry: its set-user-id and
    /// set-group-id bits and its `security.capability` attribute (file
    /// capabilities) are not restored.
    pub no_setuid: bool,
}

impl RestoreOptions {
    pub fn new(target: impl Into<PathBuf>) -> Self {
        RestoreOptions {
            target: target.into(),
            include: vec![],
            exclude: vec![],
            overwrite: Overwrite::Always,
            // SAFETY: geteuid cannot fail.
            owner: unsafe { libc::geteuid() } == 0,
            progress: Arc::new(Progress::default()),
            readers: 0,
            dir_metadata: true,
            plan_pieces: PLAN_PIECES,
            no_special: false,
            no_setuid: false,
        }
    }
}
