//! The background work: the destage loop (a batch at a time, waiting
//! for space on a full disk), checkpoints, and closing.

use crate::config::*;
use crate::error::*;
use crate::files::*;
use crate::journal::Journal;
use crate::mutex::lock;
use crate::state::*;
use std::fs::{self, File};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Volume {
    /// Waits until everything written before the call is in the map: the
    /// batch being filled now is destaged (one batch, not an empty buffer:
    /// clients may go on writing).
    pub(crate) fn destage_current(&self) -> io::Result<()> {
        let m = lock(&self.mem);
        let want = match m.buf.is_empty() {
            true => m.journal.generation.saturating_sub(1),
            false => m.journal.generation,
        };
        let m = self.wait_destaged(m, |m| m.applied >= want || m.stop)?;
        match m.applied >= want {
            true => Ok(()),
            false => Err(io::Error::other("the volume is closing")),
        }
    }
}

impl Volume {
    /// Makes every batch destaged so far durable: data, fingerprints, map
    /// and reference counts synced; then the blocks they freed become
    /// free and their journal files go. Batches destaged while the files
    /// sync keep their journal files and freed blocks for the next one.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        let _one = lock(&self.checkpointing);
        // After a failure (a sync that failed may have lost pages a retry
        // would report synced) nothing is released: reopening replays.
        if let Some(f) = lock(&self.mem).failed.clone() {
            return Err(VolumeError::Io("checkpoint".into(), f.error()));
        }
        let (freed, done, fps, refs, covered, entries) = {
            let mut d = lock(&self.disk);
            if self.picks_releases.load(Ordering::SeqCst) {
                self.pick_up_releases(&mut d);
            }
            // The map entries of every batch destaged so far (destage
            // applies a batch under the disk lock): their data is written.
            let entries = self.map.take();
            let fps = d.fps.try_clone().map_err(ioe("fps"))?;
            let refs = d.refs.try_clone().map_err(ioe("refs"))?;
            d.uncommitted_bytes = 0;
            d.last_checkpoint = Instant::now();
            // A frozen image may name freed blocks: they wait.
            let held = self.holds.load(Ordering::SeqCst) > 0;
            let freed = match held {
                true => Vec::new(),
                false => std::mem::take(&mut d.pending_free),
            };
            let covered = d.uncommitted_generation;
            (
                freed,
                std::mem::take(&mut d.uncommitted),
                fps,
                refs,
                covered,
                entries,
            )
        };
        // Everything those batches wrote was written before this point:
        // their map entries go to the map file once it is synced.
        let synced = (|| -> io::Result<()> {
            self.data.sync_data()?;
            fps.sync_data()?;
            self.map.commit(&entries)?;
            self.map.sync()?;
            refs.sync_data()
        })();
        let mut d = lock(&self.disk);
        if let Err(e) = synced {
            // Nothing is released: the journal files stay for recovery.
            d.pending_free.extend(freed);
            d.uncommitted.splice(0..0, done);
            drop(d);
            // Failed for good before the next checkpoint can start: a
            // retried fsync can claim success over pages it lost.
            self.fail(Failure::new(
                format!("syncing the volume's files: {e}"),
                Some(&e),
            ));
            return Err(VolumeError::Io("sync".into(), e));
        }
        for (i, p) in done.iter().enumerate() {
            match fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    // The rest stay tracked, for the next checkpoint, and
                    // nothing is reused: a journal left may name blocks.
                    d.uncommitted.splice(0..0, done[i..].iter().cloned());
                    d.pending_free.extend(freed);
                    return Err(VolumeError::Io(p.display().to_string(), e));
                }
            }
            lock(&self.unsynced).retain(|(q, _)| q != p);
        }
        // Released holds given back: their counts are synced.
        self.forget_given_back(&mut d);
        let k = self.direct_blocks.swap(0, Ordering::SeqCst);
        d.counters.logical_blocks_written += k;
        d.counters.physical_blocks_written += k;
        // Written under the disk lock: state files never go back in time.
        // (It syncs the directory: the journals are gone for good.)
        if let Err(e) = self.write_state(d.counters.clone()) {
            d.pending_free.extend(freed);
            drop(d);
            let why = format!("writing the volume's state: {e}");
            self.fail(Failure {
                why,
                ..Failure::of(&e)
            });
            return Err(e);
        }
        // Only now may the freed blocks be reused: no journal that could
        // be replayed names them. Reads in flight may still use an old
        // map entry: wait for them.
        drop(self.reuse_guard.write().unwrap_or_else(|e| e.into_inner()));
        punch_holes(&self.data, &freed);
        crate::destage::release(&mut lock(&self.space).free, freed);
        d.placed_since.retain(|_, g| *g > covered);
        drop(d);
        // Their blocks may be written in place from now on.
        lock(&self.mem).recent.retain(|_, g| *g > covered);
        Ok(())
    }

    /// Stops the volume (writes refused, nothing more destaged or
    /// released) after a failure that a retry could hide.
    /// Whether the volume is closing (or closed) or stopped by a failure.
    pub(crate) fn closing_or_stopped(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || lock(&self.mem).failed.is_some()
    }

    pub(crate) fn fail(&self, why: Failure) {
        let mut m = lock(&self.mem);
        m.failed.get_or_insert(why);
        self.destaged.notify_all();
    }

    /// Starts a checkpoint on a thread of its own unless one is running.
    pub(crate) fn checkpoint_in_background(self: &Arc<Self>) {
        if self.checkpoint_busy.swap(true, Ordering::SeqCst) {
            return;
        }
        /// Clears the busy flag however the checkpoint thread ends.
        struct Busy(Arc<Volume>);
        impl Drop for Busy {
            fn drop(&mut self) {
                self.0.checkpoint_busy.store(false, Ordering::SeqCst);
            }
        }
        let v = self.clone();
        let busy = Busy(self.clone());
        std::thread::spawn(move || {
            let _busy = busy;
            if let Err(e) = v.checkpoint() {
                tracing::error!("checkpoint failed: {e}");
                v.fail(Failure::of(&e));
            }
        });
    }

    /// Destages what is buffered, stops the destage thread and marks the
    /// volume clean.
    pub fn close(&self) -> io::Result<()> {
        self.close_keeping_lock().map(drop)
    }

    /// [`Volume::close`], handing back the volume's lock instead of
    /// letting it go (`None` if it was closed before): no other process
    /// opens the volume until the file is dropped (`volume defrag`, until
    /// it has swapped in the copy).
    pub fn close_keeping_lock(&self) -> io::Result<Option<File>> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(None);
        }
        self.readahead.stop();
        self.sync_all()?;
        lock(&self.mem).stop = true;
        self.kick.notify_all();
        // Writes in place under way reach the file before it is marked
        // clean and let go (placed ones under way fail: see write_placed).
        drop(self.direct_io.write().unwrap_or_else(|e| e.into_inner()));
        if let Some(h) = lock(&self.destager).take() {
            let _ = h.join();
        }
        // A checkpoint the destage thread started ends before the volume
        // is marked clean (none starts after that thread).
        while self.checkpoint_busy.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Writes a client sent while the close began that could not be
        // destaged (a full disk): their journal stays, to be replayed.
        if let Some(f) = &lock(&self.mem).failed {
            return Err(f.error());
        }
        // Batches destaged since sync_all's checkpoint (none, unless a
        // client wrote meanwhile) are synced before the clean mark.
        if !lock(&self.disk).uncommitted.is_empty() {
            self.checkpoint().map_err(io::Error::other)?;
        }
        // A release given back whose file is still there would be given
        // back again after a clean open: the volume stays unclean instead
        // (the next open recounts).
        if let Some(name) = lock(&self.disk).released_applied.iter().next() {
            return Err(io::Error::other(format!(
                "the released hold {name} could not be deleted: the next open recounts"
            )));
        }
        let m = lock(&self.mem);
        let _ = fs::remove_file(&m.journal.path);
        // Before the clean mark: a crash in between leaves no set.
        m.changes.save(&self.dir).map_err(io::Error::other)?;
        drop(m);
        self.save_live().map_err(io::Error::other)?;
        self.save_state(true).map_err(io::Error::other)?;
        Ok(lock(&self.lock).take())
    }

    /// The bytes destaging `buf` may take on the disk, if the disk has
    /// fewer free (none when it has enough, or cannot tell): its blocks'
    /// data, fingerprints and reference counts, a map page per 512
    /// logical blocks it touches, and [`SPACE_MARGIN`].
    pub(crate) fn short_of_space(&self, m: &Mem) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let buf = &m.buf;
        // Trims, zero ranges and placed writes (whose data is on disk
        // already) take no new data blocks: such a batch is never held
        // back (it may be what frees space).
        if buf.blocks.is_empty() {
            return None;
        }
        // With dedup every block goes to a new disk block (a duplicate is
        // not known before the batch runs); without, a mapped block is
        // written in place unless a frozen image holds it or it was
        // written since the last checkpoint (see `Mem::recent`).
        let in_place = !self.cfg.dedup && self.holds.load(Ordering::SeqCst) == 0;
        let keys: Vec<u64> = buf.blocks.keys().copied().collect();
        let mut new = keys.len() as u64;
        if in_place {
            let mut i = 0;
            while i < keys.len() {
                let mut j = i + 1;
                while j < keys.len() && keys[j] == keys[j - 1] + 1 && j - i < 1 << 16 {
                    j += 1;
                }
                if let Ok(map) = self.map.read(keys[i], j - i) {
                    let mapped = (i..j)
                        .filter(|&x| map[x - i] != 0 && !m.recent.contains_key(&keys[x]))
                        .count();
                    new -= mapped as u64;
                }
                i = j;
            }
        }
        // A map page per 512 logical blocks the batch touches, and those
        // of earlier batches' entries still waiting for a checkpoint.
        let mut pages: Vec<u64> = keys
            .iter()
            .chain(buf.placed.keys())
            .map(|b| b / 512)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let pages = pages.len() as u64 + (self.map.pending() as u64).div_ceil(512);
        let need = new * (BLOCK as u64 + 16 + 4) + pages * 4096 + SPACE_MARGIN;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the data file is open; `st` is a valid out-parameter.
        if unsafe { libc::fstatvfs(self.data.as_raw_fd(), &mut st) } != 0 {
            return None;
        }
        let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
        (free < need).then_some(need)
    }

    pub(crate) fn destage_loop(self: Arc<Self>) {
        loop {
            let taken = match self.take_batch() {
                Taken::Stop => return,
                Taken::Again => continue,
                Taken::Batch(t) => t,
            };
            let generation = taken.generation;
            let r = self.destage_batch(taken);
            let _ = self.save_live();
            let mut m = lock(&self.mem);
            if let Err(e) = r {
                // The batch stays where reads find it (its writes were
                // acknowledged); writes are refused from now on.
                tracing::error!(
                    "destage failed: {e}; writes are refused from now on (reads go on, \
                     acknowledged writes stay in the journal): stop the server, fix the \
                     cause and serve the volume again"
                );
                m.failed.get_or_insert(Failure::of(&e));
                self.destaged.notify_all();
                return;
            }
            m.destaging = None;
            m.prev_journal = None;
            m.applied = generation;
            self.destaged.notify_all();
        }
    }

    /// Waits for a batch to destage (a second's writes at most, or a full
    /// buffer, or a flush) and takes it, with its journal: a new journal
    /// takes new writes meanwhile.
    fn take_batch(&self) -> Taken {
        let mut m = lock(&self.mem);
        if m.failed.is_some() {
            // A failed checkpoint: nothing more is destaged.
            self.destaged.notify_all();
            return Taken::Stop;
        }
        // At most a second's writes wait in the buffer.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !m.stop && !m.urgent && m.buf.bytes < DESTAGE_AT {
            let now = Instant::now();
            if now >= deadline && !m.buf.is_empty() {
                break;
            }
            let wait = deadline
                .saturating_duration_since(now)
                .max(Duration::from_millis(50));
            m = self
                .kick
                .wait_timeout(m, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        m.urgent = false;
        if m.buf.is_empty() {
            return match m.stop {
                true => Taken::Stop,
                false => Taken::Again,
            };
        }
        // A batch destaged in part could not be taken back: one that may
        // not fit waits for space (writes of data are refused meanwhile),
        // and the volume goes on once there is.
        if let Some(need) = self.short_of_space(&m) {
            return self.wait_for_space(m, need);
        }
        if m.full.take().is_some() {
            tracing::info!("space freed on the disk holding the volume: writes resume");
            self.live.waiting_for_space.store(0, Ordering::Relaxed);
        }
        let next = m.journal.generation + 1;
        let fresh = match Journal::create(&self.dir, next) {
            Ok(j) => j,
            Err(e) => {
                m.failed = Some(Failure::new(
                    format!("cannot start journal {next}: {e}"),
                    Some(&e),
                ));
                self.destaged.notify_all();
                return Taken::Stop;
            }
        };
        let old = std::mem::replace(&mut m.journal, fresh);
        let batch = Arc::new(std::mem::take(&mut m.buf));
        m.destaging = Some(batch.clone());
        m.prev_journal = old.file().try_clone().ok().map(Arc::new);
        Taken::Batch(TakenBatch {
            batch,
            old_path: old.path.clone(),
            generation: old.generation,
            old_file: m.prev_journal.clone(),
            many_recent: m.recent.len() >= RECENT_MAX,
        })
    }

    /// The disk lacks `need` bytes for the batch: writes are refused with
    /// ENOSPC and the loop looks again after a pause — or, closing, the
    /// volume fails (the close keeps the journal: see
    /// `close_keeping_lock`).
    fn wait_for_space(&self, mut m: std::sync::MutexGuard<'_, Mem>, need: u64) -> Taken {
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        if m.stop {
            m.failed = Some(Failure::new(
                format!("no room on the disk for the last writes ({need} bytes): {full}"),
                Some(&full),
            ));
            self.destaged.notify_all();
            drop(m);
            self.live.waiting_for_space.store(0, Ordering::Relaxed);
            let _ = self.save_live();
            return Taken::Stop;
        }
        let first = m.full.is_none();
        m.full = Some(need);
        // Looked at again after the pause, not a second later.
        m.urgent = true;
        self.destaged.notify_all();
        drop(m);
        if first {
            tracing::warn!(
                "the disk holding the volume is full ({need} bytes needed to destage): \
                 writes are refused with ENOSPC until space is freed"
            );
        }
        // Told again at every look (written over its own bytes: it needs
        // no free block), so that `volume stats` says why, and goes on
        // counting reads, while the pause lasts.
        self.live.waiting_for_space.store(need, Ordering::Relaxed);
        if let Err(e) = self.save_live() {
            tracing::debug!("live figures not saved: {e}");
        }
        std::thread::sleep(SPACE_RETRY);
        Taken::Again
    }

    /// Whether `batch` must wait for a checkpoint before it is destaged.
    ///
    /// A batch that will overwrite in place blocks an older placed record
    /// names checkpoints what was destaged before it first: a power loss
    /// could keep the new data without the batch's record, and the replay
    /// would then find the placed block's checksum changed and read it as
    /// zeros. After the checkpoint no journal names them (and the blocks of
    /// those batches go straight to disk from then on). Syncing this
    /// batch's journal instead would do, but for every batch of the next
    /// seconds (random writes after a sequential one: 0.5x). (Other batches
    /// are not synced before destage: their data, written back before
    /// their records, is redone or dropped by the replay; their map entries
    /// reach the map file only with the checkpoint that synced their data,
    /// see `blockmap`.) Pending map entries stay bounded too when
    /// checkpoints fall behind (a slow sync).
    fn must_checkpoint(&self, batch: &Batch) -> bool {
        (!batch.blocks.is_empty() && self.holds.load(Ordering::SeqCst) == 0 && {
            let d = lock(&self.disk);
            batch.blocks.keys().any(|b| d.placed_since.contains_key(b))
        }) || self.map.pending() >= 2 * CHECKPOINT_ENTRIES
    }

    /// Destages a batch taken: applied to the map and counts (after a
    /// checkpoint where it must wait for one), its journal kept until a
    /// checkpoint syncs what it wrote, and a checkpoint started when one
    /// is due.
    fn destage_batch(self: &Arc<Self>, t: TakenBatch) -> Result<()> {
        if self.must_checkpoint(&t.batch) {
            self.checkpoint()?;
        }
        let freed = self.apply(&t.batch)?;
        // FLUSH syncs this journal until a checkpoint has synced what the
        // batch wrote (before `prev_journal` is cleared).
        if let Some(f) = t.old_file {
            lock(&self.unsynced).push((t.old_path.clone(), f));
        }
        let due = {
            let mut d = lock(&self.disk);
            // Free for reuse after the checkpoint that deletes this batch's
            // journal.
            d.free_later(freed);
            d.placed_since
                .extend(t.batch.placed.keys().map(|&b| (b, t.generation)));
            d.uncommitted_bytes += fs::metadata(&t.old_path).map(|m| m.len()).unwrap_or(0);
            d.uncommitted.push(t.old_path.clone());
            d.uncommitted_generation = t.generation;
            d.uncommitted_bytes >= CHECKPOINT_BYTES
                || self.map.pending() >= CHECKPOINT_ENTRIES
                || d.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
                || t.many_recent
        };
        if due {
            self.checkpoint_in_background();
        }
        Ok(())
    }

    /// The threshold in force: fixed, or (auto) the median size in blocks
    /// of the last [`RECENT_READS`] reads, 1..=8 (4 before any read):
    /// sequential reads raise it (dedup only long runs, reads stay on few
    /// physical runs), small random reads lower it (fragmentation costs
    /// them nothing, every duplicate is worth taking).
    pub fn threshold(&self) -> usize {
        match self.cfg.threshold {
            Threshold::Fixed(n) => n as usize,
            Threshold::Auto => lock(&self.live.recent_reads)
                .median()
                .map_or(4, |m| m.clamp(1, 8)),
        }
    }
}

/// What the destage loop takes next.
enum Taken {
    /// The volume stops (or failed).
    Stop,
    /// Nothing to destage yet; look again.
    Again,
    Batch(TakenBatch),
}

/// A batch taken for destage, and its journal.
struct TakenBatch {
    batch: Arc<Batch>,
    old_path: std::path::PathBuf,
    generation: u64,
    old_file: Option<Arc<File>>,
    /// Many blocks wait to be written in place: a checkpoint is due.
    many_recent: bool,
}
