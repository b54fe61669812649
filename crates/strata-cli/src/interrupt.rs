//! Ctrl-C (SIGINT) and SIGTERM: one line saying what is kept, the
//! repository locks this process holds released, exit 130.
//!
//! Exiting at any point is safe: every commit in Strata is an atomic
//! rename or put of one object after the data it names is durable, so an
//! interrupted command leaves only unreferenced objects, which the next
//! `gc` (or `maintain`) removes. Commands that commit in several steps
//! (forget of several snapshots, gc, maintain, copy, tier moves) keep the
//! steps finished before the signal. Commands that serve until stopped
//! (`mount`, `volume serve`) handle the signal themselves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What the running command has committed so far, for the message.
static COMMITTED: Mutex<Option<String>> = Mutex::new(None);

/// Whether the command commits in steps (the message then says so).
static STEPWISE: AtomicBool = AtomicBool::new(false);

/// How long releasing the locks may take before the process exits anyway
/// (a storage that hangs must not keep Ctrl-C from working).
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Notes that `what` is committed: an interruption from now on says so.
pub(crate) fn committed(what: impl Into<String>) {
    *COMMITTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(what.into());
}

pub(crate) fn install(json: bool, command_handles_it: bool, stepwise: bool) {
    if command_handles_it {
        return;
    }
    STEPWISE.store(stepwise, Ordering::Relaxed);
    let res = ctrlc::set_handler(move || on_interrupt(json));
    if let Err(e) = res {
        tracing::debug!("no Ctrl-C handler: {e}");
    }
}

fn on_interrupt(json: bool) {
    let done = COMMITTED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let msg = match (done, STEPWISE.load(Ordering::Relaxed)) {
        (Some(what), _) => format!("interrupted: {what} committed, nothing after it"),
        (None, true) => {
            "interrupted: the steps finished before stay committed, the one in progress is not (run the command again to finish)".to_string()
        }
        (None, false) => "interrupted: nothing committed".to_string(),
    };
    eprintln!("{msg}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(strata_store::repo::lock::release_held());
    });
    let released = rx.recv_timeout(RELEASE_WAIT).ok();
    if released.is_none() {
        eprintln!("the storage did not answer: locks left behind run out with their lease (or `strata unlock`)");
    }
    if json {
        // Straight to the descriptor: the main thread may hold stdout's
        // lock, blocked on a full pipe.
        let line = format!(
            "{}\n",
            serde_json::json!({"error": msg, "interrupted": true, "exit_code": 130,
                               "locks_released": released})
        );
        // SAFETY: writes a valid buffer to fd 1.
        unsafe {
            libc::write(1, line.as_ptr().cast(), line.len());
        }
    }
    std::process::exit(130);
}
