//! `exact`: every chunk fingerprint in RAM.

use super::interface::IndexStrategy;
use super::table::{ChunkLoc, ContainerTable, Sharded};
use std::collections::HashMap;
use strata_core::format::ContainerMeta;
use strata_core::Fingerprint;

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

impl<E> IndexStrategy<E> for ExactIndex {
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

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::format::ChunkEntry;
    use strata_core::format::{ContainerId, ContainerMeta};

    #[test]
    fn exact_claims_once() {
        let t = ContainerTable::default();
        let exact = ExactIndex::default();
        let idx: &dyn IndexStrategy = &exact;
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
            deltas: Vec::new(),
        };
        exact.add_chunks(&t, &meta);
        assert_eq!(
            exact
                .lookup(&Fingerprint([2; 32]))
                .map(|l| t.get(l.container)),
            Some(ContainerId([3; 16]))
        );
    }
}
