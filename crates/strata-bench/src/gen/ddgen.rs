//! Data Domain's synthetic load generator (Duggal et al., "Data Domain
//! Cloud Tier", USENIX ATC 2019, §8.2.1).
//!
//! From the paper: "A first generation backup is randomly generated, and
//! the following generations have **deletions, shuffles, and additions**.
//! We typically write **many streams in parallel, each stream consisting
//! of generations of backups beginning from a unique seed**. The **change
//! rate between two consecutive generations is 5 %**. Gen0 is the first
//! generation of backups where we only get **local compression (an
//! average of 2×)** and no deduplication." §8.2.2 uses backups that
//! "average **24 GB** each"; §8.2.3 uses **Gen42** as aged data and §8.2.4
//! up to 100 generations.
//!
//! Here each series is one stream: a directory holding one file,
//! [`FILE_NAME`], rewritten in full every generation (as a backup
//! application writes a new backup image). Defaults: 24 GB × `scale` per
//! generation, 43 generations (Gen0–Gen42), 1 stream (`streams` for more;
//! every stream has its own seed so streams do not share data).
//!
//! Our choices where the paper is silent: the 5 % change rate is split
//! equally between deletions, shuffles (a range moved elsewhere in the
//! stream) and additions of new content (so the size stays about constant);
//! edit ranges are lognormal (median 32 KiB, 512 B – 1 MiB) at uniformly
//! random, non-overlapping positions. Gen0 content is [`Mix::TYPICAL`]
//! (zstd-3 ≈ 2×), addressable in 64 KiB pages so any range of any earlier
//! content can be regenerated. `base` makes Gen0 the concatenation of the
//! real files under it (unscaled).

use super::content::{ContentGen, Mix};
use super::extents::{self, Extent};
use super::fsutil::{prepare_dir, set_mtime, sim_time, versions_to_apply, BaseData};
use super::rng::{derive_seed, LongTail, Rng};
use super::workload::{no_preset, GenOptions, Workload};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Backup size per generation at scale 1 (§8.2.2).
pub const GEN_BYTES: f64 = 24e9;
/// Default number of generations: Gen0–Gen42 (§8.2.3's aged data).
pub const DEFAULT_GENERATIONS: usize = 43;
/// Change rate between consecutive generations (§8.2.1).
pub const CHANGE_RATE: f64 = 0.05;
/// The file each stream's directory holds.
pub const FILE_NAME: &str = "backup.dat";

const PAGE: u64 = 64 * 1024;
const SRC_BASE: u64 = u64::MAX;
const EDIT: LongTail = LongTail::LogNormal {
    median: 32768.0,
    sigma: 1.0,
    min: 512,
    max: 1 << 20,
};

struct Stream {
    extents: Vec<Extent>,
    next_src: u64,
    done: usize,
    base: Option<BaseData>,
}

/// The `ddgen` workload (see the module docs).
pub struct DdGen {
    seed: u64,
    scale: f64,
    size: u64,
    versions: usize,
    change_rate: f64,
    base: Option<PathBuf>,
    streams: Vec<Option<Stream>>,
}

/// What one generation changed (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenChange {
    pub deleted: u64,
    pub moved: u64,
    pub added: u64,
}

impl DdGen {
    pub fn new(opts: &GenOptions) -> anyhow::Result<DdGen> {
        no_preset("ddgen", opts)?;
        let n = opts.streams.unwrap_or(1);
        Ok(DdGen {
            seed: opts.seed,
            scale: opts.scale,
            size: (GEN_BYTES * opts.scale).round().max(PAGE as f64) as u64,
            versions: opts.versions.unwrap_or(DEFAULT_GENERATIONS),
            change_rate: CHANGE_RATE,
            base: opts.base.clone(),
            streams: (0..n).map(|_| None).collect(),
        })
    }

    /// Overrides the 5 % change rate (for experiments).
    pub fn with_change_rate(mut self, rate: f64) -> DdGen {
        self.change_rate = rate.clamp(0.0, 1.0);
        self
    }

    fn stream_seed(&self, s: usize) -> u64 {
        derive_seed(self.seed, &[0xdd, s as u64])
    }

    fn gen0(&self) -> io::Result<Stream> {
        match &self.base {
            Some(b) => {
                let base = BaseData::open(b)?;
                Ok(Stream {
                    extents: vec![Extent {
                        src: SRC_BASE,
                        off: 0,
                        len: base.len(),
                    }],
                    next_src: 1,
                    done: 0,
                    base: Some(base),
                })
            }
            None => Ok(Stream {
                extents: vec![Extent {
                    src: 0,
                    off: 0,
                    len: self.size,
                }],
                next_src: 1,
                done: 0,
                base: None,
            }),
        }
    }

    /// Applies one generation of deletions, shuffles and additions.
    fn next_generation(&self, s: usize, st: &mut Stream, gen: usize) -> GenChange {
        let mut rng = Rng::derive(self.stream_seed(s), &[gen as u64]);
        let size = extents::total(&st.extents);
        let budget = (size as f64 * self.change_rate / 3.0) as u64;
        let lens = |rng: &mut Rng| {
            let mut v = Vec::new();
            let mut sum = 0;
            while sum < budget {
                let l = EDIT.sample(rng).min(budget - sum);
                v.push(l);
                sum += l;
            }
            v
        };
        let mut change = GenChange::default();
        // Deletions.
        let l = lens(&mut rng);
        let del = extents::random_ranges(&mut rng, size, &l);
        change.deleted = del.iter().map(|r| r.1).sum();
        let (rest, _) = extents::cut(&st.extents, &del);
        // Shuffles: cut ranges out and put them back elsewhere, in random order.
        let l = lens(&mut rng);
        let mv = extents::random_ranges(&mut rng, extents::total(&rest), &l);
        change.moved = mv.iter().map(|r| r.1).sum();
        let (rest, mut pieces) = extents::cut(&rest, &mv);
        rng.shuffle(&mut pieces);
        let pos = extents::random_positions(&mut rng, extents::total(&rest), pieces.len());
        let ins: Vec<(u64, Vec<Extent>)> = pos.into_iter().zip(pieces).collect();
        let rest = extents::insert(&rest, &ins);
        // Additions of new content.
        let add = lens(&mut rng);
        change.added = add.iter().sum();
        let pos = extents::random_positions(&mut rng, extents::total(&rest), add.len());
        let ins: Vec<(u64, Vec<Extent>)> = pos
            .into_iter()
            .zip(add)
            .map(|(p, l)| {
                let e = Extent {
                    src: st.next_src,
                    off: 0,
                    len: l,
                };
                st.next_src += 1;
                (p, vec![e])
            })
            .collect();
        st.extents = extents::insert(&rest, &ins);
        change
    }

    /// Writes the current generation of stream `s` to `w` (e.g. stdout).
    /// Returns the bytes written. The stream must have been advanced to at
    /// least version 0.
    pub fn write_current<W: Write>(&mut self, s: usize, w: &mut W) -> io::Result<u64> {
        let seed = self.stream_seed(s);
        let st = self
            .streams
            .get_mut(s)
            .and_then(|x| x.as_mut())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("stream {s} has no generation yet"),
                )
            })?;
        write_extents(seed, &st.extents, st.base.as_mut(), w)
    }

    /// Current size in bytes of stream `s` (0 before version 0).
    pub fn current_len(&self, s: usize) -> u64 {
        self.streams
            .get(s)
            .and_then(|x| x.as_ref())
            .map_or(0, |st| extents::total(&st.extents))
    }
}

/// Writes the bytes described by `ext`: source 0 and additions are
/// generated page by page, [`SRC_BASE`] is read from the base files.
fn write_extents<W: Write>(
    seed: u64,
    ext: &[Extent],
    mut base: Option<&mut BaseData>,
    w: &mut W,
) -> io::Result<u64> {
    let mut page = vec![0u8; PAGE as usize];
    let mut cached: Option<(u64, u64)> = None;
    let mut written = 0;
    for e in ext {
        if e.src == SRC_BASE {
            let base = base
                .as_deref_mut()
                .ok_or_else(|| io::Error::other("base data missing"))?;
            let mut off = e.off;
            let end = e.off + e.len;
            let mut buf = vec![0u8; (PAGE as usize).min(e.len as usize)];
            while off < end {
                let n = ((end - off) as usize).min(buf.len());
                base.read_at(off, &mut buf[..n])?;
                w.write_all(&buf[..n])?;
                off += n as u64;
            }
        } else {
            let mut off = e.off;
            let end = e.off + e.len;
            while off < end {
                let p = off / PAGE;
                if cached != Some((e.src, p)) {
                    ContentGen::new(derive_seed(seed, &[e.src, p]), Mix::TYPICAL).fill(&mut page);
                    cached = Some((e.src, p));
                }
                let within = (off - p * PAGE) as usize;
                let n = ((end - off) as usize).min(PAGE as usize - within);
                w.write_all(&page[within..within + n])?;
                off += n as u64;
            }
        }
        written += e.len;
    }
    Ok(written)
}

impl Workload for DdGen {
    fn describe(&self) -> String {
        let size = match &self.base {
            Some(b) => format!("gen0 = files under {}", b.display()),
            None => format!(
                "{:.1} MB per generation (24 GB × scale {})",
                self.size as f64 / 1e6,
                self.scale
            ),
        };
        format!(
            "ddgen (Data Domain §8.2.1): {} stream(s), {size}, {} generations, {:.0}% change rate \
             (deletions, shuffles, additions); seed {}",
            self.streams.len(),
            self.versions,
            self.change_rate * 100.0,
            self.seed
        )
    }

    fn series(&self) -> Vec<String> {
        (0..self.streams.len())
            .map(|i| format!("stream-{i:02}"))
            .collect()
    }

    fn versions(&self) -> usize {
        self.versions
    }

    fn advance(&mut self, series: usize, version: usize, dir: &Path) -> io::Result<()> {
        if series >= self.streams.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no stream {series}"),
            ));
        }
        let done = self.streams[series].as_ref().map_or(0, |s| s.done);
        for v in versions_to_apply(done, version, self.versions)? {
            if v == 0 {
                prepare_dir(dir)?;
                self.streams[series] = Some(self.gen0()?);
            } else {
                let mut st = self.streams[series].take().unwrap();
                self.next_generation(series, &mut st, v);
                self.streams[series] = Some(st);
            }
            self.streams[series].as_mut().unwrap().done = v + 1;
        }
        // Write the requested generation (intermediate ones need not be).
        let path = dir.join(FILE_NAME);
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        self.write_current(series, &mut w)?;
        w.flush()?;
        drop(w);
        set_mtime(&path, sim_time(version as u64, 3600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::tests_util::cdc_new_fraction;
    use crate::gen::tree_digest;

    fn opts(scale: f64, seed: u64) -> GenOptions {
        GenOptions {
            seed,
            scale,
            versions: Some(4),
            ..Default::default()
        }
    }

    #[test]
    fn deterministic_and_sized() {
        let t = tempfile::tempdir().unwrap();
        let run = |seed, name: &str| {
            let mut w = DdGen::new(&opts(0.0002, seed)).unwrap();
            let d = t.path().join(name);
            let mut out = Vec::new();
            for v in 0..3 {
                w.advance(0, v, &d).unwrap();
                out.push(tree_digest(&d).unwrap());
            }
            let len = std::fs::metadata(d.join(FILE_NAME)).unwrap().len();
            (out, len)
        };
        let (a, len) = run(1, "a");
        let (b, _) = run(1, "b");
        let (c, _) = run(2, "c");
        assert_eq!(a, b);
        assert_ne!(a, c);
        let want = 24e9 * 0.0002;
        assert!((len as f64 - want).abs() < 0.02 * want, "{len}");
    }

    #[test]
    fn gen0_compresses_2x_and_generations_change_5_percent() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        let mut w = DdGen::new(&opts(0.0003, 7)).unwrap();
        w.advance(0, 0, &d).unwrap();
        let g0 = std::fs::read(d.join(FILE_NAME)).unwrap();
        let z = zstd::bulk::compress(&g0, 3).unwrap();
        let ratio = g0.len() as f64 / z.len() as f64;
        assert!((1.6..3.0).contains(&ratio), "gen0 ratio {ratio:.2}");
        let mut prev = g0;
        for v in 1..3 {
            w.advance(0, v, &d).unwrap();
            let cur = std::fs::read(d.join(FILE_NAME)).unwrap();
            // Only the additions (1/3 of 5 %) are new content, plus the
            // chunks cut by the edits' boundaries.
            let new = cdc_new_fraction(&prev, &cur);
            eprintln!("ddgen gen {v}: {new:.4} new");
            assert!((0.01..0.10).contains(&new), "gen {v}: {new:.3} new");
            let size_change = (cur.len() as f64 - prev.len() as f64).abs() / prev.len() as f64;
            assert!(size_change < 0.01);
            prev = cur;
        }
    }

    #[test]
    fn streams_do_not_share_data() {
        let t = tempfile::tempdir().unwrap();
        let mut o = opts(0.0001, 1);
        o.streams = Some(2);
        let mut w = DdGen::new(&o).unwrap();
        assert_eq!(w.series(), vec!["stream-00", "stream-01"]);
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        w.advance(0, 0, &a).unwrap();
        w.advance(1, 0, &b).unwrap();
        let (x, y) = (
            std::fs::read(a.join(FILE_NAME)).unwrap(),
            std::fs::read(b.join(FILE_NAME)).unwrap(),
        );
        assert!(cdc_new_fraction(&x, &y) > 0.95);
    }

    #[test]
    fn base_files_become_gen0() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let data = ContentGen::new(3, Mix::TEXT).bytes(300_000);
        std::fs::write(src.join("a"), &data[..100_000]).unwrap();
        std::fs::write(src.join("b"), &data[100_000..]).unwrap();
        let mut o = opts(0.0001, 1);
        o.base = Some(src);
        let mut w = DdGen::new(&o).unwrap();
        let d = t.path().join("d");
        w.advance(0, 0, &d).unwrap();
        assert_eq!(std::fs::read(d.join(FILE_NAME)).unwrap(), data);
        let ch = {
            let mut st = w.streams[0].take().unwrap();
            let c = w.next_generation(0, &mut st, 1);
            w.streams[0] = Some(st);
            c
        };
        assert_eq!(ch.deleted, ch.added);
        assert_eq!(ch.deleted + ch.moved + ch.added, 15_000 / 3 * 3);
    }
}
