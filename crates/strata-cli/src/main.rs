//! `strata`: the command-line front end. A thin layer over `strata-store`:
//! argument parsing, passwords, progress bars, human and `--json` output,
//! exit codes. One module per command under `commands/`.
//!
//! Exit codes: 0 success, 1 error, 2 usage error (clap), 3 the command
//! finished but some files could not be read, 10 no repository, 11 the
//! repository is locked, 12 wrong password, 130 interrupted (Ctrl-C).

/// Every `println!` in this crate goes through [`output::write_line`]: a
/// reader that goes away (`strata ls | head`) ends the command quietly
/// instead of a panic on the broken pipe. (A crate-level `macro_rules!`
/// shadows the prelude's `println!` in every module declared below.)
macro_rules! println {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}

mod cli;
mod commands;
mod interrupt;
mod lifecycle;
mod location;
mod output;
mod password;
mod prune;
mod select;

use clap::{CommandFactory, Parser};
use cli::Cli;
use output::Out;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Deduplicating, compressing, encrypting backups",
    long_about = "Strata keeps many versions of file trees, disk images and streams in little space.\n\n\
        Repository: --repo DIR, or $STRATA_REPO, or $XDG_DATA_HOME/strata/repo (~/.local/share/strata/repo).\n\
        Password (encrypted repositories): --password-file, --password-command, $STRATA_PASSWORD, or a prompt on a terminal.\n\n\
        Exit codes: 0 success, 1 error, 2 usage error, 3 finished but some files could not be read, \
        10 no repository, 11 repository locked, 12 wrong password, \
        130 interrupted (Ctrl-C; nothing of the interrupted work is committed)."
)]
struct Strata {
    #[command(flatten)]
    cli: Cli,
    #[command(subcommand)]
    cmd: commands::Cmd,
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
    // Usage errors exit 2 (clap's convention), help and version 0.
    let Strata { cli, cmd } = Strata::parse();
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
    interrupt::install(cli.json, cmd.handles_interrupt(), cmd.stepwise());
    let code = match commands::run(&cli, &cmd, &out, Strata::command) {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}");
            let code = exit_code(&e);
            if cli.json {
                println!("{}", json!({ "error": msg, "exit_code": code }));
            }
            eprintln!("error: {msg}");
            code
        }
    };
    std::process::exit(code);
}

/// Failures scripts tell apart by exit code, as restic's: 10 no
/// repository there, 11 the repository is locked, 12 wrong password;
/// every other error 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    use strata_store::StoreError;
    match e.chain().find_map(|c| c.downcast_ref::<StoreError>()) {
        Some(StoreError::NoRepository(_)) => 10,
        Some(StoreError::Locked { .. }) => 11,
        Some(StoreError::Core(strata_core::CoreError::WrongPassword)) => 12,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command's arguments are consistent (unique names, valid
    /// defaults): clap checks this lazily, per subcommand, at run time.
    #[test]
    fn command_line_definition_is_consistent() {
        super::Strata::command().debug_assert();
    }

    /// Every command and every argument has a description in `--help`.
    #[test]
    fn every_argument_is_described() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let here = format!("{path} {}", c.get_name());
            if c.get_about().is_none() && !path.is_empty() {
                missing.push(format!("{here}: the command"));
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if a.get_help().is_none() && !matches!(id, "help" | "version") {
                    missing.push(format!("{here}: {id}"));
                }
            }
            for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(sub, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Strata::command(), "", &mut missing);
        assert!(missing.is_empty(), "no description: {missing:#?}");
    }

    /// A command's summary (its line in its parent's list of commands)
    /// is short: the details go in a second paragraph, which only the
    /// command's own `--help` shows, and which does not repeat it.
    #[test]
    fn command_summaries_are_short() {
        fn walk(c: &clap::Command, path: &str, long: &mut Vec<String>) {
            let here = format!("{path} {}", c.get_name());
            let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
            if about.chars().count() > 110 {
                long.push(format!("{here}: {} characters", about.chars().count()));
            }
            // The details go on from the summary, not say it again.
            let details = c
                .get_long_about()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let start: String = about.chars().take(24).collect();
            if details.split("\n\n").skip(1).any(|p| p.starts_with(&start)) {
                long.push(format!("{here}: its details repeat its summary"));
            }
            for sub in c.get_subcommands() {
                walk(sub, &here, long);
            }
        }
        let mut long = Vec::new();
        walk(&super::Strata::command(), "", &mut long);
        assert!(long.is_empty(), "summaries too long: {long:#?}");
    }
}
