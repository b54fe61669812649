//! Defrag: a stopped volume written again in its own block order.
//!
//! A volume with dedup is a log: overwrites go to new disk blocks, so
//! after many of them a stretch of the volume lies in pieces across the
//! data file, and reads of it are many small disk reads (WAFL, which
//! iDedup is built in, has `reallocate` for the same reason). Defrag
//! checks the volume (a damaged block would be copied as a good one),
//! copies its image, in block order, into a new volume with the same
//! settings and key — through the write path, so that the copy is
//! deduplicated again and its data file holds the volume front to back —
//! and swaps the two directories in one step (`renameat2` with
//! `RENAME_EXCHANGE`). The volume stays locked from the copy to the swap.
//! A defrag that fails or is killed leaves the volume as it was (opened
//! and closed: cleanly, or recounted at the next open) and perhaps
//! `.NAME.defrag`, which the next defrag removes. The set of segments
//! changed since the last snapshot and `volume.json`'s time are carried
//! over (the image is the same), so the next snapshot reads only those
//! segments and keeps the recipe's unchanged pieces. The statistics are
//! the copy's.

use crate::error::{Result, VolumeError};
use crate::import::{fill, Progress, Source};
use crate::state::Volume;
use crate::VolumeKey;
use std::fs::File;
use std::path::Path;

/// What a defrag did.
pub struct Defragged {
    /// Disk blocks in use, and the data file's bytes on the host's disk,
    /// before and after.
    pub blocks: (u64, u64),
    pub allocated: (u64, u64),
    /// The share of blocks right after the block before them on disk,
    /// before and after.
    pub in_order: (f64, f64),
    pub seconds: f64,
}

/// Defragments the stopped volume in `dir` (named `name`): `check` and
/// `copy` are told how far the check and the copy got.
pub fn defrag(
    dir: &Path,
    name: &str,
    key: Option<&VolumeKey>,
    (check, copy): (Progress<'_>, Progress<'_>),
) -> Result<Defragged> {
    let t = std::time::Instant::now();
    let before = crate::report::report(dir, name)?;
    let cfg = Volume::config(dir)?;
    let root = dir
        .parent()
        .ok_or_else(|| VolumeError::Invalid("the volume's directory has no parent".into()))?;
    // One defrag of a volume at a time, to its end (a second one would
    // remove the first one's copy).
    let _own = flock(&root.join(format!(".{name}.defrag.lock")))
        .map_err(|e| e.context(format!("a defrag of volume {name} is under way")))?;
    can_exchange(root, name)?;
    let tmp = dir.with_file_name(format!(".{name}.defrag"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(VolumeError::io(format!(
            "removing a stopped defrag ({})",
            tmp.display()
        )))?;
    }
    // With dedup, every block against its fingerprint (a volume without
    // keeps none: its map and counts only).
    let rep = crate::check::check(dir, key, cfg.dedup, check)
        .map_err(|e| e.context(format!("checking volume {name}")))?;
    if !rep.ok() {
        return Err(VolumeError::Invalid(format!(
            "volume {name} has problems, which a copy would hide: see `strata volume check {name} --read-data`"
        )));
    }
    let old =
        Volume::open_to_read(dir, key).map_err(|e| e.context(format!("opening volume {name}")))?;
    // Opened (locked): no snapshot links to its blocks from here on; one
    // that did since they were stored again is not thrown away.
    if !crate::holds::held(dir)?.is_empty() {
        let _ = old.close();
        return Err(VolumeError::Invalid(format!(
            "a snapshot of volume {name} linked to its blocks meanwhile: run the defrag again"
        )));
    }
    let copied = Volume::create(&tmp, cfg)
        .map_err(|e| e.context("creating the copy"))
        .and_then(|()| {
            let src = Source::volume(format!("volume {name}"), old.image_reader(), old.size());
            fill(&tmp, key, src, copy)
        });
    // Closed, but still locked: no server opens it before the swap.
    let held = old
        .close_keeping_lock()
        .map_err(VolumeError::io(format!("closing volume {name}")));
    let swapped = copied.and(held).and_then(|held| {
        let r = carry_over(dir, &tmp).and_then(|()| {
            exchange(dir, &tmp).map_err(VolumeError::io("swapping the volume and its copy"))
        });
        drop(held);
        r
    });
    drop(old);
    if let Err(e) = swapped {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // The swap made durable; `tmp` holds the volume as it was.
    File::open(root)
        .and_then(|d| d.sync_all())
        .map_err(VolumeError::io("syncing the volumes' directory"))?;
    std::fs::remove_dir_all(&tmp).map_err(VolumeError::io(format!(
        "removing the volume as it was ({})",
        tmp.display()
    )))?;
    let after = crate::report::report(dir, name)?;
    let laid = crate::check::check(dir, None, false, &|_, _| {})
        .map_err(|e| e.context(format!("reading volume {name}'s new map")))?;
    Ok(Defragged {
        in_order: (rep.in_order(), laid.in_order()),
        blocks: (before.physical_blocks_in_use, after.physical_blocks_in_use),
        allocated: (
            before.data_file_allocated_bytes,
            after.data_file_allocated_bytes,
        ),
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// What the copy in `tmp` takes over from the volume in `dir`: the set
/// of segments changed since the last snapshot (the copy's own says
/// everything changed), and `volume.json`'s time (a snapshot's image
/// time).
fn carry_over(dir: &Path, tmp: &Path) -> Result<()> {
    let changes = dir.join("changes.json");
    let copy_changes = tmp.join("changes.json");
    if changes.exists() {
        std::fs::copy(&changes, &copy_changes).map_err(VolumeError::io("copying changes.json"))?;
        File::open(&copy_changes)
            .and_then(|f| f.sync_all())
            .map_err(VolumeError::io("syncing changes.json"))?;
    } else if copy_changes.exists() {
        std::fs::remove_file(&copy_changes)
            .map_err(VolumeError::io("removing the copy's changes.json"))?;
    }
    let mtime = std::fs::metadata(dir.join("volume.json"))
        .and_then(|m| m.modified())
        .map_err(VolumeError::io("reading volume.json's time"))?;
    File::options()
        .write(true)
        .open(tmp.join("volume.json"))
        .and_then(|f| f.set_modified(mtime))
        .map_err(VolumeError::io("setting the copy's volume.json time"))?;
    Ok(())
}

/// An exclusive `flock` on `path` (made if missing), or an error if
/// another process holds it.
fn flock(path: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(VolumeError::io(format!("opening {}", path.display())))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(VolumeError::Io(
            path.display().to_string(),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(f)
}

/// Fails, before anything is copied, where the volumes' file system
/// cannot swap two directories in one step.
fn can_exchange(root: &Path, name: &str) -> Result<()> {
    let (a, b) = (
        root.join(format!(".{name}.defrag.probe-a")),
        root.join(format!(".{name}.defrag.probe-b")),
    );
    for p in [&a, &b] {
        let _ = std::fs::remove_dir(p);
        std::fs::create_dir(p).map_err(VolumeError::io(format!("making {}", p.display())))?;
    }
    let r = exchange(&a, &b);
    let _ = (std::fs::remove_dir(&a), std::fs::remove_dir(&b));
    r.map_err(VolumeError::io(format!(
        "the file system of {} cannot swap two directories in one step (renameat2 with RENAME_EXCHANGE), which defrag needs",
        root.display()
    )))
}

/// Swaps two directories in one step.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // The system call itself (glibc has a wrapper only since 2.28).
    // SAFETY: two NUL-terminated paths that live across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
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
