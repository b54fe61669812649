//! Repository locks. Backups take a shared lock; forget, gc, repair take an
//! exclusive one. A lock is an object `locks/ID`; taking one means writing
//! ours and then listing the others — if a conflicting one exists, ours is
//! removed again and the command is refused with a message that names the
//! holder. A lock left by a dead process on this host is *stale*: it is
//! ignored and `strata unlock` removes it.

use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use strata_core::crypto::{random_bytes, Kind};
use strata_core::format::LockInfo;

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // on success (we also cap at the buffer).
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True when the holder of a lock is known to be gone.
pub fn is_stale(l: &LockInfo) -> bool {
    l.host == hostname() && !pid_alive(l.pid)
}

/// A lock in words, for messages.
pub fn describe(l: &LockInfo) -> String {
    format!(
        "{} (pid {} on {}, {} lock)",
        l.operation,
        l.pid,
        l.host,
        if l.exclusive { "exclusive" } else { "shared" }
    )
}

/// A held lock, released on drop.
pub struct LockGuard {
    repo: Repository,
    name: String,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.repo.backend().delete(&self.name);
    }
}

/// All locks with their object names.
pub fn list_locks(repo: &Repository) -> Result<Vec<(String, LockInfo)>> {
    let mut out = Vec::new();
    for o in repo.backend().list("locks/")? {
        match repo.get_struct::<LockInfo>(Kind::Lock, &o.name, "lock") {
            Ok(l) => out.push((o.name, l)),
            // A lock being written or removed right now; ignore it.
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Takes a lock for `operation`.
pub fn acquire(repo: &Repository, exclusive: bool, operation: &str) -> Result<LockGuard> {
    let info = LockInfo {
        host: hostname(),
        pid: std::process::id(),
        time: now_ns() / 1_000_000_000,
        exclusive,
        operation: operation.to_string(),
    };
    let mut id = [0u8; 16];
    random_bytes(&mut id)?;
    let env = repo
        .sealer()
        .seal(Kind::Lock, &strata_core::format::encode(&info)?, false)?;
    let name = format!("locks/{}", hex::encode(id));
    repo.backend().put(&name, &env)?;
    let guard = LockGuard {
        repo: repo.clone(),
        name: name.clone(),
    };
    for (other_name, other) in list_locks(repo)? {
        if other_name == name || is_stale(&other) {
            continue;
        }
        if exclusive || other.exclusive {
            let hint = if other.exclusive && other.operation == operation {
                format!("another {operation} is already running; wait for it to finish")
            } else {
                "wait for it to finish, or if it is no longer running remove it with `strata unlock`".into()
            };
            return Err(StoreError::Locked {
                holder: describe(&other),
                hint,
            });
        }
    }
    Ok(guard)
}

/// Removes stale locks (or all with `all`); returns the descriptions removed.
pub fn unlock(repo: &Repository, all: bool) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for (name, l) in list_locks(repo)? {
        if all || is_stale(&l) {
            repo.backend().delete(&name)?;
            removed.push(describe(&l));
        }
    }
    Ok(removed)
}
