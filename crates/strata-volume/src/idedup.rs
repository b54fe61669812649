//! iDedup (Srinivasan et al., FAST '12) §3.4 and §4: the dedup-metadata
//! cache and the sequence algorithm that decides, at destage, which
//! freshly written blocks become references to blocks already on disk.
//!
//! * [`MetaCache`] — a fixed pool of content nodes (fingerprint → disk
//!   block number, DBN) in LRU order, a fingerprint table whose entries
//!   hold the dup-list of every DBN with that content (kept sorted, the
//!   paper's dup-tree), and a DBN table to drop a node when its block is
//!   freed. Memory is bounded by the pool size.
//! * [`find_sequences`] — breadth-first sequence identification over the
//!   dirty blocks of one extent (consecutive logical blocks), tracking
//!   every growing sequence ⟨last block, length, last DBN⟩; a sequence
//!   that ends is kept when it has at least `threshold` blocks, minus the
//!   blocks it shares with sequences still growing (§3.4.2's overlap
//!   heuristic: when what remains is shorter than the threshold, defer
//!   to the growing ones).

use std::collections::HashMap;

/// A block's content fingerprint (128 bits, as the paper's MD5).
pub type Fp = [u8; 16];

/// Fingerprint of a 4 KiB block.
pub fn fingerprint(block: &[u8]) -> Fp {
    let h = blake3::hash(block);
    let mut f = [0u8; 16];
    f.copy_from_slice(&h.as_bytes()[..16]);
    f
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    fp: Fp,
    dbn: u64,
    /// When it was last used (a counter), to drop the stalest duplicate.
    used: u64,
    prev: u32,
    next: u32,
}

/// The dedup-metadata cache: at most `capacity` content nodes.
pub struct MetaCache {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recently used at `head`.
    head: u32,
    tail: u32,
    capacity: usize,
    /// fingerprint → node indices, sorted by DBN (the dup-list).
    by_fp: HashMap<Fp, Vec<u32>>,
    by_dbn: HashMap<u64, u32>,
    clock: u64,
    pub lookups: u64,
    pub hits: u64,
    pub evictions: u64,
}

/// Bytes one cached block costs: its node, its place in both tables.
pub const NODE_BYTES: usize = std::mem::size_of::<Node>() + 16 + 8 + 4 + 8 + 4 + 16;

/// Longest dup-list kept per fingerprint (the oldest DBNs drop out).
const MAX_DUPS: usize = 64;

impl MetaCache {
    /// A cache of `bytes` of memory (at least 1024 nodes).
    pub fn with_bytes(bytes: u64) -> MetaCache {
        let capacity = ((bytes as usize) / NODE_BYTES).max(1024);
        MetaCache {
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
            by_fp: HashMap::new(),
            by_dbn: HashMap::new(),
            clock: 0,
            lookups: 0,
            hits: 0,
            evictions: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.by_dbn.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_dbn.is_empty()
    }

    /// Memory the cache holds now (nodes and tables, by their capacity).
    pub fn memory_bytes(&self) -> u64 {
        let nodes = self.nodes.capacity() * std::mem::size_of::<Node>();
        let fp = self.by_fp.capacity() * (16 + std::mem::size_of::<Vec<u32>>() + 8)
            + self.by_fp.values().map(|v| v.capacity() * 4).sum::<usize>();
        let dbn = self.by_dbn.capacity() * (8 + 4 + 8);
        (nodes + fp + dbn + self.free.capacity() * 4) as u64
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn touch(&mut self, i: u32) {
        self.clock += 1;
        self.nodes[i as usize].used = self.clock;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// DBNs holding `fp`, ascending (empty when not cached); counts a
    /// lookup and touches what it finds.
    pub fn lookup(&mut self, fp: &Fp) -> Vec<u64> {
        self.lookups += 1;
        let Some(list) = self.by_fp.get(fp) else {
            return Vec::new();
        };
        let idx = list.clone();
        self.hits += 1;
        let dbns = idx.iter().map(|&i| self.nodes[i as usize].dbn).collect();
        for i in idx {
            self.touch(i);
        }
        dbns
    }

    /// Records that block `dbn` holds `fp`, evicting the least recently
    /// used node when the pool is full.
    pub fn insert(&mut self, fp: Fp, dbn: u64) {
        if let Some(&i) = self.by_dbn.get(&dbn) {
            if self.nodes[i as usize].fp == fp {
                self.touch(i);
                return;
            }
            self.remove(dbn);
        }
        if self.by_dbn.len() >= self.capacity {
            let t = self.tail;
            let victim = self.nodes[t as usize].dbn;
            self.remove(victim);
            self.evictions += 1;
        }
        self.clock += 1;
        let node = Node {
            fp,
            dbn,
            used: self.clock,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.push_front(i);
        self.by_dbn.insert(dbn, i);
        let nodes = &self.nodes;
        let list = self.by_fp.entry(fp).or_default();
        let pos = list.partition_point(|&j| nodes[j as usize].dbn < dbn);
        list.insert(pos, i);
        if list.len() > MAX_DUPS {
            // Drop the least recently used duplicate.
            let stalest = list.iter().copied().min_by_key(|&j| nodes[j as usize].used);
            if let Some(j) = stalest {
                let d = nodes[j as usize].dbn;
                self.remove(d);
            }
        }
    }

    /// Forgets block `dbn` (it was freed or overwritten).
    pub fn remove(&mut self, dbn: u64) {
        let Some(i) = self.by_dbn.remove(&dbn) else {
            return;
        };
        self.unlink(i);
        let fp = self.nodes[i as usize].fp;
        if let Some(list) = self.by_fp.get_mut(&fp) {
            list.retain(|&j| j != i);
            if list.is_empty() {
                self.by_fp.remove(&fp);
            }
        }
        self.free.push(i);
    }
}

/// A run of blocks to map onto existing ones: blocks `start..start+len`
/// of the extent take DBNs `dbn..dbn+len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dedup {
    pub start: usize,
    pub len: usize,
    pub dbn: u64,
}

#[derive(Clone, Copy, Debug)]
struct Seq {
    /// First block (index into the extent).
    first: usize,
    len: usize,
    /// DBN of the last block.
    last_dbn: u64,
}

/// The disk blocks of the logical blocks just before and just after an
/// extent, when mapped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    pub before: Option<u64>,
    pub after: Option<u64>,
}

/// The iDedup decision for one extent: `dups[i]` are the DBNs already
/// holding block i's content (ascending). Returns the runs to deduplicate
/// (disjoint, each at least `threshold` long); every other block is
/// written anew.
pub fn find_sequences(dups: &[Vec<u64>], threshold: usize) -> Vec<Dedup> {
    find_sequences_between(dups, threshold, Edges::default())
}

/// [`find_sequences`] of an extent between two mapped logical blocks
/// (`edges`): a run at the extent's start that goes on from the disk
/// block before it, or at its end that leads into the disk block after
/// it, is taken however short. The threshold keeps a read from jumping
/// to a short run elsewhere on disk; such a run continues its neighbour
/// on disk, so a read goes straight on (a rewrite of what was there, or
/// a copy cut by a batch's end), beyond the paper, which looks at each
/// extent alone.
pub fn find_sequences_between(dups: &[Vec<u64>], threshold: usize, edges: Edges) -> Vec<Dedup> {
    let threshold = threshold.max(1);
    let n = dups.len();
    let anchored = |s: &Seq| {
        let first_dbn = s.last_dbn + 1 - s.len as u64;
        let from = s.first == 0 && edges.before.and_then(|b| b.checked_add(1)) == Some(first_dbn);
        let to = s.first + s.len == n && s.last_dbn.checked_add(1) == edges.after;
        (from, to)
    };
    let mut claimed = vec![false; n];
    let mut out = Vec::new();
    // Growing sequences, keyed by the DBN of their last block.
    let mut active: HashMap<u64, Seq> = HashMap::new();
    for i in 0..=n {
        let mut next: HashMap<u64, Seq> = HashMap::new();
        if let Some(here) = dups.get(i) {
            for &d in here {
                let s = match d.checked_sub(1).and_then(|p| active.get(&p)) {
                    Some(s) => Seq {
                        first: s.first,
                        len: s.len + 1,
                        last_dbn: d,
                    },
                    None => Seq {
                        first: i,
                        len: 1,
                        last_dbn: d,
                    },
                };
                next.insert(d, s);
            }
        }
        // Sequences that did not grow have ended: longest first.
        let mut ended: Vec<Seq> = active
            .values()
            .filter(|s| {
                next.get(&(s.last_dbn + 1))
                    .is_none_or(|t| t.first != s.first)
            })
            .copied()
            .collect();
        // (Of two as long, one continuing a neighbour first: a rewrite of
        // what was there stays where it was.)
        let edge = |s: &Seq| {
            let (from, to) = anchored(s);
            from || to
        };
        ended.sort_by(|a, b| {
            b.len
                .cmp(&a.len)
                .then(edge(b).cmp(&edge(a)))
                .then(a.first.cmp(&b.first))
        });
        for s in ended {
            let (from, to) = anchored(&s);
            if s.len < threshold && !from && !to {
                continue;
            }
            // Blocks still covered by a growing sequence are left to it.
            let growing_from = next
                .values()
                .filter(|t| t.len > 1)
                .map(|t| t.first)
                .min()
                .unwrap_or(usize::MAX);
            let need = Need {
                threshold,
                from,
                to,
            };
            claim(&s, growing_from, need, &mut claimed, &mut out);
        }
        active = next;
    }
    out.sort_by_key(|d| d.start);
    out
}

/// How long a stretch of a sequence must be to be kept: `threshold`,
/// or any length for the stretch that begins the sequence when it goes
/// on from the disk block before the extent (`from`), and for the one
/// that ends it when it leads into the one after (`to`).
#[derive(Clone, Copy)]
struct Need {
    threshold: usize,
    from: bool,
    to: bool,
}

/// Keeps the stretches of `s` that no one claimed and no growing
/// sequence covers, when they are long enough ([`Need`]).
fn claim(s: &Seq, growing_from: usize, need: Need, claimed: &mut [bool], out: &mut Vec<Dedup>) {
    let first_dbn = s.last_dbn + 1 - s.len as u64;
    let end = s.first + s.len;
    let mut i = s.first;
    while i < end {
        if claimed[i] || i >= growing_from {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < end && !claimed[j] && j < growing_from {
            j += 1;
        }
        let edge = (need.from && i == s.first) || (need.to && j == end);
        if j - i >= need.threshold || (edge && j > i) {
            for c in &mut claimed[i..j] {
                *c = true;
            }
            out.push(Dedup {
                start: i,
                len: j - i,
                dbn: first_dbn + (i - s.first) as u64,
            });
        }
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_run_below_the_threshold_is_written() {
        let dups: Vec<Vec<u64>> = (0..3).map(|i| vec![100 + i]).collect();
        assert!(find_sequences(&dups, 4).is_empty());
        assert_eq!(
            find_sequences(&dups, 3),
            vec![Dedup {
                start: 0,
                len: 3,
                dbn: 100
            }]
        );
    }

    #[test]
    fn the_longest_sequence_wins_among_duplicates() {
        // Block contents A B C D E; A..E on disk at 10..14, B C also at 50 51.
        let dups = vec![vec![10], vec![11, 50], vec![12, 51], vec![13], vec![14]];
        assert_eq!(
            find_sequences(&dups, 2),
            vec![Dedup {
                start: 0,
                len: 5,
                dbn: 10
            }]
        );
    }

    #[test]
    fn overlap_defers_to_growing_sequences() {
        // The paper's Figure 3 shape: S1 covers blocks 0..6 and ends; S2
        // (from block 3) keeps growing to block 10. S1's non-overlapped
        // part, blocks 0..3, is below the threshold 4: S1 is rejected and
        // S2 taken whole.
        let mut dups: Vec<Vec<u64>> = Vec::new();
        for i in 0..11u64 {
            let mut d = Vec::new();
            if i < 6 {
                d.push(100 + i);
            }
            if i >= 3 {
                d.push(200 + i);
            }
            dups.push(d);
        }
        assert_eq!(
            find_sequences(&dups, 4),
            vec![Dedup {
                start: 3,
                len: 8,
                dbn: 203
            }]
        );
    }

    #[test]
    fn the_cache_evicts_least_recently_used() {
        let mut c = MetaCache::with_bytes(0);
        let cap = c.capacity() as u64;
        for d in 0..cap {
            c.insert(
                [
                    d as u8,
                    (d >> 8) as u8,
                    1,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                ],
                d,
            );
        }
        // Touch block 0, then add one more: block 1 goes, not 0.
        assert_eq!(
            c.lookup(&[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            vec![0]
        );
        c.insert([9; 16], cap);
        assert_eq!(c.len(), cap as usize);
        assert_eq!(
            c.lookup(&[1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Vec::<u64>::new()
        );
        assert_eq!(
            c.lookup(&[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            vec![0]
        );
        assert_eq!(c.evictions, 1);
        // A dup-list is sorted by DBN; removal drops one entry.
        c.insert([7; 16], 500);
        c.insert([7; 16], 300);
        c.insert([7; 16], 400);
        assert_eq!(c.lookup(&[7; 16]), vec![300, 400, 500]);
        c.remove(400);
        assert_eq!(c.lookup(&[7; 16]), vec![300, 500]);
    }

    #[test]
    fn a_short_run_continuing_a_neighbour_is_taken() {
        // Two blocks whose duplicates follow the disk block before the
        // extent (a rewrite of what was there), and two that lead into
        // the one after it.
        let dups = vec![vec![11], vec![12]];
        let before = Edges {
            before: Some(10),
            after: None,
        };
        let after = Edges {
            before: None,
            after: Some(13),
        };
        let want = vec![Dedup {
            start: 0,
            len: 2,
            dbn: 11,
        }];
        assert_eq!(find_sequences_between(&dups, 4, before), want);
        assert_eq!(find_sequences_between(&dups, 4, after), want);
        // Elsewhere on disk: below the threshold, written anew.
        let apart = Edges {
            before: Some(30),
            after: Some(40),
        };
        assert!(find_sequences_between(&dups, 4, apart).is_empty());
        // Only the stretch at the edge: a short run inside is not.
        let dups = vec![vec![11], vec![], vec![50], vec![51]];
        assert_eq!(
            find_sequences_between(&dups, 4, before),
            vec![Dedup {
                start: 0,
                len: 1,
                dbn: 11
            }]
        );
    }

    proptest! {
        /// Every run returned is a real sequence of duplicates, at least
        /// the threshold long unless it continues the disk block before
        /// or after the extent, and runs never share a block.
        #[test]
        fn runs_are_real_disjoint_and_long_enough(
            dups in proptest::collection::vec(proptest::collection::btree_set(0u64..40, 0..4), 0..60),
            threshold in 1usize..6,
            before in proptest::option::of(0u64..40),
            after in proptest::option::of(0u64..41),
        ) {
            let dups: Vec<Vec<u64>> = dups.into_iter().map(|s| s.into_iter().collect()).collect();
            let runs = find_sequences_between(&dups, threshold, Edges { before, after });
            let mut used = vec![false; dups.len()];
            for r in &runs {
                let from = r.start == 0 && before.map(|b| b + 1) == Some(r.dbn);
                let to = r.start + r.len == dups.len() && after == Some(r.dbn + r.len as u64);
                prop_assert!(r.len >= threshold || from || to, "{:?}", r);
                for k in 0..r.len {
                    prop_assert!(dups[r.start + k].contains(&(r.dbn + k as u64)));
                    prop_assert!(!used[r.start + k]);
                    used[r.start + k] = true;
                }
            }
            // Threshold 1 finds every block that has any duplicate.
            if threshold == 1 {
                for (i, d) in dups.iter().enumerate() {
                    prop_assert_eq!(used[i], !d.is_empty(), "block {}", i);
                }
            }
        }
    }
}
