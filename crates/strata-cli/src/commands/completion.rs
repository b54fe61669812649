//! `strata completion SHELL` and `strata man`: shell completions and a
//! man page, generated from the same definitions as `--help`.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct CompletionArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

pub fn completion(a: &CompletionArgs, mut cmd: clap::Command) -> Result<i32> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "strata", &mut script);
    write_all_stdout(&script)
}

/// Writes `bytes` to stdout; a reader that went away is not an error.
fn write_all_stdout(bytes: &[u8]) -> Result<i32> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

#[derive(Args)]
pub struct ManArgs {
    /// Write `strata.1` and one page per command (`strata-backup.1`, …)
    /// into this directory instead of printing `strata.1` to stdout.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn man(a: &ManArgs, cmd: clap::Command) -> Result<i32> {
    match &a.dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page)?;
            return write_all_stdout(&page);
        }
        Some(d) => {
            std::fs::create_dir_all(d)?;
            clap_mangen::generate_to(cmd, d)?;
        }
    }
    Ok(0)
}

/// `strata version`: the version, and with --json what it was built with.
pub fn version(out: &crate::output::Out) -> Result<i32> {
    out.result(
        &serde_json::json!({"version": env!("CARGO_PKG_VERSION"),
            "repository_format": strata_core::format::REPO_FORMAT_VERSION}),
        || format!("strata {}", env!("CARGO_PKG_VERSION")),
    );
    Ok(0)
}
