//! Recipes in parts (DESIGN.md "Vocabulary": recipe).
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

use crate::error::{Result, StoreError};
use crate::repo::Repository;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{
    decode, decode_recipe_object, encode_recipe_index, path_cmp, ContainerId, Node, NodeKind,
    PartRef, PieceRef, Recipe, RecipeIndex, RecipeObject, SegmentRef, STRUCT_VERSION,
};

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
pub fn part_name(id: &str) -> String {
    format!("{PARTS}/{id}")
}

/// Whether `id` is a well-formed part or recipe id (64 lowercase hex
/// digits): names read from the repository are checked before they are
/// used as object names.
pub fn valid_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn bad_id(what: &str, id: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{what} names an object {:?} that is not a valid id; run `strata check`",
        id.chars().take(80).collect::<String>()
    ))
}

/// Reads and decodes the `recipes/` object `id`.
pub fn load_object(repo: &Repository, id: &str) -> Result<RecipeObject> {
    if !valid_id(id) {
        return Err(bad_id("a snapshot", id));
    }
    let name = format!("recipes/{id}");
    repo.read_verified(&name, |raw| {
        // Named by the hash of its bytes: another recipe stored under this
        // name (a swap by someone who can write the storage) is refused.
        if blake3::hash(raw).to_hex().as_str() != id {
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
pub fn load_part(repo: &Repository, id: &str) -> Result<Recipe> {
    if !valid_id(id) {
        return Err(bad_id("a recipe", id));
    }
    let name = part_name(id);
    repo.read_verified(&name, |raw| {
        let bytes = repo
            .sealer()
            .open(Kind::RecipePart, raw)
            .map_err(|e| StoreError::corrupt(&name, e))?;
        if repo.hasher().hash(&bytes).to_hex() != id {
            return Err(StoreError::corrupt(
                &name,
                strata_core::CoreError::Decode {
                    what: "recipe part",
                    msg: "its content does not match its name".into(),
                },
            ));
        }
        decode("recipe part", &bytes).map_err(|e| StoreError::corrupt(&name, e))
    })
}

/// The ids of the parts of recipe `id` (none for a version-1 recipe).
pub fn part_ids(repo: &Repository, id: &str) -> Result<Vec<String>> {
    Ok(match load_object(repo, id)? {
        RecipeObject::Whole(_) => vec![],
        RecipeObject::Index(i) => i.parts.into_iter().map(|p| p.id).collect(),
    })
}

/// The containers recipe `id` references directly, without reading its
/// parts.
pub fn containers(repo: &Repository, id: &str) -> Result<Vec<ContainerId>> {
    Ok(match load_object(repo, id)? {
        RecipeObject::Whole(r) => r.containers,
        RecipeObject::Index(i) => i.containers,
    })
}

/// Calls `f` with each part of recipe `id` in order (a version-1 recipe is
/// one part), holding one part in memory at a time.
pub fn for_each_part(
    repo: &Repository,
    id: &str,
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

impl<'r> Parts<'r> {
    pub fn open(repo: &'r Repository, id: &str) -> Result<Self> {
        let mut p = Parts::empty(repo);
        match load_object(repo, id)? {
            RecipeObject::Whole(r) => {
                check_unique(&format!("recipes/{id}"), &r.nodes)?;
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
pub fn load_whole(repo: &Repository, id: &str) -> Result<Recipe> {
    let mut nodes = Vec::new();
    let containers = for_each_piece(repo, id, |n, _| append_joined(&mut nodes, n).map(drop))?;
    Ok(Recipe { containers, nodes })
}

/// Recipe `id`'s nodes without their chunks (a file once, however many
/// pieces hold it), and the container table [`for_each_piece`] numbers
/// references in: the tree's metadata in memory, whatever its data.
pub fn load_skeleton(repo: &Repository, id: &str) -> Result<Recipe> {
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
    id: &str,
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
    id: &str,
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
    id: &str,
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

/// Writes a recipe a part at a time. Nodes come in [`path_cmp`] order;
/// each is encoded as it arrives, so a part in the making is bytes, not
/// nodes. Parts that exist already (an unchanged subtree of an earlier
/// version) are not written again.
pub struct RecipeWriter<'r> {
    repo: &'r Repository,
    index: RecipeIndex,
    union: HashMap<ContainerId, u32>,
    /// The part being filled: its container table, encoded nodes, count.
    table: Vec<ContainerId>,
    local: HashMap<ContainerId, u32>,
    body: Vec<u8>,
    count: usize,
    first: Vec<u8>,
    /// The last node pushed, without its segments (a further piece of its
    /// file must match it).
    last: Option<Node>,
    /// Bytes of the objects written (parts and, at the end, the index).
    pub stored_bytes: u64,
    /// Of which, to the repository written to (not the mirror).
    pub primary_bytes: u64,
    pub parts_written: u64,
    pub parts_reused: u64,
    pub nodes: u64,
    /// Parts known to be damaged: written again even though they exist.
    suspects: Arc<Mutex<HashSet<String>>>,
    /// Another repository with the same keys (the cloud tier) that gets
    /// the same objects — the same bytes under the same names.
    mirror: Option<&'r Repository>,
    /// Encoded bytes at which a part ends ([`MAX_PART_BYTES`]).
    part_bytes: usize,
    /// Parts taken over unread ([`Self::push_part`]).
    carried: Vec<String>,
    /// Where the next piece of the last node's file begins (none: not
    /// known, after a part taken over that did not say).
    file_at: Option<u64>,
    /// The first node of the part being filled, as a [`PieceRef`]: the
    /// part's piece if it stays the only node.
    first_piece: Option<PieceRef>,
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

impl<'r> RecipeWriter<'r> {
    pub fn new(repo: &'r Repository) -> Self {
        RecipeWriter {
            repo,
            index: RecipeIndex::default(),
            union: HashMap::new(),
            table: Vec::new(),
            local: HashMap::new(),
            body: Vec::new(),
            count: 0,
            first: Vec::new(),
            last: None,
            stored_bytes: 0,
            primary_bytes: 0,
            parts_written: 0,
            parts_reused: 0,
            nodes: 0,
            suspects: Arc::default(),
            mirror: None,
            part_bytes: MAX_PART_BYTES,
            carried: Vec::new(),
            file_at: Some(0),
            first_piece: None,
        }
    }

    /// Ends parts at `bytes` encoded bytes instead of [`MAX_PART_BYTES`]
    /// (at least one piece): a writer under a memory cap (a fleet stage)
    /// holds and seals smaller parts.
    pub fn with_part_bytes(mut self, bytes: usize) -> Self {
        self.part_bytes = bytes.clamp(64 << 10, MAX_PART_BYTES);
        self
    }

    /// Writes every object to `mirror` too, byte for byte (the recipe of a
    /// version moving to the cloud tier, kept on both sides).
    pub fn with_mirror(mut self, mirror: &'r Repository) -> Self {
        self.mirror = Some(mirror);
        self
    }

    /// Parts not to reuse even if they exist (found damaged by whoever
    /// shares the set), so writing them again repairs them.
    pub fn with_suspects(mut self, suspects: Arc<Mutex<HashSet<String>>>) -> Self {
        self.suspects = suspects;
        self
    }

    /// Adds the next node. Its direct references hold indexes that
    /// `container_of` turns into container ids. A file of more than
    /// [`PIECE_CHUNKS`] chunks is stored in pieces; a file node with the
    /// path of the file node before it continues that file (a caller
    /// that builds a large file's chunk list as it goes pushes it a piece
    /// at a time, each piece with the same metadata).
    pub fn push(
        &mut self,
        mut node: Node,
        container_of: impl Fn(u32) -> Option<ContainerId>,
    ) -> Result<()> {
        let chunks: u64 = node.segments.iter().map(SegmentRef::chunk_count).sum();
        if chunks <= PIECE_CHUNKS as u64 {
            return self.push_piece(node, &container_of);
        }
        let segments = std::mem::take(&mut node.segments);
        let mut piece = Vec::new();
        let mut count = 0;
        for s in segments {
            count += s.chunk_count();
            piece.push(s);
            if count >= PIECE_CHUNKS as u64 {
                let segments = std::mem::take(&mut piece);
                self.push_piece(
                    Node {
                        segments,
                        ..node.clone()
                    },
                    &container_of,
                )?;
                count = 0;
            }
        }
        if !piece.is_empty() {
            self.push_piece(
                Node {
                    segments: piece,
                    ..node
                },
                &container_of,
            )?;
        }
        Ok(())
    }

    fn push_piece(
        &mut self,
        mut node: Node,
        container_of: &impl Fn(u32) -> Option<ContainerId>,
    ) -> Result<()> {
        let mut offset = Some(0);
        if let Some(last) = &mut self.last {
            if continues(last, &node) {
                if !same_but_segments(last, &mut node) {
                    return Err(StoreError::Invalid(format!(
                        "recipe nodes: {} twice, not as pieces of one file",
                        node.path_str()
                    )));
                }
                self.index.continued = true;
                offset = self.file_at;
            } else if path_cmp(&last.path, &node.path) != std::cmp::Ordering::Less {
                return Err(StoreError::Invalid(format!(
                    "recipe nodes out of order: {} after {}",
                    node.path_str(),
                    last.path_str()
                )));
            }
        }
        for s in &mut node.segments {
            for c in &mut s.chunks {
                if !c.is_direct() {
                    continue;
                }
                let id = container_of(c.container).ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "{} references container {} of a table that does not have it",
                        String::from_utf8_lossy(&node.path),
                        c.container
                    ))
                })?;
                c.container = *self.local.entry(id).or_insert_with(|| {
                    self.table.push(id);
                    self.table.len() as u32 - 1
                });
            }
        }
        if self.count == 0 {
            self.first = node.path.clone();
        }
        let file = node.kind == NodeKind::File;
        let len: u64 = node.segments.iter().map(SegmentRef::len).sum();
        self.file_at = offset.filter(|_| file).and_then(|at| at.checked_add(len));
        // (Only a part's first node may be its only one.)
        self.first_piece = match (self.count, offset) {
            (0, Some(at)) if file => Some(piece_ref(self.repo.hasher(), &mut node, at)?),
            _ => None,
        };
        postcard::to_extend(&node, std::mem::take(&mut self.body))
            .map(|b| self.body = b)
            .map_err(|e| StoreError::Invalid(format!("cannot encode a recipe node: {e}")))?;
        self.count += 1;
        self.nodes += 1;
        // A whole piece of a large file is a part of its own: a version
        // that changes a few of the file's blocks (a disk image) writes
        // the parts of those pieces again, not their neighbours'.
        let whole_piece = node
            .segments
            .iter()
            .map(SegmentRef::chunk_count)
            .sum::<u64>()
            >= PIECE_CHUNKS as u64;
        // The node's chunk list goes before the part is sealed: a single
        // large file's node is most of a part, and would otherwise be held
        // beside its encoding and the sealed part.
        node.segments = Vec::new();
        let cut = self.count >= MAX_NODES
            || whole_piece
            || self.body.len() >= self.part_bytes
            || (self.count >= MIN_NODES && path_cuts(self.repo, &node.path));
        self.last = Some(node);
        if cut {
            self.cut()?;
        }
        Ok(())
    }

    /// Adds a part of an earlier version as it is, without decoding or
    /// writing it: `part` (its container indexes left out) with its
    /// container table `containers`, holding one piece of the file `node`
    /// (whose metadata it must have). It goes where a piece of `node`
    /// would, after whole pieces only (no part in the making): the caller
    /// knows the part holds exactly what [`Self::push`] would have written
    /// for the piece — the same bytes under the same name.
    pub fn push_part(
        &mut self,
        part: &PartRef,
        containers: &[ContainerId],
        node: &Node,
    ) -> Result<()> {
        // The piece it holds, if the part says (or the caller knew).
        let piece = part
            .piece
            .clone()
            .filter(|p| Some(p.offset) == self.file_at);
        if self.mirror.is_some() {
            return Err(StoreError::Invalid(format!(
                "a part of {} taken over by a writer with a mirror (which would not have it)",
                node.path_str()
            )));
        }
        // A part may end after any node: the one in the making ends here.
        self.cut()?;
        match &mut self.last {
            Some(last) if continues(last, node) => {
                let mut n = Node {
                    segments: Vec::new(),
                    ..node.clone()
                };
                if !same_but_segments(last, &mut n) {
                    return Err(StoreError::Invalid(format!(
                        "a part of {} taken over with other metadata",
                        node.path_str()
                    )));
                }
            }
            _ => {
                return Err(StoreError::Invalid(format!(
                    "a part of {} taken over before its first piece",
                    node.path_str()
                )))
            }
        }
        self.index.continued = true;
        let containers = union_indexes(&mut self.union, &mut self.index, containers);
        self.file_at = piece.as_ref().and_then(|p| p.offset.checked_add(p.len));
        self.index.parts.push(PartRef {
            containers,
            piece,
            ..part.clone()
        });
        self.nodes += part.nodes as u64;
        self.parts_reused += 1;
        self.carried.push(part.id.clone());
        Ok(())
    }

    /// Adds every node of `recipe` (sorting them first).
    pub fn push_recipe(&mut self, mut recipe: Recipe) -> Result<()> {
        recipe.nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
        let table = std::mem::take(&mut recipe.containers);
        for n in recipe.nodes {
            self.push(n, |i| table.get(i as usize).copied())?;
        }
        Ok(())
    }

    /// Closes the part being filled: encodes it, names it and writes it
    /// unless it exists.
    fn cut(&mut self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        // A `Recipe` in the structure encoding: version byte, container
        // table, node count, nodes (postcard: a sequence is its length as
        // a varint, then its elements).
        let mut head = vec![STRUCT_VERSION];
        head = postcard::to_extend(&self.table, head)
            .and_then(|b| postcard::to_extend(&self.count, b))
            .map_err(|e| StoreError::Invalid(format!("cannot encode a recipe part: {e}")))?;
        // The header goes in front of the encoded nodes in place: a large
        // part is not held twice.
        let mut bytes = std::mem::take(&mut self.body);
        bytes.splice(0..0, head);
        let id = self.repo.hasher().hash(&bytes).to_hex();
        let name = part_name(&id);
        let suspect = self
            .suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id);
        let mut env = None;
        for repo in std::iter::once(self.repo).chain(self.mirror) {
            if !suspect && repo.backend().size(&name)?.is_some() {
                self.parts_reused += 1;
                continue;
            }
            if env.is_none() {
                env = Some(self.repo.sealer().seal(Kind::RecipePart, &bytes, true)?);
            }
            let e = env.as_deref().unwrap_or_default();
            repo.backend().put(&name, e)?;
            self.stored_bytes += e.len() as u64;
            if std::ptr::eq(repo, self.repo) {
                self.primary_bytes += e.len() as u64;
            }
            self.parts_written += 1;
        }
        let containers = union_indexes(&mut self.union, &mut self.index, &self.table);
        let piece = self.first_piece.take().filter(|_| self.count == 1);
        self.index.parts.push(PartRef {
            id,
            first: std::mem::take(&mut self.first),
            nodes: self.count as u32,
            containers,
            piece,
        });
        self.table.clear();
        self.local.clear();
        drop(env);
        self.body = bytes;
        self.body.clear();
        if self.body.capacity() > 2 * self.part_bytes {
            self.body.shrink_to(self.part_bytes);
        }
        self.count = 0;
        Ok(())
    }

    /// Writes the last part and the recipe object; returns the recipe id
    /// and the bytes written in all. The caller commits a snapshot naming
    /// it.
    pub fn finish(self) -> Result<(String, u64)> {
        let mut total = 0;
        let id = self.finish_inner(&mut total)?.0;
        Ok((id, total))
    }

    /// [`Self::finish`], returning the bytes written to the repository
    /// written to alone (not the mirror).
    pub fn finish_primary(self) -> Result<(String, u64)> {
        self.finish_inner(&mut 0)
    }

    fn finish_inner(mut self, total: &mut u64) -> Result<(String, u64)> {
        self.cut()?;
        // A part taken over unread that a later read found damaged (the
        // same part can hold several identical pieces): not committed.
        {
            let suspects = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(id) = self.carried.iter().find(|id| suspects.contains(*id)) {
                return Err(StoreError::Invalid(format!(
                    "recipe part {id}, taken over from the previous version, was found damaged: nothing committed; run the backup again (it will write the part anew)"
                )));
            }
        }
        let bytes = encode_recipe_index(&self.index)?;
        let env = self.repo.sealer().seal(Kind::Recipe, &bytes, true)?;
        let id = blake3::hash(&env).to_hex().to_string();
        for repo in std::iter::once(self.repo).chain(self.mirror) {
            repo.backend().put(&format!("recipes/{id}"), &env)?;
            self.stored_bytes += env.len() as u64;
            if std::ptr::eq(repo, self.repo) {
                self.primary_bytes += env.len() as u64;
            }
        }
        *total = self.stored_bytes;
        Ok((id, self.primary_bytes))
    }
}

/// A part's container table as indexes into the recipe's union table
/// (`union`: id → index), which gets the ids it lacks.
fn union_indexes(
    union: &mut HashMap<ContainerId, u32>,
    index: &mut RecipeIndex,
    ids: &[ContainerId],
) -> Vec<u32> {
    ids.iter()
        .map(|c| {
            *union.entry(*c).or_insert_with(|| {
                index.containers.push(*c);
                index.containers.len() as u32 - 1
            })
        })
        .collect()
}

/// Whether a part may end after the node at `path` (about 1 in
/// [`AVG_NODES`] paths).
fn path_cuts(repo: &Repository, path: &[u8]) -> bool {
    let h = repo.hasher().hash(path);
    (u16::from_le_bytes([h.0[0], h.0[1]]) as usize).is_multiple_of(AVG_NODES)
}

/// Stores a whole in-memory recipe in parts; returns its id and the bytes
/// written.
pub fn put(repo: &Repository, recipe: Recipe) -> Result<(String, u64)> {
    let mut w = RecipeWriter::new(repo);
    w.push_recipe(recipe)?;
    w.finish()
}

/// Deletes the recipes among `candidates` that no snapshot uses any more,
/// and their parts no remaining recipe shares. Returns how many recipes
/// were deleted. When a snapshot cannot be read its parts are unknown, so
/// parts are left for `gc` (which refuses to run until that is repaired).
pub fn delete_unused<'a>(
    repo: &Repository,
    candidates: impl IntoIterator<Item = &'a String>,
) -> Result<u64> {
    let (snaps, damaged) = repo.list_snapshots_tolerant()?;
    let live: HashSet<&str> = snaps
        .iter()
        .flat_map(|(_, s)| s.recipes())
        .map(String::as_str)
        .collect();
    let dead: HashSet<&String> = candidates
        .into_iter()
        .filter(|r| !live.contains(r.as_str()))
        .collect();
    let mut dead_parts: HashSet<String> = HashSet::new();
    for r in &dead {
        // An unreadable recipe's parts are left to gc.
        if let Ok(ids) = part_ids(repo, r) {
            dead_parts.extend(ids);
        }
    }
    for r in &dead {
        repo.backend().delete(&format!("recipes/{r}"))?;
    }
    if dead_parts.is_empty() || !damaged.is_empty() {
        return Ok(dead.len() as u64);
    }
    for r in live {
        for p in part_ids(repo, r)? {
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
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    let mut seen = HashSet::new();
    for id in ids {
        if seen.insert(id) {
            out.extend(part_ids(repo, id)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LocalBackend;
    use crate::repo::InitOptions;
    use std::sync::Arc;
    use strata_core::format::{ChunkRef, NodeKind, SegmentRef};
    use strata_core::Fingerprint;

    fn repo(dir: &std::path::Path) -> Repository {
        Repository::init(Arc::new(LocalBackend::new(dir)), InitOptions::default()).unwrap()
    }

    fn node(path: &str, container: u32) -> Node {
        Node {
            mode: 0o644,
            size: 5,
            segments: vec![SegmentRef {
                fp: Fingerprint([1; 32]),
                chunks: vec![ChunkRef {
                    fp: Fingerprint([2; 32]),
                    len: 5,
                    container,
                    region: 0,
                    offset: 0,
                }],
            }],
            ..Node::new(path.as_bytes().to_vec(), NodeKind::File)
        }
    }

    fn tree(n: usize) -> Recipe {
        Recipe {
            containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
            nodes: (0..n)
                .map(|i| node(&format!("d{}/f{i:05}", i % 7), (i % 4) as u32))
                .collect(),
        }
    }

    /// The container each node's reference names, by path.
    fn refs(r: &Recipe) -> Vec<(Vec<u8>, ContainerId)> {
        let mut v: Vec<_> = r
            .nodes
            .iter()
            .map(|n| {
                (
                    n.path.clone(),
                    r.containers[n.segments[0].chunks[0].container as usize],
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn parts_round_trip_and_are_shared() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let t = tree(5000);
        let (id, _) = put(&repo, t.clone()).unwrap();
        let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
            panic!("a new recipe is an index")
        };
        assert!(idx.parts.len() > 2, "{} parts", idx.parts.len());
        let back = load_whole(&repo, &id).unwrap();
        assert_eq!(back.nodes.len(), 5000);
        assert_eq!(refs(&back), refs(&t));
        assert!(back
            .nodes
            .windows(2)
            .all(|w| path_cmp(&w[0].path, &w[1].path).is_lt()));
        // One file changed: most parts are those of the first version.
        let mut t2 = t.clone();
        t2.nodes[2500].size = 6;
        let mut w = RecipeWriter::new(&repo);
        w.push_recipe(t2).unwrap();
        let (written, reused) = (w.parts_written, w.parts_reused);
        let (id2, _) = w.finish().unwrap();
        assert_eq!(written, 1, "{reused} reused");
        assert!(reused >= 2);
        // Deleting the first recipe keeps the parts the second uses.
        assert_eq!(delete_unused(&repo, [&id, &id2]).unwrap(), 2);
        assert!(repo.backend().list("parts/").unwrap().is_empty());
    }

    #[test]
    fn version_1_recipes_still_read() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let t = tree(10);
        let (id, _) = repo.put_struct(Kind::Recipe, "recipes", &t).unwrap();
        assert_eq!(load_whole(&repo, &id).unwrap(), t);
        assert!(part_ids(&repo, &id).unwrap().is_empty());
    }

    /// A crafted recipe naming one path twice (version 1), or with its
    /// parts swapped (each part intact), is refused, not restored twice.
    #[test]
    fn duplicate_and_disordered_paths_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let mut t = tree(10);
        t.nodes[5].path = t.nodes[3].path.clone();
        let (id, _) = repo.put_struct(Kind::Recipe, "recipes", &t).unwrap();
        let e = load_whole(&repo, &id).unwrap_err().to_string();
        assert!(e.contains("appears twice") && e.contains(&id), "{e}");

        let (id, _) = put(&repo, tree(3000)).unwrap();
        let RecipeObject::Index(mut idx) = load_object(&repo, &id).unwrap() else {
            panic!("a new recipe is an index")
        };
        idx.parts.swap(0, 1);
        let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
        let (bad, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
        let e = load_whole(&repo, &bad).unwrap_err().to_string();
        assert!(e.contains("comes after"), "{e}");
        assert!(
            e.contains(&part_name(&idx.parts[1].id)) || e.contains("parts/"),
            "{e}"
        );
    }

    #[test]
    fn bad_names_and_swapped_parts_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        // A whole recipe stored under another recipe's name.
        let (r1, _) = put(&repo, tree(10)).unwrap();
        let (r2, _) = put(&repo, tree(20)).unwrap();
        let other = repo.backend().get(&format!("recipes/{r2}")).unwrap();
        repo.backend()
            .put(&format!("recipes/{r1}"), &other)
            .unwrap();
        let e = load_whole(&repo, &r1).unwrap_err().to_string();
        assert!(e.contains("does not match its name"), "{e}");
        assert!(load_object(&repo, "../config").is_err());
        assert!(load_part(&repo, "../../etc/passwd").is_err());
        let (id, _) = put(&repo, tree(3000)).unwrap();
        let ids = part_ids(&repo, &id).unwrap();
        let (a, b) = (part_name(&ids[0]), part_name(&ids[1]));
        let other = repo.backend().get(&b).unwrap();
        repo.backend().put(&a, &other).unwrap();
        let e = load_whole(&repo, &id).unwrap_err().to_string();
        assert!(e.contains("does not match its name"), "{e}");
    }

    #[test]
    fn out_of_order_nodes_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let mut w = RecipeWriter::new(&repo);
        w.push(node("b", 0), |_| Some(ContainerId([0; 16])))
            .unwrap();
        assert!(w
            .push(node("a", 0), |_| Some(ContainerId([0; 16])))
            .is_err());
    }

    /// A file of `segments` segments of 512 chunks each (the pieces cut
    /// every [`PIECE_CHUNKS`] chunks), its chunks spread over 4 containers.
    fn big_file(path: &str, segments: usize) -> Node {
        let segments: Vec<SegmentRef> = (0..segments)
            .map(|s| SegmentRef {
                fp: Fingerprint([s as u8; 32]),
                chunks: (0..512u32)
                    .map(|c| ChunkRef {
                        fp: Fingerprint([(c % 251) as u8; 32]),
                        len: 4096,
                        container: (s as u32 + c) % 4,
                        region: s as u32,
                        offset: c * 4096,
                    })
                    .collect(),
            })
            .collect();
        let size = segments.iter().map(SegmentRef::len).sum();
        Node {
            mode: 0o600,
            size,
            segments,
            ..Node::new(path.as_bytes().to_vec(), NodeKind::File)
        }
    }

    /// Each whole piece of a large file is a part of its own: a version
    /// that changes one chunk of the file writes one part again (the
    /// piece's), and shares all the others with the version before.
    #[test]
    fn a_changed_piece_is_the_only_part_written_again() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let mut t = Recipe {
            nodes: vec![big_file("vm.img", 256)], // 131072 chunks: 8 pieces
            containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
        };
        let (v1, _) = put(&repo, t.clone()).unwrap();
        let p1 = part_ids(&repo, &v1).unwrap();
        assert_eq!(p1.len(), 8, "one part per piece");
        t.nodes[0].segments[100].chunks[7].offset += 1;
        let (v2, _) = put(&repo, t).unwrap();
        let p2 = part_ids(&repo, &v2).unwrap();
        let new: Vec<_> = p2.iter().filter(|p| !p1.contains(p)).collect();
        assert_eq!(new.len(), 1, "{new:?}");
    }

    /// Each whole piece's part reference tells the piece (structure
    /// version 4): where it begins, its bytes and segments, its metadata's
    /// hash; a reference telling another piece than its part holds (which
    /// a new version would take over unread) is refused by every reader.
    #[test]
    fn a_part_tells_its_piece_and_a_wrong_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let t = Recipe {
            nodes: vec![big_file("vm.img", 96)], // 3 pieces
            containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
        };
        let (id, _) = put(&repo, t).unwrap();
        let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
            panic!("a new recipe is an index")
        };
        assert!(idx.continued, "pieces");
        let told: Vec<(u64, u64, u32, u64)> = idx
            .parts
            .iter()
            .map(|p| p.piece.as_ref().expect("each part holds a piece"))
            .map(|p| (p.offset, p.len, p.segment, p.direct_chunks))
            .collect();
        let piece = 32 * (2 << 20);
        assert_eq!(
            told,
            [0, 1, 2]
                .map(|k| (k * piece, piece, 2 << 20, 16384))
                .to_vec()
        );
        assert!(load_whole(&repo, &id).is_ok());
        for bad in 0..3 {
            let mut idx = idx.clone();
            let p = idx.parts[1].piece.as_mut().unwrap();
            match bad {
                0 => p.offset += 4096,
                1 => p.meta = Fingerprint([9; 32]),
                _ => p.len -= 4096,
            }
            let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
            let (wrong, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
            let e = load_whole(&repo, &wrong).unwrap_err().to_string();
            assert!(e.contains("another piece"), "{bad}: {e}");
        }
    }

    /// A part taken over (`push_part`) ends the part in the making first,
    /// reads back as the file's piece, and is refused when it comes
    /// first, when its metadata differs, with a mirror, and (at the end)
    /// when it was found damaged meanwhile.
    #[test]
    fn a_part_taken_over_reads_back_and_is_checked() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let table: Vec<ContainerId> = (0..4).map(|i| ContainerId([i as u8; 16])).collect();
        let of = |i: u32| table.get(i as usize).copied();
        // An earlier version's parts: three whole pieces of vm.img.
        let (v1, _) = put(
            &repo,
            Recipe {
                nodes: vec![big_file("vm.img", 96)],
                containers: table.clone(),
            },
        )
        .unwrap();
        let old = match load_object(&repo, &v1).unwrap() {
            RecipeObject::Index(i) => i,
            RecipeObject::Whole(_) => unreachable!(),
        };
        let piece = |k: usize| {
            let p = &old.parts[k];
            let ids: Vec<ContainerId> = p
                .containers
                .iter()
                .map(|&c| old.containers[c as usize])
                .collect();
            (
                PartRef {
                    containers: Vec::new(),
                    ..p.clone()
                },
                ids,
            )
        };
        let file = big_file("vm.img", 96);
        let meta = Node {
            segments: Vec::new(),
            ..file.clone()
        };
        let first = Node {
            segments: file.segments[..32].to_vec(),
            ..meta.clone()
        };
        // Piece 0 pushed, pieces 1 and 2 taken over: the same recipe.
        let mut w = RecipeWriter::new(&repo);
        w.push(first.clone(), of).unwrap();
        for k in 1..3 {
            let (p, ids) = piece(k);
            w.push_part(&p, &ids, &meta).unwrap();
        }
        assert_eq!(w.parts_reused, 3, "piece 0 existed too");
        let (v2, _) = w.finish().unwrap();
        assert_eq!(v2, v1);
        assert!(load_whole(&repo, &v2).unwrap().nodes[0] == file);
        // After a short piece still in the making: it is cut first.
        let mut w = RecipeWriter::new(&repo);
        w.push(
            Node {
                segments: file.segments[..3].to_vec(),
                ..meta.clone()
            },
            of,
        )
        .unwrap();
        let (p, ids) = piece(1);
        w.push_part(&p, &ids, &meta).unwrap();
        assert_eq!(w.parts_written, 1);
        let got = load_whole(&repo, &w.finish().unwrap().0).unwrap();
        assert_eq!(got.nodes[0].segments.len(), 3 + 32);
        // Refused: first, other metadata, a mirror.
        let mut w = RecipeWriter::new(&repo);
        assert!(w.push_part(&p, &ids, &meta).is_err());
        w.push(first.clone(), of).unwrap();
        let other = Node {
            mtime_ns: 1,
            ..meta.clone()
        };
        assert!(w.push_part(&p, &ids, &other).is_err());
        let d2 = tempfile::tempdir().unwrap();
        let mirror = super::tests::repo(d2.path());
        let mut w = RecipeWriter::new(&repo).with_mirror(&mirror);
        w.push(first.clone(), of).unwrap();
        assert!(w.push_part(&p, &ids, &meta).is_err());
        // Found damaged before the end: nothing committed.
        let suspects: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut w = RecipeWriter::new(&repo).with_suspects(suspects.clone());
        w.push(first, of).unwrap();
        w.push_part(&p, &ids, &meta).unwrap();
        suspects.lock().unwrap().insert(p.id.clone());
        let e = w.finish().unwrap_err();
        assert!(e.to_string().contains("found damaged"), "{e}");
    }

    /// A file larger than a piece is stored as several nodes of its path
    /// (a recipe of structure version 3, over several parts) and read back
    /// as one node; pushing it a piece at a time writes the same parts.
    #[test]
    fn large_files_are_stored_in_pieces() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let mut t = tree(20);
        t.nodes.push(big_file("d3/huge", 400)); // 204800 chunks: 13 pieces
        t.nodes.push(node("d3/z", 1));
        let (id, _) = put(&repo, t.clone()).unwrap();
        let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
            panic!("a new recipe is an index")
        };
        assert!(idx.continued);
        assert!(idx.parts.len() >= 2, "{} parts", idx.parts.len());
        let mut pieces = 0;
        let mut largest = 0;
        for_each_part(&repo, &id, |p| {
            for n in &p.nodes {
                let c: usize = n.segments.iter().map(|s| s.chunks.len()).sum();
                largest = largest.max(c);
                pieces += (n.path == b"d3/huge") as usize;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(pieces, 13);
        assert!(largest <= PIECE_CHUNKS, "{largest}");
        let back = load_whole(&repo, &id).unwrap();
        let mut sorted = t.clone();
        sorted.nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
        assert_eq!(back.nodes.len(), sorted.nodes.len());
        for (a, b) in back.nodes.iter().zip(&sorted.nodes) {
            let refs = |n: &Node, r: &Recipe| -> Vec<(Fingerprint, ContainerId, u32, u32)> {
                n.segments
                    .iter()
                    .flat_map(|s| &s.chunks)
                    .map(|c| (c.fp, r.containers[c.container as usize], c.region, c.offset))
                    .collect()
            };
            assert_eq!(refs(a, &back), refs(b, &sorted));
            assert_eq!(
                Node {
                    segments: vec![],
                    ..a.clone()
                },
                Node {
                    segments: vec![],
                    ..b.clone()
                }
            );
        }
        // The same file pushed as pieces by a caller: the same recipe.
        let table = t.containers.clone();
        let mut w = RecipeWriter::new(&repo);
        let mut nodes = sorted.nodes.clone();
        for n in nodes.drain(..) {
            if n.path != b"d3/huge" {
                w.push(n, |i| table.get(i as usize).copied()).unwrap();
                continue;
            }
            for piece in n.segments.chunks(32) {
                let p = Node {
                    segments: piece.to_vec(),
                    ..n.clone()
                };
                w.push(p, |i| table.get(i as usize).copied()).unwrap();
            }
        }
        assert_eq!(w.finish().unwrap().0, id);
        // A recipe without pieces keeps structure version 2.
        let (small, _) = put(&repo, tree(20)).unwrap();
        let RecipeObject::Index(i2) = load_object(&repo, &small).unwrap() else {
            panic!("a new recipe is an index")
        };
        assert!(!i2.continued);
    }

    /// Pieces are refused where they cannot be: a version-2 recipe naming
    /// a path twice, or pieces that disagree on the file's metadata.
    #[test]
    fn pieces_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let repo = repo(d.path());
        let (id, _) = put(
            &repo,
            Recipe {
                containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
                nodes: vec![big_file("f", 40)],
            },
        )
        .unwrap();
        let RecipeObject::Index(mut idx) = load_object(&repo, &id).unwrap() else {
            panic!("a new recipe is an index")
        };
        idx.continued = false;
        let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
        let (v2, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
        let e = load_whole(&repo, &v2).unwrap_err().to_string();
        assert!(e.contains("appears twice"), "{e}");

        // The writer refuses a path twice unless as pieces of one file.
        let table = [ContainerId([0; 16]); 4];
        let mut w = RecipeWriter::new(&repo);
        let f = big_file("f", 2);
        w.push(f.clone(), |i| table.get(i as usize).copied())
            .unwrap();
        let e = w
            .push(
                Node {
                    mode: 0o644,
                    ..f.clone()
                },
                |i| table.get(i as usize).copied(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        // A recipe whose pieces disagree (two recipes' parts, joined by
        // hand) is refused.
        let one = Recipe {
            containers: table.to_vec(),
            nodes: vec![f.clone()],
        };
        let two = Recipe {
            containers: table.to_vec(),
            nodes: vec![Node { mode: 0o644, ..f }],
        };
        let (r1, _) = put(&repo, one).unwrap();
        let (r2, _) = put(&repo, two).unwrap();
        let (RecipeObject::Index(mut idx), RecipeObject::Index(i2)) = (
            load_object(&repo, &r1).unwrap(),
            load_object(&repo, &r2).unwrap(),
        ) else {
            panic!("new recipes are indexes")
        };
        idx.parts.extend(i2.parts);
        idx.continued = true;
        let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
        let (bad, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
        let e = load_whole(&repo, &bad).unwrap_err().to_string();
        assert!(e.contains("disagree"), "{e}");
    }
}
