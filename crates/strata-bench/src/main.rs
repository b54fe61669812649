//! `strata-bench`: generate workloads, run them through Strata and its
//! peers side by side, regenerate reports, measure machine limits.
//! See docs/benchmarks.md.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use strata_bench::gen::{self, GenOptions};
use strata_bench::indextrace::{run_all, write_report, StrategyResult, TraceRun};
use strata_bench::limits::Limits;
use strata_bench::runner::{self, RunOptions};
use strata_bench::s3::S3Server;
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
    Gen(GenCmd),
    /// Run a scenario through several systems side by side.
    Run(RunCmd),
    /// Compare index strategies (exact, SiLo, Extreme Binning) on a
    /// fingerprint trace, without data (SiLo §4): duplicates eliminated,
    /// index RAM and its growth per TB, throughput, on-disk index accesses.
    IndexTrace(IndexTraceCmd),
    /// One strategy of an index trace run (used by `index-trace`).
    #[command(hide = true)]
    IndexTraceOne(IndexTraceOneCmd),
    /// Regenerate charts and summary from a saved results.json directory.
    Report { dir: PathBuf },
    /// Measure this machine's chunking, hashing, compression and disk limits.
    Limits(LimitsCmd),
    /// What delta compression of near-duplicate chunks would store for a
    /// series of trees (e.g. a project's releases), beside exact dedup alone.
    Delta(DeltaCmd),
}

/// Arguments of `delta`.
#[derive(clap::Args)]
struct DeltaCmd {
    /// The versions in order, or one directory whose subdirectories are
    /// the versions (taken in natural order: 4.2.2 before 4.2.10).
    #[arg(required = true)]
    versions: Vec<PathBuf>,
    /// How a new chunk finds its base (`none`: exact dedup alone).
    #[arg(long, value_enum, default_value = "both")]
    hint: strata_bench::deltasim::Hint,
    /// Keep a delta when it is at most this fraction of the chunk zstd'd alone.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,
    #[arg(long, default_value_t = 8192)]
    avg_chunk: u32,
    /// Look sketches up among the same version's chunks only.
    #[arg(long)]
    version_sketches: bool,
    #[arg(long, default_value_t = 3)]
    level: i32,
    #[arg(long)]
    json: bool,
}

/// Arguments of `gen`.
#[derive(clap::Args)]
struct GenCmd {
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
}

/// Arguments of `run`.
#[derive(clap::Args)]
struct RunCmd {
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
}

/// Arguments of `index-trace`.
#[derive(clap::Args)]
struct IndexTraceCmd {
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
}

impl IndexTraceCmd {
    /// The trace run these arguments describe.
    fn trace_run(&self) -> TraceRun {
        TraceRun {
            seed: self.seed,
            dataset_bytes: self.dataset,
            versions: self.versions,
            change_rate: self.change_rate,
            segment_bytes: self.segment,
            block_bytes: self.block,
            cache_blocks: self.cache_blocks,
            file_bytes: self.file,
            record_duplicate_segments: self.record_duplicates,
        }
    }
}

/// Arguments of `index-trace-one`.
#[derive(clap::Args)]
struct IndexTraceOneCmd {
    #[arg(long)]
    spec: PathBuf,
    #[arg(long)]
    strategy: String,
    #[arg(long)]
    work: PathBuf,
    #[arg(long)]
    result: PathBuf,
}

/// Arguments of `limits`.
#[derive(clap::Args)]
struct LimitsCmd {
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

/// Seconds since the Unix epoch, to name result directories.
fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{secs}")
}

/// `gen`: a version of a tree workload into `out` (every series, one
/// directory each, with its digest on stdout), or a stream (`gen_stream`).
fn gen_cmd(c: GenCmd) -> Result<()> {
    let GenCmd {
        gen,
        out,
        version,
        size,
        volume_size,
    } = c;
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
    Ok(())
}

/// `run`: the scenario through the chosen systems; prints the summary.
fn run_cmd(c: RunCmd) -> Result<()> {
    let bin = strata_bin(c.strata)?;
    let strategies =
        systems::Strata::strategies(&bin).context("asking strata for its index strategies")?;
    let wanted = c.systems.unwrap_or_else(|| {
        let mut v: Vec<String> = strategies.iter().map(|s| format!("strata-{s}")).collect();
        v.push("restic".into());
        v.push("borg".into());
        v
    });
    let Selection { mut list, skipped } =
        select_systems(&wanted, &bin, &strategies, c.strata_force_read)?;
    let out_dir = c
        .out
        .join(format!("{}-{}", scenario_name(&c.gen), timestamp()));
    // The `+s3` systems keep their repositories in a real S3 server
    // on loopback, started here for the run.
    let _s3 = start_s3(&mut list, &c.work)?;
    let opts = RunOptions {
        scenario: c.gen.kind.clone(),
        gen: c.gen.options(),
        work: c.work,
        out: out_dir.clone(),
        restore_every: c.restore_every,
        restore_first_series_only: c.restore_first_series_only,
        deletes: !c.no_deletes,
        repeat: c.repeat,
        limits: (!c.no_limits).then(strata_bench::limits::Sizes::quick),
    };
    let res = runner::run(&opts, &mut list, skipped)?;
    println!("{}", runner::summary_markdown(&res));
    println!("results in {}", out_dir.display());
    Ok(())
}

/// The systems a run compares, and why any wanted peer is not among them.
struct Selection {
    list: Vec<Box<dyn System>>,
    /// One note per peer skipped because it is not installed.
    skipped: Vec<String>,
}

/// The systems `wanted` names, skipping (with a note) peers that are not
/// installed.
fn select_systems(
    wanted: &[String],
    bin: &Path,
    strategies: &[String],
    force_read: bool,
) -> Result<Selection> {
    let mut list: Vec<Box<dyn System>> = Vec::new();
    let mut skipped = Vec::new();
    for w in wanted {
        match w.as_str() {
            "restic" | "borg" | "restic+s3" if !systems::installed(w.trim_end_matches("+s3")) => {
                let msg = format!("{w} is not installed (scripts/bench-peers-install installs it)");
                eprintln!("skipping {msg}");
                skipped.push(msg);
            }
            "restic" => list.push(Box::new(systems::Restic::default())),
            "restic+s3" => list.push(Box::new(systems::Restic::on_s3())),
            "borg" => list.push(Box::new(systems::Borg)),
            s if s.starts_with("strata-") => {
                list.push(Box::new(strata_system(bin, s, strategies, force_read)?))
            }
            other => bail!(
                "unknown system {other:?}: use strata-<index>[+option=value...][+s3], restic[+s3] or borg"
            ),
        }
    }
    Ok(Selection { list, skipped })
}

/// Strata as `spec` (`strata-<index>[+option=value...]`) describes it,
/// checked against the index strategies the binary has.
fn strata_system(
    bin: &Path,
    spec: &str,
    strategies: &[String],
    force_read: bool,
) -> Result<systems::Strata> {
    let mut sys = systems::Strata::from_spec(bin.to_path_buf(), spec)?;
    sys.force_read = force_read;
    if !strategies.contains(&sys.index) {
        bail!(
            "strata has no index strategy {:?} (it has: {})",
            sys.index,
            strategies.join(", ")
        );
    }
    Ok(sys)
}

/// The scenario's name in its results directory: kind, preset, `-image`.
fn scenario_name(gen: &GenArgs) -> String {
    format!("{}-{}", gen.kind, gen.preset.clone().unwrap_or_default())
        .trim_end_matches('-')
        .to_lowercase()
        + if gen.image { "-image" } else { "" }
}

/// Starts the S3 server in `work` and points the `+s3` systems at it, if
/// any of them wants it (the server stops when dropped).
fn start_s3(list: &mut [Box<dyn System>], work: &Path) -> Result<Option<S3Server>> {
    if !list.iter().any(|s| s.wants_s3()) {
        return Ok(None);
    }
    let server = S3Server::start(&work.join("s3"))?;
    for s in list.iter_mut().filter(|s| s.wants_s3()) {
        s.set_s3(server.target.clone());
    }
    Ok(Some(server))
}

/// `report`: charts and summary again from `dir`/results.json.
fn report_cmd(dir: &Path) -> Result<()> {
    let mut res: runner::RunResults = serde_json::from_slice(
        &std::fs::read(dir.join("results.json"))
            .with_context(|| format!("reading {}/results.json", dir.display()))?,
    )?;
    // Results saved before the cumulative columns existed.
    runner::fill_cumulative(&mut res.backups);
    runner::write_outputs(&res, dir)?;
    println!("{}", runner::summary_markdown(&res));
    Ok(())
}

/// `index-trace`: every strategy on the trace and a report, or the SiLo
/// size sweep.
fn index_trace_cmd(c: IndexTraceCmd) -> Result<()> {
    let exe = std::env::current_exe().context("locating strata-bench")?;
    let base = c.trace_run();
    let stamp = timestamp();
    if c.sweep {
        let dir = c.out.join(format!("index-sweep-{stamp}"));
        index_sweep(&exe, &base, &c.work, &dir)
    } else {
        let results = run_all(&exe, &base, &c.strategies, &c.work)?;
        let dir = c.out.join(format!("index-trace-{stamp}"));
        let summary = write_report(&dir, &base, &results)?;
        println!("{}", std::fs::read_to_string(&summary)?);
        println!("results in {}", dir.display());
        Ok(())
    }
}

/// `index-trace --sweep`: SiLo over a grid of segment and block sizes,
/// against what exact eliminates; table, chart and results into `dir`.
fn index_sweep(exe: &Path, base: &TraceRun, work: &Path, dir: &Path) -> Result<()> {
    let exact = run_all(exe, base, &["exact".to_string()], work)?;
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
            let mut r = run_all(exe, &run, &["silo".to_string()], work)?;
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
    write_sweep(dir, base, &table, &lines, &all)?;
    println!("{table}\nresults in {}", dir.display());
    Ok(())
}

/// Writes the sweep's chart, table and results into `dir`.
fn write_sweep(
    dir: &Path,
    base: &TraceRun,
    table: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    all: &[StrategyResult],
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("sweep.svg"),
        strata_bench::chart::line_chart(
            "SiLo: duplicates eliminated vs block size (Figure 9)",
            "block MiB",
            "% of exact's",
            lines,
        ),
    )?;
    std::fs::write(dir.join("sweep.md"), table)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"run": base, "results": all}))?,
    )?;
    Ok(())
}

/// `index-trace-one`: one strategy in this process, its result to a file.
fn index_trace_one_cmd(c: IndexTraceOneCmd) -> Result<()> {
    let run: TraceRun = serde_json::from_slice(&std::fs::read(&c.spec)?)?;
    let r = strata_bench::indextrace::run_strategy(&run, &c.strategy, &c.work)?;
    std::fs::write(&c.result, serde_json::to_vec_pretty(&r)?)?;
    Ok(())
}

/// `limits`: measures the machine and prints the figures (or JSON).
fn limits_cmd(c: LimitsCmd) -> Result<()> {
    let sizes = if c.quick {
        strata_bench::limits::Sizes::quick()
    } else {
        strata_bench::limits::Sizes::full(c.disk_mib)
    };
    let l = strata_bench::limits::measure_sized(&c.work, sizes)?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&l)?);
    } else {
        print_limits(&l);
    }
    Ok(())
}

/// Natural order of names: runs of digits compare as numbers.
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let text_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (text, tail) = rest.split_at(text_len);
        let num_len = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (num, tail) = tail.split_at(num_len);
        out.push((text.to_lowercase(), num.parse().unwrap_or(u64::MAX)));
        rest = tail;
    }
    out
}

fn delta_cmd(c: DeltaCmd) -> Result<()> {
    let versions = match c.versions.as_slice() {
        [one] => {
            let mut v: Vec<PathBuf> = std::fs::read_dir(one)?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect();
            v.sort_by_key(|p| natural_key(&p.file_name().unwrap_or_default().to_string_lossy()));
            v
        }
        many => many.to_vec(),
    };
    let settings = strata_bench::deltasim::Settings {
        avg_chunk: c.avg_chunk,
        level: c.level,
        hint: c.hint,
        threshold: c.threshold,
        region: 128 << 10,
        version_sketches: c.version_sketches,
    };
    let figures = strata_bench::deltasim::run(&versions, &settings)?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
        return Ok(());
    }
    println!(
        "{:<24} {:>10} {:>8} {:>10} {:>7} {:>7} {:>10} {:>7}",
        "version", "logical", "new", "new bytes", "cands", "deltas", "stored", "s"
    );
    for f in &figures {
        println!(
            "{:<24} {:>10} {:>8} {:>10} {:>7} {:>7} {:>10} {:>7.2}",
            f.name,
            f.logical,
            f.new_chunks,
            f.new_bytes,
            f.candidates,
            f.delta_chunks,
            f.stored,
            f.seconds
        );
    }
    let total: u64 = figures.iter().map(|f| f.stored).sum();
    let logical: u64 = figures.iter().map(|f| f.logical).sum();
    println!(
        "total stored {total} bytes of {logical} logical ({:?}, threshold {})",
        c.hint, c.threshold
    );
    Ok(())
}

/// The machine's limits as aligned lines on stdout.
fn print_limits(l: &Limits) {
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

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Gen(c) => gen_cmd(c),
        Cmd::Run(c) => run_cmd(c),
        Cmd::Report { dir } => report_cmd(&dir),
        Cmd::IndexTrace(c) => index_trace_cmd(c),
        Cmd::IndexTraceOne(c) => index_trace_one_cmd(c),
        Cmd::Limits(c) => limits_cmd(c),
        Cmd::Delta(c) => delta_cmd(c),
    }
}
