//! Block write traces of a primary-storage volume with spatial and
//! temporal locality of duplicate data (iDedup, Srinivasan et al., FAST
//! 2012, §3.1 and §5).
//!
//! From the paper: in real enterprise primary workloads (NetApp CIFS
//! traces, "Corporate" and "Engineering", 4 KiB blocks) "the drop in
//! deduplication ratio was less than linear with increasing block size.
//! This implies duplicated data is clustered, thus indicating **spatial
//! locality**", and "the drop in deduplication ratio was less than linear
//! with decreasing table size. This implies duplicated data exhibits
//! notable **temporal locality**" (§3.1). §5.3: the deduplication rate is
//! ≈ **24 % / 23 %** at threshold 1 (minimum duplicate sequence length)
//! with a cache covering all blocks, and drops by ≈ **50 %** at threshold 8
//! (to 13 %); a cache of **25 %** of the blocks keeps ≈ 66/74 ≈ **89 %** of
//! what the full cache finds at threshold 4.
//!
//! The model: the trace is a sequence of *runs* of 4 KiB block writes at
//! consecutive block numbers (spatial locality). Run lengths are discrete
//! Pareto with tail index 1.2 (1–256 blocks), which puts ≈ 55 % of the
//! blocks in runs of ≥ 8 blocks — the threshold-8/threshold-1 ratio above.
//! A run is a duplicate run with probability `dup_fraction` (default 0.24):
//! it rewrites the content of a contiguous run of earlier writes, taken
//! with probability `recent_fraction` (0.85) from the most recent
//! `recent_window` (10 %) of the history and otherwise from anywhere, so
//! ≈ 89 % of duplicates have their source within the last 25 % of the
//! blocks written (temporal locality). Runs start at a random block
//! (60 %) or continue after the previous run (40 %, sequential streams).
//! Unique blocks are [`Mix::TYPICAL`] content without zero runs (so no two
//! unique blocks are equal), from a counter-derived seed.
//!
//! Not a [`super::Workload`]: iterate [`PrimaryTrace`], or store it with
//! [`write_trace`] and read it back with [`PrimaryTraceReader`].
//!
//! File format (little endian): a 40-byte header — magic `STRPRIM1`,
//! `u32` format version (1), `u32` block size, `u64` volume size in
//! blocks, `u64` number of records, `u64` seed — followed by that many
//! records of `u64` block number then `block size` bytes of data.

use super::content::{ContentGen, Mix};
use super::rng::{derive_seed, LongTail, Rng};
use std::io::{self, Read, Write};

/// Block size of the trace (iDedup deduplicates 4 KiB WAFL blocks).
pub const BLOCK_SIZE: usize = 4096;
/// File magic.
pub const MAGIC: &[u8; 8] = b"STRPRIM1";
const FORMAT: u32 = 1;
const HEADER_LEN: usize = 40;

/// Parameters of a primary trace.
#[derive(Clone, Debug, PartialEq)]
pub struct PrimaryConfig {
    pub seed: u64,
    /// Volume size in blocks.
    pub volume_blocks: u64,
    /// Number of block writes in the trace.
    pub writes: u64,
    /// Fraction of written blocks that duplicate earlier writes (§5.3: ≈ 0.24).
    pub dup_fraction: f64,
    /// Tail index of the Pareto run-length distribution.
    pub run_alpha: f64,
    /// Longest run in blocks.
    pub max_run: u64,
    /// Probability that a run continues right after the previous one.
    pub sequential: f64,
    /// Probability that a duplicate's source is in the recent window.
    pub recent_fraction: f64,
    /// The recent window as a fraction of the blocks written so far.
    pub recent_window: f64,
    /// Content of unique blocks.
    pub mix: Mix,
}

impl PrimaryConfig {
    /// A trace writing `writes` blocks into a volume of `volume_bytes`
    /// with the iDedup-derived defaults.
    pub fn new(seed: u64, volume_bytes: u64, writes: u64) -> PrimaryConfig {
        PrimaryConfig {
            seed,
            volume_blocks: (volume_bytes / BLOCK_SIZE as u64).max(1),
            writes,
            dup_fraction: 0.24,
            run_alpha: 1.2,
            max_run: 256,
            sequential: 0.4,
            recent_fraction: 0.85,
            recent_window: 0.10,
            mix: Mix {
                zeros: 0.0,
                ..Mix::TYPICAL
            },
        }
    }
}

/// Counters of what the generator produced (ground truth for tests and
/// reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrimaryStats {
    pub writes: u64,
    pub dup_blocks: u64,
    pub dup_runs: u64,
    pub unique_runs: u64,
    /// Duplicate blocks in runs of at least 8 blocks.
    pub dup_blocks_in_runs_ge8: u64,
    /// Duplicate blocks whose source lies in the last 25 % of the history.
    pub dup_blocks_recent25: u64,
}

#[derive(Clone, Copy, Debug)]
enum Run {
    Unique,
    Dup { src: usize },
}

/// The trace: an iterator of `(block number, 4 KiB of data)` writes; the
/// byte offset is `block × BLOCK_SIZE`.
#[derive(Clone, Debug)]
pub struct PrimaryTrace {
    cfg: PrimaryConfig,
    rng: Rng,
    runs: LongTail,
    /// Content id of every block written, in write order.
    history: Vec<u64>,
    next_content: u64,
    emitted: u64,
    run: Run,
    run_left: u64,
    next_block: u64,
    stats: PrimaryStats,
}

impl PrimaryTrace {
    pub fn new(cfg: PrimaryConfig) -> PrimaryTrace {
        let rng = Rng::derive(cfg.seed, &[0x9e]);
        let runs = LongTail::Pareto {
            xm: 1.0,
            alpha: cfg.run_alpha,
            min: 1,
            max: cfg.max_run.max(1),
        };
        PrimaryTrace {
            history: Vec::with_capacity(cfg.writes.min(1 << 24) as usize),
            cfg,
            rng,
            runs,
            next_content: 0,
            emitted: 0,
            run: Run::Unique,
            run_left: 0,
            next_block: 0,
            stats: PrimaryStats::default(),
        }
    }

    pub fn config(&self) -> &PrimaryConfig {
        &self.cfg
    }

    /// What has been generated so far.
    pub fn stats(&self) -> PrimaryStats {
        self.stats
    }

    /// The content of content id `id` (for checking and replay tools).
    pub fn block_data(&self, id: u64) -> Vec<u8> {
        ContentGen::new(derive_seed(self.cfg.seed, &[0xb1, id]), self.cfg.mix).bytes(BLOCK_SIZE)
    }

    /// The next write as (block number, content id), without the data.
    pub fn next_id(&mut self) -> Option<(u64, u64)> {
        if self.emitted >= self.cfg.writes {
            return None;
        }
        if self.run_left == 0 {
            self.start_run();
        }
        let id = match &mut self.run {
            Run::Unique => {
                self.next_content += 1;
                self.next_content - 1
            }
            Run::Dup { src } => {
                let id = self.history[*src];
                *src += 1;
                id
            }
        };
        let block = self.next_block;
        self.next_block = (self.next_block + 1) % self.cfg.volume_blocks;
        self.run_left -= 1;
        self.emitted += 1;
        self.stats.writes += 1;
        self.history.push(id);
        Some((block, id))
    }

    fn start_run(&mut self) {
        let len = self
            .runs
            .sample(&mut self.rng)
            .min(self.cfg.writes - self.emitted)
            .max(1);
        let h = self.history.len();
        let mut run = Run::Unique;
        if h > 0 && self.rng.chance(self.cfg.dup_fraction) {
            let len = len.min(h as u64) as usize;
            let start = if self.rng.chance(self.cfg.recent_fraction) {
                let window = ((h as f64 * self.cfg.recent_window) as usize).max(len);
                h - len - self.rng.below((window - len + 1) as u64) as usize
            } else {
                self.rng.below((h - len + 1) as u64) as usize
            };
            run = Run::Dup { src: start };
            self.run_left = len as u64;
            self.stats.dup_runs += 1;
            self.stats.dup_blocks += len as u64;
            if len >= 8 {
                self.stats.dup_blocks_in_runs_ge8 += len as u64;
            }
            let recent_from = h - h / 4;
            self.stats.dup_blocks_recent25 +=
                (start + len).saturating_sub(start.max(recent_from)) as u64;
        } else {
            self.run_left = len;
            self.stats.unique_runs += 1;
        }
        self.run = run;
        let vb = self.cfg.volume_blocks;
        if !self.rng.chance(self.cfg.sequential) || self.emitted == 0 {
            self.next_block = self.rng.below(vb);
        }
        if self.next_block + self.run_left > vb {
            self.next_block = vb.saturating_sub(self.run_left);
        }
    }
}

impl Iterator for PrimaryTrace {
    type Item = (u64, Vec<u8>);

    fn next(&mut self) -> Option<(u64, Vec<u8>)> {
        let (block, id) = self.next_id()?;
        Some((block, self.block_data(id)))
    }
}

/// Writes the header and all writes of `trace` to `w`; returns the number
/// of records.
pub fn write_trace<W: Write>(w: &mut W, trace: PrimaryTrace) -> io::Result<u64> {
    let cfg = trace.config().clone();
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT.to_le_bytes());
    h.extend_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
    h.extend_from_slice(&cfg.volume_blocks.to_le_bytes());
    h.extend_from_slice(&cfg.writes.to_le_bytes());
    h.extend_from_slice(&cfg.seed.to_le_bytes());
    w.write_all(&h)?;
    let mut n = 0;
    for (block, data) in trace {
        w.write_all(&block.to_le_bytes())?;
        w.write_all(&data)?;
        n += 1;
    }
    w.flush()?;
    Ok(n)
}

/// The header of a stored trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimaryHeader {
    pub block_size: u32,
    pub volume_blocks: u64,
    pub records: u64,
    pub seed: u64,
}

/// Reads a trace written by [`write_trace`]: an iterator of
/// `io::Result<(block number, data)>`.
pub struct PrimaryTraceReader<R: Read> {
    r: R,
    header: PrimaryHeader,
    read: u64,
}

impl<R: Read> PrimaryTraceReader<R> {
    pub fn new(mut r: R) -> io::Result<PrimaryTraceReader<R>> {
        let mut h = [0u8; HEADER_LEN];
        r.read_exact(&mut h)?;
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if &h[0..8] != MAGIC {
            return Err(bad("not a strata primary trace (bad magic)"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        if u32_at(8) != FORMAT {
            return Err(bad("unsupported primary trace format version"));
        }
        let header = PrimaryHeader {
            block_size: u32_at(12),
            volume_blocks: u64_at(16),
            records: u64_at(24),
            seed: u64_at(32),
        };
        if header.block_size == 0 || header.block_size > 1 << 20 {
            return Err(bad("implausible block size"));
        }
        Ok(PrimaryTraceReader { r, header, read: 0 })
    }

    pub fn header(&self) -> PrimaryHeader {
        self.header
    }
}

impl<R: Read> Iterator for PrimaryTraceReader<R> {
    type Item = io::Result<(u64, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.read >= self.header.records {
            return None;
        }
        self.read += 1;
        let mut b = [0u8; 8];
        let mut data = vec![0u8; self.header.block_size as usize];
        Some(
            self.r
                .read_exact(&mut b)
                .and_then(|_| self.r.read_exact(&mut data))
                .map(|_| (u64::from_le_bytes(b), data)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn deterministic() {
        let cfg = PrimaryConfig::new(1, 64 << 20, 500);
        let a: Vec<_> = PrimaryTrace::new(cfg.clone()).collect();
        let b: Vec<_> = PrimaryTrace::new(cfg.clone()).collect();
        let c: Vec<_> = PrimaryTrace::new(PrimaryConfig { seed: 2, ..cfg }).collect();
        assert_eq!(a.len(), 500);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn locality_statistics() {
        let n = 100_000;
        let mut t = PrimaryTrace::new(PrimaryConfig::new(3, 1 << 30, n));
        let mut ids = Vec::with_capacity(n as usize);
        let mut blocks = Vec::with_capacity(n as usize);
        while let Some((b, id)) = t.next_id() {
            assert!(b < t.config().volume_blocks);
            ids.push(id);
            blocks.push(b);
        }
        let s = t.stats();
        assert_eq!(s.writes, n);
        // Duplicate fraction by content: blocks whose content was written before.
        let mut seen = std::collections::HashSet::new();
        let dups = ids.iter().filter(|id| !seen.insert(**id)).count() as f64 / n as f64;
        assert!((0.18..0.30).contains(&dups), "dup fraction {dups:.3}");
        // Spatial: about half of the duplicate blocks are in runs ≥ 8 (threshold 8 keeps ≈ 54 %).
        let ge8 = s.dup_blocks_in_runs_ge8 as f64 / s.dup_blocks as f64;
        assert!(
            (0.35..0.75).contains(&ge8),
            "{ge8:.2} of dup blocks in runs ≥ 8"
        );
        // Sequentiality: most writes follow the previous block.
        let seq = blocks.windows(2).filter(|w| w[1] == w[0] + 1).count() as f64 / n as f64;
        assert!(seq > 0.7, "sequential {seq:.2}");
        // Temporal: most duplicates come from the last quarter of the history.
        let recent = s.dup_blocks_recent25 as f64 / s.dup_blocks as f64;
        assert!(recent > 0.8, "recent {recent:.2}");
        // An LRU-free check of the same: distance to the previous write of the content.
        let mut last: HashMap<u64, usize> = HashMap::new();
        let mut near = 0;
        let mut total = 0;
        for (i, id) in ids.iter().enumerate() {
            if let Some(&j) = last.get(id) {
                total += 1;
                if i - j <= i / 4 + 256 {
                    near += 1;
                }
            }
            last.insert(*id, i);
        }
        assert!(near as f64 / total as f64 > 0.8);
    }

    #[test]
    fn data_duplicates_match_ids_and_roundtrip() {
        let cfg = PrimaryConfig::new(9, 16 << 20, 2000);
        let mut ids = Vec::new();
        let mut t = PrimaryTrace::new(cfg.clone());
        while let Some((_, id)) = t.next_id() {
            ids.push(id);
        }
        let writes: Vec<_> = PrimaryTrace::new(cfg.clone()).collect();
        let mut by_data: HashMap<&[u8], u64> = HashMap::new();
        for ((_, d), id) in writes.iter().zip(&ids) {
            assert_eq!(d.len(), BLOCK_SIZE);
            assert_eq!(
                *by_data.entry(d.as_slice()).or_insert(*id),
                *id,
                "same data ⇔ same id"
            );
        }
        let mut buf = Vec::new();
        assert_eq!(
            write_trace(&mut buf, PrimaryTrace::new(cfg.clone())).unwrap(),
            2000
        );
        assert_eq!(buf.len(), HEADER_LEN + 2000 * (8 + BLOCK_SIZE));
        let r = PrimaryTraceReader::new(&buf[..]).unwrap();
        assert_eq!(r.header().records, 2000);
        assert_eq!(r.header().volume_blocks, 4096);
        let back: Vec<_> = r.map(|x| x.unwrap()).collect();
        assert_eq!(back, writes);
        assert!(PrimaryTraceReader::new(&b"garbage-garbage-garbage-garbage-garbage-"[..]).is_err());
    }
}
