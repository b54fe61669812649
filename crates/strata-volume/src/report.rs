//! `strata volume stats`: the figures of §5 for one volume, from its
//! files (counters, reference counts) and from what the serving process
//! last wrote (`live.json`: latency, cache, fragmentation).

use crate::config::{VolumeConfig, BLOCK};
use crate::error::VolumeError;
use crate::idedup::NODE_BYTES;
use crate::mutex::lock;
use crate::state::Volume;
use crate::stats::Histogram;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a serving volume reports about itself (`live.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Live {
    pub threshold_used: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_p50_us: Option<f64>,
    pub read_p99_us: Option<f64>,
    pub write_p50_us: Option<f64>,
    pub write_p99_us: Option<f64>,
    pub cache_capacity_blocks: u64,
    pub cache_blocks: u64,
    pub cache_memory_bytes: u64,
    pub cache_lookups: u64,
    pub cache_hits: u64,
    pub cache_evictions: u64,
    /// Block-map entries held in memory until a checkpoint syncs their
    /// data (about 40 bytes each; a checkpoint comes at 512 Ki of them).
    #[serde(default)]
    pub pending_map_entries: u64,
    /// Readahead around reads that miss the page cache: the cluster size
    /// now (disk blocks), and the blocks asked for beside such reads and
    /// of those read later.
    #[serde(default)]
    pub readahead_cluster_blocks: u64,
    #[serde(default)]
    pub readahead_blocks_asked: u64,
    #[serde(default)]
    pub readahead_blocks_used: u64,
    /// How a read that misses the page cache is told: `cachestat`,
    /// `read-nowait` (older kernels, or under a seccomp filter) or `off`
    /// (no clusters); empty in files of older builds.
    #[serde(default)]
    pub readahead_miss_probe: String,
    /// Bytes the buffered writes need on a disk that lacks them: writes
    /// of data are refused (ENOSPC) until space is freed; 0 when not.
    #[serde(default)]
    pub waiting_for_space_bytes: u64,
    /// Physical runs per read: counts by runs (last bucket ≥ 64).
    pub fragmentation: Histogram,
    /// Blocks per read request (last bucket ≥ 256).
    pub read_sizes: Histogram,
}

#[derive(Clone, Debug, Serialize)]
pub struct VolumeReport {
    pub name: String,
    pub size: u64,
    pub threshold: String,
    pub threshold_used: u64,
    pub cache_bytes: u64,
    pub dedup: bool,
    /// Its blocks, journal and fingerprints encrypted (XTS-AES-256).
    pub encrypted: bool,
    /// Logical blocks written / physical blocks written (destaged).
    pub dedup_ratio: f64,
    pub logical_blocks_written: u64,
    pub physical_blocks_written: u64,
    pub deduplicated_blocks: u64,
    pub duplicates_below_threshold: u64,
    /// Disk blocks referenced now, and the data file's blocks (in use + free).
    pub physical_blocks_in_use: u64,
    pub data_file_blocks: u64,
    /// Bytes the data file takes on the host's disk (freed blocks are
    /// holes: the volume is thin).
    pub data_file_allocated_bytes: u64,
    /// Duplicate sequence lengths deduplicated: [length, count] (last ≥ 64).
    pub sequence_lengths: Vec<(usize, u64)>,
    /// Reads by physical runs touched: [runs, cumulative fraction].
    pub fragmentation_cdf: Vec<(usize, f64)>,
    pub cache_hit_rate: Option<f64>,
    #[serde(flatten)]
    pub live: Live,
}

impl Volume {
    /// Writes `live.json` (done after every destage and at close).
    pub(crate) fn save_live(&self) -> Result<(), VolumeError> {
        let l = &self.live;
        let cluster = self.readahead.cluster_figures();
        let d = lock(&self.disk);
        let live = Live {
            threshold_used: l.threshold_used.load(std::sync::atomic::Ordering::Relaxed),
            reads: l.read_latency.count(),
            writes: l.write_latency.count(),
            read_p50_us: l.read_latency.percentile(50.0),
            read_p99_us: l.read_latency.percentile(99.0),
            write_p50_us: l.write_latency.percentile(50.0),
            write_p99_us: l.write_latency.percentile(99.0),
            cache_capacity_blocks: d.cache.capacity() as u64,
            cache_blocks: d.cache.len() as u64,
            cache_memory_bytes: d.cache.memory_bytes(),
            cache_lookups: d.cache.lookups,
            cache_hits: d.cache.hits,
            cache_evictions: d.cache.evictions,
            pending_map_entries: self.map.pending() as u64,
            readahead_cluster_blocks: cluster.0,
            readahead_blocks_asked: cluster.1,
            readahead_blocks_used: cluster.2,
            readahead_miss_probe: self.readahead.probe_name().to_string(),
            waiting_for_space_bytes: l
                .waiting_for_space
                .load(std::sync::atomic::Ordering::Relaxed),
            fragmentation: lock(&l.fragmentation).clone(),
            read_sizes: lock(&l.read_sizes).clone(),
        };
        drop(d);
        let _one = lock(&l.saving);
        crate::files::write_json_in_place(&self.dir.join("live.json"), &live, 0)
    }
}

/// Makes `live.json` in `dir` a file that can be written over in place
/// (see `volume::write_json_in_place`), keeping what it says.
pub(crate) fn reserve_live(dir: &Path) -> Result<(), VolumeError> {
    let p = dir.join("live.json");
    let live: Live = crate::files::read_json_shared(&p).unwrap_or_default();
    crate::files::write_json_in_place(&p, &live, crate::files::LIVE_RESERVE)
}

/// The report of the volume in `dir` (served or not).
pub fn report(dir: &Path, name: &str) -> Result<VolumeReport, VolumeError> {
    let cfg: VolumeConfig = Volume::config(dir)?;
    let state = crate::config::read_state(dir)?;
    let live: Live = crate::files::read_json_shared(&dir.join("live.json")).unwrap_or_default();
    let c = state.counters;
    let refs = std::fs::read(dir.join("refs")).map_err(|e| VolumeError::Io("refs".into(), e))?;
    let in_use = refs
        .chunks_exact(4)
        .filter(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]) != 0)
        .count() as u64;
    let (data_len, allocated) = std::fs::metadata(dir.join("data"))
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.len(), m.blocks() * 512)
        })
        .unwrap_or((0, 0));
    let cdf = live.fragmentation.cdf();
    let fragmentation_cdf = if live.fragmentation.total() == 0 {
        Vec::new()
    } else {
        cdf.iter()
            .enumerate()
            .skip(1)
            .take_while(|(i, &f)| *i == 1 || cdf[i - 1] < 1.0 || f < 1.0)
            .map(|(i, &f)| (i, f))
            .collect()
    };
    Ok(VolumeReport {
        name: name.to_string(),
        size: cfg.size,
        threshold: match cfg.threshold {
            crate::config::Threshold::Fixed(n) => n.to_string(),
            crate::config::Threshold::Auto => "auto".into(),
        },
        threshold_used: live.threshold_used,
        cache_bytes: cfg.cache_bytes,
        dedup: cfg.dedup,
        encrypted: cfg.encryption.is_some(),
        dedup_ratio: if c.physical_blocks_written == 0 {
            1.0
        } else {
            c.logical_blocks_written as f64 / c.physical_blocks_written as f64
        },
        logical_blocks_written: c.logical_blocks_written,
        physical_blocks_written: c.physical_blocks_written,
        deduplicated_blocks: c.deduplicated_blocks,
        duplicates_below_threshold: c.duplicates_below_threshold,
        physical_blocks_in_use: in_use,
        data_file_blocks: data_len / BLOCK as u64,
        data_file_allocated_bytes: allocated,
        sequence_lengths: c
            .sequence_lengths
            .counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(l, &n)| (l, n))
            .collect(),
        fragmentation_cdf,
        cache_hit_rate: (live.cache_lookups > 0)
            .then(|| live.cache_hits as f64 / live.cache_lookups as f64),
        live,
    })
}

/// Bytes of cache one block of metadata costs (for `--cache` sizing).
pub fn cache_bytes_per_block() -> usize {
    NODE_BYTES
}
