//! Files of a stored version opened for random access straight from its
//! recipe parts (`fsread::open_stored`, what `volume serve --at` and
//! Python's `open_file` use): a file, a hard link to it (its first
//! name's content), something that is not a file, a missing name.

mod common;

use common::*;
use std::sync::Arc;
use strata_store::fsread::{open_stored, RegionCache};

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
    let tree = strata_store::recipe::load_skeleton(&repo, &s.recipe).unwrap();
    let kind = strata_core::format::NodeKind::Hardlink;
    assert!(tree.nodes.iter().any(|n| n.kind == kind));
    assert!(whole("b") == content);
    let e = open("d").err().expect("a directory is refused").to_string();
    assert!(e.contains("is a directory, not a file"), "{e}");
    assert!(open("nothing").unwrap().is_none());
}
