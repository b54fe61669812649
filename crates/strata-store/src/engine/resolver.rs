//! The recipe resolver (docs/design.md "Data flow", restore: "resolve refs
//! (follow indirect chains)"): where to read each chunk a recipe
//! references — direct references through the recipe's container table,
//! indirect ones (RevDedup §2.4.1) through the series' chain of newer
//! versions, and, should a container be missing, through the full index by
//! fingerprint. Restore, dump and check use it.

use crate::engine::index::{ContainerTable, ExactIndex};
use crate::error::{Result, StoreError};
use crate::repo::container::read_meta;
use crate::repo::index::RepoIndex;
use crate::repo::{data_name, Repository};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use strata_core::format::{ChunkRef, ContainerId, Node, Recipe, RegionInfo, Snapshot};
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

/// Resolves chunk references to regions: direct ones through the recipe's
/// container table, indirect ones (RevDedup §2.4.1) by following the
/// series' chain of newer versions, and — should a container be missing —
/// through the full index by fingerprint.
pub struct Resolver {
    repo: Repository,
    containers: Vec<ContainerId>,
    regions: HashMap<ContainerId, Arc<Vec<RegionInfo>>>,
    fallback: Mutex<Option<Arc<(ExactIndex, ContainerTable, RepoIndex)>>>,
    /// Where the recipe's indirect references lead, by fingerprint.
    indirect: HashMap<Fingerprint, Resolved>,
    /// Versions followed to resolve the indirect references.
    pub chain_hops: u32,
}

/// Where to read a chunk.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub container: ContainerId,
    pub region_idx: u32,
    pub region: RegionInfo,
    pub offset: u32,
}

/// Longest chain of indirect references followed before giving up: a
/// series would need this many versions, so anything longer is damage.
pub const MAX_CHAIN: u32 = 1 << 20;

/// Region tables of containers whose data object exists and whose
/// metadata opens; anything else (rewritten, damaged) is left out and
/// resolves through the index instead.
fn load_regions(
    repo: &Repository,
    ids: &[ContainerId],
) -> HashMap<ContainerId, Arc<Vec<RegionInfo>>> {
    ids.par_iter()
        .filter_map(|id| {
            if !matches!(repo.backend().size(&data_name(id)), Ok(Some(_))) {
                return None;
            }
            read_meta(repo, id).ok().map(|m| (*id, Arc::new(m.regions)))
        })
        .collect()
}

/// The chunk references of a recipe, in order.
pub fn recipe_refs(recipe: &Recipe) -> impl Iterator<Item = &ChunkRef> {
    recipe
        .nodes
        .iter()
        .flat_map(|n| n.segments.iter().flat_map(|s| s.chunks.iter()))
}

impl Resolver {
    /// A resolver for `recipe`. `used` says which entries of its container
    /// table will be read; `indirect` lists the fingerprints of the
    /// indirect references to resolve, through the chain starting at
    /// `next` (the snapshot's [`strata_core::format::Archival::next`]).
    /// `label` names the snapshot in errors.
    pub fn new(
        repo: &Repository,
        recipe: &Recipe,
        used: impl Fn(usize) -> bool,
        label: &str,
        next: Option<&SnapshotId>,
        indirect: HashSet<Fingerprint>,
    ) -> Result<Self> {
        let needed: Vec<ContainerId> = recipe
            .containers
            .iter()
            .enumerate()
            .filter(|(i, _)| used(*i))
            .map(|(_, c)| *c)
            .collect();
        let mut r = Resolver {
            repo: repo.clone(),
            containers: recipe.containers.clone(),
            regions: load_regions(repo, &needed),
            fallback: Mutex::new(None),
            indirect: HashMap::new(),
            chain_hops: 0,
        };
        if !indirect.is_empty() {
            r.follow_chain(label, next, indirect)?;
        }
        Ok(r)
    }

    /// Walks the newer versions of the series until every wanted
    /// fingerprint meets a direct reference. Each version on the way must
    /// hold every fingerprint still wanted (that is what reverse dedup
    /// checked when it made them indirect); anything else is a broken
    /// chain, reported with the version where it broke.
    fn follow_chain(
        &mut self,
        label: &str,
        next: Option<&SnapshotId>,
        mut want: HashSet<Fingerprint>,
    ) -> Result<()> {
        let broken = |detail: String| StoreError::BrokenChain {
            snapshot: label.to_string(),
            detail,
        };
        let mut next = next.cloned();
        let mut visited = HashSet::new();
        while !want.is_empty() {
            let Some(id) = next.take() else {
                return Err(broken(format!(
                    "{} chunks are indirect but the chain ends",
                    want.len()
                )));
            };
            if !visited.insert(id.clone()) || self.chain_hops >= MAX_CHAIN {
                return Err(broken(format!("the chain loops at snapshot {id}")));
            }
            self.chain_hops += 1;
            let snap = match self.repo.load_snapshot(&id) {
                Ok(s) => s,
                Err(StoreError::NotFound(_)) => {
                    return Err(broken(format!("snapshot {id} is missing")))
                }
                Err(e) => return Err(e),
            };
            // The newer recipe is read a part at a time: only the wanted
            // fingerprints' references are kept.
            let mut present = HashSet::new();
            let mut direct = Vec::new();
            let containers =
                crate::repo::recipe::for_each_piece(&self.repo, &snap.recipe, |n, _| {
                    for c in n.segments.iter().flat_map(|s| &s.chunks) {
                        let first = !c.is_zero() && want.contains(&c.fp) && present.insert(c.fp);
                        if first && c.is_direct() {
                            direct.push(*c);
                        }
                    }
                    Ok(())
                })?;
            if present.len() < want.len() {
                let lost = want.iter().find(|f| !present.contains(*f)).copied();
                return Err(broken(format!(
                    "snapshot {id} ({}@{}) does not hold chunk {}",
                    snap.series,
                    snap.version,
                    lost.map(|f| f.to_hex()).unwrap_or_default()
                )));
            }
            let ids: Vec<ContainerId> = {
                let mut v: Vec<ContainerId> = direct
                    .iter()
                    .filter_map(|c| containers.get(c.container as usize).copied())
                    .collect();
                v.sort();
                v.dedup();
                v.retain(|c| !self.regions.contains_key(c));
                v
            };
            self.regions.extend(load_regions(&self.repo, &ids));
            for c in direct {
                let at = format!("snapshot {id}");
                let r = self.resolve_in(&containers, &c, &at)?;
                self.indirect.insert(c.fp, r);
                want.remove(&c.fp);
            }
            next = snap.archival.and_then(|a| a.next);
        }
        Ok(())
    }

    fn fallback(&self) -> Result<Arc<(ExactIndex, ContainerTable, RepoIndex)>> {
        let mut g = self.fallback.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &*g {
            return Ok(f.clone());
        }
        let table = ContainerTable::default();
        let exact = ExactIndex::default();
        let idx = RepoIndex::load(&self.repo, |m| exact.add_chunks(&table, m))?;
        let f = Arc::new((exact, table, idx));
        *g = Some(f.clone());
        Ok(f)
    }

    /// Whether `c` is a direct reference to a region this resolver knows
    /// (read from its location alone: neither its fingerprint nor the
    /// index is needed to find it).
    pub fn knows_direct(&self, c: &ChunkRef) -> bool {
        c.is_direct()
            && self
                .containers
                .get(c.container as usize)
                .and_then(|id| self.regions.get(id))
                .is_some_and(|r| (c.region as usize) < r.len())
    }

    pub fn resolve(&self, c: &ChunkRef, path: &str) -> Result<Resolved> {
        if c.is_indirect() {
            return self
                .indirect
                .get(&c.fp)
                .cloned()
                .ok_or_else(|| StoreError::MissingChunk {
                    fp: c.fp.to_hex(),
                    path: path.to_string(),
                    container: "(indirect reference not resolved)".into(),
                });
        }
        self.resolve_in(&self.containers, c, path)
    }

    fn resolve_in(&self, table: &[ContainerId], c: &ChunkRef, path: &str) -> Result<Resolved> {
        let id = *table.get(c.container as usize).ok_or_else(|| {
            StoreError::Invalid(format!("recipe of {path} references an unknown container"))
        })?;
        if let Some(regions) = self.regions.get(&id) {
            if let Some(r) = regions.get(c.region as usize) {
                return Ok(Resolved {
                    container: id,
                    region_idx: c.region,
                    region: *r,
                    offset: c.offset,
                });
            }
        }
        let f = self.fallback()?;
        let missing = || StoreError::MissingChunk {
            fp: c.fp.to_hex(),
            path: path.to_string(),
            container: id.to_hex(),
        };
        let loc = f.0.lookup(&c.fp).ok_or_else(missing)?;
        let cid = f.1.get(loc.container);
        let summary = f.2.containers.get(&cid).ok_or_else(missing)?;
        let region = *summary
            .regions
            .get(loc.region as usize)
            .ok_or_else(missing)?;
        Ok(Resolved {
            container: cid,
            region_idx: loc.region,
            region,
            offset: loc.offset,
        })
    }
}

/// A resolver for the chunks of `nodes` of a snapshot's recipe.
pub fn resolver_for(
    repo: &Repository,
    snapshot: &Snapshot,
    recipe: &Recipe,
    nodes: &[&Node],
) -> Result<Resolver> {
    let mut used = vec![false; recipe.containers.len()];
    let mut indirect = HashSet::new();
    for n in nodes {
        let chunks = n.segments.iter().flat_map(|s| &s.chunks);
        mark_needed(chunks, &mut used, &mut indirect);
    }
    resolver_with(repo, snapshot, &recipe.containers, &used, indirect)
}

/// The resolver for references numbered in `containers` (a recipe's
/// table) of version `snapshot`: the containers `used` marks and the
/// `indirect` fingerprints, which the version's chain resolves.
pub fn resolver_with(
    repo: &Repository,
    snapshot: &Snapshot,
    containers: &[ContainerId],
    used: &[bool],
    indirect: HashSet<Fingerprint>,
) -> Result<Resolver> {
    let table = Recipe {
        containers: containers.to_vec(),
        nodes: Vec::new(),
    };
    let label = format!("{}@{}", snapshot.series, snapshot.version);
    let next = snapshot.archival.as_ref().and_then(|a| a.next.as_ref());
    let used = |i: usize| used.get(i).copied().unwrap_or(false);
    Resolver::new(repo, &table, used, &label, next, indirect)
}

/// Marks what resolving `chunks` needs: the containers of direct
/// references in `used` (indices past its end ignored: damage the
/// resolver reports), the fingerprints of indirect ones in `indirect`.
pub fn mark_needed<'c>(
    chunks: impl IntoIterator<Item = &'c ChunkRef>,
    used: &mut [bool],
    indirect: &mut HashSet<Fingerprint>,
) {
    for c in chunks {
        if c.is_indirect() {
            indirect.insert(c.fp);
        } else if let Some(u) = used.get_mut(c.container as usize) {
            *u |= c.is_direct();
        }
    }
}
