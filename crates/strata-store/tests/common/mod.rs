//! Helpers shared by the integration tests: small repositories, a tiny
//! deterministic RNG, tree models and restore-and-compare.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use strata_core::chunker::ChunkerParams;
use strata_core::crypto::KdfCost;
use strata_core::id::SnapshotId;
use strata_store::backend::{BackendError, ObjectInfo, Result as BResult};
use strata_store::ops::backup::{BackupOptions, BackupReport};
use strata_store::ops::restore::{restore_from, RecipeSource, RestoreOptions};
use strata_store::{Backend, InitOptions, LocalBackend, Repository, Result};

pub const PASSWORD: &[u8] = b"pw";

/// Cheap Argon2 for encrypted test repositories.
pub const FAST_KDF: KdfCost = KdfCost {
    memory_kib: 256,
    iterations: 1,
};

pub fn password() -> Result<Vec<u8>> {
    Ok(PASSWORD.to_vec())
}

/// Small containers, regions, chunks and segments so that small trees
/// spread over many containers.
pub fn small_init(encrypted: bool) -> InitOptions {
    let mut chunker = ChunkerParams::cdc(1024);
    chunker.avg_segment = 64 << 10;
    InitOptions {
        password: encrypted.then(|| PASSWORD.to_vec()),
        kdf: FAST_KDF,
        container_size: 256 << 10,
        region_size: 32 << 10,
        chunker,
        // The chunk-level baseline: most fault tests count chunks; the
        // lifecycle tests use `segment`.
        index: "exact".into(),
        ..Default::default()
    }
}

/// Creates a repository with [`small_init`] options in `dir`.
pub fn init_repo(dir: &Path, encrypted: bool) -> Repository {
    let backend: Arc<dyn Backend> = Arc::new(LocalBackend::new(dir));
    Repository::init(backend, small_init(encrypted)).expect("init repository")
}

/// Opens the repository in `dir` through `backend` (defaults to a plain
/// local backend).
pub fn open_repo(backend: Arc<dyn Backend>) -> Repository {
    match Repository::open(backend, &password) {
        Ok(r) => r,
        Err(e) => panic!("open repository: {e}"),
    }
}

pub fn local(dir: &Path) -> Arc<dyn Backend> {
    Arc::new(LocalBackend::new(dir))
}

/// SplitMix64: a tiny deterministic generator for file contents.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    Rng(seed).bytes(n)
}

/// A file tree: regular files (relative path → content) and directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    pub files: BTreeMap<String, Vec<u8>>,
    pub dirs: BTreeSet<String>,
    pub symlinks: BTreeMap<String, PathBuf>,
}

impl Tree {
    /// A short description of how two trees differ (for assertion messages).
    pub fn diff(&self, other: &Tree) -> String {
        let mut out = Vec::new();
        for (p, a) in &self.files {
            match other.files.get(p) {
                None => out.push(format!("{p}: missing ({} bytes expected)", a.len())),
                Some(b) if a != b => {
                    let first = a
                        .iter()
                        .zip(b.iter())
                        .position(|(x, y)| x != y)
                        .unwrap_or(a.len().min(b.len()));
                    out.push(format!(
                        "{p}: content differs (expected {} bytes, got {}, first difference at {first})",
                        a.len(),
                        b.len()
                    ))
                }
                _ => {}
            }
        }
        for p in other.files.keys() {
            if !self.files.contains_key(p) {
                out.push(format!("{p}: unexpected file"));
            }
        }
        if self.dirs != other.dirs {
            out.push(format!(
                "directories differ: expected {:?}, got {:?}",
                self.dirs, other.dirs
            ));
        }
        if self.symlinks != other.symlinks {
            out.push(format!(
                "symlinks differ: expected {:?}, got {:?}",
                self.symlinks, other.symlinks
            ));
        }
        out.join("\n")
    }
}

/// Reads a directory tree from disk (paths relative to `root`).
pub fn read_tree(root: &Path) -> Tree {
    let mut t = Tree::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = fs::symlink_metadata(&p).unwrap().file_type();
            if ft.is_dir() {
                t.dirs.insert(rel);
                stack.push(p);
            } else if ft.is_symlink() {
                t.symlinks.insert(rel, fs::read_link(&p).unwrap());
            } else if ft.is_file() {
                t.files.insert(rel, fs::read(&p).unwrap());
            } else {
                panic!("unexpected file type at {}", p.display());
            }
        }
    }
    t
}

/// Writes the files of a tree under `root` (directories are created).
pub fn write_tree(root: &Path, t: &Tree) {
    fs::create_dir_all(root).unwrap();
    for d in &t.dirs {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for (p, data) in &t.files {
        let full = root.join(p);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, data).unwrap();
    }
    for (p, target) in &t.symlinks {
        std::os::unix::fs::symlink(target, root.join(p)).unwrap();
    }
}

/// Where a backed-up absolute path ends up below a restore target.
pub fn restored_path(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap_or(src))
}

/// A backup and the incremental lifecycle after it, as `strata backup`
/// runs them.
pub fn backup_with_lifecycle(repo: &Repository, opts: BackupOptions) -> Result<BackupReport> {
    strata_store::revdedup::backup(
        repo,
        opts,
        strata_store::revdedup::After::Lifecycle,
        &mut |_| {},
    )
    .map(|b| b.report)
}

/// Backs `paths` up as series `test`, the lifecycle after it.
pub fn backup_paths(repo: &Repository, paths: &[&Path]) -> Result<BackupReport> {
    backup_with_lifecycle(
        repo,
        BackupOptions {
            paths: paths.iter().map(|p| p.to_path_buf()).collect(),
            series: Some("test".into()),
            ..Default::default()
        },
    )
}

/// Restores the snapshot `id` (through its current recipe, as `strata
/// restore` does) into a fresh directory below `scratch` and returns the
/// tree found where `src` was.
pub fn restore_tree(
    repo: &Repository,
    id: &SnapshotId,
    src: &Path,
    scratch: &Path,
    what: &str,
) -> Tree {
    let target = tempfile::tempdir_in(scratch).unwrap();
    let snap = repo
        .load_snapshot(id)
        .unwrap_or_else(|e| panic!("{what}: load snapshot {id}: {e}"));
    let recipe = RecipeSource::Stored {
        repo,
        id: &snap.recipe,
    };
    let opts = RestoreOptions::new(target.path());
    if let Err(e) = restore_from(repo, &snap, recipe, &opts) {
        panic!("{what}: restore of snapshot {id} failed: {e}");
    }
    read_tree(&restored_path(target.path(), src))
}

/// Asserts that snapshot `id` restores to exactly `expected`.
pub fn assert_restores(
    repo: &Repository,
    id: &SnapshotId,
    src: &Path,
    scratch: &Path,
    expected: &Tree,
    what: &str,
) {
    let got = restore_tree(repo, id, src, scratch, what);
    if &got != expected {
        panic!(
            "{what}: restored tree differs from the backed-up one:\n{}",
            expected.diff(&got)
        );
    }
}

/// Runs `check` (optionally reading all data) and panics unless it is ok.
pub fn assert_check_ok(repo: &Repository, read_data: bool, what: &str) {
    let r = strata_store::ops::check::check(
        repo,
        &strata_store::ops::check::CheckOptions {
            read_data,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{what}: check failed to run: {e}"));
    assert!(
        r.ok(),
        "{what}: check reported errors: {:#?} (damaged: {:?})",
        r.errors,
        r.damaged_snapshots
    );
}

/// Copies a directory tree (for cloning a repository state).
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let ft = e.file_type().unwrap();
        let dst = to.join(e.file_name());
        if ft.is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Names of the objects under a prefix.
pub fn object_names(backend: &dyn Backend, prefix: &str) -> Vec<String> {
    backend
        .list(prefix)
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect()
}

// ---------------------------------------------------------------------------
// A fault-injecting backend.

#[derive(Default)]
pub struct Faults {
    /// Bytes that puts may still write; `None` = unlimited. A put that does
    /// not fit fails with ENOSPC and writes nothing.
    pub budget: Option<u64>,
    /// Mutations (put/delete) that may still succeed; once exhausted every
    /// further mutation fails, as if the process had died.
    pub mutations_left: Option<u64>,
    /// Puts of objects whose name starts with this prefix fail with ENOSPC.
    pub full_for: Option<&'static str>,
    /// Reads of this object return the byte at this offset flipped.
    pub flip: Option<(String, u64)>,
    /// Deleting `meta/X` once `data/X` is gone always succeeds and does not
    /// count as a mutation: the pair is deleted atomically.
    pub atomic_container_delete: bool,
    pub puts: u64,
    pub failed_puts: u64,
    /// Names of the whole objects read, in order.
    pub gets: Vec<String>,
}

pub struct FaultBackend {
    inner: LocalBackend,
    f: Mutex<Faults>,
}

impl FaultBackend {
    pub fn new(dir: &Path) -> Arc<Self> {
        Arc::new(FaultBackend {
            inner: LocalBackend::new(dir),
            f: Mutex::new(Faults::default()),
        })
    }

    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.f.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn heal(&self) {
        let mut f = self.faults();
        f.budget = None;
        f.mutations_left = None;
        f.flip = None;
        f.full_for = None;
    }

    fn mutation(&self, name: &str) -> BResult<()> {
        let mut f = self.faults();
        match &mut f.mutations_left {
            Some(0) => Err(BackendError::io(
                "write",
                name,
                std::io::Error::other("simulated crash"),
            )),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn flip(&self, name: &str, offset: u64, buf: &mut [u8]) {
        if let Some((n, at)) = &self.faults().flip {
            if n == name && *at >= offset && *at < offset + buf.len() as u64 {
                buf[(*at - offset) as usize] ^= 0x55;
            }
        }
    }
}

impl Backend for FaultBackend {
    fn put(&self, name: &str, data: &[u8]) -> BResult<()> {
        self.mutation(name)?;
        {
            let mut f = self.faults();
            f.puts += 1;
            if f.full_for.is_some_and(|p| name.starts_with(p)) {
                f.failed_puts += 1;
                return Err(BackendError::io(
                    "write",
                    name,
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                ));
            }
            if let Some(b) = &mut f.budget {
                if data.len() as u64 > *b {
                    f.failed_puts += 1;
                    return Err(BackendError::io(
                        "write",
                        name,
                        std::io::Error::from_raw_os_error(libc::ENOSPC),
                    ));
                }
                *b -= data.len() as u64;
            }
        }
        self.inner.put(name, data)
    }

    fn get(&self, name: &str) -> BResult<Vec<u8>> {
        self.faults().gets.push(name.to_string());
        let mut v = self.inner.get(name)?;
        self.flip(name, 0, &mut v);
        Ok(v)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> BResult<Vec<u8>> {
        let mut v = self.inner.get_range(name, offset, len)?;
        self.flip(name, offset, &mut v);
        Ok(v)
    }

    fn list(&self, prefix: &str) -> BResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }

    fn delete(&self, name: &str) -> BResult<()> {
        let paired = self.faults().atomic_container_delete
            && name.starts_with("meta/")
            && matches!(self.inner.size(&format!("data/{}", &name[5..])), Ok(None));
        if !paired {
            self.mutation(name)?;
        }
        self.inner.delete(name)
    }

    fn size(&self, name: &str) -> BResult<Option<u64>> {
        self.inner.size(name)
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
}
