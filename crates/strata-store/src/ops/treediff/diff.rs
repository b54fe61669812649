//! Diff: two versions' trees compared, from their recipes alone (each
//! version's whole tree without chunks, [`whole_skeleton`], and each
//! file's [`ContentHash`], read a recipe part at a time).
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

use crate::error::Result;
use crate::repo::Repository;
use serde::{Serialize, Serializer};
use std::cmp::Ordering;
use std::collections::HashMap;
use strata_core::format::{path_cmp, ChunkRef, Node, NodeKind, Recipe, Snapshot};
use strata_core::id::RecipeId;
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
pub(super) fn lossy<S: Serializer>(p: &[u8], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(p))
}

/// Serialises a kind by its script name ([`NodeKind::id`]).
pub(super) fn kind_id<S: Serializer>(k: &NodeKind, s: S) -> std::result::Result<S::Ok, S::Error> {
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
pub(super) struct Tree<'a> {
    pub(super) nodes: Vec<&'a Node>,
    /// Files' content hashes by path, when the nodes come without chunks
    /// (a version's skeleton, hashed as its parts were read).
    hashes: Option<&'a ContentHashes>,
}

/// Regular files' content hashes by path ([`ContentHash`]).
pub type ContentHashes = HashMap<Vec<u8>, [u8; 32]>;

impl<'a> Tree<'a> {
    pub(crate) fn new(r: &'a Recipe, hashes: Option<&'a ContentHashes>) -> Self {
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
    pub(crate) fn hash_of(&self, f: &Node) -> Option<[u8; 32]> {
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
    pub(crate) fn get(&self, path: &[u8]) -> Option<&'a Node> {
        let i = self
            .nodes
            .binary_search_by(|n| path_cmp(&n.path, path))
            .ok()?;
        self.nodes.get(i).copied()
    }

    /// The regular file holding `n`'s content: `n` itself, or the file a
    /// hard link names (`None` when it is not in the tree as a file).
    pub(crate) fn file_of(&self, n: &'a Node) -> Option<&'a Node> {
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
    pub(crate) fn size_of(&self, n: &'a Node) -> Option<u64> {
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
    pub(crate) hasher: blake3::Hasher,
    /// Zero bytes not yet hashed (a run may go on).
    pub(crate) zeros: u64,
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

    pub(crate) fn flush_zeros(&mut self) {
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
fn hashed_skeleton(repo: &Repository, id: &RecipeId) -> Result<(Recipe, ContentHashes)> {
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
    pub(crate) entries: Vec<DiffEntry>,
    pub(crate) summary: DiffSummary,
}

impl Collect {
    pub(crate) fn push(&mut self, e: DiffEntry) {
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
    pub(crate) fn one_side(&mut self, t: &Tree, n: &Node, change: Change) {
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
