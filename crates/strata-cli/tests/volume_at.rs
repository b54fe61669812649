//! `strata volume serve NAME --at SNAPSHOT`: a stored version served
//! read-only over NBD from the repository, beside the live volume, and
//! after the volume is gone.

mod common;

use common::nbd::*;
use common::*;
use std::process::Command;

/// `volume serve v --at AT` on loopback.
fn at_args(at: &str) -> [&str; 7] {
    [
        "volume",
        "serve",
        "v",
        "--at",
        at,
        "--listen",
        "127.0.0.1:0",
    ]
}

fn serve_at(r: &Repo, at: &str) -> Served {
    serve_at_with(r, at, &[])
}

fn serve_at_with(r: &Repo, at: &str, extra: &[&str]) -> Served {
    let mut args = at_args(at).to_vec();
    args.extend_from_slice(extra);
    args.push("--json");
    serve_cmd(r.cmd(&args))
}

/// What nbdcopy reads from `url`.
fn read_all(r: &Repo, url: &str, name: &str) -> Vec<u8> {
    let out = r.scratch(name);
    sh(Command::new("nbdcopy").arg(url).arg(&out));
    std::fs::read(&out).unwrap()
}

/// Two versions of a served volume; each served by version number, by
/// `latest` and by id, read-only (nbdinfo says so, nbdcopy cannot write),
/// while the live volume is served and written; then after the volume is
/// deleted. Names that do not fit are refused, saying what to look at.
#[test]
fn stored_versions_are_served_read_only() {
    if !(have("nbdcopy") && have("nbdinfo")) {
        return;
    }
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", "8M"]);
    // A backup of another series, newer than nothing yet: `latest` must
    // still mean the volume's latest.
    let src = r.scratch("tree");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let live = serve(&r);
    let first = prng(61, 8 << 20);
    let img = r.scratch("first.raw");
    std::fs::write(&img, &first).unwrap();
    sh(Command::new("nbdcopy").arg(&img).arg(&live.url));
    let v1 = r.json(&["volume", "snapshot", "v"]);
    let mut second = first.clone();
    second[..1 << 20].copy_from_slice(&prng(62, 1 << 20));
    std::fs::write(&img, &second).unwrap();
    sh(Command::new("nbdcopy").arg(&img).arg(&live.url));
    r.json(&["volume", "snapshot", "v"]);
    let other = r.json(&["backup", path_str(&src)]);
    let other = other["id"].as_str().unwrap().to_string();
    // The live volume moves on meanwhile.
    let third = prng(63, 8 << 20);
    std::fs::write(&img, &third).unwrap();
    sh(Command::new("nbdcopy").arg(&img).arg(&live.url));
    let id1 = v1["id"].as_str().unwrap();
    for (at, want) in [
        ("1", &first),
        ("2", &second),
        ("latest", &second),
        (&id1[..12], &first),
    ] {
        // (Versions by number through a region cache of 1 MiB: regions
        // are let go and read again.)
        let cache: &[&str] = match at.len() {
            1 => &["--cache-mib", "1"],
            _ => &[],
        };
        let s = serve_at_with(&r, at, cache);
        assert!(
            read_all(&r, &s.url, &format!("at-{at}.raw")) == *want,
            "--at {at}"
        );
        let info = sh(Command::new("nbdinfo").arg(&s.url));
        let info = String::from_utf8_lossy(&info.stdout);
        assert!(info.contains("is_read_only: true"), "{info}");
        let o = Command::new("nbdcopy")
            .arg(&img)
            .arg(&s.url)
            .output()
            .unwrap();
        assert!(!o.status.success(), "nbdcopy wrote into a stored version");
        stop(s);
    }
    assert!(
        read_all(&r, &live.url, "live.raw") == third,
        "the live volume"
    );
    stop(live);
    // Refused: no such version; a snapshot of another series.
    let refused = |at: &str| r.run(&at_args(at)).expect_code(1).stderr;
    // (Digits past any version number are tried as an id prefix: an id
    // of 12 digits must serve, one no id has is no snapshot.)
    for at in ["9", "460925553221"] {
        let e = refused(at);
        assert!(
            e.contains(&format!("no snapshot {at:?} of volume v")),
            "{e}"
        );
    }
    let e = refused(&other);
    assert!(e.contains("not of volume v"), "{e}");
    // A region cache is for a stored version only.
    let o = r
        .run(&["volume", "serve", "v", "--cache-mib", "8"])
        .expect_code(2);
    assert!(o.stderr.contains("--at"), "{}", o.stderr);
    // The volume gone, its versions stay servable.
    r.json(&["volume", "delete", "v", "--yes"]);
    let s = serve_at(&r, "latest");
    assert!(read_all(&r, &s.url, "after.raw") == second, "after delete");
    stop(s);
}

fn serve(r: &Repo) -> Served {
    serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]))
}

/// `nbdinfo --map`: (offset, length, type) of each extent.
fn map(url: &str) -> Vec<(u64, u64, u32)> {
    let o = sh(Command::new("nbdinfo").args(["--map", url]));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// What was written is data, the rest holes (`base:allocation`, and
/// structured reads), on the live volume and on a stored version served
/// with `--at`: qemu-img and nbdcopy skip the holes instead of reading
/// them.
#[test]
fn allocation_is_told_live_and_stored() {
    if !(have("nbdcopy") && have("nbdinfo")) {
        return;
    }
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", "64M"]);
    let live = serve(&r);
    let img = r.scratch("one.raw");
    std::fs::write(&img, prng(71, 1 << 20)).unwrap();
    sh(Command::new("nbdcopy").arg(&img).arg(&live.url));
    let want = [(0, 1 << 20, 0), (1 << 20, 63 << 20, 3)];
    assert_eq!(map(&live.url), want, "live");
    // Reads across the end of the data: its zeros come back as a hole.
    let py = libnbd_python();
    let read = |url: &str| structured_read(py.unwrap(), url, 512 << 10, 1 << 20);
    let want_read = vec![
        (512 << 10, 512 << 10, "data".to_string()),
        (1 << 20, 512 << 10, "hole".to_string()),
    ];
    if py.is_some() {
        assert_eq!(read(&live.url), want_read, "live");
    }
    r.json(&["volume", "snapshot", "v"]);
    stop(live);
    let s = serve_at(&r, "latest");
    assert_eq!(map(&s.url), want, "stored");
    if py.is_some() {
        assert_eq!(read(&s.url), want_read, "stored");
    }
    stop(s);
}

/// The README's instant recovery: a qcow2 overlay over a stored version
/// served with `--at` takes writes (into the overlay) and reads the rest
/// from the version.
#[test]
fn a_qcow2_overlay_writes_over_a_stored_version() {
    if !(have("qemu-img") && have("qemu-io")) {
        return;
    }
    let r = Repo::with_init(&[], None);
    let base = prng(81, 4 << 20);
    let img = r.scratch("base.raw");
    std::fs::write(&img, &base).unwrap();
    r.json(&["volume", "create", "v", "--from", path_str(&img)]);
    r.json(&["volume", "snapshot", "v"]);
    let s = serve_at(&r, "latest");
    let top = r.scratch("top.qcow2");
    sh(Command::new("qemu-img")
        .args(["create", "-f", "qcow2", "-F", "raw", "-b", &s.url])
        .arg(&top));
    sh(Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x61 0 65536"])
        .arg(&top));
    let merged = r.scratch("merged.raw");
    sh(Command::new("qemu-img")
        .args(["convert", "-f", "qcow2", "-O", "raw"])
        .arg(&top)
        .arg(&merged));
    stop(s);
    let got = std::fs::read(&merged).unwrap();
    assert!(
        got[..65536].iter().all(|&b| b == 0x61),
        "the overlay's write"
    );
    assert!(
        got[65536..] == base[65536..],
        "the rest from the stored version"
    );
}
