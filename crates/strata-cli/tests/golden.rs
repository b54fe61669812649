//! Golden repositories (`tests/golden/NAME/`, made once by
//! `scripts/make-golden` with the build of their time and never rewritten):
//! this build must open each, find it clean with `check --read-data`, list
//! the same snapshot ids and restore every version byte-exact — including
//! reverse-deduplicated (archival) ones, hard links, symlinks, an empty
//! file, a zero run and a name that is not UTF-8. A format change that
//! would strand old repositories fails here (`recipe-pieces-1` holds a
//! volume's snapshots, recipes of structure version 4 whose part
//! references tell their pieces). Golden volumes
//! (`scripts/make-golden-volumes`, `expected-volumes.json`): each volume of
//! the fixture checks clean, is snapshotted (one left unclean by a kill -9
//! replays its journal first) and restores byte-exact, then checks clean
//! with every block read.

mod common;

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn copy_tree(from: &Path, to: &Path) {
    for e in walkdir::WalkDir::new(from) {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(from).unwrap();
        let dst = to.join(rel);
        if e.file_type().is_dir() {
            fs::create_dir_all(&dst).unwrap();
        } else {
            fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A copy of fixture `dir`'s repository in a temporary directory (which
/// also takes the restores), and its expectations (`file`).
fn open_fixture(dir: &Path, file: &str) -> (tempfile::TempDir, PathBuf, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    copy_tree(&dir.join("repo"), &repo);
    let expected: Value = serde_json::from_slice(&fs::read(dir.join(file)).unwrap()).unwrap();
    (tmp, repo, expected)
}

/// `strata --repo REPO ARGS` with the fixtures' password; must succeed.
fn run_in(repo: &Path, args: &[&str]) -> Run {
    let mut c = strata();
    c.arg("--repo")
        .arg(repo)
        .env("STRATA_PASSWORD", "golden")
        .args(args);
    run_cmd(c, None).ok()
}

/// The fixtures under `tests/golden/` that hold `file`.
fn fixtures_with(file: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let found: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|d| d.join(file).exists())
        .collect();
    assert!(
        !found.is_empty(),
        "no fixture with {file} in {}",
        root.display()
    );
    found
}

fn check_fixture(dir: &Path) {
    let (tmp, repo, expected) = open_fixture(dir, "expected.json");
    let run = |args: &[&str]| run_in(&repo, args);
    let c = run(&["--json", "check", "--read-data"]).json();
    assert_eq!(c["errors"], serde_json::json!([]), "{}: {c}", dir.display());
    let snaps = run(&["--json", "snapshots"]).json();
    let versions = expected.as_object().unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), versions.len());
    for (spec, want) in versions {
        let listed = snaps
            .as_array()
            .unwrap()
            .iter()
            .find(|v| format!("{}@{}", s(&v["series"]), v["version"]) == *spec)
            .unwrap_or_else(|| panic!("{spec} is not listed"));
        assert_eq!(listed["id"], want["id"], "{spec}: snapshot id changed");
        let target = tmp
            .path()
            .join(format!("restore-{}", spec.replace(['@', ':', '/'], "_")));
        run(&["restore", spec, "-t", path_str(&target), "--verify"]);
        for (path, e) in want["entries"].as_object().unwrap() {
            let rel: PathBuf = match e.get("path_hex").and_then(Value::as_str) {
                Some(h) => OsStr::from_bytes(&hex(h)).into(),
                None => path.trim_start_matches('/').into(),
            };
            let full = target.join(rel.strip_prefix("/").unwrap_or(&rel));
            let meta = fs::symlink_metadata(&full)
                .unwrap_or_else(|err| panic!("{spec}: {path} not restored: {err}"));
            match s(&e["type"]) {
                "file" | "hardlink" if meta.is_file() => {
                    let data = fs::read(&full).unwrap();
                    if let Some(sum) = e.get("sha256").and_then(Value::as_str) {
                        assert_eq!(data.len() as u64, u(&e["size"]), "{spec}: {path}");
                        assert_eq!(hex::encode(Sha256::digest(&data)), sum, "{spec}: {path}");
                    }
                }
                "dir" => assert!(meta.is_dir(), "{spec}: {path}"),
                "symlink" => assert_eq!(
                    fs::read_link(&full).unwrap().as_os_str().as_bytes(),
                    s(&e["target"]).as_bytes(),
                    "{spec}: {path}"
                ),
                other => panic!("{spec}: {path} restored as {meta:?}, expected {other}"),
            }
        }
    }
}

#[test]
fn golden_repositories_open_check_and_restore_exactly() {
    for d in fixtures_with("expected.json") {
        check_fixture(&d);
    }
}

/// One golden volume fixture: every volume checked, snapshotted, restored
/// byte-exact and checked again with its data read.
fn check_volume_fixture(dir: &Path) {
    let (tmp, repo, expected) = open_fixture(dir, "expected-volumes.json");
    let run = |args: &[&str]| run_in(&repo, args);
    let listed = run(&["--json", "volume", "list"]).json();
    assert_eq!(
        listed.as_array().map(Vec::len),
        expected.as_object().map(|o| o.len()),
        "{listed}"
    );
    for (name, want) in expected.as_object().unwrap() {
        let c = run(&["--json", "volume", "check", name]).json();
        assert_eq!(c["problems"], serde_json::json!([]), "{name}: {c}");
        run(&["volume", "snapshot", name]);
        let target = tmp.path().join(format!("restore-{name}"));
        let spec = format!("volume:{name}@latest");
        run(&["restore", &spec, "-t", path_str(&target)]);
        let img = fs::read(target.join(format!("{name}.img"))).unwrap();
        assert_eq!(img.len() as u64, u(&want["size"]), "{name}");
        let sum = hex::encode(Sha256::digest(&img));
        assert_eq!(sum, s(&want["sha256"]), "{name}: the image changed");
        let c = run(&["--json", "volume", "check", name, "--read-data"]).json();
        assert_eq!(c["problems"], serde_json::json!([]), "{name}: {c}");
        assert_eq!(c["clean"], Value::Bool(true), "{name}: {c}");
    }
}

#[test]
fn golden_volumes_check_snapshot_and_restore_exactly() {
    for d in fixtures_with("expected-volumes.json") {
        check_volume_fixture(&d);
    }
}

/// `delta-1` (`GOLDEN_INIT_OPTS="--delta on" scripts/make-golden delta-1`)
/// holds chunks in delta regions and recipe parts stored as deltas: the
/// fixture is what it claims to be (the tests above restore it).
#[test]
fn the_delta_fixture_holds_deltas() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/delta-1");
    let (_tmp, repo, _) = open_fixture(&dir, "expected.json");
    let st = run_in(&repo, &["--json", "stats"]).json();
    assert!(st["delta"]["chunks"].as_u64().unwrap() > 0, "{st:#}");
    let delta_parts = walkdir::WalkDir::new(repo.join("parts"))
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .filter(|e| fs::read(e.path()).unwrap().get(1) == Some(&18))
        .count();
    assert!(delta_parts > 0);
}
