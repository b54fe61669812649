//! `segment`: RevDedup's index of whole segments.

use super::interface::{IndexStrategy, Learns};
use super::table::{ChunkLoc, ContainerTable, Sharded};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_core::format::{
    ChunkEntry, ContainerId, ContainerMeta, ContainerSummary, SegmentSummary,
};
use strata_core::Fingerprint;

/// Where a [`SegmentIndex`] reads a container's chunk entries (its
/// metadata, from the repository) when a segment it holds is met again.
pub trait ChunkLists: Send + Sync {
    /// Container `id`'s chunk entries (None: unreadable, a miss).
    fn chunks(&self, id: &ContainerId) -> Option<Vec<ChunkEntry>>;
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
    lists: Arc<dyn ChunkLists>,
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
    cache: Mutex<HashMap<u32, Arc<Vec<ChunkEntry>>>>,
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
    /// An empty index over `table`, reading containers' chunk entries
    /// from `lists`.
    pub fn new(lists: Arc<dyn ChunkLists>, table: Arc<ContainerTable>) -> Self {
        SegmentIndex {
            lists,
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

    fn container_chunks(&self, c: u32) -> Option<Arc<Vec<ChunkEntry>>> {
        if let Some(v) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&c) {
            return Some(v.clone());
        }
        let v = Arc::new(self.lists.chunks(&self.table.get(c))?);
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

impl<E> IndexStrategy<E> for SegmentIndex {
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
        IndexStrategy::<E>::record_run(self, chunks, at);
        IndexStrategy::<E>::release_segment(self, segment);
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
        IndexStrategy::<E>::add_segments(self, table, &meta.summary(), &meta.segment_summaries())
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
