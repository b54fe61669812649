//! `strata volume defrag`: a stopped volume written again in its own
//! block order.
//!
//! A volume with dedup is a log: overwrites go to new disk blocks, so
//! after many of them a stretch of the volume lies in pieces across the
//! data file, and reads of it are many small disk reads (WAFL, which
//! iDedup is built in, has `reallocate` for the same reason). Defrag
//! copies the volume's image, in block order, into a new volume with the
//! same settings and key — through the write path, so that the copy is
//! deduplicated again and its data file holds the volume front to back —
//! and then swaps the two directories in one step (`renameat2` with
//! `RENAME_EXCHANGE`). Until the swap the volume is untouched; a defrag
//! that fails or is killed leaves `.NAME.defrag` beside it, which the
//! next defrag removes. The set of segments changed since the last
//! snapshot is carried over (the image is the same), so the next
//! snapshot still reads only those. The statistics start again.

use super::import::{fill, Source};
use anyhow::{bail, Context, Result};
use std::path::Path;
use strata_volume::{Volume, VolumeKey};

/// What a defrag did.
pub(super) struct Defragged {
    /// Disk blocks in use, and the data file's bytes on the host's disk,
    /// before and after.
    pub blocks: (u64, u64),
    pub allocated: (u64, u64),
    pub seconds: f64,
}

/// Defragments the stopped volume in `dir`.
pub(super) fn defrag(
    cli: &crate::Cli,
    dir: &Path,
    name: &str,
    key: Option<&VolumeKey>,
) -> Result<Defragged> {
    let t = std::time::Instant::now();
    let before = strata_volume::report::report(dir, name)?;
    let tmp = dir.with_file_name(format!(".{name}.defrag"));
    if tmp.exists() {
        drop(Volume::lock(&tmp).with_context(|| format!("a defrag of {name} is under way"))?);
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing a stopped defrag ({})", tmp.display()))?;
    }
    let old = Volume::open_keyed(dir, key).with_context(|| format!("opening volume {name}"))?;
    let size = old.size();
    let made = Volume::create(&tmp, Volume::config(dir)?)
        .context("creating the new copy")
        .and_then(|()| {
            let src = Source::new(format!("volume {name}"), Box::new(old.image_reader()), size);
            fill(cli, &tmp, key, src)
        });
    let closed = old
        .close()
        .with_context(|| format!("closing volume {name}"));
    drop(old);
    let swapped = made.and(closed).and_then(|()| swap(dir, &tmp));
    if let Err(e) = swapped {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // `tmp` holds the volume as it was.
    std::fs::remove_dir_all(&tmp)
        .with_context(|| format!("removing the volume as it was ({})", tmp.display()))?;
    let after = strata_volume::report::report(dir, name)?;
    Ok(Defragged {
        blocks: (before.physical_blocks_in_use, after.physical_blocks_in_use),
        allocated: (
            before.data_file_allocated_bytes,
            after.data_file_allocated_bytes,
        ),
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// Puts the copy in `tmp` in the place of the volume in `dir`, if the
/// volume was not served in the meantime (between its close and here).
fn swap(dir: &Path, tmp: &Path) -> Result<()> {
    let state = || std::fs::read(dir.join("state.json")).context("reading the volume's state");
    let closed = state()?;
    let lock = Volume::lock(dir)?;
    if state()? != closed {
        bail!("the volume was served while it was copied: run defrag again");
    }
    // The set of segments changed since the last snapshot: the old one
    // (the copy's own says everything changed).
    let changes = dir.join("changes.json");
    let copy_changes = tmp.join("changes.json");
    if changes.exists() {
        std::fs::copy(&changes, &copy_changes).context("copying changes.json")?;
    } else if copy_changes.exists() {
        std::fs::remove_file(&copy_changes).context("removing the copy's changes.json")?;
    }
    exchange(dir, tmp)
        .with_context(|| format!("swapping {} and {}", dir.display(), tmp.display()))?;
    drop(lock);
    Ok(())
}

/// Swaps two directories in one step.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths that live across the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
