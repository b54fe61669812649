//! `volume create`: a thin volume, empty or filled from a raw image.

use super::{check_name, import, new_key, root, sweep_deleted};
use crate::output::{fmt_bytes, Out};
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use strata_core::size::parse_size;
use strata_volume::{Threshold, Volume, VolumeConfig};

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The volume's name (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// Size the clients see (e.g. 100G; a multiple of 4 KiB). With
    /// `--from FILE`, the file's size (rounded up to 4 KiB) unless
    /// given.
    #[arg(long, value_parser = parse_size, required_unless_present = "from")]
    pub size: Option<u64>,
    /// Deduplicate only runs of at least this many duplicate 4 KiB
    /// blocks (so sequential reads stay sequential), or `auto`: the
    /// median read size seen, 1–8.
    #[arg(long, default_value = "4")]
    pub threshold: Threshold,
    /// Memory for the dedup metadata (fingerprints of recently written
    /// blocks); more finds more duplicates.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub cache: u64,
    /// Write every block anew (the baseline to compare dedup against).
    #[arg(long)]
    pub no_dedup: bool,
    /// Fill the new volume from a raw disk image (a file, a block
    /// device, or `-` for standard input with `--size`): its blocks
    /// of zeros are left unwritten (thin), the rest deduplicated as a
    /// client's writes; a sparse file's holes are not even read. A
    /// volume's snapshot comes back as a volume with `strata dump
    /// volume:NAME@latest NAME.img | strata volume create NAME2 --size
    /// SIZE --from -`.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
}

/// Creates volume `a.name` in the volumes directory `where_`.
pub(super) fn create(
    cli: &crate::Cli,
    out: &Out,
    where_: &root::Root,
    a: &CreateArgs,
) -> Result<i32> {
    let CreateArgs {
        name,
        size,
        threshold,
        cache,
        no_dedup,
        from,
    } = a;
    let root = &where_.path;
    check_name(name)?;
    // (What killed deletes left half removed.)
    sweep_deleted(root);
    // Before a source is opened or a password asked for.
    if root.join(name).join("volume.json").exists() {
        bail!(
            "volume {name} already exists: choose another name, or delete it first \
             (`strata volume delete {name} --yes`; its snapshots stay)"
        );
    }
    let source = from.as_deref().map(import::Source::open).transpose()?;
    let size = match (size, &source) {
        (Some(s), _) => *s,
        (None, Some(src)) => src
            .size_hint()
            .ok_or_else(|| anyhow!("--from {}: its size is not known: give --size", src.name))?,
        (None, None) => bail!("--size is required"),
    };
    if let Some(need) = source.as_ref().and_then(|s| s.size_hint()) {
        if need > size {
            bail!(
                "{} is larger than the volume ({size} bytes): give a larger --size",
                source.as_ref().map(|s| s.name.as_str()).unwrap_or_default()
            );
        }
    }
    let size = &size;
    let mut cfg = VolumeConfig {
        format: 1,
        size: *size,
        block_size: 4096,
        threshold: *threshold,
        cache_bytes: *cache,
        dedup: !no_dedup,
        encryption: None,
    };
    let key = new_key(cli, &mut cfg)?;
    let encrypted = cfg.encryption.is_some();
    where_.prepare()?;
    let dir = root.join(name);
    let imported = match source {
        Some(src) => Some(import::create_filled(cli, &dir, cfg, key.as_ref(), src)?),
        None => {
            Volume::create(&dir, cfg)?;
            None
        }
    };
    let mut j = serde_json::json!({"volume": name, "size": size, "dedup": !no_dedup, "encrypted": encrypted});
    if let Some(i) = &imported {
        j["imported_bytes"] = i.size.into();
        j["read_bytes"] = i.read.into();
        j["written_bytes"] = i.written.into();
        // A stream says nothing of its length: one that ended
        // before the volume's size may have been cut short.
        if from.as_deref() == Some(std::path::Path::new("-")) && i.size < *size {
            out.warn(&format!(
                "standard input ended after {} of the volume's {}: the rest reads as \
                 zeros. If the stream was cut short (a failed `strata dump`; \
                 `set -o pipefail` makes a shell say so), delete the volume and import \
                 again",
                fmt_bytes(i.size),
                fmt_bytes(*size)
            ));
        }
    }
    out.result(&j, || {
        let mut t = format!(
            "volume {name} created ({}{})",
            fmt_bytes(*size),
            if encrypted { ", encrypted" } else { "" }
        );
        if let Some(i) = &imported {
            let holes = match i.read < i.size {
                true => format!(" ({} read, the rest holes)", fmt_bytes(i.read)),
                false => String::new(),
            };
            t += &format!(
                "\nfilled from {}: {}{holes}, {} not zeros",
                i.name,
                fmt_bytes(i.size),
                fmt_bytes(i.written)
            );
        }
        t
    });
    Ok(0)
}
