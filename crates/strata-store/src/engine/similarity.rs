//! The `silo` and `binning` index strategies of a repository (docs/design.md
//! "Index strategies"; SiLo §3, Extreme Binning): the `strata-index`
//! cores, with their on-disk parts stored as repository objects.
//!
//! Objects (all sealed as [`Kind::IndexData`], derived and rebuildable —
//! losing them costs duplicates, never data):
//!
//! | name | content |
//! |---|---|
//! | `silo/blk/ID` | a SiLo block: frozen locality table of its segments |
//! | `silo/sht/TIME-RAND` | similarity-table changes of one backup: (representative, block) pairs |
//! | `binning/bin/ID` | an Extreme Binning bin |
//! | `binning/primary/TIME-RAND` | primary-index changes of one backup |
//!
//! Each backup loads the similarity table (or primary index) from the
//! change objects in name order, works with block ids from a random range
//! of its own (concurrent backups never collide), and writes its changes
//! at the end. Every location a block or bin returns is checked against
//! the containers the backup knows (the pool's, and its own new ones):
//! after gc moved chunks, a stale location is a miss, never a dangling
//! reference.

use crate::error::{Result, StoreError};
use crate::repo::{now_ns, IndexSpec, Repository};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_core::crypto::{random_bytes, Kind};
use strata_core::format::{ContainerId, ContainerMeta};
use strata_core::Fingerprint;
use strata_index::binning::{Binning, Ticket};
use strata_index::silo::{Silo, SiloConfig};
use strata_index::strategy::{ChunkLoc, ContainerTable, Learns};
use strata_index::{AsyncStore, BlockStore, IndexError, PosLoc, StoreStats};

/// Index data stored as sealed repository objects under a prefix.
pub struct RepoBlockStore {
    repo: Repository,
    stats: StoreStats,
}

impl RepoBlockStore {
    pub fn new(repo: &Repository) -> Self {
        RepoBlockStore {
            repo: repo.clone(),
            stats: StoreStats::default(),
        }
    }
}

fn ierr(name: &str, e: impl std::fmt::Display) -> IndexError {
    IndexError::Store {
        name: name.to_string(),
        msg: e.to_string(),
    }
}

impl BlockStore for RepoBlockStore {
    fn put(&self, name: &str, bytes: &[u8]) -> strata_index::Result<()> {
        let env = self
            .repo
            .sealer()
            .seal(Kind::IndexData, bytes, true)
            .map_err(|e| ierr(name, e))?;
        self.stats.wrote(env.len());
        self.repo
            .backend()
            .put(name, &env)
            .map_err(|e| ierr(name, e))
    }

    fn get(&self, name: &str) -> strata_index::Result<Vec<u8>> {
        let env = self.repo.backend().get(name).map_err(|e| ierr(name, e))?;
        self.stats.read(env.len());
        self.repo
            .sealer()
            .open(Kind::IndexData, &env)
            .map_err(|e| ierr(name, e))
    }

    fn delete(&self, name: &str) -> strata_index::Result<()> {
        self.repo.backend().delete(name).map_err(|e| ierr(name, e))
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

fn store_err(e: IndexError) -> StoreError {
    StoreError::Invalid(format!("index strategy: {e}"))
}

/// Version byte of a table-changes object.
const CHANGES_VERSION: u8 = 1;

#[derive(Serialize, Deserialize)]
struct Changes<V> {
    version: u8,
    entries: Vec<(u128, V)>,
}

/// Loads a table from its change objects (applied in name order, which is
/// time order), consolidating them into one when there are many.
fn load_table<V: Serialize + serde::de::DeserializeOwned + Clone>(
    repo: &Repository,
    prefix: &str,
) -> Result<HashMap<u128, V>> {
    let mut names: Vec<String> = repo
        .backend()
        .list(prefix)?
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    let mut table = HashMap::new();
    for n in &names {
        let raw = repo.backend().get(n)?;
        let bytes = repo
            .sealer()
            .open(Kind::IndexData, &raw)
            .map_err(|e| StoreError::corrupt(n.clone(), e))?;
        let c: Changes<V> = postcard::from_bytes(&bytes).map_err(|e| {
            StoreError::corrupt(
                n.clone(),
                strata_core::CoreError::Decode {
                    what: "index table changes",
                    msg: e.to_string(),
                },
            )
        })?;
        if c.version != CHANGES_VERSION {
            return Err(StoreError::corrupt(
                n.clone(),
                strata_core::CoreError::UnknownVersion {
                    what: "index table changes",
                    found: c.version,
                    supported: CHANGES_VERSION,
                },
            ));
        }
        table.extend(c.entries);
    }
    if names.len() > 32 {
        // One object for the whole table; the ones it covers go. A
        // concurrent backup's changes written meanwhile stay (they were not
        // listed) and apply after it.
        put_changes(
            repo,
            prefix,
            table.iter().map(|(k, v)| (*k, v.clone())).collect(),
        )?;
        for n in &names {
            repo.backend().delete(n)?;
        }
    }
    Ok(table)
}

fn put_changes<V: Serialize>(
    repo: &Repository,
    prefix: &str,
    entries: Vec<(u128, V)>,
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut r = [0u8; 4];
    random_bytes(&mut r)?;
    let name = format!("{prefix}{:020}-{}", now_ns(), hex::encode(r));
    let bytes = postcard::to_allocvec(&Changes {
        version: CHANGES_VERSION,
        entries,
    })
    .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let env = repo.sealer().seal(Kind::IndexData, &bytes, true)?;
    Ok(repo.backend().put(&name, &env)?)
}

/// A random block/bin id range of this process (high 32 bits).
fn id_base() -> Result<u64> {
    let mut b = [0u8; 4];
    random_bytes(&mut b)?;
    Ok((u32::from_le_bytes(b) as u64 | 1) << 32)
}

fn to_pos(table: &ContainerTable, l: &ChunkLoc) -> PosLoc {
    PosLoc {
        container: table.get(l.container).0,
        region: l.region,
        offset: l.offset,
        len: l.len,
    }
}

/// A location from a block or bin, if its container is one this backup may
/// reference (an indexed pool container, or one it wrote itself).
fn from_pos(table: &ContainerTable, p: &PosLoc) -> Option<ChunkLoc> {
    Some(ChunkLoc {
        container: table.lookup(&ContainerId(p.container))?,
        region: p.region,
        offset: p.offset,
        len: p.len,
    })
}

/// `silo`: SiLo over the backup stream.
pub struct SiloStrategy {
    repo: Repository,
    table: Arc<ContainerTable>,
    inner: Mutex<Silo<Fingerprint, PosLoc>>,
    store: Arc<AsyncStore>,
}

const SILO_BLOCKS: &str = "silo/blk/";
const SILO_TABLE: &str = "silo/sht/";

impl SiloStrategy {
    /// Opens SiLo with the tuning options of the repository's index spec.
    pub fn new(repo: &Repository, table: Arc<ContainerTable>, spec: &IndexSpec) -> Result<Self> {
        let sht: HashMap<u128, u64> = load_table(repo, SILO_TABLE)?;
        let store = Arc::new(AsyncStore::new(Arc::new(RepoBlockStore::new(repo))));
        let cfg = SiloConfig {
            // The paper's 256 MiB blocks: on ddgen (shuffled, 5 % change)
            // 64 MiB blocks found 99.00 % of exact's duplicates, 128 MiB
            // 99.65 %, 256 MiB 99.95 % (docs/benchmarks.md); a block's
            // locality table costs ~1 MB to read on a hit.
            block_bytes: spec.get("block-mib", 256) << 20,
            cache_blocks: spec.get("cache-blocks", 8) as usize,
            reps: spec.get("reps", 1) as usize,
            gc_blocks: true,
            record_duplicate_segments: spec.get("record-duplicates", 0) != 0,
        };
        let silo = Silo::with_table(cfg, store.clone(), SILO_BLOCKS, sht, id_base()?);
        Ok(SiloStrategy {
            repo: repo.clone(),
            table,
            inner: Mutex::new(silo),
            store,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Silo<Fingerprint, PosLoc>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl strata_index::strategy::IndexStrategy<StoreError> for SiloStrategy {
    fn name(&self) -> &'static str {
        "silo"
    }

    fn lookup_segment(
        &self,
        _segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>> {
        // A failed block read only costs duplicates (the core already
        // treats an unreadable block as a miss).
        let found = self.lock().lookup(chunks).unwrap_or_else(|e| {
            tracing::warn!("silo lookup: {e}");
            vec![None; chunks.len()]
        });
        found
            .iter()
            .map(|p| p.as_ref().and_then(|p| from_pos(&self.table, p)))
            .collect()
    }

    fn claim(&self, fp: &Fingerprint, loc: ChunkLoc) -> Option<ChunkLoc> {
        self.lock()
            .claim(*fp, to_pos(&self.table, &loc))
            .and_then(|p| from_pos(&self.table, &p))
    }

    fn segment_done(
        &self,
        _segment: &Fingerprint,
        chunks: &[(Fingerprint, ChunkLoc)],
        bytes: u64,
        new_chunks: usize,
    ) -> Result<()> {
        let chunks: Vec<(Fingerprint, PosLoc)> = chunks
            .iter()
            .map(|(f, l)| (*f, to_pos(&self.table, l)))
            .collect();
        self.lock()
            .add_segment(&chunks, bytes, new_chunks)
            .map_err(store_err)
    }

    fn groups_small_files(&self) -> bool {
        true
    }

    fn finish(&self) -> Result<()> {
        let changes = {
            let mut s = self.lock();
            s.flush().map_err(store_err)?;
            s.take_changes().0
        };
        self.store.finish().map_err(store_err)?;
        put_changes(&self.repo, SILO_TABLE, changes)
    }

    fn ram_bytes(&self) -> u64 {
        self.lock().ram_bytes()
    }

    fn entries(&self) -> u64 {
        self.lock().entries()
    }

    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta) {
        // Only known containers are valid targets of a block's locations.
        table.intern(meta.id);
    }

    fn learns(&self) -> Learns {
        Learns::Containers
    }
}

/// `binning`: Extreme Binning, one representative per file (per segment
/// for files larger than a segment).
pub struct BinningStrategy {
    repo: Repository,
    table: Arc<ContainerTable>,
    inner: Mutex<Binning<Fingerprint, PosLoc>>,
    /// Lookups waiting for their `segment_done`, by segment fingerprint.
    tickets: Mutex<HashMap<Fingerprint, Ticket<Fingerprint, PosLoc>>>,
    store: Arc<AsyncStore>,
    /// Primary-index entries set by this backup.
    changed: Mutex<Vec<(u128, (u64, u128))>>,
}

const BINS: &str = "binning/bin/";
const PRIMARY: &str = "binning/primary/";

impl BinningStrategy {
    pub fn new(repo: &Repository, table: Arc<ContainerTable>) -> Result<Self> {
        let primary: HashMap<u128, (u64, u128)> = load_table(repo, PRIMARY)?;
        let store = Arc::new(AsyncStore::new(Arc::new(RepoBlockStore::new(repo))));
        let b = Binning::with_primary(store.clone(), BINS, true, primary, id_base()?);
        Ok(BinningStrategy {
            repo: repo.clone(),
            table,
            inner: Mutex::new(b),
            tickets: Mutex::default(),
            store,
            changed: Mutex::default(),
        })
    }
}

impl strata_index::strategy::IndexStrategy<StoreError> for BinningStrategy {
    fn name(&self) -> &'static str {
        "binning"
    }

    fn lookup_segment(
        &self,
        segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>> {
        let r = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lookup_file(chunks);
        match r {
            Ok((found, ticket)) => {
                self.tickets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(*segment, ticket);
                found
                    .iter()
                    .map(|p| p.as_ref().and_then(|p| from_pos(&self.table, p)))
                    .collect()
            }
            Err(e) => {
                tracing::warn!("binning lookup: {e}");
                vec![None; chunks.len()]
            }
        }
    }

    fn claim(&self, _fp: &Fingerprint, _loc: ChunkLoc) -> Option<ChunkLoc> {
        // Extreme Binning has no shared write buffer: two workers may both
        // store a chunk new to their bins (as the original does).
        None
    }

    fn segment_done(
        &self,
        segment: &Fingerprint,
        chunks: &[(Fingerprint, ChunkLoc)],
        _bytes: u64,
        _new_chunks: usize,
    ) -> Result<()> {
        let Some(ticket) = self
            .tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(segment)
        else {
            return Ok(());
        };
        let chunks: Vec<(Fingerprint, PosLoc)> = chunks
            .iter()
            .map(|(f, l)| (*f, to_pos(&self.table, l)))
            .collect();
        let mut b = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let set = b.add_file(ticket, &chunks).map_err(store_err)?;
        if let Some(entry) = set {
            self.changed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(entry);
        }
        Ok(())
    }

    fn finish(&self) -> Result<()> {
        self.store.finish().map_err(store_err)?;
        let changed = std::mem::take(&mut *self.changed.lock().unwrap_or_else(|e| e.into_inner()));
        put_changes(&self.repo, PRIMARY, changed)
    }

    fn ram_bytes(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ram_bytes()
    }

    fn entries(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries()
    }

    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta) {
        table.intern(meta.id);
    }

    fn learns(&self) -> Learns {
        Learns::Containers
    }
}
