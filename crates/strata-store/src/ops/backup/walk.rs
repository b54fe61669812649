//! The walk: the first stage of a backup. It records every entry's
//! metadata (a [`Node`]) and hands it on at once ([`Feed`]) with, for a
//! file whose content must be read, where to read it; files unchanged
//! since the series' previous version take its recipe instead (see
//! [`super::parent`]).
//!
//! Directory traversal is `walkdir` (never following symlinks; each
//! directory's entries in name order, so paths come in the recipe's order,
//! [`strata_core::format::path_cmp`], and the previous version is read
//! alongside), excludes are `globset` patterns, extended attributes (ACLs
//! among them) come from `xattr`.

use super::job::{PATCH_PIECE, PATCH_SEGMENT};
use super::parent::{CarriedPart, Parent, ParentFile, PrevNode};
use super::patch::{PatchSource, SharedImage};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use strata_core::format::{path_cmp, Node, NodeKind, PieceRef};

/// Where a job's bytes come from.
pub(crate) enum Source {
    Path(PathBuf),
    Stream(Mutex<Option<Box<dyn Read + Send>>>),
    /// An image of which only some segments are read.
    Patch(Mutex<Option<PatchSource>>),
}

/// A file whose content must be read: its node (metadata; the segments
/// are filled in when it is stored), where to read it, and its previous
/// version to deduplicate against.
pub(crate) struct Job {
    /// Its place in the tree (see [`super::flow`]).
    pub seq: u64,
    pub node: Node,
    pub source: Source,
    pub prev: Option<ParentFile>,
}

/// Where the walk hands each entry, in tree order.
pub(crate) trait Feed {
    /// The next entry; `source` is set for a file to read.
    fn push(&mut self, node: Node, source: Option<(Source, Option<ParentFile>)>) -> Result<()>;
    /// Waits until fewer than `max` files handed on are still being
    /// stored.
    fn wait_in_flight(&mut self, max: usize) -> Result<()>;
    /// A part of the previous version that goes into the recipe as it is
    /// (a piece of `node`, the file handed on before it).
    fn push_part(&mut self, part: CarriedPart, node: Node) -> Result<()>;
}

/// Pieces of a patched image being stored at once (each holds its
/// previous piece's unchanged segments and its new segments until the
/// recipe takes it).
const PIECES_IN_FLIGHT: usize = 4;

/// What the backup leaves out: glob patterns matched against the file name
/// (or the absolute path when the pattern contains `/`; `*` and `?` stay
/// within one path component, `**` crosses them), and paths — recognised
/// by device and inode too, whatever path leads to them.
pub struct Excludes {
    names: GlobSet,
    paths: GlobSet,
    exact: Vec<PathBuf>,
    ids: Vec<(u64, u64)>,
    /// A directory holding a file of one of these names is left out
    /// (`CACHEDIR.TAG`, `.nobackup`).
    if_present: Vec<String>,
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
            if_present: vec![],
        })
    }

    /// Also leaves out directories that hold a file named one of `names`.
    pub fn if_present(mut self, names: &[String]) -> Result<Self> {
        if let Some(bad) = names.iter().find(|n| n.is_empty() || n.contains('/')) {
            return Err(StoreError::Invalid(format!(
                "--exclude-if-present takes a file name, not {bad:?}"
            )));
        }
        self.if_present = names.to_vec();
        Ok(self)
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
        if self.paths.is_match(abs) || name.is_some_and(|n| self.names.is_match(n)) {
            return true;
        }
        m.is_some_and(|m| m.is_dir())
            && self
                .if_present
                .iter()
                .any(|n| fs::symlink_metadata(abs.join(n)).is_ok())
    }
}

/// The walk's working state.
pub(crate) struct Walker<'a, 'p> {
    feed: &'a mut dyn Feed,
    pub warnings: Vec<String>,
    /// Paths recorded for roots and their ancestors (the only entries two
    /// roots can share).
    seen: HashSet<Vec<u8>>,
    hardlinks: HashMap<(u64, u64), Vec<u8>>,
    parent: &'a mut Parent<'p>,
    force_read: bool,
    progress: &'a Progress,
    pub reused: u64,
    /// Bytes of patched images whose pieces went into the recipe as the
    /// previous version's parts.
    pub carried_bytes: u64,
    excludes: &'a Excludes,
    /// Stay on each root's file system (mount points below a root are
    /// recorded as empty directories).
    pub one_file_system: bool,
    /// Entries not from the file system (`--stdin` and its directories),
    /// in path order, each handed on at its place among the others.
    synthetic: VecDeque<(Node, Option<Source>)>,
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

impl<'a, 'p> Walker<'a, 'p> {
    pub fn new(
        feed: &'a mut dyn Feed,
        parent: &'a mut Parent<'p>,
        force_read: bool,
        progress: &'a Progress,
        excludes: &'a Excludes,
    ) -> Self {
        Walker {
            feed,
            warnings: Vec::new(),
            seen: HashSet::new(),
            hardlinks: HashMap::new(),
            parent,
            force_read,
            progress,
            reused: 0,
            carried_bytes: 0,
            excludes,
            one_file_system: false,
            synthetic: VecDeque::new(),
        }
    }

    /// Adds entries that are not in the file system (a stream and its
    /// directories): each is handed on where its path falls among the
    /// walked ones. A path the walk also meets is refused.
    pub fn add_synthetic(&mut self, mut entries: Vec<(Node, Option<Source>)>) {
        entries.sort_by(|a, b| path_cmp(&a.0.path, &b.0.path));
        self.synthetic = entries.into();
    }

    /// Hands on the synthetic entries that come before `path` (all of
    /// them when `None`).
    fn flush_synthetic(&mut self, path: Option<&[u8]>) -> Result<()> {
        while let Some((n, _)) = self.synthetic.front() {
            if let Some(p) = path {
                match path_cmp(&n.path, p) {
                    std::cmp::Ordering::Greater => break,
                    // A directory of the stream's name that is walked
                    // anyway is recorded as it is on disk.
                    std::cmp::Ordering::Equal if n.kind == NodeKind::Dir => {
                        self.synthetic.pop_front();
                        continue;
                    }
                    std::cmp::Ordering::Equal => {
                        return Err(StoreError::Invalid(format!(
                            "--stdin-name {} is also a path being backed up; choose another name",
                            n.path_str()
                        )))
                    }
                    std::cmp::Ordering::Less => {}
                }
            }
            let Some((node, source)) = self.synthetic.pop_front() else {
                break;
            };
            if let Some(Source::Patch(m)) = &source {
                let patch = m.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(p) = patch {
                    self.push_patch(node, p)?;
                    continue;
                }
            }
            // A stream: looked up in its previous version.
            let prev = self.parent.take(&node.path);
            let prev = source.as_ref().and(prev.as_ref()).and_then(|p| p.file());
            self.feed.push(node, source.map(|s| (s, prev)))?;
        }
        Ok(())
    }

    /// Hands on a patched image a piece at a time ([`PATCH_PIECE`]), each
    /// a job whose node is a piece of the image's, with the previous
    /// version's piece at the same place (its unchanged segments taken
    /// over) and its neighbours (chunk lookups around what is read): the
    /// previous version is read a piece at a time, and at most
    /// [`PIECES_IN_FLIGHT`] pieces are being stored, so memory stays the
    /// same for an image of any size.
    fn push_patch(&mut self, node: Node, p: PatchSource) -> Result<()> {
        let PatchSource {
            source,
            size,
            changed,
            ..
        } = p;
        let image = SharedImage(Arc::new(Mutex::new(source)));
        let file = Node::new(node.path.clone(), NodeKind::File);
        // The previous image's pieces within reach of the one handed on:
        // (first byte, piece).
        let mut window: VecDeque<(u64, PrevNode)> = VecDeque::new();
        let (mut next, mut prev_done) = (0u64, false);
        let carry = self.carry_filter(&node, size, changed.as_deref());
        self.parent.set_carry(carry);
        for k in 0..size.div_ceil(PATCH_PIECE).max(1) {
            let (s, e) = (k * PATCH_PIECE, ((k + 1) * PATCH_PIECE).min(size));
            // A piece none of whose segments changed, alone in a part that
            // says so: that part, unread.
            if let Some(carried) = (k > 0 && next == s)
                .then(|| self.parent.take_carried(&node.path, s))
                .flatten()
            {
                next = e;
                self.carry_piece(
                    carried,
                    Node {
                        size,
                        ..node.clone()
                    },
                    e - s,
                    e >= size,
                )?;
                continue;
            }
            while !prev_done
                && next < e.saturating_add(PATCH_PIECE)
                && !self.parent.next_carried(&node.path, next)
            {
                let after = (next > 0).then_some(&file);
                match self.parent.take_piece(&node.path, after) {
                    Some(piece) => {
                        let len = piece.len();
                        window.push_back((next, piece));
                        next += len;
                        // (An empty piece would never move on.)
                        prev_done |= len == 0;
                    }
                    None => prev_done = true,
                }
            }
            while window
                .front()
                .is_some_and(|(at, p)| at + p.len() + PATCH_PIECE <= s)
            {
                window.pop_front();
            }
            let mut job = PatchSource {
                source: Box::new(image.clone()),
                size,
                end: e,
                changed: None,
                clean: Default::default(),
                prev: None,
                at: s,
                hole: None,
            };
            if let (Some(ch), Some((_, prev))) = (&changed, window.iter().find(|(at, _)| *at == s))
            {
                job.clean = prev.clean_segments_at(s, e, size, ch);
            }
            let piece = Node {
                size,
                ..node.clone()
            };
            // A piece after the first whose every segment is the previous
            // version's, in a part of its own: that part, as it is (the
            // bytes the recipe writer would write for it again).
            let parent = &*self.parent;
            let carried = window
                .iter_mut()
                .find(|(at, _)| *at == s && k > 0)
                .and_then(|(_, prev)| {
                    let whole = job.clean.len() as u64 == (e - s).div_ceil(PATCH_SEGMENT)
                        && prev.len() == e - s
                        && prev.same_file(&piece);
                    whole.then(|| prev.carried_at(parent, s)).flatten()
                });
            if let Some(carried) = carried {
                self.carry_piece(carried, piece, e - s, e >= size)?;
                continue;
            }
            let same = window.iter().find(|(at, _)| *at == s).map(|(_, p)| p);
            let read = match changed {
                Some(_) => job.read_ranges(),
                None => vec![(s, e)],
            };
            let near: Vec<(u64, &PrevNode)> = window.iter().map(|(at, p)| (*at, p)).collect();
            let lookups = PrevNode::pieces_near(&near, &read);
            if let (false, Some(prev)) = (job.clean.is_empty(), same) {
                job.prev = Some(prev.segments_of(&job.clean));
            }
            self.feed.wait_in_flight(PIECES_IN_FLIGHT)?;
            let source = Source::Patch(Mutex::new(Some(job)));
            self.feed.push(piece, Some((source, lookups)))?;
        }
        self.parent.set_carry(None);
        Ok(())
    }

    /// Which pieces of the previous version of the image `node` (of
    /// `size` bytes) to take over unread: those whose part says it holds
    /// alone a whole piece after the first, at its place, cut in the
    /// patch's segments, with the image's metadata, none of its segments
    /// changed. None when the changes are not known.
    fn carry_filter(
        &self,
        node: &Node,
        size: u64,
        changed: Option<&[bool]>,
    ) -> Option<super::parent::CarryFilter<'p>> {
        let changed = changed?.to_vec();
        let meta = self.parent.piece_meta(&mut Node {
            size,
            ..node.clone()
        })?;
        Some(Box::new(move |p: &PieceRef| {
            let end = p.offset.saturating_add(p.len);
            p.offset > 0
                && p.offset.is_multiple_of(PATCH_PIECE)
                && p.len > 0
                && p.len == PATCH_PIECE.min(size.saturating_sub(p.offset))
                && p.segment as u64 == PATCH_SEGMENT
                && p.meta == meta
                && (p.offset / PATCH_SEGMENT..end.div_ceil(PATCH_SEGMENT))
                    .all(|k| changed.get(k as usize) == Some(&false))
        }))
    }

    /// Hands on the previous version's part of a piece of `len` bytes
    /// (the last piece of its image: `last`), as it is.
    fn carry_piece(
        &mut self,
        carried: CarriedPart,
        piece: Node,
        len: u64,
        last: bool,
    ) -> Result<()> {
        self.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
        if last {
            // (The job of the last piece counts the file done.)
            self.progress.files_done.fetch_add(1, Ordering::Relaxed);
        }
        self.carried_bytes += len;
        self.feed.push_part(carried, piece)
    }

    /// Records one entry. `dedup` is set for roots and their ancestors, the
    /// only entries two roots can share (nested roots are merged before the
    /// walk), so the set of seen paths stays small.
    fn add(&mut self, abs: &Path, m: &Metadata, dedup: bool) -> Result<()> {
        let rel = rel_bytes(abs);
        // `/` itself has no name to restore; its children are recorded.
        if rel.is_empty() || (dedup && !self.seen.insert(rel.clone())) {
            return Ok(());
        }
        self.flush_synthetic(Some(&rel))?;
        // The previous version is read up to here whatever the entry is,
        // so a damaged part of it is known before a node it covers is
        // handed on (see [`Parent::suspects`]).
        let mut prev = self.parent.take(&rel);
        let mut node = node_from_meta(rel.clone(), m);
        node.xattrs = read_xattrs(abs);
        match node.kind {
            NodeKind::Symlink => match fs::read_link(abs) {
                Ok(t) => node.target = Some(t.as_os_str().as_bytes().to_vec()),
                Err(e) => {
                    self.warnings
                        .push(format!("{}: cannot read link: {e}", abs.display()));
                    return Ok(());
                }
            },
            NodeKind::File => {
                if node.nlink > 1 {
                    if let Some(first) = self.hardlinks.get(&(node.dev, node.ino)) {
                        node.kind = NodeKind::Hardlink;
                        node.target = Some(first.clone());
                        node.size = 0;
                        return self.feed.push(node, None);
                    }
                    self.hardlinks.insert((node.dev, node.ino), rel.clone());
                }
                self.progress.files_total.fetch_add(1, Ordering::Relaxed);
                self.progress
                    .bytes_total
                    .fetch_add(node.size, Ordering::Relaxed);
                if let (false, Some(p)) = (self.force_read, prev.as_mut()) {
                    if let Some(segs) = self.parent.reuse(p, &node) {
                        node.segments = segs;
                        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
                        self.progress
                            .bytes_done
                            .fetch_add(node.size, Ordering::Relaxed);
                        self.reused += 1;
                        return self.feed.push(node, None);
                    }
                }
                let prev = prev.and_then(|p| p.file());
                return self
                    .feed
                    .push(node, Some((Source::Path(abs.to_path_buf()), prev)));
            }
            _ => {}
        }
        self.feed.push(node, None)
    }

    /// Walks one root: its ancestors (so restore recreates them with their
    /// metadata), the root, and everything below it. Roots come in path
    /// order; [`Self::finish`] ends the walk.
    pub fn walk_root(&mut self, root: &Path) -> Result<()> {
        let mut anc: Vec<&Path> = root
            .ancestors()
            .skip(1)
            .filter(|a| a.parent().is_some())
            .collect();
        anc.reverse();
        for a in anc {
            if let Ok(m) = fs::symlink_metadata(a) {
                self.add(a, &m, true)?;
            }
        }
        let m = match fs::symlink_metadata(root) {
            Ok(m) => m,
            Err(e) => {
                self.warnings.push(format!("{}: {e}", root.display()));
                return Ok(());
            }
        };
        self.add(root, &m, true)?;
        if !m.is_dir() {
            return Ok(());
        }
        let excludes = self.excludes;
        let entries = walkdir::WalkDir::new(root)
            .min_depth(1)
            .follow_links(false)
            .same_file_system(self.one_file_system)
            // Each directory's entries by name: depth first, that is the
            // recipe's path order.
            .sort_by(|a, b| a.file_name().cmp(b.file_name()))
            .into_iter()
            .filter_entry(|e| !excludes.excluded(e.path(), e.metadata().ok().as_ref()));
        for entry in entries {
            match entry {
                Ok(e) => match e.metadata() {
                    Ok(m) => self.add(e.path(), &m, false)?,
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
        Ok(())
    }

    /// Hands on what is left (synthetic entries after every walked path)
    /// and reads the rest of the previous version for its counts.
    pub fn finish(&mut self) -> Result<()> {
        self.flush_synthetic(None)?;
        self.parent.finish();
        if let Some(w) = self.parent.damaged.take() {
            self.warnings.push(w);
        }
        Ok(())
    }
}

/// The I/O error inside a walkdir error, or the error itself.
fn io_cause(e: &walkdir::Error) -> String {
    match e.io_error() {
        Some(io) => io.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
