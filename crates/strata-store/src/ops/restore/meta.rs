//! A restored name's metadata: owner, extended attributes, mode and
//! times, set through a file restore holds open or on the name itself
//! (never through a symlink).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata_core::format::{Node, NodeKind};

/// The set-user-id and set-group-id bits of a mode.
pub(super) const SET_ID_BITS: u32 = 0o6000;
/// The extended attribute that holds a file's capabilities.
pub(super) const CAPABILITY_XATTR: &[u8] = b"security.capability";

pub(super) fn set_times(p: &Path, mtime_ns: i64) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    let times = [ts, ts];
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a restore does with owners and privileges, and what a file it
/// creates gets without being told.
#[derive(Clone, Copy, Debug)]
pub(super) struct MetaOpts {
    /// Restore the owner (`RestoreOptions::owner`).
    pub owner: bool,
    /// Drop set-id bits and file capabilities (`RestoreOptions::no_setuid`).
    pub no_setuid: bool,
    /// The owner a new file gets (this process's effective ids), when no
    /// directory it can be created in passes its group on (set-group-id):
    /// a file restore created with that owner needs no `fchown`.
    pub creator: Option<(u32, u32)>,
    /// The process's umask, when known: a file created with its mode's
    /// permission bits that the umask left whole needs no `fchmod`.
    pub umask: Option<u32>,
}

impl MetaOpts {
    pub fn new(owner: bool, no_setuid: bool) -> Self {
        MetaOpts {
            owner,
            no_setuid,
            // SAFETY: geteuid and getegid cannot fail.
            creator: Some(unsafe { (libc::geteuid(), libc::getegid()) }),
            umask: umask(),
        }
    }

    /// The mode `n` ends with (set-id bits dropped under `no_setuid`),
    /// and whether that drops privileges.
    fn mode_of(&self, n: &Node) -> (u32, bool) {
        let mode = n.mode & 0o7777;
        match self.no_setuid {
            true => (mode & !SET_ID_BITS, mode & SET_ID_BITS != 0),
            false => (mode, false),
        }
    }

    /// The permission bits to create `n`'s file with: its own (no set-id
    /// bits yet), so a file never is more open while restored than
    /// after, and writable by its owner (a file restore opens again must
    /// open for writing).
    pub fn create_mode(n: &Node) -> u32 {
        n.mode & 0o777 | 0o200
    }
}

/// The process's umask (`/proc/self/status`), read without changing it.
fn umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line.split_whitespace().nth(1)?, 8).ok()
}

/// Where metadata goes: a file restore created and holds open, or a name
/// checked to be of the node's kind (never followed).
pub(super) enum Target<'a> {
    Open(&'a File),
    Name(&'a Path),
}

/// Sets `n`'s owner, extended attributes, mode (not a symlink's) and
/// times on `t`, in that order (a change of owner clears set-id bits, so
/// the mode comes after it; times last). `created`: the mode restore
/// created `t` with (before the umask), when it did — it then has the
/// creator's owner and that mode less the umask, and neither is set
/// again when it is what `n` says. `shown` names it in warnings.
/// Returns whether privileges were dropped (`no_setuid`).
pub(super) fn apply(
    t: Target,
    shown: &Path,
    (n, created): (&Node, Option<u32>),
    o: MetaOpts,
    warnings: &mut Vec<String>,
) -> bool {
    let mut warn = |what: &str, e: std::io::Error| {
        warnings.push(format!("{}: cannot restore {what}: {e}", shown.display()))
    };
    let owned = created.is_some() && o.creator == Some((n.uid, n.gid));
    if o.owner && !owned {
        let r = match t {
            Target::Open(f) => std::os::unix::fs::fchown(f, Some(n.uid), Some(n.gid)),
            Target::Name(p) => std::os::unix::fs::lchown(p, Some(n.uid), Some(n.gid)),
        };
        if let Err(e) = r {
            warn("owner", e);
        }
    }
    let (mode, mut dropped) = o.mode_of(n);
    let moded = created.is_some_and(|c| o.umask.is_some_and(|u| c & !u == mode));
    for (name, value) in &n.xattrs {
        if o.no_setuid && name.as_slice() == CAPABILITY_XATTR {
            dropped = true;
            continue;
        }
        let r = set_xattr(&t, name, value);
        if let Err(e) = r {
            warn(
                &format!("extended attribute {}", String::from_utf8_lossy(name)),
                e,
            );
        }
    }
    if n.kind != NodeKind::Symlink && !moded {
        let perm = std::fs::Permissions::from_mode(mode);
        let r = match t {
            Target::Open(f) => f.set_permissions(perm),
            Target::Name(p) => std::fs::set_permissions(p, perm),
        };
        if let Err(e) = r {
            warn("permissions", e);
        }
    }
    let r = match t {
        Target::Open(f) => {
            let at = system_time(n.mtime_ns);
            f.set_times(std::fs::FileTimes::new().set_accessed(at).set_modified(at))
        }
        Target::Name(p) => set_times(p, n.mtime_ns),
    };
    if let Err(e) = r {
        warn("times", e);
    }
    dropped
}

/// `ns` nanoseconds from the epoch (before it when negative).
fn system_time(ns: i64) -> SystemTime {
    let d = Duration::new(
        ns.unsigned_abs() / 1_000_000_000,
        (ns.unsigned_abs() % 1_000_000_000) as u32,
    );
    if ns >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

/// Sets extended attribute `name` of `t` (through its descriptor, or on
/// the name itself, never through a symlink).
fn set_xattr(t: &Target, name: &[u8], value: &[u8]) -> std::io::Result<()> {
    let n = CString::new(name)?;
    let v = value.as_ptr() as *const libc::c_void;
    let r = match t {
        // SAFETY: an open descriptor, a valid C string and a value buffer
        // of the given length.
        Target::Open(f) => unsafe { libc::fsetxattr(f.as_raw_fd(), n.as_ptr(), v, value.len(), 0) },
        Target::Name(p) => {
            let c = CString::new(p.as_os_str().as_bytes())?;
            // SAFETY: valid C strings and a value buffer of the given length.
            unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), v, value.len(), 0) }
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
