//! A chunk's other stored copies: when the region a read needs is
//! damaged (its container missing, truncated or failing authentication),
//! the same chunk may be stored elsewhere — a segment index stores a
//! segment again rather than reference a distant one, a backup after a
//! lost container stores its chunks again. Restore, dump, mount and the
//! salvage of `repair snapshots` then read it from there, each copy
//! checked against the chunk's fingerprint.

use crate::error::{Result, StoreError};
use crate::repo::container::read_meta;
use crate::repo::index::RepoIndex;
use crate::repo::region::read_region;
use crate::repo::Repository;
use std::collections::{HashMap, HashSet};
use strata_core::format::{ContainerId, RegionInfo};
use strata_core::Fingerprint;

/// Whether `e` says a stored object is damaged or gone (so another copy
/// may help), rather than that the storage cannot be reached.
pub fn is_damage(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Corrupt { .. } | StoreError::NotFound(_) | StoreError::Core(_)
    )
}

/// Where a copy lies.
struct Copy {
    container: ContainerId,
    region: RegionInfo,
    offset: u32,
    len: u32,
}

/// The chunks `wanted` as stored in containers other than `damaged`
/// (those with no intact copy are left out): one pass over the index,
/// then each copy's region read and the chunk checked against its
/// fingerprint.
pub fn other_copies(
    repo: &Repository,
    damaged: &ContainerId,
    wanted: &[Fingerprint],
) -> Result<HashMap<Fingerprint, Vec<u8>>> {
    let want: HashSet<&Fingerprint> = wanted.iter().collect();
    let mut copies: HashMap<Fingerprint, Vec<Copy>> = HashMap::new();
    RepoIndex::load(repo, |m| {
        if m.id == *damaged {
            return;
        }
        for c in m.chunks.iter().filter(|c| want.contains(&c.fp)) {
            if let Some(r) = m.regions.get(c.region as usize) {
                copies.entry(c.fp).or_default().push(Copy {
                    container: m.id,
                    region: *r,
                    offset: c.offset,
                    len: c.len,
                });
            }
        }
    })?;
    let mut found = HashMap::new();
    let mut regions: HashMap<(ContainerId, u64), Option<Vec<u8>>> = HashMap::new();
    for (fp, places) in copies {
        for p in places {
            let plain = regions
                .entry((p.container, p.region.offset))
                .or_insert_with(|| read_region(repo, &p.container, &p.region).ok());
            let chunk = plain.as_ref().and_then(|b| {
                b.get(p.offset as usize..(p.offset as usize).checked_add(p.len as usize)?)
            });
            if let Some(chunk) = chunk.filter(|c| repo.hasher().hash(c) == fp) {
                found.insert(fp, chunk.to_vec());
                break;
            }
        }
    }
    Ok(found)
}

/// The plaintext of region `reg` of damaged container `cid` where
/// `ranges` (offset, length in the region) need it, rebuilt from other
/// stored copies of the chunks there (found by the container's metadata),
/// and how many chunks that took; `None` when a byte of a range has no
/// intact copy. Bytes outside the ranges are zeros.
pub fn rebuild_region(
    repo: &Repository,
    cid: &ContainerId,
    reg: &RegionInfo,
    ranges: &[(u32, u32)],
) -> Option<(Vec<u8>, u64)> {
    let meta = read_meta(repo, cid).ok()?;
    let idx = meta.regions.iter().position(|r| r.offset == reg.offset)? as u32;
    let overlaps = |off: u32, len: u32| {
        ranges
            .iter()
            .any(|&(o, l)| off < o.saturating_add(l) && o < off.saturating_add(len))
    };
    let mut needed: Vec<(u32, u32, Fingerprint)> = meta
        .chunks
        .iter()
        .filter(|c| c.region == idx && overlaps(c.offset, c.len))
        .map(|c| (c.offset, c.len, c.fp))
        .collect();
    needed.sort();
    let fps: Vec<Fingerprint> = needed.iter().map(|c| c.2).collect();
    let copies = other_copies(repo, cid, &fps).ok()?;
    let mut plain = vec![0u8; reg.raw_len as usize];
    for (off, len, fp) in &needed {
        let data = copies.get(fp).filter(|d| d.len() == *len as usize)?;
        plain
            .get_mut(*off as usize..(*off as usize).checked_add(data.len())?)?
            .copy_from_slice(data);
    }
    // Every byte of every range must lie in a chunk copied in.
    for &(o, l) in ranges {
        let mut at = o;
        for &(off, len, _) in &needed {
            if off <= at && at < off.saturating_add(len) {
                at = off.saturating_add(len);
            }
        }
        if at < o.saturating_add(l) {
            return None;
        }
    }
    Some((plain, needed.len() as u64))
}
