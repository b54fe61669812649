//! End-to-end tests of the everyday commands and options: snapshot
//! selection (`latest`, id prefixes, filters), names that are not UTF-8,
//! `ls`/`dump`/`restore` paths, restore's `--overwrite`, `--dry-run`,
//! `--exclude` and `--verify`, passwords, exit codes, Ctrl-C, `diff`,
//! `find`, `key`, `tag`, backup's list and exclude options, completions
//! and man pages. Every test drives the real binary.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

fn arr(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        v => panic!("expected a JSON array, got {v}"),
    }
}

/// `ls SPEC [EXTRA...] --json` as path → entry.
fn ls(repo: &Repo, spec: &str, extra: &[&str]) -> BTreeMap<String, Value> {
    let mut a = vec!["ls", spec];
    a.extend_from_slice(extra);
    arr(repo.json(&a))
        .into_iter()
        .map(|e| (s(&e["path"]).to_string(), e))
        .collect()
}

/// A `strata --repo REPO ARGS...` command with no password in the
/// environment (the repository's password is given some other way).
fn bare(repo: &Repo, args: &[&str]) -> Command {
    let mut c = strata();
    c.arg("--repo").arg(&repo.path).args(args);
    c
}

/// A `strata` command with an encrypted repository's password `pw`.
fn with_pw(repo: &Repo, pw: &str, args: &[&str]) -> Run {
    let mut c = bare(repo, args);
    c.env("STRATA_PASSWORD", pw);
    run_cmd(c, None)
}

/// Files and directories (relative paths) below `root`, empty when it
/// does not exist.
fn listing(root: &Path) -> BTreeSet<PathBuf> {
    if !root.exists() {
        return BTreeSet::new();
    }
    manifest(root)
        .into_keys()
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

fn mtime(p: &Path) -> SystemTime {
    fs::symlink_metadata(p).unwrap().modified().unwrap()
}

fn set_mtime(p: &Path, t: SystemTime) {
    fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap_or_else(|e| panic!("set mtime of {}: {e}", p.display()));
}

fn stdin_backup(repo: &Repo, name: &str, data: &[u8], extra: &[&str]) -> Value {
    let mut a = vec!["--json", "backup", "--stdin", "--stdin-name", name];
    a.extend_from_slice(extra);
    repo.run_stdin(&a, data).ok().json()
}

// ---------------------------------------------------------------------------
// 1. A path that does not exist.

#[test]
fn backup_of_missing_path_fails_and_commits_nothing() {
    let repo = Repo::new();
    let r = repo.run(&["backup", "/no/such/path"]).expect_code(1);
    assert!(r.stderr.contains("/no/such/path"), "{}", r.stderr);
    assert_eq!(repo.snapshots(), Vec::<Value>::new());
    // Also when an existing path comes with it.
    let src = repo.dir().join("src");
    write(&src.join("f"), b"f\n");
    repo.run(&["backup", path_str(&src), "/no/such/path"])
        .expect_code(1);
    assert_eq!(repo.snapshots(), Vec::<Value>::new());
}

// ---------------------------------------------------------------------------
// 2. `latest` names one series.

#[test]
fn latest_is_scoped_to_one_series() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a.txt"), b"alpha\n");
    write(&src.join("sub/b.txt"), b"beta\n");
    let b = repo.backup(&[&src], &[]);
    let snaps = repo.snapshots();
    let host = s(&snaps[0]["host"]).to_string();
    let dir_series = format!("{host}:{}", src.display());
    assert_eq!(s(&b["series"]), dir_series);
    let db = stdin_backup(&repo, "db.sql", b"CREATE TABLE t;\n", &[]);
    let db_series = format!("{host}:stdin:db.sql");
    assert_eq!(s(&db["series"]), db_series);

    // Two series: `latest` alone is ambiguous and names both.
    let t = repo.scratch("t-ambiguous");
    let r = repo
        .run(&["restore", "latest", "-t", path_str(&t)])
        .expect_code(1);
    assert!(r.stderr.contains("ambiguous"), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{dir_series}@latest")),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!("{db_series}@latest")),
        "{}",
        r.stderr
    );
    assert!(!t.exists(), "a refused restore created its target");
    let r = repo.run(&["ls", "latest"]).expect_code(1);
    assert!(
        r.stderr.contains(&format!("{db_series}@latest")),
        "{}",
        r.stderr
    );

    // --path picks the directory's series.
    let t = repo.scratch("t-dir");
    let v = repo.json(&[
        "restore",
        "latest",
        "--path",
        path_str(&src),
        "-t",
        path_str(&t),
    ]);
    assert_eq!(s(&v["snapshot"]), s(&b["id"]));
    assert_eq!(u(&v["files"]), 2);
    assert_trees_equal(&src, &restored(&t, &src));

    // --series picks the stream's.
    let t = repo.scratch("t-db");
    let v = repo.json(&[
        "restore",
        "latest",
        "--series",
        &db_series,
        "-t",
        path_str(&t),
    ]);
    assert_eq!(s(&v["snapshot"]), s(&db["id"]));
    assert_eq!(
        listing(&t),
        BTreeSet::from([PathBuf::from("db.sql")]),
        "only the stream is restored"
    );
    assert_eq!(fs::read(t.join("db.sql")).unwrap(), b"CREATE TABLE t;\n");

    // ls latest --series X.
    let r = repo.run(&["ls", "latest", "--series", &db_series]).ok();
    let lines: Vec<&str> = r.stdout_lines();
    assert_eq!(lines.len(), 1, "{}", r.out());
    assert!(lines[0].ends_with(" /db.sql"), "{}", r.out());
    let entries = ls(&repo, "latest", &["--series", &dir_series]);
    assert!(entries.contains_key(&format!("{}/sub/b.txt", src.display())));
    assert!(!entries.contains_key("/db.sql"));
    // dump too.
    let r = repo
        .run(&["dump", "latest", "--series", &db_series, "/db.sql"])
        .ok();
    assert_eq!(r.stdout, b"CREATE TABLE t;\n");
    // A filter that leaves nothing.
    let r = repo
        .run(&["ls", "latest", "--series", "no-such-series"])
        .expect_code(1);
    assert!(r.stderr.contains("no-such-series"), "{}", r.stderr);
}

#[test]
fn latest_without_filter_when_there_is_one_series() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("x"), b"one\n");
    repo.backup(&[&src], &[]);
    write(&src.join("x"), b"two!\n");
    let b2 = repo.backup(&[&src], &[]);
    assert_eq!(u(&b2["version"]), 2);
    let t = repo.scratch("t");
    let v = repo.json(&["restore", "latest", "-t", path_str(&t)]);
    assert_eq!(s(&v["snapshot"]), s(&b2["id"]));
    assert_eq!(fs::read(restored(&t, &src).join("x")).unwrap(), b"two!\n");
    let e = ls(&repo, "latest", &[]);
    assert_eq!(u(&e[&format!("{}/x", src.display())]["size"]), 5);
}

// ---------------------------------------------------------------------------
// 3. Snapshot id prefixes.

#[test]
fn snapshot_id_prefixes_resolve_or_are_ambiguous() {
    let repo = Repo::new();
    // Snapshots until two ids share their first hex digit, a letter
    // (digits alone, shorter than 4, are taken for version numbers).
    let mut ids: Vec<String> = Vec::new();
    let pair = loop {
        let data = format!("version {}\n", ids.len());
        let v = stdin_backup(&repo, "f", data.as_bytes(), &["--no-lifecycle"]);
        let id = s(&v["id"]).to_string();
        let letter = id.as_bytes()[0].is_ascii_alphabetic();
        if let Some(other) = ids.iter().find(|o| letter && o[..1] == id[..1]) {
            break (other.clone(), id.clone());
        }
        ids.push(id);
        assert!(ids.len() <= 60);
    };
    ids.push(pair.1.clone());
    let resolved = |spec: &str| -> String {
        let t = repo.dir().join("never-written");
        let v = repo.json(&["restore", spec, "-t", path_str(&t), "--dry-run"]);
        assert!(!t.exists());
        s(&v["snapshot"]).to_string()
    };

    // Ambiguous: both short ids, with "…".
    let digit = &pair.0[..1];
    let r = repo.run(&["ls", digit]).expect_code(1);
    assert!(r.stderr.contains("ambiguous"), "{}", r.stderr);
    for id in [&pair.0, &pair.1] {
        assert!(
            r.stderr.contains(&format!("{}…", &id[..8])),
            "{} not named: {}",
            &id[..8],
            r.stderr
        );
    }
    let t = repo.scratch("t");
    let r = repo
        .run(&["restore", digit, "-t", path_str(&t)])
        .expect_code(1);
    assert!(r.stderr.contains("ambiguous"), "{}", r.stderr);
    assert!(!t.exists());

    // The shortest unique prefix (1 to 3 characters) of every snapshot
    // that has one resolves to it, also in upper case.
    let mut tried = 0;
    for id in &ids {
        let Some(n) = (1..=3).find(|&n| ids.iter().filter(|o| o[..n] == id[..n]).count() == 1)
        else {
            continue;
        };
        if id[..n].bytes().all(|b| b.is_ascii_digit()) {
            // Taken for a version number, with a hint.
            let r = repo.run(&["ls", &id[..n]]).expect_code(1);
            assert!(r.stderr.contains("version number"), "{}", r.stderr);
            tried += 1;
            continue;
        }
        assert_eq!(resolved(&id[..n]), *id, "prefix {}", &id[..n]);
        assert_eq!(resolved(&id[..n].to_uppercase()), *id);
        tried += 1;
    }
    assert!(tried >= ids.len() - 2, "few unique prefixes among {ids:?}");
    // One character where it is unique.
    if let Some(id) = ids.iter().find(|id| {
        id.as_bytes()[0].is_ascii_alphabetic()
            && ids.iter().filter(|o| o[..1] == id[..1]).count() == 1
    }) {
        assert_eq!(resolved(&id[..1]), *id);
    }
    // A prefix of no snapshot, and one that is not hex.
    let none = (0..16u8)
        .map(|d| format!("{d:x}"))
        .find(|d| !ids.iter().any(|id| id.starts_with(d.as_str())))
        .map(|d| d.repeat(3))
        .unwrap_or_else(|| format!("{}{}", &pair.0[..2], "zz"));
    repo.run(&["ls", &none]).expect_code(1);
    repo.run(&["ls", "xyz"]).expect_code(1);
}

// ---------------------------------------------------------------------------
// 4. Names that are not UTF-8.

#[test]
fn non_utf8_names_list_dump_and_restore() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    fs::create_dir_all(&src).unwrap();
    let raw_name = OsStr::from_bytes(b"n\xff");
    let raw = src.join(raw_name);
    let content = prng(11, 3000);
    fs::write(&raw, &content).unwrap();
    write(&src.join("other.txt"), b"other\n");
    let b = repo.backup(&[&src], &[]);
    let id = s(&b["id"]).to_string();

    let entries = ls(&repo, &id, &[]);
    let shown = format!("{}/n\\xff", src.display());
    let e = entries
        .get(&shown)
        .unwrap_or_else(|| panic!("no {shown} in {:?}", entries.keys()));
    let mut want_bytes = raw.as_os_str().as_bytes().to_vec();
    assert_eq!(want_bytes[0], b'/');
    let got: Vec<u8> = e["path_bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("no path_bytes: {e}"))
        .iter()
        .map(|b| u(b) as u8)
        .collect();
    assert_eq!(got, want_bytes);
    assert_eq!(u(&e["size"]), content.len() as u64);
    assert_eq!(s(&e["type"]), "file");
    // UTF-8 names carry no path_bytes.
    let other = &entries[&format!("{}/other.txt", src.display())];
    assert!(other.get("path_bytes").is_none(), "{other}");
    // Text ls shows the escaped name.
    let r = repo.run(&["ls", &id]).ok();
    assert!(
        r.out().lines().any(|l| l.ends_with(&format!(" {shown}"))),
        "{}",
        r.out()
    );

    // dump by the raw name (with or without the leading '/').
    let mut c = repo.cmd(&["dump", &id]);
    c.arg(&raw);
    let r = run_cmd(c, None).ok();
    assert_eq!(r.stdout, content);
    want_bytes.remove(0);
    let mut c = repo.cmd(&["dump", &id]);
    c.arg(OsStr::from_bytes(&want_bytes));
    assert_eq!(run_cmd(c, None).ok().stdout, content);
    // ls by the raw name.
    let mut c = repo.cmd(&["--json", "ls", &id]);
    c.arg(&raw);
    let v = arr(run_cmd(c, None).ok().json());
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(s(&v[0]["path"]), shown);

    // restore --include the raw name: that file only, byte-exact.
    let t = repo.scratch("t");
    let mut c = repo.cmd(&["--json", "restore", &id, "-t", path_str(&t), "--include"]);
    c.arg(&raw);
    let v = run_cmd(c, None).ok().json();
    assert_eq!(u(&v["files"]), 1, "{v}");
    assert_eq!(u(&v["bytes"]), content.len() as u64, "{v}");
    let got = restored(&t, &src);
    assert_eq!(fs::read(got.join(raw_name)).unwrap(), content);
    assert!(!got.join("other.txt").exists());
    let files: Vec<PathBuf> = walk_files(&t);
    assert_eq!(files, vec![got.join(raw_name)]);
}

// ---------------------------------------------------------------------------
// 5. Paths that select nothing.

#[test]
fn paths_that_match_nothing_are_errors() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a"), b"a\n");
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();
    for p in ["/missing", "relative/nope"] {
        let r = repo.run(&["ls", &id, p]).expect_code(1);
        assert!(r.stderr.contains("nothing in snapshot"), "{}", r.stderr);
        assert!(r.stdout.is_empty(), "{}", r.out());
        let shown = format!("/{}", p.trim_start_matches('/'));
        assert!(r.stderr.contains(&shown), "{}", r.stderr);
    }
    // One good and one bad path: still an error, naming the bad one only.
    let good = format!("{}/a", src.display());
    let r = repo.run(&["ls", &id, &good, "/missing"]).expect_code(1);
    assert!(
        r.stderr.contains("/missing") && !r.stderr.contains(&good),
        "{}",
        r.stderr
    );
    // A relative path that exists works (paths start at the root).
    let rel = good.trim_start_matches('/');
    let v = arr(repo.json(&["ls", &id, rel]));
    assert_eq!(v.len(), 1);
    assert_eq!(s(&v[0]["path"]), good);

    let t = repo.scratch("t");
    let r = repo
        .run(&["restore", &id, "-t", path_str(&t), "--include", "/nope"])
        .expect_code(1);
    assert!(r.stderr.contains("nothing in snapshot"), "{}", r.stderr);
    assert!(r.stderr.contains("/nope"), "{}", r.stderr);
    assert_eq!(listing(&t), BTreeSet::new(), "the target got files");
    // dump of a missing file.
    let r = repo.run(&["dump", &id, "/missing"]).expect_code(1);
    assert!(r.stderr.contains("/missing"), "{}", r.stderr);
    assert!(r.stdout.is_empty());
}

// ---------------------------------------------------------------------------
// 6. ls and dump speak to people.

trait Lines {
    fn stdout_lines(&self) -> Vec<&str>;
}

impl Lines for Run {
    fn stdout_lines(&self) -> Vec<&str> {
        std::str::from_utf8(&self.stdout)
            .expect("utf-8 stdout")
            .lines()
            .collect()
    }
}

const DEBUG_NAMES: [&str; 6] = ["Dir", "File", "Hardlink", "Symlink", "Fifo", "Some("];

#[test]
fn ls_and_dump_show_sizes_slashes_and_words() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    let body = prng(3, 1234);
    write(&src.join("dir/one"), &body);
    fs::hard_link(src.join("dir/one"), src.join("two")).unwrap();
    std::os::unix::fs::symlink("dir/one", src.join("sym")).unwrap();
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();

    let e = ls(&repo, &id, &[]);
    let one = format!("{}/dir/one", src.display());
    let two = format!("{}/two", src.display());
    let kinds: BTreeSet<&str> = [s(&e[&one]["type"]), s(&e[&two]["type"])].into();
    assert_eq!(kinds, BTreeSet::from(["file", "hardlink"]), "{e:?}");
    for p in [&one, &two] {
        assert_eq!(u(&e[p]["size"]), body.len() as u64, "{p}: {}", e[p]);
    }
    assert_eq!(s(&e[&format!("{}/sym", src.display())]["type"]), "symlink");
    assert!(e.keys().all(|p| p.starts_with('/')), "{:?}", e.keys());

    let r = repo.run(&["ls", &id]).ok();
    let lines = r.stdout_lines();
    assert_eq!(lines.len(), e.len(), "{}", r.out());
    for l in &lines {
        let (head, path) = l.split_once(" /").unwrap_or_else(|| panic!("no path: {l}"));
        assert!(
            e.contains_key(&format!(
                "/{}",
                path.split(" => ")
                    .next()
                    .unwrap()
                    .split(" -> ")
                    .next()
                    .unwrap()
            )),
            "{l}"
        );
        for w in DEBUG_NAMES {
            assert!(!head.contains(w), "{w} in {l}");
        }
        let fields: Vec<&str> = head.split_whitespace().collect();
        let kind = fields[0].chars().next().unwrap();
        assert!("-dlh".contains(kind), "{l}");
        assert!(
            fields[0][1..].chars().all(|c| c.is_digit(8)) && fields[0].len() == 5,
            "{l}"
        );
    }
    // The hard link's line: the file's size and `=> first name`.
    let link = if s(&e[&two]["type"]) == "hardlink" {
        &two
    } else {
        &one
    };
    let first = if link == &two { &one } else { &two };
    let line = lines
        .iter()
        .find(|l| l.contains(&format!(" {link} => ")))
        .unwrap_or_else(|| panic!("no hard link line in {}", r.out()));
    assert!(line.starts_with('h'), "{line}");
    assert!(line.ends_with(&format!(" => {first}")), "{line}");
    assert_eq!(
        line.split_whitespace().nth(3),
        Some(&*body.len().to_string()),
        "{line}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with('l') && l.ends_with(" -> dir/one")),
        "{}",
        r.out()
    );

    // dump: a directory and a symlink are not files, said in words.
    let dir = format!("{}/dir", src.display());
    let r = repo.run(&["dump", &id, &dir]).expect_code(1);
    assert!(
        r.stderr
            .contains(&format!("{dir} is a directory, not a file")),
        "{}",
        r.stderr
    );
    let sym = format!("{}/sym", src.display());
    let r = repo.run(&["dump", &id, &sym]).expect_code(1);
    assert!(
        r.stderr.contains("is a symbolic link, not a file"),
        "{}",
        r.stderr
    );
    for w in DEBUG_NAMES {
        assert!(!r.stderr.contains(w), "{w}: {}", r.stderr);
    }
    // dump of either name of the hard link: the content.
    for p in [&one, &two] {
        assert_eq!(repo.run(&["dump", &id, p]).ok().stdout, body);
    }
}

// ---------------------------------------------------------------------------
// 7. Restore into a directory that is not empty.

/// A source with two small files, backed up; returns (src, id, target)
/// with the target restored once.
fn overwrite_setup(repo: &Repo) -> (PathBuf, String, PathBuf) {
    let src = repo.dir().join("src");
    write(&src.join("f1"), b"one");
    write(&src.join("sub/f2"), b"two two");
    touch(&src.join("f1"), "2022-01-02 03:04:05.123456789");
    touch(&src.join("sub/f2"), "2022-01-02 03:04:05.5");
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();
    let t = repo.scratch("t");
    repo.restore(&id, &t);
    (src, id, t)
}

/// A restore's names left alone and files written.
fn assert_counts(v: &Value, skipped: u64, files: u64) {
    assert_eq!((u(&v["skipped"]), u(&v["files"])), (skipped, files), "{v}");
}

fn restore_ow(repo: &Repo, id: &str, t: &Path, mode: &str) -> Value {
    let v = repo.json(&["restore", id, "-t", path_str(t), "--overwrite", mode]);
    assert_eq!(v["warnings"], json!([]), "{v}");
    v
}

#[test]
fn restore_refuses_a_non_empty_target_without_overwrite() {
    let repo = Repo::new();
    let (src, id, t) = overwrite_setup(&repo);
    let f1 = restored(&t, &src).join("f1");
    write(&f1, b"changed!");
    write(&t.join("unrelated"), b"mine\n");
    let before = manifest(&t);
    let r = repo
        .run(&["restore", &id, "-t", path_str(&t)])
        .expect_code(1);
    assert!(r.stderr.contains("--overwrite"), "{}", r.stderr);
    assert!(r.stderr.contains("not empty"), "{}", r.stderr);
    assert_manifest_eq(&before, &manifest(&t), "refused restore");
    // An empty existing directory is fine.
    let empty = repo.dir().join("empty");
    fs::create_dir(&empty).unwrap();
    repo.restore(&id, &empty);
    assert_trees_equal(&src, &restored(&empty, &src));
}

#[test]
fn restore_overwrite_never_and_always() {
    let repo = Repo::new();
    let (src, id, t) = overwrite_setup(&repo);
    let f1 = restored(&t, &src).join("f1");
    let f2 = restored(&t, &src).join("sub/f2");
    write(&f1, b"changed!");
    fs::remove_file(&f2).unwrap();
    let v = restore_ow(&repo, &id, &t, "never");
    assert_eq!(fs::read(&f1).unwrap(), b"changed!", "never replaced a file");
    // The missing file comes back; the existing one is skipped.
    assert_eq!(fs::read(&f2).unwrap(), b"two two");
    assert_counts(&v, 1, 1);

    let v = restore_ow(&repo, &id, &t, "never");
    assert_counts(&v, 2, 0);

    let v = restore_ow(&repo, &id, &t, "always");
    assert_counts(&v, 0, 2);
    assert_eq!(fs::read(&f1).unwrap(), b"one");
    assert_trees_equal(&src, &restored(&t, &src));
}

#[test]
fn restore_overwrite_if_changed() {
    let repo = Repo::new();
    let (src, id, t) = overwrite_setup(&repo);
    let f1 = restored(&t, &src).join("f1");
    let f2 = restored(&t, &src).join("sub/f2");
    // Same size and mtime as the snapshot's (content differs, so a
    // replacement would show): kept.
    write(&f1, b"ONE");
    set_mtime(&f1, mtime(&src.join("f1")));
    // Another size: replaced.
    write(&f2, b"2");
    set_mtime(&f2, mtime(&src.join("sub/f2")));
    let v = restore_ow(&repo, &id, &t, "if-changed");
    assert_counts(&v, 1, 1);
    assert_eq!(fs::read(&f1).unwrap(), b"ONE");
    assert_eq!(fs::read(&f2).unwrap(), b"two two");
    // Same size, another mtime: replaced.
    write(&f1, b"ONE");
    let v = restore_ow(&repo, &id, &t, "if-changed");
    assert_eq!(u(&v["skipped"]), 1, "{v}"); // f2 now matches
    assert_eq!(fs::read(&f1).unwrap(), b"one");
    assert_trees_equal(&src, &restored(&t, &src));
}

#[test]
fn restore_overwrite_if_newer() {
    let repo = Repo::new();
    let (src, id, t) = overwrite_setup(&repo);
    let f1 = restored(&t, &src).join("f1");
    let f2 = restored(&t, &src).join("sub/f2");
    // Newer than the snapshot's: kept.
    write(&f1, b"newer");
    set_mtime(&f1, SystemTime::now() + Duration::from_secs(3600));
    // Older: replaced.
    write(&f2, b"older");
    set_mtime(
        &f2,
        SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_800),
    );
    let v = restore_ow(&repo, &id, &t, "if-newer");
    assert_counts(&v, 1, 1);
    assert_eq!(fs::read(&f1).unwrap(), b"newer");
    assert_eq!(fs::read(&f2).unwrap(), b"two two");
    assert_eq!(mtime(&f2), mtime(&src.join("sub/f2")));
}

#[test]
fn restore_overwrite_rejects_unknown_mode() {
    let repo = Repo::new();
    let (_, id, t) = overwrite_setup(&repo);
    repo.run(&[
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--overwrite",
        "sometimes",
    ])
    .expect_code(2);
}

// ---------------------------------------------------------------------------
// 8. Restore --dry-run, --exclude, --verify.

#[test]
fn restore_dry_run_exclude_and_verify() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    let big = prng(8, 5000);
    write(&src.join("keep/a.bin"), &big);
    write(&src.join("keep/b.txt"), b"bee\n");
    write(&src.join("drop/c.txt"), b"sea\n");
    write(&src.join("drop/deeper/d.txt"), b"dee\n");
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();

    let t = repo.scratch("t-dry");
    let v = repo.json(&["restore", &id, "-t", path_str(&t), "--dry-run"]);
    assert_eq!(v["dry_run"], json!(true), "{v}");
    assert_eq!(u(&v["files"]), 4, "{v}");
    assert_eq!(u(&v["bytes"]), big.len() as u64 + 12, "{v}");
    assert_eq!(u(&v["existing"]), 0, "{v}");
    assert!(!t.exists(), "dry run created the target");
    // Into an existing tree: no --overwrite needed, nothing touched.
    let full = repo.scratch("t-full");
    repo.restore(&id, &full);
    let before = manifest(&full);
    let v = repo.json(&["restore", &id, "-t", path_str(&full), "--dry-run"]);
    assert_eq!(u(&v["existing"]), 4, "{v}");
    assert_manifest_eq(&before, &manifest(&full), "dry run");
    // With --exclude.
    let drop = src.join("drop");
    let v = repo.json(&[
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--dry-run",
        "--exclude",
        path_str(&drop),
    ]);
    assert_eq!(u(&v["files"]), 2, "{v}");
    assert_eq!(u(&v["bytes"]), big.len() as u64 + 4, "{v}");

    // --exclude: the subtree is left out.
    let t = repo.scratch("t-ex");
    let v = repo.json(&[
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--exclude",
        path_str(&drop),
    ]);
    assert_eq!(u(&v["files"]), 2, "{v}");
    let got = restored(&t, &src);
    assert!(!got.join("drop").exists());
    assert_eq!(fs::read(got.join("keep/a.bin")).unwrap(), big);
    assert_eq!(
        walk_files(&t),
        vec![got.join("keep/a.bin"), got.join("keep/b.txt")]
    );
    // An excluded file within an included directory.
    let t = repo.scratch("t-ex2");
    let incl = src.join("drop");
    let excl = src.join("drop/deeper");
    repo.json(&[
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--include",
        path_str(&incl),
        "--exclude",
        path_str(&excl),
    ]);
    assert_eq!(walk_files(&t), vec![restored(&t, &src).join("drop/c.txt")]);

    // --verify.
    let t = repo.scratch("t-verify");
    let r = repo
        .run(&["--json", "restore", &id, "-t", path_str(&t), "--verify"])
        .ok();
    let v = r.json();
    assert_eq!(v["verify"]["mismatches"], json!([]), "{v}");
    assert_eq!(u(&v["verify"]["files"]), 4, "{v}");
    assert_eq!(u(&v["verify"]["bytes"]), big.len() as u64 + 12, "{v}");
    let r = repo
        .run(&[
            "restore",
            &id,
            "-t",
            path_str(&t),
            "--verify",
            "--overwrite",
            "always",
        ])
        .ok();
    assert!(r.out().contains("all match the snapshot"), "{}", r.out());
    // A file changed behind restore's back (kept by --overwrite never)
    // is a mismatch: exit 1.
    write(&restored(&t, &src).join("keep/b.txt"), b"BEE\n");
    let r = repo.run(&[
        "--json",
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--verify",
        "--overwrite",
        "never",
    ]);
    let v = r.json();
    assert_eq!(r.code, 1, "{v}");
    let m = v["verify"]["mismatches"].as_array().unwrap();
    assert_eq!(m.len(), 1, "{v}");
    assert!(s(&m[0]).contains("b.txt"), "{v}");
}

/// A hard link whose first name is not selected is restored as a file
/// (see `--exclude` above); `--dry-run` must report what restore does.
#[test]
fn restore_dry_run_counts_hard_links_like_restore() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("d/h"), b"hello\n");
    fs::hard_link(src.join("d/h"), src.join("f")).unwrap();
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();
    // Whichever name the recipe records as the link.
    let link = ls(&repo, &id, &[])
        .into_iter()
        .find(|(_, v)| s(&v["type"]) == "hardlink")
        .map(|(p, _)| p)
        .expect("a hard link entry");
    let t = repo.scratch("t");
    let a = ["restore", &id, "-t", path_str(&t), "--include", &link];
    let d = repo.json(&[&a[..], &["--dry-run"]].concat());
    assert!(!t.exists());
    let real = repo.json(&a);
    assert_eq!(u(&real["files"]), 1, "{real}");
    assert_eq!(u(&real["bytes"]), 6, "{real}");
    assert_eq!(
        fs::read(t.join(link.trim_start_matches('/'))).unwrap(),
        b"hello\n"
    );
    assert_eq!(
        (u(&d["files"]), u(&d["bytes"])),
        (u(&real["files"]), u(&real["bytes"])),
        "dry run {d}\nreal {real}"
    );
}

// ---------------------------------------------------------------------------
// 9. Passwords.

#[test]
fn password_sources() {
    let repo = Repo::with_init(&["--encrypt"], Some("pw"));
    let src = repo.dir().join("src");
    write(&src.join("f"), b"secret\n");
    repo.backup(&[&src], &[]);

    let r = run_cmd(
        bare(&repo, &["--password-file", "/nope.txt", "snapshots"]),
        None,
    )
    .expect_code(1);
    assert!(
        r.stderr.contains("cannot read the password file"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("/nope.txt"), "{}", r.stderr);
    // Also from the environment variable.
    let mut c = bare(&repo, &["snapshots"]);
    c.env("STRATA_PASSWORD_FILE", "/nope.txt");
    let r = run_cmd(c, None).expect_code(1);
    assert!(
        r.stderr.contains("cannot read the password file"),
        "{}",
        r.stderr
    );

    // A file's first line.
    let pf = repo.dir().join("pw.txt");
    fs::write(&pf, "pw\nignored\n").unwrap();
    let r = run_cmd(
        bare(
            &repo,
            &["--json", "--password-file", path_str(&pf), "snapshots"],
        ),
        None,
    )
    .ok();
    assert_eq!(arr(r.json()).len(), 1);

    // A command's first line.
    let r = run_cmd(
        bare(
            &repo,
            &["--json", "--password-command", "echo pw", "snapshots"],
        ),
        None,
    )
    .ok();
    assert_eq!(arr(r.json()).len(), 1);
    let mut c = bare(&repo, &["--json", "snapshots"]);
    c.env("STRATA_PASSWORD_COMMAND", "printf 'pw\\nmore\\n'");
    assert_eq!(arr(run_cmd(c, None).ok().json()).len(), 1);
    // The file and the command take precedence over $STRATA_PASSWORD.
    let mut c = bare(&repo, &["--password-command", "echo wrong", "snapshots"]);
    c.env("STRATA_PASSWORD", "pw");
    run_cmd(c, None).expect_code(12);

    let r = run_cmd(
        bare(&repo, &["--password-command", "exit 3", "snapshots"]),
        None,
    )
    .expect_code(1);
    assert!(r.stderr.contains("password command failed"), "{}", r.stderr);
    let r = run_cmd(
        bare(&repo, &["--password-command", "false", "ls", "latest"]),
        None,
    )
    .expect_code(1);
    assert!(r.stderr.contains("password command failed"), "{}", r.stderr);

    let r = with_pw(&repo, "wrong", &["snapshots"]).expect_code(12);
    assert!(r.stderr.contains("wrong password"), "{}", r.stderr);
    let wf = repo.dir().join("wrong.txt");
    fs::write(&wf, "wrong\n").unwrap();
    let r = run_cmd(
        bare(&repo, &["--password-file", path_str(&wf), "snapshots"]),
        None,
    )
    .expect_code(12);
    assert!(r.stderr.contains("wrong password"), "{}", r.stderr);
    // No password at all (no terminal): a clear message.
    let r = run_cmd(bare(&repo, &["snapshots"]), None).expect_code(1);
    assert!(r.stderr.contains("encrypted"), "{}", r.stderr);
    // Both flags at once: a usage error.
    run_cmd(
        bare(
            &repo,
            &[
                "--password-file",
                path_str(&pf),
                "--password-command",
                "echo pw",
                "snapshots",
            ],
        ),
        None,
    )
    .expect_code(2);
}

// ---------------------------------------------------------------------------
// 10. Usage errors and help.

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let repo = Repo::new();
    for args in [
        vec!["--no-such-flag", "snapshots"],
        vec!["snapshots", "--no-such-flag"],
        vec!["backup", "--bogus", "/tmp"],
        vec!["restore"],
        vec!["restore", "latest"],
        vec!["dump", "latest"],
        vec!["diff", "latest"],
        vec!["no-such-command"],
        vec!["find"],
        vec!["tag"],
        vec!["key", "remove"],
        vec!["completion", "tcsh"],
    ] {
        let r = repo.run(&args).expect_code(2);
        assert!(!r.stderr.is_empty(), "{args:?}: no message");
    }
    let r = run_cmd(
        {
            let mut c = strata();
            c.arg("--help");
            c
        },
        None,
    )
    .ok();
    assert!(r.out().contains("130"), "{}", r.out());
    assert!(r.out().contains("interrupted"), "{}", r.out());
    let mut c = strata();
    c.args(["restore", "--help"]);
    let r = run_cmd(c, None).ok();
    assert!(r.out().contains("--overwrite"), "{}", r.out());
    // No command at all: usage (2).
    run_cmd(strata(), None).expect_code(2);
}

// ---------------------------------------------------------------------------
// 11. Ctrl-C.

#[test]
fn ctrl_c_exits_130_commits_nothing_and_leaves_no_lock() {
    let repo = Repo::with_init(&["--encrypt"], Some("pw"));
    let mut c = repo.cmd(&["--json", "backup", "--stdin", "--stdin-name", "big"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn strata backup");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&prng(21, 1 << 20)).unwrap();
    stdin.flush().unwrap();
    let locks = repo.path.join("locks");
    let lock_count = || fs::read_dir(&locks).map(|d| d.count()).unwrap_or(0);
    wait_until(Duration::from_secs(20), "the backup's lock", || {
        lock_count() > 0
    });
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: sends a signal to our own child.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0, "kill");
    let status = wait_timeout(&mut child, Duration::from_secs(20), "interrupted backup");
    drop(stdin);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(exit_code(status), 130, "stderr: {err}\nstdout: {out}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(err.contains("nothing committed"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["interrupted"], json!(true), "{v}");
    assert_eq!(repo.snapshots(), Vec::<Value>::new());
    assert_eq!(lock_count(), 0, "a lock was left behind");
    // The repository works on: a backup and a clean check.
    stdin_backup(&repo, "after", b"after\n", &[]);
    repo.assert_clean("after the interrupted backup");
}

// ---------------------------------------------------------------------------
// 12. diff.

#[test]
fn diff_lists_added_removed_modified_and_metadata() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("keep"), b"same\n");
    write(&src.join("gone"), b"bye bye\n");
    write(&src.join("mod"), b"old\n");
    write(&src.join("perm"), b"mode\n");
    let b1 = repo.backup(&[&src], &[]);
    fs::remove_file(src.join("gone")).unwrap();
    write(&src.join("added"), b"brand new\n");
    write(&src.join("mod"), b"new content\n");
    chmod(&src.join("perm"), 0o600);
    let b2 = repo.backup(&[&src], &[]);
    let (id1, id2) = (s(&b1["id"]), s(&b2["id"]));

    let v = repo.json(&["diff", id1, id2]);
    assert_eq!(s(&v["old"]), id1);
    assert_eq!(s(&v["new"]), id2);
    let changes = v["changes"].as_array().unwrap();
    let p = |n: &str| format!("{}/{n}", src.display());
    let files: BTreeMap<String, (String, Value, Value)> = changes
        .iter()
        .filter(|c| s(&c["kind"]) == "file")
        .map(|c| {
            (
                s(&c["path"]).to_string(),
                (
                    s(&c["change"]).to_string(),
                    c["old_size"].clone(),
                    c["new_size"].clone(),
                ),
            )
        })
        .collect();
    let want: BTreeMap<String, (String, Value, Value)> = [
        (p("added"), ("added".to_string(), json!(null), json!(10))),
        (p("gone"), ("removed".to_string(), json!(8), json!(null))),
        (p("mod"), ("modified".to_string(), json!(4), json!(12))),
        (p("perm"), ("metadata".to_string(), json!(5), json!(5))),
    ]
    .into();
    assert_eq!(files, want, "{v:#}");
    let perm = changes.iter().find(|c| s(&c["path"]) == p("perm")).unwrap();
    assert_eq!(perm["what"], json!(["mode"]), "{perm}");
    let modc = changes.iter().find(|c| s(&c["path"]) == p("mod")).unwrap();
    assert!(
        modc["what"].as_array().unwrap().contains(&json!("content")),
        "{modc}"
    );
    // The source directory's own times changed.
    let srcd = changes
        .iter()
        .find(|c| s(&c["path"]) == path_str(&src))
        .unwrap_or_else(|| panic!("no change of the directory: {v:#}"));
    assert_eq!(s(&srcd["change"]), "metadata");
    // Everything listed is a real path.
    assert!(changes.iter().all(|c| s(&c["path"]).starts_with('/')));

    let count = |what: &str| changes.iter().filter(|c| s(&c["change"]) == what).count() as u64;
    let sum = &v["summary"];
    assert_eq!(u(&sum["added"]), 1, "{sum}");
    assert_eq!(u(&sum["removed"]), 1, "{sum}");
    assert_eq!(u(&sum["modified"]), 1, "{sum}");
    assert_eq!(u(&sum["added_bytes"]), 10, "{sum}");
    assert_eq!(u(&sum["removed_bytes"]), 8, "{sum}");
    for what in ["added", "removed", "modified", "metadata"] {
        assert_eq!(u(&sum[what]), count(what), "{what}: {v:#}");
    }

    // --no-dir-metadata leaves out the directories.
    let v2 = repo.json(&["diff", id1, id2, "--no-dir-metadata"]);
    let c2 = v2["changes"].as_array().unwrap();
    assert!(c2.iter().all(|c| s(&c["kind"]) != "dir"), "{v2:#}");
    assert_eq!(c2.len(), 4, "{v2:#}");

    // Text: one line per change with its mark, then the summary.
    let r = repo.run(&["diff", id1, id2, "--no-dir-metadata"]).ok();
    let out = r.out();
    for (mark, name) in [("+", "added"), ("-", "gone"), ("M", "mod"), ("U", "perm")] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(mark) && l.contains(&p(name))),
            "{mark} {name}: {out}"
        );
    }
    assert!(
        out.contains("1 added (10 B), 1 removed (8 B), 1 modified"),
        "{out}"
    );
    for w in DEBUG_NAMES {
        assert!(!out.contains(w), "{w}: {out}");
    }
    // Same snapshot: no changes.
    let v = repo.json(&["diff", id2, id2]);
    assert_eq!(v["changes"], json!([]), "{v}");
}

#[test]
fn diff_summary_matches_changes_with_no_dir_metadata() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("perm"), b"mode\n");
    let b1 = repo.backup(&[&src], &[]);
    chmod(&src.join("perm"), 0o600);
    write(&src.join("added"), b"x\n");
    let b2 = repo.backup(&[&src], &[]);
    let v = repo.json(&["diff", s(&b1["id"]), s(&b2["id"]), "--no-dir-metadata"]);
    let listed = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| s(&c["change"]) == "metadata")
        .count() as u64;
    assert_eq!(listed, 1, "{v:#}");
    assert_eq!(u(&v["summary"]["metadata"]), listed, "{v:#}");
}

// ---------------------------------------------------------------------------
// 13. find.

#[test]
fn find_names_the_snapshots_holding_matching_paths() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("alpha.txt"), b"a\n");
    write(&src.join("sub/beta.txt"), b"b\n");
    let id1 = s(&repo.backup(&[&src], &[])["id"]).to_string();
    write(&src.join("sub/alphabet.md"), b"abc\n");
    let id2 = s(&repo.backup(&[&src], &[])["id"]).to_string();
    let p = |n: &str| format!("{}/{n}", src.display());
    let hits = |args: &[&str]| -> BTreeSet<(String, String)> {
        let mut a = vec!["find"];
        a.extend_from_slice(args);
        arr(repo.json(&a))
            .iter()
            .map(|h| (s(&h["snapshot"]).to_string(), s(&h["path"]).to_string()))
            .collect()
    };
    let all = BTreeSet::from([
        (id1.clone(), p("alpha.txt")),
        (id2.clone(), p("alpha.txt")),
        (id2.clone(), p("sub/alphabet.md")),
    ]);
    assert_eq!(hits(&["alpha*"]), all);
    // JSON fields.
    let v = arr(repo.json(&["find", "alphabet.md"]));
    assert_eq!(v.len(), 1);
    assert_eq!(s(&v[0]["type"]), "file");
    assert_eq!(u(&v[0]["size"]), 4);
    assert_eq!(u(&v[0]["version"]), 2);
    // Several patterns, path patterns.
    assert_eq!(
        hits(&["beta.txt", "alphabet.*"]),
        BTreeSet::from([
            (id1.clone(), p("sub/beta.txt")),
            (id2.clone(), p("sub/beta.txt")),
            (id2.clone(), p("sub/alphabet.md")),
        ])
    );
    assert_eq!(
        hits(&["sub/*.md"]),
        BTreeSet::from([(id2.clone(), p("sub/alphabet.md"))])
    );
    assert_eq!(
        hits(&[&format!("{}/*.txt", src.display())]),
        BTreeSet::from([(id1.clone(), p("alpha.txt")), (id2.clone(), p("alpha.txt"))])
    );
    // Nothing: exit 1.
    let r = repo.run(&["find", "zzz*"]).expect_code(1);
    assert!(r.stderr.contains("zzz*"), "{}", r.stderr);
    repo.run(&["--json", "find", "zzz*"]).expect_code(1);
    // --snapshot restricts.
    assert_eq!(
        hits(&["alpha*", "--snapshot", &id1]),
        BTreeSet::from([(id1.clone(), p("alpha.txt"))])
    );
    assert_eq!(hits(&["alpha*", "-s", &id2[..12]]).len(), 2);
    repo.run(&["find", "alphabet*", "--snapshot", &id1])
        .expect_code(1);
    // Case.
    repo.run(&["find", "ALPHA*"]).expect_code(1);
    assert_eq!(hits(&["-i", "ALPHA*"]), all);
    assert_eq!(hits(&["--ignore-case", "Alpha.TXT"]).len(), 2);
    // Text: grouped by snapshot.
    let r = repo.run(&["find", "alphabet*"]).ok();
    let out = r.out();
    assert!(out.contains(&format!("snapshot {}", &id2[..8])), "{out}");
    assert!(!out.contains(&id1[..8]), "{out}");
    assert!(out.contains(&p("sub/alphabet.md")), "{out}");
}

// ---------------------------------------------------------------------------
// 14. key.

#[test]
fn key_list_add_passwd_remove() {
    let repo = Repo::with_init(&["--encrypt"], Some("pw"));
    let src = repo.dir().join("src");
    write(&src.join("f"), b"keyed\n");
    repo.backup(&[&src], &[]);
    let opens = |pw: &str| with_pw(&repo, pw, &["--json", "snapshots"]).code == 0;
    let list = |pw: &str| arr(with_pw(&repo, pw, &["--json", "key", "list"]).ok().json());

    let l = list("pw");
    assert_eq!(l.len(), 1, "{l:?}");
    let k = &l[0];
    let mut fields: Vec<&str> = k.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        ["created_ns", "current", "host", "id", "user"],
        "{k}"
    );
    assert_eq!(k["current"], json!(true));
    assert!(u(&k["created_ns"]) > 0, "{k}");
    assert!(
        !s(&k["host"]).is_empty() && !s(&k["user"]).is_empty(),
        "{k}"
    );
    let first = s(&k["id"]).to_string();

    // add, from a file.
    let nf = repo.dir().join("new.txt");
    fs::write(&nf, "pw2\n").unwrap();
    let v = with_pw(
        &repo,
        "pw",
        &["--json", "key", "add", "--new-password-file", path_str(&nf)],
    )
    .ok()
    .json();
    let second = s(&v["added"]).to_string();
    assert!(opens("pw") && opens("pw2"));
    assert!(!opens("pw3"));
    let l = list("pw2");
    assert_eq!(l.len(), 2);
    let current: Vec<&str> = l
        .iter()
        .filter(|k| k["current"] == json!(true))
        .map(|k| s(&k["id"]))
        .collect();
    assert_eq!(current, [second.as_str()]);
    let text = with_pw(&repo, "pw2", &["key", "list"]).ok().out();
    assert!(
        text.lines()
            .any(|l| l.starts_with('*') && l.contains(&second)),
        "{text}"
    );

    // The key in use cannot be removed.
    let r = with_pw(&repo, "pw", &["key", "remove", &first]).expect_code(1);
    assert!(r.stderr.contains("your password opened"), "{}", r.stderr);
    assert!(opens("pw"));
    let r = with_pw(&repo, "pw", &["key", "remove", "ffffffffffffff"]).expect_code(1);
    assert!(r.stderr.contains("no key"), "{}", r.stderr);
    // An empty new password is refused.
    let empty = repo.dir().join("empty.txt");
    fs::write(&empty, "\n").unwrap();
    with_pw(
        &repo,
        "pw",
        &["key", "add", "--new-password-file", path_str(&empty)],
    )
    .expect_code(1);
    assert_eq!(list("pw").len(), 2);

    // passwd, from $STRATA_NEW_PASSWORD: the old password stops working.
    let mut c = bare(&repo, &["--json", "key", "passwd"]);
    c.env("STRATA_PASSWORD", "pw")
        .env("STRATA_NEW_PASSWORD", "pw3");
    run_cmd(c, None).ok();
    let r = with_pw(&repo, "pw", &["snapshots"]).expect_code(12);
    assert!(r.stderr.contains("wrong password"), "{}", r.stderr);
    assert!(opens("pw3") && opens("pw2"));
    assert_eq!(list("pw3").len(), 2);
    // add from $STRATA_NEW_PASSWORD too.
    let mut c = bare(&repo, &["--json", "key", "add"]);
    c.env("STRATA_PASSWORD", "pw3")
        .env("STRATA_NEW_PASSWORD", "pw4");
    let fourth = s(&run_cmd(c, None).ok().json()["added"]).to_string();
    assert!(opens("pw4"));
    // No new password from anywhere: an error, not a hang.
    with_pw(&repo, "pw3", &["key", "add"]).expect_code(1);

    // Remove another key (by a unique prefix): its password stops working.
    let prefix = &second[..8];
    let v = with_pw(&repo, "pw3", &["--json", "key", "remove", prefix])
        .ok()
        .json();
    assert_eq!(s(&v["removed"]), second);
    assert!(!opens("pw2"));
    assert!(opens("pw3") && opens("pw4"));
    let ids: BTreeSet<String> = list("pw4")
        .iter()
        .map(|k| s(&k["id"]).to_string())
        .collect();
    assert!(
        ids.contains(&fourth) && !ids.contains(&second) && !ids.contains(&first),
        "{ids:?}"
    );
    assert_eq!(ids.len(), 2);
    // The data is still readable.
    let t = repo.scratch("t");
    let mut c = bare(&repo, &["restore", "latest", "-t", path_str(&t)]);
    c.env("STRATA_PASSWORD", "pw4");
    run_cmd(c, None).ok();
    assert_eq!(fs::read(restored(&t, &src).join("f")).unwrap(), b"keyed\n");
}

#[test]
fn key_list_on_an_unencrypted_repository() {
    let repo = Repo::new();
    let r = repo.run(&["key", "list"]).expect_code(1);
    assert!(r.stderr.contains("not encrypted"), "{}", r.stderr);
    let mut c = repo.cmd(&["key", "add"]);
    c.env("STRATA_NEW_PASSWORD", "x");
    let r = run_cmd(c, None).expect_code(1);
    assert!(r.stderr.contains("not encrypted"), "{}", r.stderr);
}

// ---------------------------------------------------------------------------
// 15. tag and the snapshot filters.

#[test]
fn tags_and_snapshot_filters() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("f"), b"tagged\n");
    let a = repo.backup(&[&src], &["--tag", "initial"]);
    let b = stdin_backup(&repo, "db.sql", b"db\n", &[]);
    let (ida, idb) = (s(&a["id"]).to_string(), s(&b["id"]).to_string());
    let ids_before = repo.snapshot_ids();
    let tags = |id: &str| -> Vec<String> {
        let all = repo.snapshots();
        let sn = all.iter().find(|x| s(&x["id"]) == id).unwrap();
        sn["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| s(t).to_string())
            .collect()
    };
    assert_eq!(tags(&ida), ["initial"]);

    let v = repo.json(&["tag", &ida[..10], "--add", "a", "--add", "b"]);
    assert_eq!(v, json!([{"id": ida, "tags": ["initial", "a", "b"]}]));
    assert_eq!(tags(&ida), ["initial", "a", "b"]);
    repo.json(&["tag", &ida, "--remove", "a"]);
    assert_eq!(tags(&ida), ["initial", "b"]);
    repo.json(&["tag", &ida, "--set", "x"]);
    assert_eq!(tags(&ida), ["x"]);
    assert_eq!(tags(&idb), Vec::<String>::new());
    assert_eq!(repo.snapshot_ids(), ids_before, "tagging changed ids");
    // The snapshot still reads.
    let t = repo.scratch("t");
    repo.restore(&ida, &t);
    assert_trees_equal(&src, &restored(&t, &src));
    // Nothing to do: an error.
    let r = repo.run(&["tag", &ida]).expect_code(1);
    assert!(r.stderr.contains("nothing to do"), "{}", r.stderr);
    // Several snapshots at once; --set '' clears.
    repo.json(&["tag", &ida, &idb, "--add", "both"]);
    assert_eq!(tags(&ida), ["x", "both"]);
    assert_eq!(tags(&idb), ["both"]);
    repo.json(&["tag", &idb, "--set", ""]);
    assert_eq!(tags(&idb), Vec::<String>::new());

    let ids = |args: &[&str]| -> BTreeSet<String> {
        let mut x = vec!["snapshots"];
        x.extend_from_slice(args);
        arr(repo.json(&x))
            .iter()
            .map(|v| s(&v["id"]).to_string())
            .collect()
    };
    let just = |id: &str| BTreeSet::from([id.to_string()]);
    assert_eq!(ids(&["--tag", "x"]), just(&ida));
    assert_eq!(ids(&["--tag", "nope", "--tag", "x"]), just(&ida));
    assert_eq!(ids(&["--tag", "nope"]), BTreeSet::new());
    let host = s(&repo.snapshots()[0]["host"]).to_string();
    assert_eq!(ids(&["--host", &host]), ids_before);
    assert_eq!(ids(&["--host", "no-such-host"]), BTreeSet::new());
    assert_eq!(ids(&["--path", path_str(&src)]), just(&ida));
    assert_eq!(ids(&["--path", &format!("{}/", src.display())]), just(&ida));
    assert_eq!(ids(&["--path", "/elsewhere"]), BTreeSet::new());
    let db_series = format!("{host}:stdin:db.sql");
    assert_eq!(ids(&["--series", &db_series]), just(&idb));
    assert_eq!(
        ids(&["--series", &db_series, "--tag", "x"]),
        BTreeSet::new()
    );
    // Text output: the tag column.
    let out = repo.run(&["snapshots", "--tag", "x"]).ok().out();
    assert!(out.contains(&ida[..8]) && !out.contains(&idb[..8]), "{out}");
    assert!(out.contains("1 snapshots"), "{out}");
    // `latest` within a tag.
    let t = repo.scratch("t2");
    let v = repo.json(&["restore", "latest", "--tag", "x", "-t", path_str(&t)]);
    assert_eq!(s(&v["snapshot"]), ida);
}

// ---------------------------------------------------------------------------
// 16. Backup's list, exclude and dry-run options.

/// Paths below `root` in `ls --json` of `spec`, relative to it.
fn ls_below(repo: &Repo, spec: &str, root: &Path) -> BTreeSet<String> {
    let prefix = format!("{}/", root.display());
    ls(repo, spec, &[])
        .into_keys()
        .filter_map(|p| p.strip_prefix(&prefix).map(String::from))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn backup_exclude_file_and_exclude_if_present() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("keep/a.txt"), b"a\n");
    write(&src.join("keep/b.log"), b"b\n");
    write(&src.join("#keep"), b"hash\n");
    write(&src.join("logs/x"), b"x\n");
    write(&src.join("skip/.nobackup"), b"");
    write(&src.join("skip/data"), b"data\n");
    write(&src.join("deep/skip2/.nobackup"), b"");
    write(&src.join("deep/skip2/more"), b"more\n");
    write(&src.join("deep/kept"), b"kept\n");
    let ef = repo.dir().join("excludes");
    fs::write(
        &ef,
        format!(
            "# a comment: #keep is not a pattern\n#keep\n*.log\n\n{}/logs\n",
            src.display()
        ),
    )
    .unwrap();
    let b = repo.backup(
        &[&src],
        &[
            "--exclude-file",
            path_str(&ef),
            "--exclude-if-present",
            ".nobackup",
        ],
    );
    let got = ls_below(&repo, s(&b["id"]), &src);
    assert_eq!(
        got,
        set(&["#keep", "keep", "keep/a.txt", "deep", "deep/kept"]),
        "{got:?}"
    );
    assert_eq!(u(&b["files"]), 3, "{b}");
    // Only --exclude-if-present.
    let b = repo.backup(&[&src], &["--exclude-if-present", ".nobackup"]);
    let got = ls_below(&repo, s(&b["id"]), &src);
    assert!(
        got.contains("logs/x") && got.contains("keep/b.log"),
        "{got:?}"
    );
    assert!(
        !got.iter()
            .any(|p| p.starts_with("skip") || p.contains("skip2")),
        "{got:?}"
    );
    // A missing exclude file is an error.
    let r = repo
        .backup_run(&[&src], &["--exclude-file", "/no/such/excludes"])
        .expect_code(1);
    assert!(r.stderr.contains("/no/such/excludes"), "{}", r.stderr);
    assert_eq!(repo.snapshots().len(), 2);
}

#[test]
fn backup_files_from() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("one/a"), b"a\n");
    write(&src.join("two/b"), b"b\n");
    write(&src.join("three/c"), b"c\n");
    let list = repo.dir().join("list");
    fs::write(
        &list,
        format!(
            "# what to back up\n{}\n\n{}\n",
            src.join("one").display(),
            src.join("two/b").display()
        ),
    )
    .unwrap();
    let b = repo.backup(&[], &["--files-from", path_str(&list)]);
    assert_eq!(u(&b["files"]), 2, "{b}");
    let got = ls_below(&repo, s(&b["id"]), &src);
    assert_eq!(got, set(&["one", "one/a", "two", "two/b"]), "{got:?}");
    let snap = &repo.snapshots()[0];
    let paths: BTreeSet<&str> = snap["paths"].as_array().unwrap().iter().map(s).collect();
    let one = src.join("one");
    let two_b = src.join("two/b");
    assert_eq!(paths, BTreeSet::from([path_str(&one), path_str(&two_b)]));
    // With a path on the command line too.
    let three = src.join("three");
    let b = repo.backup(&[&three], &["--files-from", path_str(&list)]);
    let got = ls_below(&repo, s(&b["id"]), &src);
    assert_eq!(
        got,
        set(&["one", "one/a", "two", "two/b", "three", "three/c"]),
        "{got:?}"
    );
    // Nothing to back up.
    let empty = repo.dir().join("empty-list");
    fs::write(&empty, "# nothing\n").unwrap();
    let r = repo
        .backup_run(&[], &["--files-from", path_str(&empty)])
        .expect_code(1);
    assert!(r.stderr.contains("nothing to back up"), "{}", r.stderr);
}

#[test]
fn backup_dry_run_commits_nothing() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a"), &prng(30, 4000));
    write(&src.join("d/b"), b"bee\n");
    let before = repo.objects("");
    for flag in ["--dry-run", "-n"] {
        let v = repo.backup(&[&src], &[flag]);
        assert_eq!(v["dry_run"], json!(true), "{v}");
        assert_eq!(u(&v["files"]), 2, "{v}");
        assert_eq!(u(&v["logical_bytes"]), 4004, "{v}");
        assert_eq!(repo.snapshots(), Vec::<Value>::new());
        assert_eq!(
            repo.objects(""),
            before,
            "a dry run wrote to the repository"
        );
    }
    let r = repo.run(&["backup", path_str(&src), "--dry-run"]).ok();
    assert!(r.out().contains("dry run"), "{}", r.out());
    assert_eq!(repo.snapshots(), Vec::<Value>::new());
    // A real backup afterwards is version 1 with everything new.
    let v = repo.backup(&[&src], &[]);
    assert_eq!(v["dry_run"], json!(false));
    assert_eq!(u(&v["version"]), 1);
    assert_eq!(u(&v["reused_files"]), 0);
    // A dry run against an existing version sees the unchanged files.
    let v = repo.backup(&[&src], &["-n"]);
    assert_eq!(u(&v["version"]), 2, "{v}");
    assert_eq!(u(&v["new_chunks"]), 0, "{v}");
    assert_eq!(repo.snapshots().len(), 1);
}

#[test]
fn backup_one_file_system_on_one_file_system() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a"), b"a\n");
    write(&src.join("d/e/f"), &prng(31, 2000));
    std::os::unix::fs::symlink("d/e/f", src.join("l")).unwrap();
    let b1 = repo.backup(&[&src], &[]);
    let b2 = repo.backup(&[&src], &["--one-file-system"]);
    let b3 = repo.backup(&[&src], &["-x"]);
    let e1 = ls(&repo, s(&b1["id"]), &[]);
    for b in [&b2, &b3] {
        assert_eq!(b["files"], b1["files"]);
        assert_eq!(b["dirs"], b1["dirs"]);
        assert_eq!(b["logical_bytes"], b1["logical_bytes"]);
        let e = ls(&repo, s(&b["id"]), &[]);
        // Same entries below the source (the ancestors' times may move).
        let below = |m: &BTreeMap<String, Value>| -> BTreeMap<String, Value> {
            m.iter()
                .filter(|(p, _)| p.starts_with(path_str(&src)))
                .map(|(p, v)| (p.clone(), v.clone()))
                .collect()
        };
        assert_eq!(below(&e), below(&e1));
    }
    let t = repo.scratch("t");
    repo.restore(s(&b3["id"]), &t);
    assert_trees_equal(&src, &restored(&t, &src));
}

// ---------------------------------------------------------------------------
// 17. completion, man, version.

#[test]
fn completion_man_and_version() {
    for sh in ["bash", "zsh", "fish"] {
        let mut c = strata();
        c.args(["completion", sh]);
        let r = run_cmd(c, None).ok();
        let out = r.out();
        assert!(out.contains("strata"), "{sh}: {out}");
        assert!(out.contains("restore"), "{sh}");
        assert!(
            out.contains("--overwrite") || out.contains("overwrite"),
            "{sh}"
        );
    }
    let mut c = strata();
    c.arg("man");
    let r = run_cmd(c, None).ok();
    let out = r.out();
    assert!(
        out.starts_with(".TH") || out.starts_with(".ie"),
        "{}",
        &out[..out.len().min(200)]
    );
    assert!(out.contains(".TH strata"), "{}", &out[..out.len().min(400)]);
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("man");
    let mut c = strata();
    c.arg("man").arg("--dir").arg(&d);
    run_cmd(c, None).ok();
    for page in [
        "strata.1",
        "strata-backup.1",
        "strata-restore.1",
        "strata-key.1",
    ] {
        let text = fs::read_to_string(d.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
    let backup = fs::read_to_string(d.join("strata-backup.1")).unwrap();
    assert!(
        backup.contains("exclude"),
        "strata-backup.1 lacks its options"
    );

    let version = env!("CARGO_PKG_VERSION");
    let mut c = strata();
    c.arg("version");
    let r = run_cmd(c, None).ok();
    assert_eq!(r.out().trim(), format!("strata {version}"));
    let mut c = strata();
    c.args(["--json", "version"]);
    let v = run_cmd(c, None).ok().json();
    assert_eq!(s(&v["version"]), version);
    let mut c = strata();
    c.arg("--version");
    let r = run_cmd(c, None).ok();
    assert!(r.out().contains(version), "{}", r.out());
}

// ---------------------------------------------------------------------------
// Output into a closed pipe (`strata ls latest | head`).

#[test]
fn output_into_a_closed_pipe_does_not_panic() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    for i in 0..50 {
        write(&src.join(format!("f{i}")), b"x\n");
    }
    repo.backup(&[&src], &[]);
    for args in [
        vec!["ls", "latest"],
        vec!["--json", "ls", "latest"],
        vec!["snapshots"],
        vec!["find", "f*"],
    ] {
        let mut c = repo.cmd(&args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        // The reader goes away before strata writes anything.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let code = exit_code(o.status);
        assert!(!err.contains("panicked"), "{args:?}: exit {code}\n{err}");
        assert_ne!(code, 101, "{args:?}: {err}");
    }
}

// ---------------------------------------------------------------------------
// `--json` failures print one document.

#[test]
fn find_json_without_hits_prints_one_document() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("a"), b"a\n");
    repo.backup(&[&src], &[]);
    let r = repo.run(&["--json", "find", "zzz*"]).expect_code(1);
    let docs = r.json_stream();
    assert_eq!(docs.len(), 1, "{}", r.out());
}

// ---------------------------------------------------------------------------
// Found in review: restore replaces names instead of writing through them,
// leaves existing directories alone unless told, `forget` honours the filter,
// `copy` is all or nothing and keeps series in time order, a closed pipe
// does not stop the work.

#[test]
fn restore_replaces_hard_links_symlinks_and_fifos_in_the_target() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    for n in ["a", "b", "c"] {
        write(&src.join(n), format!("snapshot-{n}").as_bytes());
    }
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();
    let t = repo.scratch("t");
    repo.restore(&id, &t);
    let r = restored(&t, &src);
    // a: a hard link to a file outside the target; b: a symlink to one;
    // c: a named pipe (opening it for writing would block).
    let (out1, out2) = (repo.dir().join("outside1"), repo.dir().join("outside2"));
    write(&out1, b"precious1");
    write(&out2, b"precious2");
    fs::remove_file(r.join("a")).unwrap();
    fs::hard_link(&out1, r.join("a")).unwrap();
    fs::remove_file(r.join("b")).unwrap();
    std::os::unix::fs::symlink(&out2, r.join("b")).unwrap();
    fs::remove_file(r.join("c")).unwrap();
    let c = std::ffi::CString::new(r.join("c").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    repo.json(&["restore", &id, "-t", path_str(&t), "--overwrite", "always"]);
    assert_eq!(fs::read(&out1).unwrap(), b"precious1");
    assert_eq!(fs::read(&out2).unwrap(), b"precious2");
    assert_trees_equal(&src, &r);
}

#[test]
fn restore_without_always_leaves_existing_directories_alone() {
    use std::os::unix::fs::PermissionsExt;
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("d/f"), b"x");
    fs::set_permissions(src.join("d"), fs::Permissions::from_mode(0o700)).unwrap();
    let id = s(&repo.backup(&[&src], &[])["id"]).to_string();
    let t = repo.scratch("t");
    let d = restored(&t, &src).join("d");
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    for mode in ["never", "if-newer"] {
        repo.json(&["restore", &id, "-t", path_str(&t), "--overwrite", mode]);
        let m = fs::metadata(&d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(m, 0o755, "--overwrite {mode} changed an existing directory");
    }
    assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
    repo.json(&[
        "restore",
        &id,
        "-t",
        path_str(&t),
        "--overwrite",
        "if-changed",
    ]);
    assert_eq!(
        fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
        0o700
    );
}

#[test]
fn forget_latest_honours_the_filter() {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("f"), b"1");
    let weekly = s(&repo.backup(&[&src], &["--tag", "weekly"])["id"]).to_string();
    write(&src.join("f"), b"2");
    let plain = s(&repo.backup(&[&src], &[])["id"]).to_string();
    repo.json(&["forget", "latest", "--tag", "weekly"]);
    let left: Vec<String> = repo
        .snapshots()
        .iter()
        .map(|v| s(&v["id"]).to_string())
        .collect();
    assert_eq!(
        left,
        vec![plain],
        "forgot the wrong one (the tagged was {weekly})"
    );
}

#[test]
fn copy_is_all_or_nothing_and_keeps_series_in_time_order() {
    let a = Repo::new();
    let src = a.dir().join("src");
    // Incompressible, so the container is mostly this file's data.
    let mut x = 0x9e3779b97f4a7c15u64;
    let data: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    write(&src.join("f"), &data);
    a.backup(&[&src], &[]);
    // The destination's series already has a newer version.
    let b = Repo::new();
    let bsrc = b.dir().join("src");
    write(&bsrc.join("f"), b"newer");
    let series = s(&a.snapshots()[0]["series"]).to_string();
    b.backup(&[&bsrc], &["--series", &series]);
    let from = a.path.to_str().unwrap().to_string();
    let r = b
        .run(&["--json", "copy", "--from-repo", &from])
        .expect_code(3);
    let v = r.json();
    assert_eq!(u(&v["refused"]), 1, "{v}");
    assert_eq!(b.snapshots().len(), 1);
    // A damaged source: nothing committed.
    let c = Repo::new();
    let obj = a.objects("data").into_iter().next().unwrap();
    let p = a.path.join(&obj);
    let mut d = fs::read(&p).unwrap();
    let at = d.len() / 2;
    d[at] ^= 0x55;
    fs::write(&p, &d).unwrap();
    let r = c.run(&["copy", "--from-repo", &from]).expect_code(1);
    assert!(r.stderr.contains("nothing committed"), "{}", r.stderr);
    assert!(c.snapshots().is_empty());
}

#[test]
fn a_closed_pipe_does_not_stop_the_work() {
    let repo = Repo::new();
    for i in 0..3 {
        stdin_backup(&repo, "f", format!("{i}").as_bytes(), &[]);
    }
    let mut c = repo.cmd(&["forget", "--keep-last", "1"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    drop(child.stdout.take());
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0));
    assert_eq!(repo.snapshots().len(), 1);
}

/// A stray object among the snapshots (a name that is no snapshot id)
/// is reported by name, never a crash; `forget NAME` drops it.
#[test]
fn a_stray_object_among_the_snapshots_is_named_not_a_crash() {
    let repo = Repo::new();
    let v = stdin_backup(&repo, "f", b"data", &[]);
    fs::write(repo.path.join("snapshots/x"), b"junk").unwrap();
    let r = repo.run(&["check"]).expect_code(1);
    assert!(r.out().contains("damaged snapshots: x"), "{}", r.out());
    let list = repo.snapshots();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], v["id"]);
    repo.run(&["forget", "x"]).ok();
    assert!(!repo.path.join("snapshots/x").exists());
    repo.run(&["check"]).ok();
}

/// A lock object nobody can read blocks nothing; `unlock` removes it.
#[test]
fn an_unreadable_lock_blocks_nothing() {
    let repo = Repo::new();
    fs::create_dir_all(repo.path.join("locks")).unwrap();
    fs::write(repo.path.join("locks/0123abcd"), b"junk").unwrap();
    stdin_backup(&repo, "f", b"data", &[]);
    repo.json(&["gc"]);
    repo.json(&["unlock"]);
    assert!(!repo.path.join("locks/0123abcd").exists());
}
