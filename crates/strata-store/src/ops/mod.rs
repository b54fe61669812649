//! The operations on a repository, above the dedup engine: each its own
//! module, one job each.

pub mod backup;
pub mod check;
pub mod forget;
pub mod gc;
pub mod repair;
pub mod repo_copy;
pub mod restore;
pub mod retention;
pub mod stats;
pub mod treediff;
