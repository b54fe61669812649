//! The backup's workers: a pool of exactly `threads` threads (so
//! `--threads 1` is one core's work and `--threads N` spreads over N)
//! running small tasks in FIFO order.
//!
//! A small file is one task: read, chunk, fingerprint, look up, pack,
//! compress, all on one worker ([`Ctx::process_small`]). A large file or a
//! stream is a pipeline of tasks so that every worker can help with it:
//!
//! ```text
//! read+chunk block k ──spawns──► read+chunk block k+1   (serial: chunk boundaries)
//!        │ fingerprint block k (any worker)
//!        ▼
//! sequencer (in block order; cheap): segment cuts, previous-version lookups
//!        │ one task per segment (any worker)
//!        ▼
//! index lookup → pack new chunks → compress + write regions
//! ```
//!
//! Only boundary detection of one stream is serial. Reading pauses while
//! more than [`AHEAD_PER_WORKER`] bytes per worker of that file are read
//! but not yet stored, so memory stays bounded whatever the file's size.

use super::dedup::{changed_warning, open_source, Found, Outcome, TimedRead, WorkerBuffers};
use super::flow::{Feeder, Flow, FlowLimits, RecipeItem, TreeCounts, Unit};
use super::job::Block;
use super::job::{chunk_fp, Ctx, SegmentJob};
use super::parent::{Guide, ParentFile};
use super::patch::PatchSource;
use super::walk::{Job, Source};
use crate::engine::writer::{ContainerSink, ContainerWriter, SinkResult, Written};
use crate::error::{Result, StoreError};
use crate::repo::recipe::writer::RecipeWriter;
use crate::stages::Stage;
use rayon::prelude::*;
use rayon::ScopeFifo;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use strata_core::chunker::{ChunkStream, Cutter, Pick, Segmenter};
use strata_core::format::{Node, SegmentRef};

/// Files at least this large, and streams, go through the block pipeline
/// by default ([`super::BackupOptions::large_file`]).
pub const LARGE: u64 = 16 << 20;
/// Bytes read and chunked at a time from a large file.
const BLOCK: usize = 4 << 20;
/// Bytes of one large file read but not yet stored, per worker, before its
/// reading pauses.
const AHEAD_PER_WORKER: u64 = 8 << 20;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What every task shares.
struct Shared<'a> {
    ctx: &'a Ctx<'a>,
    flow: &'a Flow<'a>,
    sink: &'a ContainerSink,
    /// Idle container writers and buffers: a task takes one and gives it
    /// back, so there are at most as many as workers.
    writers: Mutex<Vec<ContainerWriter>>,
    buffers: Mutex<Vec<WorkerBuffers>>,
    error: Mutex<Option<StoreError>>,
    /// Read-ahead bound of one large file.
    ahead: u64,
}

impl Shared<'_> {
    /// Runs one task of the pool. A task that panics fails the backup
    /// (nothing is committed) instead of leaving its file's slot empty
    /// and the walk waiting for it for ever.
    fn guard(&self, task: impl FnOnce()) {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task)) {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            self.fail(StoreError::Invalid(format!(
                "a backup worker failed ({what}); this is a bug, please report it"
            )));
        }
    }

    fn fail(&self, e: StoreError) {
        self.ctx.abort.store(true, Ordering::SeqCst);
        let mut g = lock(&self.error);
        if g.is_none() {
            *g = Some(e);
        }
        drop(g);
        self.flow.wake();
    }

    /// Whether the backup must stop. A cancel by the caller is turned into
    /// the backup's error here, so every part of the pipeline winds down
    /// as after a failure (the walk is woken, nothing waits for results).
    fn aborted(&self) -> bool {
        if self.ctx.abort.load(Ordering::Relaxed) {
            return true;
        }
        if self.ctx.progress.is_cancelled() {
            self.fail(StoreError::Cancelled);
            return true;
        }
        false
    }

    fn with_writer<T>(&self, f: impl FnOnce(&mut ContainerWriter) -> T) -> T {
        let w = lock(&self.writers).pop();
        let mut w = w.unwrap_or_else(|| {
            let mut w = self.sink.writer(self.ctx.repo, self.ctx.table.clone());
            w.set_link(self.ctx.link.clone());
            w
        });
        let r = f(&mut w);
        lock(&self.writers).push(w);
        r
    }

    fn with_buffers<T>(&self, f: impl FnOnce(&mut WorkerBuffers) -> T) -> T {
        let b = lock(&self.buffers).pop();
        let mut b = b.unwrap_or_default();
        let r = f(&mut b);
        lock(&self.buffers).push(b);
        r
    }
}

/// What a run leaves for the commit.
pub(crate) struct RunResult<'r> {
    pub written: SinkResult,
    /// What of `written` a failure from here on takes back.
    pub tracked: Arc<Mutex<Written>>,
    /// The recipe, all parts but the last written.
    pub recipe: RecipeWriter<'r>,
    pub counts: TreeCounts,
    pub warnings: Vec<String>,
}

/// Nodes sent to the recipe thread at a time, at most, in flight.
const RECIPE_BATCHES: usize = 8;

/// Runs a backup's pipeline: `walk` (on the calling thread) hands entries
/// to a [`Feeder`]; files to read go to a pool of `threads` workers;
/// finished nodes go, in tree order, to a thread that writes them as
/// recipe parts into `recipe`. Returns what the containers' sink wrote
/// and the recipe writer, to be finished once the containers are durable.
pub(crate) fn run<'r>(
    ctx: &Ctx<'_>,
    threads: usize,
    limits: FlowLimits,
    recipe: RecipeWriter<'r>,
    walk: impl FnOnce(&mut Feeder<'_>) -> Result<()>,
) -> Result<RunResult<'r>> {
    let threads = threads.clamp(1, 256);
    let sink =
        ContainerSink::with_index_batches(ctx.repo, Some(ctx.stages.clone()), Some(INDEX_BATCH));
    let flow = Flow::new(threads, &ctx.abort, &ctx.progress.cancel);
    let shared = Shared {
        ctx,
        flow: &flow,
        sink: &sink,
        writers: Mutex::new(Vec::new()),
        buffers: Mutex::new(Vec::new()),
        error: Mutex::new(None),
        ahead: AHEAD_PER_WORKER * threads as u64,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("strata-worker-{i}"))
        .build()
        .map_err(|e| StoreError::Invalid(format!("cannot start the backup workers: {e}")))?;
    let (ptx, prx) = sync_channel::<PathBuf>(PREFETCH_FILES);
    let (rtx, rrx) = sync_channel::<Vec<RecipeItem>>(RECIPE_BATCHES);
    let table = ctx.table.clone();
    let (walked, counts, recipe) = std::thread::scope(|t| {
        t.spawn(move || prefetch(prx));
        let writer = t.spawn(move || -> Result<RecipeWriter<'r>> {
            let mut w = recipe;
            for batch in rrx {
                for item in batch {
                    match item {
                        RecipeItem::Node(n) => w.push(n, |i| table.try_get(i))?,
                        RecipeItem::Part(p, n) => w.push_part(&p.part, &p.containers, &n)?,
                    }
                }
            }
            Ok(w)
        });
        let (walked, counts) = pool.in_place_scope_fifo(|s| {
            let sh = &shared;
            let spawn = || s.spawn_fifo(move |s| sh.guard(|| puller(s, sh)));
            let mut feeder = Feeder {
                flow: &flow,
                spawn: &spawn,
                recipe: rtx,
                prefetch: Some(ptx),
                large: ctx.large_file,
                grouping: ctx
                    .strategy
                    .groups_small_files()
                    .then_some(ctx.chunker.avg_segment as u64),
                limits,
                next_seq: 0,
                group: Vec::new(),
                group_bytes: 0,
                counts: TreeCounts::default(),
                waited: Default::default(),
                last_file: None,
            };
            let r = walk(&mut feeder).and_then(|_| feeder.finish());
            if r.is_err() {
                ctx.abort.store(true, Ordering::SeqCst);
            }
            (r, feeder.counts)
        });
        let recipe = writer
            .join()
            .unwrap_or_else(|_| Err(StoreError::Invalid("the recipe writer panicked".into())));
        (walked, counts, recipe)
    });
    let Shared { writers, error, .. } = shared;
    let mut error = error.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut writers = writers.into_inner().unwrap_or_else(|e| e.into_inner());
    let recipe = match first_error(error.take(), recipe, walked) {
        Ok(r) => Some(r),
        Err(e) => {
            error = Some(e);
            None
        }
    };
    if error.is_none() {
        // Close the last containers; after an error, dropping the writers
        // removes their partial objects instead.
        let flushed: Result<()> =
            pool.install(|| writers.par_iter_mut().try_for_each(|w| w.flush()));
        if let Err(e) = flushed {
            error = Some(e);
        }
    }
    drop(writers);
    // The finisher's error comes first: when it fails, the workers only
    // see a closed channel. Whatever fails, the containers nobody else
    // can know of are taken back.
    let tracked = sink.written();
    let fail = |e| super::discard::take_back(ctx.repo, &tracked, e);
    let written = sink.finish().map_err(fail)?;
    if let Some(e) = error {
        return Err(fail(e));
    }
    let Some(recipe) = recipe else {
        return Err(fail(StoreError::Cancelled));
    };
    // With the containers durable, the strategy may persist what points
    // at them (its side data is derived; a crash later costs nothing).
    ctx.strategy.finish().map_err(fail)?;
    Ok(RunResult {
        tracked: tracked.clone(),
        written,
        recipe,
        counts,
        warnings: flow.take_warnings(),
    })
}

/// The recipe, or the first error that is not a consequence of another:
/// a worker's explains a cancelled walk or a stopped writer, the walk's
/// own error the workers' cancellation.
fn first_error<R>(worker: Option<StoreError>, recipe: Result<R>, walked: Result<()>) -> Result<R> {
    match (worker, recipe, walked) {
        (None, Ok(r), Ok(())) => Ok(r),
        (w, r, k) => Err([w, r.err(), k.err()]
            .into_iter()
            .flatten()
            .find(|e| !matches!(e, StoreError::Cancelled))
            .unwrap_or(StoreError::Cancelled)),
    }
}

/// New chunks a backup lists in one index object as it goes (≈ 12 MB of
/// entries; 1 GiB of 4 KiB chunks): its memory does not grow with what it
/// stores.
pub(crate) const INDEX_BATCH: usize = 256 << 10;

/// Small files the walk may hand the prefetcher ahead of the workers (the
/// queue's bounds keep the walk itself close).
const PREFETCH_FILES: usize = 256;

/// Files found in the page cache in a row after which the prefetcher
/// looks at only one file in [`CACHED_SAMPLE`] (until one is not).
const CACHED_RUN: usize = 32;
const CACHED_SAMPLE: usize = 16;

/// Asks the kernel to read the small files the walk queued into the page
/// cache while the workers are busy (`posix_fadvise(WILLNEED)`): a tree of
/// many small files on a cold cache is bound by read latency, and this
/// overlaps the reads without more worker threads than `--threads`. Large
/// files are read sequentially, which the kernel's own readahead covers.
/// A tree already in the cache is left alone after a few dozen files (one
/// in [`CACHED_SAMPLE`] still looked at): opening every file once more
/// cost a warm tree's backup a fifth of its time.
fn prefetch(paths: Receiver<PathBuf>) {
    use std::os::fd::AsRawFd;
    let (mut cached, mut n) = (0usize, 0usize);
    for p in paths {
        n += 1;
        if cached >= CACHED_RUN && !n.is_multiple_of(CACHED_SAMPLE) {
            continue;
        }
        let Ok(f) = open_source(&p) else {
            continue;
        };
        if is_cached(&f) {
            cached += 1;
            continue;
        }
        cached = 0;
        // SAFETY: advisory syscall on a descriptor we own.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
        }
    }
}

/// Whether the start of `f` is in the page cache: a one-byte read that
/// may not wait for the disk (`preadv2(RWF_NOWAIT)`; false where the
/// system cannot tell).
fn is_cached(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let iov = libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: one iovec over a live one-byte buffer, a descriptor we own.
    let r = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    r >= 0
}

/// Takes the next work unit, processes it (or starts its pipeline), and
/// queues its own continuation behind whatever it spawned.
fn puller<'s>(s: &ScopeFifo<'s>, sh: &'s Shared<'s>) {
    if sh.aborted() {
        return;
    }
    let Some(unit) = sh.flow.take_unit() else {
        return;
    };
    let ctx = sh.ctx;
    match unit {
        Unit::One(job) if is_large(&job, ctx.large_file) => Stream::start(s, sh, *job),
        Unit::One(mut job) => {
            let r = sh.with_buffers(|b| sh.with_writer(|w| ctx.process_small(w, b, &mut job)));
            match r {
                Ok(o) => sh.flow.complete(job.seq, job.node, o),
                Err(e) => sh.fail(e),
            }
        }
        Unit::Group(mut jobs) => {
            let r = sh.with_buffers(|b| sh.with_writer(|w| ctx.process_group(w, b, &mut jobs)));
            match r {
                Ok(outcomes) => {
                    let mut by_job: Vec<Option<Outcome>> = jobs.iter().map(|_| None).collect();
                    for (i, o) in outcomes {
                        if let Some(slot) = by_job.get_mut(i) {
                            *slot = Some(o);
                        }
                    }
                    for (job, o) in jobs.into_iter().zip(by_job) {
                        let o = o.unwrap_or_else(|| {
                            Outcome::Failed(format!("{}: not stored", job.node.path_str()))
                        });
                        sh.flow.complete(job.seq, job.node, o);
                    }
                }
                Err(e) => sh.fail(e),
            }
        }
    }
    s.spawn_fifo(move |s| sh.guard(|| puller(s, sh)));
}

fn is_large(job: &Job, large: u64) -> bool {
    match job.source {
        Source::Stream(_) | Source::Patch(_) => true,
        Source::Path(_) => job.node.size >= large,
    }
}

type ChunkSource<'s> = ChunkStream<TimedRead<Box<dyn Read + Send + 's>>>;

/// Bytes read and chunked at a time: [`BLOCK`], smaller when the
/// large-file threshold is (tests drive small files through here).
fn block_size(ctx: &Ctx<'_>) -> usize {
    BLOCK.min(ctx.large_file.max(1 << 16) as usize)
}

/// The serial part of reading a large file.
struct Reader<'s> {
    input: Input<'s>,
    next: u64,
}

/// What a large file is read from.
enum Input<'s> {
    /// From start to end, cut by the chunker.
    Stream(ChunkSource<'s>),
    /// Only its changed segments ([`super::patch`]).
    Patch(PatchSource),
}

impl Reader<'_> {
    /// The next block: up to [`BLOCK`] bytes read and chunked, or a
    /// patch's unchanged segment.
    fn next_block(&mut self, ctx: &Ctx<'_>) -> Block {
        let idx = self.next;
        self.next += 1;
        match &mut self.input {
            Input::Stream(stream) => stream_block(stream, ctx, idx),
            Input::Patch(p) => p.next_block(ctx, idx, block_size(ctx)),
        }
    }
}

/// Reads the next [`BLOCK`] bytes of a stream straight into a buffer of
/// the pool, after the last longest-chunk's worth of the block before:
/// chunked on any core from its own start ([`Stream::read_block`]) and
/// joined to the chunks before by the sequencer.
fn stream_block(stream: &mut ChunkSource<'_>, ctx: &Ctx<'_>, idx: u64) -> Block {
    let mut data = ctx.buffers.take();
    let own = stream.position();
    let mut b = Block::empty(idx, own);
    let keep = stream.cutter().max();
    match stream.read_raw(&mut data, block_size(ctx), keep) {
        Err(e) => {
            data.clear();
            b.end = Some(Err(format!("read error: {e}")));
        }
        Ok((kept, end)) => {
            b.offset = own - kept as u64;
            b.prefix = kept;
            b.guessed = true;
            if end {
                b.end = Some(Ok(()));
            }
        }
    }
    let n = (data.len() - b.prefix) as u64;
    ctx.progress.bytes_done.fetch_add(n, Ordering::Relaxed);
    ctx.read_bytes.fetch_add(n, Ordering::Relaxed);
    b.span = n;
    b.data = ctx.buffers.share(data);
    b
}

/// Joins block `b`'s guessed chunks to the file's chunks before it, which
/// end at `next_chunk`: `b` then holds the true chunks that start in it
/// (hashed here when not guessed: the first one or two of a block,
/// usually), and `next_chunk` moves past them.
fn join(ctx: &Ctx<'_>, next_chunk: &mut u64, b: &mut Block) -> std::result::Result<(), String> {
    let t = Instant::now();
    let end = matches!(b.end, Some(Ok(())));
    let from = next_chunk
        .checked_sub(b.offset)
        .map(|f| f as usize)
        .filter(|&f| f <= b.data.len())
        .ok_or_else(|| format!("block {} does not follow the chunks before it", b.idx))?;
    let mut joined = Vec::with_capacity(b.chunks.len() + 2);
    let cut = Cutter::new(ctx.chunker);
    let stop = cut.join(&b.data, from, end, &b.chunks, &b.sure, &mut joined);
    let hasher = ctx.repo.hasher();
    let mut chunks = Vec::with_capacity(joined.len());
    let mut hashed = Vec::with_capacity(joined.len());
    for (a, len, pick) in joined {
        chunks.push((a, len));
        let known = match pick {
            Pick::Sure(k) => b.sure_hashed.get(k as usize),
            Pick::Guess(g) => b.hashed.get(g as usize),
            Pick::Cut => None,
        };
        hashed.push(match known {
            Some(&h) => h,
            None => chunk_fp(hasher, &b.data[a..a + len as usize]),
        });
    }
    (b.chunks, b.hashed) = (chunks, hashed);
    *next_chunk = b.offset + stop as u64;
    ctx.stages.add(Stage::Chunk, t, 0);
    Ok(())
}

/// The in-order part: segment cuts and previous-version lookups.
struct Sequencer {
    next_block: u64,
    waiting: BTreeMap<u64, Block>,
    seg: Segmenter,
    cur: SegmentJob,
    next_seg: usize,
    prev: Option<ParentFile>,
    /// Where the file's chunks stand: the offset the next one starts at.
    next_chunk: u64,
}

/// One large file (or stream) going through the pipeline.
struct Stream<'s> {
    /// Its place in the tree, and its node until it is stored.
    slot: u64,
    node: Mutex<Option<Node>>,
    /// How it is named in messages.
    label: String,
    /// The file, to see whether it changed while read.
    file: Option<(File, std::path::PathBuf)>,
    /// Read from a stream (`--stdin`, an import, a Python object): a read
    /// error fails the backup, as a version without its one file must not
    /// be committed (an unreadable file of a tree is a warning instead).
    from_stream: bool,
    reader: Mutex<Reader<'s>>,
    seq: Mutex<Sequencer>,
    results: Mutex<Vec<Option<SegmentRef>>>,
    /// Segments dispatched but not stored yet.
    outstanding: AtomicUsize,
    /// Bytes read but not stored yet.
    pending: AtomicU64,
    paused: AtomicBool,
    dispatched_all: AtomicBool,
    finalized: AtomicBool,
    failure: Mutex<Option<String>>,
    size: AtomicU64,
    /// A patched image's size (its node's, whichever piece this job is).
    image_size: Option<u64>,
    /// Not a patched image's piece before its last (the file is done
    /// when this job is).
    whole: bool,
    /// The previous version's chunk boundaries: where the file did not
    /// change, blocks are checked against them instead of cut.
    guide: Option<Arc<Guide>>,
    /// Its cutter, and the length of the chunks it cuts in zeros (how a
    /// previous version's run of zero chunks splits).
    cut: (Cutter, u32),
}

impl<'s> Stream<'s> {
    fn start(s: &ScopeFifo<'s>, sh: &'s Shared<'s>, job: Job) {
        let Job {
            seq: slot,
            node,
            source,
            prev,
        } = job;
        type Opened<'s> = (Box<dyn Read + Send + 's>, Option<(File, PathBuf)>, String);
        let mut patch = None;
        let (reader, file, label): Opened<'s> = match &source {
            Source::Path(p) => match open_source(p) {
                Ok(f) => {
                    let handle = f.try_clone().ok().map(|h| (h, p.clone()));
                    (Box::new(f), handle, p.display().to_string())
                }
                Err(e) => {
                    let o = Outcome::Failed(format!("{}: {e}", p.display()));
                    return sh.flow.complete(slot, node, o);
                }
            },
            Source::Stream(m) => match lock(m).take() {
                Some(r) => (r, None, node.path_str()),
                None => return sh.fail(StoreError::Invalid("stream read twice".into())),
            },
            Source::Patch(m) => match lock(m).take() {
                Some(p) => {
                    patch = Some(p);
                    (Box::new(std::io::empty()), None, node.path_str())
                }
                None => return sh.fail(StoreError::Invalid("stream read twice".into())),
            },
        };
        let ctx = sh.ctx;
        let guide = prev.as_ref().and_then(|p| p.guide.clone());
        let cutter = Cutter::new(ctx.chunker);
        let zero_len = cutter.cut_len(&vec![0; cutter.max() + 1]) as u32;
        let image_size = patch.as_ref().map(|p| p.size);
        let whole = patch.as_ref().is_none_or(|p| p.end >= p.size);
        let input = match patch {
            Some(p) => Input::Patch(p),
            None => Input::Stream(ChunkStream::new(
                TimedRead {
                    inner: reader,
                    stages: ctx.stages.clone(),
                    ns: 0,
                },
                ctx.chunker,
            )),
        };
        let st = Arc::new(Stream {
            slot,
            node: Mutex::new(Some(node)),
            label,
            file,
            from_stream: matches!(source, Source::Stream(_) | Source::Patch(_)),
            reader: Mutex::new(Reader { input, next: 0 }),
            seq: Mutex::new(Sequencer {
                next_block: 0,
                waiting: BTreeMap::new(),
                seg: Segmenter::new(&ctx.chunker),
                cur: SegmentJob::default(),
                next_seg: 0,
                prev,
                next_chunk: 0,
            }),
            results: Mutex::new(Vec::new()),
            outstanding: AtomicUsize::new(0),
            pending: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            dispatched_all: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            failure: Mutex::new(None),
            size: AtomicU64::new(0),
            image_size,
            whole,
            guide,
            cut: (cutter, zero_len),
        });
        s.spawn_fifo(move |s| sh.guard(|| st.read_block(s, sh)));
    }

    /// Reads and chunks the next block, queues the one after, fingerprints
    /// this one and hands it to the sequencer.
    fn read_block(self: Arc<Self>, s: &ScopeFifo<'s>, sh: &'s Shared<'s>) {
        if sh.aborted() {
            return;
        }
        let mut b = lock(&self.reader).next_block(sh.ctx);
        // What its segments' stores give back (a patch's unchanged
        // segment too, though it holds no bytes).
        self.pending.fetch_add(b.span, Ordering::SeqCst);
        if b.end.is_none() {
            self.schedule_read(s, sh);
        }
        let hasher = sh.ctx.repo.hasher();
        if b.guessed {
            let (cut, zero_len) = self.cut;
            let mut unchanged = false;
            if let Some(g) = &self.guide {
                let t = Instant::now();
                let (mut sure, mut hashed) = (Vec::new(), Vec::new());
                let h = |d: &[u8]| chunk_fp(hasher, d);
                let sizes = (cut.max(), zero_len);
                unchanged = g.sure(&b.data, b.offset, sizes, h, &mut sure, &mut hashed);
                (b.sure, b.sure_hashed) = (sure, hashed);
                sh.ctx.stages.add(Stage::Hash, t, b.data.len() as u64);
            }
            // Cut (on this core, from the block's start) unless the
            // previous version's chunks cover it unchanged.
            if !unchanged {
                let t = Instant::now();
                let end = matches!(b.end, Some(Ok(())));
                cut.cut_all(&b.data, 0, end, &mut b.chunks);
                sh.ctx.stages.add(Stage::Chunk, t, b.data.len() as u64);
            }
        }
        let t = Instant::now();
        b.hashed = b
            .chunks
            .iter()
            .map(|&(a, n)| chunk_fp(hasher, &b.data[a..a + n as usize]))
            .collect();
        let hashed: u64 = b.chunks.iter().map(|c| c.1 as u64).sum();
        sh.ctx.stages.add(Stage::Hash, t, hashed);
        self.sequence(s, sh, b);
    }

    /// Queues the next read unless too much of the file waits to be
    /// stored; then the last store below the bound resumes it.
    fn schedule_read(self: &Arc<Self>, s: &ScopeFifo<'s>, sh: &'s Shared<'s>) {
        if self.pending.load(Ordering::SeqCst) < sh.ahead {
            let st = self.clone();
            s.spawn_fifo(move |s| sh.guard(|| st.read_block(s, sh)));
            return;
        }
        self.paused.store(true, Ordering::SeqCst);
        // Stores may have drained everything in between: resume now
        // unless one of them already did.
        self.resume_if_below(s, sh);
    }

    fn resume_if_below(self: &Arc<Self>, s: &ScopeFifo<'s>, sh: &'s Shared<'s>) {
        if self.pending.load(Ordering::SeqCst) < sh.ahead
            && self
                .paused
                .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            let st = self.clone();
            s.spawn_fifo(move |s| sh.guard(|| st.read_block(s, sh)));
        }
    }

    /// Takes blocks in file order: cuts segments and dispatches each.
    fn sequence(self: &Arc<Self>, s: &ScopeFifo<'s>, sh: &'s Shared<'s>, b: Block) {
        let mut q = lock(&self.seq);
        q.waiting.insert(b.idx, b);
        loop {
            let k = q.next_block;
            let Some(mut b) = q.waiting.remove(&k) else {
                return;
            };
            q.next_block += 1;
            if b.guessed {
                if let Err(m) = join(sh.ctx, &mut q.next_chunk, &mut b) {
                    b.end = Some(Err(m));
                }
            }
            let end_offset = b.end_offset();
            let t = Instant::now();
            if let Some((mut job, found)) = b.known {
                // A segment of the previous version, whole: what came
                // before it is a segment of its own.
                if !q.cur.is_empty() {
                    let cur = std::mem::take(&mut q.cur);
                    self.dispatch(s, sh, &mut q, cur);
                }
                q.seg.reset();
                job.at = b.offset;
                let found = Found {
                    locs: found,
                    near: Vec::new(),
                };
                self.queue_store(s, sh, &mut q, job, found);
            }
            for (i, &(start, len)) in b.chunks.iter().enumerate() {
                let (fp, zero) = b.hashed[i];
                if q.cur.is_empty() {
                    q.cur.at = b.offset + start as u64;
                }
                q.cur.push_shared(fp, zero, &b.data, start, len);
                if q.seg.push(&fp, len) {
                    let job = std::mem::take(&mut q.cur);
                    self.dispatch(s, sh, &mut q, job);
                }
            }
            sh.ctx.stages.add(Stage::Lookup, t, 0);
            if let Some(end) = b.end {
                match end {
                    Ok(()) => {
                        if !q.cur.is_empty() {
                            let job = std::mem::take(&mut q.cur);
                            self.dispatch(s, sh, &mut q, job);
                        }
                        let size = self.image_size.unwrap_or(end_offset);
                        self.size.store(size, Ordering::SeqCst);
                    }
                    Err(m) => *lock(&self.failure) = Some(m),
                }
                drop(q);
                self.dispatched_all.store(true, Ordering::SeqCst);
                if self.outstanding.load(Ordering::SeqCst) == 0 {
                    self.finalize(sh);
                }
                return;
            }
        }
    }

    /// Looks a segment up in the previous version (here, in order) and
    /// queues its storing.
    fn dispatch(
        self: &Arc<Self>,
        s: &ScopeFifo<'s>,
        sh: &'s Shared<'s>,
        q: &mut Sequencer,
        job: SegmentJob,
    ) {
        let found = sh.ctx.parent_lookup(q.prev.as_mut(), &job);
        self.queue_store(s, sh, q, job, found);
    }

    /// Queues the storing of a segment whose chunks were looked up.
    fn queue_store(
        self: &Arc<Self>,
        s: &ScopeFifo<'s>,
        sh: &'s Shared<'s>,
        q: &mut Sequencer,
        job: SegmentJob,
        found: Found,
    ) {
        let idx = q.next_seg;
        q.next_seg += 1;
        lock(&self.results).push(None);
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        let st = self.clone();
        s.spawn_fifo(move |s| sh.guard(|| st.store(s, sh, idx, job, found)));
    }

    fn store(
        self: Arc<Self>,
        s: &ScopeFifo<'s>,
        sh: &'s Shared<'s>,
        idx: usize,
        job: SegmentJob,
        found: Found,
    ) {
        if !sh.aborted() {
            match sh.with_writer(|w| sh.ctx.store_segment(w, &job, found)) {
                Ok(seg) => lock(&self.results)[idx] = Some(seg),
                Err(e) => sh.fail(e),
            }
        }
        let len = job.len();
        drop(job);
        self.pending.fetch_sub(len, Ordering::SeqCst);
        self.resume_if_below(s, sh);
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1
            && self.dispatched_all.load(Ordering::SeqCst)
        {
            self.finalize(sh);
        }
    }

    /// Delivers the file's outcome, once.
    fn finalize(&self, sh: &Shared<'_>) {
        if self.finalized.swap(true, Ordering::SeqCst) || sh.aborted() {
            return;
        }
        let Some(node) = lock(&self.node).take() else {
            return;
        };
        let outcome = match lock(&self.failure).take() {
            Some(m) if self.from_stream => {
                return sh.fail(StoreError::Invalid(format!(
                    "{}: reading the stream failed: {m}; nothing committed",
                    self.label
                )))
            }
            Some(m) => Outcome::Failed(format!("{}: {m}", self.label)),
            None => {
                let segments: Option<Vec<SegmentRef>> = lock(&self.results).drain(..).collect();
                let Some(segments) = segments else {
                    return sh.fail(StoreError::Invalid(format!(
                        "{}: a segment was not stored",
                        self.label
                    )));
                };
                let size = self.size.load(Ordering::SeqCst);
                let warning = self
                    .file
                    .as_ref()
                    .and_then(|(f, p)| changed_warning(f, p, size, &node));
                if self.whole {
                    sh.ctx.progress.files_done.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Done {
                    segments,
                    size,
                    warning,
                }
            }
        };
        sh.flow.complete(self.slot, node, outcome);
    }
}
