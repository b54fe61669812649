//! Random access to the files of a snapshot, for `strata mount` (a
//! read-only FUSE view) and anything else that reads parts of files
//! rather than whole trees.
//!
//! [`crate::ops::restore::dump`] and [`FileReader::copy_to`] stream a file from
//! its first chunk to its last. A file system is asked for 128 KiB at
//! arbitrary offsets instead, often by several threads at once, so here:
//!
//! * [`SnapshotReader`] holds one version's recipe — whole, or as its
//!   [`Skeleton`] (`mount`: a file's chunks are read from the parts
//!   holding it when it is opened) — and builds, the first
//!   time one of its files is opened, one [`Resolver`] for the whole
//!   recipe. Building a resolver reads the metadata of the containers it
//!   covers and follows the indirect chain of a reverse-deduplicated
//!   version through every newer version's recipe — far too much to repeat
//!   per file — so it is done once per snapshot and shared.
//! * [`find_stored`] finds one file of a stored recipe read a part at a
//!   time and opens it (`volume serve --at`, `dump`, Python's
//!   `open_file`): only its chunk runs are kept.
//! * [`FileReader`] holds a file's chunk list (runs of zeros and of a
//!   region's consecutive chunks) with cumulative offsets and
//!   finds the chunks under a byte range by binary search; zero chunks are
//!   synthesised, never read.
//! * [`RegionCache`] keeps recently opened (decompressed, decrypted)
//!   regions, bounded by bytes, least recently used out first, shared by
//!   every reader: consecutive reads inside one 64–128 KiB region open it
//!   once, and two threads wanting the same region wait for one load.

use crate::engine::copies::{is_damage, rebuild_region};
use crate::engine::resolver::{mark_needed, resolver_for, resolver_with, Resolved, Resolver};
use crate::error::{Result, StoreError};
use crate::repo::region::read_region;
use crate::repo::skeleton::Skeleton;
use crate::repo::Repository;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use strata_core::format::{
    path_cmp, ChunkRef, ContainerId, Node, NodeKind, Recipe, RecipeObject, Snapshot,
};
use strata_core::id::{PartId, RecipeId};
use strata_core::Fingerprint;

/// Default bound of a [`RegionCache`]: 64 MiB of plaintext regions.
pub const DEFAULT_REGION_CACHE_BYTES: usize = 64 << 20;

/// Which region of which repository: the repository is part of the key
/// (a hash of its id) so that one cache can serve a repository and its
/// cloud tier, whose containers are distinct objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RegionKey {
    repo: u64,
    container: ContainerId,
    region: u32,
}

/// A cached region and when it was last used.
struct CacheEntry {
    data: Arc<Vec<u8>>,
    tick: u64,
}

#[derive(Default)]
struct CacheState {
    entries: HashMap<RegionKey, CacheEntry>,
    /// Use order: tick → key; the first entry is the least recently used.
    order: BTreeMap<u64, RegionKey>,
    /// Regions some thread is reading now; others wanting them wait.
    loading: HashSet<RegionKey>,
    tick: u64,
    bytes: usize,
    hits: u64,
    misses: u64,
}

/// Plaintext regions recently read, shared by every [`FileReader`]:
/// bounded by `capacity` bytes of region data, least recently used
/// evicted first, safe to use from many threads. A region larger than the
/// whole capacity is returned but not kept.
pub struct RegionCache {
    capacity: usize,
    state: Mutex<CacheState>,
    loaded: Condvar,
}

/// Counters of a [`RegionCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub regions: usize,
    pub bytes: usize,
    pub hits: u64,
    pub misses: u64,
}

/// Removes a key from the loading set and wakes the waiters however the
/// load ends (error or unwinding included).
struct LoadingGuard<'a> {
    cache: &'a RegionCache,
    key: RegionKey,
}

impl Drop for LoadingGuard<'_> {
    fn drop(&mut self) {
        self.cache.lock().loading.remove(&self.key);
        self.cache.loaded.notify_all();
    }
}

impl Default for RegionCache {
    fn default() -> Self {
        RegionCache::new(DEFAULT_REGION_CACHE_BYTES)
    }
}

impl RegionCache {
    /// A cache holding at most `capacity` bytes of region plaintext (0
    /// caches nothing, though concurrent loads of one region still share
    /// one read).
    pub fn new(capacity: usize) -> Self {
        RegionCache {
            capacity,
            state: Mutex::new(CacheState::default()),
            loaded: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current size and hit counters.
    pub fn stats(&self) -> CacheStats {
        let s = self.lock();
        CacheStats {
            regions: s.entries.len(),
            bytes: s.bytes,
            hits: s.hits,
            misses: s.misses,
        }
    }

    /// The plaintext of the region `r` points into, from the cache or
    /// read (and decrypted, decompressed, checked) from `repo`.
    pub fn region(&self, repo: &Repository, r: &Resolved) -> Result<Arc<Vec<u8>>> {
        let key = RegionKey {
            repo: repo_tag(repo),
            container: r.container,
            region: r.region_idx,
        };
        let mut s = self.lock();
        loop {
            if let Some(data) = touch(&mut s, &key) {
                s.hits += 1;
                return Ok(data);
            }
            if !s.loading.contains(&key) {
                break;
            }
            s = self.loaded.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.misses += 1;
        s.loading.insert(key);
        drop(s);
        let guard = LoadingGuard { cache: self, key };
        let data = Arc::new(read_region(repo, &r.container, &r.region)?);
        self.insert(key, data.clone());
        drop(guard);
        Ok(data)
    }

    /// Keeps `data` under `key`, evicting the least recently used
    /// regions beyond the capacity.
    fn insert(&self, key: RegionKey, data: Arc<Vec<u8>>) {
        if data.len() > self.capacity {
            return;
        }
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        s.bytes += data.len();
        s.order.insert(tick, key);
        if let Some(old) = s.entries.insert(key, CacheEntry { data, tick }) {
            s.bytes -= old.data.len();
            s.order.remove(&old.tick);
        }
        while s.bytes > self.capacity {
            let Some((_, victim)) = s.order.pop_first() else {
                break;
            };
            if let Some(e) = s.entries.remove(&victim) {
                s.bytes -= e.data.len();
            }
        }
    }
}

/// A hit: the entry becomes the most recently used.
fn touch(s: &mut CacheState, key: &RegionKey) -> Option<Arc<Vec<u8>>> {
    s.tick += 1;
    let tick = s.tick;
    let e = s.entries.get_mut(key)?;
    let old = std::mem::replace(&mut e.tick, tick);
    let data = e.data.clone();
    s.order.remove(&old);
    s.order.insert(tick, *key);
    Some(data)
}

/// A short tag of a repository (a hash of its id) for cache keys.
fn repo_tag(repo: &Repository) -> u64 {
    let mut h = DefaultHasher::new();
    repo.config().id.hash(&mut h);
    h.finish()
}

/// One version opened for random access to its files: the repository
/// holding its data, the snapshot as that repository records it, its
/// tree, and a resolver for the whole recipe built on first use.
pub struct SnapshotReader {
    repo: Repository,
    snapshot: Snapshot,
    tree: Tree,
    cache: Arc<RegionCache>,
    resolver: Mutex<Option<Arc<Resolver>>>,
}

/// Where a [`SnapshotReader`] takes files' chunks from.
enum Tree {
    /// The recipe, whole in memory.
    Whole(Arc<Recipe>),
    /// The recipe's skeleton: a file's chunks are read from the parts
    /// holding it (in `recipes`) when it is opened.
    Stored {
        skeleton: Arc<Skeleton>,
        recipes: Box<Repository>,
    },
}

impl SnapshotReader {
    /// `repo` holds the data of `snapshot` (the repository itself, or the
    /// cloud tier for a version or part moved there); `recipe` is the
    /// snapshot's recipe, whose nodes [`Self::open`] accepts.
    pub fn new(
        repo: Repository,
        snapshot: Snapshot,
        recipe: Arc<Recipe>,
        cache: Arc<RegionCache>,
    ) -> Self {
        SnapshotReader {
            repo,
            snapshot,
            tree: Tree::Whole(recipe),
            cache,
            resolver: Mutex::new(None),
        }
    }

    /// As [`Self::new`], the recipe held as its `skeleton` (read from
    /// `recipes`): [`Self::open_node`] reads a file's chunks from the
    /// parts holding it, so only the open files' chunk runs are held.
    pub fn stored(
        repo: Repository,
        snapshot: Snapshot,
        skeleton: Arc<Skeleton>,
        recipes: Repository,
        cache: Arc<RegionCache>,
    ) -> Self {
        SnapshotReader {
            repo,
            snapshot,
            tree: Tree::Stored {
                skeleton,
                recipes: Box::new(recipes),
            },
            cache,
            resolver: Mutex::new(None),
        }
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The resolver for the whole recipe, built the first time (a failed
    /// build is not remembered: the next call tries again). Concurrent
    /// first calls wait for one build. (From a skeleton: every container
    /// of its table, and — for a reverse-deduplicated version only — the
    /// indirect fingerprints of one pass over its parts.)
    pub fn resolver(&self) -> Result<Arc<Resolver>> {
        let mut g = self.resolver.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &*g {
            return Ok(r.clone());
        }
        let r = match &self.tree {
            Tree::Whole(recipe) => {
                let nodes: Vec<&Node> = recipe.nodes.iter().collect();
                resolver_for(&self.repo, &self.snapshot, recipe, &nodes)?
            }
            Tree::Stored { skeleton, recipes } => {
                let containers = &skeleton.recipe.containers;
                let used = vec![true; containers.len()];
                let mut indirect = HashSet::new();
                if let (Some(id), Some(_)) = (skeleton.id(), &self.snapshot.archival) {
                    crate::repo::recipe::for_each_piece(recipes, id, |n, _| {
                        let chunks = n.segments.iter().flat_map(|s| &s.chunks);
                        mark_needed(chunks, &mut [], &mut indirect);
                        Ok(())
                    })?;
                }
                resolver_with(&self.repo, &self.snapshot, containers, &used, indirect)?
            }
        };
        let r = Arc::new(r);
        *g = Some(r.clone());
        Ok(r)
    }

    /// A reader of `node`'s content. `node` must be a node of this
    /// reader's recipe (a hard link's caller passes the node it points
    /// to); its chunk references index the recipe's container table. (A
    /// reader of a skeleton finds the node by its path first: prefer
    /// [`Self::open_node`].)
    pub fn open(&self, node: &Node) -> Result<FileReader> {
        not_a_file(node)?;
        match &self.tree {
            Tree::Whole(_) => Ok(FileReader::new(
                &self.repo,
                node,
                self.resolver()?,
                self.cache.clone(),
            )),
            Tree::Stored { skeleton, .. } => {
                let same = |n: &Node| n.path == node.path && n.kind == node.kind;
                let i = skeleton.recipe.nodes.iter().position(same);
                let i = i.ok_or_else(|| {
                    StoreError::Invalid(format!("{} is not in the recipe", node.path_str()))
                })?;
                self.open_node(i)
            }
        }
    }

    /// A reader of node `i` of the recipe (a file's).
    pub fn open_node(&self, i: usize) -> Result<FileReader> {
        let missing = || StoreError::Invalid(format!("no node {i} in the recipe"));
        match &self.tree {
            Tree::Whole(recipe) => self.open(recipe.nodes.get(i).ok_or_else(missing)?),
            Tree::Stored { skeleton, recipes } => {
                let node = skeleton.recipe.nodes.get(i).ok_or_else(missing)?;
                not_a_file(node)?;
                let resolver = self.resolver()?;
                let mut chunks = Vec::new();
                skeleton.chunks_of(recipes, i, |c| push_run(&mut chunks, *c, &resolver))?;
                Ok(FileReader::from_runs(
                    &self.repo,
                    node.path_str(),
                    chunks,
                    resolver,
                    self.cache.clone(),
                ))
            }
        }
    }
}

/// Refuses to read a node that is not a file (a hard link's reader
/// opens the file it names).
fn not_a_file(n: &Node) -> Result<()> {
    match n.kind {
        NodeKind::File => Ok(()),
        k => Err(StoreError::Invalid(format!(
            "/{} is {}, not a file",
            n.path_str(),
            k.noun()
        ))),
    }
}

/// A file of a stored recipe, found by [`find_stored`]: what opening it
/// needs, read from the parts that may hold it.
pub struct StoredFile {
    recipes: Repository,
    parts: RecipeParts,
    /// The path whose chunks are the file's content (a hard link's first
    /// name's).
    content: Vec<u8>,
    shown: String,
    /// The recipe's container table, and each id's number in it.
    containers: Vec<ContainerId>,
    table: HashMap<ContainerId, u32>,
    used: Vec<bool>,
    indirect: HashSet<Fingerprint>,
    /// The parts holding the content's pieces.
    span: Vec<usize>,
}

/// A recipe's parts as [`StoredFile`] reads them: by the list of its
/// index (each part's first path tells where a path can be), or the one
/// object of a version-1 recipe.
enum RecipeParts {
    Index {
        ids: Vec<PartId>,
        firsts: Vec<Vec<u8>>,
    },
    Whole(Arc<Recipe>),
}

impl RecipeParts {
    /// The parts that may hold `path`: the last whose first path comes
    /// before it, and those that begin with it (further pieces of a file).
    fn holding(&self, path: &[u8]) -> std::ops::Range<usize> {
        match self {
            RecipeParts::Whole(_) => 0..1,
            RecipeParts::Index { firsts, .. } => {
                let before = firsts.partition_point(|f| path_cmp(f, path).is_lt());
                let upto = firsts.partition_point(|f| path_cmp(f, path).is_le());
                before.saturating_sub(1)..upto.max(before)
            }
        }
    }

    fn part(&self, recipes: &Repository, k: usize) -> Result<Arc<Recipe>> {
        match self {
            RecipeParts::Whole(r) => Ok(r.clone()),
            RecipeParts::Index { ids, .. } => {
                let id = ids
                    .get(k)
                    .ok_or_else(|| StoreError::Invalid(format!("a recipe has no part {k}")))?;
                Ok(Arc::new(crate::repo::recipe::load_part(recipes, id)?))
            }
        }
    }
}

/// Finds the file `path` of the recipe `id` stored in `recipes`, reading
/// only the parts that may hold it (the recipe's index tells each part's
/// first path). A hard link stands for its first name's content. `None`
/// when the recipe has no `path`; an error when it is neither a file nor
/// a hard link to one.
pub fn find_stored(recipes: &Repository, id: &RecipeId, path: &[u8]) -> Result<Option<StoredFile>> {
    let (parts, containers) = match crate::repo::recipe::load_object(recipes, id)? {
        RecipeObject::Index(i) => {
            let (ids, firsts) = i.parts.into_iter().map(|p| (p.id, p.first)).unzip();
            (RecipeParts::Index { ids, firsts }, i.containers)
        }
        RecipeObject::Whole(r) => {
            let containers = r.containers.clone();
            (RecipeParts::Whole(Arc::new(r)), containers)
        }
    };
    let table = (containers.iter().enumerate())
        .map(|(i, c)| (*c, i as u32))
        .collect();
    let mut f = StoredFile {
        recipes: recipes.clone(),
        parts,
        content: path.to_vec(),
        shown: String::from_utf8_lossy(path).into_owned(),
        used: vec![false; containers.len()],
        containers,
        table,
        indirect: HashSet::new(),
        span: Vec::new(),
    };
    match f.mark(path)? {
        None => Ok(None),
        Some((NodeKind::File, _)) => Ok(Some(f)),
        Some((NodeKind::Hardlink, Some(first))) => match f.mark(&first)? {
            Some((NodeKind::File, _)) => {
                f.content = first;
                Ok(Some(f))
            }
            _ => Err(StoreError::Invalid(format!(
                "/{} is a hard link to a file missing from the snapshot",
                f.shown
            ))),
        },
        // (Named as `ls` shows paths: from the snapshot's root.)
        Some((kind, _)) => Err(StoreError::Invalid(format!(
            "/{} is {}, not a file",
            f.shown,
            kind.noun()
        ))),
    }
}

impl StoredFile {
    /// Reads the parts that may hold `want`: its kind and hard-link
    /// target, the parts holding its pieces, and what resolving its
    /// chunks needs (marked in `used` and `indirect`).
    fn mark(&mut self, want: &[u8]) -> Result<Option<(NodeKind, Option<Vec<u8>>)>> {
        let mut found = None;
        self.span.clear();
        for k in self.parts.holding(want) {
            let part = self.parts.part(&self.recipes, k)?;
            let mut here = false;
            for n in part.nodes.iter().filter(|n| n.path == want) {
                found.get_or_insert_with(|| (n.kind, n.target.clone()));
                here = true;
            }
            if !here {
                continue;
            }
            self.span.push(k);
            let (used, indirect) = (&mut self.used, &mut self.indirect);
            let mut mark = |c: &ChunkRef| {
                crate::engine::resolver::mark_needed(std::iter::once(c), used, indirect)
            };
            crate::repo::skeleton::part_chunks(&part, &self.table, want, &mut mark)?;
        }
        Ok(found)
    }

    /// A reader of the file, its data read from `data` (the recipe's
    /// version is `snapshot`): its chunk runs are all that is kept.
    pub fn open(
        self,
        data: &Repository,
        snapshot: &Snapshot,
        cache: Arc<RegionCache>,
    ) -> Result<FileReader> {
        let resolver = resolver_with(data, snapshot, &self.containers, &self.used, self.indirect)?;
        let resolver = Arc::new(resolver);
        let mut chunks = Vec::new();
        let mut push = |c: &ChunkRef| push_run(&mut chunks, *c, &resolver);
        for &k in &self.span {
            let part = self.parts.part(&self.recipes, k)?;
            crate::repo::skeleton::part_chunks(&part, &self.table, &self.content, &mut push)?;
        }
        Ok(FileReader::from_runs(
            data, self.shown, chunks, resolver, cache,
        ))
    }
}

/// [`find_stored`] and [`StoredFile::open`] in one: the file `path` of
/// version `snapshot` (recipe `id` in `recipes`, data in `data`).
pub fn open_stored(
    recipes: &Repository,
    data: &Repository,
    snapshot: &Snapshot,
    id: &RecipeId,
    path: &[u8],
    cache: Arc<RegionCache>,
) -> Result<Option<FileReader>> {
    find_stored(recipes, id, path)?
        .map(|f| f.open(data, snapshot, cache))
        .transpose()
}

/// Appends `c` to a file's chunk list, as part of the reference before it
/// when it goes on from it: zeros after zeros, or the next bytes of the
/// same region, which `resolver` finds by location alone. A disk image
/// stored in order then takes one reference per run of a region instead
/// of one per 4 KiB chunk (a 100 GiB image: a few MB instead of 1.5 GB).
/// A merged reference keeps its first chunk's fingerprint, never used:
/// only references the resolver may have to look up by fingerprint (an
/// indirect one, or one whose region it does not know) stay whole.
fn push_run(chunks: &mut Vec<ChunkRef>, c: ChunkRef, resolver: &Resolver) {
    if c.is_zero() {
        return strata_core::format::push_chunk(chunks, c);
    }
    if let Some(last) = chunks.last_mut() {
        let goes_on = last.is_direct()
            && (last.container, last.region) == (c.container, c.region)
            && last.offset.checked_add(last.len) == Some(c.offset)
            && resolver.knows_direct(&c);
        if let (true, Some(len)) = (goes_on, last.len.checked_add(c.len)) {
            last.len = len;
            return;
        }
    }
    chunks.push(c)
}

/// Random access to one file's content.
pub struct FileReader {
    repo: Repository,
    path: String,
    chunks: Vec<ChunkRef>,
    /// `ends[i]`: offset just past chunk `i`; ascending.
    ends: Vec<u64>,
    resolver: Arc<Resolver>,
    cache: Arc<RegionCache>,
}

impl FileReader {
    /// A reader of `node`'s chunks, resolved through `resolver` (one
    /// built for the recipe `node` belongs to) and read from `repo`.
    pub fn new(
        repo: &Repository,
        node: &Node,
        resolver: Arc<Resolver>,
        cache: Arc<RegionCache>,
    ) -> Self {
        let mut chunks: Vec<ChunkRef> = Vec::new();
        for c in node.segments.iter().flat_map(|s| s.chunks.iter()) {
            push_run(&mut chunks, *c, &resolver);
        }
        Self::from_runs(repo, node.path_str(), chunks, resolver, cache)
    }

    /// A reader of the chunk list `chunks` ([`push_run`] made it).
    fn from_runs(
        repo: &Repository,
        path: String,
        mut chunks: Vec<ChunkRef>,
        resolver: Arc<Resolver>,
        cache: Arc<RegionCache>,
    ) -> Self {
        chunks.shrink_to_fit();
        let mut end = 0u64;
        let ends = chunks
            .iter()
            .map(|c| {
                end += c.len as u64;
                end
            })
            .collect();
        FileReader {
            repo: repo.clone(),
            path,
            chunks,
            ends,
            resolver,
            cache,
        }
    }

    /// References held in memory for the file: runs of zeros and of a
    /// region's consecutive chunks count once.
    pub fn references(&self) -> usize {
        self.chunks.len()
    }

    /// The file's path in its snapshot (for messages).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file's length in bytes.
    pub fn size(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// `len` bytes from `offset` (up to the end of the file) as runs
    /// (bytes, zeros): a run of zero chunks was never stored and reads as
    /// zeros without reading anything.
    pub fn zero_runs(&self, offset: u64, len: u64) -> Vec<(u64, bool)> {
        let end = self.size().min(offset.saturating_add(len));
        let mut out: Vec<(u64, bool)> = Vec::new();
        let mut i = self.ends.partition_point(|&e| e <= offset);
        let mut pos = offset;
        while pos < end {
            let (Some(c), Some(&c_end)) = (self.chunks.get(i), self.ends.get(i)) else {
                break;
            };
            let hi = end.min(c_end);
            let zero = c.is_zero();
            i += 1;
            if hi == pos {
                continue;
            }
            match out.last_mut() {
                Some((l, z)) if *z == zero => *l += hi - pos,
                _ => out.push((hi - pos, zero)),
            }
            pos = hi;
        }
        out
    }

    /// The region holding the run `c` and the run's offset in it, from
    /// the cache — or, that region damaged, rebuilt where the run lies
    /// from other stored copies of its chunks (not cached).
    fn locate(&self, c: &ChunkRef) -> Result<(Arc<Vec<u8>>, usize)> {
        let r = self.resolver.resolve(c, &self.path)?;
        match self.cache.region(&self.repo, &r) {
            Ok(region) => Ok((region, r.offset as usize)),
            Err(e) => Ok((Arc::new(self.second_copy(&r, c, e)?), r.offset as usize)),
        }
    }

    /// Region `r` rebuilt where run `c` lies from other stored copies,
    /// after reading it failed with `e` (handed back when that is not
    /// damage, or no copy is intact).
    fn second_copy(&self, r: &Resolved, c: &ChunkRef, e: StoreError) -> Result<Vec<u8>> {
        if !is_damage(&e) {
            return Err(e);
        }
        let (plain, _) =
            rebuild_region(&self.repo, &r.container, &r.region, &[(r.offset, c.len)]).ok_or(e)?;
        tracing::warn!(
            "{}: {} is damaged, read from other stored copies",
            self.path,
            crate::repo::data_name(&r.container)
        );
        Ok(plain)
    }

    /// Up to `len` bytes from `offset`: fewer only at the end of the file
    /// (none at or past it).
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let size = self.size();
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut i = self.ends.partition_point(|&e| e <= offset);
        let mut pos = offset;
        while pos < end {
            let (Some(c), Some(&c_end)) = (self.chunks.get(i), self.ends.get(i)) else {
                break;
            };
            let c_start = c_end - c.len as u64;
            let hi = end.min(c_end);
            let (from, to) = ((pos - c_start) as usize, (hi - c_start) as usize);
            if c.is_zero() {
                out.resize(out.len() + (to - from), 0);
            } else {
                let (region, at) = self.locate(c)?;
                let data = region.get(at + from..at + to).ok_or_else(|| {
                    StoreError::Invalid(format!("{}: chunk outside its region", self.path))
                })?;
                out.extend_from_slice(data);
            }
            pos = hi;
            i += 1;
        }
        Ok(out)
    }

    /// Writes the whole file to `out` in order (`dump`): a run of a
    /// region's chunks straight from that region, read once and kept only
    /// while its run is written (no cache: a file read once from start to
    /// end would only churn one), zeros as zeros. Returns the bytes
    /// written.
    pub fn copy_to(&self, out: &mut dyn std::io::Write) -> Result<u64> {
        let zeros = vec![0u8; 1 << 16];
        let mut last: Option<((ContainerId, u32), Vec<u8>)> = None;
        let mut written = 0u64;
        let werr = |e| StoreError::io("write", "output", e);
        for c in &self.chunks {
            if c.is_zero() {
                let mut left = c.len as usize;
                while left > 0 {
                    let n = left.min(zeros.len());
                    out.write_all(&zeros[..n]).map_err(werr)?;
                    left -= n;
                }
            } else {
                let r = self.resolver.resolve(c, &self.path)?;
                let key = (r.container, r.region_idx);
                // A region rebuilt from other copies holds this run only:
                // it is not kept as `last`.
                let (plain, whole) = match last.take() {
                    Some((k, plain)) if k == key => (plain, true),
                    _ => match read_region(&self.repo, &r.container, &r.region) {
                        Ok(p) => (p, true),
                        Err(e) => (self.second_copy(&r, c, e)?, false),
                    },
                };
                let at = r.offset as usize;
                let data = plain.get(at..at + c.len as usize).ok_or_else(|| {
                    StoreError::Invalid(format!("{}: chunk outside its region", self.path))
                })?;
                out.write_all(data).map_err(werr)?;
                if whole {
                    last = Some((key, plain));
                }
            }
            written += c.len as u64;
        }
        out.flush().map_err(werr)?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::backup::BackupOptions;
    use crate::{InitOptions, LocalBackend};
    use std::path::Path;
    use strata_core::chunker::ChunkerParams;
    use strata_core::format::NodeKind;
    use strata_core::id::SnapshotId;

    /// SplitMix64, for file contents and read positions.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// An encrypted repository with small containers and regions, so a
    /// few MB spread over many of both (the integration tests' options).
    fn init(dir: &Path) -> Repository {
        let mut chunker = ChunkerParams::cdc(1024);
        chunker.avg_segment = 64 << 10;
        let opts = InitOptions {
            password: Some(b"pw".to_vec()),
            kdf: strata_core::crypto::KdfCost {
                memory_kib: 256,
                iterations: 1,
            },
            container_size: 256 << 10,
            region_size: 32 << 10,
            chunker,
            index: "exact".into(),
            ..Default::default()
        };
        Repository::init(Arc::new(LocalBackend::new(dir)), opts).unwrap()
    }

    fn backup_dir(repo: &Repository, src: &Path) -> SnapshotId {
        let opts = BackupOptions {
            paths: vec![src.to_path_buf()],
            series: Some("t".into()),
            ..Default::default()
        };
        crate::revdedup::backup(repo, opts, crate::revdedup::After::Lifecycle, &mut |_| {})
            .unwrap()
            .report
            .id
    }

    /// The files of the test tree: empty, small, and 3 MB of random bytes
    /// with a 256 KiB run of zeros in the middle.
    fn files(seed: u64) -> Vec<(&'static str, Vec<u8>)> {
        let mut rng = Rng(seed);
        let mut big = rng.bytes(3 << 20);
        big[1 << 20..(1 << 20) + (256 << 10)].fill(0);
        vec![
            ("empty", Vec::new()),
            ("small", b"hello, mount".to_vec()),
            ("big", big),
        ]
    }

    fn write_files(src: &Path, files: &[(&str, Vec<u8>)]) {
        std::fs::create_dir_all(src).unwrap();
        for (name, data) in files {
            std::fs::write(src.join(name), data).unwrap();
        }
    }

    /// Reads random ranges of every file of snapshot `id` and compares
    /// them with `files`; also reads at and past the end.
    fn check_snapshot(
        repo: &Repository,
        id: &SnapshotId,
        files: &[(&str, Vec<u8>)],
        cache: &Arc<RegionCache>,
    ) {
        let snap = repo.load_snapshot(id).unwrap();
        let recipe = Arc::new(repo.load_recipe(&snap.recipe).unwrap());
        let reader = SnapshotReader::new(repo.clone(), snap, recipe.clone(), cache.clone());
        let mut rng = Rng(7);
        for (name, data) in files {
            let node = recipe
                .nodes
                .iter()
                .find(|n| n.kind == NodeKind::File && n.path.ends_with(name.as_bytes()))
                .unwrap_or_else(|| panic!("{name} not in the snapshot"));
            let f = reader.open(node).unwrap();
            // Runs: a region's chunks (32 KiB regions, ~1 KiB chunks)
            // are one reference in memory (indirect ones stay whole).
            let count: u64 = node.segments.iter().map(|s| s.chunk_count()).sum();
            let indirect = node
                .segments
                .iter()
                .flat_map(|s| &s.chunks)
                .any(|c| c.is_indirect());
            assert!(
                indirect || f.references() as u64 <= count.div_ceil(8),
                "{name}: {} of {count}",
                f.references()
            );
            let size = data.len() as u64;
            assert_eq!(f.size(), size, "{name}");
            let len: u64 = node.segments.iter().map(|s| s.len()).sum();
            assert_eq!(len, size, "{name}");
            assert_eq!(f.read_at(0, data.len() + 100).unwrap(), *data, "{name}");
            for _ in 0..200 {
                let off = rng.below(size + 10);
                let len = rng.below(300 << 10) as usize;
                let got = f.read_at(off, len).unwrap();
                let lo = (off.min(size)) as usize;
                let hi = (off.saturating_add(len as u64).min(size)) as usize;
                assert!(got == data[lo..hi], "{name}: {len} bytes at {off}");
            }
            assert!(f.read_at(size, 10).unwrap().is_empty(), "{name} at EOF");
            assert!(f.read_at(size + 1, 10).unwrap().is_empty(), "{name}");
            assert!(f.read_at(u64::MAX, usize::MAX).unwrap().is_empty());
            if size > 0 {
                let tail = f.read_at(size - 1, 4096).unwrap();
                assert_eq!(tail, data[data.len() - 1..], "{name}: short read");
                let whole = f.read_at(0, usize::MAX).unwrap();
                assert!(whole == *data, "{name}: read of usize::MAX bytes");
            }
        }
    }

    #[test]
    fn read_at_matches_source_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = init(&tmp.path().join("repo"));
        let src = tmp.path().join("src");
        let v1 = files(1);
        write_files(&src, &v1);
        let id = backup_dir(&repo, &src);
        // Room for a few regions only: reads evict and reload.
        let cache = Arc::new(RegionCache::new(256 << 10));
        check_snapshot(&repo, &id, &v1, &cache);
        let st = cache.stats();
        assert!(st.bytes <= 256 << 10, "{st:?}");
        assert!(st.hits > 0 && st.misses > 0, "{st:?}");
        // The big file has zero chunks, which are never read.
        let snap = repo.load_snapshot(&id).unwrap();
        let recipe = repo.load_recipe(&snap.recipe).unwrap();
        assert!(crate::engine::resolver::recipe_refs(&recipe).any(|c| c.is_zero()));
    }

    /// A reverse-deduplicated version reads through its indirect chain.
    #[test]
    fn read_at_follows_indirect_references() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = init(&tmp.path().join("repo"));
        let src = tmp.path().join("src");
        let v1 = files(2);
        write_files(&src, &v1);
        let id1 = backup_dir(&repo, &src);
        let mut v2 = v1.clone();
        v2[2].1[100..200].fill(0xAB);
        v2[1].1 = b"changed".to_vec();
        write_files(&src, &v2);
        let id2 = backup_dir(&repo, &src);
        let policy = crate::repo::lifecycle::Policy {
            series: "t".into(),
            live: 1,
            retain: None,
            retain_days: None,
        };
        crate::repo::lifecycle::set_policy(&repo, &policy).unwrap();
        crate::revdedup::maintain(&repo, &Default::default()).unwrap();
        let snap = repo.load_snapshot(&id1).unwrap();
        assert!(snap.archival.is_some(), "version 1 is not archival");
        let recipe = repo.load_recipe(&snap.recipe).unwrap();
        assert!(crate::engine::resolver::recipe_refs(&recipe).any(|c| c.is_indirect()));
        let cache = Arc::new(RegionCache::default());
        check_snapshot(&repo, &id1, &v1, &cache);
        check_snapshot(&repo, &id2, &v2, &cache);
    }

    /// Many threads reading one file through one small cache.
    #[test]
    fn concurrent_reads_share_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = init(&tmp.path().join("repo"));
        let src = tmp.path().join("src");
        let v1 = files(3);
        write_files(&src, &v1);
        let id = backup_dir(&repo, &src);
        let snap = repo.load_snapshot(&id).unwrap();
        let recipe = Arc::new(repo.load_recipe(&snap.recipe).unwrap());
        let cache = Arc::new(RegionCache::new(1 << 20));
        let reader = SnapshotReader::new(repo.clone(), snap, recipe.clone(), cache.clone());
        let node = recipe
            .nodes
            .iter()
            .find(|n| n.path.ends_with(b"big"))
            .unwrap();
        let f = reader.open(node).unwrap();
        let data = &v1[2].1;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let f = &f;
                s.spawn(move || {
                    let mut rng = Rng(t);
                    for _ in 0..100 {
                        let off = rng.below(data.len() as u64);
                        let got = f.read_at(off, 128 << 10).unwrap();
                        let end = (off as usize + (128 << 10)).min(data.len());
                        assert!(got == data[off as usize..end], "thread {t} at {off}");
                    }
                });
            }
        });
        assert!(cache.stats().bytes <= 1 << 20);
    }

    #[test]
    fn cache_evicts_least_recently_used() {
        let cache = RegionCache::new(30);
        let key = |r| RegionKey {
            repo: 1,
            container: ContainerId([0; 16]),
            region: r,
        };
        for r in 0..3 {
            cache.insert(key(r), Arc::new(vec![r as u8; 10]));
        }
        // Region 0 used again: region 1 is now the oldest.
        assert!(touch(&mut cache.lock(), &key(0)).is_some());
        cache.insert(key(3), Arc::new(vec![3; 10]));
        let s = cache.lock();
        assert!(s.entries.contains_key(&key(0)) && !s.entries.contains_key(&key(1)));
        assert_eq!(s.bytes, 30);
        assert_eq!(s.order.len(), 3);
        drop(s);
        // Larger than the whole cache: not kept.
        cache.insert(key(9), Arc::new(vec![0; 31]));
        assert!(!cache.lock().entries.contains_key(&key(9)));
    }
}
