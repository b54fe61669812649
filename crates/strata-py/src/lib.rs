//! `strata._native`: the Python bindings of Strata (PyO3, abi3).
//!
//! The Python package `strata` (python/strata) wraps this module in typed
//! classes; this layer stays small: it opens repositories, runs the store's
//! operations with the GIL released, and hands reports back as JSON text
//! that the Python layer turns into dataclasses. Like the CLI, the Python
//! layer reads the environment (`STRATA_PASSWORD`, the AWS settings) and
//! passes everything down as arguments: nothing here reads environment
//! variables.

mod backend;
mod errors;
mod fleet;
mod reader;
mod repo;
mod run;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<repo::Repository>()?;
    m.add_class::<reader::FileReader>()?;
    m.add_class::<fleet::Lock>()?;
    m.add_function(wrap_pyfunction!(fleet::fleet_stage, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
