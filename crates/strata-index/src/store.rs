//! Where index strategies keep their on-disk parts (SiLo blocks, Extreme
//! Binning bins): named byte strings, written whole. The repository
//! implements this with sealed objects; trace mode with a directory or
//! memory. Every store counts its accesses, since "accesses to the on-disk
//! index" are what SiLo minimises.

use crate::{IndexError, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
}
