//! Chunking (docs/design.md "Chunking"; RevDedup §2.2.2, Parallel VM §3).
//!
//! One pass over the input yields both dedup units:
//! * **chunks** — content-defined with FastCDC (normalised, level 1; min =
//!   avg/2, max = 4·avg) or fixed 4 KiB blocks for disk images;
//! * **segments** — runs of whole chunks. In CDC mode a segment ends after a
//!   chunk whose fingerprint satisfies a second, rarer condition
//!   (`fp mod d == 0` once the segment has reached half its average size,
//!   forced at twice the average), so segment boundaries are as
//!   shift-resistant as chunk boundaries. In fixed mode segments are exactly
//!   `avg_segment` bytes (2 MiB), aligned with the image's blocks.
//!
//! The reader is buffered in large blocks and chunks are handed out as
//! slices of that buffer: no allocation per chunk.

use crate::error::{CoreError, Result};
use crate::fingerprint::Fingerprint;
use serde::{Deserialize, Serialize};
use std::io::{self, Read};

/// Which chunker a backup uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkerKind {
    /// FastCDC content-defined chunks.
    Cdc,
    /// Fixed-size chunks (disk images, block volumes).
    Fixed,
}

/// Chunk and segment size parameters; stored in the repository config (the
/// CDC defaults) and in each snapshot (what that backup used).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    pub kind: ChunkerKind,
    pub avg_chunk: u32,
    pub avg_segment: u32,
}

impl ChunkerParams {
    /// FastCDC with the given average chunk size and ~4 MiB segments.
    pub fn cdc(avg_chunk: u32) -> Self {
        ChunkerParams {
            kind: ChunkerKind::Cdc,
            avg_chunk,
            avg_segment: 4 << 20,
        }
    }

    /// 4 KiB chunks, 2 MiB segments.
    pub fn fixed() -> Self {
        ChunkerParams {
            kind: ChunkerKind::Fixed,
            avg_chunk: 4096,
            avg_segment: 2 << 20,
        }
    }

    pub fn min_chunk(&self) -> u32 {
        match self.kind {
            ChunkerKind::Cdc => self.avg_chunk / 2,
            ChunkerKind::Fixed => self.avg_chunk,
        }
    }

    pub fn max_chunk(&self) -> u32 {
        match self.kind {
            ChunkerKind::Cdc => self.avg_chunk * 4,
            ChunkerKind::Fixed => self.avg_chunk,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let ok_pow2 = self.avg_chunk.is_power_of_two();
        match self.kind {
            ChunkerKind::Cdc => {
                if !(1024..=1 << 20).contains(&self.avg_chunk) || !ok_pow2 {
                    return Err(CoreError::ChunkerParams(format!(
                        "average chunk size must be a power of two between 1 KiB and 1 MiB, got {}",
                        self.avg_chunk
                    )));
                }
            }
            ChunkerKind::Fixed => {
                if !(512..=1 << 20).contains(&self.avg_chunk) || !ok_pow2 {
                    return Err(CoreError::ChunkerParams(format!(
                        "fixed chunk size must be a power of two between 512 B and 1 MiB, got {}",
                        self.avg_chunk
                    )));
                }
            }
        }
        if self.avg_segment < 4 * self.max_chunk() {
            return Err(CoreError::ChunkerParams(format!(
                "segment size {} must be at least four maximum chunks ({})",
                self.avg_segment,
                4 * self.max_chunk()
            )));
        }
        Ok(())
    }
}

const BUF_SIZE: usize = 4 << 20;

/// Where chunks end: the cut of one chunk at a time, over bytes in memory.
#[derive(Clone, Copy, Debug)]
pub struct Cutter {
    params: ChunkerParams,
    mask_s: u64,
    mask_l: u64,
}

impl Cutter {
    pub fn new(params: ChunkerParams) -> Self {
        let bits = fastcdc::v2020::logarithm2(params.avg_chunk.max(256));
        Cutter {
            params,
            mask_s: fastcdc::v2020::MASKS[(bits + 1) as usize],
            mask_l: fastcdc::v2020::MASKS[(bits - 1) as usize],
        }
    }

    /// The longest chunk.
    pub fn max(&self) -> usize {
        self.params.max_chunk() as usize
    }

    /// The length of the chunk `src` begins with (`src` holds at least
    /// the longest chunk, or the rest of the stream).
    pub fn cut_len(&self, src: &[u8]) -> usize {
        let max = self.max();
        match self.params.kind {
            ChunkerKind::Fixed => src.len().min(max),
            ChunkerKind::Cdc => {
                let (_, cut) = fastcdc::v2020::cut(
                    src,
                    self.params.min_chunk() as usize,
                    self.params.avg_chunk as usize,
                    max,
                    self.mask_s,
                    self.mask_l,
                    self.mask_s << 1,
                    self.mask_l << 1,
                );
                cut.clamp(1, src.len())
            }
        }
    }

    /// Cuts `data[from..]` into chunks as a stream would, pushing each
    /// (start, length): while a longest chunk remains, or to the end of
    /// `data` when the stream ends there (`end`). Returns where it stopped.
    pub fn cut_all(
        &self,
        data: &[u8],
        mut from: usize,
        end: bool,
        out: &mut Vec<(usize, u32)>,
    ) -> usize {
        while from < data.len() && (end || data.len() - from >= self.max()) {
            let len = self.cut_len(&data[from..]);
            out.push((from, len as u32));
            from += len;
        }
        from
    }

    /// The stream's true chunks of `data` from `from` (a chunk boundary),
    /// given `guess`, the chunks [`Self::cut_all`] cut from the start of
    /// `data` (which need not be a boundary), and `sure`, chunks known to
    /// be what this cutter cuts where they begin when at least a longest
    /// chunk follows (a previous version's chunk at the same place whose
    /// bytes and the byte after it are unchanged). From `from`, one chunk
    /// at a time: a sure chunk that begins there (unless the stream ends
    /// within a longest chunk), else a guessed one that begins there —
    /// once a cut meets a guess the two agree, as a cut depends only on
    /// the bytes after the last one — else a cut made here. Pushes
    /// (start, length, where it came from) and stops where
    /// [`Self::cut_all`] does. This is what makes chunking parallel:
    /// blocks are cut or checked on any core, and joined in order at the
    /// cost of a chunk or two each.
    pub fn join(
        &self,
        data: &[u8],
        mut from: usize,
        end: bool,
        guess: &[(usize, u32)],
        sure: &[(usize, u32)],
        out: &mut Vec<(usize, u32, Pick)>,
    ) -> usize {
        let (mut g, mut k) = (0, 0);
        while from < data.len() && (end || data.len() - from >= self.max()) {
            while g < guess.len() && guess[g].0 < from {
                g += 1;
            }
            while k < sure.len() && sure[k].0 < from {
                k += 1;
            }
            let (start, len, pick) =
                if k < sure.len() && sure[k].0 == from && data.len() - from >= self.max() {
                    (from, sure[k].1, Pick::Sure(k as u32))
                } else if g < guess.len() && guess[g].0 == from {
                    (from, guess[g].1, Pick::Guess(g as u32))
                } else {
                    (from, self.cut_len(&data[from..]) as u32, Pick::Cut)
                };
            out.push((start, len, pick));
            from += len as usize;
        }
        from
    }
}

/// Where a chunk [`Cutter::join`] gives comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The sure chunk of this index.
    Sure(u32),
    /// The guessed chunk of this index.
    Guess(u32),
    /// Cut by the join itself.
    Cut,
}

/// Splits a byte stream into chunks. Call [`ChunkStream::next_chunk`] until
/// it returns `None`.
pub struct ChunkStream<R> {
    reader: R,
    params: ChunkerParams,
    cutter: Cutter,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    offset: u64,
}

impl<R: Read> ChunkStream<R> {
    pub fn new(reader: R, params: ChunkerParams) -> Self {
        Self::with_buffer(reader, params, Vec::new())
    }

    /// Like [`ChunkStream::new`] but reuses `buf` (from
    /// [`ChunkStream::into_buffer`]) so that a worker going through many
    /// small files does not allocate a fresh read buffer for each.
    pub fn with_buffer(reader: R, params: ChunkerParams, mut buf: Vec<u8>) -> Self {
        let size = BUF_SIZE.max(2 * params.max_chunk() as usize);
        if buf.len() != size {
            buf = vec![0u8; size];
        }
        ChunkStream {
            reader,
            params,
            cutter: Cutter::new(params),
            buf,
            start: 0,
            end: 0,
            eof: false,
            offset: 0,
        }
    }

    /// Gives the read buffer back for reuse.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// The reader the stream reads from.
    pub fn reader(&self) -> &R {
        &self.reader
    }

    /// Bytes handed out so far.
    pub fn position(&self) -> u64 {
        self.offset
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end < self.buf.len() {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The cuts this stream makes.
    pub fn cutter(&self) -> Cutter {
        self.cutter
    }

    /// Reads up to `size` more bytes of the stream into `data` (fewer at
    /// its end), after the last `keep` bytes of the block read before
    /// (none before the first): for chunking blocks in parallel, each
    /// from its own start, joined with [`Cutter::join`] (`keep` of at
    /// least the longest chunk holds every chunk that crosses into the
    /// next block). Returns how many bytes at the start of `data` came
    /// from the block before, and whether the stream ended. Not to be
    /// mixed with [`Self::next_chunk`] on one stream.
    pub fn read_raw(
        &mut self,
        data: &mut Vec<u8>,
        size: usize,
        keep: usize,
    ) -> io::Result<(usize, bool)> {
        data.clear();
        data.extend_from_slice(&self.buf[self.start..self.end]);
        let kept = data.len();
        data.resize(kept + size, 0);
        let mut filled = kept;
        while filled < data.len() && !self.eof {
            match self.reader.read(&mut data[filled..]) {
                Ok(0) => self.eof = true,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    data.clear();
                    return Err(e);
                }
            }
        }
        data.truncate(filled);
        self.offset += (filled - kept) as u64;
        let k = keep.min(filled).min(self.buf.len());
        self.buf[..k].copy_from_slice(&data[filled - k..]);
        self.start = 0;
        self.end = k;
        Ok((kept, self.eof))
    }

    /// The next chunk as `(offset in stream, bytes)`, or `None` at the end.
    pub fn next_chunk(&mut self) -> io::Result<Option<(u64, &[u8])>> {
        let max = self.params.max_chunk() as usize;
        if self.end - self.start < max && !self.eof {
            self.fill()?;
        }
        let avail = self.end - self.start;
        if avail == 0 {
            return Ok(None);
        }
        let len = self.cutter.cut_len(&self.buf[self.start..self.end]);
        let off = self.offset;
        let s = self.start;
        self.start += len;
        self.offset += len as u64;
        Ok(Some((off, &self.buf[s..s + len])))
    }
}

/// Decides where segments end, chunk by chunk.
#[derive(Clone, Debug)]
pub struct Segmenter {
    fixed: bool,
    min: u64,
    avg: u64,
    max: u64,
    divisor: u64,
    cur: u64,
}

impl Segmenter {
    pub fn new(params: &ChunkerParams) -> Self {
        let avg = params.avg_segment as u64;
        let min = avg / 2;
        Segmenter {
            fixed: params.kind == ChunkerKind::Fixed,
            min,
            avg,
            max: avg * 2,
            divisor: ((avg - min) / params.avg_chunk as u64).max(1),
            cur: 0,
        }
    }

    /// Accounts a chunk; returns true when the segment ends after it.
    pub fn push(&mut self, fp: &Fingerprint, len: u32) -> bool {
        self.cur += len as u64;
        let cut = if self.fixed {
            self.cur >= self.avg
        } else {
            self.cur >= self.max
                || (self.cur >= self.min && fp.prefix_u64().is_multiple_of(self.divisor))
        };
        if cut {
            self.cur = 0;
        }
        cut
    }

    /// Starts a new segment (at a file boundary).
    pub fn reset(&mut self) {
        self.cur = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Hasher;

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    fn chunks(data: &[u8], p: ChunkerParams) -> Vec<Vec<u8>> {
        let mut s = ChunkStream::new(data, p);
        let mut out = vec![];
        while let Some((_, c)) = s.next_chunk().unwrap() {
            out.push(c.to_vec());
        }
        out
    }

    /// A reader that returns at most `step` bytes per call.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = out.len().min(self.1).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    /// The chunks of blocks read with [`ChunkStream::read_raw`], each cut
    /// from its own start and joined in order (as the backup pipeline
    /// does, the guesses on any core).
    /// The chunks of `parent` (a previous version) that are sure in
    /// `buf` (at `start` of the new stream): at the same place, their
    /// bytes and the byte after them unchanged, a longest chunk after
    /// their start in the parent.
    fn sure_of(buf: &[u8], start: u64, parent: &[u8], p: ChunkerParams) -> Vec<(usize, u32)> {
        let max = p.max_chunk() as usize;
        let mut out = Vec::new();
        let mut off = 0usize;
        for c in chunks(parent, p) {
            let (a, len) = (off, c.len());
            off += len;
            let Some(rel) = (a as u64).checked_sub(start) else {
                continue;
            };
            let rel = rel as usize;
            if rel + len > buf.len() || a + max > parent.len() {
                continue;
            }
            // The byte after it: in the buffer (or the stream ends there).
            let next_same = match (buf.get(rel + len), parent.get(a + len)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            };
            if buf[rel..rel + len] == parent[a..a + len] && (next_same || len == max) {
                out.push((rel, len as u32));
            }
        }
        out
    }

    fn joined_chunks(
        data: &[u8],
        p: ChunkerParams,
        size: usize,
        step: usize,
        parent: &[u8],
    ) -> Vec<Vec<u8>> {
        let mut s = ChunkStream::new(Trickle(data, step), p);
        let cut = s.cutter();
        let (mut buf, mut out) = (Vec::new(), vec![]);
        // Where the true chunking stands, in the stream.
        let (mut at, mut base) = (0u64, 0u64);
        loop {
            let (kept, end) = s.read_raw(&mut buf, size, cut.max()).unwrap();
            // buf[0] is at `base - kept` in the stream.
            let start = base - kept as u64;
            let mut guess = Vec::new();
            // (Without guesses, as when the previous version's chunks
            // cover the block: the join cuts what they do not.)
            if size.is_multiple_of(2) {
                cut.cut_all(&buf, 0, end, &mut guess);
            }
            let mut joined = Vec::new();
            let from = (at - start) as usize;
            let sure = sure_of(&buf, start, parent, p);
            let stop = cut.join(&buf, from, end, &guess, &sure, &mut joined);
            let mut pos = from;
            for &(a, len, pick) in &joined {
                assert_eq!(a, pos);
                match pick {
                    Pick::Guess(g) => assert_eq!(guess[g as usize], (a, len)),
                    Pick::Sure(k) => assert_eq!(sure[k as usize], (a, len)),
                    Pick::Cut => {}
                }
                out.push(buf[a..a + len as usize].to_vec());
                pos += len as usize;
            }
            assert_eq!(pos, stop);
            at = start + stop as u64;
            base = s.position();
            assert!(
                base - at <= cut.max() as u64,
                "more left over than the kept bytes"
            );
            if end {
                assert_eq!(at, data.len() as u64);
                return out;
            }
        }
    }

    proptest::proptest! {
        /// Blocks cut in parallel from their own starts and joined in
        /// order cut exactly as chunk by chunk does.
        #[test]
        fn joined_blocks_cut_as_chunks(len in 0usize..300_000, seed in 0u64..1000,
                                       size in 1usize..100_000, step in 1usize..70_000,
                                       fixed in proptest::bool::ANY, zeros in proptest::bool::ANY) {
            let p = if fixed { ChunkerParams::fixed() } else { ChunkerParams::cdc(4096) };
            let mut data = pseudo_random(len, seed);
            if zeros {
                // Runs of zeros: cut at the longest chunk, so the guesses
                // of a block rarely meet the true cuts.
                for b in data.iter_mut().skip(len / 3).take(len / 3) {
                    *b = 0;
                }
            }
            // A previous version: the same bytes with some changed,
            // inserted and cut.
            let mut parent = data.clone();
            let n = parent.len();
            if n > 10 {
                for i in (seed as usize % 97..n).step_by(n / 5 + 1) {
                    parent[i] ^= 0x5a;
                }
                // The first byte of a chunk: the chunk before it stays
                // the same, but where it is cut depends on that byte.
                let cs = chunks(&data, p);
                let mut at = 0;
                for c in cs.iter().take(cs.len() / 2) {
                    at += c.len();
                }
                if at < n {
                    parent[at] ^= 0xff;
                }
                if seed % 3 == 0 {
                    parent.splice(n / 2..n / 2, pseudo_random(5000, seed + 1));
                }
                if seed % 5 == 0 {
                    parent.truncate(n * 2 / 3);
                }
            }
            proptest::prop_assert_eq!(joined_chunks(&data, p, size, step, &parent), chunks(&data, p));
            // And the other way round: the changed version backed up
            // after the original.
            proptest::prop_assert_eq!(joined_chunks(&parent, p, size, step, &data), chunks(&parent, p));
            proptest::prop_assert_eq!(joined_chunks(&data, p, size, step, &data), chunks(&data, p));
            proptest::prop_assert_eq!(joined_chunks(&data, p, size, step, &[]), chunks(&data, p));
        }
    }

    #[test]
    fn cdc_chunks_cover_input_within_bounds() {
        let p = ChunkerParams::cdc(8192);
        let data = pseudo_random(10 << 20, 42);
        let cs = chunks(&data, p);
        assert_eq!(cs.concat(), data);
        for c in &cs[..cs.len() - 1] {
            assert!(c.len() >= 4096 && c.len() <= 32768, "{}", c.len());
        }
        let avg = data.len() / cs.len();
        assert!((6000..14000).contains(&avg), "avg {avg}");
    }

    #[test]
    fn cdc_resynchronises_after_insert() {
        let p = ChunkerParams::cdc(8192);
        let data = pseudo_random(2 << 20, 7);
        let mut edited = data[..100_000].to_vec();
        edited.extend_from_slice(b"inserted bytes");
        edited.extend_from_slice(&data[100_000..]);
        let a = chunks(&data, p);
        let b = chunks(&edited, p);
        let common = b.iter().filter(|c| a.contains(c)).count();
        assert!(
            common + 4 >= a.len(),
            "only {common} of {} chunks shared",
            a.len()
        );
    }

    #[test]
    fn fixed_chunks_and_segments() {
        let p = ChunkerParams::fixed();
        let data = pseudo_random(5 << 20, 9);
        let cs = chunks(&data, p);
        assert!(cs.iter().all(|c| c.len() == 4096));
        let mut seg = Segmenter::new(&p);
        let h = Hasher::plain();
        let cuts = cs
            .iter()
            .filter(|c| seg.push(&h.hash(c), c.len() as u32))
            .count();
        assert_eq!(cuts, 2);
    }

    #[test]
    fn cdc_segments_average_near_target() {
        let p = ChunkerParams::cdc(8192);
        let data = pseudo_random(64 << 20, 3);
        let cs = chunks(&data, p);
        let mut seg = Segmenter::new(&p);
        let h = Hasher::plain();
        let cuts = cs
            .iter()
            .filter(|c| seg.push(&h.hash(c), c.len() as u32))
            .count();
        let avg = data.len() / cuts.max(1);
        assert!((2 << 20..7 << 20).contains(&avg), "avg segment {avg}");
    }

    #[test]
    fn bad_params_rejected() {
        assert!(ChunkerParams::cdc(3000).validate().is_err());
        assert!(ChunkerParams::cdc(8192).validate().is_ok());
        assert!(ChunkerParams::fixed().validate().is_ok());
    }
}
