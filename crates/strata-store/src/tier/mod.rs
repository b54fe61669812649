//! The cloud tier (Data Domain Cloud Tier, docs/design.md "Cloud tier"): a
//! second deduplication domain in a bucket, attached to a local repository
//! (the active tier). It is a Strata repository of its own — config, a
//! copy of the key, containers, index objects, and the recipes and
//! snapshot objects of the versions it holds — so the bucket alone
//! restores everything (`strata --repo s3://… restore` works on it, and
//! `tier dr-rebuild` rebuilds a local site from it). The two sides share
//! keys, so chunks and recipe parts have the same fingerprints and names
//! on both; they never share chunks: a version is wholly in one tier.
//!
//! | module | what |
//! |---|---|
//! | [`select`] | which versions (and paths) a tier command works on |
//! | [`phv`] | the perfect-hash vector: one bit per fingerprint of a tier |
//! | [`estimate`] | bytes a move would free on the active tier (§4) |
//! | [`migrate`] | versions to the cloud tier, deduplicated against it (§6.1), and back (recall, §6.2) |
//! | [`paths`] | paths within versions: cutting a version in an active and a cloud part, and joining them |
//! | [`seed`] | the bulk first transfer, in physical order, resumable (§5) |
//! | [`sources`] | where a version's data is: the repository, its cloud tier, or both |
//! | `attach` | attaching a cloud tier, where its settings are kept, opening it |
//! | [`cloud_gc`] | cleaning the cloud tier region by region, copying forward next to the store (§7) |
//! | [`copy_forward`] | how objects are assembled without downloading them |
//! | `wanted` | the destination's index of just the chunks that move |

mod attach;
pub mod cloud_gc;
pub mod copy_forward;
pub mod estimate;
pub mod migrate;
pub mod paths;
pub mod phv;
pub mod seed;
pub mod select;
pub mod sources;
mod wanted;

pub use attach::{attach, attach_with, attached, open_cloud_in, CLOUD_CONTAINER, TIER_CONFIG};
pub use sources::{tier_name, Tiers};

use attach::{read_tier_config, write_tier_config};

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use std::sync::Arc;
use strata_core::crypto::{Kind, Sealer};
use strata_core::format::{encode_config, RepoConfig, Tier, TierConfig};
use strata_core::id::{RecipeId, SnapshotId};

/// Forgets versions held by the cloud tier: the bucket's snapshot copy
/// first (so a disaster recovery does not bring them back), then the local
/// snapshot object, then recipes neither side uses any more. Their data
/// in the bucket is freed by the cloud tier's gc. Returns how many.
pub fn forget_cloud(local: &Repository, cloud: &Repository, ids: &[SnapshotId]) -> Result<u64> {
    let _l = crate::repo::lock::acquire(local, true, "forget")?;
    let _c = crate::repo::lock::acquire(cloud, true, "forget")?;
    let mut recipes = Vec::new();
    for id in ids {
        let s = local.load_snapshot(id)?;
        if s.tier != Tier::Cloud {
            return Err(StoreError::Invalid(format!(
                "snapshot {id} is not in the cloud tier"
            )));
        }
        cloud.backend().delete(&id.object_name())?;
        local.backend().delete(&id.object_name())?;
        recipes.push(s.recipe);
    }
    crate::repo::recipe::delete_unused(cloud, &recipes)?;
    crate::repo::recipe::delete_unused(local, &recipes)?;
    Ok(ids.len() as u64)
}

/// After active versions were forgotten: the bucket forgets their cloud
/// parts (`tier migrate --path`; `parts` holds each version's id and its
/// part's recipe, read before the forget). In this order a failed forget
/// loses nothing, and a crash between the two leaves an orphan that the
/// cloud tier's gc drops. Returns how many parts went.
pub fn forget_cloud_parts(cloud: &Repository, parts: &[(SnapshotId, RecipeId)]) -> Result<u64> {
    let _c = crate::repo::lock::acquire(cloud, true, "forget")?;
    for (id, _) in parts {
        cloud.backend().delete(&id.object_name())?;
    }
    crate::repo::recipe::delete_unused(cloud, parts.iter().map(|(_, r)| r))?;
    Ok(parts.len() as u64)
}

/// What `dr_rebuild` brought back.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Rebuilt {
    pub repository_id: String,
    pub snapshots: u64,
    pub recipes: u64,
    pub parts: u64,
    pub seconds: f64,
}

/// Disaster recovery (§2.2): rebuilds a local site from its cloud tier
/// alone. `local` must be empty; `cloud` is the bucket, opened with the
/// repository's password (its key copy). The new local repository takes
/// the lost one's id and settings, is attached to the bucket, and gets the
/// namespace back: every snapshot object of the bucket with its recipe —
/// the versions in the cloud tier, restorable at once. (Versions that were
/// only in the lost active tier are gone with it.)
pub fn dr_rebuild(
    local: Arc<dyn Backend>,
    cloud: &Repository,
    url: &str,
    index: &str,
) -> Result<(Repository, Rebuilt)> {
    let started = std::time::Instant::now();
    if local.size("config")?.is_some() {
        return Err(StoreError::AlreadyExists(local.describe()));
    }
    let tc = read_tier_config(cloud)?
        .filter(|c| c.role == Tier::Cloud)
        .ok_or_else(|| {
            StoreError::Invalid(format!(
                "{} is not a cloud tier (no tier config of its own)",
                cloud.backend().describe()
            ))
        })?;
    let index = crate::repo::IndexSpec::parse(index)?;
    let cc = cloud.config();
    let config = RepoConfig {
        id: tc.peer_id.clone(),
        created: now_ns() / 1_000_000_000,
        container_size: crate::repo::default_container_size(&index.name),
        index: index.to_string(),
        ..cc.clone()
    };
    if cc.encrypted {
        crate::repo::keys::sync_slots(cloud.backend(), &local)?;
    }
    let repo = cloud.sibling(local.clone(), config.clone());
    let mut out = Rebuilt {
        repository_id: config.id.clone(),
        ..Default::default()
    };
    // The namespace: recipes (parts first) before the snapshots naming them.
    for (id, s) in cloud.list_snapshots()? {
        for p in crate::repo::recipe::needed_parts(cloud, &s.recipe)? {
            let name = crate::repo::recipe::part_name(&p);
            if local.size(&name)?.is_none() {
                local.put(&name, &cloud.backend().get(&name)?)?;
                out.parts += 1;
            }
        }
        let rname = format!("recipes/{}", s.recipe);
        if local.size(&rname)?.is_none() {
            local.put(&rname, &cloud.backend().get(&rname)?)?;
            out.recipes += 1;
        }
        let sname = format!("snapshots/{id}");
        local.put(&sname, &cloud.backend().get(&sname)?)?;
        out.snapshots += 1;
    }
    write_tier_config(
        &repo,
        &TierConfig {
            role: Tier::Active,
            peer_id: cc.id.clone(),
            peer_url: url.to_string(),
            attached: now_ns() / 1_000_000_000,
        },
    )?;
    let env = Sealer::plain(3).seal(Kind::Config, &encode_config(&config)?, false)?;
    // Last: what makes the directory a repository.
    local.put("config", &env)?;
    out.seconds = started.elapsed().as_secs_f64();
    Ok((repo, out))
}
