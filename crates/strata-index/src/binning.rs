//! Extreme Binning (Bhagwat et al., MASCOTS 2009), the similarity-only
//! baseline SiLo is compared with (SiLo §4; docs/design.md "Index strategies":
//! `binning`).
//!
//! Every file is represented by its minimum chunk key. The *primary
//! index*, the only structure in RAM, maps a representative to a *bin* (on
//! disk: the chunk keys of every file that had this representative) and to
//! the hash of the last such file's whole chunk list. A file whose whole
//! hash matches is a duplicate file, found without a disk access; otherwise
//! its bin is read, its chunks are deduplicated against the bin alone, and
//! the bin is written back with the new ones. Files with a new
//! representative start a new bin and find no duplicates at all — the
//! weakness SiLo's locality fixes: similar files whose minimum chunk
//! differs are never compared.

use crate::frozen::Frozen;
use crate::key::{table_bytes, ChunkKey, IndexError, KeyMap, Location, Result};
use crate::store::BlockStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What Extreme Binning did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinningStats {
    pub files: u64,
    /// Files whose whole-file hash matched (no disk access).
    pub dup_files: u64,
    pub bin_loads: u64,
    pub bin_writes: u64,
    pub new_bins: u64,
    pub dup_chunks: u64,
    pub new_chunks: u64,
}

/// What [`Binning::lookup_file`] found, to hand back to
/// [`Binning::add_file`] (several files may be in flight at once).
pub enum Ticket<K, L> {
    None,
    /// The file matched its bin's last file whole.
    Whole,
    /// The file's bin (loaded), or a new bin to create.
    Bin {
        rep: u128,
        hash: u128,
        id: Option<u64>,
        chunks: Option<Frozen<K, L>>,
    },
}

/// Extreme Binning over a stream of files.
pub struct Binning<K, L> {
    store: Arc<dyn BlockStore>,
    prefix: String,
    /// Representative → (bin id, whole-file hash of its last file).
    primary: KeyMap<u128, (u64, u128)>,
    next_bin: u64,
    /// Whether callers need locations for whole-file duplicates (a
    /// repository does; trace mode only counts).
    need_locations: bool,
    pub stats: BinningStats,
    _p: std::marker::PhantomData<(K, L)>,
}

/// Hash of a file's chunk list.
fn whole_hash<K: ChunkKey>(keys: &[K]) -> u128 {
    let mut h = blake3::Hasher::new();
    for k in keys {
        h.update(&k.prefix().to_le_bytes());
    }
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize().as_bytes()[..16]);
    u128::from_le_bytes(b)
}

impl<K: ChunkKey, L: Location + Default> Binning<K, L> {
    pub fn new(store: Arc<dyn BlockStore>, prefix: &str, need_locations: bool) -> Self {
        Self::with_primary(store, prefix, need_locations, Default::default(), 0)
    }

    /// Resumes from a persisted primary index; new bins get ids from
    /// `next_bin` on (writers that may run at once use disjoint ranges).
    pub fn with_primary(
        store: Arc<dyn BlockStore>,
        prefix: &str,
        need_locations: bool,
        primary: std::collections::HashMap<u128, (u64, u128)>,
        next_bin: u64,
    ) -> Self {
        Binning {
            store,
            prefix: prefix.to_string(),
            primary: primary.into_iter().collect(),
            next_bin,
            need_locations,
            stats: BinningStats::default(),
            _p: std::marker::PhantomData,
        }
    }

    fn bin_name(&self, id: u64) -> String {
        format!("{}{id}", self.prefix)
    }

    fn load(&mut self, id: u64) -> Result<Frozen<K, L>> {
        let name = self.bin_name(id);
        let raw = self.store.get(&name)?;
        let bin = Frozen::from_bytes(&name, raw)?;
        if bin.id() != id {
            return Err(IndexError::Decode {
                name,
                msg: format!("holds bin {}", bin.id()),
            });
        }
        self.stats.bin_loads += 1;
        Ok(bin)
    }

    /// Looks up one file's chunks.
    #[allow(clippy::type_complexity)]
    pub fn lookup_file(&mut self, keys: &[K]) -> Result<(Vec<Option<L>>, Ticket<K, L>)> {
        if keys.is_empty() {
            return Ok((Vec::new(), Ticket::None));
        }
        self.stats.files += 1;
        let rep = keys.iter().map(|k| k.prefix()).min().unwrap_or_default();
        let hash = whole_hash(keys);
        let (out, pending) = match self.primary.get(&rep).copied() {
            Some((_, h)) if h == hash && !self.need_locations => {
                self.stats.dup_files += 1;
                (vec![Some(L::default()); keys.len()], Ticket::Whole)
            }
            Some((id, h)) => {
                let chunks = self.load(id)?;
                if h == hash {
                    self.stats.dup_files += 1;
                }
                let out = keys.iter().map(|k| chunks.get(k)).collect();
                (
                    out,
                    Ticket::Bin {
                        rep,
                        hash,
                        id: Some(id),
                        chunks: Some(chunks),
                    },
                )
            }
            None => (
                vec![None; keys.len()],
                Ticket::Bin {
                    rep,
                    hash,
                    id: None,
                    chunks: None,
                },
            ),
        };
        let dups = out.iter().filter(|x: &&Option<L>| x.is_some()).count() as u64;
        self.stats.dup_chunks += dups;
        self.stats.new_chunks += keys.len() as u64 - dups;
        Ok((out, pending))
    }

    /// Records a file looked up before, with its chunks' locations: new
    /// chunks join its bin, which is written back. Returns the primary-index
    /// entry it set, if any (what a repository persists).
    #[allow(clippy::type_complexity)]
    pub fn add_file(
        &mut self,
        ticket: Ticket<K, L>,
        chunks: &[(K, L)],
    ) -> Result<Option<(u128, (u64, u128))>> {
        match ticket {
            Ticket::None | Ticket::Whole => Ok(None),
            Ticket::Bin {
                rep,
                hash,
                id,
                chunks: old,
            } => {
                let new: Vec<&(K, L)> = chunks
                    .iter()
                    .filter(|(k, _)| old.as_ref().is_none_or(|b| b.get(k).is_none()))
                    .collect();
                let id = match id {
                    Some(id) => id,
                    None => {
                        self.stats.new_bins += 1;
                        self.next_bin += 1;
                        self.next_bin - 1
                    }
                };
                if !new.is_empty() || old.is_none() {
                    let mut all: KeyMap<K, L> = old
                        .as_ref()
                        .map(|b| b.entries().collect())
                        .unwrap_or_default();
                    for (k, l) in new {
                        all.entry(*k).or_insert(*l);
                    }
                    let bytes = Frozen::<K, L>::build(
                        id,
                        &[],
                        all.len(),
                        all.iter().map(|(k, l)| (*k, *l)),
                    );
                    self.store.put(&self.bin_name(id), &bytes)?;
                    self.stats.bin_writes += 1;
                }
                self.primary.insert(rep, (id, hash));
                Ok(Some((rep, (id, hash))))
            }
        }
    }

    pub fn entries(&self) -> u64 {
        self.primary.len() as u64
    }

    /// RAM of the primary index (the bins of files in flight are
    /// transient, each bounded by the largest bin).
    pub fn ram_bytes(&self) -> u64 {
        table_bytes(self.primary.capacity(), 16 + 8 + 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn key(i: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b.copy_from_slice(&blake3::hash(&i.to_le_bytes()).as_bytes()[..16]);
        b
    }

    fn file(b: &mut Binning<[u8; 16], ()>, ids: &[u64]) -> usize {
        let keys: Vec<_> = ids.iter().map(|i| key(*i)).collect();
        let (found, t) = b.lookup_file(&keys).unwrap();
        let chunks: Vec<_> = keys.iter().map(|k| (*k, ())).collect();
        b.add_file(t, &chunks).unwrap();
        found.iter().filter(|f| f.is_some()).count()
    }

    #[test]
    fn duplicate_files_and_similar_files() {
        let mut b: Binning<[u8; 16], ()> =
            Binning::new(Arc::new(MemStore::default()), "bin/", false);
        let a: Vec<u64> = (0..100).collect();
        assert_eq!(file(&mut b, &a), 0);
        // The same file: whole-file match, no bin read.
        assert_eq!(file(&mut b, &a), 100);
        assert_eq!(b.stats.dup_files, 1);
        assert_eq!(b.stats.bin_loads, 0);
        // A similar file (same minimum chunk): deduplicated against the bin.
        let min = *a.iter().min_by_key(|i| key(**i).prefix()).unwrap();
        let mut a2 = a.clone();
        let victim = a2.iter().position(|i| *i != min).unwrap();
        a2[victim] = 5000;
        assert_eq!(file(&mut b, &a2), 99);
        assert_eq!(b.stats.bin_loads, 1);
        // A similar file whose minimum chunk changed finds nothing: the
        // weakness SiLo's locality addresses.
        let mut a3 = a.clone();
        let at = a3.iter().position(|i| *i == min).unwrap();
        a3[at] = 6000;
        assert_eq!(file(&mut b, &a3), 0);
        assert!(b.ram_bytes() > 0);
        assert_eq!(b.entries(), 2);
    }
}
