//! A recipe's chunk references rewritten (chunks moved by compaction,
//! reverse dedup or a tier move; two recipes joined), whole or a part at
//! a time.

use super::writer::RecipeWriter;
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use std::collections::HashMap;
use strata_core::format::{ChunkRef, ContainerId, Node, Recipe};
use strata_core::id::RecipeId;

/// Where [`rewrite_refs`] points a chunk reference.
pub enum Target {
    /// Unchanged.
    Keep,
    /// Indirect: the chunk with the same fingerprint in the next version.
    Indirect,
    /// Direct, at (container, region, offset).
    At(ContainerId, u32, u32),
}

/// Rewrites every chunk reference of `recipe` with `f` — given the
/// reference and, for a direct one, its container — and rebuilds the
/// container table with only the containers still used.
pub fn rewrite_refs(
    recipe: &mut Recipe,
    mut f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<()> {
    let old = std::mem::take(&mut recipe.containers);
    let mut table = NewTable::default();
    for n in &mut recipe.nodes {
        rewrite_node(n, &old, &mut table, &mut f)?;
    }
    recipe.containers = table.ids;
    Ok(())
}

/// A container table in the making: ids in order of first use.
#[derive(Default)]
struct NewTable {
    ids: Vec<ContainerId>,
    index: HashMap<ContainerId, u32>,
}

/// [`rewrite_refs`] for one node whose direct references index `old`; the
/// new references index `table`.
fn rewrite_node(
    n: &mut Node,
    old: &[ContainerId],
    table: &mut NewTable,
    f: &mut impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<()> {
    for s in &mut n.segments {
        for c in &mut s.chunks {
            if c.is_zero() {
                continue;
            }
            let cid = match c.is_direct() {
                true => Some(*old.get(c.container as usize).ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "a recipe references container {} of {}",
                        c.container,
                        old.len()
                    ))
                })?),
                false => None,
            };
            let (id, region, offset) = match f(c, cid)? {
                Target::Keep => match cid {
                    Some(id) => (id, c.region, c.offset),
                    None => continue,
                },
                Target::Indirect => {
                    *c = ChunkRef::indirect(c.fp, c.len);
                    continue;
                }
                Target::At(id, region, offset) => (id, region, offset),
            };
            let i = *table.index.entry(id).or_insert_with(|| {
                table.ids.push(id);
                table.ids.len() as u32 - 1
            });
            *c = ChunkRef {
                fp: c.fp,
                len: c.len,
                container: i,
                region,
                offset,
            };
        }
    }
    Ok(())
}

/// [`rewrite_refs`] for the stored recipe `id`, a part at a time: each
/// node (a file's piece) is rewritten as it is read and handed to `sink`
/// with its own container table — typically into a [`RecipeWriter`]
/// ([`store_rewritten`]), whose parts that come out as they were are not
/// written again. Neither recipe is held whole: a disk image's version of
/// millions of chunks costs a part.
pub fn rewrite_pieces(
    repo: &Repository,
    id: &RecipeId,
    mut f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
    mut sink: impl FnMut(Node, &[ContainerId]) -> Result<()>,
) -> Result<()> {
    if crate::repo::recipe::part_ids(repo, id)?.is_empty() {
        // A version-1 recipe is one object whose nodes are in byte order,
        // not the path order a writer takes: sorted whole, as `put` sorts.
        let mut r = crate::repo::recipe::load_whole(repo, id)?;
        r.nodes
            .sort_by(|a, b| strata_core::format::path_cmp(&a.path, &b.path));
        for mut n in r.nodes {
            let mut table = NewTable::default();
            rewrite_node(&mut n, &r.containers, &mut table, &mut f)?;
            sink(n, &table.ids)?;
        }
        return Ok(());
    }
    crate::repo::recipe::for_each_piece_in_part(repo, id, |mut n, _, _, old| {
        let mut table = NewTable::default();
        rewrite_node(&mut n, old, &mut table, &mut f)?;
        sink(n, &table.ids)
    })?;
    Ok(())
}

/// [`rewrite_pieces`] stored as a new recipe: its id and the bytes
/// written.
pub fn store_rewritten(
    repo: &Repository,
    id: &RecipeId,
    f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
) -> Result<(RecipeId, u64)> {
    let mut w = RecipeWriter::new(repo);
    rewrite_into(repo, id, f, &mut w)?;
    w.finish()
}

/// [`rewrite_pieces`] of the stored recipe `id` pushed into `w` (another
/// tier's writer, one with a mirror): the caller finishes it.
pub fn rewrite_into(
    repo: &Repository,
    id: &RecipeId,
    f: impl FnMut(&ChunkRef, Option<ContainerId>) -> Result<Target>,
    w: &mut RecipeWriter,
) -> Result<()> {
    rewrite_pieces(repo, id, f, |n, table| {
        w.push(n, |i| table.get(i as usize).copied())
    })
}
