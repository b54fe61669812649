//! Restored files: each is created by the reader that first writes into
//! it and finished (trailing hole, owner, mode, times) by the one that
//! writes its last byte. Files split over many read plans, read-only and
//! set-id files, empty and sparse ones must all come back with their
//! content and metadata, also below a set-group-id directory.

mod common;

use common::*;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};
use strata_store::ops::restore::{restore_from, RecipeSource, RestoreOptions};

/// (name, mode, content) of the files the test backs up.
fn files() -> Vec<(String, u32, Vec<u8>)> {
    let mut holes = random_bytes(3, 100_000);
    holes.resize(1 << 20, 0);
    let mut v = vec![
        ("read-only".to_string(), 0o444, random_bytes(1, 300_000)),
        ("setuid".to_string(), 0o4755, random_bytes(2, 5_000)),
        ("private".to_string(), 0o600, b"secret".to_vec()),
        ("empty".to_string(), 0o644, Vec::new()),
        ("ends-in-a-hole".to_string(), 0o640, holes),
        ("all-zeros".to_string(), 0o644, vec![0; 200_000]),
    ];
    for i in 0..40 {
        v.push((
            format!("many/f{i}"),
            0o644,
            random_bytes(100 + i, 1000 + i as usize * 97),
        ));
    }
    v
}

fn mtime_of(i: usize) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::new(1_600_000_000 + i as u64 * 3_601, 123_456_789)
}

/// Directories (below the files' ones) and their modes.
const DIRS: &[(&str, u32)] = &[("d", 0o755), ("d/narrow", 0o750), ("d/narrow/sgid", 0o2775)];

/// Asserts that `root` holds `files()` with their modes and times.
fn assert_files(root: &Path, what: &str) {
    for (i, (d, mode)) in DIRS.iter().enumerate() {
        let m = fs::symlink_metadata(root.join(d)).unwrap();
        assert!(m.is_dir(), "{what}: {d}");
        assert_eq!(m.mode() & 0o7777, *mode, "{what}: {d}: mode");
        assert_eq!(
            m.modified().unwrap(),
            mtime_of(100 + i),
            "{what}: {d}: mtime"
        );
    }
    for (i, (name, mode, content)) in files().into_iter().enumerate() {
        let p = root.join(&name);
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        assert!(m.is_file(), "{what}: {name}");
        assert_eq!(m.len(), content.len() as u64, "{what}: {name}: size");
        assert!(fs::read(&p).unwrap() == content, "{what}: {name}: content");
        assert_eq!(m.mode() & 0o7777, mode, "{what}: {name}: mode");
        assert_eq!(m.modified().unwrap(), mtime_of(i), "{what}: {name}: mtime");
        assert_eq!((m.uid(), m.gid()), owner_of(&name), "{what}: {name}: owner");
    }
}

/// The owner the test gives a file (other than the creator's when the
/// test runs as root, so restore must set it).
fn owner_of(name: &str) -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    let me = unsafe { (libc::geteuid(), libc::getegid()) };
    match (me.0 == 0, name) {
        (true, "private") => (4321, 4321),
        (true, "read-only") => (0, 4321),
        _ => me,
    }
}

#[test]
fn files_split_over_plans_come_back_whole_with_their_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("many")).unwrap();
    for (i, (name, mode, content)) in files().into_iter().enumerate() {
        let p = src.join(&name);
        fs::write(&p, &content).unwrap();
        let (uid, gid) = owner_of(&name);
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        let t = mtime_of(i);
        f.set_times(FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    }
    // Directories: one with the mode mkdir gives, one narrower, one
    // set-group-id; each with its own time.
    for (d, mode) in DIRS {
        let p = src.join(d);
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
    }
    for (i, (d, _)) in DIRS.iter().enumerate().rev() {
        let t = mtime_of(100 + i);
        let f = File::open(src.join(d)).unwrap();
        f.set_times(FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    }
    let repo = init_repo(&tmp.path().join("repo"), true);
    let r = backup_paths(&repo, &[&src]).unwrap();
    let recipe = || RecipeSource::Stored {
        repo: &repo,
        id: &r.snapshot.recipe,
    };
    // One piece per plan: every file of more than one region is written
    // over several plans, so opened again; every file over few readers.
    for (pieces, readers) in [(1, 1), (1, 3), (3, 2), (1 << 18, 0)] {
        let target = tmp.path().join(format!("t-{pieces}-{readers}"));
        let mut opts = RestoreOptions::new(&target);
        opts.plan_pieces = pieces;
        opts.readers = readers;
        let rep = restore_from(&repo, &r.snapshot, recipe(), &opts).unwrap();
        assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
        assert_eq!(rep.files, files().len() as u64);
        assert_files(
            &restored_path(&target, &src),
            &format!("{pieces} pieces per plan, {readers} readers"),
        );
        let phases: Vec<&str> = rep.phases.iter().map(|p| p.phase).collect();
        for p in [
            "plan",
            "directories",
            "reads",
            "fetch",
            "decode",
            "write",
            "metadata",
        ] {
            assert!(phases.contains(&p), "{phases:?}");
        }
    }
    // Below a set-group-id directory new files take its group: the
    // owners restore says must still be theirs.
    let sg = tmp.path().join("setgid");
    fs::create_dir(&sg).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&sg, None, Some(777)).unwrap();
    }
    fs::set_permissions(&sg, fs::Permissions::from_mode(0o2777)).unwrap();
    let opts = RestoreOptions::new(&sg);
    restore_from(&repo, &r.snapshot, recipe(), &opts).unwrap();
    assert_files(&restored_path(&sg, &src), "below a set-group-id directory");
    // Without set-id bits when asked.
    let target = tmp.path().join("no-setuid");
    let mut opts = RestoreOptions::new(&target);
    opts.no_setuid = true;
    let rep = restore_from(&repo, &r.snapshot, recipe(), &opts).unwrap();
    // The set-uid file and the set-group-id directory.
    assert_eq!(rep.privileges_dropped, 2);
    let m = fs::metadata(restored_path(&target, &src).join("d/narrow/sgid")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o775);
    let m = fs::metadata(restored_path(&target, &src).join("setuid")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755);
}
