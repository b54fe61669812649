//! How much active-tier space moving a selection to the cloud tier would
//! free (Data Domain Cloud Tier §4) — also the answer to "how much would
//! `forget` free?". No reference counts: a perfect-hash vector over every
//! fingerprint of the active tier is marked from the selected versions
//! (and paths), unmarked from every other active version, and what stays
//! marked is referenced by the selection alone; a walk of every
//! container's metadata then sums the stored copies of those chunks.

use super::phv::Phv;
use super::select::{versions, Selection};
use crate::error::Result;
use crate::index::RepoIndex;
use crate::recipe;
use crate::repo::Repository;
use globset::GlobSet;
use serde::Serialize;
use std::collections::HashSet;
use strata_core::format::{Node, Snapshot, Tier};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Estimate {
    pub versions: Vec<String>,
    /// Bytes the active tier frees once the selection is gone and the
    /// pool compacted: containers every chunk of which is the selection's
    /// alone, whole, plus the stored share (pro rata of each region's
    /// compression) of the selection's chunks in the other containers.
    pub freed_bytes: u64,
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

fn in_paths(paths: &Option<GlobSet>, n: &Node) -> bool {
    paths.as_ref().is_none_or(|g| {
        let mut p = b"/".to_vec();
        p.extend_from_slice(&n.path);
        g.is_match(String::from_utf8_lossy(&p).as_ref())
    })
}

/// Estimates what moving `sel` (active versions) would free.
pub fn estimate(repo: &Repository, sel: &Selection) -> Result<Estimate> {
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
            e.freed_container_bytes += m.data_len;
            e.freed_bytes += m.data_len;
            e.freed_region_bytes += m.regions.iter().map(|r| r.stored_len as u64).sum::<u64>();
            return;
        }
        for (i, r) in m.regions.iter().enumerate() {
            let raw = r.raw_len.max(1) as u64;
            e.freed_bytes += r.stored_len as u64 * marked_raw[i].min(raw) / raw;
            let (n, k) = region_chunks[i];
            if n > 0 && n == k {
                e.freed_region_bytes += r.stored_len as u64;
            }
        }
    })?;
    e.seconds = started.elapsed().as_secs_f64();
    Ok(e)
}
