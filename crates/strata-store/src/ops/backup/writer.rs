//! [`DedupWriter`]: the backup's dedup stage as a public type, for callers
//! that have byte streams rather than files — a block-volume server
//! destaging extents, the Python bindings backing up a stream, a fleet
//! worker storing a VM's dirty segments.

use super::dedup::{Ctx, CtxParts, WorkerBuffers};
use crate::engine::index::{build_strategy, ContainerTable, IndexStrategy};
use crate::engine::writer::{ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::lock::{self, LockGuard};
use crate::repo::Repository;
use crate::stages::Stages;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_core::format::{ContainerId, SegmentRef};

/// Deduplicates byte streams into a repository's containers the way a
/// backup does — content-defined chunks and segments, the repository's
/// index strategy, new chunks compressed, sealed and packed into
/// containers — and makes them durable and indexed at
/// [`DedupWriter::finish`].
///
/// It holds a shared repository lock from [`DedupWriter::open`] to
/// `finish`, so no gc runs meanwhile. What it stores is referenced by
/// nothing until the caller commits an object that points at it (a
/// snapshot's recipe, a volume's block map): a gc after `finish` and before
/// that commit would sweep it.
pub struct DedupWriter {
    repo: Repository,
    strategy: Box<dyn IndexStrategy>,
    table: Arc<ContainerTable>,
    chunker: ChunkerParams,
    stages: Arc<Stages>,
    progress: Arc<Progress>,
    sink: ContainerSink,
    /// The container writer and reusable buffers; streams are deduplicated
    /// one at a time.
    state: Mutex<(ContainerWriter, WorkerBuffers)>,
    new_chunks: AtomicU64,
    new_raw: AtomicU64,
    _lock: LockGuard,
}

/// One stream as stored: its segments, whose direct chunk references index
/// `containers` (as a recipe's do), and its length.
#[derive(Clone, Debug)]
pub struct StoredStream {
    pub containers: Vec<ContainerId>,
    pub segments: Vec<SegmentRef>,
    pub size: u64,
}

/// What [`DedupWriter::finish`] made durable.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Committed {
    /// The index object listing the new containers (none when nothing new
    /// was stored).
    pub index_object: Option<String>,
    pub containers: u64,
    /// Bytes written to the repository (containers, metadata, index).
    pub stored_bytes: u64,
    pub new_chunks: u64,
    pub new_raw_bytes: u64,
}

impl DedupWriter {
    /// Loads the repository's index strategy and starts a container sink.
    /// `chunker` overrides the repository's (e.g. fixed 4 KiB chunks for
    /// block devices).
    pub fn open(repo: &Repository, chunker: Option<ChunkerParams>) -> Result<Self> {
        let lock = lock::acquire(repo, false, "dedup writer")?;
        let chunker = chunker.unwrap_or(repo.config().chunker);
        chunker.validate()?;
        let table = Arc::new(ContainerTable::default());
        let (strategy, mut idx) = build_strategy(repo, &table)?;
        crate::repo::index::upgrade_summaries(repo, &mut idx);
        let stages = Arc::new(Stages::new(1));
        let sink = ContainerSink::with_stages(repo, Some(stages.clone()));
        let writer = sink.writer(repo, table.clone());
        Ok(DedupWriter {
            repo: repo.clone(),
            strategy,
            table,
            chunker,
            stages,
            progress: Arc::new(Progress::default()),
            sink,
            state: Mutex::new((writer, WorkerBuffers::default())),
            new_chunks: AtomicU64::new(0),
            new_raw: AtomicU64::new(0),
            _lock: lock,
        })
    }

    /// Deduplicates and stores one stream, read to its end.
    pub fn write(&self, reader: &mut dyn Read) -> Result<StoredStream> {
        let ctx = Ctx::new(CtxParts {
            repo: &self.repo,
            strategy: self.strategy.as_ref(),
            table: self.table.clone(),
            chunker: self.chunker,
            progress: &self.progress,
            stages: self.stages.clone(),
            // One stream at a time, read on this thread.
            large_file: u64::MAX,
            link: None,
        });
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (writer, bufs) = &mut *g;
        let r = ctx.process_stream(writer, bufs, reader, None)?;
        self.new_chunks
            .fetch_add(ctx.new_chunks.load(Ordering::Relaxed), Ordering::Relaxed);
        self.new_raw
            .fetch_add(ctx.new_raw.load(Ordering::Relaxed), Ordering::Relaxed);
        let (mut segments, size) =
            r.map_err(|m| StoreError::Invalid(format!("reading the stream: {m}")))?;
        let containers = super::commit::localise(segments.iter_mut(), &self.table);
        Ok(StoredStream {
            containers,
            segments,
            size,
        })
    }

    /// Closes the last container, waits until every container is durable,
    /// and lists them in a new index object.
    pub fn finish(self) -> Result<Committed> {
        let DedupWriter {
            repo,
            strategy,
            sink,
            state,
            new_chunks,
            new_raw,
            ..
        } = self;
        let (mut writer, _) = state.into_inner().unwrap_or_else(|e| e.into_inner());
        let flushed = writer.flush();
        drop(writer);
        let written = sink.finish()?;
        flushed?;
        strategy.finish()?;
        let mut out = Committed {
            containers: written.metas.len() as u64,
            stored_bytes: written.stored_bytes,
            new_chunks: new_chunks.into_inner(),
            new_raw_bytes: new_raw.into_inner(),
            ..Default::default()
        };
        if !written.metas.is_empty() {
            let (name, n) = crate::repo::index::put_index_object(&repo, written.metas)?;
            out.index_object = Some(name);
            out.stored_bytes += n;
        }
        Ok(out)
    }
}
