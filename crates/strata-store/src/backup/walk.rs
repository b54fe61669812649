//! The walk: the first stage of a backup. It records every entry's
//! metadata (a [`Node`]) and lists the files whose content must be read
//! (a [`Job`] each); files unchanged since the series' previous version
//! take its recipe instead (see [`super::parent`]).
//!
//! Directory traversal is `walkdir` (never following symlinks; a
//! directory's files before its subdirectories, in name order, so the
//! files of one directory are consecutive jobs), excludes are `globset`
//! patterns, extended attributes (ACLs among them) come from `xattr`.

use super::parent::Parent;
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use std::collections::{HashMap, HashSet};
use std::fs::{self, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use strata_core::format::{Node, NodeKind};

/// Where a job's bytes come from.
pub(crate) enum Source {
    Path(PathBuf),
    Stream(Mutex<Option<Box<dyn Read + Send>>>),
}

/// A file whose content must be read: its node and its source.
pub(crate) struct Job {
    pub node: usize,
    pub source: Source,
}

/// What the backup leaves out: glob patterns matched against the file name
/// (or the absolute path when the pattern contains `/`; `*` and `?` stay
/// within one path component, `**` crosses them), and paths — recognised
/// by device and inode too, whatever path leads to them.
pub struct Excludes {
    names: GlobSet,
    paths: GlobSet,
    exact: Vec<PathBuf>,
    ids: Vec<(u64, u64)>,
}

impl Excludes {
    pub fn new(patterns: &[String], paths: &[PathBuf]) -> Result<Self> {
        let (mut names, mut full) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for p in patterns {
            let glob: Glob = GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .map_err(|e| StoreError::Invalid(format!("exclude pattern {p:?}: {e}")))?;
            if p.contains('/') {
                full.add(glob);
            } else {
                names.add(glob);
            }
        }
        let built = |b: GlobSetBuilder| {
            b.build()
                .map_err(|e| StoreError::Invalid(format!("exclude patterns: {e}")))
        };
        Ok(Excludes {
            names: built(names)?,
            paths: built(full)?,
            exact: paths.to_vec(),
            ids: paths
                .iter()
                .filter_map(|p| fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))
                .collect(),
        })
    }

    /// Whether `abs` (with metadata `m`, not following symlinks) is left out.
    pub fn excluded(&self, abs: &Path, m: Option<&Metadata>) -> bool {
        if self.exact.iter().any(|p| p == abs) {
            return true;
        }
        if m.is_some_and(|m| m.is_dir() && self.ids.contains(&(m.dev(), m.ino()))) {
            return true;
        }
        let name = abs.file_name().map(Path::new);
        self.paths.is_match(abs) || name.is_some_and(|n| self.names.is_match(n))
    }
}

/// The walk's result and working state.
pub(crate) struct Walker<'a> {
    pub nodes: Vec<Node>,
    pub jobs: Vec<Job>,
    pub warnings: Vec<String>,
    /// Paths recorded for roots and their ancestors (the only entries two
    /// roots can share).
    pub seen: HashSet<Vec<u8>>,
    hardlinks: HashMap<(u64, u64), Vec<u8>>,
    parent: &'a Parent<'a>,
    force_read: bool,
    progress: &'a Progress,
    pub reused: u64,
    excludes: &'a Excludes,
}

/// A path relative to `/`, as the recipe stores it.
pub(crate) fn rel_bytes(p: &Path) -> Vec<u8> {
    let b = p.as_os_str().as_bytes();
    let s = b.iter().take_while(|&&c| c == b'/').count();
    b[s..].to_vec()
}

fn node_from_meta(path: Vec<u8>, m: &Metadata) -> Node {
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        NodeKind::Dir
    } else if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_fifo() {
        NodeKind::Fifo
    } else if ft.is_char_device() {
        NodeKind::CharDevice
    } else if ft.is_block_device() {
        NodeKind::BlockDevice
    } else if ft.is_socket() {
        NodeKind::Socket
    } else {
        NodeKind::File
    };
    Node {
        path,
        kind,
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        ino: m.ino(),
        dev: m.dev(),
        rdev: m.rdev(),
        nlink: m.nlink(),
        size: if kind == NodeKind::File { m.len() } else { 0 },
        target: None,
        segments: vec![],
        xattrs: vec![],
    }
}

/// Extended attributes of a path (not following a final symlink). A file
/// system without xattr support simply yields none.
pub fn read_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(names) = xattr::list(path) else {
        return vec![];
    };
    names
        .filter_map(|n| {
            let v = xattr::get(path, &n).ok().flatten()?;
            Some((n.as_bytes().to_vec(), v))
        })
        .collect()
}

impl<'a> Walker<'a> {
    pub fn new(
        parent: &'a Parent<'a>,
        force_read: bool,
        progress: &'a Progress,
        excludes: &'a Excludes,
    ) -> Self {
        Walker {
            nodes: Vec::new(),
            jobs: Vec::new(),
            warnings: Vec::new(),
            seen: HashSet::new(),
            hardlinks: HashMap::new(),
            parent,
            force_read,
            progress,
            reused: 0,
            excludes,
        }
    }

    /// Records one entry. `dedup` is set for roots and their ancestors, the
    /// only entries two roots can share (nested roots are merged before the
    /// walk), so the set of seen paths stays small.
    fn add(&mut self, abs: &Path, m: &Metadata, dedup: bool) {
        let rel = rel_bytes(abs);
        // `/` itself has no name to restore; its children are recorded.
        if rel.is_empty() || (dedup && !self.seen.insert(rel.clone())) {
            return;
        }
        let mut node = node_from_meta(rel.clone(), m);
        node.xattrs = read_xattrs(abs);
        match node.kind {
            NodeKind::Symlink => match fs::read_link(abs) {
                Ok(t) => node.target = Some(t.as_os_str().as_bytes().to_vec()),
                Err(e) => {
                    self.warnings
                        .push(format!("{}: cannot read link: {e}", abs.display()));
                    return;
                }
            },
            NodeKind::File => {
                if node.nlink > 1 {
                    if let Some(first) = self.hardlinks.get(&(node.dev, node.ino)) {
                        node.kind = NodeKind::Hardlink;
                        node.target = Some(first.clone());
                        node.size = 0;
                        self.nodes.push(node);
                        return;
                    }
                    self.hardlinks.insert((node.dev, node.ino), rel.clone());
                }
                self.progress.files_total.fetch_add(1, Ordering::Relaxed);
                self.progress
                    .bytes_total
                    .fetch_add(node.size, Ordering::Relaxed);
                if !self.force_read {
                    if let Some(segs) = self.parent.reuse(&node) {
                        node.segments = segs;
                        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
                        self.progress
                            .bytes_done
                            .fetch_add(node.size, Ordering::Relaxed);
                        self.reused += 1;
                        self.nodes.push(node);
                        return;
                    }
                }
                self.jobs.push(Job {
                    node: self.nodes.len(),
                    source: Source::Path(abs.to_path_buf()),
                });
            }
            _ => {}
        }
        self.nodes.push(node);
    }

    /// Walks one root: its ancestors (so restore recreates them with their
    /// metadata), the root, and everything below it.
    pub fn walk_root(&mut self, root: &Path) {
        let mut anc: Vec<&Path> = root
            .ancestors()
            .skip(1)
            .filter(|a| a.parent().is_some())
            .collect();
        anc.reverse();
        for a in anc {
            if let Ok(m) = fs::symlink_metadata(a) {
                self.add(a, &m, true);
            }
        }
        let m = match fs::symlink_metadata(root) {
            Ok(m) => m,
            Err(e) => {
                self.warnings.push(format!("{}: {e}", root.display()));
                return;
            }
        };
        self.add(root, &m, true);
        if !m.is_dir() {
            return;
        }
        let excludes = self.excludes;
        let entries = walkdir::WalkDir::new(root)
            .min_depth(1)
            .follow_links(false)
            // A directory's files first, then its subdirectories, each in
            // name order.
            .sort_by(|a, b| {
                (a.file_type().is_dir(), a.file_name())
                    .cmp(&(b.file_type().is_dir(), b.file_name()))
            })
            .into_iter()
            .filter_entry(|e| !excludes.excluded(e.path(), e.metadata().ok().as_ref()));
        for entry in entries {
            match entry {
                Ok(e) => match e.metadata() {
                    Ok(m) => self.add(e.path(), &m, false),
                    Err(err) => {
                        self.warnings
                            .push(format!("{}: {}", e.path().display(), io_cause(&err)))
                    }
                },
                Err(err) => {
                    let path = err
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    let what = if err.depth() > 0 && err.io_error().is_some() {
                        "cannot read directory: "
                    } else {
                        ""
                    };
                    self.warnings
                        .push(format!("{path}: {what}{}", io_cause(&err)));
                }
            }
        }
    }
}

/// The I/O error inside a walkdir error, or the error itself.
fn io_cause(e: &walkdir::Error) -> String {
    match e.io_error() {
        Some(io) => io.to_string(),
        None => e.to_string(),
    }
}

/// Groups consecutive jobs that are small files of one directory (each at
/// most a quarter of a segment) into units of up to `segment` bytes; every
/// other job is a unit of its own. The walk lists a directory's files
/// together, so consecutive is enough.
pub(crate) fn group_small_files(jobs: &[Job], nodes: &[Node], segment: u64) -> Vec<Vec<usize>> {
    let small = |j: &Job| matches!(j.source, Source::Path(_)) && nodes[j.node].size <= segment / 4;
    let dir = |j: &Job| {
        let p = &nodes[j.node].path;
        p[..p.iter().rposition(|&b| b == b'/').unwrap_or(0)].to_vec()
    };
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    let mut cur_dir: Option<Vec<u8>> = None;
    for (i, j) in jobs.iter().enumerate() {
        if !small(j) {
            if !cur.is_empty() {
                units.push(std::mem::take(&mut cur));
            }
            units.push(vec![i]);
            cur_dir = None;
            cur_bytes = 0;
            continue;
        }
        let d = dir(j);
        if cur_dir.as_ref() != Some(&d) || cur_bytes >= segment {
            if !cur.is_empty() {
                units.push(std::mem::take(&mut cur));
            }
            cur_dir = Some(d);
            cur_bytes = 0;
        }
        cur_bytes += nodes[j.node].size;
        cur.push(i);
    }
    if !cur.is_empty() {
        units.push(cur);
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_of_a_directory_are_grouped() {
        let node = |path: &str, size: u64| Node {
            path: path.as_bytes().to_vec(),
            kind: NodeKind::File,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            ino: 0,
            dev: 0,
            rdev: 0,
            nlink: 1,
            size,
            target: None,
            segments: vec![],
            xattrs: vec![],
        };
        let nodes = vec![
            node("a/1", 100),
            node("a/2", 100),
            node("a/big", 10_000),
            node("a/3", 100),
            node("b/1", 100),
            node("b/2", 200),
            node("b/3", 200),
        ];
        let jobs: Vec<Job> = (0..nodes.len())
            .map(|i| Job {
                node: i,
                source: Source::Path(PathBuf::from("x")),
            })
            .collect();
        // Segment 1000: small = at most 250 bytes, a unit holds ~1000.
        let units = group_small_files(&jobs, &nodes, 1000);
        assert_eq!(units, vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6]]);
        // Segment 400: only 100-byte files are small.
        let units = group_small_files(&jobs, &nodes, 400);
        assert_eq!(
            units,
            vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5], vec![6]]
        );
        // Segment 800: b's files are small; a unit closes once it holds a
        // segment's worth.
        let units = group_small_files(&jobs, &nodes, 800);
        assert_eq!(units, vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6]]);
        let many: Vec<Node> = (0..10).map(|i| node(&format!("c/{i}"), 200)).collect();
        let jobs: Vec<Job> = (0..10)
            .map(|i| Job {
                node: i,
                source: Source::Path(PathBuf::from("x")),
            })
            .collect();
        let units = group_small_files(&jobs, &many, 800);
        assert_eq!(units, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[test]
    fn excludes() {
        let ex = |pats: &[&str]| {
            Excludes::new(&pats.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[]).unwrap()
        };
        let m = |e: &Excludes, p: &str| e.excluded(Path::new(p), None);
        let e = ex(&["*.o"]);
        assert!(m(&e, "/src/main.o"));
        assert!(!m(&e, "/src/main.c"));
        let e = ex(&["/home/*/cache"]);
        assert!(m(&e, "/home/u/cache"));
        assert!(!m(&e, "/home/u/v/cache"));
        let e = ex(&["/home/**/cache"]);
        assert!(m(&e, "/home/u/v/cache"));
        let e = ex(&["fil?.txt", "target"]);
        assert!(m(&e, "/x/file.txt"));
        assert!(m(&e, "/x/target"));
        assert!(!m(&e, "/x/targets"));
        assert!(Excludes::new(&["a[".to_string()], &[]).is_err());
        let e = Excludes::new(&[], &[PathBuf::from("/r/repo")]).unwrap();
        assert!(m(&e, "/r/repo"));
        assert!(!m(&e, "/r/repo2"));
    }
}
