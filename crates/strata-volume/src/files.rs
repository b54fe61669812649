//! The volume's files: JSON written whole or in place (with readers
//! taking turns), arrays of numbers, sparse copies, holes punched.

use crate::error::{ioe, Result, VolumeError};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use strata_core::BLOCK_SIZE as BLOCK;

/// The least room `live.json` is given (it is rewritten in place).
pub(crate) const LIVE_RESERVE: usize = 64 << 10;

/// Copies `src` to `dst`: a reflink (instant, whatever the size) where the
/// file system has them (XFS, Btrfs), else a copy of its data, its holes
/// left holes (a mostly empty volume's map is mostly holes: a 1 TiB
/// volume's is 2 GiB).
pub(crate) fn clone_or_copy(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const FICLONE: libc::c_ulong = 0x4004_9409;
    let from = File::open(src)?;
    let to = File::create(dst)?;
    // SAFETY: both descriptors are open for the duration of the call.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) } == 0 {
        return Ok(());
    }
    copy_sparse(&from, &to)
}

/// The first byte of data at or after `at` in the regular file `f`
/// (`SEEK_DATA`; none when only a hole follows), `at` itself where the
/// file system cannot tell holes.
pub fn next_data(f: &File, at: u64) -> io::Result<Option<u64>> {
    match seek_extent(f, at, libc::SEEK_DATA) {
        Err(e) if holes_unknown(&e) => Ok(Some(at)),
        r => r,
    }
}

/// `lseek(at, whence)` for `SEEK_DATA`/`SEEK_HOLE`: none when nothing of
/// the kind follows (ENXIO); `at` itself past `off_t`.
pub(crate) fn seek_extent(f: &File, at: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let Ok(off) = libc::off_t::try_from(at) else {
        return Ok(Some(at));
    };
    // SAFETY: `f` is open; lseek only moves its offset (readers set it
    // again before reading).
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        e => Err(e),
    }
}

/// Whether `e` says the file system cannot tell holes from data.
pub(crate) fn holes_unknown(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

/// Copies `from` into the empty `to`, extent by extent of data
/// (`SEEK_DATA`/`SEEK_HOLE`); where the file system cannot tell its holes,
/// the whole file as one extent.
pub(crate) fn copy_sparse(from: &File, to: &File) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let mut at = 0;
    while at < len {
        let Some(start) = next_data(from, at)? else {
            break;
        };
        let end = match seek_extent(from, start, libc::SEEK_HOLE) {
            Ok(Some(h)) => h.min(len),
            Ok(None) => len,
            Err(e) if holes_unknown(&e) => len,
            Err(e) => return Err(e),
        };
        if end <= start {
            break;
        }
        let (mut r, mut w) = (from, to);
        r.seek(SeekFrom::Start(start))?;
        w.seek(SeekFrom::Start(start))?;
        let n = io::copy(&mut r.take(end - start), &mut w)?;
        if n < end - start {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the map grew shorter while it was copied",
            ));
        }
        at = end;
    }
    Ok(())
}

pub(crate) fn open_rw(p: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map_err(ioe(p.display().to_string()))
}

pub(crate) fn write_json(p: &Path, v: &impl Serialize) -> Result<()> {
    let body = serde_json::to_vec_pretty(v).map_err(|e| VolumeError::Invalid(e.to_string()))?;
    write_bytes(p, &body)
}

/// Writes `body` to `p` whole or not at all: a file of its own, synced,
/// renamed over `p` (the rename synced too). What a failure leaves of
/// the file of its own is removed.
pub(crate) fn write_bytes(p: &Path, body: &[u8]) -> Result<()> {
    // A name of its own per write: two threads may save the same file.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = p.with_extension(format!("tmp.{}.{n}", std::process::id()));
    let f = File::create(&tmp).map_err(ioe(tmp.display().to_string()))?;
    let written = f
        .write_all_at(body, 0)
        .and_then(|_| f.sync_all())
        .and_then(|_| fs::rename(&tmp, p));
    if let Err(e) = written {
        // (On a full disk: not a partial file left behind.)
        let _ = fs::remove_file(&tmp);
        return Err(VolumeError::Io(p.display().to_string(), e));
    }
    // The rename itself must survive a crash.
    if let Some(dir) = p.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(ioe(dir.display().to_string()))?;
    }
    Ok(())
}

/// Writes a file that is rewritten often and read by other processes
/// (`live.json`) over its own bytes: a disk with no free block left can
/// still be told what the volume is doing (a pause for space above all).
/// The JSON is padded with spaces to the file's length, which a JSON
/// reader ignores. A file too short (or missing, or sparse) is made anew,
/// with room to spare, the usual way ([`write_json`]).
///
/// At least `room` bytes are kept (a file shorter than that is made
/// anew). Readers and the writer take turns ([`Flock`]): a reader never
/// sees half of one body and half of another.
///
/// (On a copy-on-write or compressing file system — btrfs, ZFS — writing
/// over a file's bytes takes new blocks all the same, and a file of
/// spaces may occupy fewer blocks than its length: there it is made anew
/// each time, as before.)
pub(crate) fn write_json_in_place(p: &Path, v: &impl Serialize, room: usize) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut body = serde_json::to_vec_pretty(v).map_err(|e| VolumeError::Invalid(e.to_string()))?;
    let rewrite = fs::OpenOptions::new()
        .write(true)
        .open(p)
        .ok()
        .and_then(|f| {
            let m = f.metadata().ok()?;
            // Every byte allocated: writing over them takes no new block.
            let whole = m.blocks().saturating_mul(512) >= m.len();
            let len = m.len() as usize;
            (whole && len >= body.len() && len >= room).then_some((f, len))
        });
    match rewrite {
        Some((f, len)) => {
            body.resize(len, b' ');
            let _turn = Flock::take(&f, libc::LOCK_EX);
            f.write_all_at(&body, 0)
                .map_err(ioe(p.display().to_string()))
        }
        None => {
            let room = room.max(LIVE_RESERVE).max(body.len().saturating_mul(2));
            body.resize(room, b' ');
            write_bytes(p, &body)
        }
    }
}

/// An advisory lock on an open file (`flock(2)`), let go when dropped.
pub(crate) struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    pub(crate) fn take(f: &'a File, how: libc::c_int) -> Option<Flock<'a>> {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on an open descriptor.
        (unsafe { libc::flock(f.as_raw_fd(), how) } == 0).then_some(Flock(f))
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// [`read_json`] of a file [`write_json_in_place`] writes over: read
/// while the writer waits.
pub(crate) fn read_json_shared<T: for<'de> Deserialize<'de>>(p: &Path) -> Result<T> {
    use std::io::Read;
    let f = File::open(p).map_err(ioe(p.display().to_string()))?;
    let mut b = Vec::new();
    {
        let _turn = Flock::take(&f, libc::LOCK_SH);
        (&f).read_to_end(&mut b)
            .map_err(ioe(p.display().to_string()))?;
    }
    serde_json::from_slice(&b).map_err(|e| VolumeError::Invalid(format!("{}: {e}", p.display())))
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(p: &Path) -> Result<T> {
    let b = fs::read(p).map_err(ioe(p.display().to_string()))?;
    serde_json::from_slice(&b).map_err(|e| VolumeError::Invalid(format!("{}: {e}", p.display())))
}

pub(crate) fn read_u64s(f: &File, first: u64, n: usize) -> io::Result<Vec<u64>> {
    let mut b = vec![0u8; n * 8];
    let got = read_full_at(f, &mut b, first * 8)?;
    b[got..].fill(0);
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

/// The reference counts of the data file's first `end` blocks (a short
/// `refs` file reads as zeros past its end).
pub(crate) fn read_counts(refs: &File, end: u64) -> Result<Vec<u32>> {
    read_counts_at(refs, 0, end)
}

/// The reference counts of disk blocks `first..first + n`.
pub(crate) fn read_counts_at(refs: &File, first: u64, n: u64) -> Result<Vec<u32>> {
    let mut raw = vec![0u8; n as usize * 4];
    let got = read_full_at(refs, &mut raw, first * 4).map_err(ioe("refs"))?;
    raw[got..].fill(0);
    Ok(raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Reads as much as the file has (a sparse or short file reads as zeros
/// past its end); returns the bytes read.
pub(crate) fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Gives freed disk blocks back to the file system (a hole reads as
/// zeros), before they can be reused: a volume's TRIM frees space on the
/// host as a sparse image file's does, and a freed block no longer holds
/// its old data for a later map entry to name after a power loss (ext4's
/// ordered mode writes a reused block's new data before the allocation
/// that maps it). Where the file system has no holes, nothing changes.
pub(crate) fn punch_holes(data: &File, freed: &[u64]) {
    use std::os::fd::AsRawFd;
    let mut dbns = freed.to_vec();
    dbns.sort_unstable();
    for (i, j) in neighbour_runs(&dbns) {
        let (off, len) = (dbns[i] * BLOCK as u64, (j - i) as u64 * BLOCK as u64);
        // SAFETY: fallocate on an open descriptor with plain integers.
        let r = unsafe {
            libc::fallocate(
                data.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            // (EOPNOTSUPP and the like: the blocks keep their bytes.)
            tracing::debug!("punching a hole: {}", io::Error::last_os_error());
            return;
        }
    }
}

/// The index ranges `i..j` of `v` whose values are consecutive numbers
/// (disk blocks side by side: one I/O each).
pub(crate) fn neighbour_runs(v: &[u64]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= v.len() {
            return None;
        }
        let s = i;
        i += 1;
        while i < v.len() && v[i - 1].checked_add(1) == Some(v[i]) {
            i += 1;
        }
        Some((s, i))
    })
}
