//! `strata-bench delta`: what delta compression of near-duplicate chunks
//! would save on a series of real trees, before (and beside) the
//! repository format that stores it.
//!
//! Every version is chunked as a backup chunks it (FastCDC, the
//! repository's default sizes) and deduplicated exactly by fingerprint.
//! Each new chunk then looks for a *base* among the chunks stored whole
//! so far (a delta's base is never itself a delta: depth 1):
//!
//! * `sketch`: a chunk sharing a super-feature ([`strata_core::sketch`]),
//!   the one sharing the most, the newest on a tie;
//! * `path`: the chunk at the same place of the same file in the version
//!   before (a backup knows it: it compares every file with its parent);
//! * `both`: the sketch's candidate, else the path's.
//!
//! A chunk whose delta ([`strata_core::delta`]) is smaller than
//! `threshold` × its zstd-alone size is stored as a delta. Stored bytes
//! are counted as the writer lays them out: chunks stored whole in
//! compression regions of up to 128 KiB, zstd each; delta chunks in
//! regions of their own, each compressed with its chunks' bases as the
//! prefix, plus 36 bytes per base reference (fingerprint and length); an
//! envelope's overhead per region.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;
use strata_core::chunker::{ChunkerParams, Cutter};
use strata_core::sketch::{sketch, Sketch, SUPER_FEATURES};
use strata_core::Fingerprint;

/// How a new chunk finds its base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hint {
    Sketch,
    Path,
    Both,
    /// No deltas: what the repository stores today.
    None,
}

/// Settings of a simulation.
#[derive(Clone, Debug)]
pub struct Settings {
    pub avg_chunk: u32,
    pub level: i32,
    pub hint: Hint,
    /// A delta is kept when it is at most this fraction of the chunk
    /// compressed alone.
    pub threshold: f64,
    pub region: usize,
    /// Sketches are looked up among the chunks of the same version only
    /// (what a backup knows without a sketch index kept in the
    /// repository); the path hint still reaches the version before.
    pub version_sketches: bool,
}

/// Envelope bytes per region (header, nonce, tag of an encrypted one).
const ENVELOPE: u64 = 3 + 24 + 16;
/// Bytes of one base reference in a delta region's list.
const BASE_REF: u64 = 36;

/// Figures of one version.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VersionFigures {
    pub name: String,
    pub logical: u64,
    pub chunks: u64,
    pub new_chunks: u64,
    pub new_bytes: u64,
    /// Candidates found for new chunks (by the hint in use).
    pub candidates: u64,
    pub delta_chunks: u64,
    pub delta_bytes: u64,
    /// Distinct bases the delta chunks of this version need.
    pub bases: u64,
    /// Bytes stored for this version.
    pub stored: u64,
    pub seconds: f64,
    pub sketch_seconds: f64,
    pub encode_seconds: f64,
}

#[derive(Default)]
struct Region {
    plain: Vec<u8>,
    bases: Vec<Fingerprint>,
}

/// The chunks stored whole so far, and how to find them.
#[derive(Default)]
struct Store {
    seen: HashSet<Fingerprint>,
    whole: HashMap<Fingerprint, Vec<u8>>,
    sketches: HashMap<Fingerprint, Sketch>,
    /// Super-feature → newest whole chunk having it, per position.
    by_feature: [HashMap<u64, Fingerprint>; SUPER_FEATURES],
}

impl Store {
    fn sketch_candidate(&self, s: &Sketch) -> Option<Fingerprint> {
        let mut best: Option<(usize, Fingerprint)> = None;
        for (i, sf) in s.0.iter().enumerate() {
            if let Some(fp) = self.by_feature[i].get(sf) {
                let shared = self.sketches.get(fp).map_or(0, |o| o.shared(s));
                if best.is_none_or(|(n, _)| shared > n) {
                    best = Some((shared, *fp));
                }
            }
        }
        best.map(|(_, fp)| fp)
    }

    fn keep_whole(&mut self, fp: Fingerprint, data: &[u8], s: Option<Sketch>) {
        self.whole.insert(fp, data.to_vec());
        if let Some(s) = s {
            for (i, sf) in s.0.iter().enumerate() {
                self.by_feature[i].insert(*sf, fp);
            }
            self.sketches.insert(fp, s);
        }
    }
}

/// Files of `root`, relative paths in order (symbolic links left out).
fn files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let t = e.file_type()?;
            let p = rel.join(e.file_name());
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Runs the simulation over `versions` in order.
pub fn run(versions: &[PathBuf], s: &Settings) -> Result<Vec<VersionFigures>> {
    let cutter = Cutter::new(ChunkerParams::cdc(s.avg_chunk));
    let hasher = strata_core::Hasher::plain();
    let mut store = Store::default();
    let mut parent: HashMap<PathBuf, Vec<Fingerprint>> = HashMap::new();
    let mut out = Vec::new();
    for dir in versions {
        let t0 = Instant::now();
        let mut f = VersionFigures {
            name: dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into()),
            ..Default::default()
        };
        let (mut whole, mut delta) = (Region::default(), Region::default());
        let mut this: HashMap<PathBuf, Vec<Fingerprint>> = HashMap::new();
        let mut bases = HashSet::new();
        if s.version_sketches {
            store.by_feature.iter_mut().for_each(HashMap::clear);
            store.sketches.clear();
        }
        for rel in files(dir)? {
            let data = std::fs::read(dir.join(&rel))?;
            f.logical += data.len() as u64;
            let mut cuts = Vec::new();
            cutter.cut_all(&data, 0, true, &mut cuts);
            let before = parent.get(&rel);
            let mut fps = Vec::with_capacity(cuts.len());
            for (i, (start, len)) in cuts.into_iter().enumerate() {
                let chunk = &data[start..start + len as usize];
                let fp = hasher.hash(chunk);
                fps.push(fp);
                f.chunks += 1;
                if !store.seen.insert(fp) {
                    continue;
                }
                f.new_chunks += 1;
                f.new_bytes += chunk.len() as u64;
                let ts = Instant::now();
                let sk = if s.hint == Hint::None {
                    None
                } else {
                    sketch(chunk)
                };
                let by_sketch = sk.and_then(|k| store.sketch_candidate(&k));
                f.sketch_seconds += ts.elapsed().as_secs_f64();
                let by_path = || {
                    before
                        .and_then(|b| b.get(i))
                        .filter(|b| store.whole.contains_key(*b))
                        .copied()
                };
                let candidate = match s.hint {
                    Hint::None => None,
                    Hint::Sketch => by_sketch,
                    Hint::Path => by_path(),
                    Hint::Both => by_sketch.or_else(by_path),
                };
                let te = Instant::now();
                let chosen = match candidate {
                    Some(b) => {
                        f.candidates += 1;
                        let base = &store.whole[&b];
                        let d = strata_core::delta::encode(chunk, base, s.level)?;
                        let alone = zstd::bulk::compress(chunk, s.level)?;
                        (d.len() as f64 <= s.threshold * alone.len() as f64).then_some(b)
                    }
                    None => None,
                };
                f.encode_seconds += te.elapsed().as_secs_f64();
                match chosen {
                    Some(b) => {
                        f.delta_chunks += 1;
                        f.delta_bytes += chunk.len() as u64;
                        bases.insert(b);
                        delta.plain.extend_from_slice(chunk);
                        if !delta.bases.contains(&b) {
                            delta.bases.push(b);
                        }
                        if delta.plain.len() >= s.region {
                            f.stored += seal(&mut delta, &store, s.level)?;
                        }
                    }
                    None => {
                        store.keep_whole(fp, chunk, sk);
                        whole.plain.extend_from_slice(chunk);
                        if whole.plain.len() >= s.region {
                            f.stored += seal(&mut whole, &store, s.level)?;
                        }
                    }
                }
            }
            this.insert(rel, fps);
        }
        f.stored += seal(&mut whole, &store, s.level)? + seal(&mut delta, &store, s.level)?;
        f.bases = bases.len() as u64;
        f.seconds = t0.elapsed().as_secs_f64();
        parent = this;
        out.push(f);
    }
    Ok(out)
}

/// The bytes region `r` stores; empties it.
fn seal(r: &mut Region, store: &Store, level: i32) -> Result<u64> {
    if r.plain.is_empty() {
        return Ok(0);
    }
    let body = if r.bases.is_empty() {
        zstd::bulk::compress(&r.plain, level)?.len() as u64
    } else {
        let prefix: Vec<u8> = r
            .bases
            .iter()
            .flat_map(|b| store.whole[b].iter().copied())
            .collect();
        strata_core::delta::encode(&r.plain, &prefix, level)?.len() as u64
            + BASE_REF * r.bases.len() as u64
    };
    let n = body.min(r.plain.len() as u64) + ENVELOPE;
    *r = Region::default();
    Ok(n)
}
