//! Repository locks. Backups take a shared lock; forget, gc, repair take an
//! exclusive one. A lock is an object `locks/ID`; taking one means writing
//! ours and then listing the others — if a conflicting one exists, ours is
//! removed again and the command is refused with a message that names the
//! holder. Two commands that wrote conflicting locks at the same moment do
//! not both give up: the junior steps back for up to [`CONTEND`], so the
//! senior goes on.
//!
//! A lock is a *lease* (as restic's locks are): it records when it runs
//! out, and a thread rewrites it every third of the lease while the command
//! runs. A lock is *stale* — ignored, and removed by `strata unlock` — when
//! its lease ran out more than [`SKEW`] ago by this host's clock (on any
//! host: object stores have no process to ask), or when its process on this
//! host is gone. Locks written before leases (version 1) expire only by
//! their process.

use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use strata_core::crypto::{random_bytes, Kind};
use strata_core::format::{decode_lock, encode_lock, LockInfo};

/// How long a lock lasts unless refreshed.
pub const LEASE: Duration = Duration::from_secs(15 * 60);
/// Clock difference between hosts tolerated before another host's lease
/// counts as run out.
pub const SKEW: Duration = Duration::from_secs(10 * 60);

/// The name of the user this process runs as (from the password
/// database, not the environment), or the uid.
pub fn username() -> String {
    // SAFETY: getuid cannot fail; getpwuid_r writes into our buffers only.
    unsafe {
        let uid = libc::getuid();
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut res) == 0
            && !res.is_null()
            && !pw.pw_name.is_null()
        {
            return std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned();
        }
        uid.to_string()
    }
}

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

fn now_s() -> i64 {
    now_ns() / 1_000_000_000
}

/// Whether process `pid` of this host is still there.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True when the holder of a lock is known to be gone: its lease ran out
/// (allowing for clock skew), or its process on this host died.
pub fn is_stale(l: &LockInfo) -> bool {
    let run_out = l.expires > 0 && now_s() > l.expires.saturating_add(SKEW.as_secs() as i64);
    run_out || (l.host == hostname() && !pid_alive(l.pid))
}

/// A lock in words, for messages.
pub fn describe(l: &LockInfo) -> String {
    format!(
        "{} (pid {} on {}, {} lock{})",
        l.operation,
        l.pid,
        l.host,
        if l.exclusive { "exclusive" } else { "shared" },
        match l.expires - now_s() {
            _ if l.expires == 0 => String::new(),
            left if left >= 0 => format!(", lease {} min left", left / 60),
            left => format!(", lease ran out {} min ago", -left / 60),
        }
    )
}

/// A held lock: refreshed by a thread while held, removed on drop.
pub struct LockGuard {
    repo: Repository,
    name: String,
    stop: Arc<(Mutex<bool>, Condvar)>,
    refresher: Option<std::thread::JoinHandle<()>>,
}

/// Locks this process holds, so an interrupted command can release them
/// on its way out ([`release_held`]) as dropping the guards would.
type Held = (
    Arc<dyn crate::backend::Backend>,
    String,
    Arc<(Mutex<bool>, Condvar)>,
);
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// Removes every lock this process holds. For a process about to exit
/// without unwinding (Ctrl-C): the guards' drops will not run.
pub fn release_held() -> usize {
    let held = std::mem::take(&mut *HELD.lock().unwrap_or_else(|e| e.into_inner()));
    let n = held.len();
    for (backend, name, stop) in held {
        // The refresher first (waiting out a refresh in flight), so it
        // cannot write the lock again after it is deleted.
        *stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        stop.1.notify_all();
        let _ = backend.delete(&name);
    }
    n
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, n, _)| n != &self.name);
        {
            let (m, cv) = &*self.stop;
            *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
        let _ = self.repo.backend().delete(&self.name);
    }
}

fn seal_lock(repo: &Repository, info: &LockInfo) -> Result<Vec<u8>> {
    Ok(repo.sealer().seal(Kind::Lock, &encode_lock(info)?, false)?)
}

/// Rewrites the lock every third of its lease until told to stop.
fn refresh(
    repo: Repository,
    name: String,
    mut info: LockInfo,
    lease: Duration,
    stop: Arc<(Mutex<bool>, Condvar)>,
) {
    let (m, cv) = &*stop;
    let mut stopped = m.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // Told to stop before this thread got here: no wait.
        if *stopped {
            return;
        }
        let (g, _) = cv
            .wait_timeout(stopped, lease / 3)
            .unwrap_or_else(|e| e.into_inner());
        stopped = g;
        if *stopped {
            return;
        }
        info.time = now_s();
        info.expires = info.time + lease.as_secs() as i64;
        let written =
            seal_lock(&repo, &info).and_then(|env| Ok(repo.backend().put(&name, &env)?));
        if let Err(e) = written {
            tracing::warn!(
                "could not refresh lock {name}: {e}; it runs out at {}",
                info.expires
            );
        }
    }
}

/// All locks with their object names.
pub fn list_locks(repo: &Repository) -> Result<Vec<(String, LockInfo)>> {
    let mut out = Vec::new();
    for o in repo.backend().list("locks/")? {
        let raw = match repo.backend().get(&o.name) {
            Ok(r) => r,
            // A lock being removed right now; ignore it.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        let info = repo
            .sealer()
            .open(Kind::Lock, &raw)
            .map_err(|e| StoreError::corrupt(&o.name, e))
            .and_then(|b| decode_lock(&b).map_err(|e| StoreError::corrupt(&o.name, e)));
        out.push((
            o.name.clone(),
            info.unwrap_or_else(|e| {
                // A lock nobody can read holds nothing: it counts as stale
                // (so it blocks no command, and `strata unlock` removes it).
                tracing::warn!("{e}: treated as a stale lock");
                LockInfo {
                    host: "?".into(),
                    pid: 0,
                    time: 0,
                    exclusive: false,
                    operation: "unreadable lock object".into(),
                    expires: 1,
                }
            }),
        ));
    }
    Ok(out)
}

/// How long two commands that took conflicting locks at the same moment
/// sort it out: the junior one (by time, then name) steps back and tries
/// again meanwhile, the senior waits for it to step back. A holder that
/// stays longer is a command already running: the lock is refused.
pub const CONTEND: Duration = Duration::from_secs(3);

/// Takes a lock for `operation` with the default [`LEASE`].
pub fn acquire(repo: &Repository, exclusive: bool, operation: &str) -> Result<LockGuard> {
    acquire_with_lease(repo, exclusive, operation, LEASE)
}

/// Takes a lock whose lease lasts `lease` and is refreshed every third of
/// it while held.
pub fn acquire_with_lease(
    repo: &Repository,
    exclusive: bool,
    operation: &str,
    lease: Duration,
) -> Result<LockGuard> {
    acquire_contended(repo, exclusive, operation, lease, CONTEND)
}

/// [`acquire_with_lease`], sorting out a conflict with a lock taken at the
/// same moment for up to `contend`.
fn acquire_contended(
    repo: &Repository,
    exclusive: bool,
    operation: &str,
    lease: Duration,
    contend: Duration,
) -> Result<LockGuard> {
    let time = now_s();
    let info = LockInfo {
        host: hostname(),
        pid: std::process::id(),
        time,
        exclusive,
        operation: operation.to_string(),
        expires: time + lease.as_secs().max(1) as i64,
    };
    let mut id = [0u8; 16];
    random_bytes(&mut id)?;
    let name = format!("locks/{}", hex::encode(id));
    let sealed = seal_lock(repo, &info)?;
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push((
        repo.backend().clone(),
        name.clone(),
        stop.clone(),
    ));
    // Dropped on a refusal: removes ours (and forgets it).
    let mut guard = LockGuard {
        repo: repo.clone(),
        name: name.clone(),
        stop,
        refresher: None,
    };
    let started = std::time::Instant::now();
    let mut placed = false;
    loop {
        if !placed {
            repo.backend().put(&name, &sealed)?;
            placed = true;
        }
        let Some(other) = conflict(repo, &name, exclusive)? else {
            break;
        };
        if started.elapsed() >= contend {
            let hint = if other.info.exclusive && other.info.operation == operation {
                format!("another {operation} is already running; wait for it to finish")
            } else {
                "wait for it to finish, or if it is no longer running remove it with `strata unlock`".into()
            };
            return Err(StoreError::Locked {
                holder: describe(&other.info),
                hint,
            });
        }
        // The junior steps back (so the senior can go on) and comes back.
        if (other.info.time, other.name.as_str()) < (info.time, name.as_str()) {
            repo.backend().delete(&name)?;
            placed = false;
        }
        std::thread::sleep(backoff());
    }
    guard.refresher = {
        let (repo, name, info, stop) = (repo.clone(), name, info, guard.stop.clone());
        std::thread::Builder::new()
            .name("strata-lock".into())
            .spawn(move || refresh(repo, name, info, lease, stop))
            .ok()
    };
    Ok(guard)
}

/// A lock of another command.
struct Other {
    name: String,
    info: LockInfo,
}

/// The senior-most live lock that conflicts with ours (`name`), if any.
fn conflict(repo: &Repository, name: &str, exclusive: bool) -> Result<Option<Other>> {
    Ok(list_locks(repo)?
        .into_iter()
        .filter(|(n, l)| n != name && !is_stale(l) && (exclusive || l.exclusive))
        .map(|(name, info)| Other { name, info })
        .min_by(|a, b| (a.info.time, &a.name).cmp(&(b.info.time, &b.name))))
}

/// A wait of 50 to 150 ms, so two contenders do not keep meeting.
fn backoff() -> Duration {
    let mut b = [0u8; 1];
    let _ = random_bytes(&mut b);
    Duration::from_millis(50 + u64::from(b[0]) * 100 / 255)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::InitOptions;
    use std::sync::Barrier;

    /// An exclusive and a shared lock asked for at the same moment: one of
    /// the two commands always gets its lock (before, both could see the
    /// other's lock and both give up), the other is refused naming it.
    #[test]
    fn two_commands_at_once_do_not_both_give_up() {
        let repo = Repository::init(
            Arc::new(strata_backend::MemoryBackend::new()),
            InitOptions::default(),
        )
        .unwrap();
        for round in 0..10 {
            let barrier = Barrier::new(2);
            let results: Vec<Result<LockGuard>> = std::thread::scope(|s| {
                let take = |exclusive: bool, op: &'static str| {
                    let (repo, barrier) = (&repo, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        let r = acquire_contended(
                            repo,
                            exclusive,
                            op,
                            LEASE,
                            Duration::from_millis(400),
                        );
                        // Held until both have an answer.
                        std::thread::sleep(Duration::from_millis(1200));
                        r
                    })
                };
                let a = take(true, "gc");
                let b = take(false, "backup");
                vec![a.join().unwrap(), b.join().unwrap()]
            });
            let won = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(won, 1, "round {round}: {} got the lock", won);
            let refused = results.iter().find_map(|r| r.as_ref().err()).unwrap();
            assert!(
                matches!(refused, StoreError::Locked { .. }),
                "round {round}: {refused}"
            );
            drop(results);
            assert!(list_locks(&repo).unwrap().is_empty(), "round {round}");
        }
    }
}
