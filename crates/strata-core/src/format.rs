//! Versioned on-disk structures (docs/design.md "Vocabulary", "Data flow").
//!
//! Every structure is encoded as one format-version byte followed by its
//! postcard encoding, and the result is stored inside a sealed envelope
//! ([`crate::crypto`]), which adds the envelope version and the checksum or
//! AEAD tag. Data containers additionally have a small fixed binary frame
//! (see [`container_header`] and [`ContainerFooter`]) so that their metadata
//! section can be found without any other object.

use crate::chunker::ChunkerParams;
use crate::error::{CoreError, Result};
use crate::fingerprint::Fingerprint;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Version of the repository layout (config, object names, structures).
/// 2: lifecycle stamps name their owner version, snapshots record their
/// reverse-dedup state, chunk references can be indirect.
pub const REPO_FORMAT_VERSION: u8 = 2;
/// Version byte of each structure below.
pub const STRUCT_VERSION: u8 = 1;

/// Encodes a structure: version byte + postcard.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    // Serialised straight after the version byte: recipes of large trees
    // run to tens of MB and are not worth a second copy.
    postcard::to_extend(value, vec![STRUCT_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

/// Decodes a structure encoded by [`encode`], checking its version.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T> {
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(what))?;
    if v != STRUCT_VERSION {
        return Err(CoreError::UnknownVersion {
            what,
            found: v,
            supported: STRUCT_VERSION,
        });
    }
    postcard::from_bytes(body).map_err(|e| CoreError::Decode {
        what,
        msg: e.to_string(),
    })
}

/// Version byte of [`Snapshot`]: 2 added [`Archival::released_bytes`], 3
/// added [`Snapshot::tier`], 4 [`Snapshot::cloud_part`]; versions 1–3 are
/// still read (released bytes 0, tier active, no cloud part).
pub const SNAPSHOT_VERSION: u8 = 4;

/// Encodes a snapshot with its own structure version.
pub fn encode_snapshot(s: &Snapshot) -> Result<Vec<u8>> {
    postcard::to_extend(s, vec![SNAPSHOT_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

/// Decodes a snapshot of any version this build reads.
pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot> {
    const WHAT: &str = "snapshot";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let err = |e: postcard::Error| CoreError::Decode {
        what: WHAT,
        msg: e.to_string(),
    };
    match v {
        SNAPSHOT_VERSION => postcard::from_bytes(body).map_err(err),
        3 => postcard::from_bytes::<v3::Snapshot>(body)
            .map(Snapshot::from)
            .map_err(err),
        2 => postcard::from_bytes::<v2::Snapshot>(body)
            .map(Snapshot::from)
            .map_err(err),
        1 => postcard::from_bytes::<v1::Snapshot>(body)
            .map(Snapshot::from)
            .map_err(err),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: SNAPSHOT_VERSION,
        }),
    }
}

/// Snapshots as version 3 wrote them (no cloud part).
mod v3 {
    use super::{Archival, ChunkerParams, SnapshotStats, Tier};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Snapshot {
        pub series: String,
        pub version: u32,
        pub time_ns: i64,
        pub host: String,
        pub paths: Vec<String>,
        pub tags: Vec<String>,
        pub recipe: String,
        pub parent: Option<String>,
        pub chunker: ChunkerParams,
        pub stats: SnapshotStats,
        pub archival: Option<Archival>,
        pub tier: Tier,
    }
}

impl From<v3::Snapshot> for Snapshot {
    fn from(s: v3::Snapshot) -> Self {
        Snapshot {
            series: s.series,
            version: s.version,
            time_ns: s.time_ns,
            host: s.host,
            paths: s.paths,
            tags: s.tags,
            recipe: s.recipe,
            parent: s.parent,
            chunker: s.chunker,
            stats: s.stats,
            archival: s.archival,
            tier: s.tier,
            cloud_part: None,
        }
    }
}

/// Snapshots as version 2 wrote them (no tier).
mod v2 {
    use super::{Archival, ChunkerParams, SnapshotStats};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Snapshot {
        pub series: String,
        pub version: u32,
        pub time_ns: i64,
        pub host: String,
        pub paths: Vec<String>,
        pub tags: Vec<String>,
        pub recipe: String,
        pub parent: Option<String>,
        pub chunker: ChunkerParams,
        pub stats: SnapshotStats,
        pub archival: Option<Archival>,
    }
}

impl From<v2::Snapshot> for Snapshot {
    fn from(s: v2::Snapshot) -> Self {
        Snapshot {
            series: s.series,
            version: s.version,
            time_ns: s.time_ns,
            host: s.host,
            paths: s.paths,
            tags: s.tags,
            recipe: s.recipe,
            parent: s.parent,
            chunker: s.chunker,
            stats: s.stats,
            archival: s.archival,
            tier: Tier::Active,
            cloud_part: None,
        }
    }
}

/// Structures as version 1 wrote them.
mod v1 {
    use super::{ChunkerParams, SnapshotStats};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Archival {
        pub next: Option<String>,
        pub converted_ns: i64,
        pub direct_chunks: u64,
        pub direct_bytes: u64,
        pub indirect_chunks: u64,
        pub indirect_bytes: u64,
    }

    #[derive(Deserialize)]
    pub struct Snapshot {
        pub series: String,
        pub version: u32,
        pub time_ns: i64,
        pub host: String,
        pub paths: Vec<String>,
        pub tags: Vec<String>,
        pub recipe: String,
        pub parent: Option<String>,
        pub chunker: ChunkerParams,
        pub stats: SnapshotStats,
        pub archival: Option<Archival>,
    }
}

impl From<v1::Snapshot> for Snapshot {
    fn from(s: v1::Snapshot) -> Self {
        Snapshot {
            series: s.series,
            version: s.version,
            time_ns: s.time_ns,
            host: s.host,
            paths: s.paths,
            tags: s.tags,
            recipe: s.recipe,
            parent: s.parent,
            chunker: s.chunker,
            stats: s.stats,
            archival: s.archival.map(|a| Archival {
                next: a.next,
                converted_ns: a.converted_ns,
                direct_chunks: a.direct_chunks,
                direct_bytes: a.direct_bytes,
                indirect_chunks: a.indirect_chunks,
                indirect_bytes: a.indirect_bytes,
                released_bytes: 0,
            }),
            tier: Tier::Active,
            cloud_part: None,
        }
    }
}

/// Identity of a data container (random, never reused).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerId(pub [u8; 16]);

impl ContainerId {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let v = hex::decode(s).ok()?;
        Some(ContainerId(v.try_into().ok()?))
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "C({})", self.to_hex())
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

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
}

impl ContainerMeta {
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

/// Version byte of an [`IndexSummary`]: 2 added the containers' segments;
/// version 1 is still read (no segments: a reader that needs them reads
/// the index object).
pub const INDEX_SUMMARY_VERSION: u8 = 2;

/// The summaries of one index object's containers, stored as
/// `isum/HASH` beside `index/HASH`. The name it summarises is inside too,
/// so a summary cannot be passed off for another index object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSummary {
    /// The full name of the index object (`index/HASH`).
    pub index: String,
    pub containers: Vec<ContainerSummary>,
    /// The whole segments of each container, in the order of
    /// `containers` (none in a version-1 summary).
    pub segments: Option<Vec<Vec<SegmentSummary>>>,
}

impl IndexSummary {
    /// The summary of index object `index` holding `metas`.
    pub fn of(index: String, metas: &[ContainerMeta]) -> IndexSummary {
        IndexSummary {
            index,
            containers: metas.iter().map(|m| m.summary()).collect(),
            segments: Some(metas.iter().map(|m| m.segment_summaries()).collect()),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct IndexSummaryV1 {
    index: String,
    containers: Vec<ContainerSummary>,
}

#[derive(Serialize, Deserialize)]
struct IndexSummaryV2 {
    index: String,
    containers: Vec<ContainerSummary>,
    segments: Vec<Vec<SegmentSummary>>,
}

/// Encodes an index summary: version 2 with its segments, version 1
/// without.
pub fn encode_index_summary(s: &IndexSummary) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    match &s.segments {
        Some(segments) => postcard::to_extend(
            &IndexSummaryV2 {
                index: s.index.clone(),
                containers: s.containers.clone(),
                segments: segments.clone(),
            },
            vec![INDEX_SUMMARY_VERSION],
        )
        .map_err(enc),
        None => postcard::to_extend(
            &IndexSummaryV1 {
                index: s.index.clone(),
                containers: s.containers.clone(),
            },
            vec![STRUCT_VERSION],
        )
        .map_err(enc),
    }
}

/// Decodes an index summary of version 1 or 2 (one whose segments do not
/// match its containers one to one is refused).
pub fn decode_index_summary(bytes: &[u8]) -> Result<IndexSummary> {
    const WHAT: &str = "index summary";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let dec = |e: postcard::Error| CoreError::Decode {
        what: WHAT,
        msg: e.to_string(),
    };
    match v {
        1 => {
            let s: IndexSummaryV1 = postcard::from_bytes(body).map_err(dec)?;
            Ok(IndexSummary {
                index: s.index,
                containers: s.containers,
                segments: None,
            })
        }
        INDEX_SUMMARY_VERSION => {
            let s: IndexSummaryV2 = postcard::from_bytes(body).map_err(dec)?;
            if s.segments.len() != s.containers.len() {
                return Err(CoreError::Decode {
                    what: WHAT,
                    msg: format!(
                        "{} containers but segments of {}",
                        s.containers.len(),
                        s.segments.len()
                    ),
                });
            }
            Ok(IndexSummary {
                index: s.index,
                containers: s.containers,
                segments: Some(s.segments),
            })
        }
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: INDEX_SUMMARY_VERSION,
        }),
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

/// Sentinel container index of a chunk that is all zeros (never stored).
pub const ZERO_CHUNK: u32 = u32::MAX;
/// Sentinel container index of an *indirect* reference (RevDedup §2.4.1):
/// the chunk with this fingerprint in the next version of the series (see
/// [`Archival::next`]), which may itself be indirect.
pub const INDIRECT_CHUNK: u32 = u32::MAX - 1;

/// Reference to one chunk from a recipe. `container` indexes the recipe's
/// container table (a *direct* reference, docs/design.md "recipe"), or is
/// [`ZERO_CHUNK`] or [`INDIRECT_CHUNK`]. Commands that move chunks (gc,
/// maintain) rewrite the recipes that point at them; should a container be
/// missing anyway, restore falls back to the index by fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub fp: Fingerprint,
    pub len: u32,
    pub container: u32,
    pub region: u32,
    pub offset: u32,
}

impl ChunkRef {
    pub fn is_zero(&self) -> bool {
        self.container == ZERO_CHUNK
    }

    pub fn is_indirect(&self) -> bool {
        self.container == INDIRECT_CHUNK
    }

    /// A reference to a stored chunk of this recipe's container table.
    pub fn is_direct(&self) -> bool {
        self.container < INDIRECT_CHUNK
    }

    /// An indirect reference to the chunk `fp` of the next version.
    pub fn indirect(fp: Fingerprint, len: u32) -> Self {
        ChunkRef {
            fp,
            len,
            container: INDIRECT_CHUNK,
            region: 0,
            offset: 0,
        }
    }

    /// A run of `chunks` consecutive all-zero chunks of a segment, `len`
    /// bytes in all, as one reference: nothing is stored for them, and a
    /// sparse disk image's recipe (4 KiB chunks) would otherwise hold 48
    /// bytes per 4 KiB of nothing — 1.2 GB for an empty 100 GiB volume.
    /// `offset`, unused by a zero reference, counts the chunks after the
    /// first (0: one chunk, what every build wrote before runs).
    pub fn zeros(len: u32, chunks: u32) -> Self {
        ChunkRef {
            fp: Fingerprint::ZERO,
            len,
            container: ZERO_CHUNK,
            region: 0,
            offset: chunks.saturating_sub(1),
        }
    }

    /// How many chunks this reference stands for: a zero run's count,
    /// else 1. A segment's fingerprint hashes that many fingerprints, and
    /// a recipe's pieces are counted in chunks so.
    pub fn chunk_count(&self) -> u64 {
        if self.is_zero() {
            self.offset as u64 + 1
        } else {
            1
        }
    }

    /// Whether a zero run counts no more chunks than it has bytes (every
    /// other reference is): one that does is damage, read as its bytes.
    pub fn is_sound_run(&self) -> bool {
        self.chunk_count() <= (self.len as u64).max(1)
    }
}

/// A segment of a file: whole chunks, the coarse dedup unit. Consecutive
/// zero chunks are one [`ChunkRef::zeros`] run, whether they were written
/// so or one by one (decoding merges them: every reader sees one form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    pub fp: Fingerprint,
    #[serde(deserialize_with = "chunks_with_zero_runs")]
    pub chunks: Vec<ChunkRef>,
}

impl SegmentRef {
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The chunks the segment was cut into (a zero run counts its chunks).
    pub fn chunk_count(&self) -> u64 {
        self.chunks.iter().map(ChunkRef::chunk_count).sum()
    }

    /// Appends `c`, merged into the zero run before it if both are zeros.
    pub fn push(&mut self, c: ChunkRef) {
        push_chunk(&mut self.chunks, c)
    }

    /// The segment `fp` of `chunks`, its zero chunks merged into runs.
    pub fn with_runs(fp: Fingerprint, chunks: impl IntoIterator<Item = ChunkRef>) -> Self {
        let mut s = SegmentRef {
            fp,
            chunks: Vec::new(),
        };
        chunks.into_iter().for_each(|c| s.push(c));
        s
    }
}

/// Appends `c` to `chunks`, a zero chunk merged into a zero run before it
/// (while the run's length and count fit their fields).
pub fn push_chunk(chunks: &mut Vec<ChunkRef>, c: ChunkRef) {
    if let (true, Some(last)) = (c.is_zero(), chunks.last_mut()) {
        if last.is_zero() {
            let len = last.len.checked_add(c.len);
            let count = last
                .offset
                .checked_add(c.offset)
                .and_then(|n| n.checked_add(1));
            if let (Some(len), Some(count)) = (len, count) {
                last.len = len;
                last.offset = count;
                return;
            }
        }
    }
    chunks.push(c)
}

/// Decodes a segment's chunk list merging its zero chunks into runs as
/// they come (a sparse image's recipe written by an older build is never
/// held expanded).
fn chunks_with_zero_runs<'de, D>(d: D) -> std::result::Result<Vec<ChunkRef>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Runs;
    impl<'de> serde::de::Visitor<'de> for Runs {
        type Value = Vec<ChunkRef>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of chunk references")
        }

        fn visit_seq<A>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error>
        where
            A: serde::de::SeqAccess<'de>,
        {
            // (The encoded count is not trusted for more than a start.)
            let mut chunks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(c) = seq.next_element::<ChunkRef>()? {
                push_chunk(&mut chunks, c);
            }
            Ok(chunks)
        }
    }
    d.deserialize_seq(Runs)
}

/// Version byte of [`KeySlot`]: 1 was the bare [`crate::crypto::KeyFile`]
/// (no host, user or time), still read.
pub const KEY_SLOT_VERSION: u8 = 2;

/// One key slot (`keys/ID`): the master key wrapped by one password, and
/// who made it when (`strata key list`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeySlot {
    pub key: crate::crypto::KeyFile,
    pub host: String,
    pub user: String,
    pub created_ns: i64,
}

pub fn encode_key_slot(k: &KeySlot) -> Result<Vec<u8>> {
    postcard::to_extend(k, vec![KEY_SLOT_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

/// Decodes a key slot of either version.
pub fn decode_key_slot(bytes: &[u8]) -> Result<KeySlot> {
    let what = "key file";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(what))?;
    let err = |e: postcard::Error| CoreError::Decode {
        what,
        msg: e.to_string(),
    };
    match v {
        1 => Ok(KeySlot {
            key: postcard::from_bytes(body).map_err(err)?,
            host: String::new(),
            user: String::new(),
            created_ns: 0,
        }),
        KEY_SLOT_VERSION => postcard::from_bytes(body).map_err(err),
        found => Err(CoreError::UnknownVersion {
            what,
            found,
            supported: KEY_SLOT_VERSION,
        }),
    }
}

/// What a tree entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    /// A further name of a file recorded earlier (`target` holds its path).
    Hardlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl NodeKind {
    /// The name scripts see (`ls --json` "type").
    pub fn id(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "dir",
            NodeKind::Symlink => "symlink",
            NodeKind::Hardlink => "hardlink",
            NodeKind::Fifo => "fifo",
            NodeKind::CharDevice => "chardevice",
            NodeKind::BlockDevice => "blockdevice",
            NodeKind::Socket => "socket",
        }
    }

    /// The name a person reads ("a directory").
    pub fn noun(self) -> &'static str {
        match self {
            NodeKind::File => "a file",
            NodeKind::Dir => "a directory",
            NodeKind::Symlink => "a symbolic link",
            NodeKind::Hardlink => "a hard link",
            NodeKind::Fifo => "a named pipe",
            NodeKind::CharDevice => "a character device",
            NodeKind::BlockDevice => "a block device",
            NodeKind::Socket => "a socket",
        }
    }

    /// The type letter `ls -l` shows.
    pub fn letter(self) -> char {
        match self {
            NodeKind::Dir => 'd',
            NodeKind::Symlink => 'l',
            NodeKind::Hardlink => 'h',
            NodeKind::Fifo => 'p',
            NodeKind::CharDevice => 'c',
            NodeKind::BlockDevice => 'b',
            NodeKind::Socket => 's',
            NodeKind::File => '-',
        }
    }
}

/// One entry of a version's tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Path relative to the snapshot root, `/`-separated raw bytes.
    pub path: Vec<u8>,
    pub kind: NodeKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
    pub rdev: u64,
    pub nlink: u64,
    pub size: u64,
    /// Symlink target, or the first path of a hardlinked file.
    pub target: Option<Vec<u8>>,
    pub segments: Vec<SegmentRef>,
    /// Extended attributes (name, value), ACLs included.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    /// A node of `kind` at `path` with every other field zero or empty
    /// (one link): a base for `Node { mode, size, ..Node::new(p, k) }`.
    pub fn new(path: Vec<u8>, kind: NodeKind) -> Node {
        Node {
            path,
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            ino: 0,
            dev: 0,
            rdev: 0,
            nlink: 1,
            size: 0,
            target: None,
            segments: vec![],
            xattrs: vec![],
        }
    }

    pub fn path_str(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// Nodes and the container table their direct references index: one
/// *part* of a version's recipe (`parts/NAME`), or — in memory, and in
/// `recipes/` objects of structure version 1 — a whole version's tree.
/// Nodes are in [`path_cmp`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    pub containers: Vec<ContainerId>,
    pub nodes: Vec<Node>,
}

/// Version byte of a `recipes/` object holding a [`RecipeIndex`]. Objects
/// of version 1 hold a whole [`Recipe`] and are still read.
pub const RECIPE_INDEX_VERSION: u8 = 2;

/// Version byte of a [`RecipeIndex`] whose parts may hold *continued*
/// files: a file node followed by further file nodes of the same path
/// (within its part or at the start of the next), whose segments follow
/// its own — a file too large for one part, stored in pieces so that
/// neither writer nor reader holds its whole chunk list. Same encoding as
/// version 2; the byte tells readers that predate pieces to refuse the
/// recipe instead of reporting a path twice.
pub const RECIPE_INDEX_CONTINUED: u8 = 3;

/// Version byte of a [`RecipeIndex`] of continued files (as
/// [`RECIPE_INDEX_CONTINUED`]) whose part references may say which piece
/// of a file their part holds alone ([`PartRef::piece`]): a new version of
/// an image takes such a part over unread when none of its segments
/// changed. Versions 2 and 3 are still read (no piece known).
pub const RECIPE_INDEX_PIECES: u8 = 4;

/// A version's recipe as stored since recipe version 2: the list of its
/// parts (each a [`Recipe`] of consecutive nodes, stored as its own
/// content-addressed object, so versions share the parts of unchanged
/// subtrees) and the union of their container tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipeIndex {
    /// Every container a part references directly.
    pub containers: Vec<ContainerId>,
    pub parts: Vec<PartRef>,
    /// Whether its parts may hold continued files (stored as structure
    /// version [`RECIPE_INDEX_CONTINUED`], not a field of the encoding).
    #[serde(skip)]
    pub continued: bool,
}

/// One part of a [`RecipeIndex`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    /// Object name of the part: keyed BLAKE3 of its encoded bytes (hex).
    pub id: String,
    /// Path of its first node; a part holds the nodes from here up to the
    /// next part's first path.
    pub first: Vec<u8>,
    pub nodes: u32,
    /// The part's container table as indexes into
    /// [`RecipeIndex::containers`].
    pub containers: Vec<u32>,
    /// The piece of a file the part holds alone, when known (structure
    /// version [`RECIPE_INDEX_PIECES`]).
    pub piece: Option<PieceRef>,
}

/// What a part holding a single piece of a file holds, told without
/// reading it: enough for a new version of the file to know that the
/// part is what it would write for the same piece.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceRef {
    /// The byte of the file at which the piece begins, and its bytes.
    pub offset: u64,
    pub len: u64,
    /// Keyed hash of the node's metadata (every field but its segments,
    /// in the structure encoding).
    pub meta: Fingerprint,
    /// The bytes every segment of the piece holds but the last, which
    /// holds at most that many (0: the segments differ in length).
    pub segment: u32,
    /// Its direct chunk references and their bytes.
    pub direct_chunks: u64,
    pub direct_bytes: u64,
}

/// A part reference as versions 2 and 3 encode it (no piece).
#[derive(Deserialize)]
struct PartRefV2 {
    id: String,
    first: Vec<u8>,
    nodes: u32,
    containers: Vec<u32>,
}

/// A recipe index as versions 2 and 3 encode it.
#[derive(Deserialize)]
struct RecipeIndexV2 {
    containers: Vec<ContainerId>,
    parts: Vec<PartRefV2>,
}

/// The encoding of versions 2 and 3 (a version-4 index without pieces
/// is written as one of them, which older readers still read).
#[derive(Serialize)]
struct RecipeIndexV2Out<'a> {
    containers: &'a [ContainerId],
    parts: Vec<PartRefV2Out<'a>>,
}

#[derive(Serialize)]
struct PartRefV2Out<'a> {
    id: &'a str,
    first: &'a [u8],
    nodes: u32,
    containers: &'a [u32],
}

/// What a `recipes/` object holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipeObject {
    /// Structure version 1: the whole tree in one object.
    Whole(Recipe),
    Index(RecipeIndex),
}

/// Encodes a recipe index: structure version [`RECIPE_INDEX_PIECES`]
/// when a part says which piece it holds (its files are continued), else
/// [`RECIPE_INDEX_CONTINUED`] when it holds continued files, else
/// [`RECIPE_INDEX_VERSION`].
pub fn encode_recipe_index(r: &RecipeIndex) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    if r.continued && r.parts.iter().any(|p| p.piece.is_some()) {
        return postcard::to_extend(r, vec![RECIPE_INDEX_PIECES]).map_err(enc);
    }
    let v = match r.continued {
        true => RECIPE_INDEX_CONTINUED,
        false => RECIPE_INDEX_VERSION,
    };
    let old = RecipeIndexV2Out {
        containers: &r.containers,
        parts: r
            .parts
            .iter()
            .map(|p| PartRefV2Out {
                id: &p.id,
                first: &p.first,
                nodes: p.nodes,
                containers: &p.containers,
            })
            .collect(),
    };
    postcard::to_extend(&old, vec![v]).map_err(enc)
}

/// Decodes a `recipes/` object of any version this build reads.
pub fn decode_recipe_object(bytes: &[u8]) -> Result<RecipeObject> {
    const WHAT: &str = "recipe";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let err = |e: postcard::Error| CoreError::Decode {
        what: WHAT,
        msg: e.to_string(),
    };
    match v {
        RECIPE_INDEX_PIECES => postcard::from_bytes(body)
            .map(|i| {
                RecipeObject::Index(RecipeIndex {
                    continued: true,
                    ..i
                })
            })
            .map_err(err),
        RECIPE_INDEX_VERSION | RECIPE_INDEX_CONTINUED => postcard::from_bytes(body)
            .map(|i: RecipeIndexV2| {
                RecipeObject::Index(RecipeIndex {
                    containers: i.containers,
                    parts: i
                        .parts
                        .into_iter()
                        .map(|p| PartRef {
                            id: p.id,
                            first: p.first,
                            nodes: p.nodes,
                            containers: p.containers,
                            piece: None,
                        })
                        .collect(),
                    continued: v == RECIPE_INDEX_CONTINUED,
                })
            })
            .map_err(err),
        STRUCT_VERSION => postcard::from_bytes(body)
            .map(RecipeObject::Whole)
            .map_err(err),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: RECIPE_INDEX_PIECES,
        }),
    }
}

/// The order of nodes in a recipe: component by component, each compared
/// as bytes, a directory before its contents — the order of a depth-first
/// walk that visits each directory's entries by name. Equivalent to
/// comparing the paths as bytes with `/` below every other byte.
pub fn path_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let key = |c: u8| if c == b'/' { 0u8 } else { c };
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return key(*x).cmp(&key(*y)).then(x.cmp(y));
        }
    }
    a.len().cmp(&b.len())
}

/// Figures recorded with each snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotStats {
    pub files: u64,
    pub dirs: u64,
    pub logical_bytes: u64,
    /// Bytes of file content actually read (unchanged files are skipped).
    pub read_bytes: u64,
    pub new_chunks: u64,
    /// Plaintext bytes of new chunks.
    pub new_raw_bytes: u64,
    /// Bytes added to the repository (containers + metadata).
    pub new_stored_bytes: u64,
    pub duration_ms: u64,
    pub warnings: u64,
}

/// How an archival version was reverse-deduplicated (RevDedup §2.4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archival {
    /// Snapshot id of the version its indirect references point into
    /// (the next version of the series); `None` when it has none.
    pub next: Option<String>,
    /// When the conversion was committed (ns since the epoch).
    pub converted_ns: i64,
    /// Chunk references left direct (into containers stamped with this
    /// version) and their plaintext bytes.
    pub direct_chunks: u64,
    pub direct_bytes: u64,
    /// Chunk references made indirect and their plaintext bytes.
    pub indirect_chunks: u64,
    pub indirect_bytes: u64,
    /// Of those, bytes whose chunk the next version holds at another
    /// location: pool space the conversion could free (snapshot version 2;
    /// 0 when read from version 1).
    pub released_bytes: u64,
}

/// A committed version. Writing this object is the commit point. The
/// object keeps its name (the snapshot id, the hash of its first content)
/// when lifecycle commands replace it to switch its recipe atomically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub series: String,
    pub version: u32,
    /// Nanoseconds since the epoch.
    pub time_ns: i64,
    pub host: String,
    pub paths: Vec<String>,
    pub tags: Vec<String>,
    /// Object id of the recipe.
    pub recipe: String,
    pub parent: Option<String>,
    pub chunker: ChunkerParams,
    pub stats: SnapshotStats,
    /// Set once the version is reverse-deduplicated (archival form: direct
    /// references only into its own stamped containers, the rest indirect).
    pub archival: Option<Archival>,
    /// Which tier holds its data (structure version 3).
    pub tier: Tier,
    /// Paths moved out of an active version to the cloud tier by `tier
    /// migrate --path` (structure version 4). In the bucket, the version's
    /// snapshot object holds just these paths and carries the same record.
    pub cloud_part: Option<CloudPart>,
}

impl Snapshot {
    /// The recipes this version uses: its own and its cloud part's.
    pub fn recipes(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.recipe).chain(self.cloud_part.as_ref().map(|p| &p.recipe))
    }
}

/// The files of a version that live in the cloud tier while the rest of it
/// stays active: their recipe (all references direct into the cloud
/// tier's containers; the same object on both sides), which globs chose
/// them, and what they hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudPart {
    pub recipe: String,
    pub paths: Vec<String>,
    pub files: u64,
    pub logical_bytes: u64,
    /// When the last move was committed (ns since the epoch).
    pub moved_ns: i64,
}

/// Where a version's data is: the active tier (the repository itself) or
/// the cloud tier attached to it (`strata tier`), a separate dedup domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tier {
    #[default]
    Active,
    Cloud,
}

/// An index object: the metadata of a set of containers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexObject {
    pub containers: Vec<ContainerMeta>,
}

/// Repository configuration (stored unencrypted, checksummed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoConfig {
    pub format_version: u8,
    pub id: String,
    pub created: i64,
    pub chunker: ChunkerParams,
    pub zstd_level: i32,
    pub container_size: u32,
    pub region_size: u32,
    pub encrypted: bool,
    pub index: String,
}

/// `tier/config` of a repository and of its cloud tier: which side this
/// is and who the other side is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierConfig {
    /// This side's role.
    pub role: Tier,
    /// The other side's repository id.
    pub peer_id: String,
    /// On the active side: where the cloud tier is (`s3://BUCKET/PREFIX`,
    /// with its `?endpoint=`), as given to `strata tier add`.
    pub peer_url: String,
    /// When it was attached (seconds since the epoch).
    pub attached: i64,
}

/// A lock held by a running command: a lease, refreshed while it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub host: String,
    pub pid: u32,
    /// When it was taken or last refreshed (seconds since the epoch).
    pub time: i64,
    pub exclusive: bool,
    pub operation: String,
    /// When the lease runs out unless refreshed (seconds since the epoch);
    /// 0 for locks written before leases (structure version 1).
    pub expires: i64,
}

/// Version byte of [`LockInfo`]: 2 added `expires`; version-1 locks are
/// still read (they never expire by time).
pub const LOCK_VERSION: u8 = 2;

pub fn encode_lock(l: &LockInfo) -> Result<Vec<u8>> {
    postcard::to_extend(l, vec![LOCK_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

pub fn decode_lock(bytes: &[u8]) -> Result<LockInfo> {
    const WHAT: &str = "lock";
    #[derive(Deserialize)]
    struct V1 {
        host: String,
        pid: u32,
        time: i64,
        exclusive: bool,
        operation: String,
    }
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let err = |e: postcard::Error| CoreError::Decode {
        what: WHAT,
        msg: e.to_string(),
    };
    match v {
        LOCK_VERSION => postcard::from_bytes(body).map_err(err),
        1 => postcard::from_bytes::<V1>(body)
            .map_err(err)
            .map(|l| LockInfo {
                host: l.host,
                pid: l.pid,
                time: l.time,
                exclusive: l.exclusive,
                operation: l.operation,
                expires: 0,
            }),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: LOCK_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_chunks_decode_as_runs() {
        let data = |b: u8| ChunkRef {
            fp: Fingerprint([b; 32]),
            len: 4096,
            container: 0,
            region: 1,
            offset: 4096 * b as u32,
        };
        let zero = ChunkRef::zeros(4096, 1);
        // As builds before zero runs wrote it: one reference per chunk.
        let written = SegmentRef {
            fp: Fingerprint([9; 32]),
            chunks: vec![zero, zero, data(1), zero, zero, zero, data(2), zero],
        };
        let bytes = encode(&written).unwrap();
        let read: SegmentRef = decode("segment", &bytes).unwrap();
        assert_eq!(
            read.chunks,
            vec![
                ChunkRef::zeros(8192, 2),
                data(1),
                ChunkRef::zeros(3 * 4096, 3),
                data(2),
                zero
            ]
        );
        assert_eq!((read.len(), read.chunk_count()), (8 * 4096, 8));
        assert_eq!(read.fp, written.fp);
        // Runs merge with runs, and a run encoded decodes as itself.
        let mut again = SegmentRef {
            fp: read.fp,
            chunks: Vec::new(),
        };
        for c in read.chunks.iter().chain(&read.chunks) {
            again.push(*c);
        }
        assert_eq!(again.chunk_count(), 16);
        assert_eq!(again.chunks[4], ChunkRef::zeros(3 * 4096, 3));
        let back: SegmentRef = decode("segment", &encode(&again).unwrap()).unwrap();
        assert_eq!(back, again);
        // A run never overflows its length: a new one starts.
        let mut big = Vec::new();
        push_chunk(&mut big, ChunkRef::zeros(u32::MAX - 10, 7));
        push_chunk(&mut big, ChunkRef::zeros(4096, 1));
        assert_eq!(big.len(), 2);
    }

    #[test]
    fn path_order_is_a_depth_first_walk_by_name() {
        use std::cmp::Ordering::*;
        let mut v: Vec<&[u8]> = vec![b"a.txt", b"a/b", b"a", b"ab", b"a/b/c", b"a/a", b"b"];
        v.sort_by(|x, y| path_cmp(x, y));
        let want: Vec<&[u8]> = vec![b"a", b"a/a", b"a/b", b"a/b/c", b"a.txt", b"ab", b"b"];
        assert_eq!(v, want);
        assert_eq!(path_cmp(b"x", b"x"), Equal);
        assert_eq!(path_cmp(b"x/", b"x"), Greater);
    }

    #[test]
    fn index_summaries_of_both_versions_decode() {
        let fp = |b: u8| Fingerprint([b; 32]);
        let entry = |b: u8| ChunkEntry {
            fp: fp(b),
            region: 0,
            offset: 0,
            len: 4096,
        };
        let meta = ContainerMeta {
            id: ContainerId([3; 16]),
            data_len: 100,
            created: 5,
            stamp: None,
            regions: vec![],
            chunks: vec![entry(9), entry(2), entry(7), entry(1)],
            segments: vec![
                SegmentEntry {
                    fp: fp(40),
                    first_chunk: 0,
                    chunks: 3,
                },
                // A run past the chunk entries: no representatives.
                SegmentEntry {
                    fp: fp(41),
                    first_chunk: 3,
                    chunks: u32::MAX,
                },
            ],
        };
        let s = IndexSummary::of("index/ab".into(), std::slice::from_ref(&meta));
        let segs = s.segments.as_ref().unwrap();
        assert_eq!(segs[0][0].reps, Some([fp(2), fp(9)]));
        assert_eq!(segs[0][1].reps, None);
        let v2 = encode_index_summary(&s).unwrap();
        assert_eq!(v2[0], INDEX_SUMMARY_VERSION);
        assert_eq!(decode_index_summary(&v2).unwrap(), s);
        // Version 1 (what earlier builds wrote): no segments.
        let v1 = encode(&IndexSummaryV1 {
            index: s.index.clone(),
            containers: s.containers.clone(),
        })
        .unwrap();
        let old = decode_index_summary(&v1).unwrap();
        assert_eq!((old.index, old.segments), (s.index.clone(), None));
        assert_eq!(old.containers, s.containers);
        // Segments that do not match the containers one to one.
        let mut bad = s.clone();
        bad.segments = Some(vec![]);
        assert!(decode_index_summary(&encode_index_summary(&bad).unwrap()).is_err());
        let mut future = v2.clone();
        future[0] = 9;
        assert!(matches!(
            decode_index_summary(&future),
            Err(CoreError::UnknownVersion { found: 9, .. })
        ));
        assert!(decode_index_summary(&[]).is_err());
    }

    #[test]
    fn recipe_objects_of_both_versions_decode() {
        let whole = Recipe {
            containers: vec![ContainerId([7; 16])],
            nodes: vec![],
        };
        assert_eq!(
            decode_recipe_object(&encode(&whole).unwrap()).unwrap(),
            RecipeObject::Whole(whole)
        );
        let idx = RecipeIndex {
            containers: vec![ContainerId([1; 16])],
            parts: vec![PartRef {
                id: "ab".into(),
                first: b"a/b".to_vec(),
                nodes: 3,
                containers: vec![0],
                piece: None,
            }],
            continued: false,
        };
        let bytes = encode_recipe_index(&idx).unwrap();
        assert_eq!(bytes[0], RECIPE_INDEX_VERSION);
        assert_eq!(
            decode_recipe_object(&bytes).unwrap(),
            RecipeObject::Index(idx.clone())
        );
        // With continued files: the same encoding under version 3.
        let cont = RecipeIndex {
            continued: true,
            ..idx.clone()
        };
        let b3 = encode_recipe_index(&cont).unwrap();
        assert_eq!(b3[0], RECIPE_INDEX_CONTINUED);
        assert_eq!(b3[1..], bytes[1..]);
        assert_eq!(
            decode_recipe_object(&b3).unwrap(),
            RecipeObject::Index(cont.clone())
        );
        // A part that says which piece it holds: version 4, continued.
        let mut pieces = cont.clone();
        pieces.parts[0].piece = Some(PieceRef {
            offset: 64 << 20,
            len: 2 << 20,
            meta: Fingerprint([5; 32]),
            segment: 2 << 20,
            direct_chunks: 512,
            direct_bytes: 2 << 20,
        });
        let b4 = encode_recipe_index(&pieces).unwrap();
        assert_eq!(b4[0], RECIPE_INDEX_PIECES);
        assert_eq!(
            decode_recipe_object(&b4).unwrap(),
            RecipeObject::Index(pieces.clone())
        );
        // Without continued files no piece is kept: version 2.
        let plain = RecipeIndex {
            continued: false,
            ..pieces
        };
        assert_eq!(encode_recipe_index(&plain).unwrap(), bytes);
        let mut future = bytes.clone();
        future[0] = 9;
        assert!(decode_recipe_object(&future).is_err());
        assert!(decode_recipe_object(&[]).is_err());
        assert!(decode_recipe_object(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn version_is_checked() {
        let l = LockInfo {
            host: "h".into(),
            pid: 1,
            time: 2,
            exclusive: true,
            operation: "gc".into(),
            expires: 3,
        };
        let mut b = encode_lock(&l).unwrap();
        assert_eq!(decode_lock(&b).unwrap(), l);
        b[0] = 9;
        assert!(matches!(
            decode_lock(&b),
            Err(CoreError::UnknownVersion { found: 9, .. })
        ));
        assert!(decode_lock(&[]).is_err());
        assert!(decode_lock(&[LOCK_VERSION, 1]).is_err());
        // A lock of version 1 (no lease) still reads, never expiring.
        let v1 = encode(&(&l.host, l.pid, l.time, l.exclusive, &l.operation)).unwrap();
        assert_eq!(decode_lock(&v1).unwrap(), LockInfo { expires: 0, ..l });
    }

    #[test]
    fn snapshots_of_versions_1_and_2_still_read() {
        #[derive(Serialize)]
        struct V1Archival {
            next: Option<String>,
            converted_ns: i64,
            direct_chunks: u64,
            direct_bytes: u64,
            indirect_chunks: u64,
            indirect_bytes: u64,
        }
        let mut s = Snapshot {
            series: "s".into(),
            version: 3,
            time_ns: 5,
            host: "h".into(),
            paths: vec!["/p".into()],
            tags: vec![],
            recipe: "r".into(),
            parent: None,
            chunker: ChunkerParams::cdc(8192),
            stats: SnapshotStats::default(),
            archival: None,
            tier: Tier::Active,
            cloud_part: None,
        };
        // A version-1 object: the same fields, the archival record without
        // released_bytes.
        let old = (
            &s.series,
            s.version,
            s.time_ns,
            &s.host,
            &s.paths,
            &s.tags,
            &s.recipe,
            &s.parent,
            s.chunker,
            &s.stats,
            Some(V1Archival {
                next: Some("n".into()),
                converted_ns: 7,
                direct_chunks: 1,
                direct_bytes: 2,
                indirect_chunks: 3,
                indirect_bytes: 4,
            }),
        );
        let bytes = postcard::to_extend(&old, vec![1]).unwrap();
        let got = decode_snapshot(&bytes).unwrap();
        s.archival = Some(Archival {
            next: Some("n".into()),
            converted_ns: 7,
            direct_chunks: 1,
            direct_bytes: 2,
            indirect_chunks: 3,
            indirect_bytes: 4,
            released_bytes: 0,
        });
        assert_eq!(got, s);
        // A version-2 object: no tier; it reads as active.
        s.archival.as_mut().unwrap().released_bytes = 9;
        let v2 = (
            &s.series,
            s.version,
            s.time_ns,
            &s.host,
            &s.paths,
            &s.tags,
            &s.recipe,
            &s.parent,
            s.chunker,
            &s.stats,
            &s.archival,
        );
        let bytes = postcard::to_extend(&v2, vec![2]).unwrap();
        assert_eq!(decode_snapshot(&bytes).unwrap(), s);
        // A version-3 object: a tier, no cloud part.
        s.tier = Tier::Cloud;
        let v3 = (
            &s.series,
            s.version,
            s.time_ns,
            &s.host,
            &s.paths,
            &s.tags,
            &s.recipe,
            &s.parent,
            s.chunker,
            &s.stats,
            &s.archival,
            s.tier,
        );
        let bytes = postcard::to_extend(&v3, vec![3]).unwrap();
        assert_eq!(decode_snapshot(&bytes).unwrap(), s);
        // Version 4 round-trips, with the new fields.
        s.cloud_part = Some(CloudPart {
            recipe: "p".into(),
            paths: vec!["/logs/**".into()],
            files: 2,
            logical_bytes: 3,
            moved_ns: 4,
        });
        assert_eq!(decode_snapshot(&encode_snapshot(&s).unwrap()).unwrap(), s);
        assert_eq!(s.recipes().collect::<Vec<_>>(), ["r", "p"]);
        assert!(matches!(
            decode_snapshot(&[5, 0]),
            Err(CoreError::UnknownVersion { found: 5, .. })
        ));
    }

    #[test]
    fn footer_roundtrip() {
        let f = ContainerFooter {
            meta_offset: 12345,
            meta_len: 77,
        };
        assert_eq!(ContainerFooter::parse(&f.to_bytes()).unwrap(), f);
        let mut b = f.to_bytes();
        b[15] = 0;
        assert!(ContainerFooter::parse(&b).is_err());
    }
}
