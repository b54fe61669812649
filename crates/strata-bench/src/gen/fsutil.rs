//! File-system helpers shared by the tree generators: preparing output
//! directories, copying a `--base` tree, listing trees in a deterministic
//! order, simulated modification times, and [`BaseData`] (real files used
//! as a byte source). Nothing here models a paper.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// Start of simulated time: Monday 2014-01-06 00:00 UTC. Generators set the
/// mtime of every file they write to `SIM_EPOCH + day·86400 + …`, so trees
/// are reproducible including their mtimes, and a file changed on a later
/// simulated day always gets a different mtime.
pub const SIM_EPOCH: u64 = 1_388_966_400;

/// Creates `dir` if needed and checks that it is empty (generators refuse
/// to write version 0 over existing files rather than delete them).
pub fn prepare_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    if fs::read_dir(dir)?.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{}: version 0 must be generated into an empty directory",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Sets a file's mtime (and atime) to simulated time `secs` (seconds since
/// the Unix epoch).
pub fn set_mtime(path: &Path, secs: u64) -> io::Result<()> {
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    let f = fs::OpenOptions::new().write(true).open(path)?;
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
}

/// Sets the mtime (and atime) of an open file.
pub fn set_file_mtime(f: &File, secs: u64) -> io::Result<()> {
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
}

/// Simulated time of `day` plus `tick` seconds (tick < 86400 keeps the day).
pub fn sim_time(day: u64, tick: u64) -> u64 {
    SIM_EPOCH + day * 86_400 + tick % 86_400
}

/// Entries of a directory sorted by name.
fn sorted_entries(dir: &Path) -> io::Result<Vec<fs::DirEntry>> {
    let mut v: Vec<fs::DirEntry> = fs::read_dir(dir)?.collect::<io::Result<_>>()?;
    v.sort_by_key(|e| e.file_name());
    Ok(v)
}

/// Regular files and directories under `root` (relative paths, depth-first
/// in name order; `root` itself excluded; symlinks are not followed and
/// listed in neither).
pub fn list_tree(root: &Path) -> io::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    fn walk(
        root: &Path,
        rel: &Path,
        files: &mut Vec<PathBuf>,
        dirs: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        for e in sorted_entries(&root.join(rel))? {
            let ft = e.file_type()?;
            let r = rel.join(e.file_name());
            if ft.is_dir() {
                dirs.push(r.clone());
                walk(root, &r, files, dirs)?;
            } else if ft.is_file() {
                files.push(r);
            }
        }
        Ok(())
    }
    walk(root, Path::new(""), &mut files, &mut dirs)?;
    Ok((files, dirs))
}

/// Copies the tree `src` into `dst` (regular files, directories, symlinks;
/// other file types are skipped). Copies are made owner-writable so the
/// generators can modify them. Returns the bytes of regular files copied.
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let mut bytes = 0;
    fs::create_dir_all(dst)?;
    for e in sorted_entries(src)? {
        let ft = e.file_type()?;
        let from = e.path();
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            bytes += copy_tree(&from, &to)?;
            let mut p = fs::metadata(&to)?.permissions();
            p.set_mode(p.mode() | 0o700);
            fs::set_permissions(&to, p)?;
        } else if ft.is_file() {
            bytes += fs::copy(&from, &to)?;
            let mut p = fs::metadata(&to)?.permissions();
            p.set_mode((p.mode() | 0o600) & 0o7777);
            fs::set_permissions(&to, p)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        }
    }
    Ok(bytes)
}

/// Real files used as a byte source: the regular files under a directory
/// (or a single file), concatenated in name order. Reads past the end
/// return zeros.
#[derive(Debug)]
pub struct BaseData {
    root: PathBuf,
    /// (relative path, offset in the concatenation, length)
    files: Vec<(PathBuf, u64, u64)>,
    total: u64,
    open: Option<(usize, File)>,
}

impl BaseData {
    pub fn open(path: &Path) -> io::Result<BaseData> {
        let meta = fs::metadata(path)?;
        let (root, list) = if meta.is_file() {
            (
                path.parent().unwrap_or(Path::new("/")).to_path_buf(),
                vec![PathBuf::from(path.file_name().unwrap_or_default())],
            )
        } else {
            (path.to_path_buf(), list_tree(path)?.0)
        };
        let mut files = Vec::new();
        let mut total = 0;
        for rel in list {
            let len = fs::metadata(root.join(&rel))?.len();
            if len > 0 {
                files.push((rel, total, len));
                total += len;
            }
        }
        if total == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: no data in base", path.display()),
            ));
        }
        Ok(BaseData {
            root,
            files,
            total,
            open: None,
        })
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Fills `buf` with the bytes at `offset` of the concatenation.
    pub fn read_at(&mut self, mut offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut pos = 0;
        while pos < buf.len() {
            if offset >= self.total {
                buf[pos..].fill(0);
                return Ok(());
            }
            let i = self.files.partition_point(|f| f.1 + f.2 <= offset);
            let (ref rel, start, len) = self.files[i];
            if self.open.as_ref().map(|o| o.0) != Some(i) {
                self.open = Some((i, File::open(self.root.join(rel))?));
            }
            let f = &self.open.as_ref().unwrap().1;
            let within = offset - start;
            let n = ((len - within) as usize).min(buf.len() - pos);
            let mut got = 0;
            while got < n {
                let k = f.read_at(&mut buf[pos + got..pos + n], within + got as u64)?;
                if k == 0 {
                    // The file shrank since it was listed: zero-fill.
                    buf[pos + got..pos + n].fill(0);
                    break;
                }
                got += k;
            }
            pos += n;
            offset += n as u64;
        }
        Ok(())
    }
}

/// Reads a whole file (helper with a path in the error).
pub fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut v))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok(v)
}

/// The versions `advance` has to apply to reach `version` when `done`
/// versions of the series exist already (0: nothing generated yet).
pub(crate) fn versions_to_apply(
    done: usize,
    version: usize,
    total: usize,
) -> io::Result<std::ops::RangeInclusive<usize>> {
    if version >= total {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "version {version} out of range: the workload has {total} versions (0..{})",
                total.saturating_sub(1)
            ),
        ));
    }
    if version < done {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("version {version} was already produced (next is {done}); versions must be generated in order"),
        ));
    }
    Ok(done..=version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_data_concatenates() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a")).unwrap();
        fs::write(t.path().join("a/x"), b"hello ").unwrap();
        fs::write(t.path().join("b"), b"world").unwrap();
        fs::write(t.path().join("c"), b"").unwrap();
        let mut b = BaseData::open(t.path()).unwrap();
        assert_eq!(b.len(), 11);
        let mut buf = [0u8; 14];
        b.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"hello world\0\0\0");
        let mut buf = [0u8; 4];
        b.read_at(4, &mut buf).unwrap();
        assert_eq!(&buf, b"o wo");
    }

    #[test]
    fn copy_and_list() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir_all(src.join("d/e")).unwrap();
        fs::write(src.join("d/f"), b"1").unwrap();
        fs::write(src.join("g"), b"22").unwrap();
        std::os::unix::fs::symlink("g", src.join("l")).unwrap();
        let dst = t.path().join("dst");
        assert_eq!(copy_tree(&src, &dst).unwrap(), 3);
        let (files, dirs) = list_tree(&dst).unwrap();
        assert_eq!(files, vec![PathBuf::from("d/f"), PathBuf::from("g")]);
        assert_eq!(dirs, vec![PathBuf::from("d"), PathBuf::from("d/e")]);
        assert_eq!(fs::read_link(dst.join("l")).unwrap(), PathBuf::from("g"));
        assert!(prepare_dir(&dst).is_err());
        prepare_dir(&t.path().join("new")).unwrap();
        assert!(versions_to_apply(2, 1, 5).is_err());
        assert!(versions_to_apply(0, 5, 5).is_err());
        assert_eq!(versions_to_apply(1, 3, 5).unwrap(), 1..=3);
    }
}
