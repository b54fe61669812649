//! How much active-tier space moving a selection to the cloud tier would
//! free (Data Domain Cloud Tier §4) — also the answer to "how much would
//! `forget` free?". Two figures:
//!
//! - The paper's, from metadata alone. No reference counts: a
//!   perfect-hash vector over every fingerprint of the active tier is
//!   marked from the selected versions (and paths), unmarked from every
//!   other active version, and what stays marked is referenced by the
//!   selection alone; a walk of every container's metadata then sums the
//!   stored copies of those chunks (`selection_bytes`, pro rata of each
//!   region's compression).
//! - The exact one (`freed_bytes`): what the next `gc` will free once the
//!   selection has left the active tier. Chunk-level cleaning recompresses
//!   what it copies forward and leaves containers below its threshold
//!   alone, so no metadata sum can predict it to the byte; instead gc
//!   itself runs on a what-if copy of the repository in which the
//!   selection has moved ([`crate::ops::gc::simulate`]): it reads the
//!   containers gc would copy forward and writes nothing.

use super::paths::in_paths;
use super::phv::Phv;
use super::select::{versions, Selection};
use crate::error::Result;
use crate::ops::gc::{simulate, GcOptions};
use crate::repo::index::RepoIndex;
use crate::repo::recipe;
use crate::repo::Repository;
use serde::Serialize;
use std::collections::HashSet;
use strata_core::format::{Node, Snapshot, Tier};
use strata_core::id::SnapshotId;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Estimate {
    pub versions: Vec<SnapshotId>,
    /// Stored bytes (`stats` `stored_bytes`) the active tier frees when the
    /// selection has moved (or been forgotten) and `gc` has run with
    /// `gc_threshold`: exact to the byte when `exact`, including garbage
    /// that gc would collect anyway (with paths, the what-if versions keep
    /// all but the selected files). Without `exact` (`fast`, or a move
    /// that would be refused), `selection_bytes`. Negative in the rare case that gc's
    /// copies take more room than it frees (it merges small containers,
    /// and a copied region cut by a container boundary compresses a little
    /// worse).
    pub freed_bytes: i64,
    pub exact: bool,
    /// Why `freed_bytes` is not exact, when it is not.
    pub not_exact_because: Option<String>,
    pub gc_threshold: f64,
    /// Containers that gc would delete, copy forward, and write.
    pub gc_containers_deleted: u64,
    pub gc_containers_rewritten: u64,
    pub gc_containers_written: u64,
    /// The stored share of the selection's own chunks: containers every
    /// chunk of which is the selection's alone, whole, plus the pro-rata
    /// share of each region's compression in the other containers — what
    /// cleaning every chunk (threshold 0) would free.
    pub selection_bytes: u64,
    /// Of which: containers freed whole.
    pub freed_container_bytes: u64,
    pub freed_containers: u64,
    /// Compression regions all of whose chunks are the selection's alone
    /// (what region-granular cleaning frees).
    pub freed_region_bytes: u64,
    /// Uncompressed bytes of the selection's own chunks (every stored copy).
    pub freed_raw_bytes: u64,
    pub freed_chunks: u64,
    /// Chunk fingerprints of the active tier, and the vector's memory.
    pub fingerprints: u64,
    pub phv_bytes: u64,
    pub seconds: f64,
}

/// Applies `f` to every chunk fingerprint of the nodes of version `s`
/// that `keep` accepts.
fn each_fp(
    repo: &Repository,
    s: &Snapshot,
    keep: &dyn Fn(&Node) -> bool,
    f: &mut dyn FnMut(&strata_core::Fingerprint),
) -> Result<()> {
    recipe::for_each_part(repo, &s.recipe, |part| {
        for n in part.nodes.iter().filter(|n| keep(n)) {
            for c in n.segments.iter().flat_map(|s| &s.chunks) {
                if !c.is_zero() {
                    f(&c.fp);
                }
            }
        }
        Ok(())
    })
}

/// Estimates what moving `sel` (active versions) would free; `exact` adds
/// the gc simulation (whole versions only).
pub fn estimate(repo: &Repository, sel: &Selection, exact: bool) -> Result<Estimate> {
    let _lock = crate::repo::lock::acquire(repo, false, "tier estimate")?;
    let started = std::time::Instant::now();
    let chosen = versions(repo, sel, Tier::Active)?;
    let paths = sel.path_set()?;
    let chosen_ids: HashSet<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();

    // Every fingerprint stored in the active tier.
    let mut keys = Vec::new();
    RepoIndex::load(repo, |m| keys.extend(m.chunks.iter().map(|c| c.fp)))?;
    let mut phv = Phv::build(keys);

    // Mark the selection; unmark everything else that stays.
    for (_, s) in &chosen {
        each_fp(repo, s, &|n| in_paths(&paths, n), &mut |fp| phv.set(fp))?;
    }
    for (id, s) in repo.list_active_snapshots()? {
        if chosen_ids.contains(id.as_str()) {
            if paths.is_some() {
                each_fp(repo, &s, &|n| !in_paths(&paths, n), &mut |fp| phv.clear(fp))?;
            }
            continue;
        }
        each_fp(repo, &s, &|_| true, &mut |fp| phv.clear(fp))?;
    }

    // Sum what stays marked, container by container.
    let mut e = Estimate {
        versions: chosen.iter().map(|(id, _)| id.clone()).collect(),
        fingerprints: phv.len() as u64,
        phv_bytes: phv.ram_bytes(),
        ..Default::default()
    };
    RepoIndex::load(repo, |m| {
        let mut marked_raw = vec![0u64; m.regions.len()];
        let mut region_chunks = vec![(0u32, 0u32); m.regions.len()];
        let mut all = !m.chunks.is_empty();
        for c in &m.chunks {
            let r = c.region as usize;
            let marked = phv.get(&c.fp);
            if let (Some(x), Some(rc)) = (marked_raw.get_mut(r), region_chunks.get_mut(r)) {
                rc.0 += 1;
                if marked {
                    *x += c.len as u64;
                    rc.1 += 1;
                }
            }
            if marked {
                e.freed_raw_bytes += c.len as u64;
                e.freed_chunks += 1;
            }
            all &= marked;
        }
        if all {
            e.freed_containers += 1;
            e.freed_container_bytes += m.data_bytes();
            e.selection_bytes += m.data_bytes();
            e.freed_region_bytes += m.data_bytes();
            return;
        }
        for (i, r) in m.regions.iter().enumerate() {
            let raw = r.raw_len.max(1) as u64;
            e.selection_bytes += r.stored_len as u64 * marked_raw[i].min(raw) / raw;
            let (n, k) = region_chunks[i];
            if n > 0 && n == k {
                e.freed_region_bytes += r.stored_len as u64;
            }
        }
    })?;
    e.freed_bytes = e.selection_bytes as i64;
    e.gc_threshold = GcOptions::default().threshold;
    // A selection migrate would refuse (an older active version keeps
    // chunks in a selected one) cannot be simulated as moved.
    let ids: HashSet<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();
    // With paths, each version as it would stay (its files cut out).
    let mut rests = std::collections::HashMap::new();
    if let Some(g) = &paths {
        for (id, s) in &chosen {
            if let Some(sp) = super::paths::split(&repo.load_recipe(&s.recipe)?, g)? {
                rests.insert(id.clone(), sp.rest);
            }
        }
    }
    let refused = match &paths {
        None => super::select::check_chains(&repo.list_snapshots()?, &ids).err(),
        Some(_) => super::paths::check_chains(repo, &rests).err(),
    };
    e.not_exact_because = if !exact {
        Some("--fast: metadata only".into())
    } else {
        refused.map(|r| r.to_string())
    };
    if e.not_exact_because.is_none() && !chosen.is_empty() {
        let opts = GcOptions::default();
        let r = simulate(repo, &opts, |what_if| {
            for (id, s) in &chosen {
                let mut moved = s.clone();
                if paths.is_none() {
                    moved.tier = Tier::Cloud;
                    moved.archival = None;
                } else if let Some(rest) = rests.remove(id) {
                    moved.recipe = recipe::writer::put(what_if, rest)?.0;
                } else {
                    continue;
                }
                what_if.replace_snapshot(id, &moved)?;
            }
            Ok(())
        })?;
        e.exact = true;
        e.freed_bytes = r.bytes_before as i64 - r.bytes_after as i64;
        e.gc_containers_deleted = r.containers_deleted + r.stamped_deleted;
        e.gc_containers_rewritten = r.containers_rewritten;
        e.gc_containers_written = r.containers_written;
    }
    e.seconds = started.elapsed().as_secs_f64();
    Ok(e)
}
