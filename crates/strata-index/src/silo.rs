//! SiLo (Xia et al., "SiLo: A Similarity-Locality based Near-Exact
//! Deduplication Scheme with Low RAM Overhead and High Throughput", USENIX
//! ATC 2011, §3; docs/design.md "Index strategies": `silo`).
//!
//! - A *segment* (~2 MiB of consecutive chunks; small files of one
//!   directory grouped, large files split — the caller cuts them) is
//!   represented by its minimum chunk key (or its `reps` smallest), its
//!   *representative* (§3.2).
//! - The *similarity table* (SHTable), the only index held in RAM for the
//!   whole repository, maps a representative to the *block* that last
//!   stored a segment with it: ~25 bytes per segment.
//! - A *block* groups the contiguous segments of the stream written
//!   together (`block_bytes` of data, e.g. 256 MiB); its *locality table*
//!   (LHTable) maps every chunk key of those segments to its location, and
//!   is stored on disk as one object (§3.3). Blocks record every chunk of
//!   their segments, duplicates included, so the newest block holding a
//!   representative describes the newest stream around it.
//! - Workflow (§3.5): a segment whose representative hits in the SHTable
//!   loads that block into a FIFO *read cache* (one disk read per similar
//!   segment at most); its chunks, and those of the neighbouring segments
//!   that follow, are looked up in the cached blocks' LHTables and in the
//!   *write buffer* (the block being filled). A chunk found nowhere is new.
//! - Blocks no SHTable entry points at any more are deleted
//!   (`gc_blocks`), so the on-disk index tracks the live stream rather
//!   than the whole history.
//!
//! SiLo is near-exact: a duplicate is missed when neither its segment's
//! representative nor a neighbour's leads to a block holding it.

use crate::frozen::Frozen;
use crate::key::{table_bytes, ChunkKey, IndexError, KeyMap, Location, Result};
use crate::store::BlockStore;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// SiLo's knobs (the segment size belongs to whoever cuts segments).
#[derive(Clone, Debug)]
pub struct SiloConfig {
    /// Data bytes per block (the paper's default 256 MiB).
    pub block_bytes: u64,
    /// Blocks in the FIFO read cache.
    pub cache_blocks: usize,
    /// Representative keys per segment (the smallest ones).
    pub reps: usize,
    /// Delete blocks the similarity table no longer points at.
    pub gc_blocks: bool,
    /// Record segments that were wholly duplicate in the write buffer too.
    /// With it, the newest blocks always describe the newest stream (best
    /// locality) but every backup writes index blocks for all its data;
    /// without it, only segments with new chunks are recorded, so the
    /// on-disk index grows with the changed data only.
    pub record_duplicate_segments: bool,
}

impl Default for SiloConfig {
    fn default() -> Self {
        SiloConfig {
            block_bytes: 256 << 20,
            cache_blocks: 8,
            reps: 1,
            gc_blocks: true,
            record_duplicate_segments: false,
        }
    }
}

/// What SiLo did, for the harness and `strata stats --index`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiloStats {
    pub segments: u64,
    /// Representatives found in the SHTable, and not.
    pub sht_hits: u64,
    pub sht_misses: u64,
    /// SHTable hits whose block was already cached (no disk access).
    pub cache_hits: u64,
    /// Blocks read from disk.
    pub block_loads: u64,
    pub blocks_written: u64,
    pub blocks_deleted: u64,
    pub dup_chunks: u64,
    pub new_chunks: u64,
    /// Wholly duplicate segments left out of the write buffer.
    pub skipped_segments: u64,
}

/// The block being filled (the write buffer).
struct OpenBlock<K, L> {
    id: u64,
    reps: Vec<u128>,
    lht: KeyMap<K, L>,
    data_bytes: u64,
}

impl<K: ChunkKey, L: Location> OpenBlock<K, L> {
    fn new(id: u64) -> Self {
        OpenBlock {
            id,
            reps: Vec::new(),
            lht: KeyMap::default(),
            data_bytes: 0,
        }
    }
}

/// The SiLo index over one stream.
pub struct Silo<K, L> {
    cfg: SiloConfig,
    store: Arc<dyn BlockStore>,
    /// Prefix of block object names.
    prefix: String,
    sht: KeyMap<u128, u64>,
    /// SHTable entries pointing at each block.
    refs: HashMap<u64, u32>,
    /// The read cache, oldest first: blocks as stored (frozen tables,
    /// probed in place).
    cache: VecDeque<Arc<Frozen<K, L>>>,
    wb: OpenBlock<K, L>,
    next_block: u64,
    /// SHTable entries set since the last [`Silo::take_changes`].
    changed: Vec<(u128, u64)>,
    deleted: Vec<u64>,
    pub stats: SiloStats,
}

impl<K: ChunkKey, L: Location> Silo<K, L> {
    /// An empty index whose blocks are named `{prefix}{id}` in `store`.
    pub fn new(cfg: SiloConfig, store: Arc<dyn BlockStore>, prefix: &str) -> Self {
        Self::with_table(cfg, store, prefix, HashMap::new(), 0)
    }

    /// An index resuming from a persisted similarity table; new blocks get
    /// ids from `next_block` on (writers that may run at once must use
    /// disjoint ranges).
    pub fn with_table(
        cfg: SiloConfig,
        store: Arc<dyn BlockStore>,
        prefix: &str,
        sht: HashMap<u128, u64>,
        next_block: u64,
    ) -> Self {
        let mut refs: HashMap<u64, u32> = HashMap::new();
        for b in sht.values() {
            *refs.entry(*b).or_default() += 1;
        }
        Silo {
            wb: OpenBlock::new(next_block),
            next_block: next_block + 1,
            cfg,
            store,
            prefix: prefix.to_string(),
            sht: sht.into_iter().collect(),
            refs,
            cache: VecDeque::new(),
            changed: Vec::new(),
            deleted: Vec::new(),
            stats: SiloStats::default(),
        }
    }

    pub fn block_name(&self, id: u64) -> String {
        format!("{}{id}", self.prefix)
    }

    /// The `reps` smallest key prefixes.
    fn representatives(&self, keys: impl Iterator<Item = u128>) -> Vec<u128> {
        let k = self.cfg.reps.max(1);
        let mut best: Vec<u128> = Vec::with_capacity(k + 1);
        for p in keys {
            if best.contains(&p) {
                continue;
            }
            if best.len() < k {
                best.push(p);
                best.sort_unstable();
            } else if p < best[k - 1] {
                best[k - 1] = p;
                best.sort_unstable();
            }
        }
        best
    }

    fn ensure_cached(&mut self, id: u64) -> Result<()> {
        if id == self.wb.id || self.cache.iter().any(|b| b.id() == id) {
            self.stats.cache_hits += 1;
            return Ok(());
        }
        let name = self.block_name(id);
        let raw = self.store.get(&name)?;
        let block = Frozen::from_bytes(&name, raw)?;
        if block.id() != id {
            return Err(IndexError::Decode {
                name,
                msg: format!("holds block {}", block.id()),
            });
        }
        self.stats.block_loads += 1;
        self.push_cache(Arc::new(block));
        Ok(())
    }

    fn push_cache(&mut self, b: Arc<Frozen<K, L>>) {
        self.cache.push_back(b);
        while self.cache.len() > self.cfg.cache_blocks.max(1) {
            self.cache.pop_front();
        }
    }

    /// Finds a key: in the write buffer, then in the block the segment's
    /// representative led to (most chunks of a similar segment are there),
    /// then in the other cached blocks, newest first.
    fn find(&self, k: &K, first: Option<&Frozen<K, L>>) -> Option<L> {
        if let Some(l) = self.wb.lht.get(k) {
            return Some(*l);
        }
        if let Some(l) = first.and_then(|b| b.get(k)) {
            return Some(l);
        }
        let skip = first.map(|b| b.id());
        self.cache
            .iter()
            .rev()
            .filter(|b| Some(b.id()) != skip)
            .find_map(|b| b.get(k))
    }

    /// Looks up one segment: loads the block of each representative that
    /// hits in the SHTable, then finds each chunk in the write buffer or
    /// the cached blocks.
    pub fn lookup(&mut self, keys: &[K]) -> Result<Vec<Option<L>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut first = None;
        for rep in self.representatives(keys.iter().map(|k| k.prefix())) {
            match self.sht.get(&rep).copied() {
                Some(b) => {
                    self.stats.sht_hits += 1;
                    // A block deleted meanwhile (or damaged) only costs
                    // duplicates: the lookup goes on without it.
                    if self.ensure_cached(b).is_err() {
                        self.sht.remove(&rep);
                    } else if first.is_none() {
                        first = self.cache.iter().rev().find(|x| x.id() == b).cloned();
                    }
                }
                None => self.stats.sht_misses += 1,
            }
        }
        let out: Vec<Option<L>> = keys
            .iter()
            .map(|k| self.find(k, first.as_deref()))
            .collect();
        let dups = out.iter().filter(|x| x.is_some()).count() as u64;
        self.stats.dup_chunks += dups;
        self.stats.new_chunks += keys.len() as u64 - dups;
        Ok(out)
    }

    /// Reserves a new chunk in the write buffer; returns the location of a
    /// copy another writer stored first.
    pub fn claim(&mut self, k: K, l: L) -> Option<L> {
        if let Some(x) = self.wb.lht.get(&k) {
            return Some(*x);
        }
        self.wb.lht.insert(k, l);
        None
    }

    /// Records a segment once its chunks are stored (`new_chunks` of them
    /// were new): all its chunks go into the write buffer's LHTable and its
    /// representatives now point at the write buffer's block. Flushes the
    /// block when full.
    pub fn add_segment(
        &mut self,
        chunks: &[(K, L)],
        data_bytes: u64,
        new_chunks: usize,
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        if !self.cfg.record_duplicate_segments && new_chunks == 0 {
            // Its representatives keep pointing at the block that holds it.
            self.stats.segments += 1;
            self.stats.skipped_segments += 1;
            return Ok(());
        }
        for (k, l) in chunks {
            self.wb.lht.entry(*k).or_insert(*l);
        }
        let wb = self.wb.id;
        for rep in self.representatives(chunks.iter().map(|(k, _)| k.prefix())) {
            self.wb.reps.push(rep);
            let old = self.sht.insert(rep, wb);
            if old != Some(wb) {
                *self.refs.entry(wb).or_default() += 1;
                self.changed.push((rep, wb));
                if let Some(o) = old {
                    self.release(o)?;
                }
            }
        }
        self.wb.data_bytes += data_bytes;
        self.stats.segments += 1;
        if self.wb.data_bytes >= self.cfg.block_bytes {
            self.flush()?;
        }
        Ok(())
    }

    fn release(&mut self, id: u64) -> Result<()> {
        let gone = match self.refs.get_mut(&id) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if gone {
            self.refs.remove(&id);
            if self.cfg.gc_blocks && id != self.wb.id {
                self.store.delete(&self.block_name(id))?;
                self.deleted.push(id);
                self.stats.blocks_deleted += 1;
            }
        }
        Ok(())
    }

    /// Writes the write buffer's block and starts a new one (at the end of
    /// a stream, or when it is full). The written block joins the read
    /// cache: the next segments are most likely its neighbours.
    pub fn flush(&mut self) -> Result<()> {
        if self.wb.lht.is_empty() {
            return Ok(());
        }
        let id = self.wb.id;
        let full = std::mem::replace(&mut self.wb, OpenBlock::new(self.next_block));
        self.next_block += 1;
        let name = self.block_name(id);
        let bytes = Frozen::<K, L>::build(
            id,
            &full.reps,
            full.lht.len(),
            full.lht.iter().map(|(k, l)| (*k, *l)),
        );
        self.store.put(&name, &bytes)?;
        self.stats.blocks_written += 1;
        if !self.refs.contains_key(&id) && self.cfg.gc_blocks {
            // Every representative it held moved on within the block's
            // own lifetime: nothing will look for it.
            self.store.delete(&name)?;
            self.deleted.push(id);
            self.stats.blocks_deleted += 1;
        }
        self.push_cache(Arc::new(Frozen::from_bytes(&name, bytes)?));
        Ok(())
    }

    /// SHTable entries set and blocks deleted since the last call (what
    /// the repository persists after a backup).
    pub fn take_changes(&mut self) -> (Vec<(u128, u64)>, Vec<u64>) {
        (
            std::mem::take(&mut self.changed),
            std::mem::take(&mut self.deleted),
        )
    }

    /// The id the next block will get.
    pub fn next_block(&self) -> u64 {
        self.wb.id
    }

    pub fn entries(&self) -> u64 {
        self.sht.len() as u64
    }

    /// The similarity table (representative → block), for persisting.
    pub fn table(&self) -> impl Iterator<Item = (u128, u64)> + '_ {
        self.sht.iter().map(|(r, b)| (*r, *b))
    }

    /// RAM of the similarity table alone (grows with the data).
    pub fn sht_ram_bytes(&self) -> u64 {
        table_bytes(self.sht.capacity(), 16 + 8) + table_bytes(self.refs.capacity(), 8 + 4)
    }

    /// RAM of everything: similarity table, read cache and write buffer
    /// (the last two are bounded by the configuration).
    pub fn ram_bytes(&self) -> u64 {
        self.sht_ram_bytes()
            + self.cache.iter().map(|b| b.ram_bytes()).sum::<u64>()
            + table_bytes(
                self.wb.lht.capacity(),
                std::mem::size_of::<K>() + std::mem::size_of::<L>(),
            )
            + self.wb.reps.capacity() as u64 * 16
            + self.changed.capacity() as u64 * 24
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemStore, StoreStats};

    fn key(i: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        let h = blake3::hash(&i.to_le_bytes());
        b.copy_from_slice(&h.as_bytes()[..16]);
        b
    }

    fn silo(block_bytes: u64, cache: usize) -> (Silo<[u8; 16], u64>, Arc<MemStore>) {
        let store = Arc::new(MemStore::default());
        let s = Silo::new(
            SiloConfig {
                block_bytes,
                cache_blocks: cache,
                reps: 1,
                gc_blocks: true,
                record_duplicate_segments: true,
            },
            store.clone(),
            "blk/",
        );
        (s, store)
    }

    /// Feeds a stream of chunk ids in segments of `seg` chunks; returns the
    /// number of chunks found duplicate.
    fn feed(s: &mut Silo<[u8; 16], u64>, ids: &[u64], seg: usize) -> u64 {
        let mut dups = 0;
        for part in ids.chunks(seg) {
            let keys: Vec<[u8; 16]> = part.iter().map(|i| key(*i)).collect();
            let found = s.lookup(&keys).unwrap();
            let chunks: Vec<([u8; 16], u64)> = keys
                .iter()
                .zip(part)
                .zip(&found)
                .map(|((k, i), f)| {
                    if f.is_some() {
                        dups += 1;
                    }
                    (*k, f.unwrap_or(*i))
                })
                .collect();
            let new = found.iter().filter(|f| f.is_none()).count();
            s.add_segment(&chunks, part.len() as u64 * 8192, new)
                .unwrap();
        }
        s.flush().unwrap();
        dups
    }

    #[test]
    fn second_identical_stream_is_all_duplicate() {
        let (mut s, store) = silo(64 * 8192 * 4, 4);
        let v1: Vec<u64> = (0..4096).collect();
        assert_eq!(feed(&mut s, &v1, 64), 0);
        assert_eq!(feed(&mut s, &v1, 64), 4096);
        // One SHTable entry per segment, far fewer than chunks.
        assert_eq!(s.entries(), 64);
        assert!(s.stats.block_loads <= 16, "{:?}", s.stats);
        assert!(StoreStats::get(&store.stats().writes) >= 16);
    }

    #[test]
    fn locality_finds_what_similarity_misses() {
        // Blocks of two segments, a one-block cache. Version 2 changes the
        // minimum chunk of every odd segment, so its representative misses;
        // the block loaded for the even segment before it (same block)
        // still finds its other chunks.
        let (mut s, _) = silo(64 * 8192 * 2, 1);
        let v1: Vec<u64> = (0..2048).collect();
        feed(&mut s, &v1, 64);
        let mut v2 = v1.clone();
        for seg in v2.chunks_mut(64) {
            if seg[0] % 128 == 64 {
                let (pos, _) = seg
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, i)| key(**i).prefix())
                    .unwrap();
                seg[pos] += 1_000_000;
            }
        }
        let changed = v2.iter().filter(|i| **i >= 1_000_000).count() as u64;
        assert_eq!(changed, 16);
        let dups = feed(&mut s, &v2, 64);
        assert_eq!(dups, 2048 - changed, "{:?}", s.stats);
        assert!(s.stats.sht_misses >= 16, "{:?}", s.stats);
    }

    #[test]
    fn read_cache_is_fifo_and_bounded() {
        let (mut s, _) = silo(64 * 8192, 2);
        let v1: Vec<u64> = (0..64 * 8).collect();
        feed(&mut s, &v1, 64);
        assert!(s.cache.len() <= 2);
        let before = s.stats.block_loads;
        // Segment 0's block is long gone from the cache: a disk read.
        feed(&mut s, &v1[..64], 64);
        assert_eq!(s.stats.block_loads, before + 1);
    }

    #[test]
    fn superseded_blocks_are_deleted() {
        let (mut s, store) = silo(64 * 8192 * 2, 2);
        let v1: Vec<u64> = (0..1024).collect();
        for _ in 0..5 {
            feed(&mut s, &v1, 64);
        }
        // Every representative now points at the last stream's blocks.
        assert!(s.stats.blocks_deleted > 0);
        let live: std::collections::HashSet<u64> = s.table().map(|(_, b)| b).collect();
        assert_eq!(store.bytes() > 0, !live.is_empty());
        for id in live {
            assert!(store.get(&s.block_name(id)).is_ok());
        }
        // And resuming from the table finds the same duplicates.
        let (changes, _) = s.take_changes();
        assert!(!changes.is_empty());
        let mut again: Silo<[u8; 16], u64> = Silo::with_table(
            s.cfg.clone(),
            store.clone(),
            "blk/",
            s.table().collect(),
            s.next_block(),
        );
        assert_eq!(feed(&mut again, &v1, 64), 1024);
    }

    #[test]
    fn claim_reserves_once() {
        let (mut s, _) = silo(1 << 30, 2);
        assert_eq!(s.claim(key(1), 10), None);
        assert_eq!(s.claim(key(1), 11), Some(10));
        assert_eq!(s.lookup(&[key(1), key(2)]).unwrap(), vec![Some(10), None]);
        assert!(s.ram_bytes() > 0);
    }
}
