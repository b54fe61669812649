//! Linked snapshots (`docs/design-linked-snapshots.md`): a snapshot of a
//! stopped volume of the repository hands its new containers over to the
//! volume's own blocks — the repository keeps a link stub instead of a
//! second copy, the volume holds the blocks. Every version still restores
//! byte-exact (after the volume is overwritten too), check reads the held
//! blocks and finds one changed on disk, copy reads through the link,
//! forget + gc give them back, and deleting or defragmenting the volume
//! stores what it held in the repository again first.

mod common;
use common::nbd::*;
use common::*;
use std::process::Command;

/// 6 MiB of random data, 2 MiB of zeros, the first 2 MiB again, then
/// zeros up to 16 MiB.
fn image() -> Vec<u8> {
    let mut d = prng(41, 6 << 20);
    d.resize(8 << 20, 0);
    let head = d[..2 << 20].to_vec();
    d.extend_from_slice(&head);
    d.resize(16 << 20, 0);
    d
}

fn linked_volume(password: Option<&str>) -> (Repo, Vec<u8>) {
    let extra: &[&str] = if password.is_some() {
        &["--encrypt"]
    } else {
        &[]
    };
    linked_volume_in(Repo::with_init(extra, password))
}

/// Volume `v` of [`image`] made in `r`.
fn linked_volume_in(r: Repo) -> (Repo, Vec<u8>) {
    let img = image();
    let src = r.scratch("disk.raw");
    std::fs::write(&src, &img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    (r, img)
}

fn restores(r: &Repo, at: &str, want: &[u8], what: &str) {
    let t = r.dir().join(format!("t-{}", what.replace(' ', "-")));
    r.json(&["restore", at, "--target", t.to_str().unwrap()]);
    assert!(std::fs::read(t.join("v.img")).unwrap() == want, "{what}");
    std::fs::remove_dir_all(&t).unwrap();
}

#[test]
fn a_snapshot_hands_its_blocks_over_to_the_volume() {
    for password in [None, Some("pw")] {
        let (r, img) = linked_volume(password);
        let s = r.json(&["volume", "snapshot", "v"]);
        assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
        // Nearly all it stored is now the volume's to keep.
        let stored = s["new_stored_bytes"].as_u64().unwrap();
        assert!(
            s["linked_stored_bytes"].as_u64().unwrap() * 10 > stored * 9,
            "{s}"
        );
        let st = r.json(&["stats"]);
        assert!(st["linked_bytes"].as_u64().unwrap() >= 6 << 20, "{st}");
        assert!(st["stored_bytes"].as_u64().unwrap() < 1 << 20, "{st}");
        restores(&r, "volume:v@1", &img, "linked version");
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "{c}");
        let vc = r.json(&["volume", "check", "v", "--read-data"]);
        assert!(vc["held_blocks"].as_u64().unwrap() >= 1536, "{vc}");
        // Nothing changed: nothing read, nothing more to link.
        let s2 = r.json(&["volume", "snapshot", "v"]);
        assert_eq!(s2["read_bytes"], 0, "{s2}");
        assert_eq!(s2["linked_containers"], 0, "{s2}");
        // Another repository gets copies, read through the link.
        let other = r.dir().join("other");
        let mut c = r.cmd(&["--json", "init"]);
        c.arg("--repo").arg(&other);
        if password.is_some() {
            c.args(["--encrypt"]).args(FAST_KDF);
        }
        run_cmd(c, None).ok();
        let mut c = r.cmd(&["copy", "--from-repo", r.path.to_str().unwrap()]);
        c.arg("--repo").arg(&other);
        if let Some(pw) = password {
            c.env("STRATA_FROM_PASSWORD", pw);
        }
        run_cmd(c, None).ok();
        let t = r.dir().join("t-copied");
        let mut c = r.cmd(&["restore", "volume:v@1", "--target", t.to_str().unwrap()]);
        c.arg("--repo").arg(&other);
        run_cmd(c, None).ok();
        assert!(std::fs::read(t.join("v.img")).unwrap() == img, "copied");
        // Forgotten and collected: given back at the volume's next open.
        let holds = r.path.join("volumes/v/holds");
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(&holds)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let before = names();
        assert!(before.iter().all(|n| n.ends_with(".hold")), "{before:?}");
        r.json(&["forget", "volume:v@1", "volume:v@2"]);
        r.json(&["gc"]);
        assert!(
            names().iter().all(|n| n.ends_with(".released")),
            "released, not given back yet: {:?}",
            names()
        );
        let vc = r.json(&["volume", "check", "v"]);
        assert!(vc["held_blocks"].as_u64().unwrap() > 0, "{vc}");
        // The next snapshot opens the volume (which gives them back) and,
        // its base forgotten, reads and links everything anew.
        let s3 = r.json(&["volume", "snapshot", "v"]);
        assert!(s3["linked_containers"].as_u64().unwrap() > 0, "{s3}");
        let now = names();
        assert!(
            now.iter()
                .all(|n| n.ends_with(".hold") && !before.contains(n)),
            "{now:?}"
        );
        // The volume deleted while a version links to it: what it held is
        // stored in the repository again first, and the version restores.
        let d = r.json(&["volume", "delete", "v", "--yes"]);
        assert!(d["stored_again_bytes"].as_u64().unwrap() >= 6 << 20, "{d}");
        let at = s3["id"].as_str().unwrap();
        restores(&r, at, &img, "after the volume is gone");
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "{c}");
        let st = r.json(&["stats"]);
        assert_eq!(st["linked_bytes"], 0, "{st}");
        assert!(st["stored_bytes"].as_u64().unwrap() >= 6 << 20, "{st}");
    }
}

/// `volume defrag` replaces the data file: the versions linked to it are
/// stored again first, and restore after.
#[test]
fn defrag_stores_linked_versions_again() {
    let (r, img) = linked_volume(Some("pw"));
    let s = r.json(&["volume", "snapshot", "v"]);
    assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
    r.json(&["volume", "defrag", "v"]);
    restores(&r, "volume:v@1", &img, "after defrag");
    let st = r.json(&["stats"]);
    assert_eq!(st["linked_bytes"], 0, "{st}");
    let vc = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(vc["holds"], 0, "{vc}");
}

/// The volume overwritten after the snapshot (through the server, whose
/// new data goes elsewhere while the old blocks are held): the linked
/// version still restores what it was.
#[test]
fn a_linked_version_outlives_overwrites() {
    if !have("nbdcopy") {
        return;
    }
    let (r, img) = linked_volume(None);
    let s = r.json(&["volume", "snapshot", "v"]);
    assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
    let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
    let new = prng(42, 16 << 20);
    let src = r.scratch("new.raw");
    std::fs::write(&src, &new).unwrap();
    sh(Command::new("nbdcopy").arg(&src).arg(&srv.url));
    stop(srv);
    restores(&r, "volume:v@1", &img, "after overwrites");
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    let s2 = r.json(&["volume", "snapshot", "v"]);
    assert!(s2["linked_containers"].as_u64().unwrap() > 0, "{s2}");
    restores(&r, "volume:v@2", &new, "the new version");
    restores(&r, "volume:v@1", &img, "the old one still");
}

/// A held block changed on the host's disk: check names the container,
/// and restore fails rather than write what the version never held.
#[test]
fn a_changed_held_block_is_found() {
    let (r, _) = linked_volume(None);
    r.json(&["volume", "snapshot", "v"]);
    let data = r.path.join("volumes/v/data");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"changed", 4096 * 7 + 100).unwrap();
    drop(f);
    let c = r.run(&["--json", "check", "--read-data"]);
    assert_ne!(c.code, 0);
    let j = c.json();
    assert!(j["errors"].to_string().contains("no longer hold"), "{j}");
    let t = r.dir().join("t-bad");
    let e = r
        .run(&["restore", "volume:v@1", "--target", t.to_str().unwrap()])
        .expect_code(1);
    assert!(e.stderr.contains("no longer hold"), "{}", e.stderr);
    // Deleting the volume stores the rest again and says what could not be.
    let d = r.run(&["volume", "delete", "v", "--yes"]).ok();
    assert!(d.stderr.contains("could not be stored"), "{}", d.stderr);
    assert!(!r.path.join("volumes/v").exists());
}

/// A volume cut short on the host: `check` (without reading data) finds
/// the linked containers whose blocks are gone.
#[test]
fn check_finds_a_volume_cut_short() {
    let (r, _) = linked_volume(None);
    r.json(&["volume", "snapshot", "v"]);
    let data = r.path.join("volumes/v/data");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(4096 * 10)
        .unwrap();
    let c = r.run(&["--json", "check"]);
    assert_ne!(c.code, 0);
    let j = c.json();
    assert!(j["errors"].to_string().contains("past the end"), "{j}");
}

/// A served volume's snapshot is linked too: the server takes the holds
/// over the control connection while the freeze keeps the frozen image's
/// blocks. Clients overwrite everything afterwards (the held blocks stay
/// as they were), a second served snapshot links the new blocks, and a
/// release by gc while served is given back at the server's checkpoint.
#[test]
fn a_served_volume_s_snapshot_is_linked() {
    if !have("nbdcopy") {
        return;
    }
    for password in [None, Some("pw")] {
        let (r, img) = linked_volume(password);
        let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
        let s = r.json(&["volume", "snapshot", "v"]);
        assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
        let st = r.json(&["stats"]);
        assert!(st["linked_bytes"].as_u64().unwrap() >= 6 << 20, "{st}");
        let held = |ext: &str| hold_files(&r, ext);
        assert_eq!(
            held(".hold") as u64,
            s["linked_containers"].as_u64().unwrap()
        );
        // Overwritten while served: the new data goes elsewhere.
        let new = prng(43, 16 << 20);
        let src = r.scratch("new.raw");
        std::fs::write(&src, &new).unwrap();
        sh(Command::new("nbdcopy").arg(&src).arg(&srv.url));
        restores(&r, "volume:v@1", &img, "served, overwritten");
        let s2 = r.json(&["volume", "snapshot", "v"]);
        assert!(s2["linked_containers"].as_u64().unwrap() > 0, "{s2}");
        restores(&r, "volume:v@2", &new, "the second served snapshot");
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "{c}");
        // The first version forgotten while served: its holds released,
        // then given back by the server (at its checkpoint or its stop).
        r.json(&["forget", "volume:v@1"]);
        r.json(&["gc"]);
        assert!(held(".released") > 0);
        stop(srv);
        let vc = r.json(&["volume", "check", "v", "--read-data"]);
        assert_eq!(vc["problems"], serde_json::json!([]), "{vc}");
        assert!(r.path.join("volumes/v/holds").is_dir());
        assert_eq!(held(".released"), 0, "given back at the stop");
        assert_eq!(vc["holds"].as_u64().unwrap(), held(".hold") as u64, "{vc}");
        restores(&r, "volume:v@2", &new, "after the release");
    }
}

/// Snapshots of a served volume while a client overwrites it all the time:
/// each links what it stores to blocks the freeze keeps and the server
/// holds, so however the volume moves on, every block each version links
/// still holds its data — `check --read-data` reads them all, every
/// version restores (its chunks checked), and the volume checks clean.
#[test]
fn a_served_snapshot_is_linked_while_clients_write() {
    let Some(py) = libnbd_python() else {
        return;
    };
    let (r, _) = random_volume(80, &[]);
    let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
    let stop_file = r.dir().join("stop-writing");
    let progress = r.dir().join("written");
    // (At most 4 GiB in all: as fast as it can, to meet the destage's
    // frees while holds are taken.)
    let script = format!(
        "import nbd, os, random\n\
         h = nbd.NBD()\n\
         h.connect_uri({url:?})\n\
         n = 0\n\
         while not os.path.exists({stop:?}) and n < 4096:\n\
         \x20   h.pwrite(os.urandom(1 << 20), random.randrange({mib}) << 20)\n\
         \x20   n += 1\n\
         \x20   if n % 8 == 0:\n\
         \x20       h.flush()\n\
         \x20       open({progress:?} + '.t', 'w').write(str(n))\n\
         \x20       os.rename({progress:?} + '.t', {progress:?})\n\
         h.flush()\n\
         h.shutdown()\n\
         print(n)\n",
        url = srv.url,
        stop = stop_file.to_str().unwrap(),
        progress = progress.to_str().unwrap(),
        mib = KILL_SIZE >> 20,
    );
    let written = || -> u64 {
        std::fs::read_to_string(&progress)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let writer = Command::new(py)
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ids = Vec::new();
    let mut seen = 0;
    for _ in 0..3 {
        // Some writes flushed since the last snapshot (something new to
        // link), and the client still writing.
        let t = std::time::Instant::now();
        while written() < seen + 16 && t.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        seen = written();
        assert!(seen < 4096, "the client stopped before the snapshots");
        let s = r.json(&["volume", "snapshot", "v", "--read-all"]);
        assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["hold_failed_containers"], 0, "{s}");
        ids.push(s["id"].as_str().unwrap().to_string());
    }
    std::fs::write(&stop_file, b"").unwrap();
    let out = writer.wait_with_output().unwrap();
    assert!(out.status.success());
    let writes: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    eprintln!("{writes} MiB written by the client meanwhile");
    assert!(writes > 3, "the client wrote while the snapshots ran");
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    for (i, id) in ids.iter().enumerate() {
        let t = r.dir().join(format!("t-busy-{i}"));
        r.json(&["restore", id, "--target", t.to_str().unwrap()]);
        assert_eq!(
            std::fs::metadata(t.join("v.img")).unwrap().len(),
            KILL_SIZE as u64
        );
        std::fs::remove_dir_all(&t).unwrap();
    }
    stop(srv);
    let vc = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(vc["problems"], serde_json::json!([]), "{vc}");
}

/// Writes `data` at `offset` through libnbd and flushes.
fn nbd_write(py: &str, url: &str, offset: u64, data: &[u8], scratch: &std::path::Path) {
    std::fs::write(scratch, data).unwrap();
    let script = format!(
        "import nbd\n\
         h = nbd.NBD()\n\
         h.connect_uri({url:?})\n\
         h.pwrite(open({:?}, 'rb').read(), {offset})\n\
         h.flush()\n\
         h.shutdown()\n",
        scratch.to_str().unwrap()
    );
    sh(Command::new(py).args(["-c", &script]));
}

/// The size of the volumes the kill tests write to.
const KILL_SIZE: usize = 48 << 20;

/// A repository (`init` given `extra`) with volume `v` of [`KILL_SIZE`]
/// random bytes (`seed`), and those bytes.
fn random_volume(seed: u64, extra: &[&str]) -> (Repo, Vec<u8>) {
    let r = Repo::with_init(extra, None);
    let img = prng(seed, KILL_SIZE);
    let src = r.scratch("disk.raw");
    std::fs::write(&src, &img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    (r, img)
}

/// Writes new random bytes (`seed`) over half `round % 2` of the volume
/// served at `url`; `cur` follows.
fn write_half(r: &Repo, py: &str, url: &str, round: u64, seed: u64, cur: &mut [u8]) {
    let off = (round as usize % 2) * (KILL_SIZE / 2);
    let new = prng(seed, KILL_SIZE / 2);
    nbd_write(
        py,
        url,
        off as u64,
        &new,
        &r.dir().join(format!("w{round}")),
    );
    cur[off..off + KILL_SIZE / 2].copy_from_slice(&new);
}

/// The names of the volume's hold files ending in `ext`.
fn hold_files(r: &Repo, ext: &str) -> usize {
    std::fs::read_dir(r.path.join("volumes/v/holds"))
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(ext)
            })
            .count()
        })
        .unwrap_or(0)
}

/// The repository's link markers, and how many of them name a container
/// that is not a link stub: one whose data object is not there yet (a
/// snapshot killed before it put the stub) or is stored (a hold the volume
/// did not take).
fn links(r: &Repo) -> (usize, usize) {
    let Ok(d) = std::fs::read_dir(r.path.join("links")) else {
        return (0, 0);
    };
    // (Not a killed put's temporary file: never listed.)
    let names: Vec<String> = d
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    let half = names
        .iter()
        .filter(|n| {
            use std::io::Read;
            let data = r.path.join("data").join(&n[..2]).join(n.as_str());
            let mut head = [0u8; 8];
            !std::fs::File::open(&data)
                .and_then(|mut f| f.read_exact(&mut head))
                .is_ok_and(|_| &head == b"STRLINK1")
        })
        .count();
    (names.len(), half)
}

/// kill -9 of `volume snapshot` while it links and commits (of a stopped
/// volume, which the killed process had open, and of a served one, whose
/// server takes the holds), at points spread over the end of its run:
/// every version committed restores byte-exact, the repository and the
/// volume check clean, the next snapshot releases what the killed one
/// left linked (its marker and maybe its hold, no stub, never committed),
/// and once the versions are forgotten gc releases every hold.
#[test]
fn kill_9_during_linking() {
    let Some(py) = libnbd_python() else {
        return;
    };
    // Containers of 4 MiB: each run links several, so a kill right after
    // a marker has several chances to come before its stub (with one
    // container a run, a disk that syncs fast left no half-linked one).
    let (r, mut cur) = random_volume(60, &["--container-mib", "4"]);
    let mut expected: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    let record = |expected: &mut std::collections::BTreeMap<String, Vec<u8>>, img: &[u8]| {
        let mut n = 0;
        for id in r.snapshot_ids() {
            if let std::collections::btree_map::Entry::Vacant(e) = expected.entry(id) {
                e.insert(img.to_vec());
                n += 1;
            }
        }
        n
    };
    // A full run's time, linking all it reads (24 MiB of new blocks, as
    // each round writes below).
    let t = std::time::Instant::now();
    r.json(&["volume", "snapshot", "v"]);
    let base = t.elapsed().as_millis() as u64;
    record(&mut expected, &cur);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let jitter = prng(seed, 64);
    const ROUNDS: usize = 8;
    let (mut half_linked, mut released) = (0, 0);
    let mut links_after = links(&r);
    for round in 0..ROUNDS {
        // Half the volume new, written by a client.
        let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
        write_half(
            &r,
            py,
            &srv.url,
            round as u64,
            1000 + round as u64,
            &mut cur,
        );
        let served = round % 2 == 1;
        let srv = match served {
            true => Some(srv),
            false => {
                stop(srv);
                None
            }
        };
        // Killed while it links: as soon as a new marker shows (the
        // marker, the hold, the stub follow one another as each container
        // is done), give or take a few ms; every third round at a time
        // spread over the run's end.
        let mut c = r.cmd(&["volume", "snapshot", "v"]);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let markers_before = links(&r).0;
        let started = std::time::Instant::now();
        let mut child = c.spawn().unwrap();
        let extra = jitter[round] as u64 % 4;
        let how = match round % 3 {
            2 => {
                let delay = base / 2 + jitter[round + 16] as u64 * base / 2 / 255;
                std::thread::sleep(std::time::Duration::from_millis(delay));
                format!("after {delay} of {base} ms")
            }
            _ => loop {
                if links(&r).0 > markers_before {
                    std::thread::sleep(std::time::Duration::from_millis(extra));
                    break format!(
                        "{extra} ms after a new marker ({} ms in)",
                        started.elapsed().as_millis()
                    );
                }
                if started.elapsed().as_millis() as u64 > 4 * base
                    || child.try_wait().unwrap().is_some()
                {
                    break "at its end".to_string();
                }
            },
        };
        let _ = child.kill();
        let st = child.wait().unwrap();
        let committed = record(&mut expected, &cur);
        let (markers, half) = links(&r);
        half_linked += usize::from(half > links_after.1);
        eprintln!(
            "round {round} ({}): killed {how} ({st}); committed {committed}, \
             markers {markers} ({half} with their data still stored), holds {}",
            if served { "served" } else { "stopped" },
            hold_files(&r, ".hold")
        );
        assert!(committed <= 1);
        // The next snapshot goes on from whatever the kill left, and
        // first releases what it left linked (no version's; nothing had
        // indexed it yet).
        let s = r.json(&["volume", "snapshot", "v"]);
        assert_eq!(record(&mut expected, &cur), 1, "{s}");
        released += s["released_leftover_containers"].as_u64().unwrap();
        links_after = links(&r);
        eprintln!("  then: {s}, half-linked {}", links_after.1);
        assert_eq!(
            unstubbed(&r),
            0,
            "round {round}: a half-linked container is left"
        );
        if let Some(srv) = srv {
            stop(srv);
        }
        let vc = r.json(&["volume", "check", "v"]);
        assert_eq!(vc["problems"], serde_json::json!([]), "round {round}: {vc}");
        let c = r.json(&["check"]);
        assert_eq!(c["errors"], serde_json::json!([]), "round {round}: {c}");
    }
    eprintln!("kills that left a new container half-linked: {half_linked}");
    // (The kills come right after a marker shows, before its hold's
    // syncs are done: the state gc must clean up.)
    assert!(half_linked > 0, "no kill left a container half-linked");
    assert!(released > 0, "no snapshot released what a kill left");
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    let vc = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(vc["problems"], serde_json::json!([]), "{vc}");
    for (i, (id, img)) in expected.iter().enumerate() {
        restores(&r, id, img, &format!("version {i}"));
    }
    // Every version forgotten and collected: no hold is left once the
    // volume has given the releases back.
    let ids: Vec<&str> = expected.keys().map(String::as_str).collect();
    let mut a = vec!["forget"];
    a.extend(&ids);
    r.json(&a);
    // gc killed as soon as it has released a hold (before the stub and
    // the marker go), then run again.
    let mut c = r.cmd(&["gc"]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let started = std::time::Instant::now();
    let mut child = c.spawn().unwrap();
    while hold_files(&r, ".released") == 0
        && started.elapsed().as_secs() < 30
        && child.try_wait().unwrap().is_none()
    {}
    let _ = child.kill();
    let st = child.wait().unwrap();
    eprintln!(
        "gc killed ({st}): {} released, {} held, {} markers",
        hold_files(&r, ".released"),
        hold_files(&r, ".hold"),
        links(&r).0
    );
    let c = r.json(&["check"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    r.json(&["gc"]);
    let vc = r.json(&["volume", "check", "v"]);
    assert_eq!(vc["problems"], serde_json::json!([]), "{vc}");
    assert_eq!(hold_files(&r, ".hold"), 0);
    assert_eq!(links(&r).0, 0, "no marker is left");
    let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
    stop(srv);
    assert_eq!(hold_files(&r, ".released"), 0);
    let vc = r.json(&["volume", "check", "v"]);
    assert_eq!(vc["held_blocks"], 0, "{vc}");
    let st = r.json(&["stats"]);
    assert_eq!(st["linked_bytes"], 0, "{st}");
}

/// The server killed while a snapshot has it take holds (right after the
/// snapshot's first marker shows): the snapshot is committed all the same,
/// the containers whose hold the server did not take stored from the
/// volume's blocks (their markers kept: a hold the server took before it
/// died is released with them); the restarted volume recounts its holds;
/// every version restores, and once everything is forgotten gc leaves no
/// hold and no marker.
#[test]
fn a_server_killed_while_it_takes_holds() {
    let Some(py) = libnbd_python() else {
        return;
    };
    let (r, mut cur) = random_volume(70, &[]);
    let mut versions: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..3u64 {
        let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
        write_half(&r, py, &srv.url, round, 2000 + round, &mut cur);
        let (before, half_before) = links(&r);
        let snap = r.cmd(&["--json", "volume", "snapshot", "v"]);
        let child = {
            let mut c = snap;
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().unwrap()
        };
        let started = std::time::Instant::now();
        while links(&r).0 == before && started.elapsed().as_secs() < 60 {}
        // (0, 4, 8 ms: before the hold is taken, or after.)
        std::thread::sleep(std::time::Duration::from_millis(4 * round));
        let mut srv = srv;
        srv.child.kill().unwrap();
        srv.child.wait().unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "round {round}: snapshot {} ({} markers, {} half-linked, {} holds): {}",
            out.status,
            links(&r).0,
            links(&r).1,
            hold_files(&r, ".hold"),
            stderr.trim()
        );
        // Linked as far as the server held, stored from there on.
        assert!(out.status.success(), "{stderr}");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let failed = j["hold_failed_containers"].as_u64().unwrap() as usize;
        assert_eq!(links(&r).1, half_before + failed, "{j}");
        let id = j["id"].as_str().unwrap().to_string();
        versions.push((id, cur.clone()));
        // Opened again after the kill (journal replayed, counts recounted
        // with the holds): clean, and every version reads back.
        let vc = r.json(&["volume", "check", "v", "--read-data"]);
        assert_eq!(vc["problems"], serde_json::json!([]), "round {round}: {vc}");
        for (i, (id, img)) in versions.iter().enumerate() {
            restores(&r, id, img, &format!("round {round} version {i}"));
        }
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "round {round}: {c}");
    }
    // A snapshot of the stopped volume that reads everything finds it
    // stored, and links what is new.
    let half = links(&r).1;
    let s = r.json(&["volume", "snapshot", "v", "--read-all"]);
    versions.push((s["id"].as_str().unwrap().to_string(), cur.clone()));
    assert_eq!(s["hold_failed_containers"], 0, "{s}");
    assert_eq!(links(&r).1, half, "{s}");
    let ids: Vec<&str> = versions.iter().map(|(i, _)| i.as_str()).collect();
    let mut a = vec!["forget"];
    a.extend(&ids);
    r.json(&a);
    r.json(&["gc"]);
    assert_eq!(hold_files(&r, ".hold"), 0);
    assert_eq!(links(&r).0, 0);
    r.json(&["volume", "snapshot", "v"]);
    let vc = r.json(&["volume", "check", "v"]);
    assert_eq!(vc["problems"], serde_json::json!([]), "{vc}");
}

/// Sets the repository's zstd level in its (checksummed) config, as a
/// build with another zstd would compress differently.
fn set_zstd_level(r: &Repo, level: i32) {
    use strata_core::crypto::{Kind, Sealer};
    use strata_core::format::RepoConfig;
    let p = r.path.join("config");
    let raw = std::fs::read(&p).unwrap();
    let plain = Sealer::plain(3).open(Kind::Config, &raw).unwrap();
    let mut c: RepoConfig = strata_core::format::decode_config(&plain).unwrap();
    c.zstd_level = level;
    let env = Sealer::plain(3)
        .seal(
            Kind::Config,
            &strata_core::format::encode_config(&c).unwrap(),
            false,
        )
        .unwrap();
    std::fs::write(&p, env).unwrap();
}

/// `volume delete` stores what a volume held again, compressed, whatever
/// zstd does now (here the repository's level changed in between, as
/// after a zstd upgrade): each container is first stored at the lengths
/// its metadata gives (uncompressed, as the link sink linked it), then
/// copied forward compressed. The version restores, check reads it clean,
/// and the repository holds the compressed size.
#[test]
fn a_volume_goes_even_when_zstd_compresses_otherwise() {
    // Better (level 19) in a plain repository, worse (level 1) in an
    // encrypted one.
    for (password, level) in [(None, 19), (Some("pw"), 1)] {
        goes_with_another_zstd(password, level);
    }
}

fn goes_with_another_zstd(password: Option<&str>, level: i32) {
    let extra: &[&str] = if password.is_some() {
        &["--encrypt"]
    } else {
        &[]
    };
    let r = Repo::with_init(extra, password);
    // Compressible data (text-like), and random data after it.
    let mut img: Vec<u8> = (0..(6u32 << 20))
        .map(|i| b"strata volume linked snapshot "[(i as usize * 7 + i as usize / 4093) % 30])
        .collect();
    img.extend(prng(44, 2 << 20));
    let src = r.scratch("disk.raw");
    std::fs::write(&src, &img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    let s = r.json(&["volume", "snapshot", "v"]);
    assert!(s["linked_containers"].as_u64().unwrap() > 0, "{s}");
    set_zstd_level(&r, level);
    let d = r.json(&["volume", "delete", "v", "--yes"]);
    assert!(d["stored_again_bytes"].as_u64().unwrap() > 0, "{d}");
    restores(&r, "volume:v@1", &img, "stored again by another zstd");
    let c = r.json(&["check", "--read-data"]);
    assert_eq!(c["errors"], serde_json::json!([]), "{c}");
    let st = r.json(&["stats"]);
    assert_eq!(st["linked_bytes"], 0, "{st}");
    // 6 MiB of text-like data compress to little, 2 MiB random do not.
    assert!(st["stored_bytes"].as_u64().unwrap() < 3 << 20, "{st} {d}");
    assert!(d["stored_again_bytes"].as_u64().unwrap() < 3 << 20, "{d}");
}

/// `volume delete` of a volume with one changed held block: the copy
/// forward of the linked containers fails on it, so they are stored one
/// by one (that one named damaged), then copied forward compressed once
/// more. The repository holds the compressed size, and no warning says
/// compressing failed.
#[test]
fn a_damaged_container_does_not_keep_the_rest_uncompressed() {
    let r = Repo::with_init(&["--container-mib", "2"], None);
    let img = text_blocks(12 << 20, b"strata linked, damaged, compressed ");
    let src = r.scratch("disk.raw");
    std::fs::write(&src, &img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    let s = r.json(&["volume", "snapshot", "v"]);
    assert!(s["linked_containers"].as_u64().unwrap() > 1, "{s}");
    let data = r.path.join("volumes/v/data");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"changed", 4096 * 3 + 100).unwrap();
    drop(f);
    let d = r.run(&["--json", "volume", "delete", "v", "--yes"]).ok();
    assert!(d.stderr.contains("no longer match"), "{s} {}", d.stderr);
    assert!(
        !d.stderr.contains("compressing them failed"),
        "{}",
        d.stderr
    );
    let j = d.json();
    assert_eq!(j["damaged_containers"], 1, "{j}");
    assert!(j["recompressed_containers"].as_u64().unwrap() >= 1, "{j}");
    assert!(!r.path.join("volumes/v").exists());
    // The damaged container stays as it was (check names it); the rest,
    // 6 MiB of text-like data, is stored compressed.
    let st = r.json(&["stats"]);
    assert_eq!(st["linked_containers"], 1, "{st}");
    assert!(st["stored_bytes"].as_u64().unwrap() < 1 << 20, "{st}");
}

/// A volume of text-like blocks (each its own) and random ones, snapshotted
/// (linked): the repository and the image.
fn linked_mixed_volume(seed: u64) -> (Repo, Vec<u8>) {
    let r = Repo::with_init(&["--container-mib", "4"], None);
    let mut img = text_blocks(24 << 20, b"strata volume delete, killed ");
    img.extend(prng(seed, 24 << 20));
    let src = r.scratch("disk.raw");
    std::fs::write(&src, &img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    let s = r.json(&["volume", "snapshot", "v"]);
    assert!(s["linked_containers"].as_u64().unwrap() > 1, "{s}");
    (r, img)
}

/// kill -9 of `volume delete` at points spread over its run (storing the
/// linked containers again, copying them forward, deleting the volume's
/// files): as soon as the copy's first container shows, as soon as the
/// first marker goes, or after a share of a full run's time. The version
/// restores byte-exact after the kill, a second `volume delete` finishes
/// the job, and then the version still restores, check reads it clean,
/// nothing is linked any more and the data is stored compressed.
#[test]
fn kill_9_during_volume_delete() {
    // A full run's time.
    let (r, _) = linked_mixed_volume(70);
    let t = std::time::Instant::now();
    r.json(&["volume", "delete", "v", "--yes"]);
    let base = t.elapsed().as_millis() as u64;
    let data_objects = |r: &Repo| {
        walkdir::WalkDir::new(r.path.join("data"))
            .into_iter()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_type().is_file() && !e.file_name().to_string_lossy().starts_with('.')
            })
            .count()
    };
    const ROUNDS: u64 = 6;
    let mut midway = 0;
    for round in 0..ROUNDS {
        let (r, img) = linked_mixed_volume(71 + round);
        let (objects, markers) = (data_objects(&r), links(&r).0);
        let mut c = r.cmd(&["volume", "delete", "v", "--yes"]);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let started = std::time::Instant::now();
        let mut child = c.spawn().unwrap();
        let how = match round % 3 {
            0 => loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                if data_objects(&r) > objects || started.elapsed().as_secs() > 20 {
                    break format!("a new container ({} ms in)", started.elapsed().as_millis());
                }
            },
            1 => loop {
                std::thread::sleep(std::time::Duration::from_millis(1));
                if links(&r).0 < markers || started.elapsed().as_secs() > 20 {
                    break format!("a marker gone ({} ms in)", started.elapsed().as_millis());
                }
            },
            _ => {
                let delay = base * (round + 1) / (ROUNDS + 1);
                std::thread::sleep(std::time::Duration::from_millis(delay));
                format!("after {delay} of {base} ms")
            }
        };
        let _ = child.kill();
        child.wait().unwrap();
        let how = format!("killed {how}");
        let there = r.path.join("volumes/v").exists();
        midway += (there && (links(&r).0 < markers || data_objects(&r) > objects)) as u32;
        restores(&r, "volume:v@1", &img, "before the rerun");
        let c = r.json(&["check"]);
        assert_eq!(c["errors"], serde_json::json!([]), "{how}: {c}");
        if there {
            r.json(&["volume", "delete", "v", "--yes"]);
        }
        assert!(!r.path.join("volumes/v").exists(), "{how}");
        restores(&r, "volume:v@1", &img, "after");
        r.json(&["gc"]);
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "{how}: {c}");
        let st = r.json(&["stats"]);
        assert_eq!(st["linked_bytes"], 0, "{how}: {st}");
        // Compressed: the 24 MiB of text-like data to little.
        assert!(
            st["stored_bytes"].as_u64().unwrap() < 26 << 20,
            "{how}: {st}"
        );
        // A new volume of the name: nothing a killed delete left stays.
        r.json(&["volume", "create", "v", "--size", "1M"]);
        let left: Vec<_> = std::fs::read_dir(r.path.join("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["v"], "{how}");
    }
    // Some kills landed after the copy began and before the volume's
    // deletion.
    assert!(midway > 0, "no kill landed midway");
}

/// `len` bytes of text-like 4 KiB blocks (`words` repeated, strided),
/// each one of its own: its number at its start.
fn text_blocks(len: usize, words: &[u8]) -> Vec<u8> {
    let mut img: Vec<u8> = (0..len).map(|i| words[(i * 5) % words.len()]).collect();
    for (n, b) in img.chunks_mut(4096).enumerate() {
        b[..12].copy_from_slice(format!("{n:>12}").as_bytes());
    }
    img
}

/// Markers whose container has no data object at all (linking stopped
/// before its stub; not one stored after a failed hold).
fn unstubbed(r: &Repo) -> usize {
    std::fs::read_dir(r.path.join("links"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .filter(|n| !r.path.join("data").join(&n[..2]).join(n).exists())
                .count()
        })
        .unwrap_or(0)
}

/// What the sweep of a killed snapshot's leftovers must leave alone: with
/// a record of a live process beside the volume (another snapshot may be
/// linking) nothing is released, and once it goes the next snapshot
/// releases them; with the index objects gone (a version then needs
/// chunks only unlisted containers hold) the sweep is refused with a
/// warning, the snapshot goes on, and after `repair index` the first
/// version restores and checks clean.
#[test]
fn a_sweep_leaves_what_a_version_or_a_running_snapshot_may_need() {
    if !have("nbdcopy") {
        return;
    }
    // (Containers of 4 MiB: a kill right after the first marker comes
    // well before the snapshot's end, which removes its record.)
    let (r, img) = linked_volume_in(Repo::with_init(&["--container-mib", "4"], None));
    r.json(&["volume", "snapshot", "v"]);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let live = r
        .path
        .join(format!("volumes/.v.snapshot-{}", std::process::id()));
    for (round, seed) in [(0, 90), (1, 91)] {
        // New data, then a snapshot killed as it links it.
        let srv = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
        let src = r.scratch(&format!("new{round}.raw"));
        std::fs::write(&src, prng(seed, 16 << 20)).unwrap();
        sh(Command::new("nbdcopy").arg(&src).arg(&srv.url));
        stop(srv);
        let before = links(&r).0;
        let mut c = r.cmd(&["volume", "snapshot", "v"]);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().unwrap();
        let t = std::time::Instant::now();
        while links(&r).0 == before && t.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = child.kill();
        child.wait().unwrap();
        assert!(
            links(&r).0 > before,
            "round {round}: no marker before the kill"
        );
        // (Its record stays: the kill came before its end.)
        let record = r.path.join(format!("volumes/.v.snapshot-{}", child.id()));
        assert!(
            record.exists(),
            "round {round}: the killed snapshot's record"
        );
        if round == 0 {
            // A live process's record: nothing is released.
            let me = format!("{}\n{}\n", host.trim(), std::process::id());
            std::fs::write(&live, me).unwrap();
            let s = r.json(&["volume", "snapshot", "v"]);
            assert_eq!(s["released_leftover_containers"], 0, "{s}");
            std::fs::remove_file(&live).unwrap();
            let s = r.json(&["volume", "snapshot", "v"]);
            assert!(
                s["released_leftover_containers"].as_u64().unwrap() > 0,
                "{s}"
            );
        } else {
            // The index objects gone: the sweep is refused.
            std::fs::remove_dir_all(r.path.join("index")).unwrap();
            std::fs::create_dir(r.path.join("index")).unwrap();
            let s = r.run(&["--json", "volume", "snapshot", "v"]).ok();
            assert!(s.stderr.contains("stays until gc"), "{}", s.stderr);
            assert_eq!(s.json()["released_leftover_containers"], 0);
            r.json(&["repair", "index"]);
        }
        restores(&r, "volume:v@1", &img, &format!("round {round}"));
        let c = r.json(&["check", "--read-data"]);
        assert_eq!(c["errors"], serde_json::json!([]), "round {round}: {c}");
    }
}
