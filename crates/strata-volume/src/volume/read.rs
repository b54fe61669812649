//! The read path: the buffer first, then the map; runs of neighbouring
//! disk blocks read at once, decrypted, and read ahead.

use super::image::{ImageReader, ImageSource};
use crate::blockmap::disk_runs;
use crate::config::*;
use crate::files::*;
use crate::journal::{self};
use crate::mutex::lock;
use crate::readahead::will_need;
use crate::state::*;
use std::io;
use std::sync::Arc;
use std::time::Instant;

impl Volume {
    /// Where block `b`'s current content is (buffer first).
    pub(crate) fn src(m: &Mem, b: u64) -> Src {
        if let Some((_, d)) = m.inflight.get(&b) {
            return Src::Mem(d.clone());
        }
        if let Some(d) = m.buf.blocks.get(&b) {
            return Src::Mem(d.clone());
        }
        if let Some(&d) = m.buf.placed.get(&b) {
            return Src::At(d);
        }
        if m.buf.zeros.contains(b) {
            return Src::Zero;
        }
        if let Some(batch) = &m.destaging {
            if let Some(d) = batch.blocks.get(&b) {
                return Src::Mem(d.clone());
            }
            if let Some(&d) = batch.placed.get(&b) {
                return Src::At(d);
            }
            if batch.zeros.contains(b) {
                return Src::Zero;
            }
        }
        Src::Disk
    }

    /// Whether blocks `first..first+n` were never written or were last
    /// trimmed or zeroed: they read as zeros without a disk read (the
    /// buffer first, then the map).
    pub(crate) fn unwritten(&self, first: u64, n: usize) -> io::Result<bool> {
        let m = lock(&self.mem);
        let mut on_disk = false;
        for b in first..first.saturating_add(n as u64) {
            match Self::src(&m, b) {
                Src::Zero => {}
                Src::Disk => on_disk = true,
                Src::Mem(_) | Src::At(_) => return Ok(false),
            }
        }
        drop(m);
        // (A block not in the buffer when it was looked at is in the map:
        // a destaged batch is mapped before it leaves the buffer.)
        Ok(!on_disk || self.map.read(first, n)?.iter().all(|&e| e == 0))
    }

    /// `len` bytes from `offset` as runs (bytes, unallocated): blocks
    /// never written, trimmed or zeroed are unallocated (they read as
    /// zeros). At most [`EXTENTS_MAX`] bytes are told (a client asks again
    /// for the rest, as NBD allows).
    pub fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        let bs = BLOCK as u64;
        let end = offset.saturating_add(len.min(EXTENTS_MAX)).min(self.size());
        if offset >= end {
            return Ok(Vec::new());
        }
        let first = offset / bs;
        let n = (end.div_ceil(bs) - first) as usize;
        // The buffer is looked at 4096 blocks at a time, its lock let go
        // in between: a client asking about 256 MiB does not hold up
        // writers for the whole scan (each piece is as it was when looked
        // at, as a whole answer would be when sent).
        let mut srcs: Vec<Src> = Vec::with_capacity(n);
        for from in (first..first + n as u64).step_by(EXTENTS_LOCKED) {
            let to = (from + EXTENTS_LOCKED as u64).min(first + n as u64);
            let m = lock(&self.mem);
            srcs.extend((from..to).map(|b| Self::src(&m, b)));
        }
        // (A block not in the buffer when it was looked at is in the map:
        // a destaged batch is mapped before it leaves the buffer.)
        let map = match srcs.iter().any(|s| matches!(s, Src::Disk)) {
            true => self.map.read(first, n)?,
            false => vec![0; n],
        };
        let mut runs: Vec<(u64, bool)> = Vec::new();
        for (i, (src, &e)) in srcs.iter().zip(&map).enumerate() {
            let hole = match src {
                Src::Zero => true,
                Src::Disk => e == 0,
                Src::Mem(_) | Src::At(_) => false,
            };
            let at = (first + i as u64) * bs;
            let bytes = (at + bs).min(end) - at.max(offset);
            match runs.last_mut() {
                Some((l, h)) if *h == hole => *l += bytes,
                _ => runs.push((bytes, hole)),
            }
        }
        Ok(runs)
    }

    /// Reads whole blocks `first..first+n` into `out`; returns which are
    /// zeros and how many physical runs the disk reads touched.
    /// `track`: a client's read (not a snapshot's), which steers the
    /// clusters read around misses.
    pub(crate) fn read_blocks(
        &self,
        first: u64,
        out: &mut [u8],
        track: bool,
    ) -> io::Result<(Vec<bool>, usize)> {
        let n = out.len() / BLOCK;
        let (srcs, guard) = {
            let m = lock(&self.mem);
            let srcs: Vec<Src> = (0..n as u64).map(|i| Self::src(&m, first + i)).collect();
            // A placed block's DBN came from the buffer: the guard is
            // taken before the buffer can change (writers, too, take it
            // while holding the mem lock). Else after the mem lock.
            let placed = srcs.iter().any(|s| matches!(s, Src::At(_)));
            let guard = placed.then(|| self.reuse_guard.read().unwrap_or_else(|e| e.into_inner()));
            (srcs, guard)
        };
        let _reading = match guard {
            Some(g) => g,
            None => self.reuse_guard.read().unwrap_or_else(|e| e.into_inner()),
        };
        let mut zero = vec![false; n];
        let any_disk = srcs.iter().any(|s| matches!(s, Src::Disk));
        let mut map = if any_disk {
            self.map.read(first, n)?
        } else {
            vec![0; n]
        };
        // Placed blocks read like mapped ones.
        for (i, s) in srcs.iter().enumerate() {
            if let Src::At(d) = s {
                map[i] = d.saturating_add(1);
            }
        }
        let on_disk = |s: &Src| matches!(s, Src::Disk | Src::At(_));
        // The disk runs (first index, end, DBN) in the order read.
        let disk_runs = disk_runs(&map, |i| on_disk(&srcs[i]));
        // A client's reads are probed first: what the page cache holds of
        // each run (its bytes already read), whether it missed, and the
        // clusters to ask for around the misses (a snapshot's reader asks
        // for what it reads next itself); then the disk reads start.
        let mut cached = vec![0usize; disk_runs.len()];
        let mut missed = vec![false; disk_runs.len()];
        let mut hints = Vec::new();
        if track {
            for (k, &(i, j, dbn)) in disk_runs.iter().enumerate() {
                let dst = &mut out[i * BLOCK..j * BLOCK];
                (cached[k], missed[k]) = self.readahead.probe_run(&self.data, dst, dbn, &mut hints);
            }
        }
        self.ask_for_runs(&disk_runs, &cached, &missed, hints, track);
        for (i, src) in srcs.iter().enumerate() {
            let dst = &mut out[i * BLOCK..(i + 1) * BLOCK];
            match src {
                Src::Mem(d) => dst.copy_from_slice(d),
                Src::Zero => {
                    dst.fill(0);
                    zero[i] = true;
                }
                Src::Disk if map[i] == 0 => {
                    dst.fill(0);
                    zero[i] = true;
                }
                Src::Disk | Src::At(_) => {}
            }
        }
        // One read per disk run (of what the page cache did not give).
        for (&(i, j, dbn), &had) in disk_runs.iter().zip(&cached) {
            let dst = &mut out[i * BLOCK..j * BLOCK];
            let off = dbn
                .checked_mul(BLOCK as u64)
                .ok_or_else(|| io::Error::other("the map names a block past any disk"))?;
            let got = had + read_full_at(&self.data, &mut dst[had..], off + had as u64)?;
            if got < dst.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("data is shorter than block {}", dbn + (j - i) as u64),
                ));
            }
            self.decrypt_read(dbn, dst);
        }
        self.readahead.on_read(first, n as u64);
        Ok((zero, disk_runs.len()))
    }

    /// Starts the disk reads of a read of `runs` (first index, end, DBN)
    /// that `missed` the page cache (all but the first when that cannot
    /// be told: `track` off, or no probe) beyond the `cached` bytes of
    /// each, and asks for `hints`, the clusters around them. A read of one
    /// run asks for its clusters and leaves the run to the read itself, so
    /// that the block layer joins them into one disk read. A read of
    /// several asks for its runs first, then the clusters: the disk takes
    /// them in that order, and what the read waits for is not queued
    /// behind what is only likely to be read (on the harness trace at
    /// threshold 4: read p99 −10 %, 4 % more disk reads).
    pub(crate) fn ask_for_runs(
        &self,
        runs: &[(usize, usize, u64)],
        cached: &[usize],
        missed: &[bool],
        hints: Vec<(u64, u64)>,
        track: bool,
    ) {
        if runs.len() <= 1 {
            crate::readahead::hint_all(&self.data, &hints);
            return;
        }
        let unknown = !track || !self.readahead.probes();
        for (k, &(i, j, dbn)) in runs.iter().enumerate() {
            let first_alone = k == 0 && hints.is_empty();
            if !first_alone && (missed[k] || (unknown && k > 0)) {
                let had = (cached[k] / BLOCK) as u64;
                will_need(&self.data, dbn + had, (j - i) as u64 - had);
            }
        }
        crate::readahead::hint_all(&self.data, &hints);
    }

    /// What goes to disk blocks `dbn..` for `data` (whole blocks): the
    /// data itself, or encrypted.
    pub(crate) fn disk_bytes<'a>(&self, dbn: u64, data: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        match &self.crypt {
            None => std::borrow::Cow::Borrowed(data),
            Some(c) => {
                let mut v = data.to_vec();
                c.seal_data(dbn, &mut v);
                std::borrow::Cow::Owned(v)
            }
        }
    }

    /// Decrypts, in place, whole blocks read from disk blocks `dbn..`.
    pub(crate) fn decrypt_read(&self, dbn: u64, buf: &mut [u8]) {
        if let Some(c) = &self.crypt {
            c.open_data(dbn, buf);
        }
    }

    /// Disk block `dbn` into `dst` (one block), decrypted.
    pub(crate) fn read_block(&self, dbn: u64, dst: &mut [u8]) -> io::Result<()> {
        let off = dbn
            .checked_mul(BLOCK as u64)
            .ok_or_else(|| io::Error::other("the map names a block past any disk"))?;
        if read_full_at(&self.data, dst, off)? < dst.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("data is shorter than block {dbn}"),
            ));
        }
        self.decrypt_read(dbn, dst);
        Ok(())
    }

    /// A journal record of whole blocks from `first`: its header, and for
    /// an encrypted volume the bytes to append in place of `data`.
    pub(crate) fn journal_record(&self, first: u64, data: &[u8]) -> JournalRecord {
        match &self.crypt {
            None => (journal::write_header(first, data, BLOCK), None),
            Some(c) => {
                let mut sealed = data.to_vec();
                c.seal_journal(first, &mut sealed);
                (journal::write_header(first, &sealed, BLOCK), Some(sealed))
            }
        }
    }

    /// A block's dedup fingerprint (keyed in an encrypted volume).
    pub(crate) fn fingerprint(&self, block: &[u8]) -> crate::idedup::Fp {
        match &self.crypt {
            None => crate::idedup::fingerprint(block),
            Some(c) => c.fingerprint(block),
        }
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(e) if e <= self.cfg.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "beyond the end of the volume",
            )),
        }
    }

    /// Reads `buf.len()` bytes at `offset`; returns the block-aligned
    /// byte ranges of `buf` that are zeros.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<Vec<(u64, u64)>> {
        self.read_range(offset, buf, true)
    }

    /// The disk blocks that hold logical blocks `first..first + n` now:
    /// None for a block never written, trimmed or zeroed, or whose last
    /// write is still buffered (not destaged: no disk block has it yet).
    pub fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        self.check_range(first * BLOCK as u64, n as u64 * BLOCK as u64)?;
        let srcs: Vec<Src> = {
            let m = lock(&self.mem);
            (0..n as u64).map(|i| Self::src(&m, first + i)).collect()
        };
        let map = self.map.read(first, n)?;
        Ok(srcs
            .iter()
            .zip(map)
            .map(|(s, e)| match s {
                Src::At(d) => Some(*d),
                Src::Disk => e.checked_sub(1),
                Src::Mem(_) | Src::Zero => None,
            })
            .collect())
    }

    /// The volume's bytes from its start, as one stream (`volume
    /// snapshot`): its reads are not counted in the clients' statistics,
    /// nor do they steer `--threshold auto`.
    pub fn image_reader(self: &Arc<Self>) -> ImageReader {
        ImageSource::Live {
            vol: self.clone(),
            pos: 0,
        }
        .reader()
    }

    pub(crate) fn read_range(
        &self,
        offset: u64,
        buf: &mut [u8],
        track: bool,
    ) -> io::Result<Vec<(u64, u64)>> {
        let t = Instant::now();
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(Vec::new());
        }
        let first = offset / BLOCK as u64;
        let last = (offset + buf.len() as u64 - 1) / BLOCK as u64;
        let n = (last - first + 1) as usize;
        let aligned = offset.is_multiple_of(BLOCK as u64) && buf.len().is_multiple_of(BLOCK);
        let (zero, runs) = if aligned {
            self.read_blocks(first, buf, track)?
        } else {
            let mut tmp = vec![0u8; n * BLOCK];
            let r = self.read_blocks(first, &mut tmp, track)?;
            let skip = (offset % BLOCK as u64) as usize;
            buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
            r
        };
        if track {
            lock(&self.live.read_sizes).add(n, 1);
            lock(&self.live.recent_reads).push(n);
            if runs > 0 {
                lock(&self.live.fragmentation).add(runs, 1);
            }
        }
        let mut holes = Vec::new();
        if aligned {
            let mut i = 0;
            while i < n {
                if zero[i] {
                    let s = i;
                    while i < n && zero[i] {
                        i += 1;
                    }
                    holes.push(((s * BLOCK) as u64, (i * BLOCK) as u64));
                } else {
                    i += 1;
                }
            }
        }
        if track {
            self.live.read_latency.record(t.elapsed());
        }
        Ok(holes)
    }
}
