//! Daily snapshots of a fleet of VM disk images (Parallel, low-cost VM
//! snapshot deduplication with batch scheduling — Alibaba Aliyun study,
//! §3–§5).
//!
//! From the paper: VM snapshots are backed up **daily**; the system keeps
//! **10 snapshots** per VM (§5). "Each VM has about **40 GB** of storage
//! data usage on average including OS and user data disk" and "each VM
//! image is divided into **2 MB fix-sized segments**" with per-segment
//! **dirty bits** (§3, §5). "Level 1 segment dirty bits identify 78 % of
//! duplicate blocks", block dedup inside dirty segments removes another
//! 74.5 %, 94.4 % in total; "the average number of **consecutive dirty
//! segments is 2.92**" (§5). VM sizes have "a **very long tail**
//! distribution": "the smallest group of 100 VMs has an average size of
//! 15 GB, while the largest has an average size of over 700 GB" (§4). Many
//! duplicates come from "common software packages and operating systems"
//! shared between VMs (§2).
//!
//! Here each series is one VM whose directory holds one raw, sparse disk
//! image, [`IMAGE_NAME`]; each version is one day. The image is an OS
//! region (10 GB × scale, **identical in every VM**: one base derived from
//! the seed — or the files under `base`, e.g. a real image — except for a
//! few per-VM customised blocks) followed by a per-VM data region
//! (lognormal, median 16 GB × scale, σ = 1.1, at most 700 GB × scale: mean
//! VM ≈ 40 GB × scale with a long tail). Data segments are free (20 %,
//! left as holes), copies of a shared package pool (10 %, popular packages
//! more often) or unique (70 %). Every day 3 % of the segments (runs with a
//! geometric length of mean 2.92) become dirty; a dirty segment gets runs
//! of 4 KiB block writes covering ≈ 25 % of it (lognormal): 55 % new
//! unique data, 20 % blocks of that day's update (identical in every VM
//! that writes them), 15 % blocks copied from the OS base, 10 % zeros
//! (freed, punched as holes). Defaults: 8 VMs (`streams`), 10 versions
//! (days). The shares, the OS size and the write model are our choices;
//! the segment size, run length, 40 GB mean and long tail are the paper's.

use super::content::{ContentGen, Mix};
use super::fsutil::{prepare_dir, set_mtime, sim_time, versions_to_apply, BaseData};
use super::rng::{derive_seed, mix64, LongTail, Rng};
use super::workload::{no_preset, GenOptions, Workload};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The image file in each VM's directory.
pub const IMAGE_NAME: &str = "disk.img";
/// Segment size (§3, §5: 2 MB segments with dirty bits).
pub const SEGMENT: u64 = 2 << 20;
/// Block size of the writes inside dirty segments.
pub const BLOCK: u64 = strata_core::BLOCK_SIZE as u64;
/// Default fleet size.
pub const DEFAULT_VMS: usize = 8;
/// Default versions: the 10 daily snapshots kept per VM (§5).
pub const DEFAULT_DAYS: usize = 10;
/// Default fraction of segments dirtied per day.
pub const DIRTY_RATE: f64 = 0.03;
/// Mean run of consecutive dirty segments (§5: 2.92).
pub const DIRTY_RUN: f64 = 2.92;
/// OS region at scale 1.
pub const OS_BYTES: f64 = 10e9;
/// Per-VM data region at scale 1 (lognormal median, σ, max).
pub const DATA_MEDIAN: f64 = 16e9;
pub const DATA_SIGMA: f64 = 1.1;
pub const DATA_MAX: f64 = 700e9;

const BLOCKS_PER_SEG: u64 = SEGMENT / BLOCK;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Os(u64),
    Pool(u64),
    Unique(u64, u64),
    Update(u64, u64),
}

struct Vm {
    segments: u64,
    done: usize,
}

/// The `vmfleet` workload (see the module docs).
pub struct VmFleet {
    seed: u64,
    scale: f64,
    versions: usize,
    dirty_rate: f64,
    os_segments: u64,
    pool_segments: u64,
    update_blocks: u64,
    data_segments: Vec<u64>,
    base: Option<PathBuf>,
    base_data: Option<BaseData>,
    vms: Vec<Option<Vm>>,
    cache: Option<(Source, Vec<u8>)>,
}

fn segs(bytes: f64) -> u64 {
    ((bytes / SEGMENT as f64).ceil() as u64).max(1)
}

impl VmFleet {
    pub fn new(opts: &GenOptions) -> anyhow::Result<VmFleet> {
        no_preset("vmfleet", opts)?;
        let n = opts.streams.unwrap_or(DEFAULT_VMS);
        let s = opts.scale;
        let base_data = match &opts.base {
            Some(b) => Some(BaseData::open(b)?),
            None => None,
        };
        let os_segments = match &base_data {
            Some(b) => segs(b.len() as f64),
            None => segs(OS_BYTES * s),
        };
        let mut rng = Rng::derive(opts.seed, &[0x7f, 0]);
        let dist = LongTail::LogNormal {
            median: DATA_MEDIAN * s,
            sigma: DATA_SIGMA,
            min: SEGMENT,
            max: (DATA_MAX * s) as u64,
        };
        let data_segments = (0..n).map(|_| segs(dist.sample(&mut rng) as f64)).collect();
        Ok(VmFleet {
            seed: opts.seed,
            scale: s,
            versions: opts.versions.unwrap_or(DEFAULT_DAYS),
            dirty_rate: DIRTY_RATE,
            os_segments,
            pool_segments: segs(2e9 * s).max(8),
            update_blocks: (segs(256e6 * s) * BLOCKS_PER_SEG).max(64),
            data_segments,
            base: opts.base.clone(),
            base_data,
            vms: (0..n).map(|_| None).collect(),
            cache: None,
        })
    }

    /// Overrides the 3 % daily dirty-segment rate.
    pub fn with_dirty_rate(mut self, rate: f64) -> VmFleet {
        self.dirty_rate = rate.clamp(0.0, 1.0);
        self
    }

    /// Image size in bytes of every VM.
    pub fn vm_sizes(&self) -> Vec<u64> {
        self.data_segments
            .iter()
            .map(|d| (self.os_segments + d) * SEGMENT)
            .collect()
    }

    /// Whether OS segment `k` is free space (identical in all VMs).
    fn os_free(&self, k: u64) -> bool {
        self.base_data.is_none() && mix64(derive_seed(self.seed, &[0x05, k])) % 100 < 30
    }

    /// Fills `buf` (one segment) with the content of `src`.
    fn segment(&mut self, src: Source, buf: &mut [u8]) -> io::Result<()> {
        if let Some((s, data)) = &self.cache {
            if *s == src {
                buf.copy_from_slice(data);
                return Ok(());
            }
        }
        match src {
            Source::Os(k) => match &mut self.base_data {
                Some(b) => b.read_at(k * SEGMENT, buf)?,
                None => ContentGen::new(derive_seed(self.seed, &[0x05, k]), Mix::DISK).fill(buf),
            },
            Source::Pool(j) => {
                ContentGen::new(derive_seed(self.seed, &[0x9a, j]), Mix::DISK).fill(buf)
            }
            Source::Unique(vm, k) => {
                ContentGen::new(derive_seed(self.seed, &[0x0e, vm, k]), Mix::DISK).fill(buf)
            }
            Source::Update(day, j) => {
                ContentGen::new(derive_seed(self.seed, &[0xda, day, j]), Mix::DISK).fill(buf)
            }
        }
        self.cache = Some((src, buf.to_vec()));
        Ok(())
    }

    /// Writes version 0 of VM `vm`: OS region, then data region.
    fn install(&mut self, vm: usize, path: &Path) -> io::Result<Vm> {
        let total = self.os_segments + self.data_segments[vm];
        let f = File::create(path)?;
        f.set_len(total * SEGMENT)?;
        let mut rng = Rng::derive(self.seed, &[0x7f, 1, vm as u64]);
        let mut buf = vec![0u8; SEGMENT as usize];
        for k in 0..total {
            let src = if k < self.os_segments {
                if self.os_free(k) {
                    None
                } else {
                    Some(Source::Os(k))
                }
            } else {
                let r = rng.f64();
                if r < 0.20 {
                    None
                } else if r < 0.30 {
                    // Popular packages are installed more often.
                    let u = rng.f64();
                    Some(Source::Pool((u * u * self.pool_segments as f64) as u64))
                } else {
                    Some(Source::Unique(vm as u64, k))
                }
            };
            let Some(src) = src else { continue };
            self.segment(src, &mut buf)?;
            if k < self.os_segments && rng.chance(0.03) {
                // Per-VM customisation of the OS (configuration, logs).
                let mut g = ContentGen::new(rng.next_u64(), Mix::TEXT);
                for _ in 0..1 + rng.below(8) {
                    let b = rng.below(BLOCKS_PER_SEG) as usize * BLOCK as usize;
                    g.fill(&mut buf[b..b + BLOCK as usize]);
                }
            }
            if buf.iter().all(|&x| x == 0) {
                continue;
            }
            f.write_all_at(&buf, k * SEGMENT)?;
        }
        Ok(Vm {
            segments: total,
            done: 0,
        })
    }

    /// One day: dirty segments in runs, each with runs of block writes.
    fn day(&mut self, vm: usize, st: &Vm, day: u64, path: &Path) -> io::Result<DayStats> {
        let f = OpenOptions::new().write(true).open(path)?;
        let mut rng = Rng::derive(self.seed, &[0x7f, 2, vm as u64, day]);
        let mut stats = DayStats::default();
        let target = rng.round_random(self.dirty_rate * st.segments as f64);
        let mut dirty = vec![false; st.segments as usize];
        let mut count = 0;
        let mut guard = 0;
        while count < target && guard < 100 * (target + 1) {
            guard += 1;
            let run = rng.geometric(DIRTY_RUN).min(target - count);
            let start = rng.below(st.segments);
            for k in start..(start + run).min(st.segments) {
                if !dirty[k as usize] {
                    dirty[k as usize] = true;
                    count += 1;
                }
            }
        }
        let mut src_buf = vec![0u8; SEGMENT as usize];
        let mut counter = 0u64;
        for k in 0..st.segments {
            if !dirty[k as usize] {
                continue;
            }
            stats.dirty_segments += 1;
            let cover = (rng
                .lognormal(0.25, 0.8)
                .clamp(1.0 / BLOCKS_PER_SEG as f64, 1.0)
                * BLOCKS_PER_SEG as f64) as u64;
            let mut written = 0;
            while written < cover {
                let len = rng.geometric(8.0).min(cover - written).min(BLOCKS_PER_SEG);
                let at = rng.below(BLOCKS_PER_SEG - len + 1);
                let off = k * SEGMENT + at * BLOCK;
                let bytes = (len * BLOCK) as usize;
                let r = rng.f64();
                if r < 0.10 {
                    punch_or_zero(&f, off, bytes as u64)?;
                    stats.zero_blocks += len;
                } else {
                    let (src, from) = if r < 0.65 {
                        // New data: generated for this write only.
                        counter += 1;
                        stats.unique_blocks += len;
                        let seed = derive_seed(self.seed, &[0xd1, vm as u64, day, counter]);
                        ContentGen::new(seed, Mix::DISK).fill(&mut src_buf[..bytes]);
                        f.write_all_at(&src_buf[..bytes], off)?;
                        written += len;
                        continue;
                    } else if r < 0.85 {
                        let nseg = self.update_blocks.div_ceil(BLOCKS_PER_SEG);
                        let j = rng.below(self.update_blocks - len.min(self.update_blocks));
                        stats.update_blocks += len;
                        let seg = (j / BLOCKS_PER_SEG).min(nseg - 1);
                        (
                            Source::Update(day, seg),
                            (j % BLOCKS_PER_SEG).min(BLOCKS_PER_SEG - len),
                        )
                    } else {
                        stats.os_copy_blocks += len;
                        let mut s = rng.below(self.os_segments);
                        for _ in 0..8 {
                            if !self.os_free(s) {
                                break;
                            }
                            s = rng.below(self.os_segments);
                        }
                        (Source::Os(s), rng.below(BLOCKS_PER_SEG - len + 1))
                    };
                    self.segment(src, &mut src_buf)?;
                    let b = (from * BLOCK) as usize;
                    f.write_all_at(&src_buf[b..b + bytes], off)?;
                }
                written += len;
            }
        }
        Ok(stats)
    }
}

/// What one simulated day wrote into one VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DayStats {
    pub dirty_segments: u64,
    pub unique_blocks: u64,
    pub update_blocks: u64,
    pub os_copy_blocks: u64,
    pub zero_blocks: u64,
}

/// Frees a range (a hole in a sparse file); writes zeros where punching
/// holes is not supported.
fn punch_or_zero(f: &File, off: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on an open descriptor with valid arguments.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    f.write_all_at(&vec![0u8; len as usize], off)
}

impl Workload for VmFleet {
    fn describe(&self) -> String {
        let sizes = self.vm_sizes();
        let total: u64 = sizes.iter().sum();
        let os = match &self.base {
            Some(b) => format!("OS base from {}", b.display()),
            None => format!(
                "OS base {:.0} MB",
                (self.os_segments * SEGMENT) as f64 / 1e6
            ),
        };
        format!(
            "vmfleet (Parallel VM snapshot dedup §3–§5): {} VMs, {:.1} GB of images (largest {:.1} GB), scale {}, {os}; \
             {} daily versions, {:.1}% of 2 MiB segments dirty per day in runs of {DIRTY_RUN}; seed {}",
            sizes.len(),
            total as f64 / 1e9,
            sizes.iter().max().copied().unwrap_or(0) as f64 / 1e9,
            self.scale,
            self.versions,
            self.dirty_rate * 100.0,
            self.seed
        )
    }

    fn series(&self) -> Vec<String> {
        (0..self.vms.len()).map(|i| format!("vm-{i:03}")).collect()
    }

    fn versions(&self) -> usize {
        self.versions
    }

    fn advance(&mut self, series: usize, version: usize, dir: &Path) -> io::Result<()> {
        if series >= self.vms.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no VM {series}"),
            ));
        }
        let path = dir.join(IMAGE_NAME);
        let done = self.vms[series].as_ref().map_or(0, |v| v.done);
        for v in versions_to_apply(done, version, self.versions)? {
            if v == 0 {
                prepare_dir(dir)?;
                let vm = self.install(series, &path)?;
                self.vms[series] = Some(vm);
            } else {
                let st = self.vms[series].take().unwrap();
                let r = self.day(series, &st, v as u64, &path);
                self.vms[series] = Some(st);
                r?;
            }
            self.vms[series].as_mut().unwrap().done = v + 1;
            set_mtime(&path, sim_time(v as u64, 3 * 3600))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::tree_digest;

    fn opts(scale: f64, seed: u64, vms: usize, days: usize) -> GenOptions {
        GenOptions {
            seed,
            scale,
            versions: Some(days),
            streams: Some(vms),
            ..Default::default()
        }
    }

    fn segments_of(path: &Path) -> Vec<[u8; 32]> {
        std::fs::read(path)
            .unwrap()
            .chunks(SEGMENT as usize)
            .map(|c| *blake3::hash(c).as_bytes())
            .collect()
    }

    #[test]
    fn sizes_are_long_tailed_around_40gb() {
        let w = VmFleet::new(&opts(1.0, 1, 400, 1)).unwrap();
        let mut s: Vec<f64> = w.vm_sizes().iter().map(|&b| b as f64 / 1e9).collect();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let mean = s.iter().sum::<f64>() / s.len() as f64;
        let median = s[s.len() / 2];
        assert!((30.0..50.0).contains(&mean), "mean {mean:.1} GB");
        assert!(
            s[s.len() - 1] > 5.0 * median,
            "max {:.0} median {median:.0}",
            s[s.len() - 1]
        );
        let w = VmFleet::new(&GenOptions::default()).unwrap();
        assert_eq!(w.series().len(), DEFAULT_VMS);
        assert_eq!(w.versions(), DEFAULT_DAYS);
    }

    #[test]
    fn shared_os_base_sparse_images_and_dirty_segments() {
        let t = tempfile::tempdir().unwrap();
        let mut w = VmFleet::new(&opts(0.0008, 3, 2, 3))
            .unwrap()
            .with_dirty_rate(0.15);
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        w.advance(0, 0, &a).unwrap();
        w.advance(1, 0, &b).unwrap();
        let (ia, ib) = (a.join(IMAGE_NAME), b.join(IMAGE_NAME));
        let (sa, sb) = (segments_of(&ia), segments_of(&ib));
        let os = w.os_segments as usize;
        assert!(os >= 3);
        let same_os = (0..os).filter(|&k| sa[k] == sb[k]).count();
        assert!(same_os * 10 >= os * 8, "{same_os}/{os} OS segments shared");
        let data_a: std::collections::HashSet<_> = sa[os..].iter().collect();
        let zero = *blake3::hash(&vec![0u8; SEGMENT as usize]).as_bytes();
        let shared_data = sb[os..]
            .iter()
            .filter(|h| **h != zero && data_a.contains(h))
            .count();
        assert!(
            shared_data < sb.len() - os,
            "data regions are mostly per-VM"
        );
        // Free segments are holes.
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&ia).unwrap();
        if sa.contains(&zero) {
            assert!(m.blocks() * 512 < m.len(), "image is sparse");
        }
        // One day dirties about 15 % of the segments, in runs.
        let before = sa;
        w.advance(0, 1, &a).unwrap();
        let after = segments_of(&ia);
        let changed = before.iter().zip(&after).filter(|(x, y)| x != y).count();
        let frac = changed as f64 / before.len() as f64;
        assert!(
            (0.04..0.30).contains(&frac),
            "{changed}/{} segments changed",
            before.len()
        );
        assert_eq!(std::fs::metadata(&ia).unwrap().len(), m.len());
        // Determinism.
        let mut w2 = VmFleet::new(&opts(0.0008, 3, 2, 3))
            .unwrap()
            .with_dirty_rate(0.15);
        let c = t.path().join("c");
        w2.advance(0, 0, &c).unwrap();
        w2.advance(0, 1, &c).unwrap();
        assert_eq!(tree_digest(&a).unwrap(), tree_digest(&c).unwrap());
        let mut w3 = VmFleet::new(&opts(0.0008, 4, 2, 3)).unwrap();
        let d = t.path().join("d");
        w3.advance(0, 0, &d).unwrap();
        assert_ne!(tree_digest(&d).unwrap(), tree_digest(&c).unwrap());
    }

    #[test]
    fn daily_updates_are_shared_between_vms() {
        let mut w = VmFleet::new(&opts(0.0005, 5, 2, 2))
            .unwrap()
            .with_dirty_rate(0.5);
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        w.advance(0, 0, &a).unwrap();
        w.advance(1, 0, &b).unwrap();
        let sa = w.vms[0].take().unwrap();
        let st = w.day(0, &sa, 1, &a.join(IMAGE_NAME)).unwrap();
        assert!(st.dirty_segments > 0);
        let total = st.unique_blocks + st.update_blocks + st.os_copy_blocks + st.zero_blocks;
        assert!(
            st.unique_blocks * 3 > total && st.update_blocks > 0,
            "{st:?}"
        );
    }
}
