//! Where index strategies keep their on-disk parts (SiLo blocks, Extreme
//! Binning bins): named byte strings, written whole. The repository
//! implements this with sealed objects; trace mode with a directory or
//! memory. Every store counts its accesses, since "accesses to the on-disk
//! index" are what SiLo minimises.

use crate::key::{IndexError, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of a store's traffic.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub deletes: AtomicU64,
}

impl StoreStats {
    pub fn read(&self, n: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn wrote(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Named blobs, written whole.
pub trait BlockStore: Send + Sync {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()>;
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    fn delete(&self, name: &str) -> Result<()>;
    fn stats(&self) -> &StoreStats;
}

/// A store in memory (tests, small traces).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    stats: StoreStats,
}

impl MemStore {
    /// Bytes currently held.
    pub fn bytes(&self) -> u64 {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|v| v.len() as u64)
            .sum()
    }
}

impl BlockStore for MemStore {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.stats.wrote(bytes.len());
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), bytes.to_vec());
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let v = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| IndexError::Store {
                name: name.to_string(),
                msg: "not found".into(),
            })?;
        self.stats.read(v.len());
        Ok(v)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.stats.deletes.fetch_add(1, Ordering::Relaxed);
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        Ok(())
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

/// A store in a directory of files (trace mode at terabyte scale: the
/// blocks are real disk reads and writes, not RAM).
pub struct DirStore {
    dir: PathBuf,
    stats: StoreStats,
}

impl DirStore {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| IndexError::Store {
            name: dir.display().to_string(),
            msg: e.to_string(),
        })?;
        Ok(DirStore {
            dir,
            stats: StoreStats::default(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name.replace('/', "_"))
    }

    /// Bytes of the files in the directory.
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

impl BlockStore for DirStore {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.stats.wrote(bytes.len());
        std::fs::write(self.path(name), bytes).map_err(|e| IndexError::Store {
            name: name.to_string(),
            msg: e.to_string(),
        })
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let v = std::fs::read(self.path(name)).map_err(|e| IndexError::Store {
            name: name.to_string(),
            msg: e.to_string(),
        })?;
        self.stats.read(v.len());
        Ok(v)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.stats.deletes.fetch_add(1, Ordering::Relaxed);
        match std::fs::remove_file(self.path(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(IndexError::Store {
                name: name.to_string(),
                msg: e.to_string(),
            }),
        }
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

/// A queued operation: the bytes to put, or `None` to delete.
type Op = Option<Arc<Vec<u8>>>;
type Pending = Arc<Mutex<HashMap<String, Op>>>;

/// Writes through background threads, as SiLo's write buffer does: a
/// flushed block costs the index no time, and reads of a block still being
/// written are served from memory. Several writers overlap the fsyncs of a
/// durable store (Extreme Binning writes a small bin per file); every name
/// always goes to the same writer, so operations on one name stay ordered.
pub struct AsyncStore {
    inner: Arc<dyn BlockStore>,
    pending: Pending,
    tx: Mutex<Vec<std::sync::mpsc::SyncSender<(String, Op)>>>,
    workers: Mutex<Vec<std::thread::JoinHandle<Result<()>>>>,
}

/// Background writers of an [`AsyncStore`].
const WRITERS: usize = 4;

impl AsyncStore {
    pub fn new(inner: Arc<dyn BlockStore>) -> Self {
        let pending: Pending = Arc::default();
        let mut txs = Vec::new();
        let mut workers = Vec::new();
        for _ in 0..WRITERS {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Op)>(16);
            let (inner2, pending2) = (inner.clone(), pending.clone());
            workers.push(std::thread::spawn(move || -> Result<()> {
                for (name, data) in rx {
                    match &data {
                        Some(d) => inner2.put(&name, d)?,
                        None => inner2.delete(&name)?,
                    }
                    let mut p = pending2.lock().unwrap_or_else(|e| e.into_inner());
                    // Only if no newer operation on the name is queued.
                    if p.get(&name).is_some_and(|x| match (x, &data) {
                        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                        (None, None) => true,
                        _ => false,
                    }) {
                        p.remove(&name);
                    }
                }
                Ok(())
            }));
            txs.push(tx);
        }
        AsyncStore {
            inner,
            pending,
            tx: Mutex::new(txs),
            workers: Mutex::new(workers),
        }
    }

    fn send(&self, name: &str, data: Op) -> Result<()> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), data.clone());
        let writer = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            name.hash(&mut h);
            h.finish() as usize % WRITERS
        };
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(writer)
            .cloned();
        let sent = tx.map(|t| t.send((name.to_string(), data)).is_ok());
        if sent != Some(true) {
            return Err(IndexError::Store {
                name: name.to_string(),
                msg: "background writer stopped".into(),
            });
        }
        Ok(())
    }

    /// Waits for every queued write; reports the first failure.
    pub fn finish(&self) -> Result<()> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first = Ok(());
        for h in workers {
            let r = match h.join() {
                Ok(r) => r,
                Err(_) => Err(IndexError::Store {
                    name: "writer".into(),
                    msg: "background writer panicked".into(),
                }),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl BlockStore for AsyncStore {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.send(name, Some(Arc::new(bytes.to_vec())))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        if let Some(p) = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return match p {
                Some(d) => Ok(d.as_ref().clone()),
                None => Err(IndexError::Store {
                    name: name.to_string(),
                    msg: "deleted".into(),
                }),
            };
        }
        self.inner.get(name)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.send(name, None)
    }

    fn stats(&self) -> &StoreStats {
        self.inner.stats()
    }
}

impl Drop for AsyncStore {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_roundtrip_and_count() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DirStore::new(tmp.path().join("d")).unwrap();
        let mem = MemStore::default();
        for s in [&dir as &dyn BlockStore, &mem] {
            s.put("silo/blk/1", b"abc").unwrap();
            assert_eq!(s.get("silo/blk/1").unwrap(), b"abc");
            assert!(s.get("nope").is_err());
            s.delete("silo/blk/1").unwrap();
            assert!(s.get("silo/blk/1").is_err());
            assert_eq!(StoreStats::get(&s.stats().writes), 1);
            assert_eq!(StoreStats::get(&s.stats().reads), 1);
            assert_eq!(StoreStats::get(&s.stats().read_bytes), 3);
        }
    }

    #[test]
    fn async_store_reads_its_own_pending_writes() {
        let mem: Arc<MemStore> = Arc::new(MemStore::default());
        let a = AsyncStore::new(mem.clone());
        for i in 0..100u32 {
            a.put(&format!("b{i}"), &i.to_le_bytes()).unwrap();
            assert_eq!(a.get(&format!("b{i}")).unwrap(), i.to_le_bytes());
        }
        a.delete("b5").unwrap();
        assert!(a.get("b5").is_err());
        a.finish().unwrap();
        assert!(mem.get("b5").is_err());
        assert_eq!(mem.get("b99").unwrap(), 99u32.to_le_bytes());
        assert_eq!(StoreStats::get(&mem.stats().writes), 100);
    }
}
