//! A volume's linked containers stored again (`volume delete`, `volume
//! defrag`), and what killed snapshots of a volume left linked released.

use std::collections::HashSet;
use strata_core::format::{ContainerId, ContainerMeta};
use strata_store::repo::links::{delete_data, marker_name, release, stored_bytes, Linked};
use strata_store::repo::{data_name, meta_name, Repository};
use strata_store::{Result, StoreError};

/// Releases what killed snapshots of volume `volume` left linked: each
/// container its marker names that no index lists (a snapshot's
/// containers are indexed as it commits, or every 256 Ki chunks) —
/// its hold released, its stub or data, metadata and marker deleted, as
/// gc does for any container no index lists, and as gc refused when a
/// version needs chunks only such a container holds. Only under the
/// repository's exclusive lock, so no backup is writing containers it has
/// not indexed yet: when another command holds a lock, nothing is done
/// (`None`). The caller makes sure no other snapshot of the volume runs.
/// Returns the containers released. (What a killed snapshot had indexed
/// already waits for gc.)
pub fn sweep_unindexed(repo: &Repository, volume: &str) -> Result<Option<u64>> {
    if repo.is_dry() {
        return Ok(Some(0));
    }
    let _lock = match strata_store::repo::lock::acquire(repo, true, "volume snapshot (leftovers)") {
        Ok(l) => l,
        Err(StoreError::Locked { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    repo.forget_listed();
    let ids: Vec<ContainerId> = repo.linked_ids()?.iter().copied().collect();
    if ids.is_empty() {
        return Ok(Some(0));
    }
    let indexed = strata_store::repo::index::RepoIndex::load_summaries(repo)?.containers;
    let mut candidates = Vec::new();
    for id in ids.into_iter().filter(|id| !indexed.contains_key(id)) {
        if marked_for(repo, &id, volume)? {
            candidates.push(id);
        }
    }
    // As gc: none goes while a version needs chunks only it holds (an
    // index object lost or damaged: `strata repair index` first).
    let names: Vec<String> = candidates.iter().map(data_name).collect();
    strata_store::ops::gc::refuse_needed_orphans(repo, &names)?;
    for id in &candidates {
        repo.backend().delete(&meta_name(id))?;
        delete_data(repo, id)?;
    }
    repo.forget_listed();
    Ok(Some(candidates.len() as u64))
}

/// Whether container `id` has a marker, and it names volume `volume`.
fn marked_for(repo: &Repository, id: &ContainerId, volume: &str) -> Result<bool> {
    match repo.backend().get(&marker_name(id)) {
        Ok(raw) => Ok(raw == volume.as_bytes()),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What [`unlink_volume`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct UnlinkReport {
    /// Containers stored again in the repository, and their bytes.
    pub containers: u64,
    pub stored_bytes: u64,
    /// Containers whose blocks no longer hold what they held (changed on
    /// the host): their versions are damaged already. They stay linked and
    /// held.
    pub damaged: Vec<(ContainerId, String)>,
    /// Containers that could not be stored again for another reason (an
    /// I/O error, a full disk, a region that would not seal to the same
    /// length), with why: they stay linked and held.
    pub failed: Vec<String>,
    /// Of those stored again, containers the link sink had linked (their
    /// metadata gives them uncompressed) whose data compresses: copied
    /// forward into compressed containers, the recipes pointing at them
    /// rewritten, and the bytes that freed.
    pub recompressed: u64,
    pub recompressed_freed_bytes: u64,
    /// Why that copy failed, if it did (they stay stored uncompressed).
    pub recompress_failed: Option<String>,
}

/// Stores again every container linked to volume `volume` (before the
/// volume is deleted or replaced), reading each linked region once.
///
/// A container the link sink linked (its metadata gives every region
/// uncompressed) is copied forward into compressed containers, with the
/// recipes pointing at it rewritten (pool compaction of those alone, as
/// gc does; deleting the original releases its hold). Any other — or one
/// the copy leaves behind — is sealed again into a data object laid out
/// exactly as its metadata says (the same regions at the same offsets:
/// zstd and the envelope give the same lengths for the same plaintext;
/// where another zstd does not, each region and the metadata are sealed
/// to the length they had, padded with a frame decompression passes
/// over), which replaces the stub; then the hold is released and the
/// marker goes. A container whose blocks do not check out, or that would
/// not come out the same, stays linked and held (`damaged`, `failed`).
/// Holds the repository's lock.
pub fn unlink_volume(repo: &Repository, volume: &str) -> Result<UnlinkReport> {
    if repo.is_dry() {
        return Err(StoreError::Invalid(
            "a what-if handle stores nothing again".into(),
        ));
    }
    let _lock = strata_store::repo::lock::acquire(repo, true, "volume unlink")?;
    repo.forget_listed();
    let mut rep = UnlinkReport::default();
    let mut compressible = HashSet::new();
    let mut direct: Vec<(ContainerId, u64)> = Vec::new();
    let ids: Vec<ContainerId> = repo.linked_ids()?.iter().copied().collect();
    for id in ids {
        match unlink_one(repo, volume, &id, true, &mut rep)? {
            Unlinked::Copy(bytes) => direct.push((id, bytes)),
            Unlinked::Compressible => drop(compressible.insert(id)),
            Unlinked::Done => {}
        }
    }
    repo.forget_listed();
    // Linked by the sink, or stored uncompressed: copied forward
    // compressed, whatever their fill (all of them in one pass).
    let mut first: Option<String> = None;
    if !direct.is_empty() || !compressible.is_empty() {
        let these = compressible
            .iter()
            .copied()
            .chain(direct.iter().map(|d| d.0));
        match recompress(repo, these.collect(), &mut rep) {
            Ok(()) => compressible.clear(),
            Err(e) => first = Some(e.to_string()),
        }
    }
    // What the copy left linked (it failed — a region that does not check
    // out — or passed it over), stored again one by one, then copied
    // forward once more.
    let (damaged, failed) = (rep.damaged.len(), rep.failed.len());
    for (id, bytes) in direct {
        if repo.backend().size(&marker_name(&id))?.is_some() {
            if let Unlinked::Compressible = unlink_one(repo, volume, &id, false, &mut rep)? {
                compressible.insert(id);
            }
        } else {
            rep.containers += 1;
            rep.stored_bytes += bytes;
        }
    }
    repo.forget_listed();
    // The first copy's failure is told unless what it failed on is named
    // already (damaged, or failed to store again).
    if rep.damaged.len() > damaged || rep.failed.len() > failed {
        first = None;
    }
    if !compressible.is_empty() {
        if let Err(e) = recompress(repo, compressible, &mut rep) {
            first = Some(e.to_string());
        }
    }
    rep.recompress_failed = first;
    rep.stored_bytes = rep
        .stored_bytes
        .saturating_sub(rep.recompressed_freed_bytes);
    Ok(rep)
}

/// What [`unlink_one`] made of a linked container.
enum Unlinked {
    /// Linked by the sink: left linked, to be copied forward (its stored
    /// bytes, as its metadata gives them).
    Copy(u64),
    /// Stored (again), uncompressed, though its data may compress.
    Compressible,
    /// Stored again as it was, damaged, failed, or not this volume's.
    Done,
}

/// Container `id`, if its marker names `volume`: stored again and its
/// hold released — unless the sink linked it and `defer` (then left for
/// the copy forward).
fn unlink_one(
    repo: &Repository,
    volume: &str,
    id: &ContainerId,
    defer: bool,
    rep: &mut UnlinkReport,
) -> Result<Unlinked> {
    if !marked_for(repo, id, volume)? {
        return Ok(Unlinked::Done);
    }
    // (A container half deleted by an interrupted gc has nothing to
    // store again: its hold and marker just go.)
    let linked = match repo.link_of(id) {
        Err(StoreError::NotFound(_)) => None,
        Err(StoreError::Backend(e)) if e.is_not_found() => None,
        r => r?,
    };
    let mut done = Unlinked::Done;
    if linked.is_none() && stored_uncompressed(repo, id) {
        // Stored, its marker kept (the sink's hold failed): as the
        // sink wrote it, uncompressed.
        done = Unlinked::Compressible;
    }
    let meta = match linked {
        None => None,
        Some(l) => match strata_store::repo::container::read_meta(repo, id) {
            Ok(m) => Some((l, m)),
            Err(StoreError::NotFound(_)) => None,
            Err(StoreError::Backend(e)) if e.is_not_found() => None,
            Err(e) => return Err(e),
        },
    };
    if let Some((l, m)) = meta {
        if defer && uncompressed(repo, &m) {
            return Ok(Unlinked::Copy(m.data_bytes()));
        }
        match store_again(repo, &m, &l) {
            Ok(shorter) => {
                rep.containers += 1;
                rep.stored_bytes += m.data_bytes();
                if shorter {
                    done = Unlinked::Compressible;
                }
            }
            Err(e @ StoreError::Corrupt { .. }) => {
                rep.damaged.push((*id, e.to_string()));
                return Ok(Unlinked::Done);
            }
            Err(e) => {
                rep.failed.push(e.to_string());
                return Ok(Unlinked::Done);
            }
        }
    }
    // Stored (again, or linked no further than its marker): the volume
    // may let the blocks go.
    release(repo, id, volume)?;
    repo.backend().delete(&marker_name(id))?;
    Ok(done)
}

/// Pool compaction of containers `only`, whatever their fill: their live
/// chunks copied forward compressed, the recipes rewritten, the originals
/// deleted (a linked one's hold released); counted in `rep`.
fn recompress(repo: &Repository, only: HashSet<ContainerId>, rep: &mut UnlinkReport) -> Result<()> {
    let mut gc = strata_store::ops::gc::GcReport::default();
    let opts = strata_store::ops::gc::GcOptions {
        only: Some(only),
        ..Default::default()
    };
    strata_store::ops::gc::compact::compact_pool(repo, &opts, &mut gc)?;
    rep.recompressed += gc.containers_rewritten;
    rep.recompressed_freed_bytes += gc.bytes_freed;
    Ok(())
}

/// Whether container `id` is stored and every region of it uncompressed
/// (its length the plaintext's plus the envelope's), as the link sink
/// stores a container whose hold the volume did not take.
fn stored_uncompressed(repo: &Repository, id: &ContainerId) -> bool {
    strata_store::repo::container::read_meta(repo, id).is_ok_and(|m| uncompressed(repo, &m))
}

/// Whether container `m`'s metadata gives every region uncompressed (its
/// length the plaintext's plus the envelope's), as the link sink lays
/// them out.
fn uncompressed(repo: &Repository, m: &ContainerMeta) -> bool {
    let overhead = repo.sealer().overhead() as u64;
    !m.regions.is_empty()
        && m.regions
            .iter()
            .all(|r| r.stored_len as u64 == r.raw_len as u64 + overhead)
}

/// Container `m`'s data object made again from its linked regions and
/// put in place of the stub. Returns whether a region would compress
/// shorter than its metadata lets it be here (one the link sink linked,
/// which its metadata gives uncompressed).
fn store_again(repo: &Repository, m: &ContainerMeta, l: &Linked) -> Result<bool> {
    let name = data_name(&m.id);
    let (data, shorter) = stored_bytes(repo, m, |r| l.region(repo, &name, r))?;
    repo.backend().put(&name, &data)?;
    repo.backend().evict(&name);
    repo.forget_link(&m.id);
    Ok(shorter)
}
