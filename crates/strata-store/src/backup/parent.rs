//! The series' previous version, as a backup uses it: unchanged files take
//! its recipe without being read ([`Parent::reuse`]), and a changed file's
//! new segments are deduplicated chunk by chunk against the same file's
//! chunks in it ([`Parent::file`]).
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

use crate::index::{ChunkLoc, ContainerTable, IndexStrategy, RepoIndex};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use strata_core::format::{ChunkRef, ContainerId, Node, NodeKind, SegmentRef};
use strata_core::Fingerprint;

/// The previous version of the series (empty for a first backup).
pub(crate) struct Parent<'a> {
    /// Its files by path; an unchanged file's entry is taken out when the
    /// walk reuses it (its segments move into the new version).
    nodes: Mutex<HashMap<Vec<u8>, Node>>,
    /// Per entry of the previous recipe's container table: its interned id
    /// in this backup's table, if the container is still in the pool.
    containers: Vec<Option<u32>>,
    strategy: &'a dyn IndexStrategy,
    /// 1 in 64 of its chunk fingerprints (by fingerprint), to estimate how
    /// much of it the new version stores again elsewhere.
    sample: HashSet<Fingerprint>,
    /// Its non-zero chunk references and their bytes.
    pub direct_chunks: u64,
    pub direct_bytes: u64,
}

impl<'a> Parent<'a> {
    /// No previous version.
    pub fn none(strategy: &'a dyn IndexStrategy) -> Self {
        Parent {
            nodes: Mutex::new(HashMap::new()),
            containers: Vec::new(),
            strategy,
            sample: HashSet::new(),
            direct_chunks: 0,
            direct_bytes: 0,
        }
    }

    /// The previous version's files, from its recipe's nodes and container
    /// table. Only pool containers still in the index are used.
    pub fn new(
        nodes: Vec<Node>,
        containers: &[ContainerId],
        index: &RepoIndex,
        table: &ContainerTable,
        strategy: &'a dyn IndexStrategy,
    ) -> Self {
        let containers = containers
            .iter()
            .map(|id| {
                index
                    .containers
                    .get(id)
                    .filter(|c| c.stamp.is_none())
                    .map(|_| table.intern(*id))
            })
            .collect();
        let (mut sample, mut direct_chunks, mut direct_bytes) = (HashSet::new(), 0, 0);
        for c in nodes
            .iter()
            .flat_map(|n| n.segments.iter().flat_map(|s| &s.chunks))
        {
            if c.is_direct() {
                direct_chunks += 1;
                direct_bytes += c.len as u64;
                if is_anchor(&c.fp) {
                    sample.insert(c.fp);
                }
            }
        }
        let nodes = nodes
            .into_iter()
            .filter(|n| n.kind == NodeKind::File)
            .map(|mut n| (std::mem::take(&mut n.path), n))
            .collect();
        Parent {
            nodes: Mutex::new(nodes),
            containers,
            strategy,
            sample,
            direct_chunks,
            direct_bytes,
        }
    }

    /// Whether the previous version (probably) holds chunk `fp`: exact for
    /// the 1 in 64 fingerprints of the sample, `false` for the others.
    pub fn sampled_holds(&self, fp: &Fingerprint) -> bool {
        is_anchor(fp) && self.sample.contains(fp)
    }

    fn loc_of(&self, c: &ChunkRef) -> Option<ChunkLoc> {
        let container = (*self.containers.get(c.container as usize)?)?;
        Some(ChunkLoc {
            container,
            region: c.region,
            offset: c.offset,
            len: c.len,
        })
    }

    /// The previous version's segments of `new` when the file is unchanged
    /// (same size, mtime, ctime and inode), pointing at current locations.
    pub fn reuse(&self, new: &Node) -> Option<Vec<SegmentRef>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let old = nodes.get(&new.path)?;
        if old.size != new.size
            || old.mtime_ns != new.mtime_ns
            || old.ctime_ns != new.ctime_ns
            || old.ino != new.ino
        {
            return None;
        }
        let mut segs = std::mem::take(&mut nodes.get_mut(&new.path)?.segments);
        let mut ok = true;
        'all: for s in &mut segs {
            for c in &mut s.chunks {
                if c.is_zero() {
                    continue;
                }
                // Moved by gc since (or otherwise gone): the current
                // location, if the strategy knows it.
                match self.loc_of(c).or_else(|| self.strategy.lookup_chunk(&c.fp)) {
                    Some(l) => {
                        c.container = l.container;
                        c.region = l.region;
                        c.offset = l.offset;
                    }
                    None => {
                        ok = false;
                        break 'all;
                    }
                }
            }
        }
        if !ok {
            // Read it again; the (partly remapped) segments are of no use.
            nodes.remove(&new.path);
            return None;
        }
        nodes.remove(&new.path);
        Some(segs)
    }

    /// The previous version of the file at `path`, for chunk lookups while
    /// it is read again.
    pub fn file(&self, path: &[u8]) -> Option<ParentFile> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let node = nodes.get(path)?;
        let mut refs = Vec::new();
        let mut offset = 0u64;
        for c in node.segments.iter().flat_map(|s| &s.chunks) {
            if let (false, Some(loc)) = (c.is_zero(), self.loc_of(c)) {
                refs.push((offset, c.fp, loc));
            }
            offset += c.len as u64;
        }
        drop(nodes);
        let anchors = refs
            .iter()
            .enumerate()
            .filter(|(_, r)| is_anchor(&r.1))
            .map(|(i, r)| (r.1, i))
            .collect();
        (!refs.is_empty()).then(|| ParentFile {
            refs,
            anchors,
            map: HashMap::new(),
            lo: 0,
            hi: 0,
            drift: 0,
        })
    }
}

/// Whether a chunk is in the whole-file sample (1 in 64).
fn is_anchor(fp: &Fingerprint) -> bool {
    fp.0[0] & 63 == 0
}

/// Bytes of the previous file looked at on either side of the segment
/// being read (after allowing for the drift of insertions and deletions).
const WINDOW: u64 = 64 << 20;

/// One file of the previous version: its chunks by offset, and a map of
/// those in the current window.
pub(crate) struct ParentFile {
    refs: Vec<(u64, Fingerprint, ChunkLoc)>,
    /// The sample of the whole file, to find the place again.
    anchors: HashMap<Fingerprint, usize>,
    map: HashMap<Fingerprint, usize>,
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

    /// Where the previous file holds chunk `fp`, if in the window or the
    /// sample; `at` is the chunk's offset in the new file.
    pub fn find(&mut self, fp: &Fingerprint, at: u64) -> Option<ChunkLoc> {
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
            .collect();
        ParentFile {
            anchors: (0..n)
                .filter(|i| i % 64 == 0)
                .map(|i| (fp(i as u64), i))
                .collect(),
            refs,
            map: HashMap::new(),
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
