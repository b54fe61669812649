//! Made-up snapshots for unit tests.

use strata_core::chunker::ChunkerParams;
use strata_core::format::Snapshot;
use strata_core::id::{RecipeId, SnapshotId};

/// A made-up snapshot id for `series` version `version`: the hex of
/// `series-version`, zero-padded to 64 digits.
pub(crate) fn snapshot_id(series: &str, version: u32) -> SnapshotId {
    SnapshotId::parse(&format!(
        "{:0>64}",
        hex::encode(format!("{series}-{version}"))
    ))
    .unwrap()
}

/// Version `version` of `series`, taken at `time_ns` on host `h`, with
/// no paths, tags or parent (the fields a test cares about are set after).
pub(crate) fn snapshot(series: &str, version: u32, time_ns: i64) -> Snapshot {
    Snapshot {
        series: series.into(),
        version,
        time_ns,
        host: "h".into(),
        paths: vec![],
        tags: vec![],
        recipe: RecipeId::parse(&"0".repeat(64)).unwrap(),
        parent: None,
        chunker: ChunkerParams::cdc(8192),
        stats: Default::default(),
        archival: None,
        tier: Default::default(),
        cloud_part: None,
    }
}
