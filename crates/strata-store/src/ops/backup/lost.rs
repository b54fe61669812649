//! Containers the index lists but the repository no longer has (deleted
//! by hand, lost with a disk, removed by a bucket's lifecycle rule).
//!
//! A backup must not deduplicate against them: a version that references
//! a lost container is damaged the moment it is committed. So a backup
//! lists the data objects once at its start, learns no chunk of a lost
//! container (the index strategy, the previous version's reusable files
//! and the parts an image takes over all go by the same set), stores
//! those chunks again where it meets them, and says which older versions
//! are damaged.

use crate::engine::index::{build_strategy, ContainerTable, IndexStrategy};
use crate::error::Result;
use crate::repo::index::RepoIndex;
use crate::repo::{container_id_of, recipe, Repository};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use strata_core::format::ContainerId;

/// Most damaged versions a warning names one by one.
const NAMED: usize = 10;

/// The repository's index strategy and index for a backup, without the
/// containers whose data is gone (returned, sorted) and those in `avoid`
/// (known to be damaged).
pub(crate) fn load_index(
    repo: &Repository,
    table: &Arc<ContainerTable>,
    avoid: &HashSet<ContainerId>,
) -> Result<(Box<dyn IndexStrategy>, RepoIndex, Vec<ContainerId>)> {
    let present = present(repo)?;
    let usable: HashSet<ContainerId> = present.difference(avoid).copied().collect();
    let (strategy, mut index) = build_strategy(repo, table, Some(&usable))?;
    crate::repo::index::upgrade_summaries(repo, &mut index);
    let lost = take_lost(&mut index, &present);
    // (Out of the previous version's pool too.)
    for c in avoid {
        index.containers.remove(c);
    }
    Ok((strategy, index, lost))
}

/// The containers whose data object the repository has: one listing of
/// `data/` (a linked container's data object is its link stub).
fn present(repo: &Repository) -> Result<HashSet<ContainerId>> {
    Ok(repo
        .backend()
        .list("data/")?
        .iter()
        .filter_map(|o| container_id_of(&o.name))
        .collect())
}

/// Takes the containers `index` lists without a data object out of it
/// (so nothing built from it afterwards offers their chunks) and returns
/// them, sorted.
fn take_lost(index: &mut RepoIndex, present: &HashSet<ContainerId>) -> Vec<ContainerId> {
    let mut lost: Vec<ContainerId> = index
        .containers
        .keys()
        .filter(|id| !present.contains(id))
        .copied()
        .collect();
    lost.sort();
    for id in &lost {
        index.containers.remove(id);
    }
    lost
}

/// The warning a backup gives when containers are lost: how many, and
/// the versions whose recipes still reference them directly (as
/// SERIES@VERSION). Asked again after the lifecycle, which may have
/// re-pointed an older version to the chunks this backup stored again.
pub fn warning(repo: &Repository, lost: &[ContainerId]) -> Result<String> {
    let gone: HashSet<&ContainerId> = lost.iter().collect();
    let (snapshots, _) = repo.list_snapshots_tolerant()?;
    let mut damaged = BTreeSet::new();
    for (_, s) in &snapshots {
        for r in s.recipes() {
            // A recipe that cannot be read is check's to report.
            let uses = recipe::containers(repo, r)
                .map(|cs| cs.iter().any(|c| gone.contains(c)))
                .unwrap_or(false);
            if uses {
                damaged.insert((s.series.clone(), s.version));
                break;
            }
        }
    }
    let mut names: Vec<String> = damaged
        .iter()
        .take(NAMED)
        .map(|(series, v)| format!("{series}@{v}"))
        .collect();
    if damaged.len() > NAMED {
        names.push(format!("and {} more", damaged.len() - NAMED));
    }
    let first = crate::repo::data_name(&lost[0]);
    let what = if names.is_empty() {
        "no version references them any more".to_string()
    } else {
        format!(
            "{} older version(s) reference them: {} (what has no other copy is lost: \
             `strata check --read-data` lists the files, `strata repair snapshots` saves \
             the rest)",
            damaged.len(),
            names.join(", ")
        )
    };
    Ok(format!(
        "{} container(s) the index lists are missing from the repository ({first}{}): \
         their chunks were stored again where this backup met them; {what}",
        lost.len(),
        if lost.len() > 1 { ", …" } else { "" },
    ))
}
