//! The link sink (`src/sink.rs`): a backup of a volume's image links the
//! containers it writes to the volume's disk blocks instead of writing
//! them. Here the volume is a data file laid out in another order than
//! the image, and its map and holds are the test's: every container whose
//! chunks the volume places and holds is a link stub, held block by block;
//! a block the volume does not place, or one that does not hold its
//! chunk, or a hold the volume refuses, has that container stored instead
//! — and every version restores byte-exact and checks clean. (The real
//! volume, stopped and served, is `strata-cli/tests/volume_link.rs`.)

// The store's test helpers (small repositories, a deterministic RNG).
#[path = "../../strata-store/tests/common/mod.rs"]
mod common;

use common::*;
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_core::BLOCK_SIZE as BLOCK;
use strata_link::{DirVolumes, LinkSink, SinkCounts, VolumeLink};
use strata_store::ops::backup::patch::{ImagePatch, ReadAt};
use strata_store::ops::backup::{backup, BackupOptions, BackupReport};
use strata_store::Repository;

/// The image, read from memory.
struct Image(Arc<Vec<u8>>);

impl ReadAt for Image {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let s = offset as usize;
        let src = self
            .0
            .get(s..s + buf.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A volume as the sink sees it: image block `b` at disk block
/// `dbn(b)` (None for the blocks in `unplaced`), holds recorded, or
/// refused after `holds_allowed` of them.
struct TestVolume {
    blocks: u64,
    unplaced: HashSet<u64>,
    holds: Mutex<HashMap<String, Vec<u64>>>,
    holds_allowed: usize,
    /// Holds asked for, refused ones included.
    asked: std::sync::atomic::AtomicUsize,
}

fn dbn(b: u64) -> u64 {
    // Neighbours in pairs swapped, past a few blocks of other data.
    7 + (b ^ 1)
}

impl VolumeLink for TestVolume {
    fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        if first + n as u64 > self.blocks {
            return Err(io::Error::other("past the volume's end"));
        }
        Ok((first..first + n as u64)
            .map(|b| (!self.unplaced.contains(&b)).then(|| dbn(b)))
            .collect())
    }

    fn hold(&self, name: &str, dbns: &[u64]) -> io::Result<()> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut h = self.holds.lock().unwrap();
        if h.len() >= self.holds_allowed {
            return Err(io::Error::other("the volume's server is gone"));
        }
        h.insert(name.to_string(), dbns.to_vec());
        Ok(())
    }
}

/// 6 MiB of random data (with a repeated stretch), then 1 MiB of zeros.
fn image() -> Vec<u8> {
    let mut d = random_bytes(5, 6 << 20);
    let copy = d[..256 << 10].to_vec();
    d[4 << 20..(4 << 20) + (256 << 10)].copy_from_slice(&copy);
    d.resize(7 << 20, 0);
    d
}

/// The volume's data file: each image block at its disk block.
fn write_volume(dir: &Path, img: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut disk = vec![0xEEu8; 7 * BLOCK + img.len() + BLOCK];
    for (b, blk) in img.chunks(BLOCK).enumerate() {
        let at = dbn(b as u64) as usize * BLOCK;
        disk[at..at + BLOCK].copy_from_slice(blk);
    }
    std::fs::write(dir.join("data"), disk).unwrap();
}

fn snapshot(repo: &Repository, img: &[u8], vol: Arc<TestVolume>) -> (BackupReport, SinkCounts) {
    let sink = LinkSink::new(repo, "v", None, vol).unwrap();
    let r = backup(
        repo,
        BackupOptions {
            image: Some(ImagePatch {
                name: "v.img".into(),
                source: Box::new(Image(Arc::new(img.to_vec()))),
                size: img.len() as u64,
                base: None,
                changed: None,
                time_ns: 1,
                link: Some(sink.clone() as Arc<dyn strata_store::engine::writer::Linker>),
            }),
            series: Some("volume:v".into()),
            chunker: Some(ChunkerParams::fixed()),
            ..Default::default()
        },
    )
    .unwrap();
    (r, sink.counts())
}

fn restored(repo: &Repository, r: &BackupReport) -> Vec<u8> {
    let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
    let node = recipe.nodes.iter().find(|n| n.path == b"v.img").unwrap();
    let mut out = Vec::new();
    strata_store::ops::restore::dump(repo, &r.snapshot, &recipe, node, &mut out).unwrap();
    out
}

/// Data objects that are link stubs, and those stored.
fn data_objects(root: &Path) -> (usize, usize) {
    let mut n = (0, 0);
    for e in walkdir::WalkDir::new(root.join("data")) {
        let e = e.unwrap();
        if e.file_type().is_file() && !e.file_name().to_string_lossy().starts_with('.') {
            let head = std::fs::read(e.path()).unwrap();
            match head.starts_with(b"STRLINK1") {
                true => n.0 += 1,
                false => n.1 += 1,
            }
        }
    }
    n
}

/// A repository (small containers) with volume `v` beside it.
fn setup(tmp: &Path, img: &[u8]) -> Repository {
    let root = tmp.join("repo");
    let repo = init_repo(&root, false).with_volumes(Some(DirVolumes::at(&root.join("volumes"))));
    write_volume(&root.join("volumes/v"), img);
    repo
}

fn volume(img: &[u8], unplaced: &[u64], holds_allowed: usize) -> Arc<TestVolume> {
    Arc::new(TestVolume {
        blocks: (img.len() / BLOCK) as u64,
        unplaced: unplaced.iter().copied().collect(),
        holds: Mutex::new(HashMap::new()),
        holds_allowed,
        asked: Default::default(),
    })
}

#[test]
fn every_container_placed_is_linked_and_held() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image();
    let repo = setup(tmp.path(), &img);
    let vol = volume(&img, &[], usize::MAX);
    let (r, c) = snapshot(&repo, &img, vol.clone());
    assert!(c.containers > 10, "{c:?}");
    assert_eq!((c.stored_instead, c.hold_failed), (0, 0), "{c:?}");
    // 6 MiB less the repeated 256 KiB, each block once.
    assert_eq!(c.blocks as usize, (6 << 20) / BLOCK - 64, "{c:?}");
    assert_eq!(
        data_objects(&repo_root(tmp.path())),
        (c.containers as usize, 0)
    );
    // Every hold names disk blocks of the image's, each once.
    let holds = vol.holds.lock().unwrap().clone();
    assert_eq!(holds.len() as u64, c.containers);
    let mut all: Vec<u64> = holds.values().flatten().copied().collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "a block held twice");
    assert!(all
        .iter()
        .all(|&d| d >= 7 && d < 7 + (6 << 20) / BLOCK as u64));
    // Almost nothing written: stubs, metadata, index, recipe.
    assert!(
        r.snapshot.stats.new_stored_bytes < 1 << 20,
        "{:?}",
        r.snapshot.stats
    );
    assert!(restored(&repo, &r) == img);
    assert_check_ok(&repo, true, "linked");
}

fn repo_root(tmp: &Path) -> std::path::PathBuf {
    tmp.join("repo")
}

#[test]
fn a_block_the_volume_does_not_place_has_its_container_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image();
    let repo = setup(tmp.path(), &img);
    // Block 300: well into a container (256 KiB: 64 blocks), after a
    // region or more of it (32 KiB) was linked.
    let vol = volume(&img, &[300, 1000], usize::MAX);
    let (r, c) = snapshot(&repo, &img, vol);
    assert_eq!(c.stored_instead, 2, "{c:?}");
    assert_eq!(c.hold_failed, 0, "{c:?}");
    assert_eq!(
        data_objects(&repo_root(tmp.path())),
        (c.containers as usize, 2)
    );
    assert!(restored(&repo, &r) == img);
    assert_check_ok(&repo, true, "two stored");
}

#[test]
fn a_block_that_does_not_hold_its_chunk_has_its_container_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image();
    let repo = setup(tmp.path(), &img);
    // The volume's block of image block 500 holds other bytes.
    let data = repo_root(tmp.path()).join("volumes/v/data");
    let mut disk = std::fs::read(&data).unwrap();
    let at = dbn(500) as usize * BLOCK;
    disk[at + 17] ^= 0x55;
    std::fs::write(&data, disk).unwrap();
    let (r, c) = snapshot(&repo, &img, volume(&img, &[], usize::MAX));
    assert_eq!(c.stored_instead, 1, "{c:?}");
    assert!(restored(&repo, &r) == img);
    assert_check_ok(&repo, true, "one stored");
}

#[test]
fn a_hold_the_volume_refuses_has_the_rest_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image();
    let repo = setup(tmp.path(), &img);
    let vol = volume(&img, &[], 3);
    let (r, c) = snapshot(&repo, &img, vol.clone());
    assert_eq!(c.containers, 3, "{c:?}");
    assert!(c.hold_failed >= 1, "{c:?}");
    // None asked again after the one refused (containers already being
    // linked are stored from the volume's blocks, the next ones as usual).
    assert_eq!(vol.asked.load(std::sync::atomic::Ordering::SeqCst), 4);
    let (stubs, stored) = data_objects(&repo_root(tmp.path()));
    assert_eq!(stubs, 3);
    assert!(stored > 10, "{stored}");
    // The containers whose hold failed keep their markers (the volume
    // may have taken the hold before it failed to answer).
    let markers = std::fs::read_dir(repo_root(tmp.path()).join("links"))
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(markers as u64, 3 + c.hold_failed);
    assert!(restored(&repo, &r) == img);
    assert_check_ok(&repo, true, "holds refused");
}
