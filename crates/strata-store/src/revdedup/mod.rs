//! The RevDedup lifecycle (docs/design.md "Lifecycle"; RevDedup §2.4, §2.5):
//! out-of-line reverse deduplication of versions that left the live
//! window, and expiry of versions past retention.
//!
//! New backups are deduplicated inline at segment level only (the
//! `segment` index strategy): they reference whole segments in the shared
//! *pool* and restore fast, but keep the duplicates that segments miss.
//! `maintain` then turns every version that left its series' live window
//! into *archival* form against the next version of the same series:
//!
//! 1. the next version's chunk fingerprints go into a temporary in-memory
//!    table (§2.4.1);
//! 2. each chunk reference of the old version whose fingerprint is in the
//!    table becomes *indirect* (resolved through the next version at
//!    restore); the others stay *direct*, where they are;
//! 3. the new recipe and the snapshot object that points at it are
//!    committed (the atomic switch);
//! 4. the pool is compacted ([`crate::ops::gc::compact`]): chunk locations that no
//!    version references any more are removed — whole containers dropped,
//!    partly dead ones copied forward with their live segments kept whole,
//!    and chunks one archival version alone holds moved into containers
//!    *stamped* with it (§2.4.3, §2.5).
//!
//! Two-level reference management (§2.4.2): a chunk stays in the pool
//! while any retained version of any series references it directly — the
//! paper's direct-reference flag, derived by marking — so converting a
//! version never copies data and never makes the repository grow. Versions
//! of a series expire oldest first and indirect references only point to
//! newer versions, so expiry (§2.5) deletes the owner's stamped containers
//! without scanning anything else; what it referenced in the pool goes at
//! the next compaction.
//!
//! Every step is resumable: a kill before a version's snapshot object is
//! replaced leaves it in live form; a kill during compaction leaves
//! duplicates the next run removes.

mod backup;
mod maintain;

pub use backup::{backup, After, BackedUp};
pub use maintain::{
    after_backup, maintain, AfterBackup, Compact, Converted, MaintainOptions, MaintainReport,
    INCREMENTAL_COMPACT_AT,
};
