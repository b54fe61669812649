//! `strata volume serve NAME --at SNAPSHOT`: a stored version of a
//! volume served read-only over NBD straight from the repository (or its
//! cloud tier) — instant recovery: a VM boots from yesterday's disk, or a
//! file is fished out of it, without restoring the image first. The
//! volume itself is not opened: it may be served meanwhile, or gone.

use super::super::tier;
use anyhow::{anyhow, bail, Context, Result};
use std::io;
use std::sync::Arc;
use strata_core::format::{NodeKind, Snapshot};
use strata_store::fsread::{FileReader, RegionCache, SnapshotReader};
use strata_volume::nbd::BlockDevice;

/// A version's image file, read through the repository: reads only.
pub(super) struct StoredImage {
    file: FileReader,
    size: u64,
}

impl BlockDevice for StoredImage {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<Vec<(u64, u64)>> {
        let got = self
            .file
            .read_at(offset, buf.len())
            .map_err(|e| io::Error::other(e.to_string()))?;
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        // (Past the image's end, within the export: zeros.)
        buf[n..].fill(0);
        Ok(Vec::new())
    }

    fn write(&self, _: u64, _: Vec<u8>, _: bool) -> io::Result<()> {
        Err(read_only())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, _: u64, _: u64, _: bool) -> io::Result<()> {
        Err(read_only())
    }

    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> io::Result<()> {
        Err(read_only())
    }

    fn read_only(&self) -> bool {
        true
    }
}

fn read_only() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}

/// The snapshot `at` names in series `volume:NAME`: `latest`, a version
/// number of the series, or a snapshot id (prefix) that must belong to it.
fn find(repo: &strata_store::Repository, name: &str, at: &str) -> Result<(String, Snapshot)> {
    let series = format!("volume:{name}");
    let spec = match at {
        "latest" => format!("{series}@latest"),
        v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => format!("{series}@{v}"),
        id => id.to_string(),
    };
    let filter = strata_store::snapshots::SnapshotFilter::default();
    let (id, s) = repo.resolve_snapshot_in(&spec, &filter).with_context(|| {
        format!("no snapshot {at:?} of volume {name} (see `strata snapshots --series {series}`)")
    })?;
    if s.series != series {
        bail!(
            "snapshot {} is of {:?}, not of volume {name} (series {series})",
            crate::output::short(&id),
            s.series
        );
    }
    Ok((id, s))
}

/// The image of volume `name` in the snapshot `at` names, opened for
/// reads: the device, the snapshot's id and the snapshot.
pub(super) fn open(
    cli: &crate::Cli,
    name: &str,
    at: &str,
    cache_bytes: usize,
) -> Result<(Arc<StoredImage>, String, Snapshot)> {
    let repo = crate::open(cli)?;
    let (id, s) = find(&repo, name, at)?;
    let want = format!("{name}.img");
    let cache = Arc::new(RegionCache::new(cache_bytes));
    // The active recipe first; its cloud part only when the image moved.
    let mut parts = vec![s.clone()];
    parts.extend(strata_store::tier::paths::part_snapshot(&s));
    for (i, part) in parts.iter().enumerate() {
        let recipe = Arc::new(repo.load_recipe(&part.recipe)?);
        let Some(node) = recipe.nodes.iter().find(|n| n.path == want.as_bytes()) else {
            continue;
        };
        if node.kind != NodeKind::File {
            bail!(
                "{want} in snapshot {} is {}, not an image",
                crate::output::short(&id),
                node.kind.noun()
            );
        }
        let data = match i {
            0 => tier::data_repo(&repo, part)?,
            _ => tier::cloud(&repo)?,
        };
        let reader = SnapshotReader::new(data, part.clone(), recipe.clone(), cache);
        let file = reader.open(node)?;
        let size = file.size();
        return Ok((Arc::new(StoredImage { file, size }), id, s));
    }
    Err(anyhow!(
        "snapshot {} has no image {want} (not a volume snapshot?)",
        crate::output::short(&id)
    ))
}
