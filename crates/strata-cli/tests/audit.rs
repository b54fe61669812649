//! Regressions of the outside audit (issue 40): each test reproduces what
//! the audit found and fails without its fix.

mod common;

use common::*;
use std::fs;

/// A repository directory replaced by a symbolic link is refused (nothing
/// is read through it), and the error says so — not "object is truncated".
#[test]
fn a_symlinked_repository_directory_is_named_as_such() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a.txt"), b"a\n");
    repo.backup(&[&src], &[]);
    let locks = repo.path.join("locks");
    let elsewhere = repo.dir().join("elsewhere");
    fs::create_dir_all(&locks).unwrap();
    fs::rename(&locks, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &locks).unwrap();
    for cmd in [&["unlock"][..], &["backup", path_str(&src)], &["gc"]] {
        let r = repo.run(cmd).expect_code(1);
        assert!(
            r.stderr.contains("symbolic link"),
            "{cmd:?}: the error does not say what is wrong: {}",
            r.stderr
        );
        assert!(
            !r.stderr.contains("truncated"),
            "{cmd:?}: the error points at the wrong problem: {}",
            r.stderr
        );
    }
    // Nothing was written through the link.
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
}

/// A snapshot object replaced by a symbolic link (to a valid copy of
/// itself) is reported by `check`, not skipped as if it were not there.
#[test]
fn check_reports_a_snapshot_object_that_is_a_symlink() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a.txt"), b"a\n");
    let b = repo.backup(&[&src], &[]);
    let id = s(&b["id"]).to_string();
    let obj = walk_files(&repo.path.join("snapshots"))
        .into_iter()
        .find(|p| p.ends_with(&id))
        .expect("the snapshot object");
    let copy = repo.dir().join("copy");
    fs::copy(&obj, &copy).unwrap();
    fs::remove_file(&obj).unwrap();
    std::os::unix::fs::symlink(&copy, &obj).unwrap();
    let r = repo.run(&["check", "--read-data"]).expect_code(1);
    let said = format!("{}{}", r.out(), r.stderr);
    assert!(
        said.contains("symbolic link") && said.contains(&id[..8]),
        "check does not report the symlinked snapshot: {said}"
    );
}
