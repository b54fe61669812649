//! Comparing and searching versions' trees: the library side of `strata
//! diff SNAP1 SNAP2` and `strata find PATTERN`. Both work on recipes only
//! (a version's whole tree without chunks, [`whole_skeleton`], and for
//! diff each file's [`ContentHash`], both read a recipe part at a time)
//! and never read file data.
//!
//! # Diff
//!
//! [`diff`] walks the two trees side by side in recipe order
//! ([`path_cmp`]), so it takes one pass over each. Every path is reported
//! at most once:
//!
//! * [`Change::Added`] / [`Change::Removed`]: the path is in one tree only.
//!   A removed (or added) directory lists each path below it as well.
//! * [`Change::Modified`]: the content or the kind changed. A path whose
//!   kind changed (a file that became a directory, a file that became a
//!   hard link…) is one `Modified` entry with `what` holding `"kind"` and
//!   [`DiffEntry::old_kind`] the old kind, rather than a `Removed` and an
//!   `Added` entry for the same path: the listing stays one line per path,
//!   in path order, and what was below a former directory (or is below a
//!   new one) is listed as removed (added) anyway.
//! * [`Change::Metadata`]: the content is the same, but the permission
//!   bits (`"mode"`), owner or group (`"owner"`), modification time
//!   (`"mtime"`), extended attributes (`"xattrs"`, compared as a set) or
//!   the symlink or hard-link target (`"target"`) changed.
//!
//! `ctime`, inode, device and link count are not compared: they change
//! whenever a tree is restored or copied, without anything in it changing.
//!
//! Content is compared by fingerprint. A regular file's content is its
//! size and its chunks' (fingerprint, length) list; the chunks' locations
//! are not compared, so a file a later version took over from its parent
//! unread, whose chunks gc has moved since, or that reverse dedup turned
//! into indirect references, is unchanged — and so is one whose chunks are
//! the same but grouped into other segments. (Segment fingerprints alone
//! would not do: every all-zero chunk has [`Fingerprint::ZERO`], whatever
//! its length.) Two versions cut with different chunker parameters show
//! every non-empty file as modified. A hard link's content is that of the
//! file it names (`target`, the first path of the file in its tree; the
//! node itself carries no data and size 0), so a link whose file changed
//! is modified too. A device's content is its device number; directories,
//! FIFOs, sockets and symlinks have none (a symlink's target is metadata).
//!
//! # Find
//!
//! [`Matcher`] takes restic's `find` patterns (glob syntax of the
//! `globset` crate: `*`, `?`, `[…]`, `{a,b}`; `*` and `?` never match `/`,
//! `**` matches any number of path components):
//!
//! * a pattern without `/` is matched against the entry's name (its last
//!   path component): `*.txt`, `Makefile`;
//! * a pattern with a leading `/` is matched against the whole path from
//!   the snapshot root: `/home/*/notes.txt`;
//! * any other pattern with a `/` is matched against the path's trailing
//!   components, at any depth: `docs/*.md` finds `/docs/a.md` and
//!   `/src/docs/b.md` (as if written `/**/docs/*.md`).
//!
//! A trailing `/` is ignored (it does not restrict the match to
//! directories). Matching is case-sensitive unless `ignore_case` is set,
//! which folds pattern and path to lower case (Unicode case folding; bytes
//! that are not UTF-8 are kept, ASCII letters among them folded). Paths
//! are matched as raw bytes, so a name that is not UTF-8 is matched by
//! `*`, `*.txt` and the like. Several patterns match what any of them does.

use crate::error::{Result, StoreError};
use crate::repo::tiers::whole_skeleton;
use crate::repo::Repository;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Serialize, Serializer};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use strata_core::format::{path_cmp, ChunkRef, Node, NodeKind, Recipe, Snapshot};
use strata_core::Fingerprint;

/// How a path differs between two trees (serialised in lower case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Only in the new tree.
    Added,
    /// Only in the old tree.
    Removed,
    /// Content or kind changed (metadata may have changed too).
    Modified,
    /// Same content and kind; only metadata changed.
    Metadata,
}

/// One changed path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiffEntry {
    /// Relative path, `/`-separated raw bytes (serialised as a string,
    /// bytes that are not UTF-8 replaced by U+FFFD).
    #[serde(serialize_with = "lossy")]
    pub path: Vec<u8>,
    pub change: Change,
    /// Kind of the new node, or of the old one when it was removed
    /// (serialised as [`NodeKind::id`], as `ls --json` has it).
    #[serde(serialize_with = "kind_id")]
    pub kind: NodeKind,
    /// The old node's kind when it is not `kind` (a kind change).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "old_kind_id"
    )]
    pub old_kind: Option<NodeKind>,
    /// Size of the old and the new node, for regular files and hard links
    /// (a hard link's is its file's); `None` for other kinds and for the
    /// side that has no node.
    pub old_size: Option<u64>,
    pub new_size: Option<u64>,
    /// What changed, in this order: `"kind"` or `"content"` (for
    /// [`Change::Modified`]), then any of `"mode"`, `"owner"`, `"mtime"`,
    /// `"xattrs"`, `"target"`. Empty for added and removed paths.
    pub what: Vec<&'static str>,
}

/// Counts of a diff.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiffSummary {
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    pub metadata: u64,
    /// Sizes of the regular files added and removed (hard links are not
    /// counted: they share their file's data).
    pub added_bytes: u64,
    pub removed_bytes: u64,
}

/// Serialises raw path bytes as a (lossy) string.
fn lossy<S: Serializer>(p: &[u8], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(p))
}

/// Serialises a kind by its script name ([`NodeKind::id`]).
fn kind_id<S: Serializer>(k: &NodeKind, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(k.id())
}

/// [`kind_id`] of an optional kind.
fn old_kind_id<S: Serializer>(k: &Option<NodeKind>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match k {
        Some(k) => s.serialize_some(k.id()),
        None => s.serialize_none(),
    }
}

/// A recipe's nodes in path order, one per path. Recipes are written in
/// that order; whole recipes of structure version 1 may not be, and a
/// damaged one may repeat a path (the first node of a path is kept).
struct Tree<'a> {
    nodes: Vec<&'a Node>,
    /// Files' content hashes by path, when the nodes come without chunks
    /// (a version's skeleton, hashed as its parts were read).
    hashes: Option<&'a ContentHashes>,
}

/// Regular files' content hashes by path ([`ContentHash`]).
pub type ContentHashes = HashMap<Vec<u8>, [u8; 32]>;

impl<'a> Tree<'a> {
    fn new(r: &'a Recipe, hashes: Option<&'a ContentHashes>) -> Self {
        let mut nodes: Vec<&Node> = r.nodes.iter().collect();
        if !nodes
            .windows(2)
            .all(|w| path_cmp(&w[0].path, &w[1].path).is_lt())
        {
            nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
            nodes.dedup_by(|later, first| later.path == first.path);
        }
        Tree { nodes, hashes }
    }

    /// The content hash of regular file `f`: from the hashes given, else
    /// from its chunks.
    fn hash_of(&self, f: &Node) -> Option<[u8; 32]> {
        match self.hashes {
            Some(h) => h.get(&f.path).copied(),
            None => {
                let mut h = ContentHash::default();
                f.segments
                    .iter()
                    .flat_map(|s| &s.chunks)
                    .for_each(|c| h.push(c));
                Some(h.finish())
            }
        }
    }

    /// The node at `path`.
    fn get(&self, path: &[u8]) -> Option<&'a Node> {
        let i = self
            .nodes
            .binary_search_by(|n| path_cmp(&n.path, path))
            .ok()?;
        self.nodes.get(i).copied()
    }

    /// The regular file holding `n`'s content: `n` itself, or the file a
    /// hard link names (`None` when it is not in the tree as a file).
    fn file_of(&self, n: &'a Node) -> Option<&'a Node> {
        match n.kind {
            NodeKind::File => Some(n),
            NodeKind::Hardlink => n
                .target
                .as_deref()
                .and_then(|t| self.get(t))
                .filter(|f| f.kind == NodeKind::File),
            _ => None,
        }
    }

    /// The size reported for `n` (see [`DiffEntry::old_size`]).
    fn size_of(&self, n: &'a Node) -> Option<u64> {
        match n.kind {
            NodeKind::File | NodeKind::Hardlink => Some(self.file_of(n).map_or(n.size, |f| f.size)),
            _ => None,
        }
    }
}

/// Whether two regular files hold the same bytes: same size and the same
/// chunks, wherever those are stored and however they are grouped into
/// segments or pieces (compared by [`ContentHash`]).
fn same_file_content(ta: &Tree, a: &Node, tb: &Tree, b: &Node) -> bool {
    a.size == b.size && ta.hash_of(a).is_some_and(|h| Some(h) == tb.hash_of(b))
}

/// A file's content as diff compares it: a hash of its chunks'
/// (fingerprint, length) list in order, zeros as one run however they
/// were cut (into chunks, runs, segments or pieces). Chunks are pushed as
/// the recipe holds them, so a file is hashed without its chunk list in
/// memory.
#[derive(Default)]
pub struct ContentHash {
    hasher: blake3::Hasher,
    /// Zero bytes not yet hashed (a run may go on).
    zeros: u64,
}

impl ContentHash {
    pub fn push(&mut self, c: &ChunkRef) {
        if c.is_zero() {
            self.zeros += c.len as u64;
            return;
        }
        self.flush_zeros();
        self.hasher.update(&c.fp.0);
        self.hasher.update(&(c.len as u64).to_le_bytes());
    }

    fn flush_zeros(&mut self) {
        if self.zeros > 0 {
            self.hasher.update(&Fingerprint::ZERO.0);
            self.hasher.update(&self.zeros.to_le_bytes());
            self.zeros = 0;
        }
    }

    pub fn finish(mut self) -> [u8; 32] {
        self.flush_zeros();
        *self.hasher.finalize().as_bytes()
    }
}

/// Recipe `id` without chunks ([`crate::repo::recipe::load_skeleton`]) and its
/// regular files' content hashes, in one pass over its parts.
fn hashed_skeleton(repo: &Repository, id: &str) -> Result<(Recipe, ContentHashes)> {
    let mut hashes = ContentHashes::new();
    let mut nodes: Vec<Node> = Vec::new();
    // The hash of the last file, open while its pieces come.
    let mut open: Option<ContentHash> = None;
    let containers = crate::repo::recipe::for_each_piece(repo, id, |mut n, _| {
        let chunks = std::mem::take(&mut n.segments);
        let is_file = n.kind == NodeKind::File;
        if !crate::repo::recipe::append_joined(&mut nodes, n)? {
            // A new node: the file before it is whole.
            let before = nodes.len().checked_sub(2).and_then(|i| nodes.get(i));
            if let (Some(h), Some(f)) = (open.take(), before) {
                hashes.insert(f.path.clone(), h.finish());
            }
        }
        if is_file {
            let h = open.get_or_insert_with(ContentHash::default);
            chunks
                .iter()
                .flat_map(|s| &s.chunks)
                .for_each(|c| h.push(c));
        }
        Ok(())
    })?;
    if let (Some(h), Some(f)) = (open, nodes.last()) {
        hashes.insert(f.path.clone(), h.finish());
    }
    Ok((Recipe { containers, nodes }, hashes))
}

/// Whether two nodes of the same kind hold the same content (see the
/// module documentation).
fn same_content(ta: &Tree, x: &Node, tb: &Tree, y: &Node) -> bool {
    match x.kind {
        NodeKind::File | NodeKind::Hardlink => match (ta.file_of(x), tb.file_of(y)) {
            (Some(f), Some(g)) => same_file_content(ta, f, tb, g),
            // A link whose file is missing (damage): the same target is
            // all that can be said.
            (None, None) => x.target == y.target,
            _ => false,
        },
        NodeKind::CharDevice | NodeKind::BlockDevice => x.rdev == y.rdev,
        NodeKind::Dir | NodeKind::Symlink | NodeKind::Fifo | NodeKind::Socket => true,
    }
}

/// Whether two lists of extended attributes hold the same pairs, in any
/// order.
fn same_xattrs(a: &[(Vec<u8>, Vec<u8>)], b: &[(Vec<u8>, Vec<u8>)]) -> bool {
    if a == b {
        return true;
    }
    if a.len() != b.len() {
        return false;
    }
    let (mut a, mut b): (Vec<_>, Vec<_>) = (a.iter().collect(), b.iter().collect());
    a.sort();
    b.sort();
    a == b
}

/// Permission bits of a mode (the file type is the node's kind).
const PERMISSION_BITS: u32 = 0o7777;

/// The entry for a path both trees hold, or `None` when it is unchanged.
fn compare(ta: &Tree, x: &Node, tb: &Tree, y: &Node) -> Option<DiffEntry> {
    let mut what = Vec::new();
    if x.kind != y.kind {
        what.push("kind");
    } else if !same_content(ta, x, tb, y) {
        what.push("content");
    }
    if x.mode & PERMISSION_BITS != y.mode & PERMISSION_BITS {
        what.push("mode");
    }
    if (x.uid, x.gid) != (y.uid, y.gid) {
        what.push("owner");
    }
    if x.mtime_ns != y.mtime_ns {
        what.push("mtime");
    }
    if !same_xattrs(&x.xattrs, &y.xattrs) {
        what.push("xattrs");
    }
    if x.kind == y.kind && x.target != y.target {
        what.push("target");
    }
    let change = match what.first()? {
        &"kind" | &"content" => Change::Modified,
        _ => Change::Metadata,
    };
    Some(DiffEntry {
        path: y.path.clone(),
        change,
        kind: y.kind,
        old_kind: (x.kind != y.kind).then_some(x.kind),
        old_size: ta.size_of(x),
        new_size: tb.size_of(y),
        what,
    })
}

/// The entries and counts as a diff collects them.
#[derive(Default)]
struct Collect {
    entries: Vec<DiffEntry>,
    summary: DiffSummary,
}

impl Collect {
    fn push(&mut self, e: DiffEntry) {
        let s = &mut self.summary;
        let file = e.kind == NodeKind::File;
        match e.change {
            Change::Added => {
                s.added += 1;
                if file {
                    s.added_bytes += e.new_size.unwrap_or(0);
                }
            }
            Change::Removed => {
                s.removed += 1;
                if file {
                    s.removed_bytes += e.old_size.unwrap_or(0);
                }
            }
            Change::Modified => s.modified += 1,
            Change::Metadata => s.metadata += 1,
        }
        self.entries.push(e);
    }

    /// A path only one tree (`t`) holds.
    fn one_side(&mut self, t: &Tree, n: &Node, change: Change) {
        let size = t.size_of(n);
        let (old_size, new_size) = match change {
            Change::Removed => (size, None),
            _ => (None, size),
        };
        self.push(DiffEntry {
            path: n.path.clone(),
            change,
            kind: n.kind,
            old_kind: None,
            old_size,
            new_size,
            what: Vec::new(),
        });
    }
}

/// What changed from tree `a` (old) to tree `b` (new), in path order, and
/// the counts. One pass over both trees (plus a sort of a tree that is not
/// in path order, and a lookup per hard link); no data is read. See the
/// module documentation for what each [`Change`] means.
pub fn diff(a: &Recipe, b: &Recipe) -> (Vec<DiffEntry>, DiffSummary) {
    diff_trees(Tree::new(a, None), Tree::new(b, None))
}

/// [`diff`] of two trees held without chunks (skeletons), their files'
/// content given as their [`ContentHash`]es by path.
pub fn diff_hashed(
    a: &Recipe,
    a_hashes: &ContentHashes,
    b: &Recipe,
    b_hashes: &ContentHashes,
) -> (Vec<DiffEntry>, DiffSummary) {
    diff_trees(Tree::new(a, Some(a_hashes)), Tree::new(b, Some(b_hashes)))
}

fn diff_trees(ta: Tree, tb: Tree) -> (Vec<DiffEntry>, DiffSummary) {
    let mut out = Collect::default();
    let mut ai = ta.nodes.iter().copied().peekable();
    let mut bi = tb.nodes.iter().copied().peekable();
    loop {
        let ord = match (ai.peek(), bi.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(x), Some(y)) => path_cmp(&x.path, &y.path),
        };
        match ord {
            Ordering::Less => {
                if let Some(x) = ai.next() {
                    out.one_side(&ta, x, Change::Removed);
                }
            }
            Ordering::Greater => {
                if let Some(y) = bi.next() {
                    out.one_side(&tb, y, Change::Added);
                }
            }
            Ordering::Equal => {
                if let (Some(x), Some(y)) = (ai.next(), bi.next()) {
                    if let Some(e) = compare(&ta, x, &tb, y) {
                        out.push(e);
                    }
                }
            }
        }
    }
    (out.entries, out.summary)
}

/// [`diff`] of two versions' whole trees (active and cloud parts joined).
/// Reads their recipes only; takes no lock, like listing a version.
pub fn diff_snapshots(
    repo: &Repository,
    old: &Snapshot,
    new: &Snapshot,
) -> Result<(Vec<DiffEntry>, DiffSummary)> {
    let (a, ah) = hashed_tree(repo, old)?;
    let (b, bh) = hashed_tree(repo, new)?;
    Ok(diff_hashed(&a, &ah, &b, &bh))
}

/// A version's whole tree without chunks (active and cloud parts joined,
/// as [`whole_skeleton`]) and its files' content hashes (the active
/// part's where both hold a path, as the joined tree keeps its node):
/// its recipes read a part at a time.
fn hashed_tree(repo: &Repository, s: &Snapshot) -> Result<(Recipe, ContentHashes)> {
    let (tree, mut hashes) = hashed_skeleton(repo, &s.recipe)?;
    match crate::repo::tiers::part_snapshot(s) {
        Some(p) => {
            let (cloud, cloud_hashes) = hashed_skeleton(repo, &p.recipe)?;
            for (path, h) in cloud_hashes {
                hashes.entry(path).or_insert(h);
            }
            Ok((crate::repo::tiers::merge(tree, cloud)?, hashes))
        }
        None => Ok((tree, hashes)),
    }
}

/// The paths `find` reports: a set of patterns (see the module
/// documentation for their meaning).
#[derive(Clone, Debug)]
pub struct Matcher {
    /// Patterns without `/`, matched against the last component.
    names: GlobSet,
    /// Patterns with `/`, matched against `/` + the relative path.
    paths: GlobSet,
    ignore_case: bool,
}

impl Matcher {
    /// Compiles `patterns`; an empty list, an empty pattern (or `/`) and a
    /// malformed glob are errors.
    pub fn new<S: AsRef<str>>(patterns: &[S], ignore_case: bool) -> Result<Matcher> {
        if patterns.is_empty() {
            return Err(StoreError::Invalid(
                "find needs at least one pattern".into(),
            ));
        }
        let (mut names, mut paths) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for given in patterns {
            let given = given.as_ref();
            let folded = if ignore_case {
                Cow::Owned(given.to_lowercase())
            } else {
                Cow::Borrowed(given)
            };
            let p = folded.trim_end_matches('/');
            if p.is_empty() {
                return Err(StoreError::Invalid(format!(
                    "find pattern {given:?} is empty: give a name or a path"
                )));
            }
            let (set, glob) = if !p.contains('/') {
                (&mut names, Cow::Borrowed(p))
            } else if p.starts_with('/') {
                (&mut paths, Cow::Borrowed(p))
            } else if p.starts_with("**/") {
                (&mut paths, Cow::Owned(format!("/{p}")))
            } else {
                (&mut paths, Cow::Owned(format!("/**/{p}")))
            };
            let g = GlobBuilder::new(&glob)
                .literal_separator(true)
                .case_insensitive(ignore_case)
                .build()
                .map_err(|e| StoreError::Invalid(format!("find pattern {given:?}: {e}")))?;
            set.add(g);
        }
        let built = |b: GlobSetBuilder| {
            b.build()
                .map_err(|e| StoreError::Invalid(format!("find patterns: {e}")))
        };
        Ok(Matcher {
            names: built(names)?,
            paths: built(paths)?,
            ignore_case,
        })
    }

    /// Whether a node's path (relative, `/`-separated raw bytes, as in a
    /// recipe) is matched.
    pub fn is_match(&self, path: &[u8]) -> bool {
        let path = if self.ignore_case {
            Cow::Owned(fold_case(path))
        } else {
            Cow::Borrowed(path)
        };
        let name = path.rsplit(|&c| c == b'/').next().unwrap_or(&path);
        if !self.names.is_empty() && self.names.is_match(as_path(name)) {
            return true;
        }
        if self.paths.is_empty() {
            return false;
        }
        let mut full = Vec::with_capacity(path.len() + 1);
        full.push(b'/');
        full.extend_from_slice(&path);
        self.paths.is_match(as_path(&full))
    }
}

/// Raw bytes as a path, for `globset` (which matches them as bytes).
fn as_path(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

/// Lower-cases the UTF-8 runs of `b` and keeps its other bytes.
fn fold_case(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        out.extend_from_slice(chunk.valid().to_lowercase().as_bytes());
        out.extend(chunk.invalid().iter().map(u8::to_ascii_lowercase));
    }
    out
}

/// A node `find` matched, with the version it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FindHit {
    pub snapshot_id: String,
    pub series: String,
    pub version: u32,
    /// When the version was taken (ns since the epoch).
    pub time_ns: i64,
    /// Relative path, `/`-separated raw bytes (serialised as a string,
    /// bytes that are not UTF-8 replaced by U+FFFD).
    #[serde(serialize_with = "lossy")]
    pub path: Vec<u8>,
    /// Serialised as [`NodeKind::id`].
    #[serde(serialize_with = "kind_id")]
    pub kind: NodeKind,
    /// The node's size; a hard link's is its file's.
    pub size: u64,
    pub mtime_ns: i64,
}

/// The nodes of `recipe` (the whole tree of version `id`, `snap`) that
/// `m` matches, in path order.
pub fn find_in(id: &str, snap: &Snapshot, recipe: &Recipe, m: &Matcher) -> Vec<FindHit> {
    let tree = Tree::new(recipe, None);
    tree.nodes
        .iter()
        .filter(|n| m.is_match(&n.path))
        .map(|n| FindHit {
            snapshot_id: id.to_string(),
            series: snap.series.clone(),
            version: snap.version,
            time_ns: snap.time_ns,
            path: n.path.clone(),
            kind: n.kind,
            size: tree.size_of(n).unwrap_or(n.size),
            mtime_ns: n.mtime_ns,
        })
        .collect()
}

/// [`find_in`] over the whole trees of `snaps` (id, snapshot), in the
/// order given; stops at the first version whose recipe cannot be read
/// (call [`find_in`] per version to go on past one). Reads recipes only;
/// takes no lock, like listing a version.
pub fn find(repo: &Repository, snaps: &[(String, Snapshot)], m: &Matcher) -> Result<Vec<FindHit>> {
    let mut hits = Vec::new();
    for (id, s) in snaps {
        let recipe = whole_skeleton(repo, s)?;
        hits.extend(find_in(id, s, &recipe, m));
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::chunker::ChunkerParams;
    use strata_core::format::{ChunkRef, SegmentRef, SnapshotStats, Tier, ZERO_CHUNK};
    use strata_core::{Fingerprint, Hasher};

    /// A node with everyday metadata and no content.
    fn node(path: &[u8], kind: NodeKind) -> Node {
        Node {
            mode: if kind == NodeKind::Dir {
                0o40755
            } else {
                0o100644
            },
            uid: 1000,
            gid: 1000,
            mtime_ns: 1_000,
            ctime_ns: 1_000,
            ino: 7,
            dev: 1,
            ..Node::new(path.to_vec(), kind)
        }
    }

    fn dir(path: &[u8]) -> Node {
        node(path, NodeKind::Dir)
    }

    /// A chunk reference to `data` in container `container`.
    fn chunk(data: &[u8], container: u32) -> ChunkRef {
        ChunkRef {
            fp: Hasher::plain().hash(data),
            len: data.len() as u32,
            container,
            region: 0,
            offset: 0,
        }
    }

    /// A regular file whose content is the chunks `parts`, one segment.
    fn file(path: &[u8], parts: &[&[u8]]) -> Node {
        let chunks: Vec<ChunkRef> = parts.iter().map(|p| chunk(p, 0)).collect();
        let mut n = node(path, NodeKind::File);
        n.size = chunks.iter().map(|c| c.len as u64).sum();
        n.segments = vec![SegmentRef {
            fp: Hasher::plain().hash_fingerprints(chunks.iter().map(|c| &c.fp)),
            chunks,
        }];
        n
    }

    fn link(path: &[u8], kind: NodeKind, target: &[u8]) -> Node {
        let mut n = node(path, kind);
        n.target = Some(target.to_vec());
        n.size = if kind == NodeKind::Symlink {
            target.len() as u64
        } else {
            0
        };
        n
    }

    fn recipe(mut nodes: Vec<Node>) -> Recipe {
        nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
        Recipe {
            containers: vec![],
            nodes,
        }
    }

    /// (path, change, what) of each entry, for compact assertions.
    fn brief(e: &[DiffEntry]) -> Vec<(String, Change, Vec<&'static str>)> {
        e.iter()
            .map(|e| {
                (
                    String::from_utf8_lossy(&e.path).into_owned(),
                    e.change,
                    e.what.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn added_removed_and_unchanged_paths_with_counts() {
        let a = recipe(vec![
            dir(b"d"),
            file(b"d/keep", &[b"same"]),
            file(b"d/old", &[b"0123456789"]),
            link(b"d/ln", NodeKind::Symlink, b"keep"),
        ]);
        let b = recipe(vec![
            dir(b"d"),
            file(b"d/keep", &[b"same"]),
            file(b"d/new", &[b"abc", b"defg"]),
            dir(b"e"),
            link(b"d/ln", NodeKind::Symlink, b"keep"),
        ]);
        let (e, s) = diff(&a, &b);
        assert_eq!(
            brief(&e),
            [
                ("d/new".into(), Change::Added, vec![]),
                ("d/old".into(), Change::Removed, vec![]),
                ("e".into(), Change::Added, vec![]),
            ]
        );
        assert_eq!((e[0].old_size, e[0].new_size), (None, Some(7)));
        assert_eq!((e[1].old_size, e[1].new_size), (Some(10), None));
        assert_eq!((e[2].kind, e[2].new_size), (NodeKind::Dir, None));
        assert_eq!(
            s,
            DiffSummary {
                added: 2,
                removed: 1,
                modified: 0,
                metadata: 0,
                added_bytes: 7,
                removed_bytes: 10,
            }
        );
        // Identical trees, and empty ones, have no differences.
        assert_eq!(diff(&a, &a), (vec![], DiffSummary::default()));
        assert_eq!(diff(&Recipe::default(), &Recipe::default()).0, vec![]);
        // Everything added / removed against an empty tree.
        let (_, s) = diff(&Recipe::default(), &b);
        assert_eq!((s.added, s.added_bytes), (5, 11));
        let (_, s) = diff(&b, &Recipe::default());
        assert_eq!((s.removed, s.removed_bytes), (5, 11));
    }

    #[test]
    fn content_changes_are_modified() {
        let a = recipe(vec![
            file(b"same-size", &[b"aaaa"]),
            file(b"grown", &[b"aaaa"]),
            file(b"edited", &[b"aaaa", b"bbbb"]),
        ]);
        let mut touched = file(b"same-size", &[b"zzzz"]);
        // Touched too: both reported.
        touched.mtime_ns = 5;
        let b = recipe(vec![
            touched,
            file(b"grown", &[b"aaaa", b"b"]),
            file(b"edited", &[b"aaaa", b"cccc"]),
        ]);
        let (e, s) = diff(&a, &b);
        assert_eq!(
            brief(&e),
            [
                ("edited".into(), Change::Modified, vec!["content"]),
                ("grown".into(), Change::Modified, vec!["content"]),
                (
                    "same-size".into(),
                    Change::Modified,
                    vec!["content", "mtime"]
                ),
            ]
        );
        assert_eq!((e[1].old_size, e[1].new_size), (Some(4), Some(5)));
        assert_eq!(
            (s.modified, s.metadata, s.added_bytes, s.removed_bytes),
            (3, 0, 0, 0)
        );
    }

    #[test]
    fn metadata_only_changes() {
        let base = || {
            let mut x = file(b"f", &[b"data"]);
            x.xattrs = vec![
                (b"user.a".to_vec(), b"1".to_vec()),
                (b"user.b".to_vec(), b"2".to_vec()),
            ];
            x
        };
        let case = |edit: &dyn Fn(&mut Node)| {
            let mut y = base();
            edit(&mut y);
            let (e, s) = diff(&recipe(vec![base()]), &recipe(vec![y]));
            assert_eq!(s.metadata, e.len() as u64);
            e.into_iter()
                .map(|e| {
                    assert_eq!(e.change, Change::Metadata);
                    e.what
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(case(&|n| n.mode = 0o100600), [vec!["mode"]]);
        assert_eq!(case(&|n| n.mtime_ns += 1), [vec!["mtime"]]);
        assert_eq!(case(&|n| n.uid = 0), [vec!["owner"]]);
        assert_eq!(case(&|n| n.gid = 0), [vec!["owner"]]);
        assert_eq!(case(&|n| n.xattrs[1].1 = b"3".to_vec()), [vec!["xattrs"]]);
        assert_eq!(case(&|n| n.xattrs.truncate(1)), [vec!["xattrs"]]);
        assert_eq!(
            case(&|n| {
                n.mode = 0o104755;
                n.uid = 1;
                n.mtime_ns = 0;
                n.xattrs.clear();
            }),
            [vec!["mode", "owner", "mtime", "xattrs"]]
        );
        // Not differences: the same xattrs in another order, ctime, inode,
        // device, link count.
        let none: Vec<Vec<&str>> = vec![];
        assert_eq!(case(&|n| n.xattrs.reverse()), none);
        assert_eq!(
            case(&|n| {
                n.ctime_ns = 9;
                n.ino = 9;
                n.dev = 9;
                n.nlink = 2;
            }),
            none
        );
    }

    #[test]
    fn moved_indirect_and_regrouped_chunks_are_the_same_content() {
        let a = recipe(vec![file(b"f", &[b"one", b"two", b"three"])]);
        // A later version took the file over unread: the same chunks at
        // other locations, or indirect after reverse dedup, or split into
        // other segments.
        let mut moved = a.clone();
        for c in &mut moved.nodes[0].segments[0].chunks {
            (c.container, c.region, c.offset) = (3, 4, 5);
        }
        let mut indirect = a.clone();
        for c in &mut indirect.nodes[0].segments[0].chunks {
            *c = ChunkRef::indirect(c.fp, c.len);
        }
        let mut regrouped = a.clone();
        let seg = regrouped.nodes[0].segments.remove(0);
        for c in seg.chunks {
            regrouped.nodes[0].segments.push(SegmentRef {
                fp: c.fp,
                chunks: vec![c],
            });
        }
        for b in [&moved, &indirect, &regrouped] {
            assert_eq!(diff(&a, b), (vec![], DiffSummary::default()));
        }
    }

    #[test]
    fn zero_runs_of_other_lengths_are_other_content() {
        let zero = |len| ChunkRef {
            fp: Fingerprint::ZERO,
            len,
            container: ZERO_CHUNK,
            region: 0,
            offset: 0,
        };
        let with = |first, last| {
            let chunks = vec![zero(first), chunk(b"x", 0), zero(last)];
            let mut n = node(b"sparse", NodeKind::File);
            n.size = 11;
            n.segments = vec![SegmentRef {
                fp: Hasher::plain().hash_fingerprints(chunks.iter().map(|c| &c.fp)),
                chunks,
            }];
            recipe(vec![n])
        };
        // Same size and segment fingerprints; other bytes.
        let (e, _) = diff(&with(4, 6), &with(6, 4));
        assert_eq!(
            brief(&e),
            [("sparse".into(), Change::Modified, vec!["content"])]
        );
        assert!(diff(&with(4, 6), &with(4, 6)).0.is_empty());
        // The same zeros cut otherwise (chunks, a run, other segments):
        // the same content.
        let cut = |parts: &[&[u32]]| {
            let mut n = node(b"sparse", NodeKind::File);
            n.size = 12;
            n.segments = parts
                .iter()
                .map(|p| SegmentRef {
                    fp: Fingerprint::ZERO,
                    chunks: p.iter().map(|&l| zero(l)).collect(),
                })
                .collect();
            recipe(vec![n])
        };
        let one = cut(&[&[4, 4, 4]]);
        assert!(diff(&one, &cut(&[&[8], &[4]])).0.is_empty());
        assert!(diff(&one, &cut(&[&[4], &[4, 4]])).0.is_empty());
        assert_eq!(diff(&one, &cut(&[&[4], &[4]])).0.len(), 1);
    }

    #[test]
    fn a_file_that_became_a_directory_is_one_modified_entry() {
        let a = recipe(vec![file(b"x", &[b"data"]), file(b"y", &[b"1"])]);
        let b = recipe(vec![
            dir(b"x"),
            file(b"x/inner", &[b"in"]),
            file(b"y", &[b"1"]),
        ]);
        let (e, s) = diff(&a, &b);
        // Its permission bits changed too (0644 to 0755).
        assert_eq!(
            brief(&e),
            [
                ("x".into(), Change::Modified, vec!["kind", "mode"]),
                ("x/inner".into(), Change::Added, vec![]),
            ]
        );
        assert_eq!(e[0].kind, NodeKind::Dir);
        assert_eq!(e[0].old_kind, Some(NodeKind::File));
        let json = serde_json::to_value(&e[0]).unwrap();
        assert_eq!(
            (&json["kind"], &json["old_kind"]),
            (&"dir".into(), &"file".into())
        );
        assert_eq!((e[0].old_size, e[0].new_size), (Some(4), None));
        assert_eq!((s.added, s.modified, s.added_bytes), (1, 1, 2));
        // And back: the directory's contents are removed.
        let (e, s) = diff(&b, &a);
        assert_eq!(
            brief(&e),
            [
                ("x".into(), Change::Modified, vec!["kind", "mode"]),
                ("x/inner".into(), Change::Removed, vec![]),
            ]
        );
        assert_eq!(
            (e[0].kind, e[0].old_kind),
            (NodeKind::File, Some(NodeKind::Dir))
        );
        assert_eq!((s.removed, s.removed_bytes), (1, 2));
    }

    #[test]
    fn symlink_target_change_is_metadata() {
        let a = recipe(vec![link(b"l", NodeKind::Symlink, b"one")]);
        let b = recipe(vec![link(b"l", NodeKind::Symlink, b"two")]);
        let (e, s) = diff(&a, &b);
        assert_eq!(brief(&e), [("l".into(), Change::Metadata, vec!["target"])]);
        assert_eq!((e[0].old_size, e[0].new_size), (None, None));
        assert_eq!(s.metadata, 1);
        // A symlink replaced by a file is a kind change, not a target one.
        let c = recipe(vec![file(b"l", &[b"two"])]);
        assert_eq!(
            brief(&diff(&a, &c).0),
            [("l".into(), Change::Modified, vec!["kind"])]
        );
    }

    #[test]
    fn devices_compare_their_numbers() {
        let dev = |rdev| {
            let mut n = node(b"dev/sda", NodeKind::BlockDevice);
            n.rdev = rdev;
            recipe(vec![n])
        };
        assert!(diff(&dev(8), &dev(8)).0.is_empty());
        assert_eq!(
            brief(&diff(&dev(8), &dev(9)).0),
            [("dev/sda".into(), Change::Modified, vec!["content"])]
        );
    }

    #[test]
    fn hard_links_compare_by_their_file() {
        let a = recipe(vec![
            file(b"f", &[b"data"]),
            file(b"g", &[b"data"]),
            link(b"l1", NodeKind::Hardlink, b"f"),
            link(b"l2", NodeKind::Hardlink, b"f"),
            file(b"l3", &[b"data"]),
        ]);
        let b = recipe(vec![
            file(b"f", &[b"DATA"]),
            file(b"g", &[b"data"]),
            // Its file changed.
            link(b"l1", NodeKind::Hardlink, b"f"),
            // Another file with the old content.
            link(b"l2", NodeKind::Hardlink, b"g"),
            // A file that became a link to the same content.
            link(b"l3", NodeKind::Hardlink, b"g"),
        ]);
        let (e, s) = diff(&a, &b);
        assert_eq!(
            brief(&e),
            [
                ("f".into(), Change::Modified, vec!["content"]),
                ("l1".into(), Change::Modified, vec!["content"]),
                ("l2".into(), Change::Metadata, vec!["target"]),
                ("l3".into(), Change::Modified, vec!["kind"]),
            ]
        );
        // A link's size is its file's.
        assert_eq!((e[1].old_size, e[1].new_size), (Some(4), Some(4)));
        assert_eq!((s.modified, s.metadata), (3, 1));
        // Added and removed links do not count their file's bytes twice.
        let (e, s) = diff(&recipe(vec![file(b"f", &[b"data"])]), &a);
        assert_eq!(e.len(), 4);
        assert_eq!((s.added, s.added_bytes), (4, 8));
        assert_eq!(e[1].new_size, Some(4));
        // A link whose file is missing (damage) compares by target alone.
        let dangling = |t: &[u8]| recipe(vec![link(b"l", NodeKind::Hardlink, t)]);
        assert!(diff(&dangling(b"x"), &dangling(b"x")).0.is_empty());
        assert_eq!(
            brief(&diff(&dangling(b"x"), &dangling(b"y")).0),
            [("l".into(), Change::Modified, vec!["content", "target"])]
        );
    }

    #[test]
    fn removing_a_directory_lists_everything_below_it() {
        let a = recipe(vec![
            dir(b"a"),
            dir(b"a/b"),
            file(b"a/b/c", &[b"123"]),
            dir(b"a/b/d"),
            file(b"a/b/d/e", &[b"45"]),
            file(b"a/b.txt", &[b"6"]),
            file(b"a/z", &[b"7"]),
        ]);
        let b = recipe(vec![
            dir(b"a"),
            file(b"a/b.txt", &[b"6"]),
            file(b"a/z", &[b"7"]),
        ]);
        let (e, s) = diff(&a, &b);
        assert_eq!(
            brief(&e),
            [
                ("a/b".into(), Change::Removed, vec![]),
                ("a/b/c".into(), Change::Removed, vec![]),
                ("a/b/d".into(), Change::Removed, vec![]),
                ("a/b/d/e".into(), Change::Removed, vec![]),
            ]
        );
        assert_eq!((s.removed, s.removed_bytes), (4, 5));
        // Reversed, the same paths are added, in the same order.
        let (e, s) = diff(&b, &a);
        assert!(e.iter().all(|e| e.change == Change::Added));
        assert_eq!(e.len(), 4);
        assert_eq!((s.added, s.added_bytes), (4, 5));
    }

    #[test]
    fn paths_that_are_not_utf8() {
        let bad: &[u8] = b"dir/caf\xe9";
        let a = recipe(vec![
            dir(b"dir"),
            file(bad, &[b"v1"]),
            file(b"dir/\xff\xfe", &[b"x"]),
        ]);
        let b = recipe(vec![
            dir(b"dir"),
            file(bad, &[b"v2"]),
            file(b"dir/\xff\xff", &[b"x"]),
        ]);
        let (e, _) = diff(&a, &b);
        let got: Vec<(&[u8], Change)> = e.iter().map(|e| (e.path.as_slice(), e.change)).collect();
        assert_eq!(
            got,
            [
                (bad, Change::Modified),
                (&b"dir/\xff\xfe"[..], Change::Removed),
                (&b"dir/\xff\xff"[..], Change::Added),
            ]
        );
        // Serialised as a string.
        let json = serde_json::to_value(&e[0]).unwrap();
        assert_eq!(json["path"], "dir/caf\u{fffd}");
        assert_eq!(json["change"], "modified");
        assert_eq!(json["kind"], "file");
        assert_eq!(json["what"], serde_json::json!(["content"]));
        assert!(json.get("old_kind").is_none());
    }

    #[test]
    fn trees_out_of_order_or_with_repeated_paths_still_diff() {
        let sorted = recipe(vec![
            dir(b"a"),
            file(b"a/x", &[b"1"]),
            file(b"a.txt", &[b"2"]),
        ]);
        let mut shuffled = sorted.clone();
        shuffled.nodes.reverse();
        assert!(diff(&sorted, &shuffled).0.is_empty());
        // A repeated path counts once (its first node).
        let mut twice = sorted.clone();
        twice.nodes.push(file(b"a/x", &[b"other"]));
        assert!(diff(&sorted, &twice).0.is_empty());
    }

    fn snap(series: &str, version: u32) -> Snapshot {
        Snapshot {
            series: series.into(),
            version,
            time_ns: 42,
            host: "h".into(),
            paths: vec![],
            tags: vec![],
            recipe: "r".into(),
            parent: None,
            chunker: ChunkerParams::cdc(8192),
            stats: SnapshotStats::default(),
            archival: None,
            tier: Tier::Active,
            cloud_part: None,
        }
    }

    fn matches(patterns: &[&str], ignore_case: bool, paths: &[&[u8]]) -> Vec<String> {
        let m = Matcher::new(patterns, ignore_case).unwrap();
        paths
            .iter()
            .filter(|p| m.is_match(p))
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }

    const TREE: &[&[u8]] = &[
        b"docs",
        b"docs/a.md",
        b"docs/sub/b.md",
        b"src",
        b"src/docs",
        b"src/docs/c.md",
        b"src/main.rs",
        b"README.md",
    ];

    #[test]
    fn patterns_without_a_slash_match_names() {
        assert_eq!(
            matches(&["*.md"], false, TREE),
            ["docs/a.md", "docs/sub/b.md", "src/docs/c.md", "README.md"]
        );
        assert_eq!(matches(&["docs"], false, TREE), ["docs", "src/docs"]);
        // Not a substring or prefix of the name, nor a directory above it.
        assert!(matches(&["doc"], false, TREE).is_empty());
        assert!(matches(&["main"], false, TREE).is_empty());
        // Several patterns: any of them.
        assert_eq!(
            matches(&["main.rs", "b.*"], false, TREE),
            ["docs/sub/b.md", "src/main.rs"]
        );
        // A trailing slash is ignored.
        assert_eq!(matches(&["docs/"], false, TREE), ["docs", "src/docs"]);
    }

    #[test]
    fn patterns_with_a_slash_match_paths() {
        // A leading slash is the snapshot root.
        assert_eq!(matches(&["/docs"], false, TREE), ["docs"]);
        assert_eq!(matches(&["/docs/*.md"], false, TREE), ["docs/a.md"]);
        assert_eq!(
            matches(&["/docs/**/*.md"], false, TREE),
            ["docs/a.md", "docs/sub/b.md"]
        );
        assert_eq!(matches(&["/*"], false, TREE), ["docs", "src", "README.md"]);
        // Otherwise the trailing components, at any depth.
        assert_eq!(
            matches(&["docs/*.md"], false, TREE),
            ["docs/a.md", "src/docs/c.md"]
        );
        assert_eq!(matches(&["**/sub/*"], false, TREE), ["docs/sub/b.md"]);
        assert_eq!(matches(&["src/docs"], false, TREE), ["src/docs"]);
        // `*` stays within a component.
        assert!(matches(&["/*.md"], false, &[b"docs/a.md"]).is_empty());
    }

    #[test]
    fn case_is_significant_unless_ignored() {
        let tree: &[&[u8]] = &[
            b"Docs/Notes.TXT",
            "Été/ÉCOLE.txt".as_bytes(),
            b"x/n\xc9.TXT",
        ];
        assert!(matches(&["*.txt"], false, tree).contains(&"Été/ÉCOLE.txt".to_string()));
        assert_eq!(matches(&["*.txt"], false, tree).len(), 1);
        assert_eq!(matches(&["*.txt"], true, tree).len(), 3);
        assert_eq!(
            matches(&["/docs/notes.txt"], true, tree),
            ["Docs/Notes.TXT"]
        );
        assert_eq!(matches(&["NOTES.txt"], true, tree), ["Docs/Notes.TXT"]);
        // Beyond ASCII too.
        assert_eq!(matches(&["/été/école.TXT"], true, tree), ["Été/ÉCOLE.txt"]);
        assert!(matches(&["/été/école.TXT"], false, tree).is_empty());
    }

    #[test]
    fn names_that_are_not_utf8_match_by_bytes() {
        let tree: &[&[u8]] = &[b"d", b"d/caf\xe9.txt", b"d/\xff"];
        assert_eq!(matches(&["*"], false, tree).len(), 3);
        assert_eq!(matches(&["*.txt"], false, tree), ["d/caf\u{fffd}.txt"]);
        assert_eq!(matches(&["caf?.txt"], false, tree), ["d/caf\u{fffd}.txt"]);
        assert_eq!(matches(&["/d/*"], false, tree).len(), 2);
        assert_eq!(matches(&["/D/CAF*"], true, tree), ["d/caf\u{fffd}.txt"]);
    }

    #[test]
    fn bad_patterns_are_errors() {
        assert!(Matcher::new::<&str>(&[], false).is_err());
        assert!(Matcher::new(&[""], false).is_err());
        assert!(Matcher::new(&["/"], false).is_err());
        let e = Matcher::new(&["a[b"], false).unwrap_err();
        assert!(e.to_string().contains("a[b"), "{e}");
    }

    #[test]
    fn find_in_reports_matching_nodes_with_their_version() {
        let r = recipe(vec![
            dir(b"d"),
            file(b"d/x.log", &[b"12345"]),
            link(b"d/y.log", NodeKind::Hardlink, b"d/x.log"),
            file(b"d/z.txt", &[b"1"]),
        ]);
        let m = Matcher::new(&["*.log"], false).unwrap();
        let hits = find_in("abc", &snap("home", 3), &r, &m);
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0],
            FindHit {
                snapshot_id: "abc".into(),
                series: "home".into(),
                version: 3,
                time_ns: 42,
                path: b"d/x.log".to_vec(),
                kind: NodeKind::File,
                size: 5,
                mtime_ns: 1_000,
            }
        );
        // A hard link reports its file's size.
        assert_eq!((hits[1].kind, hits[1].size), (NodeKind::Hardlink, 5));
        let json = serde_json::to_value(&hits[1]).unwrap();
        assert_eq!(json["path"], "d/y.log");
        assert_eq!(json["kind"], "hardlink");
        assert!(find_in(
            "abc",
            &snap("home", 3),
            &r,
            &Matcher::new(&["nope"], false).unwrap()
        )
        .is_empty());
    }
}
