//! Readahead in the volume's own block order.
//!
//! The kernel reads ahead in the order of the data file, but a volume's
//! blocks lie there in the order they were written (first writes placed
//! as they come, destage's batches in arrival order, a deduplicated run
//! wherever its first copy is): a client reading the volume from start
//! to end reads disk blocks that may lie apart. WAFL, the file system
//! iDedup is built in, reads ahead by file blocks, not disk blocks
//! (§3.4: "sequential reads stay sequential" is about what it then
//! reads). So does a volume: it keeps a few read streams, and a read that
//! continues one asks the kernel for the disk blocks of the logical
//! blocks ahead of it (`posix_fadvise(WILLNEED)`: the reads start and the
//! call returns), on a thread of its own so that the client's read does
//! not wait for the map lookups. The window grows as a stream goes on,
//! as the kernel's does.
//!
//! And a read whose blocks lie in several disk runs asks for all but the
//! first before reading the first ([`will_need`]): the disk reads them
//! side by side instead of one after another.

use crate::blockmap::BlockMap;
use crate::volume::lock;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Read streams followed at once (a few clients, or one client's
/// several files).
pub(crate) const STREAMS: usize = 8;
/// The window of a stream just found, in blocks (128 KiB).
pub(crate) const FIRST_WINDOW: u64 = 32;
/// The largest window, in blocks (4 MiB).
pub(crate) const MAX_WINDOW: u64 = 1024;
/// How far from a stream's end a read may start and still continue it:
/// a connection's workers serve one stream's requests in any order.
pub(crate) const SLACK: u64 = 64;

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    /// The block after the furthest read of the stream.
    next: u64,
    /// Blocks below this have been asked for.
    ahead: u64,
    /// Ask again once the stream has read up to here (the middle of what
    /// was last asked for, as the kernel's readahead mark).
    mark: u64,
    window: u64,
    /// When the stream was last read (for replacing the oldest).
    used: u64,
}

/// The read streams of a volume: which logical blocks to read ahead.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    streams: Vec<Stream>,
    tick: u64,
}

impl Streams {
    /// A read of blocks `first..first+n` of a volume of `nblocks`: the
    /// logical blocks to read ahead now, if any. A read that continues
    /// no stream starts one (and reads nothing ahead: a random read
    /// stays one read).
    pub(crate) fn on_read(&mut self, first: u64, n: u64, nblocks: u64) -> Option<(u64, u64)> {
        self.tick += 1;
        let end = first.saturating_add(n).min(nblocks);
        let tick = self.tick;
        let hit = self.streams.iter_mut().find(|s| {
            first <= s.next.saturating_add(SLACK) && first.saturating_add(SLACK) >= s.next
        });
        let Some(s) = hit else {
            let fresh = Stream {
                next: end,
                ahead: end,
                mark: end,
                window: FIRST_WINDOW,
                used: tick,
            };
            if self.streams.len() < STREAMS {
                self.streams.push(fresh);
            } else if let Some(old) = self.streams.iter_mut().min_by_key(|s| s.used) {
                *old = fresh;
            }
            return None;
        };
        s.used = tick;
        // Only a read that goes further asks for more (one behind, or
        // the same again, does not).
        let advanced = end > s.next;
        s.next = s.next.max(end);
        if !advanced || s.next < s.mark {
            return None;
        }
        let from = s.ahead.max(s.next);
        let to = s.next.saturating_add(s.window).min(nblocks);
        s.mark = from + to.saturating_sub(from) / 2;
        s.window = (s.window * 2).min(MAX_WINDOW);
        s.ahead = to.max(s.ahead);
        (from < to).then_some((from, to - from))
    }
}

/// Blocks per hint: the kernel reads at most its readahead window per
/// `WILLNEED` (often 128 KiB), so a longer run is asked for in pieces.
const HINT_BLOCKS: u64 = 32;

/// Asks the kernel to start reading `blocks` disk blocks from `dbn` of
/// `data` into the page cache (a hint: errors are ignored).
pub(crate) fn will_need(data: &File, dbn: u64, blocks: u64) {
    use std::os::fd::AsRawFd;
    let bs = crate::volume::BLOCK as u64;
    let mut at = dbn;
    let end = dbn.saturating_add(blocks);
    while at < end {
        let n = (end - at).min(HINT_BLOCKS);
        let (Some(off), Some(len)) = (at.checked_mul(bs), n.checked_mul(bs)) else {
            return;
        };
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise on an open descriptor with plain integers.
        unsafe {
            libc::posix_fadvise(data.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED);
        }
        at += n;
    }
}

/// A volume's readahead: its read streams, and the thread that looks up
/// and asks for the disk blocks ahead (started on the first stream
/// found).
pub(crate) struct Readahead {
    streams: Mutex<Streams>,
    nblocks: u64,
    /// The block map and the data file (a handle of its own).
    files: Mutex<Option<(Arc<BlockMap>, File)>>,
    worker: Mutex<Option<mpsc::Sender<(u64, u64)>>>,
    /// Set by [`Readahead::stop`]: the thread drops what is queued.
    stopped: Arc<AtomicBool>,
}

impl Readahead {
    pub(crate) fn new(map: Arc<BlockMap>, data: &File, nblocks: u64) -> Readahead {
        let files = data.try_clone().map(|d| (map, d));
        Readahead {
            streams: Mutex::new(Streams::default()),
            nblocks,
            // Without handles of its own (out of descriptors), no readahead.
            files: Mutex::new(files.ok()),
            worker: Mutex::new(None),
            stopped: Arc::default(),
        }
    }

    /// Called after each read of logical blocks `first..first+n`.
    pub(crate) fn on_read(&self, first: u64, n: u64) {
        let Some(ahead) = lock(&self.streams).on_read(first, n, self.nblocks) else {
            return;
        };
        let mut w = lock(&self.worker);
        if w.is_none() {
            let Some((map, data)) = lock(&self.files).take() else {
                return;
            };
            let (tx, rx) = mpsc::channel::<(u64, u64)>();
            let stopped = self.stopped.clone();
            let spawned = std::thread::Builder::new()
                .name("strata-readahead".into())
                .spawn(move || {
                    while let Ok((from, count)) = rx.recv() {
                        if stopped.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Ok(dbns) = map.read(from, count as usize) {
                            prefetch(&dbns, &data);
                        }
                    }
                });
            if spawned.is_err() {
                return;
            }
            *w = Some(tx);
        }
        if let Some(tx) = w.as_ref() {
            let _ = tx.send(ahead);
        }
    }

    /// Ends the thread (when the volume closes).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        lock(&self.worker).take();
        lock(&self.files).take();
    }
}

/// Asks for the disk blocks of map entries `dbns`, one hint per run of
/// neighbouring disk blocks.
pub(crate) fn prefetch(dbns: &[u64], data: &File) {
    for (i, j, dbn) in crate::volume::disk_runs(dbns, |_| true) {
        will_need(data, dbn, (j - i) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_random_read_reads_nothing_ahead() {
        let mut s = Streams::default();
        assert_eq!(s.on_read(100, 4, 10_000), None);
        assert_eq!(s.on_read(5000, 4, 10_000), None);
        assert_eq!(s.on_read(2000, 1, 10_000), None);
    }

    #[test]
    fn a_stream_reads_ahead_in_growing_windows() {
        let mut s = Streams::default();
        assert_eq!(s.on_read(0, 8, 100_000), None);
        // The second read continues the stream: the window after it.
        assert_eq!(s.on_read(8, 8, 100_000), Some((16, FIRST_WINDOW)));
        // Within the first half of what was asked for: nothing more.
        assert_eq!(s.on_read(16, 8, 100_000), None);
        // Into the second half: the rest of a window twice as large.
        let ahead = 16 + FIRST_WINDOW;
        assert_eq!(
            s.on_read(24, 8, 100_000),
            Some((ahead, 32 + 2 * FIRST_WINDOW - ahead))
        );
        // The window stops growing at MAX_WINDOW.
        let mut at = 32;
        let mut last = None;
        for _ in 0..10_000 {
            if let Some(r) = s.on_read(at, 8, 100_000) {
                last = Some(r);
            }
            at += 8;
        }
        let (from, count) = last.unwrap();
        assert!(count <= MAX_WINDOW && from + count <= at + MAX_WINDOW);
    }

    #[test]
    fn reads_that_do_not_go_further_ask_for_nothing() {
        let mut s = Streams::default();
        assert_eq!(s.on_read(1000, 8, 100_000), None);
        // Near, but behind or the same again: random reads with locality.
        assert_eq!(s.on_read(990, 8, 100_000), None);
        assert_eq!(s.on_read(1000, 8, 100_000), None);
        assert!(s.on_read(1008, 8, 100_000).is_some());
    }

    #[test]
    fn readahead_stops_at_the_end_of_the_volume() {
        let mut s = Streams::default();
        assert_eq!(s.on_read(90, 4, 100), None);
        assert_eq!(s.on_read(94, 4, 100), Some((98, 2)));
        assert_eq!(s.on_read(98, 2, 100), None);
    }

    #[test]
    fn requests_served_out_of_order_keep_one_stream() {
        let mut s = Streams::default();
        s.on_read(0, 8, 100_000);
        // A connection's workers served the third request first.
        assert!(s.on_read(16, 8, 100_000).is_some());
        assert_eq!(s.on_read(8, 8, 100_000), None);
        assert_eq!(s.streams.len(), 1);
    }

    #[test]
    fn interleaved_streams_are_followed_apart_and_the_oldest_replaced() {
        let mut s = Streams::default();
        let starts: Vec<u64> = (0..STREAMS as u64).map(|k| k * 10_000).collect();
        for &b in &starts {
            assert_eq!(s.on_read(b, 4, 1 << 30), None);
        }
        for &b in &starts {
            assert!(s.on_read(b + 4, 4, 1 << 30).is_some(), "stream at {b}");
        }
        // A new stream replaces the least recently read one (the first).
        assert_eq!(s.on_read(500_000, 4, 1 << 30), None);
        assert_eq!(
            s.on_read(8, 4, 1 << 30),
            None,
            "the first stream was replaced"
        );
        assert!(s.on_read(500_004, 4, 1 << 30).is_some());
    }
}
