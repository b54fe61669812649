//! The files a restore writes: each is created by the reader that first
//! writes into it (so files are created in parallel, on every reader),
//! and finished — its trailing hole, owner, mode and times set through
//! the descriptor it was written with, then closed — by the reader that
//! writes its last byte. Per file that is one `openat` (with the file's
//! permission bits), its `pwrite`s, `utimensat` and `close`, with
//! `fchown` only when the owner is restored and differs from the
//! creator's and `fchmod` only when the umask or set-id bits leave the
//! mode short: no second open, no `stat`, no lookup of its name after it
//! was created. Files no
//! reader finishes (empty, all holes, or ending in a hole planned after
//! their data was written) are finished after the reads, in parallel.

use super::meta::{apply, MetaOpts, Target};
use crate::error::{Result, StoreError};
use rayon::prelude::*;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use strata_core::format::Node;

/// One file restore writes.
pub(super) struct RestoreFile<'s> {
    /// Where it goes.
    pub full: PathBuf,
    /// Its path in the recipe (for errors).
    pub path: String,
    pub node: &'s Node,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    created: bool,
    /// Bytes neither written nor planned as a hole yet.
    remaining: u64,
    /// Some of it is a hole: its size is set when it is finished.
    holes: bool,
    finished: bool,
}

impl<'s> RestoreFile<'s> {
    pub fn new(full: PathBuf, node: &'s Node) -> Self {
        RestoreFile {
            full,
            path: node.path_str(),
            node,
            state: Mutex::new(State {
                remaining: node.size,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `len` bytes of zeros the file keeps as a hole.
    pub fn hole(&self, len: u64) {
        let mut s = self.state();
        s.remaining = s.remaining.saturating_sub(len);
        s.holes = true;
    }

    /// The file open for writing: created new (never through a symlink,
    /// replacing what else has its name) the first time.
    pub fn open(&self) -> Result<File> {
        let mut s = self.state();
        let f = if s.created {
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.full)
        } else {
            self.create()
        };
        let f = f.map_err(|e| StoreError::io("create", self.full.display().to_string(), e))?;
        s.created = true;
        Ok(f)
    }

    fn create(&self) -> std::io::Result<File> {
        let new = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(MetaOpts::create_mode(self.node))
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.full)
        };
        match new() {
            // A name is replaced, never written through: what has it may
            // be a hard link to something outside the target, a symlink
            // or a FIFO. A directory stays (and the create fails).
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if fs::symlink_metadata(&self.full).is_ok_and(|m| !m.is_dir()) {
                    let _ = fs::remove_file(&self.full);
                }
                new()
            }
            r => r,
        }
    }

    /// Counts `len` bytes written; true when that was the file's last
    /// (the caller then finishes it with [`Self::finish`]).
    pub fn wrote(&self, len: u64) -> bool {
        let mut s = self.state();
        s.remaining = s.remaining.saturating_sub(len);
        let last = s.remaining == 0 && !s.finished;
        s.finished |= last;
        last
    }

    /// Sets the file's size (when it ends in a hole) and metadata through
    /// `f`. Returns whether privileges were dropped.
    pub fn finish(&self, f: &File, o: MetaOpts, warnings: &mut Vec<String>) -> Result<bool> {
        if self.state().holes {
            f.set_len(self.node.size)
                .map_err(|e| StoreError::io("write", self.full.display().to_string(), e))?;
        }
        let created = Some(MetaOpts::create_mode(self.node));
        Ok(apply(
            Target::Open(f),
            &self.full,
            (self.node, created),
            o,
            warnings,
        ))
    }
}

/// Counts of files finished and what finishing them said.
#[derive(Default)]
pub(super) struct Finished {
    pub warnings: Mutex<Vec<String>>,
    pub privileges_dropped: AtomicU64,
}

impl Finished {
    /// Finishes `rf` through `f`, keeping its warnings.
    pub fn finish(&self, rf: &RestoreFile, f: &File, o: MetaOpts) -> Result<()> {
        let mut w = Vec::new();
        let dropped = rf.finish(f, o, &mut w)?;
        if dropped {
            self.privileges_dropped.fetch_add(1, Ordering::Relaxed);
        }
        if !w.is_empty() {
            self.warnings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(w);
        }
        Ok(())
    }

    /// Creates (or opens) and finishes every file no reader finished,
    /// `pool`'s threads at once.
    pub fn rest(
        &self,
        files: &[RestoreFile],
        o: MetaOpts,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<()> {
        let run = || {
            files.par_iter().try_for_each(|rf| {
                {
                    let mut s = rf.state();
                    if s.finished {
                        return Ok(());
                    }
                    s.finished = true;
                    s.holes |= rf.node.size > 0;
                }
                let f = rf.open()?;
                self.finish(rf, &f, o)
            })
        };
        match pool {
            Some(p) => p.install(run),
            None => run(),
        }
    }
}
