//! A repository in a local directory: each object a file. Every put is
//! crash-safe: write a temporary file (`.tmp-…`, never listed), fsync it,
//! rename it into place, fsync the directory.
//!
//! Nothing inside the repository is followed through a symbolic link: a
//! repository on shared storage may have been written by someone else, and
//! a symlinked `isum/` or `data/ab` would otherwise make gc delete, or
//! backup write, files outside it. The root itself may be a link.
//!
//! Objects are created readable by their owner only (0600, directories
//! 0700), as restic does, whatever the umask — unless the repository's
//! `config` is group-readable: then the repository is meant to be shared
//! with a group, and new files are 0640, directories 0750.

use crate::object::{
    check_name, check_prefix, Backend, BackendError, ObjectInfo, ObjectWriter, Result,
};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A repository in a local directory.
pub struct LocalBackend {
    root: PathBuf,
    /// Whether new files and directories are group-readable (decided from
    /// `config` the first time something is created).
    group: std::sync::OnceLock<bool>,
}

impl LocalBackend {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalBackend {
            root: root.into(),
            group: std::sync::OnceLock::new(),
        }
    }

    /// File and directory modes of new objects.
    fn modes(&self) -> (u32, u32) {
        use std::os::unix::fs::PermissionsExt;
        let group = *self.group.get_or_init(|| {
            fs::metadata(self.root.join("config"))
                .map(|m| m.permissions().mode() & 0o040 != 0)
                .unwrap_or(false)
        });
        if group {
            (0o640, 0o750)
        } else {
            (0o600, 0o700)
        }
    }

    /// A new temporary file with the repository's file mode (set after
    /// creation: the umask narrows `open`'s).
    fn create_tmp(&self, tmp: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mode = self.modes().0;
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(tmp)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        Ok(f)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of a valid object name, none of whose directories inside
    /// the repository (nor the file itself) is a symbolic link.
    fn path(&self, op: &'static str, name: &str) -> Result<PathBuf> {
        check_name(op, name)?;
        self.refuse_links(op, name, true)?;
        Ok(self.root.join(name))
    }

    /// Fails if a component of `rel` (a checked name or prefix) below the
    /// root is a symbolic link; the last one only when `last` is set.
    /// Components that do not exist yet end the walk.
    fn refuse_links(&self, op: &'static str, rel: &str, last: bool) -> Result<()> {
        let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        let n = if last {
            parts.len()
        } else {
            parts.len().saturating_sub(1)
        };
        let mut p = self.root.clone();
        for c in &parts[..n] {
            p.push(c);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(BackendError::new(
                        crate::object::ErrorKind::Corrupt,
                        op,
                        rel,
                        format!(
                            "{} is a symbolic link inside the repository; refusing to follow it \
                             (it may point outside): remove it",
                            p.display()
                        ),
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(BackendError::io(op, rel, e)),
            }
        }
        Ok(())
    }

    /// The directory of object `name`, created (durably) if missing.
    fn dir_of(&self, path: &Path, name: &str) -> Result<PathBuf> {
        let dir = path.parent().ok_or_else(|| {
            BackendError::new(
                crate::object::ErrorKind::Invalid,
                "write",
                name,
                "no parent",
            )
        })?;
        if !dir.exists() {
            use std::os::unix::fs::PermissionsExt;
            // The directories this creates (below the root), so that their
            // mode can be set exactly: the umask narrows `mkdir`'s.
            let new: Vec<&Path> = dir
                .ancestors()
                .take_while(|a| *a != self.root && !a.exists())
                .collect();
            let err = |e| BackendError::io("create directory", dir.display().to_string(), e);
            fs::create_dir_all(dir).map_err(err)?;
            for d in new {
                fs::set_permissions(d, fs::Permissions::from_mode(self.modes().1)).map_err(err)?;
            }
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
        let file = self
            .create_tmp(&tmp)
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
            let mut f = self.create_tmp(&tmp)?;
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
                    crate::object::ErrorKind::Corrupt,
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
        self.refuse_links("list", prefix, true)?;
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
                } else if ft.is_file() || ft.is_symlink() {
                    // A symbolic link is listed (not followed: its size is
                    // the link's), so that reading it fails loudly instead
                    // of the object silently missing from every listing.
                    let size = fs::symlink_metadata(&p).map(|m| m.len()).unwrap_or(0);
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

    fn sweep_temporaries(&self, older_than: std::time::Duration) -> Result<crate::object::Swept> {
        let mut swept = crate::object::Swept::default();
        let now = std::time::SystemTime::now();
        // Where objects are (`prefix/XX/name` at most): links not
        // followed, no other file system (a mount inside the repository)
        // entered, an entry that cannot be read passed over.
        let walk = walkdir::WalkDir::new(&self.root)
            .follow_links(false)
            .same_file_system(true)
            .max_depth(3);
        for ent in walk.into_iter().filter_map(|e| e.ok()) {
            if !ent.file_type().is_file() || !ent.file_name().to_string_lossy().starts_with(".tmp-")
            {
                continue;
            }
            let Ok(meta) = ent.metadata() else {
                continue;
            };
            let old = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age > older_than);
            if !old {
                continue;
            }
            match fs::remove_file(ent.path()) {
                Ok(()) => {
                    swept.files += 1;
                    swept.bytes += meta.len();
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("{}: {e}", ent.path().display()),
            }
        }
        Ok(swept)
    }

    fn delete(&self, name: &str) -> Result<()> {
        // Unlinking removes a link itself, never its target: only the
        // directories on the way must not be links.
        check_name("delete", name)?;
        self.refuse_links("delete", name, false)?;
        match fs::remove_file(self.root.join(name)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Temporary files a killed writer left are swept once old enough;
    /// objects, fresh temporaries and what a link points to stay.
    #[test]
    fn old_temporaries_are_swept() {
        let d = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(d.path());
        b.put("data/ab/abcd", b"object").unwrap();
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let stale = d.path().join("data/ab/.tmp-1-dead");
        fs::write(&stale, vec![7u8; 1000]).unwrap();
        File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let fresh = d.path().join("data/ab/.tmp-2-live");
        fs::write(&fresh, b"being written").unwrap();
        let outside = tempfile::tempdir().unwrap();
        let far = outside.path().join(".tmp-3-far");
        fs::write(&far, b"not ours").unwrap();
        File::options()
            .write(true)
            .open(&far)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        symlink(outside.path(), d.path().join("data/cd")).unwrap();
        let swept = b
            .sweep_temporaries(std::time::Duration::from_secs(600))
            .unwrap();
        assert_eq!(
            swept,
            crate::object::Swept {
                files: 1,
                bytes: 1000
            }
        );
        assert!(!stale.exists() && fresh.exists() && far.exists());
        assert_eq!(b.get("data/ab/abcd").unwrap(), b"object");
    }

    /// A repository whose `isum/` and `data/ab` are links to a directory
    /// outside it: no operation reads, lists, writes or deletes there.
    #[test]
    fn symlinks_inside_the_repository_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("ab")).unwrap();
        fs::write(outside.join("victim"), b"precious").unwrap();
        fs::write(outside.join("ab").join("victim"), b"precious").unwrap();
        let root = tmp.path().join("repo");
        fs::create_dir_all(root.join("data")).unwrap();
        symlink(&outside, root.join("isum")).unwrap();
        symlink(outside.join("ab"), root.join("data").join("ab")).unwrap();
        fs::create_dir_all(root.join("meta")).unwrap();
        symlink(outside.join("victim"), root.join("meta").join("m1")).unwrap();
        let b = LocalBackend::new(&root);

        for (name, what) in [("isum/victim", "read"), ("data/ab/victim", "read")] {
            let e = b.get(name).unwrap_err();
            assert_eq!(
                e.kind,
                crate::object::ErrorKind::Corrupt,
                "{what} {name}: {e}"
            );
            assert!(e.to_string().contains("symbolic link"), "{e}");
            assert!(b.get_range(name, 0, 1).is_err());
            assert!(b.size(name).is_err());
            assert!(b.delete(name).is_err());
            assert!(b.put(name, b"x").is_err());
            assert!(b.stream(name).is_err());
        }
        // The object itself a link: not read, but deleting removes the link.
        assert!(b.get("meta/m1").is_err());
        b.put("data/cd/ok", b"fine").unwrap();
        assert!(b.list("isum/").is_err());
        assert!(b.list("data/ab/").is_err());
        // Listing the parent shows the links as objects (not followed: a
        // link to a directory lists nothing below it), so that reading one
        // fails loudly rather than the object silently missing.
        let names: Vec<String> = b.list("").unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, ["data/ab", "data/cd/ok", "isum", "meta/m1"]);
        b.delete("meta/m1").unwrap();
        assert!(!root.join("meta").join("m1").exists());

        assert_eq!(fs::read(outside.join("victim")).unwrap(), b"precious");
        assert_eq!(
            fs::read(outside.join("ab").join("victim")).unwrap(),
            b"precious"
        );
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 2);
    }

    /// New objects are private to their owner whatever the umask, unless
    /// the config says the repository is shared with a group.
    #[test]
    fn objects_are_private_unless_the_repository_is_shared() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let tmp = tempfile::tempdir().unwrap();
        let private = LocalBackend::new(tmp.path().join("a"));
        private.put("config", b"c").unwrap();
        private.put("data/ab/x", b"1").unwrap();
        let mut w = private.stream("data/cd/y").unwrap().unwrap();
        w.write(b"2").unwrap();
        w.finish().unwrap();
        let root = tmp.path().join("a");
        assert_eq!(mode(&root.join("config")), 0o600);
        assert_eq!(mode(&root.join("data/ab/x")), 0o600);
        assert_eq!(mode(&root.join("data/cd/y")), 0o600);
        assert_eq!(mode(&root.join("data/ab")), 0o700);
        // A repository whose config is group-readable is shared.
        // The umask must not narrow a shared repository's modes.
        // SAFETY: umask only swaps the process file-creation mask.
        let old = unsafe { libc::umask(0o077) };
        let root = tmp.path().join("b");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("config"), b"c").unwrap();
        fs::set_permissions(root.join("config"), fs::Permissions::from_mode(0o640)).unwrap();
        let shared = LocalBackend::new(&root);
        shared.put("data/ab/x", b"1").unwrap();
        let (x, ab, data) = (
            mode(&root.join("data/ab/x")),
            mode(&root.join("data/ab")),
            mode(&root.join("data")),
        );
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        assert_eq!((x, ab, data), (0o640, 0o750, 0o750));
    }

    /// The repository root itself may be reached through a link.
    #[test]
    fn a_linked_root_works() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("real")).unwrap();
        symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        let b = LocalBackend::new(tmp.path().join("link"));
        b.put("data/ab/x", b"1").unwrap();
        assert_eq!(b.get("data/ab/x").unwrap(), b"1");
        assert_eq!(b.list("data/").unwrap().len(), 1);
    }
}
