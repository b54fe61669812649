//! Where restore takes a recipe's nodes from: a recipe in memory, or a
//! stored one read a part at a time, so that restoring a version holds
//! its tree's metadata but never its whole chunk list (a fully written
//! 100 GiB disk image is 26 million chunk references).

use crate::error::Result;
use crate::repo::recipe;
use crate::repo::Repository;
use strata_core::format::{Node, Recipe};
use strata_core::id::RecipeId;

/// The recipe of the version being restored.
#[derive(Clone, Copy)]
pub enum RecipeSource<'a> {
    /// Whole in memory.
    Memory(&'a Recipe),
    /// Stored in `repo` under `id`, read a part at a time.
    Stored {
        repo: &'a Repository,
        id: &'a RecipeId,
    },
}

impl RecipeSource<'_> {
    /// Every node with its metadata and none of its chunks (a file once,
    /// however many pieces hold it), and the container table the
    /// references of [`RecipeSource::for_each_piece`] are numbered in.
    pub fn skeleton(&self) -> Result<Recipe> {
        match self {
            RecipeSource::Memory(r) => Ok(Recipe {
                containers: r.containers.clone(),
                nodes: r.nodes.iter().map(without_chunks).collect(),
            }),
            RecipeSource::Stored { repo, id } => recipe::load_skeleton(repo, id),
        }
    }

    /// Calls `f` with each node and its chunks, with the offset in its
    /// file where they begin: a file stored in pieces comes as one node
    /// per piece, in order.
    pub fn for_each_piece(&self, mut f: impl FnMut(&Node, u64) -> Result<()>) -> Result<()> {
        match self {
            RecipeSource::Memory(r) => {
                // (Pieces of one file, should a recipe in memory hold them
                // unjoined, go on where the one before ended.)
                let mut end = 0u64;
                for (i, n) in r.nodes.iter().enumerate() {
                    let goes_on = i > 0 && recipe::continues(&r.nodes[i - 1], n);
                    let offset = if goes_on { end } else { 0 };
                    let len: u64 = n.segments.iter().map(|s| s.len()).sum();
                    end = offset.saturating_add(len);
                    f(n, offset)?;
                }
                Ok(())
            }
            RecipeSource::Stored { repo, id } => {
                recipe::for_each_piece(repo, id, |n, offset| f(&n, offset)).map(drop)
            }
        }
    }
}

/// A copy of `n` without its chunks.
fn without_chunks(n: &Node) -> Node {
    Node {
        path: n.path.clone(),
        target: n.target.clone(),
        segments: Vec::new(),
        xattrs: n.xattrs.clone(),
        ..*n
    }
}
