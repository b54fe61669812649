//! The options every command takes (repository, password, output), and
//! what commands do with them: open the repository and its cloud tier,
//! read the password, show progress.

use crate::location;
use crate::output::ProgressDisplay;
use crate::password::Sources;
use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::PathBuf;
use strata_store::backend::Location;
use strata_store::{Repository, StoreError};

// The global options, flattened into the parser (main.rs). (A doc
// comment here would become every command's description.)
#[derive(clap::Args)]
pub(crate) struct Cli {
    /// Repository: a directory, or s3://BUCKET/PREFIX[?endpoint=URL&region=R]
    /// (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS
    /// profile; endpoint also from AWS_ENDPOINT_URL; path-style addressing
    /// for an endpoint, virtual-hosted for AWS: &addressing=path|virtual;
    /// bodies sent UNSIGNED-PAYLOAD, checked by Strata itself:
    /// &payload=signed to sign them).
    #[arg(long, short = 'r', global = true, env = "STRATA_REPO")]
    pub(crate) repo: Option<String>,
    /// Read the password from this file (first line).
    #[arg(long, global = true, env = "STRATA_PASSWORD_FILE")]
    pub(crate) password_file: Option<PathBuf>,
    /// Run this shell command and take its first line of output as the
    /// password (e.g. `pass show backup`).
    #[arg(
        long,
        global = true,
        env = "STRATA_PASSWORD_COMMAND",
        conflicts_with = "password_file"
    )]
    pub(crate) password_command: Option<String>,
    /// Machine-readable JSON on stdout.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Print only errors.
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
    /// More detail (repeat for debug logs).
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// The repository password.
pub(crate) fn read_password(cli: &Cli, confirm: bool) -> Result<Vec<u8>, StoreError> {
    Sources {
        file: cli.password_file.as_deref(),
        command: cli.password_command.as_deref(),
        env: "STRATA_PASSWORD",
        flags: "--password-file or --password-command",
        question: "repository password: ",
    }
    .read(confirm)
}

pub(crate) fn repo_location(cli: &Cli) -> Result<Location> {
    location::location(cli.repo.as_deref())
}

/// Nanoseconds the last [`open`] took (key derivation included): the
/// fixed cost every command pays, reported in `--json` as
/// `process.open_seconds`.
static OPEN_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn open(cli: &Cli) -> Result<Repository> {
    let started = std::time::Instant::now();
    let repo = open_untimed(cli)?;
    OPEN_NS.store(
        started.elapsed().as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    Ok(repo)
}

/// What the process has cost so far: CPU time, peak memory, the bytes
/// and calls of its reads and writes (`/proc/self/io`), and how long
/// opening the repository took — `--json`'s `process` for the commands
/// whose speed is measured (backup, restore).
pub(crate) fn process_figures() -> serde_json::Value {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let mut v = serde_json::json!({
        "user_seconds": secs(ru.ru_utime),
        "system_seconds": secs(ru.ru_stime),
        "peak_rss_bytes": ru.ru_maxrss as u64 * 1024,
        "voluntary_switches": ru.ru_nvcsw,
        "open_seconds": OPEN_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9,
    });
    // rchar/wchar: bytes through read and write calls; syscr/syscw: the calls.
    if let Ok(io) = std::fs::read_to_string("/proc/self/io") {
        for line in io.lines() {
            if let Some((k, n)) = line.split_once(':') {
                if let Ok(n) = n.trim().parse::<u64>() {
                    v[k.trim()] = serde_json::json!(n);
                }
            }
        }
    }
    v
}

fn open_untimed(cli: &Cli) -> Result<Repository> {
    let loc = repo_location(cli)?;
    let backend = location::backend(&loc, false)?;
    let repo = Repository::open(backend, &|| read_password(cli, false))
        .with_context(|| format!("opening repository {}", loc))?
        .with_cache(location::cache_base())
        .with_volumes(strata_link::DirVolumes::of(&loc));
    Ok(repo)
}

/// `repo` and its cloud tier (opened on first use, its requests metered
/// for the tier commands' cost).
pub(crate) fn tiers(repo: &Repository) -> strata_store::tier::Tiers {
    let open = |url: &str| -> strata_store::Result<std::sync::Arc<dyn strata_store::Backend>> {
        let loc = location::location(Some(url))
            .map_err(|e| strata_store::StoreError::Invalid(format!("{e:#}")))?;
        let meter = location::CLOUD_METER.get_or_init(Default::default).clone();
        location::metered_backend(&loc, false, meter)
            .map_err(|e| strata_store::StoreError::Invalid(format!("{e:#}")))
    };
    strata_store::tier::Tiers::new(repo, std::sync::Arc::new(open))
}

pub(crate) fn progress_for(cli: &Cli, what: &str) -> ProgressDisplay {
    ProgressDisplay::start(what, progress_shown(cli))
}

/// Whether progress is drawn (on a terminal, unless `--quiet` or `--json`).
pub(crate) fn progress_shown(cli: &Cli) -> bool {
    !cli.quiet && !cli.json && std::io::stderr().is_terminal()
}
