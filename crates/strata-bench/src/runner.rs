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

use crate::gen::{self, tree_digest, GenOptions};
use crate::measure::{drop_caches, tree_bytes};
use crate::report::opt_na;
use crate::systems::System;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

// The rows of a run live in `crate::results`, its reports in
// `crate::report`; the runner's callers find them here too.
pub use crate::report::{summarize, summary_markdown, write_outputs, Summary};
pub use crate::results::{BackupRow, BaselineRow, DeleteRow, RestoreRow, RunResults};

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
    let src_dirs = fresh_sources(&opts.work, series.len())?;
    let repos = init_repos(&opts.work, systems)?;
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
    let baseline = measure_baselines(systems, run, &mut res.baselines)?;
    let mut pass = Pass {
        opts,
        run,
        versions,
        digests: vec![Vec::new(); series.len()],
        logical: vec![Vec::new(); series.len()],
        series,
        src_dirs,
        repos,
        baseline,
    };
    for v in 0..versions {
        pass.generate(wl.as_mut(), v)?;
        pass.backup_version(systems, v, &mut res.backups)?;
    }
    fill_cumulative(&mut res.backups);
    let mismatches = pass.restore_selected(systems, &mut res.restores)?;
    pass.measure_deletes(systems, &mut res)?;
    Ok((res, mismatches))
}

/// Empties `work`/src and creates one source directory per series in it.
fn fresh_sources(work: &Path, series: usize) -> Result<Vec<PathBuf>> {
    let src_dirs: Vec<PathBuf> = (0..series).map(|i| work.join(format!("src/{i}"))).collect();
    let _ = std::fs::remove_dir_all(work.join("src"));
    for d in &src_dirs {
        std::fs::create_dir_all(d)?;
    }
    Ok(src_dirs)
}

/// Removes what an earlier run left of each system's repository in `work`
/// (with its stored data and cache) and initialises it afresh; returns the
/// repositories, in the order of `systems`.
fn init_repos(work: &Path, systems: &mut [Box<dyn System>]) -> Result<Vec<PathBuf>> {
    let repos: Vec<PathBuf> = systems
        .iter()
        .map(|s| work.join(format!("repo-{}", s.name())))
        .collect();
    for (s, r) in systems.iter_mut().zip(&repos) {
        let _ = std::fs::remove_dir_all(r);
        let _ = std::fs::remove_dir_all(s.stored_dir(r));
        let _ = std::fs::remove_dir_all(crate::systems::cache_dir(r));
        s.init(r)
            .with_context(|| format!("initialising {}", s.name()))?;
    }
    Ok(repos)
}

/// What loading each system's program reads from a cold cache, to subtract
/// from its restores' storage reads (`None` where the cache could not be
/// dropped); each measurement is also added to `rows`.
fn measure_baselines(
    systems: &[Box<dyn System>],
    run: usize,
    rows: &mut Vec<BaselineRow>,
) -> Result<Vec<Option<u64>>> {
    let mut baseline: Vec<Option<u64>> = Vec::new();
    for sys in systems.iter() {
        let dropped = drop_caches();
        let m = crate::measure::run(&mut sys.baseline_command(), &[0])
            .with_context(|| format!("baseline run of {}", sys.name()))?;
        baseline.push(dropped.then_some(m.storage_read_bytes));
        rows.push(BaselineRow {
            run,
            system: sys.name(),
            cache_dropped: dropped,
            storage_read_bytes: m.storage_read_bytes,
            syscall_read_bytes: m.syscall_read_bytes,
        });
    }
    Ok(baseline)
}

/// What one pass of the scenario works on: its series and their source
/// directories, each system's repository and program baseline, and what
/// each generated version holds.
struct Pass<'a> {
    opts: &'a RunOptions,
    /// Which repetition this is (0-based).
    run: usize,
    /// Versions per series.
    versions: usize,
    series: Vec<String>,
    /// One source directory per series.
    src_dirs: Vec<PathBuf>,
    /// One repository per system, in the order of the systems.
    repos: Vec<PathBuf>,
    /// Per system, what loading its program reads from a cold cache.
    baseline: Vec<Option<u64>>,
    /// Per series, the tree digest of each version generated so far.
    digests: Vec<Vec<String>>,
    /// Per series, the logical bytes of each version generated so far.
    logical: Vec<Vec<u64>>,
}

impl Pass<'_> {
    /// Brings every series' source directory to version `v` (0-based) and
    /// records its digest and logical bytes.
    fn generate(&mut self, wl: &mut dyn gen::Workload, v: usize) -> Result<()> {
        for (si, d) in self.src_dirs.iter().enumerate() {
            wl.advance(si, v, d)
                .with_context(|| format!("generating version {v} of {}", self.series[si]))?;
            self.digests[si].push(tree_digest(d)?);
            self.logical[si].push(tree_bytes(d));
        }
        Ok(())
    }

    /// Backs up version `v` (0-based) of every series with every system,
    /// the order of the systems rotated by the version; rows into `rows`.
    fn backup_version(
        &self,
        systems: &mut [Box<dyn System>],
        v: usize,
        rows: &mut Vec<BackupRow>,
    ) -> Result<()> {
        let n = systems.len();
        for k in 0..n {
            let i = (k + v) % n;
            for si in 0..self.src_dirs.len() {
                let row = self.backup_one(systems[i].as_mut(), i, si, v)?;
                log_backup(&row);
                rows.push(row);
            }
        }
        Ok(())
    }

    /// System `i`'s backup of version `v` (0-based) of series `si`, and its
    /// maintenance run after it.
    fn backup_one(&self, sys: &mut dyn System, i: usize, si: usize, v: usize) -> Result<BackupRow> {
        let (series, repo) = (&self.series[si], &self.repos[i]);
        let m = sys
            .backup(repo, series, v + 1, &self.src_dirs[si])
            .with_context(|| format!("{} backup of {}@{}", sys.name(), series, v + 1))?;
        // Out-of-line maintenance after the backup (Strata's
        // RevDedup lifecycle), timed apart; stored bytes after it.
        let maint = sys
            .after_backup(repo)
            .with_context(|| format!("{} maintenance after {}@{}", sys.name(), series, v + 1))?;
        let logical = self.logical[si][v];
        Ok(BackupRow {
            run: self.run,
            system: sys.name(),
            series: series.clone(),
            version: v + 1,
            logical_bytes: logical,
            seconds: m.seconds,
            mb_per_s: mb(logical, m.seconds),
            stored_bytes_after: tree_bytes(&sys.stored_dir(repo)),
            peak_rss_bytes: m.peak_rss_bytes,
            cumulative_logical_bytes: 0,
            dedup_ratio: 0.0,
            space_saving_pct: 0.0,
            maintain_seconds: maint.map(|m| m.seconds),
            new_raw_bytes: json_u64(&m.stdout, "new_raw_bytes"),
            index_ram_bytes: json_u64(&m.stdout, "index_ram_bytes"),
        })
    }

    /// Restores the selected versions, oldest first, of the selected series
    /// with every system (the order rotated by the version) and verifies
    /// them; rows into `rows`, returns the versions that differ.
    fn restore_selected(
        &self,
        systems: &mut [Box<dyn System>],
        rows: &mut Vec<RestoreRow>,
    ) -> Result<Vec<String>> {
        let every = self.opts.restore_every.max(1);
        let selected: Vec<usize> = (1..=self.versions)
            .filter(|v| (v - 1) % every == 0 || *v == self.versions)
            .collect();
        let restore_series = if self.opts.restore_first_series_only {
            1
        } else {
            self.series.len()
        };
        let mut mismatches = Vec::new();
        for &v in &selected {
            for si in 0..restore_series {
                let n = systems.len();
                for k in 0..n {
                    let i = (k + v) % n;
                    let row = self.restore_one(systems[i].as_mut(), i, si, v)?;
                    if !row.verified {
                        mismatches.push(format!("{} {}@{v}", row.system, row.series));
                    }
                    rows.push(row);
                }
            }
        }
        Ok(mismatches)
    }

    /// System `i`'s restore of version `v` (1-based) of series `si` into a
    /// fresh directory, after a page-cache drop, checked against the
    /// version's digest.
    fn restore_one(
        &self,
        sys: &mut dyn System,
        i: usize,
        si: usize,
        v: usize,
    ) -> Result<RestoreRow> {
        let series = &self.series[si];
        let target = self.opts.work.join("restore");
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir_all(&target)?;
        let dropped = drop_caches();
        let (m, root) = sys
            .restore(&self.repos[i], series, v, &self.src_dirs[si], &target)
            .with_context(|| format!("{} restore of {}@{v}", sys.name(), series))?;
        let ok = tree_digest(&root)
            .map(|d| d == self.digests[si][v - 1])
            .unwrap_or(false);
        let bytes = self.logical[si][v - 1];
        let reads = sys.last_restore_reads();
        let row = RestoreRow {
            run: self.run,
            system: sys.name(),
            series: series.clone(),
            version: v,
            bytes,
            seconds: m.seconds,
            mb_per_s: mb(bytes, m.seconds),
            peak_rss_bytes: m.peak_rss_bytes,
            cache_dropped: dropped,
            storage_read_bytes: m.storage_read_bytes,
            syscall_read_bytes: m.syscall_read_bytes,
            read_per_byte: m.syscall_read_bytes as f64 / bytes.max(1) as f64,
            baseline_read_bytes: self.baseline[i].unwrap_or(0),
            storage_read_per_byte: storage_read_per_byte(
                m.storage_read_bytes,
                self.baseline[i],
                bytes,
                dropped,
            ),
            containers_read: reads.map(|r| r.0),
            regions_read: reads.map(|r| r.1),
            mb_per_container: reads.map(|r| bytes as f64 / 1e6 / r.0.max(1) as f64),
            verified: ok,
        };
        log_restore(&row);
        let _ = std::fs::remove_dir_all(&target);
        Ok(row)
    }

    /// With every system: deletes the oldest version of every series, then
    /// half of the rest, timing each deletion into `res.deletes`; or records
    /// in `res.deletes_skipped` why not.
    fn measure_deletes(&self, systems: &mut [Box<dyn System>], res: &mut RunResults) -> Result<()> {
        let versions = self.versions;
        if !self.opts.deletes {
            res.deletes_skipped = Some("deletions not measured (--no-deletes)".into());
            return Ok(());
        }
        if versions < 3 {
            let msg = format!(
                "deletions not measured: {versions} version(s) per series, and deleting the oldest \
                 and then half of the versions needs at least 3"
            );
            eprintln!("{msg}");
            res.deletes_skipped = Some(msg);
            return Ok(());
        }
        for (i, sys) in systems.iter_mut().enumerate() {
            let oldest: Vec<(String, usize)> = self.series.iter().map(|s| (s.clone(), 1)).collect();
            res.deletes
                .push(self.delete(sys.as_mut(), i, "oldest", &oldest)?);
            let half: Vec<(String, usize)> = self
                .series
                .iter()
                .flat_map(|s| (2..=versions).step_by(2).map(move |v| (s.clone(), v)))
                .collect();
            res.deletes
                .push(self.delete(sys.as_mut(), i, "half", &half)?);
            eprintln!("delete  {:<14} oldest + half done", sys.name());
        }
        Ok(())
    }

    /// System `i`'s timed deletion of `versions` (series, version), as the
    /// row `what`.
    fn delete(
        &self,
        sys: &mut dyn System,
        i: usize,
        what: &str,
        versions: &[(String, usize)],
    ) -> Result<DeleteRow> {
        let m = sys.delete(&self.repos[i], versions)?;
        Ok(DeleteRow {
            run: self.run,
            system: sys.name(),
            what: what.into(),
            versions: versions.len(),
            seconds: m.seconds,
            stored_bytes_after: tree_bytes(&sys.stored_dir(&self.repos[i])),
        })
    }
}

/// One line on stderr for a backup just measured.
fn log_backup(row: &BackupRow) {
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
}

/// One line on stderr for a restore just measured and verified.
fn log_restore(row: &RestoreRow) {
    eprintln!(
        "restore {:<14} {}@{:<3} {:>8.1} MB/s  storage read/byte {}  syscall read/byte {:.2}{}{}",
        row.system,
        row.series,
        row.version,
        row.mb_per_s,
        opt_na(row.storage_read_per_byte, 2),
        row.read_per_byte,
        row.containers_read
            .map(|c| format!("  containers {c}"))
            .unwrap_or_default(),
        if row.verified { "" } else { "  MISMATCH" }
    );
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
