//! `strata --repo s3://…` against a real S3 server (versitygw on loopback,
//! started by `scripts/test`, which sets `STRATA_TEST_S3`): every command a
//! local repository has, and one clear line for what a user gets wrong.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

struct S3Repo {
    url: String,
    endpoint: String,
    tmp: tempfile::TempDir,
}

fn endpoint() -> Option<String> {
    match std::env::var("STRATA_TEST_S3") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            eprintln!("STRATA_TEST_S3 is not set: skipping (scripts/test starts an S3 server)");
            None
        }
    }
}

fn unique(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{}-{}", std::process::id(), t % 1_000_000_007)
}

impl S3Repo {
    fn new(endpoint: &str, bucket: &str) -> S3Repo {
        S3Repo {
            url: format!("s3://{bucket}/{}", unique("repo")),
            endpoint: endpoint.to_string(),
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn cmd_with(&self, url: &str, secret: &str, args: &[&str]) -> Command {
        let mut c = strata();
        c.arg("--repo")
            .arg(url)
            .args(args)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", "strata")
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("STRATA_PASSWORD", "s3-test")
            // A bucket's volumes live in the user's data directory.
            .env("XDG_DATA_HOME", self.tmp.path().join("data"))
            .env_remove("STRATA_VOLUMES_DIR");
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        run_cmd(self.cmd_with(&self.url, "strata-secret", args), None)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        self.run(&a).ok().json()
    }

    /// The local repository (the active tier) of the tier tests.
    fn local(&self) -> std::path::PathBuf {
        self.tmp.path().join("repo")
    }

    fn run_local(&self, args: &[&str]) -> Run {
        run_cmd(
            self.cmd_with(self.local().to_str().unwrap(), "strata-secret", args),
            None,
        )
    }

    fn json_local(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        self.run_local(&a).ok().json()
    }
}

fn tree(root: &Path, seed: u64) {
    for i in 0..40u64 {
        let n = 100 + (i * 7919 % 200_000) as usize;
        write(&root.join(format!("d{}/f{i}", i % 4)), &prng(seed + i, n));
    }
    write(&root.join("big.img"), &prng(seed + 99, 9 << 20));
}

#[test]
fn s3_repository_end_to_end() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-e2e"));
    // The bucket does not exist yet: init creates it.
    let v = r.json(&INIT_ENCRYPTED);
    assert_eq!(v["encrypted"], Value::Bool(true), "{v}");
    let e = r.run(&["init"]).expect_code(1);
    assert!(e.stderr.contains("already exists"), "{}", e.stderr);

    let src = r.tmp.path().join("src");
    tree(&src, 1);
    let b1 = r.json(&["backup", src.to_str().unwrap()]);
    assert_eq!(b1["warnings"], serde_json::json!([]), "{b1}");
    write(&src.join("d1/f1"), b"changed");
    let b2 = r.json(&["backup", src.to_str().unwrap()]);
    assert_eq!(b2["version"], 2, "{b2}");
    let snaps = r.json(&["snapshots"]);
    assert_eq!(snaps.as_array().unwrap().len(), 2);

    let before = manifest(&src);
    let target = r.tmp.path().join("restore");
    let v = r.json(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    assert_manifest_eq(
        &before,
        &manifest(&restored(&target, &src)),
        "restore from S3",
    );

    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    let first = b1["id"].as_str().unwrap();
    r.json(&["forget", first]);
    r.json(&["gc"]);
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    let target2 = r.tmp.path().join("restore2");
    r.json(&["restore", "latest", "--target", target2.to_str().unwrap()]);
    assert_manifest_eq(
        &before,
        &manifest(&restored(&target2, &src)),
        "after forget + gc",
    );
    let s = r.json(&["stats"]);
    assert!(s["stored_bytes"].as_u64().unwrap() > 9 << 20, "{s}");
}

#[test]
fn s3_mistakes_get_one_clear_line() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-err"));
    r.json(&["init"]);
    // Wrong secret key.
    let e = run_cmd(r.cmd_with(&r.url, "wrong", &["snapshots"]), None).expect_code(1);
    assert_eq!(e.stderr.trim().lines().count(), 1, "{}", e.stderr);
    assert!(
        e.stderr.contains("denied")
            || e.stderr.contains("credentials")
            || e.stderr.contains("Signature"),
        "{}",
        e.stderr
    );
    // A bucket with no repository in it.
    let other = format!("{}-elsewhere", r.url);
    let e = run_cmd(r.cmd_with(&other, "strata-secret", &["snapshots"]), None).expect_code(10);
    assert!(e.stderr.contains("strata init"), "{}", e.stderr);
    // A bucket that does not exist.
    let e = run_cmd(
        r.cmd_with(
            "s3://strata-no-such-bucket/x",
            "strata-secret",
            &["snapshots"],
        ),
        None,
    )
    .expect_code(10);
    assert!(e.stderr.contains("strata init"), "{}", e.stderr);
    // Nothing listening there.
    let mut c = r.cmd_with(&r.url, "strata-secret", &["snapshots"]);
    c.env("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
    let started = std::time::Instant::now();
    let e = run_cmd(c, None).expect_code(1);
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(e.stderr.trim().lines().count(), 1, "{}", e.stderr);
    // A URL that is not one.
    let e = run_cmd(
        r.cmd_with("s3://x/../y", "strata-secret", &["snapshots"]),
        None,
    )
    .expect_code(1);
    assert!(
        e.stderr.contains("not allowed") || e.stderr.contains("valid"),
        "{}",
        e.stderr
    );
}

/// Through a proxy that throttles and drops connections mid-transfer, a
/// backup and a restore still succeed whole; with the server gone, a
/// backup fails in one line and commits nothing.
#[test]
fn s3_through_a_faulty_network() {
    use strata_store::backend::fault_proxy::{FaultProxy, Faults};
    let Some(ep) = endpoint() else { return };
    let proxy = FaultProxy::start(ep.trim_start_matches("http://")).unwrap();
    let r = S3Repo::new(&proxy.endpoint(), &unique("strata-flaky"));
    r.json(&INIT_ENCRYPTED);
    proxy.set(Faults {
        slow_down_every: 4,
        cut_upload_every: 3,
        cut_upload_after: 100_000,
        cut_download_every: 3,
        cut_download_after: 100_000,
        ..Default::default()
    });
    let src = r.tmp.path().join("src");
    tree(&src, 7);
    let b1 = r.json(&["backup", src.to_str().unwrap()]);
    assert_eq!(b1["warnings"], serde_json::json!([]), "{b1}");
    let target = r.tmp.path().join("restore");
    r.json(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_manifest_eq(
        &manifest(&src),
        &manifest(&restored(&target, &src)),
        "flaky restore",
    );
    let i = proxy.injected();
    assert!(
        i.slow_downs > 0 && i.cut_uploads + i.cut_downloads > 0,
        "{i:?}"
    );

    // The server goes away in the middle of a backup: 4 MiB into its
    // 20 MiB of new data, on whichever connections the client reuses
    // (servers differ in how many a backup opens — MinIO keeps a backup on
    // two — and what matters is that it is gone before the commit).
    write(&src.join("d0/new"), &prng(70, 20 << 20));
    proxy.set(Faults {
        down_after_upload_bytes: 4 << 20,
        ..Default::default()
    });
    let e = r.run(&["backup", src.to_str().unwrap()]).expect_code(1);
    // One line for the error, and at most one saying what the failed
    // backup could not take back (the server is gone: until gc).
    let lines: Vec<&str> = e.stderr.trim().lines().collect();
    assert!(lines.len() <= 2, "{}", e.stderr);
    assert!(lines.last().unwrap().starts_with("error:"), "{}", e.stderr);
    if lines.len() == 2 {
        assert!(lines[0].contains("stay until `strata gc`"), "{}", e.stderr);
    }
    assert!(proxy.injected().refused > 0, "{:?}", proxy.injected());
    proxy.set(Faults::default());
    let snaps = r.json(&["snapshots"]);
    assert_eq!(
        snaps.as_array().unwrap().len(),
        1,
        "nothing committed: {snaps}"
    );
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    // What the failed backup left is swept, and the next backup works.
    r.json(&["unlock"]);
    r.json(&["gc"]);
    let b2 = r.json(&["backup", src.to_str().unwrap()]);
    assert_eq!(b2["version"], 2, "{b2}");
    let target = r.tmp.path().join("restore2");
    r.json(&["restore", "latest", "--target", target.to_str().unwrap()]);
    assert_manifest_eq(
        &manifest(&src),
        &manifest(&restored(&target, &src)),
        "after the outage",
    );
}

/// A local repository with its cloud tier in a real bucket: estimate,
/// migrate, gc, restore from the bucket, the bucket alone, forget.
#[test]
fn tier_to_s3() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-tier"));
    let local = r.local();
    let run = |args: &[&str]| r.run_local(args);
    let json = |args: &[&str]| r.json_local(args);
    json(&INIT_ENCRYPTED);
    let src = r.tmp.path().join("src");
    let mut trees = Vec::new();
    let mut ids = Vec::new();
    for v in 0..3u64 {
        tree(&src, 10 + v);
        let b = json(&["backup", src.to_str().unwrap()]);
        ids.push(b["id"].as_str().unwrap().to_string());
        trees.push(manifest(&src));
    }
    // The estimate needs no cloud tier (it also says what `forget` frees);
    // a migration does.
    json(&["tier", "estimate", &ids[0]]);
    let e = run(&["tier", "migrate", &ids[0]]).expect_code(1);
    assert!(e.stderr.contains("tier add"), "{}", e.stderr);
    json(&["tier", "add", &r.url]);
    let est = json(&["tier", "estimate", &ids[0], &ids[1]]);
    let freed = est["freed_bytes"].as_i64().unwrap();
    assert!(freed > 0, "{est}");
    let before = json(&["stats"])["stored_bytes"].as_u64().unwrap();
    let m = json(&["tier", "migrate", &ids[0], &ids[1]]);
    assert_eq!(m["versions"].as_array().unwrap().len(), 2, "{m}");
    assert!(m["cloud_requests"]["puts"].as_u64().unwrap() > 0, "{m}");
    assert!(
        m["cost"]["storage_usd_per_month"].as_f64().unwrap() > 0.0,
        "{m}"
    );
    assert!(m["cost"]["command_usd"].as_f64().unwrap() > 0.0, "{m}");
    json(&["gc"]);
    let after = json(&["stats"])["stored_bytes"].as_u64().unwrap();
    // To the byte: the estimate ran gc on a what-if copy.
    assert_eq!(before as i64 - after as i64, freed, "estimate {est}");
    assert_eq!(est["exact"], true, "{est}");
    let snaps = json(&["snapshots"]);
    let tiers: Vec<&str> = snaps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tier"].as_str().unwrap())
        .collect();
    assert_eq!(tiers, ["cloud", "cloud", "active"]);
    for (i, id) in ids.iter().enumerate() {
        let t = r.tmp.path().join(format!("restore{i}"));
        json(&["restore", id, "--target", t.to_str().unwrap()]);
        assert_manifest_eq(
            &trees[i],
            &manifest(&restored(&t, &src)),
            &format!("v{}", i + 1),
        );
    }
    let c = json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    // The bucket alone is a repository of the cloud versions.
    let alone = r.json(&["snapshots"]);
    assert_eq!(alone.as_array().unwrap().len(), 2, "{alone}");
    // Recall version 2; forget version 1 (gone from both sides).
    let rc = json(&["tier", "recall", &ids[1]]);
    assert_eq!(rc["versions"].as_array().unwrap().len(), 1, "{rc}");
    let t = r.tmp.path().join("recalled");
    json(&["restore", &ids[1], "--target", t.to_str().unwrap()]);
    assert_manifest_eq(&trees[1], &manifest(&restored(&t, &src)), "recalled v2");
    json(&["forget", &ids[0]]);
    assert_eq!(json(&["snapshots"]).as_array().unwrap().len(), 2);
    assert_eq!(r.json(&["snapshots"]).as_array().unwrap().len(), 0);
    // Move version 3 out, lose the site, rebuild it from the bucket.
    json(&["tier", "migrate", &ids[2]]);
    std::fs::remove_dir_all(&local).unwrap();
    let d = json(&["tier", "dr-rebuild", "--from", &r.url]);
    assert_eq!(d["snapshots"], 1, "{d}");
    let t = r.tmp.path().join("after-dr");
    json(&["restore", &ids[2], "--target", t.to_str().unwrap()]);
    assert_manifest_eq(
        &trees[2],
        &manifest(&restored(&t, &src)),
        "v3 after the rebuild",
    );
}

/// `strata tier migrate --path`: the big image of each old version moves
/// to the bucket, the small files stay; `snapshots` says active+cloud,
/// `ls` and `dump` see the whole tree, restore reads both tiers, `forget`
/// drops the bucket's part too, and `tier recall` joins a part back.
#[test]
fn tier_migrate_paths_to_s3() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-paths"));
    let json = |args: &[&str]| r.json_local(args);
    json(&["init"]);
    let src = r.tmp.path().join("src");
    let mut trees = Vec::new();
    let mut ids = Vec::new();
    for v in 0..3u64 {
        tree(&src, 40 + v);
        let b = json(&["backup", src.to_str().unwrap()]);
        ids.push(b["id"].as_str().unwrap().to_string());
        trees.push(manifest(&src));
    }
    json(&["tier", "add", &r.url]);
    let before = json(&["stats"])["stored_bytes"].as_u64().unwrap();
    let est = json(&["tier", "estimate", &ids[0], &ids[1], "--path", "**/big.img"]);
    assert_eq!(est["exact"], true, "{est}");
    let m = json(&["tier", "migrate", &ids[0], &ids[1], "--path", "**/big.img"]);
    assert_eq!(m["files"], 2, "{m}");
    json(&["gc"]);
    let after = json(&["stats"])["stored_bytes"].as_u64().unwrap();
    // To the byte: gc ran on a what-if copy with the files cut out.
    assert_eq!(
        est["freed_bytes"].as_i64().unwrap(),
        before as i64 - after as i64,
        "{est}"
    );
    // Two 9 MiB images of random data left the active tier.
    assert!(before - after > 17 << 20, "{before} -> {after}");
    let tiers: Vec<String> = json(&["snapshots"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tier"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tiers, ["active+cloud", "active+cloud", "active"]);
    let ls = json(&["ls", &ids[0]]);
    let img = format!("{}/big.img", src.display());
    assert!(
        ls.as_array().unwrap().iter().any(|n| n["path"] == img),
        "{ls}"
    );
    let d = r.run_local(&["dump", &ids[0], &img]).ok();
    assert_eq!(d.stdout.len(), 9 << 20);
    for (i, id) in ids.iter().enumerate() {
        let t = r.tmp.path().join(format!("restore{i}"));
        json(&["restore", id, "--target", t.to_str().unwrap()]);
        assert_manifest_eq(
            &trees[i],
            &manifest(&restored(&t, &src)),
            &format!("v{}", i + 1),
        );
    }
    let c = json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    // The bucket alone: the two images.
    assert_eq!(r.json(&["snapshots"]).as_array().unwrap().len(), 2);
    json(&["forget", &ids[0]]);
    assert_eq!(r.json(&["snapshots"]).as_array().unwrap().len(), 1);
    let rc = json(&["tier", "recall", &ids[1]]);
    assert_eq!(rc["files"], 1, "{rc}");
    assert_eq!(r.json(&["snapshots"]).as_array().unwrap().len(), 0);
    let t = r.tmp.path().join("recalled");
    json(&["restore", &ids[1], "--target", t.to_str().unwrap()]);
    assert_manifest_eq(&trees[1], &manifest(&restored(&t, &src)), "recalled v2");
}

/// `strata tier gc --service`: the cloud tier cleaned through a
/// `strata copy-forward-service` next to the bucket, downloading nothing.
#[test]
fn tier_gc_through_the_copy_forward_service() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-cgc"));
    let run = |args: &[&str]| r.run_local(args);
    let json = |args: &[&str]| r.json_local(args);
    json(&INIT_ENCRYPTED);
    let src = r.tmp.path().join("src");
    let mut ids = Vec::new();
    let mut trees = Vec::new();
    for v in 0..3u64 {
        tree(&src, 20 + v);
        ids.push(
            json(&["backup", src.to_str().unwrap()])["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        trees.push(manifest(&src));
    }
    json(&["tier", "add", &r.url]);
    json(&["tier", "migrate", &ids[0], &ids[1], &ids[2]]);
    json(&["forget", &ids[1]]);
    let e = run(&["tier", "gc"]).expect_code(1);
    assert!(e.stderr.contains("--service"), "{}", e.stderr);

    // The service, with the bucket's credentials only, on a port it picks
    // (one probed here and let go could be taken before it binds).
    let mut svc = r
        .cmd_with(
            &r.url,
            "strata-secret",
            &["copy-forward-service", "--listen", "127.0.0.1:0"],
        )
        .env_remove("STRATA_PASSWORD")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let listen = {
        use std::io::BufRead;
        let mut err = std::io::BufReader::new(svc.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .rsplit_once("listening on http://")
            .unwrap_or_else(|| panic!("the service did not start: {line:?}"))
            .1
            .to_string();
        // (The rest of what it says is drained, never let fill the pipe.)
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        addr
    };
    let g = json(&[
        "tier",
        "gc",
        "--service",
        &format!("http://{listen}"),
        "--threshold",
        "0",
    ]);
    let _ = svc.kill();
    let _ = svc.wait();
    assert!(g["dead_bytes_freed"].as_u64().unwrap() > 0, "{g}");
    // No stored byte comes back here: only the service's short answers.
    assert_eq!(g["bytes_downloaded"], 0, "{g}");
    let answers = g["service_answer_bytes"].as_u64().unwrap();
    assert!(
        answers > 0 && answers < 100 * (1 + g["containers_written"].as_u64().unwrap()),
        "{g}"
    );
    assert!(
        g["bytes_after"].as_u64() < g["bytes_before"].as_u64(),
        "{g}"
    );
    for i in [0usize, 2] {
        let t = r.tmp.path().join(format!("after-gc{i}"));
        json(&["restore", &ids[i], "--target", t.to_str().unwrap()]);
        assert_manifest_eq(
            &trees[i],
            &manifest(&restored(&t, &src)),
            "after the cloud gc",
        );
    }
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
}

/// `strata tier gc --s3-copy`: S3's own server-side copy cleans a cloud
/// tier of large containers without downloading anything.
#[test]
fn tier_gc_by_s3_server_side_copy() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-s3copy"));
    let json = |args: &[&str]| r.json_local(args);
    json(&["init"]);
    let src = r.tmp.path().join("src");
    let mut ids = Vec::new();
    let mut trees = Vec::new();
    for v in 0..3u64 {
        tree(&src, 40 + v);
        write(&src.join("more.img"), &prng(90 + v, 6 << 20));
        ids.push(
            json(&["backup", src.to_str().unwrap()])["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        trees.push(manifest(&src));
    }
    json(&["tier", "add", &r.url, "--container-mib", "16"]);
    json(&["tier", "migrate", &ids[0], &ids[1], &ids[2]]);
    json(&["forget", &ids[1]]);
    let g = json(&["tier", "gc", "--s3-copy", "--threshold", "0.1"]);
    assert_eq!(g["bytes_downloaded"], 0, "{g}");
    assert!(g["containers_copied_forward"].as_u64().unwrap() > 0, "{g}");
    // Create + at least one part + complete per container, in the cost.
    let copies = g["server_side_copy_requests"].as_u64().unwrap();
    assert!(
        copies >= 3 * g["containers_copied_forward"].as_u64().unwrap(),
        "{g}"
    );
    assert!(g["cost"]["requests_usd"].as_f64().unwrap() > 0.0, "{g}");
    assert!(
        g["bytes_after"].as_u64() < g["bytes_before"].as_u64(),
        "{g}"
    );
    for i in [0usize, 2] {
        let t = r.tmp.path().join(format!("after{i}"));
        json(&["restore", &ids[i], "--target", t.to_str().unwrap()]);
        assert_manifest_eq(
            &trees[i],
            &manifest(&restored(&t, &src)),
            "after S3 copy-forward",
        );
    }
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
}

/// `strata tier seed`: the bulk first transfer into an empty cloud tier.
#[test]
fn tier_seed_to_s3() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-seed"));
    let json = |args: &[&str]| r.json_local(args);
    json(&INIT_ENCRYPTED);
    let src = r.tmp.path().join("src");
    let mut ids = Vec::new();
    let mut trees = Vec::new();
    for v in 0..3u64 {
        tree(&src, 60 + v);
        ids.push(
            json(&["backup", src.to_str().unwrap()])["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        trees.push(manifest(&src));
    }
    json(&["tier", "add", &r.url]);
    let s = json(&["tier", "seed", &ids[0], &ids[1]]);
    assert_eq!(s["versions"].as_array().unwrap().len(), 2, "{s}");
    assert!(s["cloud_requests"]["puts"].as_u64().unwrap() > 0, "{s}");
    json(&["gc"]);
    for i in 0..3 {
        let t = r.tmp.path().join(format!("seeded{i}"));
        json(&["restore", &ids[i], "--target", t.to_str().unwrap()]);
        assert_manifest_eq(&trees[i], &manifest(&restored(&t, &src)), "after the seed");
    }
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
}

/// A volume's snapshots on the cloud tier: the version the volume's
/// changes count from moves to the bucket; the next snapshot cannot take
/// its segments from there, so it reads what was written (not the holes)
/// and stores nothing new (the data is still in the active tier); the one
/// after reads nothing. Every version restores, from either tier.
#[test]
fn volume_snapshots_tier_to_s3() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-voltier"));
    let json = |args: &[&str]| r.json_local(args);
    json(&INIT_ENCRYPTED);
    let mut img = prng(3, 4 << 20);
    img.resize(64 << 20, 0);
    img.extend(prng(4, 4 << 20));
    let src = r.tmp.path().join("img.raw");
    std::fs::write(&src, &img).unwrap();
    json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    let v1 = json(&["volume", "snapshot", "v"]);
    let v2 = json(&["volume", "snapshot", "v"]);
    assert_eq!(v2["read_bytes"], 0, "{v2}");
    json(&["tier", "add", &r.url]);
    json(&["tier", "migrate", v2["id"].as_str().unwrap()]);
    json(&["gc"]);
    let v3 = json(&["volume", "snapshot", "v"]);
    assert_eq!(v3["read_bytes"], 8 << 20, "the base is in the bucket: {v3}");
    assert_eq!(v3["new_raw_bytes"], 0, "{v3}");
    let v4 = json(&["volume", "snapshot", "v"]);
    assert_eq!(v4["read_bytes"], 0, "{v4}");
    // Its second piece (64 MiB on) taken over with its part, unread.
    assert_eq!(v4["parts_taken_over_bytes"], 4 << 20, "{v4}");
    assert_eq!(v4["unchanged_bytes"], 68 << 20, "{v4}");
    json(&["tier", "migrate", v1["id"].as_str().unwrap()]);
    for v in 1..=4 {
        let t = r.tmp.path().join(format!("t{v}"));
        json(&[
            "restore",
            &format!("volume:v@{v}"),
            "--target",
            t.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read(t.join("v.img")).unwrap() == img,
            "version {v}"
        );
    }
    // Version 1, now in the bucket, served read-only straight from it
    // (every version moved and the local containers collected: nothing of
    // the image is left on the active tier to read by mistake).
    if common::nbd::have("nbdcopy") {
        for v in [&v3, &v4] {
            json(&["tier", "migrate", v["id"].as_str().unwrap()]);
        }
        json(&["gc"]);
        let local = r.local();
        let c = r.cmd_with(
            local.to_str().unwrap(),
            "strata-secret",
            &[
                "volume",
                "serve",
                "v",
                "--at",
                "1",
                "--listen",
                "127.0.0.1:0",
                "--json",
            ],
        );
        let s = common::nbd::serve_cmd(c);
        let out = r.tmp.path().join("at1.raw");
        common::nbd::sh(Command::new("nbdcopy").arg(&s.url).arg(&out));
        common::nbd::stop(s);
        assert!(
            std::fs::read(&out).unwrap() == img,
            "version 1 served from the bucket"
        );
    }
    let c = json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
}

/// A bucket repository's volumes live on this host (the user's data
/// directory, `strata/volumes/ID`): created, written through NBD while
/// served, snapshotted into the bucket (frozen by the server) and stopped,
/// restored from the bucket, served from it read-only. The directory is
/// bound to its repository: another repository given it is refused.
#[test]
fn volumes_of_a_bucket_repository() {
    let Some(ep) = endpoint() else { return };
    let r = S3Repo::new(&ep, &unique("strata-vol"));
    r.json(&INIT_ENCRYPTED);
    let mut img = prng(5, 3 << 20);
    img.resize(16 << 20, 0);
    let src = r.tmp.path().join("img.raw");
    std::fs::write(&src, &img).unwrap();
    let c = r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    assert_eq!(c["encrypted"], true, "{c}");
    let root = r.tmp.path().join("data/strata/volumes");
    let dirs: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1);
    let vols = dirs[0].path();
    assert!(vols.join("v/volume.json").exists());
    let bound: Value =
        serde_json::from_slice(&std::fs::read(vols.join("repository.json")).unwrap()).unwrap();
    assert!(
        bound["id"]
            .as_str()
            .unwrap()
            .starts_with(&*dirs[0].file_name().to_string_lossy()),
        "{bound}"
    );
    let list = r.json(&["volume", "list"]);
    assert_eq!(list[0]["name"], "v", "{list}");
    if common::nbd::have("nbdcopy") {
        // New data written through the server, snapshotted while served.
        let s = common::nbd::serve_cmd(r.cmd_with(
            &r.url,
            "strata-secret",
            &["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"],
        ));
        img[..1 << 20].copy_from_slice(&prng(6, 1 << 20));
        std::fs::write(&src, &img).unwrap();
        common::nbd::sh(Command::new("nbdcopy").arg(&src).arg(&s.url));
        let v1 = r.json(&["volume", "snapshot", "v"]);
        assert_eq!(v1["version"], 1, "{v1}");
        common::nbd::stop(s);
    } else {
        r.json(&["volume", "snapshot", "v"]);
    }
    let v2 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v2["read_bytes"], 0, "nothing changed: {v2}");
    for v in [1, 2] {
        let t = r.tmp.path().join(format!("t{v}"));
        let at = format!("volume:v@{v}");
        r.json(&["restore", &at, "--target", t.to_str().unwrap()]);
        assert!(
            std::fs::read(t.join("v.img")).unwrap() == img,
            "version {v}"
        );
    }
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    // Another repository given this directory is refused, and the
    // volume is left as it was.
    let other = S3Repo::new(&ep, &unique("strata-vol2"));
    other.json(&INIT_ENCRYPTED);
    for args in [
        vec!["volume", "list"],
        vec!["volume", "create", "w", "--size", "1M"],
        vec!["volume", "snapshot", "v"],
    ] {
        let mut a = vec!["volume", "--volumes-dir", vols.to_str().unwrap()];
        a.extend_from_slice(&args[1..]);
        let e = other.run(&a).expect_code(1);
        assert!(
            e.stderr.contains("belong to another repository"),
            "{args:?}: {}",
            e.stderr
        );
    }
    assert!(!vols.join("w").exists());
    let s = r.json(&["volume", "stats", "v"]);
    assert_eq!(s["name"], "v", "{s}");
}
