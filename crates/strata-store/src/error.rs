//! Typed errors of the repository layer. Each says which object or path it
//! concerns and, where there is one, what the user can do about it.

use strata_core::CoreError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("object {0} not found in the repository")]
    NotFound(String),
    // The cause is part of the message (and deliberately not a `source`),
    // so that printing the error chain does not repeat it.
    #[error("{op} {name}: {cause}")]
    Io {
        op: &'static str,
        name: String,
        cause: std::io::Error,
    },
    #[error("the disk holding {0} is full: free some space and run the command again (nothing committed was lost)")]
    DiskFull(String),
    #[error("object {name}: {cause}")]
    Corrupt { name: String, cause: CoreError },
    #[error("no repository at {0}: run `strata init` first")]
    NoRepository(String),
    #[error("a repository already exists at {0}")]
    AlreadyExists(String),
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("repository is locked by {holder}: {hint}")]
    Locked { holder: String, hint: String },
    #[error("no snapshot matches {0:?}")]
    NoSnapshot(String),
    #[error("{spec:?} is ambiguous: matches {candidates} ({hint})")]
    AmbiguousSnapshot {
        spec: String,
        candidates: String,
        hint: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("unsafe path {0:?} in the repository: refusing to restore outside the target")]
    UnsafePath(String),
    #[error("chunk {fp} of {path} is missing from the repository (container {container}); run `strata check`")]
    MissingChunk {
        fp: String,
        path: String,
        container: String,
    },
    #[error("broken chain of indirect references from snapshot {snapshot}: {detail}; the versions after it in its series are needed to restore it (run `strata check`)")]
    BrokenChain { snapshot: String, detail: String },
    #[error("operation cancelled")]
    Cancelled,
    #[error(transparent)]
    Backend(strata_backend::BackendError),
}

impl From<strata_backend::BackendError> for StoreError {
    fn from(e: strata_backend::BackendError) -> Self {
        use strata_backend::ErrorKind as K;
        match e.kind {
            K::NotFound => StoreError::NotFound(e.name),
            K::DiskFull => StoreError::DiskFull(e.name),
            // The backend's own reason: a short object and a symbolic
            // link in the repository are different problems.
            K::Corrupt => StoreError::Corrupt {
                name: e.name,
                cause: CoreError::Damaged(e.message),
            },
            _ => StoreError::Backend(e),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// Wraps an I/O error, recognising a full disk.
    pub fn io(op: &'static str, name: impl Into<String>, source: std::io::Error) -> Self {
        let name = name.into();
        if source.raw_os_error() == Some(libc::ENOSPC)
            || source.raw_os_error() == Some(libc::EDQUOT)
        {
            return StoreError::DiskFull(name);
        }
        if source.kind() == std::io::ErrorKind::NotFound && op == "read" {
            return StoreError::NotFound(name);
        }
        StoreError::Io {
            op,
            name,
            cause: source,
        }
    }

    pub fn corrupt(name: impl Into<String>, source: CoreError) -> Self {
        match source {
            CoreError::WrongPassword => StoreError::Core(source),
            cause => StoreError::Corrupt {
                name: name.into(),
                cause,
            },
        }
    }
}
