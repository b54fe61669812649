//! What a backup's stages hand one another: the per-backup context its
//! workers share, a segment ready to be looked up and stored, a block of
//! a large file, an unchanged segment of a patched image — and the units
//! of an image patch.

use super::blockbuf::{BlockData, BufferPool};
use crate::engine::index::{ChunkLoc, ContainerTable, IndexStrategy};
use crate::progress::Progress;
use crate::repo::Repository;
use crate::stages::Stages;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_core::fingerprint::is_zero;
use strata_core::Fingerprint;

/// The unit of change: the fixed chunker's segment (2 MiB).
pub const PATCH_SEGMENT: u64 = 2 << 20;
/// The fixed chunker's chunk: a block (4 KiB).
pub(crate) const PATCH_CHUNK: u64 = strata_core::BLOCK_SIZE as u64;

/// The bytes of one piece of a patched image: the recipe writer's piece
/// ([`crate::repo::recipe::PIECE_CHUNKS`] chunks of 4 KiB, 64 MiB). An image is
/// backed up a piece at a time, each piece a job of its own (its node a
/// piece of the image's), so that neither its previous version nor its
/// new one is ever held whole.
pub const PATCH_PIECE: u64 = crate::repo::recipe::PIECE_CHUNKS as u64 * PATCH_CHUNK;

/// Per-backup state shared by the workers.
pub(crate) struct Ctx<'a> {
    pub repo: &'a Repository,
    pub strategy: &'a dyn IndexStrategy,
    pub table: Arc<ContainerTable>,
    pub chunker: ChunkerParams,
    pub progress: &'a Progress,
    pub stages: Arc<Stages>,
    pub abort: AtomicBool,
    pub new_chunks: AtomicU64,
    pub new_raw: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Bytes found in the previous version of their file.
    pub parent_bytes: AtomicU64,
    /// Bytes found in a similar stored segment.
    pub similar_bytes: AtomicU64,
    /// Files at least this large (and streams) go through the block
    /// pipeline that spreads one file over every worker.
    pub large_file: u64,
    /// The new chunks stored, 1 in 64 by fingerprint (with their lengths):
    /// met with the previous version's sample after the walk, it tells how
    /// much of that version this one stored again.
    pub stored_sample: Mutex<HashMap<Fingerprint, u32>>,
    /// The volume whose blocks the new containers link to (a volume's
    /// snapshot: the link sink, a [`crate::engine::writer::Linker`]).
    pub link: Option<Arc<dyn crate::engine::writer::Linker>>,
    /// Buffers large files' blocks are read into, used again.
    pub buffers: BufferPool,
    /// Picks the bases of new chunks stored as deltas (a repository with
    /// deltas on, not linking to a volume).
    pub delta: Option<super::delta::DeltaPicker>,
}

/// What a [`Ctx`] works with; its counters start at zero.
pub(crate) struct CtxParts<'a> {
    pub repo: &'a Repository,
    pub strategy: &'a dyn IndexStrategy,
    pub table: Arc<ContainerTable>,
    pub chunker: ChunkerParams,
    pub progress: &'a Progress,
    pub stages: Arc<Stages>,
    pub large_file: u64,
    pub link: Option<Arc<dyn crate::engine::writer::Linker>>,
}

impl<'a> Ctx<'a> {
    /// Whether the backup must stop: a worker failed, or the caller
    /// cancelled it.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed) || self.progress.is_cancelled()
    }

    pub fn new(p: CtxParts<'a>) -> Self {
        Ctx {
            repo: p.repo,
            strategy: p.strategy,
            chunker: p.chunker,
            progress: p.progress,
            stages: p.stages,
            abort: AtomicBool::new(false),
            new_chunks: AtomicU64::new(0),
            new_raw: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            parent_bytes: AtomicU64::new(0),
            similar_bytes: AtomicU64::new(0),
            large_file: p.large_file,
            stored_sample: Mutex::new(HashMap::new()),
            delta: (p.repo.config().delta && p.link.is_none())
                .then(|| super::delta::DeltaPicker::new(p.repo, p.table.clone())),
            table: p.table,
            link: p.link,
            buffers: BufferPool::default(),
        }
    }
}

/// A chunk's fingerprint, and whether it is all zeros (never stored, so
/// not hashed).
pub(crate) fn chunk_fp(hasher: &strata_core::Hasher, chunk: &[u8]) -> (Fingerprint, bool) {
    if is_zero(chunk) {
        (Fingerprint::ZERO, true)
    } else {
        (hasher.hash(chunk), false)
    }
}

/// One chunk of a segment being formed: its bytes are `len` bytes at
/// `start` of the segment's own data (`block` = [`OWN`]) or of one of the
/// blocks it shares (all-zero chunks have none).
#[derive(Clone, Copy)]
pub(crate) struct PendingChunk {
    pub fp: Fingerprint,
    pub block: u32,
    pub start: usize,
    pub len: u32,
    pub zero: bool,
}

/// [`PendingChunk::block`] of bytes held in the segment's own data.
pub(crate) const OWN: u32 = u32::MAX;
/// [`PendingChunk::block`] of a chunk without bytes: the previous
/// version's, whose location is known (a patch's unchanged segment).
pub(crate) const KNOWN: u32 = u32::MAX - 1;

/// A segment ready to be looked up and stored: its chunks, their bytes
/// (copied into `data`, or shared with the blocks a large file was read
/// in), and its offset in the file.
#[derive(Default)]
pub(crate) struct SegmentJob {
    pub chunks: Vec<PendingChunk>,
    pub data: Vec<u8>,
    pub blocks: Vec<BlockData>,
    pub at: u64,
}

impl SegmentJob {
    /// Adds a chunk, copying its bytes.
    pub fn push(&mut self, fp: Fingerprint, zero: bool, chunk: &[u8]) {
        self.chunks.push(PendingChunk {
            fp,
            block: OWN,
            start: self.data.len(),
            len: chunk.len() as u32,
            zero,
        });
        if !zero {
            self.data.extend_from_slice(chunk);
        }
    }

    /// Adds a chunk of the previous version without its bytes: only for a
    /// chunk whose location goes with it (or a zero one).
    pub fn push_known(&mut self, fp: Fingerprint, zero: bool, len: u32) {
        self.chunks.push(PendingChunk {
            fp,
            block: KNOWN,
            start: 0,
            len,
            zero,
        });
    }

    /// Adds a chunk whose bytes stay in `block` at `start`.
    pub fn push_shared(
        &mut self,
        fp: Fingerprint,
        zero: bool,
        block: &BlockData,
        start: usize,
        len: u32,
    ) {
        if !self.blocks.last().is_some_and(|b| Arc::ptr_eq(b, block)) {
            self.blocks.push(block.clone());
        }
        self.chunks.push(PendingChunk {
            fp,
            block: self.blocks.len() as u32 - 1,
            start,
            len,
            zero,
        });
    }

    /// The bytes of a (non-zero) chunk.
    pub(crate) fn bytes(&self, c: &PendingChunk) -> &[u8] {
        let buf = match c.block {
            OWN => &self.data,
            b => &self.blocks[b as usize][..],
        };
        &buf[c.start..c.start + c.len as usize]
    }

    /// Plaintext bytes, zero chunks included.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The fingerprints of its non-zero chunks.
    pub(crate) fn fps(&self) -> Vec<Fingerprint> {
        self.chunks
            .iter()
            .filter(|c| !c.zero)
            .map(|c| c.fp)
            .collect()
    }
}

/// An unchanged segment: its chunks (fingerprints, no bytes) and where
/// each non-zero one is.
pub(crate) type CleanSegment = (SegmentJob, Vec<Option<ChunkLoc>>);

/// A run of chunks read from a large file, in file order. Its segments
/// share its bytes until they are stored.
pub(crate) struct Block {
    pub idx: u64,
    /// File offset of its first chunk.
    pub offset: u64,
    /// Bytes of the file it covers.
    pub span: u64,
    /// Bytes at the start of `data` that the block before covers (read
    /// again, for the chunk that crosses from it: see [`Self::guessed`]);
    /// `offset` is where `data` begins.
    pub prefix: usize,
    pub data: BlockData,
    /// (start in `data`, length) of each chunk.
    pub chunks: Vec<(usize, u32)>,
    /// `chunks` were cut from the start of `data` on any core, a guess:
    /// the sequencer joins them to the chunks before
    /// ([`strata_core::chunker::Cutter::join`]).
    pub guessed: bool,
    /// Chunks of the previous version found unchanged in `data`, sure to
    /// be cut there ([`super::parent::Guide::sure`]), and their hashes.
    pub sure: Vec<(usize, u32)>,
    pub sure_hashed: Vec<(Fingerprint, bool)>,
    pub hashed: Vec<(Fingerprint, bool)>,
    /// A whole segment taken from the previous version unread (a patch).
    pub known: Option<CleanSegment>,
    /// Set on the last block: end of file, or the read error that ended it.
    pub end: Option<std::result::Result<(), String>>,
}

impl Block {
    /// The file offset after its own bytes.
    pub(crate) fn end_offset(&self) -> u64 {
        self.offset + self.prefix as u64 + self.span
    }

    pub(crate) fn empty(idx: u64, offset: u64) -> Block {
        Block {
            idx,
            offset,
            span: 0,
            prefix: 0,
            data: Arc::default(),
            chunks: Vec::new(),
            guessed: false,
            sure: Vec::new(),
            sure_hashed: Vec::new(),
            hashed: Vec::new(),
            known: None,
            end: None,
        }
    }
}
