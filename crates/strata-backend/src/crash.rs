//! [`Crash`]: a backend that "dies" after a given number of writes — every
//! put and delete after it fails, as if the process writing had been
//! killed at that point — for crash-consistency tests that run in one
//! process (the operation-sequence harness, `strata_store::opseq`).
//! Reads keep working, so what the crash left can be looked at; once
//! [`Crash::revive`]d, the storage accepts writes again (a new process).

use crate::object::{Backend, BackendError, ObjectInfo, Result};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

/// A backend wrapper that fails every mutation after a countdown.
pub struct Crash {
    inner: Arc<dyn Backend>,
    /// Mutations still allowed; negative: no countdown.
    left: AtomicI64,
    crashed: AtomicBool,
}

impl Crash {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Crash {
            inner,
            left: AtomicI64::new(-1),
            crashed: AtomicBool::new(false),
        }
    }

    /// Lets `n` more puts or deletes through, then fails the rest.
    pub fn crash_after(&self, n: u64) {
        self.crashed.store(false, Ordering::SeqCst);
        self.left
            .store(n.min(i64::MAX as u64) as i64, Ordering::SeqCst);
    }

    /// Whether the countdown ran out (a write was refused).
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Writes go through again, without a countdown.
    pub fn revive(&self) {
        self.left.store(-1, Ordering::SeqCst);
        self.crashed.store(false, Ordering::SeqCst);
    }

    fn mutation(&self, op: &'static str, name: &str) -> Result<()> {
        if self.crashed() {
            return Err(dead(op, name));
        }
        let before = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then(|| n - 1).or((n < 0).then_some(n))
            });
        match before {
            Ok(_) => Ok(()),
            Err(_) => {
                self.crashed.store(true, Ordering::SeqCst);
                Err(dead(op, name))
            }
        }
    }
}

fn dead(op: &'static str, name: &str) -> BackendError {
    BackendError::io(op, name, std::io::Error::other("simulated crash"))
}

impl Backend for Crash {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.mutation("write", name)?;
        self.inner.put(name, data)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.get_range(name, offset, len)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.mutation("delete", name)?;
        self.inner.delete(name)
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.inner.size(name)
    }
    // Objects are put whole (no stream): a crash never leaves half an
    // object, as with the local and S3 backends' atomic writes.
    fn describe(&self) -> String {
        format!("{} (crashing)", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[test]
    fn writes_fail_after_the_countdown_and_reads_go_on() {
        let c = Crash::new(Arc::new(MemoryBackend::new()));
        c.put("a/x", b"1").unwrap();
        c.crash_after(2);
        c.put("a/y", b"2").unwrap();
        c.delete("a/x").unwrap();
        assert!(c.put("a/z", b"3").is_err());
        assert!(c.crashed());
        assert!(c.delete("a/y").is_err(), "dead for good");
        assert_eq!(c.get("a/y").unwrap(), b"2");
        c.revive();
        c.put("a/z", b"3").unwrap();
        assert_eq!(c.list("a/").unwrap().len(), 2);
    }
}
