//! The side-by-side runner: one workload through several systems in the
//! same run, interleaved, measuring what the papers measure.
//!
//! For each version the workload advances every series in place, the tree
//! digest is recorded, and each system backs it up — the order of systems
//! rotates every version (A B C, B C A, …) so that drift in the machine's
//! load spreads evenly. Afterwards every selected version is restored by
//! every system, oldest first, with the page cache dropped before each
//! restore where permitted, and verified against the recorded digest (a
//! mismatch fails the run). Finally the oldest version is deleted, then
//! half of the rest, and the time each system takes is recorded.
//!
//! Deletion with several series (GP, ddgen streams): "oldest" deletes
//! version 1 of *every* series in one deletion (one command per system —
//! for borg one `delete` per archive, then one `compact`), timed as a
//! whole; "half" then deletes the even versions 2, 4, … of every series the
//! same way, leaving versions 3, 5, …. The row records how many versions
//! (series × versions) each deletion removed. With fewer than 3 versions
//! per series there is nothing sensible to delete in two steps, so the
//! deletions are skipped and the summary says so.

use crate::chart::line_chart;
use crate::gen::{self, tree_digest, GenOptions};
use crate::measure::{drop_caches, tree_bytes};
use crate::systems::System;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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

pub struct RunOptions {
    pub scenario: String,
    pub gen: GenOptions,
    pub work: PathBuf,
    pub out: PathBuf,
    /// Restore every k-th version (and always the first and the last).
    pub restore_every: usize,
    /// Restore only the first series (large GP-style runs).
    pub restore_first_series_only: bool,
    pub deletes: bool,
    /// Run the whole scenario this many times; summaries take medians.
    pub repeat: usize,
    /// Measure the machine's limits with these sizes before the first run
    /// (`None`: don't).
    pub limits: Option<crate::limits::Sizes>,
}

/// A whole-number field of a command's `--json` output.
fn json_u64(stdout: &str, field: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(stdout)
        .ok()
        .and_then(|v| v[field].as_u64())
}

fn mb(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-6)
}

/// Fills the cumulative figures of backup rows (in the order the backups
/// ran): per repetition and system, the logical bytes backed up so far and
/// the dedup ratio and space saving against the stored bytes after each
/// backup. Idempotent, so `report` can fill rows saved without them.
pub fn fill_cumulative(rows: &mut [BackupRow]) {
    let mut acc: std::collections::HashMap<(usize, String), u64> = Default::default();
    for r in rows {
        let c = acc.entry((r.run, r.system.clone())).or_default();
        *c += r.logical_bytes;
        r.cumulative_logical_bytes = *c;
        r.dedup_ratio = *c as f64 / r.stored_bytes_after.max(1) as f64;
        r.space_saving_pct = 100.0 * (1.0 - r.stored_bytes_after as f64 / (*c).max(1) as f64);
    }
}

/// Bytes read from storage per byte restored, net of `baseline` (what
/// loading the program reads from a cold cache). `None` unless both the
/// restore and the baseline ran after a page-cache drop: with a warm cache
/// `read_bytes` says nothing about the repository's layout.
pub fn storage_read_per_byte(
    storage_read_bytes: u64,
    baseline: Option<u64>,
    bytes_restored: u64,
    cache_dropped: bool,
) -> Option<f64> {
    let base = baseline?;
    cache_dropped
        .then(|| storage_read_bytes.saturating_sub(base) as f64 / bytes_restored.max(1) as f64)
}

pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|k| k.parse::<u64>().ok())
        .map(|k| k / 1024 / 1024)
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {mem} GiB RAM, Linux {}", kernel.trim())
}

/// Runs a scenario and writes results, charts and a summary to `opts.out`.
pub fn run(
    opts: &RunOptions,
    systems: &mut [Box<dyn System>],
    skipped: Vec<String>,
) -> Result<RunResults> {
    let limits = if let Some(sizes) = opts.limits {
        eprintln!("measuring machine limits (quick pass; --no-limits skips it)");
        let l =
            crate::limits::measure_sized(&opts.work, sizes).context("measuring machine limits")?;
        eprintln!(
            "limits: FastCDC {:.0} MB/s, BLAKE3 {:.0} MB/s, zstd -3 {:.0} MB/s, disk write {:.0} MB/s, read {:.0} MB/s",
            l.fastcdc_mb_s, l.blake3_8k_mb_s, l.zstd3_mb_s, l.disk_write_mb_s, l.disk_read_mb_s
        );
        Some(l)
    } else {
        None
    };
    let mut all: Option<RunResults> = None;
    let mut mismatches = Vec::new();
    for r in 0..opts.repeat.max(1) {
        if opts.repeat > 1 {
            eprintln!("run {} of {}", r + 1, opts.repeat);
        }
        let (mut res, bad) = run_once(opts, systems, skipped.clone(), r)?;
        mismatches.extend(bad);
        match &mut all {
            None => all = Some(res),
            Some(a) => {
                a.backups.append(&mut res.backups);
                a.restores.append(&mut res.restores);
                a.deletes.append(&mut res.deletes);
                a.baselines.append(&mut res.baselines);
            }
        }
    }
    let mut res = all.expect("at least one run");
    res.limits = limits;
    write_outputs(&res, &opts.out)?;
    if !mismatches.is_empty() {
        bail!(
            "restored data differs from the source for: {}",
            mismatches.join(", ")
        );
    }
    Ok(res)
}

/// One pass of the scenario; returns its results and any restore mismatches.
fn run_once(
    opts: &RunOptions,
    systems: &mut [Box<dyn System>],
    skipped: Vec<String>,
    run: usize,
) -> Result<(RunResults, Vec<String>)> {
    let mut wl = gen::workload(&opts.scenario, &opts.gen)?;
    let series = wl.series();
    let versions = wl.versions();
    std::fs::create_dir_all(&opts.work)?;
    std::fs::create_dir_all(&opts.out)?;
    let src_dirs: Vec<PathBuf> = (0..series.len())
        .map(|i| opts.work.join(format!("src/{i}")))
        .collect();
    let _ = std::fs::remove_dir_all(opts.work.join("src"));
    for d in &src_dirs {
        std::fs::create_dir_all(d)?;
    }
    let repos: Vec<PathBuf> = systems
        .iter()
        .map(|s| opts.work.join(format!("repo-{}", s.name())))
        .collect();
    for (s, r) in systems.iter_mut().zip(&repos) {
        let _ = std::fs::remove_dir_all(r);
        let _ = std::fs::remove_dir_all(s.stored_dir(r));
        let _ = std::fs::remove_dir_all(crate::systems::cache_dir(r));
        s.init(r)
            .with_context(|| format!("initialising {}", s.name()))?;
    }
    let mut res = RunResults {
        scenario: opts.scenario.clone(),
        workload: wl.describe(),
        systems: systems.iter().map(|s| (s.name(), s.settings())).collect(),
        skipped,
        machine: machine(),
        cache_drop_permitted: drop_caches(),
        backups: vec![],
        restores: vec![],
        deletes: vec![],
        baselines: vec![],
        limits: None,
        deletes_skipped: None,
    };
    // What loading each program reads from a cold cache, to subtract from
    // its restores' storage reads.
    let mut baseline: Vec<Option<u64>> = Vec::new();
    for sys in systems.iter() {
        let dropped = drop_caches();
        let m = crate::measure::run(&mut sys.baseline_command(), &[0])
            .with_context(|| format!("baseline run of {}", sys.name()))?;
        baseline.push(dropped.then_some(m.storage_read_bytes));
        res.baselines.push(BaselineRow {
            run,
            system: sys.name(),
            cache_dropped: dropped,
            storage_read_bytes: m.storage_read_bytes,
            syscall_read_bytes: m.syscall_read_bytes,
        });
    }
    let mut digests: Vec<Vec<String>> = vec![Vec::new(); series.len()];
    let mut logical: Vec<Vec<u64>> = vec![Vec::new(); series.len()];
    for v in 0..versions {
        for (si, d) in src_dirs.iter().enumerate() {
            wl.advance(si, v, d)
                .with_context(|| format!("generating version {v} of {}", series[si]))?;
            digests[si].push(tree_digest(d)?);
            logical[si].push(tree_bytes(d));
        }
        let n = systems.len();
        for k in 0..n {
            let i = (k + v) % n;
            for (si, d) in src_dirs.iter().enumerate() {
                let sys = &mut systems[i];
                let m = sys
                    .backup(&repos[i], &series[si], v + 1, d)
                    .with_context(|| {
                        format!("{} backup of {}@{}", sys.name(), series[si], v + 1)
                    })?;
                // Out-of-line maintenance after the backup (Strata's
                // RevDedup lifecycle), timed apart; stored bytes after it.
                let maint = sys.after_backup(&repos[i]).with_context(|| {
                    format!("{} maintenance after {}@{}", sys.name(), series[si], v + 1)
                })?;
                let row = BackupRow {
                    run,
                    system: sys.name(),
                    series: series[si].clone(),
                    version: v + 1,
                    logical_bytes: logical[si][v],
                    seconds: m.seconds,
                    mb_per_s: mb(logical[si][v], m.seconds),
                    stored_bytes_after: tree_bytes(&sys.stored_dir(&repos[i])),
                    peak_rss_bytes: m.peak_rss_bytes,
                    cumulative_logical_bytes: 0,
                    dedup_ratio: 0.0,
                    space_saving_pct: 0.0,
                    maintain_seconds: maint.map(|m| m.seconds),
                    new_raw_bytes: json_u64(&m.stdout, "new_raw_bytes"),
                    index_ram_bytes: json_u64(&m.stdout, "index_ram_bytes"),
                };
                eprintln!(
                    "backup  {:<14} {}@{:<3} {:>8.1} MB/s  stored {:>8.1} MB{}",
                    row.system,
                    row.series,
                    row.version,
                    row.mb_per_s,
                    row.stored_bytes_after as f64 / 1e6,
                    row.maintain_seconds
                        .map(|s| format!("  maintain {s:.2} s"))
                        .unwrap_or_default()
                );
                res.backups.push(row);
            }
        }
    }
    fill_cumulative(&mut res.backups);
    // Restores, oldest first.
    let every = opts.restore_every.max(1);
    let selected: Vec<usize> = (1..=versions)
        .filter(|v| (v - 1) % every == 0 || *v == versions)
        .collect();
    let restore_series = if opts.restore_first_series_only {
        1
    } else {
        series.len()
    };
    let mut mismatches = Vec::new();
    for &v in &selected {
        for si in 0..restore_series {
            let n = systems.len();
            for k in 0..n {
                let i = (k + v) % n;
                let sys = &mut systems[i];
                let target = opts.work.join("restore");
                let _ = std::fs::remove_dir_all(&target);
                std::fs::create_dir_all(&target)?;
                let dropped = drop_caches();
                let (m, root) = sys
                    .restore(&repos[i], &series[si], v, &src_dirs[si], &target)
                    .with_context(|| format!("{} restore of {}@{v}", sys.name(), series[si]))?;
                let ok = tree_digest(&root)
                    .map(|d| d == digests[si][v - 1])
                    .unwrap_or(false);
                if !ok {
                    mismatches.push(format!("{} {}@{v}", sys.name(), series[si]));
                }
                let bytes = logical[si][v - 1];
                let reads = sys.last_restore_reads();
                let row = RestoreRow {
                    run,
                    system: sys.name(),
                    series: series[si].clone(),
                    version: v,
                    bytes,
                    seconds: m.seconds,
                    mb_per_s: mb(bytes, m.seconds),
                    peak_rss_bytes: m.peak_rss_bytes,
                    cache_dropped: dropped,
                    storage_read_bytes: m.storage_read_bytes,
                    syscall_read_bytes: m.syscall_read_bytes,
                    read_per_byte: m.syscall_read_bytes as f64 / bytes.max(1) as f64,
                    baseline_read_bytes: baseline[i].unwrap_or(0),
                    storage_read_per_byte: storage_read_per_byte(
                        m.storage_read_bytes,
                        baseline[i],
                        bytes,
                        dropped,
                    ),
                    containers_read: reads.map(|r| r.0),
                    regions_read: reads.map(|r| r.1),
                    mb_per_container: reads.map(|r| bytes as f64 / 1e6 / r.0.max(1) as f64),
                    verified: ok,
                };
                eprintln!(
                    "restore {:<14} {}@{:<3} {:>8.1} MB/s  storage read/byte {}  syscall read/byte {:.2}{}{}",
                    row.system,
                    row.series,
                    v,
                    row.mb_per_s,
                    opt_na(row.storage_read_per_byte, 2),
                    row.read_per_byte,
                    reads
                        .map(|r| format!("  containers {}", r.0))
                        .unwrap_or_default(),
                    if ok { "" } else { "  MISMATCH" }
                );
                res.restores.push(row);
                let _ = std::fs::remove_dir_all(&target);
            }
        }
    }
    if !opts.deletes {
        res.deletes_skipped = Some("deletions not measured (--no-deletes)".into());
    } else if versions < 3 {
        let msg = format!(
            "deletions not measured: {versions} version(s) per series, and deleting the oldest \
             and then half of the versions needs at least 3"
        );
        eprintln!("{msg}");
        res.deletes_skipped = Some(msg);
    } else {
        for (i, sys) in systems.iter_mut().enumerate() {
            let oldest: Vec<(String, usize)> = series.iter().map(|s| (s.clone(), 1)).collect();
            let m = sys.delete(&repos[i], &oldest)?;
            res.deletes.push(DeleteRow {
                run,
                system: sys.name(),
                what: "oldest".into(),
                versions: oldest.len(),
                seconds: m.seconds,
                stored_bytes_after: tree_bytes(&sys.stored_dir(&repos[i])),
            });
            let half: Vec<(String, usize)> = series
                .iter()
                .flat_map(|s| (2..=versions).step_by(2).map(move |v| (s.clone(), v)))
                .collect();
            let m = sys.delete(&repos[i], &half)?;
            res.deletes.push(DeleteRow {
                run,
                system: sys.name(),
                what: "half".into(),
                versions: half.len(),
                seconds: m.seconds,
                stored_bytes_after: tree_bytes(&sys.stored_dir(&repos[i])),
            });
            eprintln!("delete  {:<14} oldest + half done", sys.name());
        }
    }
    Ok((res, mismatches))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-system summary figures.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub system: String,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub dedup_ratio: f64,
    pub space_saving_pct: f64,
    pub first_backup_mb_s: f64,
    pub median_later_backup_mb_s: f64,
    pub first_restore_mb_s: f64,
    pub last_restore_mb_s: f64,
    pub median_restore_mb_s: f64,
    /// Syscall bytes read (`rchar`) per byte restored, last version.
    pub last_restore_read_per_byte: f64,
    /// Storage bytes read (net of the baseline) per byte restored, last
    /// version; `None` unless the page cache was dropped.
    pub last_restore_storage_read_per_byte: Option<f64>,
    pub last_restore_containers_per_gb: Option<f64>,
    pub max_backup_rss_mb: f64,
    /// Median wall time of the maintenance run after each backup.
    pub median_maintain_s: Option<f64>,
    pub delete_oldest_s: Option<f64>,
    pub delete_half_s: Option<f64>,
}

pub fn summarize(res: &RunResults) -> Vec<Summary> {
    res.systems
        .iter()
        .map(|(name, _)| {
            let b: Vec<&BackupRow> = res.backups.iter().filter(|r| &r.system == name).collect();
            let r: Vec<&RestoreRow> = res.restores.iter().filter(|r| &r.system == name).collect();
            // Per repetition: logical bytes written and final stored bytes.
            let runs = b.iter().map(|x| x.run).max().map_or(1, |m| m + 1);
            let logical: u64 = b.iter().map(|x| x.logical_bytes).sum::<u64>() / runs as u64;
            let stored = median(
                (0..runs)
                    .map(|k| {
                        b.iter()
                            .filter(|x| x.run == k)
                            .map(|x| x.stored_bytes_after)
                            .next_back()
                            .unwrap_or(0) as f64
                    })
                    .collect(),
            ) as u64;
            let first_v = b.iter().map(|x| x.version).min().unwrap_or(1);
            let last_v = r.iter().map(|x| x.version).max().unwrap_or(1);
            let first_r: Vec<&&RestoreRow> = r.iter().filter(|x| x.version == first_v).collect();
            let last_r: Vec<&&RestoreRow> = r.iter().filter(|x| x.version == last_v).collect();
            let del = |w: &str| {
                let v: Vec<f64> = res
                    .deletes
                    .iter()
                    .filter(|d| &d.system == name && d.what == w)
                    .map(|d| d.seconds)
                    .collect();
                (!v.is_empty()).then(|| median(v))
            };
            Summary {
                system: name.clone(),
                logical_bytes: logical,
                stored_bytes: stored,
                dedup_ratio: logical as f64 / stored.max(1) as f64,
                space_saving_pct: 100.0 * (1.0 - stored as f64 / logical.max(1) as f64),
                first_backup_mb_s: median(
                    b.iter()
                        .filter(|x| x.version == first_v)
                        .map(|x| x.mb_per_s)
                        .collect(),
                ),
                median_later_backup_mb_s: median(
                    b.iter()
                        .filter(|x| x.version > first_v)
                        .map(|x| x.mb_per_s)
                        .collect(),
                ),
                first_restore_mb_s: median(first_r.iter().map(|x| x.mb_per_s).collect()),
                last_restore_mb_s: median(last_r.iter().map(|x| x.mb_per_s).collect()),
                median_restore_mb_s: median(r.iter().map(|x| x.mb_per_s).collect()),
                last_restore_read_per_byte: median(
                    last_r.iter().map(|x| x.read_per_byte).collect(),
                ),
                last_restore_storage_read_per_byte: last_r
                    .iter()
                    .map(|x| x.storage_read_per_byte)
                    .collect::<Option<Vec<f64>>>()
                    .filter(|v| !v.is_empty())
                    .map(median),
                last_restore_containers_per_gb: last_r.first().and_then(|x| {
                    // Deterministic across repetitions (same data, same plan).
                    x.containers_read
                        .map(|c| c as f64 / (x.bytes.max(1) as f64 / 1e9))
                }),
                max_backup_rss_mb: b.iter().map(|x| x.peak_rss_bytes).max().unwrap_or(0) as f64
                    / 1e6,
                median_maintain_s: {
                    let v: Vec<f64> = b.iter().filter_map(|x| x.maintain_seconds).collect();
                    (!v.is_empty()).then(|| median(v))
                },
                delete_oldest_s: del("oldest"),
                delete_half_s: del("half"),
            }
        })
        .collect()
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "–".into())
}

fn opt_na(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "n/a".into())
}

/// The summary as a Markdown table, plus Strata / peer ratios.
pub fn summary_markdown(res: &RunResults) -> String {
    let sums = summarize(res);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Scenario `{}`: {}  \nMachine: {}; page cache dropped before restores: {}\n",
        res.scenario,
        res.workload,
        res.machine,
        if res.cache_drop_permitted {
            "yes"
        } else {
            "no (not permitted)"
        }
    );
    let _ = writeln!(s, "| system | logical GB | stored GB | dedup ratio | space saving | backup v1 MB/s | later backups MB/s (median) | restore first MB/s | restore last MB/s | storage read/byte (last) | syscall read/byte (last) | containers/GB (last) | max backup RSS MB | maintain s (median) | delete oldest s | delete half s |");
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &sums {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.3} | {:.2} | {:.1} % | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {} | {:.0} | {} | {} | {} |",
            x.system,
            x.logical_bytes as f64 / 1e9,
            x.stored_bytes as f64 / 1e9,
            x.dedup_ratio,
            x.space_saving_pct,
            x.first_backup_mb_s,
            x.median_later_backup_mb_s,
            x.first_restore_mb_s,
            x.last_restore_mb_s,
            opt_na(x.last_restore_storage_read_per_byte, 2),
            x.last_restore_read_per_byte,
            opt(x.last_restore_containers_per_gb, 1),
            x.max_backup_rss_mb,
            opt(x.median_maintain_s, 2),
            opt(x.delete_oldest_s, 2),
            opt(x.delete_half_s, 2)
        );
    }
    let _ = writeln!(s, "\nSettings:\n");
    for (name, settings) in &res.systems {
        let _ = writeln!(s, "- {name}: {settings}");
    }
    if let Some(l) = &res.limits {
        let _ = writeln!(
            s,
            "\nMachine limits (quick `limits` pass at the start of the run): FastCDC 8 KiB {:.0} MB/s, \
             BLAKE3 8 KiB {:.0} MB/s, zstd -3 {:.0} MB/s (ratio {:.2}) on one core; disk sequential \
             write {:.0} MB/s (fsync), read {:.0} MB/s ({}).\n",
            l.fastcdc_mb_s,
            l.blake3_8k_mb_s,
            l.zstd3_mb_s,
            l.zstd3_ratio,
            l.disk_write_mb_s,
            l.disk_read_mb_s,
            if l.disk_read_cache_dropped {
                "page cache dropped"
            } else {
                "page cache NOT dropped"
            }
        );
        let _ = writeln!(
            s,
            "| system | backup v1 / disk write | later backups / disk write | restore first / disk read | restore last / disk read |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        let pct = |x: f64, lim: f64| {
            if lim > 0.0 {
                format!("{:.0} %", 100.0 * x / lim)
            } else {
                "–".into()
            }
        };
        for x in &sums {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                x.system,
                pct(x.first_backup_mb_s, l.disk_write_mb_s),
                pct(x.median_later_backup_mb_s, l.disk_write_mb_s),
                pct(x.first_restore_mb_s, l.disk_read_mb_s),
                pct(x.last_restore_mb_s, l.disk_read_mb_s)
            );
        }
    }
    let stratas: Vec<&Summary> = sums
        .iter()
        .filter(|x| x.system.starts_with("strata"))
        .collect();
    // Duplicate elimination of the inline index strategies, before
    // compression: logical bytes minus the bytes their backups stored anew
    // (not meaningful for a system whose maintenance changes it later).
    let dedup: Vec<(String, u64, u64, u64)> = {
        let mut v = Vec::new();
        let mut names: Vec<&String> = res.backups.iter().map(|b| &b.system).collect();
        names.sort();
        names.dedup();
        for n in names {
            let rows: Vec<&BackupRow> = res
                .backups
                .iter()
                .filter(|b| &b.system == n && b.run == 0)
                .collect();
            if rows
                .iter()
                .all(|b| b.new_raw_bytes.is_some() && b.maintain_seconds.is_none())
                && !rows.is_empty()
            {
                let logical: u64 = rows.iter().map(|b| b.logical_bytes).sum();
                let new: u64 = rows.iter().filter_map(|b| b.new_raw_bytes).sum();
                let ram = rows.iter().filter_map(|b| b.index_ram_bytes).max();
                v.push((
                    n.clone(),
                    logical,
                    logical.saturating_sub(new),
                    ram.unwrap_or(0),
                ));
            }
        }
        v
    };
    if let Some(exact) = dedup.iter().find(|d| d.0 == "strata-exact") {
        let _ = writeln!(
            s,
            "\nDuplicate bytes eliminated inline (before compression; first repetition), and the index strategy's own RAM at its largest (end of a backup):\n\n| system | logical GB | stored anew GB | duplicates eliminated | of strata-exact's | index RAM | of strata-exact's |\n|---|---|---|---|---|---|---|"
        );
        for (n, logical, dup, ram) in &dedup {
            let _ = writeln!(
                s,
                "| {n} | {:.3} | {:.3} | {:.2} % | {:.2} % | {} | {} |",
                *logical as f64 / 1e9,
                (logical - dup) as f64 / 1e9,
                100.0 * *dup as f64 / (*logical).max(1) as f64,
                100.0 * *dup as f64 / exact.2.max(1) as f64,
                if *ram > 0 {
                    format!("{:.2} MiB", *ram as f64 / (1u64 << 20) as f64)
                } else {
                    "–".into()
                },
                if *ram > 0 && exact.3 > 0 {
                    format!("{:.3}", *ram as f64 / exact.3 as f64)
                } else {
                    "–".into()
                }
            );
        }
    }
    let peers: Vec<&Summary> = sums
        .iter()
        .filter(|x| !x.system.starts_with("strata"))
        .collect();
    if !stratas.is_empty() && !peers.is_empty() {
        let _ = writeln!(s, "\nRatios Strata / peer (> 1 means Strata is better; for stored bytes and times, peer / Strata):\n");
        let _ = writeln!(
            s,
            "| strata | peer | stored | backup v1 | later backups | restore last | delete oldest |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for a in &stratas {
            for p in &peers {
                let inv = |x: Option<f64>, y: Option<f64>| match (x, y) {
                    (Some(x), Some(y)) if x > 0.0 => format!("{:.2}", y / x),
                    _ => "–".into(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                    a.system,
                    p.system,
                    p.stored_bytes as f64 / a.stored_bytes.max(1) as f64,
                    a.first_backup_mb_s / p.first_backup_mb_s.max(1e-9),
                    a.median_later_backup_mb_s / p.median_later_backup_mb_s.max(1e-9),
                    a.last_restore_mb_s / p.last_restore_mb_s.max(1e-9),
                    inv(a.delete_oldest_s, p.delete_oldest_s)
                );
            }
        }
    }
    if !res.skipped.is_empty() {
        let _ = writeln!(s, "\nSkipped: {}", res.skipped.join("; "));
    }
    if let Some(d) = &res.deletes_skipped {
        let _ = writeln!(s, "\nNote: {d}.");
    }
    s
}

/// Writes results.json, backups.csv, restores.csv, deletes.csv (every CSV
/// row carries its repetition in `run`), charts and summary.md.
pub fn write_outputs(res: &RunResults, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(res)?)?;
    let mut csv = String::from(
        "run,system,series,version,logical_bytes,seconds,mb_per_s,stored_bytes_after,peak_rss_bytes,cumulative_logical_bytes,dedup_ratio,space_saving_pct,maintain_seconds\n",
    );
    for r in &res.backups {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.3},{:.2},{},{},{},{:.3},{:.2},{}",
            r.run,
            r.system,
            r.series,
            r.version,
            r.logical_bytes,
            r.seconds,
            r.mb_per_s,
            r.stored_bytes_after,
            r.peak_rss_bytes,
            r.cumulative_logical_bytes,
            r.dedup_ratio,
            r.space_saving_pct,
            r.maintain_seconds
                .map(|x| format!("{x:.3}"))
                .unwrap_or_default()
        );
    }
    std::fs::write(out.join("backups.csv"), csv)?;
    let mut csv = String::from("run,system,series,version,bytes,seconds,mb_per_s,cache_dropped,storage_read_bytes,baseline_read_bytes,storage_read_per_byte,syscall_read_bytes,syscall_read_per_byte,containers_read,regions_read,mb_per_container,verified\n");
    for r in &res.restores {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.3},{:.2},{},{},{},{},{},{:.3},{},{},{},{}",
            r.run,
            r.system,
            r.series,
            r.version,
            r.bytes,
            r.seconds,
            r.mb_per_s,
            r.cache_dropped,
            r.storage_read_bytes,
            r.baseline_read_bytes,
            r.storage_read_per_byte
                .map(|x| format!("{x:.3}"))
                .unwrap_or_default(),
            r.syscall_read_bytes,
            r.read_per_byte,
            r.containers_read.map(|x| x.to_string()).unwrap_or_default(),
            r.regions_read.map(|x| x.to_string()).unwrap_or_default(),
            r.mb_per_container
                .map(|x| format!("{x:.2}"))
                .unwrap_or_default(),
            r.verified
        );
    }
    std::fs::write(out.join("restores.csv"), csv)?;
    let mut csv = String::from("run,system,what,versions,seconds,stored_bytes_after\n");
    for d in &res.deletes {
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.3},{}",
            d.run, d.system, d.what, d.versions, d.seconds, d.stored_bytes_after
        );
    }
    std::fs::write(out.join("deletes.csv"), csv)?;
    let first_series = res
        .backups
        .first()
        .map(|b| b.series.clone())
        .unwrap_or_default();
    // One point per version: the median over repetitions.
    let by_version = |rows: Vec<(usize, f64)>| -> Vec<(f64, f64)> {
        let mut m: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
        for (v, y) in rows {
            m.entry(v).or_default().push(y);
        }
        m.into_iter()
            .map(|(v, ys)| (v as f64, median(ys)))
            .collect()
    };
    let chart = |file: &str, title: &str, y: &str, f: &dyn Fn(&str) -> Vec<(usize, f64)>| {
        let lines: Vec<(String, Vec<(f64, f64)>)> = res
            .systems
            .iter()
            .map(|(n, _)| (n.clone(), by_version(f(n))))
            .collect();
        std::fs::write(
            out.join(file),
            line_chart(&format!("{}: {title}", res.scenario), "version", y, &lines),
        )
    };
    let backups = |n: &str, f: fn(&BackupRow) -> f64| -> Vec<(usize, f64)> {
        res.backups
            .iter()
            .filter(|b| b.system == n && b.series == first_series)
            .map(|b| (b.version, f(b)))
            .collect()
    };
    let restores = |n: &str, f: fn(&RestoreRow) -> f64| -> Vec<(usize, f64)> {
        res.restores
            .iter()
            .filter(|b| b.system == n && b.series == first_series)
            .map(|b| (b.version, f(b)))
            .collect()
    };
    chart("backup-throughput.svg", "backup throughput", "MB/s", &|n| {
        backups(n, |b| b.mb_per_s)
    })?;
    chart(
        "restore-throughput.svg",
        "restore throughput",
        "MB/s",
        &|n| restores(n, |b| b.mb_per_s),
    )?;
    chart(
        "restore-read-per-byte.svg",
        "syscall bytes read per byte restored",
        "bytes read (rchar) / byte",
        &|n| restores(n, |b| b.read_per_byte),
    )?;
    let storage_title = if res
        .restores
        .iter()
        .any(|r| r.storage_read_per_byte.is_some())
    {
        "storage bytes read per byte restored (net of program load)"
    } else {
        "storage bytes read per byte restored: n/a (page cache not dropped)"
    };
    chart(
        "restore-storage-read-per-byte.svg",
        storage_title,
        "bytes read (read_bytes) / byte",
        &|n| {
            res.restores
                .iter()
                .filter(|b| b.system == n && b.series == first_series)
                .filter_map(|b| b.storage_read_per_byte.map(|y| (b.version, y)))
                .collect()
        },
    )?;
    // Stored bytes after each version, all series together (the largest
    // figure of a version is the one after its last series).
    chart("stored-bytes.svg", "cumulative stored bytes", "MB", &|n| {
        let mut last: std::collections::BTreeMap<(usize, usize), u64> = Default::default();
        for b in res.backups.iter().filter(|b| b.system == n) {
            let e = last.entry((b.run, b.version)).or_default();
            *e = (*e).max(b.stored_bytes_after);
        }
        last.into_iter()
            .map(|((_, v), s)| (v, s as f64 / 1e6))
            .collect()
    })?;
    // Space saving after each version, all series together (the row of a
    // version with the most logical bytes so far is its last series).
    chart("space-saving.svg", "space saving per version", "%", &|n| {
        let mut last: std::collections::BTreeMap<(usize, usize), (u64, f64)> = Default::default();
        for b in res.backups.iter().filter(|b| b.system == n) {
            let e = last.entry((b.run, b.version)).or_insert((0, 0.0));
            if b.cumulative_logical_bytes >= e.0 {
                *e = (b.cumulative_logical_bytes, b.space_saving_pct);
            }
        }
        last.into_iter().map(|((_, v), (_, p))| (v, p)).collect()
    })?;
    std::fs::write(out.join("summary.md"), summary_markdown(res))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(run: usize, system: &str, version: usize, logical: u64, stored: u64) -> BackupRow {
        BackupRow {
            run,
            system: system.into(),
            series: "s".into(),
            version,
            logical_bytes: logical,
            seconds: 1.0,
            mb_per_s: 1.0,
            stored_bytes_after: stored,
            peak_rss_bytes: 0,
            cumulative_logical_bytes: 0,
            dedup_ratio: 0.0,
            space_saving_pct: 0.0,
            maintain_seconds: None,
            new_raw_bytes: None,
            index_ram_bytes: None,
        }
    }

    #[test]
    fn cumulative_figures_per_run_and_system() {
        let mut rows = vec![
            row(0, "a", 1, 100, 50),
            row(0, "b", 1, 100, 200),
            row(0, "a", 2, 100, 50),
            row(0, "a", 3, 200, 100),
            row(1, "a", 1, 100, 25),
        ];
        fill_cumulative(&mut rows);
        let got: Vec<(u64, f64, f64)> = rows
            .iter()
            .map(|r| {
                (
                    r.cumulative_logical_bytes,
                    r.dedup_ratio,
                    r.space_saving_pct,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (100, 2.0, 50.0),
                // Stored more than written: ratio < 1, negative saving.
                (100, 0.5, -100.0),
                (200, 4.0, 75.0),
                (400, 4.0, 75.0),
                // A new repetition starts from zero.
                (100, 4.0, 75.0),
            ]
        );
        // Idempotent.
        let again = rows.clone();
        fill_cumulative(&mut rows);
        assert_eq!(format!("{again:?}"), format!("{rows:?}"),);
    }

    #[test]
    fn duplicate_table_compares_with_exact() {
        let mut backups = Vec::new();
        for (sys, anew, ram) in [
            ("strata-exact", [60, 10], 4 << 20),
            ("strata-silo", [60, 12], 1 << 20),
        ] {
            for (v, new) in anew.into_iter().enumerate() {
                let mut r = row(0, sys, v + 1, 100, 0);
                r.new_raw_bytes = Some(new);
                r.index_ram_bytes = Some(ram / (2 - v as u64));
                backups.push(r);
            }
        }
        let res = RunResults {
            scenario: "t".into(),
            workload: "t".into(),
            systems: vec![],
            skipped: vec![],
            machine: "m".into(),
            cache_drop_permitted: true,
            backups,
            restores: vec![],
            deletes: vec![],
            baselines: vec![],
            limits: None,
            deletes_skipped: None,
        };
        let md = summary_markdown(&res);
        // exact eliminated 200 - 70 = 130 bytes, silo 128: 98.46 % of it;
        // RAM is the largest backup's, 1 MiB against 4 MiB.
        assert!(
            md.contains("| strata-silo | 0.000 | 0.000 | 64.00 % | 98.46 % | 1.00 MiB | 0.250 |"),
            "{md}"
        );
        assert!(
            md.contains("| strata-exact | 0.000 | 0.000 | 65.00 % | 100.00 % | 4.00 MiB | 1.000 |"),
            "{md}"
        );
    }

    #[test]
    fn storage_reads_net_of_the_program_baseline() {
        // 30 MB read, 10 MB of it loading the program, 40 MB restored.
        let v = storage_read_per_byte(30_000_000, Some(10_000_000), 40_000_000, true);
        assert_eq!(v, Some(0.5));
        // A baseline larger than the reads never goes negative.
        assert_eq!(storage_read_per_byte(5, Some(10), 100, true), Some(0.0));
        // Without a cache drop (of the restore or of the baseline): n/a.
        assert_eq!(storage_read_per_byte(30, Some(10), 40, false), None);
        assert_eq!(storage_read_per_byte(30, None, 40, true), None);
        // Nothing restored: per byte of at least one byte.
        assert_eq!(storage_read_per_byte(7, Some(2), 0, true), Some(5.0));
    }
}
