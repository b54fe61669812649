//! Trace mode for index strategies (issue 5; SiLo §4): fingerprint streams
//! from [`crate::gen::trace`] driven through the `strata-index` cores —
//! `exact`, `silo`, `binning` — at terabyte scale without any data, the
//! way the SiLo paper evaluates. Each strategy runs in a child process of
//! its own (so its peak RSS is its own) over the same deterministic trace.
//!
//! Measured per strategy: duplicate bytes eliminated (and as a share of
//! what `exact` eliminates), index RAM (the structures' own accounting,
//! after every version, hence growth per TB), throughput (logical MB/s and
//! fingerprints/s, also net of the generator's own time), accesses to the
//! on-disk index (block/bin reads and writes) and peak RSS.
//!
//! The stream is cut into SiLo segments and Extreme Binning "files" by
//! content: a cut after a chunk whose fingerprint is 0 modulo the average
//! number of chunks per unit (between half and twice the average size), so
//! unchanged regions keep their cuts from one version to the next.

use crate::gen::trace::{FingerprintTrace, TraceConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use strata_index::binning::Binning;
use strata_index::exact::ExactMap;
use strata_index::silo::{Silo, SiloConfig};
use strata_index::{AsyncStore, BlockStore, DirStore, StoreStats};

/// What to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TraceRun {
    pub seed: u64,
    /// Logical size of version 1.
    pub dataset_bytes: u64,
    pub versions: usize,
    /// Fraction of chunks replaced per version.
    pub change_rate: f64,
    /// SiLo segment size (bytes).
    pub segment_bytes: u64,
    /// SiLo block size (bytes of data).
    pub block_bytes: u64,
    pub cache_blocks: usize,
    /// Average "file" size for Extreme Binning.
    pub file_bytes: u64,
    /// SiLo records wholly duplicate segments in new blocks too.
    #[serde(default)]
    pub record_duplicate_segments: bool,
}

impl TraceRun {
    fn trace(&self) -> FingerprintTrace {
        let mut cfg = TraceConfig::new(self.seed, self.dataset_bytes, self.versions);
        cfg.change_rate = self.change_rate;
        FingerprintTrace::new(cfg)
    }
}

/// One version's figures for one strategy.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VersionFigures {
    pub version: usize,
    pub logical_bytes: u64,
    pub dup_bytes: u64,
    pub chunks: u64,
    pub seconds: f64,
    /// Index RAM after this version (all of it, and the part that grows
    /// with the data).
    pub ram_bytes: u64,
    pub growing_ram_bytes: u64,
    pub entries: u64,
}

/// A strategy's whole run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StrategyResult {
    pub strategy: String,
    pub versions: Vec<VersionFigures>,
    pub logical_bytes: u64,
    pub dup_bytes: u64,
    pub chunks: u64,
    pub seconds: f64,
    pub ram_bytes: u64,
    pub growing_ram_bytes: u64,
    pub entries: u64,
    pub store_reads: u64,
    pub store_read_bytes: u64,
    pub store_writes: u64,
    pub store_written_bytes: u64,
    /// Bytes the on-disk parts occupy at the end.
    pub store_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Strategy-specific counters (SiLo and binning stats).
    pub detail: serde_json::Value,
}

/// Content-defined cuts of the chunk stream into units of ~`avg` bytes.
struct Cutter {
    min: u64,
    max: u64,
    divisor: u64,
    acc: u64,
}

impl Cutter {
    fn new(avg: u64, avg_chunk: u64) -> Self {
        Cutter {
            min: avg / 2,
            max: avg * 2,
            divisor: (avg / avg_chunk.max(1)).max(1),
            acc: 0,
        }
    }

    /// Adds a chunk; true when the unit ends after it.
    fn push(&mut self, fp: &[u8; 32], len: u32) -> bool {
        self.acc += len as u64;
        let h = u64::from_le_bytes(fp[24..32].try_into().expect("8 bytes"));
        let cut = (self.acc >= self.min && h % self.divisor == 0) || self.acc >= self.max;
        if cut {
            self.acc = 0;
        }
        cut
    }
}

fn key(fp: &[u8; 32]) -> [u8; 16] {
    fp[..16].try_into().expect("16 bytes")
}

/// A strategy's index, with the content-defined cutter and the buffered
/// unit (segment or file) of the strategies that deduplicate a unit at a
/// time.
enum Index {
    None,
    Exact(ExactMap<[u8; 16], ()>),
    Silo(Box<Silo<[u8; 16], ()>>, Cutter, Vec<([u8; 16], u32)>),
    Binning(Box<Binning<[u8; 16], ()>>, Cutter, Vec<([u8; 16], u32)>),
}

impl Index {
    /// The index `strategy` names, with its on-disk parts in `store`.
    fn new(strategy: &str, run: &TraceRun, store: &Arc<dyn BlockStore>) -> Result<Self> {
        let avg_chunk = 8192;
        Ok(match strategy {
            "none" => Index::None,
            "exact" => Index::Exact(ExactMap::default()),
            "silo" => Index::Silo(
                Box::new(Silo::new(
                    SiloConfig {
                        block_bytes: run.block_bytes,
                        cache_blocks: run.cache_blocks,
                        reps: 1,
                        gc_blocks: true,
                        record_duplicate_segments: run.record_duplicate_segments,
                    },
                    store.clone(),
                    "blk-",
                )),
                Cutter::new(run.segment_bytes, avg_chunk),
                Vec::new(),
            ),
            "binning" => Index::Binning(
                Box::new(Binning::new(store.clone(), "bin-", false)),
                Cutter::new(run.file_bytes, avg_chunk),
                Vec::new(),
            ),
            other => bail!("unknown strategy {other:?}: exact, silo, binning (or none)"),
        })
    }

    /// Takes the next chunk of the stream; returns the duplicate bytes
    /// found (the chunk's, or those of the unit it completes).
    fn push(&mut self, fp: &[u8; 32], len: u32) -> Result<u64> {
        match self {
            Index::None => {}
            Index::Exact(m) => {
                if m.claim(key(fp), ()).is_some() {
                    return Ok(len as u64);
                }
            }
            Index::Silo(silo, cut, unit) => {
                unit.push((key(fp), len));
                if cut.push(fp, len) {
                    return silo_unit(silo, unit);
                }
            }
            Index::Binning(b, cut, unit) => {
                unit.push((key(fp), len));
                if cut.push(fp, len) {
                    return bin_unit(b, unit);
                }
            }
        }
        Ok(0)
    }

    /// Ends a version, which ends a stream: its last unit is complete (and
    /// SiLo persists what a repository would after a backup); returns the
    /// duplicate bytes of that unit.
    fn end_version(&mut self) -> Result<u64> {
        let mut dup = 0;
        match self {
            Index::Silo(silo, cut, unit) => {
                if !unit.is_empty() {
                    dup += silo_unit(silo, unit)?;
                }
                cut.acc = 0;
                silo.flush()?;
                // What a repository would persist after each backup.
                let _ = silo.take_changes();
            }
            Index::Binning(b, cut, unit) => {
                if !unit.is_empty() {
                    dup += bin_unit(b, unit)?;
                }
                cut.acc = 0;
            }
            _ => {}
        }
        Ok(dup)
    }

    /// Index RAM now (all of it, and the part that grows with the data),
    /// and the number of entries.
    fn ram(&self) -> (u64, u64, u64) {
        match self {
            Index::None => (0, 0, 0),
            Index::Exact(m) => (m.ram_bytes(), m.ram_bytes(), m.entries()),
            Index::Silo(silo, _, _) => (silo.ram_bytes(), silo.sht_ram_bytes(), silo.entries()),
            Index::Binning(b, _, _) => (b.ram_bytes(), b.ram_bytes(), b.entries()),
        }
    }

    /// Strategy-specific counters (SiLo and binning stats).
    fn detail(&self) -> Result<serde_json::Value> {
        Ok(match self {
            Index::Silo(silo, _, _) => serde_json::to_value(&silo.stats)?,
            Index::Binning(b, _, _) => serde_json::to_value(&b.stats)?,
            _ => serde_json::Value::Null,
        })
    }
}

/// Deduplicates one buffered unit; returns its duplicate bytes.
fn silo_unit(silo: &mut Silo<[u8; 16], ()>, unit: &mut Vec<([u8; 16], u32)>) -> Result<u64> {
    let keys: Vec<[u8; 16]> = unit.iter().map(|(k, _)| *k).collect();
    let found = silo.lookup(&keys)?;
    let mut dup = 0;
    let mut chunks = Vec::with_capacity(unit.len());
    let mut bytes = 0;
    let mut new = 0;
    for ((k, len), f) in unit.iter().zip(&found) {
        bytes += *len as u64;
        // Within the unit, a repeat is found through the write buffer.
        if f.is_some() || silo.claim(*k, ()).is_some() {
            dup += *len as u64;
        } else {
            new += 1;
        }
        chunks.push((*k, ()));
    }
    silo.add_segment(&chunks, bytes, new)?;
    unit.clear();
    Ok(dup)
}

/// Deduplicates one buffered unit (a "file") through Extreme Binning;
/// returns its duplicate bytes.
fn bin_unit(b: &mut Binning<[u8; 16], ()>, unit: &mut Vec<([u8; 16], u32)>) -> Result<u64> {
    let keys: Vec<[u8; 16]> = unit.iter().map(|(k, _)| *k).collect();
    let (found, ticket) = b.lookup_file(&keys)?;
    let mut seen = std::collections::HashSet::new();
    let mut dup = 0;
    for ((k, len), f) in unit.iter().zip(&found) {
        if f.is_some() || !seen.insert(*k) {
            dup += *len as u64;
        }
    }
    let chunks: Vec<([u8; 16], ())> = keys.iter().map(|k| (*k, ())).collect();
    b.add_file(ticket, &chunks)?;
    unit.clear();
    Ok(dup)
}

/// Runs one strategy over the whole trace in this process.
pub fn run_strategy(run: &TraceRun, strategy: &str, work: &Path) -> Result<StrategyResult> {
    let store_dir = work.join(format!("store-{strategy}"));
    let _ = std::fs::remove_dir_all(&store_dir);
    let dir = Arc::new(DirStore::new(&store_dir)?);
    // Writes go through a background thread, like SiLo's write buffer.
    let async_store = Arc::new(AsyncStore::new(dir.clone()));
    let store: Arc<dyn BlockStore> = async_store.clone();
    let mut trace = run.trace();
    let mut res = StrategyResult {
        strategy: strategy.to_string(),
        ..Default::default()
    };
    let mut index = Index::new(strategy, run, &store)?;
    let started = Instant::now();
    loop {
        let v = run_version(&trace, &mut index)?;
        eprintln!(
            "{strategy:>8} v{:<3} {:>9.1} GB  dup {:>6.2} %  RAM {:>10}  {:>7.1} s",
            v.version,
            v.logical_bytes as f64 / 1e9,
            100.0 * v.dup_bytes as f64 / v.logical_bytes.max(1) as f64,
            v.ram_bytes,
            v.seconds
        );
        res.versions.push(v);
        if !trace.advance() {
            break;
        }
    }
    async_store.finish()?;
    res.seconds = started.elapsed().as_secs_f64();
    add_up_versions(&mut res);
    let st = store.stats();
    res.store_reads = StoreStats::get(&st.reads);
    res.store_read_bytes = StoreStats::get(&st.read_bytes);
    res.store_writes = StoreStats::get(&st.writes);
    res.store_written_bytes = StoreStats::get(&st.written_bytes);
    res.store_bytes = dir.bytes();
    res.detail = index.detail()?;
    drop(index);
    let _ = std::fs::remove_dir_all(&store_dir);
    Ok(res)
}

/// Drives the trace's current version through the index; its figures.
fn run_version(trace: &FingerprintTrace, index: &mut Index) -> Result<VersionFigures> {
    let t = Instant::now();
    let mut v = VersionFigures {
        version: trace.version() + 1,
        ..Default::default()
    };
    for r in trace.records() {
        v.logical_bytes += r.len as u64;
        v.chunks += 1;
        v.dup_bytes += index.push(&r.fp, r.len)?;
    }
    v.dup_bytes += index.end_version()?;
    v.seconds = t.elapsed().as_secs_f64();
    (v.ram_bytes, v.growing_ram_bytes, v.entries) = index.ram();
    Ok(v)
}

/// A strategy's totals from its versions' figures: logical and duplicate
/// bytes and chunks summed, RAM and entries as after the last version.
fn add_up_versions(res: &mut StrategyResult) {
    for v in &res.versions {
        res.logical_bytes += v.logical_bytes;
        res.dup_bytes += v.dup_bytes;
        res.chunks += v.chunks;
    }
    if let Some(last) = res.versions.last() {
        res.ram_bytes = last.ram_bytes;
        res.growing_ram_bytes = last.growing_ram_bytes;
        res.entries = last.entries;
    }
}

/// Runs every strategy in a child process (`index-trace-one`) and collects
/// the results, with each child's peak RSS.
pub fn run_all(
    exe: &Path,
    run: &TraceRun,
    strategies: &[String],
    work: &Path,
) -> Result<Vec<StrategyResult>> {
    std::fs::create_dir_all(work)?;
    let spec = work.join("trace-run.json");
    std::fs::write(&spec, serde_json::to_vec_pretty(run)?)?;
    let mut out = Vec::new();
    for s in strategies {
        let result = work.join(format!("result-{s}.json"));
        let mut c = std::process::Command::new(exe);
        c.args(["index-trace-one", "--spec"])
            .arg(&spec)
            .args(["--strategy", s, "--work"])
            .arg(work)
            .arg("--result")
            .arg(&result);
        let m = crate::measure::run(&mut c, &[0])
            .with_context(|| format!("trace run of strategy {s}"))?;
        let mut r: StrategyResult = serde_json::from_slice(&std::fs::read(&result)?)?;
        r.peak_rss_bytes = m.peak_rss_bytes;
        out.push(r);
    }
    Ok(out)
}

/// The report of a trace run: a Markdown summary against `exact`.
pub fn summary(run: &TraceRun, results: &[StrategyResult]) -> String {
    let exact = results.iter().find(|r| r.strategy == "exact");
    let none = results.iter().find(|r| r.strategy == "none");
    let tb = |b: u64| b as f64 / 1e12;
    let mut s = format!(
        "Trace: {} versions of a {:.0} GB stream ({:.2} TB logical), {:.1} % of chunks changed per version, 8 KiB chunks; \
         SiLo segments {} KiB, blocks {} MiB, {} cached blocks; binning files {} KiB; seed {}\n\n",
        run.versions,
        run.dataset_bytes as f64 / 1e9,
        results.first().map(|r| tb(r.logical_bytes)).unwrap_or(0.0),
        run.change_rate * 100.0,
        run.segment_bytes >> 10,
        run.block_bytes >> 20,
        run.cache_blocks,
        run.file_bytes >> 10,
        run.seed,
    );
    s += "| strategy | dup eliminated | of exact's | index RAM | RAM growth per TB | RAM vs exact | entries | MB/s | MB/s net of generator | index reads | index writes | on-disk index | peak RSS |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let gen_secs = none.map(|n| n.seconds).unwrap_or(0.0);
    for r in results.iter().filter(|r| r.strategy != "none") {
        // Growth after the first version, from the entry count (table
        // capacities jump in powers of two) at the final bytes per entry.
        let per_tb = {
            let v = &r.versions;
            match (v.first(), v.last()) {
                (Some(a), Some(b)) if v.len() > 1 && b.entries > 0 => {
                    let logical: u64 = v[1..].iter().map(|x| x.logical_bytes).sum();
                    let per_entry = b.growing_ram_bytes as f64 / b.entries as f64;
                    b.entries.saturating_sub(a.entries) as f64 * per_entry / tb(logical).max(1e-12)
                }
                _ => 0.0,
            }
        };
        let of_exact = exact
            .map(|e| {
                format!(
                    "{:.2} %",
                    100.0 * r.dup_bytes as f64 / e.dup_bytes.max(1) as f64
                )
            })
            .unwrap_or_else(|| "–".into());
        let vs_exact = exact
            .map(|e| format!("1/{:.0}", e.ram_bytes as f64 / r.ram_bytes.max(1) as f64))
            .unwrap_or_else(|| "–".into());
        let mbps = r.logical_bytes as f64 / r.seconds.max(1e-9) / 1e6;
        let net = r.logical_bytes as f64 / (r.seconds - gen_secs).max(1e-9) / 1e6;
        s += &format!(
            "| {} | {:.2} % | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.strategy,
            100.0 * r.dup_bytes as f64 / r.logical_bytes.max(1) as f64,
            of_exact,
            mib(r.ram_bytes),
            mib(per_tb as u64),
            if r.strategy == "exact" {
                "1".into()
            } else {
                vs_exact
            },
            r.entries,
            mbps,
            if none.is_some() {
                format!("{net:.0}")
            } else {
                "–".into()
            },
            r.store_reads,
            r.store_writes,
            mib(r.store_bytes),
            mib(r.peak_rss_bytes),
        );
    }
    if let Some(n) = none {
        s += &format!(
            "\nGenerating the trace alone takes {:.1} s ({:.0} MB/s); \"net\" subtracts it.\n",
            n.seconds,
            n.logical_bytes as f64 / n.seconds.max(1e-9) / 1e6
        );
    }
    if let Some(e) = exact {
        // The repository's exact index keeps a 32-byte fingerprint and a
        // 16-byte location per chunk.
        s += &format!(
            "\nIn trace mode keys are 16-byte fingerprint prefixes with no location. The repository's `exact` index keeps 48 bytes per chunk: {} for these {} chunks at the same table load.\n",
            mib((e.ram_bytes as f64 * 49.0 / 17.0) as u64),
            e.entries
        );
    }
    s
}

fn mib(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Writes results, summary and charts into `dir`.
pub fn write_report(dir: &Path, run: &TraceRun, results: &[StrategyResult]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"run": run, "results": results}))?,
    )?;
    let mut csv = String::from(
        "strategy,version,logical_bytes,dup_bytes,chunks,seconds,ram_bytes,growing_ram_bytes,entries\n",
    );
    for r in results {
        for v in &r.versions {
            csv += &format!(
                "{},{},{},{},{},{:.3},{},{},{}\n",
                r.strategy,
                v.version,
                v.logical_bytes,
                v.dup_bytes,
                v.chunks,
                v.seconds,
                v.ram_bytes,
                v.growing_ram_bytes,
                v.entries
            );
        }
    }
    std::fs::write(dir.join("versions.csv"), csv)?;
    let lines = |f: &dyn Fn(&StrategyResult, usize, f64) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        results
            .iter()
            .filter(|r| r.strategy != "none")
            .map(|r| {
                let mut acc = 0u64;
                let pts = r
                    .versions
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        acc += v.logical_bytes;
                        (acc as f64 / 1e12, f(r, i, acc as f64))
                    })
                    .collect();
                (r.strategy.clone(), pts)
            })
            .collect()
    };
    std::fs::write(
        dir.join("index-ram.svg"),
        crate::chart::line_chart(
            "Index RAM as the stream grows",
            "logical TB",
            "MiB",
            &lines(&|r, i, _| r.versions[i].ram_bytes as f64 / (1u64 << 20) as f64),
        ),
    )?;
    std::fs::write(
        dir.join("dup-eliminated.svg"),
        crate::chart::line_chart(
            "Duplicate bytes eliminated per version",
            "logical TB",
            "% of the version",
            &lines(&|r, i, _| {
                let v = &r.versions[i];
                100.0 * v.dup_bytes as f64 / v.logical_bytes.max(1) as f64
            }),
        ),
    )?;
    let sum = summary(run, results);
    std::fs::write(dir.join("summary.md"), &sum)?;
    Ok(dir.join("summary.md"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> TraceRun {
        TraceRun {
            seed: 3,
            dataset_bytes: 64 << 20,
            versions: 4,
            change_rate: 0.03,
            segment_bytes: 512 << 10,
            block_bytes: 8 << 20,
            cache_blocks: 4,
            file_bytes: 128 << 10,
            record_duplicate_segments: false,
        }
    }

    #[test]
    fn silo_is_near_exact_and_binning_below_on_a_small_trace() {
        let tmp = tempfile::tempdir().unwrap();
        let run = small();
        let e = run_strategy(&run, "exact", tmp.path()).unwrap();
        let s = run_strategy(&run, "silo", tmp.path()).unwrap();
        let b = run_strategy(&run, "binning", tmp.path()).unwrap();
        assert_eq!(e.logical_bytes, s.logical_bytes);
        assert!(e.dup_bytes > e.logical_bytes / 2, "{e:?}");
        // Never more than exact (a strategy can miss, never invent).
        assert!(s.dup_bytes <= e.dup_bytes && b.dup_bytes <= e.dup_bytes);
        let silo_share = s.dup_bytes as f64 / e.dup_bytes as f64;
        assert!(silo_share > 0.98, "silo found {silo_share}");
        // RAM: SiLo's growing part is far below exact's.
        assert!(s.growing_ram_bytes * 10 < e.ram_bytes, "{s:?} {e:?}");
        let sum = summary(&run, &[e, s, b]);
        assert!(sum.contains("| silo |"), "{sum}");
    }

    #[test]
    fn cutter_is_content_defined_and_bounded() {
        let mut c = Cutter::new(64 << 10, 8192);
        let mut sizes = Vec::new();
        let mut acc = 0;
        for i in 0..10_000u64 {
            let fp = *blake3::hash(&i.to_le_bytes()).as_bytes();
            acc += 8192;
            if c.push(&fp, 8192) {
                sizes.push(acc);
                acc = 0;
            }
        }
        assert!(sizes.iter().all(|s| (32 << 10..=128 << 10).contains(s)));
        let mean = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
        assert!((40_000.0..110_000.0).contains(&mean), "{mean}");
    }
}
