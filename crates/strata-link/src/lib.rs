//! A volume linked to its repository (`docs/design-linked-snapshots.md`).
//! The store and the volume know nothing of each other; this crate, above
//! both, joins them:
//!
//! * [`volumes`] — a local repository's volumes, through which the store
//!   reads linked containers and releases their holds
//!   ([`strata_store::repo::links::Volumes`]).
//! * [`sink`] — the link sink: a volume's snapshot links the containers it
//!   writes to the volume's blocks ([`strata_store::engine::writer::Linker`]).
//! * [`snapshot`] — a volume's snapshot into its repository; [`leftovers`]
//!   — what killed snapshots left linked, released by the next one.
//! * [`unlink`], [`delete`] — a volume's linked containers stored again,
//!   before it is deleted or defragmented.
//! * [`at`] — a stored version of a volume as a read-only block device.
//! * [`dir`] — a repository's volumes directory; [`keys`] — an encrypted
//!   volume's key, and the repository as volume operations reach it;
//!   [`manage`] — create, copy, check, defrag.

pub mod at;
pub mod delete;
pub mod dir;
pub mod error;
pub mod keys;
pub mod leftovers;
pub mod manage;
pub mod sink;
pub mod snapshot;
pub mod unlink;
pub mod volumes;

pub use dir::VolumesDir;
pub use error::{LinkError, Result};
pub use keys::RepoAccess;
pub use sink::{LinkSink, SinkCounts, VolumeLink};
pub use unlink::{sweep_unindexed, unlink_volume, UnlinkReport};
pub use volumes::DirVolumes;
