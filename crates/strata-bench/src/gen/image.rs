//! A tree laid out as a single disk image, like `dd` of a disk holding it
//! (RevDedup §4.1 backs up the SG series as disk images): used by
//! `sg --image`.
//!
//! The model is a minimal filesystem without metadata blocks: the image is
//! a sequence of 4 KiB blocks; every file occupies whole blocks, its content
//! starting at a 4 KiB-aligned offset and zero-padded to the end of its
//! last block. Like a real filesystem (and unlike a tar stream, where one
//! new or grown file shifts everything after it) allocations are *stable*:
//!
//! * the first version lays the files out back to back in path order;
//! * a file keeps its blocks from version to version, so the image changes
//!   only where file contents change;
//! * a file that outgrows its blocks gets one more extent, allocated at the
//!   end of the image, for the rest of its content (fragmentation, as an
//!   ageing filesystem does); a file that shrinks keeps its blocks, the
//!   unused ones zeroed;
//! * new files are allocated at the end of the image in path order;
//! * a removed file's blocks become zeros and are not reused.
//!
//! Allocation only depends on the sequence of trees passed to
//! [`ImageLayout::update`], so a generator that updates the layout after
//! every version produces byte-identical images from the same seed.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Block size of the image: files start at multiples of it.
pub const IMAGE_BLOCK: u64 = strata_core::BLOCK_SIZE as u64;

/// A run of blocks of the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First block.
    pub start: u64,
    /// Number of blocks.
    pub blocks: u64,
}

/// Where every file of the tree lives in the image (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageLayout {
    files: BTreeMap<PathBuf, (u64, Vec<Extent>)>,
    /// Blocks allocated so far (the image's length in blocks).
    end: u64,
}

impl ImageLayout {
    pub fn new() -> ImageLayout {
        ImageLayout::default()
    }

    /// Brings the layout to a tree of `files` (relative path, size in
    /// bytes; any order): removed files free their blocks, then in path
    /// order grown files get an extent for the rest and new files one extent
    /// each, both at the end of the image.
    pub fn update(&mut self, files: &[(PathBuf, u64)]) {
        let mut sorted: Vec<&(PathBuf, u64)> = files.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let present: std::collections::HashSet<&PathBuf> = sorted.iter().map(|f| &f.0).collect();
        self.files.retain(|p, _| present.contains(p));
        for (path, size) in sorted {
            let need = size.div_ceil(IMAGE_BLOCK);
            let entry = self.files.entry(path.clone()).or_default();
            entry.0 = *size;
            let have: u64 = entry.1.iter().map(|e| e.blocks).sum();
            if need > have {
                entry.1.push(Extent {
                    start: self.end,
                    blocks: need - have,
                });
                self.end += need - have;
            }
        }
    }

    /// The image's length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.end * IMAGE_BLOCK
    }

    /// The extents of a file, in content order.
    pub fn extents(&self, path: &Path) -> Option<&[Extent]> {
        self.files.get(path).map(|f| &f.1[..])
    }

    /// Files in path order with their size and extents.
    pub fn files(&self) -> impl Iterator<Item = (&PathBuf, u64, &[Extent])> {
        self.files.iter().map(|(p, (s, e))| (p, *s, &e[..]))
    }

    /// Writes the image of the files under `root` to `image`: every file's
    /// content into its extents, zeros everywhere else. The image is
    /// rewritten from scratch (truncated first), so blocks no file uses
    /// read as zeros.
    pub fn write_image(&self, root: &Path, image: &Path) -> io::Result<()> {
        let out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(image)?;
        out.set_len(self.len_bytes())?;
        let mut buf = Vec::new();
        for (path, size, extents) in self.files() {
            buf.clear();
            File::open(root.join(path))
                .and_then(|mut f| f.read_to_end(&mut buf))
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            if buf.len() as u64 != size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: {} bytes, the layout expects {size}",
                        path.display(),
                        buf.len()
                    ),
                ));
            }
            let mut rest = &buf[..];
            for e in extents {
                if rest.is_empty() {
                    break;
                }
                let n = rest.len().min((e.blocks * IMAGE_BLOCK) as usize);
                out.write_all_at(&rest[..n], e.start * IMAGE_BLOCK)?;
                rest = &rest[n..];
            }
        }
        Ok(())
    }
}

/// Where a series' file tree is kept when its directory holds the image:
/// a sibling `NAME.sg-tree` of the directory.
pub fn tree_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into());
    dir.with_file_name(format!("{name}.sg-tree"))
}

/// Name of the image file inside the series directory.
pub const IMAGE_NAME: &str = "disk.img";

/// Reads the image's blocks (for tests and diagnostics).
pub fn read_blocks(image: &Path) -> io::Result<Vec<Vec<u8>>> {
    Ok(fs::read(image)?
        .chunks(IMAGE_BLOCK as usize)
        .map(|c| c.to_vec())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn layout_is_stable_aligned_and_in_path_order() {
        let mut l = ImageLayout::new();
        // Given out of order; laid out in path order.
        l.update(&[(p("b/x"), 5000), (p("a"), 4096), (p("c"), 0), (p("b/w"), 1)]);
        let ext = |l: &ImageLayout, s: &str| l.extents(&p(s)).unwrap().to_vec();
        let e = |start, blocks| Extent { start, blocks };
        assert_eq!(ext(&l, "a"), vec![e(0, 1)]);
        assert_eq!(ext(&l, "b/w"), vec![e(1, 1)]);
        assert_eq!(ext(&l, "b/x"), vec![e(2, 2)]);
        assert_eq!(ext(&l, "c"), vec![]);
        assert_eq!(l.len_bytes(), 4 * IMAGE_BLOCK);
        // "b/x" grows by one block, "a" shrinks, "aa" and "d" are new,
        // "b/w" is removed: nothing existing moves.
        l.update(&[
            (p("d"), 10),
            (p("b/x"), 9000),
            (p("aa"), 8192),
            (p("a"), 100),
            (p("c"), 0),
        ]);
        assert_eq!(ext(&l, "a"), vec![e(0, 1)]);
        assert_eq!(ext(&l, "aa"), vec![e(4, 2)]);
        assert_eq!(ext(&l, "b/x"), vec![e(2, 2), e(6, 1)]);
        assert_eq!(ext(&l, "d"), vec![e(7, 1)]);
        assert!(l.extents(&p("b/w")).is_none());
        assert_eq!(l.len_bytes(), 8 * IMAGE_BLOCK);
        // The same sequence of trees gives the same layout.
        let mut m = ImageLayout::new();
        m.update(&[(p("a"), 4096), (p("b/w"), 1), (p("b/x"), 5000), (p("c"), 0)]);
        m.update(&[
            (p("a"), 100),
            (p("aa"), 8192),
            (p("b/x"), 9000),
            (p("c"), 0),
            (p("d"), 10),
        ]);
        assert_eq!(l, m);
    }

    #[test]
    fn image_holds_files_at_their_extents_with_zero_padding() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tree");
        fs::create_dir_all(root.join("b")).unwrap();
        fs::write(root.join("a"), vec![1u8; 5000]).unwrap();
        fs::write(root.join("b/c"), vec![2u8; 10]).unwrap();
        let mut l = ImageLayout::new();
        l.update(&[(p("a"), 5000), (p("b/c"), 10)]);
        let img = t.path().join(IMAGE_NAME);
        l.write_image(&root, &img).unwrap();
        let data = fs::read(&img).unwrap();
        assert_eq!(data.len(), 3 * 4096);
        assert!(data[..5000].iter().all(|&b| b == 1));
        assert!(data[5000..8192].iter().all(|&b| b == 0));
        assert!(data[8192..8202].iter().all(|&b| b == 2));
        assert!(data[8202..].iter().all(|&b| b == 0));
        // Shrinking "a" zeroes its unused tail; the rest stays in place.
        fs::write(root.join("a"), vec![3u8; 100]).unwrap();
        l.update(&[(p("a"), 100), (p("b/c"), 10)]);
        l.write_image(&root, &img).unwrap();
        let data = fs::read(&img).unwrap();
        assert_eq!(data.len(), 3 * 4096);
        assert!(data[..100].iter().all(|&b| b == 3));
        assert!(data[100..8192].iter().all(|&b| b == 0));
        assert!(data[8192..8202].iter().all(|&b| b == 2));
        assert_eq!(tree_dir(Path::new("/w/src/0")), p("/w/src/0.sg-tree"));
    }
}
