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
//!
//! A read that misses the page cache also asks for the rest of the
//! aligned *cluster* of disk blocks around what it reads ([`Clusters`]):
//! blocks written together lie together in the data file, and are read
//! together far more often than not. A volume that overwrites in place
//! gets this from the kernel's context readahead (a miss whose preceding
//! pages were read reads ahead); a log does not, since a block's
//! neighbours there were written at the same time, not read before it.
//! A read of blocks so asked for asks for the cluster after it, once
//! (the kernel's asynchronous readahead, in clusters of the data file):
//! blocks written together are read on together. The cluster's size (16
//! to 256 KiB) follows how many of the blocks asked for are read later:
//! it halves while fewer than 1/16 are (random reads over a large volume
//! stay small reads), and doubles while a quarter or more are.
//!
//! A miss is told by asking the page cache how much of the run it holds
//! (`cachestat(2)`, Linux 6.5: it reads nothing). Where that call is
//! missing or refused, and in a process under a seccomp filter (one that
//! kills on a call it does not know would end the server), the run is
//! read from the page cache only (`preadv2(RWF_NOWAIT)`, Linux 4.14): a
//! hit is then read by that one call, a miss returns what was cached.
//! Since Linux 5.9 such a miss has already started the read of the rest
//! before the cluster is asked for, so the disk gets both as separate
//! reads (the trace: a quarter to half more disk reads, p50 up to 10 %
//! slower in a random order than with `cachestat`, and still far faster
//! than without clusters). Where neither works, there are no clusters.

use crate::blockmap::BlockMap;
use crate::config::BLOCK;
use crate::mutex::lock;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
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

/// The smallest, first and largest cluster, in disk blocks (16, 64 and
/// 256 KiB): powers of two, at most [`GROUP`] (checked below).
pub(crate) const CLUSTER_MIN: u64 = 4;
pub(crate) const CLUSTER_FIRST: u64 = 16;
pub(crate) const CLUSTER_MAX: u64 = 64;
/// Disk blocks per slot of [`Clusters`] (one bit each).
const GROUP: u64 = 64;
const _: () =
    assert!(CLUSTER_MIN.is_power_of_two() && CLUSTER_MAX.is_power_of_two() && CLUSTER_MAX <= GROUP);
/// Slots of [`Clusters`]: what was asked for in up to 1 GiB of the
/// data file (64 KiB).
const CLUSTER_SLOTS: usize = 1 << 12;
/// Blocks asked for between two decisions on the cluster's size.
const CLUSTER_EPOCH: u64 = 4096;

/// The cluster readahead of a volume's misses: which disk blocks around
/// a missed read to ask for, and whether those asked for are then read.
#[derive(Debug)]
pub(crate) struct Clusters {
    /// Per 64-block group of the data file (direct-mapped): (group + 1,
    /// the blocks asked for and not read since, the blocks ever asked
    /// for). 0 is an empty slot.
    slots: Vec<(u64, u64, u64)>,
    size: u64,
    /// Blocks asked for, and of those read, since the last decision.
    asked: u64,
    used: u64,
    /// The same since the volume was opened.
    pub(crate) total_asked: u64,
    pub(crate) total_used: u64,
}

impl Default for Clusters {
    fn default() -> Clusters {
        Clusters {
            slots: vec![(0, 0, 0); CLUSTER_SLOTS],
            size: CLUSTER_FIRST,
            asked: 0,
            used: 0,
            total_asked: 0,
            total_used: 0,
        }
    }
}

/// The bits of blocks `from..to` within their group (one group).
fn group_mask(from: u64, to: u64) -> u64 {
    let (a, n) = (from % GROUP, to - from);
    if n >= GROUP {
        u64::MAX
    } else {
        ((1u64 << n) - 1) << a
    }
}

impl Clusters {
    /// The cluster size now, in blocks.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    fn slot(group: u64) -> usize {
        (group % CLUSTER_SLOTS as u64) as usize
    }

    /// Disk blocks `dbn..dbn+n` were read (from the page cache or not):
    /// those asked for count as used. A read of blocks asked for goes on
    /// in the data file's order, as the kernel's asynchronous readahead
    /// assumes: the cluster after the one it ends in, to ask for now
    /// (unless it was asked for before).
    pub(crate) fn on_read(&mut self, dbn: u64, n: u64) -> Option<(u64, u64)> {
        let end = dbn.saturating_add(n);
        let mut b = dbn;
        let mut used = 0;
        while b < end {
            let g = b / GROUP;
            let to = end.min((g + 1).saturating_mul(GROUP));
            let s = &mut self.slots[Self::slot(g)];
            if s.0 == g + 1 {
                let m = group_mask(b, to);
                used += u64::from((s.1 & m).count_ones());
                s.1 &= !m;
            }
            b = to;
        }
        self.used += used;
        self.total_used += used;
        if used == 0 {
            return None;
        }
        let c = self.size;
        let next = end.div_ceil(c).saturating_mul(c);
        let s = self.slots[Self::slot(next / GROUP)];
        let fresh = next.checked_add(c).is_some()
            && (s.0 != next / GROUP + 1 || s.2 & group_mask(next, next + c) == 0);
        if !fresh {
            return None;
        }
        self.mark(next, next + c);
        self.decide();
        Some((next, c))
    }

    /// Blocks `a..b` (within one group) asked for.
    fn mark(&mut self, a: u64, b: u64) {
        let g = a / GROUP;
        let s = &mut self.slots[Self::slot(g)];
        if s.0 != g + 1 {
            *s = (g + 1, 0, 0);
        }
        let m = group_mask(a, b);
        s.1 |= m;
        s.2 |= m;
        self.asked += b - a;
        self.total_asked += b - a;
    }

    /// The cluster's size after an epoch of blocks asked for.
    fn decide(&mut self) {
        if self.asked < CLUSTER_EPOCH {
            return;
        }
        let c = self.size;
        if self.used * 4 >= self.asked {
            self.size = (c * 2).min(CLUSTER_MAX);
        } else if self.used * 16 < self.asked {
            self.size = (c / 2).max(CLUSTER_MIN);
        }
        self.asked = 0;
        self.used = 0;
    }

    /// A read of disk blocks `dbn..dbn+n` missed the page cache: the
    /// blocks to ask for beside it, (first, count) — before it in its
    /// first cluster, after it in its last (the read itself is a read of
    /// its own).
    pub(crate) fn on_miss(&mut self, dbn: u64, n: u64) -> [Option<(u64, u64)>; 2] {
        let c = self.size;
        let end = dbn.saturating_add(n);
        let around = [(dbn / c * c, dbn), (end, end.div_ceil(c).saturating_mul(c))];
        let mut out = [None; 2];
        for (k, (a, b)) in around.into_iter().enumerate() {
            if a < b {
                // Within one group, as c divides GROUP.
                self.mark(a, b);
                out[k] = Some((a, b - a));
            }
        }
        self.decide();
        out
    }
}

/// Blocks per hint: the kernel reads at most its readahead window per
/// `WILLNEED` (often 128 KiB), so a longer run is asked for in pieces.
const HINT_BLOCKS: u64 = 32;

/// Asks for each of `hints` ([`hint`]).
pub(crate) fn hint_all(data: &File, hints: &[(u64, u64)]) {
    for &(from, count) in hints {
        hint(data, from, count);
    }
}

/// Asks the kernel to start reading `blocks` disk blocks from `dbn` of
/// `data` into the page cache (a hint: errors are ignored), in hints of
/// at most [`HINT_BLOCKS`].
pub(crate) fn will_need(data: &File, dbn: u64, blocks: u64) {
    let mut at = dbn;
    let end = dbn.saturating_add(blocks);
    while at < end {
        let n = (end - at).min(HINT_BLOCKS);
        if !hint(data, at, n) {
            return;
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
    clusters: Mutex<Clusters>,
    /// How the page cache is asked what it holds ([`Probe`]).
    probe: AtomicU8,
}

/// How a volume tells a read that misses the page cache, in the order
/// tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Probe {
    /// Asks how much of the range is cached (`cachestat(2)`).
    Cachestat = 0,
    /// Reads from the page cache only (`preadv2(RWF_NOWAIT)`).
    NoWait = 1,
    /// Neither works here: no clusters.
    Off = 2,
}

impl Probe {
    fn from_u8(v: u8) -> Probe {
        match v {
            0 => Probe::Cachestat,
            1 => Probe::NoWait,
            _ => Probe::Off,
        }
    }

    /// The way to try first: `cachestat`, unless a seccomp filter could
    /// kill the process for a call this recent.
    fn first() -> Probe {
        static FIRST: std::sync::OnceLock<Probe> = std::sync::OnceLock::new();
        *FIRST.get_or_init(|| {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            match seccomp_filtered(&status) {
                true => Probe::NoWait,
                false => Probe::Cachestat,
            }
        })
    }
}

/// Whether `/proc/self/status` text says a seccomp filter is on (mode 2).
fn seccomp_filtered(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .is_some_and(|v| v.trim() == "2")
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
            clusters: Mutex::default(),
            probe: AtomicU8::new(Probe::first() as u8),
        }
    }

    /// Whether the page cache can be asked what it holds.
    pub(crate) fn probes(&self) -> bool {
        self.probe() != Probe::Off
    }

    /// How a miss is told now, for `volume stats`.
    pub(crate) fn probe_name(&self) -> &'static str {
        match self.probe() {
            Probe::Cachestat => "cachestat",
            Probe::NoWait => "read-nowait",
            Probe::Off => "off",
        }
    }

    fn probe(&self) -> Probe {
        Probe::from_u8(self.probe.load(Ordering::Relaxed))
    }

    /// From `from` to the next way (only ever down: a thread that saw an
    /// earlier way does not bring it back).
    fn step_down(&self, from: Probe, to: Probe) {
        let _ =
            self.probe
                .compare_exchange(from as u8, to as u8, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The cluster size now, and the blocks asked for around misses and
    /// read since the volume was opened.
    pub(crate) fn cluster_figures(&self) -> (u64, u64, u64) {
        let c = lock(&self.clusters);
        (c.size(), c.total_asked, c.total_used)
    }

    /// Before disk blocks `dbn..` of `data` are read into `dst` (whole
    /// blocks): reads what the page cache holds of them, and when that is
    /// not all, asks for the rest of their clusters ([`Clusters`]). The
    /// bytes of `dst` read (a prefix; the caller reads the rest), and
    /// whether the run missed (false where that cannot be told).
    #[cfg(test)]
    pub(crate) fn before_read(&self, data: &File, dst: &mut [u8], dbn: u64) -> (usize, bool) {
        let mut hints = Vec::new();
        let r = self.probe_run(data, dst, dbn, &mut hints);
        hint_all(data, &hints);
        r
    }

    /// [`Self::before_read`], the clusters to ask for added to `hints`
    /// instead of asked for: the caller asks for the reads it must wait
    /// for first, so that they are not queued behind what is only
    /// likely to be read.
    pub(crate) fn probe_run(
        &self,
        data: &File,
        dst: &mut [u8],
        dbn: u64,
        hints: &mut Vec<(u64, u64)>,
    ) -> (usize, bool) {
        let n = (dst.len() / BLOCK) as u64;
        let bs = BLOCK as u64;
        let (Some(off), Some(len)) = (dbn.checked_mul(bs), n.checked_mul(bs)) else {
            return (0, false);
        };
        let (got, missed) = match self.probe() {
            Probe::Off => return (0, false),
            Probe::Cachestat => match all_cached(data, off, len) {
                Ok(all) => (0, !all),
                Err(_) => {
                    // Not here (before Linux 6.5, or refused): read from
                    // the page cache only.
                    self.step_down(Probe::Cachestat, Probe::NoWait);
                    return self.probe_run(data, dst, dbn, hints);
                }
            },
            Probe::NoWait => match read_cached(data, dst, off) {
                Ok(got) => (got, got < dst.len()),
                Err(_) => {
                    // Not on this file system or kernel either: the
                    // kernel's readahead only.
                    self.step_down(Probe::NoWait, Probe::Off);
                    return (0, false);
                }
            },
        };
        let (next, cluster) = {
            let mut c = lock(&self.clusters);
            let next = c.on_read(dbn, n);
            let around = if missed { c.on_miss(dbn, n) } else { [None; 2] };
            (next, around)
        };
        hints.extend(cluster.into_iter().chain([next]).flatten());
        (got, missed)
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

/// Reads `data` at `off` into `dst` from the page cache only
/// (`preadv2(RWF_NOWAIT)`): the bytes read, a prefix of `dst` (0 when its
/// first page is not cached). An error when the file system or kernel
/// cannot read that way.
fn read_cached(data: &File, dst: &mut [u8], off: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // Past any offset (a damaged map entry): nothing is cached there, and
    // the kernel's EINVAL must not turn the probe off.
    let end = off.checked_add(dst.len() as u64);
    let (Ok(off), Some(Ok(_))) = (libc::off_t::try_from(off), end.map(libc::off_t::try_from))
    else {
        return Ok(0);
    };
    let iov = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    // SAFETY: one iovec naming `dst`, live and writable for its length,
    // on an open descriptor.
    let r = unsafe { libc::preadv2(data.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) };
    if r >= 0 {
        return Ok(usize::try_from(r).unwrap_or(0).min(dst.len()));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Not cached (a read of it may have been started).
        Some(libc::EAGAIN) => Ok(0),
        // Unknown flag (before 4.14), no preadv2, a file system that cannot
        // (no FMODE_NOWAIT), a filter: this way does not work here.
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM) => Err(e),
        // Anything else is the blocking read's to report.
        _ => Ok(0),
    }
}

/// Whether the page cache holds all of `data`'s `len` bytes from `off`.
fn all_cached(data: &File, off: u64, len: u64) -> io::Result<bool> {
    // The pages the range touches, all of them cached.
    let page = page_size();
    let pages = off.saturating_add(len).div_ceil(page) - off / page;
    Ok(cached_pages(data, off, len)? >= pages)
}

/// How many pages of `data`'s `len` bytes from `off` the page cache
/// holds (`cachestat(2)`, Linux 6.5; it reads nothing).
fn cached_pages(data: &File, off: u64, len: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    /// `__NR_cachestat` on x86-64, arm64, riscv and most others (where it
    /// is another, the call fails and the volume stops asking).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off, len };
    let mut st = Stat::default();
    // SAFETY: the kernel reads `range` and writes `st`, both live and of
    // the layout cachestat(2) defines; an open descriptor; flags 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            data.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.nr_cache)
}

/// The kernel's page size (asked once).
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf with a valid name.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(p).unwrap_or(4096).max(1)
    })
}

/// Asks the kernel to read `blocks` disk blocks from `dbn` of `data` in
/// one hint (one read by the disk). False when the range is past any
/// offset.
fn hint(data: &File, dbn: u64, blocks: u64) -> bool {
    use std::os::fd::AsRawFd;
    let bs = BLOCK as u64;
    let (Some(off), Some(len)) = (dbn.checked_mul(bs), blocks.checked_mul(bs)) else {
        return false;
    };
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return false;
    };
    // SAFETY: posix_fadvise on an open descriptor with plain integers.
    unsafe {
        libc::posix_fadvise(data.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED);
    }
    true
}

/// Asks for the disk blocks of map entries `dbns`, one hint per run of
/// neighbouring disk blocks.
pub(crate) fn prefetch(dbns: &[u64], data: &File) {
    for (i, j, dbn) in crate::blockmap::disk_runs(dbns, |_| true) {
        will_need(data, dbn, (j - i) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_asks_for_the_rest_of_its_clusters() {
        let mut c = Clusters::default();
        assert_eq!(c.size(), CLUSTER_FIRST);
        // One block in the middle of a cluster of 16: the 5 before it and
        // the 10 after it.
        assert_eq!(c.on_miss(37, 1), [Some((32, 5)), Some((38, 10))]);
        // A run across clusters: the start of its first, the end of its
        // last; nothing is asked twice for a run on cluster bounds.
        assert_eq!(c.on_miss(60, 10), [Some((48, 12)), Some((70, 10))]);
        assert_eq!(c.on_miss(80, 16), [None, None]);
        assert_eq!(c.total_asked, 5 + 10 + 12 + 10);
        // Blocks asked for count once when read, the others not at all.
        c.on_read(30, 10);
        assert_eq!(c.total_used, 2 + 5);
        c.on_read(30, 10);
        assert_eq!(c.total_used, 7);
    }

    #[test]
    fn reading_blocks_asked_for_asks_for_the_next_cluster_once() {
        let mut c = Clusters::default();
        // Nothing asked for yet: a read asks for nothing.
        assert_eq!(c.on_read(0, 4), None);
        assert_eq!(c.on_miss(100, 1), [Some((96, 4)), Some((101, 11))]);
        // A read of blocks asked for: the next cluster, once.
        assert_eq!(c.on_read(101, 2), Some((112, 16)));
        assert_eq!(c.on_read(103, 2), None, "asked for already");
        // Reading that one on asks for the one after it.
        assert_eq!(c.on_read(112, 16), Some((128, 16)));
        // Blocks read before (not asked for again) ask for nothing.
        assert_eq!(c.on_read(112, 16), None);
        assert_eq!(c.total_asked, 4 + 11 + 16 + 16);
        assert_eq!(c.total_used, 2 + 2 + 16);
    }

    #[test]
    fn clusters_grow_while_their_blocks_are_read_and_shrink_while_not() {
        // A reader going through the data file: what was asked for is read.
        let mut c = Clusters::default();
        let mut dbn = 0;
        while dbn < 100_000 {
            if c.on_miss(dbn, 1).iter().flatten().count() > 0 {
                c.on_read(dbn, c.size());
            }
            dbn += c.size();
        }
        assert_eq!(c.size(), CLUSTER_MAX);
        // Random reads far apart: nothing asked for is read.
        let mut x = 7u64;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let dbn = (x >> 20) % (1 << 30);
            c.on_read(dbn, 1);
            c.on_miss(dbn, 1);
        }
        assert_eq!(c.size(), CLUSTER_MIN);
        // Both stay within bounds whatever comes.
        for b in [0, 1, 63, 64, u64::MAX - 10] {
            c.on_read(b, 10);
            c.on_miss(b, 10);
        }
        assert!((CLUSTER_MIN..=CLUSTER_MAX).contains(&c.size()));
    }

    #[test]
    fn reads_that_miss_ask_for_their_clusters_and_read_the_file_as_it_is() {
        // Each way of telling a miss, as a kernel or filter may leave it.
        for probe in [Probe::Cachestat, Probe::NoWait] {
            reads_that_miss_with(probe);
        }
    }

    fn reads_that_miss_with(probe: Probe) {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let mut f = File::create(&path).unwrap();
        let bytes: Vec<u8> = (0..300 * BLOCK).map(|i| (i % 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap();
        let f = File::open(&path).unwrap();
        let map = Arc::new(BlockMap::new(File::create(dir.path().join("map")).unwrap()));
        let r = Readahead::new(map, &f, 16);
        r.probe.store(probe as u8, Ordering::Relaxed);
        // Out of the page cache (clean pages: DONTNEED drops them).
        // SAFETY: posix_fadvise on an open descriptor.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        // Where the kernel says what it caches (Linux 6.5) and the pages
        // were dropped (not on tmpfs), reads miss and ask for clusters.
        let dropped = cached_pages(&f, 0, bytes.len() as u64).is_ok_and(|k| k == 0)
            || read_cached(&f, &mut [0u8; BLOCK], 0).is_ok_and(|got| got == 0);
        let mut misses = 0;
        let runs = [(37u64, 1usize), (100, 40), (295, 5), (299, 1)];
        for (dbn, n) in runs {
            let mut buf = vec![0u8; n * BLOCK];
            let (had, missed) = r.before_read(&f, &mut buf, dbn);
            misses += usize::from(missed);
            assert!(had <= buf.len());
            let at = dbn as usize * BLOCK;
            let got = crate::files::read_full_at(&f, &mut buf[had..], (at + had) as u64).unwrap();
            assert_eq!(had + got, n * BLOCK);
            assert_eq!(buf, bytes[at..at + n * BLOCK], "blocks {dbn}+{n}");
        }
        // Read again, now cached: where the page cache can be read alone,
        // the probe reads them all, exactly.
        for (dbn, n) in runs {
            let mut buf = vec![0u8; n * BLOCK];
            let (had, missed) = r.before_read(&f, &mut buf, dbn);
            if r.probe() == Probe::NoWait {
                assert!(!missed && had == buf.len(), "blocks {dbn}+{n}: {had}");
                let at = dbn as usize * BLOCK;
                assert_eq!(buf, bytes[at..at + n * BLOCK], "blocks {dbn}+{n}");
            }
        }
        // Past the end: nothing asked for there matters.
        for dbn in [1 << 40, u64::MAX / 2, u64::MAX] {
            let (had, _) = r.before_read(&f, &mut [0u8; 8 * BLOCK], dbn);
            assert_eq!(had, 0);
        }
        if r.probe() != probe {
            eprintln!(
                "SKIPPED: {probe:?} does not work here (now {:?})",
                r.probe()
            );
            return;
        }
        if dropped {
            assert!(misses >= 1, "{probe:?}: no read missed");
            let (size, asked, _) = r.cluster_figures();
            assert!(asked > 0, "no cluster asked for");
            assert!((CLUSTER_MIN..=CLUSTER_MAX).contains(&size));
        }
    }

    #[test]
    fn a_seccomp_filter_is_told_from_the_process_status() {
        let status = "Name:\tstrata\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert!(seccomp_filtered(status));
        assert!(!seccomp_filtered("Name:\tstrata\nSeccomp:\t0\n"));
        assert!(!seccomp_filtered("Seccomp:\t1\n"));
        assert!(!seccomp_filtered(""));
    }

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
