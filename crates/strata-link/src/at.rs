//! A stored version of a volume as a read-only block device, read
//! straight from the repository (or its cloud tier): `strata volume serve
//! NAME --at SNAPSHOT` serves it over NBD — instant recovery: a VM boots
//! from yesterday's disk, or a file is fished out of it, without
//! restoring the image first. The volume itself is not opened: it may be
//! served meanwhile, or gone.

use crate::error::{Context as _, LinkError, Result};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::format::Snapshot;
use strata_core::id::SnapshotId;
use strata_store::engine::fsread::{find_stored, FileReader, RegionCache};
use strata_store::tier::Tiers;
use strata_store::StoreError;
use strata_volume::nbd::BlockDevice;

/// A version's image file, read through the repository: reads only.
pub struct StoredImage {
    file: FileReader,
    size: u64,
    /// Reads that failed (the first few are logged, then every 1000th).
    failures: AtomicU64,
}

impl BlockDevice for StoredImage {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<Vec<(u64, u64)>> {
        let got = self.file.read_at(offset, buf.len()).map_err(|e| {
            let n = self.failures.fetch_add(1, Ordering::Relaxed);
            if n < 10 || n.is_multiple_of(1000) {
                tracing::warn!("reading {} at {offset}: {e}", self.file.path());
            }
            io::Error::other(e.to_string())
        })?;
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        // (The export is the image's size: a read is never past its end.)
        buf[n..].fill(0);
        // Zero chunks go back as holes in structured replies.
        let mut at = 0u64;
        let mut zeros = Vec::new();
        for (len, zero) in self.file.zero_runs(offset, buf.len() as u64) {
            if zero {
                zeros.push((at, at + len));
            }
            at += len;
        }
        Ok(zeros)
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

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        let len = len.min(strata_volume::volume::EXTENTS_MAX);
        Ok(self.file.zero_runs(offset, len))
    }
}

fn read_only() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}

/// The snapshot `at` names in series `volume:NAME`: `latest`, a version
/// number of the series, or a snapshot id (prefix) — looked up among the
/// series' snapshots only. Digits are a version number first, then an id
/// prefix (an id may be all digits).
fn find(repo: &strata_store::Repository, name: &str, at: &str) -> Result<(SnapshotId, Snapshot)> {
    let series = format!("volume:{name}");
    let (all, _) = repo.list_snapshots_tolerant()?;
    let mine: Vec<(SnapshotId, Snapshot)> = all
        .iter()
        .filter(|(_, s)| s.series == series)
        .cloned()
        .collect();
    let digits = !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit());
    let mut tries = Vec::new();
    match at {
        "latest" => tries.push(format!("{series}@latest")),
        v if digits => {
            tries.push(format!("{series}@{v}"));
            if v.len() >= 4 {
                tries.push(v.to_string());
            }
        }
        id => tries.push(id.to_string()),
    }
    for (k, spec) in tries.iter().enumerate() {
        match strata_store::repo::snapshots::resolve_in(&mine, spec) {
            Ok(found) => return Ok(found),
            Err(StoreError::NoSnapshot(_)) if k + 1 < tries.len() => continue,
            Err(StoreError::NoSnapshot(_)) => {
                // A snapshot of something else, named by its id?
                if let Ok((id, s)) = strata_store::repo::snapshots::resolve_in(&all, spec) {
                    return Err(LinkError::Invalid(format!(
                        "snapshot {} is of {:?}, not of volume {name} (series {series})",
                        short(&id),
                        s.series
                    )));
                }
                return Err(LinkError::Invalid(format!(
                    "no snapshot {at:?} of volume {name} (see `strata snapshots --series {series}`)"
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(LinkError::Invalid(format!(
        "no snapshot {at:?} of volume {name}"
    )))
}

/// The image of volume `name` in the snapshot `at` names, opened for
/// reads, and the repository's shared lock (held while it is served, so
/// that gc, forget and tier moves wait rather than take its data away).
pub struct Opened {
    pub image: Arc<StoredImage>,
    pub id: SnapshotId,
    pub snapshot: Snapshot,
    pub _lock: strata_store::repo::lock::LockGuard,
}

pub fn open(tiers: &Tiers, name: &str, at: &str, cache_bytes: usize) -> Result<Opened> {
    crate::dir::check_name(name)?;
    let repo = tiers.active();
    let lock = strata_store::repo::lock::acquire(repo, false, "volume serve --at")?;
    let (id, s) = find(repo, name, at)?;
    let want = format!("{name}.img");
    let cache = Arc::new(RegionCache::new(cache_bytes));
    // The active part first, then the cloud part (where moved files are);
    // the recipe read a part at a time, only the image's chunk runs kept.
    let mut parts = vec![s.clone()];
    parts.extend(strata_store::repo::tiers::part_snapshot(&s));
    for (i, part) in parts.into_iter().enumerate() {
        let cannot = || format!("cannot serve {want} of snapshot {}", short(&id));
        let Some(found) = find_stored(repo, &part.recipe, want.as_bytes()).with_context(cannot)?
        else {
            continue;
        };
        // (The cloud tier is opened only for an image moved there.)
        let data = tiers.part_data(&part, i > 0)?;
        let file = found
            .open(&data, &part, cache.clone())
            .with_context(cannot)?;
        let size = file.size();
        let image = Arc::new(StoredImage {
            file,
            size,
            failures: AtomicU64::new(0),
        });
        return Ok(Opened {
            image,
            id,
            snapshot: s,
            _lock: lock,
        });
    }
    Err(LinkError::Invalid(format!(
        "snapshot {} has no image {want} (not a volume snapshot?)",
        short(&id)
    )))
}

/// The first 8 characters of an id, as messages show it.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}
