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
