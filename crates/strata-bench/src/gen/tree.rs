//! In-memory model of a generated file tree, shared by the `sg` and
//! `smallfiles` generators: the list of files (path, size, kind) and
//! directories in creation order, unique naming, creating, editing and
//! removing files. Keeping the model in memory (instead of re-listing the
//! directory) makes every choice deterministic and cheap.

use super::content::{vocab_word, ContentGen, FileKind};
use super::fsutil::{list_tree, read_file, set_file_mtime, set_mtime};
use super::rng::Rng;
use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub(crate) struct FileEntry {
    pub path: PathBuf,
    pub size: u64,
    pub kind: FileKind,
}

#[derive(Clone, Debug)]
pub(crate) struct Tree {
    pub files: Vec<FileEntry>,
    /// Relative directory paths; index 0 is the root ("").
    pub dirs: Vec<PathBuf>,
    /// Popularity of each directory for new files.
    pub dir_weight: Vec<f64>,
    taken: HashSet<PathBuf>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree {
            files: Vec::new(),
            dirs: vec![PathBuf::new()],
            dir_weight: vec![1.0],
            taken: HashSet::new(),
        }
    }

    /// The model of an existing tree (a copied `--base`).
    pub fn scan(root: &Path) -> io::Result<Tree> {
        let (files, dirs) = list_tree(root)?;
        let mut t = Tree::new();
        for d in dirs {
            t.taken.insert(d.clone());
            t.dirs.push(d);
            t.dir_weight.push(1.0);
        }
        for f in files {
            let size = fs::metadata(root.join(&f))?.len();
            t.taken.insert(f.clone());
            t.files.push(FileEntry {
                kind: FileKind::from_path(&f),
                path: f,
                size,
            });
        }
        Ok(t)
    }

    pub fn depth(&self, dir: usize) -> usize {
        self.dirs[dir].components().count()
    }

    /// A free path `dir/stem[-n][.ext]`.
    pub fn unique_path(&self, dir: &Path, stem: &str, ext: &str) -> PathBuf {
        let mk = |n: usize| {
            let mut name = stem.to_string();
            if n > 0 {
                name.push_str(&format!("-{n}"));
            }
            if !ext.is_empty() {
                name.push('.');
                name.push_str(ext);
            }
            dir.join(name)
        };
        let mut n = 0;
        loop {
            let p = mk(n);
            if !self.taken.contains(&p) {
                return p;
            }
            n += 1;
        }
    }

    /// Creates directory `parent/name` (made unique) and returns its index.
    pub fn add_dir(
        &mut self,
        root: &Path,
        parent: usize,
        name: &str,
        weight: f64,
    ) -> io::Result<usize> {
        let p = self.unique_path(&self.dirs[parent].clone(), name, "");
        fs::create_dir(root.join(&p))?;
        self.taken.insert(p.clone());
        self.dirs.push(p);
        self.dir_weight.push(weight);
        Ok(self.dirs.len() - 1)
    }

    /// A directory chosen by popularity (linear scan; fine for daily use).
    pub fn pick_dir(&self, rng: &mut Rng) -> usize {
        rng.choose_weighted(&self.dir_weight)
    }

    /// Creates a new file of `size` bytes of `kind` content in `dir`.
    #[allow(clippy::too_many_arguments)]
    pub fn create_file(
        &mut self,
        root: &Path,
        dir: usize,
        stem: &str,
        ext: &str,
        kind: FileKind,
        size: u64,
        seed: u64,
        mtime: u64,
    ) -> io::Result<usize> {
        let rel = self.unique_path(&self.dirs[dir].clone(), stem, ext);
        let path = root.join(&rel);
        let mut f = fs::File::create(&path)?;
        ContentGen::new(seed, kind.mix()).write_to(&mut f, size)?;
        set_file_mtime(&f, mtime)?;
        self.taken.insert(rel.clone());
        self.files.push(FileEntry {
            path: rel,
            size,
            kind,
        });
        Ok(self.files.len() - 1)
    }

    /// Removes file `idx`; with `prune`, also its directories that became
    /// empty (except the root).
    pub fn remove_file(&mut self, root: &Path, idx: usize, prune: bool) -> io::Result<()> {
        let f = self.files.remove(idx);
        fs::remove_file(root.join(&f.path))?;
        self.taken.remove(&f.path);
        if prune {
            let mut d = f.path.parent().map(Path::to_path_buf);
            while let Some(dir) = d {
                if dir.as_os_str().is_empty() || fs::read_dir(root.join(&dir))?.next().is_some() {
                    break;
                }
                fs::remove_dir(root.join(&dir))?;
                self.taken.remove(&dir);
                if let Some(i) = self.dirs.iter().position(|x| *x == dir) {
                    self.dirs.remove(i);
                    self.dir_weight.remove(i);
                }
                d = dir.parent().map(Path::to_path_buf);
            }
        }
        Ok(())
    }

    /// Moves file `idx` into directory `dir` (a rename: same content).
    pub fn move_file(&mut self, root: &Path, idx: usize, dir: usize) -> io::Result<()> {
        let old = self.files[idx].path.clone();
        let name = old
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("f")
            .to_string();
        let (stem, ext) = match name.rsplit_once('.') {
            Some((s, e)) if !s.is_empty() => (s.to_string(), e.to_string()),
            _ => (name.clone(), String::new()),
        };
        let new = self.unique_path(&self.dirs[dir].clone(), &stem, &ext);
        fs::rename(root.join(&old), root.join(&new))?;
        self.taken.remove(&old);
        self.taken.insert(new.clone());
        self.files[idx].path = new;
        Ok(())
    }
}

/// A file-name stem from the vocabulary (`word`, `word_word`, `word12`).
pub(crate) fn name_stem(rng: &mut Rng) -> String {
    let r = rng.next_u64();
    match r % 4 {
        0 | 1 => vocab_word(r >> 8).to_string(),
        2 => format!("{}_{}", vocab_word(r >> 8), vocab_word(r >> 32)),
        _ => format!("{}{}", vocab_word(r >> 8), (r >> 40) % 100),
    }
}

/// Modifies about `fraction` of a file's bytes in 1–3 ranges: in-place
/// overwrites (70 %), inserts (15 %) and deletes (15 %) with new content of
/// the file's kind, then sets the mtime. Overwrite-only edits are written
/// in place; edits that shift data rewrite the file.
pub(crate) fn edit_bytes(
    root: &Path,
    f: &mut FileEntry,
    fraction: f64,
    rng: &mut Rng,
    mtime: u64,
) -> io::Result<()> {
    let path = root.join(&f.path);
    let size = f.size;
    let total = ((size as f64 * fraction).round() as u64).max(1);
    let nranges = 1 + rng.below(3).min(total - 1);
    let mut ops = Vec::with_capacity(nranges as usize);
    let mut left = total;
    for i in 0..nranges {
        let len = if i + 1 == nranges {
            left
        } else {
            1 + rng.below(left - (nranges - i - 1))
        };
        left -= len;
        let r = rng.f64();
        let op = if size == 0 || r < 0.15 {
            1 // insert
        } else if r < 0.30 {
            2 // delete
        } else {
            0 // overwrite
        };
        ops.push((op, len));
    }
    let mut g = ContentGen::new(rng.next_u64(), f.kind.mix());
    if ops.iter().all(|o| o.0 == 0) {
        let file = fs::OpenOptions::new().write(true).open(&path)?;
        for &(_, len) in &ops {
            let len = len.min(size);
            let off = rng.below(size - len + 1);
            file.write_all_at(&g.bytes(len as usize), off)?;
        }
    } else {
        let mut data = read_file(&path)?;
        for &(op, len) in &ops {
            let len = len as usize;
            match op {
                1 => {
                    let off = rng.below(data.len() as u64 + 1) as usize;
                    data.splice(off..off, g.bytes(len));
                }
                2 if len < data.len() => {
                    let off = rng.below((data.len() - len) as u64 + 1) as usize;
                    data.drain(off..off + len);
                }
                _ => {
                    let len = len.min(data.len());
                    let off = rng.below((data.len() - len) as u64 + 1) as usize;
                    let new = g.bytes(len);
                    data[off..off + len].copy_from_slice(&new);
                }
            }
        }
        fs::write(&path, &data)?;
        f.size = data.len() as u64;
    }
    set_mtime(&path, mtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_edit_move_remove() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let mut tree = Tree::new();
        let d = tree.add_dir(root, 0, "lib", 1.0).unwrap();
        let d2 = tree.add_dir(root, d, "sub", 1.0).unwrap();
        let a = tree
            .create_file(root, d2, "a", "c", FileKind::Source, 10_000, 1, 0)
            .unwrap();
        let b = tree
            .create_file(root, d2, "a", "c", FileKind::Source, 100, 2, 0)
            .unwrap();
        assert_eq!(tree.files[b].path, PathBuf::from("lib/sub/a-1.c"));
        let before = fs::read(root.join(&tree.files[a].path)).unwrap();
        let mut rng = Rng::new(1);
        for _ in 0..5 {
            let mut f = tree.files[a].clone();
            edit_bytes(root, &mut f, 0.1, &mut rng, 1_400_000_000).unwrap();
            assert_eq!(fs::metadata(root.join(&f.path)).unwrap().len(), f.size);
            tree.files[a] = f;
        }
        let after = fs::read(root.join(&tree.files[a].path)).unwrap();
        assert_ne!(before, after);
        tree.move_file(root, b, 0).unwrap();
        assert_eq!(tree.files[b].path, PathBuf::from("a-1.c"));
        tree.remove_file(root, a, true).unwrap();
        assert!(!root.join("lib").exists());
        assert_eq!(tree.dirs.len(), 1);
        let scanned = Tree::scan(root).unwrap();
        assert_eq!(scanned.files.len(), 1);
    }
}
