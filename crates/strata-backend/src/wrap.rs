//! Backends around backends: [`Retry`] retries transient failures with
//! exponential backoff; [`Limit`] caps how many operations run at once
//! (an object store throttles, and a laptop's uplink is shared);
//! [`Metering`] counts requests and bytes (what a command cost).

use crate::object::{Backend, BackendError, ErrorKind, ObjectInfo, ObjectWriter, Result};
use std::sync::atomic::{AtomicU64, Ordering};
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
    fn evict(&self, name: &str) {
        self.inner.evict(name)
    }
    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        self.inner.sweep_temporaries(older_than)
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
    fn evict(&self, name: &str) {
        self.inner.evict(name)
    }
    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        self.inner.sweep_temporaries(older_than)
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
    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        self.inner.sweep_temporaries(older_than)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

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
    fn metering_counts_requests_and_bytes() {
        let meter = Arc::new(Meter::default());
        let m: Arc<dyn Backend> =
            Arc::new(Metering::new(Arc::new(MemoryBackend::new()), meter.clone()));
        m.put("a/b", b"hello").unwrap();
        m.get("a/b").unwrap();
        m.get_range("a/b", 1, 2).unwrap();
        m.list("a/").unwrap();
        m.size("a/b").unwrap();
        m.delete("a/b").unwrap();
        let mut w = crate::object::create_object(&m, "a/c").unwrap();
        w.write(b"12345678").unwrap();
        w.finish().unwrap();
        let r = meter.read();
        assert_eq!(
            (r.puts, r.gets, r.ranged_gets, r.lists, r.heads, r.deletes),
            (2, 1, 1, 1, 1, 1)
        );
        assert_eq!((r.bytes_sent, r.bytes_received), (5 + 8, 5 + 2));
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
                // Held until three are in at once (however late the
                // others start on a loaded machine), then a little more.
                let t = std::time::Instant::now();
                while self.peak.load(Ordering::SeqCst) < 3 && t.elapsed().as_secs() < 10 {
                    std::thread::sleep(Duration::from_millis(1));
                }
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

/// Counts requests by kind and bytes each way: what a command cost on a
/// metered object store (`--json` reports it).
#[derive(Default)]
pub struct Meter {
    pub puts: AtomicU64,
    pub gets: AtomicU64,
    pub ranged_gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub heads: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
}

/// A snapshot of a [`Meter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metered {
    pub puts: u64,
    pub gets: u64,
    pub ranged_gets: u64,
    pub lists: u64,
    pub deletes: u64,
    pub heads: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl Meter {
    pub fn read(&self) -> Metered {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Metered {
            puts: r(&self.puts),
            gets: r(&self.gets),
            ranged_gets: r(&self.ranged_gets),
            lists: r(&self.lists),
            deletes: r(&self.deletes),
            heads: r(&self.heads),
            bytes_sent: r(&self.bytes_sent),
            bytes_received: r(&self.bytes_received),
        }
    }
}

/// Counts what passes through to the inner backend in a [`Meter`].
pub struct Metering {
    inner: Arc<dyn Backend>,
    pub meter: Arc<Meter>,
}

impl Metering {
    pub fn new(inner: Arc<dyn Backend>, meter: Arc<Meter>) -> Self {
        Metering { inner, meter }
    }

    fn add(&self, counter: &AtomicU64, bytes: &AtomicU64, n: u64) {
        counter.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(n, Ordering::Relaxed);
    }
}

impl Backend for Metering {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.add(&self.meter.puts, &self.meter.bytes_sent, data.len() as u64);
        self.inner.put(name, data)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let r = self.inner.get(name);
        let n = r.as_ref().map_or(0, |v| v.len() as u64);
        self.add(&self.meter.gets, &self.meter.bytes_received, n);
        r
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let r = self.inner.get_range(name, offset, len);
        let n = r.as_ref().map_or(0, |v| v.len() as u64);
        self.add(&self.meter.ranged_gets, &self.meter.bytes_received, n);
        r
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.meter.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.meter.deletes.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(name)
    }
    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.meter.heads.fetch_add(1, Ordering::Relaxed);
        self.inner.size(name)
    }
    fn will_need(&self, name: &str, offset: u64, len: u64) {
        self.inner.will_need(name, offset, len)
    }
    fn evict(&self, name: &str) {
        self.inner.evict(name)
    }
    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        self.inner.sweep_temporaries(older_than)
    }
    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        Ok(self.inner.stream(name)?.map(|w| {
            Box::new(MeteredWriter {
                inner: w,
                meter: self.meter.clone(),
            }) as Box<dyn ObjectWriter>
        }))
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

struct MeteredWriter {
    inner: Box<dyn ObjectWriter>,
    meter: Arc<Meter>,
}

impl ObjectWriter for MeteredWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.meter
            .bytes_sent
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(data)
    }
    fn written(&self) -> u64 {
        self.inner.written()
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.meter.puts.fetch_add(1, Ordering::Relaxed);
        self.inner.finish()
    }
}
