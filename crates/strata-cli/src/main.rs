//! `strata`: the command-line front end. A thin layer over `strata-store`:
//! argument parsing, passwords, progress bars, human and `--json` output,
//! exit codes (0 ok, 1 fatal error, 3 backup finished with unreadable files).

mod location;
mod output;
mod restore;
mod service;
mod tier;
mod volume;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use output::{fmt_bytes, fmt_time, Out, ProgressDisplay};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use strata_core::chunker::ChunkerParams;
use strata_core::format::{NodeKind, Tier};
use strata_store::backend::Location;
use strata_store::backup::{BackupOptions, StdinSource};
use strata_store::{InitOptions, Repository, StoreError};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Deduplicating, compressing, encrypting backups",
    long_about = "Strata keeps many versions of file trees, disk images and streams in little space.\n\n\
        Repository: --repo DIR, or $STRATA_REPO, or $XDG_DATA_HOME/strata/repo (~/.local/share/strata/repo).\n\
        Password (encrypted repositories): $STRATA_PASSWORD, --password-file, or a prompt on a terminal.\n\n\
        Exit codes: 0 success, 1 error, 3 backup finished but some files could not be read."
)]
pub(crate) struct Cli {
    /// Repository: a directory, or s3://BUCKET/PREFIX[?endpoint=URL&region=R]
    /// (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS
    /// profile; endpoint also from AWS_ENDPOINT_URL; path-style addressing
    /// for an endpoint, virtual-hosted for AWS: &addressing=path|virtual;
    /// bodies sent UNSIGNED-PAYLOAD, checked by Strata itself:
    /// &payload=signed to sign them).
    #[arg(long, short = 'r', global = true, env = "STRATA_REPO")]
    repo: Option<String>,
    /// Read the password from this file (first line).
    #[arg(long, global = true, env = "STRATA_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
    /// Machine-readable JSON on stdout.
    #[arg(long, global = true)]
    json: bool,
    /// Print only errors.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// More detail (repeat for debug logs).
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a new repository.
    Init(InitArgs),
    /// Back up files, directories or stdin as a new version of a series.
    Backup(BackupArgs),
    /// List snapshots (versions).
    Snapshots {
        /// Only this series.
        #[arg(long)]
        series: Option<String>,
    },
    /// List the entries of a snapshot.
    Ls {
        /// Snapshot: id (prefix), `latest`, SERIES@VERSION or SERIES@latest.
        snapshot: String,
        /// Only entries at or below this path.
        path: Option<String>,
    },
    /// Write one file of a snapshot to stdout.
    Dump { snapshot: String, path: String },
    /// Restore a snapshot into a directory.
    Restore {
        snapshot: String,
        /// Directory to restore into (created if missing).
        #[arg(long, short)]
        target: PathBuf,
        /// Restore only these paths (repeatable).
        #[arg(long, short)]
        include: Vec<String>,
        /// Containers read at once (default: the cores; from a bucket,
        /// twice the cores and at least 4, as reads wait on the network).
        #[arg(long)]
        readers: Option<usize>,
    },
    /// Remove snapshots. Reverse-deduplicated (archival) versions free their
    /// stamped data at once; live-form data is freed by `gc` (or `--prune`).
    Forget {
        #[arg(required = true)]
        snapshots: Vec<String>,
        /// Run gc afterwards.
        #[arg(long)]
        prune: bool,
    },
    /// Free the space of data no snapshot references (mark and sweep).
    Gc {
        /// Rewrite containers with more than this fraction of dead data.
        #[arg(long, default_value_t = 0.2)]
        threshold: f64,
        /// Only report what would be freed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show or set the lifecycle policy of a series: how many newest versions
    /// stay live, how many (or how many days of) versions are retained.
    Policy {
        /// The series (all series with a stored policy when omitted).
        series: Option<String>,
        /// Newest versions kept live (segment-level dedup, fastest restore).
        #[arg(long)]
        live: Option<u32>,
        /// Versions retained in all, live ones included.
        #[arg(long, conflicts_with = "retain_all")]
        retain: Option<u32>,
        /// Versions older than this many days expire.
        #[arg(long)]
        retain_days: Option<u32>,
        /// Retain every version (clears --retain and --retain-days).
        #[arg(long)]
        retain_all: bool,
    },
    /// Lifecycle work, out of line (RevDedup): reverse-deduplicate the
    /// versions that left their series' live window against the next
    /// version, delete versions past retention (with their stamped
    /// containers, no scan), and compact the shared pool. Resumable.
    Maintain {
        /// Rewrite pool containers with more than this fraction of dead data.
        #[arg(long, default_value_t = 0.2)]
        threshold: f64,
        /// Also rewrite pool containers with more than this fraction of
        /// data dead or held by one archival version alone, moving such
        /// chunks into containers stamped with their version (expiring it
        /// later deletes them without a scan; the newest versions' containers
        /// stay dense). 1 turns it off.
        #[arg(long, default_value_t = 0.5)]
        separate: f64,
        /// Only report what would be done.
        #[arg(long)]
        dry_run: bool,
    },
    /// Repository statistics: sizes, dedup and compression ratios, and per
    /// series the lifecycle figures.
    Stats {
        /// Only the index strategy: its entries and the RAM it holds.
        #[arg(long)]
        index: bool,
    },
    /// Check the repository's structure (and with --read-data all data).
    Check {
        /// Read and verify every region and chunk.
        #[arg(long)]
        read_data: bool,
    },
    /// Remove locks left by processes that no longer run.
    Unlock {
        /// Remove all locks, even of running processes.
        #[arg(long)]
        all: bool,
    },
    /// What this build supports (index strategies, chunkers, format version).
    Features,
    /// The cloud tier: a bucket holding cold versions as a second dedup
    /// domain (add, estimate, migrate).
    Tier {
        #[command(subcommand)]
        cmd: tier::TierCmd,
    },
    /// Thin, deduplicated block volumes served over NBD (iDedup's inline
    /// dedup of duplicate runs at least --threshold blocks long).
    Volume {
        #[command(subcommand)]
        cmd: volume::VolumeCmd,
    },
    /// Run next to a cloud tier's bucket (--repo s3://…): assembles new
    /// objects from ranges of existing ones for `strata tier gc --service`,
    /// so cleaning the cloud tier downloads nothing.
    CopyForwardService {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8089")]
        listen: String,
    },
    /// Rebuild derived structures.
    Repair {
        #[command(subcommand)]
        what: RepairWhat,
    },
}

#[derive(Subcommand)]
enum RepairWhat {
    /// Rebuild the index from the containers' metadata.
    Index,
}

#[derive(Args)]
struct InitArgs {
    /// Encrypt the repository (asks for a password).
    #[arg(long)]
    encrypt: bool,
    /// Average chunk size in bytes (power of two).
    #[arg(long, default_value_t = 8192)]
    chunk_size: u32,
    /// Average segment size in KiB (default: 2048 for `silo`, its
    /// similarity unit; 4096 otherwise — the coarse dedup unit of
    /// `segment`, where RevDedup §4 trades 1-8 MiB: smaller finds more
    /// duplicates inline and writes less, larger restores faster).
    #[arg(long)]
    segment_kib: Option<u32>,
    /// zstd compression level (1-22).
    #[arg(long, default_value_t = 3)]
    compression: i32,
    /// Target container size in MiB (default: 32 for `segment`, 8 for `exact`).
    #[arg(long)]
    container_mib: Option<u32>,
    /// Index strategy: `segment` (RevDedup: segment-level inline dedup,
    /// reverse dedup by `strata maintain`), `exact` (every chunk in RAM),
    /// `silo` (SiLo: near-exact with a tiny similarity table in RAM) or
    /// `binning` (Extreme Binning, the similarity-only baseline).
    /// Options may follow a colon (`silo:block-mib=128`) or be given with
    /// `--index-opt`.
    #[arg(long, default_value = "segment")]
    index: String,
    /// A tuning option of the index strategy, KEY=VALUE (repeatable). `silo`:
    /// block-mib (data per locality block, default 256), cache-blocks (blocks
    /// in the read cache, 8), reps (representative fingerprints per segment,
    /// 1), record-duplicates (1: duplicate segments join new blocks too, 0).
    #[arg(long = "index-opt", value_name = "KEY=VALUE")]
    index_opt: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ChunkerArg {
    Cdc,
    Fixed,
}

#[derive(Args)]
struct BackupArgs {
    /// Files and directories to back up.
    paths: Vec<PathBuf>,
    /// Series name (default: host and absolute paths).
    #[arg(long)]
    series: Option<String>,
    /// Tag the snapshot (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// Back up standard input as one file.
    #[arg(long)]
    stdin: bool,
    /// File name for --stdin.
    #[arg(long, default_value = "stdin")]
    stdin_name: String,
    /// Read every file even if unchanged since the previous version.
    #[arg(long)]
    force_read: bool,
    /// Chunker: content-defined (default) or fixed 4 KiB (disk images).
    #[arg(long, value_enum)]
    chunker: Option<ChunkerArg>,
    /// Worker threads (default: number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Leave out files matching this glob (name, or absolute path if it contains '/'; repeatable).
    #[arg(long, short = 'e')]
    exclude: Vec<String>,
    /// Run a full `strata maintain` after the backup (by default the
    /// backup runs the incremental lifecycle: reverse dedup of the version
    /// that left the live window, expiry, compaction once it pays).
    #[arg(long, conflicts_with = "no_lifecycle")]
    maintain: bool,
    /// Skip the lifecycle after the backup (`strata maintain` catches up).
    #[arg(long)]
    no_lifecycle: bool,
}

pub(crate) fn read_password(cli: &Cli, confirm: bool) -> Result<Vec<u8>, StoreError> {
    if let Some(f) = &cli.password_file {
        let s = std::fs::read_to_string(f).map_err(|e| {
            StoreError::Invalid(format!(
                "cannot read the password file {}: {e}",
                f.display()
            ))
        })?;
        return Ok(s.lines().next().unwrap_or("").as_bytes().to_vec());
    }
    if let Ok(p) = std::env::var("STRATA_PASSWORD") {
        return Ok(p.into_bytes());
    }
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        let p = rpassword::prompt_password("repository password: ")
            .map_err(|e| StoreError::io("read", "password", e))?;
        if confirm {
            let q = rpassword::prompt_password("repeat password: ")
                .map_err(|e| StoreError::io("read", "password", e))?;
            if p != q {
                return Err(StoreError::Invalid("passwords do not match".into()));
            }
        }
        return Ok(p.into_bytes());
    }
    Err(StoreError::Invalid(
        "the repository is encrypted: set $STRATA_PASSWORD, use --password-file, or run on a terminal".into(),
    ))
}

fn main() {
    // glibc gives every thread that allocates its own malloc arena; with a
    // worker pool and a finisher thread that is tens of MB of memory held
    // in fragments. Two arenas keep the workers from contending while
    // bounding that.
    // SAFETY: mallopt only tunes the allocator; called before any thread.
    // Buffers of a MB and more (read blocks, segments, regions being
    // sealed) are mapped and unmapped on their own instead of fragmenting
    // the heap (a fixed threshold also stops glibc from raising it).
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    let cli = Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (_, 0) => "warn",
        (_, 1) => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .init();
    let out = Out::new(cli.json, cli.quiet);
    let code = match run(&cli, &out) {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}");
            if cli.json {
                println!("{}", json!({ "error": msg }));
            }
            eprintln!("error: {msg}");
            1
        }
    };
    std::process::exit(code);
}

pub(crate) fn repo_location(cli: &Cli) -> Result<Location> {
    location::location(cli.repo.as_deref())
}

pub(crate) fn open(cli: &Cli) -> Result<Repository> {
    let loc = repo_location(cli)?;
    let backend = location::backend(&loc, false)?;
    let repo = Repository::open(backend, &|| read_password(cli, false))
        .with_context(|| format!("opening repository {}", location::describe(&loc)))?;
    Ok(repo)
}

pub(crate) fn progress_for(cli: &Cli, what: &str) -> ProgressDisplay {
    ProgressDisplay::start(
        what,
        !cli.quiet && !cli.json && std::io::stderr().is_terminal(),
    )
}

fn run(cli: &Cli, out: &Out) -> Result<i32> {
    // Checking and repairing read the bucket itself, never local copies.
    if matches!(cli.cmd, Cmd::Check { .. } | Cmd::Repair { .. }) {
        location::NO_OBJECT_CACHE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match &cli.cmd {
        Cmd::Init(a) => {
            let loc = repo_location(cli)?;
            let mut index = a.index.clone();
            for (i, o) in a.index_opt.iter().enumerate() {
                index.push(if i == 0 && !a.index.contains(':') {
                    ':'
                } else {
                    ','
                });
                index.push_str(o);
            }
            // Checked before anything is created on disk.
            let index_name = strata_store::repo::IndexSpec::parse(&index)?.name;
            let backend = location::backend(&loc, true)?;
            let password = if a.encrypt {
                Some(read_password(cli, true)?)
            } else {
                None
            };
            let repo = Repository::init(
                backend,
                InitOptions {
                    password,
                    chunker: ChunkerParams {
                        avg_segment: a
                            .segment_kib
                            .map(|k| k.saturating_mul(1024))
                            .unwrap_or_else(|| {
                                strata_store::repo::default_segment_size(&index_name)
                            }),
                        ..ChunkerParams::cdc(a.chunk_size)
                    },
                    zstd_level: a.compression,
                    container_size: a
                        .container_mib
                        .map(|m| m.max(1) << 20)
                        .unwrap_or_else(|| strata_store::repo::default_container_size(&index_name)),
                    index,
                    ..Default::default()
                },
            )
            .with_context(|| format!("creating repository at {}", location::describe(&loc)))?;
            let c = repo.config();
            out.result(
                &json!({"repository": location::describe(&loc), "id": c.id, "encrypted": c.encrypted, "index": c.index,
                        "chunk_size": c.chunker.avg_chunk, "compression": c.zstd_level}),
                || {
                    format!(
                        "created {} repository {} at {}",
                        if c.encrypted {
                            "encrypted"
                        } else {
                            "unencrypted"
                        },
                        &c.id[..8],
                        location::describe(&loc)
                    )
                },
            );
            Ok(0)
        }
        Cmd::Backup(a) => cmd_backup(cli, out, a),
        Cmd::Snapshots { series } => {
            let repo = open(cli)?;
            let (all, damaged) = repo.list_snapshots_tolerant()?;
            for (id, e) in &damaged {
                out.warn(&format!(
                    "snapshot {id} cannot be read ({e}); `strata forget {id}` drops it"
                ));
            }
            let policies = strata_store::lifecycle::list_policies(&repo)?;
            let states = strata_store::lifecycle::version_states(
                &all,
                &policies,
                strata_store::repo::now_ns(),
            );
            let reversed: std::collections::HashSet<&str> = all
                .iter()
                .filter(|(_, s)| s.archival.is_some())
                .map(|(i, _)| i.as_str())
                .collect();
            // "archival" once reverse-deduplicated; "archival*" while it
            // waits for `strata maintain`.
            let cloud: std::collections::HashSet<&str> = all
                .iter()
                .filter(|(_, s)| s.tier == Tier::Cloud)
                .map(|(i, _)| i.as_str())
                .collect();
            let state = |id: &str| {
                // The lifecycle works on the active tier only.
                if cloud.contains(id) {
                    return "-".to_string();
                }
                let st = states
                    .get(id)
                    .map(|s| format!("{s:?}").to_lowercase())
                    .unwrap_or_default();
                match (st.as_str(), reversed.contains(id)) {
                    ("archival", false) => "archival*".to_string(),
                    (_, true) if st != "archival" => format!("{st} (rev)"),
                    _ => st,
                }
            };
            let list: Vec<_> = all
                .iter()
                .filter(|(_, s)| series.as_ref().is_none_or(|x| &s.series == x))
                .collect();
            if out.json {
                let v: Vec<_> = list
                    .iter()
                    .map(|(id, s)| {
                        json!({"id": id, "short_id": &id[..8], "series": s.series, "version": s.version,
                               "time": fmt_time(s.time_ns), "time_ns": s.time_ns, "host": s.host, "paths": s.paths,
                               "tags": s.tags, "logical_bytes": s.stats.logical_bytes,
                               "new_stored_bytes": s.stats.new_stored_bytes, "files": s.stats.files,
                               "duration_ms": s.stats.duration_ms, "state": state(id),
                               "reverse_deduplicated": s.archival.is_some(),
                               "archival": s.archival,
                               "tier": tier::tier_name(s), "cloud_part": s.cloud_part})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if !out.quiet {
                println!(
                    "{:<10} {:<40} {:>4}  {:<20} {:>10} {:>10}  {:<8} {:<12} tags",
                    "id", "series", "ver", "time (UTC)", "size", "new", "state", "tier"
                );
                for (id, s) in &list {
                    println!(
                        "{:<10} {:<40} {:>4}  {:<20} {:>10} {:>10}  {:<8} {:<12} {}",
                        &id[..8],
                        s.series,
                        s.version,
                        fmt_time(s.time_ns),
                        fmt_bytes(s.stats.logical_bytes),
                        fmt_bytes(s.stats.new_stored_bytes),
                        state(id),
                        tier::tier_name(s),
                        s.tags.join(",")
                    );
                }
                println!("{} snapshots", list.len());
                if list.iter().any(|(id, _)| state(id) == "archival*") {
                    println!("archival* = left the live window; the next backup or `strata maintain` reverse-deduplicates it");
                }
            }
            Ok(0)
        }
        Cmd::Ls { snapshot, path } => {
            let repo = open(cli)?;
            let (_, s) = repo.resolve_snapshot(snapshot)?;
            let r = strata_store::tier::paths::whole_recipe(&repo, &s)?;
            let inc: Vec<String> = path.iter().cloned().collect();
            let nodes: Vec<_> = r
                .nodes
                .iter()
                .filter(|n| inc.is_empty() || inc.iter().any(|p| restore::under(&n.path, p)))
                .collect();
            restore::all_matched(&r, &inc, snapshot)?;
            if out.json {
                let v: Vec<_> = nodes
                    .iter()
                    .map(|n| {
                        json!({"path": format!("/{}", n.path_str()), "type": format!("{:?}", n.kind).to_lowercase(),
                               "size": n.size, "mode": n.mode & 0o7777, "uid": n.uid, "gid": n.gid,
                               "mtime": fmt_time(n.mtime_ns),
                               "target": n.target.as_ref().map(|t| String::from_utf8_lossy(t).into_owned())})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for n in nodes {
                    let t = match n.kind {
                        NodeKind::Dir => 'd',
                        NodeKind::Symlink => 'l',
                        NodeKind::Hardlink => 'h',
                        NodeKind::Fifo => 'p',
                        NodeKind::CharDevice => 'c',
                        NodeKind::BlockDevice => 'b',
                        NodeKind::Socket => 's',
                        NodeKind::File => '-',
                    };
                    let extra = n
                        .target
                        .as_ref()
                        .map(|t| format!(" -> {}", String::from_utf8_lossy(t)))
                        .unwrap_or_default();
                    println!(
                        "{t}{:04o} {:>5} {:>5} {:>12} {} /{}{extra}",
                        n.mode & 0o7777,
                        n.uid,
                        n.gid,
                        n.size,
                        fmt_time(n.mtime_ns),
                        n.path_str()
                    );
                }
            }
            Ok(0)
        }
        Cmd::Dump { snapshot, path } => restore::dump(cli, snapshot, path),
        Cmd::Restore {
            snapshot,
            target,
            include,
            readers,
        } => restore::restore(cli, out, snapshot, target, include, *readers),
        Cmd::Forget { snapshots, prune } => {
            let repo = open(cli)?;
            let (all, damaged) = repo.list_snapshots_tolerant()?;
            let mut ids = Vec::new();
            for s in snapshots {
                // A damaged snapshot can be named by its full id.
                match damaged.iter().find(|(id, _)| id == s) {
                    Some((id, _)) => ids.push(id.clone()),
                    None => ids.push(strata_store::repo::resolve_in(&all, s)?.0),
                }
            }
            ids.sort();
            ids.dedup();
            let started = std::time::Instant::now();
            let (cloud_ids, ids): (Vec<String>, Vec<String>) = ids
                .into_iter()
                .partition(|id| all.iter().any(|(i, s)| i == id && s.tier == Tier::Cloud));
            let mut cloud_forgotten = 0;
            if !cloud_ids.is_empty() {
                let c = tier::cloud(&repo)?;
                cloud_forgotten = strata_store::tier::forget_cloud(&repo, &c, &cloud_ids)?;
            }
            // Active versions some of whose files are in the cloud tier:
            // the bucket forgets those parts once the versions are gone.
            let parts: Vec<(String, String)> = all
                .iter()
                .filter(|(i, s)| ids.contains(i) && s.tier == Tier::Active)
                .filter_map(|(i, s)| Some((i.clone(), s.cloud_part.as_ref()?.recipe.clone())))
                .collect();
            let part_tier = match parts.is_empty() {
                true => None,
                false => Some(tier::cloud(&repo)?),
            };
            let mut rep = if ids.is_empty() {
                Default::default()
            } else {
                strata_store::forget::forget(&repo, &ids)?
            };
            if let Some(c) = &part_tier {
                cloud_forgotten += strata_store::tier::forget_cloud_parts(c, &parts)?;
            }
            rep.removed_snapshots.extend(cloud_ids);
            let mut v = serde_json::to_value(&rep)?;
            v["cloud_snapshots_removed"] = json!(cloud_forgotten);
            v["seconds"] = json!(started.elapsed().as_secs_f64());
            out.result(&v, || {
                let mut t = format!("removed {} snapshots", rep.removed_snapshots.len());
                if rep.stamped_containers_deleted > 0 {
                    t += &format!(
                        "; freed {} of archival data ({} stamped containers)",
                        fmt_bytes(rep.stamped_bytes_freed),
                        rep.stamped_containers_deleted
                    );
                }
                if !rep.rebased.is_empty() {
                    t += &format!(
                        "; re-pointed {} archival versions that referenced them",
                        rep.rebased.len()
                    );
                }
                t
            });
            if *prune {
                return gc_cmd(cli, out, &repo, 0.2, false);
            }
            Ok(0)
        }
        Cmd::Maintain {
            threshold,
            separate,
            dry_run,
        } => {
            let repo = open(cli)?;
            if !(0.0..=1.0).contains(separate) {
                bail!("--separate must be between 0 and 1");
            }
            maintain_cmd(cli, out, &repo, (*threshold, *separate), *dry_run)
        }
        Cmd::Gc { threshold, dry_run } => {
            let repo = open(cli)?;
            gc_cmd(cli, out, &repo, *threshold, *dry_run)
        }
        Cmd::Policy {
            series,
            live,
            retain,
            retain_days,
            retain_all,
        } => {
            use strata_store::lifecycle::{list_policies, policy_of, set_policy};
            let repo = open(cli)?;
            let mut policies = list_policies(&repo)?;
            let changing =
                live.is_some() || retain.is_some() || retain_days.is_some() || *retain_all;
            if let Some(series) = series {
                let mut p = policy_of(&policies, series);
                if changing {
                    if !repo
                        .list_snapshots_tolerant()?
                        .0
                        .iter()
                        .any(|(_, s)| &s.series == series)
                    {
                        out.warn(&format!("no snapshot of series {series:?} yet; the policy applies once there is"));
                    }
                    if let Some(l) = live {
                        p.live = *l;
                    }
                    if let Some(r) = retain {
                        p.retain = Some(*r);
                    }
                    if let Some(d) = retain_days {
                        p.retain_days = Some(*d);
                    }
                    if *retain_all {
                        p.retain = None;
                        p.retain_days = None;
                    }
                    set_policy(&repo, &p)?;
                }
                policies.insert(series.clone(), p);
            }
            let mut list: Vec<_> = policies
                .values()
                .filter(|p| series.as_ref().is_none_or(|s| &p.series == s))
                .cloned()
                .collect();
            list.sort_by(|a, b| a.series.cmp(&b.series));
            out.result(&serde_json::to_value(&list)?, || {
                let mut t = String::new();
                for p in &list {
                    t += &format!(
                        "{}: live {}, retain {}{}\n",
                        p.series,
                        p.live,
                        p.retain
                            .map(|r| format!("{r} versions"))
                            .unwrap_or_else(|| "all versions".into()),
                        p.retain_days
                            .map(|d| format!(", at most {d} days"))
                            .unwrap_or_default()
                    );
                }
                if list.is_empty() {
                    t = "no policies set (default: live 1, retain all)".into();
                }
                t.trim_end().to_string()
            });
            Ok(0)
        }
        Cmd::Stats { index: true } => {
            let repo = open(cli)?;
            let table = Arc::new(strata_store::index::ContainerTable::default());
            let (strategy, idx) = strata_store::index::build_strategy(&repo, &table)?;
            let v = json!({"index_strategy": repo.config().index, "index_entries": strategy.entries(),
                           "index_ram_bytes": strategy.ram_bytes(), "containers": idx.containers.len()});
            out.result(&v, || {
                format!(
                    "index: {} — {} entries, {} in RAM ({} containers known)",
                    repo.config().index,
                    strategy.entries(),
                    fmt_bytes(strategy.ram_bytes()),
                    idx.containers.len()
                )
            });
            Ok(0)
        }
        Cmd::Stats { index: false } => {
            let repo = open(cli)?;
            let st = strata_store::stats::stats(&repo)?;
            out.result(&serde_json::to_value(&st)?, || {
                format!(
                    "snapshots:          {} in {} series\n\
                     logical size:       {}\n\
                     unique data:        {} in {} chunks, {} segments\n\
                     stored (data):      {} in {} containers\n\
                     repository total:   {}\n\
                     dedup ratio:        {:.2}x\n\
                     compression ratio:  {:.2}x\n\
                     total ratio:        {:.2}x ({:.1}% space saved)\n\
                     index:              {} ({} entries, {} RAM)\n\
                     pool / archival:    {} shared pool, {} stamped archival containers\n\
                     space saved:        {:.1}% by segment-level dedup, {:.1}% more by reverse dedup (before compression){}",
                    st.snapshots,
                    st.series,
                    fmt_bytes(st.logical_bytes),
                    fmt_bytes(st.unique_raw_bytes),
                    st.chunks,
                    st.segments,
                    fmt_bytes(st.stored_bytes),
                    st.containers,
                    fmt_bytes(st.total_repo_bytes),
                    st.dedup_ratio,
                    st.compression_ratio,
                    st.total_ratio,
                    st.space_saving_pct,
                    st.index_strategy,
                    st.index_entries,
                    fmt_bytes(st.index_ram_bytes),
                    fmt_bytes(st.pool_bytes),
                    fmt_bytes(st.stamped_bytes),
                    st.saving_segment_pct,
                    st.saving_reverse_pct,
                    series_table(&st.series_stats)
                )
            });
            Ok(0)
        }
        Cmd::Check { read_data } => {
            let repo = open(cli)?;
            let pd = progress_for(cli, "check");
            let opts = strata_store::check::CheckOptions {
                read_data: *read_data,
                progress: pd.progress.clone(),
            };
            let res = strata_store::check::check(&repo, &opts);
            pd.finish();
            let rep = res?;
            for w in &rep.warnings {
                out.warn(w);
            }
            if !out.json {
                for e in &rep.errors {
                    eprintln!("error: {e}");
                }
            }
            out.result(&serde_json::to_value(&rep)?, || {
                if rep.ok() {
                    format!(
                        "no errors: {} snapshots, {} containers, {} chunks{}",
                        rep.snapshots,
                        rep.containers,
                        rep.chunks,
                        if *read_data {
                            format!(
                                ", {} regions and {} read and verified",
                                rep.regions_read,
                                fmt_bytes(rep.bytes_read)
                            )
                        } else {
                            String::new()
                        }
                    )
                } else {
                    format!(
                        "{} errors; damaged snapshots: {}",
                        rep.errors.len(),
                        rep.damaged_snapshots
                            .iter()
                            .map(|s| &s[..8])
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            });
            Ok(if rep.ok() { 0 } else { 1 })
        }
        Cmd::Features => {
            let strategies = strata_store::repo::INDEX_STRATEGIES;
            out.result(
                &json!({"version": env!("CARGO_PKG_VERSION"),
                        "repository_format": strata_core::format::REPO_FORMAT_VERSION,
                        "index_strategies": strategies, "chunkers": ["cdc", "fixed"],
                        "maintain": true, "lifecycle": ["revdedup"], "lifecycle_after_backup": true,
                        "encryption": ["none", "xchacha20poly1305"], "backends": ["local"]}),
                || {
                    format!(
                        "strata {}\nrepository format {}\nindex strategies: {}\nlifecycle: revdedup (after every backup, and strata maintain)\nchunkers: cdc, fixed\nbackends: local",
                        env!("CARGO_PKG_VERSION"),
                        strata_core::format::REPO_FORMAT_VERSION,
                        strategies.join(", ")
                    )
                },
            );
            Ok(0)
        }
        Cmd::Unlock { all } => {
            let repo = open(cli)?;
            let removed = strata_store::lock::unlock(&repo, *all)?;
            out.result(&json!({ "removed": removed }), || {
                format!("removed {} locks", removed.len())
            });
            Ok(0)
        }
        Cmd::Tier { cmd } => tier::run(cli, out, cmd),
        Cmd::Volume { cmd } => volume::run(cli, out, cmd),
        Cmd::CopyForwardService { listen } => service::run(cli.repo.as_deref(), listen),
        Cmd::Repair {
            what: RepairWhat::Index,
        } => {
            let repo = open(cli)?;
            let (n, problems) = strata_store::gc::repair_index(&repo)?;
            for p in &problems {
                out.warn(p);
            }
            out.result(&json!({"containers": n, "problems": problems}), || {
                format!("index rebuilt from {n} containers")
            });
            Ok(if problems.is_empty() { 0 } else { 3 })
        }
    }
}

fn series_table(list: &[strata_store::stats::SeriesStats]) -> String {
    if list.is_empty() {
        return String::new();
    }
    let mut t = format!(
        "\n\n{:<40} {:>5} {:>5} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>6}",
        "series",
        "live",
        "arch",
        "(pending)",
        "expired",
        "logical",
        "indirect",
        "rev-freed",
        "stamped",
        "chain"
    );
    for s in list {
        t += &format!(
            "\n{:<40} {:>5} {:>5} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>6.2}",
            s.series,
            s.live,
            s.archival,
            s.pending,
            s.expired,
            fmt_bytes(s.logical_bytes),
            fmt_bytes(s.indirect_bytes),
            fmt_bytes(s.reverse_freed_bytes),
            fmt_bytes(s.stamped_bytes),
            s.avg_chain_length
        );
    }
    t += "\n(rev-freed: pool space reverse dedup freed; indirect: bytes old versions reach through newer ones)";
    t
}

fn gc_cmd(cli: &Cli, out: &Out, repo: &Repository, threshold: f64, dry_run: bool) -> Result<i32> {
    if !(0.0..=1.0).contains(&threshold) {
        bail!("--threshold must be between 0 and 1");
    }
    let pd = progress_for(cli, "gc");
    let opts = strata_store::gc::GcOptions {
        threshold,
        dry_run,
        progress: pd.progress.clone(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let res = strata_store::gc::gc(repo, &opts);
    pd.finish();
    let rep = res?;
    let mut v = serde_json::to_value(&rep)?;
    v["seconds"] = json!(started.elapsed().as_secs_f64());
    out.result(&v, || {
        format!(
            "{}{} freed: {} containers deleted, {} rewritten into {}, {} orphans removed; {} -> {}",
            if dry_run { "(dry run) " } else { "" },
            fmt_bytes(rep.bytes_freed),
            rep.containers_deleted,
            rep.containers_rewritten,
            rep.containers_written,
            rep.orphans_deleted,
            fmt_bytes(rep.bytes_before),
            fmt_bytes(rep.bytes_after)
        )
    });
    Ok(0)
}

fn maintain_cmd(
    cli: &Cli,
    out: &Out,
    repo: &Repository,
    thresholds: (f64, f64),
    dry_run: bool,
) -> Result<i32> {
    let (rep, secs) = run_maintain(cli, repo, thresholds, dry_run)?;
    let mut v = serde_json::to_value(&rep)?;
    v["seconds"] = json!(secs);
    out.result(&v, || maintain_text(&rep, secs));
    Ok(0)
}

fn run_maintain(
    cli: &Cli,
    repo: &Repository,
    (threshold, separate): (f64, f64),
    dry_run: bool,
) -> Result<(strata_store::revdedup::MaintainReport, f64)> {
    if !(0.0..=1.0).contains(&threshold) {
        bail!("--threshold must be between 0 and 1");
    }
    let pd = progress_for(cli, "maintain");
    let opts = strata_store::revdedup::MaintainOptions {
        threshold,
        separate,
        dry_run,
        progress: pd.progress.clone(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let res = strata_store::revdedup::maintain(repo, &opts);
    pd.finish();
    Ok((res?, started.elapsed().as_secs_f64()))
}

fn maintain_text(rep: &strata_store::revdedup::MaintainReport, secs: f64) -> String {
    let mut t = String::new();
    let pre = if rep.dry_run { "(dry run) " } else { "" };
    for c in &rep.converted {
        t += &format!(
            "{pre}reverse-deduplicated {}@{} against the next version: {} indirect, {} kept direct\n",
            c.series,
            c.version,
            fmt_bytes(c.indirect_bytes),
            fmt_bytes(c.direct_bytes),
        );
    }
    if !rep.expired.is_empty() {
        t += &format!(
            "{pre}expired {} versions: {} of archival data freed without scanning ({} stamped containers)\n",
            rep.expired.len(),
            fmt_bytes(rep.stamped_bytes_freed),
            rep.stamped_containers_deleted
        );
    }
    if rep.leftovers_deleted > 0 {
        t += &format!(
            "removed {} containers left by an interrupted run\n",
            rep.leftovers_deleted
        );
    }
    t += &format!(
        "{pre}pool: {} containers dropped, {} rewritten into {} ({} moved to stamped containers); {} -> {} ({secs:.1}s)",
        rep.pool.containers_deleted,
        rep.pool.containers_rewritten,
        rep.pool.containers_written,
        fmt_bytes(rep.pool.bytes_separated),
        fmt_bytes(rep.bytes_before),
        fmt_bytes(rep.bytes_after),
    );
    t
}

/// The process's peak resident memory so far (`VmHWM`), if the system
/// tells.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One line on what the lifecycle after a backup did.
fn lifecycle_text(l: &strata_store::revdedup::AfterBackup, secs: f64) -> String {
    use strata_store::revdedup::AfterBackup;
    match l {
        AfterBackup::Done(m) => {
            let mut parts = Vec::new();
            for c in &m.converted {
                parts.push(format!(
                    "{}@{} reverse-deduplicated ({} now indirect)",
                    c.series,
                    c.version,
                    fmt_bytes(c.indirect_bytes)
                ));
            }
            if !m.expired.is_empty() {
                parts.push(format!("{} versions expired", m.expired.len()));
            }
            if m.compacted {
                parts.push(format!(
                    "pool compacted ({} freed)",
                    fmt_bytes(m.bytes_before.saturating_sub(m.bytes_after))
                ));
            }
            if parts.is_empty() {
                parts.push("nothing to do".into());
            }
            format!("  lifecycle: {} ({secs:.1}s)", parts.join("; "))
        }
        AfterBackup::Skipped { reason } => format!("  lifecycle skipped: {reason}"),
        AfterBackup::Failed { error } => format!("  lifecycle failed: {error}"),
    }
}

fn cmd_backup(cli: &Cli, out: &Out, a: &BackupArgs) -> Result<i32> {
    let repo = open(cli)?;
    if a.paths.is_empty() && !a.stdin {
        bail!("nothing to back up: give one or more paths, or --stdin");
    }
    let pd = progress_for(cli, "backup");
    let mut opts = BackupOptions {
        paths: a.paths.clone(),
        series: a.series.clone(),
        tags: a.tag.clone(),
        force_read: a.force_read,
        chunker: a.chunker.map(|c| match c {
            ChunkerArg::Cdc => repo.config().chunker,
            ChunkerArg::Fixed => ChunkerParams::fixed(),
        }),
        progress: pd.progress.clone(),
        excludes: a.exclude.clone(),
        // Never back the repository up into itself.
        exclude_paths: match repo_location(cli)? {
            Location::Local(p) => std::fs::canonicalize(p).into_iter().collect(),
            Location::S3(_) => vec![],
        },
        lifecycle: !a.no_lifecycle && !a.maintain,
        ..Default::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    if a.stdin {
        opts.stdin = Some(StdinSource {
            reader: Box::new(std::io::stdin()),
            name: a.stdin_name.clone(),
        });
    }
    let res = strata_store::backup::backup(&repo, opts);
    pd.finish();
    let rep = res?;
    for w in &rep.warnings {
        out.warn(w);
    }
    let s = &rep.snapshot;
    let secs = s.stats.duration_ms as f64 / 1000.0;
    // `--maintain`: the lifecycle runs once the backup is committed (and
    // its shared lock released); its report joins the backup's output.
    let maintained = if a.maintain {
        Some(run_maintain(cli, &repo, (0.2, 0.5), false)?)
    } else {
        None
    };
    let mut v = json!({"id": rep.id, "short_id": &rep.id[..8], "series": s.series, "version": s.version,
                "files": s.stats.files, "dirs": s.stats.dirs, "logical_bytes": s.stats.logical_bytes,
                "read_bytes": s.stats.read_bytes, "new_chunks": s.stats.new_chunks,
                "new_raw_bytes": s.stats.new_raw_bytes, "new_stored_bytes": s.stats.new_stored_bytes,
                "reused_files": rep.reused_files, "seconds": secs, "index_ram_bytes": rep.index_ram_bytes,
                "warnings": rep.warnings, "threads": rep.threads, "stages": rep.stages,
                "parent_bytes": rep.parent_bytes, "similar_bytes": rep.similar_bytes,
                "peak_rss_bytes": peak_rss_bytes()});
    if let Some((m, msecs)) = &maintained {
        v["maintain"] = serde_json::to_value(m)?;
        v["maintain"]["seconds"] = json!(msecs);
    }
    if let Some((l, lsecs)) = &rep.lifecycle {
        v["lifecycle"] = serde_json::to_value(l)?;
        v["lifecycle"]["seconds"] = json!(lsecs);
        if let strata_store::revdedup::AfterBackup::Failed { error } = l {
            out.warn(&format!("the lifecycle after the backup failed (the backup is committed): {error}; run `strata maintain`"));
        }
    }
    out.result(
        &v,
        || {
            let text = format!(
                "snapshot {} saved: {}@{}\n  {} files ({} unchanged), {} dirs, {} logical, {} read\n  {} new chunks, {} new data, {} added to the repository\n  {:.1}s ({}/s)",
                &rep.id[..8],
                s.series,
                s.version,
                s.stats.files,
                rep.reused_files,
                s.stats.dirs,
                fmt_bytes(s.stats.logical_bytes),
                fmt_bytes(s.stats.read_bytes),
                s.stats.new_chunks,
                fmt_bytes(s.stats.new_raw_bytes),
                fmt_bytes(s.stats.new_stored_bytes),
                secs,
                fmt_bytes((s.stats.logical_bytes as f64 / secs.max(1e-3)) as u64)
            );
            let mut text = match &rep.lifecycle {
                Some((l, lsecs)) => format!("{text}\n{}", lifecycle_text(l, *lsecs)),
                None => text,
            };
            if cli.verbose > 0 {
                text += &format!("\n  stages ({} workers; busy seconds, busy/wall):", rep.threads);
                for st in &rep.stages {
                    text += &format!(
                        "\n    {:<9} {:>7.2}s {:>5.2}  {}",
                        serde_json::to_value(st.stage)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default(),
                        st.busy_seconds,
                        st.busy_of_wall,
                        fmt_bytes(st.bytes)
                    );
                }
            }
            match &maintained {
                Some((m, msecs)) => format!("{text}\n{}", maintain_text(m, *msecs)),
                None => text,
            }
        },
    );
    let code = if rep.warnings.is_empty() {
        0
    } else {
        if !out.json {
            eprintln!(
                "warning: {} files or directories could not be read (listed above)",
                rep.warnings.len()
            );
        }
        3
    };
    Ok(code)
}
