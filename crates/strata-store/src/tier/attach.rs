//! A repository's cloud tier: attaching one (`tier attach`), where its
//! settings are kept, and opening it.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use std::sync::Arc;
use strata_core::crypto::{random_bytes, Kind, Sealer};
use strata_core::format::{decode_config, encode, encode_config, RepoConfig, Tier, TierConfig};

/// Object holding a side's [`TierConfig`].
pub const TIER_CONFIG: &str = "tier/config";

/// Default size of the cloud tier's containers: 4 MiB objects, the upper
/// end of the paper's 1–4 MB (§2.3: larger objects, fewer requests, no
/// speed gained beyond).
pub const CLOUD_CONTAINER: u32 = 4 << 20;

pub(super) fn read_tier_config(repo: &Repository) -> Result<Option<TierConfig>> {
    repo.get_struct_opt(Kind::TierConfig, TIER_CONFIG, "tier config")
}

pub(super) fn write_tier_config(repo: &Repository, c: &TierConfig) -> Result<()> {
    let env = repo.sealer().seal(Kind::TierConfig, &encode(c)?, false)?;
    Ok(repo.backend().put(TIER_CONFIG, &env)?)
}

/// The cloud tier attached to `local`, if any: its location as given to
/// `tier add`.
pub fn attached(local: &Repository) -> Result<Option<TierConfig>> {
    Ok(read_tier_config(local)?.filter(|c| c.role == Tier::Active))
}

/// Attaches the bucket behind `backend` (`url` says where it is) as
/// `local`'s cloud tier: creates the cloud repository there (same keys,
/// [`CLOUD_CONTAINER`]-sized containers) or, when the bucket already holds
/// `local`'s cloud tier, re-attaches it. Returns the cloud repository.
pub fn attach(local: &Repository, backend: Arc<dyn Backend>, url: &str) -> Result<Repository> {
    attach_with(local, backend, url, CLOUD_CONTAINER)
}

/// [`attach`] with the cloud tier's container size (of a new cloud tier;
/// S3's server-side copy cleans only containers above 5 MiB).
pub fn attach_with(
    local: &Repository,
    backend: Arc<dyn Backend>,
    url: &str,
    container_size: u32,
) -> Result<Repository> {
    if let Some(c) = attached(local)? {
        if c.peer_url != url {
            return Err(StoreError::Invalid(format!(
                "this repository already has a cloud tier at {}; one cloud tier per repository",
                c.peer_url
            )));
        }
    }
    let cloud = match backend.size("config")? {
        Some(_) => open_cloud_in(local, backend.clone())?,
        None => create_cloud(local, backend.clone(), container_size)?,
    };
    write_tier_config(
        local,
        &TierConfig {
            role: Tier::Active,
            peer_id: cloud.config().id.clone(),
            peer_url: url.to_string(),
            attached: now_ns() / 1_000_000_000,
        },
    )?;
    Ok(cloud)
}

/// Creates the cloud repository in an empty bucket.
fn create_cloud(
    local: &Repository,
    backend: Arc<dyn Backend>,
    container_size: u32,
) -> Result<Repository> {
    let lc = local.config();
    let mut id = [0u8; 16];
    random_bytes(&mut id)?;
    let config = RepoConfig {
        id: hex::encode(id),
        created: now_ns() / 1_000_000_000,
        container_size: container_size.max(2 * lc.region_size),
        index: "exact".into(),
        // The tier stores whole chunks: what it holds is read alone.
        delta: false,
        ..lc.clone()
    };
    if lc.encrypted {
        // The same key, wrapped by the same password: the bucket opens
        // alone (disaster recovery) with the repository's password.
        crate::repo::keys::sync_slots(local.backend(), &backend)?;
    }
    let cloud = local.sibling(backend.clone(), config.clone());
    write_tier_config(
        &cloud,
        &TierConfig {
            role: Tier::Cloud,
            peer_id: lc.id.clone(),
            peer_url: String::new(),
            attached: now_ns() / 1_000_000_000,
        },
    )?;
    let env = Sealer::plain(3).seal(Kind::Config, &encode_config(&config)?, false)?;
    // The config is written last: it is what makes the bucket a repository.
    backend.put("config", &env)?;
    Ok(cloud)
}

/// Opens `local`'s cloud tier in `backend`, checking that it is the one.
pub fn open_cloud_in(local: &Repository, backend: Arc<dyn Backend>) -> Result<Repository> {
    let raw = match backend.get("config") {
        Ok(r) => r,
        Err(e) if e.is_not_found() => {
            return Err(StoreError::Invalid(format!(
                "no cloud tier at {}: `strata tier add` creates it",
                backend.describe()
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let bytes = Sealer::plain(3)
        .open(Kind::Config, &raw)
        .map_err(|e| StoreError::corrupt("config", e))?;
    let config = decode_config(&bytes).map_err(|e| StoreError::corrupt("config", e))?;
    let cloud = local.sibling(backend.clone(), config);
    match read_tier_config(&cloud) {
        Ok(Some(c)) if c.role == Tier::Cloud && c.peer_id == local.config().id => Ok(cloud),
        Ok(_) => Err(StoreError::Invalid(format!(
            "{} holds a repository that is not this repository's cloud tier",
            backend.describe()
        ))),
        // Another repository's keys cannot open its tier config.
        Err(StoreError::Core(_)) | Err(StoreError::Corrupt { .. }) => {
            Err(StoreError::Invalid(format!(
                "{} holds a repository with other keys, not this repository's cloud tier",
                backend.describe()
            )))
        }
        Err(e) => Err(e),
    }
}
