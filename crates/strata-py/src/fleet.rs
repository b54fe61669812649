//! The fleet's per-host stages (strata_store::fleet), run by
//! `python -m strata_fleet.worker` in a process of their own so that each
//! stage's memory is its process's, and a repository lock the job holds.

use crate::errors::{IntoPy, StrataError};
use crate::repo::Repository;
use pyo3::prelude::*;
use std::sync::Mutex;
use strata_store::fleet::{self, args::StageArgs};

/// Runs fleet stage `stage` with `args` (JSON, see
/// `strata_store::fleet::args::StageArgs`); returns its report as JSON.
#[pyfunction]
#[pyo3(signature = (stage, args, repo=None))]
pub fn fleet_stage(
    py: Python<'_>,
    stage: &str,
    args: &str,
    repo: Option<PyRef<'_, Repository>>,
) -> PyResult<String> {
    let a: StageArgs = serde_json::from_str(args)
        .map_err(|e| StrataError::new_err(format!("bad stage arguments: {e}")))?;
    let need = || {
        repo.as_ref()
            .map(|r| r.inner().clone())
            .ok_or_else(|| StrataError::new_err(format!("stage {stage} needs the repository")))
    };
    let v = match stage {
        "validate" => {
            let r = need()?;
            py.detach(|| fleet::update::validate(&r, &a))
        }
        "scan" => {
            let r = need()?;
            py.detach(|| fleet::scan::scan(&r, &a))
        }
        "route" => py.detach(|| fleet::detect::route_requests(&a)),
        "compare" => py.detach(|| fleet::detect::compare(&a)),
        "store" => {
            let r = need()?;
            py.detach(|| fleet::store::store(&r, &a))
        }
        "update" => py.detach(|| fleet::update::update(&a)),
        "mark" => {
            let r = need()?;
            py.detach(|| fleet::sweep::mark(&r, &a))
        }
        "sweep" => py.detach(|| fleet::sweep::sweep(&a)),
        "finish" => {
            let r = need()?;
            py.detach(|| fleet::finish::finish(&r, &a))
        }
        other => return Err(StrataError::new_err(format!("no fleet stage {other:?}"))),
    }
    .py_err()?;
    Ok(v.to_string())
}

/// A repository lock held until `release()` (or the object is dropped);
/// a thread renews its lease meanwhile.
#[pyclass(module = "strata._native")]
pub struct Lock {
    guard: Mutex<Option<strata_store::repo::lock::LockGuard>>,
}

#[pymethods]
impl Lock {
    /// Takes a shared (or, with `exclusive`, an exclusive) lock for
    /// `operation`.
    #[new]
    #[pyo3(signature = (repo, operation, exclusive=false))]
    fn new(
        py: Python<'_>,
        repo: PyRef<'_, Repository>,
        operation: &str,
        exclusive: bool,
    ) -> PyResult<Lock> {
        let r = repo.inner().clone();
        let g = py
            .detach(|| strata_store::repo::lock::acquire(&r, exclusive, operation))
            .py_err()?;
        Ok(Lock {
            guard: Mutex::new(Some(g)),
        })
    }

    /// Releases the lock (again: nothing).
    fn release(&self, py: Python<'_>) {
        let g = self.guard.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(g));
    }
}
