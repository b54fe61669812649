//! Unit tests of the volume: live figures, holds, map copies, a full
//! disk, the auto threshold.

use crate::config::{Threshold, VolumeConfig, BLOCK};
use crate::error::{Failure, VolumeError};
use crate::files::LIVE_RESERVE;
use crate::files::{clone_or_copy, copy_sparse, read_json, read_json_shared, write_json_in_place};
use crate::mutex::lock;
use crate::state::{Batch, Block, RecentReads, Volume, RECENT_READS};
use std::io;

/// `live.json` is written over its own bytes once it has room (the
/// same file, no other left beside it), padded so that it parses, and
/// made anew when it has not (a longer body, or a file cut short).
#[test]
fn live_figures_are_written_in_place() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("live.json");
    let body = |n: usize| serde_json::json!({ "reads": n, "pad": "x".repeat(n) });
    write_json_in_place(&p, &body(1), LIVE_RESERVE).unwrap();
    let (ino, len) = {
        let m = std::fs::metadata(&p).unwrap();
        (m.ino(), m.len())
    };
    assert!(len >= LIVE_RESERVE as u64);
    write_json_in_place(&p, &body(2), 0).unwrap();
    let m = std::fs::metadata(&p).unwrap();
    assert_eq!((m.ino(), m.len()), (ino, len), "rewritten in place");
    let v: serde_json::Value = read_json_shared(&p).unwrap();
    assert_eq!(v["reads"], 2);
    // Longer than the room it has: a new file, twice as long.
    let big = LIVE_RESERVE + 10;
    write_json_in_place(&p, &body(big), 0).unwrap();
    let m = std::fs::metadata(&p).unwrap();
    assert!(m.ino() != ino && m.len() >= 2 * big as u64);
    let v: serde_json::Value = read_json(&p).unwrap();
    assert_eq!(v["reads"], big);
    // Cut short: made anew, not written past its end.
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(10)
        .unwrap();
    write_json_in_place(&p, &body(3), 0).unwrap();
    let v: serde_json::Value = read_json(&p).unwrap();
    assert_eq!(v["reads"], 3);
    // A tight file (as an older build left it) is given room.
    std::fs::write(&p, serde_json::to_vec(&body(4)).unwrap()).unwrap();
    write_json_in_place(&p, &body(4), LIVE_RESERVE).unwrap();
    assert!(std::fs::metadata(&p).unwrap().len() >= LIVE_RESERVE as u64);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no file left beside it");
}

/// A hold takes back a block a batch has just freed, before the batch's
/// caller makes it pending (`Disk::freeing`): the window in which a
/// served volume's hold for a snapshot, waiting on the disk lock while
/// the batch was applied, saw the block as free and was refused.
#[test]
fn a_hold_takes_back_blocks_a_batch_has_just_freed() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let cfg = VolumeConfig {
        format: 1,
        size: 1 << 20,
        block_size: 4096,
        threshold: Threshold::Fixed(4),
        cache_bytes: 1 << 20,
        dedup: true,
        encryption: None,
    };
    Volume::create(&d, cfg).unwrap();
    let v = Volume::open(&d).unwrap();
    v.write_at(0, &[1u8; BLOCK], false).unwrap();
    v.sync_all().unwrap();
    let old = v.disk_blocks(0, 1).unwrap()[0].expect("destaged");
    // Block 0 written again, applied as the destage thread does.
    let mut batch = Batch::default();
    let buf = Arc::new(vec![2u8; BLOCK]);
    batch.put(0, Block::slices(&buf, 0, 1).next().unwrap());
    let freed = v.apply(&batch).unwrap();
    assert!(freed.contains(&old), "{freed:?}");
    // (Here the destage thread lets the lock go, then takes it again.)
    v.hold("h", &[old]).unwrap();
    lock(&v.disk).free_later(freed);
    assert!(
        !lock(&v.disk).pending_free.contains(&old),
        "held, not to be reused"
    );
    assert!(lock(&v.disk).freeing.is_empty());
}

/// The freeze's copy of a map keeps its holes: a mostly empty map's
/// copy takes about what its data does, and reads back the same.
#[test]
fn a_map_copy_keeps_its_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("map"), dir.path().join("copy"));
    // (The sparse copy itself: a reflink would take its place on XFS.)
    let copy = |a: &std::path::Path, b: &std::path::Path| {
        let (from, to) = (
            std::fs::File::open(a).unwrap(),
            std::fs::File::create(b).unwrap(),
        );
        copy_sparse(&from, &to).unwrap();
    };
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    f.write_all_at(&[7u8; 4096], 0).unwrap();
    f.write_all_at(&[9u8; 100], 40 << 20).unwrap();
    drop(f);
    copy(&src, &dst);
    let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    assert!(a == b, "the copy reads the same");
    let used = std::fs::metadata(&dst).unwrap().blocks() * 512;
    // (A file system that cannot tell holes copies every byte.)
    let src_used = std::fs::metadata(&src).unwrap().blocks() * 512;
    if src_used < 1 << 20 {
        assert!(used < 1 << 20, "{used} bytes taken by the copy");
    }
    // An empty map, and a map that is data only.
    std::fs::File::create(&src)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    copy(&src, &dst);
    assert_eq!(std::fs::read(&dst).unwrap(), vec![0u8; 1 << 20]);
    std::fs::write(&src, [3u8; 12345]).unwrap();
    copy(&src, &dst);
    assert_eq!(std::fs::read(&dst).unwrap(), vec![3u8; 12345]);
    // What the freeze calls: a reflink, or the same copy.
    clone_or_copy(&src, &dst).unwrap();
    assert_eq!(std::fs::read(&dst).unwrap(), vec![3u8; 12345]);
}

/// A full disk stops a volume as one: its writes then get ENOSPC over
/// NBD (not EIO), and the error says it was full.
#[test]
fn a_full_disk_failure_is_told_as_one() {
    let full = io::Error::from_raw_os_error(libc::ENOSPC);
    let f = Failure::of(&VolumeError::Io("fps".into(), full));
    assert_eq!(f.error().kind(), io::ErrorKind::StorageFull);
    assert_eq!(crate::nbd::errno(&f.error()), crate::nbd::ENOSPC);
    assert!(
        f.error().to_string().contains("No space left"),
        "{}",
        f.error()
    );
    let eio = io::Error::from_raw_os_error(libc::EIO);
    let other = Failure::new("syncing".into(), Some(&eio));
    assert_eq!(crate::nbd::errno(&other.error()), crate::nbd::EIO);
    let quota = Failure::new(
        "q".into(),
        Some(&io::Error::from_raw_os_error(libc::EDQUOT)),
    );
    assert_eq!(quota.error().kind(), io::ErrorKind::StorageFull);
    // Any other kind reaches the client as EIO, never as its own EINVAL.
    let einval = io::Error::from_raw_os_error(libc::EINVAL);
    let bad_write = Failure::new("data".into(), Some(&einval));
    assert_eq!(crate::nbd::errno(&bad_write.error()), crate::nbd::EIO);
    let invalid = Failure::of(&VolumeError::Invalid("bad".into()));
    assert_eq!(invalid.error().kind(), io::ErrorKind::Other);
}

#[test]
fn auto_follows_the_latest_reads() {
    let mut r = RecentReads::default();
    assert_eq!(r.median(), None);
    for _ in 0..1000 {
        r.push(32);
    }
    assert_eq!(r.median(), Some(32));
    // Small reads take over once they are most of the window, however
    // many large ones came before.
    for _ in 0..RECENT_READS / 2 + 1 {
        r.push(1);
    }
    assert_eq!(r.median(), Some(1));
}
