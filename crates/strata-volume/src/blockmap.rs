//! The block map: logical block → disk block number + 1 (0: unmapped),
//! one little-endian `u64` per logical block in the file `map`.
//!
//! A destaged batch's new entries are *pending*: held in memory, where
//! every lookup finds them, and written to the file only by the
//! checkpoint that has synced the data they name ([`BlockMap::commit`]).
//! So the file never names a disk block whose data may not be on disk: a
//! power loss before that checkpoint leaves the old entry, naming the old
//! data (the blocks a batch frees are reused only after the checkpoint
//! that covers it). Written straight to the file, an entry of an
//! unflushed write could reach the disk before its data (the kernel
//! writes pages back in no order) and the block read zeros — neither
//! what it held nor what was written.
//!
//! Zero entries (TRIM, WRITE_ZEROES) name no data: those of blocks with
//! no pending entry go to the file at once; a pending entry becomes a
//! pending zero. A lookup reads the file under the (shared) lock of the
//! pending entries, and a commit drops the entries it wrote only after
//! writing them, so a lookup never sees a block's place in the file
//! without its pending entry on top while the two differ.

use crate::files::read_u64s;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The map file and its pending entries.
pub(crate) struct BlockMap {
    file: File,
    pending: RwLock<Pending>,
}

#[derive(Default)]
struct Pending {
    /// Block → (stamp of the change that set it, entry).
    entries: BTreeMap<u64, (u64, u64)>,
    stamp: u64,
}

/// Pending entries taken by a checkpoint: (block, stamp, entry), in block
/// order.
pub(crate) type Taken = Vec<(u64, u64, u64)>;

impl BlockMap {
    pub(crate) fn new(file: File) -> BlockMap {
        BlockMap {
            file,
            pending: RwLock::default(),
        }
    }

    fn shared(&self) -> RwLockReadGuard<'_, Pending> {
        self.pending.read().unwrap_or_else(|e| e.into_inner())
    }

    fn exclusive(&self) -> RwLockWriteGuard<'_, Pending> {
        self.pending.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries `first..first+n` as they stand (pending ones included).
    pub(crate) fn read(&self, first: u64, n: usize) -> io::Result<Vec<u64>> {
        let p = self.shared();
        let mut v = read_u64s(&self.file, first, n)?;
        for (&b, &(_, e)) in p.entries.range(first..first.saturating_add(n as u64)) {
            v[(b - first) as usize] = e;
        }
        Ok(v)
    }

    /// Sets entries `first..` to `values` (pending until a checkpoint);
    /// entries that do not change (a block rewritten in place) are left
    /// alone.
    pub(crate) fn set(&self, first: u64, values: &[u64]) -> io::Result<()> {
        let mut p = self.exclusive();
        let on_file = read_u64s(&self.file, first, values.len())?;
        p.stamp += 1;
        let stamp = p.stamp;
        for (i, (&v, &f)) in values.iter().zip(&on_file).enumerate() {
            let b = first + i as u64;
            match p.entries.get_mut(&b) {
                Some(e) => *e = (stamp, v),
                None if v != f => {
                    p.entries.insert(b, (stamp, v));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Zeros entries `s..e`; returns what they were.
    pub(crate) fn zero(&self, s: u64, e: u64) -> io::Result<Vec<u64>> {
        let mut p = self.exclusive();
        let n = (e - s) as usize;
        let mut old = read_u64s(&self.file, s, n)?;
        p.stamp += 1;
        let stamp = p.stamp;
        // On the file, only the blocks no pending entry covers.
        let mut on_file = old.clone();
        for (&b, v) in p.entries.range_mut(s..e) {
            let i = (b - s) as usize;
            old[i] = v.1;
            on_file[i] = 0;
            *v = (stamp, 0);
        }
        write_zeros(&self.file, s, &on_file)?;
        Ok(old)
    }

    /// The pending entries, for a checkpoint to commit once the data they
    /// name is synced.
    pub(crate) fn take(&self) -> Taken {
        let p = self.shared();
        p.entries.iter().map(|(&b, &(s, e))| (b, s, e)).collect()
    }

    /// Writes `taken` to the file (its data synced: a later change of a
    /// block pending meanwhile keeps its own entry pending) and drops the
    /// entries no change came after. The file is synced by the caller.
    ///
    /// The file is written without the lock: the blocks taken stay
    /// pending until the end, so no lookup, `set` or `zero` reads or
    /// writes their place in the file meanwhile.
    pub(crate) fn commit(&self, taken: &Taken) -> io::Result<()> {
        let mut i = 0;
        while i < taken.len() {
            let mut j = i + 1;
            while j < taken.len() && taken[j].0 == taken[j - 1].0 + 1 && j - i < 1 << 16 {
                j += 1;
            }
            let bytes: Vec<u8> = taken[i..j].iter().flat_map(|t| t.2.to_le_bytes()).collect();
            self.file.write_all_at(&bytes, taken[i].0 * 8)?;
            i = j;
        }
        let mut p = self.exclusive();
        for &(b, stamp, _) in taken {
            if p.entries.get(&b).is_some_and(|&(s, _)| s == stamp) {
                p.entries.remove(&b);
            }
        }
        Ok(())
    }

    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Pending entries.
    pub(crate) fn pending(&self) -> usize {
        self.shared().entries.len()
    }

    /// Copies the map as it stands (pending entries included) to `dst`
    /// with `copy` (the file at `src` to `dst`). The caller keeps `set`
    /// and `zero` from running meanwhile (it holds the destage lock); a
    /// commit may, and writes only blocks pending now, which the copy
    /// gets from memory. Lookups go on while the file is copied.
    pub(crate) fn copy_to(
        &self,
        src: &Path,
        dst: &Path,
        copy: impl FnOnce(&Path, &Path) -> io::Result<()>,
    ) -> io::Result<()> {
        let entries: Vec<(u64, u64)> = self
            .shared()
            .entries
            .iter()
            .map(|(&b, &(_, e))| (b, e))
            .collect();
        copy(src, dst)?;
        if entries.is_empty() {
            return Ok(());
        }
        let f = std::fs::OpenOptions::new().write(true).open(dst)?;
        let mut i = 0;
        while i < entries.len() {
            let mut j = i + 1;
            while j < entries.len() && entries[j].0 == entries[j - 1].0 + 1 && j - i < 1 << 16 {
                j += 1;
            }
            let bytes: Vec<u8> = entries[i..j]
                .iter()
                .flat_map(|e| e.1.to_le_bytes())
                .collect();
            f.write_all_at(&bytes, entries[i].0 * 8)?;
            i = j;
        }
        Ok(())
    }
}

/// Zeros the entries of the runs of `entries` (from block `first`) that
/// are not zero.
fn write_zeros(file: &File, first: u64, entries: &[u64]) -> io::Result<()> {
    let mut i = 0;
    while i < entries.len() {
        if entries[i] == 0 {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < entries.len() && entries[j] != 0 {
            j += 1;
        }
        file.write_all_at(&vec![0u8; (j - i) * 8], (first + i as u64) * 8)?;
        i = j;
    }
    Ok(())
}

/// Map entries (DBN + 1; 0: none) in runs naming neighbouring disk
/// blocks, one I/O each: (first index, end index, first DBN). Zero
/// entries, and those for which `mapped` is false, are in no run.
pub(crate) fn disk_runs(map: &[u64], mapped: impl Fn(usize) -> bool) -> Vec<(usize, usize, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < map.len() {
        if map[i] == 0 || !mapped(i) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < map.len() && mapped(j) && map[j - 1].checked_add(1) == Some(map[j]) {
            j += 1;
        }
        out.push((i, j, map[i] - 1));
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> (tempfile::TempDir, BlockMap) {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(t.path().join("map"))
            .unwrap();
        (t, BlockMap::new(f))
    }

    fn on_file(m: &BlockMap, first: u64, n: usize) -> Vec<u64> {
        read_u64s(&m.file, first, n).unwrap()
    }

    /// New entries are seen at once and reach the file only when
    /// committed; a change after the checkpoint took them stays pending.
    #[test]
    fn entries_reach_the_file_only_when_committed() {
        let (_t, m) = map();
        m.set(10, &[5, 6, 7]).unwrap();
        assert_eq!(m.read(9, 5).unwrap(), vec![0, 5, 6, 7, 0]);
        assert_eq!(on_file(&m, 9, 5), vec![0; 5]);
        let taken = m.take();
        // A later batch changes block 11 while the checkpoint syncs.
        m.set(11, &[9]).unwrap();
        m.commit(&taken).unwrap();
        assert_eq!(on_file(&m, 10, 3), vec![5, 6, 7]);
        assert_eq!(m.read(10, 3).unwrap(), vec![5, 9, 7]);
        assert_eq!(m.pending(), 1);
        m.commit(&m.take()).unwrap();
        assert_eq!(on_file(&m, 10, 3), vec![5, 9, 7]);
        assert_eq!(m.pending(), 0);
        // Unchanged entries (a block rewritten in place) are not pending.
        m.set(10, &[5, 9, 8]).unwrap();
        assert_eq!(m.pending(), 1);
    }

    /// A zero of committed entries goes to the file; of pending ones it
    /// stays pending (a commit running meanwhile writes what it took,
    /// whose data is synced, and the zero stays in force).
    #[test]
    fn zeros_name_no_data() {
        let (_t, m) = map();
        m.set(0, &[1, 2, 3, 4]).unwrap();
        m.commit(&m.take()).unwrap();
        m.set(2, &[30, 40]).unwrap();
        let taken = m.take();
        assert_eq!(m.zero(1, 4).unwrap(), vec![2, 30, 40]);
        assert_eq!(on_file(&m, 0, 4), vec![1, 0, 3, 4]);
        assert_eq!(m.read(0, 4).unwrap(), vec![1, 0, 0, 0]);
        m.commit(&taken).unwrap();
        assert_eq!(on_file(&m, 0, 4), vec![1, 0, 30, 40]);
        assert_eq!(m.read(0, 4).unwrap(), vec![1, 0, 0, 0]);
        m.commit(&m.take()).unwrap();
        assert_eq!(on_file(&m, 0, 4), vec![1, 0, 0, 0]);
        assert_eq!(m.pending(), 0);
    }

    #[test]
    fn a_copy_holds_the_pending_entries() {
        let (t, m) = map();
        m.set(0, &[1, 2]).unwrap();
        m.commit(&m.take()).unwrap();
        m.set(1, &[7, 8]).unwrap();
        let dst = t.path().join("copy");
        m.copy_to(&t.path().join("map"), &dst, |s, d| {
            std::fs::copy(s, d).map(|_| ())
        })
        .unwrap();
        let f = File::open(&dst).unwrap();
        assert_eq!(read_u64s(&f, 0, 3).unwrap(), vec![1, 7, 8]);
        assert_eq!(on_file(&m, 0, 3), vec![1, 2, 0]);
    }
}
