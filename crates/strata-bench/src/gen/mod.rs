//! Workload generators. Every generator is deterministic from its seed:
//! the same options always produce byte-identical trees.
//!
//! Tree workloads (implement [`Workload`], chosen by [`workload`]):
//!
//! * [`sg`] — RevDedup §4.1 synthetic series SG1–SG5 and GP (Table I),
//!   as trees or (`image`) as one disk image per version ([`image`]).
//! * [`ddgen`] — Data Domain §8.2.1 load generator: generations with
//!   deletions, shuffles and additions at a 5 % change rate, N streams.
//! * [`smallfiles`] — source-tree releases dominated by small files (the
//!   SiLo Linux-versions set).
//! * [`vmfleet`] — raw disk images of a VM fleet with a shared OS base and
//!   daily dirty 2 MiB segments (Parallel VM snapshot paper §3–§5).
//!
//! Streams without a tree: [`primary`] (iDedup §3.1/§5 block write traces)
//! and [`trace`] (fingerprint-only backup streams as SiLo evaluates).
//! Building blocks: [`rng`] (seeded PRNG), [`content`] (data that
//! compresses about 2× with zstd), [`fsutil`].

use std::io;
use std::path::Path;

pub mod content;
pub mod ddgen;
mod extents;
pub mod fsutil;
pub mod image;
pub mod primary;
pub mod rng;
pub mod sg;
pub mod smallfiles;
pub mod trace;
mod tree;
pub mod vmfleet;
mod workload;

pub use workload::{GenOptions, Workload};

/// The workload kinds [`workload`] knows.
pub const KINDS: &[&str] = &["sg", "ddgen", "smallfiles", "vmfleet"];

/// Creates the workload `kind` ("sg", "ddgen", "smallfiles", "vmfleet";
/// case-insensitive) with `opts`.
pub fn workload(kind: &str, opts: &GenOptions) -> anyhow::Result<Box<dyn Workload>> {
    if !(opts.scale.is_finite() && opts.scale > 0.0) {
        anyhow::bail!("scale must be a positive number (got {})", opts.scale);
    }
    if opts.versions == Some(0) {
        anyhow::bail!("versions must be at least 1");
    }
    if opts.streams == Some(0) {
        anyhow::bail!("streams must be at least 1");
    }
    if let Some(b) = &opts.base {
        if !b.exists() {
            anyhow::bail!("base {} does not exist", b.display());
        }
    }
    if opts.image && !kind.eq_ignore_ascii_case("sg") {
        anyhow::bail!("--image is for the sg workload (vmfleet versions are disk images already)");
    }
    Ok(match kind.to_ascii_lowercase().as_str() {
        "sg" => Box::new(sg::SgWorkload::new(opts)?),
        "ddgen" => Box::new(ddgen::DdGen::new(opts)?),
        "smallfiles" => Box::new(smallfiles::SmallFiles::new(opts)?),
        "vmfleet" => Box::new(vmfleet::VmFleet::new(opts)?),
        _ => anyhow::bail!(
            "unknown workload kind {kind:?}; known kinds: {} (block-write and fingerprint traces \
             are written by `strata-bench gen primary` and `gen trace`)",
            KINDS.join(", ")
        ),
    })
}

pub use strata_core::size::parse_size;

/// A BLAKE3 digest (hex) of a tree: over the entries under `dir` (not
/// `dir` itself) sorted by relative path, each contributing its path, its
/// type, and for regular files the size and BLAKE3 of the content, for
/// symlinks the target. Directories count (empty ones too); other file
/// types count by type only. Metadata (modes, times, owners) is not
/// included. Lets the runner verify a restore byte-exact against a version
/// without keeping a copy.
pub fn tree_digest(dir: &Path) -> io::Result<String> {
    use rayon::prelude::*;
    use std::os::unix::ffi::OsStrExt;

    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        File,
        Dir,
        Symlink,
        Other,
    }
    fn walk(root: &Path, rel: &Path, out: &mut Vec<(Vec<u8>, Kind)>) -> io::Result<()> {
        for e in std::fs::read_dir(root.join(rel))? {
            let e = e?;
            let ft = e.file_type()?;
            let r = rel.join(e.file_name());
            let kind = if ft.is_dir() {
                Kind::Dir
            } else if ft.is_file() {
                Kind::File
            } else if ft.is_symlink() {
                Kind::Symlink
            } else {
                Kind::Other
            };
            out.push((r.as_os_str().as_bytes().to_vec(), kind));
            if kind == Kind::Dir {
                walk(root, &r, out)?;
            }
        }
        Ok(())
    }
    let mut entries = Vec::new();
    walk(dir, Path::new(""), &mut entries)?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<io::Result<Vec<u8>>> = entries
        .par_iter()
        .map(|(rel, kind)| {
            let path = dir.join(std::ffi::OsStr::from_bytes(rel));
            let mut v = Vec::with_capacity(rel.len() + 50);
            v.extend_from_slice(&(rel.len() as u64).to_le_bytes());
            v.extend_from_slice(rel);
            match kind {
                Kind::File => {
                    v.push(b'f');
                    let mut h = blake3::Hasher::new();
                    let mut f = std::fs::File::open(&path)?;
                    let n = io::copy(&mut f, &mut h)?;
                    v.extend_from_slice(&n.to_le_bytes());
                    v.extend_from_slice(h.finalize().as_bytes());
                }
                Kind::Dir => v.push(b'd'),
                Kind::Symlink => {
                    v.push(b'l');
                    let t = std::fs::read_link(&path)?;
                    let t = t.as_os_str().as_bytes();
                    v.extend_from_slice(&(t.len() as u64).to_le_bytes());
                    v.extend_from_slice(t);
                }
                Kind::Other => v.push(b'o'),
            }
            Ok(v)
        })
        .collect();
    let mut h = blake3::Hasher::new();
    h.update(b"strata-bench tree digest v1\0");
    for p in parts {
        h.update(&p?);
    }
    Ok(h.finalize().to_hex().to_string())
}

/// Helpers shared by the generators' tests.
#[cfg(test)]
pub(crate) mod tests_util {
    use super::rng::Rng;
    use std::collections::HashSet;

    /// Content-defined chunks (gear hash, ~4 KiB average, 1–16 KiB).
    pub fn cdc(data: &[u8]) -> Vec<&[u8]> {
        let mut gear = [0u64; 256];
        let mut r = Rng::new(0x6ea2);
        for g in gear.iter_mut() {
            *g = r.next_u64();
        }
        let mut out = Vec::new();
        let mut start = 0;
        let mut h = 0u64;
        for i in 0..data.len() {
            h = (h << 1).wrapping_add(gear[data[i] as usize]);
            let len = i + 1 - start;
            if (len >= 1024 && h >> 52 == 0) || len >= 16384 {
                out.push(&data[start..=i]);
                start = i + 1;
                h = 0;
            }
        }
        if start < data.len() {
            out.push(&data[start..]);
        }
        out
    }

    /// Fraction of `cur`'s bytes in chunks that do not occur in `prev`.
    pub fn cdc_new_fraction(prev: &[u8], cur: &[u8]) -> f64 {
        let old: HashSet<[u8; 32]> = cdc(prev)
            .iter()
            .map(|c| *blake3::hash(c).as_bytes())
            .collect();
        let new: usize = cdc(cur)
            .iter()
            .filter(|c| !old.contains(blake3::hash(c).as_bytes()))
            .map(|c| c.len())
            .sum();
        new as f64 / cur.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_sees_content_paths_types_and_links() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("a/empty")).unwrap();
        std::fs::write(d.join("a/x"), b"hello").unwrap();
        std::os::unix::fs::symlink("a/x", d.join("l")).unwrap();
        let d0 = tree_digest(d).unwrap();
        assert_eq!(d0, tree_digest(d).unwrap());
        std::fs::write(d.join("a/x"), b"hellp").unwrap();
        let d1 = tree_digest(d).unwrap();
        assert_ne!(d0, d1);
        std::fs::write(d.join("a/x"), b"hello").unwrap();
        assert_eq!(d0, tree_digest(d).unwrap());
        std::fs::remove_dir(d.join("a/empty")).unwrap();
        assert_ne!(d0, tree_digest(d).unwrap());
        std::fs::create_dir(d.join("a/empty")).unwrap();
        std::fs::remove_file(d.join("l")).unwrap();
        std::os::unix::fs::symlink("a/y", d.join("l")).unwrap();
        assert_ne!(d0, tree_digest(d).unwrap());
        // The same tree elsewhere has the same digest.
        let e = t.path().join("copy");
        std::fs::create_dir(&e).unwrap();
        std::fs::create_dir_all(e.join("a/empty")).unwrap();
        std::fs::write(e.join("a/x"), b"hello").unwrap();
        std::os::unix::fs::symlink("a/x", e.join("l")).unwrap();
        assert_eq!(d0, tree_digest(&e).unwrap());
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size("2 MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        for bad in ["", "G", "12X", "1.2.3M", "-5"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_kind_lists_known_ones() {
        let err = workload("nope", &GenOptions::default())
            .err()
            .unwrap()
            .to_string();
        for k in KINDS {
            assert!(err.contains(k), "{err}");
        }
    }
}
