//! Backends around backends: [`Retry`] retries transient failures with
//! exponential backoff; [`Limit`] caps how many operations run at once
//! (an object store throttles, and a laptop's uplink is shared).

use crate::{Backend, BackendError, ErrorKind, ObjectInfo, ObjectWriter, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Retries operations that fail with [`ErrorKind::Transient`].
pub struct Retry {
    inner: Arc<dyn Backend>,
    /// Attempts after the first.
    pub retries: u32,
    /// Wait before the first retry; doubled each time, up to `max_wait`.
    pub first_wait: Duration,
    pub max_wait: Duration,
}

impl Retry {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Retry {
            inner,
            retries: 6,
            first_wait: Duration::from_millis(100),
            max_wait: Duration::from_secs(10),
        }
    }

    fn run<T>(&self, mut f: impl FnMut(&dyn Backend) -> Result<T>) -> Result<T> {
        let mut wait = self.first_wait;
        let mut attempt = 0;
        loop {
            match f(self.inner.as_ref()) {
                Err(e) if e.kind == ErrorKind::Transient && attempt < self.retries => {
                    attempt += 1;
                    tracing::debug!("{e}; retry {attempt} of {} in {wait:?}", self.retries);
                    std::thread::sleep(jitter(wait));
                    wait = (wait * 2).min(self.max_wait);
                }
                r => return r,
            }
        }
    }
}

/// `d` plus up to a quarter of it, so clients that failed together do not
/// retry together.
fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    let _ = getrandom::getrandom(&mut b);
    d + d.mul_f64(u16::from_le_bytes(b) as f64 / u16::MAX as f64 / 4.0)
}

impl Backend for Retry {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run(|b| b.put(name, data))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.run(|b| b.get(name))
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.run(|b| b.get_range(name, offset, len))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.run(|b| b.list(prefix))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.run(|b| b.delete(name))
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.run(|b| b.size(name))
    }
    fn will_need(&self, name: &str, offset: u64, len: u64) {
        self.inner.will_need(name, offset, len)
    }
    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        self.run(|b| b.stream(name))
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Lets at most `max` operations run at once; the others wait.
pub struct Limit {
    inner: Arc<dyn Backend>,
    max: usize,
    running: Mutex<usize>,
    freed: Condvar,
}

impl Limit {
    pub fn new(inner: Arc<dyn Backend>, max: usize) -> Self {
        Limit {
            inner,
            max: max.max(1),
            running: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    fn run<T>(&self, f: impl FnOnce(&dyn Backend) -> T) -> T {
        {
            let mut n = self.running.lock().unwrap_or_else(|e| e.into_inner());
            while *n >= self.max {
                n = self.freed.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            *n += 1;
        }
        let r = f(self.inner.as_ref());
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.freed.notify_one();
        r
    }
}

impl Backend for Limit {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run(|b| b.put(name, data))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.run(|b| b.get(name))
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.run(|b| b.get_range(name, offset, len))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.run(|b| b.list(prefix))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.run(|b| b.delete(name))
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.run(|b| b.size(name))
    }
    fn will_need(&self, name: &str, offset: u64, len: u64) {
        self.inner.will_need(name, offset, len)
    }
    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        // A streamed object's parts are the inner backend's business.
        self.inner.stream(name)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// A backend that fails on purpose, for tests of the wrappers and of the
/// code above them: the next `n` operations fail with `kind`.
pub struct Flaky {
    inner: Arc<dyn Backend>,
    pending: Mutex<(u32, ErrorKind)>,
}

impl Flaky {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Flaky {
            inner,
            pending: Mutex::new((0, ErrorKind::Transient)),
        }
    }

    /// Makes the next `n` operations fail with `kind`.
    pub fn fail_next(&self, n: u32, kind: ErrorKind) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = (n, kind);
    }

    fn check(&self, op: &'static str, name: &str) -> Result<()> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.0 > 0 {
            p.0 -= 1;
            return Err(BackendError::new(p.1, op, name, "injected failure"));
        }
        Ok(())
    }
}

impl Backend for Flaky {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.check("write", name)?;
        self.inner.put(name, data)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.check("read", name)?;
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check("read", name)?;
        self.inner.get_range(name, offset, len)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.check("list", prefix)?;
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.check("delete", name)?;
        self.inner.delete(name)
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.check("stat", name)?;
        self.inner.size(name)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    #[test]
    fn transient_failures_are_retried_and_others_are_not() {
        let flaky = Arc::new(Flaky::new(Arc::new(MemoryBackend::new())));
        let mut r = Retry::new(flaky.clone());
        r.first_wait = Duration::from_millis(1);
        r.put("a", b"x").unwrap();
        flaky.fail_next(3, ErrorKind::Transient);
        assert_eq!(r.get("a").unwrap(), b"x");
        flaky.fail_next(10, ErrorKind::Transient);
        assert_eq!(r.get("a").unwrap_err().kind, ErrorKind::Transient);
        flaky.fail_next(0, ErrorKind::Transient);
        flaky.fail_next(1, ErrorKind::Permission);
        assert_eq!(r.get("a").unwrap_err().kind, ErrorKind::Permission);
        assert_eq!(r.get("a").unwrap(), b"x");
    }

    #[test]
    fn the_limit_holds() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Counting {
            now: AtomicUsize,
            peak: AtomicUsize,
        }
        impl Backend for Counting {
            fn put(&self, _: &str, _: &[u8]) -> Result<()> {
                let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
                self.peak.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
                self.now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
            fn get(&self, n: &str) -> Result<Vec<u8>> {
                Err(BackendError::not_found("read", n))
            }
            fn get_range(&self, n: &str, _: u64, _: u64) -> Result<Vec<u8>> {
                Err(BackendError::not_found("read", n))
            }
            fn list(&self, _: &str) -> Result<Vec<ObjectInfo>> {
                Ok(vec![])
            }
            fn delete(&self, _: &str) -> Result<()> {
                Ok(())
            }
            fn size(&self, _: &str) -> Result<Option<u64>> {
                Ok(None)
            }
            fn describe(&self) -> String {
                "counting".into()
            }
        }
        let c = Arc::new(Counting {
            now: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        let l = Arc::new(Limit::new(c.clone(), 3));
        std::thread::scope(|s| {
            for _ in 0..12 {
                let l = l.clone();
                s.spawn(move || l.put("x", b"").unwrap());
            }
        });
        assert_eq!(c.peak.load(Ordering::SeqCst), 3);
    }
}
