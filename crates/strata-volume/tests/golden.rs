//! Golden volumes (`tests/golden/volume-1/NAME/`, made once by
//! `cargo test -p strata-volume --test golden -- --ignored make_golden`
//! with the build of their time and never rewritten): each is what a
//! crash left — a checkpointed map, reference counts, fingerprints and
//! data, batches destaged but not checkpointed, and journal files with
//! every kind of record (writes, zero ranges, placed writes) still to
//! replay. This build must open each, replay it and read back the image
//! that was flushed before the crash, byte for byte; and open it again
//! clean. A change to any of the volume's files or records that would
//! strand an old volume fails here.

use std::fs;
use std::path::{Path, PathBuf};
use strata_volume::{Threshold, Volume, VolumeConfig};

const SIZE: u64 = 64 * 4096;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/volume-1")
}

/// The volumes: name, dedup.
const VOLUMES: [(&str, bool); 2] = [("dedup", true), ("plain", false)];

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        // Not state: the lock a live server held, its control socket.
        if name == "lock" || name == "control.sock" {
            continue;
        }
        fs::copy(e.path(), to.join(name)).unwrap();
    }
}

fn read_all(v: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    v.read_at(0, &mut b).unwrap();
    b
}

/// Block `b`'s content in write `round` (distinct per block and round,
/// with some blocks equal across blocks so that dedup finds runs).
fn block(b: u64, round: u64) -> Vec<u8> {
    let seed = if b % 16 < 8 { b % 8 } else { b } + 1000 * round;
    (0..4096u64)
        .map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i * 31) >> 3) as u8)
        .collect()
}

fn blocks(first: u64, n: u64, round: u64) -> Vec<u8> {
    (first..first + n).flat_map(|b| block(b, round)).collect()
}

#[test]
#[ignore = "writes the golden volumes; run once per volume format"]
fn make_golden() {
    let root = golden_dir();
    assert!(
        !root.exists(),
        "{} exists: golden volumes are never rewritten",
        root.display()
    );
    for (name, dedup) in VOLUMES {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join(name);
        let cfg = VolumeConfig {
            format: 1,
            size: SIZE,
            block_size: 4096,
            threshold: Threshold::Fixed(2),
            cache_bytes: 1 << 20,
            dedup,
            encryption: None,
        };
        Volume::create(&dir, cfg).unwrap();
        let v = Volume::open(&dir).unwrap();
        // Checkpointed: first writes (placed without dedup), copies.
        v.write_at(0, &blocks(0, 16, 0), false).unwrap();
        v.write_at(16 * 4096, &blocks(0, 16, 0), false).unwrap();
        v.write_at(40 * 4096, &blocks(40, 8, 0), false).unwrap();
        v.sync_all().unwrap();
        // Destaged, not checkpointed: overwrites (in place without
        // dedup), a partial write, a zero range.
        v.write_at(2 * 4096, &blocks(2, 4, 1), false).unwrap();
        v.write_at(41 * 4096 + 100, &[7u8; 5000], false).unwrap();
        v.zero_range(20 * 4096, 3 * 4096, false).unwrap();
        v.destage().unwrap();
        // Only in journals: more of each kind, and new placed blocks.
        v.write_at(48 * 4096, &blocks(48, 6, 2), false).unwrap();
        v.write_at(8 * 4096, &blocks(0, 4, 0), false).unwrap();
        v.zero_range(44 * 4096 + 10, 4096 * 2, false).unwrap();
        v.write_at(3 * 4096, &blocks(3, 1, 3), true).unwrap();
        v.flush().unwrap();
        let image = read_all(&v);
        let out = root.join(name);
        copy_dir(&dir, &out);
        fs::write(
            out.with_extension("blake3"),
            blake3::hash(&image).to_hex().as_bytes(),
        )
        .unwrap();
        v.close().unwrap();
    }
}

#[test]
fn golden_volumes_replay_and_read_back() {
    let root = golden_dir();
    for (name, dedup) in VOLUMES {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join(name);
        copy_dir(&root.join(name), &dir);
        let want = fs::read_to_string(root.join(name).with_extension("blake3")).unwrap();
        let journals = fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("journal.")
            })
            .count();
        assert!(journals >= 2, "{name}: the fixture has journals to replay");
        assert_eq!(Volume::config(&dir).unwrap().dedup, dedup);
        let v = Volume::open(&dir).unwrap();
        let got = blake3::hash(&read_all(&v)).to_hex().to_string();
        assert_eq!(got, want.trim(), "{name}: the replayed image differs");
        v.close().unwrap();
        let v = Volume::open(&dir).unwrap();
        let again = blake3::hash(&read_all(&v)).to_hex().to_string();
        assert_eq!(
            again,
            want.trim(),
            "{name}: the image differs after a clean close"
        );
        v.close().unwrap();
    }
}
