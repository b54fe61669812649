//! `strata init`: create a repository.

use crate::cli::{read_password, repo_location, Cli};
use crate::location;
use crate::output::Out;
use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use strata_core::crypto::KdfCost;
use strata_store::{InitOptions, Repository};

#[derive(Args)]
pub struct InitArgs {
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
    /// Memory of the password hash (Argon2id) in KiB, with --encrypt;
    /// keys added later cost the same. Lower only where memory is scarce
    /// (or in tests): it is what makes guessing passwords expensive.
    #[arg(long, value_name = "KIB", default_value_t = KdfCost::default().memory_kib)]
    kdf_memory_kib: u32,
    /// Passes of the password hash (Argon2id), with --encrypt.
    #[arg(long, value_name = "N", default_value_t = KdfCost::default().iterations)]
    kdf_iterations: u32,
    /// Store a changed chunk as a delta against the chunk the previous
    /// version of its file held at its place, when that saves (zstd with
    /// the old chunk as its prefix). Builds before deltas cannot open a
    /// repository with deltas on.
    #[arg(long, value_enum, default_value = "off")]
    delta: OnOff,
}

/// A switch.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

pub fn run(cli: &Cli, out: &Out, a: &InitArgs) -> Result<i32> {
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
    let mut opts = InitOptions::with_defaults(
        index,
        a.chunk_size,
        a.segment_kib,
        a.compression,
        a.container_mib,
        None,
    )?;
    opts.kdf = KdfCost {
        memory_kib: a.kdf_memory_kib,
        iterations: a.kdf_iterations,
    }
    .validate()?;
    opts.delta = a.delta == OnOff::On;
    let backend = location::backend(&loc, true)?;
    if a.encrypt {
        opts.password = Some(read_password(cli, true)?);
    }
    let repo = Repository::init(backend, opts)
        .map(|r| r.with_cache(location::cache_base()))
        .with_context(|| format!("creating repository at {}", loc))?;
    let c = repo.config();
    out.result(
        &json!({"repository": loc.to_string(), "id": c.id, "encrypted": c.encrypted, "index": c.index,
                "chunk_size": c.chunker.avg_chunk, "compression": c.zstd_level, "delta": c.delta}),
        || {
            format!(
                "created {} repository {} at {}",
                if c.encrypted { "encrypted" } else { "unencrypted" },
                crate::output::short(&c.id),
                loc
            )
        },
    );
    Ok(0)
}
