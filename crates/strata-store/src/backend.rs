//! Storage backends: the `strata-backend` crate (the trait, local, memory
//! and S3 backends, wrappers, the conformance suite), re-exported.

pub use strata_backend::*;
