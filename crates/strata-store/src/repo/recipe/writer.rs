//! Writing a recipe a part at a time ([`RecipeWriter`]), and storing a
//! whole one ([`put`]).

use super::*;

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
    suspects: Arc<Mutex<HashSet<PartId>>>,
    /// Another repository with the same keys (the cloud tier) that gets
    /// the same objects — the same bytes under the same names.
    mirror: Option<&'r Repository>,
    /// Encoded bytes at which a part ends ([`MAX_PART_BYTES`]).
    part_bytes: usize,
    /// Parts taken over unread ([`Self::push_part`]).
    carried: Vec<PartId>,
    /// Where the next piece of the last node's file begins (none: not
    /// known, after a part taken over that did not say).
    file_at: Option<u64>,
    /// The first node of the part being filled, as a [`PieceRef`]: the
    /// part's piece if it stays the only node.
    first_piece: Option<PieceRef>,
    /// The previous version's parts, to store new parts as deltas
    /// against (a repository with deltas on).
    bases: Option<PartBases>,
    /// The last base read, and its bytes.
    base_bytes: Option<(PartId, Vec<u8>)>,
    /// Parts written as deltas (shared: read after the writer is done).
    parts_as_deltas: Arc<std::sync::atomic::AtomicU64>,
}

/// The parts of a previous version, as bases for the parts of a new one:
/// each part's first path and the part stored whole that stands for it
/// (itself, or its own base), and what each part's object is a delta
/// against (for parts the new version uses again as they are).
#[derive(Clone, Debug, Default)]
pub struct PartBases {
    pub firsts: Vec<(Vec<u8>, PartId)>,
    pub of: HashMap<PartId, Option<PartId>>,
}

impl PartBases {
    /// From a previous version's part references.
    pub fn of_parts(parts: &[PartRef]) -> Self {
        PartBases {
            firsts: parts
                .iter()
                .map(|p| {
                    (
                        p.first.clone(),
                        p.base.clone().unwrap_or_else(|| p.id.clone()),
                    )
                })
                .collect(),
            of: parts
                .iter()
                .map(|p| (p.id.clone(), p.base.clone()))
                .collect(),
        }
    }

    /// The whole part holding the paths from `first` in the previous
    /// version (the last part beginning at or before it).
    fn for_first(&self, first: &[u8]) -> Option<&PartId> {
        let k = self
            .firsts
            .partition_point(|(f, _)| path_cmp(f, first) != std::cmp::Ordering::Greater);
        self.firsts.get(k.checked_sub(1)?).map(|(_, id)| id)
    }
}

/// A part is stored as a delta when that takes at most this fraction of
/// storing it whole.
const PART_DELTA_KEEP: f64 = 0.5;

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
            bases: None,
            base_bytes: None,
            parts_as_deltas: Arc::default(),
        }
    }

    /// The count of parts written as deltas, also after the writer is
    /// consumed.
    pub fn parts_as_deltas(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.parts_as_deltas.clone()
    }

    /// Stores new parts as deltas against the previous version's parts
    /// `bases` where that saves (never with a mirror: its objects are the
    /// same bytes on both sides, and the bases may not be).
    pub fn with_part_bases(mut self, bases: PartBases) -> Self {
        self.bases = Some(bases);
        self
    }

    /// The envelope of part `id` (encoded `bytes`) as a delta against the
    /// previous version's part at its place, when that takes at most
    /// [`PART_DELTA_KEEP`] of `whole` (its envelope stored whole); and
    /// that base.
    fn as_delta(
        &mut self,
        id: &PartId,
        bytes: &[u8],
        whole: &[u8],
    ) -> Result<Option<(Vec<u8>, PartId)>> {
        let Some(base) = self
            .bases
            .as_ref()
            .filter(|_| self.mirror.is_none())
            .and_then(|b| b.for_first(&self.first))
            .filter(|b| *b != id)
            .cloned()
        else {
            return Ok(None);
        };
        if self.base_bytes.as_ref().is_none_or(|(b, _)| *b != base) {
            // A base that cannot be read is no base: the part is stored whole.
            match whole_part_bytes(self.repo, &base) {
                Ok(b) => self.base_bytes = Some((base.clone(), b)),
                Err(_) => return Ok(None),
            }
        }
        let Some((_, base_bytes)) = &self.base_bytes else {
            return Ok(None);
        };
        let frame = strata_core::delta::encode(bytes, base_bytes, self.repo.config().zstd_level)?;
        let payload = strata_core::format::encode(&PartDelta {
            base: base.clone(),
            frame,
        })?;
        let env = self
            .repo
            .sealer()
            .seal(Kind::RecipePartDelta, &payload, false)?;
        Ok((env.len() as f64 <= PART_DELTA_KEEP * whole.len() as f64).then_some((env, base)))
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
    pub fn with_suspects(mut self, suspects: Arc<Mutex<HashSet<PartId>>>) -> Self {
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
        let id = PartId::parse(&self.repo.hasher().hash(&bytes).to_hex())?;
        let name = part_name(&id);
        let suspect = self
            .suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id);
        let mut env = None;
        let mut base = None;
        for repo in std::iter::once(self.repo).chain(self.mirror) {
            if !suspect && repo.backend().size(&name)?.is_some() {
                // The object there may be a delta (any writer may meet
                // one, in a repository with deltas on): its reference
                // names its base, which is kept as long as it is. One
                // that cannot be read is written again.
                let known = match self.bases.as_ref().and_then(|b| b.of.get(&id)) {
                    _ if !repo.config().delta || base.is_some() => Some(base.clone()),
                    Some(b) => Some(b.clone()),
                    None => part_base(repo, &id).ok(),
                };
                if let Some(b) = known {
                    base = b;
                    self.parts_reused += 1;
                    continue;
                }
            }
            if env.is_none() {
                let whole = self.repo.sealer().seal(Kind::RecipePart, &bytes, true)?;
                env = Some(match self.as_delta(&id, &bytes, &whole)? {
                    Some((delta, b)) => {
                        base = Some(b);
                        self.parts_as_deltas
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        delta
                    }
                    None => whole,
                });
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
            base,
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
    pub fn finish(self) -> Result<(RecipeId, u64)> {
        let mut total = 0;
        let id = self.finish_inner(&mut total)?.0;
        Ok((id, total))
    }

    /// [`Self::finish`], returning the bytes written to the repository
    /// written to alone (not the mirror).
    pub fn finish_primary(self) -> Result<(RecipeId, u64)> {
        self.finish_inner(&mut 0)
    }

    fn finish_inner(mut self, total: &mut u64) -> Result<(RecipeId, u64)> {
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
        let id = RecipeId::of_hash(&blake3::hash(&env));
        for repo in std::iter::once(self.repo).chain(self.mirror) {
            repo.backend().put(&id.object_name(), &env)?;
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
pub fn put(repo: &Repository, recipe: Recipe) -> Result<(RecipeId, u64)> {
    let mut w = RecipeWriter::new(repo);
    w.push_recipe(recipe)?;
    w.finish()
}
