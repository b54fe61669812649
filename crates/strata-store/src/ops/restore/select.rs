//! Which nodes of a recipe a restore (or `ls`, `dump`) takes: include and
//! exclude paths, hard links whose first name is left out, and the check
//! that a recipe path stays inside the target.

use crate::error::{Result, StoreError};
use std::borrow::Cow;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use strata_core::format::{Node, NodeKind, Recipe};

/// Checks a recipe path and turns it into a relative path.
pub fn safe_rel(path: &[u8]) -> Result<PathBuf> {
    let bad = || StoreError::UnsafePath(String::from_utf8_lossy(path).into_owned());
    if path.is_empty() || path[0] == b'/' || path.contains(&0) {
        return Err(bad());
    }
    let mut out = PathBuf::new();
    for comp in path.split(|&b| b == b'/') {
        if comp.is_empty() || comp == b"." || comp == b".." {
            return Err(bad());
        }
        out.push(std::ffi::OsStr::from_bytes(comp));
    }
    Ok(out)
}

/// `pattern` without a leading or trailing `/` (paths in a recipe are
/// relative to the snapshot root).
fn trim_slashes(mut p: &[u8]) -> &[u8] {
    while let [b'/', rest @ ..] = p {
        p = rest;
    }
    while let [rest @ .., b'/'] = p {
        p = rest;
    }
    p
}

/// Whether `path` (a recipe node's) is `pattern` or below it, as `ls`,
/// `restore --include/--exclude` and `dump` take paths (a leading and a
/// trailing `/` ignored; an empty pattern is the root). Bytes, so names
/// that are not UTF-8 can be selected.
pub fn under(path: &[u8], pattern: &[u8]) -> bool {
    let p = trim_slashes(pattern);
    p.is_empty() || (path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/'))
}

/// True when `path` is selected by the include list (or is an ancestor
/// directory of a selected path).
pub fn selected(path: &[u8], include: &[Vec<u8>]) -> bool {
    include.is_empty()
        || include.iter().any(|inc| {
            let inc = trim_slashes(inc);
            under(path, inc) || (inc.starts_with(path) && inc.get(path.len()) == Some(&b'/'))
        })
}

/// True when `path` is an excluded path or below one.
pub fn excluded(path: &[u8], exclude: &[Vec<u8>]) -> bool {
    exclude
        .iter()
        .any(|e| !trim_slashes(e).is_empty() && under(path, e))
}

/// The patterns that select nothing in `recipe` (a typo would otherwise
/// print or restore nothing and succeed).
pub fn unmatched<'a>(recipe: &Recipe, patterns: &'a [Vec<u8>]) -> Vec<&'a [u8]> {
    patterns
        .iter()
        .filter(|p| !recipe.nodes.iter().any(|n| under(&n.path, p)))
        .map(Vec::as_slice)
        .collect()
}

/// The nodes an include list selects. A hard link whose first name is not
/// selected becomes a regular file with that name's content (the first such
/// link of a group); the group's other selected links point at it.
pub fn select_nodes<'a>(
    recipe: &'a Recipe,
    include: &[Vec<u8>],
    exclude: &[Vec<u8>],
) -> Vec<Cow<'a, Node>> {
    select_entries(recipe, include, exclude)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// [`select_nodes`], each node with the recipe path whose chunks are its
/// content: its own, or for a hard link restored as a file, its first
/// name's.
pub(super) fn select_entries<'a>(
    recipe: &'a Recipe,
    include: &[Vec<u8>],
    exclude: &[Vec<u8>],
) -> Vec<(Cow<'a, Node>, &'a [u8])> {
    let all_selected = include.is_empty() && exclude.is_empty();
    let selected = |p: &[u8], include: &[Vec<u8>]| selected(p, include) && !excluded(p, exclude);
    let by_path: HashMap<&[u8], &Node> = if all_selected {
        HashMap::new()
    } else {
        recipe
            .nodes
            .iter()
            .map(|n| (n.path.as_slice(), n))
            .collect()
    };
    let mut moved: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut out = Vec::new();
    for n in recipe.nodes.iter().filter(|n| selected(&n.path, include)) {
        let target = n.target.as_deref().unwrap_or_default();
        if all_selected || n.kind != NodeKind::Hardlink || selected(target, include) {
            out.push((Cow::Borrowed(n), n.path.as_slice()));
        } else if let Some(first) = moved.get(target) {
            let mut link = n.clone();
            link.target = Some(first.clone());
            out.push((Cow::Owned(link), n.path.as_slice()));
        } else if let Some(orig) = by_path.get(target).filter(|o| o.kind == NodeKind::File) {
            let mut file = (*orig).clone();
            file.path = n.path.clone();
            moved.insert(target.to_vec(), n.path.clone());
            out.push((Cow::Owned(file), orig.path.as_slice()));
        } else {
            out.push((Cow::Borrowed(n), n.path.as_slice()));
        }
    }
    out
}
