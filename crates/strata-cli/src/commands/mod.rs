//! One module per command, as `strata --help` lists them. Each exports its
//! arguments (`…Args`, with a description for every one) and a `run`.

mod backup;
mod check;
mod completion;
mod copy;
mod diff;
mod dump;
mod features;
mod find;
mod forget;
mod gc;
mod init;
mod key;
mod ls;
mod maintain;
pub mod mount;
mod policy;
mod repair;
mod restore;
mod service;
mod snapshots;
mod stats;
mod tag;
pub(crate) mod tier;
mod unlock;
mod volume;

use crate::cli::Cli;
use crate::output::Out;
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Create a new repository.
    Init(init::InitArgs),
    /// Back up files, directories or stdin as a new version of a series.
    Backup(backup::BackupArgs),
    /// List snapshots (versions).
    Snapshots(snapshots::SnapshotsArgs),
    /// List the entries of a snapshot.
    Ls(ls::LsArgs),
    /// Write one file of a snapshot to stdout.
    Dump(dump::DumpArgs),
    /// Restore a snapshot into a directory.
    Restore(restore::RestoreArgs),
    /// What changed between two snapshots.
    ///
    /// Added, removed, modified and metadata-only paths, with sizes (from the
    /// recipes; no data read).
    Diff(diff::DiffArgs),
    /// Which snapshots hold paths matching a pattern.
    Find(find::FindArgs),
    /// Add, remove or set snapshots' tags.
    Tag(tag::TagArgs),
    /// Copy snapshots from another repository into this one.
    ///
    /// Deduplicated against this one; snapshots copied already are skipped.
    Copy(copy::CopyArgs),
    /// Browse the repository as a read-only file system (FUSE).
    ///
    /// Series, versions, and each version's tree, read on demand. Runs until
    /// unmounted (`fusermount3 -u DIR`) or interrupted.
    Mount(mount::MountArgs),
    /// Remove snapshots.
    ///
    /// Reverse-deduplicated (archival) versions free their stamped data at
    /// once; live-form data is freed by `gc` (or `--prune`).
    Forget(forget::ForgetArgs),
    /// Free the space of data no snapshot references (mark and sweep).
    Gc(gc::GcArgs),
    /// Show or set the lifecycle policy of a series.
    ///
    /// How many newest versions stay live, how many (or how many days of)
    /// versions are retained.
    Policy(policy::PolicyArgs),
    /// Lifecycle work, out of line: reverse dedup, retention, pool compaction.
    ///
    /// RevDedup: reverse-deduplicate the versions that left their series' live
    /// window against the next version, delete versions past retention (with
    /// their stamped containers, no scan), and compact the shared pool.
    /// Resumable.
    Maintain(maintain::MaintainArgs),
    /// Repository statistics: sizes, dedup and compression ratios, and per
    /// series the lifecycle figures.
    Stats(stats::StatsArgs),
    /// Check the repository's structure (and with --read-data all data).
    Check(check::CheckArgs),
    /// Remove locks left by processes that no longer run.
    Unlock(unlock::UnlockArgs),
    /// What this build supports (index strategies, chunkers, format version).
    Features,
    /// Passwords of an encrypted repository: list, add, passwd, remove.
    Key {
        #[command(subcommand)]
        cmd: key::KeyCmd,
    },
    /// Print a shell completion script.
    ///
    /// bash, zsh, fish, elvish or powershell: e.g. `strata completion bash >
    /// /etc/bash_completion.d/strata`.
    Completion(completion::CompletionArgs),
    /// Print the man page (or write all pages with --dir).
    Man(completion::ManArgs),
    /// Print the version.
    Version,
    /// The cloud tier: a bucket holding cold versions as a second dedup
    /// domain (add, estimate, migrate).
    Tier {
        #[command(subcommand)]
        cmd: tier::TierCmd,
    },
    /// Thin, deduplicated block volumes served over NBD.
    ///
    /// iDedup's inline dedup: only runs of at least --threshold duplicate
    /// blocks are deduplicated, so sequential reads stay sequential.
    Volume {
        /// Where the repository's volumes live (their blocks, journals and
        /// maps; snapshots go to the repository). Default: `volumes/` in a
        /// local repository; for a bucket (s3://…), `strata/volumes/` and
        /// the repository's id in the user's data directory
        /// (`$XDG_DATA_HOME`, else `~/.local/share`). A directory on a
        /// fast disk keeps volumes there while the repository is on
        /// another. A directory holds the volumes of one repository.
        #[arg(long, global = true, env = "STRATA_VOLUMES_DIR", value_name = "DIR")]
        volumes_dir: Option<std::path::PathBuf>,
        #[command(subcommand)]
        cmd: volume::VolumeCmd,
    },
    /// Run next to a cloud tier's bucket, for `tier gc --service`.
    ///
    /// With --repo s3://…: assembles new objects from ranges of existing ones
    /// for `strata tier gc --service`, so cleaning the cloud tier downloads
    /// nothing.
    CopyForwardService(service::ServiceArgs),
    /// Rebuild derived structures.
    Repair {
        #[command(subcommand)]
        what: repair::RepairWhat,
    },
}

impl Cmd {
    /// Commands that serve until stopped and shut down on a signal
    /// themselves.
    pub(crate) fn handles_interrupt(&self) -> bool {
        matches!(self, Cmd::Volume { cmd, .. } if cmd.serves()) || matches!(self, Cmd::Mount(_))
    }
}

impl Cmd {
    /// Commands that commit in several steps: an interruption keeps the
    /// steps already done.
    pub(crate) fn stepwise(&self) -> bool {
        matches!(
            self,
            Cmd::Forget(_)
                | Cmd::Gc(_)
                | Cmd::Maintain(_)
                | Cmd::Copy(_)
                | Cmd::Tier { .. }
                | Cmd::Tag(_)
                | Cmd::Repair { .. }
        )
    }
}

/// Runs `cmd`; `whole` is the whole command line's definition (for
/// completions and man pages).
pub(crate) fn run(cli: &Cli, cmd: &Cmd, out: &Out, whole: fn() -> clap::Command) -> Result<i32> {
    // Checking and repairing read the bucket itself, never local copies.
    if matches!(cmd, Cmd::Check(_) | Cmd::Repair { .. }) {
        crate::location::NO_OBJECT_CACHE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match cmd {
        Cmd::Init(a) => init::run(cli, out, a),
        Cmd::Backup(a) => backup::run(cli, out, a),
        Cmd::Snapshots(a) => snapshots::run(cli, out, a),
        Cmd::Ls(a) => ls::run(cli, out, a),
        Cmd::Dump(a) => dump::run(cli, a),
        Cmd::Restore(a) => restore::run(cli, out, a),
        Cmd::Forget(a) => forget::run(cli, out, a),
        Cmd::Gc(a) => gc::run(cli, out, a),
        Cmd::Policy(a) => policy::run(cli, out, a),
        Cmd::Maintain(a) => maintain::run(cli, out, a),
        Cmd::Stats(a) => stats::run(cli, out, a),
        Cmd::Check(a) => check::run(cli, out, a),
        Cmd::Unlock(a) => unlock::run(cli, out, a),
        Cmd::Features => features::run(out),
        Cmd::Diff(a) => diff::run(cli, out, a),
        Cmd::Find(a) => find::run(cli, out, a),
        Cmd::Tag(a) => tag::run(cli, out, a),
        Cmd::Copy(a) => copy::run(cli, out, a),
        Cmd::Mount(a) => mount::run(crate::cli::open(cli)?, out, a),
        Cmd::Key { cmd } => key::run(cli, out, cmd),
        Cmd::Completion(a) => completion::completion(a, whole()),
        Cmd::Man(a) => completion::man(a, whole()),
        Cmd::Version => completion::version(out),
        Cmd::Tier { cmd } => tier::run(cli, out, cmd),
        Cmd::Volume { cmd, volumes_dir } => volume::run(cli, out, cmd, volumes_dir.as_deref()),
        Cmd::CopyForwardService(a) => service::run(cli.repo.as_deref(), &a.listen),
        Cmd::Repair { what } => repair::run(cli, out, what),
    }
}
