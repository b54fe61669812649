//! Repository statistics: logical vs stored bytes, dedup and compression
//! ratios, object counts, and per series the lifecycle figures of RevDedup
//! (versions per window, space saved by segment-level and by reverse
//! dedup as in its Figure 4, length of indirect-reference chains).

use crate::engine::index::{build_strategy, ContainerTable};
use crate::error::Result;
use crate::repo::index::RepoIndex;
use crate::repo::lifecycle::{list_policies, version_states, VersionState};
use crate::repo::{now_ns, Repository};
use std::collections::{BTreeMap, HashMap, HashSet};
use strata_core::format::{ContainerId, Snapshot};
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepoStats {
    pub snapshots: u64,
    pub series: u64,
    /// Sum of the logical sizes of all snapshots.
    pub logical_bytes: u64,
    /// Plaintext bytes of the unique stored chunks.
    pub unique_raw_bytes: u64,
    /// Bytes of chunk data as stored (compressed, sealed regions) in the
    /// data containers.
    pub stored_bytes: u64,
    /// Bytes of the data container objects (chunk data, headers, metadata).
    pub container_bytes: u64,
    /// Of the chunk data, what volumes hold for the repository (linked
    /// containers: their data objects are link stubs), not counted in
    /// `stored_bytes` and `container_bytes`.
    pub linked_bytes: u64,
    pub linked_containers: u64,
    /// Bytes of everything in the repository (data + metadata).
    pub total_repo_bytes: u64,
    pub containers: u64,
    pub chunks: u64,
    pub segments: u64,
    /// logical / unique raw.
    pub dedup_ratio: f64,
    /// unique raw / stored.
    pub compression_ratio: f64,
    /// logical / stored.
    pub total_ratio: f64,
    pub space_saving_pct: f64,
    pub index_strategy: String,
    pub index_entries: u64,
    pub index_ram_bytes: u64,
    /// Bytes of containers in the shared pool and stamped (archival) ones.
    pub pool_bytes: u64,
    pub stamped_bytes: u64,
    /// Plaintext bytes of the distinct non-zero segments the snapshots
    /// reference: what segment-level dedup alone would store.
    pub segment_level_bytes: u64,
    /// Plaintext bytes the snapshots need: pool chunks some version
    /// references plus the archival versions' stamped chunks.
    pub referenced_raw_bytes: u64,
    /// Plaintext bytes in pool containers that nothing references any more
    /// (left below the compaction threshold; `gc --threshold 0` frees them).
    pub pool_dead_raw_bytes: u64,
    /// RevDedup Figure 4: % of the logical bytes (zero chunks excluded,
    /// before compression) saved by segment-level inline dedup, and the
    /// further % saved by reverse dedup.
    pub saving_segment_pct: f64,
    pub saving_reverse_pct: f64,
    /// Chunks stored as deltas (a repository with deltas on).
    pub delta: Option<DeltaStats>,
    pub series_stats: Vec<SeriesStats>,
}

/// What delta regions hold, and what they saved.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DeltaStats {
    pub regions: u64,
    pub chunks: u64,
    /// Plaintext bytes of the chunks stored as deltas, and what their
    /// regions take.
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    /// Distinct bases they need.
    pub bases: u64,
    /// What those chunks would take compressed like the chunks stored
    /// whole (at the repository's own ratio), less what they take.
    pub saved_bytes: u64,
}

/// Lifecycle figures of one series.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SeriesStats {
    pub series: String,
    pub versions: u64,
    /// States under the series' policy now.
    pub live: u64,
    pub archival: u64,
    /// Past retention, deleted by the next `maintain`.
    pub expired: u64,
    /// Archival versions already reverse-deduplicated, and those waiting
    /// for `maintain`.
    pub reverse_deduplicated: u64,
    pub pending: u64,
    pub logical_bytes: u64,
    /// Over its reverse-deduplicated versions: bytes of direct and of
    /// indirect references, and the average number of newer versions an
    /// indirect reference passes through before it meets a direct one.
    pub direct_bytes: u64,
    pub indirect_bytes: u64,
    /// Of the indirect bytes, those whose chunk the next version held at
    /// another location: the pool space reverse dedup freed for this
    /// series (the rest the backups already shared inline).
    pub reverse_freed_bytes: u64,
    pub avg_chain_length: f64,
    pub max_chain_length: u32,
    /// Stored bytes of the stamped containers its versions own.
    pub stamped_bytes: u64,
}

pub fn stats(repo: &Repository) -> Result<RepoStats> {
    let mut st = RepoStats {
        index_strategy: repo.config().index.clone(),
        ..Default::default()
    };
    let idx = index_figures(repo, &mut st)?;
    if repo.config().delta {
        st.delta = Some(delta_figures(repo)?);
    }
    let snaps = repo.list_active_snapshots()?;
    st.snapshots = snaps.len() as u64;
    st.series = snaps
        .iter()
        .map(|(_, s)| &s.series)
        .collect::<HashSet<_>>()
        .len() as u64;
    st.logical_bytes = snaps.iter().map(|(_, s)| s.stats.logical_bytes).sum();
    let refs = References::walk(repo, &snaps, &idx)?;
    space_figures(&mut st, &idx, &refs);
    st.series_stats = series_stats(repo, &snaps, &idx)?;
    st.total_repo_bytes = repo_bytes(repo)?;
    ratios(&mut st);
    Ok(st)
}

/// Fills in the figures of the index and the containers (linked ones
/// apart) and returns the index.
fn index_figures(repo: &Repository, st: &mut RepoStats) -> Result<RepoIndex> {
    let table = std::sync::Arc::new(ContainerTable::default());
    let (strategy, idx) = build_strategy(repo, &table, None)?;
    st.containers = idx.containers.len() as u64;
    st.chunks = idx.containers.values().map(|c| c.chunks as u64).sum();
    st.unique_raw_bytes = idx.containers.values().map(|c| c.raw_bytes).sum();
    st.stored_bytes = idx.stored_bytes();
    st.container_bytes = idx.container_bytes();
    for id in repo.linked_ids()?.iter() {
        if let (Some(c), Ok(Some(l))) = (idx.containers.get(id), repo.link_of(id)) {
            st.linked_containers += 1;
            st.linked_bytes += c.raw_bytes;
            st.stored_bytes = st.stored_bytes.saturating_sub(c.data_bytes());
            st.container_bytes = st.container_bytes.saturating_sub(c.data_len) + l.stub_len;
        }
    }
    st.index_entries = strategy.entries();
    st.index_ram_bytes = strategy.ram_bytes();
    Ok(idx)
}

/// Delta regions of every indexed container (index objects read whole).
fn delta_figures(repo: &Repository) -> Result<DeltaStats> {
    let mut d = DeltaStats::default();
    let mut bases = HashSet::new();
    let (mut plain_raw, mut plain_stored) = (0u64, 0u64);
    RepoIndex::load(repo, |m| {
        for (i, r) in m.regions.iter().enumerate() {
            match m.delta_of(i as u32) {
                Some(dr) => {
                    d.regions += 1;
                    d.raw_bytes += r.raw_len as u64;
                    d.stored_bytes += r.stored_len as u64;
                    d.chunks += dr.chunk_bases.len() as u64;
                    bases.extend(dr.bases.iter().map(|b| (b.container, b.region, b.offset)));
                }
                None => {
                    plain_raw += r.raw_len as u64;
                    plain_stored += r.stored_len as u64;
                }
            }
        }
    })?;
    d.bases = bases.len() as u64;
    let alone = d.raw_bytes as f64 * plain_stored as f64 / plain_raw.max(1) as f64;
    d.saved_bytes = (alone as u64).saturating_sub(d.stored_bytes);
    Ok(d)
}

/// What the snapshots' recipes reference.
struct References {
    /// Plaintext bytes of each distinct segment, zero chunks excluded.
    segs: HashMap<Fingerprint, u64>,
    /// Logical bytes of the snapshots, zero chunks excluded.
    logical_nonzero: u64,
    /// Pool chunk locations that some version references.
    pool_refs: HashMap<(ContainerId, u32, u32), u32>,
}

impl References {
    /// Reads the recipes of `snaps` for what they reference.
    fn walk(repo: &Repository, snaps: &[(SnapshotId, Snapshot)], idx: &RepoIndex) -> Result<Self> {
        let mut segs: HashMap<Fingerprint, u64> = HashMap::new();
        let mut recipes = HashSet::new();
        let mut logical_nonzero = 0u64;
        // Pool chunk locations that some version references.
        let mut pool_refs: HashMap<(ContainerId, u32, u32), u32> = HashMap::new();
        for (_, s) in snaps {
            let first_use = recipes.insert(s.recipe.clone());
            crate::repo::recipe::for_each_segment(repo, &s.recipe, |sg, table| {
                for c in &sg.chunks {
                    if !c.is_zero() {
                        logical_nonzero += c.len as u64;
                    }
                    if c.is_direct() {
                        let cid = table.get(c.container as usize);
                        let in_pool = cid
                            .and_then(|id| idx.containers.get(id))
                            .is_some_and(|m| m.stamp.is_none());
                        if let (Some(cid), true) = (cid, in_pool) {
                            pool_refs.insert((*cid, c.region, c.offset), c.len);
                        }
                    }
                }
                if first_use {
                    segs.entry(sg.fp).or_insert_with(|| {
                        sg.chunks
                            .iter()
                            .filter(|c| !c.is_zero())
                            .map(|c| c.len as u64)
                            .sum()
                    });
                }
                Ok(())
            })?;
        }
        Ok(References {
            segs,
            logical_nonzero,
            pool_refs,
        })
    }
}

/// Fills in the segment, pool and stamped figures and the RevDedup
/// savings from the index and what the recipes reference.
fn space_figures(st: &mut RepoStats, idx: &RepoIndex, refs: &References) {
    st.segments = refs.segs.len() as u64;
    st.segment_level_bytes = refs.segs.values().sum();
    let mut stamped_raw = 0u64;
    let mut pool_raw = 0u64;
    for c in idx.containers.values() {
        if c.stamp.is_some() {
            st.stamped_bytes += c.data_bytes();
            stamped_raw += c.raw_bytes;
        } else {
            st.pool_bytes += c.data_bytes();
            pool_raw += c.raw_bytes;
        }
    }
    let pool_referenced: u64 = refs.pool_refs.values().map(|l| *l as u64).sum();
    st.referenced_raw_bytes = pool_referenced + stamped_raw;
    st.pool_dead_raw_bytes = pool_raw.saturating_sub(pool_referenced);
    let logical_nonzero = refs.logical_nonzero;
    let pct = |part: u64| {
        if logical_nonzero == 0 {
            0.0
        } else {
            100.0 * part as f64 / logical_nonzero as f64
        }
    };
    st.saving_segment_pct = pct(logical_nonzero.saturating_sub(st.segment_level_bytes));
    st.saving_reverse_pct = pct(st
        .segment_level_bytes
        .saturating_sub(st.referenced_raw_bytes));
}

/// Bytes of everything in the repository (data and metadata).
fn repo_bytes(repo: &Repository) -> Result<u64> {
    let b = repo.backend();
    Ok([
        "config",
        "keys/",
        "data/",
        "meta/",
        "index/",
        "isum/",
        "recipes/",
        "parts/",
        "snapshots/",
    ]
    .iter()
    .map(|p| {
        b.list(p)
            .map(|l| l.iter().map(|o| o.size).sum::<u64>())
            .unwrap_or(0)
    })
    .sum::<u64>()
        + b.size("config")?.unwrap_or(0))
}

/// Fills in the dedup, compression and total ratios and the space saving.
fn ratios(st: &mut RepoStats) {
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    st.dedup_ratio = ratio(st.logical_bytes, st.unique_raw_bytes);
    // (Over what the repository stores itself: linked data is the volume's.)
    st.compression_ratio = ratio(
        st.unique_raw_bytes.saturating_sub(st.linked_bytes),
        st.stored_bytes,
    );
    st.total_ratio = ratio(st.logical_bytes, st.total_repo_bytes);
    st.space_saving_pct = if st.logical_bytes == 0 {
        0.0
    } else {
        100.0 * (1.0 - st.total_repo_bytes as f64 / st.logical_bytes as f64)
    };
}

/// Per-series lifecycle figures. Chain lengths are computed newest to
/// oldest, keeping one version's fingerprint → hops table at a time, and
/// only for a version an older one points at. The table is keyed by the
/// fingerprint's first 8 bytes (a figure, not a lookup of data: a
/// collision would shift an average by one hop), 16 bytes an entry
/// rather than 40 — a version of a disk image has millions.
fn series_stats(
    repo: &Repository,
    snaps: &[(SnapshotId, Snapshot)],
    idx: &RepoIndex,
) -> Result<Vec<SeriesStats>> {
    let policies = list_policies(repo)?;
    let states = version_states(snaps, &policies, now_ns());
    let mut owned: HashMap<&str, u64> = HashMap::new();
    for c in idx.containers.values() {
        if let Some(s) = &c.stamp {
            *owned.entry(s.owner.as_str()).or_default() += c.data_bytes();
        }
    }
    let mut by_series: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
    for s in snaps {
        by_series.entry(s.1.series.as_str()).or_default().push(s);
    }
    let mut out = Vec::new();
    for (name, mut list) in by_series {
        list.sort_by_key(|(_, s)| std::cmp::Reverse((s.version, s.time_ns)));
        let mut st = SeriesStats {
            series: name.to_string(),
            versions: list.len() as u64,
            ..Default::default()
        };
        let (mut hops_sum, mut hops_n) = (0u64, 0u64);
        let mut newer: Option<(&str, HashMap<u64, u32>)> = None;
        let pointed_at: HashSet<&str> = list
            .iter()
            .filter_map(|(_, s)| s.archival.as_ref().and_then(|a| a.next.as_deref()))
            .collect();
        for (id, s) in list {
            st.logical_bytes += s.stats.logical_bytes;
            st.stamped_bytes += owned.get(id.as_str()).copied().unwrap_or(0);
            match states.get(id) {
                Some(VersionState::Live) => st.live += 1,
                Some(VersionState::Archival) => st.archival += 1,
                Some(VersionState::Expired) => st.expired += 1,
                None => {}
            }
            let Some(a) = &s.archival else {
                if states.get(id) == Some(&VersionState::Archival) {
                    st.pending += 1;
                }
                newer = Some((id, HashMap::new()));
                continue;
            };
            st.reverse_deduplicated += 1;
            st.direct_bytes += a.direct_bytes;
            st.indirect_bytes += a.indirect_bytes;
            st.reverse_freed_bytes += a.released_bytes;
            let next_hops = newer
                .as_ref()
                .filter(|(nid, _)| a.next.as_deref() == Some(*nid))
                .map(|(_, h)| h);
            let keep = pointed_at.contains(id.as_str());
            let mut hops: HashMap<u64, u32> = HashMap::new();
            crate::repo::recipe::for_each_segment(repo, &s.recipe, |sg, _| {
                for c in sg.chunks.iter().filter(|c| c.is_indirect()) {
                    let key = c.fp.prefix_u64();
                    let h = 1 + next_hops.and_then(|m| m.get(&key)).copied().unwrap_or(0);
                    if keep {
                        hops.insert(key, h);
                    }
                    hops_sum += h as u64;
                    hops_n += 1;
                    st.max_chain_length = st.max_chain_length.max(h);
                }
                Ok(())
            })?;
            newer = Some((id, hops));
        }
        st.avg_chain_length = if hops_n == 0 {
            0.0
        } else {
            hops_sum as f64 / hops_n as f64
        };
        out.push(st);
    }
    Ok(out)
}
