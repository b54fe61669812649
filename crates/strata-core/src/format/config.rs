//! The repository's config, and a tier's.

use super::codec::STRUCT_VERSION;
use super::snapshot::Tier;
use crate::chunker::ChunkerParams;
use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// Version byte of a config that turns delta compression on; one without
/// it is written as version 1, what builds before deltas wrote (and
/// those builds refuse a version-2 config, whose repository may hold
/// delta regions they cannot read).
pub const DELTA_CONFIG_VERSION: u8 = 2;

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
    /// New chunks that resemble a stored one are stored as deltas
    /// against it (docs/design.md "Delta compression").
    pub delta: bool,
}

#[derive(Serialize, Deserialize)]
struct ConfigV1 {
    format_version: u8,
    id: String,
    created: i64,
    chunker: ChunkerParams,
    zstd_level: i32,
    container_size: u32,
    region_size: u32,
    encrypted: bool,
    index: String,
}

/// Encodes a config: version 1 with deltas off, [`DELTA_CONFIG_VERSION`]
/// with them on.
pub fn encode_config(c: &RepoConfig) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    if c.delta {
        return postcard::to_extend(c, vec![DELTA_CONFIG_VERSION]).map_err(enc);
    }
    let v1 = ConfigV1 {
        format_version: c.format_version,
        id: c.id.clone(),
        created: c.created,
        chunker: c.chunker,
        zstd_level: c.zstd_level,
        container_size: c.container_size,
        region_size: c.region_size,
        encrypted: c.encrypted,
        index: c.index.clone(),
    };
    postcard::to_extend(&v1, vec![STRUCT_VERSION]).map_err(enc)
}

/// Decodes a config of either version.
pub fn decode_config(bytes: &[u8]) -> Result<RepoConfig> {
    const WHAT: &str = "repository config";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let dec = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    match v {
        STRUCT_VERSION => {
            let c: ConfigV1 = postcard::from_bytes(body).map_err(dec)?;
            Ok(RepoConfig {
                format_version: c.format_version,
                id: c.id,
                created: c.created,
                chunker: c.chunker,
                zstd_level: c.zstd_level,
                container_size: c.container_size,
                region_size: c.region_size,
                encrypted: c.encrypted,
                index: c.index,
                delta: false,
            })
        }
        DELTA_CONFIG_VERSION => postcard::from_bytes(body).map_err(dec),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: DELTA_CONFIG_VERSION,
        }),
    }
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
