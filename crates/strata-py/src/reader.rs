//! Streams between Python and the store: a Python file-like object read
//! by a backup ([`PyStream`]), and random access to a file of a snapshot
//! ([`FileReader`], which python/strata wraps in an `io.RawIOBase`).

use crate::errors::IntoPy;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::io::Read;
use std::sync::Arc;
use strata_core::format::Snapshot;
use strata_store::engine::fsread::{open_stored, RegionCache, DEFAULT_REGION_CACHE_BYTES};

/// A Python object with `read(n) -> bytes`, read by the store's backup
/// thread (which takes the GIL for each read).
pub struct PyStream {
    obj: Py<PyAny>,
}

impl PyStream {
    pub fn new(obj: Py<PyAny>) -> Self {
        PyStream { obj }
    }
}

impl Read for PyStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Python::attach(|py| {
            let chunk = self
                .obj
                .call_method1(py, "read", (buf.len(),))
                .map_err(|e| std::io::Error::other(format!("the stream's read() failed: {e}")))?;
            let chunk = chunk.bind(py);
            if chunk.is_none() {
                return Ok(0);
            }
            let bytes = chunk
                .cast::<PyBytes>()
                .map_err(|_| std::io::Error::other("the stream's read() must return bytes"))?;
            let b = bytes.as_bytes();
            if b.len() > buf.len() {
                return Err(std::io::Error::other(
                    "the stream's read(n) returned more than n bytes",
                ));
            }
            buf[..b.len()].copy_from_slice(b);
            Ok(b.len())
        })
    }
}

/// Random access to one file of a snapshot.
#[pyclass(frozen, module = "strata._native")]
pub struct FileReader {
    inner: strata_store::engine::fsread::FileReader,
    size: u64,
}

impl FileReader {
    /// The reader of `path` in snapshot `spec` of `repo` (a hard link
    /// reads its first name's content), its data in `sources` (the cloud
    /// tier's part first, as restore reads them).
    pub fn open(
        repo: &strata_store::Repository,
        sources: Vec<(strata_store::Repository, Snapshot)>,
        spec: &str,
        path: &str,
    ) -> PyResult<FileReader> {
        let want = path.trim_start_matches('/').as_bytes();
        // The active part first, then the cloud part (where moved files are).
        for (data, part) in sources.into_iter().rev() {
            // (64 MiB of decoded regions, as `strata mount` keeps; the
            // recipe read a part at a time, only the file's chunks kept.)
            let cache = Arc::new(RegionCache::new(DEFAULT_REGION_CACHE_BYTES));
            let found = open_stored(repo, &data, &part, &part.recipe, want, cache);
            if let Some(inner) = found.py_err()? {
                let size = inner.size();
                return Ok(FileReader { inner, size });
            }
        }
        Err(crate::errors::SnapshotNotFound::new_err(format!(
            "no file {path} in snapshot {spec}"
        )))
    }
}

#[pymethods]
impl FileReader {
    /// The file's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The file's path in the snapshot.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string()
    }

    /// Up to `length` bytes from `offset` (fewer at the end of the file).
    fn read_at<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let data = py.detach(|| self.inner.read_at(offset, length)).py_err()?;
        Ok(PyBytes::new(py, &data))
    }
}
