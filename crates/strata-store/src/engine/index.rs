//! The repository's index strategy, built from its index objects
//! ([`crate::repo::index`]) at the start of a backup: `exact` and
//! `segment` are `strata-index`'s ([`strata_index::strategy`]), `silo` and
//! `binning` this crate's adapters of its SiLo and Extreme Binning cores
//! ([`crate::engine::similarity`]).

use crate::error::{Result, StoreError};
use crate::repo::index::RepoIndex;
use crate::repo::Repository;
use std::collections::HashSet;
use std::sync::Arc;
use strata_core::format::{ChunkEntry, ContainerId};

pub use strata_index::strategy::{ChunkLoc, ContainerTable, ExactIndex, Learns, SegmentIndex};

/// A repository's index strategy: one whose side work fails with the
/// store's errors.
pub trait IndexStrategy: strata_index::strategy::IndexStrategy<StoreError> {}

impl<T: strata_index::strategy::IndexStrategy<StoreError> + ?Sized> IndexStrategy for T {}

/// A segment index reads a container's chunk entries from its metadata
/// object.
struct MetaLists(Repository);

impl strata_index::strategy::ChunkLists for MetaLists {
    fn chunks(&self, id: &ContainerId) -> Option<Vec<ChunkEntry>> {
        crate::repo::container::read_meta(&self.0, id)
            .ok()
            .map(|m| m.chunks)
    }
}

/// Builds the repository's configured index strategy from its index
/// objects, interning container ids in `table`. With `present`, a
/// container not in it (its data object is gone) is not learnt.
pub fn build_strategy(
    repo: &Repository,
    table: &Arc<ContainerTable>,
    present: Option<&HashSet<ContainerId>>,
) -> Result<(Box<dyn IndexStrategy>, RepoIndex)> {
    let usable = |id: &ContainerId| present.is_none_or(|p| p.contains(id));
    let spec = crate::repo::IndexSpec::parse(&repo.config().index)?;
    let strategy: Box<dyn IndexStrategy> = match spec.name.as_str() {
        "segment" => Box::new(SegmentIndex::new(
            Arc::new(MetaLists(repo.clone())),
            table.clone(),
        )),
        "silo" => Box::new(crate::engine::similarity::SiloStrategy::new(
            repo,
            table.clone(),
            &spec,
        )?),
        "binning" => Box::new(crate::engine::similarity::BinningStrategy::new(
            repo,
            table.clone(),
        )?),
        _ => Box::new(ExactIndex::default()),
    };
    // Stamped containers hold archival data that expires with its owner:
    // new backups must never reference it, so no strategy learns it.
    let idx = match strategy.learns() {
        Learns::Chunks => RepoIndex::load(repo, |m| {
            if m.stamp.is_none() && usable(&m.id) {
                strategy.add_container(table, m)
            }
        })?,
        Learns::Segments => RepoIndex::load_segments(repo, true, |c, segments| {
            if c.stamp.is_none() && usable(&c.id) {
                strategy.add_segments(table, c, segments)
            }
        })?,
        Learns::Containers => {
            let idx = RepoIndex::load_summaries(repo)?;
            for o in &idx.objects {
                for id in &idx.contents[o] {
                    if idx.containers[id].stamp.is_none() && usable(id) {
                        table.intern(*id);
                    }
                }
            }
            idx
        }
    };
    Ok((strategy, idx))
}
