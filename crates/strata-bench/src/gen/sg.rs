//! RevDedup's synthetic backup series (Li et al., "RevDedup", ACM TOS 2014,
//! §4.1 and Table I), which extend Lillibridge et al.'s generator for
//! stress-testing fragmentation.
//!
//! From the paper: a series starts from a full backup of a system image
//! holding **1.1 GB of system files** (Ubuntu 12.04). On every simulated
//! weekday the generator "randomly walk\[s\] through the file system to pick
//! **α %** of files and modif\[ies\] **β %** of file contents, and further
//! add\[s\] **γ MB** of new files". **Five weekdays make one week**; a full
//! backup is taken at the start of every week. Table I:
//!
//! | preset | series | backups/series | α | β | γ |
//! |--------|--------|----------------|----|-----|------|
//! | SG1    | 1      | 78             | 2 %| 10 %| 10 MB|
//! | SG2    | 1      | 78             | 4 %| 10 %| 10 MB|
//! | SG3    | 1      | 78             | 2 %| 20 %| 10 MB|
//! | SG4    | 1      | 78             | 2 %| 10 %| 20 MB|
//! | SG5    | 1      | 78             |10 %| 10 %| 10 MB|
//! | GP     | 16     | 20 (320 total) | 2 %| 10 %| 10 MB|
//!
//! Here version 0 is the base tree, and each next version applies five
//! weekdays of changes to the previous one. Sizes are multiplied by
//! `scale` (base = 1.1 GB × scale, γ = γ MB × scale per day); `versions`
//! overrides the 78/20 backups and `streams` the number of series (1/16).
//!
//! Our choices where the paper is silent: the base is a tree of files
//! (not a disk image) in nested directories, with a lognormal file-size
//! distribution per file kind (text/config, source, binaries, compressed
//! media; overall median ≈ 3 KiB, mean ≈ 30 KiB, capped at 64 MiB) and
//! lognormal directory popularity; content from [`super::content`] so the
//! base compresses about 2×. "Modify β % of contents" becomes 1–3 ranges
//! totalling β % of the file: in-place overwrites (70 %), inserts (15 %),
//! deletes (15 %). Files to modify are picked uniformly each day (so a file
//! can change twice in one week). The 16 GP series start from the *same*
//! base tree (one image cloned 16 times) and then diverge; each SG series
//! and each GP series draws its changes from its own seed. New files go to
//! existing directories by popularity, 5 % of them into a new directory.
//! `base` replaces the generated base tree by a copy of real files
//! (unscaled); the daily changes then apply to those files.

use super::content::FileKind;
use super::fsutil::{copy_tree, prepare_dir, set_mtime, sim_time, versions_to_apply};
use super::image::{self, ImageLayout};
use super::rng::{LongTail, Rng};
use super::tree::{edit_bytes, name_stem, Tree};
use super::workload::{GenOptions, Workload};
use std::io;
use std::path::{Path, PathBuf};

/// One row of RevDedup's Table I.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgPreset {
    pub name: &'static str,
    /// Number of backup series.
    pub series: usize,
    /// Weekly full backups per series.
    pub versions: usize,
    /// Fraction of files modified per weekday (α).
    pub alpha: f64,
    /// Fraction of a modified file's content changed (β).
    pub beta: f64,
    /// MB (10^6 bytes) of new files per weekday at scale 1 (γ).
    pub gamma_mb: f64,
}

/// Table I of the RevDedup paper.
pub const PRESETS: [SgPreset; 6] = [
    SgPreset {
        name: "SG1",
        series: 1,
        versions: 78,
        alpha: 0.02,
        beta: 0.10,
        gamma_mb: 10.0,
    },
    SgPreset {
        name: "SG2",
        series: 1,
        versions: 78,
        alpha: 0.04,
        beta: 0.10,
        gamma_mb: 10.0,
    },
    SgPreset {
        name: "SG3",
        series: 1,
        versions: 78,
        alpha: 0.02,
        beta: 0.20,
        gamma_mb: 10.0,
    },
    SgPreset {
        name: "SG4",
        series: 1,
        versions: 78,
        alpha: 0.02,
        beta: 0.10,
        gamma_mb: 20.0,
    },
    SgPreset {
        name: "SG5",
        series: 1,
        versions: 78,
        alpha: 0.10,
        beta: 0.10,
        gamma_mb: 10.0,
    },
    SgPreset {
        name: "GP",
        series: 16,
        versions: 20,
        alpha: 0.02,
        beta: 0.10,
        gamma_mb: 10.0,
    },
];

/// Size of the base image's system files at scale 1 (§4.1: 1.1 GB).
pub const BASE_BYTES: f64 = 1.1e9;
/// Simulated weekdays per weekly backup.
pub const DAYS_PER_VERSION: usize = 5;

/// A preset by name (case-insensitive).
pub fn preset(name: &str) -> Option<SgPreset> {
    PRESETS
        .iter()
        .copied()
        .find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Share of files and file-size distribution of each kind in the base
/// tree. Medians/σ chosen to give a system-files-like tree: many small
/// configuration and script files, fewer large libraries and archives.
const KINDS: [(FileKind, f64, f64, f64); 4] = [
    // kind, share of files, median bytes, sigma
    (FileKind::Text, 0.42, 1800.0, 1.6),
    (FileKind::Source, 0.19, 5000.0, 1.5),
    (FileKind::Binary, 0.30, 9000.0, 2.0),
    (FileKind::Media, 0.09, 6000.0, 2.0),
];

const TOP_DIRS: [&str; 12] = [
    "bin",
    "boot",
    "etc",
    "lib",
    "opt",
    "sbin",
    "usr",
    "var",
    "usr/bin",
    "usr/lib",
    "usr/share",
    "var/lib",
];

#[derive(Clone, Debug)]
struct Config {
    preset: SgPreset,
    seed: u64,
    scale: f64,
    versions: usize,
    base: Option<PathBuf>,
    base_bytes: u64,
    gamma_bytes: u64,
    max_file: u64,
    image: bool,
}

struct Series {
    tree: Tree,
    done: usize,
    /// With `image`: where the tree's files live in the image.
    layout: Option<ImageLayout>,
}

/// The `sg` workload (see the module docs).
pub struct SgWorkload {
    cfg: Config,
    series: Vec<Option<Series>>,
}

impl SgWorkload {
    pub fn new(opts: &GenOptions) -> anyhow::Result<SgWorkload> {
        let name = opts.preset.as_deref().unwrap_or("SG1");
        let Some(preset) = preset(name) else {
            anyhow::bail!(
                "unknown sg preset {name:?}; known: {}",
                PRESETS
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let series = opts.streams.unwrap_or(preset.series);
        let base_bytes = (BASE_BYTES * opts.scale).round().max(1.0) as u64;
        let cfg = Config {
            preset,
            seed: opts.seed,
            scale: opts.scale,
            versions: opts.versions.unwrap_or(preset.versions),
            base: opts.base.clone(),
            base_bytes,
            gamma_bytes: (preset.gamma_mb * 1e6 * opts.scale).round() as u64,
            max_file: (base_bytes / 8).clamp(64 << 10, 64 << 20),
            image: opts.image,
        };
        Ok(SgWorkload {
            cfg,
            series: (0..series).map(|_| None).collect(),
        })
    }

    /// The preset in use.
    pub fn preset(&self) -> SgPreset {
        self.cfg.preset
    }
}

fn pick_kind(rng: &mut Rng) -> FileKind {
    let w: Vec<f64> = KINDS.iter().map(|k| k.1).collect();
    KINDS[rng.choose_weighted(&w)].0
}

fn file_size(cfg: &Config, kind: FileKind, rng: &mut Rng) -> u64 {
    let (_, _, median, sigma) = KINDS.iter().copied().find(|k| k.0 == kind).unwrap();
    LongTail::LogNormal {
        median,
        sigma,
        min: 0,
        max: cfg.max_file,
    }
    .sample(rng)
}

fn new_file(
    cfg: &Config,
    tree: &mut Tree,
    root: &Path,
    dir: usize,
    rng: &mut Rng,
    day: u64,
    limit: u64,
) -> io::Result<u64> {
    let kind = pick_kind(rng);
    let size = file_size(cfg, kind, rng).min(limit);
    let stem = name_stem(rng);
    let ext = *rng.choose(kind.extensions()).unwrap();
    let seed = rng.next_u64();
    let tick = rng.below(86_400);
    tree.create_file(root, dir, &stem, ext, kind, size, seed, sim_time(day, tick))?;
    Ok(size)
}

/// Generates the base tree: directories first (a random recursive tree
/// under a few system top-level directories), then files placed by
/// directory popularity until the byte target is reached.
fn build_base(cfg: &Config, root: &Path) -> io::Result<Tree> {
    if let Some(b) = &cfg.base {
        copy_tree(b, root)?;
        return Tree::scan(root);
    }
    // The same base for every series (GP clones one image 16 times).
    let mut rng = Rng::derive(cfg.seed, &[0x5b, 0]);
    let mut tree = Tree::new();
    tree.dir_weight[0] = 0.2;
    let mean_file: f64 = KINDS
        .iter()
        .map(|k| k.1 * k.2 * (k.3 * k.3 / 2.0).exp())
        .sum();
    let est_files = (cfg.base_bytes as f64 / mean_file).max(4.0);
    let ndirs = (est_files / 14.0).ceil() as usize;
    for top in TOP_DIRS {
        let (parent, name) = match top.split_once('/') {
            Some((p, n)) => (
                tree.dirs
                    .iter()
                    .position(|d| d == Path::new(p))
                    .unwrap_or(0),
                n,
            ),
            None => (0, top),
        };
        let w = rng.lognormal(1.0, 1.2);
        tree.add_dir(root, parent, name, w)?;
    }
    while tree.dirs.len() < ndirs + TOP_DIRS.len() + 1 {
        let parent = 1 + rng.below(tree.dirs.len() as u64 - 1) as usize;
        if tree.depth(parent) >= 7 {
            continue;
        }
        let w = rng.lognormal(1.0, 1.2);
        let name = name_stem(&mut rng);
        tree.add_dir(root, parent, &name, w)?;
    }
    // Cumulative popularity for fast weighted choice.
    let mut cum = Vec::with_capacity(tree.dirs.len());
    let mut acc = 0.0;
    for (i, w) in tree.dir_weight.iter().enumerate() {
        acc += if i == 0 { 0.0 } else { *w };
        cum.push(acc);
    }
    let mut total = 0u64;
    while total < cfg.base_bytes {
        let x = rng.f64() * acc;
        let dir = cum.partition_point(|&c| c <= x).min(tree.dirs.len() - 1);
        total += new_file(
            cfg,
            &mut tree,
            root,
            dir,
            &mut rng,
            0,
            cfg.base_bytes - total,
        )?;
    }
    Ok(tree)
}

/// One simulated weekday: modify β % of the content of α % of the files,
/// then add γ bytes of new files.
fn weekday(cfg: &Config, tree: &mut Tree, root: &Path, series: usize, day: u64) -> io::Result<()> {
    let mut rng = Rng::derive(cfg.seed, &[0x5b, 1 + series as u64, day]);
    let n = tree.files.len();
    let k = rng.round_random(cfg.preset.alpha * n as f64) as usize;
    for idx in rng.sample_distinct(n, k) {
        let tick = rng.below(86_400);
        edit_bytes(
            root,
            &mut tree.files[idx],
            cfg.preset.beta,
            &mut rng,
            sim_time(day, tick),
        )?;
    }
    let mut added = 0u64;
    while added < cfg.gamma_bytes {
        let dir = if rng.chance(0.05) || tree.dirs.len() == 1 {
            let parent = tree.pick_dir(&mut rng);
            let name = name_stem(&mut rng);
            let w = rng.lognormal(1.0, 1.2);
            tree.add_dir(root, parent, &name, w)?
        } else {
            tree.pick_dir(&mut rng)
        };
        added += new_file(cfg, tree, root, dir, &mut rng, day, cfg.gamma_bytes - added)?;
    }
    Ok(())
}

/// Calendar day of weekday `wd` (0..5) of version `v ≥ 1`.
fn calendar_day(v: usize, wd: usize) -> u64 {
    (7 * (v - 1) + 1 + wd) as u64
}

impl Workload for SgWorkload {
    fn describe(&self) -> String {
        let c = &self.cfg;
        let p = &c.preset;
        let base = match &c.base {
            Some(b) => format!("base copied from {}", b.display()),
            None => format!("base {:.1} MB", c.base_bytes as f64 / 1e6),
        };
        let image = if c.image {
            "; each version one disk image (files at 4 KiB-aligned offsets, stable allocation in path order)"
        } else {
            ""
        };
        format!(
            "sg {} (RevDedup §4.1): α={}% β={}% γ={} MB/day, scale {} → {base}, {:.2} MB new files/day; \
             {} series × {} versions of {} weekdays; seed {}{image}",
            p.name,
            p.alpha * 100.0,
            p.beta * 100.0,
            p.gamma_mb,
            c.scale,
            c.gamma_bytes as f64 / 1e6,
            self.series.len(),
            c.versions,
            DAYS_PER_VERSION,
            c.seed
        )
    }

    fn series(&self) -> Vec<String> {
        let n = self.series.len();
        let name = self.cfg.preset.name.to_ascii_lowercase();
        if n == 1 {
            vec![name]
        } else {
            (0..n).map(|i| format!("{name}-{i:02}")).collect()
        }
    }

    fn versions(&self) -> usize {
        self.cfg.versions
    }

    fn advance(&mut self, series: usize, version: usize, dir: &Path) -> io::Result<()> {
        let cfg = &self.cfg;
        let slot = self.series.get_mut(series).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no series {series}"))
        })?;
        let done = slot.as_ref().map_or(0, |s| s.done);
        // With `image` the tree lives beside `dir`, which holds the image.
        let root = if cfg.image {
            image::tree_dir(dir)
        } else {
            dir.to_path_buf()
        };
        for v in versions_to_apply(done, version, cfg.versions)? {
            if v == 0 {
                prepare_dir(dir)?;
                if cfg.image {
                    prepare_dir(&root)?;
                }
                *slot = Some(Series {
                    tree: build_base(cfg, &root)?,
                    done: 0,
                    layout: cfg.image.then(ImageLayout::new),
                });
            } else {
                let s = slot.as_mut().unwrap();
                for wd in 0..DAYS_PER_VERSION {
                    weekday(cfg, &mut s.tree, &root, series, calendar_day(v, wd))?;
                }
            }
            let s = slot.as_mut().unwrap();
            // Allocation depends on every version's tree, so update the
            // layout after each one even when several are applied at once.
            if let Some(l) = &mut s.layout {
                let files: Vec<(PathBuf, u64)> = s
                    .tree
                    .files
                    .iter()
                    .map(|f| (f.path.clone(), f.size))
                    .collect();
                l.update(&files);
            }
            s.done = v + 1;
        }
        if let Some(l) = slot.as_ref().and_then(|s| s.layout.as_ref()) {
            let img = dir.join(image::IMAGE_NAME);
            l.write_image(&root, &img)?;
            let day = if version == 0 {
                0
            } else {
                calendar_day(version, DAYS_PER_VERSION - 1)
            };
            set_mtime(&img, sim_time(day, 86_399))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::tree_digest;
    use std::collections::HashMap;

    fn opts(preset: &str, scale: f64, seed: u64, versions: usize) -> GenOptions {
        GenOptions {
            seed,
            scale,
            preset: Some(preset.into()),
            versions: Some(versions),
            base: None,
            streams: None,
            image: false,
        }
    }

    #[test]
    fn image_mode_is_deterministic_and_changes_locally() {
        let t = tempfile::tempdir().unwrap();
        let mut o = opts("SG5", 0.002, 5, 3);
        o.image = true;
        let gen = |name: &str| {
            let mut w = SgWorkload::new(&o).unwrap();
            let d = t.path().join(name);
            let mut digests = vec![];
            let mut blocks = vec![];
            for v in 0..3 {
                w.advance(0, v, &d).unwrap();
                // The series directory holds the image and nothing else.
                let entries: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
                assert_eq!(entries.len(), 1);
                digests.push(tree_digest(&d).unwrap());
                blocks.push(image::read_blocks(&d.join(image::IMAGE_NAME)).unwrap());
            }
            (digests, blocks, d)
        };
        let (a, blocks, d) = gen("a");
        let (b, _, _) = gen("b");
        assert_eq!(a, b, "same seed, same images");
        assert_ne!(a[0], a[1]);
        // The image is the files at their extents: version 0 is the files
        // back to back in path order, each from a 4 KiB boundary.
        let tree = image::tree_dir(&d);
        let (files, _) = crate::gen::fsutil::list_tree(&tree).unwrap();
        assert!(files.len() > 20);
        let img = std::fs::read(d.join(image::IMAGE_NAME)).unwrap();
        assert_eq!(img.len() % image::IMAGE_BLOCK as usize, 0);
        let mut rebuilt = image::ImageLayout::new();
        // Rebuild from the version-2 tree alone: different allocation, but
        // the same content per file.
        rebuilt.update(
            &files
                .iter()
                .map(|f| (f.clone(), std::fs::metadata(tree.join(f)).unwrap().len()))
                .collect::<Vec<_>>(),
        );
        let mut starts: Vec<u64> = rebuilt
            .files()
            .filter_map(|(_, _, e)| e.first().map(|x| x.start))
            .collect();
        let sorted = starts.clone();
        starts.sort();
        assert_eq!(starts, sorted, "fresh layout in path order");
        // Between versions most blocks stay where they were, unchanged:
        // edits change a few blocks, new files and grown files go to the end.
        for v in 1..3 {
            let (prev, cur) = (&blocks[v - 1], &blocks[v]);
            assert!(cur.len() > prev.len(), "new files extend the image");
            let same = prev.iter().zip(cur.iter()).filter(|(x, y)| x == y).count();
            let frac = same as f64 / prev.len() as f64;
            // SG5 edits 10 % of ~41 % of the files a week; a small file
            // edit changes its only block(s).
            assert!(frac > 0.55, "version {v}: {frac:.3} of blocks unchanged");
            eprintln!(
                "sg image version {v}: {frac:.3} of the previous image's blocks unchanged in place"
            );
        }
    }

    fn file_hashes(root: &Path) -> HashMap<PathBuf, [u8; 32]> {
        let (files, _) = crate::gen::fsutil::list_tree(root).unwrap();
        files
            .into_iter()
            .map(|f| {
                (
                    f.clone(),
                    *blake3::hash(&std::fs::read(root.join(&f)).unwrap()).as_bytes(),
                )
            })
            .collect()
    }

    #[test]
    fn presets_match_table_1() {
        let sg4 = preset("sg4").unwrap();
        assert_eq!(
            (sg4.alpha, sg4.beta, sg4.gamma_mb, sg4.versions),
            (0.02, 0.10, 20.0, 78)
        );
        let gp = preset("GP").unwrap();
        assert_eq!(gp.series * gp.versions, 320);
        let w = SgWorkload::new(&GenOptions {
            preset: Some("GP".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(w.series().len(), 16);
        assert_eq!(w.versions(), 20);
        assert!(SgWorkload::new(&GenOptions {
            preset: Some("SG9".into()),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn deterministic_from_seed() {
        let t = tempfile::tempdir().unwrap();
        let run = |seed: u64, name: &str| {
            let mut w = SgWorkload::new(&opts("SG1", 0.001, seed, 2)).unwrap();
            let d = t.path().join(name);
            w.advance(0, 0, &d).unwrap();
            let d0 = tree_digest(&d).unwrap();
            w.advance(0, 1, &d).unwrap();
            (d0, tree_digest(&d).unwrap())
        };
        let a = run(1, "a");
        let b = run(1, "b");
        let c = run(2, "c");
        assert_eq!(a, b);
        assert_ne!(a.0, c.0);
        assert_ne!(a.0, a.1);
    }

    #[test]
    fn base_size_and_change_rate() {
        // SG5: α = 10 %, so about 1 - 0.9^5 ≈ 41 % of files change per week.
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        let scale = 0.004;
        let mut w = SgWorkload::new(&opts("SG5", scale, 3, 3)).unwrap();
        w.advance(0, 0, &d).unwrap();
        let bytes = crate::gen::fsutil::list_tree(&d)
            .unwrap()
            .0
            .iter()
            .map(|f| std::fs::metadata(d.join(f)).unwrap().len())
            .sum::<u64>();
        let target = BASE_BYTES * scale;
        assert!(
            (bytes as f64 - target).abs() < 0.01 * target,
            "{bytes} vs {target}"
        );
        let mut prev = file_hashes(&d);
        assert!(prev.len() > 80, "{} files", prev.len());
        for v in 1..3 {
            w.advance(0, v, &d).unwrap();
            let cur = file_hashes(&d);
            let changed = prev.iter().filter(|(p, h)| cur.get(*p) != Some(h)).count();
            let frac = changed as f64 / prev.len() as f64;
            eprintln!("sg SG5 version {v}: {frac:.3} of files changed");
            assert!(
                (0.25..=0.5).contains(&frac),
                "version {v}: {frac:.3} of files changed"
            );
            let added = cur.len() - prev.len();
            // γ = 10 MB × scale per day, five days.
            let new_bytes: u64 = cur
                .keys()
                .filter(|p| !prev.contains_key(*p))
                .map(|p| std::fs::metadata(d.join(p)).unwrap().len())
                .sum();
            let want = 5.0 * 10e6 * scale;
            assert!(
                added > 0 && (new_bytes as f64 - want).abs() < 0.05 * want,
                "{added} files, {new_bytes} bytes"
            );
            prev = cur;
        }
    }

    #[test]
    fn gp_series_share_the_base_and_diverge() {
        let t = tempfile::tempdir().unwrap();
        let mut o = opts("GP", 0.0005, 1, 2);
        o.streams = Some(2);
        let mut w = SgWorkload::new(&o).unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        w.advance(0, 0, &a).unwrap();
        w.advance(1, 0, &b).unwrap();
        assert_eq!(tree_digest(&a).unwrap(), tree_digest(&b).unwrap());
        w.advance(0, 1, &a).unwrap();
        w.advance(1, 1, &b).unwrap();
        assert_ne!(tree_digest(&a).unwrap(), tree_digest(&b).unwrap());
        assert!(
            w.advance(0, 1, &a).is_err(),
            "versions must be produced in order"
        );
        assert!(w.advance(0, 2, &a).is_err(), "beyond the last version");
    }

    #[test]
    fn base_from_real_files() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("etc")).unwrap();
        for i in 0..40 {
            std::fs::write(
                src.join(format!("etc/f{i}.conf")),
                vec![b'a' + (i % 26) as u8; 3000 + i * 10],
            )
            .unwrap();
        }
        let mut o = opts("SG5", 0.0001, 1, 2);
        o.base = Some(src.clone());
        let mut w = SgWorkload::new(&o).unwrap();
        let d = t.path().join("out");
        w.advance(0, 0, &d).unwrap();
        assert_eq!(file_hashes(&d), file_hashes(&src));
        w.advance(0, 1, &d).unwrap();
        let (a, b) = (file_hashes(&d), file_hashes(&src));
        assert!(b.iter().filter(|(p, h)| a.get(*p) != Some(h)).count() >= 5);
    }
}
