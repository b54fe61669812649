//! Files of a stored version opened for random access straight from its
//! recipe parts (`fsread::open_stored`, what `volume serve --at` and
//! Python's `open_file` use): a file, a hard link to it (its first
//! name's content), something that is not a file, a missing name.

mod common;

use common::*;
use std::sync::Arc;
use strata_store::engine::fsread::{open_stored, RegionCache};

#[test]
fn files_open_from_stored_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), true);
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    let content = random_bytes(3, 700_000);
    std::fs::write(src.join("a"), &content).unwrap();
    std::fs::hard_link(src.join("a"), src.join("b")).unwrap();
    let r = backup_paths(&repo, &[&src]).unwrap();
    let s = &r.snapshot;
    let rel = |name: &str| {
        let p = src.join(name);
        p.to_str()
            .unwrap()
            .trim_start_matches('/')
            .as_bytes()
            .to_vec()
    };
    let open = |name: &str| {
        let cache = Arc::new(RegionCache::new(1 << 20));
        open_stored(&repo, &repo, s, &s.recipe, &rel(name), cache)
    };
    let whole = |name: &str| {
        let f = open(name).unwrap().expect("in the version");
        assert_eq!(f.size(), content.len() as u64);
        f.read_at(0, content.len()).unwrap()
    };
    assert!(whole("a") == content);
    let f = open("a").unwrap().unwrap();
    assert!(f.read_at(123_456, 1000).unwrap() == content[123_456..124_456]);
    // One of the two names is a hard link to the other: both read it.
    let tree = strata_store::repo::recipe::load_skeleton(&repo, &s.recipe).unwrap();
    let kind = strata_core::format::NodeKind::Hardlink;
    assert!(tree.nodes.iter().any(|n| n.kind == kind));
    assert!(whole("b") == content);
    let e = open("d").err().expect("a directory is refused").to_string();
    assert!(e.contains("is a directory, not a file"), "{e}");
    assert!(open("nothing").unwrap().is_none());
}

/// A tree of several recipe parts held as its skeleton: every file's
/// chunks, read from the parts that hold it, are the whole recipe's (same
/// table), and a reader of the skeleton reads the files' bytes.
#[test]
fn a_skeleton_reads_each_file_from_its_parts() {
    use strata_store::engine::fsread::SnapshotReader;
    use strata_store::repo::skeleton::Skeleton;
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), false);
    let src = tmp.path().join("src");
    let mut rng = Rng(9);
    // Parts are cut where the (keyed) hash of a path says so: files are
    // added until the tree takes more than one part.
    let mut round = 0;
    let r = loop {
        for f in 0..800 {
            let dir = src.join(format!("d{round}{:02}", f % 16));
            std::fs::create_dir_all(&dir).unwrap();
            let len = rng.below(6_000) as usize;
            std::fs::write(dir.join(format!("f{f:03}")), rng.bytes(len)).unwrap();
        }
        let r = backup_paths(&repo, &[&src]).unwrap();
        let parts = strata_store::repo::recipe::part_ids(&repo, &r.snapshot.recipe).unwrap();
        round += 1;
        if parts.len() > 1 || round == 10 {
            assert!(parts.len() > 1, "{} parts", parts.len());
            break r;
        }
    };
    let s = &r.snapshot;
    let whole = repo.load_recipe(&s.recipe).unwrap();
    let sk = Skeleton::load(&repo, &s.recipe).unwrap();
    assert_eq!(sk.recipe.containers, whole.containers);
    assert_eq!(sk.recipe.nodes.len(), whole.nodes.len());
    let cache = Arc::new(RegionCache::new(4 << 20));
    let sk = Arc::new(sk);
    let reader = SnapshotReader::stored(repo.clone(), s.clone(), sk.clone(), repo.clone(), cache);
    let mut files = 0;
    for (i, n) in whole.nodes.iter().enumerate() {
        assert_eq!(sk.recipe.nodes[i].path, n.path);
        assert!(sk.recipe.nodes[i].segments.is_empty());
        let want: Vec<_> = n.segments.iter().flat_map(|s| s.chunks.clone()).collect();
        let mut got = Vec::new();
        sk.chunks_of(&repo, i, |c| got.push(*c)).unwrap();
        if n.kind != strata_core::format::NodeKind::File {
            assert!(got.is_empty());
            continue;
        }
        assert!(got == want, "{}", n.path_str());
        let len: u64 = want.iter().map(|c| c.len as u64).sum();
        assert_eq!(sk.lens[i], len);
        if i % 7 == 0 {
            // Found from the parts its index says may hold it.
            let cache = Arc::new(RegionCache::new(1 << 20));
            let f = open_stored(&repo, &repo, s, &s.recipe, &n.path, cache).unwrap();
            let f = f.expect("every file is found");
            assert_eq!(f.size(), len, "{}", n.path_str());
        }
        if i % 97 == 0 {
            let f = reader.open_node(i).unwrap();
            let disk = std::fs::read(format!("/{}", n.path_str())).unwrap();
            assert!(
                f.read_at(0, disk.len() + 1).unwrap() == disk,
                "{}",
                n.path_str()
            );
            files += 1;
        }
    }
    assert!(files > 5);
}
