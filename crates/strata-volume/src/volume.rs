//! A deduplicated block volume: iDedup's write path (§3.3) on files.
//!
//! Files in the volume's directory: `volume.json` (size, block size,
//! threshold, cache size), `journal.N` (acknowledged writes not yet on
//! disk), `data` (disk blocks, DBN × block size), `map` (logical block →
//! DBN + 1, 0 = zeros; u64 each), `refs` (u32 reference count per DBN),
//! `fps` (16-byte fingerprint per DBN, to warm the cache on open),
//! `state.json` (clean shutdown flag, counters) and `live.json` (the
//! running server's latency, cache and fragmentation figures).
//!
//! Writes are appended to the journal and kept in a buffer that reads see
//! at once; a background thread destages the buffer extent by extent,
//! in the order the extents were first written: fingerprints, dup-lists from the metadata
//! cache, `find_sequences` at the threshold, references for the runs
//! kept and new disk blocks for the rest — written, not synced. A
//! checkpoint (every 512 MiB of journal or 5 s, and on sync and close)
//! syncs data, fingerprints, map and reference counts, then deletes the
//! journal files of the batches it covers: until then a crash replays
//! them over the map, rewriting every block they touched. After an unclean
//! stop the reference counts are recounted from the map. Blocks freed by
//! a batch (overwrites, TRIM) are reused only after the next checkpoint,
//! so no map entry on disk can point at reused data.

use crate::blockmap::BlockMap;
use crate::changes::{ChangeSet, Changes};
use crate::crypt::{Crypt, Encryption, VolumeKey};
use crate::idedup::{Fp, MetaCache};
use crate::journal::{self, Journal, Record};
use crate::readahead::{prefetch, will_need, Readahead};
use crate::stats::{Histogram, Latency, Persistent};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const BLOCK: usize = 4096;
const FORMAT: u32 = 1;
/// The format of an encrypted volume: builds before encryption refuse it
/// (they would read its blocks as plain and write plain ones among them).
pub const FORMAT_ENCRYPTED: u32 = 2;
/// The buffer is destaged once it holds this much, or after a second.
const DESTAGE_AT: usize = 32 << 20;
/// Writers wait while the buffer holds this much (the batch being
/// destaged is not counted).
const BUFFER_MAX: usize = 256 << 20;
/// How often a batch that waits for disk space looks again.
const SPACE_RETRY: Duration = Duration::from_millis(500);
/// Room kept free beyond what a batch may need (journals, state files).
const SPACE_MARGIN: u64 = 1 << 20;
/// Destaged batches become durable together at a checkpoint, after this
/// many bytes of their journals or this long.
const CHECKPOINT_BYTES: u64 = 512 << 20;
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
/// ... or this many map entries wait for one (about 40 bytes each;
/// placed writes put their data in no journal). At twice as many, destage
/// waits for one.
const CHECKPOINT_ENTRIES: usize = 1 << 19;
/// ... or once this many blocks wait for one to be written in place
/// (`Mem::recent`: 1 GiB of first writes without dedup, whose journal
/// records are small).
const RECENT_MAX: usize = 1 << 18;
/// Longest extent the sequence algorithm looks at in one go.
pub(crate) const EXTENT_BLOCKS: usize = 1024;

#[derive(thiserror::Error, Debug)]
pub enum VolumeError {
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    #[error("{0}")]
    Invalid(String),
}

pub(crate) type Result<T> = std::result::Result<T, VolumeError>;

impl VolumeError {
    /// This error said in the light of `what` ("what: the error"); an
    /// I/O error stays one (a full disk is still told apart).
    pub fn context(self, what: impl std::fmt::Display) -> VolumeError {
        match self {
            VolumeError::Io(c, e) => VolumeError::Io(format!("{what}: {c}"), e),
            VolumeError::Invalid(m) => VolumeError::Invalid(format!("{what}: {m}")),
        }
    }

    /// An I/O error of `what`.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> VolumeError {
        let what = what.to_string();
        move |e| VolumeError::Io(what, e)
    }
}

/// Why a volume stopped taking writes, and the kind of error that made
/// it (a full disk is told apart: clients get ENOSPC, and the CLI says to
/// free space).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    why: String,
    kind: io::ErrorKind,
}

impl Failure {
    pub(crate) fn new(why: String, e: Option<&io::Error>) -> Failure {
        // Only a full disk (or quota) is told apart: any other kind (an
        // EINVAL of a write to the data file, say) would tell the client
        // its own request was wrong.
        let full = e.is_some_and(|e| {
            matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
                || matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                )
        });
        let kind = match full {
            true => io::ErrorKind::StorageFull,
            false => io::ErrorKind::Other,
        };
        Failure { why, kind }
    }

    fn of(e: &VolumeError) -> Failure {
        match e {
            VolumeError::Io(_, io) => Failure::new(e.to_string(), Some(io)),
            VolumeError::Invalid(_) => Failure::new(e.to_string(), None),
        }
    }

    /// The error writes (and syncs) get from now on.
    fn error(&self) -> io::Error {
        io::Error::new(self.kind, format!("the volume stopped: {}", self.why))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// A journal record's header, and the bytes to append when they are not
/// the data's own (encrypted).
type JournalRecord = ([u8; journal::HEADER], Option<Vec<u8>>);

pub(crate) fn ioe(what: impl Into<String>) -> impl FnOnce(io::Error) -> VolumeError {
    let w = what.into();
    move |e| VolumeError::Io(w, e)
}

/// The sequence threshold: a number, or chosen from how the volume is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Threshold {
    Fixed(u32),
    Auto,
}

impl std::str::FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(Threshold::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(Threshold::Fixed(n)),
            _ => Err(format!("{s:?}: a threshold is 1..=1024 blocks or `auto`")),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VolumeConfig {
    pub format: u32,
    pub size: u64,
    pub block_size: u32,
    pub threshold: Threshold,
    /// Bytes of dedup metadata cache.
    pub cache_bytes: u64,
    /// False: every block is written anew (the baseline of §5).
    pub dedup: bool,
    /// How the volume's blocks, journal and fingerprints are encrypted
    /// (a volume in an encrypted repository; see [`crate::crypt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// The counters and clean flag of the volume in `dir`.
pub(crate) fn read_state(dir: &Path) -> Result<State> {
    read_json(&dir.join("state.json"))
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct State {
    pub(crate) clean: bool,
    #[serde(default)]
    pub(crate) counters: Persistent,
}

/// Contiguous ranges [start, end) of blocks.
#[derive(Default, Clone, Debug)]
pub(crate) struct Ranges(pub(crate) BTreeMap<u64, u64>);

impl Ranges {
    fn contains(&self, b: u64) -> bool {
        self.0.range(..=b).next_back().is_some_and(|(_, &e)| b < e)
    }

    fn insert(&mut self, mut s: u64, mut e: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..=e)
            .rev()
            .take_while(|(_, &end)| end >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in overlapping {
            self.0.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.0.insert(s, e);
    }
}

/// One buffered block: a slice of the journal record it came in (the
/// record's bytes are shared by all its blocks, not copied per block; a
/// record partly overwritten stays in memory until its batch is destaged).
#[derive(Clone)]
pub(crate) struct Block {
    buf: Arc<Vec<u8>>,
    off: usize,
}

impl Block {
    /// Blocks of `buf` from byte `start` on (`n` of them).
    fn slices(buf: &Arc<Vec<u8>>, start: usize, n: usize) -> impl Iterator<Item = Block> + '_ {
        (0..n).map(move |i| Block {
            buf: buf.clone(),
            off: start + i * BLOCK,
        })
    }
}

impl Block {
    /// Whether this block comes right after `prev` in the same buffer.
    pub(crate) fn follows(&self, prev: &Block) -> bool {
        Arc::ptr_eq(&self.buf, &prev.buf) && self.off == prev.off + BLOCK
    }

    /// `n` blocks of this block's buffer from this one on (each of them
    /// [`Self::follows`] the one before).
    pub(crate) fn run(&self, n: usize) -> &[u8] {
        &self.buf[self.off..self.off + n * BLOCK]
    }

    /// Whether every byte is zero.
    pub(crate) fn is_zero(&self) -> bool {
        static ZERO: [u8; BLOCK] = [0; BLOCK];
        **self == ZERO[..]
    }
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.off..self.off + BLOCK]
    }
}

/// Buffered writes: whole blocks, and ranges written as zeros.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) blocks: BTreeMap<u64, Block>,
    /// When each block of `blocks` was last written (a counter): destage
    /// takes extents in the order of their earliest entry, laying new
    /// blocks out in the order they came.
    pub(crate) arrival: HashMap<u64, u64>,
    next: u64,
    pub(crate) zeros: Ranges,
    /// Blocks already written to new disk blocks (block → DBN): a first
    /// write without dedup, journaled as where it went.
    pub(crate) placed: BTreeMap<u64, u64>,
    /// Disk blocks of placed blocks written again within the batch: free
    /// after the next checkpoint.
    pub(crate) orphans: Vec<u64>,
    bytes: usize,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.zeros.0.is_empty() && self.placed.is_empty()
    }

    /// Block `b` now on disk block `dbn`.
    fn place(&mut self, b: u64, dbn: u64) {
        if self.blocks.remove(&b).is_some() {
            self.arrival.remove(&b);
            self.bytes -= BLOCK;
        }
        if let Some(old) = self.placed.insert(b, dbn) {
            self.orphans.push(old);
        }
    }

    fn put(&mut self, b: u64, data: Block) {
        if let Some(old) = self.placed.remove(&b) {
            self.orphans.push(old);
        }
        if self.blocks.insert(b, data).is_none() {
            self.bytes += BLOCK;
        }
        self.arrival.insert(b, self.next);
        self.next += 1;
    }

    fn zero(&mut self, s: u64, e: u64) {
        let placed: Vec<u64> = self.placed.range(s..e).map(|(&k, _)| k).collect();
        for k in placed {
            if let Some(old) = self.placed.remove(&k) {
                self.orphans.push(old);
            }
        }
        let gone: Vec<u64> = self.blocks.range(s..e).map(|(&k, _)| k).collect();
        for k in gone {
            self.blocks.remove(&k);
            self.arrival.remove(&k);
            self.bytes -= BLOCK;
        }
        self.zeros.insert(s, e);
    }
}

/// How a write goes straight to disk ([`Volume::in_place`]).
enum Direct {
    /// Over these disk blocks.
    Over(Vec<u64>),
    /// To new disk blocks.
    New,
}

enum Src {
    Mem(Block),
    Zero,
    /// On disk block (DBN), not yet in the map.
    At(u64),
    Disk,
}

struct Mem {
    buf: Batch,
    destaging: Option<Arc<Batch>>,
    journal: Journal,
    /// The journal of the batch being destaged (synced by FLUSH too).
    prev_journal: Option<Arc<File>>,
    /// Set when a destage failed: writes are refused from then on.
    failed: Option<Failure>,
    /// Set while the disk lacks room for the next batch (the bytes it
    /// may need): writes of data are refused with ENOSPC meanwhile, and
    /// the batch waits until space is freed.
    full: Option<u64>,
    stop: bool,
    /// Someone waits for the buffer to reach the disk (sync, full buffer).
    urgent: bool,
    /// Journal generation of the last batch destaged (its writes are in
    /// the map).
    applied: u64,
    /// Without dedup: the journal generation that last wrote each block
    /// written since the last checkpoint (such a block is not written in
    /// place at once: a replay of the older record would undo it).
    recent: HashMap<u64, u64>,
    /// Direct writes (placed, or in place) writing the data file outside
    /// this lock (block → the write's token, its data): reads find them
    /// here until the write is done. A later write of a block drops its
    /// entry, and a placed write then leaves that block out of its record.
    inflight: HashMap<u64, (u64, Block)>,
    next_token: u64,
    /// Segments written since the last snapshot.
    changes: Changes,
}

impl Mem {
    /// A write of blocks `s..e` replaces any direct write still in
    /// flight there.
    fn supersede(&mut self, s: u64, e: u64) {
        if !self.inflight.is_empty() {
            self.inflight.retain(|b, _| !(s..e).contains(b));
        }
    }
}

/// Free space of the data file (its own lock: writes without dedup take
/// new blocks as they come, destage takes them per batch).
pub(crate) struct Space {
    /// Free disk blocks: start → length.
    pub(crate) free: BTreeMap<u64, u64>,
    /// Disk blocks in use or freed are below this.
    pub(crate) end: u64,
    /// Where the last allocation ended (next-fit).
    pub(crate) cursor: u64,
}

pub(crate) struct Disk {
    pub(crate) refs: File,
    pub(crate) fps: File,
    pub(crate) cache: MetaCache,
    pub(crate) counters: Persistent,
    /// Blocks freed since the last checkpoint (reused only after it: a
    /// map entry on disk may still point at them).
    pub(crate) pending_free: Vec<u64>,
    /// Blocks a batch just applied freed, on their way to `pending_free`
    /// (its caller adds them together with the batch's journal, under the
    /// lock taken again): a hold may take them back meanwhile, as it does
    /// blocks in `pending_free`.
    pub(crate) freeing: std::collections::HashSet<u64>,
    /// Journal files of batches destaged since the last checkpoint, and
    /// their bytes: kept until the checkpoint makes their batches durable.
    pub(crate) uncommitted: Vec<PathBuf>,
    pub(crate) uncommitted_bytes: u64,
    /// The generation of the last batch in `uncommitted`.
    pub(crate) uncommitted_generation: u64,
    /// Blocks placed (`Volume::write_placed`) by batches not yet
    /// checkpointed, with the batch's generation: their placed records
    /// can still be replayed.
    pub(crate) placed_since: HashMap<u64, u64>,
    pub(crate) last_checkpoint: Instant,
    /// Released holds whose blocks were given back (their counts
    /// subtracted) and whose files are not deleted yet: never subtracted
    /// again ([`crate::holds`]).
    pub(crate) released_applied: std::collections::HashSet<String>,
}

impl Disk {
    /// Blocks a batch freed (`Volume::apply`), to be reused after the next
    /// checkpoint — those a hold has not taken back since.
    pub(crate) fn free_later(&mut self, freed: Vec<u64>) {
        let Disk {
            pending_free,
            freeing,
            ..
        } = self;
        pending_free.extend(freed.into_iter().filter(|b| freeing.remove(b)));
    }
}

/// Live figures of a serving volume.
#[derive(Default)]
pub struct LiveStats {
    pub read_latency: Latency,
    pub write_latency: Latency,
    /// Physical runs each read touched (§5.4), last bucket ≥ 64.
    pub fragmentation: Mutex<Histogram>,
    /// Blocks per read request (the workload's sequentiality), ≥ 256 last.
    pub read_sizes: Mutex<Histogram>,
    /// The sizes of the last [`RECENT_READS`] reads: `--threshold auto`
    /// follows the workload as it is now, not since the server started.
    pub recent_reads: Mutex<RecentReads>,
    pub threshold_used: AtomicU64,
    /// Bytes the buffered writes need on a disk that lacks them (writes
    /// of data refused meanwhile); 0 when they fit.
    pub waiting_for_space: AtomicU64,
    /// Held while `live.json` is written (rewritten in place: one writer
    /// at a time).
    pub(crate) saving: Mutex<()>,
}

/// Reads `--threshold auto` looks at.
pub const RECENT_READS: usize = 256;

/// A ring of the latest read sizes, in blocks.
#[derive(Default, Debug)]
pub struct RecentReads {
    sizes: Vec<u32>,
    next: usize,
}

impl RecentReads {
    pub fn push(&mut self, blocks: usize) {
        let b = blocks.min(u32::MAX as usize) as u32;
        if self.sizes.len() < RECENT_READS {
            self.sizes.push(b);
        } else {
            self.sizes[self.next] = b;
        }
        self.next = (self.next + 1) % RECENT_READS;
    }

    /// The median of the latest reads, if any.
    pub fn median(&self) -> Option<usize> {
        if self.sizes.is_empty() {
            return None;
        }
        let mut v = self.sizes.clone();
        let mid = v.len() / 2;
        Some(*v.select_nth_unstable(mid).1 as usize)
    }
}

pub struct Volume {
    pub(crate) dir: PathBuf,
    pub cfg: VolumeConfig,
    /// The block map (new entries pending until a checkpoint).
    pub(crate) map: Arc<BlockMap>,
    pub(crate) data: File,
    /// The ciphers of an encrypted volume.
    crypt: Option<Arc<Crypt>>,
    /// Reads ahead along the volume's streams of reads.
    pub(crate) readahead: Readahead,
    mem: Mutex<Mem>,
    /// Wakes the destage thread.
    kick: Condvar,
    /// Signalled when a batch has been destaged.
    destaged: Condvar,
    pub(crate) disk: Mutex<Disk>,
    pub(crate) space: Mutex<Space>,
    pub live: LiveStats,
    destager: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held (shared) by every read of the map and data files, taken
    /// (exclusive) by a checkpoint before it lets freed blocks be reused:
    /// a read that found an old map entry finishes before its block can
    /// hold someone else's data.
    reuse_guard: std::sync::RwLock<()>,
    /// Held (flock) while the volume is open — one process at a time —
    /// and let go by `close`.
    lock: Mutex<Option<File>>,
    closed: AtomicBool,
    /// Held by the checkpoint running (one at a time); a checkpoint the
    /// destage thread starts when one is due runs on a thread of its own,
    /// so destaging goes on while the files sync (the one before a batch
    /// that overwrites placed blocks in place runs on the destage thread).
    checkpointing: Mutex<()>,
    checkpoint_busy: AtomicBool,
    /// Frozen images being read ([`Volume::freeze`]): while any is, no
    /// freed block is reused, so every block a frozen map names keeps its
    /// data.
    pub(crate) holds: std::sync::atomic::AtomicUsize,
    /// Journals of batches destaged but not yet checkpointed: FLUSH syncs
    /// them too (their batches' data and map are not synced yet).
    unsynced: Mutex<Vec<(PathBuf, Arc<File>)>>,
    /// Blocks written in place since the counters were last saved.
    direct_blocks: AtomicU64,
    /// A write in place since the data file was last synced.
    data_dirty: AtomicBool,
    /// Held by FLUSH while it syncs the data file.
    data_sync: Mutex<()>,
    /// Held (shared) by each write in place while it writes, outside the
    /// mem lock, and (exclusive) by destage while it applies a batch: a
    /// batch that writes a block again, or frees its disk block, comes
    /// after the write in place it superseded has reached the file; a
    /// freeze and `close` take it to wait for writes in place under way.
    /// Taken before `disk`; a writer never waits for it holding `mem`.
    pub(crate) direct_io: std::sync::RwLock<()>,
    /// Checkpoints pick released holds up ([`crate::holds`]): set once the
    /// volume is marked unclean after opening, so a crash between giving
    /// a release back and deleting its file leaves a recount to the next
    /// open, never a second subtraction.
    pub(crate) picks_releases: AtomicBool,
}

impl Volume {
    /// A point-in-time image of the volume while it is served: everything
    /// acknowledged so far is destaged (not synced: the image is read
    /// through the page cache), the block map is
    /// copied (under the destage lock: the map after a whole batch, so a
    /// prefix of the writes — crash-consistent), and until the returned
    /// [`Frozen`] is dropped no freed block is reused, so the blocks the
    /// copy names keep their data while clients go on writing (new data
    /// always goes to other blocks).
    pub fn freeze(self: &Arc<Self>) -> Result<Frozen> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(VolumeError::Invalid("the volume is closing".into()));
        }
        let changes;
        {
            // Writes in place are checked under the mem lock: none starts
            // from here on. Those under way finish before the map is
            // copied (placed writes take blocks no map names).
            let mut m = lock(&self.mem);
            self.holds.fetch_add(1, Ordering::SeqCst);
            // Every write marked so far is in the buffer, destaged below.
            changes = m.changes.take();
        }
        drop(self.direct_io.write().unwrap_or_else(|e| e.into_inner()));
        let frozen = Frozen {
            vol: self.clone(),
            changes: Mutex::new(Some(changes)),
            map: self.dir.join(format!(
                "map.frozen.{}",
                FROZEN_SEQ.fetch_add(1, Ordering::SeqCst)
            )),
        };
        self.destage_current()
            .map_err(|e| VolumeError::Io("destage".into(), e))?;
        {
            let _d = lock(&self.disk);
            self.map
                .copy_to(&self.dir.join("map"), &frozen.map, clone_or_copy)
                .map_err(ioe("map copy"))?;
        }
        // Writes after the take may be in the copy: their marks too (each
        // was marked before it could reach the map).
        if let Some(c) = lock(&frozen.changes).as_mut() {
            lock(&self.mem).changes.widen(c);
        }
        Ok(frozen)
    }
}

impl Volume {
    /// A snapshot of the volume (stopped: no writes while it reads) takes
    /// what changed since the last one; it ends with
    /// [`Volume::snapshot_done`].
    pub fn take_changes(&self) -> ChangeSet {
        lock(&self.mem).changes.take()
    }

    /// The snapshot that took `cs` was committed as version `committed`,
    /// or was not (its changes come back).
    pub fn snapshot_done(&self, cs: ChangeSet, committed: Option<&str>) {
        lock(&self.mem).changes.give_back(cs, committed);
    }
}

static FROZEN_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Copies `src` to `dst`: a reflink (instant, whatever the size) where the
/// file system has them (XFS, Btrfs), else a copy of its data, its holes
/// left holes (a mostly empty volume's map is mostly holes: a 1 TiB
/// volume's is 2 GiB).
fn clone_or_copy(src: &Path, dst: &Path) -> io::Result<()> {
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
fn seek_extent(f: &File, at: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
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
fn holes_unknown(e: &io::Error) -> bool {
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

impl Volume {
    /// Waits until everything written before the call is in the map: the
    /// batch being filled now is destaged (one batch, not an empty buffer:
    /// clients may go on writing).
    fn destage_current(&self) -> io::Result<()> {
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

/// A frozen image of a served volume ([`Volume::freeze`]).
pub struct Frozen {
    vol: Arc<Volume>,
    /// The copy of the block map.
    pub map: PathBuf,
    /// What changed since the last snapshot, up to the image.
    changes: Mutex<Option<ChangeSet>>,
}

impl Frozen {
    /// The version the image's changes count from, and which segments
    /// may differ from it (none: read everything).
    pub fn changes(&self) -> (Option<String>, Option<Vec<bool>>) {
        match &*lock(&self.changes) {
            Some(c) => (c.base.clone(), c.changed()),
            None => (None, None),
        }
    }

    /// The image was committed as version `id`: the volume's changes
    /// count from it now.
    pub fn committed(&self, id: &str) {
        if let Some(c) = lock(&self.changes).take() {
            self.vol.snapshot_done(c, Some(id));
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.map);
        if let Some(c) = lock(&self.changes).take() {
            self.vol.snapshot_done(c, None);
        }
        self.vol.holds.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes of a volume image per read of its source: whole blocks, at most
/// 1 MiB ([`ImageReader`] hands them out in any sizes).
const IMAGE_READ: usize = 1 << 20;

/// A volume image as a stream: a live volume ([`Volume::image_reader`])
/// or a frozen one ([`ImageSource::frozen`]), read 1 MiB at a time.
pub struct ImageReader {
    src: ImageSource,
    buf: Vec<u8>,
    /// Bytes of `buf` handed out.
    at: usize,
}

impl io::Read for ImageReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.buf.len() {
            self.src.fill(&mut self.buf)?;
            self.at = 0;
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl ImageReader {
    /// Goes on reading at byte `offset` (a block boundary within the
    /// image): what lies between is passed over unread.
    pub fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        if !offset.is_multiple_of(BLOCK as u64) || offset > self.src.size() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a skip to byte {offset} of the image"),
            ));
        }
        self.buf.clear();
        self.at = 0;
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = &mut self.src;
        *pos = offset;
        Ok(())
    }

    /// See [`ImageSource::unwritten`].
    pub fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        self.src.unwritten(offset, len)
    }
}

/// Where an [`ImageReader`] reads from.
pub enum ImageSource {
    Live {
        vol: Arc<Volume>,
        pos: u64,
    },
    /// The map copy and the data file of a frozen image (whose blocks a
    /// served volume's new writes never overwrite while the freeze holds).
    Frozen {
        /// The connection holding the freeze (checked after every read).
        conn: Option<std::os::unix::net::UnixStream>,
        map: File,
        data: File,
        crypt: Option<Arc<Crypt>>,
        size: u64,
        pos: u64,
    },
}

impl ImageSource {
    fn reader(self) -> ImageReader {
        ImageReader {
            src: self,
            buf: Vec::new(),
            at: 0,
        }
    }

    /// Reads the frozen image of the volume in `dir` through the map copy
    /// at `map`, while `conn` (from [`crate::control::freeze_remote`])
    /// holds the freeze: each read is checked to have ended while the
    /// server still held it.
    pub fn frozen(
        dir: &Path,
        map: &Path,
        conn: Option<std::os::unix::net::UnixStream>,
        key: Option<&VolumeKey>,
    ) -> Result<ImageReader> {
        Ok(Self::open_frozen(dir, map, conn, key)?.reader())
    }

    /// [`ImageSource::frozen`], read at any offset
    /// ([`ImageSource::read_exact_at`]).
    pub fn open_frozen(
        dir: &Path,
        map: &Path,
        conn: Option<std::os::unix::net::UnixStream>,
        key: Option<&VolumeKey>,
    ) -> Result<ImageSource> {
        let cfg = Volume::config(dir)?;
        let crypt = Volume::crypt(dir, &cfg, key)?;
        Ok(ImageSource::Frozen {
            conn,
            map: File::open(map).map_err(ioe(map.display().to_string()))?,
            data: File::open(dir.join("data")).map_err(ioe("data"))?,
            crypt,
            size: cfg.size,
            pos: 0,
        })
    }
}

/// The frozen map copy of a served volume, read for the disk blocks the
/// frozen image names (linked snapshots: the blocks a version's
/// containers link, held by the server before the freeze ends).
pub struct FrozenMap {
    map: File,
    blocks: u64,
}

impl FrozenMap {
    /// The frozen map at `map` (from [`crate::control::freeze_remote`]) of
    /// the volume in `dir`.
    pub fn open(dir: &Path, map: &Path) -> Result<FrozenMap> {
        let cfg = Volume::config(dir)?;
        Ok(FrozenMap {
            map: File::open(map).map_err(ioe(map.display().to_string()))?,
            blocks: cfg.size.div_ceil(BLOCK as u64),
        })
    }

    /// The disk blocks of logical blocks `first..first + n` in the frozen
    /// image (None: never written, trimmed or zeroed) — as
    /// [`Volume::disk_blocks`] of a stopped volume.
    pub fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        if first.checked_add(n as u64).is_none_or(|e| e > self.blocks) {
            return Err(io::Error::other(format!(
                "blocks {first}..+{n} are past the volume's end ({} blocks)",
                self.blocks
            )));
        }
        Ok(read_u64s(&self.map, first, n)?
            .into_iter()
            .map(|e| e.checked_sub(1))
            .collect())
    }
}

/// Fills `out` (whole blocks from block `first`) through a frozen `map`
/// copy from `data`; the disk runs after the first are asked for before
/// the first is read (read side by side).
fn read_frozen(
    map: &File,
    data: &File,
    crypt: Option<&Crypt>,
    first: u64,
    out: &mut [u8],
) -> io::Result<()> {
    let n = out.len() / BLOCK;
    let map = read_u64s(map, first, n)?;
    out.fill(0);
    let runs = disk_runs(&map, |_| true);
    for &(i, j, dbn) in runs.iter().skip(1) {
        will_need(data, dbn, (j - i) as u64);
    }
    for (i, j, dbn) in runs {
        let dst = &mut out[i * BLOCK..j * BLOCK];
        let off = dbn
            .checked_mul(BLOCK as u64)
            .ok_or_else(|| io::Error::other("the frozen map names a block past any disk"))?;
        if read_full_at(data, dst, off)? < dst.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the volume's data is shorter than its frozen map says",
            ));
        }
        if let Some(c) = crypt {
            c.open_data(dbn, dst);
        }
    }
    Ok(())
}

/// Map entries (DBN + 1; 0: none) in runs naming neighbouring disk
/// blocks, one I/O each: (first index, end index, first DBN). Zero
/// entries, and those for which `mapped` is false, are in no run.
pub(crate) fn disk_runs(map: &[u64], mapped: impl Fn(usize) -> bool) -> Vec<(usize, usize, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < map.len() {
        if map[i] == 0 || !mapped(i) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < map.len() && mapped(j) && map[j - 1].checked_add(1) == Some(map[j]) {
            j += 1;
        }
        out.push((i, j, map[i] - 1));
        i = j;
    }
    out
}

impl ImageSource {
    /// The image's bytes at `offset` (block-aligned; `buf` whole blocks,
    /// or up to the end of the image) — a snapshot that reads only what
    /// changed. A frozen image's disk blocks are asked for all at once.
    pub fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bs = BLOCK as u64;
        let end = offset.checked_add(buf.len() as u64);
        if !offset.is_multiple_of(bs)
            || !buf.len().is_multiple_of(BLOCK)
            || end.is_none_or(|e| e > self.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a read of {} bytes at {offset} of the image", buf.len()),
            ));
        }
        match self {
            ImageSource::Live { vol, .. } => {
                vol.read_range(offset, buf, false)?;
            }
            ImageSource::Frozen {
                conn,
                map,
                data,
                crypt,
                ..
            } => {
                read_frozen(map, data, crypt.as_deref(), offset / bs, buf)?;
                if let Some(c) = conn {
                    crate::control::still_frozen(c)?;
                }
            }
        }
        Ok(())
    }

    /// Whether the image's bytes `offset..offset+len` (whole blocks) are
    /// known to be zeros without reading them: blocks never written, or
    /// last trimmed or zeroed (a snapshot hands such a stretch on as
    /// zeros, neither read nor fingerprinted).
    pub fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        let bs = BLOCK as u64;
        if !offset.is_multiple_of(bs)
            || !len.is_multiple_of(bs)
            || offset.checked_add(len).is_none_or(|e| e > self.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} of the image"),
            ));
        }
        let (first, n) = (offset / bs, (len / bs) as usize);
        match self {
            ImageSource::Live { vol, .. } => vol.unwritten(first, n),
            ImageSource::Frozen { map, .. } => {
                Ok(read_u64s(map, first, n)?.iter().all(|&e| e == 0))
            }
        }
    }

    /// The image's bytes.
    pub fn size(&self) -> u64 {
        match self {
            ImageSource::Live { vol, .. } => vol.size(),
            ImageSource::Frozen { size, .. } => *size,
        }
    }

    /// The next whole blocks (at most [`IMAGE_READ`] bytes) into `buf`;
    /// empty at the end.
    fn fill(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let size = self.size();
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = self;
        let at = *pos;
        let n = (size.saturating_sub(at) as usize).min(IMAGE_READ);
        buf.resize(n, 0);
        if n == 0 {
            return Ok(());
        }
        // The image is read from start to end: a frozen image's disk
        // blocks of the next read are asked for before this one is read.
        if let ImageSource::Frozen { map, data, .. } = self {
            let next = (at + n as u64) / BLOCK as u64;
            let left = (size.saturating_sub(at + n as u64) as usize).min(IMAGE_READ);
            if let Ok(dbns) = read_u64s(map, next, left / BLOCK) {
                prefetch(&dbns, data);
            }
        }
        self.read_exact_at(at, buf)?;
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = self;
        *pos += n as u64;
        Ok(())
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of a write while the disk has no room for the `need` bytes
/// of the batch the volume holds (ENOSPC to NBD clients).
fn no_room(need: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "{} (the volume's buffered writes need {need} bytes on its disk): \
             writes resume once space is freed",
            io::Error::from_raw_os_error(libc::ENOSPC)
        ),
    )
}

/// The largest volume: 2^32 − 1 blocks of 4 KiB (≈ 16 TiB), so that a
/// disk block's reference count (32 bits) cannot wrap.
pub const MAX_SIZE: u64 = u32::MAX as u64 * BLOCK as u64;

/// A volume size: a positive multiple of 4 KiB, at most [`MAX_SIZE`].
pub(crate) fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(BLOCK as u64) || size > MAX_SIZE {
        return Err(VolumeError::Invalid(format!(
            "a size of {size} bytes: a volume's size is a positive multiple of {BLOCK} bytes, at most {MAX_SIZE} (16 TiB)"
        )));
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
fn write_bytes(p: &Path, body: &[u8]) -> Result<()> {
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

/// The most bytes one [`Volume::extents`] tells (256 MiB: 64 Ki blocks).
pub const EXTENTS_MAX: u64 = 256 << 20;
/// Blocks of the write buffer [`Volume::extents`] looks at under one hold
/// of its lock.
const EXTENTS_LOCKED: usize = 4096;

/// The least room `live.json` is given (it is rewritten in place).
pub(crate) const LIVE_RESERVE: usize = 64 << 10;

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
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn take(f: &'a File, how: libc::c_int) -> Option<Flock<'a>> {
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

impl Volume {
    /// Creates volume files in `dir` (which must not hold a volume).
    /// Its `format` is set from whether it is encrypted.
    pub fn create(dir: &Path, mut cfg: VolumeConfig) -> Result<()> {
        cfg.format = match cfg.encryption {
            Some(_) => FORMAT_ENCRYPTED,
            None => FORMAT,
        };
        check_size(cfg.size)?;
        if dir.join("volume.json").exists() {
            return Err(VolumeError::Invalid(format!(
                "a volume already exists at {}",
                dir.display()
            )));
        }
        fs::create_dir_all(dir).map_err(ioe(dir.display().to_string()))?;
        for f in ["data", "map", "refs", "fps"] {
            open_rw(&dir.join(f))?;
        }
        write_json(
            &dir.join("state.json"),
            &State {
                clean: true,
                counters: Persistent {
                    sequence_lengths: Histogram::with_buckets(65),
                    ..Default::default()
                },
            },
        )?;
        write_json(&dir.join("volume.json"), &cfg)
    }

    pub fn config(dir: &Path) -> Result<VolumeConfig> {
        let cfg: VolumeConfig = read_json(&dir.join("volume.json"))?;
        let want = match cfg.encryption {
            Some(_) => FORMAT_ENCRYPTED,
            None => FORMAT,
        };
        if cfg.format != want || cfg.block_size as usize != BLOCK {
            return Err(VolumeError::Invalid(format!(
                "{}: volume format {} / block size {} (this build: {FORMAT}, or {FORMAT_ENCRYPTED} with encryption / {BLOCK})",
                dir.display(),
                cfg.format,
                cfg.block_size
            )));
        }
        check_size(cfg.size)
            .map_err(|e| VolumeError::Invalid(format!("{}: {e}", dir.display())))?;
        Ok(cfg)
    }

    /// Opens a volume, recovers it after an unclean stop (reference
    /// counts from the map, the journal replayed) and starts destaging.
    pub fn open(dir: &Path) -> Result<Arc<Volume>> {
        Self::open_with(dir, true, None)
    }

    /// [`Volume::open`] with the volume's key (an encrypted volume needs
    /// it; a wrong one is refused).
    pub fn open_keyed(dir: &Path, key: Option<&VolumeKey>) -> Result<Arc<Volume>> {
        Self::open_with(dir, true, key)
    }

    /// [`Volume::open`] to read it (a snapshot of a stopped volume):
    /// without filling the dedup cache from `fps` (a third of such a
    /// snapshot's time). What is written meanwhile is deduplicated only
    /// against itself.
    pub fn open_to_read(dir: &Path, key: Option<&VolumeKey>) -> Result<Arc<Volume>> {
        Self::open_with(dir, false, key)
    }

    /// The ciphers of the volume in `dir` with config `cfg` (none if it is
    /// not encrypted), `key` checked.
    pub(crate) fn crypt(
        dir: &Path,
        cfg: &VolumeConfig,
        key: Option<&VolumeKey>,
    ) -> Result<Option<Arc<Crypt>>> {
        match (&cfg.encryption, key) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(VolumeError::Invalid(format!(
                "{}: the volume is encrypted, and no key was given (it is opened through its repository, with the repository's password)",
                dir.display()
            ))),
            (Some(e), Some(k)) if !e.accepts(k) => Err(VolumeError::Invalid(format!(
                "{}: the key does not open this volume (another repository's password, or a damaged volume.json)",
                dir.display()
            ))),
            (Some(_), Some(k)) => Ok(Some(Arc::new(Crypt::new(k)))),
        }
    }

    fn open_with(dir: &Path, warm_cache: bool, key: Option<&VolumeKey>) -> Result<Arc<Volume>> {
        // Locked first: the size read next is not changed meanwhile (a
        // resize holds the lock).
        let lock_file = Self::lock(dir)?;
        let cfg = Self::config(dir)?;
        let crypt = Self::crypt(dir, &cfg, key)?;
        // Frozen maps of a server that is gone (its snapshots ended with it).
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("map.frozen.") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        let state: State = read_json(&dir.join("state.json"))?;
        let nblocks = cfg.size / BLOCK as u64;
        let map_file = open_rw(&dir.join("map"))?;
        let data = open_rw(&dir.join("data"))?;
        let refs = open_rw(&dir.join("refs"))?;
        let fps = open_rw(&dir.join("fps"))?;
        let end = data.metadata().map_err(ioe("data"))?.len() / BLOCK as u64;
        if !state.clean {
            rebuild_refs(dir, &map_file, &refs, nblocks, end)?;
        }
        let (free, cache) = scan_refs(&refs, &fps, end, &cfg, state.clean && warm_cache)?;
        let old = journal::existing(dir).map_err(ioe(dir.display().to_string()))?;
        let next_gen = old.last().map(|(g, _)| g + 1).unwrap_or(1);
        let mut counters = state.counters;
        if counters.sequence_lengths.counts.is_empty() {
            counters.sequence_lengths = Histogram::with_buckets(65);
        }
        let map = Arc::new(BlockMap::new(map_file));
        let readahead = Readahead::new(map.clone(), &data, nblocks);
        // What was written since the last snapshot: known only after a
        // clean close (a replayed journal's writes were not counted).
        let changes = match state.clean && old.is_empty() {
            true => Changes::load(dir, nblocks),
            false => {
                let _ = Changes::unknown(nblocks).save(dir);
                Changes::unknown(nblocks)
            }
        };
        let vol = Arc::new(Volume {
            dir: dir.to_path_buf(),
            map,
            data,
            crypt,
            readahead,
            mem: Mutex::new(Mem {
                buf: Batch::default(),
                destaging: None,
                journal: Journal::create(dir, next_gen).map_err(ioe("journal"))?,
                prev_journal: None,
                failed: None,
                full: None,
                stop: false,
                urgent: false,
                applied: next_gen - 1,
                recent: HashMap::new(),
                inflight: HashMap::new(),
                next_token: 0,
                changes,
            }),
            kick: Condvar::new(),
            destaged: Condvar::new(),
            disk: Mutex::new(Disk {
                refs,
                fps,
                cache,
                counters,
                pending_free: Vec::new(),
                freeing: Default::default(),
                uncommitted: Vec::new(),
                uncommitted_bytes: 0,
                uncommitted_generation: 0,
                placed_since: HashMap::new(),
                last_checkpoint: Instant::now(),
                released_applied: Default::default(),
            }),
            space: Mutex::new(Space {
                free,
                end,
                cursor: end,
            }),
            live: LiveStats {
                fragmentation: Mutex::new(Histogram::with_buckets(65)),
                read_sizes: Mutex::new(Histogram::with_buckets(257)),
                ..Default::default()
            },
            cfg,
            destager: Mutex::new(None),
            lock: Mutex::new(Some(lock_file)),
            reuse_guard: std::sync::RwLock::new(()),
            closed: AtomicBool::new(false),
            checkpointing: Mutex::new(()),
            checkpoint_busy: AtomicBool::new(false),
            holds: Default::default(),
            unsynced: Mutex::new(Vec::new()),
            direct_blocks: AtomicU64::new(0),
            data_dirty: AtomicBool::new(false),
            data_sync: Mutex::new(()),
            direct_io: std::sync::RwLock::new(()),
            picks_releases: AtomicBool::new(false),
        });
        vol.replay(&old)?;
        vol.checkpoint()?;
        vol.save_state(false)?;
        vol.picks_releases.store(true, Ordering::SeqCst);
        // Room for the live figures while there is room: on a disk that
        // then fills, they are written over it (what they were stays).
        if let Err(e) = crate::report::reserve_live(&vol.dir) {
            tracing::debug!("no room kept for live figures: {e}");
        }
        let v = vol.clone();
        *lock(&vol.destager) = Some(std::thread::spawn(move || v.destage_loop()));
        Ok(vol)
    }

    /// Replays the journals `old` left by an unclean stop: what they
    /// hold is destaged (the checkpoint after makes it durable and drops
    /// them). Placed writes whose data reached the disk keep their
    /// blocks: those are taken out of the free space before anything is
    /// replayed.
    fn replay(&self, old: &[(u64, PathBuf)]) -> Result<()> {
        let mut journals = Vec::new();
        for (_, p) in old {
            // Durable before the replay writes anything (a kill -9 left
            // them in the page cache only).
            File::open(p)
                .and_then(|f| f.sync_all())
                .map_err(ioe(p.display().to_string()))?;
            let recs = journal::read(p, BLOCK).map_err(ioe(p.display().to_string()))?;
            journals.push((p, self.keep_placed(recs)?));
        }
        for (p, recs) in journals {
            let mut batch = Batch::default();
            for r in recs {
                match r {
                    Record::Placed { block, dbn, crcs } => {
                        for i in 0..crcs.len() as u64 {
                            batch.place(block + i, dbn + i);
                        }
                    }
                    Record::Write { block, mut data } => {
                        let n = data.len() / BLOCK;
                        if let Some(c) = &self.crypt {
                            c.open_journal(block, &mut data);
                        }
                        let data = Arc::new(data);
                        for (i, b) in Block::slices(&data, 0, n).enumerate() {
                            batch.put(block + i as u64, b);
                        }
                    }
                    Record::Zero { block, count } => batch.zero(block, block + count as u64),
                }
            }
            let freed = self.apply(&batch)?;
            let mut d = lock(&self.disk);
            d.free_later(freed);
            d.uncommitted.push(p.clone());
        }
        Ok(())
    }

    /// A journal's records without the placed writes whose data is not on
    /// disk (unflushed when the machine stopped: they are lost, as a
    /// plain disk's unflushed writes are); the blocks of the rest are taken
    /// out of the free space.
    fn keep_placed(&self, recs: Vec<Record>) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(recs.len());
        let mut buf = vec![0u8; BLOCK];
        for r in recs {
            let Record::Placed { block, dbn, crcs } = r else {
                out.push(r);
                continue;
            };
            // Block by block: one may since have been written over in
            // place (a later record of the journal has it), another not
            // have reached the disk. A block dropped reads as it did when
            // it was placed — zeros — even if its map entry was written
            // back before the crash.
            for (i, crc) in (0u64..).zip(crcs) {
                let got = read_full_at(&self.data, &mut buf, (dbn + i) * BLOCK as u64)
                    .map_err(ioe("data"))?;
                if got == BLOCK && crc32c::crc32c(&buf) == crc {
                    crate::destage::reserve(&mut lock(&self.space), dbn + i, 1);
                    out.push(Record::Placed {
                        block: block + i,
                        dbn: dbn + i,
                        crcs: vec![crc],
                    });
                } else {
                    out.push(Record::Zero {
                        block: block + i,
                        count: 1,
                    });
                }
            }
        }
        Ok(out)
    }

    pub fn size(&self) -> u64 {
        self.cfg.size
    }

    /// Takes the volume's lock (`lock` in its directory, an exclusive
    /// `flock`: released by the kernel when the process ends, even by
    /// kill -9). Fails at once when another process holds it.
    pub fn lock(dir: &Path) -> Result<File> {
        use std::os::fd::AsRawFd;
        let f = open_rw(&dir.join("lock"))?;
        // SAFETY: flock on a file descriptor we own.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(VolumeError::Invalid(format!(
                    "the volume at {} is in use by another process (a running `strata volume serve`?)",
                    dir.display()
                )));
            }
            return Err(VolumeError::Io(format!("locking {}", dir.display()), e));
        }
        Ok(f)
    }

    fn save_state(&self, clean: bool) -> Result<()> {
        let d = lock(&self.disk);
        let counters = d.counters.clone();
        write_json(&self.dir.join("state.json"), &State { clean, counters })
    }

    /// The counters after a batch (the volume stays marked in use).
    pub(crate) fn write_state(&self, counters: Persistent) -> Result<()> {
        write_json(
            &self.dir.join("state.json"),
            &State {
                clean: false,
                counters,
            },
        )
    }

    /// Where block `b`'s current content is (buffer first).
    fn src(m: &Mem, b: u64) -> Src {
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
    fn unwritten(&self, first: u64, n: usize) -> io::Result<bool> {
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
    fn read_blocks(
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
    fn ask_for_runs(
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
    fn decrypt_read(&self, dbn: u64, buf: &mut [u8]) {
        if let Some(c) = &self.crypt {
            c.open_data(dbn, buf);
        }
    }

    /// Disk block `dbn` into `dst` (one block), decrypted.
    fn read_block(&self, dbn: u64, dst: &mut [u8]) -> io::Result<()> {
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
    fn journal_record(&self, first: u64, data: &[u8]) -> JournalRecord {
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

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
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

    fn read_range(&self, offset: u64, buf: &mut [u8], track: bool) -> io::Result<Vec<(u64, u64)>> {
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

    /// Waits while the buffer is full; fails when destaging has failed,
    /// and — a write of `data` (not a trim or a zero range, which free
    /// space) — while the disk has no room for the next batch.
    fn lock_for_write(&self, data: bool) -> io::Result<MutexGuard<'_, Mem>> {
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
    fn whole_blocks(&self, m: &Mem, offset: u64, data: &[u8]) -> io::Result<(u64, Vec<u8>)> {
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

    fn after_write(&self, m: MutexGuard<'_, Mem>, fua: bool) -> io::Result<()> {
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
    fn write_journaled(
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
    fn in_place(&self, m: &Mem, first: u64, n: usize) -> io::Result<Option<Direct>> {
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
    fn put_inflight(m: &mut Mem, first: u64, data: Vec<u8>) -> (u64, Arc<Vec<u8>>) {
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
    fn take_inflight(m: &mut Mem, first: u64, n: usize, token: u64) -> Vec<bool> {
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
    fn write_placed(
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
    fn write_in_place(&self, at: &[u64], data: &[u8]) -> io::Result<()> {
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
    fn direct_io_guard(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
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
    fn sync_data_file(&self) -> io::Result<()> {
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
    fn wait_destaged<'m>(
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
    fn checkpoint_in_background(self: &Arc<Self>) {
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
    fn short_of_space(&self, m: &Mem) -> Option<u64> {
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

    fn destage_loop(self: Arc<Self>) {
        let mut many_recent;
        loop {
            let (batch, old_path, generation, old_file) = {
                let mut m = lock(&self.mem);
                if m.failed.is_some() {
                    // A failed checkpoint: nothing more is destaged.
                    self.destaged.notify_all();
                    return;
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
                    if m.stop {
                        return;
                    }
                    continue;
                }
                // A batch destaged in part could not be taken back: one
                // that may not fit waits for space (writes of data are
                // refused meanwhile), and the volume goes on once there is.
                if let Some(need) = self.short_of_space(&m) {
                    let full = io::Error::from_raw_os_error(libc::ENOSPC);
                    if m.stop {
                        // (The close that asked sees it and keeps the
                        // journal: see `close_keeping_lock`.)
                        m.failed = Some(Failure::new(
                            format!(
                                "no room on the disk for the last writes ({need} bytes): {full}"
                            ),
                            Some(&full),
                        ));
                        self.destaged.notify_all();
                        drop(m);
                        self.live.waiting_for_space.store(0, Ordering::Relaxed);
                        let _ = self.save_live();
                        return;
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
                    // Told again at every look (written over its own bytes:
                    // it needs no free block), so that `volume stats` says
                    // why, and goes on counting reads, while the pause lasts.
                    self.live.waiting_for_space.store(need, Ordering::Relaxed);
                    if let Err(e) = self.save_live() {
                        tracing::debug!("live figures not saved: {e}");
                    }
                    std::thread::sleep(SPACE_RETRY);
                    continue;
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
                        return;
                    }
                };
                let old = std::mem::replace(&mut m.journal, fresh);
                let batch = Arc::new(std::mem::take(&mut m.buf));
                m.destaging = Some(batch.clone());
                m.prev_journal = old.file().try_clone().ok().map(Arc::new);
                let f = m.prev_journal.clone();
                many_recent = m.recent.len() >= RECENT_MAX;
                (batch, old.path.clone(), old.generation, f)
            };
            // A batch that will overwrite in place blocks an older placed
            // record names checkpoints what was destaged before it first:
            // a power loss could keep the new data without the batch's
            // record, and the replay would then find the placed block's
            // checksum changed and read it as zeros. After the checkpoint
            // no journal names them (and the blocks of those batches go
            // straight to disk from then on). Syncing this batch's journal
            // instead would do, but for every batch of the next seconds
            // (random writes after a sequential one: 0.5x). (Other batches
            // are not synced before destage: their data, written back
            // before their records, is redone or dropped by the replay; their
            // map entries reach the map file only with the checkpoint that
            // synced their data, see `blockmap`.)
            let must_checkpoint = (!batch.blocks.is_empty()
                && self.holds.load(Ordering::SeqCst) == 0
                && {
                    let d = lock(&self.disk);
                    batch.blocks.keys().any(|b| d.placed_since.contains_key(b))
                })
                // Pending map entries stay bounded when checkpoints fall
                // behind (a slow sync).
                || self.map.pending() >= 2 * CHECKPOINT_ENTRIES;
            let synced = match must_checkpoint {
                true => self.checkpoint(),
                false => Ok(()),
            };
            let r = synced.and_then(|_| self.apply(&batch)).map(|freed| {
                // FLUSH syncs this journal until a checkpoint has synced
                // what the batch wrote (before `prev_journal` is cleared).
                if let Some(f) = old_file {
                    lock(&self.unsynced).push((old_path.clone(), f));
                }
                let due = {
                    let mut d = lock(&self.disk);
                    // Free for reuse after the checkpoint that deletes
                    // this batch's journal.
                    d.free_later(freed);
                    d.placed_since
                        .extend(batch.placed.keys().map(|&b| (b, generation)));
                    d.uncommitted_bytes += fs::metadata(&old_path).map(|m| m.len()).unwrap_or(0);
                    d.uncommitted.push(old_path.clone());
                    d.uncommitted_generation = generation;
                    d.uncommitted_bytes >= CHECKPOINT_BYTES
                        || self.map.pending() >= CHECKPOINT_ENTRIES
                        || d.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
                        || many_recent
                };
                if due {
                    self.checkpoint_in_background();
                }
            });
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
fn neighbour_runs(v: &[u64]) -> impl Iterator<Item = (usize, usize)> + '_ {
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

/// Reference counts recounted from the map and the holds (after an
/// unclean stop); a released hold the recount did not count is given
/// back already, its file deleted.
pub(crate) fn rebuild_refs(
    dir: &Path,
    map: &File,
    refs: &File,
    nblocks: u64,
    end: u64,
) -> Result<()> {
    let mut counts = vec![0u32; end as usize];
    let held = crate::holds::count_into(dir, &mut counts, false)?;
    if let Some(why) = held.damaged.first() {
        // Which blocks it keeps is not known: none may be freed.
        return Err(VolumeError::Invalid(format!(
            "{why}: the disk blocks it keeps for the repository are not known, so the \
             volume's free space cannot be counted. Put the file back from a copy, or, once \
             no snapshot of the repository links to the volume, delete it"
        )));
    }
    if let Some(first) = held.past_first {
        tracing::warn!(
            "{} held blocks lie past the end of the data file (first: {first}): not counted",
            held.past
        );
    }
    let step = 1 << 16;
    let mut at = 0;
    while at < nblocks {
        let n = step.min(nblocks - at) as usize;
        let mut entries = read_u64s(map, at, n).map_err(ioe("map"))?;
        let mut past = false;
        for e in entries.iter_mut() {
            if *e != 0 && *e - 1 < end {
                counts[(*e - 1) as usize] += 1;
            } else if *e != 0 {
                // Data the crash lost with the file's growth (never
                // flushed: FLUSH syncs the file's size too): zeros.
                *e = 0;
                past = true;
            }
        }
        if past {
            let bytes: Vec<u8> = entries.iter().flat_map(|v| v.to_le_bytes()).collect();
            map.write_all_at(&bytes, at * 8).map_err(ioe("map"))?;
        }
        at += n as u64;
    }
    let bytes: Vec<u8> = counts.iter().flat_map(|c| c.to_le_bytes()).collect();
    refs.set_len(0).map_err(ioe("refs"))?;
    refs.write_all_at(&bytes, 0).map_err(ioe("refs"))?;
    refs.sync_all().map_err(ioe("refs"))?;
    crate::holds::drop_uncounted_releases(dir, &held.names)
}

/// Free disk blocks from the reference counts, and the metadata cache
/// warmed with the fingerprints of blocks in use (after a clean stop).
fn scan_refs(
    refs: &File,
    fps: &File,
    end: u64,
    cfg: &VolumeConfig,
    warm: bool,
) -> Result<(BTreeMap<u64, u64>, MetaCache)> {
    let mut free = BTreeMap::new();
    let mut cache = MetaCache::with_bytes(cfg.cache_bytes);
    let counts = read_counts(refs, end)?;
    let mut fp_raw = Vec::new();
    if warm && cfg.dedup {
        fp_raw = vec![0u8; (end * 16) as usize];
        let got = read_full_at(fps, &mut fp_raw, 0).map_err(ioe("fps"))?;
        fp_raw[got..].fill(0);
    }
    let mut run: Option<(u64, u64)> = None;
    for d in 0..end {
        let i = d as usize;
        if counts[i] == 0 {
            run = match run {
                Some((s, l)) if s + l == d => Some((s, l + 1)),
                Some((s, l)) => {
                    free.insert(s, l);
                    Some((d, 1))
                }
                None => Some((d, 1)),
            };
        } else if !fp_raw.is_empty() {
            let fp: Fp = fp_raw[i * 16..i * 16 + 16].try_into().unwrap_or_default();
            cache.insert(fp, d);
        }
    }
    if let Some((s, l)) = run {
        free.insert(s, l);
    }
    Ok((free, cache))
}

#[cfg(test)]
mod tests {
    use super::{io, Failure, RecentReads, VolumeError, RECENT_READS};

    /// `live.json` is written over its own bytes once it has room (the
    /// same file, no other left beside it), padded so that it parses, and
    /// made anew when it has not (a longer body, or a file cut short).
    #[test]
    fn live_figures_are_written_in_place() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("live.json");
        let body = |n: usize| serde_json::json!({ "reads": n, "pad": "x".repeat(n) });
        super::write_json_in_place(&p, &body(1), super::LIVE_RESERVE).unwrap();
        let (ino, len) = {
            let m = std::fs::metadata(&p).unwrap();
            (m.ino(), m.len())
        };
        assert!(len >= super::LIVE_RESERVE as u64);
        super::write_json_in_place(&p, &body(2), 0).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.ino(), m.len()), (ino, len), "rewritten in place");
        let v: serde_json::Value = super::read_json_shared(&p).unwrap();
        assert_eq!(v["reads"], 2);
        // Longer than the room it has: a new file, twice as long.
        let big = super::LIVE_RESERVE + 10;
        super::write_json_in_place(&p, &body(big), 0).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert!(m.ino() != ino && m.len() >= 2 * big as u64);
        let v: serde_json::Value = super::read_json(&p).unwrap();
        assert_eq!(v["reads"], big);
        // Cut short: made anew, not written past its end.
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(10)
            .unwrap();
        super::write_json_in_place(&p, &body(3), 0).unwrap();
        let v: serde_json::Value = super::read_json(&p).unwrap();
        assert_eq!(v["reads"], 3);
        // A tight file (as an older build left it) is given room.
        std::fs::write(&p, serde_json::to_vec(&body(4)).unwrap()).unwrap();
        super::write_json_in_place(&p, &body(4), super::LIVE_RESERVE).unwrap();
        assert!(std::fs::metadata(&p).unwrap().len() >= super::LIVE_RESERVE as u64);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no file left beside it");
    }

    /// A hold takes back a block a batch has just freed, before the batch's
    /// caller makes it pending (`Disk::freeing`): the window in which a
    /// served volume's hold for a snapshot, waiting on the disk lock while
    /// the batch was applied, saw the block as free and was refused.
    #[test]
    fn a_hold_takes_back_blocks_a_batch_has_just_freed() {
        use super::{lock, Batch, Block, Threshold, Volume, VolumeConfig, BLOCK};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("v");
        let cfg = VolumeConfig {
            format: 1,
            size: 1 << 20,
            block_size: 4096,
            threshold: Threshold::Fixed(4),
            cache_bytes: 1 << 20,
            dedup: true,
            encryption: None,
        };
        Volume::create(&d, cfg).unwrap();
        let v = Volume::open(&d).unwrap();
        v.write_at(0, &[1u8; BLOCK], false).unwrap();
        v.sync_all().unwrap();
        let old = v.disk_blocks(0, 1).unwrap()[0].expect("destaged");
        // Block 0 written again, applied as the destage thread does.
        let mut batch = Batch::default();
        let buf = Arc::new(vec![2u8; BLOCK]);
        batch.put(0, Block::slices(&buf, 0, 1).next().unwrap());
        let freed = v.apply(&batch).unwrap();
        assert!(freed.contains(&old), "{freed:?}");
        // (Here the destage thread lets the lock go, then takes it again.)
        v.hold("h", &[old]).unwrap();
        lock(&v.disk).free_later(freed);
        assert!(
            !lock(&v.disk).pending_free.contains(&old),
            "held, not to be reused"
        );
        assert!(lock(&v.disk).freeing.is_empty());
    }

    /// The freeze's copy of a map keeps its holes: a mostly empty map's
    /// copy takes about what its data does, and reads back the same.
    #[test]
    fn a_map_copy_keeps_its_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("map"), dir.path().join("copy"));
        // (The sparse copy itself: a reflink would take its place on XFS.)
        let copy = |a: &std::path::Path, b: &std::path::Path| {
            let (from, to) = (
                std::fs::File::open(a).unwrap(),
                std::fs::File::create(b).unwrap(),
            );
            super::copy_sparse(&from, &to).unwrap();
        };
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7u8; 4096], 0).unwrap();
        f.write_all_at(&[9u8; 100], 40 << 20).unwrap();
        drop(f);
        copy(&src, &dst);
        let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        assert!(a == b, "the copy reads the same");
        let used = std::fs::metadata(&dst).unwrap().blocks() * 512;
        // (A file system that cannot tell holes copies every byte.)
        let src_used = std::fs::metadata(&src).unwrap().blocks() * 512;
        if src_used < 1 << 20 {
            assert!(used < 1 << 20, "{used} bytes taken by the copy");
        }
        // An empty map, and a map that is data only.
        std::fs::File::create(&src)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        copy(&src, &dst);
        assert_eq!(std::fs::read(&dst).unwrap(), vec![0u8; 1 << 20]);
        std::fs::write(&src, [3u8; 12345]).unwrap();
        copy(&src, &dst);
        assert_eq!(std::fs::read(&dst).unwrap(), vec![3u8; 12345]);
        // What the freeze calls: a reflink, or the same copy.
        super::clone_or_copy(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), vec![3u8; 12345]);
    }

    /// A full disk stops a volume as one: its writes then get ENOSPC over
    /// NBD (not EIO), and the error says it was full.
    #[test]
    fn a_full_disk_failure_is_told_as_one() {
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        let f = Failure::of(&VolumeError::Io("fps".into(), full));
        assert_eq!(f.error().kind(), io::ErrorKind::StorageFull);
        assert_eq!(crate::nbd::errno(&f.error()), crate::nbd::ENOSPC);
        assert!(
            f.error().to_string().contains("No space left"),
            "{}",
            f.error()
        );
        let eio = io::Error::from_raw_os_error(libc::EIO);
        let other = Failure::new("syncing".into(), Some(&eio));
        assert_eq!(crate::nbd::errno(&other.error()), crate::nbd::EIO);
        let quota = Failure::new(
            "q".into(),
            Some(&io::Error::from_raw_os_error(libc::EDQUOT)),
        );
        assert_eq!(quota.error().kind(), io::ErrorKind::StorageFull);
        // Any other kind reaches the client as EIO, never as its own EINVAL.
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        let bad_write = Failure::new("data".into(), Some(&einval));
        assert_eq!(crate::nbd::errno(&bad_write.error()), crate::nbd::EIO);
        let invalid = Failure::of(&VolumeError::Invalid("bad".into()));
        assert_eq!(invalid.error().kind(), io::ErrorKind::Other);
    }

    #[test]
    fn auto_follows_the_latest_reads() {
        let mut r = RecentReads::default();
        assert_eq!(r.median(), None);
        for _ in 0..1000 {
            r.push(32);
        }
        assert_eq!(r.median(), Some(32));
        // Small reads take over once they are most of the window, however
        // many large ones came before.
        for _ in 0..RECENT_READS / 2 + 1 {
            r.push(1);
        }
        assert_eq!(r.median(), Some(1));
    }
}
