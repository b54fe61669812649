//! The volume against a plain byte array: any sequence of writes, zero
//! writes, trims, flushes, destages and reopenings reads back exactly
//! what the array holds; and iDedup's threshold at work.

use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use strata_volume::report::report;
use strata_volume::{Encryption, Threshold, Volume, VolumeConfig, VolumeKey};

const SIZE: u64 = 64 * 4096;

fn cfg(threshold: u32, dedup: bool) -> VolumeConfig {
    VolumeConfig {
        format: 1,
        size: SIZE,
        block_size: 4096,
        threshold: Threshold::Fixed(threshold),
        cache_bytes: 1 << 20,
        dedup,
        encryption: None,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// offset, length, content seed (few seeds: duplicates happen)
    Write(u64, u64, u8),
    Zero(u64, u64),
    Flush,
    Destage,
    Reopen,
    /// What kill -9 leaves after the buffered writes are destaged (before
    /// a checkpoint): the files copied, the copy opened (journal replay).
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SIZE, 1..40_000u64, 0..4u8).prop_map(|(o, l, s)| Op::Write(o, l.min(SIZE - o), s)),
        // Whole blocks: what goes straight to disk without dedup.
        6 => (0..SIZE / 4096, 1..12u64, 0..4u8)
            .prop_map(|(b, n, s)| Op::Write(b * 4096, n.min(SIZE / 4096 - b) * 4096, s)),
        2 => (0..SIZE, 1..60_000u64).prop_map(|(o, l)| Op::Zero(o, l.min(SIZE - o))),
        1 => Just(Op::Flush),
        1 => Just(Op::Destage),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

/// Content that repeats per 4 KiB block of the absolute offset, so equal
/// seeds at equal alignment give duplicate blocks.
fn content(off: u64, len: u64, seed: u8) -> Vec<u8> {
    (off..off + len)
        .map(|i| {
            ((i / 4096) as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i % 7) as u8)
        })
        .collect()
}

fn read_all(v: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    v.read_at(0, &mut b).unwrap();
    b
}

/// A new volume `v` in `root`, open.
fn fresh(root: &Path, threshold: u32, dedup: bool) -> (std::path::PathBuf, Arc<Volume>) {
    let dir = root.join("v");
    Volume::create(&dir, cfg(threshold, dedup)).unwrap();
    let v = Volume::open(&dir).unwrap();
    (dir, v)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The key of the encrypted volumes of these tests.
fn key(b: u8) -> VolumeKey {
    VolumeKey([b; 32])
}

/// [`cfg`] of a volume encrypted with [`key`]`(1)`.
fn encrypted_cfg(threshold: u32, dedup: bool) -> VolumeConfig {
    VolumeConfig {
        encryption: Some(Encryption::new([7; 16], &key(1))),
        ..cfg(threshold, dedup)
    }
}

fn run(dir: &Path, ops: &[Op], threshold: u32, dedup: bool, encrypted: bool) {
    let (c, k) = match encrypted {
        true => (encrypted_cfg(threshold, dedup), Some(key(1))),
        false => (cfg(threshold, dedup), None),
    };
    Volume::create(dir, c).unwrap();
    let open = |dir: &Path| Volume::open_keyed(dir, k.as_ref()).unwrap();
    let mut v: Arc<Volume> = open(dir);
    let mut model = vec![0u8; SIZE as usize];
    for o in ops {
        match *o {
            Op::Write(off, len, seed) => {
                let c = content(off, len, seed);
                v.write_at(off, &c, false).unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&c);
            }
            Op::Zero(off, len) => {
                v.zero_range(off, len, false).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            Op::Flush => v.flush().unwrap(),
            Op::Destage => v.sync_all().unwrap(),
            Op::Reopen => {
                v.close().unwrap();
                drop(v);
                v = open(dir);
            }
            Op::Crash => {
                v.destage().unwrap();
                let copy = dir.with_extension("crashed");
                copy_dir(dir, &copy);
                v.close().unwrap();
                drop(v);
                std::fs::remove_dir_all(dir).unwrap();
                std::fs::rename(&copy, dir).unwrap();
                v = open(dir);
            }
        }
        // An unaligned read in the middle too.
        let mut b = vec![0u8; 5000];
        v.read_at(1234, &mut b).unwrap();
        assert_eq!(b, model[1234..6234]);
    }
    assert!(read_all(&v) == model);
    v.close().unwrap();
    drop(v);
    let v = open(dir);
    assert!(read_all(&v) == model, "after reopening");
    v.close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn reads_back_what_a_plain_file_would(
        ops in proptest::collection::vec(op(), 1..30),
        threshold in 1u32..5,
        dedup in any::<bool>(),
        encrypted in any::<bool>(),
    ) {
        let t = tempfile::tempdir().unwrap();
        run(&t.path().join("v"), &ops, threshold, dedup, encrypted);
    }
}

/// Whether `hay` holds `needle`.
fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// An encrypted volume (in an encrypted repository): no file of it holds
/// a written block in plain, nor its plain fingerprint — data file,
/// journal (what a crash leaves) and `fps` alike; it reads back only with
/// its key, a frozen image too.
#[test]
fn an_encrypted_volume_keeps_no_plaintext_on_disk() {
    use std::io::Read;
    const MARK: &[u8] = b"STRATA-PLAIN-MARK";
    let block: Vec<u8> = MARK.iter().copied().cycle().take(4096).collect();
    let plain_fp = strata_volume::idedup::fingerprint(&block);
    for dedup in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v");
        Volume::create(&dir, encrypted_cfg(1, dedup)).unwrap();
        let v = Volume::open_keyed(&dir, Some(&key(1))).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        let mut put = |v: &Volume, off: u64, data: &[u8]| {
            v.write_at(off, data, false).unwrap();
            model[off as usize..off as usize + data.len()].copy_from_slice(data);
        };
        // Whole blocks (placed, or in place, without dedup), duplicates of
        // them (deduplicated), a rewrite, and partial blocks (journaled).
        let run: Vec<u8> = block.repeat(8);
        put(&v, 0, &run);
        v.sync_all().unwrap();
        put(&v, 16 * 4096, &run);
        put(&v, 0, &block.repeat(2));
        put(&v, 40 * 4096 + 100, &run[..9000]);
        v.flush().unwrap();
        // What kill -9 leaves now: the journal holds the last writes.
        let crashed = t.path().join("crashed");
        copy_dir(&dir, &crashed);
        v.sync_all().unwrap();
        for d in [&dir, &crashed] {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                let b = std::fs::read(&p).unwrap();
                assert!(
                    !holds(&b, MARK),
                    "{} holds plaintext (dedup {dedup})",
                    p.display()
                );
                assert!(
                    !holds(&b, &plain_fp),
                    "{} holds a plain fingerprint",
                    p.display()
                );
            }
        }
        assert!(read_all(&v) == model);
        // A frozen image reads only with the key.
        let f = v.freeze().unwrap();
        assert!(strata_volume::ImageSource::frozen(&dir, &f.map, None, None).is_err());
        let mut img = Vec::new();
        strata_volume::ImageSource::frozen(&dir, &f.map, None, Some(&key(1)))
            .unwrap()
            .read_to_end(&mut img)
            .unwrap();
        assert!(img == model, "the frozen image");
        drop(f);
        v.close().unwrap();
        // The crash copy replays its journal with the key.
        let e = Volume::open(&crashed).err().expect("opened without a key");
        assert!(e.to_string().contains("encrypted"), "{e}");
        let e = Volume::open_keyed(&crashed, Some(&key(2)))
            .err()
            .expect("a wrong key");
        assert!(e.to_string().contains("does not open"), "{e}");
        let r = Volume::open_keyed(&crashed, Some(&key(1))).unwrap();
        assert!(read_all(&r) == model, "after the replay (dedup {dedup})");
        r.close().unwrap();
        let r = Volume::open_to_read(&dir, Some(&key(1))).unwrap();
        assert!(read_all(&r) == model);
        r.close().unwrap();
    }
}

/// The journal alone carries acknowledged writes across a crash: the
/// files are copied while the volume is running (what kill -9 leaves),
/// and the copy opens with everything written before the flush.
#[test]
fn a_crash_keeps_every_flushed_write() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 2, true);
    let mut model = vec![0u8; SIZE as usize];
    for k in 0..20u64 {
        let off = (k * 12_345) % (SIZE - 9000);
        let c = content(off, 9000, k as u8 % 3);
        v.write_at(off, &c, false).unwrap();
        model[off as usize..off as usize + 9000].copy_from_slice(&c);
        if k == 10 {
            v.sync_all().unwrap();
        }
    }
    v.zero_range(8192, 20_000, false).unwrap();
    model[8192..28_192].fill(0);
    v.flush().unwrap();
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    let r = Volume::open(&crashed).unwrap();
    assert!(read_all(&r) == model);
    r.close().unwrap();
    v.close().unwrap();
}

/// Duplicate runs shorter than the threshold are written anew; longer
/// ones become references; threshold 1 takes them all.
#[test]
fn the_threshold_decides_what_is_deduplicated() {
    for (threshold, want_dedup) in [(1u32, 16u64 + 3), (4, 16), (8, 16), (17, 0)] {
        let t = tempfile::tempdir().unwrap();
        let (dir, v) = fresh(t.path(), threshold, true);
        // Blocks 0..16: a run of 16 distinct blocks; blocks 20..23 distinct too.
        let run: Vec<u8> = (0..16 * 4096)
            .map(|i| (i / 4096 * 7 + i % 13) as u8 + 1)
            .collect();
        let short: Vec<u8> = (0..3 * 4096)
            .map(|i| (i / 4096 * 5 + i % 11) as u8 + 101)
            .collect();
        v.write_at(0, &run, false).unwrap();
        v.write_at(20 * 4096, &short, false).unwrap();
        v.sync_all().unwrap();
        // Their copies: the 16-run at block 32, the 3-run at block 50.
        v.write_at(32 * 4096, &run, false).unwrap();
        v.write_at(50 * 4096, &short, false).unwrap();
        v.close().unwrap();
        let r = report(&dir, "v").unwrap();
        assert_eq!(
            r.deduplicated_blocks, want_dedup,
            "threshold {threshold}: {r:?}"
        );
        assert_eq!(r.logical_blocks_written, 38);
        assert_eq!(r.physical_blocks_written, 38 - want_dedup);
        assert_eq!(r.physical_blocks_in_use, 38 - want_dedup);
        let v = Volume::open(&dir).unwrap();
        let mut b = vec![0u8; 16 * 4096];
        v.read_at(32 * 4096, &mut b).unwrap();
        assert_eq!(b, run);
        // Overwriting the copy frees nothing shared, trimming both frees.
        v.zero_range(0, SIZE, false).unwrap();
        v.close().unwrap();
        let r = report(&dir, "v").unwrap();
        assert_eq!(r.physical_blocks_in_use, 0, "threshold {threshold}");
        // Freed space is reused: writing again does not grow the data file.
        let v = Volume::open(&dir).unwrap();
        v.write_at(0, &run, false).unwrap();
        v.close().unwrap();
        let r = report(&dir, "v").unwrap();
        assert_eq!(r.data_file_blocks, 38 - want_dedup, "threshold {threshold}");
    }
}

/// A run shorter than the threshold is deduplicated when it continues
/// its logical neighbours on disk: two blocks rewritten with what they
/// held map back to their own disk blocks (nothing written, the file
/// stays one run), and the last blocks of a copy that a batch's end cut
/// off join the run before them.
#[test]
fn a_short_run_that_continues_its_neighbours_is_deduplicated() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 4, true);
    let data: Vec<u8> = (0..32 * 4096)
        .map(|i| (i / 4096 * 7 + i % 13) as u8 + 1)
        .collect();
    v.write_at(0, &data, false).unwrap();
    v.sync_all().unwrap();
    // The same two blocks again.
    v.write_at(10 * 4096, &data[10 * 4096..12 * 4096], false)
        .unwrap();
    v.sync_all().unwrap();
    // A copy of blocks 0..16 at 40, its last two in a batch of their own.
    v.write_at(40 * 4096, &data[..14 * 4096], false).unwrap();
    v.sync_all().unwrap();
    v.write_at(54 * 4096, &data[14 * 4096..16 * 4096], false)
        .unwrap();
    v.sync_all().unwrap();
    // And a copy of blocks 16..24 at 56 whose first two came last: they
    // lead into the run after them.
    v.write_at(58 * 4096, &data[18 * 4096..24 * 4096], false)
        .unwrap();
    v.sync_all().unwrap();
    v.write_at(56 * 4096, &data[16 * 4096..18 * 4096], false)
        .unwrap();
    v.close().unwrap();
    let r = report(&dir, "v").unwrap();
    assert_eq!(r.deduplicated_blocks, 2 + 16 + 8, "{r:?}");
    assert_eq!(r.physical_blocks_in_use, 32, "{r:?}");
    assert_eq!(r.data_file_blocks, 32, "nothing new written: {r:?}");
    let v = Volume::open(&dir).unwrap();
    let mut b = vec![0u8; 16 * 4096];
    v.read_at(40 * 4096, &mut b).unwrap();
    assert!(b == data[..16 * 4096], "the copy reads back");
    v.read_at(0, &mut b).unwrap();
    assert!(b == data[..16 * 4096]);
    v.read_at(48 * 4096, &mut b).unwrap();
    assert!(b == data[8 * 4096..24 * 4096], "the second copy reads back");
    v.close().unwrap();
}

/// Data written in one batch by two requests, the later one at lower
/// block numbers, is laid out on disk in the order it came: a later copy
/// of both, in that order, is one duplicate sequence of 8 blocks (in
/// block-number order the copy's source would be two runs of 4, each
/// below threshold 8).
#[test]
fn a_batch_is_laid_out_in_the_order_it_was_written() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 8, true);
    let block = |k: u64| -> Vec<u8> { (0..4096u64).map(|i| (i * 31 + k * 7 + 1) as u8).collect() };
    let a: Vec<u8> = (0..4).flat_map(block).collect();
    let b: Vec<u8> = (4..8).flat_map(block).collect();
    // One batch: A at blocks 40..44, then B at blocks 10..14.
    v.write_at(40 * 4096, &a, false).unwrap();
    v.write_at(10 * 4096, &b, false).unwrap();
    v.sync_all().unwrap();
    // The copy, A then B, at blocks 20..28.
    let copy = [a.clone(), b.clone()].concat();
    v.write_at(20 * 4096, &copy, false).unwrap();
    v.close().unwrap();
    let r = report(&dir, "v").unwrap();
    assert_eq!(r.deduplicated_blocks, 8, "{r:?}");
    let v = Volume::open(&dir).unwrap();
    let mut got = vec![0u8; 8 * 4096];
    v.read_at(20 * 4096, &mut got).unwrap();
    assert_eq!(got, copy);
    v.close().unwrap();
}

/// Without dedup, destage writes a block over its old disk block: a
/// volume written sequentially and then overwritten at random keeps its
/// layout (the data file does not grow), also across a crash replayed
/// from the journal. (The blocks are rewritten before a checkpoint, so the
/// overwrites go through the journal and destage, not straight to disk.)
/// With dedup they go to new blocks.
#[test]
fn overwrites_stay_in_place() {
    for dedup in [false, true] {
        overwrites_stay_in_place_with(dedup);
    }
}

fn overwrites_stay_in_place_with(dedup: bool) {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 1, dedup);
    let n = 48u64;
    let mut model = vec![0u8; SIZE as usize];
    model[..(n * 4096) as usize].copy_from_slice(&content(0, n * 4096, 1));
    v.write_at(0, &model[..(n * 4096) as usize], false).unwrap();
    v.destage().unwrap();
    let len = || std::fs::metadata(dir.join("data")).unwrap().len();
    assert_eq!(len(), n * 4096);
    let journal = journal_bytes(&dir);
    for (k, b) in [5u64, 40, 30, 47, 6, 0, 17].into_iter().enumerate() {
        let c: Vec<u8> = (0..4096u64)
            .map(|i| (i * 13 + k as u64 * 101 + 7) as u8)
            .collect();
        v.write_at(b * 4096, &c, false).unwrap();
        model[(b * 4096) as usize..][..4096].copy_from_slice(&c);
        if k == 3 {
            v.destage().unwrap();
        }
    }
    v.destage().unwrap();
    assert!(
        journal_bytes(&dir) > journal,
        "the overwrites were not journaled"
    );
    match dedup {
        false => assert_eq!(len(), n * 4096, "overwrites allocated new blocks"),
        true => assert_eq!(len(), (n + 7) * 4096, "dedup overwrote in place"),
    }
    assert!(read_all(&v) == model);
    // A crash now: the journal replays the first write and the overwrites.
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    v.close().unwrap();
    let v = Volume::open(&crashed).unwrap();
    assert!(read_all(&v) == model);
    v.close().unwrap();
    // (The replay may lay blocks out anew: with dedup the cache starts
    // cold, without a placed block overwritten in place since is dropped
    // from its record and written again from the later one.)
}

/// Without dedup, a first write goes to new disk blocks at once and the
/// journal records only where (a placed record): reads see it before and
/// after destage, a crash replays it, and a placed write whose data did
/// not reach the disk (unflushed at a power loss: its CRC no longer
/// matches) is dropped — the blocks read as before it, nothing else moves.
#[test]
fn first_writes_are_written_once() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 4, false);
    let mut model = vec![0u8; SIZE as usize];
    let a = content(0, 16 * 4096, 1);
    v.write_at(0, &a, false).unwrap();
    model[..a.len()].copy_from_slice(&a);
    assert!(journal_bytes(&dir) < 4096, "the data went to the journal");
    assert!(read_all(&v) == model, "before destage");
    // Placed again in the same batch (journaled now: it is recent), and
    // a second placed write after a destage.
    let a2 = content(4 * 4096, 4096, 2);
    v.write_at(4 * 4096, &a2, false).unwrap();
    model[4 * 4096..5 * 4096].copy_from_slice(&a2);
    v.destage().unwrap();
    let b = content(32 * 4096, 8 * 4096, 3);
    v.write_at(32 * 4096, &b, false).unwrap();
    model[32 * 4096..40 * 4096].copy_from_slice(&b);
    v.flush().unwrap();
    assert!(read_all(&v) == model, "after destage");
    // A crash: both replay.
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    // A power loss that kept the journal but not the second write's data.
    let lost = t.path().join("lost");
    copy_dir(&dir, &lost);
    v.close().unwrap();
    let r = Volume::open(&crashed).unwrap();
    assert!(read_all(&r) == model, "after a crash");
    r.close().unwrap();
    let data = std::fs::read(lost.join("data")).unwrap();
    let at = data
        .windows(4096)
        .step_by(4096)
        .position(|w| w == &b[..4096])
        .expect("the second write's first block is in the data file");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(lost.join("data"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0u8; 4096], at as u64 * 4096).unwrap();
    // Block by block: the block whose data was lost reads as before the
    // write (zeros), whether or not its map entry was written back.
    let r = Volume::open(&lost).unwrap();
    let mut want = model.clone();
    want[32 * 4096..33 * 4096].fill(0);
    assert!(
        read_all(&r) == want,
        "the lost block is dropped, nothing else"
    );
    // Its blocks are free again and the volume goes on.
    r.write_at(32 * 4096, &b, false).unwrap();
    r.sync_all().unwrap();
    assert!(read_all(&r) == model);
    r.close().unwrap();
}

/// A placed write flushed and destaged, then one of its blocks overwritten
/// in place (through the journal: it is recent): before that overwrite
/// reaches the disk, no journal may still hold the placed record — a power
/// loss could keep the new data without the overwrite's record, and the
/// replay would then find the placed block's checksum changed. What a
/// power loss may leave (the newest journal gone, the data there) reads
/// back every flushed block.
#[test]
fn a_placed_block_is_not_overwritten_while_its_record_can_be_replayed() {
    use strata_volume::journal::{self, Record};
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 4, false);
    let x = content(8 * 4096, 4 * 4096, 1);
    v.write_at(8 * 4096, &x, false).unwrap();
    v.flush().unwrap();
    v.destage().unwrap();
    let y = content(8 * 4096, 4096, 2);
    v.write_at(8 * 4096, &y, false).unwrap();
    v.flush().unwrap();
    v.destage().unwrap();
    let mut model = vec![0u8; SIZE as usize];
    model[8 * 4096..12 * 4096].copy_from_slice(&x);
    model[8 * 4096..9 * 4096].copy_from_slice(&y);
    assert!(read_all(&v) == model);
    let lost = t.path().join("lost");
    copy_dir(&dir, &lost);
    v.close().unwrap();
    let mut overwrite = None;
    for (_, p) in journal::existing(&lost).unwrap() {
        for r in journal::read(&p, 4096).unwrap() {
            match r {
                Record::Placed { block, crcs, .. } => {
                    let end = block + crcs.len() as u64;
                    assert!(
                        end <= 8 || block >= 12,
                        "a placed record of blocks 8..12 is left"
                    );
                }
                Record::Write { block: 8, .. } => overwrite = Some(p.clone()),
                _ => {}
            }
        }
    }
    // The overwrite's record not synced: its journal gone.
    std::fs::remove_file(overwrite.expect("the overwrite's journal")).unwrap();
    let r = Volume::open(&lost).unwrap();
    assert!(read_all(&r) == model, "a flushed block was lost");
    r.close().unwrap();
}

fn journal_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("journal"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Without dedup, an overwrite of blocks written before the last
/// checkpoint goes straight to their disk blocks as a plain file's write
/// would (no journal record, nothing to destage); FLUSH makes it durable
/// and a crash keeps it. Blocks written since the checkpoint still go
/// through the journal (a replay would undo a write in place over them).
#[test]
fn without_dedup_overwrites_go_straight_to_disk() {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 4, false);
    let n = 48u64;
    let mut model = vec![0u8; SIZE as usize];
    model[..(n * 4096) as usize].copy_from_slice(&content(0, n * 4096, 1));
    v.write_at(0, &model[..(n * 4096) as usize], false).unwrap();
    v.sync_all().unwrap();
    let before = journal_bytes(&dir);
    for (k, (b, len)) in [(5u64, 1u64), (6, 4), (47, 1), (20, 8)]
        .into_iter()
        .enumerate()
    {
        let c = content(b * 4096, len * 4096, 10 + k as u8);
        v.write_at(b * 4096, &c, false).unwrap();
        model[(b * 4096) as usize..][..c.len()].copy_from_slice(&c);
    }
    v.flush().unwrap();
    assert_eq!(
        journal_bytes(&dir),
        before,
        "overwrites went to the journal"
    );
    // New blocks go through the journal, and so do their next writes.
    for seed in [3u8, 4] {
        let c = content(50 * 4096, 2 * 4096, seed);
        v.write_at(50 * 4096, &c, false).unwrap();
        model[50 * 4096..52 * 4096].copy_from_slice(&c);
        v.destage().unwrap();
    }
    assert!(journal_bytes(&dir) > before);
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    assert!(read_all(&v) == model);
    v.close().unwrap();
    let r = Volume::open(&crashed).unwrap();
    assert!(read_all(&r) == model, "after a crash");
    assert!(std::fs::metadata(crashed.join("data")).unwrap().len() <= (n + 4) * 4096);
    r.close().unwrap();
    // (The crashed copy lost the count of writes in place since its last
    // checkpoint; the volume closed cleanly has them.)
    let rep = report(&dir, "v").unwrap();
    assert_eq!(rep.logical_blocks_written, n + 14 + 4, "{rep:?}");
}

/// A frozen image keeps its point in time while the volume goes on:
/// blocks overwritten, trimmed and freed after the freeze are not reused
/// while it is held, and the frozen reader sees the old content.
#[test]
fn a_frozen_image_keeps_its_point_in_time() {
    use std::io::Read;
    let t = tempfile::tempdir().unwrap();
    // Dedup off: every write takes new blocks.
    let (dir, v) = fresh(t.path(), 2, false);
    let a = content(0, 16 * 4096, 1);
    v.write_at(0, &a, false).unwrap();
    // Checkpointed: without the freeze, the overwrite below would go
    // straight over A's blocks.
    v.sync_all().unwrap();
    let f = v.freeze().unwrap();
    // After the freeze: overwrite half, trim the rest, write elsewhere,
    // with checkpoints (which would free and reuse A's blocks).
    let b = content(0, 8 * 4096, 2);
    v.write_at(0, &b, false).unwrap();
    v.zero_range(8 * 4096, 8 * 4096, false).unwrap();
    v.sync_all().unwrap();
    // Two 8-block writes: each would fit the hole A's blocks left.
    let c = content(0, 8 * 4096, 3);
    v.write_at(30 * 4096, &c, false).unwrap();
    v.write_at(45 * 4096, &c, false).unwrap();
    v.sync_all().unwrap();
    let mut img = Vec::new();
    strata_volume::ImageSource::frozen(&dir, &f.map, None, None)
        .unwrap()
        .read_to_end(&mut img)
        .unwrap();
    let mut want = vec![0u8; SIZE as usize];
    want[..a.len()].copy_from_slice(&a);
    assert!(img == want, "the frozen image is the volume at the freeze");
    let map = f.map.clone();
    drop(f);
    assert!(!map.exists());
    // The live volume has the later writes.
    let mut now = vec![0u8; SIZE as usize];
    v.read_at(0, &mut now).unwrap();
    let mut want = vec![0u8; SIZE as usize];
    want[..b.len()].copy_from_slice(&b);
    want[30 * 4096..30 * 4096 + c.len()].copy_from_slice(&c);
    want[45 * 4096..45 * 4096 + c.len()].copy_from_slice(&c);
    assert!(now == want);
    v.close().unwrap();
}

/// Readers and writers on several threads while batches are destaged and
/// checkpointed (and freed blocks reused): each thread owns a region,
/// rewrites it with duplicate-prone content and always reads back its
/// last write.
#[test]
fn concurrent_writers_and_readers_see_their_own_writes() {
    let t = tempfile::tempdir().unwrap();
    let (_, v) = fresh(t.path(), 2, true);
    let region = SIZE / 4;
    std::thread::scope(|s| {
        for k in 0..4u64 {
            let v = &v;
            s.spawn(move || {
                let base = k * region;
                for round in 0..60u64 {
                    let len = 4096 * (1 + (round * 7 + k) % 12);
                    let off = base + (round * 4096 * 3) % (region - len);
                    let c = content(off, len, (round % 3) as u8);
                    v.write_at(off, &c, round % 5 == 0).unwrap();
                    let mut b = vec![0u8; len as usize];
                    v.read_at(off, &mut b).unwrap();
                    assert_eq!(b, c, "thread {k} round {round}");
                    if round % 17 == 0 {
                        v.sync_all().unwrap();
                    }
                    if round % 13 == 0 {
                        v.zero_range(off, 4096, false).unwrap();
                        let mut z = vec![1u8; 4096];
                        v.read_at(off, &mut z).unwrap();
                        assert!(z.iter().all(|&x| x == 0));
                    }
                }
            });
        }
    });
    v.close().unwrap();
}

/// A block of write `id` to block `b`: says which block and write it is,
/// so a block read back can be checked to be a whole write of its own.
fn tagged(b: u64, id: u64) -> Vec<u8> {
    let mut v = vec![(id % 251) as u8; 4096];
    v[..8].copy_from_slice(&b.to_le_bytes());
    v[8..16].copy_from_slice(&id.to_le_bytes());
    v
}

fn check_tagged(img: &[u8]) {
    check_tagged_at(img, 0)
}

/// Without dedup, whole-block writes go to disk outside the buffer's lock
/// (placed first writes, writes in place); with dedup, through the
/// journal: threads writing, trimming and reading the same blocks at once
/// leave an image whose every block is a whole write of that block, the
/// same live, after a reopen and after a crash following a FLUSH.
#[test]
fn concurrent_overlapping_writes_agree_with_the_replay() {
    for dedup in [false, true] {
        concurrent_overlapping_writes(dedup);
    }
}

fn concurrent_overlapping_writes(dedup: bool) {
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 1, dedup);
    let blocks = SIZE / 4096;
    std::thread::scope(|s| {
        for k in 0..4u64 {
            let v = &v;
            s.spawn(move || {
                let mut x = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for round in 0..400u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = 1 + x % 8;
                    let b = (x >> 8) % (blocks - n + 1);
                    let id = k << 32 | round;
                    match (x >> 40) % 16 {
                        0 => v.zero_range(b * 4096, n * 4096, false).unwrap(),
                        1 => v.flush().unwrap(),
                        2 => v.sync_all().unwrap(),
                        3 => {
                            let mut r = vec![0u8; (n * 4096) as usize];
                            v.read_at(b * 4096, &mut r).unwrap();
                            check_tagged_at(&r, b);
                        }
                        _ => {
                            let data: Vec<u8> = (b..b + n).flat_map(|i| tagged(i, id)).collect();
                            v.write_at(b * 4096, &data, round % 9 == 0).unwrap();
                        }
                    }
                }
            });
        }
    });
    let live = read_all(&v);
    check_tagged(&live);
    assert!(live.iter().any(|&x| x != 0));
    v.flush().unwrap();
    let copy = dir.with_extension("crashed");
    copy_dir(&dir, &copy);
    v.close().unwrap();
    drop(v);
    let v = Volume::open(&dir).unwrap();
    assert!(read_all(&v) == live, "the reopened volume differs");
    v.close().unwrap();
    let c = Volume::open(&copy).unwrap();
    assert!(read_all(&c) == live, "the volume after a crash differs");
    c.close().unwrap();
}

fn check_tagged_at(img: &[u8], first: u64) {
    for (i, blk) in img.chunks(4096).enumerate() {
        if blk.iter().all(|&x| x == 0) {
            continue;
        }
        let id = u64::from_le_bytes(blk[8..16].try_into().unwrap());
        assert!(blk == tagged(first + i as u64, id).as_slice());
    }
}

/// A partial write beside a write in place of the same block (no dedup)
/// reads the block's edge after that write or before it, never half of
/// it: the block ends as one write after the other.
#[test]
fn a_partial_write_beside_a_write_in_place_keeps_an_order() {
    let t = tempfile::tempdir().unwrap();
    let (_, v) = fresh(t.path(), 1, false);
    v.write_at(0, &tagged(0, 0), false).unwrap();
    for i in 1..1000u64 {
        // Checkpointed: the whole-block write goes in place.
        v.sync_all().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| v.write_at(0, &tagged(0, i), false).unwrap());
            s.spawn(|| v.write_at(2048, &[0xEE; 2048], false).unwrap());
        });
        let mut b = vec![0u8; 4096];
        v.read_at(0, &mut b).unwrap();
        let whole = tagged(0, i);
        let mut after = whole.clone();
        after[2048..].fill(0xEE);
        assert!(b == whole || b == after, "round {i}: neither order");
    }
    v.close().unwrap();
}

/// Without dedup, a flushed overwrite of blocks a journal since the last
/// checkpoint names survives a later write whose record a power loss
/// drops: the replay finds the flushed data, not the older journaled data
/// under it.
#[test]
fn a_flushed_rewrite_survives_a_later_write_lost_in_a_crash() {
    use strata_volume::journal;
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 1, false);
    let a: Vec<u8> = (8..12).flat_map(|b| tagged(b, 1)).collect();
    v.write_at(8 * 4096, &a, false).unwrap();
    v.sync_all().unwrap();
    v.write_at(8 * 4096 + 100, &[5u8; 4096], false).unwrap();
    v.destage().unwrap();
    let y: Vec<u8> = (8..12).flat_map(|b| tagged(b, 2)).collect();
    v.write_at(8 * 4096, &y, false).unwrap();
    v.flush().unwrap();
    v.destage().unwrap();
    let flushed = read_all(&v);
    let (_, newest) = journal::existing(&dir).unwrap().into_iter().last().unwrap();
    let before = std::fs::metadata(&newest).unwrap().len();
    let w: Vec<u8> = (8..12).flat_map(|b| tagged(b, 3)).collect();
    v.write_at(8 * 4096, &w, false).unwrap();
    let after = std::fs::metadata(&newest).unwrap().len();
    assert!(
        after - before >= 4 * 4096,
        "the later write is not in the journal"
    );
    let lost = t.path().join("lost");
    copy_dir(&dir, &lost);
    v.close().unwrap();
    // The later write's record did not reach the disk.
    let name = newest.file_name().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(lost.join(name))
        .unwrap()
        .set_len(before)
        .unwrap();
    let r = Volume::open(&lost).unwrap();
    assert!(read_all(&r) == flushed, "the flushed rewrite is lost");
    r.close().unwrap();
}

/// A power loss after an unflushed overwrite was destaged, as the kernel
/// may leave it: the block map's pages written back, the data's not, the
/// journal record lost. Each block then reads what it held before (or
/// what was written), never zeros: the map file names only data a
/// checkpoint has synced. With dedup, where every write goes to new
/// blocks (without dedup an overwrite goes in place, its map entry
/// unchanged), and a TRIM destaged beside it.
#[test]
fn an_unflushed_overwrite_lost_at_a_power_loss_reads_the_old_data() {
    use strata_volume::journal;
    for threshold in [1, 4] {
        let t = tempfile::tempdir().unwrap();
        let (dir, v) = fresh(t.path(), threshold, true);
        let a: Vec<u8> = (0..32).flat_map(|b| tagged(b, 1)).collect();
        v.write_at(0, &a, false).unwrap();
        v.sync_all().unwrap();
        let durable = std::fs::read(dir.join("data")).unwrap();
        let b: Vec<u8> = (0..24).flat_map(|b| tagged(b, 2)).collect();
        v.write_at(0, &b, false).unwrap();
        v.destage().unwrap();
        // Zeros over blocks just destaged (pending) and over older ones.
        v.zero_range(20 * 4096, 2 * 4096, false).unwrap();
        v.zero_range(28 * 4096, 4 * 4096, false).unwrap();
        v.destage().unwrap();
        let mut now = a.clone();
        now[..b.len()].copy_from_slice(&b);
        now[20 * 4096..22 * 4096].fill(0);
        now[28 * 4096..].fill(0);
        assert!(read_all(&v)[..a.len()] == now[..]);
        let journals = journal::existing(&dir).unwrap();
        let lost = t.path().join("lost");
        copy_dir(&dir, &lost);
        // No checkpoint came between (it would have deleted the journal
        // of the overwrite, and synced its data).
        let held: u64 = journals
            .iter()
            .filter_map(|(_, p)| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        assert!(
            held >= b.len() as u64,
            "a checkpoint ran ({held} journal bytes)"
        );
        v.close().unwrap();
        std::fs::write(lost.join("data"), &durable).unwrap();
        for (_, p) in journals {
            std::fs::remove_file(lost.join(p.file_name().unwrap())).unwrap();
        }
        let r = Volume::open(&lost).unwrap();
        let got = read_all(&r);
        for blk in 0..32usize {
            let g = &got[blk * 4096..(blk + 1) * 4096];
            let (old, new) = (&a[blk * 4096..][..4096], &now[blk * 4096..][..4096]);
            assert!(
                g == old || g == new,
                "block {blk} reads neither its old nor its new data"
            );
        }
        r.close().unwrap();
    }
}

/// Blocks a TRIM frees go back to the file system at the checkpoint that
/// lets them be reused (holes in the data file), with or without dedup,
/// and read back as zeros.
#[test]
fn trimmed_blocks_free_space_on_the_host() {
    use std::os::unix::fs::MetadataExt;
    for dedup in [false, true] {
        let t = tempfile::tempdir().unwrap();
        let (dir, v) = fresh(t.path(), 1, dedup);
        let a: Vec<u8> = (0..48).flat_map(|b| tagged(b, 1)).collect();
        v.write_at(0, &a, false).unwrap();
        v.sync_all().unwrap();
        let used = |d: &Path| std::fs::metadata(d.join("data")).unwrap().blocks() * 512;
        let before = used(&dir);
        assert!(before >= 48 * 4096, "dedup {dedup}: {before}");
        v.zero_range(0, 40 * 4096, false).unwrap();
        v.sync_all().unwrap();
        let after = used(&dir);
        assert!(
            after <= before - 40 * 4096,
            "dedup {dedup}: {before} bytes allocated before the trim, {after} after"
        );
        assert_eq!(report(&dir, "v").unwrap().data_file_allocated_bytes, after);
        let mut b = vec![1u8; 48 * 4096];
        v.read_at(0, &mut b).unwrap();
        assert!(b[..40 * 4096].iter().all(|&x| x == 0) && b[40 * 4096..] == a[40 * 4096..]);
        // Reused: written again, the blocks come back.
        v.write_at(0, &a[..40 * 4096], false).unwrap();
        v.sync_all().unwrap();
        let mut b = vec![0u8; 48 * 4096];
        v.read_at(0, &mut b).unwrap();
        assert!(b == a);
        v.close().unwrap();
    }
}

/// What a snapshot reads: the 2 MiB segments written since the last
/// committed one, through freezes (a served volume's snapshots), clean
/// closes and reopenings (a stopped one's), and none known after a crash.
#[test]
fn snapshots_count_the_segments_written_since_the_last_one() {
    const SEG: u64 = 2 << 20;
    for dedup in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v");
        let c = VolumeConfig {
            size: 8 * SEG,
            ..cfg(4, dedup)
        };
        Volume::create(&dir, c).unwrap();
        let v = Volume::open(&dir).unwrap();
        let changed = |c: Option<Vec<bool>>| -> Vec<usize> {
            let c = c.expect("known");
            (0..c.len()).filter(|&k| c[k]).collect()
        };
        v.write_at(0, &content(0, 4096, 1), false).unwrap();
        let f = v.freeze().unwrap();
        assert_eq!(f.changes(), (None, None), "the first reads everything");
        f.committed("v1");
        drop(f);
        // Whole blocks (placed without dedup), a partial write, a trim.
        v.write_at(3 * SEG + 4096, &content(0, 8192, 2), false)
            .unwrap();
        v.write_at(4 * SEG - 10, &content(0, 20, 2), false).unwrap();
        v.zero_range(6 * SEG, 4096, false).unwrap();
        let f = v.freeze().unwrap();
        let (base, c) = f.changes();
        assert_eq!(base.as_deref(), Some("v1"));
        assert_eq!(changed(c), vec![3, 4, 6], "dedup {dedup}");
        // Written while frozen: counts for the next; this one fails.
        v.write_at(7 * SEG, &content(0, 4096, 3), false).unwrap();
        drop(f);
        let f = v.freeze().unwrap();
        assert_eq!(changed(f.changes().1), vec![3, 4, 6, 7], "given back");
        f.committed("v2");
        drop(f);
        // Stopped: the set survives a clean close, once.
        v.write_at(SEG, &content(0, 4096, 4), false).unwrap();
        v.close().unwrap();
        drop(v);
        let v = Volume::open(&dir).unwrap();
        let cs = v.take_changes();
        assert_eq!(cs.base.as_deref(), Some("v2"));
        assert_eq!(changed(cs.changed()), vec![1]);
        v.snapshot_done(cs, Some("v3"));
        v.write_at(2 * SEG, &content(0, 4096, 5), false).unwrap();
        // A crash (the files as kill -9 leaves them): nothing known.
        v.destage().unwrap();
        let copy = dir.with_extension("crashed");
        copy_dir(&dir, &copy);
        v.close().unwrap();
        drop(v);
        let v = Volume::open(&dir).unwrap();
        let cs = v.take_changes();
        assert_eq!(cs.base.as_deref(), Some("v3"));
        assert_eq!(changed(cs.changed()), vec![2]);
        v.snapshot_done(cs, None);
        v.close().unwrap();
        drop(v);
        let v = Volume::open(&copy).unwrap();
        assert!(v.take_changes().changed().is_none(), "after a crash");
        v.close().unwrap();
    }
}

/// A freeze while clients write: every segment whose content in the
/// frozen image differs from the last committed snapshot's image is in
/// the freeze's change set (writes that came between the set's take and
/// the map's copy are in the image: their segments must be read).
#[test]
fn a_frozen_image_s_change_set_covers_every_write_it_holds() {
    use std::io::Read;
    const SEG: u64 = 2 << 20;
    const SEGS: u64 = 16;
    for dedup in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v");
        let c = VolumeConfig {
            size: SEGS * SEG,
            ..cfg(4, dedup)
        };
        Volume::create(&dir, c).unwrap();
        let v = Volume::open(&dir).unwrap();
        let image = |f: &strata_volume::Frozen| {
            let mut img = Vec::new();
            strata_volume::ImageSource::frozen(&dir, &f.map, None, None)
                .unwrap()
                .read_to_end(&mut img)
                .unwrap();
            img
        };
        let f = v.freeze().unwrap();
        let mut base = image(&f);
        f.committed("v0");
        drop(f);
        // One 1 MiB write into the next segment, sent off as the freeze
        // begins: it lands before the set is taken, between the take and
        // the map's copy, or after it.
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u8)>();
        let writer = {
            let v = v.clone();
            std::thread::spawn(move || {
                while let Ok((k, fill)) = rx.recv() {
                    v.write_at(k * SEG + (1 << 20), &vec![fill; 1 << 20], false)
                        .unwrap();
                }
            })
        };
        for round in 1..=60u64 {
            tx.send((round % SEGS, round as u8)).unwrap();
            let f = v.freeze().unwrap();
            let img = image(&f);
            let (b, changed) = f.changes();
            assert_eq!(b, Some(format!("v{}", round - 1)));
            let changed = changed.unwrap();
            for (k, &c) in changed.iter().enumerate() {
                let r = k * SEG as usize..(k + 1) * SEG as usize;
                assert!(
                    c || img[r.clone()] == base[r],
                    "dedup {dedup}, round {round}: segment {k} changed, not in the set"
                );
            }
            f.committed(&format!("v{round}"));
            drop(f);
            base = img;
        }
        drop(tx);
        writer.join().unwrap();
        v.close().unwrap();
    }
}

/// `check` finds what went wrong with a stopped volume's files: a data
/// block changed on the host's disk (with `read_data`, named by the
/// logical blocks that read it — two, the block being shared), reference
/// counts that disagree with the map, a map entry past the data file;
/// an open volume is refused; an encrypted one's data needs its key.
#[test]
fn check_finds_damage_to_a_stopped_volume() {
    use std::os::unix::fs::FileExt;
    use strata_volume::check::check;
    for encrypted in [false, true] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v");
        let c = match encrypted {
            true => encrypted_cfg(1, true),
            false => cfg(1, true),
        };
        Volume::create(&dir, c).unwrap();
        let k = key(1);
        let k = encrypted.then_some(&k);
        let v = Volume::open_keyed(&dir, k).unwrap();
        let a: Vec<u8> = (0..8).flat_map(|b| tagged(b, 1)).collect();
        v.write_at(0, &a, false).unwrap();
        // The same 8 blocks again at 32: deduplicated (threshold 1).
        v.write_at(32 * 4096, &a, false).unwrap();
        let none = |_: u64, _: u64| {};
        let err = check(&dir, k, false, &none).unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
        v.close().unwrap();
        drop(v);
        let r = check(&dir, k, true, &none).unwrap();
        assert!(r.ok(), "{:?}", r.problems);
        assert_eq!((r.logical_blocks_mapped, r.disk_blocks_in_use), (16, 8));
        assert_eq!(r.blocks_verified, 8);
        if encrypted {
            let e = check(&dir, None, true, &none).unwrap_err();
            assert!(e.to_string().contains("no key"), "{e}");
            assert!(check(&dir, Some(&key(2)), true, &none).is_err());
            assert!(check(&dir, None, false, &none).unwrap().ok());
        }
        // One byte of logical block 5's disk block changed.
        let map = std::fs::File::open(dir.join("map")).unwrap();
        let mut e = [0u8; 8];
        map.read_exact_at(&mut e, 5 * 8).unwrap();
        let dbn = u64::from_le_bytes(e) - 1;
        let data = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("data"))
            .unwrap();
        let mut b = [0u8; 1];
        data.read_exact_at(&mut b, dbn * 4096 + 100).unwrap();
        data.write_all_at(&[b[0] ^ 1], dbn * 4096 + 100).unwrap();
        assert!(check(&dir, k, false, &none).unwrap().ok());
        let r = check(&dir, k, true, &none).unwrap();
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(
            r.problems[0].contains("1 disk block(s) do not match"),
            "{:?}",
            r.problems
        );
        assert!(r.problems[0].contains(": 5, 37"), "{:?}", r.problems);
        data.write_all_at(&b, dbn * 4096 + 100).unwrap();
        // A reference count off by one.
        let refs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("refs"))
            .unwrap();
        refs.write_all_at(&1u32.to_le_bytes(), dbn * 4).unwrap();
        let r = check(&dir, k, false, &none).unwrap();
        assert!(
            r.problems[0].contains("1 reference count(s) differ"),
            "{:?}",
            r.problems
        );
        refs.write_all_at(&2u32.to_le_bytes(), dbn * 4).unwrap();
        // A map entry past the data file.
        let map = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("map"))
            .unwrap();
        map.write_all_at(&1000u64.to_le_bytes(), 60 * 8).unwrap();
        let r = check(&dir, k, false, &none).unwrap();
        assert!(
            r.problems[0].contains("past the data file's end"),
            "{:?}",
            r.problems
        );
    }
}

/// What a kill -9 leaves is no problem for `check` (notes only: the next
/// open replays and recounts), nor is a volume without dedup (read, not
/// verified); a journal damaged before its last record is (the replay
/// would lose the records after it), a torn last record is not.
#[test]
fn check_tells_a_crash_from_damage() {
    use strata_volume::check::check;
    use strata_volume::journal;
    let none = |_: u64, _: u64| {};
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 4, true);
    v.write_at(
        0,
        &(0..8).flat_map(|b| tagged(b, 1)).collect::<Vec<u8>>(),
        false,
    )
    .unwrap();
    v.sync_all().unwrap();
    v.write_at(0, &tagged(0, 2), false).unwrap();
    v.write_at(20 * 4096, &tagged(20, 2), false).unwrap();
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    v.close().unwrap();
    let r = check(&crashed, None, true, &none).unwrap();
    assert!(r.ok() && !r.clean, "{:?}", r.problems);
    assert!(!r.notes.is_empty());
    let (_, newest) = journal::existing(&crashed)
        .unwrap()
        .into_iter()
        .last()
        .unwrap();
    let mut j = std::fs::read(&newest).unwrap();
    assert!(j.len() > 2 * 4096, "two records in the journal");
    // The last record torn: a note.
    std::fs::write(&newest, &j[..j.len() - 100]).unwrap();
    let r = check(&crashed, None, false, &none).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert!(
        r.notes.iter().any(|n| n.contains("torn record")),
        "{:?}",
        r.notes
    );
    // The first record's data changed: the second would be lost.
    j[200] ^= 1;
    std::fs::write(&newest, &j).unwrap();
    let r = check(&crashed, None, false, &none).unwrap();
    assert!(
        r.problems.len() == 1 && r.problems[0].contains("is damaged at byte 0"),
        "{:?}",
        r.problems
    );
    // Without dedup: read, not verified.
    let t2 = tempfile::tempdir().unwrap();
    let (dir2, v2) = fresh(t2.path(), 4, false);
    v2.write_at(0, &tagged(0, 1), false).unwrap();
    v2.close().unwrap();
    let r = check(&dir2, None, true, &none).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!((r.blocks_read, r.blocks_verified), (1, 0));
}

/// A stopped volume grows (old blocks kept, new ones zeros and writable)
/// and, asked to, shrinks (the blocks past the end dropped, their disk
/// blocks freed unless shared with a block kept); refused while open,
/// after an unclean stop, or smaller without `shrink`.
#[test]
fn a_stopped_volume_is_resized() {
    use strata_volume::check::check;
    let none = |_: u64, _: u64| {};
    let t = tempfile::tempdir().unwrap();
    let (dir, v) = fresh(t.path(), 1, true);
    let a: Vec<u8> = (0..8).flat_map(|b| tagged(b, 1)).collect();
    v.write_at(0, &a, false).unwrap();
    // Blocks 60..64: 4 of their own, and 4 more sharing blocks 0..4.
    let b: Vec<u8> = (60..64).flat_map(|b| tagged(b, 1)).collect();
    v.write_at(60 * 4096, &b, false).unwrap();
    v.write_at(56 * 4096, &a[..4 * 4096], false).unwrap();
    let e = Volume::resize(&dir, 2 * SIZE, false).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    // What a kill -9 leaves: refused.
    let crashed = t.path().join("crashed");
    copy_dir(&dir, &crashed);
    let e = Volume::resize(&crashed, 2 * SIZE, false).unwrap_err();
    assert!(e.to_string().contains("not closed cleanly"), "{e}");
    v.close().unwrap();
    drop(v);
    let e = Volume::resize(&dir, strata_volume::volume::MAX_SIZE + 4096, false).unwrap_err();
    assert!(e.to_string().contains("16 TiB"), "{e}");
    let mtime = || {
        std::fs::metadata(dir.join("volume.json"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let created = mtime();
    assert_eq!(Volume::resize(&dir, 2 * SIZE, false).unwrap(), SIZE);
    // The image's time in snapshots.
    assert_eq!(mtime(), created);
    let v = Volume::open(&dir).unwrap();
    assert_eq!(v.size(), 2 * SIZE);
    let mut got = vec![0u8; 2 * SIZE as usize];
    v.read_at(0, &mut got).unwrap();
    assert!(got[..a.len()] == a[..] && got[60 * 4096..64 * 4096] == b[..]);
    assert!(got[SIZE as usize..].iter().all(|&x| x == 0));
    v.write_at(2 * SIZE - 4096, &tagged(127, 1), false).unwrap();
    v.close().unwrap();
    drop(v);
    let e = Volume::resize(&dir, 48 * 4096, false).unwrap_err();
    assert!(e.to_string().contains("--shrink"), "{e}");
    let before = check(&dir, None, true, &none).unwrap();
    assert_eq!(before.disk_blocks_in_use, 8 + 4 + 1);
    assert_eq!(Volume::resize(&dir, 48 * 4096, true).unwrap(), 2 * SIZE);
    let after = check(&dir, None, true, &none).unwrap();
    assert!(after.ok() && after.clean, "{:?}", after.problems);
    // Blocks 0..4 stay referenced by blocks 0..8 (56..60 shared them).
    assert_eq!(after.disk_blocks_in_use, 8);
    assert_eq!(after.logical_blocks_mapped, 8);
    let v = Volume::open(&dir).unwrap();
    assert_eq!(v.size(), 48 * 4096);
    let mut got = vec![0u8; 48 * 4096];
    v.read_at(0, &mut got).unwrap();
    assert!(got[..a.len()] == a[..] && got[a.len()..].iter().all(|&x| x == 0));
    // Grown back: what was dropped reads as zeros.
    v.close().unwrap();
    drop(v);
    Volume::resize(&dir, SIZE, false).unwrap();
    let v = Volume::open(&dir).unwrap();
    assert!(read_all(&v)[48 * 4096..].iter().all(|&x| x == 0));
    v.close().unwrap();
}

/// `extents` tells data from holes across the whole of a large request
/// (the buffer looked at a piece at a time): blocks in the buffer, blocks
/// destaged to the map, zeroed ranges, and never-written ones; at most
/// `EXTENTS_MAX` bytes, and nothing past the end of the volume.
#[test]
fn extents_tell_data_from_holes_across_a_large_request() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("v");
    let mut c = cfg(4, true);
    c.size = 300 << 20;
    Volume::create(&dir, c).unwrap();
    let v = Volume::open(&dir).unwrap();
    let mb = 1u64 << 20;
    // Destaged: 1 MiB at 10 MiB, 8 KiB at 40 MiB; then zeroed: 4 KiB of
    // the first; buffered: 64 KiB at 20 MiB (past the first piece of
    // 4096 blocks) and 4 KiB at 299 MiB.
    v.write_at(10 * mb, &content(10 * mb, mb, 1), false)
        .unwrap();
    v.write_at(40 * mb, &content(40 * mb, 8192, 2), false)
        .unwrap();
    v.destage().unwrap();
    v.zero_range(10 * mb + 4096, 4096, false).unwrap();
    v.write_at(20 * mb, &content(20 * mb, 65536, 3), false)
        .unwrap();
    v.write_at(299 * mb, &content(299 * mb, 4096, 4), false)
        .unwrap();
    // As (start, end, hole), from runs of (length, hole).
    let spans = |offset: u64, len: u64| {
        let mut at = offset;
        v.extents(offset, len)
            .unwrap()
            .into_iter()
            .map(|(l, h)| {
                at += l;
                (at - l, at, h)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        spans(0, 64 * mb),
        vec![
            (0, 10 * mb, true),
            (10 * mb, 10 * mb + 4096, false),
            (10 * mb + 4096, 10 * mb + 8192, true),
            (10 * mb + 8192, 11 * mb, false),
            (11 * mb, 20 * mb, true),
            (20 * mb, 20 * mb + 65536, false),
            (20 * mb + 65536, 40 * mb, true),
            (40 * mb, 40 * mb + 8192, false),
            (40 * mb + 8192, 64 * mb, true),
        ]
    );
    // Unaligned ends; a request larger than EXTENTS_MAX is cut there; the
    // end of the volume.
    assert_eq!(
        spans(10 * mb + 100, 5000),
        vec![
            (10 * mb + 100, 10 * mb + 4096, false),
            (10 * mb + 4096, 10 * mb + 5100, true)
        ]
    );
    let max = strata_volume::volume::EXTENTS_MAX;
    let whole = spans(0, u64::MAX);
    assert_eq!(whole.last().unwrap().1, max);
    assert_eq!(
        spans(299 * mb, 4 * mb),
        vec![
            (299 * mb, 299 * mb + 4096, false),
            (299 * mb + 4096, 300 * mb, true)
        ]
    );
    v.close().unwrap();
}
