//! Paths within versions (Data Domain Cloud Tier §6.1 moves files, not
//! whole backups): `tier migrate --path GLOB` moves the selected files of
//! each chosen version to the cloud tier and keeps the rest active. The
//! version stays one snapshot: its active recipe loses the moved files,
//! and its [`CloudPart`] names a second recipe — the moved files, their
//! hard links and parent directories, every reference direct into the
//! cloud tier — which is also the recipe of the version's snapshot object
//! in the bucket (so the bucket alone still restores what it holds).
//! Restore reads the active part, then the cloud part, into one tree.
//!
//! Reverse dedup (RevDedup §2.4) makes an older version's chunks indirect
//! when the next version holds them; a file moved out of a version may be
//! what still holds an older version's chunk. Before anything moves, every
//! active version's chain is checked against the versions as they will
//! be, and a move that would break one is refused with the version and
//! the way out (select its paths too, or move whole versions).

use crate::engine::resolver::recipe_refs;
use crate::error::{Result, StoreError};
use crate::repo::recipe::refs::{rewrite_refs, Target};
use crate::repo::Repository;
use globset::GlobSet;
use std::collections::{HashMap, HashSet};
use strata_core::format::{Node, NodeKind, Recipe, Snapshot, Tier};
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

/// A version's recipe cut in two.
#[derive(Debug)]
pub(crate) struct Split {
    /// What stays: every node but the moved files and their hard links.
    pub rest: Recipe,
    /// What moves: the selected files, hard links to them, and the
    /// directories above both (kept in `rest` as well).
    pub part: Recipe,
    pub files: u64,
    pub logical_bytes: u64,
}

/// Cuts `recipe` into the files `globs` select and the rest; `None` when
/// no file is selected.
pub(crate) fn split(recipe: &Recipe, globs: &GlobSet) -> Result<Option<Split>> {
    let globs = Some(globs.clone());
    let moved: HashSet<&[u8]> = recipe
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::File && in_paths(&globs, n))
        .map(|n| n.path.as_slice())
        .collect();
    if moved.is_empty() {
        return Ok(None);
    }
    let goes = |n: &strata_core::format::Node| {
        moved.contains(n.path.as_slice())
            || (n.kind == NodeKind::Hardlink
                && n.target.as_deref().is_some_and(|t| moved.contains(t)))
    };
    let mut parents: HashSet<&[u8]> = HashSet::new();
    for n in recipe.nodes.iter().filter(|n| goes(n)) {
        let p = n.path.as_slice();
        for (i, _) in p.iter().enumerate().filter(|(_, b)| **b == b'/') {
            parents.insert(&p[..i]);
        }
    }
    let mut rest = Recipe {
        containers: recipe.containers.clone(),
        nodes: Vec::new(),
    };
    let mut part = Recipe {
        containers: recipe.containers.clone(),
        nodes: Vec::new(),
    };
    let (mut files, mut logical_bytes) = (0, 0);
    for n in &recipe.nodes {
        if goes(n) {
            if n.kind == NodeKind::File {
                files += 1;
                logical_bytes += n.size;
            }
            part.nodes.push(n.clone());
        } else {
            if n.kind == NodeKind::Dir && parents.contains(n.path.as_slice()) {
                part.nodes.push(n.clone());
            }
            rest.nodes.push(n.clone());
        }
    }
    // Each keeps only the containers it references.
    rewrite_refs(&mut rest, |_, _| Ok(Target::Keep))?;
    rewrite_refs(&mut part, |_, _| Ok(Target::Keep))?;
    Ok(Some(Split {
        rest,
        part,
        files,
        logical_bytes,
    }))
}

/// Fingerprints of a recipe: all of them, and those referenced directly.
struct Fps {
    all: HashSet<Fingerprint>,
    direct: HashSet<Fingerprint>,
}

impl Fps {
    fn of(r: &Recipe) -> Fps {
        let mut f = Fps {
            all: HashSet::new(),
            direct: HashSet::new(),
        };
        for c in recipe_refs(r).filter(|c| !c.is_zero()) {
            f.all.insert(c.fp);
            if c.is_direct() {
                f.direct.insert(c.fp);
            }
        }
        f
    }
}

/// Refuses splits that would break a reverse-dedup chain: every active
/// version's indirect references must still meet, walking its chain, a
/// version that holds them — with `splits` (version id → its recipe as it
/// will be) applied.
pub(crate) fn check_chains(repo: &Repository, splits: &HashMap<SnapshotId, Recipe>) -> Result<()> {
    let all = repo.list_active_snapshots()?;
    let series: HashSet<&str> = all
        .iter()
        .filter(|(id, _)| splits.contains_key(id))
        .map(|(_, s)| s.series.as_str())
        .collect();
    let by_id: HashMap<&str, &Snapshot> = all.iter().map(|(i, s)| (i.as_str(), s)).collect();
    let mut cache: HashMap<SnapshotId, Fps> = HashMap::new();
    let load = |id: &SnapshotId| -> Result<Fps> {
        Ok(match splits.get(id) {
            Some(r) => Fps::of(r),
            None => {
                let s = by_id.get(id.as_str()).ok_or_else(|| {
                    StoreError::Invalid(format!("snapshot {id} is not an active version"))
                })?;
                Fps::of(&repo.load_recipe(&s.recipe)?)
            }
        })
    };
    for (wid, w) in all
        .iter()
        .filter(|(_, s)| series.contains(s.series.as_str()))
    {
        let Some(mut next) = w.archival.as_ref().and_then(|a| a.next.clone()) else {
            continue;
        };
        let mut want: HashSet<Fingerprint> = match splits.get(wid) {
            Some(r) => recipe_refs(r)
                .filter(|c| c.is_indirect())
                .map(|c| c.fp)
                .collect(),
            None => recipe_refs(&repo.load_recipe(&w.recipe)?)
                .filter(|c| c.is_indirect())
                .map(|c| c.fp)
                .collect(),
        };
        let mut hops = 0;
        while !want.is_empty() && hops < all.len() {
            hops += 1;
            if by_id
                .get(next.as_str())
                .is_none_or(|s| s.tier != Tier::Active)
            {
                break;
            }
            if !cache.contains_key(&next) {
                cache.insert(next.clone(), load(&next)?);
            }
            let f = &cache[&next];
            if let Some(lost) = want.iter().find(|fp| !f.all.contains(*fp)) {
                let x = by_id[next.as_str()];
                return Err(StoreError::Invalid(format!(
                    "{}@{} shares data (chunk {}) with files this move takes out of {}@{} \
                     through reverse dedup: select the same paths in {}@{} too, or move whole versions",
                    w.series,
                    w.version,
                    &lost.to_hex()[..16],
                    x.series,
                    x.version,
                    w.series,
                    w.version
                )));
            }
            want.retain(|fp| !f.direct.contains(fp));
            match by_id[next.as_str()]
                .archival
                .as_ref()
                .and_then(|a| a.next.clone())
            {
                Some(n) => next = n,
                None => break,
            }
        }
    }
    Ok(())
}

/// Whether node `n` is among `paths` (all nodes without them).
pub(crate) fn in_paths(paths: &Option<GlobSet>, n: &Node) -> bool {
    paths.as_ref().is_none_or(|g| {
        let mut p = b"/".to_vec();
        p.extend_from_slice(&n.path);
        g.is_match(String::from_utf8_lossy(&p).as_ref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use globset::{Glob, GlobSetBuilder};
    use strata_core::format::{ChunkRef, ContainerId, Node, SegmentRef};

    fn node(path: &str, kind: NodeKind, container: Option<u32>) -> Node {
        let chunks = container
            .map(|c| ChunkRef {
                fp: strata_core::fingerprint::Hasher::plain().hash(path.as_bytes()),
                len: 10,
                container: c,
                region: 0,
                offset: 0,
            })
            .into_iter()
            .collect::<Vec<_>>();
        Node {
            size: if chunks.is_empty() { 0 } else { 10 },
            target: (kind == NodeKind::Hardlink).then(|| b"a/logs/x.log".to_vec()),
            segments: vec![SegmentRef {
                fp: Fingerprint::ZERO,
                chunks,
            }],
            ..Node::new(path.as_bytes().to_vec(), kind)
        }
    }

    fn tree() -> Recipe {
        Recipe {
            containers: vec![ContainerId([1; 16]), ContainerId([2; 16])],
            nodes: vec![
                node("a", NodeKind::Dir, None),
                node("a/b.txt", NodeKind::File, Some(0)),
                node("a/logs", NodeKind::Dir, None),
                node("a/logs/x.log", NodeKind::File, Some(1)),
                node("a/logs/y.log", NodeKind::File, Some(0)),
                node("a/z", NodeKind::Hardlink, None),
                node("c", NodeKind::Dir, None),
            ],
        }
    }

    fn globs(g: &[&str]) -> GlobSet {
        let mut b = GlobSetBuilder::new();
        for g in g {
            b.add(Glob::new(g).unwrap());
        }
        b.build().unwrap()
    }

    fn paths(r: &Recipe) -> Vec<String> {
        r.nodes.iter().map(|n| n.path_str()).collect()
    }

    #[test]
    fn split_takes_files_their_links_and_parents_and_merge_undoes_it() {
        let r = tree();
        let s = split(&r, &globs(&["/a/logs/**"])).unwrap().unwrap();
        assert_eq!(
            paths(&s.part),
            ["a", "a/logs", "a/logs/x.log", "a/logs/y.log", "a/z"]
        );
        assert_eq!(paths(&s.rest), ["a", "a/b.txt", "a/logs", "c"]);
        assert_eq!((s.files, s.logical_bytes), (2, 20));
        // Each keeps only its own containers.
        assert_eq!(s.rest.containers, vec![ContainerId([1; 16])]);
        assert_eq!(s.part.containers.len(), 2);
        let back = crate::repo::tiers::merge(s.rest, s.part).unwrap();
        assert_eq!(paths(&back), paths(&r));
        for (a, b) in back.nodes.iter().zip(&r.nodes) {
            let refs = |n: &Node, t: &[ContainerId]| -> Vec<ContainerId> {
                n.segments
                    .iter()
                    .flat_map(|s| &s.chunks)
                    .map(|c| t[c.container as usize])
                    .collect()
            };
            assert_eq!(refs(a, &back.containers), refs(b, &r.containers));
        }
        assert!(split(&r, &globs(&["/nope/**"])).unwrap().is_none());
        // A directory alone moves nothing.
        assert!(split(&r, &globs(&["/c"])).unwrap().is_none());
    }
}
