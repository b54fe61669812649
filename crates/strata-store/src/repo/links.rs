//! Linked containers (`docs/design-linked-snapshots.md`): a container
//! whose regions a volume holds in its own disk blocks. Its data object
//! `data/ID` is a link stub (`LINK_MAGIC`, then a sealed [`LinkStub`]: the
//! volume, and each region's disk blocks and fingerprint), and a marker
//! `links/ID` holding the volume's name tells readers which containers to
//! look at (and lets deleting the container release the hold however far
//! linking got); its metadata, index entries and the recipes that use it
//! are those of an ordinary container. A region of a
//! linked container reads the same plaintext as a stored one would: its
//! blocks read from the volume's data file, decrypted, joined, and checked
//! against the region's fingerprint.
//!
//! The store reads no volume itself: the caller gives the repository
//! handle its [`Volumes`] (`Repository::with_volumes`; the `strata-link`
//! crate has them for a local repository's `volumes/`), through which a
//! linked container's blocks are read and its hold released. A volume's
//! snapshot links the containers it writes as it writes them (the link
//! sink in `strata-link`, through the container writer's
//! `engine::writer::Linker`); [`delete_data`] releases the hold before the stub
//! goes (gc, compaction, forget).

use crate::error::{Result, StoreError};
use crate::repo::volumes::Links;
pub use crate::repo::volumes::{HeldBlocks, Linked, Volumes};
use crate::repo::{data_name, Repository};
use std::collections::HashSet;
use std::sync::Arc;
use strata_core::crypto::Kind;
use strata_core::format::{
    decode, ContainerId, ContainerMeta, LinkStub, RegionInfo, CONTAINER_MAGIC, LINK_MAGIC,
};
use strata_core::BLOCK_SIZE as BLOCK;

/// The marker of linked container `id`.
pub fn marker_name(id: &ContainerId) -> String {
    format!("links/{}", id.to_hex())
}

/// Whether `name` can be a volume's name (a stub or marker that names
/// anything else is damaged).
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl Repository {
    /// Forgets the list of linked containers (read again on next use).
    pub fn forget_listed(&self) {
        *self.links.listed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// This repository's volumes (those of a local repository, in its
    /// `volumes/`): needed to read linked containers and release their
    /// holds. The library reads no environment: the caller says.
    pub fn with_volumes(mut self, volumes: Option<Arc<dyn Volumes>>) -> Self {
        self.links = Arc::new(Links {
            volumes,
            dry: self.links.dry,
            ..Default::default()
        });
        self
    }

    /// The containers marked linked (`links/`), listed once per handle.
    pub fn linked_ids(&self) -> Result<Arc<HashSet<ContainerId>>> {
        let mut l = self.links.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*l {
            return Ok(s.clone());
        }
        let ids: HashSet<ContainerId> = self
            .backend()
            .list("links/")?
            .iter()
            .filter_map(|o| o.name.strip_prefix("links/"))
            .filter_map(ContainerId::from_hex)
            .collect();
        let ids = Arc::new(ids);
        *l = Some(ids.clone());
        Ok(ids)
    }

    /// Notes that container `id` is marked linked now (this handle wrote
    /// its marker).
    pub fn note_linked(&self, id: ContainerId) {
        let mut l = self.links.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = l.as_mut() {
            Arc::make_mut(set).insert(id);
        }
    }

    /// Container `id` if it is linked (its stub read and checked); None
    /// for a stored one — also when its marker is left over from linking
    /// that did not get to put the stub (its hold not taken).
    pub fn link_of(&self, id: &ContainerId) -> Result<Option<Arc<Linked>>> {
        if !self.linked_ids()?.contains(id) {
            return Ok(None);
        }
        if let Some(l) = self
            .links
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Ok(Some(l.clone()));
        }
        let name = data_name(id);
        let head = self
            .backend()
            .get_range(&name, 0, LINK_MAGIC.len() as u64)?;
        if head.starts_with(&CONTAINER_MAGIC) {
            return Ok(None);
        }
        let bytes = self.backend().get(&name)?;
        let stub = self.open_stub(&name, &bytes)?;
        let l = Arc::new(self.linked(&name, stub, bytes.len() as u64)?);
        self.links
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*id, l.clone());
        Ok(Some(l))
    }

    /// The stub in `bytes` (data object `name`), checked.
    fn open_stub(&self, name: &str, bytes: &[u8]) -> Result<LinkStub> {
        let corrupt = |e| StoreError::corrupt(name.to_string(), e);
        let env = bytes
            .strip_prefix(&LINK_MAGIC)
            .ok_or_else(|| corrupt(strata_core::CoreError::BadMagic("data container or link")))?;
        let plain = self.sealer().open(Kind::Link, env).map_err(corrupt)?;
        let stub: LinkStub = decode("link stub", &plain).map_err(corrupt)?;
        if !valid_volume_name(&stub.volume) {
            return Err(StoreError::Invalid(format!(
                "{name}: links to {:?}, which is not a volume name",
                stub.volume
            )));
        }
        for r in &stub.regions {
            if r.blocks.len() as u64 * BLOCK as u64 != r.raw_len as u64 {
                return Err(StoreError::Invalid(format!(
                    "{name}: a region of {} bytes in {} blocks",
                    r.raw_len,
                    r.blocks.len()
                )));
            }
        }
        Ok(stub)
    }

    fn linked(&self, name: &str, stub: LinkStub, stub_len: u64) -> Result<Linked> {
        let key = match &stub.salt {
            None => None,
            Some(salt) => Some(self.volume_key(salt).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name}: links to an encrypted volume, and the repository is not encrypted"
                ))
            })?),
        };
        let blocks = self.volumes(name, &stub.volume)?.blocks(&stub.volume, key);
        let by_offset = stub
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| (r.offset, i))
            .collect();
        Ok(Linked {
            stub,
            blocks,
            by_offset,
            stub_len,
        })
    }

    /// This repository's volumes, of which `name` needs volume `volume`
    /// (an error where they are not reachable from here).
    pub fn volumes(&self, name: &str, volume: &str) -> Result<&Arc<dyn Volumes>> {
        self.links.volumes.as_ref().ok_or_else(|| {
            StoreError::Invalid(format!(
                "{name} links to blocks of volume {volume}, and this repository's volumes are not \
                 reachable from here (a local repository's are in its `volumes/`)"
            ))
        })
    }

    /// Whether this is a what-if handle (holds are never released).
    pub fn is_dry(&self) -> bool {
        self.links.dry
    }

    /// Forgets the stub read of container `id` (its data object replaced).
    pub fn forget_link(&self, id: &ContainerId) {
        self.links
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

impl Linked {
    /// The plaintext of region `r` (as the container's metadata gives it),
    /// read from the volume's blocks and checked against its fingerprint.
    pub fn region(&self, repo: &Repository, name: &str, r: &RegionInfo) -> Result<Vec<u8>> {
        let lr = self
            .by_offset
            .get(&r.offset)
            .map(|&i| &self.stub.regions[i])
            .filter(|lr| lr.raw_len == r.raw_len)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name}: the link stub has no region at offset {} of {} bytes",
                    r.offset, r.raw_len
                ))
            })?;
        let mut out = vec![0u8; lr.raw_len as usize];
        self.blocks.read(&lr.blocks, &mut out).map_err(|e| {
            StoreError::io(
                "read",
                format!("{} (held blocks of {name})", self.blocks.describe()),
                e,
            )
        })?;
        if repo.hasher().hash(&out) != lr.hash {
            return Err(StoreError::corrupt(
                format!(
                    "{name} (region at offset {}, held by volume {})",
                    r.offset, self.stub.volume
                ),
                strata_core::CoreError::Truncated(
                    "the volume's blocks no longer hold what the container held",
                ),
            ));
        }
        Ok(out)
    }

    /// Checks, without reading them, that the volume's data file has
    /// every block the stub names (`check` without `--read-data`).
    pub fn verify_reachable(&self, name: &str) -> Result<()> {
        let len = self.blocks.data_len().map_err(|e| {
            StoreError::io(
                "open",
                format!("{} (held blocks of {name})", self.blocks.describe()),
                e,
            )
        })?;
        match self.blocks().max() {
            Some(b) if b.saturating_add(1).saturating_mul(BLOCK as u64) > len => {
                Err(StoreError::Invalid(format!(
                    "{name}: links to block {b} of volume {}, past the end of its data file",
                    self.stub.volume
                )))
            }
            _ => Ok(()),
        }
    }

    /// The blocks the volume holds for this container.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.stub
            .regions
            .iter()
            .flat_map(|r| r.blocks.iter().copied())
    }
}

/// Deletes container `id`'s data object: a linked one's hold is released
/// first (the volume gives its blocks back at its next checkpoint), and
/// its marker goes last.
pub fn delete_data(repo: &Repository, id: &ContainerId) -> Result<()> {
    // The marker names the volume: its hold is released even when
    // linking stopped before the stub was put. (Looked
    // up, not taken from the list: another process may have linked it
    // since this handle listed them.)
    release_by_marker(repo, id)?;
    repo.backend().delete(&data_name(id))?;
    repo.backend().delete(&marker_name(id))?;
    repo.forget_link(id);
    Ok(())
}

/// Releases the hold of container `id` in the volume its marker names
/// (nothing without a marker, or on a what-if handle). Returns whether
/// there was a marker.
pub fn release_by_marker(repo: &Repository, id: &ContainerId) -> Result<bool> {
    let raw = match repo.backend().get(&marker_name(id)) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if repo.links.dry {
        return Ok(true);
    }
    let volume = String::from_utf8(raw).unwrap_or_default();
    if !valid_volume_name(&volume) {
        return Err(StoreError::Invalid(format!(
            "{}: its marker names no volume (damaged)",
            marker_name(id)
        )));
    }
    release(repo, id, &volume)?;
    Ok(true)
}

/// Releases volume `volume`'s hold of container `id`.
pub fn release(repo: &Repository, id: &ContainerId, volume: &str) -> Result<()> {
    repo.volumes(&data_name(id), volume)?
        .release(volume, &id.to_hex())
        .map_err(|e| StoreError::Invalid(format!("releasing the blocks of {}: {e}", data_name(id))))
}

/// Container `m`'s data object laid out exactly as its metadata says,
/// each region's plaintext from `plain` (sealed compressed, or to the
/// length the metadata gives it where that differs); and whether a region
/// would compress shorter than that length.
pub fn stored_bytes(
    repo: &Repository,
    m: &ContainerMeta,
    plain: impl Fn(&RegionInfo) -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, bool)> {
    let name = data_name(&m.id);
    let differs = |what: &str| {
        StoreError::Invalid(format!(
            "{name}: stored again, {what} would differ from its metadata; it stays linked"
        ))
    };
    let mut data = strata_core::format::container_header().to_vec();
    let mut regions: Vec<&RegionInfo> = m.regions.iter().collect();
    regions.sort_by_key(|r| r.offset);
    let mut shorter = false;
    for r in regions {
        let plain = plain(r)?;
        let mut sealed = crate::repo::container::seal_region(repo, &plain)?;
        shorter |= sealed.len() < r.stored_len as usize;
        if sealed.len() != r.stored_len as usize {
            // Another zstd compresses it otherwise: sealed to the length
            // the container gives it, padded.
            sealed = repo
                .sealer()
                .seal_padded(Kind::Region, &plain, r.stored_len as usize)?
                .ok_or_else(|| differs("a region"))?;
        }
        if data.len() as u64 != r.offset {
            return Err(differs("a region"));
        }
        data.extend_from_slice(&sealed);
    }
    let mut meta = m.clone();
    let tail = match crate::repo::container::container_tail(repo, &mut meta, data.len() as u64) {
        Ok(tail) if meta == *m => tail,
        // (Another zstd, or one that does not settle: the metadata sealed
        // to the length it had.)
        _ => crate::repo::container::container_tail_sized(repo, m, data.len() as u64)?
            .ok_or_else(|| differs("its metadata"))?,
    };
    data.extend_from_slice(&tail);
    if data.len() as u64 != m.data_len {
        return Err(differs("its metadata"));
    }
    Ok((data, shorter))
}
