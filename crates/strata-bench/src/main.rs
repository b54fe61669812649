//! `strata-bench`: generate workloads, run them through Strata and its
//! peers side by side, regenerate reports, measure machine limits.
//! See docs/benchmarks.md.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use strata_bench::gen::{self, GenOptions};
use strata_bench::runner::{self, RunOptions};
use strata_bench::systems::{self, System};

#[derive(Parser)]
#[command(
    name = "strata-bench",
    version,
    about = "Strata's benchmark harness and workload generators"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct GenArgs {
    /// Workload: sg, ddgen, smallfiles, vmfleet (and for `gen` only: primary, trace).
    kind: String,
    /// Preset (sg: SG1..SG5, GP).
    #[arg(long)]
    preset: Option<String>,
    /// Size factor relative to the paper's dataset.
    #[arg(long, default_value_t = 0.01)]
    scale: f64,
    /// Number of versions (default: the preset's).
    #[arg(long)]
    versions: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start from real files in this directory.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Parallel streams / series.
    #[arg(long)]
    streams: Option<usize>,
    /// sg: make every version one disk image of the tree (files at 4 KiB-aligned
    /// offsets, stable allocation) instead of the tree itself.
    #[arg(long)]
    image: bool,
}

impl GenArgs {
    fn options(&self) -> GenOptions {
        GenOptions {
            seed: self.seed,
            scale: self.scale,
            preset: self.preset.clone(),
            versions: self.versions,
            base: self.base.clone(),
            streams: self.streams,
            image: self.image,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Write one version of a workload into a directory (series 0, or all
    /// series as subdirectories), or a `primary` block-write trace or a
    /// `trace` fingerprint stream into a file (`--out -`: stdout).
    Gen {
        #[command(flatten)]
        gen: GenArgs,
        /// Output directory (tree workloads) or file, `-` for stdout (primary, trace).
        #[arg(long)]
        out: PathBuf,
        /// Which version to produce (1-based; earlier versions are generated and overwritten in place).
        #[arg(long, default_value_t = 1)]
        version: usize,
        /// primary: bytes of 4 KiB block writes in the trace; trace: logical
        /// size of version 1 of the stream (e.g. 256M, 10GiB, 1TB).
        #[arg(long, value_parser = gen::parse_size)]
        size: Option<u64>,
        /// primary: size of the volume written to (default: --size).
        #[arg(long, value_parser = gen::parse_size)]
        volume_size: Option<u64>,
    },
    /// Run a scenario through several systems side by side.
    Run {
        #[command(flatten)]
        gen: GenArgs,
        /// Systems: strata-<index>[+option=value...] (options go to `strata init`, e.g.
        /// strata-segment+segment-kib=1024; default: every strategy the binary reports), restic, borg.
        #[arg(long, value_delimiter = ',')]
        systems: Option<Vec<String>>,
        /// Where results go (a timestamped subdirectory is created).
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// Scratch directory for sources, repositories and restores.
        #[arg(long, default_value = "/tmp/strata-bench-work")]
        work: PathBuf,
        /// Restore every k-th version (plus first and last).
        #[arg(long, default_value_t = 1)]
        restore_every: usize,
        /// Restore only the first series.
        #[arg(long)]
        restore_first_series_only: bool,
        /// Skip the deletion measurements.
        #[arg(long)]
        no_deletes: bool,
        /// Strata backs up with --force-read (every file read and looked up,
        /// none reused from the previous version): compares index strategies
        /// on all the data.
        #[arg(long)]
        strata_force_read: bool,
        /// Repeat the whole scenario N times; the summary quotes medians.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Skip the quick machine-limits pass at the start of the run.
        #[arg(long)]
        no_limits: bool,
        /// The strata binary (default: next to this program).
        #[arg(long, env = "STRATA_BIN")]
        strata: Option<PathBuf>,
    },
    /// Compare index strategies (exact, SiLo, Extreme Binning) on a
    /// fingerprint trace, without data (SiLo §4): duplicates eliminated,
    /// index RAM and its growth per TB, throughput, on-disk index accesses.
    IndexTrace {
        /// Logical size of the stream's first version (e.g. 500GB).
        #[arg(long, value_parser = gen::parse_size, default_value = "50GB")]
        dataset: u64,
        /// Versions (backups) of the stream.
        #[arg(long, default_value_t = 20)]
        versions: usize,
        /// Fraction of chunks replaced per version.
        #[arg(long, default_value_t = 0.03)]
        change_rate: f64,
        /// Strategies (none = the generator alone, for net throughput).
        #[arg(long, value_delimiter = ',', default_value = "none,exact,silo,binning")]
        strategies: Vec<String>,
        /// SiLo segment size.
        #[arg(long, value_parser = gen::parse_size, default_value = "2MiB")]
        segment: u64,
        /// SiLo block size (data per block).
        #[arg(long, value_parser = gen::parse_size, default_value = "256MiB")]
        block: u64,
        /// SiLo read cache, in blocks.
        #[arg(long, default_value_t = 8)]
        cache_blocks: usize,
        /// Average file size for Extreme Binning.
        #[arg(long, value_parser = gen::parse_size, default_value = "256KiB")]
        file: u64,
        /// SiLo: record wholly duplicate segments in new blocks too (the
        /// newest blocks then describe the whole newest stream).
        #[arg(long)]
        record_duplicates: bool,
        /// Duplicate elimination vs block and segment size (SiLo Figure 9):
        /// SiLo only, over a grid of sizes, at this trace's scale.
        #[arg(long)]
        sweep: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value = "/tmp/strata-bench-work/index-trace")]
        work: PathBuf,
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// One strategy of an index trace run (used by `index-trace`).
    #[command(hide = true)]
    IndexTraceOne {
        #[arg(long)]
        spec: PathBuf,
        #[arg(long)]
        strategy: String,
        #[arg(long)]
        work: PathBuf,
        #[arg(long)]
        result: PathBuf,
    },
    /// Regenerate charts and summary from a saved results.json directory.
    Report { dir: PathBuf },
    /// Measure this machine's chunking, hashing, compression and disk limits.
    Limits {
        #[arg(long, default_value = "/tmp/strata-bench-work")]
        work: PathBuf,
        /// Size of the disk test file in MiB.
        #[arg(long, default_value_t = 1024)]
        disk_mib: usize,
        /// The quicker pass `run` makes (smaller CPU samples, 1 GiB disk file).
        #[arg(long, conflicts_with = "disk_mib")]
        quick: bool,
        #[arg(long)]
        json: bool,
    },
}

fn strata_bin(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let me = std::env::current_exe()?;
    let p = me.with_file_name("strata");
    if p.exists() {
        return Ok(p);
    }
    bail!("no strata binary next to {}; build it (cargo build --release -p strata-cli) or pass --strata", me.display())
}

/// `gen primary` / `gen trace`: writes the stream to `out` (`-`: stdout)
/// and a one-line description to stderr.
fn gen_stream(
    kind: &str,
    args: &GenArgs,
    out: &std::path::Path,
    size: Option<u64>,
    volume_size: Option<u64>,
) -> Result<()> {
    use std::io::Write;
    if args.preset.is_some() || args.base.is_some() || args.streams.is_some() || args.image {
        bail!("`gen {kind}` takes --size, --seed and --versions (trace), not --preset, --base or --streams");
    }
    let mut w: Box<dyn Write> = if out.as_os_str() == "-" {
        Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout().lock(),
        ))
    } else {
        Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
        ))
    };
    let block = gen::primary::BLOCK_SIZE as u64;
    if kind == "primary" {
        if args.versions.is_some() {
            bail!("`gen primary` writes one trace; use --size for its length");
        }
        let size = size.unwrap_or(256 << 20);
        let writes = size.div_ceil(block).max(1);
        let volume = volume_size.unwrap_or(size).max(block);
        let cfg = gen::primary::PrimaryConfig::new(args.seed, volume, writes);
        let n = gen::primary::write_trace(&mut w, gen::primary::PrimaryTrace::new(cfg))?;
        w.flush()?;
        eprintln!(
            "primary trace (iDedup §3.1/§5): {n} writes of {block} B ({:.1} MB) into a {:.1} MB volume; seed {}",
            (n * block) as f64 / 1e6,
            volume as f64 / 1e6,
            args.seed
        );
    } else {
        if volume_size.is_some() {
            bail!("--volume-size is for `gen primary`");
        }
        let size = size.unwrap_or(1 << 30);
        let versions = args.versions.unwrap_or(10);
        if versions == 0 {
            bail!("versions must be at least 1");
        }
        let cfg = gen::trace::TraceConfig::new(args.seed, size, versions);
        let mut t = gen::trace::FingerprintTrace::new(cfg);
        let n = gen::trace::write_trace(&mut w, &mut t)?;
        w.flush()?;
        eprintln!(
            "fingerprint trace (SiLo §4): {versions} versions from {:.1} MB, {n} records; seed {}",
            size as f64 / 1e6,
            args.seed
        );
    }
    Ok(())
}

fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{secs}")
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Gen {
            gen,
            out,
            version,
            size,
            volume_size,
        } => {
            let kind = gen.kind.to_ascii_lowercase();
            if kind == "primary" || kind == "trace" {
                return gen_stream(&kind, &gen, &out, size, volume_size);
            }
            if size.is_some() || volume_size.is_some() {
                bail!("--size and --volume-size are for `gen primary` and `gen trace`");
            }
            let mut wl = gen::workload(&gen.kind, &gen.options())?;
            let series = wl.series();
            if version == 0 || version > wl.versions() {
                bail!("version must be between 1 and {}", wl.versions());
            }
            for si in 0..series.len() {
                let dir = if series.len() == 1 {
                    out.clone()
                } else {
                    out.join(&series[si])
                };
                std::fs::create_dir_all(&dir)?;
                for v in 0..version {
                    wl.advance(si, v, &dir)?;
                }
                println!("{}\t{}", dir.display(), gen::tree_digest(&dir)?);
            }
        }
        Cmd::Run {
            gen,
            systems: wanted,
            out,
            work,
            restore_every,
            restore_first_series_only,
            no_deletes,
            strata_force_read,
            repeat,
            no_limits,
            strata,
        } => {
            let bin = strata_bin(strata)?;
            let strategies = systems::Strata::strategies(&bin)
                .context("asking strata for its index strategies")?;
            let wanted = wanted.unwrap_or_else(|| {
                let mut v: Vec<String> = strategies.iter().map(|s| format!("strata-{s}")).collect();
                v.push("restic".into());
                v.push("borg".into());
                v
            });
            let mut list: Vec<Box<dyn System>> = Vec::new();
            let mut skipped = Vec::new();
            for w in &wanted {
                match w.as_str() {
                    "restic" | "borg" | "restic+s3" if !systems::installed(w.trim_end_matches("+s3")) => {
                        let msg = format!(
                            "{w} is not installed (scripts/bench-peers-install installs it)"
                        );
                        eprintln!("skipping {msg}");
                        skipped.push(msg);
                    }
                    "restic" => list.push(Box::new(systems::Restic::default())),
                    "restic+s3" => list.push(Box::new(systems::Restic::on_s3())),
                    "borg" => list.push(Box::new(systems::Borg)),
                    s if s.starts_with("strata-") => {
                        let mut sys = systems::Strata::from_spec(bin.clone(), s)?;
                        sys.force_read = strata_force_read;
                        if !strategies.contains(&sys.index) {
                            bail!(
                                "strata has no index strategy {:?} (it has: {})",
                                sys.index,
                                strategies.join(", ")
                            );
                        }
                        list.push(Box::new(sys));
                    }
                    other => bail!(
                        "unknown system {other:?}: use strata-<index>[+option=value...][+s3], restic[+s3] or borg"
                    ),
                }
            }
            let name = format!("{}-{}", gen.kind, gen.preset.clone().unwrap_or_default())
                .trim_end_matches('-')
                .to_lowercase()
                + if gen.image { "-image" } else { "" };
            let out_dir = out.join(format!("{name}-{}", timestamp()));
            // The `+s3` systems keep their repositories in a real S3 server
            // on loopback, started here for the run.
            let _s3 = if list.iter().any(|s| s.wants_s3()) {
                let server = strata_bench::s3::S3Server::start(&work.join("s3"))?;
                for s in list.iter_mut().filter(|s| s.wants_s3()) {
                    s.set_s3(server.target.clone());
                }
                Some(server)
            } else {
                None
            };
            let opts = RunOptions {
                scenario: gen.kind.clone(),
                gen: gen.options(),
                work,
                out: out_dir.clone(),
                restore_every,
                restore_first_series_only,
                deletes: !no_deletes,
                repeat,
                limits: (!no_limits).then(strata_bench::limits::Sizes::quick),
            };
            let res = runner::run(&opts, &mut list, skipped)?;
            println!("{}", runner::summary_markdown(&res));
            println!("results in {}", out_dir.display());
        }
        Cmd::Report { dir } => {
            let mut res: runner::RunResults = serde_json::from_slice(
                &std::fs::read(dir.join("results.json"))
                    .with_context(|| format!("reading {}/results.json", dir.display()))?,
            )?;
            // Results saved before the cumulative columns existed.
            runner::fill_cumulative(&mut res.backups);
            runner::write_outputs(&res, &dir)?;
            println!("{}", runner::summary_markdown(&res));
        }
        Cmd::IndexTrace {
            dataset,
            versions,
            change_rate,
            strategies,
            segment,
            block,
            cache_blocks,
            file,
            record_duplicates,
            sweep,
            seed,
            work,
            out,
        } => {
            use strata_bench::indextrace::{run_all, write_report, TraceRun};
            let exe = std::env::current_exe().context("locating strata-bench")?;
            let base = TraceRun {
                seed,
                dataset_bytes: dataset,
                versions,
                change_rate,
                segment_bytes: segment,
                block_bytes: block,
                cache_blocks,
                file_bytes: file,
                record_duplicate_segments: record_duplicates,
            };
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            if sweep {
                let dir = out.join(format!("index-sweep-{stamp}"));
                let exact = run_all(&exe, &base, &["exact".to_string()], &work)?;
                let e = exact[0].dup_bytes.max(1) as f64;
                let mut table = String::from(
                    "| segment | block | dup eliminated, % of exact's | SHTable entries | block loads |\n|---|---|---|---|---|\n",
                );
                let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
                let mut all = exact.clone();
                for seg in [512u64 << 10, 1 << 20, 2 << 20, 4 << 20] {
                    let mut pts = Vec::new();
                    for blk in [8u64 << 20, 32 << 20, 128 << 20, 512 << 20] {
                        let run = TraceRun {
                            segment_bytes: seg,
                            block_bytes: blk,
                            ..base.clone()
                        };
                        let mut r = run_all(&exe, &run, &["silo".to_string()], &work)?;
                        let mut r = r.remove(0);
                        let share = 100.0 * r.dup_bytes as f64 / e;
                        table += &format!(
                            "| {} KiB | {} MiB | {:.3} | {} | {} |\n",
                            seg >> 10,
                            blk >> 20,
                            share,
                            r.entries,
                            r.store_reads
                        );
                        pts.push(((blk >> 20) as f64, share));
                        r.strategy = format!("silo seg {} KiB block {} MiB", seg >> 10, blk >> 20);
                        all.push(r);
                    }
                    lines.push((format!("segment {} KiB", seg >> 10), pts));
                }
                std::fs::create_dir_all(&dir)?;
                std::fs::write(
                    dir.join("sweep.svg"),
                    strata_bench::chart::line_chart(
                        "SiLo: duplicates eliminated vs block size (Figure 9)",
                        "block MiB",
                        "% of exact's",
                        &lines,
                    ),
                )?;
                std::fs::write(dir.join("sweep.md"), &table)?;
                std::fs::write(
                    dir.join("results.json"),
                    serde_json::to_vec_pretty(&serde_json::json!({"run": base, "results": all}))?,
                )?;
                println!("{table}\nresults in {}", dir.display());
            } else {
                let results = run_all(&exe, &base, &strategies, &work)?;
                let dir = out.join(format!("index-trace-{stamp}"));
                let summary = write_report(&dir, &base, &results)?;
                println!("{}", std::fs::read_to_string(&summary)?);
                println!("results in {}", dir.display());
            }
        }
        Cmd::IndexTraceOne {
            spec,
            strategy,
            work,
            result,
        } => {
            let run: strata_bench::indextrace::TraceRun =
                serde_json::from_slice(&std::fs::read(&spec)?)?;
            let r = strata_bench::indextrace::run_strategy(&run, &strategy, &work)?;
            std::fs::write(&result, serde_json::to_vec_pretty(&r)?)?;
        }
        Cmd::Limits {
            work,
            disk_mib,
            quick,
            json,
        } => {
            let sizes = if quick {
                strata_bench::limits::Sizes::quick()
            } else {
                strata_bench::limits::Sizes::full(disk_mib)
            };
            let l = strata_bench::limits::measure_sized(&work, sizes)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&l)?);
            } else {
                println!("cores:                    {}", l.cores);
                println!("FastCDC 8 KiB (1 core):   {:.0} MB/s", l.fastcdc_mb_s);
                println!("BLAKE3 8 KiB (1 core):    {:.0} MB/s", l.blake3_8k_mb_s);
                println!(
                    "zstd -3 128 KiB (1 core): {:.0} MB/s (ratio {:.2})",
                    l.zstd3_mb_s, l.zstd3_ratio
                );
                println!(
                    "disk sequential write:    {:.0} MB/s (fsync)",
                    l.disk_write_mb_s
                );
                println!(
                    "disk sequential read:     {:.0} MB/s ({})",
                    l.disk_read_mb_s,
                    if l.disk_read_cache_dropped {
                        "page cache dropped"
                    } else {
                        "page cache NOT dropped"
                    }
                );
            }
        }
    }
    Ok(())
}
