//! The container writer: chunks packed into regions and containers in
//! stream order (the layout is [`crate::repo::container`]'s).
//!
//! Writers fill regions and containers on the backup worker threads, and
//! compress, seal and write each region as soon as it is full (the
//! container object is streamed to storage), so memory holds one region
//! per writer and compression runs on every worker; a [`ContainerSink`]
//! thread finishes each container (fsync, rename, metadata object) while
//! the workers go on. A writer can link a container to a volume's blocks
//! instead of storing it (a [`Linker`]).

use crate::backend::{create_object, ObjectWriter};
use crate::engine::index::{ChunkLoc, ContainerTable};
use crate::error::{Result, StoreError};
use crate::repo::container::{container_tail, seal_region};
use crate::repo::delta::{MAX_BASES, MAX_PREFIX};
use crate::repo::{data_name, meta_name, now_ns, Repository};
use crate::stages::{Stage, Stages};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::crypto::{random_bytes, Kind};
use strata_core::format::{
    container_header, encode_meta, BaseRef, ChunkEntry, ContainerId, ContainerMeta, DeltaRegion,
    LinkedRegion, RegionInfo, SegmentEntry, Stamp, CONTAINER_HEADER_LEN,
};
use strata_core::Fingerprint;
use strata_core::BLOCK_SIZE as BLOCK;

/// Where a container writer can link a container instead of storing it:
/// the blocks of a volume whose image a snapshot reads (the link sink of
/// `strata-link`). A container stays linked while each of its chunks is
/// one whole block the target has; each region is checked against the
/// target's blocks as it closes; one that is not turns the container back
/// into an ordinary one (its linked regions read back and written).
pub trait Linker: Send + Sync {
    /// Whether containers opened now are to be linked.
    fn linking(&self) -> bool;
    /// The disk blocks of image blocks `first..first + n` (None: not
    /// there — a hole, or a block still in the volume's write buffer).
    fn disk_blocks(&self, first: u64, n: usize) -> std::io::Result<Vec<Option<u64>>>;
    /// Whether disk blocks `dbns` hold `plain`, byte for byte.
    fn holds(&self, dbns: &[u64], plain: &[u8]) -> bool;
    /// A region linked earlier, read back and checked against its hash (a
    /// container stored after all).
    fn read_back(&self, repo: &Repository, lr: &LinkedRegion) -> Result<Vec<u8>>;
    /// Counts a container begun linked and stored after all.
    fn note_stored_instead(&self);
    /// Puts container `meta` (its regions `regions`) into the repository
    /// as linked; returns its data object's bytes. Runs on the sink's
    /// finisher thread.
    fn commit(
        &self,
        repo: &Repository,
        meta: &ContainerMeta,
        regions: Vec<LinkedRegion>,
    ) -> Result<u64>;
}

/// A writer's window on the image's disk blocks (asked of the [`Linker`]
/// a window at a time, not a block at a time).
#[derive(Default)]
struct BlockWindow {
    first: u64,
    dbns: Vec<Option<u64>>,
}

/// Image blocks asked of the linker at once.
const WINDOW: usize = 512;

impl BlockWindow {
    /// The disk block of a chunk of `len` bytes at image offset `at`, if
    /// it is one whole block the linker's target has on disk.
    fn disk_block(&mut self, link: &dyn Linker, at: u64, len: usize) -> Option<u64> {
        if len != BLOCK || !at.is_multiple_of(BLOCK as u64) {
            return None;
        }
        let b = at / BLOCK as u64;
        if b < self.first || b >= self.first + self.dbns.len() as u64 {
            self.first = b;
            // Near the image's end the window is shorter; past it, empty.
            self.dbns = (0..=WINDOW.ilog2())
                .map(|k| WINDOW >> k)
                .find_map(|n| link.disk_blocks(b, n).ok())
                .unwrap_or_default();
        }
        self.dbns.get((b - self.first) as usize).copied().flatten()
    }
}

/// A data container whose bytes are all written: the finisher makes it
/// durable and writes its metadata object.
pub struct Finished {
    pub data: FinishedData,
    pub meta: ContainerMeta,
}

/// A finished container's data: written, or linked to a volume's blocks.
pub enum FinishedData {
    /// Its object, written (fsynced and renamed by the finisher).
    Written(Box<dyn ObjectWriter>),
    /// Its regions as the volume's blocks: the finisher puts its marker,
    /// has the volume hold them, then puts its stub.
    Linked(Arc<dyn Linker>, Vec<LinkedRegion>),
}

/// What a sink wrote.
#[derive(Default)]
pub struct SinkResult {
    /// The finished containers no index object lists yet.
    pub metas: Vec<ContainerMeta>,
    pub stored_bytes: u64,
    /// Index objects the sink wrote as containers came (see
    /// [`ContainerSink::with_index_batches`]); their bytes are in
    /// `stored_bytes`.
    pub index_objects: Vec<String>,
}

/// What a sink has put so far, kept while it runs so that a backup that
/// fails can take back what nobody else can know of.
#[derive(Default, Debug)]
pub struct Written {
    /// Containers whose objects exist (or are being put) but that no
    /// index object lists: no other command learns of them, so they can
    /// be deleted at once.
    pub unlisted: Vec<ContainerId>,
    /// Containers an index object of this sink lists, and their bytes: a
    /// backup started since may use them, so only `gc` removes them.
    pub listed: usize,
    pub listed_bytes: u64,
}

impl Written {
    /// The unlisted containers (of `bytes`) are now listed in an index
    /// object.
    pub fn listed_now(&mut self, bytes: u64) {
        self.listed += self.unlisted.len();
        self.listed_bytes += bytes;
        self.unlisted.clear();
    }
}

/// The background thread that finishes containers: fsync and rename of the
/// data object, then its metadata object (a metadata object always implies
/// its data exists). Writers compress and write their regions themselves
/// as they go, so the finisher only waits for the disk, and a bounded
/// queue keeps memory to the writers' current regions.
pub struct ContainerSink {
    tx: Option<Sender<Finished>>,
    handle: Option<std::thread::JoinHandle<Result<SinkResult>>>,
    pub stored_bytes: Arc<AtomicU64>,
    stages: Option<Arc<Stages>>,
    written: Arc<Mutex<Written>>,
}

impl ContainerSink {
    pub fn start(repo: &Repository) -> Self {
        Self::with_stages(repo, None)
    }

    /// A sink whose writers and finisher report to `stages`.
    pub fn with_stages(repo: &Repository, stages: Option<Arc<Stages>>) -> Self {
        Self::with_index_batches(repo, stages, None)
    }

    /// [`Self::with_stages`] that also lists its finished containers in an
    /// index object whenever they hold `batch` chunks (the rest is left in
    /// [`SinkResult::metas`]): a large backup does not hold every new
    /// chunk's entry until its commit, nor encode them all at once. An
    /// index object may name containers no version references yet, as
    /// after a crash before a commit; gc removes both.
    pub fn with_index_batches(
        repo: &Repository,
        stages: Option<Arc<Stages>>,
        batch: Option<usize>,
    ) -> Self {
        let (tx, rx): (Sender<Finished>, Receiver<Finished>) = bounded(2);
        let repo = repo.clone();
        let stored = Arc::new(AtomicU64::new(0));
        let stored2 = stored.clone();
        let st = stages.clone();
        let written = Arc::new(Mutex::new(Written::default()));
        let track = written.clone();
        let handle = std::thread::spawn(move || {
            let mut res = SinkResult::default();
            let mut chunks = 0usize;
            let mut bytes = 0u64;
            for f in rx {
                let t = std::time::Instant::now();
                lock(&track).unlisted.push(f.meta.id);
                let data_len = match f.data {
                    FinishedData::Written(w) => {
                        w.finish()?;
                        f.meta.data_len
                    }
                    FinishedData::Linked(sink, regions) => sink.commit(&repo, &f.meta, regions)?,
                };
                let env = repo
                    .sealer()
                    .seal(Kind::ContainerMeta, &encode_meta(&f.meta)?, true)?;
                repo.backend().put(&meta_name(&f.meta.id), &env)?;
                let n = data_len + env.len() as u64;
                if let Some(s) = &st {
                    s.add(Stage::Sync, t, n);
                }
                stored2.fetch_add(n, Ordering::Relaxed);
                res.stored_bytes += n;
                chunks += f.meta.chunks.len();
                bytes += n;
                res.metas.push(f.meta);
                if batch.is_some_and(|b| chunks >= b) {
                    let metas = std::mem::take(&mut res.metas);
                    let (name, n) =
                        crate::repo::index::put_index_object_then(&repo, metas, || {
                            lock(&track).listed_now(bytes)
                        })?;
                    stored2.fetch_add(n, Ordering::Relaxed);
                    res.stored_bytes += n;
                    res.index_objects.push(name);
                    chunks = 0;
                    bytes = 0;
                }
            }
            Ok(res)
        });
        ContainerSink {
            tx: Some(tx),
            handle: Some(handle),
            stored_bytes: stored,
            stages,
            written,
        }
    }

    /// What the sink has put so far (kept up to date while it runs, and
    /// after [`Self::finish`]).
    pub fn written(&self) -> Arc<Mutex<Written>> {
        self.written.clone()
    }

    pub fn sender(&self) -> Sender<Finished> {
        self.tx.clone().expect("sink is open until finish")
    }

    /// A container writer feeding this sink.
    pub fn writer(&self, repo: &Repository, table: Arc<ContainerTable>) -> ContainerWriter {
        let mut w = ContainerWriter::new(repo, table, self.sender());
        w.stages = self.stages.clone();
        w
    }

    /// Waits for every container to be finished.
    pub fn finish(mut self) -> Result<SinkResult> {
        drop(self.tx.take());
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            _ => Err(StoreError::Invalid(
                "container writer thread panicked".into(),
            )),
        }
    }
}

struct OpenContainer {
    id: ContainerId,
    cidx: u32,
    /// Its object; None while it is being linked.
    data: Option<Box<dyn ObjectWriter>>,
    linking: Option<Linking>,
    /// Its regions; the ones being filled hold a place (their index is
    /// handed out with their chunks' locations) until they are written.
    regions: Vec<RegionInfo>,
    cur: Vec<u8>,
    /// The index of the region `cur` fills, once it has a chunk.
    cur_idx: Option<u32>,
    /// The delta region being filled, if any.
    delta: Option<OpenDelta>,
    deltas: Vec<DeltaRegion>,
    chunks: Vec<ChunkEntry>,
    segments: Vec<SegmentEntry>,
    raw: usize,
}

/// A delta region being filled: its index, its chunks' plaintext, and
/// its bases with their plaintexts (the prefix it is compressed with).
struct OpenDelta {
    idx: u32,
    plain: Vec<u8>,
    bases: Vec<(BaseRef, Arc<Vec<u8>>)>,
    /// Each chunk's base (an index in `bases`).
    chunk_bases: Vec<u32>,
    prefix_len: usize,
}

impl OpenContainer {
    /// The index of the region `cur` fills, given a place if it has none.
    fn cur_index(&mut self) -> u32 {
        *self.cur_idx.get_or_insert_with(|| {
            self.regions.push(PLACE);
            self.regions.len() as u32 - 1
        })
    }
}

/// The place of a region not written yet.
const PLACE: RegionInfo = RegionInfo {
    offset: 0,
    stored_len: 0,
    raw_len: 0,
};

/// Packs chunks into regions and containers in stream order; each region
/// is compressed, sealed and written as soon as it is full, so a writer
/// holds one region's plaintext, not a container.
pub struct ContainerWriter {
    repo: Repository,
    table: Arc<ContainerTable>,
    sink: Sender<Finished>,
    region_size: usize,
    container_size: usize,
    stamp: Option<Stamp>,
    open: Option<OpenContainer>,
    /// Index of the first chunk of the segment being packed whole, if any.
    segment_start: Option<(u32, u32)>,
    stages: Option<Arc<Stages>>,
    /// Nanoseconds spent compressing and writing regions so far.
    io_ns: u64,
    /// The volume a snapshot reads, whose blocks its containers link to
    /// ([`Linker`]), and this writer's window on its map.
    link: Option<Arc<dyn Linker>>,
    window: BlockWindow,
}

/// A container being linked: its closed regions as the volume's blocks,
/// the blocks of the chunks of the region being filled, and the bytes it
/// would take stored uncompressed so far.
struct Linking {
    regions: Vec<LinkedRegion>,
    cur: Vec<u64>,
    /// A chunk of the region being filled that the volume does not place:
    /// the container is stored after all when the region closes.
    broken: bool,
    len: u64,
}

impl ContainerWriter {
    pub fn new(repo: &Repository, table: Arc<ContainerTable>, sink: Sender<Finished>) -> Self {
        ContainerWriter {
            repo: repo.clone(),
            table,
            sink,
            region_size: repo.config().region_size as usize,
            container_size: repo.config().container_size as usize,
            stamp: None,
            open: None,
            segment_start: None,
            stages: None,
            io_ns: 0,
            link: None,
            window: BlockWindow::default(),
        }
    }

    /// Containers opened from now on link to the blocks of the volume
    /// `link` reads, where every chunk is one the volume has on disk
    /// (see [`Self::append_at`]).
    pub fn set_link(&mut self, link: Option<Arc<dyn Linker>>) {
        self.link = link;
    }

    /// Starts packing a segment of `bytes` new bytes whole: rolls over to a
    /// new container first unless it fits (a segment larger than a
    /// container gets a container of its own), and keeps the container
    /// open until [`Self::end_segment`].
    pub fn begin_segment(&mut self, bytes: usize) -> Result<()> {
        if let Some(c) = &self.open {
            if c.raw > 0 && c.raw + bytes > self.container_size {
                self.flush()?;
            }
        }
        self.segment_start = Some((u32::MAX, 0));
        Ok(())
    }

    /// Ends a segment started with [`Self::begin_segment`]; records it in
    /// the container's metadata when all of it was appended there, and
    /// returns where: (interned container, first chunk entry).
    pub fn end_segment(&mut self, fp: Fingerprint, appended: u32) -> Option<(u32, u32)> {
        let start = self.segment_start.take();
        match (start, self.open.as_mut()) {
            (Some((cidx, first)), Some(c))
                if cidx == c.cidx && appended > 0 && c.chunks.len() as u32 == first + appended =>
            {
                c.segments.push(SegmentEntry {
                    fp,
                    first_chunk: first,
                    chunks: appended,
                });
                Some((cidx, first))
            }
            _ => None,
        }
    }

    /// Nanoseconds this writer spent compressing and writing regions.
    pub fn io_ns(&self) -> u64 {
        self.io_ns
    }

    /// Containers written from now on carry this lifecycle stamp.
    pub fn set_stamp(&mut self, stamp: Option<Stamp>) {
        self.stamp = stamp;
    }

    /// Ends the current compression region: the next chunk starts a new
    /// one. Copy-forward keeps the chunks of one source region together,
    /// so their compression is never worse than where they came from.
    pub fn end_region(&mut self) -> Result<()> {
        self.close_region()
    }

    /// Seals the current region and writes it to the container's object
    /// (or, while the container is linked, checks it against the volume's
    /// blocks).
    fn close_region(&mut self) -> Result<()> {
        let Some(c) = self.open.as_mut() else {
            return Ok(());
        };
        if c.cur.is_empty() {
            return match c.cur_idx.take() {
                Some(idx) => self.give_up(idx),
                None => Ok(()),
            };
        }
        if self.link_region()? {
            return Ok(());
        }
        let Some(c) = self.open.as_mut() else {
            return Ok(());
        };
        let idx = c.cur_index();
        let t0 = std::time::Instant::now();
        let sealed = seal_region(&self.repo, &c.cur)?;
        let raw = c.cur.len();
        self.put_region(idx, &sealed, raw, t0)?;
        if let Some(c) = self.open.as_mut() {
            c.cur.clear();
            c.cur_idx = None;
        }
        Ok(())
    }

    /// Writes `sealed` (a region of `raw` plaintext bytes, compressed
    /// and sealed since `t0`) to the open container's object, at place
    /// `idx` of its regions.
    fn put_region(
        &mut self,
        idx: u32,
        sealed: &[u8],
        raw: usize,
        t0: std::time::Instant,
    ) -> Result<()> {
        let no_object = || StoreError::Invalid("a container without its object".into());
        let c = self.open.as_mut().ok_or_else(no_object)?;
        let data = c.data.as_mut().ok_or_else(no_object)?;
        if let Some(s) = &self.stages {
            s.add(Stage::Compress, t0, raw as u64);
        }
        let t = std::time::Instant::now();
        let offset = data.written();
        data.write(sealed)?;
        if let Some(s) = &self.stages {
            s.add(Stage::Write, t, sealed.len() as u64);
        }
        self.io_ns += t0.elapsed().as_nanos() as u64;
        c.regions[idx as usize] = RegionInfo {
            offset,
            stored_len: sealed.len() as u32,
            raw_len: raw as u32,
        };
        Ok(())
    }

    /// Gives up place `idx`, a region no chunk went into after all (its
    /// location was asked for, then another worker stored the chunk): the
    /// last region's place is dropped, another's is written empty.
    fn give_up(&mut self, idx: u32) -> Result<()> {
        let Some(c) = self.open.as_mut() else {
            return Ok(());
        };
        if idx as usize + 1 == c.regions.len() {
            c.regions.pop();
            return Ok(());
        }
        let sealed = seal_region(&self.repo, &[])?;
        self.put_region(idx, &sealed, 0, std::time::Instant::now())
    }

    /// Compresses the delta region being filled against its bases, seals
    /// and writes it.
    fn close_delta(&mut self) -> Result<()> {
        let Some(c) = self.open.as_mut() else {
            return Ok(());
        };
        let Some(d) = c.delta.take() else {
            return Ok(());
        };
        if d.plain.is_empty() {
            return self.give_up(d.idx);
        }
        let t0 = std::time::Instant::now();
        let mut prefix = Vec::with_capacity(d.prefix_len);
        for (_, bytes) in &d.bases {
            prefix.extend_from_slice(bytes);
        }
        let frame = strata_core::delta::encode(&d.plain, &prefix, self.repo.config().zstd_level)?;
        let sealed = self.repo.sealer().seal(Kind::DeltaRegion, &frame, false)?;
        self.put_region(d.idx, &sealed, d.plain.len(), t0)?;
        if let Some(c) = self.open.as_mut() {
            c.deltas.push(DeltaRegion {
                region: d.idx,
                bases: d.bases.into_iter().map(|(b, _)| b).collect(),
                chunk_bases: d.chunk_bases,
            });
        }
        Ok(())
    }

    /// Closes the region being filled of a container being linked, if its
    /// chunks are blocks the volume holds: true when it was linked. Else
    /// the container is stored after all (its regions so far read back and
    /// written), and the region is left to be written.
    fn link_region(&mut self) -> Result<bool> {
        let (Some(c), Some(sink)) = (self.open.as_mut(), self.link.as_ref()) else {
            return Ok(false);
        };
        let Some(l) = c.linking.as_mut() else {
            return Ok(false);
        };
        let t = std::time::Instant::now();
        if !l.broken && l.cur.len() * BLOCK == c.cur.len() && sink.holds(&l.cur, &c.cur) {
            let stored_len = c.cur.len() + self.repo.sealer().overhead();
            let idx = *c.cur_idx.get_or_insert(c.regions.len() as u32);
            if idx as usize == c.regions.len() {
                c.regions.push(PLACE);
            }
            c.regions[idx as usize] = RegionInfo {
                offset: l.len,
                stored_len: stored_len as u32,
                raw_len: c.cur.len() as u32,
            };
            c.cur_idx = None;
            l.regions.push(LinkedRegion {
                offset: l.len,
                raw_len: c.cur.len() as u32,
                blocks: std::mem::take(&mut l.cur),
                hash: self.repo.hasher().hash(&c.cur),
            });
            l.len += stored_len as u64;
            c.cur.clear();
            if let Some(s) = &self.stages {
                s.add(Stage::Write, t, 0);
            }
            return Ok(true);
        }
        // Stored after all: what was linked so far, read back and written.
        let l = c.linking.take().expect("checked above");
        sink.note_stored_instead();
        let mut data = create_object(self.repo.backend(), &data_name(&c.id))?;
        data.write(&container_header())?;
        for (r, lr) in c.regions.iter_mut().zip(&l.regions) {
            let sealed = seal_region(&self.repo, &sink.read_back(&self.repo, lr)?)?;
            r.offset = data.written();
            r.stored_len = sealed.len() as u32;
            data.write(&sealed)?;
        }
        c.data = Some(data);
        self.io_ns += t.elapsed().as_nanos() as u64;
        Ok(false)
    }

    /// Where the next chunk of `len` bytes will go, rolling over to a new
    /// region or container first when it would not fit.
    pub fn next_loc(&mut self, len: usize) -> Result<ChunkLoc> {
        self.open_for(len)?;
        let full = self
            .open
            .as_ref()
            .is_some_and(|c| !c.cur.is_empty() && c.cur.len() + len > self.region_size);
        if full {
            self.close_region()?;
        }
        let c = self.open.as_mut().expect("opened above");
        Ok(ChunkLoc {
            container: c.cidx,
            region: c.cur_index(),
            offset: c.cur.len() as u32,
            len: len as u32,
        })
    }

    /// Makes sure a container is open with room for a chunk of `len`
    /// bytes (rolling over to a new one unless a segment is being packed
    /// whole), and notes where a segment being packed begins.
    fn open_for(&mut self, len: usize) -> Result<()> {
        let in_segment = self.segment_start.is_some();
        if let Some(c) = &self.open {
            if !in_segment && c.raw > 0 && c.raw + len > self.container_size {
                self.flush()?;
            }
        }
        if self.open.is_none() {
            let mut id = [0u8; 16];
            random_bytes(&mut id)?;
            let id = ContainerId(id);
            // Linked, if it can be: no object unless it is stored after all.
            let (data, linking) = match &self.link {
                Some(l) if l.linking() => (
                    None,
                    Some(Linking {
                        regions: Vec::new(),
                        cur: Vec::new(),
                        broken: false,
                        len: CONTAINER_HEADER_LEN as u64,
                    }),
                ),
                _ => {
                    let mut data = create_object(self.repo.backend(), &data_name(&id))?;
                    data.write(&container_header())?;
                    (Some(data), None)
                }
            };
            self.open = Some(OpenContainer {
                id,
                cidx: self.table.intern(id),
                data,
                linking,
                regions: Vec::new(),
                cur: Vec::with_capacity(self.region_size),
                cur_idx: None,
                delta: None,
                deltas: Vec::new(),
                chunks: Vec::new(),
                segments: Vec::new(),
                raw: 0,
            });
        }
        let c = self.open.as_mut().expect("opened above");
        if self.segment_start == Some((u32::MAX, 0)) {
            self.segment_start = Some((c.cidx, c.chunks.len() as u32));
        }
        Ok(())
    }

    /// Where the next chunk of `len` bytes goes if it is stored as a delta
    /// against `base` (see [`Self::append_delta`]): in the container's
    /// delta region, which is closed first when the chunk, or the base,
    /// would not fit in it. None when this writer links containers to a
    /// volume's blocks (which hold chunks whole).
    pub fn next_delta_loc(&mut self, len: usize, base: &BaseRef) -> Result<Option<ChunkLoc>> {
        if self.link.is_some() {
            return Ok(None);
        }
        self.open_for(len)?;
        let c = self.open.as_mut().expect("next_loc opens a container");
        if c.linking.is_some() {
            return Ok(None);
        }
        let full = c.delta.as_ref().is_some_and(|d| {
            let new_base = !d.bases.iter().any(|(b, _)| b == base);
            !d.plain.is_empty()
                && (d.plain.len() + len > self.region_size
                    || (new_base
                        && (d.bases.len() >= MAX_BASES
                            || d.prefix_len + base.len as usize > MAX_PREFIX)))
        });
        if full {
            self.close_delta()?;
        }
        let c = self.open.as_mut().expect("open above");
        let d = c.delta.get_or_insert_with(|| {
            c.regions.push(PLACE);
            OpenDelta {
                idx: c.regions.len() as u32 - 1,
                plain: Vec::new(),
                bases: Vec::new(),
                chunk_bases: Vec::new(),
                prefix_len: 0,
            }
        });
        Ok(Some(ChunkLoc {
            container: c.cidx,
            region: d.idx,
            offset: d.plain.len() as u32,
            len: len as u32,
        }))
    }

    /// Appends a chunk at the location [`Self::next_delta_loc`] returned,
    /// to be compressed against `base` (whose plaintext is `base_bytes`).
    pub fn append_delta(
        &mut self,
        fp: Fingerprint,
        data: &[u8],
        base: BaseRef,
        base_bytes: Arc<Vec<u8>>,
    ) {
        let c = self
            .open
            .as_mut()
            .expect("next_delta_loc opens a container");
        let d = c
            .delta
            .as_mut()
            .expect("next_delta_loc opens a delta region");
        let k = match d.bases.iter().position(|(b, _)| *b == base) {
            Some(k) => k,
            None => {
                d.prefix_len += base_bytes.len();
                d.bases.push((base, base_bytes));
                d.bases.len() - 1
            }
        };
        d.chunk_bases.push(k as u32);
        c.chunks.push(ChunkEntry {
            fp,
            region: d.idx,
            offset: d.plain.len() as u32,
            len: data.len() as u32,
        });
        d.plain.extend_from_slice(data);
        c.raw += data.len();
    }

    /// Appends a chunk at the location [`Self::next_loc`] returned.
    pub fn append(&mut self, fp: Fingerprint, data: &[u8]) {
        self.append_at(fp, data, None)
    }

    /// [`Self::append`] of a chunk at offset `at` of the image the link
    /// sink's volume holds (see [`Self::set_link`]): a container being
    /// linked stays so while its chunks are blocks the volume has on disk.
    pub fn append_at(&mut self, fp: Fingerprint, data: &[u8], at: Option<u64>) {
        let c = self.open.as_mut().expect("next_loc opens a container");
        if let Some(l) = c.linking.as_mut() {
            let dbn = match (&self.link, at) {
                (Some(sink), Some(at)) => self.window.disk_block(&**sink, at, data.len()),
                _ => None,
            };
            match dbn {
                Some(d) if !l.broken => l.cur.push(d),
                _ => l.broken = true,
            }
        }
        let region = c.cur_index();
        c.chunks.push(ChunkEntry {
            fp,
            region,
            offset: c.cur.len() as u32,
            len: data.len() as u32,
        });
        c.cur.extend_from_slice(data);
        c.raw += data.len();
    }

    /// Closes the open container and hands it to the sink's finisher.
    pub fn flush(&mut self) -> Result<()> {
        self.close_delta()?;
        self.close_region()?;
        let Some(c) = self.open.take() else {
            return Ok(());
        };
        if c.chunks.is_empty() {
            // Nothing in it: dropping the writer removes the partial object.
            return Ok(());
        }
        let mut meta = ContainerMeta {
            id: c.id,
            data_len: 0,
            created: now_ns() / 1_000_000_000,
            stamp: self.stamp.clone(),
            regions: c.regions,
            chunks: c.chunks,
            segments: c.segments,
            deltas: c.deltas,
        };
        let data = match (c.data, c.linking, &self.link) {
            (Some(mut data), _, _) => {
                let tail = container_tail(&self.repo, &mut meta, data.written())?;
                data.write(&tail)?;
                debug_assert_eq!(data.written(), meta.data_len);
                FinishedData::Written(data)
            }
            (None, Some(l), Some(sink)) => {
                // (The metadata's length as the container stored.)
                container_tail(&self.repo, &mut meta, l.len)?;
                FinishedData::Linked(sink.clone(), l.regions)
            }
            _ => return Err(StoreError::Invalid("a container without its object".into())),
        };
        self.sink.send(Finished { data, meta }).map_err(|_| {
            StoreError::Invalid("container writer stopped (see the error above)".into())
        })
    }
}

/// A mutex's guard, whether or not a thread panicked holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LocalBackend;
    use crate::repo::index::RepoIndex;
    use crate::repo::InitOptions;

    /// A sink with index batches lists its containers in an index object
    /// each time they reach the batch, and leaves the rest to its caller:
    /// every container is listed exactly once.
    #[test]
    fn index_objects_are_written_as_containers_come() {
        let t = tempfile::tempdir().unwrap();
        let opts = InitOptions {
            container_size: 64 << 10,
            region_size: 16 << 10,
            ..Default::default()
        };
        let repo = Repository::init(Arc::new(LocalBackend::new(t.path())), opts).unwrap();
        let sink = ContainerSink::with_index_batches(&repo, None, Some(40));
        let mut w = sink.writer(&repo, Arc::new(ContainerTable::default()));
        // 100 chunks of 4 KiB: 16 per container, 7 containers.
        for i in 0..100u32 {
            let mut data = vec![0u8; 4096];
            data[..4].copy_from_slice(&i.to_le_bytes());
            w.next_loc(data.len()).unwrap();
            w.append(repo.hasher().hash(&data), &data);
        }
        w.flush().unwrap();
        drop(w);
        let res = sink.finish().unwrap();
        assert_eq!(res.index_objects.len(), 2, "after 48 and 96 chunks");
        assert_eq!(res.metas.len(), 1, "the last 4 chunks' container");
        crate::repo::index::put_index_object(&repo, res.metas).unwrap();
        let mut listed = 0;
        let idx = RepoIndex::load(&repo, |m| listed += m.chunks.len()).unwrap();
        assert_eq!(listed, 100);
        assert_eq!(idx.containers.len(), 7);
    }
}
