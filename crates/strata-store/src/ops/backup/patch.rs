//! A stream of which only some parts changed since a version of its
//! series — a block volume's image (`strata volume snapshot`), whose
//! server knows which 2 MiB segments were written since its last
//! snapshot. The unchanged segments are taken from that version's recipe
//! without reading them; only the changed ones are read (at their
//! offsets, [`ReadAt`]), chunked and deduplicated as any stream.
//!
//! The image is cut with the fixed chunker (4 KiB chunks, segments of
//! exactly [`PATCH_SEGMENT`] bytes), so segment *k* of the new version
//! covers the same bytes as segment *k* of the old one. A segment is
//! taken from the old version only if that version's segment *k* lies at
//! the same offset with the same length and every chunk of it can be
//! found (its container is still in the repository): any other segment is
//! read. If the series' newest version is not the one the changes are
//! counted from, everything is read.

use super::job::{Block, CleanSegment, PATCH_CHUNK};
use super::job::{Ctx, SegmentJob};
pub use super::job::{PATCH_PIECE, PATCH_SEGMENT};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Bytes of a stream read at any offset.
pub trait ReadAt: Send {
    /// Fills `buf` with the stream's bytes from `offset` (all of them, or
    /// an error).
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Whether the bytes `offset..offset+len` are known to be zeros
    /// without reading them (a volume's blocks never written, say): such a
    /// segment is handed on as zero chunks, neither read nor hashed. By
    /// default nothing is known.
    fn unwritten(&mut self, _offset: u64, _len: u64) -> io::Result<bool> {
        Ok(false)
    }
}

/// An image backed up as one file (`name`) of which only the segments
/// flagged in `changed` may differ from version `base` of the series.
pub struct ImagePatch {
    pub name: String,
    pub source: Box<dyn ReadAt>,
    /// Bytes of the image.
    pub size: u64,
    /// The version the changes are counted from (none: read everything).
    pub base: Option<String>,
    /// Per [`PATCH_SEGMENT`] of the image: whether it may have changed
    /// since `base` (none: unknown, read everything). Segments past its
    /// end count as changed.
    pub changed: Option<Vec<bool>>,
    /// The image file's time (mtime and ctime) in the version. The same
    /// in every version of an image (its creation, say), the pieces of its
    /// recipe that did not change are the previous version's, byte for
    /// byte: not encoded, compressed or written again.
    pub time_ns: i64,
    /// The volume the image is read from, whose blocks the new containers
    /// link to instead of being written (a [`crate::engine::writer::Linker`]:
    /// the link sink of `strata-link`, which counts what was linked).
    pub link: Option<std::sync::Arc<dyn crate::engine::writer::Linker>>,
}

/// The image's bytes, shared by the jobs of its pieces (one read at a
/// time).
#[derive(Clone)]
pub(crate) struct SharedImage(pub std::sync::Arc<std::sync::Mutex<Box<dyn ReadAt>>>);

impl ReadAt for SharedImage {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .read_exact_at(offset, buf)
    }

    fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwritten(offset, len)
    }
}

/// A patch as the pipeline reads it: the image, or a piece of it
/// (`at..end`).
pub(crate) struct PatchSource {
    pub source: Box<dyn ReadAt>,
    /// Bytes of the image.
    pub size: u64,
    /// Where this job's bytes end (the image's size, or its piece's end).
    pub end: u64,
    /// As [`ImagePatch::changed`], once checked against the parent.
    pub changed: Option<Vec<bool>>,
    /// The unchanged segments found in the parent (filled by the walk):
    /// segment *k* → its index in `prev`.
    pub clean: BTreeMap<u64, usize>,
    /// The parent's segments, each taken when the patch comes to it.
    pub prev: Option<super::parent::PrevSegments>,
    /// The next offset to hand on.
    pub at: u64,
    /// A segment found unwritten ([`ReadAt::unwritten`]) while reading up
    /// to it, not asked again when it comes.
    pub hole: Option<u64>,
}

/// A segment of `len` bytes of zeros, known without reading it: its
/// chunks as the fixed chunker cuts it, all zero (stored nowhere).
fn zero_segment(len: u64) -> CleanSegment {
    let mut job = SegmentJob::default();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(PATCH_CHUNK);
        job.push_known(strata_core::Fingerprint::ZERO, true, n as u32);
        at += n;
    }
    (job, Vec::new())
}

impl PatchSource {
    /// Where segment `k` of this job ends.
    fn segment_end(&self, k: u64) -> u64 {
        ((k + 1) * PATCH_SEGMENT).min(self.end)
    }

    /// Whether segment `k` is known to be zeros without reading it (asked
    /// of the source once).
    fn is_hole(&mut self, k: u64) -> io::Result<bool> {
        if self.hole == Some(k) {
            return Ok(true);
        }
        let at = k * PATCH_SEGMENT;
        self.source.unwritten(at, self.segment_end(k) - at)
    }

    /// The byte ranges that will be read: the segments not in `clean`,
    /// neighbours merged, in order.
    pub(crate) fn read_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for k in self.at / PATCH_SEGMENT..self.end.div_ceil(PATCH_SEGMENT) {
            if self.clean.contains_key(&k) {
                continue;
            }
            let (s, e) = (k * PATCH_SEGMENT, ((k + 1) * PATCH_SEGMENT).min(self.end));
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        out
    }

    /// The next block of the image: an unchanged segment (no bytes), or
    /// up to `block` bytes read up to the next unchanged segment, cut into
    /// 4 KiB chunks.
    pub(crate) fn next_block(&mut self, ctx: &Ctx<'_>, idx: u64, block: usize) -> Block {
        let at = self.at;
        let mut b = Block::empty(idx, at);
        if at >= self.end {
            b.end = Some(Ok(()));
            return b;
        }
        if at.is_multiple_of(PATCH_SEGMENT) {
            let known = self
                .clean
                .remove(&(at / PATCH_SEGMENT))
                .and_then(|i| self.prev.as_mut()?.take(i));
            // (One whose chunks are not found after all, which the walk
            // checked they were, would be read.)
            let hole = match known {
                Some(_) => None,
                None => match self.is_hole(at / PATCH_SEGMENT) {
                    Ok(h) => h.then(|| zero_segment(self.segment_end(at / PATCH_SEGMENT) - at)),
                    Err(e) => {
                        b.end = Some(Err(format!("reading the map at byte {at}: {e}")));
                        return b;
                    }
                },
            };
            if let Some(k) = &known {
                ctx.parent_bytes.fetch_add(k.0.len(), Ordering::Relaxed);
            }
            if let Some(known) = known.or(hole) {
                let span = known.0.len();
                b.span = span;
                b.known = Some(known);
                self.at += span;
                ctx.progress.bytes_done.fetch_add(span, Ordering::Relaxed);
                if self.at >= self.end {
                    b.end = Some(Ok(()));
                }
                return b;
            }
        }
        // Read up to the next unchanged or unwritten segment, never into
        // it.
        let mut end = (at + block as u64).min(self.end);
        if let Some((&k, _)) = self.clean.range(at / PATCH_SEGMENT + 1..).next() {
            end = end.min(k * PATCH_SEGMENT);
        }
        for k in at / PATCH_SEGMENT + 1..end.div_ceil(PATCH_SEGMENT) {
            match self.is_hole(k) {
                Ok(false) => {}
                Ok(true) => {
                    self.hole = Some(k);
                    end = k * PATCH_SEGMENT;
                    break;
                }
                Err(e) => {
                    b.end = Some(Err(format!(
                        "reading the map at byte {}: {e}",
                        k * PATCH_SEGMENT
                    )));
                    return b;
                }
            }
        }
        let started = Instant::now();
        let mut data = ctx.buffers.take();
        data.resize((end - at) as usize, 0);
        if let Err(e) = self.source.read_exact_at(at, &mut data) {
            b.end = Some(Err(format!("read error at byte {at}: {e}")));
            return b;
        }
        ctx.stages
            .add(crate::stages::Stage::Read, started, data.len() as u64);
        let n = data.len();
        b.chunks = (0..n)
            .step_by(PATCH_CHUNK as usize)
            .map(|s| (s, (n - s).min(PATCH_CHUNK as usize) as u32))
            .collect();
        b.span = n as u64;
        b.data = ctx.buffers.share(data);
        ctx.progress
            .bytes_done
            .fetch_add(n as u64, Ordering::Relaxed);
        ctx.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.at = end;
        if self.at >= self.end {
            b.end = Some(Ok(()));
        }
        b
    }
}
