//! What gc is asked to do, and what it did (shared by the sweep and the
//! pool compaction).

use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Containers with more than this fraction of dead bytes are rewritten.
    pub threshold: f64,
    /// Containers with more than this fraction of bytes that are dead or
    /// held by one archival version alone are rewritten too, moving those
    /// chunks into the version's stamped containers (1.0, gc's default:
    /// never; `maintain` separates by default).
    pub separate: f64,
    pub dry_run: bool,
    pub progress: Arc<crate::progress::Progress>,
    /// Compaction of these containers alone, each copied forward whatever
    /// its fill (`volume unlink`: containers stored uncompressed come
    /// back compressed); None: the whole pool by the thresholds.
    pub only: Option<std::collections::HashSet<strata_core::format::ContainerId>>,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            threshold: 0.2,
            separate: 1.0,
            dry_run: false,
            progress: Arc::new(Default::default()),
            only: None,
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct GcReport {
    /// Chunk locations referenced directly by some snapshot.
    pub live_chunks: u64,
    pub containers_before: u64,
    pub containers_deleted: u64,
    pub containers_rewritten: u64,
    /// Of those rewritten, small containers merged into fuller ones.
    pub containers_merged: u64,
    pub containers_written: u64,
    /// Plaintext bytes moved into stamped containers (held by one archival
    /// version alone).
    pub bytes_separated: u64,
    /// Stamped containers whose owner is gone or never committed.
    pub stamped_deleted: u64,
    /// Recipes rewritten to point at copied-forward chunks.
    pub recipes_remapped: u64,
    /// Pool containers kept where they are because they hold the base of
    /// a live delta (a base never moves: its deltas name where it is).
    pub containers_pinned: u64,
    pub orphans_deleted: u64,
    /// Recipe objects no snapshot uses, deleted.
    pub recipes_deleted: u64,
    /// Recipe parts no recipe uses, deleted.
    pub parts_deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub bytes_freed: u64,
    /// Temporary files writers killed half-way left (older than
    /// [`TEMPORARY_AGE`]), deleted, and their bytes.
    pub temporaries_deleted: u64,
    pub temporary_bytes_deleted: u64,
    pub dry_run: bool,
}

/// How old a temporary file must be for gc to take it for a killed
/// writer's (gc holds the exclusive lock: no writer is at work, but a
/// clock may be off).
pub const TEMPORARY_AGE: std::time::Duration = std::time::Duration::from_secs(600);
