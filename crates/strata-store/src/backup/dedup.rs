//! The dedup stage of a backup: read → chunk → fingerprint → index lookup
//! → pack new chunks into containers, one work unit (a file, or a group of
//! small files) per worker at a time.
//!
//! A segment the index strategy does not know is looked up chunk by chunk
//! in the previous version of the same file ([`ParentFile`]) before its
//! chunks are stored, so an edit stores only the chunks it changed.

use super::parent::{Parent, ParentFile};
use super::walk::{Job, Source};
use crate::container::ContainerWriter;
use crate::error::{Result, StoreError};
use crate::index::{ChunkLoc, IndexStrategy};
use crate::progress::Progress;
use crate::repo::Repository;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use strata_core::chunker::{ChunkStream, ChunkerParams, Segmenter};
use strata_core::fingerprint::is_zero;
use strata_core::format::{ChunkRef, Node, SegmentRef, ZERO_CHUNK};
use strata_core::Fingerprint;

/// What became of one job.
pub(crate) enum Outcome {
    Done {
        segments: Vec<SegmentRef>,
        size: u64,
        warning: Option<String>,
    },
    Failed(String),
}

/// Per-backup state shared by the workers.
pub(crate) struct Ctx<'a> {
    pub repo: &'a Repository,
    pub strategy: &'a dyn IndexStrategy,
    pub chunker: ChunkerParams,
    pub progress: &'a Progress,
    pub parent: &'a Parent<'a>,
    pub table: std::sync::Arc<crate::index::ContainerTable>,
    pub abort: AtomicBool,
    pub new_chunks: AtomicU64,
    pub new_raw: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Chunks (and bytes) found in the previous version of their file.
    pub parent_chunks: AtomicU64,
    pub parent_bytes: AtomicU64,
}

/// A chunk's fingerprint, and whether it is all zeros (never stored, so
/// not hashed).
fn chunk_fp(hasher: &strata_core::Hasher, chunk: &[u8]) -> (Fingerprint, bool) {
    if is_zero(chunk) {
        (Fingerprint::ZERO, true)
    } else {
        (hasher.hash(chunk), false)
    }
}

/// Bytes of a segment's non-zero chunks the strategy did not find.
fn new_bytes_of(chunks: &[PendingChunk], found: &[Option<ChunkLoc>]) -> usize {
    chunks
        .iter()
        .filter(|c| !c.zero)
        .zip(found)
        .filter(|(_, f)| f.is_none())
        .map(|(c, _)| c.len as usize)
        .sum()
}

/// Buffers a worker reuses from file to file.
#[derive(Default)]
pub(crate) struct WorkerBuffers {
    read: Vec<u8>,
    segment: Vec<u8>,
}

struct PendingChunk {
    fp: Fingerprint,
    start: usize,
    len: u32,
    zero: bool,
}

impl<'a> Ctx<'a> {
    /// Looks a segment up, stores what is new and records its reference.
    /// `at` is the segment's offset in its file.
    fn finish_segment(
        &self,
        writer: &mut ContainerWriter,
        data: &[u8],
        chunks: &mut Vec<PendingChunk>,
        out: &mut Vec<SegmentRef>,
        prev: Option<&mut ParentFile<'_>>,
        at: u64,
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let hasher = self.repo.hasher();
        let seg_fp = hasher.hash_fingerprints(chunks.iter().map(|c| &c.fp));
        let fps: Vec<Fingerprint> = chunks.iter().filter(|c| !c.zero).map(|c| c.fp).collect();
        let mut found: Vec<Option<ChunkLoc>> = self.strategy.lookup_segment(&seg_fp, &fps);
        // A segment-level strategy that did not find the segment made this
        // worker its storer: it must record or release it on every path.
        let storer = self.strategy.whole_segments() && found.iter().any(|f| f.is_none());
        if let (Some(prev), true) = (prev, found.iter().any(|f| f.is_none())) {
            self.fill_from_parent(prev, chunks, &mut found, at);
        }
        // Segment-level strategies store a new segment whole, in one
        // container; `appended` counts what this segment added there.
        let whole = storer && found.iter().any(|f| f.is_none());
        let all_new = found.iter().all(|f| f.is_none());
        let stored = if whole {
            writer
                .begin_segment(new_bytes_of(chunks, &found))
                .and_then(|()| self.store_chunks(writer, data, chunks.drain(..), found))
        } else {
            self.store_chunks(writer, data, chunks.drain(..), found)
        };
        let (refs, appended, stored_locs) = match stored {
            Ok(v) => v,
            Err(e) => {
                // Workers waiting for this segment must not wait in vain.
                if storer {
                    self.strategy.release_segment(&seg_fp);
                }
                return Err(e);
            }
        };
        if storer {
            if whole && writer.end_segment(seg_fp, appended) && all_new {
                self.strategy.record_segment(&seg_fp, &stored_locs);
            } else {
                self.strategy.release_segment(&seg_fp);
            }
        }
        self.segment_done(&seg_fp, &refs, appended as usize)?;
        out.push(SegmentRef {
            fp: seg_fp,
            chunks: refs,
        });
        Ok(())
    }

    /// Fills the chunks `found` lacks from the previous version of the
    /// file, where it has them.
    fn fill_from_parent(
        &self,
        prev: &mut ParentFile<'_>,
        chunks: &[PendingChunk],
        found: &mut [Option<ChunkLoc>],
        at: u64,
    ) {
        let end = at + chunks.iter().map(|c| c.len as u64).sum::<u64>();
        prev.window(at, end);
        let mut offset = at;
        let mut slots = found.iter_mut();
        for c in chunks {
            if !c.zero {
                let slot = slots.next().expect("one slot per non-zero chunk");
                if slot.is_none() {
                    *slot = prev.find(&c.fp, offset);
                    if slot.is_some() {
                        self.parent_chunks.fetch_add(1, Ordering::Relaxed);
                        self.parent_bytes.fetch_add(c.len as u64, Ordering::Relaxed);
                    }
                }
            }
            offset += c.len as u64;
        }
    }

    /// Stores the chunks the strategy did not find (claiming each, so two
    /// workers never store one twice) and returns every chunk's reference,
    /// how many this call appended, and where.
    fn store_chunks(
        &self,
        writer: &mut ContainerWriter,
        data: &[u8],
        chunks: impl Iterator<Item = PendingChunk>,
        found: Vec<Option<ChunkLoc>>,
    ) -> Result<(Vec<ChunkRef>, u32, Vec<ChunkLoc>)> {
        let mut appended = 0u32;
        let mut stored_locs = Vec::new();
        let mut found = found.into_iter();
        let mut refs = Vec::new();
        for c in chunks {
            if c.zero {
                refs.push(ChunkRef {
                    fp: Fingerprint::ZERO,
                    len: c.len,
                    container: ZERO_CHUNK,
                    region: 0,
                    offset: 0,
                });
                continue;
            }
            let loc = match found.next().flatten() {
                Some(l) => l,
                None => {
                    let loc = writer.next_loc(c.len as usize)?;
                    match self.strategy.claim(&c.fp, loc) {
                        None => {
                            writer.append(c.fp, &data[c.start..c.start + c.len as usize]);
                            self.new_chunks.fetch_add(1, Ordering::Relaxed);
                            self.new_raw.fetch_add(c.len as u64, Ordering::Relaxed);
                            appended += 1;
                            stored_locs.push(loc);
                            loc
                        }
                        Some(existing) => existing,
                    }
                }
            };
            refs.push(ChunkRef {
                fp: c.fp,
                len: c.len,
                container: loc.container,
                region: loc.region,
                offset: loc.offset,
            });
        }
        Ok((refs, appended, stored_locs))
    }

    /// Small files of one directory looked up as one segment (SiLo §3.2,
    /// P1): each file is read and chunked whole, then one lookup covers
    /// them all; each file still gets its own segment in the recipe.
    pub fn process_group(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        jobs: &[&Job],
        nodes: &[Node],
    ) -> Result<Vec<(usize, Outcome)>> {
        let hasher = self.repo.hasher();
        let data = &mut bufs.segment;
        data.clear();
        let mut pending: Vec<PendingChunk> = Vec::new();
        // Per file: node, first pending chunk, size, warning.
        let mut files: Vec<(usize, usize, u64, Option<String>)> = Vec::new();
        let mut out = Vec::new();
        for job in jobs {
            if self.abort.load(Ordering::Relaxed) {
                return Err(StoreError::Cancelled);
            }
            let Source::Path(p) = &job.source else {
                return Err(StoreError::Invalid(
                    "only files are grouped for lookup".into(),
                ));
            };
            let mut f = match open_source(p) {
                Ok(f) => f,
                Err(e) => {
                    out.push((job.node, Outcome::Failed(format!("{}: {e}", p.display()))));
                    continue;
                }
            };
            let (first, data_mark) = (pending.len(), data.len());
            // The worker's read buffer (MBs) is reused: zeroing a fresh one
            // per small file cost more than reading the file.
            let mut stream = ChunkStream::with_buffer(
                &mut f as &mut dyn Read,
                self.chunker,
                std::mem::take(&mut bufs.read),
            );
            let mut failed = None;
            loop {
                let next = match stream.next_chunk() {
                    Ok(n) => n,
                    Err(e) => {
                        failed = Some(format!("read error: {e}"));
                        break;
                    }
                };
                let Some((_, chunk)) = next else { break };
                let (fp, zero) = chunk_fp(hasher, chunk);
                pending.push(PendingChunk {
                    fp,
                    start: data.len(),
                    len: chunk.len() as u32,
                    zero,
                });
                if !zero {
                    data.extend_from_slice(chunk);
                }
                self.progress
                    .bytes_done
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                self.read_bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            let size = stream.position();
            bufs.read = stream.into_buffer();
            if let Some(m) = failed {
                pending.truncate(first);
                data.truncate(data_mark);
                out.push((job.node, Outcome::Failed(format!("{}: {m}", p.display()))));
                continue;
            }
            self.progress.files_done.fetch_add(1, Ordering::Relaxed);
            files.push((
                job.node,
                first,
                size,
                changed_warning(&f, p, size, &nodes[job.node]),
            ));
        }
        if pending.is_empty() {
            for (node, _, size, warning) in files {
                out.push((
                    node,
                    Outcome::Done {
                        segments: vec![],
                        size,
                        warning,
                    },
                ));
            }
            return Ok(out);
        }
        let group_fp = hasher.hash_fingerprints(pending.iter().map(|c| &c.fp));
        let fps: Vec<Fingerprint> = pending.iter().filter(|c| !c.zero).map(|c| c.fp).collect();
        let found = self.strategy.lookup_segment(&group_fp, &fps);
        let per_file: Vec<Fingerprint> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let end = files.get(i + 1).map_or(pending.len(), |n| n.1);
                hasher.hash_fingerprints(pending[f.1..end].iter().map(|c| &c.fp))
            })
            .collect();
        let total = pending.len();
        let (refs, appended, _) = self.store_chunks(writer, data, pending.drain(..), found)?;
        self.segment_done(&group_fp, &refs, appended as usize)?;
        for (i, (node, first, size, warning)) in files.iter().enumerate() {
            let end = files.get(i + 1).map_or(total, |n| n.1);
            let chunks = refs[*first..end].to_vec();
            let segments = if chunks.is_empty() {
                vec![]
            } else {
                vec![SegmentRef {
                    fp: per_file[i],
                    chunks,
                }]
            };
            out.push((
                *node,
                Outcome::Done {
                    segments,
                    size: *size,
                    warning: warning.clone(),
                },
            ));
        }
        Ok(out)
    }

    /// Tells the strategy a segment (or group) is stored.
    fn segment_done(&self, seg_fp: &Fingerprint, refs: &[ChunkRef], new: usize) -> Result<()> {
        let chunks: Vec<(Fingerprint, ChunkLoc)> = refs
            .iter()
            .filter(|c| c.is_direct())
            .map(|c| {
                (
                    c.fp,
                    ChunkLoc {
                        container: c.container,
                        region: c.region,
                        offset: c.offset,
                        len: c.len,
                    },
                )
            })
            .collect();
        let bytes = refs.iter().map(|c| c.len as u64).sum();
        self.strategy.segment_done(seg_fp, &chunks, bytes, new)
    }

    /// Reads one source. `Ok(Err(msg))` is a per-file problem (a warning);
    /// `Err` is fatal for the whole backup.
    fn process(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        reader: &mut dyn Read,
        path: &[u8],
    ) -> Result<Result<(Vec<SegmentRef>, u64), String>> {
        let mut stream =
            ChunkStream::with_buffer(reader, self.chunker, std::mem::take(&mut bufs.read));
        let mut prev = self.parent.file(path);
        let r = self.process_stream(writer, &mut bufs.segment, &mut stream, prev.as_mut());
        bufs.read = stream.into_buffer();
        r
    }

    fn process_stream(
        &self,
        writer: &mut ContainerWriter,
        data: &mut Vec<u8>,
        stream: &mut ChunkStream<&mut dyn Read>,
        mut prev: Option<&mut ParentFile<'_>>,
    ) -> Result<Result<(Vec<SegmentRef>, u64), String>> {
        let mut seg = Segmenter::new(&self.chunker);
        data.clear();
        let mut pending: Vec<PendingChunk> = Vec::new();
        let mut segments = Vec::new();
        let hasher = self.repo.hasher();
        // Offset of the pending segment in the file.
        let mut at = 0u64;
        loop {
            if self.abort.load(Ordering::Relaxed) {
                return Err(StoreError::Cancelled);
            }
            let next = match stream.next_chunk() {
                Ok(n) => n,
                Err(e) => return Ok(Err(format!("read error: {e}"))),
            };
            let Some((offset, chunk)) = next else { break };
            let (fp, zero) = chunk_fp(hasher, chunk);
            let len = chunk.len() as u32;
            if pending.is_empty() {
                at = offset;
            }
            pending.push(PendingChunk {
                fp,
                start: data.len(),
                len,
                zero,
            });
            if !zero {
                data.extend_from_slice(chunk);
            }
            self.progress
                .bytes_done
                .fetch_add(len as u64, Ordering::Relaxed);
            self.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
            if seg.push(&fp, len) {
                let p = prev.as_deref_mut();
                self.finish_segment(writer, data, &mut pending, &mut segments, p, at)?;
                data.clear();
            }
        }
        self.finish_segment(writer, data, &mut pending, &mut segments, prev, at)?;
        Ok(Ok((segments, stream.position())))
    }

    pub fn process_job(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        job: &Job,
        expect: &Node,
    ) -> Result<Outcome> {
        match &job.source {
            Source::Stream(m) => {
                let mut r = m
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .ok_or_else(|| StoreError::Invalid("stream read twice".into()))?;
                Ok(match self.process(writer, bufs, &mut r, &expect.path)? {
                    Ok((segments, size)) => Outcome::Done {
                        segments,
                        size,
                        warning: None,
                    },
                    Err(m) => Outcome::Failed(format!("stdin: {m}")),
                })
            }
            Source::Path(p) => {
                let mut f = match open_source(p) {
                    Ok(f) => f,
                    Err(e) => return Ok(Outcome::Failed(format!("{}: {e}", p.display()))),
                };
                let r = self.process(writer, bufs, &mut f, &expect.path)?;
                let (segments, size) = match r {
                    Ok(x) => x,
                    Err(m) => return Ok(Outcome::Failed(format!("{}: {m}", p.display()))),
                };
                self.progress.files_done.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::Done {
                    segments,
                    size,
                    warning: changed_warning(&f, p, size, expect),
                })
            }
        }
    }
}

/// Opens a file to back up, never following a symlink (and without
/// touching its atime where the file system allows).
pub(crate) fn open_source(p: &Path) -> std::io::Result<File> {
    File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME)
        .open(p)
        .or_else(|_| {
            File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
        })
}

/// A file modified while it was read is kept as read, with a warning
/// (restic and borg do the same).
fn changed_warning(f: &File, p: &Path, size: u64, expect: &Node) -> Option<String> {
    let after = f.metadata().ok()?;
    let t = after.mtime() * 1_000_000_000 + after.mtime_nsec();
    (after.len() != size || t != expect.mtime_ns || size != expect.size).then(|| {
        format!(
            "{}: file changed while it was read; stored the {size} bytes read",
            p.display()
        )
    })
}
