//! Find: the paths of versions' trees that match patterns.
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

use super::diff::{kind_id, lossy, Tree};
use crate::error::{Result, StoreError};
use crate::repo::tiers::whole_skeleton;
use crate::repo::Repository;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Serialize;
use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use strata_core::format::{NodeKind, Recipe, Snapshot};
use strata_core::id::SnapshotId;

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
pub fn find(
    repo: &Repository,
    snaps: &[(SnapshotId, Snapshot)],
    m: &Matcher,
) -> Result<Vec<FindHit>> {
    let mut hits = Vec::new();
    for (id, s) in snaps {
        let recipe = whole_skeleton(repo, s)?;
        hits.extend(find_in(id, s, &recipe, m));
    }
    Ok(hits)
}
