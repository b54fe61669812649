//! A volume in memory: the write buffer and its batches, the disk's free
//! space and placed blocks, live figures, and [`Volume`] itself (its
//! methods, by concern, in `volume/`).

use crate::blockmap::BlockMap;
use crate::changes::Changes;
use crate::config::*;
use crate::crypt::Crypt;
use crate::error::Failure;
use crate::idedup::MetaCache;
use crate::journal::{self, Journal};
use crate::readahead::Readahead;
use crate::stats::{Histogram, Latency, Persistent};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// A journal record's header, and the bytes to append when they are not
/// the data's own (encrypted).
pub(crate) type JournalRecord = ([u8; journal::HEADER], Option<Vec<u8>>);

/// Contiguous ranges [start, end) of blocks.
#[derive(Default, Clone, Debug)]
pub(crate) struct Ranges(pub(crate) BTreeMap<u64, u64>);

impl Ranges {
    pub(crate) fn contains(&self, b: u64) -> bool {
        self.0.range(..=b).next_back().is_some_and(|(_, &e)| b < e)
    }

    pub(crate) fn insert(&mut self, mut s: u64, mut e: u64) {
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
    pub(crate) buf: Arc<Vec<u8>>,
    pub(crate) off: usize,
}

impl Block {
    /// Blocks of `buf` from byte `start` on (`n` of them).
    pub(crate) fn slices(
        buf: &Arc<Vec<u8>>,
        start: usize,
        n: usize,
    ) -> impl Iterator<Item = Block> + '_ {
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
    pub(crate) next: u64,
    pub(crate) zeros: Ranges,
    /// Blocks already written to new disk blocks (block → DBN): a first
    /// write without dedup, journaled as where it went.
    pub(crate) placed: BTreeMap<u64, u64>,
    /// Disk blocks of placed blocks written again within the batch: free
    /// after the next checkpoint.
    pub(crate) orphans: Vec<u64>,
    pub(crate) bytes: usize,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.zeros.0.is_empty() && self.placed.is_empty()
    }

    /// Block `b` now on disk block `dbn`.
    pub(crate) fn place(&mut self, b: u64, dbn: u64) {
        if self.blocks.remove(&b).is_some() {
            self.arrival.remove(&b);
            self.bytes -= BLOCK;
        }
        if let Some(old) = self.placed.insert(b, dbn) {
            self.orphans.push(old);
        }
    }

    pub(crate) fn put(&mut self, b: u64, data: Block) {
        if let Some(old) = self.placed.remove(&b) {
            self.orphans.push(old);
        }
        if self.blocks.insert(b, data).is_none() {
            self.bytes += BLOCK;
        }
        self.arrival.insert(b, self.next);
        self.next += 1;
    }

    pub(crate) fn zero(&mut self, s: u64, e: u64) {
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
pub(crate) enum Direct {
    /// Over these disk blocks.
    Over(Vec<u64>),
    /// To new disk blocks.
    New,
}

pub(crate) enum Src {
    Mem(Block),
    Zero,
    /// On disk block (DBN), not yet in the map.
    At(u64),
    Disk,
}

pub(crate) struct Mem {
    pub(crate) buf: Batch,
    pub(crate) destaging: Option<Arc<Batch>>,
    pub(crate) journal: Journal,
    /// The journal of the batch being destaged (synced by FLUSH too).
    pub(crate) prev_journal: Option<Arc<File>>,
    /// Set when a destage failed: writes are refused from then on.
    pub(crate) failed: Option<Failure>,
    /// Set while the disk lacks room for the next batch (the bytes it
    /// may need): writes of data are refused with ENOSPC meanwhile, and
    /// the batch waits until space is freed.
    pub(crate) full: Option<u64>,
    pub(crate) stop: bool,
    /// Someone waits for the buffer to reach the disk (sync, full buffer).
    pub(crate) urgent: bool,
    /// Journal generation of the last batch destaged (its writes are in
    /// the map).
    pub(crate) applied: u64,
    /// Without dedup: the journal generation that last wrote each block
    /// written since the last checkpoint (such a block is not written in
    /// place at once: a replay of the older record would undo it).
    pub(crate) recent: HashMap<u64, u64>,
    /// Direct writes (placed, or in place) writing the data file outside
    /// this lock (block → the write's token, its data): reads find them
    /// here until the write is done. A later write of a block drops its
    /// entry, and a placed write then leaves that block out of its record.
    pub(crate) inflight: HashMap<u64, (u64, Block)>,
    pub(crate) next_token: u64,
    /// Segments written since the last snapshot.
    pub(crate) changes: Changes,
}

impl Mem {
    /// A write of blocks `s..e` replaces any direct write still in
    /// flight there.
    pub(crate) fn supersede(&mut self, s: u64, e: u64) {
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
    pub(crate) sizes: Vec<u32>,
    pub(crate) next: usize,
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
    pub(crate) crypt: Option<Arc<Crypt>>,
    /// Reads ahead along the volume's streams of reads.
    pub(crate) readahead: Readahead,
    pub(crate) mem: Mutex<Mem>,
    /// Wakes the destage thread.
    pub(crate) kick: Condvar,
    /// Signalled when a batch has been destaged.
    pub(crate) destaged: Condvar,
    pub(crate) disk: Mutex<Disk>,
    pub(crate) space: Mutex<Space>,
    pub live: LiveStats,
    pub(crate) destager: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held (shared) by every read of the map and data files, taken
    /// (exclusive) by a checkpoint before it lets freed blocks be reused:
    /// a read that found an old map entry finishes before its block can
    /// hold someone else's data.
    pub(crate) reuse_guard: std::sync::RwLock<()>,
    /// Held (flock) while the volume is open — one process at a time —
    /// and let go by `close`.
    pub(crate) lock: Mutex<Option<File>>,
    pub(crate) closed: AtomicBool,
    /// Held by the checkpoint running (one at a time); a checkpoint the
    /// destage thread starts when one is due runs on a thread of its own,
    /// so destaging goes on while the files sync (the one before a batch
    /// that overwrites placed blocks in place runs on the destage thread).
    pub(crate) checkpointing: Mutex<()>,
    pub(crate) checkpoint_busy: AtomicBool,
    /// Frozen images being read ([`Volume::freeze`]): while any is, no
    /// freed block is reused, so every block a frozen map names keeps its
    /// data.
    pub(crate) holds: std::sync::atomic::AtomicUsize,
    /// Journals of batches destaged but not yet checkpointed: FLUSH syncs
    /// them too (their batches' data and map are not synced yet).
    pub(crate) unsynced: Mutex<Vec<(PathBuf, Arc<File>)>>,
    /// Blocks written in place since the counters were last saved.
    pub(crate) direct_blocks: AtomicU64,
    /// A write in place since the data file was last synced.
    pub(crate) data_dirty: AtomicBool,
    /// Held by FLUSH while it syncs the data file.
    pub(crate) data_sync: Mutex<()>,
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
