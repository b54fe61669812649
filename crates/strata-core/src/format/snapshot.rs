//! Snapshots: a version of a series, its recipe, its place in the
//! lifecycle and the tiers; every structure version still read.

use crate::chunker::ChunkerParams;
use crate::error::{CoreError, Result};
use crate::id::{RecipeId, SnapshotId};
use serde::{Deserialize, Serialize};

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
    let err = |e: postcard::Error| super::codec::decode_error(WHAT, e);
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
    use crate::id::{RecipeId, SnapshotId};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Snapshot {
        pub series: String,
        pub version: u32,
        pub time_ns: i64,
        pub host: String,
        pub paths: Vec<String>,
        pub tags: Vec<String>,
        pub recipe: RecipeId,
        pub parent: Option<SnapshotId>,
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
    use crate::id::{RecipeId, SnapshotId};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Snapshot {
        pub series: String,
        pub version: u32,
        pub time_ns: i64,
        pub host: String,
        pub paths: Vec<String>,
        pub tags: Vec<String>,
        pub recipe: RecipeId,
        pub parent: Option<SnapshotId>,
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
    use crate::id::{RecipeId, SnapshotId};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Archival {
        pub next: Option<SnapshotId>,
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
        pub recipe: RecipeId,
        pub parent: Option<SnapshotId>,
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
    pub next: Option<SnapshotId>,
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
    pub recipe: RecipeId,
    pub parent: Option<SnapshotId>,
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
    pub fn recipes(&self) -> impl Iterator<Item = &RecipeId> {
        std::iter::once(&self.recipe).chain(self.cloud_part.as_ref().map(|p| &p.recipe))
    }
}

/// The files of a version that live in the cloud tier while the rest of it
/// stays active: their recipe (all references direct into the cloud
/// tier's containers; the same object on both sides), which globs chose
/// them, and what they hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudPart {
    pub recipe: RecipeId,
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
