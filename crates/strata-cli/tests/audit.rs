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

/// A recipe part replaced by a small zstd frame that expands to 1 GiB (no
/// size in its header, so it must be streamed) is refused at what a part
/// may hold: restore and check fail clearly, quickly, in little memory.
#[test]
fn a_decompression_bomb_in_a_recipe_part_is_refused_unexpanded() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    for i in 0..20 {
        write(&src.join(format!("f{i}")), &prng(i, 5000));
    }
    repo.backup(&[&src], &[]);
    let bomb = zeros_frame(1 << 30);
    assert!(bomb.len() < 1 << 20, "the bomb is small: {}", bomb.len());
    let part = walk_files(&repo.path.join("parts"))
        .into_iter()
        .next()
        .expect("a recipe part");
    fs::write(&part, plain_zstd_envelope(13, &bomb, None)).unwrap();
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

/// `restore --no-special --no-setuid` restores an untrusted snapshot
/// without its device nodes, FIFOs, set-id bits or file capabilities;
/// without the options all of them come back.
#[test]
fn restore_can_leave_out_specials_and_privileges() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let repo = Repo::new();
    let src = repo.scratch("src");
    write(&src.join("suid"), b"#!/bin/sh\n");
    fs::set_permissions(src.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::create_dir_all(src.join("shared")).unwrap();
    fs::set_permissions(src.join("shared"), fs::Permissions::from_mode(0o2775)).unwrap();
    let fifo = std::ffi::CString::new(src.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    write(&src.join("ping"), b"\x7fELF");
    // A file capability (cap_net_raw, effective): root only.
    let cap: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let with_cap = set_xattr(&src.join("ping"), "security.capability", &cap);
    let b = repo.backup(&[&src], &[]);
    let id = s(&b["id"]);

    let full = repo.scratch("full");
    repo.restore(id, &full);
    let r = restored(&full, &src);
    let mode = |p: &std::path::Path| fs::symlink_metadata(p).unwrap().permissions().mode();
    assert_eq!(mode(&r.join("suid")) & 0o7777, 0o4755);
    assert_eq!(mode(&r.join("shared")) & 0o7777, 0o2775);
    assert!(fs::symlink_metadata(r.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    if with_cap {
        assert_eq!(
            get_xattr(&r.join("ping"), "security.capability"),
            Some(cap.to_vec())
        );
    }

    let safe = repo.scratch("safe");
    let v = repo.json(&[
        "restore",
        id,
        "--target",
        path_str(&safe),
        "--no-special",
        "--no-setuid",
    ]);
    let r = restored(&safe, &src);
    assert_eq!(mode(&r.join("suid")) & 0o7777, 0o755);
    assert_eq!(mode(&r.join("shared")) & 0o7777, 0o775);
    assert!(!r.join("fifo").exists() && fs::symlink_metadata(r.join("fifo")).is_err());
    assert_eq!(get_xattr(&r.join("ping"), "security.capability"), None);
    assert_eq!(fs::read(r.join("suid")).unwrap(), b"#!/bin/sh\n");
    assert_eq!(v["specials_left_out"], 1, "{v:#}");
    assert_eq!(
        v["privileges_dropped"],
        if with_cap { 3 } else { 2 },
        "{v:#}"
    );
}

/// A data container deleted behind the repository's back: the next backup
/// (reusing unchanged files or reading them all) stores the lost chunks
/// again instead of referencing them, warns naming the damaged older
/// version, and commits a version that restores and checks clean.
#[test]
fn a_backup_after_a_lost_container_stores_its_chunks_again() {
    for (index, extra) in [
        ("segment", &[][..]),
        ("segment", &["--force-read"][..]),
        ("segment", &["--no-lifecycle"][..]),
        ("exact", &[][..]),
        ("silo", &[][..]),
    ] {
        let repo = Repo::with_init(&["--index", index], None);
        let src = repo.scratch("src");
        for (i, name) in ["a.bin", "b.bin", "c.bin"].iter().enumerate() {
            write(&src.join(name), &prng(40 + i as u64, 700_000));
        }
        let v1 = repo.backup(&[&src], &[]);
        for c in walk_files(&repo.path.join("data")) {
            fs::remove_file(c).unwrap();
        }
        let r = repo.backup_run(&[&src], extra);
        let v2 = r.json();
        let warnings = v2["warnings"].to_string();
        assert!(
            warnings.contains("missing from the repository"),
            "{index} {extra:?}: no warning: {v2:#}"
        );
        if extra.contains(&"--no-lifecycle") {
            assert!(
                warnings.contains("reference them: ") && warnings.contains("@1"),
                "{index} {extra:?}: the version that uses them is not named: {warnings}"
            );
        }
        assert_eq!(r.code, 3, "{index} {extra:?}: {}", r.stderr);
        let t = repo.scratch("t");
        repo.restore(s(&v2["id"]), &t);
        assert_manifest_eq(
            &manifest(&src),
            &manifest(&restored(&t, &src)),
            &format!("{index} {extra:?}"),
        );
        // The warning names every version check finds damaged (the first
        // one reads its chunks from the copies stored again, unless the
        // lifecycle re-pointed it to them).
        let (_, c) = repo.check(true);
        let damaged = c["damaged_snapshots"].as_array().unwrap();
        assert!(
            !damaged.contains(&v2["id"]),
            "{index} {extra:?}: the new version is damaged: {c:#}"
        );
        if damaged.contains(&v1["id"]) {
            assert!(
                warnings.contains("reference them: "),
                "{index} {extra:?}: {warnings} but check says {c:#}"
            );
        }
        let t1 = repo.scratch("t1");
        repo.run(&["restore", s(&v1["id"]), "--target", path_str(&t1)])
            .expect_code(0);
    }
}

/// A valid snapshot object copied under another name (a new one, or over
/// another version's) is refused: the envelope authenticates its name
/// (repository format 3). check names both objects, restore refuses them,
/// and the untouched version still restores.
#[test]
fn a_snapshot_copied_under_another_name_is_refused() {
    let repo = Repo::with_init(&["--encrypt"], Some("pw"));
    let src = repo.scratch("src");
    write(&src.join("a.txt"), b"one\n");
    let v1 = repo.backup(&[&src], &[]);
    write(&src.join("a.txt"), b"two\n");
    let v2 = repo.backup(&[&src], &[]);
    write(&src.join("a.txt"), b"three\n");
    let v3 = repo.backup(&[&src], &[]);
    let (id1, id2, id3) = (s(&v1["id"]), s(&v2["id"]), s(&v3["id"]));
    let obj = |id: &str| {
        walk_files(&repo.path.join("snapshots"))
            .into_iter()
            .find(|p| p.ends_with(id))
            .expect("the snapshot object")
    };
    let bytes = fs::read(obj(id1)).unwrap();
    // Over version 2's object, and under a name of its own.
    fs::write(obj(id2), &bytes).unwrap();
    let forged = "f0".repeat(32);
    fs::write(obj(id1).with_file_name(&forged), &bytes).unwrap();
    let r = repo.run(&["--json", "check"]).expect_code(1);
    let said = format!("{}{}", r.out(), r.stderr);
    for id in [id2, forged.as_str()] {
        assert!(said.contains(id), "check does not name {id}: {said}");
    }
    for id in [id2, forged.as_str()] {
        let t = repo.scratch(&format!("t-{id}"));
        let r = repo
            .run(&["restore", id, "--target", path_str(&t)])
            .expect_code(1);
        assert!(
            r.stderr.contains("authentication") || r.stderr.contains("bound"),
            "{id}: {}",
            r.stderr
        );
    }
    let t = repo.scratch("t3");
    repo.restore(id3, &t);
    assert_eq!(
        fs::read(restored(&t, &src).join("a.txt")).unwrap(),
        b"three\n"
    );
}

/// Flips a byte every 8 KiB of a container's data object (its header
/// and tail left alone).
fn damage(container: &std::path::Path) {
    let mut bytes = fs::read(container).unwrap();
    let n = bytes.len();
    let mut at = 4096;
    while at + 4096 < n {
        bytes[at] ^= 0x5a;
        at += 8192;
    }
    fs::write(container, bytes).unwrap();
}

/// A chunk stored twice whose first copy is damaged is read from the
/// second: restore and dump succeed (saying which container is damaged),
/// check does not call the version damaged, and `repair snapshots`
/// salvages a version that lost another file without referencing the
/// damaged container.
#[test]
fn a_damaged_chunk_is_read_from_its_second_copy() {
    let repo = Repo::new();
    let src = repo.scratch("src");
    let (a, b) = (prng(81, 300_000), prng(82, 300_000));
    write(&src.join("a.bin"), &a);
    write(&src.join("b.bin"), &b);
    let v1 = repo.backup(&[&src], &[]);
    let first: Vec<_> = walk_files(&repo.path.join("data"));
    // With the first containers out of the way, a.bin is stored again.
    let aside = repo.scratch("aside");
    fs::create_dir_all(&aside).unwrap();
    for (i, c) in first.iter().enumerate() {
        fs::rename(c, aside.join(i.to_string())).unwrap();
    }
    fs::remove_file(src.join("b.bin")).unwrap();
    let r = repo.backup_run(&[&src], &["--no-lifecycle", "--force-read"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    for (i, c) in first.iter().enumerate() {
        fs::rename(aside.join(i.to_string()), c).unwrap();
        damage(c);
    }
    // a.bin comes from its second copy; b.bin has none.
    let t = repo.scratch("t");
    let r = repo
        .run(&[
            "--json",
            "restore",
            s(&v1["id"]),
            "--target",
            path_str(&t),
            "--include",
            path_str(&src.join("a.bin")),
        ])
        .expect_code(0);
    let v = r.json();
    assert!(u(&v["second_copies"]) > 0, "{v:#}");
    assert!(v["warnings"].to_string().contains("damaged"), "{v:#}");
    assert!(fs::read(restored(&t, &src).join("a.bin")).unwrap() == a);
    let d = repo
        .run(&["dump", s(&v1["id"]), path_str(&src.join("a.bin"))])
        .expect_code(0);
    assert!(d.stdout == a, "dump differs");
    let (_, c) = repo.check(true);
    assert_eq!(
        c["damaged_snapshots"],
        serde_json::json!([s(&v1["id"])]),
        "{c:#}"
    );
    let lost = c["damaged_paths"][s(&v1["id"])].to_string();
    assert!(lost.contains("b.bin") && !lost.contains("a.bin"), "{c:#}");
    // The salvage keeps a.bin, read from its second copy, and never
    // references the damaged containers.
    let r = repo.run(&["--json", "repair", "snapshots", "--read-data"]);
    let rep = r.json();
    let new = s(&rep["snapshots"][0]["repaired_as"]).to_string();
    let t2 = repo.scratch("t2");
    repo.restore(&new, &t2);
    assert!(fs::read(restored(&t2, &src).join("a.bin")).unwrap() == a);
    assert!(!restored(&t2, &src).join("b.bin").exists());
    let (_, c) = repo.check(true);
    let damaged = c["damaged_snapshots"].to_string();
    assert!(!damaged.contains(&new), "the salvage is damaged: {c:#}");
}
