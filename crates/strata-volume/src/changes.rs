//! Which parts of a volume were written since its last snapshot, so that
//! `strata volume snapshot` reads only those (the repository takes the
//! rest from that snapshot: `strata_store::ops::backup::patch`).
//!
//! The unit is the fixed chunker's segment, 2 MiB ([`SEGMENT_BLOCKS`]
//! blocks). Every write and zero range marks its segments under the
//! buffer's lock, before it can be seen (a placed write again when it is
//! recorded). A freeze takes the set under that lock, then destages and
//! copies the map: the new set holds every write from the take on, and
//! some of those may be in the image too, so once the map is copied the
//! freeze adds the new set's marks to the one it took ([`Changes::widen`]):
//! the taken set then holds every write its image holds (and perhaps a few
//! more, read for nothing), the new one every write after the take.
//!
//! The set is kept in memory and saved (`changes.json`) only by a clean
//! close, before the volume is marked clean; opening loads and removes
//! it. After a crash there is none, nor after a journal replay: the next
//! snapshot reads everything. A snapshot that is not committed gives its
//! set back; one that is makes its version the base the set counts from.

use crate::error::{Result, VolumeError};
use crate::files::{read_json, write_json};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Blocks per segment: 2 MiB of 4 KiB blocks.
pub const SEGMENT_BLOCKS: u64 = 512;
const FILE: &str = "changes.json";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Saved {
    version: u32,
    base: String,
    segment_blocks: u64,
    segments: u64,
    /// Segments written since `base`.
    changed: Vec<u64>,
}

/// The segments written since the volume's last snapshot.
#[derive(Debug)]
pub(crate) struct Changes {
    /// The snapshot they count from.
    base: Option<String>,
    /// One bit per segment; none: unknown (after a crash).
    dirty: Option<Vec<u64>>,
    segments: u64,
    /// A snapshot counts on the set it took.
    taken: bool,
}

/// What a snapshot reads: the version its changes count from and the
/// segments that may differ from it (none: everything).
#[derive(Debug)]
pub struct ChangeSet {
    pub base: Option<String>,
    words: Option<Vec<u64>>,
    segments: u64,
    /// This snapshot took the volume's set (it gives it back or commits).
    owner: bool,
}

impl ChangeSet {
    /// Per segment, whether it may have changed since [`Self::base`]; none
    /// when everything must be read.
    pub fn changed(&self) -> Option<Vec<bool>> {
        self.base.as_ref()?;
        let w = self.words.as_ref()?;
        Some((0..self.segments).map(|k| bit(w, k)).collect())
    }
}

fn bit(w: &[u64], k: u64) -> bool {
    w.get((k / 64) as usize)
        .is_some_and(|x| x >> (k % 64) & 1 == 1)
}

fn words(segments: u64) -> Vec<u64> {
    vec![0; segments.div_ceil(64) as usize]
}

impl Changes {
    /// Nothing known: the next snapshot reads everything.
    pub(crate) fn unknown(nblocks: u64) -> Changes {
        Changes {
            base: None,
            dirty: None,
            segments: nblocks.div_ceil(SEGMENT_BLOCKS),
            taken: false,
        }
    }

    /// The set a clean close saved in `dir`, removed (a crash from here
    /// on leaves none). Anything wrong with it: unknown.
    pub(crate) fn load(dir: &Path, nblocks: u64) -> Changes {
        let mut c = Changes::unknown(nblocks);
        let p = dir.join(FILE);
        if !p.exists() {
            return c;
        }
        let saved: Option<Saved> = read_json(&p).ok();
        if std::fs::remove_file(&p).is_err() {
            return c;
        }
        let Some(s) = saved else {
            return c;
        };
        let fits = s.version == VERSION
            && s.segment_blocks == SEGMENT_BLOCKS
            && s.segments == c.segments
            && s.changed.iter().all(|&k| k < c.segments);
        if fits {
            let mut w = words(c.segments);
            for k in s.changed {
                w[(k / 64) as usize] |= 1 << (k % 64);
            }
            c.base = Some(s.base);
            c.dirty = Some(w);
        }
        c
    }

    /// Saves the set in `dir` (a clean close), or removes any there.
    pub(crate) fn save(&self, dir: &Path) -> Result<()> {
        let p = dir.join(FILE);
        match (&self.base, &self.dirty) {
            (Some(base), Some(w)) if !self.taken => write_json(
                &p,
                &Saved {
                    version: VERSION,
                    base: base.clone(),
                    segment_blocks: SEGMENT_BLOCKS,
                    segments: self.segments,
                    changed: (0..self.segments).filter(|&k| bit(w, k)).collect(),
                },
            ),
            // A set left there would be loaded by the next open: a close
            // that cannot remove it fails (and the volume is not marked
            // clean).
            _ => match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(VolumeError::Io(p.display().to_string(), e))
                }
                _ => Ok(()),
            },
        }
    }

    /// Blocks `first..end` are being written.
    pub(crate) fn mark(&mut self, first: u64, end: u64) {
        let Some(w) = self.dirty.as_mut() else {
            return;
        };
        if end <= first {
            return;
        }
        for k in first / SEGMENT_BLOCKS..=(end - 1) / SEGMENT_BLOCKS {
            if let Some(x) = w.get_mut((k / 64) as usize) {
                *x |= 1 << (k % 64);
            }
        }
    }

    /// A snapshot takes the set; the volume counts anew from here. A
    /// second snapshot while one holds it reads everything.
    pub(crate) fn take(&mut self) -> ChangeSet {
        if self.taken {
            return ChangeSet {
                base: None,
                words: None,
                segments: self.segments,
                owner: false,
            };
        }
        self.taken = true;
        let w = self.dirty.replace(words(self.segments));
        ChangeSet {
            base: self.base.clone(),
            words: w,
            segments: self.segments,
            owner: true,
        }
    }

    /// Adds to `cs` what was marked since it was taken: a freeze calls it
    /// once its map is copied, as writes that came after the set was taken
    /// may be in the image (marked in this set only).
    pub(crate) fn widen(&self, cs: &mut ChangeSet) {
        if let (true, Some(w), Some(d)) = (cs.owner, cs.words.as_mut(), self.dirty.as_ref()) {
            for (a, b) in w.iter_mut().zip(d) {
                *a |= b;
            }
        }
    }

    /// The snapshot that took `cs` ended: committed as version `id` (the
    /// set now counts from it), or not (its set comes back).
    pub(crate) fn give_back(&mut self, cs: ChangeSet, committed: Option<&str>) {
        if !cs.owner {
            return;
        }
        self.taken = false;
        match committed {
            Some(id) => self.base = Some(id.to_string()),
            None => {
                self.dirty = match (self.dirty.take(), cs.words) {
                    (Some(mut d), Some(w)) => {
                        for (a, b) in d.iter_mut().zip(w) {
                            *a |= b;
                        }
                        Some(d)
                    }
                    _ => None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(cs: &ChangeSet) -> Vec<u64> {
        let v = cs.changed().unwrap();
        (0..v.len() as u64).filter(|&k| v[k as usize]).collect()
    }

    #[test]
    fn a_committed_snapshot_becomes_the_base() {
        let mut c = Changes::unknown(100 * SEGMENT_BLOCKS);
        c.mark(5, 6);
        let first = c.take();
        assert!(first.changed().is_none(), "unknown: everything is read");
        c.mark(SEGMENT_BLOCKS * 3 + 1, SEGMENT_BLOCKS * 5);
        c.give_back(first, Some("v1"));
        c.mark(SEGMENT_BLOCKS * 99, SEGMENT_BLOCKS * 100);
        let second = c.take();
        assert_eq!(second.base.as_deref(), Some("v1"));
        assert_eq!(changed(&second), vec![3, 4, 99]);
        c.give_back(second, Some("v2"));
        let third = c.take();
        assert_eq!(third.base.as_deref(), Some("v2"));
        assert!(changed(&third).is_empty());
    }

    #[test]
    fn a_failed_snapshot_gives_its_set_back() {
        let mut c = Changes::unknown(10 * SEGMENT_BLOCKS);
        let s = c.take();
        c.give_back(s, Some("v1"));
        c.mark(0, 1);
        let failed = c.take();
        // Meanwhile a write, and a second snapshot that reads everything.
        c.mark(SEGMENT_BLOCKS * 9, SEGMENT_BLOCKS * 9 + 1);
        let other = c.take();
        assert!(other.changed().is_none());
        c.give_back(other, Some("v9"));
        c.give_back(failed, None);
        let next = c.take();
        assert_eq!(next.base.as_deref(), Some("v1"));
        assert_eq!(changed(&next), vec![0, 9]);
    }

    #[test]
    fn the_set_survives_a_clean_close_only_once() {
        let d = tempfile::tempdir().unwrap();
        let n = 130 * SEGMENT_BLOCKS - 7;
        let mut c = Changes::unknown(n);
        let s = c.take();
        c.give_back(s, Some("base"));
        c.mark(SEGMENT_BLOCKS * 129, n);
        c.mark(SEGMENT_BLOCKS * 64, SEGMENT_BLOCKS * 64 + 1);
        c.save(d.path()).unwrap();
        let mut l = Changes::load(d.path(), n);
        assert!(!d.path().join(FILE).exists(), "removed once loaded");
        let cs = l.take();
        assert_eq!(cs.base.as_deref(), Some("base"));
        assert_eq!(changed(&cs), vec![64, 129]);
        // Not there: unknown. Another size, or damaged: unknown.
        assert!(Changes::load(d.path(), n).take().changed().is_none());
        c.save(d.path()).unwrap();
        assert!(Changes::load(d.path(), n + SEGMENT_BLOCKS)
            .take()
            .changed()
            .is_none());
        std::fs::write(d.path().join(FILE), b"{").unwrap();
        assert!(Changes::load(d.path(), n).take().changed().is_none());
    }
}
