//! Decompression bombs as worst-case objects of every kind a restore or a
//! check reads: each object replaced by a small zstd frame of zeros that
//! expands to exactly what its kind may hold (`Kind::max_plain`: it passes
//! the cap, is expanded, then fails to decode), then `restore` and `check
//! --read-data` run under `/usr/bin/time` for their peak RSS.
//!
//! The kinds capped at 64 MiB or less must keep both commands under
//! 256 MB (run in CI); the table of every kind, those that grow with the
//! repository (4 GiB) included, is `cargo test -p strata-cli --test bombs
//! -- --ignored --nocapture` (minutes, ~10 GB of RAM at its peak).

mod common;

use common::*;
use std::fs;
use std::path::Path;
use strata_core::crypto::Kind;

/// The object kinds restore and check read, with where one lies.
const KINDS: &[(Kind, &str)] = &[
    (Kind::Snapshot, "snapshots"),
    (Kind::Recipe, "recipes"),
    (Kind::RecipePart, "parts"),
    (Kind::ContainerMeta, "meta"),
    (Kind::Index, "index"),
    (Kind::IndexSummary, "isum"),
    (Kind::LifecycleState, "lifecycle"),
    (Kind::Policy, "policies"),
    (Kind::Config, "config"),
];

/// What an object of `kind` may expand to in the repository [`pristine`]
/// makes: its kind's cap, and for container metadata the container size
/// (32 MiB by default) plus 16 MiB.
fn cap(kind: Kind) -> u64 {
    match kind {
        Kind::ContainerMeta => (32 << 20) + (16 << 20),
        k => k.max_plain(),
    }
}

/// A small repository with every kind of object above.
fn pristine() -> Repo {
    let repo = Repo::new();
    let src = repo.dir().join("src");
    for i in 0..20 {
        write(&src.join(format!("f{i}")), &prng(i, 6000));
    }
    let b = repo.backup(&[&src], &[]);
    repo.run(&["policy", s(&b["series"]), "--live", "1"])
        .expect_code(0);
    write(&src.join("f0"), b"changed");
    repo.backup(&[&src], &[]);
    repo
}

/// One command under `/usr/bin/time`: (exit code, peak RSS in bytes).
fn measured(repo: &Repo, args: &[&str]) -> (i32, u64, String) {
    let mut c = std::process::Command::new("/usr/bin/time");
    c.arg("-f")
        .arg("RSS %M")
        .arg(bin())
        .arg("--repo")
        .arg(&repo.path)
        .args(args);
    scrub(&mut c);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let kib: u64 = err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RSS "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (o.status.code().unwrap_or(-1), kib * 1024, err)
}

/// Replaces the first object of `kind` in a copy of `pristine` with a bomb
/// of its cap, and measures restore and check: (kind, restore, check).
fn trial(kind: Kind, dir: &str, frame: &[u8]) -> Vec<(String, i32, u64)> {
    let repo = pristine();
    let p = repo.path.join(dir);
    let victim = if p.is_file() || dir == "lifecycle" {
        // (The lifecycle's state: its one object, written here if the
        // repository has none yet.)
        let p = if p.is_file() { p } else { p.join("state") };
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        p
    } else {
        walk_files(&p)
            .into_iter()
            .next()
            .expect("an object of the kind")
    };
    let name = victim
        .strip_prefix(&repo.path)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let bound = (kind == Kind::Snapshot).then_some(name.as_str());
    fs::write(&victim, plain_zstd_envelope(kind as u8, frame, bound)).unwrap();
    let t = repo.scratch("t");
    let mut out = vec![];
    for args in [
        vec!["restore", "latest", "--target", path_str(&t)],
        vec!["check", "--read-data"],
    ] {
        let (code, rss, err) = measured(&repo, &args);
        assert!(!err.contains("panicked"), "{kind:?} {args:?}: {err}");
        out.push((args[0].to_string(), code, rss));
    }
    out
}

fn run(kinds: &[(Kind, &str)], limit: Option<u64>) {
    if !Path::new("/usr/bin/time").exists() {
        eprintln!("no /usr/bin/time: skipped");
        return;
    }
    for &(kind, dir) in kinds {
        let cap = cap(kind);
        let frame = zeros_frame(cap);
        for (cmd, code, rss) in trial(kind, dir, &frame) {
            eprintln!(
                "{kind:?} ({} MiB of zeros in {} bytes): {cmd} exit {code}, peak RSS {} MB",
                cap >> 20,
                frame.len(),
                rss / 1_000_000
            );
            if let Some(l) = limit {
                assert!(rss < l, "{kind:?}: {cmd} peaked at {} MB", rss / 1_000_000);
            }
        }
    }
}

/// Every kind capped at 64 MiB or less keeps restore and check under
/// 256 MB when it holds a bomb of its cap.
#[test]
fn bombs_of_the_capped_kinds_stay_under_256_mb() {
    let capped: Vec<(Kind, &str)> = KINDS
        .iter()
        .copied()
        .filter(|&(k, _)| cap(k) <= 64 << 20)
        .collect();
    assert!(capped.len() >= 6, "{capped:?}");
    run(&capped, Some(256 << 20));
}

/// The table of every kind, those capped at 4 GiB too (no limit asserted).
#[test]
#[ignore]
fn bombs_of_every_kind_table() {
    run(KINDS, None);
}
