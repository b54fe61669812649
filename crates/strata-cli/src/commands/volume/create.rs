//! `volume create`: a thin volume, empty or filled from a raw image.

use super::access::{link_err, progress_fn, Access};
use crate::output::{fmt_bytes, Out};
use anyhow::Result;
use std::path::PathBuf;
use strata_core::size::parse_size;
use strata_link::manage::NewVolume;
use strata_link::VolumesDir;
use strata_volume::Threshold;

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

/// Creates volume `a.name` in the volumes directory `root`.
pub(super) fn create(
    cli: &crate::cli::Cli,
    out: &Out,
    root: &VolumesDir,
    a: &CreateArgs,
) -> Result<i32> {
    let (name, from) = (&a.name, &a.from);
    let v = NewVolume {
        name: name.clone(),
        size: a.size,
        threshold: a.threshold,
        cache_bytes: a.cache,
        dedup: !a.no_dedup,
        from: from.clone(),
    };
    let pd = crate::cli::progress_for(cli, "import");
    let r = strata_link::manage::create(&Access(cli), root, &v, &progress_fn(&pd.progress));
    pd.finish();
    let c = r.map_err(link_err)?;
    let (size, encrypted) = (c.size, c.encrypted);
    let mut j = serde_json::json!({"volume": name, "size": size, "dedup": !a.no_dedup, "encrypted": encrypted});
    if let Some(i) = &c.imported {
        j["imported_bytes"] = i.size.into();
        j["read_bytes"] = i.read.into();
        j["written_bytes"] = i.written.into();
        // A stream says nothing of its length: one that ended
        // before the volume's size may have been cut short.
        if from.as_deref() == Some(std::path::Path::new("-")) && i.size < size {
            out.warn(&format!(
                "standard input ended after {} of the volume's {}: the rest reads as \
                 zeros. If the stream was cut short (a failed `strata dump`; \
                 `set -o pipefail` makes a shell say so), delete the volume and import \
                 again",
                fmt_bytes(i.size),
                fmt_bytes(size)
            ));
        }
    }
    out.result(&j, || {
        let mut t = format!(
            "volume {name} created ({}{})",
            fmt_bytes(size),
            if encrypted { ", encrypted" } else { "" }
        );
        if let Some(i) = &c.imported {
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
