//! The commit stage of a backup: index object → recipe → snapshot object.
//! The snapshot write is the atomic switch (DESIGN.md "Principles" 2): a
//! crash at any earlier point leaves only unreferenced objects that `gc`
//! removes.

use crate::engine::index::ContainerTable;
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use std::collections::HashMap;
use strata_core::format::{ContainerId, SegmentRef, Snapshot};

/// Renumbers the direct references of `segments`, which hold indexes into
/// `table`, into a container table of their own listing only the
/// containers used, and returns that table.
pub(crate) fn localise<'a>(
    segments: impl Iterator<Item = &'a mut SegmentRef>,
    table: &ContainerTable,
) -> Vec<ContainerId> {
    let mut local: HashMap<u32, u32> = HashMap::new();
    let mut containers = Vec::new();
    for s in segments {
        for c in &mut s.chunks {
            if c.is_zero() {
                continue;
            }
            let g = c.container;
            c.container = *local.entry(g).or_insert_with(|| {
                containers.push(table.get(g));
                containers.len() as u32 - 1
            });
        }
    }
    containers
}

/// Writes the snapshot object — the commit point — with the next free
/// version number of its series. Two backups of one series may run at once
/// (they share the lock); should both pick the same number, the one with
/// the larger id withdraws its object and takes the next number.
pub(crate) fn commit_snapshot(repo: &Repository, snapshot: &mut Snapshot) -> Result<String> {
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
        repo.backend().delete(&format!("snapshots/{id}"))?;
        snapshot.version = next(repo, &snapshot.series)?.max(snapshot.version + 1);
    }
    Err(StoreError::Invalid(format!(
        "could not find a free version number in series {:?}; retry the backup",
        snapshot.series
    )))
}
