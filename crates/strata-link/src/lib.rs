//! A volume linked to its repository (`docs/design-linked-snapshots.md`).
//! The store and the volume know nothing of each other; this crate, above
//! both, joins them:
//!
//! * [`volumes`] — a local repository's volumes, through which the store
//!   reads linked containers and releases their holds
//!   ([`strata_store::repo::links::Volumes`]).
//! * [`sink`] — the link sink: a volume's snapshot links the containers it
//!   writes to the volume's blocks ([`strata_store::engine::writer::Linker`]).
//! * [`unlink`] — a volume's linked containers stored again (before it is
//!   deleted or defragmented), and a killed snapshot's leftovers released.

pub mod sink;
pub mod unlink;
pub mod volumes;

pub use sink::{LinkSink, SinkCounts, VolumeLink};
pub use unlink::{sweep_unindexed, unlink_volume, UnlinkReport};
pub use volumes::DirVolumes;
