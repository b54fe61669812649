//! Holds: disk blocks a volume keeps for its repository (linked
//! snapshots, `docs/design-linked-snapshots.md`). Held blocks keep their
//! data through overwrites, trims and reuse; released ones are given back
//! and reused; a crash recounts holds and never gives a release back
//! twice; a damaged hold stops a recount rather than free what it keeps.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use strata_volume::check::check;
use strata_volume::holds;
use strata_volume::{Threshold, Volume, VolumeConfig};

const BLOCK: usize = 4096;
const SIZE: u64 = 256 * BLOCK as u64;

fn cfg(dedup: bool) -> VolumeConfig {
    VolumeConfig {
        format: 1,
        size: SIZE,
        block_size: 4096,
        threshold: Threshold::Fixed(4),
        cache_bytes: 1 << 20,
        dedup,
        encryption: None,
    }
}

/// 4 KiB blocks unlike any other (seed, block index).
fn blocks(seed: u8, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n * BLOCK];
    for (i, b) in v.chunks_mut(BLOCK).enumerate() {
        for (j, x) in b.iter_mut().enumerate() {
            *x = (j as u8).wrapping_mul(seed | 1) ^ (i as u8) ^ seed.rotate_left(3);
        }
        b[..2].copy_from_slice(&[seed, i as u8]);
    }
    v
}

fn fresh(root: &Path, dedup: bool) -> (std::path::PathBuf, Arc<Volume>) {
    let dir = root.join("v");
    Volume::create(&dir, cfg(dedup)).unwrap();
    (dir.clone(), Volume::open(&dir).unwrap())
}

/// Writes `data` at logical block `at`, destaged and checkpointed; its
/// disk blocks.
fn put(v: &Volume, at: u64, data: &[u8]) -> Vec<u64> {
    v.write_at(at * BLOCK as u64, data, false).unwrap();
    v.sync_all().unwrap();
    v.disk_blocks(at, data.len() / BLOCK)
        .unwrap()
        .into_iter()
        .map(|d| d.expect("destaged"))
        .collect()
}

/// The data file's blocks `dbns`, as they are on disk.
fn raw(dir: &Path, dbns: &[u64]) -> Vec<u8> {
    let f = std::fs::File::open(dir.join("data")).unwrap();
    let mut out = vec![0u8; dbns.len() * BLOCK];
    for (i, d) in dbns.iter().enumerate() {
        f.read_exact_at(&mut out[i * BLOCK..(i + 1) * BLOCK], d * BLOCK as u64)
            .unwrap();
    }
    out
}

fn data_blocks(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("data")).unwrap().len() / BLOCK as u64
}

/// What kill -9 leaves: the volume's files (holds too) copied as they are.
fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            crash_copy(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn checked(dir: &Path) -> strata_volume::check::CheckReport {
    let r = check(dir, None, true, &|_, _| {}).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    r
}

#[test]
fn held_blocks_keep_their_data_and_released_ones_are_reused() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let a = blocks(1, 16);
    let held = put(&v, 0, &a);
    v.hold("c1", &held).unwrap();
    // Overwritten, then trimmed, with checkpoints between: without the
    // hold A's blocks would be free after the first.
    put(&v, 0, &blocks(2, 16));
    v.zero_range(0, 8 * BLOCK as u64, false).unwrap();
    v.sync_all().unwrap();
    let end = data_blocks(&dir);
    // New data cannot go to A's blocks: the file grows.
    let c = put(&v, 100, &blocks(3, 16));
    assert!(c.iter().all(|d| !held.contains(d)), "{c:?} reuses {held:?}");
    assert_eq!(data_blocks(&dir), end + 16);
    assert!(raw(&dir, &held) == a, "the held blocks keep A");
    assert_eq!(holds::held(&dir).unwrap(), ["c1"]);
    // A duplicate of A deduplicates against its held blocks.
    let again = put(&v, 200, &a);
    assert_eq!(again, held);
    v.zero_range(200 * BLOCK as u64, 16 * BLOCK as u64, false)
        .unwrap();
    v.sync_all().unwrap();
    // Released while open: given back at the next checkpoint, its file
    // gone, its blocks reused before the file grows.
    assert!(holds::release(&dir, "c1").unwrap());
    assert!(!holds::release(&dir, "c1").unwrap(), "released once");
    v.sync_all().unwrap();
    assert!(std::fs::read_dir(dir.join(holds::DIR))
        .unwrap()
        .next()
        .is_none());
    let end = data_blocks(&dir);
    let d = put(&v, 150, &blocks(4, 16));
    assert_eq!(data_blocks(&dir), end, "reused, not grown");
    assert!(d.iter().all(|x| held.contains(x)), "{d:?} in {held:?}");
    v.close().unwrap();
    let r = checked(&dir);
    assert_eq!((r.holds, r.held_blocks), (0, 0));
}

#[test]
fn check_counts_holds_and_a_release_made_while_stopped_is_given_back() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let a = blocks(5, 8);
    let held = put(&v, 0, &a);
    v.hold("c2", &held).unwrap();
    put(&v, 0, &blocks(6, 8));
    v.close().unwrap();
    // Only the hold keeps A's blocks: the counts on file agree with it.
    let r = checked(&dir);
    assert_eq!((r.holds, r.held_blocks), (1, 8));
    // Released while stopped (as gc would): still counted until the
    // volume gives it back, after its next open.
    assert!(holds::release(&dir, "c2").unwrap());
    assert_eq!(checked(&dir).held_blocks, 8);
    let v = Volume::open(&dir).unwrap();
    v.sync_all().unwrap();
    v.close().unwrap();
    let r = checked(&dir);
    assert_eq!((r.holds, r.held_blocks), (0, 0));
    assert_eq!(r.disk_blocks_in_use, 8, "A's blocks are free");
}

#[test]
fn a_crash_recounts_holds_and_drops_releases_not_given_back() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let a = blocks(7, 8);
    let b = blocks(8, 8);
    let ha = put(&v, 0, &a);
    let hb = put(&v, 8, &b);
    v.hold("ha", &ha).unwrap();
    v.hold("hb", &hb).unwrap();
    put(&v, 0, &blocks(9, 16));
    // hb released; the server dies before a checkpoint picks it up.
    holds::release(&dir, "hb").unwrap();
    let crashed = t.path().join("crashed");
    crash_copy(&dir, &crashed);
    v.close().unwrap();
    let c = Volume::open(&crashed).unwrap();
    // The recount kept ha's blocks and gave hb's back (its file gone).
    assert_eq!(holds::held(&crashed).unwrap(), ["ha"]);
    assert_eq!(
        std::fs::read_dir(crashed.join(holds::DIR)).unwrap().count(),
        1
    );
    // Writes fill hb's freed blocks, never ha's.
    for k in 0..4 {
        let d = put(&c, 40 + 8 * k, &blocks(20 + k as u8, 8));
        assert!(d.iter().all(|x| !ha.contains(x)));
    }
    assert!(raw(&crashed, &ha) == a);
    c.close().unwrap();
    let r = checked(&crashed);
    assert_eq!((r.holds, r.held_blocks), (1, 8));
}

#[test]
fn a_damaged_hold_stops_a_recount() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let h = put(&v, 0, &blocks(10, 4));
    v.hold("h", &h).unwrap();
    let crashed = t.path().join("crashed");
    crash_copy(&dir, &crashed);
    v.close().unwrap();
    let f = crashed.join(holds::DIR).join("h.hold");
    let mut b = std::fs::read(&f).unwrap();
    b[20] ^= 0xff;
    std::fs::write(&f, &b).unwrap();
    let e = Volume::open(&crashed).err().expect("refused").to_string();
    assert!(e.contains("h.hold") && e.contains("not known"), "{e}");
    let r = check(&crashed, None, false, &|_, _| {}).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("checksum")),
        "{:?}",
        r.problems
    );
}

#[test]
fn holds_are_refused_where_they_could_not_keep_data() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let h = put(&v, 0, &blocks(11, 4));
    for bad in ["", "../x", "a.b"] {
        assert!(v.hold(bad, &h).is_err(), "{bad:?}");
    }
    v.hold("ok", &h).unwrap();
    // The same name again: the same blocks are held once (a relink taken
    // up again after a kill — the release below frees them, so they were
    // not counted twice); other blocks are refused.
    v.hold("ok", &h).unwrap();
    assert!(
        v.hold("ok", &h[..2]).is_err(),
        "the same name, other blocks"
    );
    // A block past the data file, and a free one.
    assert!(v.hold("past", &[10_000]).is_err());
    v.zero_range(0, 4 * BLOCK as u64, false).unwrap();
    put(&v, 10, &blocks(12, 4));
    holds::release(&dir, "ok").unwrap();
    v.sync_all().unwrap();
    let e = v.hold("freed", &h[..1]).unwrap_err().to_string();
    assert!(e.contains("free"), "{e}");
    assert_eq!(holds::held(&dir).unwrap(), Vec::<String>::new());
    v.close().unwrap();
    // Without dedup blocks are written in place: no holds.
    let t2 = tempfile::tempdir().unwrap();
    let (_, plain) = fresh(t2.path(), false);
    let d = put(&plain, 0, &blocks(13, 2));
    let e = plain.hold("x", &d).unwrap_err().to_string();
    assert!(e.contains("in place"), "{e}");
    plain.close().unwrap();
}

/// A hold file naming a huge run (well formed, its CRC right) is counted
/// up to the data file's end and reported, not walked block by block; a
/// closed volume takes no holds.
#[test]
fn a_huge_hold_is_reported_and_a_closed_volume_takes_none() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), true);
    let h = put(&v, 0, &blocks(14, 2));
    v.close().unwrap();
    assert!(v.hold("late", &h).is_err(), "closed");
    std::fs::create_dir_all(dir.join(holds::DIR)).unwrap();
    std::fs::write(
        dir.join(holds::DIR).join("huge.hold"),
        holds::encode(&[(0, 1 << 40)]),
    )
    .unwrap();
    let r = check(&dir, None, false, &|_, _| {}).unwrap();
    assert!(
        r.problems.iter().any(|p| p.contains("past the data file")),
        "{:?}",
        r.problems
    );
}
