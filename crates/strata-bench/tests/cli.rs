//! `strata-bench gen primary` and `gen trace` from the command line: to
//! stdout and to a file, readable by the library's readers, deterministic.

use std::process::Command;
use strata_bench::gen::{primary, trace};

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata-bench"))
}

#[test]
fn gen_primary_to_stdout() {
    let run = |seed: &str| {
        let out = bench()
            .args(["gen", "primary", "--out", "-", "--size", "1M"])
            .args(["--volume-size", "4M", "--seed", seed])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let a = run("3");
    assert_eq!(a, run("3"), "deterministic");
    assert_ne!(a, run("4"));
    let r = primary::PrimaryTraceReader::new(&a[..]).unwrap();
    let h = r.header();
    assert_eq!((h.records, h.volume_blocks, h.seed), (256, 1024, 3));
    let writes: Vec<(u64, Vec<u8>)> = r.map(|w| w.unwrap()).collect();
    assert_eq!(writes.len(), 256);
    assert!(writes.iter().all(|(b, d)| *b < 1024 && d.len() == 4096));
}

#[test]
fn gen_trace_to_a_file() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("fp.trace");
    let st = bench()
        .args([
            "gen",
            "trace",
            "--size",
            "32MiB",
            "--versions",
            "3",
            "--out",
        ])
        .arg(&f)
        .status()
        .unwrap();
    assert!(st.success());
    let mut r = trace::TraceReader::new(std::fs::File::open(&f).unwrap()).unwrap();
    assert_eq!(r.header().versions, 3);
    let mut versions = 0;
    let mut bytes = 0u64;
    while let Some((_, n)) = r.next_version().unwrap() {
        let mut k = 0;
        while let Some(rec) = r.next_record().unwrap() {
            if versions == 0 {
                bytes += rec.len as u64;
            }
            k += 1;
        }
        assert_eq!(k, n);
        versions += 1;
    }
    assert_eq!(versions, 3);
    // Version 1 is about the requested size.
    let want = 32u64 << 20;
    assert!(bytes.abs_diff(want) < want / 10, "{bytes} vs {want}");
    // Options of the tree workloads are refused.
    let out = bench()
        .args(["gen", "trace", "--out", "-", "--preset", "SG1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
