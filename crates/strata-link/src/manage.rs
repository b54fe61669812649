//! The operations on a repository's volumes that need the repository for
//! no more than an encrypted volume's key (and, before a defrag, to store
//! again what its snapshots link): create, copy, check, defrag.

use crate::delete::unlink_before_removal;
use crate::dir::{check_name, VolumesDir};
use crate::error::{Context as _, LinkError, Result};
use crate::keys::{key_for_dir, new_key, RepoAccess};
use std::path::PathBuf;
use strata_volume::check::CheckReport;
use strata_volume::defrag::Defragged;
use strata_volume::import::{create_filled, Imported, Progress, Source};
use strata_volume::{Threshold, Volume, VolumeConfig};

/// A new volume, as `volume create` asks for it.
pub struct NewVolume {
    pub name: String,
    /// The size the clients see; with `from`, the image's (rounded up to
    /// 4 KiB) unless given.
    pub size: Option<u64>,
    pub threshold: Threshold,
    pub cache_bytes: u64,
    pub dedup: bool,
    /// A raw disk image to fill it from (`-`: standard input).
    pub from: Option<PathBuf>,
}

/// What a create did.
pub struct Created {
    pub size: u64,
    pub encrypted: bool,
    /// What was copied in from the image.
    pub imported: Option<Imported>,
}

/// Creates a volume in `root` (bound to the repository first, where it
/// must be), empty or filled from an image.
pub fn create(
    repo: &dyn RepoAccess,
    root: &VolumesDir,
    v: &NewVolume,
    progress: Progress<'_>,
) -> Result<Created> {
    let name = &v.name;
    check_name(name)?;
    // (What killed deletes left half removed.)
    root.sweep_deleted();
    // Before a source is opened or a password asked for.
    if root.path.join(name).join("volume.json").exists() {
        return Err(LinkError::Invalid(format!(
            "volume {name} already exists: choose another name, or delete it first \
             (`strata volume delete {name} --yes`; its snapshots stay)"
        )));
    }
    let source = v.from.as_deref().map(Source::open).transpose()?;
    let size = match (v.size, &source) {
        (Some(s), _) => s,
        (None, Some(src)) => src.size_hint().ok_or_else(|| {
            LinkError::Invalid(format!(
                "--from {}: its size is not known: give --size",
                src.name
            ))
        })?,
        (None, None) => return Err(LinkError::Invalid("--size is required".into())),
    };
    if let Some(src) = &source {
        if src.size_hint().is_some_and(|need| need > size) {
            return Err(LinkError::Invalid(format!(
                "{} is larger than the volume ({size} bytes): give a larger --size",
                src.name
            )));
        }
    }
    let mut cfg = VolumeConfig {
        format: 1,
        size,
        block_size: strata_core::BLOCK_SIZE as u32,
        threshold: v.threshold,
        cache_bytes: v.cache_bytes,
        dedup: v.dedup,
        encryption: None,
    };
    let key = new_key(repo, &mut cfg)?;
    let encrypted = cfg.encryption.is_some();
    root.prepare()?;
    let dir = root.path.join(name);
    let imported = match source {
        Some(src) => Some(create_filled(&dir, cfg, key.as_ref(), src, progress)?),
        None => {
            Volume::create(&dir, cfg)?;
            None
        }
    };
    Ok(Created {
        size,
        encrypted,
        imported,
    })
}

/// Copies the stopped volume `from` into a new volume `to`: the same size
/// and settings, its own key in an encrypted repository.
pub fn copy(
    repo: &dyn RepoAccess,
    root: &VolumesDir,
    (from, to): (&str, &str),
    progress: Progress<'_>,
) -> Result<Imported> {
    check_name(to)?;
    let src = root.existing(from)?;
    let dst = root.path.join(to);
    let key = key_for_dir(repo, &src)?;
    let mut cfg = Volume::config(&src)?;
    let new = new_key(repo, &mut cfg)?;
    let vol = Volume::open_to_read(&src, key.as_ref())
        .with_context(|| format!("opening volume {from}"))?;
    let source = Source::volume(format!("volume {from}"), vol.image_reader(), vol.size());
    let copied = create_filled(&dst, cfg, new.as_ref(), source, progress);
    let closed = vol
        .close()
        .map_err(LinkError::io(format!("closing volume {from}")));
    let copied = copied?;
    closed?;
    Ok(copied)
}

/// Checks volume `name`'s files (and with `read_data` its blocks against
/// their fingerprints; only a deduplicated volume's data is decrypted, so
/// only then is the repository opened for an encrypted volume's key).
pub fn check(
    repo: &dyn RepoAccess,
    root: &VolumesDir,
    name: &str,
    read_data: bool,
    progress: Progress<'_>,
) -> Result<CheckReport> {
    let dir = root.existing(name)?;
    let cfg = Volume::config(&dir)?;
    let key = match read_data && cfg.dedup && cfg.encryption.is_some() {
        true => key_for_dir(repo, &dir)?,
        false => None,
    };
    strata_volume::check::check(&dir, key.as_ref(), read_data, progress)
        .with_context(|| format!("checking volume {name}"))
}

/// Defragments the stopped volume `name`: what its snapshots link to its
/// blocks stored in the repository again first (its data file is
/// replaced), then the copy in block order swapped in.
pub fn defrag(
    repo: &dyn RepoAccess,
    root: &VolumesDir,
    name: &str,
    warnings: &mut Vec<String>,
    progress: (Progress<'_>, Progress<'_>),
) -> Result<Defragged> {
    let dir = root.existing(name)?;
    unlink_before_removal(repo, &dir, name, false, warnings)?;
    let key = key_for_dir(repo, &dir)?;
    strata_volume::defrag::defrag(&dir, name, key.as_ref(), progress)
        .with_context(|| format!("defragmenting volume {name}"))
}
