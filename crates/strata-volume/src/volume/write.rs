//! The write path: journaled writes buffered for destage, first writes
//! placed straight on disk, zeroed ranges, flush and sync.

use crate::config::*;
use crate::error::*;
use crate::files::*;
use crate::journal::{self, Record};
use crate::mutex::lock;
use crate::state::*;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

impl Volume {
    /// Waits while the buffer is full; fails when destaging has failed,
    /// and — a write of `data` (not a trim or a zero range, which free
    /// space) — while the disk has no room for the next batch.
    pub(crate) fn lock_for_write(&self, data: bool) -> io::Result<MutexGuard<'_, Mem>> {
        let mut m = lock(&self.mem);
        while m.buf.bytes >= BUFFER_MAX && m.failed.is_none() && !m.stop && m.full.is_none() {
            m.urgent = true;
            self.kick.notify_all();
            m = self.destaged.wait(m).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(f) = &m.failed {
            return Err(f.error());
        }
        if m.stop {
            return Err(io::Error::other("the volume is closing"));
        }
        if let (Some(need), true) = (m.full, data) {
            return Err(no_room(need));
        }
        Ok(m)
    }

    /// Blocks `first..` as whole blocks with `data` placed at `skip`
    /// bytes into the first (partial blocks at the edges are read first).
    pub(crate) fn whole_blocks(
        &self,
        m: &Mem,
        offset: u64,
        data: &[u8],
    ) -> io::Result<(u64, Vec<u8>)> {
        let first = offset / BLOCK as u64;
        let skip = (offset % BLOCK as u64) as usize;
        let n = (skip + data.len()).div_ceil(BLOCK);
        let mut out = vec![0u8; n * BLOCK];
        if skip != 0 || !data.len().is_multiple_of(BLOCK) {
            let _reading = self.reuse_guard.read().unwrap_or_else(|e| e.into_inner());
            for b in [first, first + n as u64 - 1] {
                let dst = &mut out[((b - first) as usize) * BLOCK..][..BLOCK];
                match Self::src(m, b) {
                    Src::Mem(d) => dst.copy_from_slice(&d),
                    Src::Zero => dst.fill(0),
                    Src::At(d) => self.read_block(d, dst)?,
                    Src::Disk => {
                        let e = self.map.read(b, 1)?[0];
                        if e != 0 {
                            self.read_block(e - 1, dst)?;
                        }
                    }
                }
            }
        }
        out[skip..skip + data.len()].copy_from_slice(data);
        Ok((first, out))
    }

    pub(crate) fn after_write(&self, m: MutexGuard<'_, Mem>, fua: bool) -> io::Result<()> {
        if m.buf.bytes >= DESTAGE_AT {
            self.kick.notify_all();
        }
        let f = m.journal.file().try_clone()?;
        drop(m);
        if fua {
            f.sync_data()?;
        }
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.write_owned(offset, data.to_vec(), fua)
    }

    /// [`Self::write_at`] of a buffer handed over: a write of whole blocks
    /// goes to the journal and the buffer as it is, without a copy.
    pub fn write_owned(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        let t = Instant::now();
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let bs = BLOCK as u64;
        let aligned = offset.is_multiple_of(bs) && data.len().is_multiple_of(BLOCK);
        // Whole blocks: checksummed before taking the lock. Partial ones
        // need the current content of their edge blocks, under it. (Without
        // dedup, when the write's path is known: a write in place needs no
        // checksum, a placed one its data's only.)
        let direct = aligned && !self.cfg.dedup;
        let head = (aligned && !direct).then(|| self.journal_record(offset / bs, &data));
        let mut m = self.lock_for_write(true)?;
        m.changes
            .mark(offset / bs, (offset + data.len() as u64).div_ceil(bs));
        if direct {
            // Checked under the mem lock, as a journal record is written:
            // no other write, destage batch or freeze comes between.
            let first = offset / bs;
            let over = match self.in_place(&m, first, data.len() / BLOCK)? {
                Some(Direct::Over(at)) => self.direct_io_guard().map(|g| (at, g)),
                Some(Direct::New) => return self.write_placed(m, first, data, fua, t),
                None => None,
            };
            let Some((at, writing)) = over else {
                let head = Some(self.journal_record(first, &data));
                return self.write_journaled(m, head, offset, data, fua, t);
            };
            // Written outside it (writes run side by side, as a plain
            // file's do); destage, the only other writer of mapped blocks
            // and what frees them, waits for `writing` to go. Meanwhile
            // the blocks are in `inflight`: reads, and a partial write's
            // edge blocks, find the new data there (not a half-written
            // block), and other writes of them go through the journal.
            let n = data.len() / BLOCK;
            let (token, data) = Self::put_inflight(&mut m, first, data);
            drop(m);
            let wrote = self.write_in_place(&at, &data);
            drop(writing);
            Self::take_inflight(&mut lock(&self.mem), first, n, token);
            wrote?;
            let r = match fua {
                true => self.sync_data_file(),
                false => Ok(()),
            };
            self.live.write_latency.record(t.elapsed());
            return r;
        }
        self.write_journaled(m, head, offset, data, fua, t)
    }

    /// A write through the journal and the buffer.
    pub(crate) fn write_journaled(
        &self,
        mut m: MutexGuard<'_, Mem>,
        head: Option<JournalRecord>,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
        t: Instant,
    ) -> io::Result<()> {
        let bs = BLOCK as u64;
        let (first, blocks) = match head {
            Some((h, sealed)) => {
                m.journal
                    .append_record(&h, sealed.as_deref().unwrap_or(&data))?;
                (offset / bs, data)
            }
            None => {
                let (first, blocks) = self.whole_blocks(&m, offset, &data)?;
                let (h, sealed) = self.journal_record(first, &blocks);
                m.journal
                    .append_record(&h, sealed.as_deref().unwrap_or(&blocks))?;
                (first, blocks)
            }
        };
        let n = blocks.len() / BLOCK;
        if !self.cfg.dedup {
            let g = m.journal.generation;
            m.recent.extend((first..first + n as u64).map(|b| (b, g)));
        }
        m.supersede(first, first + n as u64);
        let blocks = Arc::new(blocks);
        for (i, b) in Block::slices(&blocks, 0, n).enumerate() {
            m.buf.put(first + i as u64, b);
        }
        let r = self.after_write(m, fua);
        self.live.write_latency.record(t.elapsed());
        r
    }

    /// Whether a write of blocks `first..first+n` may go straight to
    /// disk, as a plain file's would (a volume without dedup, no freeze
    /// held): each block is on disk (not buffered or being destaged) and
    /// in no journal since the last checkpoint, and either every block has
    /// a disk block — which it alone references, there being no dedup — to
    /// write over, or none has and the write takes new ones.
    pub(crate) fn in_place(&self, m: &Mem, first: u64, n: usize) -> io::Result<Option<Direct>> {
        if self.holds.load(Ordering::SeqCst) > 0 {
            return Ok(None);
        }
        let bs = first..first + n as u64;
        if bs
            .clone()
            .any(|b| m.recent.contains_key(&b) || !matches!(Self::src(m, b), Src::Disk))
        {
            return Ok(None);
        }
        let map = self.map.read(first, n)?;
        if map.iter().all(|&e| e == 0) {
            return Ok(Some(Direct::New));
        }
        if map.contains(&0) {
            return Ok(None);
        }
        Ok(Some(Direct::Over(map.into_iter().map(|e| e - 1).collect())))
    }

    /// Puts a direct write's blocks in `inflight` under a new token.
    pub(crate) fn put_inflight(m: &mut Mem, first: u64, data: Vec<u8>) -> (u64, Arc<Vec<u8>>) {
        let data = Arc::new(data);
        let token = m.next_token;
        m.next_token += 1;
        for (i, b) in Block::slices(&data, 0, data.len() / BLOCK).enumerate() {
            m.inflight.insert(first + i as u64, (token, b));
        }
        (token, data)
    }

    /// Takes a direct write's blocks out of `inflight`: which of them were
    /// still its own (no later write replaced them).
    pub(crate) fn take_inflight(m: &mut Mem, first: u64, n: usize, token: u64) -> Vec<bool> {
        (first..first + n as u64)
            .map(|b| match m.inflight.get(&b) {
                Some((k, _)) if *k == token => m.inflight.remove(&b).is_some(),
                _ => false,
            })
            .collect()
    }

    /// A first write without dedup: the data goes to new disk blocks at
    /// once and the journal records where (with the data's CRCs); destage
    /// then only maps them. Written once, not journal then data file, and
    /// outside the mem lock, so such writes run side by side as a plain
    /// file's do: meanwhile reads find the data in `Mem::inflight`. Blocks
    /// a later write replaced meanwhile are left out of the record.
    pub(crate) fn write_placed(
        &self,
        mut m: MutexGuard<'_, Mem>,
        first: u64,
        data: Vec<u8>,
        fua: bool,
        t: Instant,
    ) -> io::Result<()> {
        let n = data.len() / BLOCK;
        let at = crate::destage::alloc(&mut lock(&self.space), n as u64);
        let (token, data) = Self::put_inflight(&mut m, first, data);
        drop(m);
        // The CRCs are of what is on disk (a replay checks the disk block).
        let disk = self.disk_bytes(at, &data);
        let crcs: Vec<u32> = disk.chunks(BLOCK).map(crc32c::crc32c).collect();
        let wrote = self.data.write_all_at(&disk, at * BLOCK as u64);
        drop(disk);
        let mut m = lock(&self.mem);
        let mine = Self::take_inflight(&mut m, first, n, token);
        let recorded = wrote.and_then(|_| {
            if let Some(f) = &m.failed {
                return Err(f.error());
            }
            // A close that began meanwhile: its last destage is done or
            // under way, and it deletes the current journal.
            if m.stop {
                return Err(io::Error::other("the volume is closing"));
            }
            // One record per run of blocks still this write's, appended
            // together (a failed append is cut whole).
            let mut enc = Vec::new();
            let mut i = 0;
            while i < n {
                let j = (i..n).find(|&j| mine[j] != mine[i]).unwrap_or(n);
                if mine[i] {
                    let r = journal::placed(first + i as u64, at + i as u64, &crcs[i..j]);
                    enc.extend_from_slice(&r);
                }
                i = j;
            }
            match enc.is_empty() {
                true => Ok(()),
                false => m.journal.append(&enc),
            }
        });
        if let Err(e) = recorded {
            // Nothing names the blocks: they go back.
            drop(m);
            let back = (at..at + n as u64).collect();
            crate::destage::release(&mut lock(&self.space).free, back);
            return Err(e);
        }
        let g = m.journal.generation;
        // Again now that it can be seen: a snapshot may have taken the
        // set since the write began.
        m.changes.mark(first, first + n as u64);
        let mut orphans = Vec::new();
        for i in 0..n as u64 {
            match mine[i as usize] {
                true => {
                    m.buf.place(first + i, at + i);
                    m.recent.insert(first + i, g);
                }
                false => orphans.push(at + i),
            }
        }
        self.data_dirty.store(true, Ordering::SeqCst);
        // FUA: the data and the record.
        let journal = match fua {
            true => Some(m.journal.file().try_clone()),
            false => None,
        };
        drop(m);
        if !orphans.is_empty() {
            crate::destage::release(&mut lock(&self.space).free, orphans);
        }
        let r = match journal {
            Some(j) => j.and_then(|j| self.sync_data_file().and_then(|_| j.sync_data())),
            None => Ok(()),
        };
        self.live.write_latency.record(t.elapsed());
        r
    }

    /// Writes `data` over disk blocks `at` (one write per run of
    /// neighbours); FUA or the next FLUSH syncs them.
    pub(crate) fn write_in_place(&self, at: &[u64], data: &[u8]) -> io::Result<()> {
        for (i, j) in neighbour_runs(at) {
            self.data.write_all_at(
                &self.disk_bytes(at[i], &data[i * BLOCK..j * BLOCK]),
                at[i] * BLOCK as u64,
            )?;
        }
        self.direct_blocks
            .fetch_add(at.len() as u64, Ordering::Relaxed);
        self.data_dirty.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// A shared hold on `direct_io` if one is free at once: a write in
    /// place never waits for a destage (it goes through the journal).
    pub(crate) fn direct_io_guard(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        match self.direct_io.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Syncs the data file for writes in place. A failure stops the
    /// volume like a failed checkpoint: the error is reported once per
    /// file, so the next checkpoint's sync could succeed over lost pages
    /// and delete journals whose batches never reached the disk.
    pub(crate) fn sync_data_file(&self) -> io::Result<()> {
        self.data.sync_data().inspect_err(|e| {
            self.fail(Failure::new(format!("syncing the data file: {e}"), Some(e)))
        })
    }

    /// TRIM and WRITE_ZEROES: the range reads back as zeros (whole blocks
    /// become holes; partial edge blocks are written with zeros).
    pub fn zero_range(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = BLOCK as u64;
        let a = offset.div_ceil(bs);
        let b = (offset + len) / bs;
        if a >= b {
            return self.write_at(offset, &vec![0u8; len as usize], fua);
        }
        if offset < a * bs {
            self.write_at(offset, &vec![0u8; (a * bs - offset) as usize], false)?;
        }
        if offset + len > b * bs {
            self.write_at(b * bs, &vec![0u8; (offset + len - b * bs) as usize], false)?;
        }
        let mut m = self.lock_for_write(false)?;
        m.changes.mark(a, b);
        let mut at = a;
        let mut enc = Vec::new();
        while at < b {
            let count = (b - at).min(u32::MAX as u64) as u32;
            journal::encode(&Record::Zero { block: at, count }, BLOCK, &mut enc);
            at += count as u64;
        }
        m.journal.append(&enc)?;
        m.supersede(a, b);
        m.buf.zero(a, b);
        self.after_write(m, fua)
    }

    /// Makes every acknowledged write durable.
    pub fn flush(&self) -> io::Result<()> {
        let (cur, prev) = {
            let m = lock(&self.mem);
            if let Some(f) = &m.failed {
                return Err(f.error());
            }
            (m.journal.file().try_clone()?, m.prev_journal.clone())
        };
        let older: Vec<Arc<File>> = lock(&self.unsynced)
            .iter()
            .map(|(_, f)| f.clone())
            .collect();
        for f in older.iter().chain(&prev) {
            f.sync_data()?;
        }
        cur.sync_data()?;
        // One at a time: a FLUSH that finds the flag cleared by another
        // still under way waits for that one's sync.
        let _one = lock(&self.data_sync);
        // One that failed before us (and cleared the flag) failed us too.
        if let Some(f) = &lock(&self.mem).failed {
            return Err(f.error());
        }
        if self.data_dirty.swap(false, Ordering::SeqCst) {
            self.sync_data_file()?;
        }
        Ok(())
    }

    /// Hurries the destage thread until `done` holds (or destaging has
    /// failed).
    pub(crate) fn wait_destaged<'m>(
        &self,
        mut m: MutexGuard<'m, Mem>,
        done: impl Fn(&Mem) -> bool,
    ) -> io::Result<MutexGuard<'m, Mem>> {
        while !done(&m) {
            if let Some(f) = &m.failed {
                return Err(f.error());
            }
            if let Some(need) = m.full {
                return Err(no_room(need));
            }
            m.urgent = true;
            self.kick.notify_all();
            m = self
                .destaged
                .wait_timeout(m, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(m)
    }

    /// Waits until everything written before the call is in the block
    /// map and no checkpoint is running — on disk (the page cache), not
    /// yet durable: what a kill -9 at this point leaves (crash tests).
    pub fn destage(&self) -> io::Result<()> {
        self.destage_current()?;
        while self.checkpoint_busy.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Destages everything buffered now and waits for it.
    pub fn sync_all(&self) -> io::Result<()> {
        let m = self.wait_destaged(lock(&self.mem), |m| {
            m.buf.is_empty() && m.destaging.is_none()
        })?;
        if let Some(f) = &m.failed {
            return Err(f.error());
        }
        drop(m);
        self.checkpoint().map_err(io::Error::other)
    }
}
