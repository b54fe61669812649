//! The repository as a read-only file system (FUSE), like `restic mount`
//! and `borg mount`: `strata mount MOUNTPOINT`.
//!
//! Layout:
//!
//! ```text
//! MOUNTPOINT/series/<series>/<version>/…   one directory per version, its tree below
//! MOUNTPOINT/series/<series>/latest        symlink to the newest version's directory
//! MOUNTPOINT/ids/<short id>/…              the same trees by snapshot id (8 hex digits,
//!                                          the whole id where 8 are ambiguous)
//! ```
//!
//! Series names are arbitrary strings; as one path component they are
//! percent-encoded where needed ([`escape_component`]): `%` → `%25`, `/` →
//! `%2F`, NUL → `%00`, and the names `.`/`..` become `%2E`/`%2E%2E` (the
//! empty name is `%`). Names inside snapshots are passed through as the
//! bytes the backup recorded, UTF-8 or not; recipe entries whose path could
//! not be a real one (empty, `.`/`..` components, NUL) are left out.
//!
//! Snapshots are listed once, at mount time. A version's tree is built the
//! first time something below it is looked at (its recipe read a part at
//! a time and held without chunks — [`Skeleton`] —, one child map); its
//! resolver the first time one of its files is opened
//! ([`strata_store::engine::fsread::SnapshotReader`]), and a file's chunks are
//! read from the parts holding it when it is opened (only its chunk runs
//! kept while it is open: a 100 GiB image in a tree costs its runs, not
//! 2.5 GB of references); reads go through one
//! [`RegionCache`] shared by every file. Files show the size, mode,
//! owner and times the backup recorded; a hard link shows the file it
//! links to (same inode number); symlinks read as recorded. Versions moved
//! to the cloud tier, or with files moved there, read from the tier, opened
//! on first use.
//!
//! Everything that would change the file system fails with EROFS (the mount
//! is read-only as well). An error reading the repository is EIO for the
//! reader and a warning in the log.
//!
//! A [`Mount`] serves until the file system is unmounted (`fusermount3 -u
//! MOUNTPOINT`, `umount`) or its caller asks it to stop (Ctrl-C / SIGTERM
//! for the CLI), which unmounts it (lazily when the mount point is busy).
//! It holds a shared lock on the repository meanwhile, so gc, forget and
//! maintenance wait rather than delete data under the mount.

mod error;
mod fs;
mod layout;

pub use error::{MountError, Result};
pub use layout::escape_component;

use fs::StrataFs;
use fuser::{MountOption, SessionACL};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_store::engine::fsread::RegionCache;
use strata_store::tier::Tiers;

/// What a mount is asked.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    /// The directory to mount on (must exist).
    pub mountpoint: PathBuf,
    /// Let other users use the mount (the kernel then checks the
    /// snapshots' permissions, and the mount goes away by itself should
    /// the process die).
    pub allow_other: bool,
    /// Only these series (all when empty).
    pub series: Vec<String>,
    /// Memory for recently read regions (decrypted, decompressed).
    pub cache_bytes: usize,
}

/// A mounted repository, served on a thread of its own.
pub struct Mount {
    pub mountpoint: PathBuf,
    /// Snapshots and series in the layout.
    pub snapshots: usize,
    pub series: usize,
    /// Snapshots left out (they could not be read), with why.
    pub left_out: Vec<(String, String)>,
    serving: std::thread::JoinHandle<std::io::Result<()>>,
    slot: Arc<Mutex<Option<fuser::SessionUnmounter>>>,
    _lock: strata_store::repo::lock::LockGuard,
}

impl Mount {
    /// Mounts the repository of `tiers` (its cloud tier opened on first
    /// use) on `opts.mountpoint`.
    pub fn start(tiers: Tiers, opts: &MountOptions) -> Result<Mount> {
        let mountpoint = match std::fs::canonicalize(&opts.mountpoint) {
            Ok(p) if p.is_dir() => p,
            Ok(_) => {
                return Err(MountError::Invalid(format!(
                    "{} is not a directory",
                    opts.mountpoint.display()
                )))
            }
            Err(e) => {
                return Err(MountError::Invalid(format!(
                    "mount point {}: {e}",
                    opts.mountpoint.display()
                )))
            }
        };
        let repo = tiers.active().clone();
        let lock = strata_store::repo::lock::acquire(&repo, false, "mount")?;
        let (snapshots, left_out) = repo.list_snapshots_tolerant()?;
        let left_out = left_out
            .into_iter()
            .map(|(id, e)| (id, e.to_string()))
            .collect();
        let cache = Arc::new(RegionCache::new(opts.cache_bytes));
        let fs = StrataFs::new(tiers, snapshots, &opts.series, cache);
        let slot = fs.unmounter.clone();
        let (n_snaps, n_series) = (fs.snaps.len(), fs.series.len());
        let mut session =
            fuser::Session::new(fs, &mountpoint, &mount_config(opts)).map_err(|e| {
                MountError::Io(
                    format!(
                        "mounting on {} (FUSE needs /dev/fuse, and fusermount3 from the fuse3 \
                         package unless root)",
                        mountpoint.display()
                    ),
                    e,
                )
            })?;
        *fs::lock(&slot) = Some(session.unmount_callable());
        let serving = std::thread::Builder::new()
            .name("fuse".into())
            .spawn(move || session.run())
            .map_err(|e| MountError::Io("starting the file system thread".into(), e))?;
        Ok(Mount {
            mountpoint,
            snapshots: n_snaps,
            series: n_series,
            left_out,
            serving,
            slot,
            _lock: lock,
        })
    }

    /// Serves until the file system is unmounted, or `stop` is set (then
    /// unmounts it: lazily when it is busy).
    pub fn wait(self, stop: &AtomicBool) -> Result<()> {
        let serving = self.serving;
        while !serving.is_finished() && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !serving.is_finished() {
            // Not `if let` on the guard: destroy() takes the lock as the
            // session ends.
            let u = fs::lock(&self.slot).take();
            if let Some(u) = u {
                unmount(u, &self.mountpoint, &serving);
            }
            if !serving.is_finished() {
                return Ok(());
            }
        }
        match serving.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(MountError::Io("serving the file system".into(), e)),
            Err(_) => Err(MountError::Invalid(
                "the file system thread panicked".into(),
            )),
        }
    }
}

/// Mount options. `fuser` is built without default features: its
/// pure-Rust mount (no libfuse, no headers at build time) calls mount(2)
/// itself when root and otherwise runs the setuid `fusermount3` (or
/// `fusermount`) helper of the fuse3 package. `auto_unmount` needs that
/// helper to stay around and `fuser` allows it only with `allow_other`, so
/// it comes with `--allow-other`; without it, strata unmounts on its own
/// signals (a killed strata leaves a dead mount for `fusermount3 -u`).
fn mount_config(a: &MountOptions) -> fuser::Config {
    let mut c = fuser::Config::default();
    c.mount_options = vec![MountOption::RO, MountOption::FSName("strata".into())];
    if a.allow_other {
        c.acl = SessionACL::All;
        c.mount_options
            .extend([MountOption::AutoUnmount, MountOption::DefaultPermissions]);
    }
    // Several requests at once: a slow read (a bucket, a resolver being
    // built) does not hold up listing.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    c.n_threads = Some(cores.clamp(2, 8));
    c
}

/// Waits up to `limit` for the file system thread to end.
fn wait_for(serving: &std::thread::JoinHandle<std::io::Result<()>>, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while !serving.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    serving.is_finished()
}

/// Runs `fusermount3 ARGS -- MOUNTPOINT`; whether it succeeded.
fn fusermount(args: &[&str], mountpoint: &Path) -> bool {
    std::process::Command::new("fusermount3")
        .args(args)
        .arg("--")
        .arg(mountpoint)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts after a signal: normally, else — the mount point is busy —
/// lazily: detached at once, gone when its last user lets go (exiting
/// closes the device, which ends it for them).
fn unmount(
    mut unmounter: fuser::SessionUnmounter,
    mountpoint: &Path,
    serving: &std::thread::JoinHandle<std::io::Result<()>>,
) {
    if let Err(e) = unmounter.unmount() {
        tracing::debug!("unmounting {}: {e}", mountpoint.display());
    }
    if wait_for(serving, Duration::from_millis(300)) {
        return;
    }
    // With `auto_unmount`, the helper unmounts only a file system whose
    // server is gone: ask it to unmount this one now.
    if fusermount(&["-u"], mountpoint) && wait_for(serving, Duration::from_secs(1)) {
        return;
    }
    tracing::warn!(
        "{} is busy: detaching it (it goes away when its last user lets go)",
        mountpoint.display()
    );
    if !fusermount(&["-u", "-z"], mountpoint) {
        if let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    wait_for(serving, Duration::from_secs(2));
}
