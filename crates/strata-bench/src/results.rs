//! The rows a run records: one per backup, restore and deletion of each
//! system, and the run's results as saved to `results.json`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackupRow {
    /// Which repetition of the scenario (0-based).
    #[serde(default)]
    pub run: usize,
    pub system: String,
    pub series: String,
    pub version: usize,
    pub logical_bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub stored_bytes_after: u64,
    pub peak_rss_bytes: u64,
    /// Logical bytes of every backup into this repository so far (all
    /// series, this one included).
    #[serde(default)]
    pub cumulative_logical_bytes: u64,
    /// Strata: plaintext bytes of the chunks this backup stored anew (from
    /// its `--json` output), before compression.
    #[serde(default)]
    pub new_raw_bytes: Option<u64>,
    /// Strata: bytes the index strategy held in RAM at the end of this
    /// backup (its own accounting, from `--json`).
    #[serde(default)]
    pub index_ram_bytes: Option<u64>,
    /// `cumulative_logical_bytes / stored_bytes_after`.
    #[serde(default)]
    pub dedup_ratio: f64,
    /// `100 × (1 − stored_bytes_after / cumulative_logical_bytes)`.
    #[serde(default)]
    pub space_saving_pct: f64,
    /// Wall time of the out-of-line maintenance run after this backup
    /// (`strata maintain` for a segment index with the RevDedup lifecycle);
    /// `stored_bytes_after` is measured after it.
    #[serde(default)]
    pub maintain_seconds: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestoreRow {
    /// Which repetition of the scenario (0-based).
    #[serde(default)]
    pub run: usize,
    pub system: String,
    pub series: String,
    pub version: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub peak_rss_bytes: u64,
    pub cache_dropped: bool,
    /// Bytes the restore read from storage (`read_bytes`), baseline included.
    pub storage_read_bytes: u64,
    pub syscall_read_bytes: u64,
    /// Bytes read through syscalls (`rchar`) per byte restored.
    pub read_per_byte: f64,
    /// Storage reads of a trivial run of the same program after a cache
    /// drop (loading the program), subtracted from `storage_read_bytes`.
    #[serde(default)]
    pub baseline_read_bytes: u64,
    /// (`storage_read_bytes` − baseline) per byte restored; `None` when the
    /// page cache could not be dropped (storage reads then mean nothing).
    #[serde(default)]
    pub storage_read_per_byte: Option<f64>,
    pub containers_read: Option<u64>,
    pub regions_read: Option<u64>,
    /// Destor's speed factor: MB restored per container read.
    pub mb_per_container: Option<f64>,
    pub verified: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeleteRow {
    /// Which repetition of the scenario (0-based).
    #[serde(default)]
    pub run: usize,
    pub system: String,
    pub what: String,
    pub versions: usize,
    pub seconds: f64,
    pub stored_bytes_after: u64,
}

/// Storage reads of a trivial run of a system's program after a page-cache
/// drop (see [`crate::systems::System::baseline_command`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BaselineRow {
    pub run: usize,
    pub system: String,
    pub cache_dropped: bool,
    pub storage_read_bytes: u64,
    pub syscall_read_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResults {
    pub scenario: String,
    pub workload: String,
    pub systems: Vec<(String, String)>,
    pub skipped: Vec<String>,
    pub machine: String,
    pub cache_drop_permitted: bool,
    pub backups: Vec<BackupRow>,
    pub restores: Vec<RestoreRow>,
    pub deletes: Vec<DeleteRow>,
    #[serde(default)]
    pub baselines: Vec<BaselineRow>,
    /// The machine's limits from a quick `limits` pass at the start of the
    /// run (`None` with `--no-limits`).
    #[serde(default)]
    pub limits: Option<crate::limits::Limits>,
    /// Why no deletions were measured, if they were not.
    #[serde(default)]
    pub deletes_skipped: Option<String>,
}
