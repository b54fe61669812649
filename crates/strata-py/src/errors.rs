//! Python exception classes for the store's typed errors.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use strata_core::CoreError;
use strata_store::StoreError;

create_exception!(
    _native,
    StrataError,
    PyException,
    "Any error Strata reports."
);
create_exception!(
    _native,
    RepositoryNotFound,
    StrataError,
    "No repository at that location (run init first)."
);
create_exception!(
    _native,
    AlreadyExists,
    StrataError,
    "A repository already exists at that location."
);
create_exception!(
    _native,
    WrongPassword,
    StrataError,
    "The password opens none of the repository's key slots."
);
create_exception!(
    _native,
    SnapshotNotFound,
    StrataError,
    "No snapshot matches, or a prefix matches several."
);
create_exception!(
    _native,
    CorruptObject,
    StrataError,
    "An object of the repository is damaged or missing (run `strata check`)."
);
create_exception!(
    _native,
    RepositoryLocked,
    StrataError,
    "Another process holds the repository's lock."
);
create_exception!(
    _native,
    DiskFull,
    StrataError,
    "The disk is full; nothing committed was lost."
);
create_exception!(
    _native,
    UnsafePath,
    StrataError,
    "A path would leave the restore target."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("StrataError", py.get_type::<StrataError>())?;
    m.add("RepositoryNotFound", py.get_type::<RepositoryNotFound>())?;
    m.add("AlreadyExists", py.get_type::<AlreadyExists>())?;
    m.add("WrongPassword", py.get_type::<WrongPassword>())?;
    m.add("SnapshotNotFound", py.get_type::<SnapshotNotFound>())?;
    m.add("CorruptObject", py.get_type::<CorruptObject>())?;
    m.add("RepositoryLocked", py.get_type::<RepositoryLocked>())?;
    m.add("DiskFull", py.get_type::<DiskFull>())?;
    m.add("UnsafePath", py.get_type::<UnsafePath>())?;
    Ok(())
}

/// The Python exception for a store error, its message the store's.
pub fn to_py(e: StoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        StoreError::NoRepository(_) => RepositoryNotFound::new_err(msg),
        StoreError::AlreadyExists(_) => AlreadyExists::new_err(msg),
        StoreError::Core(CoreError::WrongPassword) => WrongPassword::new_err(msg),
        StoreError::NoSnapshot(_) | StoreError::AmbiguousSnapshot { .. } => {
            SnapshotNotFound::new_err(msg)
        }
        StoreError::Corrupt { .. }
        | StoreError::NotFound(_)
        | StoreError::MissingChunk { .. }
        | StoreError::BrokenChain { .. } => CorruptObject::new_err(msg),
        StoreError::Locked { .. } => RepositoryLocked::new_err(msg),
        StoreError::DiskFull(_) => DiskFull::new_err(msg),
        StoreError::UnsafePath(_) => UnsafePath::new_err(msg),
        _ => StrataError::new_err(msg),
    }
}

/// A store result as a Python result.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for strata_store::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
