//! Source-tree releases dominated by small files: the "Linux-set" of the
//! SiLo paper (Xia et al., USENIX ATC 2011, §4 and Table 1).
//!
//! From the paper: Linux-set "consists of **900 versions** from version
//! 1.1.13 to 2.6.33, and represents the characteristics of small files";
//! Table 1: **101 GB, 8.8 M files, 16.9 M chunks, average chunk 5.9 KB,
//! dedup factor 19**, strong locality and similarity. §2.2: small files
//! (≤ 64 KB) are ≥ 80 % of the files but ≤ 20 % of the space; SiLo groups
//! "files with the logic sequence within the same parent directory" into
//! segments, so directory structure matters.
//!
//! Here one series is a source tree brought from release to release in
//! place. Scale: `scale` is the fraction of the *whole* Linux-set
//! (8.8 M files over 900 versions). By default it is split into
//! `round(900 × scale)` versions (2 ≤ · ≤ 900) of the paper's average
//! tree (≈ 9.8 k files, ≈ 11.5 KB/file); when `versions` is given the tree
//! size is adjusted so the total stays 8.8 M × scale files (≥ 20 files per
//! version). 0.01 → 9 releases of ≈ 9.8 k files (≈ 110 MB each).
//! `streams` > 1 gives several series that fork the same first release
//! and then receive different changes.
//!
//! Our choices where the paper is silent: a Linux-like layout (top-level
//! `arch/`, `drivers/`, `fs/`, `include/`, … with nested subdirectories of
//! ≈ 15 files each); file kinds and sizes by extension (`.c` median 8.5 KB,
//! `.h` 3.6 KB, `Makefile`/`Kconfig` 1–2 KB, `Documentation` text, rare
//! firmware blobs), lognormal with σ ≈ 1.1, content from
//! [`super::content`] (source-like text, compresses ≈ 3–4×). Each release
//! patches 6 % of the files (1–4 hunks of deleted and inserted lines), adds
//! 0.6 % new files (10 % of them in new directories), deletes 0.22 % (empty
//! directories disappear) and moves 0.1 % to other directories: about 5 %
//! new data per release (the dedup factor of 19) and a net growth of 0.38 %
//! per release (Linux grew ≈ 30× over the 900 versions); the first release
//! is sized so that the average over all releases is the target. `base`
//! starts from a copy of a real tree (e.g. an unpacked kernel) instead.

use super::content::{ContentGen, FileKind};
use super::fsutil::{copy_tree, prepare_dir, read_file, set_mtime, sim_time, versions_to_apply};
use super::rng::{LongTail, Rng};
use super::tree::{name_stem, Tree};
use super::workload::{no_preset, GenOptions, Workload};
use std::io;
use std::path::{Path, PathBuf};

/// Versions in SiLo's Linux-set.
pub const PAPER_VERSIONS: usize = 900;
/// Files in SiLo's Linux-set, all versions together.
pub const PAPER_FILES: f64 = 8.8e6;
/// Fraction of files patched per release.
pub const MODIFY_RATE: f64 = 0.06;
/// Fraction of files added per release.
pub const ADD_RATE: f64 = 0.006;
/// Fraction of files deleted per release.
pub const DELETE_RATE: f64 = 0.0022;
/// Fraction of files moved to another directory per release.
pub const MOVE_RATE: f64 = 0.001;

const TOP_DIRS: [(&str, f64); 19] = [
    ("arch", 0.14),
    ("block", 0.005),
    ("crypto", 0.01),
    ("Documentation", 0.06),
    ("drivers", 0.45),
    ("fs", 0.07),
    ("include", 0.12),
    ("init", 0.002),
    ("ipc", 0.002),
    ("kernel", 0.015),
    ("lib", 0.012),
    ("mm", 0.008),
    ("net", 0.06),
    ("scripts", 0.01),
    ("security", 0.008),
    ("sound", 0.05),
    ("tools", 0.008),
    ("usr", 0.001),
    ("virt", 0.002),
];

/// (stem or "", extension, kind, share of files, median bytes, sigma)
const FILE_TYPES: [(&str, &str, FileKind, f64, f64, f64); 9] = [
    ("", "c", FileKind::Source, 0.45, 8500.0, 1.1),
    ("", "h", FileKind::Source, 0.30, 3600.0, 1.1),
    ("Makefile", "", FileKind::Source, 0.04, 1200.0, 0.9),
    ("Kconfig", "", FileKind::Source, 0.03, 2000.0, 1.0),
    ("", "txt", FileKind::Text, 0.06, 6500.0, 1.2),
    ("", "S", FileKind::Source, 0.03, 6500.0, 1.0),
    ("", "sh", FileKind::Source, 0.02, 3200.0, 1.0),
    ("", "dts", FileKind::Source, 0.03, 5200.0, 1.0),
    ("", "bin", FileKind::Binary, 0.005, 26000.0, 1.2),
];

/// Net growth of the file count per release.
const GROWTH: f64 = ADD_RATE - DELETE_RATE;

struct Series {
    tree: Tree,
    done: usize,
}

/// The `smallfiles` workload (see the module docs).
pub struct SmallFiles {
    seed: u64,
    scale: f64,
    versions: usize,
    /// Files of the first release.
    files0: usize,
    base: Option<PathBuf>,
    series: Vec<Option<Series>>,
}

impl SmallFiles {
    pub fn new(opts: &GenOptions) -> anyhow::Result<SmallFiles> {
        no_preset("smallfiles", opts)?;
        let versions = opts.versions.unwrap_or_else(|| {
            ((PAPER_VERSIONS as f64 * opts.scale).round() as usize).clamp(2, PAPER_VERSIONS)
        });
        let avg = (PAPER_FILES * opts.scale / versions as f64).max(20.0);
        // Average of e^{g·v} over v = 0..versions is (e^{gV} − 1)/(gV).
        let gv = GROWTH * versions as f64;
        let files0 = (avg * gv / gv.exp_m1()).round().max(20.0) as usize;
        let n = opts.streams.unwrap_or(1);
        Ok(SmallFiles {
            seed: opts.seed,
            scale: opts.scale,
            versions,
            files0,
            base: opts.base.clone(),
            series: (0..n).map(|_| None).collect(),
        })
    }

    /// Files in the first release.
    pub fn initial_files(&self) -> usize {
        self.files0
    }
}

fn file_type(rng: &mut Rng) -> usize {
    let w: Vec<f64> = FILE_TYPES.iter().map(|t| t.3).collect();
    rng.choose_weighted(&w)
}

fn new_file(tree: &mut Tree, root: &Path, dir: usize, rng: &mut Rng, mtime: u64) -> io::Result<()> {
    let in_docs = tree.dirs[dir].starts_with("Documentation");
    let t = if in_docs && rng.chance(0.8) {
        4
    } else {
        file_type(rng)
    };
    let (stem, ext, kind, _, median, sigma) = FILE_TYPES[t];
    let size = LongTail::LogNormal {
        median,
        sigma,
        min: 0,
        max: 4 << 20,
    }
    .sample(rng);
    let stem = if stem.is_empty() {
        name_stem(rng)
    } else {
        stem.to_string()
    };
    let seed = rng.next_u64();
    tree.create_file(root, dir, &stem, ext, kind, size, seed, mtime)?;
    Ok(())
}

fn new_dir(tree: &mut Tree, root: &Path, rng: &mut Rng) -> io::Result<usize> {
    let mut parent = 0;
    for _ in 0..100 {
        let p = tree.pick_dir(rng);
        if tree.depth(p) < 6 && p != 0 {
            parent = p;
            break;
        }
    }
    let name = name_stem(rng);
    let w = rng.lognormal(1.0, 1.0) * tree.dir_weight[parent].clamp(0.01, 1.0);
    tree.add_dir(root, parent, &name, w)
}

fn build_first(seed: u64, files0: usize, root: &Path) -> io::Result<Tree> {
    let mut rng = Rng::derive(seed, &[0x5f, 0]);
    let mut tree = Tree::new();
    tree.dir_weight[0] = 0.0005;
    for (name, w) in TOP_DIRS {
        tree.add_dir(root, 0, name, w)?;
    }
    // ≈ 15 files per directory.
    let ndirs = (files0 / 15).max(TOP_DIRS.len() + 1);
    while tree.dirs.len() < ndirs {
        new_dir(&mut tree, root, &mut rng)?;
    }
    // A few files at the top (README, MAINTAINERS, Makefile, …).
    for stem in ["README", "MAINTAINERS", "COPYING", "CREDITS", "Makefile"] {
        let size = LongTail::LogNormal {
            median: 12000.0,
            sigma: 1.0,
            min: 100,
            max: 1 << 20,
        }
        .sample(&mut rng);
        tree.create_file(
            root,
            0,
            stem,
            "",
            FileKind::Text,
            size,
            rng.next_u64(),
            sim_time(0, 0),
        )?;
    }
    let mut cum = Vec::with_capacity(tree.dirs.len());
    let mut acc = 0.0;
    for w in &tree.dir_weight {
        acc += w;
        cum.push(acc);
    }
    while tree.files.len() < files0 {
        let x = rng.f64() * acc;
        let dir = cum.partition_point(|&c| c <= x).min(tree.dirs.len() - 1);
        let tick = rng.below(86_400);
        new_file(&mut tree, root, dir, &mut rng, sim_time(0, tick))?;
    }
    Ok(tree)
}

/// A patch: 1–4 hunks, each deleting 0–10 lines and inserting 0–15 new
/// lines at a random line boundary.
fn patch(root: &Path, tree: &mut Tree, idx: usize, rng: &mut Rng, mtime: u64) -> io::Result<()> {
    let f = &mut tree.files[idx];
    let path = root.join(&f.path);
    let mut data = read_file(&path)?;
    let mut g = ContentGen::new(rng.next_u64(), f.kind.mix());
    let hunks = 1 + rng.below(4);
    for _ in 0..hunks {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(
                data.iter()
                    .enumerate()
                    .filter(|(_, &b)| b == b'\n')
                    .map(|(i, _)| i + 1),
            )
            .filter(|&i| i <= data.len())
            .collect();
        let li = rng.below(starts.len() as u64) as usize;
        let at = starts[li];
        let del = rng.below(11) as usize;
        let end = starts.get(li + del).copied().unwrap_or(data.len()).max(at);
        let ins_lines = rng.below(16) as usize + usize::from(del == 0);
        let mut new = vec![0u8; ins_lines * 36];
        match f.kind {
            FileKind::Text => g.fill_text(&mut new),
            FileKind::Source => g.fill_source(&mut new),
            _ => g.fill(&mut new),
        }
        if f.kind != FileKind::Binary {
            // Whole lines only.
            let cut = new
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(new.len(), |i| i + 1);
            new.truncate(cut);
            if new.is_empty() {
                new.extend_from_slice(b"\n");
            }
        }
        data.splice(at..end, new);
    }
    std::fs::write(&path, &data)?;
    f.size = data.len() as u64;
    set_mtime(&path, mtime)
}

fn release(seed: u64, tree: &mut Tree, root: &Path, version: usize) -> io::Result<()> {
    let mut rng = Rng::derive(seed, &[0x5f, version as u64]);
    let day = 14 * version as u64;
    let n = tree.files.len();
    // Patches.
    let k = rng.round_random(MODIFY_RATE * n as f64) as usize;
    for idx in rng.sample_distinct(n, k) {
        let tick = rng.below(86_400);
        patch(root, tree, idx, &mut rng, sim_time(day, tick))?;
    }
    // Moves.
    let k = rng.round_random(MOVE_RATE * n as f64) as usize;
    for idx in rng.sample_distinct(n, k) {
        let dir = tree.pick_dir(&mut rng);
        tree.move_file(root, idx, dir)?;
    }
    // Deletions (highest index first so indices stay valid).
    let k = rng.round_random(DELETE_RATE * n as f64) as usize;
    for idx in rng.sample_distinct(n, k).into_iter().rev() {
        tree.remove_file(root, idx, true)?;
    }
    // Additions.
    let k = rng.round_random(ADD_RATE * n as f64) as usize;
    for _ in 0..k {
        let dir = if rng.chance(0.1) || tree.dirs.len() <= 1 {
            new_dir(tree, root, &mut rng)?
        } else {
            tree.pick_dir(&mut rng)
        };
        let tick = rng.below(86_400);
        new_file(tree, root, dir, &mut rng, sim_time(day, tick))?;
    }
    Ok(())
}

impl Workload for SmallFiles {
    fn describe(&self) -> String {
        let start = match &self.base {
            Some(b) => format!("first release copied from {}", b.display()),
            None => format!("{} files in the first release", self.files0),
        };
        format!(
            "smallfiles (SiLo Linux-set): scale {} of 8.8 M files/900 versions → {} releases, {start}; per release \
             {:.1}% files patched, {:.2}% added, {:.2}% deleted, {:.1}% moved; seed {}",
            self.scale,
            self.versions,
            MODIFY_RATE * 100.0,
            ADD_RATE * 100.0,
            DELETE_RATE * 100.0,
            MOVE_RATE * 100.0,
            self.seed
        )
    }

    fn series(&self) -> Vec<String> {
        let n = self.series.len();
        if n == 1 {
            vec!["linux".into()]
        } else {
            (0..n).map(|i| format!("linux-{i:02}")).collect()
        }
    }

    fn versions(&self) -> usize {
        self.versions
    }

    fn advance(&mut self, series: usize, version: usize, dir: &Path) -> io::Result<()> {
        if series >= self.series.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no series {series}"),
            ));
        }
        // Every series is the same project; several series fork it.
        let release_seed = super::rng::derive_seed(self.seed, &[series as u64]);
        let done = self.series[series].as_ref().map_or(0, |s| s.done);
        for v in versions_to_apply(done, version, self.versions)? {
            if v == 0 {
                prepare_dir(dir)?;
                let tree = match &self.base {
                    Some(b) => {
                        copy_tree(b, dir)?;
                        Tree::scan(dir)?
                    }
                    None => build_first(self.seed, self.files0, dir)?,
                };
                self.series[series] = Some(Series { tree, done: 0 });
            } else {
                release(
                    release_seed,
                    &mut self.series[series].as_mut().unwrap().tree,
                    dir,
                    v,
                )?;
            }
            self.series[series].as_mut().unwrap().done = v + 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::fsutil::list_tree;
    use crate::gen::tests_util::cdc;
    use crate::gen::tree_digest;
    use std::collections::HashSet;

    fn opts(scale: f64, seed: u64, versions: usize) -> GenOptions {
        GenOptions {
            seed,
            scale,
            versions: Some(versions),
            ..Default::default()
        }
    }

    fn tree_bytes(root: &Path) -> Vec<u8> {
        let (files, _) = list_tree(root).unwrap();
        let mut v = Vec::new();
        for f in files {
            v.extend(std::fs::read(root.join(f)).unwrap());
        }
        v
    }

    #[test]
    fn defaults_follow_the_linux_set() {
        let w = SmallFiles::new(&GenOptions {
            scale: 0.01,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(w.versions(), 9);
        assert!(
            (9_000..10_000).contains(&w.initial_files()),
            "{}",
            w.initial_files()
        );
        let w = SmallFiles::new(&GenOptions {
            scale: 1.0,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(w.versions(), 900);
        assert!(w.initial_files() < 3_000, "{}", w.initial_files());
    }

    #[test]
    fn deterministic_small_files_and_release_changes() {
        let t = tempfile::tempdir().unwrap();
        let o = opts(0.0001, 1, 3); // ≈ 290 files per release
        let mut a = SmallFiles::new(&o).unwrap();
        let mut b = SmallFiles::new(&o).unwrap();
        let mut c = SmallFiles::new(&opts(0.0001, 2, 3)).unwrap();
        let (da, db, dc) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
        a.advance(0, 0, &da).unwrap();
        b.advance(0, 0, &db).unwrap();
        c.advance(0, 0, &dc).unwrap();
        assert_eq!(tree_digest(&da).unwrap(), tree_digest(&db).unwrap());
        assert_ne!(tree_digest(&da).unwrap(), tree_digest(&dc).unwrap());
        let (files, dirs) = list_tree(&da).unwrap();
        assert!(files.len() >= 250, "{}", files.len());
        assert!(
            dirs.len() >= 19 && files.len() / dirs.len() >= 5,
            "{} dirs",
            dirs.len()
        );
        let sizes: Vec<u64> = files
            .iter()
            .map(|f| std::fs::metadata(da.join(f)).unwrap().len())
            .collect();
        let small = sizes.iter().filter(|&&s| s <= 64 << 10).count();
        assert!(small as f64 >= 0.9 * sizes.len() as f64);
        let mut sorted = sizes.clone();
        sorted.sort();
        let median = sorted[sorted.len() / 2];
        assert!((1500..12000).contains(&median), "median {median}");
        let mut prev = tree_bytes(&da);
        let mut prev_files: HashSet<PathBuf> = files.into_iter().collect();
        for v in 1..3 {
            a.advance(0, v, &da).unwrap();
            b.advance(0, v, &db).unwrap();
            assert_eq!(tree_digest(&da).unwrap(), tree_digest(&db).unwrap());
            let cur = tree_bytes(&da);
            let new = crate::gen::tests_util::cdc_new_fraction(&prev, &cur);
            eprintln!("smallfiles release {v}: {new:.4} new");
            assert!(
                (0.01..0.15).contains(&new),
                "release {v}: {new:.3} new bytes"
            );
            assert!(!cdc(&cur).is_empty());
            let files: HashSet<PathBuf> = list_tree(&da).unwrap().0.into_iter().collect();
            assert!(files.symmetric_difference(&prev_files).count() <= files.len() / 10);
            prev = cur;
            prev_files = files;
        }
    }
}
