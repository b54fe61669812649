//! Garbage collection of the cloud tier (Data Domain Cloud Tier §7): the
//! live compression regions are marked from the cloud versions' recipes —
//! the local copies, so marking reads nothing from the bucket — and
//! containers with dead regions are cleaned *without downloading them*:
//! a container with no live region is deleted; one whose dead regions hold
//! more than `threshold` of its bytes is copied forward region by region,
//! with its neighbours, into new containers assembled next to the store
//! ([`super::copy_forward`]). A region with one live chunk is kept whole:
//! what region granularity keeps of dead chunks is the cleaning efficiency
//! lost (§8.1.2), reported as `dead_bytes_kept`.
//!
//! Order (crash safety): new containers and their metadata objects → an
//! index object listing them → each affected version's recipe rewritten
//! (both sides) and its snapshot objects replaced (the bucket's, then the
//! local one) → the old containers leave the index → they are deleted.

use super::copy_forward::{Assemble, CopyForward, Piece};
use crate::engine::copy::delete_containers;
use crate::error::{Result, StoreError};
use crate::repo::index::{edit_index, put_index_object, RepoIndex};
use crate::repo::lock;
use crate::repo::recipe;
use crate::repo::recipe::refs::{rewrite_into, Target};
use crate::repo::{data_name, meta_name, now_ns, Repository};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use strata_core::crypto::random_bytes;
use strata_core::format::{
    container_header, ChunkEntry, ChunkRef, ContainerId, ContainerMeta, RegionInfo, Snapshot, Tier,
    CONTAINER_FOOTER_LEN, CONTAINER_HEADER_LEN,
};
use strata_core::id::{RecipeId, SnapshotId};

#[derive(Clone, Debug)]
pub struct CloudGcOptions {
    /// Copy a container forward when more than this fraction of its
    /// stored region bytes is in dead regions.
    pub threshold: f64,
    pub dry_run: bool,
}

impl Default for CloudGcOptions {
    fn default() -> Self {
        CloudGcOptions {
            threshold: 0.2,
            dry_run: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CloudGcReport {
    pub copier: String,
    /// Bucket copies of cloud parts no local version has any more (a
    /// forget, recall or migration interrupted, a version expired by the
    /// lifecycle), dropped before marking.
    pub orphan_parts_dropped: u64,
    pub containers_before: u64,
    pub bytes_before: u64,
    pub containers_deleted: u64,
    pub containers_copied_forward: u64,
    pub containers_written: u64,
    /// Stored bytes of dead regions freed.
    pub dead_bytes_freed: u64,
    /// Stored bytes (pro rata) of dead chunks inside regions kept for a
    /// live chunk: what chunk-level cleaning would also free.
    pub dead_bytes_kept: u64,
    /// Dead regions copied along because a copier's parts have a minimum
    /// size (S3's 5 MiB), and containers left alone as smaller than that.
    pub dead_bytes_copied: u64,
    pub containers_too_small: u64,
    /// `dead_bytes_kept` over all dead bytes: the efficiency region
    /// granularity costs (§8.1.2).
    pub efficiency_loss: f64,
    /// Region bytes copied next to the store, and bytes that crossed the
    /// network to and from here for it.
    pub bytes_copied: u64,
    pub bytes_downloaded: u64,
    pub bytes_uploaded: u64,
    /// Bytes of the copy-forward service's answers (status lines, no data).
    pub service_answer_bytes: u64,
    /// Requests of S3's server-side copy (multipart create, part copies,
    /// complete), which the request meter does not see.
    pub server_side_copy_requests: u64,
    pub recipes_rewritten: u64,
    pub bytes_after: u64,
    pub seconds: f64,
}

/// What the cloud versions use: per container, per region, the offsets of
/// live chunks.
type Live = HashMap<ContainerId, HashMap<u32, HashSet<u32>>>;

fn mark(local: &Repository, cloud_versions: &[(SnapshotId, Snapshot)]) -> Result<Live> {
    let mut live: Live = HashMap::new();
    let mut seen = HashSet::new();
    for (_, s) in cloud_versions {
        if !seen.insert(s.recipe.clone()) {
            continue;
        }
        recipe::for_each_part(local, &s.recipe, |part| {
            for c in part
                .nodes
                .iter()
                .flat_map(|n| n.segments.iter().flat_map(|g| &g.chunks))
            {
                if let (true, Some(cid)) =
                    (c.is_direct(), part.containers.get(c.container as usize))
                {
                    live.entry(*cid)
                        .or_default()
                        .entry(c.region)
                        .or_default()
                        .insert(c.offset);
                }
            }
            Ok(())
        })?;
    }
    Ok(live)
}

/// A new container being planned: its regions (source container and
/// region) in order.
struct Plan {
    id: ContainerId,
    pieces: Vec<Piece>,
    meta: ContainerMeta,
    len: u64,
    /// Made of byte ranges of old containers (a copier with a minimum
    /// part size), not of regions.
    from_ranges: bool,
}

impl Plan {
    fn new(created: i64) -> Result<Plan> {
        let mut b = [0u8; 16];
        random_bytes(&mut b)?;
        let id = ContainerId(b);
        Ok(Plan {
            id,
            pieces: vec![Piece::Literal(container_header().to_vec())],
            meta: ContainerMeta {
                id,
                data_len: 0,
                created,
                stamp: None,
                regions: vec![],
                chunks: vec![],
                segments: vec![],
                deltas: Vec::new(),
            },
            len: CONTAINER_HEADER_LEN as u64,
            from_ranges: false,
        })
    }

    /// Appends `ranges` (byte ranges of `m`) one after the other: the live
    /// regions inside them are listed, the dead ones are filler.
    fn add_ranges(
        &mut self,
        m: &ContainerMeta,
        ranges: &[(u64, u64)],
        live: &[bool],
        moved: &mut HashMap<(ContainerId, u32), (ContainerId, u32)>,
    ) {
        for &(start, end) in ranges {
            self.pieces.push(Piece::Range {
                source: data_name(&m.id),
                offset: start,
                len: end - start,
            });
            for (r, info) in m.regions.iter().enumerate() {
                if live[r] && info.offset >= start && info.offset < end {
                    let at = self.meta.regions.len() as u32;
                    self.meta.regions.push(RegionInfo {
                        offset: self.len + (info.offset - start),
                        ..*info
                    });
                    self.meta.chunks.extend(
                        m.chunks
                            .iter()
                            .filter(|c| c.region as usize == r)
                            .map(|c| ChunkEntry { region: at, ..*c }),
                    );
                    moved.insert((m.id, r as u32), (self.id, at));
                }
            }
            self.len += end - start;
        }
    }

    /// Appends region `r` of container `m`; returns its index here.
    fn push(&mut self, m: &ContainerMeta, r: u32) -> u32 {
        let info = m.regions[r as usize];
        let at = self.meta.regions.len() as u32;
        let merged = match self.pieces.last_mut() {
            Some(Piece::Range {
                source,
                offset,
                len,
            }) if *source == data_name(&m.id) && *offset + *len == info.offset => {
                *len += info.stored_len as u64;
                true
            }
            _ => false,
        };
        if !merged {
            self.pieces.push(Piece::Range {
                source: data_name(&m.id),
                offset: info.offset,
                len: info.stored_len as u64,
            });
        }
        self.meta.regions.push(RegionInfo {
            offset: self.len,
            ..info
        });
        self.len += info.stored_len as u64;
        self.meta.chunks.extend(
            m.chunks
                .iter()
                .filter(|c| c.region == r)
                .map(|c| ChunkEntry { region: at, ..*c }),
        );
        at
    }
}

/// Byte ranges of container `m` that carry its live regions when every
/// range must hold at least `min` bytes, the first starting at 0 (so the
/// header comes along) when `from_zero`: a gap between live regions is
/// skipped when it is larger than `min`, else copied. `None` when the
/// container is too small.
fn ranges_for(
    m: &ContainerMeta,
    live: &[bool],
    min: u64,
    from_zero: bool,
) -> Option<Vec<(u64, u64)>> {
    let end_data = m
        .regions
        .iter()
        .map(|r| r.offset + r.stored_len as u64)
        .max()?;
    if end_data < min {
        return None;
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (_, info) in m.regions.iter().enumerate().filter(|(r, _)| live[*r]) {
        let (s, e) = (info.offset, info.offset + info.stored_len as u64);
        match out.last_mut() {
            None if from_zero => out.push((0, e.max(min))),
            None => {
                let start = s.min(end_data - min);
                out.push((start, e.max(start + min)))
            }
            Some(last) if s <= last.1 || s - last.1 <= min || s + min > end_data => {
                last.1 = last.1.max(e)
            }
            Some(_) => out.push((s, e.max(s + min))),
        }
    }
    for r in &mut out {
        r.1 = r.1.min(end_data);
    }
    // Ranges may meet once clamped; merge them.
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for r in out {
        match merged.last_mut() {
            Some(l) if r.0 <= l.1 => l.1 = l.1.max(r.1),
            _ => merged.push(r),
        }
    }
    Some(merged)
}

/// Cleans the cloud tier `cloud` of `local`.
pub fn cloud_gc(
    local: &Repository,
    cloud: &Repository,
    copier: &dyn CopyForward,
    opts: &CloudGcOptions,
) -> Result<CloudGcReport> {
    let started = std::time::Instant::now();
    let _l = lock::acquire(local, true, "tier gc")?;
    let _c = lock::acquire(cloud, true, "tier gc")?;
    let mut rep = CloudGcReport {
        copier: copier.describe(),
        ..Default::default()
    };
    let (all, cloud_versions) = versions(local, cloud, opts.dry_run, &mut rep)?;
    let live = mark(local, &all)?;
    let mut metas: Vec<ContainerMeta> = Vec::new();
    let idx = RepoIndex::load(cloud, |m| metas.push(m.clone()))?;
    metas.sort_by_key(|m| (m.created, m.id));
    rep.containers_before = metas.len() as u64;
    rep.bytes_before = idx.stored_bytes();
    let target = cloud.config().container_size as u64;
    let mut planned = plan(&metas, &live, copier, (opts.threshold, target), &mut rep)?;
    let lost = rep.dead_bytes_kept + rep.dead_bytes_copied;
    let dead_all = rep.dead_bytes_freed + lost;
    rep.efficiency_loss = if dead_all == 0 {
        0.0
    } else {
        lost as f64 / dead_all as f64
    };
    if opts.dry_run || planned.drop.is_empty() {
        rep.bytes_after = rep.bytes_before;
        rep.seconds = started.elapsed().as_secs_f64();
        return Ok(rep);
    }
    assemble(cloud, copier, std::mem::take(&mut planned.plans), &mut rep)?;
    repoint(local, cloud, &all, &cloud_versions, &planned, &mut rep)?;
    // The old containers leave the index, then the bucket.
    edit_index(cloud, &idx, &planned.drop, vec![])?;
    rep.containers_deleted = planned.drop.len() as u64;
    delete_containers(cloud, planned.drop.iter())?;
    rep.bytes_after = RepoIndex::load_summaries(cloud)?.stored_bytes();
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// Versions, with their ids.
type Versions = Vec<(SnapshotId, Snapshot)>;

/// Every version whose data is in the cloud tier — the versions there, the
/// cloud parts of active ones, and what the bucket lists beyond them —
/// and, apart, the versions wholly there. A cloud part no local version
/// claims (an interrupted move's) is dropped.
fn versions(
    local: &Repository,
    cloud: &Repository,
    dry_run: bool,
    rep: &mut CloudGcReport,
) -> Result<(Versions, Versions)> {
    let local_all = local.list_snapshots()?;
    let cloud_versions: Vec<(SnapshotId, Snapshot)> = local_all
        .iter()
        .filter(|(_, s)| s.tier == Tier::Cloud)
        .cloned()
        .collect();
    let mut all = cloud_versions.clone();
    // Cloud parts of active versions, as the local record has them (the
    // bucket's copy is brought in line should a crash have left it
    // behind).
    for (id, s) in &local_all {
        if let Some(p) = crate::repo::tiers::part_snapshot(s) {
            if !dry_run && cloud.load_snapshot(id).ok().as_ref() != Some(&p) {
                cloud.replace_snapshot(id, &p)?;
            }
            all.push((id.clone(), p));
        }
    }
    // Versions the bucket lists but the local namespace does not (an
    // interrupted migration's copy) are live too: never delete what some
    // namespace copy points at. A part no local version claims is not.
    let mut orphans = Vec::new();
    for (id, s) in cloud.list_snapshots()? {
        if all.iter().any(|(i, _)| *i == id) {
            continue;
        }
        if s.cloud_part.is_some() {
            if !dry_run {
                cloud.backend().delete(&format!("snapshots/{id}"))?;
            }
            orphans.push(s.recipe);
            continue;
        }
        all.push((id, s));
    }
    rep.orphan_parts_dropped = orphans.len() as u64;
    if !dry_run {
        recipe::delete_unused(cloud, &orphans)?;
        recipe::delete_unused(local, &orphans)?;
    }
    Ok((all, cloud_versions))
}

/// What cleaning will do: the containers that go, the new ones, and where
/// each live region of a copied one lands.
struct Planned {
    drop: HashSet<ContainerId>,
    plans: Vec<Plan>,
    moved: HashMap<(ContainerId, u32), (ContainerId, u32)>,
}

/// Plans the cleaning of containers `metas` (oldest first): one all dead
/// goes, one dead beyond `threshold` has its live regions copied forward
/// into new containers of about `target` bytes (or, for a copier with a
/// minimum part size, byte ranges of it).
fn plan(
    metas: &[ContainerMeta],
    live: &Live,
    copier: &dyn CopyForward,
    (threshold, target): (f64, u64),
    rep: &mut CloudGcReport,
) -> Result<Planned> {
    let mut p = Planned {
        drop: HashSet::new(),
        plans: Vec::new(),
        moved: HashMap::new(),
    };
    let created = now_ns();
    for m in metas {
        let lm = live.get(&m.id);
        let region_live = |r: usize| lm.is_some_and(|x| x.contains_key(&(r as u32)));
        let total: u64 = m.regions.iter().map(|r| r.stored_len as u64).sum();
        let dead: u64 = (0..m.regions.len())
            .filter(|&r| !region_live(r))
            .map(|r| m.regions[r].stored_len as u64)
            .sum();
        rep.dead_bytes_kept += dead_in_live_regions(m, lm);
        if dead == total {
            p.drop.insert(m.id);
            rep.dead_bytes_freed += total;
            continue;
        }
        if (dead as f64) <= threshold * total as f64 {
            continue;
        }
        let live: Vec<bool> = (0..m.regions.len()).map(region_live).collect();
        if copier.min_part() > 0 {
            plan_ranges(&mut p, m, &live, (copier.min_part(), target, created), rep)?;
            continue;
        }
        rep.containers_copied_forward += 1;
        rep.dead_bytes_freed += dead;
        p.drop.insert(m.id);
        for r in (0..m.regions.len()).filter(|&r| live[r]) {
            let fits = p
                .plans
                .last()
                .is_some_and(|q| q.len + m.regions[r].stored_len as u64 <= target);
            if !fits {
                p.plans.push(Plan::new(created)?);
            }
            if let Some(q) = p.plans.last_mut() {
                let at = q.push(m, r as u32);
                p.moved.insert((m.id, r as u32), (q.id, at));
            }
        }
    }
    Ok(p)
}

/// Bytes of dead chunks inside the live regions of container `m` (`lm`:
/// its live chunks by region): what region granularity keeps.
fn dead_in_live_regions(m: &ContainerMeta, lm: Option<&HashMap<u32, HashSet<u32>>>) -> u64 {
    let mut kept = 0;
    for (r, info) in m.regions.iter().enumerate() {
        let Some(offs) = lm.and_then(|x| x.get(&(r as u32))) else {
            continue;
        };
        let dead_raw: u64 = m
            .chunks
            .iter()
            .filter(|c| c.region as usize == r && !offs.contains(&c.offset))
            .map(|c| c.len as u64)
            .sum();
        kept += info.stored_len as u64 * dead_raw / (info.raw_len.max(1) as u64);
    }
    kept
}

/// Plans container `m` (its regions `live` or not) copied forward as byte
/// ranges of at least `min` (S3's part size), the first from the start
/// (the header); the dead bytes they must take along stay, unlisted.
fn plan_ranges(
    p: &mut Planned,
    m: &ContainerMeta,
    live: &[bool],
    (min, target, created): (u64, u64, i64),
    rep: &mut CloudGcReport,
) -> Result<()> {
    let total: u64 = m.regions.iter().map(|r| r.stored_len as u64).sum();
    // Into the open plan (its header came with its first range), or a new
    // one whose first range starts at 0.
    let open = p
        .plans
        .last()
        .is_some_and(|q| q.from_ranges && q.len + total <= target);
    let Some(ranges) = ranges_for(m, live, min, !open) else {
        rep.containers_too_small += 1;
        return Ok(());
    };
    if !open {
        let mut q = Plan::new(created)?;
        q.pieces.clear();
        q.len = 0;
        q.from_ranges = true;
        p.plans.push(q);
    }
    let copied: u64 = ranges.iter().map(|r| r.1 - r.0).sum();
    let kept: u64 = (0..m.regions.len())
        .filter(|&r| live[r])
        .map(|r| m.regions[r].stored_len as u64)
        .sum();
    let header = if open { 0 } else { CONTAINER_HEADER_LEN as u64 };
    rep.containers_copied_forward += 1;
    rep.dead_bytes_freed += total.saturating_sub(copied.saturating_sub(header));
    rep.dead_bytes_copied += copied.saturating_sub(kept + header);
    p.drop.insert(m.id);
    if let Some(q) = p.plans.last_mut() {
        q.add_ranges(m, &ranges, live, &mut p.moved);
    }
    Ok(())
}

/// The new containers, assembled next to the store, then their metadata
/// and an index object listing them.
fn assemble(
    cloud: &Repository,
    copier: &dyn CopyForward,
    plans: Vec<Plan>,
    rep: &mut CloudGcReport,
) -> Result<()> {
    let mut new_metas = Vec::new();
    for mut p in plans {
        let tail = crate::repo::container::container_tail(cloud, &mut p.meta, p.len)?;
        let meta_env = tail[..tail.len() - CONTAINER_FOOTER_LEN].to_vec();
        p.pieces.push(Piece::Literal(tail));
        let a = Assemble {
            dest: data_name(&p.id),
            pieces: p.pieces,
        };
        let cost = copier.assemble(&a)?;
        rep.bytes_copied += p.len;
        rep.bytes_downloaded += cost.downloaded;
        rep.bytes_uploaded += cost.uploaded;
        rep.service_answer_bytes += cost.answers;
        rep.server_side_copy_requests += cost.requests;
        match cloud.backend().size(&a.dest)? {
            Some(n) if n == p.meta.data_len => {}
            got => {
                return Err(crate::error::StoreError::Invalid(format!(
                    "{} was assembled with {got:?} bytes, not {}",
                    a.dest, p.meta.data_len
                )))
            }
        }
        cloud.backend().put(&meta_name(&p.id), &meta_env)?;
        new_metas.push(p.meta);
    }
    rep.containers_written = new_metas.len() as u64;
    if !new_metas.is_empty() {
        put_index_object(cloud, new_metas)?;
    }
    Ok(())
}

/// Points the versions `all` (`cloud_versions` of them wholly in the
/// cloud tier) that use containers that go at the copies: their recipes
/// rewritten a part at a time (a disk image's version is never held
/// whole).
fn repoint(
    local: &Repository,
    cloud: &Repository,
    all: &[(SnapshotId, Snapshot)],
    cloud_versions: &[(SnapshotId, Snapshot)],
    planned: &Planned,
    rep: &mut CloudGcReport,
) -> Result<()> {
    let mut by_recipe: BTreeMap<RecipeId, Vec<(SnapshotId, Snapshot)>> = BTreeMap::new();
    for (id, s) in all {
        by_recipe
            .entry(s.recipe.clone())
            .or_default()
            .push((id.clone(), s.clone()));
    }
    for (rid, users) in by_recipe {
        let uses = recipe::containers(local, &rid)?;
        if !uses.iter().any(|c| planned.drop.contains(c)) {
            continue;
        }
        let mut w = recipe::writer::RecipeWriter::new(cloud).with_mirror(local);
        let remap = |c: &ChunkRef, cid: Option<ContainerId>| {
            Ok(
                match cid.and_then(|id| planned.moved.get(&(id, c.region))) {
                    Some((nc, nr)) => Target::At(*nc, *nr, c.offset),
                    None => Target::Keep,
                },
            )
        };
        rewrite_into(local, &rid, remap, &mut w)?;
        let (new_rid, _) = w.finish()?;
        for (id, s) in users {
            let mut ns = s.clone();
            ns.recipe = new_rid.clone();
            if let Some(p) = ns.cloud_part.as_mut() {
                p.recipe = new_rid.clone();
            }
            cloud.replace_snapshot(&id, &ns)?;
            if cloud_versions.iter().any(|(i, _)| *i == id) {
                local.replace_snapshot(&id, &ns)?;
            } else {
                repoint_part(local, &id, &rid, &new_rid)?;
            }
        }
        if new_rid != rid {
            recipe::delete_unused(cloud, [&rid])?;
            recipe::delete_unused(local, [&rid])?;
        }
        rep.recipes_rewritten += 1;
    }
    Ok(())
}

/// Points an active version's cloud part at its rewritten recipe.
fn repoint_part(local: &Repository, id: &SnapshotId, old: &RecipeId, new: &RecipeId) -> Result<()> {
    let mut s = match local.load_snapshot(id) {
        Ok(s) => s,
        Err(StoreError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    match s.cloud_part.as_mut() {
        Some(p) if p.recipe == *old => {
            p.recipe = new.clone();
            local.replace_snapshot(id, &s)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(regions: usize, size: u32) -> ContainerMeta {
        ContainerMeta {
            id: ContainerId([1; 16]),
            data_len: 0,
            created: 0,
            stamp: None,
            regions: (0..regions)
                .map(|i| RegionInfo {
                    offset: CONTAINER_HEADER_LEN as u64 + i as u64 * size as u64,
                    stored_len: size,
                    raw_len: size,
                })
                .collect(),
            chunks: vec![],
            segments: vec![],
            deltas: Vec::new(),
        }
    }

    #[test]
    fn ranges_respect_the_minimum_part_and_cover_what_lives() {
        const MIB: u64 = 1 << 20;
        let m = container(20, MIB as u32);
        let min = 5 * MIB;
        let mut live = vec![false; 20];
        for r in [0, 1, 12, 13, 19] {
            live[r] = true;
        }
        for from_zero in [true, false] {
            let rs = ranges_for(&m, &live, min, from_zero).unwrap();
            assert!(rs.iter().all(|r| r.1 - r.0 >= min), "{rs:?}");
            assert_eq!(
                rs[0].0 == 0,
                from_zero || m.regions[0].offset == 0 || rs[0].0 == 0
            );
            for (i, info) in m.regions.iter().enumerate().filter(|(i, _)| live[*i]) {
                let end = info.offset + info.stored_len as u64;
                assert!(
                    rs.iter().any(|r| r.0 <= info.offset && end <= r.1),
                    "region {i}: {rs:?}"
                );
            }
            // The dead middle (regions 5..12) is skipped.
            let copied: u64 = rs.iter().map(|r| r.1 - r.0).sum();
            assert!(copied < 16 * MIB, "{rs:?}");
        }
        // Smaller than a part: nothing to do.
        assert!(ranges_for(&container(4, MIB as u32), &[true; 4], min, true).is_none());
    }
}
