//! Reading a compression region, whatever holds it: a data container's
//! region stored whole ([`crate::repo::container`]), one stored as a
//! delta against bases elsewhere ([`crate::repo::delta`]), or one a volume
//! holds for a linked container ([`crate::repo::links`]). Every command
//! reads regions through here.

use crate::error::Result;
use crate::repo::container::open_plain_region;
use crate::repo::{data_name, Repository};
use strata_core::crypto::{claimed_kind, Kind};
use strata_core::format::{ContainerId, RegionInfo};

/// Reads and opens region `r` of container `id`, checking its length.
pub fn read_region(repo: &Repository, id: &ContainerId, r: &RegionInfo) -> Result<Vec<u8>> {
    read_with(repo, id, r, open_region)
}

/// Opens a region envelope read as part of a larger range.
pub fn open_region(repo: &Repository, name: &str, env: &[u8], r: &RegionInfo) -> Result<Vec<u8>> {
    if claimed_kind(env) == Some(Kind::DeltaRegion as u8) {
        return crate::repo::delta::open_delta_region(repo, name, env, r, &read_plain_region);
    }
    open_plain_region(repo, name, env, r)
}

/// [`read_region`] of a region that must be stored whole (a delta's
/// base: chains are one deep).
pub fn read_plain_region(repo: &Repository, id: &ContainerId, r: &RegionInfo) -> Result<Vec<u8>> {
    read_with(repo, id, r, open_plain_region)
}

/// Opens a region's envelope (of data object `name`).
type Opener = fn(&Repository, &str, &[u8], &RegionInfo) -> Result<Vec<u8>>;

/// Region `r` of container `id` from the volume that holds it (linked),
/// else read from storage and opened by `open`.
fn read_with(repo: &Repository, id: &ContainerId, r: &RegionInfo, open: Opener) -> Result<Vec<u8>> {
    let name = data_name(id);
    if let Some(l) = repo.link_of(id)? {
        return l.region(repo, &name, r);
    }
    let raw = repo
        .backend()
        .get_range(&name, r.offset, r.stored_len as u64)?;
    open(repo, &name, &raw, r)
}
