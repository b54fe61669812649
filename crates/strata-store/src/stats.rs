//! Repository statistics: logical vs stored bytes, dedup and compression
//! ratios, object counts.

use crate::error::Result;
use crate::index::{build_strategy, ContainerTable};
use crate::repo::Repository;
use std::collections::HashSet;
use strata_core::Fingerprint;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepoStats {
    pub snapshots: u64,
    pub series: u64,
    /// Sum of the logical sizes of all snapshots.
    pub logical_bytes: u64,
    /// Plaintext bytes of the unique stored chunks.
    pub unique_raw_bytes: u64,
    /// Bytes of data containers.
    pub stored_bytes: u64,
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
}

pub fn stats(repo: &Repository) -> Result<RepoStats> {
    let mut st = RepoStats {
        index_strategy: repo.config().index.clone(),
        ..Default::default()
    };
    let table = std::sync::Arc::new(ContainerTable::default());
    let (strategy, idx) = build_strategy(repo, &table)?;
    st.containers = idx.containers.len() as u64;
    st.chunks = idx.containers.values().map(|c| c.chunks as u64).sum();
    st.unique_raw_bytes = idx.containers.values().map(|c| c.raw_bytes).sum();
    st.stored_bytes = idx.stored_bytes();
    st.index_entries = strategy.entries();
    st.index_ram_bytes = strategy.ram_bytes();
    let snaps = repo.list_snapshots()?;
    st.snapshots = snaps.len() as u64;
    st.series = snaps
        .iter()
        .map(|(_, s)| &s.series)
        .collect::<HashSet<_>>()
        .len() as u64;
    st.logical_bytes = snaps.iter().map(|(_, s)| s.stats.logical_bytes).sum();
    let mut segs: HashSet<Fingerprint> = HashSet::new();
    let mut recipes = HashSet::new();
    for (_, s) in &snaps {
        if recipes.insert(s.recipe.clone()) {
            let r = repo.load_recipe(&s.recipe)?;
            for n in &r.nodes {
                segs.extend(n.segments.iter().map(|s| s.fp));
            }
        }
    }
    st.segments = segs.len() as u64;
    let b = repo.backend();
    st.total_repo_bytes = [
        "config",
        "keys/",
        "data/",
        "meta/",
        "index/",
        "recipes/",
        "snapshots/",
    ]
    .iter()
    .map(|p| {
        b.list(p)
            .map(|l| l.iter().map(|o| o.size).sum::<u64>())
            .unwrap_or(0)
    })
    .sum::<u64>()
        + b.size("config")?.unwrap_or(0);
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    st.dedup_ratio = ratio(st.logical_bytes, st.unique_raw_bytes);
    st.compression_ratio = ratio(st.unique_raw_bytes, st.stored_bytes);
    st.total_ratio = ratio(st.logical_bytes, st.total_repo_bytes);
    st.space_saving_pct = if st.logical_bytes == 0 {
        0.0
    } else {
        100.0 * (1.0 - st.total_repo_bytes as f64 / st.logical_bytes as f64)
    };
    Ok(st)
}
