//! The destination's index for a move between tiers, of just the chunks
//! that move. A migration, recall or seed must know, for each chunk of the
//! versions it moves, whether the other tier has it and where. Loading the
//! other tier's whole fingerprint index for that made the memory grow
//! with everything the destination holds (a large active tier recalling
//! one small version held an entry for every chunk it had). Instead the
//! moving versions' recipes are read first, a part at a time, and their
//! distinct fingerprints become the keys; then the destination's index
//! objects are streamed and only entries for those keys are kept. Memory
//! grows with the chunks that move, never with the destination.
//!
//! The same map replaces the per-version set of fingerprints already seen
//! (each entry remembers the last round that visited it), so a chunk costs
//! one entry in all.

use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::error::Result;
use crate::repo::index::RepoIndex;
use crate::repo::recipe;
use crate::repo::Repository;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use strata_core::format::{ContainerId, ContainerMeta};
use strata_core::id::RecipeId;
use strata_core::Fingerprint;

#[derive(Clone, Copy)]
struct Slot {
    /// Where the destination has the chunk, once known.
    at: Option<ChunkLoc>,
    /// The last round ([`MoveIndex::next_round`]) that visited it.
    visited: u32,
}

/// Fingerprint → where the destination tier has it, for the chunks of the
/// versions being moved ([`MoveIndex::want`], then [`MoveIndex::locate_in`]).
#[derive(Default)]
pub(crate) struct MoveIndex {
    slots: Mutex<HashMap<Fingerprint, Slot>>,
    table: ContainerTable,
    round: AtomicU32,
}

/// What a visit found (see [`MoveIndex::visit`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Visit {
    /// Visited before in this round.
    Again,
    /// The destination has it.
    Present,
    /// The destination lacks it.
    Lacking,
}

impl MoveIndex {
    /// Wants every chunk of the stored recipe `rid` of `repo`, read a part
    /// at a time.
    pub fn want(&self, repo: &Repository, rid: &RecipeId) -> Result<()> {
        recipe::for_each_part(repo, rid, |part| {
            let mut slots = self.lock();
            for c in part
                .nodes
                .iter()
                .flat_map(|n| n.segments.iter().flat_map(|s| &s.chunks))
            {
                if !c.is_zero() {
                    slots.entry(c.fp).or_insert(Slot {
                        at: None,
                        visited: 0,
                    });
                }
            }
            Ok(())
        })
    }

    /// Finds the wanted chunks in the pool of `to` (stamped containers
    /// belong to one archival version each and go with it: nothing new
    /// may use them), streaming its index objects.
    pub fn locate_in(&self, to: &Repository) -> Result<()> {
        RepoIndex::load(to, |m| {
            if m.stamp.is_none() {
                self.add_chunks(m)
            }
        })
        .map(|_| ())
    }

    /// Notes where container `m` holds wanted chunks (the first location
    /// found wins); other chunks are ignored.
    pub fn add_chunks(&self, m: &ContainerMeta) {
        let mut slots = self.lock();
        let mut c = None;
        for ch in &m.chunks {
            if let Some(s) = slots.get_mut(&ch.fp) {
                if s.at.is_none() {
                    let c = *c.get_or_insert_with(|| self.table.intern(m.id));
                    s.at = Some(ChunkLoc {
                        container: c,
                        region: ch.region,
                        offset: ch.offset,
                        len: ch.len,
                    });
                }
            }
        }
    }

    /// Where the destination has chunk `fp`: its container, region and
    /// offset.
    pub fn lookup(&self, fp: &Fingerprint) -> Option<(ContainerId, u32, u32)> {
        let at = self.lock().get(fp)?.at?;
        Some((self.table.get(at.container), at.region, at.offset))
    }

    /// A new round of visits (one per version moved).
    pub fn next_round(&self) -> u32 {
        self.round.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Visits chunk `fp` in `round`. A chunk nobody wanted (a recipe read
    /// differently the second time would be damage; it is not lost for
    /// that) is wanted from now on, as lacking.
    pub fn visit(&self, fp: &Fingerprint, round: u32) -> Visit {
        let mut slots = self.lock();
        let s = slots.entry(*fp).or_insert(Slot {
            at: None,
            visited: 0,
        });
        if s.visited == round {
            return Visit::Again;
        }
        s.visited = round;
        match s.at {
            Some(_) => Visit::Present,
            None => Visit::Lacking,
        }
    }

    /// Calls `f` with every wanted chunk the destination has.
    pub fn for_each_present(&self, mut f: impl FnMut(&Fingerprint)) {
        for (fp, s) in self.lock().iter() {
            if s.at.is_some() {
                f(fp)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::format::ChunkEntry;

    fn fp(i: u8) -> Fingerprint {
        Fingerprint([i; 32])
    }

    fn meta(id: u8, fps: &[u8]) -> ContainerMeta {
        let mut m = ContainerMeta {
            id: ContainerId([id; 16]),
            data_len: 0,
            created: 0,
            stamp: None,
            regions: Vec::new(),
            chunks: Vec::new(),
            segments: Vec::new(),
            deltas: Vec::new(),
        };
        for (k, f) in fps.iter().enumerate() {
            m.chunks.push(ChunkEntry {
                fp: fp(*f),
                region: 0,
                offset: k as u32 * 10,
                len: 10,
            });
        }
        m
    }

    #[test]
    fn keeps_only_wanted_chunks_at_their_first_location() {
        let idx = MoveIndex::default();
        for i in [1, 2, 3] {
            idx.lock().insert(
                fp(i),
                Slot {
                    at: None,
                    visited: 0,
                },
            );
        }
        idx.add_chunks(&meta(9, &[7, 8]));
        idx.add_chunks(&meta(5, &[1, 7, 2]));
        idx.add_chunks(&meta(6, &[2]));
        assert_eq!(idx.lock().len(), 3, "nothing unwanted kept");
        assert_eq!(idx.lookup(&fp(1)), Some((ContainerId([5; 16]), 0, 0)));
        assert_eq!(idx.lookup(&fp(2)), Some((ContainerId([5; 16]), 0, 20)));
        assert_eq!(idx.lookup(&fp(3)), None);
        assert_eq!(idx.lookup(&fp(7)), None);
        // The container without wanted chunks was not even interned.
        assert_eq!(idx.table.lookup(&ContainerId([9; 16])), None);
        let mut present = Vec::new();
        idx.for_each_present(|f| present.push(f.0[0]));
        present.sort();
        assert_eq!(present, [1, 2]);
    }

    #[test]
    fn visits_count_each_chunk_once_per_round() {
        let idx = MoveIndex::default();
        idx.lock().insert(
            fp(1),
            Slot {
                at: None,
                visited: 0,
            },
        );
        idx.add_chunks(&meta(5, &[1]));
        let r = idx.next_round();
        assert_eq!(idx.visit(&fp(1), r), Visit::Present);
        assert_eq!(idx.visit(&fp(1), r), Visit::Again);
        assert_eq!(idx.visit(&fp(4), r), Visit::Lacking, "unwanted: lacking");
        assert_eq!(idx.visit(&fp(4), r), Visit::Again);
        let r2 = idx.next_round();
        assert_eq!(idx.visit(&fp(1), r2), Visit::Present);
        // Once sent, the next round finds it.
        idx.add_chunks(&meta(6, &[4]));
        assert_eq!(idx.visit(&fp(4), r2), Visit::Present);
    }
}
