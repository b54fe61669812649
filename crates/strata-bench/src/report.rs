//! Reports of a run: per-system summary figures, the Markdown summary
//! (with Strata / peer ratios), the CSV files and the charts, all from
//! [`RunResults`] (so `report` can regenerate them from results.json).

use crate::chart::line_chart;
use crate::results::{BackupRow, DeleteRow, RestoreRow, RunResults};
use anyhow::Result;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// The median of `v` (0 when empty).
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

/// Per-system summary figures of a run (medians over its repetitions).
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

/// `v` with `prec` decimals, or a dash.
fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "–".into())
}

/// `v` with `prec` decimals, or "n/a".
pub(crate) fn opt_na(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "n/a".into())
}

/// The summary as a Markdown table, plus Strata / peer ratios.
pub fn summary_markdown(res: &RunResults) -> String {
    let sums = summarize(res);
    let mut s = String::new();
    write_overview(&mut s, res);
    write_systems_table(&mut s, &sums);
    let _ = writeln!(s, "\nSettings:\n");
    for (name, settings) in &res.systems {
        let _ = writeln!(s, "- {name}: {settings}");
    }
    if let Some(l) = &res.limits {
        write_limits(&mut s, l, &sums);
    }
    write_inline_dedup(&mut s, &inline_dedup(res));
    write_ratios(&mut s, &sums);
    if !res.skipped.is_empty() {
        let _ = writeln!(s, "\nSkipped: {}", res.skipped.join("; "));
    }
    if let Some(d) = &res.deletes_skipped {
        let _ = writeln!(s, "\nNote: {d}.");
    }
    s
}

/// The summary's first lines: scenario, workload, machine, cache drops.
fn write_overview(s: &mut String, res: &RunResults) {
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
}

/// The main table: one row of summary figures per system.
fn write_systems_table(s: &mut String, sums: &[Summary]) {
    let _ = writeln!(s, "| system | logical GB | stored GB | dedup ratio | space saving | backup v1 MB/s | later backups MB/s (median) | restore first MB/s | restore last MB/s | storage read/byte (last) | syscall read/byte (last) | containers/GB (last) | max backup RSS MB | maintain s (median) | delete oldest s | delete half s |");
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in sums {
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
}

/// The machine's limits, and each system's throughput as a share of the
/// disk's.
fn write_limits(s: &mut String, l: &crate::limits::Limits, sums: &[Summary]) {
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
    for x in sums {
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

/// A system's inline duplicate elimination over the first repetition.
struct InlineDedup {
    system: String,
    logical: u64,
    /// Logical bytes minus the bytes its backups stored anew.
    dup: u64,
    /// The index strategy's own RAM at its largest.
    ram: u64,
}

/// Duplicate elimination of the inline index strategies, before
/// compression, per system (sorted by name): logical bytes minus the bytes
/// their backups stored anew (not meaningful for a system whose maintenance
/// changes it later, so such systems are left out).
fn inline_dedup(res: &RunResults) -> Vec<InlineDedup> {
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
            v.push(InlineDedup {
                system: n.clone(),
                logical,
                dup: logical.saturating_sub(new),
                ram: ram.unwrap_or(0),
            });
        }
    }
    v
}

/// The inline duplicate-elimination table, against strata-exact (nothing
/// without it).
fn write_inline_dedup(s: &mut String, dedup: &[InlineDedup]) {
    let Some(exact) = dedup.iter().find(|d| d.system == "strata-exact") else {
        return;
    };
    let _ = writeln!(
        s,
        "\nDuplicate bytes eliminated inline (before compression; first repetition), and the index strategy's own RAM at its largest (end of a backup):\n\n| system | logical GB | stored anew GB | duplicates eliminated | of strata-exact's | index RAM | of strata-exact's |\n|---|---|---|---|---|---|---|"
    );
    for d in dedup {
        let (logical, dup, ram) = (d.logical, d.dup, d.ram);
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.2} % | {:.2} % | {} | {} |",
            d.system,
            logical as f64 / 1e9,
            (logical - dup) as f64 / 1e9,
            100.0 * dup as f64 / logical.max(1) as f64,
            100.0 * dup as f64 / exact.dup.max(1) as f64,
            if ram > 0 {
                format!("{:.2} MiB", ram as f64 / (1u64 << 20) as f64)
            } else {
                "–".into()
            },
            if ram > 0 && exact.ram > 0 {
                format!("{:.3}", ram as f64 / exact.ram as f64)
            } else {
                "–".into()
            }
        );
    }
}

/// The table of ratios of every Strata system to every peer (nothing
/// without both).
fn write_ratios(s: &mut String, sums: &[Summary]) {
    let stratas: Vec<&Summary> = sums
        .iter()
        .filter(|x| x.system.starts_with("strata"))
        .collect();
    let peers: Vec<&Summary> = sums
        .iter()
        .filter(|x| !x.system.starts_with("strata"))
        .collect();
    if stratas.is_empty() || peers.is_empty() {
        return;
    }
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

/// Writes results.json, backups.csv, restores.csv, deletes.csv (every CSV
/// row carries its repetition in `run`), charts and summary.md.
pub fn write_outputs(res: &RunResults, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(res)?)?;
    std::fs::write(out.join("backups.csv"), backups_csv(&res.backups))?;
    std::fs::write(out.join("restores.csv"), restores_csv(&res.restores))?;
    std::fs::write(out.join("deletes.csv"), deletes_csv(&res.deletes))?;
    write_charts(res, out)?;
    std::fs::write(out.join("summary.md"), summary_markdown(res))?;
    Ok(())
}

/// backups.csv: a header and one line per backup.
fn backups_csv(rows: &[BackupRow]) -> String {
    let mut csv = String::from(
        "run,system,series,version,logical_bytes,seconds,mb_per_s,stored_bytes_after,peak_rss_bytes,cumulative_logical_bytes,dedup_ratio,space_saving_pct,maintain_seconds\n",
    );
    for r in rows {
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
    csv
}

/// restores.csv: a header and one line per restore.
fn restores_csv(rows: &[RestoreRow]) -> String {
    let mut csv = String::from("run,system,series,version,bytes,seconds,mb_per_s,cache_dropped,storage_read_bytes,baseline_read_bytes,storage_read_per_byte,syscall_read_bytes,syscall_read_per_byte,containers_read,regions_read,mb_per_container,verified\n");
    for r in rows {
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
    csv
}

/// deletes.csv: a header and one line per deletion.
fn deletes_csv(rows: &[DeleteRow]) -> String {
    let mut csv = String::from("run,system,what,versions,seconds,stored_bytes_after\n");
    for d in rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.3},{}",
            d.run, d.system, d.what, d.versions, d.seconds, d.stored_bytes_after
        );
    }
    csv
}

/// One point per version: the median over repetitions.
fn median_by_version(rows: Vec<(usize, f64)>) -> Vec<(f64, f64)> {
    let mut m: std::collections::BTreeMap<usize, Vec<f64>> = Default::default();
    for (v, y) in rows {
        m.entry(v).or_default().push(y);
    }
    m.into_iter()
        .map(|(v, ys)| (v as f64, median(ys)))
        .collect()
}

/// Writes the chart `file` into `out`: one line per system through the
/// per-version medians of the (version, value) points `points` gives for it.
fn write_chart(
    res: &RunResults,
    out: &Path,
    file: &str,
    title: &str,
    y: &str,
    points: &dyn Fn(&str) -> Vec<(usize, f64)>,
) -> std::io::Result<()> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = res
        .systems
        .iter()
        .map(|(n, _)| (n.clone(), median_by_version(points(n))))
        .collect();
    std::fs::write(
        out.join(file),
        line_chart(&format!("{}: {title}", res.scenario), "version", y, &lines),
    )
}

/// Writes the per-version charts: backup and restore throughput (first
/// series), bytes read per byte restored, stored bytes and space saving.
fn write_charts(res: &RunResults, out: &Path) -> Result<()> {
    let first_series = res
        .backups
        .first()
        .map(|b| b.series.clone())
        .unwrap_or_default();
    let backups = |n: &str, f: fn(&BackupRow) -> f64| -> Vec<(usize, f64)> {
        res.backups
            .iter()
            .filter(|b| b.system == n && b.series == first_series)
            .map(|b| (b.version, f(b)))
            .collect()
    };
    let restores = |n: &str, f: fn(&RestoreRow) -> Option<f64>| -> Vec<(usize, f64)> {
        res.restores
            .iter()
            .filter(|b| b.system == n && b.series == first_series)
            .filter_map(|b| f(b).map(|y| (b.version, y)))
            .collect()
    };
    let chart = |file: &str, title: &str, y: &str, f: &dyn Fn(&str) -> Vec<(usize, f64)>| {
        write_chart(res, out, file, title, y, f)
    };
    chart("backup-throughput.svg", "backup throughput", "MB/s", &|n| {
        backups(n, |b| b.mb_per_s)
    })?;
    chart(
        "restore-throughput.svg",
        "restore throughput",
        "MB/s",
        &|n| restores(n, |b| Some(b.mb_per_s)),
    )?;
    chart(
        "restore-read-per-byte.svg",
        "syscall bytes read per byte restored",
        "bytes read (rchar) / byte",
        &|n| restores(n, |b| Some(b.read_per_byte)),
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
        &|n| restores(n, |b| b.storage_read_per_byte),
    )?;
    chart("stored-bytes.svg", "cumulative stored bytes", "MB", &|n| {
        stored_bytes_points(res, n)
    })?;
    chart("space-saving.svg", "space saving per version", "%", &|n| {
        space_saving_points(res, n)
    })?;
    Ok(())
}

/// Stored bytes (MB) after each version of system `n`, all series together
/// (the largest figure of a version is the one after its last series).
fn stored_bytes_points(res: &RunResults, n: &str) -> Vec<(usize, f64)> {
    let mut last: std::collections::BTreeMap<(usize, usize), u64> = Default::default();
    for b in res.backups.iter().filter(|b| b.system == n) {
        let e = last.entry((b.run, b.version)).or_default();
        *e = (*e).max(b.stored_bytes_after);
    }
    last.into_iter()
        .map(|((_, v), s)| (v, s as f64 / 1e6))
        .collect()
}

/// Space saving (%) after each version of system `n`, all series together
/// (the row of a version with the most logical bytes so far is its last
/// series).
fn space_saving_points(res: &RunResults, n: &str) -> Vec<(usize, f64)> {
    let mut last: std::collections::BTreeMap<(usize, usize), (u64, f64)> = Default::default();
    for b in res.backups.iter().filter(|b| b.system == n) {
        let e = last.entry((b.run, b.version)).or_insert((0, 0.0));
        if b.cumulative_logical_bytes >= e.0 {
            *e = (b.cumulative_logical_bytes, b.space_saving_pct);
        }
    }
    last.into_iter().map(|((_, v), (_, p))| (v, p)).collect()
}
