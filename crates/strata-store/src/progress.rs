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
}
