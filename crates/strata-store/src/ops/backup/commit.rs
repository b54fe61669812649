//! The commit stage of a backup: index object → recipe → snapshot object.
//! The snapshot write is the atomic switch: a
//! crash at any earlier point leaves only unreferenced objects that `gc`
//! removes.

use crate::error::{Result, StoreError};
use crate::repo::Repository;
use strata_core::format::Snapshot;
use strata_core::id::SnapshotId;

/// Writes the snapshot object — the commit point — with the next free
/// version number of its series. Two backups of one series may run at once
/// (they share the lock); should both pick the same number, the one with
/// the larger id withdraws its object and takes the next number.
pub(crate) fn commit_snapshot(repo: &Repository, snapshot: &mut Snapshot) -> Result<SnapshotId> {
    let next = |repo: &Repository, series: &str| -> Result<u32> {
        Ok(repo
            .list_snapshots_tolerant()?
            .0
            .iter()
            .filter(|(_, s)| s.series == series)
            .map(|(_, s)| s.version)
            .max()
            .unwrap_or(0)
            + 1)
    };
    snapshot.version = next(repo, &snapshot.series)?;
    for _ in 0..16 {
        let id = repo.put_snapshot(snapshot)?;
        let clash = repo
            .list_snapshots_tolerant()?
            .0
            .into_iter()
            .any(|(other, s)| {
                other < id && s.series == snapshot.series && s.version == snapshot.version
            });
        if !clash {
            return Ok(id);
        }
        repo.backend().delete(&id.object_name())?;
        snapshot.version = next(repo, &snapshot.series)?.max(snapshot.version + 1);
    }
    Err(StoreError::Invalid(format!(
        "could not find a free version number in series {:?}; retry the backup",
        snapshot.series
    )))
}
