//! `Repository`: open or create one, back up, list, restore, read files,
//! stats. Reports cross to Python as JSON text (python/strata turns them
//! into dataclasses).

use crate::backend::{self, S3Settings};
use crate::errors::{IntoPy, StrataError};
use crate::reader::{FileReader, PyStream};
use crate::run::detached;
use pyo3::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use strata_core::chunker::ChunkerParams;
use strata_core::crypto::KdfCost;
use strata_core::format::{Snapshot, Tier};
use strata_store::ops::backup::{BackupOptions, StdinSource};
use strata_store::ops::restore::{Overwrite, RestoreOptions};
use strata_store::progress::Progress;
use strata_store::{InitOptions, StoreError};

/// An open repository (thread-safe; share it between threads freely).
#[pyclass(frozen, module = "strata._native")]
pub struct Repository {
    repo: strata_store::Repository,
    s3: S3Settings,
}

fn s3_settings(s3: Option<Vec<(String, String)>>) -> PyResult<S3Settings> {
    let mut out = S3Settings::default();
    for (k, v) in s3.unwrap_or_default() {
        let v = Some(v).filter(|v| !v.is_empty());
        match k.as_str() {
            "endpoint" => out.endpoint = v,
            "region" => out.region = v,
            "access_key_id" => out.access_key_id = v,
            "secret_access_key" => out.secret_access_key = v,
            "session_token" => out.session_token = v,
            other => {
                return Err(StrataError::new_err(format!(
                    "unknown S3 setting {other:?}"
                )))
            }
        }
    }
    Ok(out)
}

/// A snapshot as JSON (what `snapshots()` lists).
pub fn snapshot_json(id: &str, s: &Snapshot) -> serde_json::Value {
    json!({"id": id, "series": s.series, "version": s.version, "time_ns": s.time_ns,
           "host": s.host, "paths": s.paths, "tags": s.tags, "parent": s.parent,
           "tier": match s.tier { Tier::Active => "active", Tier::Cloud => "cloud" },
           "archival": s.archival.is_some(), "files": s.stats.files, "dirs": s.stats.dirs,
           "logical_bytes": s.stats.logical_bytes, "new_raw_bytes": s.stats.new_raw_bytes,
           "new_stored_bytes": s.stats.new_stored_bytes})
}

impl Repository {
    /// The repository and its cloud tier (opened with this repository's
    /// S3 settings on first use).
    fn tiers(&self) -> strata_store::tier::Tiers {
        let s3 = self.s3.clone();
        let open = move |url: &str| {
            backend::open(url, &s3, false).map_err(|e| StoreError::Invalid(e.to_string()))
        };
        strata_store::tier::Tiers::new(&self.repo, Arc::new(open))
    }

    /// The repositories holding `s`'s data, with the snapshot (or part of
    /// it) each holds: the cloud tier's part first, as the CLI restores.
    fn sources(&self, s: &Snapshot) -> PyResult<Vec<(strata_store::Repository, Snapshot)>> {
        self.tiers().sources(s).py_err()
    }

    pub fn inner(&self) -> &strata_store::Repository {
        &self.repo
    }
}

#[pymethods]
impl Repository {
    /// Opens the repository at `url` (a directory or s3://BUCKET/PREFIX).
    #[staticmethod]
    #[pyo3(signature = (url, password=None, cache_dir=None, s3=None))]
    fn open(
        py: Python<'_>,
        url: &str,
        password: Option<Vec<u8>>,
        cache_dir: Option<PathBuf>,
        s3: Option<Vec<(String, String)>>,
    ) -> PyResult<Repository> {
        let s3 = s3_settings(s3)?;
        let b = backend::open(url, &s3, false)?;
        let repo = py
            .detach(|| {
                strata_store::Repository::open(b, &|| {
                    password.clone().ok_or_else(|| {
                        StoreError::Invalid(
                            "the repository is encrypted: give its password (password=, or $STRATA_PASSWORD)"
                                .into(),
                        )
                    })
                })
            })
            .py_err()?
            .with_cache(cache_dir)
            .with_volumes(strata_link::DirVolumes::of(&backend::location(url)?));
        Ok(Repository { repo, s3 })
    }

    /// Creates a repository at `url` and opens it.
    #[staticmethod]
    #[pyo3(signature = (url, password=None, index="segment".to_string(), chunk_size=8192,
                        kdf_memory_kib=None, kdf_iterations=None, cache_dir=None, s3=None))]
    #[allow(clippy::too_many_arguments)]
    fn init(
        py: Python<'_>,
        url: &str,
        password: Option<Vec<u8>>,
        index: String,
        chunk_size: u32,
        kdf_memory_kib: Option<u32>,
        kdf_iterations: Option<u32>,
        cache_dir: Option<PathBuf>,
        s3: Option<Vec<(String, String)>>,
    ) -> PyResult<Repository> {
        let s3 = s3_settings(s3)?;
        let mut opts =
            InitOptions::with_defaults(index, chunk_size, None, 3, None, password).py_err()?;
        let d = KdfCost::default();
        opts.kdf = KdfCost {
            memory_kib: kdf_memory_kib.unwrap_or(d.memory_kib),
            iterations: kdf_iterations.unwrap_or(d.iterations),
        }
        .validate()
        .map_err(|e| StrataError::new_err(e.to_string()))?;
        let b = backend::open(url, &s3, true)?;
        let repo = py
            .detach(|| strata_store::Repository::init(b, opts))
            .py_err()?
            .with_cache(cache_dir)
            .with_volumes(strata_link::DirVolumes::of(&backend::location(url)?));
        Ok(Repository { repo, s3 })
    }

    /// The repository's id.
    #[getter]
    fn id(&self) -> String {
        self.repo.config().id.clone()
    }

    /// Backs up `paths` (files and directories) or, with `stream`, one
    /// file read from a Python object with a `read(n)` method. Returns the
    /// report as JSON.
    #[pyo3(signature = (paths, series=None, tags=Vec::new(), chunker=None, threads=None,
                        excludes=Vec::new(), stream=None, stream_name="stdin".to_string(),
                        lifecycle=true))]
    #[allow(clippy::too_many_arguments)]
    fn backup(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        series: Option<String>,
        tags: Vec<String>,
        chunker: Option<String>,
        threads: Option<usize>,
        excludes: Vec<String>,
        stream: Option<Py<PyAny>>,
        stream_name: String,
        lifecycle: bool,
    ) -> PyResult<String> {
        let chunker = match chunker.as_deref() {
            None => None,
            Some("fixed") => Some(ChunkerParams::fixed()),
            Some("cdc") => Some(self.repo.config().chunker),
            Some(o) => {
                return Err(StrataError::new_err(format!(
                    "unknown chunker {o:?}: \"cdc\" or \"fixed\""
                )))
            }
        };
        if paths.is_empty() && stream.is_none() {
            return Err(StrataError::new_err(
                "nothing to back up: give paths or a stream",
            ));
        }
        let progress = Arc::new(Progress::default());
        let mut opts = BackupOptions {
            paths,
            series,
            tags,
            chunker,
            excludes,
            progress: progress.clone(),
            ..Default::default()
        };
        if let Some(t) = threads {
            opts.threads = t.max(1);
        }
        if let Some(obj) = stream {
            opts.stdin = Some(StdinSource {
                reader: Box::new(PyStream::new(obj)),
                name: stream_name,
            });
        }
        let repo = self.repo.clone();
        let after = match lifecycle {
            true => strata_store::revdedup::After::Lifecycle,
            false => strata_store::revdedup::After::Nothing,
        };
        let rep = detached(py, progress, move || {
            strata_store::revdedup::backup(&repo, opts, after, &mut |_| {}).map(|b| b.report)
        })?;
        let s = &rep.snapshot;
        let mut v = snapshot_json(&rep.id, s);
        v["read_bytes"] = s.stats.read_bytes.into();
        v["new_chunks"] = s.stats.new_chunks.into();
        v["seconds"] = (s.stats.duration_ms as f64 / 1000.0).into();
        v["warnings"] = json!(rep.warnings);
        v["reused_files"] = rep.reused_files.into();
        Ok(v.to_string())
    }

    /// Every snapshot, oldest first, as a JSON list.
    fn snapshots(&self, py: Python<'_>) -> PyResult<String> {
        let list = py.detach(|| self.repo.list_snapshots()).py_err()?;
        let v: Vec<_> = list.iter().map(|(id, s)| snapshot_json(id, s)).collect();
        Ok(serde_json::Value::from(v).to_string())
    }

    /// The snapshot `spec` names (id or prefix, `latest`, SERIES@VERSION,
    /// SERIES@latest) as JSON.
    fn snapshot(&self, py: Python<'_>, spec: &str) -> PyResult<String> {
        let (id, s) = py.detach(|| self.repo.resolve_snapshot(spec)).py_err()?;
        Ok(snapshot_json(&id, &s).to_string())
    }

    /// Restores snapshot `spec` into `target` (only `include` paths and
    /// what is below them, if given). Returns the report as JSON.
    #[pyo3(signature = (spec, target, include=Vec::new(), exclude=Vec::new(), overwrite="always"))]
    fn restore(
        &self,
        py: Python<'_>,
        spec: &str,
        target: PathBuf,
        include: Vec<String>,
        exclude: Vec<String>,
        overwrite: &str,
    ) -> PyResult<String> {
        let (id, s) = py.detach(|| self.repo.resolve_snapshot(spec)).py_err()?;
        let mut opts = RestoreOptions::new(&target);
        let bytes = |v: Vec<String>| -> Vec<Vec<u8>> {
            v.into_iter()
                .map(|p| p.trim_start_matches('/').as_bytes().to_vec())
                .collect()
        };
        opts.include = bytes(include);
        opts.exclude = bytes(exclude);
        opts.overwrite = match overwrite {
            "always" => Overwrite::Always,
            "if-changed" => Overwrite::IfChanged,
            "if-newer" => Overwrite::IfNewer,
            "never" => Overwrite::Never,
            o => {
                return Err(StrataError::new_err(format!(
                    "overwrite={o:?}: \"always\", \"if-changed\", \"if-newer\" or \"never\""
                )))
            }
        };
        let progress = Arc::new(Progress::default());
        opts.progress = progress.clone();
        let tiers = self.tiers();
        let rep = detached(py, progress, move || tiers.restore(&s, &mut opts, None))?;
        let mut v = serde_json::to_value(&rep).map_err(|e| StrataError::new_err(e.to_string()))?;
        v["snapshot"] = id.to_string().into();
        v["target"] = target.display().to_string().into();
        Ok(v.to_string())
    }

    /// A reader of the file `path` of snapshot `spec`.
    fn open_file(&self, py: Python<'_>, spec: &str, path: &str) -> PyResult<FileReader> {
        py.detach(|| {
            let (_, sources) = self.snapshot_sources(spec)?;
            FileReader::open(&self.repo, sources, spec, path)
        })
    }

    /// Removes the snapshots `specs` name (ids, prefixes, SERIES@VERSION);
    /// what only they held is freed by the next `gc`. Returns the report
    /// as JSON.
    fn forget(&self, py: Python<'_>, specs: Vec<String>) -> PyResult<String> {
        let repo = self.repo.clone();
        let ids = py
            .detach(|| {
                specs
                    .iter()
                    .map(|s| repo.resolve_snapshot(s).map(|(id, _)| id.to_string()))
                    .collect::<strata_store::Result<Vec<_>>>()
            })
            .py_err()?;
        let rep = py
            .detach(|| strata_store::ops::forget::forget(&repo, &ids))
            .py_err()?;
        serde_json::to_string(&rep).map_err(|e| StrataError::new_err(e.to_string()))
    }

    /// Mark-and-sweep garbage collection: containers with more than
    /// `threshold` of dead bytes are rewritten, dead ones deleted. Returns
    /// the report as JSON.
    #[pyo3(signature = (threshold=0.2))]
    fn gc(&self, py: Python<'_>, threshold: f64) -> PyResult<String> {
        let progress = Arc::new(Progress::default());
        let opts = strata_store::ops::gc::GcOptions {
            threshold,
            progress: progress.clone(),
            ..Default::default()
        };
        let repo = self.repo.clone();
        let rep = detached(py, progress, move || {
            strata_store::ops::gc::gc(&repo, &opts)
        })?;
        serde_json::to_string(&rep).map_err(|e| StrataError::new_err(e.to_string()))
    }

    /// The repository's figures as JSON (`unique_bytes`: plaintext bytes
    /// stored once).
    fn stats(&self, py: Python<'_>) -> PyResult<String> {
        let st = py
            .detach(|| strata_store::ops::stats::stats(&self.repo))
            .py_err()?;
        let mut v = serde_json::to_value(&st).map_err(|e| StrataError::new_err(e.to_string()))?;
        v["unique_bytes"] = st.unique_raw_bytes.into();
        Ok(v.to_string())
    }
}

impl Repository {
    /// For the reader: the snapshot's sources.
    fn snapshot_sources(
        &self,
        spec: &str,
    ) -> PyResult<(String, Vec<(strata_store::Repository, Snapshot)>)> {
        let (id, s) = self.repo.resolve_snapshot(spec).py_err()?;
        Ok((id.to_string(), self.sources(&s)?))
    }
}
