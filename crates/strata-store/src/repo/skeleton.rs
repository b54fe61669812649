//! A stored recipe's tree without its chunks, and where each node's
//! chunks are among the recipe's parts: what `strata mount` lists, and
//! what opening one of its files reads (only the parts holding that
//! file). A tree of a million files, or a 100 GiB disk image, is then
//! held as its nodes' metadata, never as every chunk reference.

use crate::error::{Result, StoreError};
use crate::repo::recipe::{append_joined, for_each_piece_in_part, load_object, load_part};
use crate::repo::Repository;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use strata_core::format::{
    ChunkRef, ContainerId, Node, NodeKind, Recipe, RecipeObject, SegmentRef,
};
use strata_core::id::{PartId, RecipeId};

/// A recipe's tree without chunks (see the module documentation).
pub struct Skeleton {
    id: Option<RecipeId>,
    /// Every node (a file once, however many pieces hold it) without its
    /// chunks; `containers` is the whole recipe's table, the one
    /// [`Skeleton::chunks_of`] numbers references in.
    pub recipe: Recipe,
    /// Per node: its content length (its chunks' bytes, all pieces).
    pub lens: Vec<u64>,
    /// Per node: the first and last part holding its pieces.
    spans: Vec<(usize, usize)>,
    /// The recipe's part ids (none: a version-1 recipe, one object).
    parts: Vec<PartId>,
    table: HashMap<ContainerId, u32>,
    /// The parts decoded last (their number; 0 for a version-1 recipe's
    /// one object), at most [`CACHED_PARTS`]: a directory's files lie in
    /// one or two parts and are opened one after another.
    cache: Mutex<VecDeque<(usize, Arc<Recipe>)>>,
}

/// Decoded parts a [`Skeleton`] keeps (a part is at most 4 MiB encoded).
const CACHED_PARTS: usize = 4;

impl Skeleton {
    /// Reads recipe `id` from `repo` a part at a time.
    pub fn load(repo: &Repository, id: &RecipeId) -> Result<Skeleton> {
        let parts = match load_object(repo, id)? {
            RecipeObject::Whole(_) => Vec::new(),
            RecipeObject::Index(i) => i.parts.into_iter().map(|p| p.id).collect(),
        };
        let mut nodes = Vec::new();
        let mut lens: Vec<u64> = Vec::new();
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let containers = for_each_piece_in_part(repo, id, |mut n, _, part, _| {
            let len: u64 = n.segments.iter().map(SegmentRef::len).sum();
            n.segments = Vec::new();
            let goes_on = append_joined(&mut nodes, n)?;
            match (goes_on, lens.last_mut(), spans.last_mut()) {
                (true, Some(l), Some(s)) => {
                    *l = l.saturating_add(len);
                    s.1 = part;
                }
                _ => {
                    lens.push(len);
                    spans.push((part, part));
                }
            }
            Ok(())
        })?;
        let table = containers
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, i as u32))
            .collect();
        Ok(Skeleton {
            id: Some(id.clone()),
            recipe: Recipe { containers, nodes },
            lens,
            spans,
            parts,
            table,
            cache: Mutex::default(),
        })
    }

    /// A skeleton of `nodes` (chunks dropped) with no stored recipe
    /// behind it: a tree to list, whose files cannot be opened.
    pub fn of_nodes(nodes: Vec<Node>) -> Skeleton {
        let lens = nodes
            .iter()
            .map(|n| n.segments.iter().map(SegmentRef::len).sum())
            .collect();
        let spans = vec![(0, 0); nodes.len()];
        let nodes = nodes
            .into_iter()
            .map(|n| Node {
                segments: Vec::new(),
                ..n
            })
            .collect();
        Skeleton {
            id: None,
            recipe: Recipe {
                containers: Vec::new(),
                nodes,
            },
            lens,
            spans,
            parts: Vec::new(),
            table: HashMap::new(),
            cache: Mutex::default(),
        }
    }

    /// The recipe's id (none for a tree of nodes only).
    pub fn id(&self) -> Option<&RecipeId> {
        self.id.as_ref()
    }

    /// Calls `f` with each chunk of node `i` in order, numbered in the
    /// skeleton's container table, reading only the parts that hold it
    /// (a version-1 recipe: its one object).
    pub fn chunks_of(
        &self,
        repo: &Repository,
        i: usize,
        mut f: impl FnMut(&ChunkRef),
    ) -> Result<()> {
        let (Some(node), Some(&(first, last))) = (self.recipe.nodes.get(i), self.spans.get(i))
        else {
            return Err(StoreError::Invalid(format!(
                "no node {i} in recipe {}",
                self.id_text()
            )));
        };
        let numbers = match self.parts.is_empty() {
            // A version-1 recipe: its one object.
            true => 0..=0,
            false => first..=last,
        };
        numbers.into_iter().try_for_each(|k| {
            let part = self.part(repo, k)?;
            part_chunks(&part, &self.table, &node.path, &mut f)
        })
    }
}

impl Skeleton {
    /// The recipe's id as messages print it (empty for a tree built from
    /// nodes alone).
    fn id_text(&self) -> &str {
        self.id.as_ref().map_or("", |i| i.as_str())
    }

    /// Part `k` decoded, from the cache or read (a version-1 recipe: its
    /// one object, `k` 0).
    fn part(&self, repo: &Repository, k: usize) -> Result<Arc<Recipe>> {
        let lock = || self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = lock().iter().find(|(n, _)| *n == k) {
            return Ok(p.clone());
        }
        let part = match self.parts.get(k) {
            Some(id) => load_part(repo, id)?,
            None if self.parts.is_empty() && self.id.is_some() => {
                match load_object(repo, self.id.as_ref().expect("checked"))? {
                    RecipeObject::Whole(r) => r,
                    RecipeObject::Index(_) => Recipe::default(),
                }
            }
            None => {
                return Err(StoreError::Invalid(format!(
                    "part {k} of recipe {:?} is not stored (a tree to list only?)",
                    self.id_text()
                )))
            }
        };
        let part = Arc::new(part);
        let mut cache = lock();
        cache.push_back((k, part.clone()));
        if cache.len() > CACHED_PARTS {
            cache.pop_front();
        }
        Ok(part)
    }
}

/// Calls `f` with the chunks of the file `path` in `part` (its pieces
/// there, in order), references renumbered through `table` (the whole
/// recipe's: container id → number).
pub(crate) fn part_chunks(
    part: &Recipe,
    table: &HashMap<ContainerId, u32>,
    path: &[u8],
    f: &mut impl FnMut(&ChunkRef),
) -> Result<()> {
    let map: Vec<Option<u32>> = part
        .containers
        .iter()
        .map(|c| table.get(c).copied())
        .collect();
    let want = |n: &&Node| n.path == path && n.kind == NodeKind::File;
    for n in part.nodes.iter().filter(want) {
        for c in n.segments.iter().flat_map(|s| &s.chunks) {
            let mut c = *c;
            if c.is_direct() {
                c.container = map
                    .get(c.container as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(|| unlisted(path))?;
            }
            f(&c);
        }
    }
    Ok(())
}

fn unlisted(path: &[u8]) -> StoreError {
    StoreError::Invalid(format!(
        "the recipe of {} references a container its part does not list",
        String::from_utf8_lossy(path)
    ))
}
