//! Recipes in parts and the streaming backup: trees are written a part at
//! a time while they are walked, versions share unchanged parts, deletion
//! and gc keep exactly the parts still used, the walk stays within its
//! bounds without deadlocking, and a damaged previous version only costs
//! rereading.

mod common;

use common::backup_with_lifecycle as backup;
use common::*;
use std::collections::HashSet;
use std::fs;
use std::path::Path;
use strata_core::format::{path_cmp, RecipeObject};
use strata_core::id::{PartId, RecipeId, SnapshotId};
use strata_store::ops::backup::{BackupOptions, BackupReport, FlowLimits, StdinSource};
use strata_store::{repo::recipe, Repository};

/// `n` small files spread over nested directories, with names whose byte
/// order differs from the tree order (`a.txt` vs `a/`).
fn many_files(root: &Path, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    for i in 0..n {
        let dir = root
            .join(format!("d{}", i % 13))
            .join(format!("s{}", i % 5));
        fs::create_dir_all(&dir).unwrap();
        let len = 10 + rng.below(3000) as usize;
        fs::write(dir.join(format!("f{i}")), rng.bytes(len)).unwrap();
        if i % 97 == 0 {
            fs::write(root.join(format!("d{}.txt", i % 13)), rng.bytes(40)).unwrap();
        }
    }
}

fn parts_of(repo: &Repository, id: &SnapshotId) -> Vec<PartId> {
    let s = repo.load_snapshot(id).unwrap();
    recipe::part_ids(repo, &s.recipe).unwrap()
}

fn segment_repo(dir: &Path) -> Repository {
    let mut o = small_init(false);
    o.index = "segment".into();
    Repository::init(local(dir), o).unwrap()
}

/// A tree of `n` files (`seed`) under `dir` backed up to a segment
/// repository beside it whose recipe has `min_parts` parts or more: the
/// tree, the repository, the version and its parts. Parts are cut where
/// a hash of the path says, and a repository without encryption hashes
/// the same everywhere, so the number of parts follows the paths — the
/// temporary directory's random name among them (3000 files give fewer
/// than three parts about once in 50 names, 6000 fewer than four about
/// once in 1000). Each try backs up a tree of another name.
fn tree_in_parts(
    dir: &Path,
    n: usize,
    seed: u64,
    min_parts: usize,
) -> (std::path::PathBuf, Repository, BackupReport, Vec<PartId>) {
    (0..8)
        .find_map(|i| {
            let src = dir.join(format!("src{i}"));
            many_files(&src, n, seed);
            let repo = segment_repo(&dir.join(format!("repo{i}")));
            let v1 = backup_paths(&repo, &[&src]).unwrap();
            let parts = parts_of(&repo, &v1.id);
            (parts.len() >= min_parts).then_some((src, repo, v1, parts))
        })
        .unwrap_or_else(|| panic!("no tree of {n} files in {min_parts} parts or more"))
}

#[test]
fn trees_are_written_in_parts_that_versions_share() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, repo, v1, p1) = tree_in_parts(tmp.path(), 6000, 1, 4);
    // The recipe is in path order, whole, in its parts.
    let whole = repo.load_recipe(&v1.snapshot.recipe).unwrap();
    assert!(whole
        .nodes
        .windows(2)
        .all(|w| path_cmp(&w[0].path, &w[1].path).is_lt()));
    let files = whole
        .nodes
        .iter()
        .filter(|n| n.kind == strata_core::format::NodeKind::File)
        .count();
    assert_eq!(files as u64, v1.snapshot.stats.files);
    let t1 = read_tree(&src);
    assert_restores(&repo, &v1.id, &src, tmp.path(), &t1, "v1");

    // One file changes: the second version writes that file's part anew
    // (and the first, whose ancestors of `src` see other tests' files come
    // and go).
    let changed = src.join("d0/s3/f3003");
    assert!(changed.exists());
    fs::write(&changed, b"changed").unwrap();
    let v2 = backup_paths(&repo, &[&src]).unwrap();
    let p2 = parts_of(&repo, &v2.id);
    let new: Vec<_> = p2.iter().filter(|p| !p1.contains(p)).collect();
    assert!(
        !new.is_empty() && new.len() <= 2,
        "{} of {} parts are new",
        new.len(),
        p2.len()
    );
    let size_of = |names: &[&PartId]| -> u64 {
        repo.backend()
            .list("parts/")
            .unwrap()
            .iter()
            .filter(|o| names.iter().any(|p| o.name.ends_with(p.as_str())))
            .map(|o| o.size)
            .sum()
    };
    let tree_bytes = size_of(&p1.iter().collect::<Vec<_>>());
    let new_bytes = size_of(&new);
    // What v2 stored is its new parts, the changed file and a little
    // metadata — never the unchanged stretches again. (Parts are cut
    // where a path's hash says so, and the paths hold a random temporary
    // directory: their sizes vary from run to run, so no fixed share of
    // the tree is asserted.)
    assert!(
        new_bytes < tree_bytes,
        "{new_bytes} of a {tree_bytes}-byte tree"
    );
    assert!(
        v2.snapshot.stats.new_stored_bytes <= new_bytes + (64 << 10),
        "an unchanged stretch of the tree is not stored again: {} stored, new parts {new_bytes} of a {tree_bytes}-byte tree",
        v2.snapshot.stats.new_stored_bytes,
    );
    let t2 = read_tree(&src);
    assert_restores(&repo, &v2.id, &src, tmp.path(), &t2, "v2");

    // Forget v1 and gc: exactly v2's parts remain.
    strata_store::ops::forget::forget(&repo, &[v1.id.to_string()]).unwrap();
    strata_store::ops::gc::gc(&repo, &Default::default()).unwrap();
    let left: HashSet<PartId> = object_names(repo.backend().as_ref(), "parts/")
        .into_iter()
        .map(|n| PartId::from_object_name(&n).unwrap_or_else(|| panic!("not a part: {n}")))
        .collect();
    // (gc may have moved chunks and so rewritten some of v2's parts.)
    let now: HashSet<PartId> = parts_of(&repo, &v2.id).into_iter().collect();
    assert_eq!(left, now);
    assert_restores(&repo, &v2.id, &src, tmp.path(), &t2, "v2 after forget");
    assert_check_ok(&repo, true, "after forget and gc");
}

#[test]
fn gc_removes_parts_no_recipe_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    many_files(&src, 1500, 2);
    let repo = segment_repo(&tmp.path().join("repo"));
    let v1 = backup_paths(&repo, &[&src]).unwrap();
    // A part left by an interrupted backup.
    let stray = PartId::parse(&"ab".repeat(32)).unwrap();
    repo.backend()
        .put(&recipe::part_name(&stray), b"left over")
        .unwrap();
    let r = strata_store::ops::gc::gc(&repo, &Default::default()).unwrap();
    assert_eq!(r.parts_deleted, 1);
    assert!(repo
        .backend()
        .size(&recipe::part_name(&stray))
        .unwrap()
        .is_none());
    assert_restores(&repo, &v1.id, &src, tmp.path(), &read_tree(&src), "v1");
}

/// Tight bounds: a window of a few nodes and a queue of one unit, a large
/// file first, small files grouped (SiLo) — the walk waits for the
/// workers, the workers for nothing, and everything is stored in order.
#[test]
fn tight_flow_limits_neither_deadlock_nor_reorder() {
    for index in ["segment", "silo"] {
        for threads in [1, 3] {
            let tmp = tempfile::tempdir().unwrap();
            let src = tmp.path().join("src");
            fs::create_dir_all(src.join("a")).unwrap();
            fs::write(src.join("a/0big"), random_bytes(7, 3 << 20)).unwrap();
            many_files(&src.join("a"), 400, 3);
            let mut o = small_init(false);
            o.index = index.into();
            let repo = Repository::init(local(&tmp.path().join("repo")), o).unwrap();
            let limits = FlowLimits {
                window_nodes: 3,
                window_bytes: 1,
                queue_units: 1,
                queue_bytes: 1,
            };
            let r = backup(
                &repo,
                BackupOptions {
                    paths: vec![src.clone()],
                    series: Some("t".into()),
                    threads,
                    large_file: 1 << 20,
                    limits,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{index}/{threads}: {e}"));
            assert_eq!(r.snapshot.stats.files, 401 + 5, "{index}/{threads}");
            assert_restores(
                &repo,
                &r.id,
                &src,
                tmp.path(),
                &read_tree(&src),
                &format!("{index}/{threads}"),
            );
        }
    }
}

#[test]
fn a_stream_and_paths_in_one_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    many_files(&src, 300, 4);
    let repo = segment_repo(&tmp.path().join("repo"));
    let data = random_bytes(9, 200_000);
    // The name sorts among the walked paths.
    let rel = src.strip_prefix("/").unwrap();
    let name = format!("{}/d3/zz.sql", rel.display());
    let err = backup(
        &repo,
        BackupOptions {
            paths: vec![src.clone()],
            stdin: Some(StdinSource {
                reader: Box::new(std::io::Cursor::new(data.clone())),
                name: format!("{}/d3", rel.display()),
            }),
            series: Some("t".into()),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("also a path being backed up"), "{err}");
    let r = backup(
        &repo,
        BackupOptions {
            paths: vec![src.clone()],
            stdin: Some(StdinSource {
                reader: Box::new(std::io::Cursor::new(data.clone())),
                name: name.clone(),
            }),
            series: Some("t".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
    let node = recipe
        .nodes
        .iter()
        .find(|n| n.path == name.as_bytes())
        .expect("the stream is in the tree");
    let mut out = Vec::new();
    strata_store::ops::restore::dump(&repo, &r.snapshot, &recipe, node, &mut out).unwrap();
    assert!(out == data, "the stream reads back");
    let mut tree = read_tree(&src);
    tree.files.insert("d3/zz.sql".into(), data);
    assert_restores(&repo, &r.id, &src, tmp.path(), &tree, "paths and stream");
}

/// A damaged part of the previous version: the next backup says so, reads
/// the files again, commits a complete version, and rewrites the part
/// (the same content under the same name), which repairs the old version.
#[test]
fn a_damaged_previous_version_is_read_around() {
    let tmp = tempfile::tempdir().unwrap();
    // (Three parts or more: with fewer the damaged part would be the
    // first, with nothing before it to reuse.)
    let (src, repo, v1, parts) = tree_in_parts(tmp.path(), 3000, 5, 3);
    let victim = recipe::part_name(&parts[parts.len() / 2]);
    let mut bytes = repo.backend().get(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    repo.backend().put(&victim, &bytes).unwrap();
    let v2 = backup_paths(&repo, &[&src]).unwrap();
    assert!(
        v2.warnings
            .iter()
            .any(|w| w.contains("previous version's recipe is damaged")),
        "{:?}",
        v2.warnings
    );
    assert!(v2.reused_files > 0 && v2.reused_files < 3000);
    assert_restores(&repo, &v2.id, &src, tmp.path(), &read_tree(&src), "v2");
    // The new version holds the same part: it was written again, which
    // repaired the old version too.
    assert!(parts_of(&repo, &v2.id).contains(&parts[parts.len() / 2]));
    recipe::load_part(&repo, &parts[parts.len() / 2]).unwrap();
    assert_restores(
        &repo,
        &v1.id,
        &src,
        tmp.path(),
        &read_tree(&src),
        "v1 repaired",
    );
    assert_check_ok(&repo, false, "after the repair");
}

/// Recipes written before parts existed (one whole object) still restore,
/// serve as a backup's previous version, and are rewritten in parts by the
/// lifecycle.
#[test]
fn whole_recipes_of_version_1_still_work() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    many_files(&src, 800, 6);
    // Byte order puts `d1-x` before `d1/…`; path order after.
    fs::write(src.join("d1-x"), b"beside d1").unwrap();
    let repo = segment_repo(&tmp.path().join("repo"));
    let v1 = backup_paths(&repo, &[&src]).unwrap();
    // Rewrite v1's recipe as a version-1 object, in byte order as builds
    // before parts wrote it.
    let mut whole = repo.load_recipe(&v1.snapshot.recipe).unwrap();
    whole.nodes.sort_by(|a, b| a.path.cmp(&b.path));
    let (rid, _) = repo
        .put_struct(strata_core::crypto::Kind::Recipe, "recipes", &whole)
        .unwrap();
    let rid = RecipeId::parse(&rid).unwrap();
    let mut s = repo.load_snapshot(&v1.id).unwrap();
    s.recipe = rid.clone();
    repo.replace_snapshot(&v1.id, &s).unwrap();
    assert!(matches!(
        recipe::load_object(&repo, &rid).unwrap(),
        RecipeObject::Whole(_)
    ));
    let t1 = read_tree(&src);
    assert_restores(&repo, &v1.id, &src, tmp.path(), &t1, "v1 whole");
    // Held as a skeleton, its files' chunks come from the one object.
    let sk = strata_store::repo::skeleton::Skeleton::load(&repo, &rid).unwrap();
    for (i, n) in whole.nodes.iter().enumerate().step_by(37) {
        let mut got = Vec::new();
        sk.chunks_of(&repo, i, |c| got.push(*c)).unwrap();
        let want: Vec<_> = n.segments.iter().flat_map(|s| s.chunks.clone()).collect();
        assert!(got == want, "{}", n.path_str());
        if n.kind == strata_core::format::NodeKind::File {
            // Found and read from the one object.
            let cache =
                std::sync::Arc::new(strata_store::engine::fsread::RegionCache::new(1 << 20));
            let s1 = repo.load_snapshot(&v1.id).unwrap();
            let f =
                strata_store::engine::fsread::open_stored(&repo, &repo, &s1, &rid, &n.path, cache);
            let f = f.unwrap().expect("in the version");
            let disk = fs::read(format!("/{}", n.path_str())).unwrap();
            assert!(
                f.read_at(0, disk.len() + 1).unwrap() == disk,
                "{}",
                n.path_str()
            );
        }
    }
    fs::write(src.join("d1/s1/f1"), b"new").unwrap();
    // Without the backup's lifecycle, so that `maintain` below rewrites v1.
    let v2 = strata_store::ops::backup::backup(
        &repo,
        strata_store::ops::backup::BackupOptions {
            paths: vec![src.clone()],
            series: Some("test".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(v2.reused_files, v1.snapshot.stats.files - 1);
    assert_restores(&repo, &v2.id, &src, tmp.path(), &read_tree(&src), "v2");
    assert_check_ok(&repo, true, "mixed recipe versions");
    // maintain rewrites v1 (reverse dedup against v2, the recipe read
    // whole and sorted into path order).
    let m = strata_store::revdedup::maintain(&repo, &Default::default()).unwrap();
    assert_eq!(m.converted.len(), 1, "{m:?}");
    let s1 = repo.load_snapshot(&v1.id).unwrap();
    assert!(s1.archival.is_some());
    assert!(!recipe::part_ids(&repo, &s1.recipe).unwrap().is_empty());
    assert_restores(&repo, &v1.id, &src, tmp.path(), &t1, "v1 archival");
    assert_check_ok(&repo, true, "v1 rewritten in parts");
}

/// A file larger than a recipe piece (here ~40 000 chunks of 1 KiB) is
/// stored as several nodes of its path: it restores whole, an unchanged
/// next version reuses it without reading it, and an edited one is
/// deduplicated chunk by chunk against all its pieces.
#[test]
fn a_large_file_is_stored_in_pieces_and_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), b"first").unwrap();
    let big = src.join("d/big");
    fs::write(&big, random_bytes(7, 40 << 20)).unwrap();
    fs::write(src.join("z"), b"last").unwrap();
    let repo = segment_repo(&tmp.path().join("repo"));
    let v1 = backup_paths(&repo, &[&src]).unwrap();
    let RecipeObject::Index(idx) = recipe::load_object(&repo, &v1.snapshot.recipe).unwrap() else {
        panic!("a new recipe is an index")
    };
    assert!(idx.continued, "a 40 MB file of 1 KiB chunks is in pieces");
    let mut pieces = 0;
    recipe::for_each_part(&repo, &v1.snapshot.recipe, |p| {
        pieces += p
            .nodes
            .iter()
            .filter(|n| n.path.ends_with(b"d/big"))
            .count();
        Ok(())
    })
    .unwrap();
    assert!(pieces >= 2, "{pieces} pieces");
    assert_eq!(v1.snapshot.stats.files, 3);
    let t1 = read_tree(&src);
    assert_restores(&repo, &v1.id, &src, tmp.path(), &t1, "v1");

    let v2 = backup_paths(&repo, &[&src]).unwrap();
    assert_eq!(v2.snapshot.stats.read_bytes, 0, "every file reused");
    assert_eq!(v2.reused_files, 3);
    assert_restores(&repo, &v2.id, &src, tmp.path(), &t1, "v2");

    // 4 KiB rewritten in the last piece: read again, found in the
    // previous version but for the few chunks around the change.
    let mut data = fs::read(&big).unwrap();
    let at = data.len() - (3 << 20);
    data[at..at + 4096].copy_from_slice(&random_bytes(8, 4096));
    fs::write(&big, &data).unwrap();
    let v3 = backup_paths(&repo, &[&src]).unwrap();
    assert!(
        v3.snapshot.stats.new_raw_bytes < 64 << 10,
        "{} new bytes",
        v3.snapshot.stats.new_raw_bytes
    );
    assert!(v3.parent_bytes > 30 << 20, "{}", v3.parent_bytes);
    let t3 = read_tree(&src);
    assert_restores(&repo, &v3.id, &src, tmp.path(), &t3, "v3");
    assert_restores(&repo, &v1.id, &src, tmp.path(), &t1, "v1 after v3");
    assert_check_ok(&repo, true, "pieces");

    // Every data container gone: check, walking the recipe a piece at a
    // time, names each damaged file once, the one in pieces too.
    for name in object_names(repo.backend().as_ref(), "data/") {
        repo.backend().delete(&name).unwrap();
    }
    let r = strata_store::ops::check::check(&repo, &Default::default()).unwrap();
    let mut paths = r
        .damaged_paths
        .get(v3.id.as_str())
        .cloned()
        .unwrap_or_default();
    paths.sort();
    let big_paths = paths.iter().filter(|p| p.ends_with("d/big")).count();
    assert_eq!((paths.len(), big_paths), (3, 1), "{paths:?}");
}
