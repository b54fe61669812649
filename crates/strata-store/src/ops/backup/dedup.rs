//! The dedup stage of a backup: a segment of fingerprinted chunks is looked
//! up — in the previous version of the same file first ([`ParentFile`]),
//! then in the index strategy — and its new chunks are packed into
//! containers. Small files go through here whole on one worker
//! ([`Ctx::process_small`], [`Ctx::process_group`]); large files and
//! streams are cut into blocks and segments by [`super::pipeline`], which
//! calls [`Ctx::store_segment`] from every worker.

use super::job::{chunk_fp, Ctx, PendingChunk, SegmentJob, KNOWN};
use super::parent::{is_anchor, ParentFile};
use super::walk::{Job, Source};
use crate::engine::index::{ChunkLoc, IndexStrategy};
use crate::engine::writer::ContainerWriter;
use crate::error::{Result, StoreError};
use crate::stages::{Stage, Stages};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use strata_core::chunker::{ChunkStream, Segmenter};
use strata_core::format::{ChunkRef, Node, SegmentRef};
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

/// What storing a segment's chunks did: every chunk's reference, and the
/// chunks appended by this call (count, locations, fingerprints).
struct Stored {
    refs: Vec<ChunkRef>,
    appended: u32,
    locs: Vec<ChunkLoc>,
    fps: Vec<Fingerprint>,
}

/// What looking a segment's chunks up in the previous version of their
/// file found: each non-zero chunk's location there, if it had it; and,
/// for a repository storing deltas, the chunk the previous version had at
/// the place of each chunk it did not have (its base, perhaps).
pub(crate) struct Found {
    pub locs: Vec<Option<ChunkLoc>>,
    pub near: Vec<Option<(Fingerprint, ChunkLoc)>>,
}

impl Found {
    /// Nothing found for `n` chunks.
    pub fn nothing(n: usize) -> Self {
        Found {
            locs: vec![None; n],
            near: Vec::new(),
        }
    }
}

/// Bytes of a segment's non-zero chunks not found anywhere.
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

/// A reader that counts the time spent in `read` as the read stage.
pub(crate) struct TimedRead<R> {
    pub inner: R,
    pub stages: Arc<Stages>,
    /// Nanoseconds spent reading so far.
    pub ns: u64,
}

impl<R: Read> Read for TimedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let t = Instant::now();
        let r = self.inner.read(buf);
        self.ns += t.elapsed().as_nanos() as u64;
        self.stages
            .add(Stage::Read, t, *r.as_ref().unwrap_or(&0) as u64);
        r
    }
}

impl<'a> Ctx<'a> {
    /// Looks up the chunks of `job` in the previous version of its file.
    pub fn parent_lookup(&self, prev: Option<&mut ParentFile>, job: &SegmentJob) -> Found {
        let n = job.chunks.iter().filter(|c| !c.zero).count();
        let Some(prev) = prev else {
            return Found::nothing(n);
        };
        let t = Instant::now();
        prev.window(job.at, job.at + job.len());
        let mut found = Found {
            locs: Vec::with_capacity(n),
            near: Vec::new(),
        };
        let mut offset = job.at;
        let mut bytes = 0u64;
        for c in &job.chunks {
            if !c.zero {
                let f = prev.find(&c.fp, offset);
                if f.is_some() {
                    bytes += c.len as u64;
                }
                if self.delta.is_some() {
                    found
                        .near
                        .push(f.is_none().then(|| prev.near(offset)).flatten());
                }
                found.locs.push(f);
            }
            offset += c.len as u64;
        }
        self.parent_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.stages.add(Stage::Lookup, t, job.len());
        found
    }

    /// Looks a segment up in the index strategy (for the chunks the
    /// previous version did not have), stores what is new and returns its
    /// reference.
    pub fn store_segment(
        &self,
        writer: &mut ContainerWriter,
        job: &SegmentJob,
        found: Found,
    ) -> Result<SegmentRef> {
        let s = self.store_segment_chunks(writer, job, found)?;
        // Consecutive zero chunks: one run.
        Ok(SegmentRef::with_runs(s.fp, s.chunks))
    }

    /// As [`Self::store_segment`], one reference per chunk of `job` (zero
    /// chunks not merged into runs: a group of small files is cut back
    /// into its files by chunk).
    fn store_segment_chunks(
        &self,
        writer: &mut ContainerWriter,
        job: &SegmentJob,
        found: Found,
    ) -> Result<SegmentRef> {
        let Found {
            locs: mut found,
            near,
        } = found;
        let t = Instant::now();
        let hasher = self.repo.hasher();
        let seg_fp = hasher.hash_fingerprints(job.chunks.iter().map(|c| &c.fp));
        // A segment-level strategy that does not know the segment makes
        // this worker its storer: it must record or release it on every
        // path.
        let mut storer = false;
        let fps = job.fps();
        if found.iter().any(|f| f.is_none()) {
            let known = self.strategy.lookup_segment(&seg_fp, &fps);
            storer = self.strategy.whole_segments() && known.iter().any(|f| f.is_none());
            for (f, k) in found.iter_mut().zip(known) {
                if k.is_some() {
                    *f = k;
                }
            }
        }
        // Released on any way out that does not record or release it
        // below: an error, or a panic (which fails the backup).
        let mut claim = Claim {
            strategy: self.strategy,
            segment: seg_fp,
            held: storer,
        };
        // Still unknown chunks: a similar stored segment may hold them
        // (content shared with other files or series, not aligned with
        // their segments).
        if storer && found.iter().any(|f| f.is_none()) {
            if let Some(similar) = self.strategy.lookup_similar(&fps) {
                let mut bytes = 0u64;
                for ((f, s), len) in found
                    .iter_mut()
                    .zip(similar)
                    .zip(job.chunks.iter().filter(|c| !c.zero).map(|c| c.len as u64))
                {
                    if f.is_none() && s.is_some() {
                        *f = s;
                        bytes += len;
                    }
                }
                self.similar_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        self.stages.add(Stage::Lookup, t, 0);
        let t = Instant::now();
        let io_before = writer.io_ns();
        // Segment-level strategies store a new segment whole, in one
        // container; `appended` counts what this segment added there.
        let whole = storer && found.iter().any(|f| f.is_none());
        let all_new = found.iter().all(|f| f.is_none());
        let new_bytes = new_bytes_of(&job.chunks, &found);
        let stored = if whole {
            writer
                .begin_segment(new_bytes)
                .and_then(|()| self.store_chunks(writer, job, found, &near))
        } else {
            self.store_chunks(writer, job, found, &near)
        };
        let Stored {
            refs,
            appended,
            locs: stored_locs,
            fps: new_fps,
        } = stored?; // (On an error, the claim lets the segment go.)
        if storer {
            match whole
                .then(|| writer.end_segment(seg_fp, appended))
                .flatten()
            {
                Some(at) if all_new => {
                    self.strategy
                        .record_segment(&seg_fp, &fps, &stored_locs, at)
                }
                Some(at) => {
                    self.strategy.record_run(&new_fps, at);
                    self.strategy.release_segment(&seg_fp)
                }
                None => self.strategy.release_segment(&seg_fp),
            }
            claim.held = false;
        }
        self.segment_done(&seg_fp, &refs, appended as usize)?;
        // Packing, less the compression and writes it triggered (counted
        // apart by the writer).
        let io = std::time::Duration::from_nanos(writer.io_ns() - io_before);
        self.stages
            .add(Stage::Store, t + io.min(t.elapsed()), new_bytes as u64);
        Ok(SegmentRef {
            fp: seg_fp,
            chunks: refs,
        })
    }

    /// Stores the chunks nobody has (claiming each, so two workers never
    /// store one twice).
    fn store_chunks(
        &self,
        writer: &mut ContainerWriter,
        job: &SegmentJob,
        found: Vec<Option<ChunkLoc>>,
        near: &[Option<(Fingerprint, ChunkLoc)>],
    ) -> Result<Stored> {
        let mut appended = 0u32;
        let mut near = near.iter();
        let mut stored_locs = Vec::new();
        let mut new_fps = Vec::new();
        let mut found = found.into_iter();
        let mut refs = Vec::with_capacity(job.chunks.len());
        // Each chunk's offset in its file (an image whose blocks a link
        // sink places).
        let mut at = job.at;
        for c in &job.chunks {
            let here = at;
            at += c.len as u64;
            if c.zero {
                refs.push(ChunkRef::zeros(c.len, 1));
                continue;
            }
            let near = near.next().copied().flatten();
            let loc = match found.next().flatten() {
                Some(l) => l,
                None if c.block == KNOWN => {
                    return Err(StoreError::Invalid(
                        "a chunk taken from the previous version has no location".into(),
                    ))
                }
                None => {
                    let bytes = job.bytes(c);
                    let base = match (&self.delta, near) {
                        (Some(d), Some(n)) => d.base_for(bytes, n),
                        _ => None,
                    };
                    let delta_loc = match &base {
                        Some((b, _)) => writer.next_delta_loc(bytes.len(), b)?,
                        None => None,
                    };
                    let loc = match delta_loc {
                        Some(l) => l,
                        None => writer.next_loc(c.len as usize)?,
                    };
                    match self.strategy.claim(&c.fp, loc) {
                        None => {
                            match (delta_loc, base) {
                                (Some(_), Some((b, bb))) => writer.append_delta(c.fp, bytes, b, bb),
                                _ => writer.append_at(c.fp, bytes, Some(here)),
                            }
                            if is_anchor(&c.fp) {
                                self.stored_sample
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .insert(c.fp, c.len);
                            }
                            self.new_chunks.fetch_add(1, Ordering::Relaxed);
                            self.new_raw.fetch_add(c.len as u64, Ordering::Relaxed);
                            appended += 1;
                            stored_locs.push(loc);
                            new_fps.push(c.fp);
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
        Ok(Stored {
            refs,
            appended,
            locs: stored_locs,
            fps: new_fps,
        })
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

    /// Reads one whole stream into `job`'s segments on this worker:
    /// chunks, fingerprints, cuts segments, stores each. `Ok(Err(msg))` is
    /// a problem of this file (a warning); `Err` ends the backup.
    pub(crate) fn process_stream(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        reader: &mut dyn Read,
        mut prev: Option<ParentFile>,
    ) -> Result<std::result::Result<(Vec<SegmentRef>, u64), String>> {
        let timed = TimedRead {
            inner: reader,
            stages: self.stages.clone(),
            ns: 0,
        };
        let mut stream =
            ChunkStream::with_buffer(timed, self.chunker, std::mem::take(&mut bufs.read));
        let mut seg = Segmenter::new(&self.chunker);
        let mut job = SegmentJob {
            data: std::mem::take(&mut bufs.segment),
            ..Default::default()
        };
        job.data.clear();
        // The largest segment at once, so the buffer never doubles past it.
        job.data.reserve_exact(
            self.chunker.avg_segment as usize * 2 + self.chunker.max_chunk() as usize,
        );
        let mut segments = Vec::new();
        let hasher = self.repo.hasher();
        let result = loop {
            if self.aborted() {
                break Err(StoreError::Cancelled);
            }
            let t = Instant::now();
            let read_before = stream.reader().ns;
            let next = stream.next_chunk();
            let chunked = t.elapsed().as_nanos() as u64;
            let next = match next {
                Ok(n) => n,
                Err(e) => break Ok(Err(format!("read error: {e}"))),
            };
            let Some((offset, chunk)) = next else {
                break Ok(Ok(()));
            };
            let th = Instant::now();
            let (fp, zero) = chunk_fp(hasher, chunk);
            self.stages.add(Stage::Hash, th, chunk.len() as u64);
            if job.is_empty() {
                job.at = offset;
            }
            job.push(fp, zero, chunk);
            let len = job.chunks.last().map_or(0, |c| c.len as u64);
            // Chunking is the time in `next_chunk` not spent in `read`.
            let read_ns = stream.reader().ns - read_before;
            let not_read = std::time::Duration::from_nanos(chunked.saturating_sub(read_ns));
            self.stages
                .add(Stage::Chunk, Instant::now() - not_read, len);
            self.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
            self.read_bytes.fetch_add(len, Ordering::Relaxed);
            if seg.push(&fp, len as u32) {
                let found = self.parent_lookup(prev.as_mut(), &job);
                segments.push(self.store_segment(writer, &job, found)?);
                job.chunks.clear();
                job.data.clear();
            }
        };
        let size = stream.position();
        bufs.read = stream.into_buffer();
        let r = match result? {
            Err(m) => Ok(Err(m)),
            Ok(()) => {
                if !job.is_empty() {
                    let found = self.parent_lookup(prev.as_mut(), &job);
                    segments.push(self.store_segment(writer, &job, found)?);
                }
                Ok(Ok((segments, size)))
            }
        };
        job.data.clear();
        bufs.segment = job.data;
        r
    }

    /// Backs one job up whole on this worker.
    pub fn process_small(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        job: &mut Job,
    ) -> Result<Outcome> {
        let prev = job.prev.take();
        let expect = &job.node;
        match &job.source {
            Source::Stream(m) => {
                let mut r = m
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .ok_or_else(|| StoreError::Invalid("stream read twice".into()))?;
                Ok(match self.process_stream(writer, bufs, &mut r, prev)? {
                    Ok((segments, size)) => Outcome::Done {
                        segments,
                        size,
                        warning: None,
                    },
                    Err(m) => Outcome::Failed(format!("{}: {m}", expect.path_str())),
                })
            }
            Source::Patch(_) => Err(StoreError::Invalid(
                "a patched image is read as a large file".into(),
            )),
            Source::Path(p) => {
                let mut f = match open_source(p) {
                    Ok(f) => f,
                    Err(e) => return Ok(Outcome::Failed(format!("{}: {e}", p.display()))),
                };
                let r = self.process_stream(writer, bufs, &mut f, prev)?;
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

    /// Small files of one directory looked up as one segment (SiLo §3.2,
    /// P1): each file is read and chunked whole, then one lookup covers
    /// them all; each file still gets its own segment in the recipe.
    pub fn process_group(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        jobs: &mut [Job],
    ) -> Result<Vec<(usize, Outcome)>> {
        let hasher = self.repo.hasher();
        let mut group = SegmentJob {
            data: std::mem::take(&mut bufs.segment),
            ..Default::default()
        };
        group.data.clear();
        // Per file: its index in `jobs`, first chunk, size, warning.
        let mut files: Vec<(usize, usize, u64, Option<String>)> = Vec::new();
        let mut out = Vec::new();
        // Each non-zero chunk's place in its file's previous version
        // (deltas on).
        let mut near = Vec::new();
        for (ji, job) in jobs.iter().enumerate() {
            if self.aborted() {
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
                    out.push((ji, Outcome::Failed(format!("{}: {e}", p.display()))));
                    continue;
                }
            };
            let (first, data_mark, near_mark) = (group.chunks.len(), group.data.len(), near.len());
            let timed = TimedRead {
                inner: &mut f as &mut dyn Read,
                stages: self.stages.clone(),
                ns: 0,
            };
            // The worker's read buffer (MBs) is reused: zeroing a fresh one
            // per small file cost more than reading the file.
            let mut stream =
                ChunkStream::with_buffer(timed, self.chunker, std::mem::take(&mut bufs.read));
            let mut failed = None;
            loop {
                let next = match stream.next_chunk() {
                    Ok(n) => n,
                    Err(e) => {
                        failed = Some(format!("read error: {e}"));
                        break;
                    }
                };
                let Some((at, chunk)) = next else { break };
                let t = Instant::now();
                let (fp, zero) = chunk_fp(hasher, chunk);
                self.stages.add(Stage::Hash, t, chunk.len() as u64);
                if self.delta.is_some() && !zero {
                    near.push(job.prev.as_ref().and_then(|p| p.near(at)));
                }
                group.push(fp, zero, chunk);
                let len = chunk.len() as u64;
                self.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
                self.read_bytes.fetch_add(len, Ordering::Relaxed);
            }
            let size = stream.position();
            bufs.read = stream.into_buffer();
            if let Some(m) = failed {
                group.chunks.truncate(first);
                group.data.truncate(data_mark);
                near.truncate(near_mark);
                out.push((ji, Outcome::Failed(format!("{}: {m}", p.display()))));
                continue;
            }
            self.progress.files_done.fetch_add(1, Ordering::Relaxed);
            files.push((ji, first, size, changed_warning(&f, p, size, &job.node)));
        }
        let total = group.chunks.len();
        let stored = if group.is_empty() {
            None
        } else {
            let group_found = Found {
                locs: vec![None; group.fps().len()],
                near: std::mem::take(&mut near),
            };
            Some(self.store_segment_chunks(writer, &group, group_found)?)
        };
        for (i, (node, first, size, warning)) in files.iter().enumerate() {
            let end = files.get(i + 1).map_or(total, |n| n.1);
            let segments = match &stored {
                Some(g) if end > *first => {
                    let chunks = &g.chunks[*first..end];
                    let fp = hasher.hash_fingerprints(chunks.iter().map(|c| &c.fp));
                    vec![SegmentRef::with_runs(fp, chunks.iter().copied())]
                }
                _ => vec![],
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
        group.data.clear();
        bufs.segment = group.data;
        Ok(out)
    }
}

/// A segment `lookup_segment` made this worker the storer of: released
/// when dropped while still held, so that no other worker waits for it
/// in vain.
struct Claim<'a> {
    strategy: &'a dyn IndexStrategy,
    segment: Fingerprint,
    held: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.held {
            self.strategy.release_segment(&self.segment);
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
pub(crate) fn changed_warning(f: &File, p: &Path, size: u64, expect: &Node) -> Option<String> {
    let after = f.metadata().ok()?;
    let t = after.mtime() * 1_000_000_000 + after.mtime_nsec();
    (after.len() != size || t != expect.mtime_ns || size != expect.size).then(|| {
        format!(
            "{}: file changed while it was read; stored the {size} bytes read",
            p.display()
        )
    })
}
