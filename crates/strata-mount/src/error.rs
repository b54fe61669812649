//! The errors of a mount.

use strata_store::StoreError;

/// Errors of a mount.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = MountError> = std::result::Result<T, E>;
