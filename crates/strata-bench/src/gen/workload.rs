//! What every tree workload is: its options and the [`Workload`] trait.

use std::io;
use std::path::{Path, PathBuf};

/// Options shared by the generators.
#[derive(Clone, Debug)]
pub struct GenOptions {
    pub seed: u64,
    /// Size factor relative to the paper's dataset (1.0 = paper size).
    pub scale: f64,
    /// Named preset (e.g. SG1..SG5, GP for `sg`).
    pub preset: Option<String>,
    /// Number of versions (backups) to produce; `None` = the preset's.
    pub versions: Option<usize>,
    /// Start from real files in this directory instead of generated ones.
    pub base: Option<PathBuf>,
    /// Parallel streams / series where the workload has them.
    pub streams: Option<usize>,
    /// `sg` only: every version is one disk image of the tree
    /// ([`image`]) instead of the tree itself.
    pub image: bool,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            seed: 1,
            scale: 0.01,
            preset: None,
            versions: None,
            base: None,
            streams: None,
            image: false,
        }
    }
}

/// A backup workload: one or more series, each a directory that is brought
/// from version to version *in place* (as a real system changes between
/// backups).
pub trait Workload: Send {
    /// Short description for reports (kind, preset, sizes).
    fn describe(&self) -> String;
    /// Names of the series; each version produces one backup per series.
    fn series(&self) -> Vec<String>;
    /// Number of versions.
    fn versions(&self) -> usize;
    /// Brings `dir` to the state of `version` (0-based) of `series`. Called
    /// for versions 0, 1, 2, … in order on the same directory.
    fn advance(&mut self, series: usize, version: usize, dir: &Path) -> io::Result<()>;
}

/// Rejects a preset for workloads that have none.
pub(crate) fn no_preset(kind: &str, opts: &GenOptions) -> anyhow::Result<()> {
    if let Some(p) = &opts.preset {
        anyhow::bail!("workload {kind} has no presets (got {p:?})");
    }
    Ok(())
}
