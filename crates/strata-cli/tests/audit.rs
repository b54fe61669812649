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

/// The peak resident memory of every child this process waited for, in
/// bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) },
        0
    );
    ru.ru_maxrss as u64 * 1024
}

/// An unencrypted repository's envelope of kind `kind` around an already
/// compressed `payload` (version, kind, zstd flag; BLAKE3 checksum).
fn plain_zstd_envelope(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![strata_core::crypto::ENVELOPE_VERSION, kind, 1];
    body.extend_from_slice(payload);
    let tag = blake3::hash(&body);
    body.extend_from_slice(&tag.as_bytes()[..16]);
    body
}

/// A recipe part replaced by a small zstd frame that expands to 1 GiB (no
/// size in its header, so it must be streamed) is refused at what a part
/// may hold: restore and check fail clearly, quickly, in little memory.
#[test]
fn a_decompression_bomb_in_a_recipe_part_is_refused_unexpanded() {
    use std::io::Write;
    let repo = Repo::new();
    let src = repo.dir().join("src");
    for i in 0..20 {
        write(&src.join(format!("f{i}")), &prng(i, 5000));
    }
    repo.backup(&[&src], &[]);
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        enc.write_all(&zeros).unwrap();
    }
    let bomb = enc.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "the bomb is small: {}", bomb.len());
    let part = walk_files(&repo.path.join("parts"))
        .into_iter()
        .next()
        .expect("a recipe part");
    fs::write(&part, plain_zstd_envelope(13, &bomb)).unwrap();
    let target = repo.scratch("t");
    for args in [
        vec!["restore", "latest", "--target", path_str(&target)],
        vec!["check", "--read-data"],
    ] {
        let started = std::time::Instant::now();
        let r = repo.run(&args).expect_code(1);
        let said = format!("{}{}", r.out(), r.stderr);
        assert!(
            said.contains("more than"),
            "{args:?}: the bomb is not named: {said}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    let peak = children_peak_rss();
    assert!(peak < 256 << 20, "a command took {} MiB", peak >> 20);
}
