//! The Strata store: a repository and the operations on it, in floors —
//! each imports only from its own floor or below.
//!
//! * ground: [`error`], [`backend`] (the storage backends, re-exported),
//!   [`progress`], [`stages`].
//! * [`repo`] — the repository: its objects and their names, config, key
//!   slots, locks, snapshots, recipes, containers, index objects, linked
//!   containers, lifecycle policies.
//! * [`engine`] — the dedup engine: index strategies, the container
//!   writer, the recipe resolver, chunk copying, random-access reads.
//! * [`ops`] — the operations: backup, restore, forget, gc, compact,
//!   check, repair, stats, diff, copy between repositories.
//! * subsystems: [`revdedup`] (the RevDedup lifecycle: windows, reverse
//!   dedup, cheap deletion), [`tier`] (the cloud tier), [`fleet`] (the
//!   per-host stages of fleet-wide batch dedup).
//! * [`opseq`] — operation sequences with crashes, checked against what
//!   they must leave (the crash-consistency harness of the tests and the
//!   fuzz target).
//!
//! `docs/design.md` tells how they fit together.

pub mod backend;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod ops;
pub mod opseq;
pub mod progress;
pub mod repo;
pub mod revdedup;
pub mod stages;
#[cfg(test)]
mod testutil;
pub mod tier;

pub use backend::{Backend, LocalBackend};
pub use error::{Result, StoreError};
pub use repo::{InitOptions, Repository};
