//! Recipes in parts (docs/design.md "Vocabulary": recipe).
//!
//! A version's recipe is a `recipes/HASH` object holding a
//! [`RecipeIndex`]: the list of its parts and the union of their container
//! tables. Each part is a `parts/NAME` object holding a [`Recipe`] of
//! consecutive nodes (in [`path_cmp`] order) with its own container table,
//! so a part is self-contained and named by the keyed hash of its bytes:
//! versions share the parts of unchanged subtrees, and a backup writes the
//! tree a part at a time as it goes instead of holding it whole (as restic
//! writes a tree per directory).
//!
//! Parts are cut where the hash of a node's path says so (at least
//! [`MIN_NODES`], about [`AVG_NODES`] on average), or at [`MAX_NODES`]
//! nodes or [`MAX_PART_BYTES`] bytes: cut points follow the paths, not the
//! position in the tree, so an insertion or removal changes only the parts
//! around it.
//!
//! `recipes/` objects of structure version 1 hold a whole [`Recipe`]; they
//! are still read (as a recipe of one part).

pub mod refs;
pub mod writer;

use crate::error::{Result, StoreError};
use crate::repo::Repository;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use strata_core::crypto::{claimed_kind, Kind};
use strata_core::format::{
    decode, decode_recipe_object, encode_recipe_index, path_cmp, ContainerId, Node, NodeKind,
    PartDelta, PartRef, PieceRef, Recipe, RecipeIndex, RecipeObject, SegmentRef, STRUCT_VERSION,
};
use strata_core::id::{PartId, RecipeId};

/// Object prefix of recipe parts.
pub const PARTS: &str = "parts";
/// Fewest nodes in a part before a path may cut it.
pub const MIN_NODES: usize = 64;
/// Average nodes per part the path hash aims at (a power of two).
pub const AVG_NODES: usize = 512;
/// Most nodes in a part.
pub const MAX_NODES: usize = 8192;
/// Most encoded bytes in a part (a single larger node is a part alone).
pub const MAX_PART_BYTES: usize = 4 << 20;
/// Most chunks in one piece of a file node (about 650 KB encoded): a
/// larger file is stored as several consecutive nodes of its path, so no
/// part, and no reader that goes a part at a time, holds its whole chunk
/// list. A piece ends at a segment boundary.
pub const PIECE_CHUNKS: usize = 16384;

/// The object name of part `id`.
pub fn part_name(id: &PartId) -> String {
    id.object_name()
}

/// Reads and decodes the `recipes/` object `id`.
pub fn load_object(repo: &Repository, id: &RecipeId) -> Result<RecipeObject> {
    let name = id.object_name();
    repo.read_verified(&name, |raw| {
        // Named by the hash of its bytes: another recipe stored under this
        // name (a swap by someone who can write the storage) is refused.
        if blake3::hash(raw).to_hex().as_str() != id.as_str() {
            return Err(StoreError::corrupt(
                &name,
                strata_core::CoreError::Decode {
                    what: "recipe",
                    msg: "its content does not match its name".into(),
                },
            ));
        }
        let bytes = repo
            .sealer()
            .open(Kind::Recipe, raw)
            .map_err(|e| StoreError::corrupt(&name, e))?;
        decode_recipe_object(&bytes).map_err(|e| StoreError::corrupt(&name, e))
    })
}

/// Reads a part and checks that it is the part its name says.
pub fn load_part(repo: &Repository, id: &PartId) -> Result<Recipe> {
    let bytes = part_bytes(repo, id)?;
    decode("recipe part", &bytes).map_err(|e| StoreError::corrupt(part_name(id), e))
}

/// The encoded bytes of part `id`, checked against its name: read whole,
/// or decoded from its delta against its base (itself stored whole).
pub fn part_bytes(repo: &Repository, id: &PartId) -> Result<Vec<u8>> {
    let name = part_name(id);
    let delta = repo.read_verified(&name, |raw| {
        if claimed_kind(raw) == Some(Kind::RecipePartDelta as u8) {
            return open_part_delta(repo, &name, raw).map(Err);
        }
        let bytes = repo
            .sealer()
            .open(Kind::RecipePart, raw)
            .map_err(|e| StoreError::corrupt(&name, e))?;
        check_part(repo, id, &bytes)?;
        Ok(Ok(bytes))
    })?;
    let d = match delta {
        Ok(bytes) => return Ok(bytes),
        Err(d) => d,
    };
    let base = whole_part_bytes(repo, &d.base).map_err(|e| match e {
        StoreError::NotFound(_) => StoreError::Invalid(format!(
            "{name} is a delta against {}, which is gone",
            part_name(&d.base)
        )),
        e => e,
    })?;
    let bytes =
        strata_core::delta::decode_within(&d.frame, &base, Kind::RecipePart.max_plain() as usize)
            .map_err(|e| StoreError::corrupt(&name, e))?;
    check_part(repo, id, &bytes)?;
    Ok(bytes)
}

/// The bytes of part `id`, which must be stored whole (a delta's base).
pub fn whole_part_bytes(repo: &Repository, id: &PartId) -> Result<Vec<u8>> {
    let name = part_name(id);
    repo.read_verified(&name, |raw| {
        let bytes = repo
            .sealer()
            .open(Kind::RecipePart, raw)
            .map_err(|e| StoreError::corrupt(&name, e))?;
        check_part(repo, id, &bytes)?;
        Ok(bytes)
    })
}

/// The base a part object is a delta against (None: stored whole).
pub fn part_base(repo: &Repository, id: &PartId) -> Result<Option<PartId>> {
    let name = part_name(id);
    repo.read_verified(&name, |raw| {
        if claimed_kind(raw) != Some(Kind::RecipePartDelta as u8) {
            return Ok(None);
        }
        Ok(Some(open_part_delta(repo, &name, raw)?.base))
    })
}

fn open_part_delta(repo: &Repository, name: &str, raw: &[u8]) -> Result<PartDelta> {
    let bytes = repo
        .sealer()
        .open(Kind::RecipePartDelta, raw)
        .map_err(|e| StoreError::corrupt(name, e))?;
    decode("recipe part delta", &bytes).map_err(|e| StoreError::corrupt(name, e))
}

/// Whether `bytes` are the part `id` names (its keyed hash).
fn check_part(repo: &Repository, id: &PartId, bytes: &[u8]) -> Result<()> {
    if repo.hasher().hash(bytes).to_hex() != id.as_str() {
        return Err(StoreError::corrupt(
            part_name(id),
            strata_core::CoreError::Decode {
                what: "recipe part",
                msg: "its content does not match its name".into(),
            },
        ));
    }
    Ok(())
}

/// The ids of the parts of recipe `id` (none for a version-1 recipe).
pub fn part_ids(repo: &Repository, id: &RecipeId) -> Result<Vec<PartId>> {
    Ok(match load_object(repo, id)? {
        RecipeObject::Whole(_) => vec![],
        RecipeObject::Index(i) => i.parts.into_iter().map(|p| p.id).collect(),
    })
}

/// The objects recipe `id` needs: its parts, and the bases of those
/// stored as deltas (each once).
pub fn needed_parts(repo: &Repository, id: &RecipeId) -> Result<Vec<PartId>> {
    let mut seen = HashSet::new();
    Ok(match load_object(repo, id)? {
        RecipeObject::Whole(_) => vec![],
        RecipeObject::Index(i) => i
            .parts
            .into_iter()
            .flat_map(|p| std::iter::once(p.id).chain(p.base))
            .filter(|p| seen.insert(p.clone()))
            .collect(),
    })
}

/// The containers recipe `id` references directly, without reading its
/// parts.
pub fn containers(repo: &Repository, id: &RecipeId) -> Result<Vec<ContainerId>> {
    Ok(match load_object(repo, id)? {
        RecipeObject::Whole(r) => r.containers,
        RecipeObject::Index(i) => i.containers,
    })
}

/// Calls `f` with each part of recipe `id` in order (a version-1 recipe is
/// one part), holding one part in memory at a time.
pub fn for_each_part(
    repo: &Repository,
    id: &RecipeId,
    mut f: impl FnMut(Recipe) -> Result<()>,
) -> Result<()> {
    let mut parts = Parts::open(repo, id)?;
    while let Some(p) = parts.next_part()? {
        f(p)?;
    }
    Ok(())
}

/// The parts of one recipe, read one at a time and checked as they come:
/// nodes in order across parts, each part as long as its recipe says.
pub struct Parts<'r> {
    repo: &'r Repository,
    /// A version-1 recipe: its one part, not yet handed out.
    whole: Option<Recipe>,
    parts: std::collections::VecDeque<PartRef>,
    /// Whether files may be continued (structure version 3).
    continued: bool,
    /// Path and kind of the last node handed out.
    last: Option<(Vec<u8>, NodeKind)>,
    /// Where the next piece of the last node's file begins.
    file_at: Option<u64>,
}

impl Repository {
    /// The whole tree of recipe `id` (all its parts) in memory; see
    /// [`crate::repo::recipe`] for reading it a part at a time.
    pub fn load_recipe(&self, id: &RecipeId) -> Result<Recipe> {
        load_whole(self, id)
    }
}

impl<'r> Parts<'r> {
    pub fn open(repo: &'r Repository, id: &RecipeId) -> Result<Self> {
        let mut p = Parts::empty(repo);
        match load_object(repo, id)? {
            RecipeObject::Whole(r) => {
                check_unique(&id.object_name(), &r.nodes)?;
                p.whole = Some(r);
            }
            RecipeObject::Index(i) => {
                p.continued = i.continued;
                p.parts = i.parts.into();
            }
        }
        Ok(p)
    }

    /// No parts.
    pub fn empty(repo: &'r Repository) -> Self {
        Parts {
            repo,
            whole: None,
            parts: Default::default(),
            continued: false,
            last: None,
            file_at: Some(0),
        }
    }

    pub fn repo(&self) -> &'r Repository {
        self.repo
    }

    /// Follows the offset of the file being read across `nodes`, and
    /// checks that a part holding one piece is the one its reference
    /// tells (a new version takes such a part over unread: what it says
    /// must hold).
    fn check_piece(&mut self, name: &str, p: &PartRef, nodes: &mut [Node]) -> Result<()> {
        for i in 0..nodes.len() {
            let continued = match i {
                0 => self
                    .last
                    .as_ref()
                    .is_some_and(|(path, k)| continues_as(path, *k, &nodes[0])),
                _ => continues(&nodes[i - 1], &nodes[i]),
            };
            let n = &mut nodes[i];
            let offset = if continued { self.file_at } else { Some(0) };
            let len: u64 = n.segments.iter().map(SegmentRef::len).sum();
            self.file_at = offset.and_then(|o| o.checked_add(len));
            let Some(told) = p.piece.as_ref().filter(|_| p.nodes == 1) else {
                continue;
            };
            let found = piece_ref(self.repo.hasher(), n, told.offset)?;
            if offset != Some(told.offset) || found != *told {
                return Err(StoreError::corrupt(
                    name.to_string(),
                    strata_core::CoreError::Decode {
                        what: "recipe part",
                        msg: format!(
                            "holds another piece of {} than its recipe says ({found:?} at {offset:?}, told {told:?})",
                            n.path_str()
                        ),
                    },
                ));
            }
        }
        if let Some(n) = nodes.last() {
            self.last = Some((n.path.clone(), n.kind));
        }
        Ok(())
    }

    /// The next part, or `None` after the last.
    pub fn next_part(&mut self) -> Result<Option<Recipe>> {
        if let Some(w) = self.whole.take() {
            return Ok(Some(w));
        }
        let Some(p) = self.parts.pop_front() else {
            return Ok(None);
        };
        let mut part = load_part(self.repo, &p.id)?;
        let name = part_name(&p.id);
        check_order(&name, &part.nodes, self.last.as_ref(), self.continued)?;
        self.check_piece(&name, &p, &mut part.nodes)?;
        if part.nodes.len() != p.nodes as usize {
            return Err(StoreError::corrupt(
                name,
                strata_core::CoreError::Decode {
                    what: "recipe part",
                    msg: format!(
                        "holds {} nodes, its recipe says {}",
                        part.nodes.len(),
                        p.nodes
                    ),
                },
            ));
        }
        Ok(Some(part))
    }
}

/// Whether `n` continues the file `prev` (a further piece of one file: see
/// [`strata_core::format::RECIPE_INDEX_CONTINUED`]).
pub fn continues(prev: &Node, n: &Node) -> bool {
    continues_as(&prev.path, prev.kind, n)
}

/// [`continues`] of a node known by its path and kind.
fn continues_as(path: &[u8], kind: NodeKind, n: &Node) -> bool {
    n.kind == NodeKind::File && kind == NodeKind::File && n.path == path
}

/// A recipe's nodes must come in strictly increasing [`path_cmp`] order,
/// each part after the one before (`after`: the previous part's last path
/// and kind), as [`RecipeWriter`] writes them: no path twice, so restore
/// never writes one path two ways — except the pieces of a continued file
/// when the recipe may hold them.
fn check_order(
    name: &str,
    nodes: &[Node],
    after: Option<&(Vec<u8>, NodeKind)>,
    continued: bool,
) -> Result<()> {
    let mut prev: Option<(&[u8], NodeKind)> = after.map(|(p, k)| (p.as_slice(), *k));
    for n in nodes {
        if let Some((p, k)) = prev {
            let piece = continued && p == n.path && k == NodeKind::File && n.kind == NodeKind::File;
            if !piece && path_cmp(p, &n.path) != std::cmp::Ordering::Less {
                return Err(out_of_order(name, &n.path, p));
            }
        }
        prev = Some((&n.path, n.kind));
    }
    Ok(())
}

/// A version-1 recipe (one object, written before parts) has no order to
/// check, but no path may appear twice.
fn check_unique(name: &str, nodes: &[Node]) -> Result<()> {
    let mut seen = HashSet::with_capacity(nodes.len());
    for n in nodes {
        if !seen.insert(n.path.as_slice()) {
            return Err(out_of_order(name, &n.path, &n.path));
        }
    }
    Ok(())
}

/// Whether two nodes agree on everything but their segments (the pieces
/// of one file must).
fn same_but_segments(a: &mut Node, b: &mut Node) -> bool {
    let (sa, sb) = (
        std::mem::take(&mut a.segments),
        std::mem::take(&mut b.segments),
    );
    let same = a == b;
    (a.segments, b.segments) = (sa, sb);
    same
}

/// Appends `n` to `nodes`, joining it to the last node when it continues
/// that file: one node per path, as a whole tree in memory has it. The
/// pieces of a file must agree on everything but their segments. Returns
/// whether `n` was joined to the node before.
pub fn append_joined(nodes: &mut Vec<Node>, mut n: Node) -> Result<bool> {
    if let Some(last) = nodes.last_mut().filter(|l| continues(l, &n)) {
        if !same_but_segments(last, &mut n) {
            return Err(disagreeing_pieces(&n));
        }
        last.segments.append(&mut n.segments);
        return Ok(true);
    }
    nodes.push(n);
    Ok(false)
}

fn disagreeing_pieces(n: &Node) -> StoreError {
    StoreError::Invalid(format!(
        "the pieces of {} in its recipe disagree on its metadata; run `strata check`",
        n.path_str()
    ))
}

fn out_of_order(name: &str, path: &[u8], after: &[u8]) -> StoreError {
    let lossy = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    StoreError::corrupt(
        name,
        strata_core::CoreError::Decode {
            what: "recipe",
            msg: if path == after {
                format!("path {} appears twice", lossy(path))
            } else {
                format!("path {} comes after {}", lossy(path), lossy(after))
            },
        },
    )
}

/// The whole tree of recipe `id` in memory: its parts' nodes in order,
/// their references renumbered into one container table.
pub fn load_whole(repo: &Repository, id: &RecipeId) -> Result<Recipe> {
    let mut nodes = Vec::new();
    let containers = for_each_piece(repo, id, |n, _| append_joined(&mut nodes, n).map(drop))?;
    Ok(Recipe { containers, nodes })
}

/// Recipe `id`'s nodes without their chunks (a file once, however many
/// pieces hold it), and the container table [`for_each_piece`] numbers
/// references in: the tree's metadata in memory, whatever its data.
pub fn load_skeleton(repo: &Repository, id: &RecipeId) -> Result<Recipe> {
    let mut nodes = Vec::new();
    let containers = for_each_piece(repo, id, |mut n, _| {
        n.segments = Vec::new();
        append_joined(&mut nodes, n).map(drop)
    })?;
    Ok(Recipe { containers, nodes })
}

/// Calls `f` with each node of recipe `id` as its parts hold it, one part
/// in memory at a time: a file stored in pieces comes as several nodes of
/// its path, one after another, each with the offset in the file where
/// its chunks begin (0 for a file in one piece). Direct references are
/// renumbered into one container table for the whole recipe, which is
/// returned: the same for every call on the same recipe (the table of
/// [`load_whole`] and [`load_skeleton`]).
pub fn for_each_piece(
    repo: &Repository,
    id: &RecipeId,
    mut f: impl FnMut(Node, u64) -> Result<()>,
) -> Result<Vec<ContainerId>> {
    for_each_piece_in_part(repo, id, |n, offset, _, _| f(n, offset))
}

/// [`for_each_piece`], each node with the number of the part that holds
/// it (its place in the recipe's list of parts; 0 for a version-1
/// recipe) and the container table as far as it is built (every
/// reference of the node is in it).
pub fn for_each_piece_in_part(
    repo: &Repository,
    id: &RecipeId,
    mut f: impl FnMut(Node, u64, usize, &[ContainerId]) -> Result<()>,
) -> Result<Vec<ContainerId>> {
    let mut part_no = 0;
    let mut containers: Vec<ContainerId> = Vec::new();
    let mut table: HashMap<ContainerId, u32> = HashMap::new();
    // The last node handed on and where its chunks end in its file.
    // The last file handed on (without its chunks) and where its chunks
    // end: a further piece must agree with it on everything else.
    let mut last: Option<(Node, u64)> = None;
    for_each_part(repo, id, |part| {
        let map: Vec<u32> = part
            .containers
            .iter()
            .map(|c| {
                *table.entry(*c).or_insert_with(|| {
                    containers.push(*c);
                    containers.len() as u32 - 1
                })
            })
            .collect();
        for mut n in part.nodes {
            renumber(&mut n, |i| map.get(i as usize).copied())?;
            let offset = match &mut last {
                Some((prev, end)) if continues(prev, &n) => {
                    if !same_but_segments(prev, &mut n) {
                        return Err(disagreeing_pieces(&n));
                    }
                    *end
                }
                _ => 0,
            };
            let end = n
                .segments
                .iter()
                .map(SegmentRef::len)
                .try_fold(offset, u64::checked_add)
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "the recipe of {} is longer than a file can be; run `strata check`",
                        n.path_str()
                    ))
                })?;
            last = (n.kind == NodeKind::File).then(|| {
                let segments = std::mem::take(&mut n.segments);
                let meta = n.clone();
                n.segments = segments;
                (meta, end)
            });
            f(n, offset, part_no, &containers)?;
        }
        part_no += 1;
        Ok(())
    })?;
    Ok(containers)
}

/// Calls `f` with every segment of recipe `id`, one part in memory at a
/// time, and the container table as far as it is built (the segment's
/// direct references index it; see [`for_each_piece`]). For walks that
/// need the references but not the tree: marking, statistics.
pub fn for_each_segment(
    repo: &Repository,
    id: &RecipeId,
    mut f: impl FnMut(&SegmentRef, &[ContainerId]) -> Result<()>,
) -> Result<Vec<ContainerId>> {
    for_each_piece_in_part(repo, id, |n, _, _, table| {
        n.segments.iter().try_for_each(|s| f(s, table))
    })
}

/// Renumbers the direct references of `n` with `map` (an unknown index is
/// damage).
fn renumber(n: &mut Node, map: impl Fn(u32) -> Option<u32>) -> Result<()> {
    let path = &n.path;
    for s in &mut n.segments {
        for c in &mut s.chunks {
            if c.is_direct() {
                c.container = map(c.container).ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "the recipe of {} references a container its part does not list",
                        String::from_utf8_lossy(path)
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// Deletes the recipes among `candidates` that no snapshot uses any more,
/// and their parts no remaining recipe shares. Returns how many recipes
/// were deleted. When a snapshot cannot be read its parts are unknown, so
/// parts are left for `gc` (which refuses to run until that is repaired).
pub fn delete_unused<'a>(
    repo: &Repository,
    candidates: impl IntoIterator<Item = &'a RecipeId>,
) -> Result<u64> {
    let (snaps, damaged) = repo.list_snapshots_tolerant()?;
    let live: HashSet<&RecipeId> = snaps.iter().flat_map(|(_, s)| s.recipes()).collect();
    let dead: HashSet<&RecipeId> = candidates
        .into_iter()
        .filter(|r| !live.contains(r))
        .collect();
    let mut dead_parts: HashSet<PartId> = HashSet::new();
    for r in &dead {
        // An unreadable recipe's parts are left to gc.
        if let Ok(ids) = needed_parts(repo, r) {
            dead_parts.extend(ids);
        }
    }
    for r in &dead {
        repo.backend().delete(&r.object_name())?;
    }
    if dead_parts.is_empty() || !damaged.is_empty() {
        return Ok(dead.len() as u64);
    }
    for r in live {
        for p in needed_parts(repo, r)? {
            dead_parts.remove(&p);
        }
    }
    for p in dead_parts {
        repo.backend().delete(&part_name(&p))?;
    }
    Ok(dead.len() as u64)
}

/// Every part the recipes `ids` use.
pub fn live_parts<'a>(
    repo: &Repository,
    ids: impl IntoIterator<Item = &'a RecipeId>,
) -> Result<HashSet<PartId>> {
    let mut out = HashSet::new();
    let mut seen = HashSet::new();
    for id in ids {
        if seen.insert(id) {
            out.extend(needed_parts(repo, id)?);
        }
    }
    Ok(out)
}

/// `node` (a file or a piece of one, with its segments) as the piece
/// beginning at byte `offset` of its file (see [`PieceRef`]).
pub fn piece_ref(hasher: &strata_core::Hasher, node: &mut Node, offset: u64) -> Result<PieceRef> {
    let segments = std::mem::take(&mut node.segments);
    let meta = postcard::to_allocvec(&*node);
    node.segments = segments;
    let meta = hasher
        .hash(&meta.map_err(|e| StoreError::Invalid(format!("cannot encode a recipe node: {e}")))?);
    let lens: Vec<u64> = node.segments.iter().map(|s| s.len()).collect();
    let segment = match lens.split_last() {
        Some((&last, rest)) => {
            let l = rest.first().copied().unwrap_or(last);
            let even = rest.iter().all(|&x| x == l) && last <= l && last > 0;
            u32::try_from(l).ok().filter(|_| even).unwrap_or(0)
        }
        None => 0,
    };
    let direct = node
        .segments
        .iter()
        .flat_map(|s| &s.chunks)
        .filter(|c| c.is_direct());
    let (direct_chunks, direct_bytes) = direct.fold((0, 0), |(n, b), c| (n + 1, b + c.len as u64));
    Ok(PieceRef {
        offset,
        len: lens.iter().sum(),
        meta,
        segment,
        direct_chunks,
        direct_bytes,
    })
}

#[cfg(test)]
mod tests;
