//! The repository's config, and a tier's.

use super::snapshot::Tier;
use crate::chunker::ChunkerParams;
use serde::{Deserialize, Serialize};

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
