//! A version split between the tiers (`tier migrate --path`): the files
//! that moved are a second recipe, its *cloud part*, held by the cloud
//! tier. Read whole, a version is its recipe and its cloud part joined.

use crate::error::{Result, StoreError};
use crate::repo::recipe::load_skeleton;
use crate::repo::recipe::refs::{rewrite_refs, Target};
use crate::repo::Repository;
use strata_core::format::{path_cmp, Recipe, Snapshot, Tier};

/// Joins two recipes of one version (an active part and a cloud part, or
/// two cloud parts) into one: nodes in path order, a directory both hold
/// taken from `a`.
pub fn merge(a: Recipe, b: Recipe) -> Result<Recipe> {
    let off = a.containers.len() as u32;
    let mut containers = a.containers;
    containers.extend(b.containers);
    let mut bn = b.nodes;
    for c in bn
        .iter_mut()
        .flat_map(|n| n.segments.iter_mut().flat_map(|s| s.chunks.iter_mut()))
    {
        if c.is_direct() {
            c.container = c.container.checked_add(off).ok_or_else(|| {
                StoreError::Invalid("a recipe's container table overflows".into())
            })?;
        }
    }
    let mut nodes = Vec::with_capacity(a.nodes.len() + bn.len());
    let mut bi = bn.into_iter().peekable();
    for n in a.nodes {
        while let Some(m) = bi.next_if(|m| path_cmp(&m.path, &n.path).is_lt()) {
            nodes.push(m);
        }
        bi.next_if(|m| m.path == n.path);
        nodes.push(n);
    }
    nodes.extend(bi);
    let mut r = Recipe { containers, nodes };
    rewrite_refs(&mut r, |_, _| Ok(Target::Keep))?;
    Ok(r)
}

/// An active version's cloud part, as the bucket's snapshot object has it
/// (what restore reads from the cloud tier after the active recipe).
pub fn part_snapshot(s: &Snapshot) -> Option<Snapshot> {
    let p = s.cloud_part.as_ref().filter(|_| s.tier == Tier::Active)?;
    let mut c = s.clone();
    c.tier = Tier::Cloud;
    c.recipe = p.recipe.clone();
    c.archival = None;
    Some(c)
}

/// A version's whole tree as one recipe, for listing (its references mix
/// two tiers' containers and are not for reading): the recipe and its
/// cloud part's, both from `repo` (which keeps a copy of every recipe).
pub fn whole_recipe(repo: &Repository, s: &Snapshot) -> Result<Recipe> {
    let r = repo.load_recipe(&s.recipe)?;
    match part_snapshot(s) {
        Some(p) => merge(r, repo.load_recipe(&p.recipe)?),
        None => Ok(r),
    }
}

/// [`whole_recipe`] without chunks ([`load_skeleton`]):
/// the version's tree for listing and selecting, in memory that does not
/// grow with the size of its files.
pub fn whole_skeleton(repo: &Repository, s: &Snapshot) -> Result<Recipe> {
    let r = load_skeleton(repo, &s.recipe)?;
    match part_snapshot(s) {
        Some(p) => merge(r, load_skeleton(repo, &p.recipe)?),
        None => Ok(r),
    }
}
