//! Storage backends (DESIGN.md "Principles": the repository is the truth).
//!
//! A backend stores immutable named objects with object-store semantics:
//! put a whole object, get it (or a byte range), list by prefix, delete. No
//! rename or append is needed, so an S3 implementation fits behind the same
//! trait. [`LocalBackend`] keeps each object as a file and makes every put
//! crash-safe: write a temporary file, fsync it, rename it into place,
//! fsync the directory.

use crate::error::{Result, StoreError};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An object name and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub name: String,
    pub size: u64,
}

/// Object-store semantics shared by every backend.
pub trait Backend: Send + Sync {
    /// Stores a whole object atomically, replacing any object of that name.
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Reads a whole object.
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads `len` bytes at `offset`; fails if the object is shorter.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Lists objects whose name starts with `prefix` (a folder such as `data/`).
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// Deletes an object; deleting a missing object is not an error.
    fn delete(&self, name: &str) -> Result<()>;
    /// Size of an object, or `None` when it does not exist.
    fn size(&self, name: &str) -> Result<Option<u64>>;
    /// Hints that these ranges will be read soon (prefetch).
    fn will_need(&self, _name: &str, _offset: u64, _len: u64) {}
    /// A writer that streams a new object to storage as it is produced,
    /// where the backend can (see [`create_object`]); `None` when objects
    /// are put whole.
    fn stream(&self, _name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        Ok(None)
    }
    /// Where the repository is, for messages.
    fn describe(&self) -> String;
}

/// An object being written piece by piece. It becomes visible under its
/// name, whole and durable, only at [`ObjectWriter::finish`]; dropped
/// before that, it leaves nothing behind.
pub trait ObjectWriter: Send {
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Bytes written so far.
    fn written(&self) -> u64;
    /// Makes the object durable and visible.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A writer for a new object `name`: streamed where the backend supports
/// it (a local file is written as it goes, so memory holds only what is
/// being produced), else buffered and put whole at the end.
pub fn create_object(backend: &Arc<dyn Backend>, name: &str) -> Result<Box<dyn ObjectWriter>> {
    if let Some(w) = backend.stream(name)? {
        return Ok(w);
    }
    Ok(Box::new(Buffered {
        backend: backend.clone(),
        name: name.to_string(),
        buf: Vec::new(),
    }))
}

/// [`ObjectWriter`] over a whole-object put.
struct Buffered {
    backend: Arc<dyn Backend>,
    name: String,
    buf: Vec<u8>,
}

impl ObjectWriter for Buffered {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn written(&self) -> u64 {
        self.buf.len() as u64
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.backend.put(&self.name, &self.buf)
    }
}

/// A local object being written: a temporary file in its directory, fsynced
/// and renamed into place at the end (like [`LocalBackend::put`]).
struct LocalWriter {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    name: String,
    written: u64,
    done: bool,
}

impl ObjectWriter for LocalWriter {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|e| StoreError::io("write", &self.name, e))?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let r = (|| {
            self.file.sync_all()?;
            fs::rename(&self.tmp, &self.path)?;
            fsync_dir(&dir)
        })();
        r.map_err(|e| StoreError::io("write", &self.name, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for LocalWriter {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// A repository in a local directory.
pub struct LocalBackend {
    root: PathBuf,
}

impl LocalBackend {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalBackend { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn tmp_suffix() -> String {
    let mut b = [0u8; 8];
    // A failing RNG only weakens uniqueness; the pid keeps names apart.
    let _ = strata_core::crypto::random_bytes(&mut b);
    format!("{}-{}", std::process::id(), hex::encode(b))
}

impl LocalBackend {
    /// The directory of object `name`, created (durably) if missing.
    fn dir_of(&self, name: &str) -> Result<PathBuf> {
        let path = self.path(name);
        let dir = path
            .parent()
            .ok_or_else(|| StoreError::Invalid(format!("bad object name {name}")))?;
        if !dir.exists() {
            fs::create_dir_all(dir)
                .map_err(|e| StoreError::io("create directory", dir.display().to_string(), e))?;
            if let Some(pp) = dir.parent() {
                let _ = fsync_dir(pp);
            }
        }
        Ok(dir.to_path_buf())
    }
}

impl Backend for LocalBackend {
    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        let dir = self.dir_of(name)?;
        let tmp = dir.join(format!(".tmp-{}", tmp_suffix()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| StoreError::io("write", name, e))?;
        Ok(Some(Box::new(LocalWriter {
            file,
            tmp,
            path: self.path(name),
            name: name.to_string(),
            written: 0,
            done: false,
        })))
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path(name);
        let dir = self.dir_of(name)?;
        let dir = dir.as_path();
        let tmp = dir.join(format!(".tmp-{}", tmp_suffix()));
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fsync_dir(dir)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(StoreError::io("write", name, e));
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        fs::read(self.path(name)).map_err(|e| StoreError::io("read", name, e))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = File::open(self.path(name)).map_err(|e| StoreError::io("read", name, e))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                StoreError::corrupt(
                    name,
                    strata_core::CoreError::Truncated("object shorter than its index says"),
                )
            } else {
                StoreError::io("read", name, e)
            }
        })?;
        Ok(buf)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        let start = self.path(prefix.trim_end_matches('/'));
        if !start.exists() {
            return Ok(out);
        }
        let mut stack = vec![start];
        while let Some(dir) = stack.pop() {
            let rd = fs::read_dir(&dir)
                .map_err(|e| StoreError::io("list", dir.display().to_string(), e))?;
            for ent in rd {
                let ent = ent.map_err(|e| StoreError::io("list", dir.display().to_string(), e))?;
                let fname = ent.file_name();
                if fname.to_string_lossy().starts_with(".tmp-") {
                    continue;
                }
                let ft = ent
                    .file_type()
                    .map_err(|e| StoreError::io("list", dir.display().to_string(), e))?;
                let p = ent.path();
                if ft.is_dir() {
                    stack.push(p);
                } else if ft.is_file() {
                    let size = ent.metadata().map(|m| m.len()).unwrap_or(0);
                    let rel = p
                        .strip_prefix(&self.root)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned();
                    out.push(ObjectInfo { name: rel, size });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        match fs::remove_file(self.path(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("delete", name, e)),
        }
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        match fs::metadata(self.path(name)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("stat", name, e)),
        }
    }

    fn will_need(&self, name: &str, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        if let Ok(f) = File::open(self.path(name)) {
            // SAFETY: plain advisory syscall on a valid descriptor.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    offset as i64,
                    len as i64,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_list_delete() {
        let d = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(d.path());
        b.put("data/ab/abc", b"hello").unwrap();
        b.put("data/cd/cde", b"world!").unwrap();
        b.put("config", b"c").unwrap();
        assert_eq!(b.get("data/ab/abc").unwrap(), b"hello");
        assert_eq!(b.get_range("data/cd/cde", 1, 3).unwrap(), b"orl");
        assert!(b.get_range("data/cd/cde", 4, 3).is_err());
        let l = b.list("data/").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].name, "data/ab/abc");
        assert_eq!(l[1].size, 6);
        b.delete("data/ab/abc").unwrap();
        b.delete("data/ab/abc").unwrap();
        assert!(matches!(b.get("data/ab/abc"), Err(StoreError::NotFound(_))));
        assert_eq!(b.size("config").unwrap(), Some(1));
        assert_eq!(b.list("nothing/").unwrap(), vec![]);
    }
}
