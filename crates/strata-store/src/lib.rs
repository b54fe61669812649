//! Strata repository layer: backends, containers, index strategies and the
//! operations on a repository — backup, restore, forget, gc, check, stats.
//!
//! Implements DESIGN.md "Principles" (repository is the truth, commit by
//! atomic switch), the container/recipe "Data flow", the `exact` and
//! `segment` index strategies, the RevDedup lifecycle (`revdedup`) and
//! mark-and-sweep GC. See `docs/architecture.md` for the map.

pub mod backend;
pub mod backup;
pub mod check;
pub mod compact;
pub mod container;
pub mod copy;
pub mod error;
pub mod fleet;
pub mod forget;
pub mod fsread;
pub mod gc;
pub mod index;
pub mod keys;
pub mod lifecycle;
pub mod link;
pub mod lock;
pub mod progress;
pub mod recipe;
pub mod repair;
pub mod repo;
pub mod repo_copy;
pub mod resolver;
pub mod restore;
pub mod retention;
pub mod revdedup;
pub mod similarity;
pub mod skeleton;
pub mod snapshots;
pub mod stages;
pub mod stats;
pub mod tier;
pub mod treediff;

pub use backend::{Backend, LocalBackend};
pub use error::{Result, StoreError};
pub use repo::{InitOptions, Repository};
