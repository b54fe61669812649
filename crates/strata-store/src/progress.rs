//! Live counters of a long-running command (backup, restore, maintain, gc,
//! check), which a front end polls to draw its progress bar.

use std::sync::atomic::{AtomicBool, AtomicU64};

/// Live counters for progress display; the CLI polls them.
#[derive(Default, Debug)]
pub struct Progress {
    pub files_total: AtomicU64,
    pub bytes_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_done: AtomicU64,
    /// Set once the walk has finished and the totals are final.
    pub totals_known: AtomicBool,
    /// Set by a front end to stop the command (a Python caller's
    /// KeyboardInterrupt): backup and restore check it between pieces of
    /// work and return [`crate::StoreError::Cancelled`], committing nothing
    /// further.
    pub cancel: AtomicBool,
}

impl Progress {
    /// Asks the command to stop.
    pub fn cancel(&self) {
        self.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the command was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(std::sync::atomic::Ordering::Relaxed)
    }
}
