//! The series' previous version, as a backup uses it: unchanged files take
//! its recipe without being read ([`Parent::reuse`]), and a changed file's
//! new segments are deduplicated chunk by chunk against the same file's
//! chunks in it ([`PrevNode::file`]).
//!
//! The second is what keeps `segment` backups of edited files as cheap as
//! an exact index: a segment with a few changed chunks is no longer stored
//! (and compressed) whole — its unchanged chunks are referenced where the
//! previous version has them, and only the new chunks are written. Lookups
//! go through a window of the previous file around the position being
//! read (following insertions and deletions by the offset of the last
//! match), so memory stays bounded for files of any size; a sample of the
//! whole file's chunks (1 in 64, by fingerprint) finds the place again
//! after an insertion or deletion larger than the window.

use super::job::SegmentJob;
use super::job::{CleanSegment, PATCH_SEGMENT};
use crate::engine::index::{ChunkLoc, ContainerTable, IndexStrategy};
use crate::error::Result;
use crate::repo::index::RepoIndex;
use crate::repo::recipe;
use crate::repo::Repository;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use strata_core::format::{
    path_cmp, ChunkRef, ContainerId, Node, NodeKind, PartRef, PieceRef, RecipeObject, SegmentRef,
};
use strata_core::id::{PartId, RecipeId};
use strata_core::Fingerprint;
use strata_index::key::KeyMap;

/// The previous version of the series (empty for a first backup), read a
/// part at a time as the walk goes: the walk visits paths in the recipe's
/// order ([`path_cmp`]), so its files are met in order and only the parts
/// around the walk's position are in memory (the one being walked and up
/// to [`READ_AHEAD`] read ahead of it).
pub(crate) struct Parent<'a> {
    repo: Option<&'a Repository>,
    /// Parts not read yet.
    parts: VecDeque<PartRef>,
    /// Parts being read ahead, in order (at most [`READ_AHEAD`]).
    reading: VecDeque<(
        PartRef,
        std::sync::mpsc::Receiver<Result<strata_core::format::Recipe>>,
    )>,
    /// The part being walked when it holds a single node (a piece of a
    /// large file): what a new version may take over as it is.
    single: Option<CarriedPart>,
    /// Nodes of the part being read, and its container table as interned
    /// ids of this backup's table (`None`: no longer in the pool).
    nodes: VecDeque<Node>,
    containers: Arc<Vec<Option<u32>>>,
    /// Containers of the pool (those a new version may reference).
    pool: HashSet<ContainerId>,
    table: Option<&'a ContainerTable>,
    strategy: &'a dyn IndexStrategy,
    /// 1 in 64 of its chunk fingerprints (by fingerprint), to estimate how
    /// much of it the new version stores again elsewhere; complete once
    /// [`Self::finish`] has read every part.
    sample: HashSet<Fingerprint>,
    /// Its non-zero chunk references and their bytes (complete after
    /// [`Self::finish`]).
    pub direct_chunks: u64,
    pub direct_bytes: u64,
    /// Set when a part could not be read: the rest of the previous version
    /// is not used (its files are read again) and the counts are partial.
    pub damaged: Option<String>,
    /// Parts found damaged, shared with the recipe writer: should the new
    /// version hold a part with the same content, it is written again
    /// (repairing the object) rather than reused.
    suspects: Arc<Mutex<HashSet<PartId>>>,
    /// The recipe index's container table (what a part's indexes name).
    index_containers: Vec<ContainerId>,
    /// Which pieces a patched image takes over unread (see
    /// [`Self::set_carry`]).
    carry: Option<CarryFilter<'a>>,
    /// Parts found missing when they were to be taken over: read instead
    /// (which finds them damaged, so the new version writes them again).
    missing: HashSet<PartId>,
    /// Its parts as bases for the new version's (deltas on).
    part_bases: Option<crate::repo::recipe::writer::PartBases>,
}

/// Whether a part holding the piece told is to be taken over unread.
pub(crate) type CarryFilter<'a> = Box<dyn Fn(&PieceRef) -> bool + 'a>;

/// A file of the previous version, as the walk takes it.
pub(crate) struct PrevNode {
    node: Node,
    containers: Arc<Vec<Option<u32>>>,
    /// The part that holds this node alone (a piece of a large file,
    /// every container of it still in the pool).
    part: Option<CarriedPart>,
}

/// A recipe part a new version takes over as it is: its reference (the
/// container indexes left out) and its container table.
#[derive(Clone, Debug)]
pub(crate) struct CarriedPart {
    pub part: PartRef,
    pub containers: Vec<ContainerId>,
}

impl<'a> Parent<'a> {
    /// No previous version.
    pub fn none(strategy: &'a dyn IndexStrategy) -> Self {
        Parent {
            repo: None,
            parts: VecDeque::new(),
            reading: VecDeque::new(),
            single: None,
            nodes: VecDeque::new(),
            containers: Arc::default(),
            pool: HashSet::new(),
            table: None,
            strategy,
            sample: HashSet::new(),
            direct_chunks: 0,
            direct_bytes: 0,
            damaged: None,
            suspects: Arc::default(),
            index_containers: Vec::new(),
            carry: None,
            missing: HashSet::new(),
            part_bases: None,
        }
    }

    /// Its parts, as bases the new version's parts may be stored as
    /// deltas against.
    pub fn part_bases(&self) -> Option<crate::repo::recipe::writer::PartBases> {
        self.part_bases.clone()
    }

    /// The previous version whose recipe is `recipe_id`. Only pool
    /// containers still in the index are used.
    pub fn open(
        repo: &'a Repository,
        recipe_id: &RecipeId,
        index: &RepoIndex,
        table: &'a ContainerTable,
        strategy: &'a dyn IndexStrategy,
    ) -> Result<Self> {
        let mut p = Parent::none(strategy);
        p.repo = Some(repo);
        p.pool = index
            .containers
            .iter()
            .filter(|(_, c)| c.stamp.is_none())
            .map(|(id, _)| *id)
            .collect();
        p.table = Some(table);
        match recipe::load_object(repo, recipe_id)? {
            RecipeObject::Whole(r) => {
                p.containers = Arc::new(p.map_table(&r.containers));
                let mut nodes = r.nodes;
                nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
                p.count(&nodes);
                p.nodes = nodes.into();
            }
            RecipeObject::Index(i) => {
                p.part_bases = Some(crate::repo::recipe::writer::PartBases::of_parts(&i.parts));
                p.parts = i.parts.into();
                p.index_containers = i.containers;
            }
        }
        Ok(p)
    }

    fn map_table(&self, ids: &[ContainerId]) -> Vec<Option<u32>> {
        let Some(table) = self.table else {
            return vec![];
        };
        ids.iter()
            .map(|id| self.pool.contains(id).then(|| table.intern(*id)))
            .collect()
    }

    /// Adds nodes to the sample and the counts.
    fn count(&mut self, nodes: &[Node]) {
        for c in nodes
            .iter()
            .flat_map(|n| n.segments.iter().flat_map(|s| &s.chunks))
        {
            if c.is_direct() {
                self.direct_chunks += 1;
                self.direct_bytes += c.len as u64;
                if is_anchor(&c.fp) {
                    self.sample.insert(c.fp);
                }
            }
        }
    }

    /// Starts reading the next parts (up to [`READ_AHEAD`] at once, each
    /// on a thread of its own): reading, checking, decompressing and
    /// decoding a part overlaps with the walk and with the other parts.
    fn read_ahead(&mut self) {
        let Some(repo) = self.repo else {
            return;
        };
        while self.reading.len() < READ_AHEAD {
            let Some(part) = self.parts.front() else {
                return;
            };
            // A part to be taken over unread is not read (nor those after
            // it, which come in order after it).
            if self.carried_unread(part) {
                return;
            }
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let (r, id) = (repo.clone(), part.id.clone());
            let part_ref = part.clone();
            let spawned = std::thread::Builder::new()
                .name("strata-parent-part".into())
                .spawn(move || {
                    let _ = tx.send(recipe::load_part(&r, &id));
                });
            if spawned.is_err() {
                // No thread to be had: the rest is read here, in turn.
                return;
            }
            self.parts.pop_front();
            self.reading.push_back((part_ref, rx));
        }
    }

    /// Reads the next part; `false` when there is none (or it is damaged).
    fn next_part(&mut self) -> bool {
        let Some(repo) = self.repo else {
            return false;
        };
        self.read_ahead();
        let (part, loaded) = match self.reading.pop_front() {
            Some((part, rx)) => {
                let r = rx.recv().unwrap_or_else(|_| {
                    Err(crate::error::StoreError::Invalid(
                        "a recipe part's reader stopped".into(),
                    ))
                });
                (part, r)
            }
            None => match self.parts.pop_front() {
                Some(part) => {
                    let r = recipe::load_part(repo, &part.id);
                    (part, r)
                }
                None => return false,
            },
        };
        match loaded {
            Ok(r) => {
                self.read_ahead();
                self.containers = Arc::new(self.map_table(&r.containers));
                // Only a part whose containers are all still in the pool
                // can be taken over as it is.
                self.single = (r.nodes.len() == 1
                    && part.nodes == 1
                    && self.containers.iter().all(Option::is_some))
                .then(|| CarriedPart {
                    part: PartRef {
                        containers: Vec::new(),
                        ..part.clone()
                    },
                    containers: r.containers.clone(),
                });
                self.count(&r.nodes);
                self.nodes = r.nodes.into();
                true
            }
            Err(e) => {
                self.single = None;
                self.suspects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(part.id);
                self.damaged = Some(format!(
                    "the previous version's recipe is damaged ({e}); its remaining files are read again"
                ));
                self.parts.clear();
                self.reading.clear();
                false
            }
        }
    }

    /// While `filter` is set, a part that holds a single piece of a file
    /// (told by its reference: [`PieceRef`]) for which it says yes, and
    /// whose containers are all in the pool, is not read ahead: the walk
    /// takes it over unread ([`Self::take_carried`]), or reads it when it
    /// comes to it.
    pub fn set_carry(&mut self, filter: Option<CarryFilter<'a>>) {
        self.carry = filter;
    }

    /// The keyed hash of `node`'s metadata as a [`PieceRef`] has it (none
    /// without a previous version).
    pub fn piece_meta(&self, node: &mut Node) -> Option<Fingerprint> {
        let repo = self.repo?;
        recipe::piece_ref(repo.hasher(), node, 0)
            .ok()
            .map(|p| p.meta)
    }

    /// Whether `part` is one the walk takes over unread.
    fn carried_unread(&self, part: &PartRef) -> bool {
        let (Some(filter), Some(piece)) = (&self.carry, &part.piece) else {
            return false;
        };
        part.nodes == 1
            && !self.missing.contains(&part.id)
            && filter(piece)
            && part.containers.iter().all(|&i| {
                self.index_containers
                    .get(i as usize)
                    .is_some_and(|id| self.pool.contains(id))
            })
    }

    /// The next part, unread, if it holds the piece of `path` beginning
    /// at byte `offset` alone and is to be taken over unread (see
    /// [`Self::set_carry`]): nothing before it is left to walk.
    pub fn next_carried(&self, path: &[u8], offset: u64) -> bool {
        self.nodes.is_empty()
            && self.reading.is_empty()
            && self.parts.front().is_some_and(|p| {
                p.first == path
                    && p.piece.as_ref().is_some_and(|pc| pc.offset == offset)
                    && self.carried_unread(p)
            })
    }

    /// Takes [`Self::next_carried`]'s part over, unread: its reference and
    /// container table. As a deduplicated
    /// chunk is, the part is checked to be in the repository, not read; a
    /// missing one is read instead (and found damaged: the piece is read
    /// from the image and its part written again).
    pub fn take_carried(&mut self, path: &[u8], offset: u64) -> Option<CarriedPart> {
        if !self.next_carried(path, offset) {
            return None;
        }
        let id = self.parts.front()?.id.clone();
        let there = self
            .repo
            .is_some_and(|r| matches!(r.backend().size(&recipe::part_name(&id)), Ok(Some(_))));
        if !there {
            self.missing.insert(id);
            return None;
        }
        let part = self.parts.pop_front()?;
        let piece = part.piece.clone()?;
        let containers = part
            .containers
            .iter()
            .map(|&i| self.index_containers.get(i as usize).copied())
            .collect::<Option<Vec<_>>>()?;
        self.direct_chunks = self.direct_chunks.saturating_add(piece.direct_chunks);
        self.direct_bytes = self.direct_bytes.saturating_add(piece.direct_bytes);
        self.single = None;
        Some(CarriedPart {
            part: PartRef {
                containers: Vec::new(),
                ..part
            },
            containers,
        })
    }

    /// The previous version's node at `path` if it is a file (the first
    /// piece of a continued one). Calls come in increasing path order;
    /// everything before `path` is passed over.
    fn find_file(&mut self, path: &[u8]) -> Option<Node> {
        loop {
            while let Some(front) = self.nodes.front() {
                match path_cmp(&front.path, path) {
                    Ordering::Less => {
                        self.nodes.pop_front();
                    }
                    Ordering::Equal => {
                        let node = self.nodes.pop_front()?;
                        return (node.kind == NodeKind::File).then_some(node);
                    }
                    Ordering::Greater => return None,
                }
            }
            if !self.next_part() {
                return None;
            }
        }
    }

    /// The previous version's file at `path`. Calls come in increasing
    /// path order; everything before `path` is passed over.
    pub fn take(&mut self, path: &[u8]) -> Option<PrevNode> {
        let node = self.find_file(path)?;
        self.join_pieces(node)
    }

    /// The previous version's file at `path` a piece at a time (a patched
    /// image: see [`super::job::PATCH_PIECE`]): its first piece (what
    /// comes before `path` is passed over), then — `after` the piece
    /// before — the next one; `None` past the last piece, or when a part
    /// cannot be read. Nothing is joined: one piece's chunks at a time.
    pub fn take_piece(&mut self, path: &[u8], after: Option<&Node>) -> Option<PrevNode> {
        let Some(prev) = after else {
            // The first piece: as `take`, without the others.
            let node = self.find_file(path)?;
            return Some(PrevNode {
                node,
                containers: self.containers.clone(),
                part: self.single.take(),
            });
        };
        loop {
            if let Some(front) = self.nodes.front() {
                if !recipe::continues(prev, front) {
                    return None;
                }
                let node = self.nodes.pop_front()?;
                return Some(PrevNode {
                    node,
                    containers: self.containers.clone(),
                    part: self.single.take(),
                });
            }
            if !self.next_part() {
                return None;
            }
        }
    }

    /// `node` with the further pieces of its file (a continued file, see
    /// [`recipe::continues`]), which may run into the parts that follow;
    /// their references renumbered into one table. `None` if a piece's
    /// part cannot be read: the file is then read again.
    fn join_pieces(&mut self, mut node: Node) -> Option<PrevNode> {
        if self
            .nodes
            .front()
            .is_some_and(|f| !recipe::continues(&node, f))
        {
            // The common case: a whole file, and its part's table as is.
            return Some(PrevNode {
                node,
                containers: self.containers.clone(),
                part: None,
            });
        }
        let mut joined: Vec<Option<u32>> = self.containers.as_ref().clone();
        let mut base = 0u32;
        loop {
            while let Some(front) = self.nodes.front() {
                if !recipe::continues(&node, front) {
                    return Some(PrevNode {
                        node,
                        containers: Arc::new(joined),
                        part: None,
                    });
                }
                let mut piece = self.nodes.pop_front()?;
                for c in piece.segments.iter_mut().flat_map(|s| &mut s.chunks) {
                    if c.is_direct() {
                        c.container = c.container.checked_add(base)?;
                    }
                }
                node.segments.append(&mut piece.segments);
            }
            if !self.next_part() {
                // The recipe's end, or a damaged part (the pieces after it
                // are unknown).
                return self.damaged.is_none().then(|| PrevNode {
                    node,
                    containers: Arc::new(joined),
                    part: None,
                });
            }
            base = joined.len() as u32;
            joined.extend(self.containers.iter().copied());
        }
    }

    /// The parts found damaged so far (see the field).
    pub fn suspects(&self) -> Arc<Mutex<HashSet<PartId>>> {
        self.suspects.clone()
    }

    /// Reads the parts the walk did not reach, so the sample and counts
    /// cover the whole previous version.
    pub fn finish(&mut self) {
        self.nodes.clear();
        while self.next_part() {
            self.nodes.clear();
        }
    }

    /// Bytes of `stored` (a 1-in-64 sample by fingerprint of the new
    /// chunks a backup stored, with their lengths) that the previous
    /// version holds too: times 64, an estimate of what reverse dedup of
    /// the previous version against the new one would free.
    pub fn stored_again(&self, stored: &HashMap<Fingerprint, u32>) -> u64 {
        stored
            .iter()
            .filter(|(fp, _)| self.sample.contains(*fp))
            .map(|(_, &len)| len as u64)
            .sum()
    }

    /// The previous version's segments of `new` when the file is unchanged
    /// (same size, mtime, ctime and inode), pointing at current locations.
    pub fn reuse(&self, old: &mut PrevNode, new: &Node) -> Option<Vec<SegmentRef>> {
        let o = &old.node;
        let stored: u64 = o.segments.iter().map(SegmentRef::len).sum();
        if o.size != new.size
            || stored != o.size
            || o.mtime_ns != new.mtime_ns
            || o.ctime_ns != new.ctime_ns
            || o.ino != new.ino
        {
            return None;
        }
        // Taken: should a chunk be gone, the file is read again without
        // its previous version (as when gc moved what nobody knows of).
        let mut segs = std::mem::take(&mut old.node.segments);
        for s in &mut segs {
            for c in &mut s.chunks {
                if c.is_zero() {
                    continue;
                }
                // Moved by gc since (or otherwise gone): the current
                // location, if the strategy knows it.
                let l = loc_of(&old.containers, c).or_else(|| self.strategy.lookup_chunk(&c.fp))?;
                c.container = l.container;
                c.region = l.region;
                c.offset = l.offset;
            }
        }
        Some(segs)
    }
}

/// Where a direct reference of a part points, in this backup's table.
fn loc_of(containers: &[Option<u32>], c: &ChunkRef) -> Option<ChunkLoc> {
    let container = (*containers.get(c.container as usize)?)?;
    Some(ChunkLoc {
        container,
        region: c.region,
        offset: c.offset,
        len: c.len,
    })
}

/// A segment's chunks with their locations, if every one is found.
fn known_segment(containers: &[Option<u32>], s: &SegmentRef) -> Option<CleanSegment> {
    let mut job = SegmentJob::default();
    let mut found = Vec::with_capacity(s.chunks.len());
    for c in &s.chunks {
        if c.is_zero() {
            // A zero run: its chunks again (the segment's fingerprint
            // hashes one per chunk), their lengths evened out. A count
            // past its bytes is damage: the segment is read instead.
            if !c.is_sound_run() {
                return None;
            }
            let n = c.chunk_count() as u32;
            for k in 0..n {
                let len = c.len / n + u32::from(k < c.len % n);
                job.push_known(Fingerprint::ZERO, true, len);
            }
        } else {
            found.push(Some(loc_of(containers, c)?));
            job.push_known(c.fp, false, c.len);
        }
    }
    Some((job, found))
}

/// A patched image's previous segments, handed to the patch that takes
/// its unchanged ones as it comes to them: each is made a
/// [`CleanSegment`] then, and its chunk list let go (not every segment's
/// chunk jobs built before the first is stored).
pub(crate) struct PrevSegments {
    segments: Vec<SegmentRef>,
    containers: Arc<Vec<Option<u32>>>,
}

impl PrevSegments {
    /// Segment `i`'s chunks and their locations (none if one is no
    /// longer found, or it was taken already).
    pub(crate) fn take(&mut self, i: usize) -> Option<CleanSegment> {
        let s = self.segments.get_mut(i)?;
        let seg = known_segment(&self.containers, s);
        s.chunks = Vec::new();
        seg.filter(|(job, _)| !job.is_empty())
    }
}

impl PrevNode {
    /// Whether it is a piece of `file` (the same metadata; every field
    /// named, so a field added to [`Node`] must be added here).
    pub fn same_file(&self, file: &Node) -> bool {
        let Node {
            path,
            kind,
            mode,
            uid,
            gid,
            mtime_ns,
            ctime_ns,
            ino,
            dev,
            rdev,
            nlink,
            size,
            target,
            segments: _,
            xattrs,
        } = &self.node;
        *path == file.path
            && *kind == file.kind
            && *mode == file.mode
            && *uid == file.uid
            && *gid == file.gid
            && *mtime_ns == file.mtime_ns
            && *ctime_ns == file.ctime_ns
            && *ino == file.ino
            && *dev == file.dev
            && *rdev == file.rdev
            && *nlink == file.nlink
            && *size == file.size
            && *target == file.target
            && *xattrs == file.xattrs
    }

    /// The part that holds it alone, if any (see [`CarriedPart`]), as the
    /// piece beginning at byte `offset` of its file (told in its reference
    /// from now on, if the recipe did not).
    pub fn carried_at(&mut self, parent: &Parent<'_>, offset: u64) -> Option<CarriedPart> {
        let mut c = self.part.clone()?;
        if c.part.piece.is_none() {
            let repo = parent.repo?;
            c.part.piece = recipe::piece_ref(repo.hasher(), &mut self.node, offset).ok();
        }
        Some(c)
    }

    /// Bytes its segments cover.
    pub fn len(&self) -> u64 {
        self.node.segments.iter().map(SegmentRef::len).sum()
    }

    /// The segments of a piece of a patched image's previous version
    /// (beginning at byte `start` of the image) that the patch says did
    /// not change (see [`super::patch`]) and that begin before `end` (the
    /// new piece's): those lying at the offset and with the length segment
    /// *k* of an image of `size` bytes has, every chunk of them found; by
    /// *k* (counted from the image's start), the index of the segment in
    /// the piece. Empty if the size differs.
    pub fn clean_segments_at(
        &self,
        start: u64,
        end: u64,
        size: u64,
        changed: &[bool],
    ) -> BTreeMap<u64, usize> {
        let mut out = BTreeMap::new();
        if self.node.size != size || !start.is_multiple_of(PATCH_SEGMENT) {
            return out;
        }
        let mut offset = start;
        for (i, s) in self.node.segments.iter().enumerate() {
            if offset >= end {
                break;
            }
            let len: u64 = s.chunks.iter().map(|c| c.len as u64).sum();
            let k = offset / PATCH_SEGMENT;
            let in_place = offset.is_multiple_of(PATCH_SEGMENT)
                && len == PATCH_SEGMENT.min(size.saturating_sub(offset));
            let found = || {
                s.chunks
                    .iter()
                    .all(|c| c.is_zero() || loc_of(&self.containers, c).is_some())
            };
            if in_place && changed.get(k as usize) == Some(&false) && found() {
                out.insert(k, i);
            }
            offset += len;
        }
        out
    }

    /// Its segments for [`PrevSegments::take`]: copies of those `keep`
    /// names (the clean ones), the others' chunk lists left out (the piece
    /// stays, for lookups around the next piece).
    pub(crate) fn segments_of(&self, keep: &BTreeMap<u64, usize>) -> PrevSegments {
        let kept: HashSet<usize> = keep.values().copied().collect();
        let segments = self
            .node
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| match kept.contains(&i) {
                true => s.clone(),
                false => SegmentRef {
                    fp: s.fp,
                    chunks: Vec::new(),
                },
            })
            .collect();
        PrevSegments {
            segments,
            containers: self.containers.clone(),
        }
    }

    /// The previous version of a changed file, for chunk lookups while it
    /// is read again.
    pub fn file(&self) -> Option<ParentFile> {
        let mut f = self.file_near(None)?;
        let mut zeros = Vec::new();
        let mut offset = 0u64;
        for c in self.node.segments.iter().flat_map(|s| &s.chunks) {
            if c.is_zero() {
                let count = c.chunk_count().min(u32::MAX as u64) as u32;
                zeros.push((offset, c.len, count));
            }
            offset += c.len as u64;
        }
        f.guide = Some(Arc::new(Guide {
            refs: f.refs.clone(),
            zeros,
            size: offset,
        }));
        Some(f)
    }

    /// [`Self::file_near`] of consecutive pieces of the previous image,
    /// each with the byte at which it begins.
    pub fn pieces_near(pieces: &[(u64, &PrevNode)], read: &[(u64, u64)]) -> Option<ParentFile> {
        let mut refs = Vec::new();
        for &(start, p) in pieces {
            p.near_refs(start, Some(read), &mut refs);
        }
        ParentFile::of(refs)
    }

    /// Its chunks within [`WINDOW`] of the ranges `read` (all without
    /// ranges), with their offsets counted from `start`, onto `refs`.
    fn near_refs(
        &self,
        start: u64,
        read: Option<&[(u64, u64)]>,
        refs: &mut Vec<(u64, Fingerprint, ChunkLoc)>,
    ) {
        let near = |o: u64| {
            read.is_none_or(|r| {
                let i = r.partition_point(|&(_, e)| e.saturating_add(WINDOW) <= o);
                r.get(i)
                    .is_some_and(|&(s, _)| s.saturating_sub(WINDOW) <= o)
            })
        };
        let mut offset = start;
        for c in self.node.segments.iter().flat_map(|s| &s.chunks) {
            if near(offset) && !c.is_zero() {
                if let Some(loc) = loc_of(&self.containers, c) {
                    refs.push((offset, c.fp, loc));
                }
            }
            offset += c.len as u64;
        }
    }

    /// [`Self::file`] with only the chunks a lookup can reach while the
    /// byte ranges `read` are read (within [`WINDOW`] of them), when only
    /// those are (a patched image: its changed segments): a large image
    /// of which a few segments changed does not build a table of every
    /// chunk (a million per 4 GiB).
    pub fn file_near(&self, read: Option<&[(u64, u64)]>) -> Option<ParentFile> {
        let mut refs = Vec::new();
        self.near_refs(0, read, &mut refs);
        ParentFile::of(refs)
    }
}

impl ParentFile {
    /// Over chunk references in offset order (none: no file).
    fn of(refs: Vec<(u64, Fingerprint, ChunkLoc)>) -> Option<ParentFile> {
        let anchors = refs
            .iter()
            .enumerate()
            .filter(|(_, r)| is_anchor(&r.1))
            .map(|(i, r)| (r.1, i))
            .collect();
        (!refs.is_empty()).then(|| ParentFile {
            refs: Arc::new(refs),
            guide: None,
            anchors,
            map: KeyMap::default(),
            lo: 0,
            hi: 0,
            drift: 0,
        })
    }
}

/// Parts of the previous version read ahead of the walk at once.
const READ_AHEAD: usize = 4;

/// The previous version of a file as its chunk boundaries: its chunks
/// with their offsets (the [`ParentFile`]'s own table, shared), its runs
/// of zero chunks (offset, length, chunks), and its size. A block of the
/// new file is checked against the chunks at the same places
/// ([`Guide::sure`]) instead of being cut.
pub(crate) struct Guide {
    pub refs: Arc<Vec<(u64, Fingerprint, ChunkLoc)>>,
    pub zeros: Vec<(u64, u32, u32)>,
    pub size: u64,
}

impl Guide {
    /// The chunks of the previous version that lie in `data` (which begins
    /// at file offset `at`), hashed (`hash`): onto `sure` those that are
    /// the chunker's own cut there in the new file too — same bytes, the
    /// next chunk's too (the cut looks at the byte after it) unless it is
    /// the longest, and a longest chunk after it in the previous version.
    /// Their fingerprints go onto `hashed`. Returns whether every chunk in
    /// `data` was unchanged and they cover it but for its last longest
    /// chunk (nothing is then left to cut).
    pub fn sure(
        &self,
        data: &[u8],
        at: u64,
        (max, zero_len): (usize, u32),
        hash: impl Fn(&[u8]) -> (Fingerprint, bool),
        sure: &mut Vec<(usize, u32)>,
        hashed: &mut Vec<(Fingerprint, bool)>,
    ) -> bool {
        let end = at + data.len() as u64;
        // The previous version's chunks in `data`, in offset order: those
        // with their fingerprints, then its zero runs' chunks.
        let mut chunks: Vec<(u64, u32, Fingerprint)> = Vec::new();
        let first = self.refs.partition_point(|r| r.0 < at);
        for &(offset, fp, loc) in &self.refs[first..] {
            if offset + loc.len as u64 > end {
                break;
            }
            chunks.push((offset, loc.len, fp));
        }
        let first = self.zeros.partition_point(|z| z.0 + z.1 as u64 <= at);
        'zeros: for &(offset, len, count) in &self.zeros[first..] {
            for (offset, len) in expand(offset, len, count, zero_len) {
                if offset + len as u64 > end {
                    break 'zeros;
                }
                chunks.push((offset, len, Fingerprint::ZERO));
            }
        }
        chunks.sort_unstable_by_key(|c| c.0);
        let mut same = Vec::new();
        let mut all = true;
        let mut covered = at;
        for &(offset, len, want) in &chunks {
            if offset < at || len == 0 || len as usize > max {
                // Begun before the block; or a run of zeros whose
                // chunks cannot be told apart, or a chunk longer than
                // any the chunker cuts (a recipe not of this chunker,
                // or a hostile one): cut, not checked.
                all &= offset < at;
                continue;
            }
            let a = (offset - at) as usize;
            let h = hash(&data[a..a + len as usize]);
            let unchanged = h.0 == want;
            all &= unchanged && covered + max as u64 >= offset;
            covered = offset + len as u64;
            same.push((a, len, unchanged, h, offset));
        }
        for (i, &(a, len, unchanged, h, offset)) in same.iter().enumerate() {
            let next = same
                .get(i + 1)
                .is_some_and(|n| n.2 && n.4 == offset + len as u64);
            if unchanged && (next || len as usize == max) && offset + max as u64 <= self.size {
                sure.push((a, len));
                hashed.push(h);
            }
        }
        all && covered + max as u64 >= end
    }
}

/// The chunks of a reference at `offset`: itself, or for a run of `count`
/// zero chunks, `count - 1` of `zero_len` bytes (what the chunker cuts in
/// zeros) and the rest — one of length 0 when that cannot be (the run
/// was cut otherwise).
fn expand(offset: u64, len: u32, count: u32, zero_len: u32) -> impl Iterator<Item = (u64, u32)> {
    let n = count.max(1);
    let rest = (n as u64 - 1) * zero_len as u64;
    let fits = n == 1 || (rest < len as u64 && len as u64 - rest <= zero_len as u64);
    let (n, step) = if fits { (n, zero_len) } else { (1, 0) };
    (0..n).map(move |i| {
        let o = offset + i as u64 * step as u64;
        match (fits, i + 1 == n) {
            (false, _) => (o, 0),
            (true, true) => (o, (len as u64 - (n as u64 - 1) * step as u64) as u32),
            (true, false) => (o, step),
        }
    })
}

/// Whether a chunk is in the whole-file sample (1 in 64).
pub(crate) fn is_anchor(fp: &Fingerprint) -> bool {
    fp.0[0] & 63 == 0
}

/// Bytes of the previous file looked at on either side of the segment
/// being read (after allowing for the drift of insertions and deletions).
const WINDOW: u64 = 64 << 20;

/// One file of the previous version: its chunks by offset, and a map of
/// those in the current window.
pub(crate) struct ParentFile {
    refs: Arc<Vec<(u64, Fingerprint, ChunkLoc)>>,
    /// Where each of its chunks begins and ends (zero ones too), for
    /// chunking the new file where it did not change: `None` for a
    /// patched image's pieces.
    pub guide: Option<Arc<Guide>>,
    /// The sample of the whole file, to find the place again.
    anchors: KeyMap<Fingerprint, usize>,
    /// (Fingerprints are uniformly random: hashed by their first bytes,
    /// not SipHash — every chunk of a file goes in and out of the map.)
    map: KeyMap<Fingerprint, usize>,
    /// The window: `refs[lo..hi]` are in `map`.
    lo: usize,
    hi: usize,
    /// Offset in the previous file minus offset in the new one, at the
    /// last match.
    drift: i64,
}

impl ParentFile {
    /// Moves the window over the bytes `start..end` of the new file.
    pub fn window(&mut self, start: u64, end: u64) {
        let at = |x: u64, d: i64| (x as i64 + d).max(0) as u64;
        let lo = self
            .refs
            .partition_point(|r| r.0 < at(start, self.drift - WINDOW as i64));
        let hi = self
            .refs
            .partition_point(|r| r.0 < at(end, self.drift + WINDOW as i64));
        if lo < self.lo || hi < self.hi || lo >= self.hi {
            self.map.clear();
            self.lo = lo;
            self.hi = lo;
        }
        for i in self.lo..lo {
            let fp = self.refs[i].1;
            if self.map.get(&fp) == Some(&i) {
                self.map.remove(&fp);
            }
        }
        for i in self.hi.max(lo)..hi {
            self.map.insert(self.refs[i].1, i);
        }
        (self.lo, self.hi) = (lo, hi);
    }

    /// The previous file's chunk at the place of byte `at` of the new one
    /// (by the drift of the last match): what a new chunk there is most
    /// likely an edit of.
    pub fn near(&self, at: u64) -> Option<(Fingerprint, ChunkLoc)> {
        let want = (at as i64).saturating_add(self.drift).max(0) as u64;
        let k = self.refs.partition_point(|r| r.0 <= want).checked_sub(1)?;
        let &(offset, fp, loc) = self.refs.get(k)?;
        (want < offset + loc.len as u64).then_some((fp, loc))
    }

    /// Where the previous file holds chunk `fp`, if in the window or the
    /// sample; `at` is the chunk's offset in the new file.
    pub fn find(&mut self, fp: &Fingerprint, at: u64) -> Option<ChunkLoc> {
        // Where the drift so far says it is: a chunk that is there is
        // taken from there, whatever other copies of it the file holds
        // (an image repeats blocks; taking another copy would move the
        // drift, and the window with it, away from the file's place).
        let want = (at as i64).saturating_add(self.drift).max(0) as u64;
        let k = self.refs.partition_point(|r| r.0 < want);
        if let Some(&(offset, f, loc)) = self.refs.get(k) {
            if offset == want && f == *fp {
                return Some(loc);
            }
        }
        let &i = self.map.get(fp).or_else(|| self.anchors.get(fp))?;
        let (offset, _, loc) = self.refs[i];
        self.drift = offset as i64 - at as i64;
        Some(loc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: usize) -> ParentFile {
        let refs: Vec<_> = (0..n)
            .map(|i| {
                let loc = ChunkLoc {
                    container: 0,
                    region: 0,
                    offset: i as u32,
                    len: 1 << 20,
                };
                ((i as u64) << 20, fp(i as u64), loc)
            })
            .collect::<Vec<_>>();
        ParentFile {
            guide: None,
            anchors: (0..n)
                .filter(|i| i % 64 == 0)
                .map(|i| (fp(i as u64), i))
                .collect(),
            refs: Arc::new(refs),
            map: KeyMap::default(),
            lo: 0,
            hi: 0,
            drift: 0,
        }
    }

    fn fp(i: u64) -> Fingerprint {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        Fingerprint(b)
    }

    /// A patched image's previous version keeps only the chunks within
    /// the window of what is read; a changed file keeps them all.
    #[test]
    fn a_patch_keeps_only_the_chunks_near_what_it_reads() {
        use strata_core::format::{ChunkRef, SegmentRef};
        // 1000 chunks of 1 MiB (a 1000 MiB image), one container.
        let chunks: Vec<ChunkRef> = (0..1000u64)
            .map(|i| ChunkRef {
                fp: fp(i + 1),
                container: 0,
                region: 0,
                offset: i as u32,
                len: 1 << 20,
            })
            .collect();
        let prev = || PrevNode {
            node: Node {
                segments: vec![SegmentRef {
                    fp: fp(0),
                    chunks: chunks.clone(),
                }],
                ..Node::new(b"v.img".to_vec(), NodeKind::File)
            },
            containers: Arc::new(vec![Some(0)]),
            part: None,
        };
        assert_eq!(prev().file().unwrap().refs.len(), 1000);
        let w = WINDOW >> 20;
        let read = [(300u64 << 20, 302 << 20), (900 << 20, 1000 << 20)];
        let f = prev().file_near(Some(&read)).unwrap();
        let offsets: Vec<u64> = f.refs.iter().map(|r| r.0 >> 20).collect();
        let want: Vec<u64> = (300 - w..302 + w).chain(900 - w..1000).collect();
        assert_eq!(offsets, want);
        assert!(prev().file_near(Some(&[])).is_none());
    }

    /// The previous version's chunks are sure only where they are the
    /// chunker's own: unchanged with the chunk after them, not near the
    /// end, never longer than the longest chunk (whatever a recipe says).
    #[test]
    fn guide_is_sure_only_of_what_the_chunker_would_cut() {
        let max = 64;
        let h = |d: &[u8]| {
            let mut f = Fingerprint::ZERO;
            f.0[..8].copy_from_slice(&(d.iter().map(|&b| b as u64).sum::<u64>() + 1).to_le_bytes());
            (f, false)
        };
        let data: Vec<u8> = (0..400u32).map(|i| (i % 251) as u8).collect();
        let pre = |a: usize, l: usize| h(&data[a..a + l]).0;
        let loc = |len| ChunkLoc {
            container: 0,
            region: 0,
            offset: 0,
            len,
        };
        let g = Guide {
            refs: Arc::new(vec![
                (0, pre(0, 40), loc(40)),
                (40, pre(40, 50), loc(50)),
                // Changed.
                (90, fp(12345), loc(30)),
                // Longer than any chunk.
                (120, pre(120, 200), loc(200)),
                (320, pre(320, 40), loc(40)),
                // Within a longest chunk of the end.
                (360, pre(360, 40), loc(40)),
            ]),
            zeros: Vec::new(),
            size: 400,
        };
        let (mut sure, mut hashed) = (Vec::new(), Vec::new());
        let all = g.sure(&data, 0, (max, 64), h, &mut sure, &mut hashed);
        assert!(!all);
        // 40..90 is followed by a changed chunk (the cut at 90 may
        // differ), 120..320 is too long, 360..400 ends within a longest
        // chunk of the end (cut with what remains).
        assert_eq!(sure, vec![(0, 40), (320, 40)]);
        assert_eq!(hashed.len(), 2);
    }

    /// A file that repeats a chunk: each place finds its own copy, and the
    /// drift stays put (another copy would move the window away).
    #[test]
    fn repeated_chunks_are_found_in_place() {
        let mut f = file(1000);
        // Chunk 10's content also at 600 (later in the file: the map
        // holds the later copy).
        Arc::get_mut(&mut f.refs).unwrap()[600].1 = fp(10);
        f.window(0, 4 << 20);
        f.window(0, 700 << 20);
        assert_eq!(f.find(&fp(10), 10 << 20).unwrap().offset, 10);
        assert_eq!(f.drift, 0);
        assert_eq!(f.find(&fp(10), 600 << 20).unwrap().offset, 600);
        assert_eq!(f.drift, 0);
        // Moved by 1 MiB: found through the map, the drift follows.
        assert_eq!(f.find(&fp(11), 12 << 20).unwrap().offset, 11);
        assert_eq!(f.drift, -(1 << 20));
    }

    #[test]
    fn window_follows_the_file_and_its_drift() {
        // 1 MiB chunks, 1000 of them: a 1000 MiB previous file.
        let mut f = file(1000);
        f.window(0, 4 << 20);
        assert!(f.find(&fp(3), 3 << 20).is_some());
        // Far beyond the window: not found until the window gets there.
        assert!(f.find(&fp(500), 0).is_none());
        f.window(498 << 20, 502 << 20);
        assert_eq!(f.find(&fp(500), 500 << 20).unwrap().offset, 500);
        assert!(f.find(&fp(3), 0).is_none(), "left behind by the window");
        assert!(f.map.len() <= 2 * (WINDOW >> 20) as usize + 8);
        // 200 MiB were inserted: nothing in the window matches, but a
        // sampled chunk (every 64th here) finds the place again.
        f.window(800 << 20, 804 << 20);
        assert!(f.find(&fp(601), 801 << 20).is_none());
        assert_eq!(f.find(&fp(640), 840 << 20).unwrap().offset, 640);
        f.window(900 << 20, 904 << 20);
        assert!(f.find(&fp(702), 902 << 20).is_some());
        // A jump backwards rebuilds the window.
        f.window(0, 1 << 20);
        f.drift = 0;
        f.window(0, 1 << 20);
        assert!(f.find(&fp(0), 0).is_some());
    }
}
