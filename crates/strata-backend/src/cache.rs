//! [`Cache`]: a local copy of a remote repository's immutable metadata.
//!
//! Objects under the given prefixes (recipe parts and indexes, container
//! metadata: objects written once under a name that never gets other
//! contents) are kept in a local directory when written or first read,
//! and read from there afterwards — a backup reads its parent's recipe, a
//! restore its version's, from the disk instead of the bucket. Everything
//! else passes through. The bucket stays the truth:
//!
//! - every cached file carries a checksum of its contents; a copy that
//!   fails it (a torn write, disk rot) is dropped and read again;
//! - listing a cached prefix drops the copies of objects that are gone
//!   (deleted by another client);
//! - problems with the cache directory are never errors, only misses;
//! - a reader that finds an object damaged calls [`Backend::evict`] and
//!   reads it again: a bad copy never outlives the first look at it;
//! - `check` and `repair` do not use the cache at all.

use crate::object::{check_name, check_prefix, Backend, ObjectInfo, ObjectWriter, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of the checksum after a cached object's contents.
const SUM: usize = 32;

/// See the module documentation.
pub struct Cache {
    inner: Arc<dyn Backend>,
    dir: PathBuf,
    prefixes: Vec<String>,
    /// Reads answered from the cache, and from the inner backend.
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl Cache {
    /// Caches the objects under `prefixes` (such as `parts/`) of `inner`
    /// in `dir`.
    pub fn new(inner: Arc<dyn Backend>, dir: impl Into<PathBuf>, prefixes: &[&str]) -> Self {
        Cache {
            inner,
            dir: dir.into(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn cached(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// Every method checks the name against the grammar first (no `..` or
    /// hidden components), so a path here stays inside the directory.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn load(&self, name: &str) -> Option<Vec<u8>> {
        let p = self.path(name);
        let mut b = std::fs::read(&p).ok()?;
        if b.len() < SUM {
            let _ = std::fs::remove_file(&p);
            return None;
        }
        let body = b.len() - SUM;
        if blake3::hash(&b[..body]).as_bytes()[..] != b[body..] {
            tracing::warn!("cached copy of {name} is damaged: dropped, read again");
            let _ = std::fs::remove_file(&p);
            return None;
        }
        b.truncate(body);
        Some(b)
    }

    fn store(&self, name: &str, data: &[u8]) {
        let p = self.path(name);
        let Some(dir) = p.parent() else { return };
        let tmp = dir.join(format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let r = std::fs::create_dir_all(dir)
            .and_then(|_| {
                let mut b = Vec::with_capacity(data.len() + SUM);
                b.extend_from_slice(data);
                b.extend_from_slice(blake3::hash(data).as_bytes());
                std::fs::write(&tmp, b)
            })
            .and_then(|_| std::fs::rename(&tmp, &p));
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Drops cached copies under `prefix` whose objects are not in `live`.
    fn prune(&self, prefix: &str, live: &[ObjectInfo]) {
        let live: HashSet<&str> = live.iter().map(|o| o.name.as_str()).collect();
        let root = self.dir.join(prefix.trim_end_matches('/'));
        for e in walkdir::WalkDir::new(&root)
            .into_iter()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_file())
        {
            let Ok(rel) = e.path().strip_prefix(&self.dir) else {
                continue;
            };
            let name = rel
                .to_string_lossy()
                .replace(std::path::MAIN_SEPARATOR, "/");
            let tmp = rel
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with('.'));
            if tmp || !live.contains(name.as_str()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Backend for Cache {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        check_name("write", name)?;
        self.inner.put(name, data)?;
        if self.cached(name) {
            self.store(name, data);
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        check_name("read", name)?;
        if !self.cached(name) {
            return self.inner.get(name);
        }
        if let Some(b) = self.load(name) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let b = self.inner.get(name)?;
        self.store(name, &b);
        Ok(b)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        check_name("read", name)?;
        if self.cached(name) {
            if let Some(b) = self.load(name) {
                let end = offset.checked_add(len).filter(|&e| e <= b.len() as u64);
                if let Some(end) = end {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(b[offset as usize..end as usize].to_vec());
                }
            }
        }
        self.inner.get_range(name, offset, len)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_prefix(prefix)?;
        let l = self.inner.list(prefix)?;
        if !prefix.is_empty() && self.cached(prefix) {
            self.prune(prefix, &l);
        }
        Ok(l)
    }

    fn delete(&self, name: &str) -> Result<()> {
        check_name("delete", name)?;
        self.inner.delete(name)?;
        if self.cached(name) {
            let _ = std::fs::remove_file(self.path(name));
        }
        Ok(())
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        self.inner.size(name)
    }

    fn will_need(&self, name: &str, offset: u64, len: u64) {
        self.inner.will_need(name, offset, len)
    }

    fn evict(&self, name: &str) {
        if check_name("evict", name).is_ok() && self.cached(name) {
            let _ = std::fs::remove_file(self.path(name));
        }
        self.inner.evict(name)
    }

    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        self.inner.sweep_temporaries(older_than)
    }

    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        // Streamed objects are data containers (not cached); a cached
        // prefix is written whole, so its copy is kept.
        if self.cached(name) {
            return Ok(None);
        }
        self.inner.stream(name)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

    fn setup() -> (tempfile::TempDir, Arc<MemoryBackend>, Cache) {
        let tmp = tempfile::tempdir().unwrap();
        let mem = Arc::new(MemoryBackend::new());
        let c = Cache::new(mem.clone(), tmp.path().join("c"), &["parts/", "meta/"]);
        (tmp, mem, c)
    }

    #[test]
    fn reads_come_from_the_cache_after_the_first() {
        let (_t, mem, c) = setup();
        mem.put("parts/ab", b"recipe part").unwrap();
        assert_eq!(c.get("parts/ab").unwrap(), b"recipe part");
        assert_eq!(c.misses.load(Ordering::Relaxed), 1);
        // Gone from the backend behind the cache's back: still served.
        mem.delete("parts/ab").unwrap();
        assert_eq!(c.get("parts/ab").unwrap(), b"recipe part");
        assert_eq!(c.get_range("parts/ab", 7, 4).unwrap(), b"part");
        assert_eq!(c.hits.load(Ordering::Relaxed), 2);
        assert!(c.get("parts/../x").is_err());
        // A reader that found it damaged drops the copy.
        mem.put("parts/ab", b"repaired").unwrap();
        c.evict("parts/ab");
        assert_eq!(c.get("parts/ab").unwrap(), b"repaired");
        mem.delete("parts/ab").unwrap();
        // Until a listing shows it is gone.
        c.list("parts/").unwrap();
        assert!(c.get("parts/ab").unwrap_err().is_not_found());
    }

    #[test]
    fn written_objects_are_cached_and_others_pass_through() {
        let (_t, mem, c) = setup();
        c.put("parts/cd", b"x").unwrap();
        c.put("data/00/aa", b"big").unwrap();
        assert!(c.path("parts/cd").exists());
        assert!(!c.path("data/00/aa").exists());
        assert_eq!(mem.get("parts/cd").unwrap(), b"x");
        c.delete("parts/cd").unwrap();
        assert!(!c.path("parts/cd").exists());
    }

    #[test]
    fn a_damaged_copy_is_read_again() {
        let (_t, mem, c) = setup();
        mem.put("meta/ef", b"metadata").unwrap();
        c.get("meta/ef").unwrap();
        let p = c.path("meta/ef");
        let mut b = std::fs::read(&p).unwrap();
        b[0] ^= 1;
        std::fs::write(&p, &b).unwrap();
        assert_eq!(c.get("meta/ef").unwrap(), b"metadata");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(c.get("meta/ef").unwrap(), b"metadata");
        assert_eq!(c.misses.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn an_unusable_cache_directory_is_only_misses() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let mem = Arc::new(MemoryBackend::new());
        let c = Cache::new(mem.clone(), &file, &["parts/"]);
        c.put("parts/ab", b"y").unwrap();
        assert_eq!(c.get("parts/ab").unwrap(), b"y");
        assert_eq!(mem.get("parts/ab").unwrap(), b"y");
    }
}
