//! Chunk index strategies: where a backup looks chunks up. Each builds
//! its in-RAM structure from the repository's index objects
//! ([`crate::repo::index`]): `exact` (every chunk fingerprint in RAM, the
//! conventional baseline), `segment` (RevDedup's segment index, the
//! default), and `silo` and `binning` ([`crate::engine::similarity`]), all
//! behind the same [`IndexStrategy`] trait.

use crate::error::Result;
use crate::repo::index::RepoIndex;
use crate::repo::Repository;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use strata_core::format::{ContainerId, ContainerMeta, ContainerSummary, SegmentSummary};
use strata_core::Fingerprint;

/// Where a chunk is stored. `container` is an interned id (see
/// [`ContainerTable`]) so an entry stays 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLoc {
    pub container: u32,
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

/// Interns container ids to small integers for compact in-RAM entries.
#[derive(Default)]
pub struct ContainerTable {
    inner: RwLock<(Vec<ContainerId>, HashMap<ContainerId, u32>)>,
}

impl ContainerTable {
    pub fn intern(&self, id: ContainerId) -> u32 {
        if let Some(&i) = self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(&id)
        {
            return i;
        }
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = g.1.get(&id) {
            return i;
        }
        let i = g.0.len() as u32;
        g.0.push(id);
        g.1.insert(id, i);
        i
    }

    pub fn get(&self, i: u32) -> ContainerId {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0[i as usize]
    }

    /// [`Self::get`] for an index that may be out of range.
    pub fn try_get(&self, i: u32) -> Option<ContainerId> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .get(i as usize)
            .copied()
    }

    pub fn lookup(&self, id: &ContainerId) -> Option<u32> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(id)
            .copied()
    }

    pub fn len(&self) -> usize {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dedup index strategy. Backups look chunks up a segment at a time (the
/// coarse unit every strategy can work with) and *claim* each chunk they
/// are about to store, so two workers never store the same new chunk.
pub trait IndexStrategy: Send + Sync {
    fn name(&self) -> &'static str;
    /// For each chunk of a segment, the location of a stored copy if known.
    fn lookup_segment(
        &self,
        segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>>;
    /// Claims a new chunk at `loc`. Returns `None` when the caller must store
    /// it, or the location another writer claimed first.
    fn claim(&self, fp: &Fingerprint, loc: ChunkLoc) -> Option<ChunkLoc>;
    /// Bytes held by the in-RAM structures.
    fn ram_bytes(&self) -> u64;
    /// Number of entries (chunks or segments) indexed.
    fn entries(&self) -> u64;
    /// Location of one chunk by fingerprint, where the strategy knows it
    /// (used to re-resolve reused references after gc moved chunks).
    fn lookup_chunk(&self, _fp: &Fingerprint) -> Option<ChunkLoc> {
        None
    }
    /// True when new segments must be packed whole into one container.
    fn whole_segments(&self) -> bool {
        false
    }
    /// Called after a new segment was stored whole: its non-zero chunks,
    /// their locations, and (container, first chunk entry) of its run in
    /// the container's metadata.
    fn record_segment(
        &self,
        _segment: &Fingerprint,
        _chunks: &[Fingerprint],
        _locs: &[ChunkLoc],
        _at: (u32, u32),
    ) {
    }
    /// Called after the new chunks of a partly new segment were packed
    /// as one run at (container, first chunk entry): lets the strategy
    /// find them by similarity later.
    fn record_run(&self, _chunks: &[Fingerprint], _at: (u32, u32)) {}
    /// For a segment neither it nor the file's previous version knows: the
    /// locations of its chunks in a *similar* stored segment, if the
    /// strategy keeps representatives (`segment`: the stored segment with
    /// the same minimum chunk fingerprint).
    fn lookup_similar(&self, _chunks: &[Fingerprint]) -> Option<Vec<Option<ChunkLoc>>> {
        None
    }
    /// Called when a segment `lookup_segment` handed to this caller to store
    /// was not stored whole after all.
    fn release_segment(&self, _segment: &Fingerprint) {}
    /// Learns the contents of a container listed in the repository index.
    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta);
    /// Learns a container's whole segments, for a strategy that learns
    /// only those ([`Learns::Segments`]).
    fn add_segments(
        &self,
        _table: &ContainerTable,
        _c: &ContainerSummary,
        _segments: &[SegmentSummary],
    ) {
    }
    /// What a backup reads of the repository index for this strategy.
    fn learns(&self) -> Learns {
        Learns::Chunks
    }
    /// Called once a segment (or a group of small files looked up as one)
    /// is stored: every non-zero chunk with its location, its plaintext
    /// bytes, and how many chunks it stored anew.
    fn segment_done(
        &self,
        _segment: &Fingerprint,
        _chunks: &[(Fingerprint, ChunkLoc)],
        _bytes: u64,
        _new_chunks: usize,
    ) -> Result<()> {
        Ok(())
    }
    /// True when small files of one directory should be looked up together
    /// as one segment (SiLo §3.2 principle P1).
    fn groups_small_files(&self) -> bool {
        false
    }
    /// End of a backup, after its containers are written: persist what the
    /// strategy keeps on the side.
    fn finish(&self) -> Result<()> {
        Ok(())
    }
}

/// What an index strategy learns from the repository index when a backup
/// begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learns {
    /// Every chunk entry ([`IndexStrategy::add_container`]): the index
    /// objects are read whole.
    Chunks,
    /// Each container's whole segments ([`IndexStrategy::add_segments`]):
    /// the index summaries, about 1/100 of the bytes.
    Segments,
    /// Only which containers exist: strategies that keep chunk locations
    /// on the side (SiLo's blocks, Extreme Binning's bins).
    Containers,
}

/// Builds the repository's configured index strategy from its index
/// objects, interning container ids in `table`.
pub fn build_strategy(
    repo: &Repository,
    table: &Arc<ContainerTable>,
) -> Result<(Box<dyn IndexStrategy>, RepoIndex)> {
    let spec = crate::repo::IndexSpec::parse(&repo.config().index)?;
    let strategy: Box<dyn IndexStrategy> = match spec.name.as_str() {
        "segment" => Box::new(SegmentIndex::new(repo, table.clone())),
        "silo" => Box::new(crate::engine::similarity::SiloStrategy::new(
            repo,
            table.clone(),
            &spec,
        )?),
        "binning" => Box::new(crate::engine::similarity::BinningStrategy::new(
            repo,
            table.clone(),
        )?),
        _ => Box::new(ExactIndex::default()),
    };
    // Stamped containers hold archival data that expires with its owner:
    // new backups must never reference it, so no strategy learns it.
    let idx = match strategy.learns() {
        Learns::Chunks => RepoIndex::load(repo, |m| {
            if m.stamp.is_none() {
                strategy.add_container(table, m)
            }
        })?,
        Learns::Segments => RepoIndex::load_segments(repo, true, |c, segments| {
            if c.stamp.is_none() {
                strategy.add_segments(table, c, segments)
            }
        })?,
        Learns::Containers => {
            let idx = RepoIndex::load_summaries(repo)?;
            for o in &idx.objects {
                for id in &idx.contents[o] {
                    if idx.containers[id].stamp.is_none() {
                        table.intern(*id);
                    }
                }
            }
            idx
        }
    };
    Ok((strategy, idx))
}

const SHARDS: usize = 64;

/// Fingerprint-keyed hash maps split into shards, so parallel workers
/// rarely contend; shared by the in-RAM strategies.
struct Sharded<V> {
    shards: Vec<Mutex<HashMap<Fingerprint, V>>>,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl<V> Sharded<V> {
    fn shard(&self, fp: &Fingerprint) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, V>> {
        self.shards[fp.0[31] as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
            .sum()
    }

    /// Key + value + hashbrown's control byte, times allocated capacity.
    fn ram_bytes(&self) -> u64 {
        let per = (std::mem::size_of::<Fingerprint>() + std::mem::size_of::<V>() + 1) as u64;
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).capacity() as u64 * per)
            .sum()
    }
}

/// `exact`: every chunk fingerprint → location, in RAM (sharded maps).
#[derive(Default)]
pub struct ExactIndex {
    map: Sharded<ChunkLoc>,
}

impl ExactIndex {
    fn shard(&self, fp: &Fingerprint) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, ChunkLoc>> {
        self.map.shard(fp)
    }

    /// Adds every chunk of a container (first location wins).
    pub fn add_chunks(&self, table: &ContainerTable, meta: &ContainerMeta) {
        let c = table.intern(meta.id);
        for ch in &meta.chunks {
            self.shard(&ch.fp).entry(ch.fp).or_insert(ChunkLoc {
                container: c,
                region: ch.region,
                offset: ch.offset,
                len: ch.len,
            });
        }
    }

    pub fn lookup(&self, fp: &Fingerprint) -> Option<ChunkLoc> {
        self.shard(fp).get(fp).copied()
    }
}

impl IndexStrategy for ExactIndex {
    fn name(&self) -> &'static str {
        "exact"
    }

    fn lookup_segment(
        &self,
        _segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>> {
        chunks.iter().map(|fp| self.lookup(fp)).collect()
    }

    fn claim(&self, fp: &Fingerprint, loc: ChunkLoc) -> Option<ChunkLoc> {
        let mut s = self.shard(fp);
        match s.get(fp) {
            Some(l) => Some(*l),
            None => {
                s.insert(*fp, loc);
                None
            }
        }
    }

    fn ram_bytes(&self) -> u64 {
        self.map.ram_bytes()
    }

    fn entries(&self) -> u64 {
        self.map.len()
    }

    fn lookup_chunk(&self, fp: &Fingerprint) -> Option<ChunkLoc> {
        self.lookup(fp)
    }

    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta) {
        self.add_chunks(table, meta)
    }
}

/// Where a whole segment is stored: a run of chunk entries of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SegLoc {
    container: u32,
    first: u32,
    chunks: u32,
}

impl SegLoc {
    /// Its chunk entries' indexes (a run past any container's end, as a
    /// damaged entry may name, is a miss: `get` finds nothing).
    fn range(&self) -> std::ops::Range<usize> {
        self.first as usize..self.first as usize + self.chunks as usize
    }
}

/// `segment` (RevDedup §2.3): an exact in-RAM index of *segment*
/// fingerprints only — 44 bytes of key and value per ~4 MiB segment, so a
/// petabyte needs ~11 GB instead of terabytes. A new segment is stored
/// whole, in stream order, inside one container; a duplicate segment is
/// referenced chunk by chunk from that container's metadata (read on the
/// hit, cached). There is no chunk-level dedup inline: that is the job of
/// reverse dedup, out of line.
pub struct SegmentIndex {
    repo: Repository,
    table: Arc<ContainerTable>,
    map: Sharded<SegLoc>,
    /// Each stored segment's representative (its minimum chunk
    /// fingerprint, a min-hash: two segments share it with a probability
    /// equal to their resemblance) → where it is stored.
    reps: Sharded<SegLoc>,
    /// Segments stored by the running backup, whose metadata objects may
    /// not be written yet.
    fresh: Mutex<HashMap<Fingerprint, Arc<Vec<ChunkLoc>>>>,
    /// Recently read container chunk lists.
    cache: Mutex<HashMap<u32, Arc<Vec<strata_core::format::ChunkEntry>>>>,
    /// New segments some worker is storing right now; another worker
    /// meeting the same segment waits for it instead of storing it twice.
    pending: Mutex<std::collections::HashSet<Fingerprint>>,
    /// Chunks this backup stored, so a chunk repeated within the backup
    /// (a file copied inside a disk image, say) is stored once: two
    /// generations of at most [`RECENT_CHUNKS`] / 2 entries each, the older
    /// dropped when the newer fills, so it covers the last ~1–2 GB of new
    /// data in bounded RAM.
    recent: Mutex<(
        HashMap<Fingerprint, ChunkLoc>,
        HashMap<Fingerprint, ChunkLoc>,
    )>,
    stored: std::sync::Condvar,
}

/// Chunks of the running backup a `segment` index remembers (~64 bytes
/// each in RAM: at most ~16 MB, the last 128k–256k new chunks).
const RECENT_CHUNKS: usize = 256 << 10;

/// How long a worker waits for another to store a segment before storing
/// it itself (a duplicate is harmless; waiting forever is not). The storer
/// releases the segment on every path, errors included, so this only bites
/// when it is truly stuck: storing may include writing and fsyncing a whole
/// container, which takes seconds on a busy disk.
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl SegmentIndex {
    pub fn new(repo: &Repository, table: Arc<ContainerTable>) -> Self {
        SegmentIndex {
            repo: repo.clone(),
            table,
            map: Sharded::default(),
            reps: Sharded::default(),
            fresh: Mutex::default(),
            cache: Mutex::default(),
            pending: Mutex::default(),
            recent: Mutex::default(),
            stored: std::sync::Condvar::new(),
        }
    }

    fn shard(&self, fp: &Fingerprint) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, SegLoc>> {
        self.map.shard(fp)
    }

    fn container_chunks(&self, c: u32) -> Option<Arc<Vec<strata_core::format::ChunkEntry>>> {
        if let Some(v) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&c) {
            return Some(v.clone());
        }
        let meta = crate::repo::container::read_meta(&self.repo, &self.table.get(c)).ok()?;
        let v = Arc::new(meta.chunks);
        let mut g = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= 64 {
            g.clear();
        }
        g.insert(c, v.clone());
        Some(v)
    }
}

/// A segment's representatives: its minimum and maximum chunk
/// fingerprints (two min-hashes under opposite orders: a similar segment
/// shares at least one with a probability ~ 1 − (1 − resemblance)²).
fn representatives(chunks: &[Fingerprint]) -> Option<[Fingerprint; 2]> {
    SegmentSummary::representatives(chunks.iter().copied())
}

impl SegmentIndex {
    /// Location of a known segment: stored by this backup or indexed.
    fn find(&self, segment: &Fingerprint, chunks: &[Fingerprint]) -> Option<Vec<Option<ChunkLoc>>> {
        if let Some(locs) = self
            .fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(segment)
        {
            if locs.len() == chunks.len() {
                return Some(locs.iter().map(|l| Some(*l)).collect());
            }
        }
        let loc = self.shard(segment).get(segment).copied()?;
        let entries = self.container_chunks(loc.container)?;
        let run = entries.get(loc.range());
        match run {
            // Defensive: the run must hold exactly these chunks.
            Some(run)
                if run.len() == chunks.len()
                    && run.iter().zip(chunks).all(|(e, fp)| e.fp == *fp) =>
            {
                Some(
                    run.iter()
                        .map(|e| {
                            Some(ChunkLoc {
                                container: loc.container,
                                region: e.region,
                                offset: e.offset,
                                len: e.len,
                            })
                        })
                        .collect(),
                )
            }
            _ => None,
        }
    }
}

impl IndexStrategy for SegmentIndex {
    fn name(&self) -> &'static str {
        "segment"
    }

    fn lookup_segment(
        &self,
        segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>> {
        if chunks.is_empty() {
            return vec![];
        }
        let deadline = std::time::Instant::now() + PENDING_WAIT;
        loop {
            if let Some(found) = self.find(segment, chunks) {
                return found;
            }
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            if pending.insert(*segment) || now >= deadline {
                // Ours to store (or waited long enough: store a copy).
                return vec![None; chunks.len()];
            }
            let _ = self.stored.wait_timeout(pending, deadline - now);
        }
    }

    fn claim(&self, fp: &Fingerprint, loc: ChunkLoc) -> Option<ChunkLoc> {
        let mut g = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let (cur, old) = &mut *g;
        if let Some(l) = cur.get(fp).or_else(|| old.get(fp)) {
            return Some(*l);
        }
        cur.insert(*fp, loc);
        if cur.len() >= RECENT_CHUNKS / 2 {
            *old = std::mem::take(cur);
        }
        None
    }

    fn ram_bytes(&self) -> u64 {
        let recent = {
            let g = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            (g.0.capacity() + g.1.capacity()) as u64 * (32 + 16 + 8)
        };
        let main = self.map.ram_bytes() + self.reps.ram_bytes() + recent;
        let fresh: u64 = self
            .fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|v| 40 + v.len() as u64 * std::mem::size_of::<ChunkLoc>() as u64)
            .sum();
        main + fresh
    }

    fn entries(&self) -> u64 {
        self.map.len()
    }

    fn whole_segments(&self) -> bool {
        true
    }

    fn record_segment(
        &self,
        segment: &Fingerprint,
        chunks: &[Fingerprint],
        locs: &[ChunkLoc],
        at: (u32, u32),
    ) {
        self.fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*segment, Arc::new(locs.to_vec()));
        self.record_run(chunks, at);
        self.release_segment(segment);
    }

    fn record_run(&self, chunks: &[Fingerprint], at: (u32, u32)) {
        let loc = SegLoc {
            container: at.0,
            first: at.1,
            chunks: chunks.len() as u32,
        };
        for rep in representatives(chunks).into_iter().flatten() {
            self.reps.shard(&rep).entry(rep).or_insert(loc);
        }
    }

    fn lookup_similar(&self, chunks: &[Fingerprint]) -> Option<Vec<Option<ChunkLoc>>> {
        // The similar segments' chunks, by fingerprint (their containers'
        // metadata is read, and cached, like a segment hit's).
        let mut by_fp: HashMap<Fingerprint, ChunkLoc> = HashMap::new();
        let mut seen = Vec::new();
        for rep in representatives(chunks)? {
            let Some(loc) = self.reps.shard(&rep).get(&rep).copied() else {
                continue;
            };
            if seen.contains(&(loc.container, loc.first)) {
                continue;
            }
            seen.push((loc.container, loc.first));
            let Some(entries) = self.container_chunks(loc.container) else {
                continue;
            };
            let Some(run) = entries.get(loc.range()) else {
                continue;
            };
            for e in run {
                by_fp.entry(e.fp).or_insert(ChunkLoc {
                    container: loc.container,
                    region: e.region,
                    offset: e.offset,
                    len: e.len,
                });
            }
        }
        (!by_fp.is_empty()).then(|| chunks.iter().map(|fp| by_fp.get(fp).copied()).collect())
    }

    fn release_segment(&self, segment: &Fingerprint) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(segment);
        self.stored.notify_all();
    }

    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta) {
        self.add_segments(table, &meta.summary(), &meta.segment_summaries())
    }

    fn add_segments(
        &self,
        table: &ContainerTable,
        c: &ContainerSummary,
        segments: &[SegmentSummary],
    ) {
        let c = table.intern(c.id);
        for s in segments {
            let e = &s.entry;
            let loc = SegLoc {
                container: c,
                first: e.first_chunk,
                chunks: e.chunks,
            };
            self.shard(&e.fp).entry(e.fp).or_insert(loc);
            for rep in s.reps.into_iter().flatten() {
                self.reps.shard(&rep).entry(rep).or_insert(loc);
            }
        }
    }

    fn learns(&self) -> Learns {
        Learns::Segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::format::ChunkEntry;

    #[test]
    fn exact_claims_once() {
        let t = ContainerTable::default();
        let idx = ExactIndex::default();
        let fp = Fingerprint([1; 32]);
        let l = ChunkLoc {
            container: t.intern(ContainerId([9; 16])),
            region: 0,
            offset: 0,
            len: 10,
        };
        assert_eq!(idx.claim(&fp, l), None);
        let l2 = ChunkLoc { offset: 5, ..l };
        assert_eq!(idx.claim(&fp, l2), Some(l));
        assert_eq!(
            idx.lookup_segment(&fp, &[fp, Fingerprint([2; 32])]),
            vec![Some(l), None]
        );
        assert_eq!(idx.entries(), 1);
        assert!(idx.ram_bytes() > 0);
        let meta = ContainerMeta {
            id: ContainerId([3; 16]),
            data_len: 1,
            created: 0,
            stamp: None,
            regions: vec![],
            segments: vec![],
            chunks: vec![ChunkEntry {
                fp: Fingerprint([2; 32]),
                region: 1,
                offset: 2,
                len: 3,
            }],
        };
        idx.add_chunks(&t, &meta);
        assert_eq!(
            idx.lookup(&Fingerprint([2; 32]))
                .map(|l| t.get(l.container)),
            Some(ContainerId([3; 16]))
        );
    }
}
