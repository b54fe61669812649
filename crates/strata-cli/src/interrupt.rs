//! Ctrl-C (SIGINT) and SIGTERM: one line saying what is kept, the
//! repository locks this process holds released, exit 130.
//!
//! Exiting at any point is safe: every commit in Strata is an atomic
//! rename or put of one object after the data it names is durable, so an
//! interrupted command leaves only unreferenced objects, which the next
//! `gc` (or `maintain`) removes. Commands that serve until stopped
//! (`mount`, `volume serve`) handle the signal themselves.

use std::sync::Mutex;

/// What the running command has committed so far, for the message.
static COMMITTED: Mutex<Option<String>> = Mutex::new(None);

/// Notes that `what` is committed: an interruption from now on says so.
pub(crate) fn committed(what: impl Into<String>) {
    *COMMITTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(what.into());
}

pub(crate) fn install(json: bool, command_handles_it: bool) {
    if command_handles_it {
        return;
    }
    let res = ctrlc::set_handler(move || {
        let done = COMMITTED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let released = strata_store::lock::release_held();
        let msg = match done {
            Some(what) => format!("interrupted: {what} committed, nothing after it"),
            None => "interrupted: nothing committed".to_string(),
        };
        if json {
            println!(
                "{}",
                serde_json::json!({"error": msg, "interrupted": true, "locks_released": released})
            );
        }
        eprintln!("{msg}");
        std::process::exit(130);
    });
    if let Err(e) = res {
        tracing::debug!("no Ctrl-C handler: {e}");
    }
}
