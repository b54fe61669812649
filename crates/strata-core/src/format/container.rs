//! Data containers: their ids, metadata (regions, chunk entries, whole
//! segments, stamp), summaries, the link stub of a linked container, and
//! the fixed binary frame around the metadata section.

use super::codec::STRUCT_VERSION;
use crate::error::{CoreError, Result};
use crate::fingerprint::Fingerprint;
pub use crate::id::ContainerId;
use serde::{Deserialize, Serialize};

/// A compression region inside a data container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// Byte offset of the region's envelope in the data object.
    pub offset: u64,
    /// Length of the envelope.
    pub stored_len: u32,
    /// Length of the plaintext (sum of its chunks).
    pub raw_len: u32,
}

/// What stands in a container's data object once a volume holds its
/// regions (linked snapshots, `docs/design-linked-snapshots.md`): the
/// volume, and each region's plaintext as the volume's disk blocks that
/// hold it, 4 KiB each, in order. Stored after [`LINK_MAGIC`], sealed
/// (`Kind::Link`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStub {
    /// The volume's name (its directory among the repository's volumes).
    pub volume: String,
    /// The salt its key is derived with (an encrypted volume).
    pub salt: Option<Vec<u8>>,
    pub regions: Vec<LinkedRegion>,
}

/// One region of a linked container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkedRegion {
    /// The region's offset in the container's metadata (which region).
    pub offset: u64,
    /// Its plaintext's length: `blocks` × 4 KiB.
    pub raw_len: u32,
    /// The disk blocks holding it, in order.
    pub blocks: Vec<u64>,
    /// The repository's fingerprint of the whole plaintext (keyed in an
    /// encrypted repository: it authenticates what the volume returns).
    pub hash: Fingerprint,
}

/// The first bytes of a link stub (a data container starts with
/// [`CONTAINER_MAGIC`]).
pub const LINK_MAGIC: [u8; 8] = *b"STRLINK1";

/// A chunk stored in a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    pub fp: Fingerprint,
    pub region: u32,
    /// Offset inside the region's plaintext.
    pub offset: u32,
    pub len: u32,
}

/// A segment stored whole in a container (segment-level dedup, RevDedup
/// §2.3): its fingerprint and its run of chunk entries. Zero chunks of the
/// segment are not stored and so not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    pub fp: Fingerprint,
    pub first_chunk: u32,
    pub chunks: u32,
}

/// Owner of a stamped container (RevDedup §2.5). Only the owner version
/// references the container directly (older versions reach it through
/// indirect references), and versions of a series expire oldest first, so
/// the container can be deleted with its owner without scanning anything.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// Snapshot id of the owner version.
    pub owner: String,
    /// Creation time of the owner version (ns since the epoch).
    pub time_ns: i64,
}

/// A chunk stored whole whose plaintext a delta region's compression
/// starts from (docs/design.md "Delta compression"): where it is, and its
/// fingerprint to check what is read there. A base is never itself in a
/// delta region (chains are one deep), and is kept while a delta needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BaseRef {
    pub fp: Fingerprint,
    pub container: ContainerId,
    /// Its region's index in that container's metadata.
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

/// A region of the container stored as a delta: its plaintext (its
/// chunks, as in any region) compressed by zstd with the plaintexts of
/// `bases`, in order, as the reference prefix; its envelope is of kind
/// `DeltaRegion`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaRegion {
    pub region: u32,
    pub bases: Vec<BaseRef>,
    /// For each chunk of the region (its chunk entries, in order), the
    /// index in `bases` of the base it resembles: the base a later
    /// version's edit of that chunk is stored against.
    pub chunk_bases: Vec<u32>,
}

/// Most bases one delta region lists, and most bytes their plaintexts
/// take together (the prefix a reader assembles): a metadata section
/// claiming more is refused, so a hostile repository cannot make a
/// reader assemble gigabytes.
pub const MAX_DELTA_BASES: usize = 64;
pub const MAX_DELTA_PREFIX: u64 = 4 << 20;

/// Version byte of a [`ContainerMeta`] (alone or in an
/// [`super::IndexObject`]) that has delta regions; one without any is
/// written as version 1, byte for byte what builds before deltas wrote.
pub const DELTA_META_VERSION: u8 = 2;

/// The metadata section of a data container; also stored on its own as the
/// container's metadata object so index, GC and check never read data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMeta {
    pub id: ContainerId,
    /// Total length of the data object.
    pub data_len: u64,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Lifecycle stamp (RevDedup §2.5): the archival version whose direct
    /// chunks this container holds; `None` for the shared pool.
    pub stamp: Option<Stamp>,
    pub regions: Vec<RegionInfo>,
    pub chunks: Vec<ChunkEntry>,
    /// Segments stored whole in this container, in order.
    pub segments: Vec<SegmentEntry>,
    /// Its regions stored as deltas, by region index (none in a version-1
    /// encoding).
    pub deltas: Vec<DeltaRegion>,
}

/// A [`ContainerMeta`] as version 1 lays it out (no delta regions).
#[derive(Serialize)]
pub(super) struct MetaV1Ref<'a> {
    id: &'a ContainerId,
    data_len: u64,
    created: i64,
    stamp: &'a Option<Stamp>,
    regions: &'a [RegionInfo],
    chunks: &'a [ChunkEntry],
    segments: &'a [SegmentEntry],
}

#[derive(Deserialize)]
pub(super) struct MetaV1 {
    id: ContainerId,
    data_len: u64,
    created: i64,
    stamp: Option<Stamp>,
    regions: Vec<RegionInfo>,
    chunks: Vec<ChunkEntry>,
    segments: Vec<SegmentEntry>,
}

impl<'a> From<&'a ContainerMeta> for MetaV1Ref<'a> {
    fn from(m: &'a ContainerMeta) -> Self {
        MetaV1Ref {
            id: &m.id,
            data_len: m.data_len,
            created: m.created,
            stamp: &m.stamp,
            regions: &m.regions,
            chunks: &m.chunks,
            segments: &m.segments,
        }
    }
}

impl From<MetaV1> for ContainerMeta {
    fn from(m: MetaV1) -> Self {
        ContainerMeta {
            id: m.id,
            data_len: m.data_len,
            created: m.created,
            stamp: m.stamp,
            regions: m.regions,
            chunks: m.chunks,
            segments: m.segments,
            deltas: Vec::new(),
        }
    }
}

/// Encodes a container's metadata: version 1 without delta regions,
/// [`DELTA_META_VERSION`] with.
pub fn encode_meta(m: &ContainerMeta) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    if m.deltas.is_empty() {
        postcard::to_extend(&MetaV1Ref::from(m), vec![STRUCT_VERSION]).map_err(enc)
    } else {
        postcard::to_extend(m, vec![DELTA_META_VERSION]).map_err(enc)
    }
}

/// Decodes a container's metadata of either version. Delta regions must
/// name regions of the container, once each, with at least one base.
pub fn decode_meta(bytes: &[u8]) -> Result<ContainerMeta> {
    const WHAT: &str = "container metadata";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let dec = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    let m = match v {
        STRUCT_VERSION => ContainerMeta::from(postcard::from_bytes::<MetaV1>(body).map_err(dec)?),
        DELTA_META_VERSION => postcard::from_bytes::<ContainerMeta>(body).map_err(dec)?,
        found => {
            return Err(CoreError::UnknownVersion {
                what: WHAT,
                found,
                supported: DELTA_META_VERSION,
            })
        }
    };
    m.check_deltas()?;
    Ok(m)
}

impl ContainerMeta {
    /// Whether its delta regions are well formed (see [`decode_meta`]).
    pub fn check_deltas(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for d in &self.deltas {
            let why = if d.region as usize >= self.regions.len() {
                "names a region the container does not have"
            } else if !seen.insert(d.region) {
                "names a region twice"
            } else if d.bases.is_empty() {
                "has no base"
            } else if d.bases.len() > MAX_DELTA_BASES
                || d.bases.iter().map(|b| u64::from(b.len)).sum::<u64>() > MAX_DELTA_PREFIX
            {
                "lists more bases than a delta region may"
            } else if d.bases.iter().any(|b| b.container == self.id) {
                "has a base in its own container"
            } else if d.chunk_bases.iter().any(|&i| i as usize >= d.bases.len()) {
                "gives a chunk a base it does not list"
            } else if d.chunk_bases.len()
                != self.chunks.iter().filter(|c| c.region == d.region).count()
            {
                "does not give each of its chunks a base"
            } else {
                continue;
            };
            return Err(CoreError::Decode {
                what: "container metadata",
                msg: format!("delta region {} {why}", d.region),
            });
        }
        Ok(())
    }

    /// The bases of region `region` when it is stored as a delta.
    pub fn delta_of(&self, region: u32) -> Option<&DeltaRegion> {
        self.deltas.iter().find(|d| d.region == region)
    }

    /// The base of each chunk entry (None for chunks stored whole), in
    /// the order of [`Self::chunks`].
    pub fn chunk_bases(&self) -> Vec<Option<&BaseRef>> {
        let mut seen: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
        self.chunks
            .iter()
            .map(|c| {
                let d = self.delta_of(c.region)?;
                let k = seen.entry(c.region).or_default();
                *k += 1;
                d.bases.get(*d.chunk_bases.get(*k - 1)? as usize)
            })
            .collect()
    }

    /// The base the chunk at `offset` of delta region `region` resembles.
    pub fn base_of(&self, region: u32, offset: u32) -> Option<&BaseRef> {
        let d = self.delta_of(region)?;
        let k = self
            .chunks
            .iter()
            .filter(|c| c.region == region)
            .position(|c| c.offset == offset)?;
        d.bases.get(*d.chunk_bases.get(k)? as usize)
    }

    pub fn raw_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    /// Bytes of its compression regions: the chunk data as stored,
    /// without the container's header and metadata.
    pub fn data_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.stored_len as u64).sum()
    }

    /// Everything about the container but its chunk and segment entries.
    pub fn summary(&self) -> ContainerSummary {
        ContainerSummary {
            id: self.id,
            data_len: self.data_len,
            created: self.created,
            stamp: self.stamp.clone(),
            chunks: self.chunks.len() as u32,
            raw_bytes: self.raw_bytes(),
            regions: self.regions.clone(),
        }
    }
}

/// A container without its chunk entries: what lifecycle bookkeeping,
/// space accounting and the similarity strategies (which keep their own
/// chunk locations) need to know. About 1/200 of a [`ContainerMeta`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSummary {
    pub id: ContainerId,
    pub data_len: u64,
    pub created: i64,
    pub stamp: Option<Stamp>,
    /// Number of chunk entries.
    pub chunks: u32,
    /// Plaintext bytes of all chunks.
    pub raw_bytes: u64,
    pub regions: Vec<RegionInfo>,
}

impl ContainerSummary {
    /// Bytes of its compression regions (see [`ContainerMeta::data_bytes`]).
    pub fn data_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.stored_len as u64).sum()
    }
}

/// A segment stored whole in a container, as an index summary carries
/// it: what the `segment` index strategy learns of it, so that a backup
/// reads summaries instead of every chunk entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSummary {
    pub entry: SegmentEntry,
    /// The least and the greatest chunk fingerprint of its run (two
    /// min-hashes under opposite orders); none when the run does not lie
    /// within the container's chunk entries.
    pub reps: Option<[Fingerprint; 2]>,
}

impl SegmentSummary {
    /// The representatives of a run of chunk fingerprints: its least and
    /// its greatest.
    pub fn representatives(fps: impl IntoIterator<Item = Fingerprint>) -> Option<[Fingerprint; 2]> {
        fps.into_iter().fold(None, |acc, fp| match acc {
            None => Some([fp, fp]),
            Some([lo, hi]) => Some([lo.min(fp), hi.max(fp)]),
        })
    }
}

impl ContainerMeta {
    /// Its whole segments with their representatives.
    pub fn segment_summaries(&self) -> Vec<SegmentSummary> {
        self.segments
            .iter()
            .map(|s| {
                let run = self.chunks.get(
                    s.first_chunk as usize
                        ..(s.first_chunk as usize).saturating_add(s.chunks as usize),
                );
                SegmentSummary {
                    entry: *s,
                    reps: run.and_then(|r| SegmentSummary::representatives(r.iter().map(|e| e.fp))),
                }
            })
            .collect()
    }
}

/// Magic at the start of every data container.
pub const CONTAINER_MAGIC: [u8; 4] = *b"STRC";
/// Magic closing the footer of every data container.
pub const FOOTER_MAGIC: [u8; 4] = *b"STRF";
pub const CONTAINER_HEADER_LEN: usize = 8;
pub const CONTAINER_FOOTER_LEN: usize = 16;

/// The 8-byte header of a data container: magic, format version, 3 reserved.
pub fn container_header() -> [u8; CONTAINER_HEADER_LEN] {
    let mut h = [0u8; CONTAINER_HEADER_LEN];
    h[..4].copy_from_slice(&CONTAINER_MAGIC);
    h[4] = STRUCT_VERSION;
    h
}

/// The 16-byte footer of a data container: where its metadata section is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerFooter {
    pub meta_offset: u64,
    pub meta_len: u32,
}

impl ContainerFooter {
    pub fn to_bytes(self) -> [u8; CONTAINER_FOOTER_LEN] {
        let mut b = [0u8; CONTAINER_FOOTER_LEN];
        b[..8].copy_from_slice(&self.meta_offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.meta_len.to_le_bytes());
        b[12..].copy_from_slice(&FOOTER_MAGIC);
        b
    }

    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() != CONTAINER_FOOTER_LEN {
            return Err(CoreError::Truncated("container footer"));
        }
        if b[12..] != FOOTER_MAGIC {
            return Err(CoreError::BadMagic("container footer"));
        }
        Ok(ContainerFooter {
            meta_offset: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            meta_len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        })
    }
}
