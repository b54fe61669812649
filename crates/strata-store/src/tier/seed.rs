//! Seeding (Data Domain Cloud Tier §5): the bulk first transfer of many
//! versions to the cloud tier, in the active tier's *physical* order. A
//! perfect-hash vector over the active tier's fingerprints is marked with
//! every chunk the selected versions reference; then the containers are
//! read one after the other, each region once, and every marked chunk
//! goes to the cloud tier and has its bit cleared — a chunk several
//! versions share is read and sent once, and reads are sequential. Only
//! when every bit is clear do the versions flip to the cloud tier.
//!
//! Resumable: the vector and the position are saved (`tier/seed`, kind 15)
//! after every batch of containers, once what the batch sent is durable
//! and indexed in the bucket; a killed seed run again with the same
//! selection goes on from there (a chunk of the batch in flight may be
//! sent twice; the cloud tier's gc removes the unused copy).

use super::migrate::{flip_to_cloud, index_of_moving};
use super::phv::Phv;
use super::select::check_chains;
use super::select::{versions, versions_any, Selection};
use crate::engine::copy::{copy_chunks_between, region_cache, CopySource};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::index::{put_index_object, RepoIndex};
use crate::repo::lock;
use crate::repo::recipe;
use crate::repo::{data_name, Repository};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use strata_core::crypto::Kind;
use strata_core::format::{encode, ContainerId, ContainerMeta, Tier};
use strata_core::id::SnapshotId;

/// Where a seed's state is kept, in the active tier.
pub const SEED_STATE: &str = "tier/seed";

#[derive(Serialize, Deserialize)]
struct SeedState {
    /// The versions being seeded (ids).
    versions: Vec<SnapshotId>,
    phv: Phv,
    /// The active tier's containers in physical order, and how many of
    /// them are done.
    containers: Vec<ContainerId>,
    done: usize,
    chunks_sent: u64,
    raw_bytes_sent: u64,
    stored_bytes_sent: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SeedReport {
    pub versions: Vec<SnapshotId>,
    /// Whether this run went on from a seed that had been interrupted.
    pub resumed: bool,
    pub fingerprints: u64,
    pub phv_bytes: u64,
    pub containers_read: u64,
    pub chunks_sent: u64,
    pub raw_bytes_sent: u64,
    pub stored_bytes_sent: u64,
    pub seconds: f64,
}

fn load_state(local: &Repository) -> Result<Option<SeedState>> {
    local.get_struct_opt(Kind::TierState, SEED_STATE, "seed state")
}

fn save_state(local: &Repository, s: &SeedState) -> Result<()> {
    let env = local.sealer().seal(Kind::TierState, &encode(s)?, true)?;
    Ok(local.backend().put(SEED_STATE, &env)?)
}

/// A new seed of `ids`: the vector built and marked, the physical order.
fn start(
    local: &Repository,
    cloud: &Repository,
    ids: &[(SnapshotId, strata_core::format::Snapshot)],
) -> Result<SeedState> {
    let mut metas: Vec<(i64, ContainerId)> = Vec::new();
    let mut keys = Vec::new();
    RepoIndex::load(local, |m| {
        metas.push((m.created, m.id));
        keys.extend(m.chunks.iter().map(|c| c.fp));
    })?;
    metas.sort();
    let mut phv = Phv::build(keys);
    for (_, s) in ids {
        recipe::for_each_part(local, &s.recipe, |part| {
            for c in part
                .nodes
                .iter()
                .flat_map(|n| n.segments.iter().flat_map(|g| &g.chunks))
            {
                if !c.is_zero() {
                    phv.set(&c.fp);
                }
            }
            Ok(())
        })?;
    }
    // What the cloud tier has already need not go again (looked up for
    // the seeded versions' chunks only).
    let there = index_of_moving(local, cloud, ids.iter().map(|(_, s)| &s.recipe))?;
    there.for_each_present(|fp| phv.clear(fp));
    Ok(SeedState {
        versions: ids.iter().map(|(id, _)| id.clone()).collect(),
        phv,
        containers: metas.into_iter().map(|(_, id)| id).collect(),
        done: 0,
        chunks_sent: 0,
        raw_bytes_sent: 0,
        stored_bytes_sent: 0,
    })
}

/// The marked chunks of `metas`, one source each (their first copy).
fn marked_sources(phv: &Phv, metas: &[&ContainerMeta]) -> Vec<CopySource> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for m in metas {
        for c in &m.chunks {
            if phv.get(&c.fp) && seen.insert(c.fp) {
                out.push(CopySource {
                    fp: c.fp,
                    container: m.id,
                    region: c.region,
                    offset: c.offset,
                    len: c.len,
                });
            }
        }
    }
    out
}

/// Containers read between two saves of the state.
const BATCH: usize = 8;

/// Seeds the cloud tier with the versions `sel` selects.
pub fn seed(
    local: &Repository,
    cloud: &Repository,
    sel: &Selection,
    progress: &Progress,
) -> Result<SeedReport> {
    let started = std::time::Instant::now();
    if !sel.paths.is_empty() {
        return Err(StoreError::Invalid(
            "a seed moves whole versions: `tier migrate --path` moves files".into(),
        ));
    }
    let _l = lock::acquire(local, true, "tier seed")?;
    let _c = lock::acquire(cloud, true, "tier seed")?;
    let mut report = SeedReport::default();
    let mut state = match load_state(local)? {
        Some(s) => {
            let mut want: Vec<SnapshotId> = versions_any(local, sel)?
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let mut have = s.versions.clone();
            want.sort();
            have.sort();
            if want != have {
                return Err(StoreError::Invalid(format!(
                    "a seed of {} other versions is in progress; run `strata tier seed` with its \
                     selection to finish it, or `--restart` to drop it",
                    s.versions.len()
                )));
            }
            report.resumed = true;
            s
        }
        None => {
            let chosen = versions(local, sel, Tier::Active)?;
            let all = local.list_snapshots()?;
            let ids: HashSet<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();
            check_chains(&all, &ids)?;
            let s = start(local, cloud, &chosen)?;
            save_state(local, &s)?;
            s
        }
    };
    report.fingerprints = state.phv.len() as u64;
    report.phv_bytes = state.phv.ram_bytes();

    // Container metadata by id (a gc since the start may have moved some
    // chunks: the final sweep below finds them wherever they are now).
    let mut metas: HashMap<ContainerId, ContainerMeta> = HashMap::new();
    RepoIndex::load(local, |m| {
        metas.insert(m.id, m.clone());
    })?;
    progress
        .bytes_total
        .store(state.containers.len() as u64, Ordering::Relaxed);
    progress.totals_known.store(true, Ordering::Relaxed);
    let regions = region_cache(local);
    loop {
        let batch: Vec<&ContainerMeta> = state
            .containers
            .iter()
            .skip(state.done)
            .take(BATCH)
            .filter_map(|id| metas.get(id))
            .collect();
        let n = state.containers.len().saturating_sub(state.done).min(BATCH);
        if n == 0 {
            break;
        }
        send(local, cloud, &mut state, &batch, &regions)?;
        state.done += n;
        report.containers_read += batch.len() as u64;
        save_state(local, &state)?;
        progress.bytes_done.fetch_add(n as u64, Ordering::Relaxed);
    }
    // Chunks moved since the start (a gc in between): wherever they are.
    if state.phv.count() > 0 {
        let all: Vec<&ContainerMeta> = metas.values().collect();
        send(local, cloud, &mut state, &all, &regions)?;
        save_state(local, &state)?;
    }
    if state.phv.count() > 0 {
        return Err(StoreError::Invalid(format!(
            "{} chunks of the seeded versions are in no container of the active tier; run `strata check`",
            state.phv.count()
        )));
    }
    // Every chunk is in the cloud tier: the versions flip, oldest first.
    let mut flipped = Vec::new();
    for id in &state.versions {
        let v = match local.load_snapshot(id) {
            Ok(v) => v,
            // Forgotten since the seed began.
            Err(StoreError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        if v.tier == Tier::Active {
            flipped.push((v.time_ns, id.clone(), v));
        }
    }
    flipped.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    // Where the cloud tier has their chunks (only theirs).
    let index = index_of_moving(local, cloud, flipped.iter().map(|(_, _, v)| &v.recipe))?;
    for (_, id, v) in &flipped {
        flip_to_cloud(local, cloud, id, v, &index)?;
    }
    local.backend().delete(SEED_STATE)?;
    report.versions = state.versions.clone();
    report.chunks_sent = state.chunks_sent;
    report.raw_bytes_sent = state.raw_bytes_sent;
    report.stored_bytes_sent = state.stored_bytes_sent;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Sends the marked chunks of `metas` (each region read once), makes them
/// durable and indexed in the bucket, then clears their bits.
fn send(
    local: &Repository,
    cloud: &Repository,
    state: &mut SeedState,
    metas: &[&ContainerMeta],
    regions: &dyn Fn(&ContainerId) -> Option<std::sync::Arc<Vec<strata_core::format::RegionInfo>>>,
) -> Result<()> {
    let sources = marked_sources(&state.phv, metas);
    if sources.is_empty() {
        return Ok(());
    }
    // A container the batch lists but cannot read fails the run whole.
    for m in metas {
        if sources.iter().any(|s| s.container == m.id) && regions(&m.id).is_none() {
            return Err(StoreError::Invalid(format!(
                "{} cannot be read; run `strata check`",
                data_name(&m.id)
            )));
        }
    }
    let (_, new) = copy_chunks_between(local, cloud, regions, &sources, None, None)?;
    state.stored_bytes_sent += new.iter().map(|m| m.data_len).sum::<u64>();
    if !new.is_empty() {
        put_index_object(cloud, new)?;
    }
    for s in &sources {
        state.phv.clear(&s.fp);
        state.chunks_sent += 1;
        state.raw_bytes_sent += s.len as u64;
    }
    Ok(())
}

/// Drops an interrupted seed's state (what it sent stays in the bucket,
/// unused, until the cloud tier's gc).
pub fn restart(local: &Repository) -> Result<bool> {
    let _l = lock::acquire(local, true, "tier seed")?;
    let had = local.backend().size(SEED_STATE)?.is_some();
    local.backend().delete(SEED_STATE)?;
    Ok(had)
}
