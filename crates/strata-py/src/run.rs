//! Long calls run on a thread of their own while the caller's thread
//! waits without the GIL, waking every 100 ms to let Python handle
//! signals: Ctrl-C (KeyboardInterrupt) cancels the operation through its
//! [`Progress`] and is raised once the operation has stopped, having
//! committed nothing further (an operation that finished meanwhile returns
//! its result); a second Ctrl-C stops the wait at once.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use strata_store::progress::Progress;

/// Runs `f` off the GIL; a signal handler's exception cancels it.
pub fn detached<T, F>(py: Python<'_>, progress: Arc<Progress>, f: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> strata_store::Result<T> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("strata-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| crate::errors::StrataError::new_err(format!("cannot start a thread: {e}")))?;
    let mut interrupted: Option<PyErr> = None;
    let mut rx = rx;
    loop {
        // The receiver goes into the GIL-free closure and comes back.
        let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
        rx = back;
        match got {
            Ok(result) => {
                let _ = worker.join();
                return match (interrupted, result) {
                    // Finished (committed) before it could stop: its result.
                    (_, Ok(v)) => Ok(v),
                    // Cancelled: the signal's exception, not "cancelled".
                    (Some(e), Err(_)) => Err(e),
                    (None, Err(e)) => Err(to_py(e)),
                };
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = worker.join();
                return Err(crate::errors::StrataError::new_err(
                    "the operation's thread stopped without a result",
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    if interrupted.is_some() {
                        // A second Ctrl-C: stop waiting (a stream that
                        // never returns would hold the call forever); the
                        // operation stops in the background, committing
                        // nothing.
                        return Err(e);
                    }
                    progress.cancel();
                    interrupted = Some(e);
                }
            }
        }
    }
}
