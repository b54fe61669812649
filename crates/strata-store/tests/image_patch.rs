//! Images of which only the changed segments are read (`backup::patch`,
//! what `strata volume snapshot` uses): the unchanged segments come from
//! the previous version unread, and the version restores to the image —
//! whatever the repository's index strategy; when the patch does not
//! count from the series' newest version, or the image's size changed,
//! everything is read; a read error commits nothing.

mod common;

use common::backup_with_lifecycle as backup;
use common::*;
use std::io;
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_core::id::SnapshotId;
use strata_store::ops::backup::patch::{ImagePatch, ReadAt, PATCH_SEGMENT};
use strata_store::ops::backup::{BackupOptions, BackupReport};
use strata_store::Repository;

const SEG: usize = PATCH_SEGMENT as usize;

/// An image in memory; records the ranges read.
struct Image {
    data: Arc<Vec<u8>>,
    reads: Arc<Mutex<Vec<(u64, usize)>>>,
    fail_at: Option<u64>,
    /// Whether it tells which segments are zeros without reading them
    /// (as a volume tells its unwritten blocks).
    knows_holes: bool,
}

impl ReadAt for Image {
    fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        if !self.knows_holes {
            return Ok(false);
        }
        if self
            .fail_at
            .is_some_and(|f| f >= offset && f < offset + len)
        {
            return Err(io::Error::other("bad map"));
        }
        let s = offset as usize;
        let src = self.data.get(s..s + len as usize).ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "past the end of the image")
        })?;
        Ok(src.iter().all(|&b| b == 0))
    }

    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self
            .fail_at
            .is_some_and(|f| f >= offset && f < offset + buf.len() as u64)
        {
            return Err(io::Error::other("bad sector"));
        }
        let s = offset as usize;
        let src = self.data.get(s..s + buf.len()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "past the end of the image")
        })?;
        buf.copy_from_slice(src);
        self.reads.lock().unwrap().push((offset, buf.len()));
        Ok(())
    }
}

/// 10.5 segments: random data with a run of zeros in segment 2.
fn image(seed: u64) -> Vec<u8> {
    let mut v = random_bytes(seed, 10 * SEG + SEG / 2);
    v[2 * SEG + 4096..2 * SEG + 40 * 4096].fill(0);
    v
}

fn snap(
    repo: &Repository,
    data: &[u8],
    base: Option<&str>,
    changed: Option<Vec<bool>>,
    fail_at: Option<u64>,
) -> (strata_store::error::Result<BackupReport>, Vec<(u64, usize)>) {
    snap_holes(repo, data, base, changed, fail_at, false)
}

/// [`snap`] of an image that tells its holes or not.
fn snap_holes(
    repo: &Repository,
    data: &[u8],
    base: Option<&str>,
    changed: Option<Vec<bool>>,
    fail_at: Option<u64>,
    knows_holes: bool,
) -> (strata_store::error::Result<BackupReport>, Vec<(u64, usize)>) {
    let reads = Arc::new(Mutex::new(Vec::new()));
    let r = strata_store::ops::backup::backup(
        repo,
        BackupOptions {
            image: Some(ImagePatch {
                name: "vm.img".into(),
                source: Box::new(Image {
                    data: Arc::new(data.to_vec()),
                    reads: reads.clone(),
                    fail_at,
                    knows_holes,
                }),
                size: data.len() as u64,
                base: base.map(str::to_string),
                changed,
                time_ns: 1_700_000_000_000_000_000,
                link: None,
            }),
            series: Some("volume:vm".into()),
            chunker: Some(ChunkerParams::fixed()),
            ..Default::default()
        },
    );
    let got = reads.lock().unwrap().clone();
    (r, got)
}

fn restored(repo: &Repository, r: &BackupReport) -> Vec<u8> {
    let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
    let node = recipe
        .nodes
        .iter()
        .find(|n| n.path == b"vm.img")
        .expect("the image is in the tree");
    let mut out = Vec::new();
    strata_store::ops::restore::dump(repo, &r.snapshot, &recipe, node, &mut out).unwrap();
    out
}

fn changed(n: usize, which: &[usize]) -> Option<Vec<bool>> {
    Some((0..n).map(|k| which.contains(&k)).collect())
}

fn read_bytes(reads: &[(u64, usize)]) -> usize {
    reads.iter().map(|r| r.1).sum()
}

fn only_changed_segments_are_read(index: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = small_init(false);
    o.index = index.into();
    let repo = Repository::init(local(&tmp.path().join("repo")), o).unwrap();
    let mut img = image(1);
    let n = img.len().div_ceil(SEG);
    // The first version: no base, everything read.
    let (r1, reads) = snap(&repo, &img, None, None, None);
    let r1 = r1.unwrap();
    assert_eq!(read_bytes(&reads), img.len());
    assert_eq!(r1.snapshot.stats.read_bytes, img.len() as u64);
    // Segments 3, 7 and the last (partial) one change.
    for k in [3usize, 7] {
        img[k * SEG + 5000..k * SEG + 9000].copy_from_slice(&random_bytes(k as u64, 4000));
    }
    let last = img.len() - 10;
    img[last] ^= 0xff;
    let (r2, reads) = snap(&repo, &img, Some(&r1.id), changed(n, &[3, 7, 10]), None);
    let r2 = r2.unwrap();
    assert_eq!(
        read_bytes(&reads),
        2 * SEG + SEG / 2,
        "{index}: only the changed segments are read: {reads:?}"
    );
    assert_eq!(r2.snapshot.stats.read_bytes, (2 * SEG + SEG / 2) as u64);
    assert!(reads
        .iter()
        .all(|&(o, _)| [3, 7, 10].contains(&(o as usize / SEG))));
    assert_eq!(r2.snapshot.stats.logical_bytes, img.len() as u64);
    assert!(
        r2.snapshot.stats.new_raw_bytes <= 3 * 8192,
        "{index}: {} new bytes",
        r2.snapshot.stats.new_raw_bytes
    );
    assert!(
        restored(&repo, &r2) == img,
        "{index}: the version restores to the image"
    );
    // Nothing changed: nothing read, and the version restores.
    let (r3, reads) = snap(&repo, &img, Some(&r2.id), changed(n, &[]), None);
    let r3 = r3.unwrap();
    assert!(reads.is_empty(), "{reads:?}");
    assert_eq!(r3.snapshot.stats.new_raw_bytes, 0);
    // Its recipe is the previous one's but for the index object.
    assert!(
        r3.snapshot.stats.new_stored_bytes < 8192,
        "{index}: {} bytes stored for an unchanged image",
        r3.snapshot.stats.new_stored_bytes
    );
    assert!(restored(&repo, &r3) == img);
    assert_check_ok(&repo, true, index);
}

#[test]
fn only_changed_segments_are_read_exact() {
    only_changed_segments_are_read("exact");
}

#[test]
fn only_changed_segments_are_read_silo() {
    only_changed_segments_are_read("silo");
}

#[test]
fn only_changed_segments_are_read_segment() {
    only_changed_segments_are_read("segment");
}

#[test]
fn changes_counted_from_another_version_read_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), false);
    let mut img = image(2);
    let n = img.len().div_ceil(SEG);
    let (r1, _) = snap(&repo, &img, None, None, None);
    let r1 = r1.unwrap();
    img[5 * SEG] ^= 1;
    let (r2, _) = snap(&repo, &img, Some(&r1.id), changed(n, &[5]), None);
    let r2 = r2.unwrap();
    // The patch claims nothing changed since r1, but r2 is the newest.
    img[6 * SEG] ^= 1;
    let (r3, reads) = snap(&repo, &img, Some(&r1.id), changed(n, &[6]), None);
    let r3 = r3.unwrap();
    assert_eq!(
        read_bytes(&reads),
        img.len(),
        "not counted from r2: all read"
    );
    assert!(restored(&repo, &r3) == img);
    // A grown image: all read.
    let _ = r2;
    let mut grown = img.clone();
    grown.extend_from_slice(&random_bytes(3, SEG));
    let (r4, reads) = snap(&repo, &grown, Some(&r3.id), changed(n + 1, &[n]), None);
    let r4 = r4.unwrap();
    assert_eq!(read_bytes(&reads), grown.len(), "another size: all read");
    assert!(restored(&repo, &r4) == grown);
}

#[test]
fn a_read_error_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), false);
    let img = image(4);
    let n = img.len().div_ceil(SEG);
    let (r1, _) = snap(&repo, &img, None, None, None);
    let r1 = r1.unwrap();
    let before = repo.list_snapshots().unwrap().len();
    let (r, _) = snap(
        &repo,
        &img,
        Some(&r1.id),
        changed(n, &[4]),
        Some(4 * PATCH_SEGMENT + 77),
    );
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("bad sector") && e.contains("nothing committed"),
        "{e}"
    );
    assert_eq!(repo.list_snapshots().unwrap().len(), before);
}

#[test]
fn a_patch_needs_the_fixed_chunker() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), false);
    let r = backup(
        &repo,
        BackupOptions {
            image: Some(ImagePatch {
                name: "vm.img".into(),
                source: Box::new(Image {
                    data: Arc::new(vec![1; 4096]),
                    reads: Default::default(),
                    fail_at: None,
                    knows_holes: false,
                }),
                size: 4096,
                base: None,
                changed: None,
                time_ns: 0,
                link: None,
            }),
            chunker: Some(ChunkerParams::cdc(8192)),
            ..Default::default()
        },
    );
    assert!(r.unwrap_err().to_string().contains("fixed chunker"));
}

/// An image of several pieces (the recipe's 64 MiB pieces: each stored as
/// a job of its own, the previous version read a piece at a time): the
/// changed segments of the first and the last piece are all that is
/// read, the version restores, counts one file of the image's size, and
/// a version of an unchanged image has the same recipe as the one before.
#[test]
fn an_image_of_several_pieces_is_patched_a_piece_at_a_time() {
    use strata_store::ops::backup::patch::PATCH_PIECE;
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let piece = PATCH_PIECE as usize;
    let mut img = random_bytes(7, 2 * piece + SEG + SEG / 2);
    img[piece - SEG..piece + SEG].fill(0);
    let n = img.len().div_ceil(SEG);
    let (r1, reads) = snap(&repo, &img, None, None, None);
    let r1 = r1.unwrap();
    assert_eq!(read_bytes(&reads), img.len());
    assert!(restored(&repo, &r1) == img);
    let k0 = 5;
    let kl = n - 1;
    img[k0 * SEG + 100] ^= 1;
    img[kl * SEG + 100] ^= 1;
    let (r2, reads) = snap(&repo, &img, Some(&r1.id), changed(n, &[k0, kl]), None);
    let r2 = r2.unwrap();
    assert_eq!(read_bytes(&reads), SEG + SEG / 2, "{reads:?}");
    // The middle piece did not change: its part is the previous one's.
    assert_eq!(r2.carried_bytes, PATCH_PIECE);
    assert_eq!(r2.snapshot.stats.files, 1);
    assert_eq!(r2.snapshot.stats.logical_bytes, img.len() as u64);
    assert!(r2.snapshot.stats.new_raw_bytes <= 2 * 4096);
    assert!(
        restored(&repo, &r2) == img,
        "the version restores to the image"
    );
    restore_stored_in_small_plans(&repo, &r2, &img);
    let (r3, reads) = snap(&repo, &img, Some(&r2.id), changed(n, &[]), None);
    let r3 = r3.unwrap();
    assert!(reads.is_empty());
    assert_eq!(r3.carried_bytes, img.len() as u64 - PATCH_PIECE);
    assert_eq!(r3.snapshot.recipe, r2.snapshot.recipe);
    // diff of the stored versions (content hashed across the pieces, a
    // part at a time) says what diff of the whole recipes says: the image
    // changed from 1 to 2, not from 2 to 3.
    use strata_store::ops::treediff::{diff, diff_snapshots, Change};
    let whole = |s: &strata_core::format::Snapshot| repo.load_recipe(&s.recipe).unwrap();
    let (d12, _) = diff_snapshots(&repo, &r1.snapshot, &r2.snapshot).unwrap();
    let img_change = |d: &[strata_store::ops::treediff::DiffEntry]| {
        d.iter()
            .find(|e| e.path == b"vm.img")
            .map(|e| (e.change, e.what.clone()))
    };
    assert_eq!(
        img_change(&d12),
        Some((Change::Modified, vec!["content"])),
        "{d12:?}"
    );
    let (w12, _) = diff(&whole(&r1.snapshot), &whole(&r2.snapshot));
    assert_eq!(img_change(&w12), img_change(&d12));
    let (d23, _) = diff_snapshots(&repo, &r2.snapshot, &r3.snapshot).unwrap();
    assert!(img_change(&d23).is_none(), "{d23:?}");
    // Read whole again: the same recipe too.
    let (r4, _) = snap(&repo, &img, Some(&r3.id), None, None);
    assert_eq!(r4.unwrap().snapshot.recipe, r2.snapshot.recipe);
    assert_check_ok(&repo, true, "pieces");
}

/// `restore_from` a stored recipe whose image is in pieces, with plans
/// of a few pieces (each read and let go before the next is made): the
/// image comes back whole, and `verify_from` finds it so — and finds a
/// changed byte where it is, and a cut file; `open_stored` reads it too.
fn restore_stored_in_small_plans(repo: &Repository, r: &BackupReport, img: &[u8]) {
    use strata_store::ops::restore::{restore_from, verify_from, RecipeSource, RestoreOptions};
    let t = tempfile::tempdir().unwrap();
    let target = t.path().join("r");
    let source = RecipeSource::Stored {
        repo,
        id: &r.snapshot.recipe,
    };
    let mut few = RestoreOptions::new(&target);
    few.plan_pieces = 3;
    let small = restore_from(repo, &r.snapshot, source, &few).unwrap();
    let file = target.join("vm.img");
    assert!(
        std::fs::read(&file).unwrap() == img,
        "restored in small plans"
    );
    let one = restore_from(
        repo,
        &r.snapshot,
        source,
        &RestoreOptions::new(t.path().join("one")),
    )
    .unwrap();
    assert_eq!(one.plans, 1);
    assert!(small.plans > 1, "{} plans", small.plans);
    assert_eq!(small.bytes, img.len() as u64);
    let v = verify_from(repo, source, &few).unwrap();
    assert_eq!((v.files, v.mismatches.len()), (1, 0), "{:?}", v.mismatches);
    // Opened for random access from the parts: the same bytes, held as
    // runs (zeros, and each region's consecutive chunks).
    let cache = std::sync::Arc::new(strata_store::engine::fsread::RegionCache::new(1 << 20));
    let f = strata_store::engine::fsread::open_stored(
        repo,
        repo,
        &r.snapshot,
        &r.snapshot.recipe,
        b"vm.img",
        cache,
    )
    .unwrap()
    .expect("the image is in the version");
    assert!(f.read_at(0, img.len()).unwrap() == img);
    assert!(
        f.references() < img.len() / 4096 / 8,
        "{} references",
        f.references()
    );
    // Held as its skeleton: the image's pieces, read from their parts,
    // are its chunks.
    let sk = strata_store::repo::skeleton::Skeleton::load(repo, &r.snapshot.recipe).unwrap();
    let whole = repo.load_recipe(&r.snapshot.recipe).unwrap();
    let i = whole
        .nodes
        .iter()
        .position(|n| n.path == b"vm.img")
        .unwrap();
    let want: Vec<_> = whole.nodes[i]
        .segments
        .iter()
        .flat_map(|s| s.chunks.clone())
        .collect();
    let mut got = Vec::new();
    sk.chunks_of(repo, i, |c| got.push(*c)).unwrap();
    assert!(got == want && sk.lens[i] == img.len() as u64);
    // A changed byte in the second piece (past its zeros) is found where
    // it is.
    let at = PATCH_PIECE_BYTES + SEG + 3 * 4096 + 17;
    let mut bad = img.to_vec();
    bad[at] ^= 0xff;
    std::fs::write(&file, &bad).unwrap();
    let v = verify_from(repo, source, &few).unwrap();
    let want = format!("differs from the snapshot at byte {}", at - at % 4096);
    assert!(
        v.mismatches.len() == 1 && v.mismatches[0].contains(&want),
        "{:?}",
        v.mismatches
    );
    std::fs::write(&file, &img[..img.len() - 1]).unwrap();
    let v = verify_from(repo, source, &few).unwrap();
    assert!(
        v.mismatches.len() == 1 && v.mismatches[0].contains("shorter"),
        "{:?}",
        v.mismatches
    );
    let mut long = img.to_vec();
    long.push(0);
    std::fs::write(&file, &long).unwrap();
    let v = verify_from(repo, source, &few).unwrap();
    assert!(
        v.mismatches.len() == 1 && v.mismatches[0].contains("longer"),
        "{:?}",
        v.mismatches
    );
}

const PATCH_PIECE_BYTES: usize = strata_store::ops::backup::patch::PATCH_PIECE as usize;

/// An image backed up beside a tree whose small files wait to be looked
/// up together (`silo` groups them): the image's pieces do not wait for
/// files held back in a group (which never went to a worker).
#[test]
fn an_image_beside_grouped_small_files_does_not_wait_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = small_init(false);
    o.index = "silo".into();
    let repo = Repository::init(local(&tmp.path().join("repo")), o).unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..20 {
        std::fs::write(tree.join(format!("f{i}")), random_bytes(i, 300)).unwrap();
    }
    let img = random_bytes(3, 3 * SEG);
    let (tx, rx) = std::sync::mpsc::channel();
    let repo2 = repo.clone();
    let img2 = img.clone();
    std::thread::spawn(move || {
        let r = strata_store::ops::backup::backup(
            &repo2,
            BackupOptions {
                paths: vec![tree],
                image: Some(ImagePatch {
                    name: "zz.img".into(),
                    source: Box::new(Image {
                        data: Arc::new(img2),
                        reads: Arc::default(),
                        fail_at: None,
                        knows_holes: false,
                    }),
                    size: 3 * SEG as u64,
                    base: None,
                    changed: None,
                    time_ns: 1,
                    link: None,
                }),
                chunker: Some(ChunkerParams::fixed()),
                ..Default::default()
            },
        );
        let _ = tx.send(r.map(|r| r.snapshot.stats.files));
    });
    let files = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the backup finished")
        .unwrap();
    assert_eq!(files, 21);
}

/// Segments the image tells are zeros without reading them (a volume's
/// unwritten blocks) are neither read nor hashed, wherever they lie: in a
/// block being read, a whole piece, the image's partial last segment. The
/// version is the one reading them would give (the same recipe), and a
/// patch reads only the changed segments that are not holes.
#[test]
fn segments_known_to_be_zeros_are_not_read() {
    use strata_store::ops::backup::patch::PATCH_PIECE;
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let piece = PATCH_PIECE as usize;
    let mut img = random_bytes(9, 2 * piece + SEG + SEG / 2);
    img[SEG..3 * SEG].fill(0);
    img[piece..2 * piece].fill(0);
    img[2 * piece + SEG..].fill(0);
    // Zeros, but not a whole segment: read.
    img[4 * SEG..5 * SEG - 4096].fill(0);
    let n = img.len().div_ceil(SEG);
    let holes = |k: usize| {
        img[k * SEG..((k + 1) * SEG).min(img.len())]
            .iter()
            .all(|&b| b == 0)
    };
    let hole_bytes = 2 * SEG + piece + SEG / 2;
    let (r1, reads) = snap_holes(&repo, &img, None, None, None, true);
    let r1 = r1.unwrap();
    assert_eq!(read_bytes(&reads), img.len() - hole_bytes, "{reads:?}");
    assert_eq!(
        r1.snapshot.stats.read_bytes,
        (img.len() - hole_bytes) as u64
    );
    assert_eq!(r1.snapshot.stats.logical_bytes, img.len() as u64);
    for &(o, len) in &reads {
        let (a, b) = (o as usize / SEG, (o as usize + len - 1) / SEG);
        assert!((a..=b).all(|k| !holes(k)), "a hole read: {o}+{len}");
    }
    assert!(
        restored(&repo, &r1) == img,
        "the version restores to the image"
    );
    // Read whole: the same recipe.
    let (r2, reads) = snap(&repo, &img, Some(&r1.id), None, None);
    let r2 = r2.unwrap();
    assert_eq!(read_bytes(&reads), img.len());
    assert_eq!(r2.snapshot.recipe, r1.snapshot.recipe);
    // A hole written, another flagged changed but still a hole: only
    // the written one is read.
    img[SEG + 10] = 5;
    let (r3, reads) = snap_holes(&repo, &img, Some(&r2.id), changed(n, &[1, 40]), None, true);
    let r3 = r3.unwrap();
    assert_eq!(reads, vec![(SEG as u64, SEG)]);
    assert!(restored(&repo, &r3) == img);
    assert!(
        r3.snapshot.stats.new_raw_bytes <= 4096,
        "{:?}",
        r3.snapshot.stats
    );
    // The image cannot tell: nothing is committed.
    let before = repo.list_snapshots().unwrap().len();
    let at = Some(40 * PATCH_SEGMENT + 4096);
    let (r, _) = snap_holes(&repo, &img, Some(&r3.id), changed(n, &[40]), at, true);
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("bad map") && e.contains("nothing committed"),
        "{e}"
    );
    assert_eq!(repo.list_snapshots().unwrap().len(), before);
    assert_check_ok(&repo, true, "holes");
}

/// A piece none of whose segments changed is taken over without reading
/// its part: the recipe index tells which piece each part holds alone
/// (structure version 4). Shown by damaging a part: a version that changes
/// another piece does not read it. As a deduplicated chunk is, the part is
/// checked to be there: a missing one is read (found damaged), its piece
/// read from the image and its part written again.
#[test]
fn unchanged_pieces_are_taken_over_unread() {
    use strata_core::format::RecipeObject;
    use strata_store::ops::backup::patch::PATCH_PIECE;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    let repo = Repository::init(local(&root), small_init(false)).unwrap();
    let piece = PATCH_PIECE as usize;
    let mut img = random_bytes(8, 3 * piece + SEG);
    let n = img.len().div_ceil(SEG);
    let r1 = snap(&repo, &img, None, None, None).0.unwrap();
    let RecipeObject::Index(idx) =
        strata_store::repo::recipe::load_object(&repo, &r1.snapshot.recipe).unwrap()
    else {
        panic!("a recipe of parts");
    };
    let told: Vec<(u64, u64)> = idx
        .parts
        .iter()
        .filter_map(|p| p.piece.as_ref().filter(|_| p.nodes == 1))
        .map(|p| (p.offset, p.len))
        .collect();
    let p = PATCH_PIECE;
    assert!(
        told.ends_with(&[(p, p), (2 * p, p), (3 * p, SEG as u64)]),
        "{told:?}"
    );
    // Nothing changed: every piece after the first taken over.
    let (r2, reads) = snap(&repo, &img, Some(&r1.id), changed(n, &[]), None);
    let r2 = r2.unwrap();
    assert!(reads.is_empty());
    assert_eq!(r2.carried_bytes, img.len() as u64 - p);
    assert_eq!(r2.snapshot.recipe, r1.snapshot.recipe);
    // The second piece's part damaged: a version changing the last piece
    // does not read it.
    let second = idx
        .parts
        .iter()
        .find(|x| x.piece.as_ref().is_some_and(|pc| pc.offset == p))
        .unwrap();
    let path = root.join(strata_store::repo::recipe::part_name(&second.id));
    let saved = std::fs::read(&path).unwrap();
    std::fs::write(&path, vec![0x5a; saved.len()]).unwrap();
    img[3 * piece + 100] ^= 1;
    let (r3, reads) = snap(&repo, &img, Some(&r2.id), changed(n, &[n - 1]), None);
    let r3 = r3.unwrap();
    assert!(r3.warnings.is_empty(), "{:?}", r3.warnings);
    assert_eq!(reads, vec![(3 * p, SEG)]);
    assert_eq!(r3.carried_bytes, 2 * p);
    std::fs::write(&path, &saved).unwrap();
    assert!(
        restored(&repo, &r3) == img,
        "the version restores to the image"
    );
    // The part gone: read instead, found missing, the piece read from the
    // image and its part written again.
    std::fs::remove_file(&path).unwrap();
    let (r4, reads) = snap(&repo, &img, Some(&r3.id), changed(n, &[]), None);
    let r4 = r4.unwrap();
    assert!(
        r4.warnings.iter().any(|w| w.contains("damaged")),
        "{:?}",
        r4.warnings
    );
    assert!(read_bytes(&reads) >= piece, "{reads:?}");
    assert!(path.exists(), "the part is written again");
    assert!(restored(&repo, &r4) == img);
    assert_check_ok(&repo, true, "carried unread");
}

/// A sparse image's zeros are recorded as runs, one reference per run of
/// a segment instead of one per 4 KiB chunk (an empty 100 GiB volume's
/// recipe held 1.2 GB of them in memory); a segment taken over from the
/// previous version keeps its fingerprint, its zero runs expanded again
/// for it; and the version reads back.
#[test]
fn zeros_are_recorded_as_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    // Segment 2 holds zeros from its 2nd to its 40th chunk; 5 and 6 are
    // zeros, 6 known so without reading.
    let mut img = image(4);
    img[5 * SEG..7 * SEG].fill(0);
    let n = img.len().div_ceil(SEG);
    let (r1, _) = snap_holes(&repo, &img, None, None, None, true);
    let r1 = r1.unwrap();
    img[3 * SEG + 100] ^= 1;
    let (r2, reads) = snap_holes(&repo, &img, Some(&r1.id), changed(n, &[3]), None, true);
    let r2 = r2.unwrap();
    assert_eq!(reads, vec![(3 * SEG as u64, SEG)]);
    let segments = |r: &BackupReport| {
        let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
        let node = recipe.nodes.iter().find(|n| n.path == b"vm.img").unwrap();
        node.segments.clone()
    };
    let (s1, s2) = (segments(&r1), segments(&r2));
    assert_eq!(s1.len(), n);
    for s in [&s1, &s2] {
        let zeros: Vec<_> = s[2].chunks.iter().filter(|c| c.is_zero()).collect();
        assert_eq!(zeros.len(), 1, "one run: {zeros:?}");
        assert_eq!((zeros[0].len, zeros[0].chunk_count()), (39 * 4096, 39));
        assert_eq!(s[2].chunks.len(), SEG / 4096 - 38);
        for k in [5, 6] {
            assert_eq!(
                s[k].chunks,
                vec![strata_core::format::ChunkRef::zeros(SEG as u32, 512)]
            );
        }
        assert!(s.iter().all(|s| s.chunk_count() == s.len().div_ceil(4096)));
    }
    // Unchanged segments, zeros and all, kept their fingerprints.
    for k in (0..n).filter(|&k| k != 3) {
        assert_eq!(s1[k].fp, s2[k].fp, "segment {k}");
    }
    assert_ne!(s1[3].fp, s2[3].fp);
    assert!(restored(&repo, &r2) == img);
    assert_check_ok(&repo, true, "zero runs");
    // A run that counts more chunks than it has bytes (damage, or another
    // writer's bug): check warns; the version still reads as its bytes;
    // the next patch reads that segment again rather than expanding it
    // (into a billion chunks).
    let mut recipe = repo.load_recipe(&r2.snapshot.recipe).unwrap();
    let node = recipe
        .nodes
        .iter_mut()
        .find(|n| n.path == b"vm.img")
        .unwrap();
    let run = node.segments[2]
        .chunks
        .iter_mut()
        .find(|c| c.is_zero())
        .unwrap();
    run.offset = 1 << 30;
    let (rid, _) = strata_store::repo::recipe::writer::put(&repo, recipe).unwrap();
    let mut odd = r2.snapshot.clone();
    odd.recipe = rid;
    repo.replace_snapshot(&r2.id, &odd).unwrap();
    let rep = strata_store::ops::check::check_ok(&repo, true).unwrap();
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("runs of zero chunks count more")),
        "{:?}",
        rep.warnings
    );
    let r2 = BackupReport {
        snapshot: odd,
        ..r2
    };
    assert!(restored(&repo, &r2) == img);
    img[7 * SEG] ^= 1;
    let (r3, reads) = snap_holes(&repo, &img, Some(&r2.id), changed(n, &[7]), None, true);
    let r3 = r3.unwrap();
    // (Segment 2 read again; the rest of the piece after it is read too.)
    assert!(
        reads.first() == Some(&(2 * SEG as u64, 2 * SEG)),
        "{reads:?}"
    );
    assert!(restored(&repo, &r3) == img);
    assert_eq!(segments(&r3)[2].chunk_count(), 512);
}

/// The lifecycle of an image in pieces, each step reading its recipes a
/// part at a time (`for_each_segment`, `rewrite_pieces`): `maintain`
/// reverse-deduplicates the two older versions (a dry run first, which
/// reports the same and changes nothing), `forget` of the middle one
/// rebases the oldest onto the newest, `gc` compacts the pool. Every
/// remaining version restores to its image, the archival one stays in
/// pieces, and `check` reads everything back.
#[test]
fn an_image_in_pieces_goes_through_the_lifecycle() {
    use strata_store::ops::forget::forget;
    use strata_store::ops::gc::{gc, GcOptions};
    use strata_store::revdedup::{maintain, MaintainOptions};
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let (reports, images) = three_versions_in_pieces(&repo);
    let ids: Vec<SnapshotId> = reports.iter().map(|r| r.id.clone()).collect();
    let current = |id: &SnapshotId| repo.load_snapshot(id).unwrap();
    let before: Vec<_> = ids.iter().map(&current).collect();
    let dry = maintain(
        &repo,
        &MaintainOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dry.converted.len(), 2, "{dry:?}");
    let after_dry: Vec<_> = ids.iter().map(&current).collect();
    assert_eq!(before, after_dry, "a dry run changes nothing");
    let m = maintain(&repo, &MaintainOptions::default()).unwrap();
    assert_eq!(m.converted.len(), 2, "{m:?}");
    for (d, c) in dry.converted.iter().zip(&m.converted) {
        assert_eq!(
            (
                d.id.as_str(),
                d.direct_chunks,
                d.indirect_chunks,
                d.released_bytes
            ),
            (
                c.id.as_str(),
                c.direct_chunks,
                c.indirect_chunks,
                c.released_bytes
            )
        );
        assert!(c.indirect_chunks > 0 && c.direct_chunks > 0, "{c:?}");
    }
    for (i, id) in ids.iter().enumerate() {
        let s = current(id);
        assert_eq!(s.archival.is_some(), i < 2, "version {}", i + 1);
        let r = BackupReport {
            snapshot: s,
            ..reports[i].clone()
        };
        assert!(
            restored(&repo, &r) == images[i],
            "version {} after maintain",
            i + 1
        );
    }
    let stored = || {
        strata_store::repo::index::RepoIndex::load_summaries(&repo)
            .unwrap()
            .stored_bytes()
    };
    let before_forget = stored();
    let f = forget(&repo, &[ids[1].to_string()]).unwrap();
    assert_eq!(f.rebased, vec![ids[0].to_string()], "{f:?}");
    let oldest = current(&ids[0]);
    assert_eq!(
        oldest.archival.as_ref().and_then(|a| a.next.as_ref()),
        Some(&ids[2])
    );
    assert!(
        strata_store::repo::recipe::part_ids(&repo, &oldest.recipe)
            .unwrap()
            .len()
            > 1,
        "the archival version is still stored in pieces"
    );
    let g = gc(&repo, &GcOptions::default()).unwrap();
    assert!(
        stored() < before_forget,
        "the forgotten version's data is freed: {f:?} {g:?}"
    );
    for i in [0, 2] {
        let r = BackupReport {
            snapshot: current(&ids[i]),
            ..reports[i].clone()
        };
        assert!(
            restored(&repo, &r) == images[i],
            "version {} after gc",
            i + 1
        );
    }
    assert_check_ok(&repo, true, "after the lifecycle");
}

/// Three versions of an image of two pieces and a segment, each changing a
/// segment in the first, the second and the last piece.
fn three_versions_in_pieces(repo: &Repository) -> (Vec<BackupReport>, Vec<Vec<u8>>) {
    use strata_store::ops::backup::patch::PATCH_PIECE;
    let piece = PATCH_PIECE as usize;
    let mut img = random_bytes(11, 2 * piece + SEG);
    let n = img.len().div_ceil(SEG);
    let mut images = Vec::new();
    let mut reports: Vec<BackupReport> = Vec::new();
    for v in 0..3u64 {
        let which = [1, n / 2, n - 1];
        if v > 0 {
            for k in which {
                let fresh = random_bytes(100 * v + k as u64, SEG.min(img.len() - k * SEG));
                img[k * SEG..k * SEG + fresh.len()].copy_from_slice(&fresh);
            }
        }
        let base = reports.last().map(|r| r.id.clone());
        let c = base.as_ref().map(|_| changed(n, &which).unwrap());
        let (r, _) = snap(repo, &img, base.as_deref(), c, None);
        reports.push(r.unwrap());
        images.push(img.clone());
    }
    (reports, images)
}

/// `check` follows a chain of two reverse-dedup hops holding only the
/// fingerprints of the version the next one checked points at: a chunk
/// the three versions share, stored once by the newest, is lost with its
/// container; all three are damaged, the two older ones as missing data
/// the chain leads to (not as references the next version does not hold,
/// which is what a table let go too early would say).
#[test]
fn check_follows_a_chain_of_image_versions() {
    use strata_store::revdedup::{maintain, MaintainOptions};
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let (reports, _) = three_versions_in_pieces(&repo);
    let m = maintain(&repo, &MaintainOptions::default()).unwrap();
    assert_eq!(m.converted.len(), 2, "{m:?}");
    assert_check_ok(&repo, false, "a chain of three");
    // Segment 0 never changed: the newest holds it directly, the two older
    // ones through the chain.
    let newest = repo.load_snapshot(&reports[2].id).unwrap();
    let recipe = repo.load_recipe(&newest.recipe).unwrap();
    let c = &recipe.nodes[0].segments[0].chunks[0];
    assert!(c.is_direct());
    let cid = recipe.containers[c.container as usize];
    let name = strata_store::repo::data_name(&cid);
    std::fs::remove_file(tmp.path().join("repo").join(&name)).unwrap();
    let rep = strata_store::ops::check::check(&repo, &Default::default()).unwrap();
    let mut damaged = rep.damaged_snapshots.clone();
    damaged.sort();
    let mut all: Vec<String> = reports.iter().map(|r| r.id.to_string()).collect();
    all.sort();
    assert_eq!(damaged, all, "{:?}", rep.errors);
    assert!(
        !rep.errors.iter().any(|e| e.contains("does not hold")),
        "{:?}",
        rep.errors
    );
}

/// Version `id` of the image dumped from `data` (the tier holding its
/// chunks), its recipe read from `names` (which keeps every recipe).
fn dumped_from(names: &Repository, data: &Repository, id: &SnapshotId) -> Vec<u8> {
    let s = names.load_snapshot(id).unwrap();
    let recipe = names.load_recipe(&s.recipe).unwrap();
    let node = recipe.nodes.iter().find(|n| n.path == b"vm.img").unwrap();
    let mut out = Vec::new();
    strata_store::ops::restore::dump(data, &s, &recipe, node, &mut out).unwrap();
    out
}

/// The cloud tier moves an image in pieces a recipe part at a time
/// (`send_stored`, `rewrite_pieces`): the two older versions,
/// reverse-deduplicated, migrate with every reference pointed into the
/// bucket; the bucket's gc after the oldest is forgotten rewrites the
/// other's recipe; recall brings it back; seeding sends the newest. Each
/// step leaves the versions restoring to their images, stored in pieces,
/// and both tiers checking clean.
#[test]
fn an_image_in_pieces_moves_to_the_cloud_and_back() {
    use strata_core::format::Tier;
    use strata_store::ops::gc::{gc, GcOptions};
    use strata_store::progress::Progress;
    use strata_store::tier::cloud_gc::{cloud_gc, CloudGcOptions};
    use strata_store::tier::migrate::recall;
    use strata_store::tier::select::Selection;
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let (reports, images) = three_versions_in_pieces(&repo);
    let ids: Vec<SnapshotId> = reports.iter().map(|r| r.id.clone()).collect();
    strata_store::revdedup::maintain(&repo, &Default::default()).unwrap();
    let cloud_dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&cloud_dir).unwrap();
    let cloud = strata_store::tier::attach(&repo, local(&cloud_dir), "test://b").unwrap();
    let sel = |ids: &[SnapshotId]| Selection {
        snapshots: ids.iter().map(|id| id.to_string()).collect(),
        ..Default::default()
    };
    let in_pieces = |r: &Repository, id: &SnapshotId| {
        let s = repo.load_snapshot(id).unwrap();
        strata_store::repo::recipe::part_ids(r, &s.recipe)
            .unwrap()
            .len()
            > 1
    };
    // In batches of 5 000 chunks: each copied and indexed before the next.
    let m = strata_store::tier::migrate::migrate_in_batches(
        &repo,
        &cloud,
        &sel(&ids[..2]),
        &Progress::default(),
        5_000,
    )
    .unwrap();
    let image_chunks = (images[0].len() / 4096) as u64;
    assert_eq!(m.chunks, 2 * image_chunks, "{m:?}");
    assert!(
        m.chunks_sent > image_chunks && m.chunks_deduplicated > 0,
        "{m:?}"
    );
    let cloud_index = strata_store::repo::index::RepoIndex::load_summaries(&cloud).unwrap();
    assert!(
        cloud_index.containers.len() as u64 == m.containers_written && m.chunks_sent > 5 * 5_000,
        "{m:?}"
    );
    for (i, id) in ids.iter().enumerate() {
        let tier = repo.load_snapshot(id).unwrap().tier;
        assert_eq!(tier, [Tier::Cloud, Tier::Cloud, Tier::Active][i]);
    }
    gc(&repo, &GcOptions::default()).unwrap();
    for i in 0..2 {
        assert!(in_pieces(&cloud, &ids[i]), "version {} in pieces", i + 1);
        assert!(
            dumped_from(&repo, &cloud, &ids[i]) == images[i],
            "v{}",
            i + 1
        );
    }
    assert!(dumped_from(&repo, &repo, &ids[2]) == images[2]);
    assert_check_ok(&repo, true, "the active tier after migrate and gc");
    assert_check_ok(
        &open_repo(local(&cloud_dir)),
        true,
        "the bucket after migrate",
    );

    // The oldest goes: the bucket's gc copies live regions forward and
    // rewrites the other version's recipe a piece at a time.
    strata_store::tier::forget_cloud(&repo, &cloud, std::slice::from_ref(&ids[0])).unwrap();
    let copier = strata_store::tier::copy_forward::Download(cloud.backend().clone());
    let opts = CloudGcOptions {
        dry_run: false,
        threshold: 0.0,
    };
    let g = cloud_gc(&repo, &cloud, &copier, &opts).unwrap();
    assert!(g.containers_deleted > 0, "{g:?}");
    assert!(in_pieces(&cloud, &ids[1]));
    assert!(dumped_from(&repo, &cloud, &ids[1]) == images[1]);
    assert_check_ok(
        &open_repo(local(&cloud_dir)),
        true,
        "the bucket after its gc",
    );

    // Recalled, it reads from the bucket only what the active tier lacks.
    let r = recall(&repo, &cloud, &sel(&ids[1..2]), &Progress::default()).unwrap();
    assert!(r.chunks_deduplicated > 0 && r.chunks_sent > 0, "{r:?}");
    assert_eq!(repo.load_snapshot(&ids[1]).unwrap().tier, Tier::Active);
    assert!(in_pieces(&repo, &ids[1]));
    assert!(dumped_from(&repo, &repo, &ids[1]) == images[1]);

    // Seeding flips the newest once every chunk is in the bucket.
    let s = strata_store::tier::seed::seed(&repo, &cloud, &sel(&ids[2..]), &Progress::default())
        .unwrap();
    assert!(s.chunks_sent > 0, "{s:?}");
    assert_eq!(repo.load_snapshot(&ids[2]).unwrap().tier, Tier::Cloud);
    assert!(in_pieces(&cloud, &ids[2]));
    assert!(dumped_from(&repo, &cloud, &ids[2]) == images[2]);
    gc(&repo, &GcOptions::default()).unwrap();
    assert_check_ok(&repo, true, "the active tier at the end");
    assert_check_ok(&open_repo(local(&cloud_dir)), true, "the bucket at the end");
}
