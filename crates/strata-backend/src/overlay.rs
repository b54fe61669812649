//! A what-if backend: a writable layer over another backend that is never
//! changed. Reads see the layer first, then the base; writes and deletes
//! stay in the layer and vanish with it. Objects under the `discard`
//! prefixes (bulk data) keep only their size, so a whole maintenance job
//! can run against the layer to learn exactly what it would do — `gc
//! --dry-run`, `tier estimate` — in little memory, touching nothing.

use crate::object::{
    check_name, check_prefix, Backend, BackendError, ErrorKind, ObjectInfo, ObjectWriter, Result,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
enum Entry {
    Kept(Arc<Vec<u8>>),
    /// Written under a discard prefix: only its size is known.
    Sized(u64),
    Deleted,
}

/// See the module documentation.
pub struct OverlayBackend {
    base: Arc<dyn Backend>,
    layer: Arc<Mutex<BTreeMap<String, Entry>>>,
    discard: Vec<String>,
}

impl OverlayBackend {
    /// A layer over `base`; objects written under any of `discard` (such
    /// as `data/`) keep only their size and cannot be read back.
    pub fn new(base: Arc<dyn Backend>, discard: &[&str]) -> Self {
        OverlayBackend {
            base,
            layer: Arc::default(),
            discard: discard.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn layer(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.layer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn discards(&self, name: &str) -> bool {
        self.discard.iter().any(|p| name.starts_with(p.as_str()))
    }

    fn set(&self, name: &str, data: &[u8]) {
        let e = if self.discards(name) {
            Entry::Sized(data.len() as u64)
        } else {
            Entry::Kept(Arc::new(data.to_vec()))
        };
        self.layer().insert(name.to_string(), e);
    }

    /// The layer's entry for `name`: `None` when the base decides.
    fn entry(&self, op: &'static str, name: &str) -> Result<Option<Arc<Vec<u8>>>> {
        match self.layer().get(name) {
            None => Ok(None),
            Some(Entry::Kept(b)) => Ok(Some(b.clone())),
            Some(Entry::Deleted) => Err(BackendError::not_found(op, name)),
            Some(Entry::Sized(_)) => Err(BackendError::new(
                ErrorKind::Invalid,
                op,
                name,
                "written in a dry run: only its size was kept",
            )),
        }
    }
}

impl Backend for OverlayBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        check_name("write", name)?;
        self.set(name, data);
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        check_name("read", name)?;
        match self.entry("read", name)? {
            Some(b) => Ok(b.to_vec()),
            None => self.base.get(name),
        }
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        check_name("read", name)?;
        let Some(b) = self.entry("read", name)? else {
            return self.base.get_range(name, offset, len);
        };
        crate::object::slice_range(name, &b, offset, len)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_prefix(prefix)?;
        let mut all: BTreeMap<String, u64> = self
            .base
            .list(prefix)?
            .into_iter()
            .map(|o| (o.name, o.size))
            .collect();
        for (name, e) in self.layer().range(prefix.to_string()..) {
            if !name.starts_with(prefix) {
                break;
            }
            match e {
                Entry::Kept(b) => all.insert(name.clone(), b.len() as u64),
                Entry::Sized(n) => all.insert(name.clone(), *n),
                Entry::Deleted => all.remove(name),
            };
        }
        Ok(all
            .into_iter()
            .map(|(name, size)| ObjectInfo { name, size })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        check_name("delete", name)?;
        self.layer().insert(name.to_string(), Entry::Deleted);
        Ok(())
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        check_name("stat", name)?;
        match self.layer().get(name) {
            Some(Entry::Kept(b)) => Ok(Some(b.len() as u64)),
            Some(Entry::Sized(n)) => Ok(Some(*n)),
            Some(Entry::Deleted) => Ok(None),
            None => self.base.size(name),
        }
    }

    fn will_need(&self, name: &str, offset: u64, len: u64) {
        if !self.layer().contains_key(name) {
            self.base.will_need(name, offset, len)
        }
    }

    fn evict(&self, name: &str) {
        self.base.evict(name)
    }

    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        check_name("write", name)?;
        Ok(Some(Box::new(LayerWriter {
            layer: self.layer.clone(),
            name: name.to_string(),
            keep: !self.discards(name),
            buf: Vec::new(),
            written: 0,
        })))
    }

    fn describe(&self) -> String {
        format!("a dry run over {}", self.base.describe())
    }
}

/// Streams into the layer (only counting, under a discard prefix).
struct LayerWriter {
    layer: Arc<Mutex<BTreeMap<String, Entry>>>,
    name: String,
    keep: bool,
    buf: Vec<u8>,
    written: u64,
}

impl ObjectWriter for LayerWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        if self.keep {
            self.buf.extend_from_slice(data);
        }
        self.written += data.len() as u64;
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    fn finish(self: Box<Self>) -> Result<()> {
        let e = if self.keep {
            Entry::Kept(Arc::new(self.buf))
        } else {
            Entry::Sized(self.written)
        };
        self.layer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name, e);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

    #[test]
    fn the_base_never_changes_and_the_layer_shadows_it() {
        let base: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        base.put("index/a", b"one").unwrap();
        base.put("data/x", b"0123456789").unwrap();
        let o = OverlayBackend::new(base.clone(), &["data/"]);
        o.put("index/b", b"two").unwrap();
        o.delete("index/a").unwrap();
        o.put("data/y", b"abcdef").unwrap();
        let mut w = o.stream("data/z").unwrap().unwrap();
        w.write(b"1234").unwrap();
        w.finish().unwrap();

        assert_eq!(o.get("index/b").unwrap(), b"two");
        assert!(o.get("index/a").unwrap_err().is_not_found());
        assert_eq!(o.get_range("data/x", 2, 3).unwrap(), b"234");
        assert_eq!(o.size("data/y").unwrap(), Some(6));
        assert_eq!(o.size("data/z").unwrap(), Some(4));
        assert_eq!(o.get("data/y").unwrap_err().kind, ErrorKind::Invalid);
        let names: Vec<_> = o
            .list("")
            .unwrap()
            .into_iter()
            .map(|i| (i.name, i.size))
            .collect();
        assert_eq!(
            names,
            [
                ("data/x".to_string(), 10),
                ("data/y".to_string(), 6),
                ("data/z".to_string(), 4),
                ("index/b".to_string(), 3)
            ]
        );
        // The base is as it was.
        let base_names: Vec<_> = base.list("").unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(base_names, ["data/x", "index/a"]);
    }
}
