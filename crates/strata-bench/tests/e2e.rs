//! A small scenario end to end: the `sg` workload through Strata (and
//! restic and borg when installed), with restores verified byte-exact and
//! every output file written.

use std::path::{Path, PathBuf};
use std::process::Command;
use strata_bench::gen::GenOptions;
use strata_bench::runner::{self, RunOptions};
use strata_bench::systems::{self, System};

/// The `strata` binary under test. `scripts/test` names the one `cargo test
/// --workspace` has just built (`STRATA_TEST_BIN`); building it again here
/// with `-p strata-cli` alone would resolve features without the
/// workspace's dev-dependencies and compile every dependency a second time.
fn strata_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("STRATA_TEST_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "STRATA_TEST_BIN {} is not a file",
            bin.display()
        );
        return bin;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "strata-cli"])
        .current_dir(&root)
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building strata failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug/strata")
}

#[test]
fn small_sg_scenario_side_by_side() {
    let bin = strata_bin();
    let strategies = systems::Strata::strategies(&bin).expect("strata features");
    assert!(strategies.iter().any(|s| s == "exact"));
    let mut list: Vec<Box<dyn System>> = vec![Box::new(systems::Strata::new(bin, "exact"))];
    let mut skipped = vec![];
    for peer in ["restic", "borg"] {
        if systems::installed(peer) {
            list.push(match peer {
                "restic" => Box::new(systems::Restic::default()),
                _ => Box::new(systems::Borg),
            });
        } else {
            eprintln!("{peer} not installed: skipped");
            skipped.push(format!("{peer} not installed"));
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        scenario: "sg".into(),
        gen: GenOptions {
            seed: 7,
            scale: 0.006,
            preset: Some("SG1".into()),
            versions: Some(4),
            ..Default::default()
        },
        work: tmp.path().join("work"),
        out: tmp.path().join("out"),
        restore_every: 1,
        restore_first_series_only: false,
        deletes: true,
        repeat: 2,
        // Small sizes: the test only checks that limits reach the summary.
        limits: Some(strata_bench::limits::Sizes {
            sample_mib: 8,
            zstd_mib: 8,
            disk_mib: 64,
        }),
    };
    let res =
        runner::run(&opts, &mut list, skipped).expect("scenario runs and every restore verifies");
    let n = list.len();
    // Two repetitions of 4 versions.
    assert_eq!(res.backups.len(), 2 * 4 * n);
    assert_eq!(res.restores.len(), 2 * 4 * n);
    assert!(res.restores.iter().all(|r| r.verified));
    assert_eq!(res.deletes.len(), 2 * 2 * n);
    assert_eq!(res.backups.iter().filter(|b| b.run == 1).count(), 4 * n);
    let strata: Vec<_> = res
        .restores
        .iter()
        .filter(|r| r.system == "strata-exact")
        .collect();
    assert!(strata.iter().all(|r| r.containers_read.unwrap_or(0) > 0));
    // Deduplication works across versions: far less stored than written.
    let logical: u64 = res
        .backups
        .iter()
        .filter(|b| b.system == "strata-exact")
        .map(|b| b.logical_bytes)
        .sum();
    let stored = res
        .backups
        .iter()
        .filter(|b| b.system == "strata-exact")
        .map(|b| b.stored_bytes_after)
        .max()
        .unwrap();
    assert!(stored * 2 < logical, "stored {stored} of {logical}");
    // Per-version cumulative figures: the last backup of a run has seen all
    // of that run's logical bytes.
    let last = res
        .backups
        .iter()
        .rfind(|b| b.system == "strata-exact" && b.run == 0)
        .unwrap();
    assert_eq!(last.cumulative_logical_bytes * 2, logical);
    assert!(last.dedup_ratio > 2.0 && last.space_saving_pct > 50.0);
    for f in [
        "results.json",
        "backups.csv",
        "restores.csv",
        "deletes.csv",
        "summary.md",
        "backup-throughput.svg",
        "restore-throughput.svg",
        "stored-bytes.svg",
        "space-saving.svg",
        "restore-read-per-byte.svg",
        "restore-storage-read-per-byte.svg",
    ] {
        assert!(opts.out.join(f).exists(), "{f} missing");
    }
    let limits = res.limits.as_ref().expect("limits measured");
    assert!(limits.disk_write_mb_s > 0.0 && limits.zstd3_mb_s > 0.0);
    let summary = std::fs::read_to_string(opts.out.join("summary.md")).unwrap();
    assert!(summary.contains("backup v1 / disk write"), "{summary}");
    assert!(summary.contains("- strata-exact: index exact"), "{summary}");
    // Every CSV row carries its repetition.
    for (f, rows) in [
        ("backups.csv", 2 * 4 * n),
        ("restores.csv", 2 * 4 * n),
        ("deletes.csv", 2 * 2 * n),
    ] {
        let text = std::fs::read_to_string(opts.out.join(f)).unwrap();
        let mut lines = text.lines();
        assert!(lines.next().unwrap().starts_with("run,system,"), "{f}");
        let runs: Vec<&str> = lines.map(|l| l.split(',').next().unwrap()).collect();
        assert_eq!(runs.len(), rows, "{f}");
        assert_eq!(runs.iter().filter(|r| **r == "1").count(), rows / 2, "{f}");
    }
    // `report` regenerates the same summary from the saved JSON.
    let saved: runner::RunResults =
        serde_json::from_slice(&std::fs::read(opts.out.join("results.json")).unwrap()).unwrap();
    assert_eq!(
        runner::summary_markdown(&saved),
        runner::summary_markdown(&res)
    );
}

/// A small segment-index run: when the binary has `strata maintain`, it
/// runs after every backup (timed apart) and deletion forgets without
/// --prune; without it, the run behaves as before.
fn segment_run(bin: PathBuf, tmp: &Path) -> runner::RunResults {
    let mut list: Vec<Box<dyn System>> = vec![Box::new(systems::Strata::new(bin, "segment"))];
    let opts = RunOptions {
        scenario: "sg".into(),
        gen: GenOptions {
            seed: 3,
            scale: 0.004,
            preset: Some("SG1".into()),
            versions: Some(3),
            ..Default::default()
        },
        work: tmp.join("work"),
        out: tmp.join("out"),
        restore_every: 1,
        restore_first_series_only: false,
        deletes: true,
        repeat: 1,
        limits: None,
    };
    let res = runner::run(&opts, &mut list, vec![]).expect("segment run verifies");
    assert_eq!(res.backups.len(), 3);
    assert!(res.restores.iter().all(|r| r.verified));
    assert_eq!(res.deletes.len(), 2);
    assert!(res.deletes_skipped.is_none());
    res
}

#[test]
fn segment_lifecycle_either_way() {
    let bin = strata_bin();
    let features = systems::Strata::features(&bin).expect("strata features");
    if !features.index_strategies.iter().any(|s| s == "segment") {
        eprintln!("strata has no segment index: skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let res = segment_run(bin.clone(), &tmp.path().join("real"));
    assert!(res
        .backups
        .iter()
        .all(|b| b.maintain_seconds.is_some() == features.maintain));
    if features.maintain {
        return;
    }
    // The binary has no maintain yet: check the runner's lifecycle path
    // with a wrapper that reports it and answers `maintain` itself.
    use std::os::unix::fs::PermissionsExt;
    let log = tmp.path().join("calls.log");
    let wrapper = tmp.path().join("strata");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             echo \"$*\" >> '{log}'\n\
             case \" $* \" in\n\
             *' features '*) echo '{{\"index_strategies\": [\"exact\", \"segment\"], \"maintain\": true}}' ;;\n\
             *' maintain '*) echo '{{\"seconds\": 0.0}}' ;;\n\
             *) exec '{bin}' \"$@\" ;;\n\
             esac\n",
            log = log.display(),
            bin = bin.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let res = segment_run(wrapper, &tmp.path().join("wrapped"));
    assert!(res.backups.iter().all(|b| b.maintain_seconds.is_some()));
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().filter(|l| l.ends_with(" maintain")).count(),
        3
    );
    let forgets: Vec<&str> = calls.lines().filter(|l| l.contains(" forget ")).collect();
    assert_eq!(forgets.len(), 2);
    assert!(
        forgets.iter().all(|l| !l.contains("--prune")),
        "{forgets:?}"
    );
    let summary = runner::summary_markdown(&res);
    assert!(summary.contains("maintain s (median)"));
    assert!(summary.contains("`strata maintain` after every backup"));
}
