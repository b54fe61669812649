//! A repository in a local directory: each object a file. Every put is
//! crash-safe: write a temporary file (`.tmp-…`, never listed), fsync it,
//! rename it into place, fsync the directory.

use crate::{check_name, check_prefix, Backend, BackendError, ObjectInfo, ObjectWriter, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

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

    /// The file of a valid object name.
    fn path(&self, op: &'static str, name: &str) -> Result<PathBuf> {
        check_name(op, name)?;
        Ok(self.root.join(name))
    }

    /// The directory of object `name`, created (durably) if missing.
    fn dir_of(&self, path: &Path, name: &str) -> Result<PathBuf> {
        let dir = path.parent().ok_or_else(|| {
            BackendError::new(crate::ErrorKind::Invalid, "write", name, "no parent")
        })?;
        if !dir.exists() {
            fs::create_dir_all(dir)
                .map_err(|e| BackendError::io("create directory", dir.display().to_string(), e))?;
            if let Some(pp) = dir.parent() {
                let _ = fsync_dir(pp);
            }
        }
        Ok(dir.to_path_buf())
    }
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn tmp_suffix() -> String {
    let mut b = [0u8; 8];
    // A failing RNG only weakens uniqueness; the pid keeps names apart.
    let _ = getrandom::getrandom(&mut b);
    format!("{}-{}", std::process::id(), hex::encode(b))
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
            .map_err(|e| BackendError::io("write", &self.name, e))?;
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
        r.map_err(|e| BackendError::io("write", &self.name, e))?;
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

impl Backend for LocalBackend {
    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        let path = self.path("write", name)?;
        let dir = self.dir_of(&path, name)?;
        let tmp = dir.join(format!(".tmp-{}", tmp_suffix()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| BackendError::io("write", name, e))?;
        Ok(Some(Box::new(LocalWriter {
            file,
            tmp,
            path,
            name: name.to_string(),
            written: 0,
            done: false,
        })))
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path("write", name)?;
        let dir = self.dir_of(&path, name)?;
        let tmp = dir.join(format!(".tmp-{}", tmp_suffix()));
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fsync_dir(&dir)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(BackendError::io("write", name, e));
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        fs::read(self.path("read", name)?).map_err(|e| BackendError::io("read", name, e))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f =
            File::open(self.path("read", name)?).map_err(|e| BackendError::io("read", name, e))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                BackendError::new(
                    crate::ErrorKind::Corrupt,
                    "read",
                    name,
                    format!("object shorter than {} bytes", offset + len),
                )
            } else {
                BackendError::io("read", name, e)
            }
        })?;
        Ok(buf)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_prefix(prefix)?;
        let mut out = Vec::new();
        let start = self.root.join(prefix.trim_end_matches('/'));
        if !start.exists() {
            return Ok(out);
        }
        let mut stack = vec![start];
        while let Some(dir) = stack.pop() {
            let err = |e| BackendError::io("list", dir.display().to_string(), e);
            for ent in fs::read_dir(&dir).map_err(err)? {
                let ent = ent.map_err(err)?;
                if ent.file_name().to_string_lossy().starts_with(".tmp-") {
                    continue;
                }
                let ft = ent.file_type().map_err(err)?;
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
        match fs::remove_file(self.path("delete", name)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BackendError::io("delete", name, e)),
        }
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        match fs::metadata(self.path("stat", name)?) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BackendError::io("stat", name, e)),
        }
    }

    fn will_need(&self, name: &str, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let Ok(path) = self.path("read", name) else {
            return;
        };
        if let Ok(f) = File::open(path) {
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
