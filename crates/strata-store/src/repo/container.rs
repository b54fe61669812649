//! Data containers (docs/design.md "Vocabulary": container, compression region).
//!
//! A data container object is laid out as
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | header: `STRC`, format version, 3 reserved bytes |
//! | 8 | … | compression regions, each a sealed envelope (zstd + AEAD/checksum) |
//! | m | … | metadata section: sealed [`ContainerMeta`] |
//! | end-16 | 16 | footer: metadata offset (u64 LE), metadata length (u32 LE), `STRF` |
//!
//! The metadata section is also written as its own `meta/` object so that
//! index, GC and check never read data; the copy inside the data object lets
//! `repair index` rebuild everything from data objects alone. Containers
//! are written by the engine's container writer (`engine::writer`); here
//! they are read, and their closing metadata sealed.

use crate::error::{Result, StoreError};
use crate::repo::{data_name, meta_name, Repository};
use strata_core::crypto::Kind;
use strata_core::format::{
    container_header, decode_meta, encode_meta, ContainerFooter, ContainerId, ContainerMeta,
    RegionInfo, CONTAINER_FOOTER_LEN, CONTAINER_HEADER_LEN, CONTAINER_MAGIC,
};

/// [`container_tail`] of `meta` as it is (its `data_len` kept): the
/// metadata sealed to the length that leaves, padded (see
/// `Sealer::seal_padded`) — a container stored again by a zstd that
/// compresses otherwise. None when it cannot be.
pub fn container_tail_sized(
    repo: &Repository,
    meta: &ContainerMeta,
    meta_offset: u64,
) -> Result<Option<Vec<u8>>> {
    let Some(env_len) = meta
        .data_len
        .checked_sub(meta_offset + CONTAINER_FOOTER_LEN as u64)
        .and_then(|l| u32::try_from(l).ok())
    else {
        return Ok(None);
    };
    let Some(mut tail) =
        repo.sealer()
            .seal_padded(Kind::ContainerMeta, &encode_meta(meta)?, env_len as usize)?
    else {
        return Ok(None);
    };
    tail.extend_from_slice(
        &ContainerFooter {
            meta_offset,
            meta_len: env_len,
        }
        .to_bytes(),
    );
    Ok(Some(tail))
}

/// Seals a region (zstd, then AEAD or checksum).
pub fn seal_region(repo: &Repository, plain: &[u8]) -> Result<Vec<u8>> {
    Ok(repo.sealer().seal(Kind::Region, plain, true)?)
}

/// The metadata section and footer that close a data container whose
/// header and regions take `meta_offset` bytes; `meta.data_len` is set to
/// the object's final length.
pub fn container_tail(
    repo: &Repository,
    meta: &mut ContainerMeta,
    meta_offset: u64,
) -> Result<Vec<u8>> {
    tail_within(repo, meta, meta_offset, 8)
}

/// [`container_tail`], looking for the fixed point at most `rounds` times.
/// The data length is part of the metadata, and the metadata's own length
/// depends on it: postcard varints make the fixed point reachable in a
/// couple of rounds — unless compression makes the two lengths chase each
/// other (a byte longer sealed with one length, a byte shorter with the
/// other, for ever). Then the metadata is sealed to a length a little
/// over the longest seen, padded with a frame decompression passes over
/// (`Sealer::seal_padded`).
fn tail_within(
    repo: &Repository,
    meta: &mut ContainerMeta,
    meta_offset: u64,
    rounds: usize,
) -> Result<Vec<u8>> {
    let sealer = repo.sealer();
    let mut longest = 0;
    for _ in 0..rounds {
        let env = sealer.seal(Kind::ContainerMeta, &encode_meta(meta)?, true)?;
        let len = meta_offset + env.len() as u64 + CONTAINER_FOOTER_LEN as u64;
        if len == meta.data_len {
            let meta_len = env.len() as u32;
            let mut tail = env;
            tail.extend_from_slice(
                &ContainerFooter {
                    meta_offset,
                    meta_len,
                }
                .to_bytes(),
            );
            return Ok(tail);
        }
        longest = longest.max(len);
        meta.data_len = len;
    }
    let base = match longest {
        0 => {
            let env = sealer.seal(Kind::ContainerMeta, &encode_meta(meta)?, true)?;
            meta_offset + env.len() as u64 + CONTAINER_FOOTER_LEN as u64
        }
        l => l,
    };
    for slack in [16, 64, 256, 4096] {
        meta.data_len = base + slack;
        if let Some(tail) = container_tail_sized(repo, meta, meta_offset)? {
            return Ok(tail);
        }
    }
    Err(StoreError::Invalid(format!(
        "{}: its metadata does not seal to a fixed length",
        data_name(&meta.id)
    )))
}
/// Opens the envelope of a region stored whole (see
/// [`crate::repo::region::open_region`] for any region).
pub fn open_plain_region(
    repo: &Repository,
    name: &str,
    env: &[u8],
    r: &RegionInfo,
) -> Result<Vec<u8>> {
    let plain = repo
        .sealer()
        .open_within(Kind::Region, env, u64::from(r.raw_len))
        .map_err(|e| StoreError::corrupt(format!("{name} (region at offset {})", r.offset), e))?;
    if plain.len() != r.raw_len as usize {
        return Err(StoreError::corrupt(
            format!("{name} (region at offset {})", r.offset),
            strata_core::CoreError::Truncated("region shorter than its metadata says"),
        ));
    }
    Ok(plain)
}

/// Reads the metadata section from a data object alone (for repair).
pub fn read_meta_from_data(repo: &Repository, id: &ContainerId) -> Result<ContainerMeta> {
    let name = data_name(id);
    let size = repo
        .backend()
        .size(&name)?
        .ok_or_else(|| StoreError::NotFound(name.clone()))?;
    meta_via(repo, id, size, |offset, len| {
        Ok(repo.backend().get_range(&name, offset, len)?)
    })
}

/// The metadata section of a data object read whole (`check --read-data`):
/// its header, footer and metadata must all be intact.
pub fn embedded_meta(repo: &Repository, id: &ContainerId, data: &[u8]) -> Result<ContainerMeta> {
    let name = data_name(id);
    if data.len() >= CONTAINER_HEADER_LEN && data[..CONTAINER_HEADER_LEN] != container_header() {
        return Err(StoreError::corrupt(
            name,
            strata_core::CoreError::BadMagic("data container header"),
        ));
    }
    meta_via(repo, id, data.len() as u64, |offset, len| {
        let end = offset.saturating_add(len);
        data.get(offset as usize..end.min(usize::MAX as u64) as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                StoreError::corrupt(
                    name.clone(),
                    strata_core::CoreError::Truncated("data container"),
                )
            })
    })
}

/// The metadata section of data object `id` of `size` bytes, read through
/// `get(offset, len)`: magic, footer, the sealed metadata, and its id.
fn meta_via(
    repo: &Repository,
    id: &ContainerId,
    size: u64,
    get: impl Fn(u64, u64) -> Result<Vec<u8>>,
) -> Result<ContainerMeta> {
    let name = data_name(id);
    let corrupt = |e| StoreError::corrupt(name.clone(), e);
    if size < (CONTAINER_HEADER_LEN + CONTAINER_FOOTER_LEN) as u64 {
        return Err(corrupt(strata_core::CoreError::Truncated("data container")));
    }
    let head = get(0, CONTAINER_HEADER_LEN as u64)?;
    if head[..4] != CONTAINER_MAGIC {
        return Err(corrupt(strata_core::CoreError::BadMagic("data container")));
    }
    let foot = get(
        size - CONTAINER_FOOTER_LEN as u64,
        CONTAINER_FOOTER_LEN as u64,
    )?;
    let f = ContainerFooter::parse(&foot).map_err(corrupt)?;
    let end = f
        .meta_offset
        .checked_add(f.meta_len as u64 + CONTAINER_FOOTER_LEN as u64);
    if end != Some(size) {
        return Err(corrupt(strata_core::CoreError::Truncated(
            "container footer points outside the object",
        )));
    }
    let env = get(f.meta_offset, f.meta_len as u64)?;
    let bytes = repo
        .sealer()
        .open_within(
            Kind::ContainerMeta,
            &env,
            meta_cap(repo).min(Kind::ContainerMeta.max_plain_of(env.len())),
        )
        .map_err(corrupt)?;
    let meta = decode_meta(&bytes).map_err(corrupt)?;
    if meta.id != *id {
        return Err(StoreError::Invalid(format!(
            "{name} holds metadata of another container ({})",
            meta.id
        )));
    }
    Ok(meta)
}

/// Reads a container's `meta/` object.
pub fn read_meta(repo: &Repository, id: &ContainerId) -> Result<ContainerMeta> {
    let name = meta_name(id);
    repo.read_verified(&name, |raw| {
        let bytes = repo
            .sealer()
            .open_within(
                Kind::ContainerMeta,
                raw,
                meta_cap(repo).min(Kind::ContainerMeta.max_plain_of(raw.len())),
            )
            .map_err(|e| StoreError::corrupt(&name, e))?;
        decode_meta(&bytes).map_err(|e| StoreError::corrupt(&name, e))
    })
}

/// The most a container's metadata can hold in this repository: an entry
/// (about 40 bytes) per chunk of at least 64 bytes is less than the
/// container's own size, plus slack for its last chunk, regions and
/// segments. A bomb claiming more is refused unexpanded.
fn meta_cap(repo: &Repository) -> u64 {
    u64::from(repo.config().container_size) + (16 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LocalBackend;
    use crate::repo::InitOptions;
    use std::sync::Arc;
    use strata_core::format::ChunkEntry;

    /// A container whose metadata never settles on one length (forced
    /// here: no round looks for the fixed point) is closed with its
    /// metadata padded to a length a little over: it reads back whole,
    /// plain and encrypted.
    #[test]
    fn a_tail_that_does_not_settle_is_padded() {
        for password in [None, Some(b"pw".to_vec())] {
            let t = tempfile::tempdir().unwrap();
            let opts = InitOptions {
                password,
                kdf: strata_core::crypto::KdfCost {
                    memory_kib: 64,
                    iterations: 1,
                },
                ..Default::default()
            };
            let repo = Repository::init(Arc::new(LocalBackend::new(t.path())), opts).unwrap();
            let mut meta = ContainerMeta {
                id: ContainerId([7; 16]),
                data_len: 0,
                created: 1,
                stamp: None,
                regions: vec![RegionInfo {
                    offset: CONTAINER_HEADER_LEN as u64,
                    stored_len: 100,
                    raw_len: 80,
                }],
                chunks: (0..50u32)
                    .map(|i| ChunkEntry {
                        fp: repo.hasher().hash(&i.to_le_bytes()),
                        region: 0,
                        offset: i,
                        len: 1,
                    })
                    .collect(),
                segments: vec![],
                deltas: Vec::new(),
            };
            let offset = CONTAINER_HEADER_LEN as u64 + 100;
            let mut settled = meta.clone();
            let usual = tail_within(&repo, &mut settled, offset, 8).unwrap();
            let tail = tail_within(&repo, &mut meta, offset, 0).unwrap();
            assert!(tail.len() > usual.len());
            assert_eq!(meta.data_len, offset + tail.len() as u64);
            let mut data = container_header().to_vec();
            data.resize(offset as usize, 0);
            data.extend_from_slice(&tail);
            assert_eq!(embedded_meta(&repo, &meta.id, &data).unwrap(), meta);
        }
    }
}
