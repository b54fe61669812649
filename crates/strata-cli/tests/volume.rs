//! `strata volume serve` with real NBD clients on loopback: nbdcopy,
//! qemu-img and nbdfuse write and read back, fio verifies, a kill -9 keeps every
//! flushed write, and a misbehaving client is cut off without disturbing
//! others. Skipped (with a message) where the NBD tools are missing; CI
//! installs them (qemu-utils, libnbd-bin, fio).

mod common;
use common::nbd::*;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn serve(repo: &Repo, name: &str) -> Served {
    serve_cmd(repo.cmd(&["volume", "serve", name, "--listen", "127.0.0.1:0", "--json"]))
}

/// kill -9: the server gets no chance to destage or close.
fn kill9(mut s: Served) {
    s.child.kill().unwrap();
    s.child.wait().unwrap();
}

/// Writes `prng(seed, 64 KiB)` at the start of the served volume with
/// qemu-img (through `patch`, a scratch file); returns the bytes.
fn qemu_write_start(s: &Served, patch: &Path, seed: u64) -> Vec<u8> {
    let data = prng(seed, 64 << 10);
    std::fs::write(patch, &data).unwrap();
    sh(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(patch)
        .arg(&s.url));
    data
}

/// An image with repeated content: two copies of a 4 MiB pattern, zeros
/// between.
/// A 64 MiB image (with a repeated stretch) copied into the served
/// volume by nbdcopy; returns its bytes.
fn copy_in_image(r: &Repo, s: &Served) -> Vec<u8> {
    let img = r.scratch("img.raw");
    let data = image(&img, 64 << 20);
    sh(Command::new("nbdcopy").arg(&img).arg(&s.url));
    data
}

fn image(p: &Path, size: usize) -> Vec<u8> {
    let mut d = vec![0u8; size];
    let pat = prng(7, 4 << 20);
    d[..pat.len()].copy_from_slice(&pat);
    d[size / 2..size / 2 + pat.len()].copy_from_slice(&pat);
    std::fs::write(p, &d).unwrap();
    d
}

/// `volume create v --from` an image file holding `img`; its JSON report.
fn create_from(r: &Repo, img: &[u8]) -> serde_json::Value {
    let src = r.scratch("disk.raw");
    std::fs::write(&src, img).unwrap();
    r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()])
}

fn new_volume(size: &str) -> Repo {
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", size]);
    r
}

#[test]
fn nbdcopy_and_qemu_img_write_and_read_back_deduplicated() {
    if !have("nbdcopy") || !have("qemu-img") {
        return;
    }
    let r = new_volume("64M");
    let s = serve(&r, "v");
    let data = copy_in_image(&r, &s);
    let out = r.scratch("out.raw");
    sh(Command::new("nbdcopy").arg(&s.url).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "nbdcopy read back");
    // qemu-img sees a raw disk of the right size and converts it back.
    let info = sh(Command::new("qemu-img").args(["info", "--output=json", &s.url]));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["virtual-size"], 64 << 20);
    let q = r.scratch("q.raw");
    sh(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &s.url])
        .arg(&q));
    assert!(std::fs::read(&q).unwrap() == data, "qemu-img read back");
    // Writes through qemu-img land too.
    let small = r.scratch("small.raw");
    std::fs::write(&small, prng(9, 1 << 20)).unwrap();
    sh(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&small)
        .arg(&s.url));
    let mut want = data.clone();
    want[..1 << 20].copy_from_slice(&prng(9, 1 << 20));
    sh(Command::new("nbdcopy").arg(&s.url).arg(&out));
    assert!(std::fs::read(&out).unwrap() == want, "after qemu-img wrote");
    // SIGTERM: destaged and closed cleanly; the second copy deduplicated.
    stop(s);
    let st = r.json(&["volume", "stats", "v"]);
    // The second 4 MiB copy is references, but for its first MiB when
    // qemu-img overwrote the first copy's before it left the buffer.
    let dedup = st["deduplicated_blocks"].as_u64().unwrap();
    assert!(dedup >= 768, "the second copy is references: {st}");
    assert!(st["dedup_ratio"].as_f64().unwrap() > 1.3, "{st}");
    assert!(st["read_p99_us"].as_f64().is_some(), "{st}");
}

#[test]
fn fio_verifies_random_writes() {
    if !have("fio") {
        return;
    }
    let r = new_volume("32M");
    let s = serve(&r, "v");
    // fio may leave a verify state file in its working directory.
    let wd = r.scratch("fio");
    std::fs::create_dir(&wd).unwrap();
    let o = Command::new("fio")
        .current_dir(&wd)
        .args([
            "--verify_state_save=0",
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", s.url),
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--verify=crc32c",
            "--do_verify=1",
            "--output-format=json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "fio: {text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "{v}");
    assert!(
        v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap() >= 16 << 20,
        "verified by reading"
    );
}

/// kill -9 while a client writes: everything written before its FLUSH
/// (nbdcopy flushes at the end) reads back after a restart.
#[test]
fn kill_9_keeps_every_flushed_write() {
    if !have("nbdcopy") {
        return;
    }
    let r = new_volume("64M");
    let s = serve(&r, "v");
    let data = copy_in_image(&r, &s);
    // More writes in flight, then the server dies.
    let other = r.scratch("other.raw");
    std::fs::write(&other, prng(11, 64 << 20)).unwrap();
    let mut w = Command::new("nbdcopy")
        .arg(&other)
        .arg(&s.url)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    kill9(s);
    let finished = w.wait().unwrap().success();
    let s2 = serve(&r, "v");
    let out = r.scratch("out.raw");
    sh(Command::new("nbdcopy").arg(&s2.url).arg(&out));
    let got = std::fs::read(&out).unwrap();
    let want = if finished { prng(11, 64 << 20) } else { data };
    // Unflushed writes may or may not be there, block by block; flushed
    // ones must be. The first copy was flushed whole: every block is
    // either its content or the second's.
    let other = prng(11, 64 << 20);
    for (i, b) in got.chunks(4096).enumerate() {
        let a = &want[i * 4096..(i + 1) * 4096];
        let o = &other[i * 4096..(i + 1) * 4096];
        assert!(
            b == a || b == o,
            "block {i} is neither the flushed nor the newer content"
        );
    }
    drop(s2);
}

fn nbd_handshake(addr: &str, name: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 18];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    c.write_all(b"IHAVEOPT").unwrap();
    c.write_all(&1u32.to_be_bytes()).unwrap(); // EXPORT_NAME
    c.write_all(&(name.len() as u32).to_be_bytes()).unwrap();
    c.write_all(name.as_bytes()).unwrap();
    let mut b = [0u8; 10];
    c.read_exact(&mut b).unwrap();
    c
}

fn request(c: &mut TcpStream, kind: u16, handle: u64, off: u64, len: u32) {
    let mut q = 0x2560_9513u32.to_be_bytes().to_vec();
    q.extend_from_slice(&0u16.to_be_bytes());
    q.extend_from_slice(&kind.to_be_bytes());
    q.extend_from_slice(&handle.to_be_bytes());
    q.extend_from_slice(&off.to_be_bytes());
    q.extend_from_slice(&len.to_be_bytes());
    c.write_all(&q).unwrap();
}

/// (error, handle) of a simple reply.
fn reply(c: &mut TcpStream) -> (u32, u64) {
    let mut b = [0u8; 16];
    c.read_exact(&mut b).unwrap();
    assert_eq!(u32::from_be_bytes(b[..4].try_into().unwrap()), 0x6744_6698);
    (
        u32::from_be_bytes(b[4..8].try_into().unwrap()),
        u64::from_be_bytes(b[8..].try_into().unwrap()),
    )
}

#[test]
fn bad_clients_get_errors_and_others_keep_working() {
    let r = new_volume("1M");
    let s = serve(&r, "v");
    let mut good = nbd_handshake(&s.addr, "v");
    // Out of range: EINVAL for a read, ENOSPC for a write; too long: EOVERFLOW.
    request(&mut good, 0, 1, 1 << 20, 4096);
    assert_eq!(reply(&mut good), (22, 1));
    request(&mut good, 0, 2, 0, 64 << 20);
    assert_eq!(reply(&mut good), (75, 2));
    request(&mut good, 1, 3, (1 << 20) - 100, 4096);
    good.write_all(&[0u8; 4096]).unwrap();
    assert_eq!(reply(&mut good), (28, 3));
    // An unknown export name ends that handshake only.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let mut b = [0u8; 18];
    c.read_exact(&mut b).unwrap();
    c.write_all(&3u32.to_be_bytes()).unwrap();
    c.write_all(b"IHAVEOPT").unwrap();
    c.write_all(&1u32.to_be_bytes()).unwrap();
    c.write_all(&4u32.to_be_bytes()).unwrap();
    c.write_all(b"nope").unwrap();
    assert_eq!(c.read(&mut b).unwrap_or(0), 0, "closed");
    // Handshake flags the server does not know close the connection at
    // once (it does not wait for options).
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.read_exact(&mut b).unwrap();
    c.write_all(&(3u32 | 1 << 7).to_be_bytes()).unwrap();
    let t = Instant::now();
    assert_eq!(c.read(&mut b).unwrap_or(1), 0, "closed");
    assert!(t.elapsed() < Duration::from_secs(5));
    // A bad request magic ends that connection only.
    let mut bad = nbd_handshake(&s.addr, "v");
    bad.write_all(&[0xde; 28]).unwrap();
    let t = Instant::now();
    assert_eq!(bad.read(&mut b).unwrap_or(0), 0, "closed");
    assert!(t.elapsed() < Duration::from_secs(5));
    // The good connection still reads and writes.
    request(&mut good, 1, 4, 8192, 4096);
    good.write_all(&[5u8; 4096]).unwrap();
    assert_eq!(reply(&mut good), (0, 4));
    request(&mut good, 0, 5, 8192, 4096);
    assert_eq!(reply(&mut good), (0, 5));
    let mut d = vec![0u8; 4096];
    good.read_exact(&mut d).unwrap();
    assert!(d.iter().all(|&x| x == 5));
    request(&mut good, 2, 6, 0, 0); // DISC
}

/// One process at a time: a second `serve` of the same volume, or a
/// delete while it is served, is refused in one line; after kill -9 the
/// lock is gone with the process.
#[test]
fn a_served_volume_is_locked() {
    let r = new_volume("1M");
    let mut s = serve(&r, "v");
    let e = r
        .run(&["volume", "serve", "v", "--listen", "127.0.0.1:0"])
        .expect_code(1);
    assert!(
        e.stderr.contains("in use by another process"),
        "{}",
        e.stderr
    );
    let e = r.run(&["volume", "delete", "v", "--yes"]).expect_code(1);
    assert!(e.stderr.contains("in use"), "{}", e.stderr);
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let e = r.run(&["volume", "delete", "v"]).expect_code(1);
    assert!(e.stderr.contains("--yes"), "{}", e.stderr);
    r.json(&["volume", "delete", "v", "--yes"]);
    let l = r.json(&["volume", "list"]);
    assert_eq!(l, serde_json::json!([]));
}

/// `volume snapshot` stores what the clients wrote as a version in the
/// repository, of a served volume (frozen by its server) or a stopped
/// one; `strata restore` writes it back as a sparse image; the next
/// snapshot of a little-changed volume adds little.
#[test]
fn snapshots_restore_as_sparse_images() {
    if !have("nbdcopy") || !have("qemu-img") {
        return;
    }
    let r = new_volume("64M");
    let s = serve(&r, "v");
    let data = copy_in_image(&r, &s);
    // Served: the server freezes a point in time for the snapshot.
    let live = r.json(&["volume", "snapshot", "v", "--tag", "live"]);
    assert_eq!(live["version"], 1, "{live}");
    // The first reads every written segment (the two 4 MiB copies); the
    // rest was never written and is neither read nor hashed.
    assert_eq!(
        live["read_bytes"],
        8 << 20,
        "the first reads what was written: {live}"
    );
    let t = r.scratch("t0");
    r.restore("volume:v@latest", &t);
    assert!(
        std::fs::read(t.join("v.img")).unwrap() == data,
        "snapshot of the served volume"
    );
    // The server lets the freeze go once the snapshot's connection ends.
    let frozen = || {
        std::fs::read_dir(r.dir().join("repo/volumes/v"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("map.frozen"))
            .count()
    };
    let t0 = Instant::now();
    while frozen() > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(frozen(), 0, "the frozen map goes with the snapshot");
    stop(s);

    // Stopped: opened here. Nothing new since the live snapshot.
    let v1 = r.json(&["volume", "snapshot", "v", "--tag", "nightly"]);
    assert_eq!(v1["series"], "volume:v");
    assert_eq!(v1["logical_bytes"], 64 << 20);
    assert_eq!(v1["version"], 2);
    assert_eq!(v1["new_raw_bytes"], 0, "{v1}");
    assert_eq!(v1["read_bytes"], 0, "nothing written since: nothing read");
    assert_eq!(v1["unchanged_bytes"], 64 << 20, "{v1}");
    // Two copies of one 4 MiB pattern and zeros: one copy stored.
    let new0 = live["new_raw_bytes"].as_u64().unwrap();
    assert!(new0 <= (4 << 20) + (64 << 10), "{live}");
    let t = r.scratch("t1");
    r.restore("volume:v@latest", &t);
    let out = t.join("v.img");
    assert!(std::fs::read(&out).unwrap() == data, "restored image");
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&out).unwrap();
    assert!(
        md.blocks() * 512 <= 16 << 20,
        "restored sparse: {} bytes allocated",
        md.blocks() * 512
    );

    // 64 KiB rewritten: the next snapshot stores about that.
    let s = serve(&r, "v");
    let patch = r.scratch("patch.raw");
    qemu_write_start(&s, &patch, 11);
    stop(s);
    let v2 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v2["version"], 3);
    assert_eq!(v2["read_bytes"], 2 << 20, "only the 2 MiB segment written");
    let new2 = v2["new_raw_bytes"].as_u64().unwrap();
    assert!(new2 <= 128 << 10, "{v2}");
    let t = r.scratch("t2");
    r.restore("volume:v@latest", &t);
    let mut want = data.clone();
    want[..64 << 10].copy_from_slice(&prng(11, 64 << 10));
    assert!(
        std::fs::read(t.join("v.img")).unwrap() == want,
        "second version"
    );
    // The snapshot's reads are not the clients': stats unchanged by it.
    let st = r.json(&["volume", "stats", "v"]);
    assert!(st["dedup_ratio"].as_f64().is_some(), "{st}");

    // Served again, written again: the server's snapshot reads that
    // segment only.
    let s = serve(&r, "v");
    qemu_write_start(&s, &patch, 12);
    let v3 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v3["read_bytes"], 2 << 20, "{v3}");
    want[..64 << 10].copy_from_slice(&prng(12, 64 << 10));
    let t = r.scratch("t3");
    r.restore("volume:v@latest", &t);
    assert!(std::fs::read(t.join("v.img")).unwrap() == want, "v3");
    // A server killed after a write: what it wrote since is not known,
    // so the next snapshot reads everything (and holds the write).
    qemu_write_start(&s, &patch, 13);
    kill9(s);
    let v4 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(
        v4["read_bytes"],
        8 << 20,
        "after a crash: all written read: {v4}"
    );
    want[..64 << 10].copy_from_slice(&prng(13, 64 << 10));
    let t = r.scratch("t4");
    r.restore("volume:v@latest", &t);
    assert!(std::fs::read(t.join("v.img")).unwrap() == want, "v4");
    // And the one after it reads nothing again, unless asked to.
    let v5 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v5["read_bytes"], 0, "{v5}");
    let v6 = r.json(&["volume", "snapshot", "v", "--read-all"]);
    assert_eq!(v6["read_bytes"], 8 << 20, "{v6}");
    let v7 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v7["read_bytes"], 0, "{v7}");
}

/// The encrypted volume's commands without NBD clients: a snapshot of a
/// stopped volume needs the repository's password (a wrong one reads
/// nothing), restores as the image (zeros here), and `volume stats` and
/// `list` need no password; a plain volume copied into an encrypted
/// repository is refused.
#[test]
fn encrypted_volumes_need_the_password() {
    let r = Repo::with_init(&["--encrypt"], Some("pw"));
    let c = r.json(&["volume", "create", "v", "--size", "4M"]);
    assert_eq!(c["encrypted"], true, "{c}");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.path.join("volumes/v/volume.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["format"], 2, "{cfg}");
    let mut wrong = r.cmd(&["volume", "snapshot", "v"]);
    wrong.env("STRATA_PASSWORD", "wrong");
    let o = wrong.output().unwrap();
    assert!(!o.status.success(), "a snapshot with a wrong password");
    let snap = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(snap["logical_bytes"], 4 << 20, "{snap}");
    let t = r.scratch("t");
    r.restore("volume:v@latest", &t);
    assert!(std::fs::read(t.join("v.img")).unwrap() == vec![0u8; 4 << 20]);
    for args in [
        &["--json", "volume", "stats", "v"][..],
        &["--json", "volume", "list"][..],
    ] {
        let mut c = r.cmd(args);
        c.env_remove("STRATA_PASSWORD");
        c.stdin(Stdio::null());
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let v = if v.is_array() { v[0].clone() } else { v };
        assert_eq!(v["encrypted"], true, "{args:?}: {v}");
    }
    // A volume made in an unencrypted repository, copied in.
    let plain = new_volume("4M");
    let from = plain.path.join("volumes/v");
    let to = r.path.join("volumes/p");
    std::fs::create_dir(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let run = r.run(&["volume", "snapshot", "p"]).expect_code(1);
    assert!(
        run.stderr.contains("not encrypted, but its repository is"),
        "{}",
        run.stderr
    );
}

/// In an encrypted repository a volume is encrypted (its blocks,
/// journal and fingerprints; the key from the repository's password): real
/// clients write and read it, snapshots of it served and stopped restore
/// exactly, a kill -9 replays its journal, none of its files holds the
/// image's bytes, and a wrong password opens nothing.
#[test]
fn an_encrypted_repository_gets_encrypted_volumes() {
    if !have("nbdcopy") || !have("qemu-img") {
        return;
    }
    let r = Repo::with_init(&["--encrypt"], Some("pw"));
    let c = r.json(&["volume", "create", "v", "--size", "64M"]);
    assert_eq!(c["encrypted"], true, "{c}");
    let s = serve(&r, "v");
    let data = copy_in_image(&r, &s);
    let live = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(live["read_bytes"], 8 << 20, "what was written: {live}");
    // Written, flushed, the server killed: the journal holds the write.
    let patch = r.scratch("patch.raw");
    qemu_write_start(&s, &patch, 21);
    kill9(s);
    let mut want = data.clone();
    want[..64 << 10].copy_from_slice(&prng(21, 64 << 10));
    // No file of the volume holds a stretch of the image in plain.
    let dir = r.dir().join("repo/volumes/v");
    let probes = [&data[100 << 10..][..64], &want[1000..1064]];
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        if !e.file_type().unwrap().is_file() {
            continue; // the control socket
        }
        let p = e.path();
        let b = std::fs::read(&p).unwrap();
        for probe in probes {
            assert!(
                !b.windows(probe.len()).any(|w| w == probe),
                "{} holds the image's bytes in plain",
                p.display()
            );
        }
    }
    // A wrong password opens neither the repository nor the volume.
    let mut bad = r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0"]);
    bad.env("STRATA_PASSWORD", "wrong");
    let o = bad.output().unwrap();
    assert!(!o.status.success(), "served with a wrong password");
    // Stopped (the journal replayed here): the write is in.
    let v2 = r.json(&["volume", "snapshot", "v"]);
    assert_eq!(v2["version"], 2, "{v2}");
    let t = r.scratch("t");
    r.restore("volume:v@latest", &t);
    assert!(
        std::fs::read(t.join("v.img")).unwrap() == want,
        "after the kill"
    );
    // Served again: read back through a client.
    let s = serve(&r, "v");
    let back = r.scratch("back.raw");
    sh(Command::new("nbdcopy").arg(&s.url).arg(&back));
    assert!(std::fs::read(&back).unwrap() == want, "read back over NBD");
    stop(s);
}

/// `volume create --from`: a raw image (file or standard input) fills the
/// new volume, thin and deduplicated; its snapshot restores the image
/// byte for byte, and a snapshot comes back as a volume through `dump`.
/// An image larger than `--size` is refused and leaves no volume.
#[test]
fn a_volume_is_made_from_an_image_or_a_snapshot() {
    for encrypt in [false, true] {
        let r = match encrypt {
            true => Repo::with_init(&["--encrypt"], Some("pw")),
            false => Repo::new(),
        };
        // 6 MiB and a partial block: data, 2 MiB of zeros, the first
        // MiB again (a duplicate run), data.
        let mut img = prng(3, 1 << 20);
        img.extend(vec![0u8; 2 << 20]);
        img.extend_from_within(..1 << 20);
        img.extend(prng(4, (2 << 20) + 100));
        let c = create_from(&r, &img);
        assert_eq!(c["size"], (6 << 20) + 4096, "{c}");
        assert_eq!(c["imported_bytes"], img.len(), "{c}");
        assert_eq!(c["written_bytes"], (4 << 20) + 4096, "{c}");
        assert_eq!(c["encrypted"], encrypt, "{c}");
        let st = r.json(&["volume", "stats", "v"]);
        assert_eq!(st["logical_blocks_written"], 1025, "{st}");
        assert_eq!(st["physical_blocks_written"], 1025 - 256, "{st}");
        r.json(&["volume", "snapshot", "v"]);
        let t = r.scratch("t");
        r.restore("volume:v@latest", &t);
        let mut want = img.clone();
        want.resize((6 << 20) + 4096, 0);
        assert!(std::fs::read(t.join("v.img")).unwrap() == want);
        // The snapshot back into a volume of its own, through a pipe.
        let dump = r
            .cmd(&["dump", "volume:v@latest", "v.img"])
            .output()
            .unwrap();
        assert!(dump.status.success());
        let size = ((8 << 20) as u64).to_string();
        let c2 = r
            .run_stdin(
                &[
                    "--json", "volume", "create", "w", "--size", &size, "--from", "-",
                ],
                &dump.stdout,
            )
            .ok()
            .json();
        assert_eq!(c2["imported_bytes"], want.len(), "{c2}");
        // A stream shorter than the volume may have been cut: said.
        let short = r
            .run_stdin(
                &["volume", "create", "y", "--size", &size, "--from", "-"],
                &dump.stdout[..1 << 20],
            )
            .ok();
        assert!(
            short.stderr.contains("standard input ended after 1 MiB"),
            "{}",
            short.stderr
        );
        r.json(&["volume", "delete", "y", "--yes"]);
        r.json(&["volume", "snapshot", "w"]);
        let t2 = r.scratch("t2");
        r.restore("volume:w@latest", &t2);
        want.resize(8 << 20, 0);
        assert!(std::fs::read(t2.join("w.img")).unwrap() == want);
        // Too large for the size given: refused, nothing left behind.
        let src = r.dir().join("disk.raw");
        let run = r
            .run(&[
                "volume",
                "create",
                "x",
                "--size",
                "1M",
                "--from",
                src.to_str().unwrap(),
            ])
            .expect_code(1);
        assert!(
            run.stderr.contains("larger than the volume"),
            "{}",
            run.stderr
        );
        assert!(!r.path.join("volumes/x").exists());
        // Standard input needs a size.
        let run = r.run_stdin(&["volume", "create", "y", "--from", "-"], b"abc");
        let run = run.expect_code(1);
        assert!(run.stderr.contains("give --size"), "{}", run.stderr);
    }
}

/// `volume check --read-data` finds a block changed on the host's disk
/// (exit code 1, the logical block named); without `--read-data` only the
/// files' agreement is checked.
#[test]
fn volume_check_finds_a_changed_block() {
    use std::os::unix::fs::FileExt;
    let r = Repo::new();
    create_from(&r, &prng(9, 1 << 20));
    let ok = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(ok["problems"], serde_json::json!([]), "{ok}");
    assert_eq!(ok["blocks_verified"], 256, "{ok}");
    let data = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.path.join("volumes/v/data"))
        .unwrap();
    let mut b = [0u8; 1];
    data.read_exact_at(&mut b, 7 * 4096).unwrap();
    data.write_all_at(&[!b[0]], 7 * 4096).unwrap();
    r.json(&["volume", "check", "v"]);
    let run = r
        .run(&["volume", "check", "v", "--read-data"])
        .expect_code(1);
    let text = run.out();
    assert!(
        text.contains("do not match their fingerprints") && text.contains(": 7"),
        "{text}"
    );
}

/// An import is made under another name and renamed when done: a stopped
/// one (left as `.NAME.import`) is neither listed nor in the way of the
/// next, and a directory of the name that is not a volume is left alone.
/// A pipe is read to its end (`--size` given).
#[test]
fn an_import_leaves_nothing_half_made() {
    let r = Repo::new();
    let src = r.scratch("disk.raw");
    std::fs::write(&src, prng(5, 256 << 10)).unwrap();
    let src = src.to_str().unwrap();
    r.json(&["volume", "create", "a", "--size", "1M"]);
    // What a kill of `volume create b --from` leaves.
    let stale = r.path.join("volumes/.b.import");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("volume.json"), b"{}").unwrap();
    let list = r.json(&["volume", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    r.json(&["volume", "create", "b", "--from", src]);
    assert!(!stale.exists());
    // Made twice: refused before the source is read, saying what to do.
    let run = r
        .run(&["volume", "create", "b", "--from", "/nonexistent"])
        .expect_code(1);
    assert!(
        run.stderr.contains("already exists") && run.stderr.contains("volume delete b"),
        "{}",
        run.stderr
    );
    // Not a volume, but someone's directory.
    let mine = r.path.join("volumes/c");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"keep").unwrap();
    let run = r
        .run(&["volume", "create", "c", "--from", src])
        .expect_code(1);
    assert!(run.stderr.contains("renaming"), "{}", run.stderr);
    assert_eq!(std::fs::read(mine.join("notes.txt")).unwrap(), b"keep");
    assert!(!r.path.join("volumes/.c.import").exists());
    // A named pipe.
    let fifo = r.scratch("pipe");
    let ok = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(ok.success());
    let (f2, data) = (fifo.clone(), prng(6, 300_000));
    let want = data.clone();
    let writer = std::thread::spawn(move || std::fs::write(f2, data).unwrap());
    let c = r.json(&[
        "volume",
        "create",
        "d",
        "--size",
        "1M",
        "--from",
        fifo.to_str().unwrap(),
    ]);
    writer.join().unwrap();
    assert_eq!(c["imported_bytes"], want.len(), "{c}");
    r.json(&["volume", "snapshot", "d"]);
    let t = r.scratch("t");
    r.restore("volume:d@latest", &t);
    let got = std::fs::read(t.join("d.img")).unwrap();
    assert!(got[..want.len()] == want[..] && got[want.len()..].iter().all(|&x| x == 0));
}

/// `volume resize`: larger at once, smaller only with `--shrink`; a
/// snapshot after it has the new size and the old data.
#[test]
fn a_volume_is_resized() {
    let r = Repo::new();
    let img = prng(8, 3 << 20);
    create_from(&r, &img);
    let g = r.json(&["volume", "resize", "v", "--size", "8M"]);
    assert_eq!(
        (g["old_size"].as_u64(), g["size"].as_u64()),
        (Some(3 << 20), Some(8 << 20))
    );
    let run = r
        .run(&["volume", "resize", "v", "--size", "1M"])
        .expect_code(1);
    assert!(run.stderr.contains("--shrink"), "{}", run.stderr);
    r.json(&["volume", "resize", "v", "--size", "2M", "--shrink"]);
    r.json(&["volume", "snapshot", "v"]);
    let t = r.scratch("t");
    r.restore("volume:v@latest", &t);
    assert!(std::fs::read(t.join("v.img")).unwrap() == img[..2 << 20]);
    let list = r.json(&["volume", "list"]);
    assert_eq!(list[0]["size"], 2 << 20, "{list}");
}

/// `volume defrag`: the volume written again in block order reads back
/// the same (plain and encrypted), keeps its set of segments changed
/// since the last snapshot, checks clean, is refused while served, and a
/// killed defrag's leftover is removed by the next one.
/// A new repository, encrypted (password `pw`) or not.
fn repo(encrypted: bool) -> Repo {
    match encrypted {
        true => Repo::with_init(&["--encrypt"], Some("pw")),
        false => Repo::with_init(&[], None),
    }
}

/// Whether the file system under `dir` swaps two directories in one
/// step (`renameat2` with `RENAME_EXCHANGE`), which defrag needs.
fn can_exchange(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (dir.join("xa"), dir.join("xb"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes()).unwrap();
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: two NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    let _ = (std::fs::remove_dir(&a), std::fs::remove_dir(&b));
    if r != 0 {
        eprintln!(
            "renameat2(RENAME_EXCHANGE) fails here ({}): skipping",
            std::io::Error::last_os_error()
        );
    }
    r == 0
}

#[test]
fn a_volume_is_defragmented() {
    if !have("qemu-img") || !can_exchange(&Repo::new().scratch("x")) {
        return;
    }
    for encrypted in [false, true] {
        let r = repo(encrypted);
        let mut img = prng(21, 8 << 20);
        let pat = img[..1 << 20].to_vec();
        img[4 << 20..5 << 20].copy_from_slice(&pat);
        create_from(&r, &img);
        r.json(&["volume", "snapshot", "v"]);
        // Overwritten in place by a client: new blocks at the log's end.
        let s = serve(&r, "v");
        let patch = r.scratch("patch.raw");
        let p = qemu_write_start(&s, &patch, 22);
        img[..p.len()].copy_from_slice(&p);
        // Refused while served, and the volume untouched.
        let run = r.run(&["volume", "defrag", "v"]).expect_code(1);
        assert!(run.stderr.contains("in use"), "{}", run.stderr);
        stop(s);
        // Another defrag under way: refused, nothing touched.
        {
            use std::os::fd::AsRawFd;
            let held = std::fs::File::create(r.path.join("volumes/.v.defrag.lock")).unwrap();
            // SAFETY: flock on a descriptor we own.
            assert_eq!(
                unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
                0
            );
            let run = r.run(&["volume", "defrag", "v"]).expect_code(1);
            assert!(run.stderr.contains("under way"), "{}", run.stderr);
        }
        // A defrag killed earlier left its copy.
        let left = r.path.join("volumes/.v.defrag");
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("data"), b"half a copy").unwrap();
        let before = r.json(&["volume", "stats", "v"]);
        let mtime = || {
            std::fs::metadata(r.path.join("volumes/v/volume.json"))
                .unwrap()
                .modified()
                .unwrap()
        };
        let t0 = mtime();
        let d = r.json(&["volume", "defrag", "v"]);
        assert_eq!(
            d["blocks_in_use_before"], before["physical_blocks_in_use"],
            "{d}"
        );
        assert_eq!(mtime(), t0, "volume.json's time is kept");
        // The overwritten start lay at the data file's end; now in order.
        let (was, now) = (
            d["in_order_before"].as_f64().unwrap(),
            d["in_order"].as_f64().unwrap(),
        );
        assert!(was < 1.0 && now > 0.99 && now > was, "{d}");
        // 8 MiB with 1 MiB twice: 7 MiB of blocks, and the patch's 64 KiB
        // (the first MiB's copy at 4 MiB keeps its start).
        let blocks = d["blocks_in_use"].as_u64().unwrap();
        assert!((7 * 256..=7 * 256 + 16).contains(&blocks), "{d}");
        assert!(!left.exists(), "the leftover copy is removed");
        let list = r.json(&["volume", "list"]);
        assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
        // The data file holds the volume front to back now.
        let st = r.json(&["volume", "stats", "v"]);
        assert_eq!(st["data_file_blocks"].as_u64(), Some(blocks), "{st}");
        assert_eq!(st["encrypted"], encrypted, "{st}");
        r.json(&["volume", "check", "v", "--read-data"]);
        // Only the segment written since the last snapshot is read.
        let snap = r.json(&["volume", "snapshot", "v"]);
        assert_eq!(snap["read_bytes"], 2 << 20, "{snap}");
        let t = r.scratch("t");
        r.restore("volume:v@latest", &t);
        assert!(
            std::fs::read(t.join("v.img")).unwrap() == img,
            "restored after defrag (encrypted: {encrypted})"
        );
        // Everything read from the copy: the whole image is there.
        let all = r.json(&["volume", "snapshot", "v", "--read-all"]);
        assert_eq!(all["read_bytes"], 8 << 20, "{all}");
        assert_eq!(all["new_raw_bytes"], 0, "the same image: {all}");
        let t = r.scratch("t-all");
        r.restore("volume:v@latest", &t);
        assert!(std::fs::read(t.join("v.img")).unwrap() == img);
        // A damaged block is not copied as a good one.
        let data = r.path.join("volumes/v/data");
        let mut bytes = std::fs::read(&data).unwrap();
        bytes[4096 * 100] ^= 1;
        std::fs::write(&data, &bytes).unwrap();
        // (Refused by the check, or before it: a version links to the
        // damaged block, so it cannot be stored in the repository again.)
        let run = r.run(&["volume", "defrag", "v"]).expect_code(1);
        assert!(
            run.stderr.contains("volume check") || run.stderr.contains("no longer hold"),
            "{}",
            run.stderr
        );
        assert!(!r.path.join("volumes/.v.defrag").exists());
        r.json(&["volume", "delete", "v", "--yes"]);
        assert!(!r.path.join("volumes/.v.defrag.lock").exists());
    }
}

/// `volume copy`: a stopped volume copied into a new, independent one
/// (its own key in an encrypted repository); refused onto an existing
/// name and while the source is served.
#[test]
fn a_volume_is_copied() {
    for encrypted in [false, true] {
        let r = repo(encrypted);
        let mut img = prng(31, 6 << 20);
        img[2 << 20..3 << 20].fill(0);
        create_from(&r, &img);
        let c = r.json(&["volume", "copy", "v", "w"]);
        assert_eq!(c["size"], 6 << 20, "{c}");
        assert_eq!(c["written_bytes"], 5 << 20, "zeros not written: {c}");
        assert_eq!(c["read_bytes"], 5 << 20, "the unwritten MiB not read: {c}");
        let cfg = |n: &str| -> serde_json::Value {
            serde_json::from_slice(
                &std::fs::read(r.path.join(format!("volumes/{n}/volume.json"))).unwrap(),
            )
            .unwrap()
        };
        assert_eq!(cfg("w")["threshold"], cfg("v")["threshold"]);
        if encrypted {
            assert!(!cfg("w")["encryption"].is_null());
            assert_ne!(
                cfg("w")["encryption"],
                cfg("v")["encryption"],
                "a key of its own"
            );
        }
        r.json(&["volume", "snapshot", "w"]);
        let t = r.scratch("t");
        r.restore("volume:w@latest", &t);
        assert!(std::fs::read(t.join("w.img")).unwrap() == img, "the copy");
        let run = r.run(&["volume", "copy", "v", "w"]).expect_code(1);
        assert!(run.stderr.contains("exists already"), "{}", run.stderr);
        if !encrypted && have("qemu-img") {
            // Independent: a write to the copy leaves the source as it was.
            let s = serve(&r, "w");
            qemu_write_start(&s, &r.scratch("patch.raw"), 32);
            // The source served: refused.
            let sv = serve(&r, "v");
            let run = r.run(&["volume", "copy", "v", "x"]).expect_code(1);
            assert!(run.stderr.contains("in use"), "{}", run.stderr);
            stop(sv);
            stop(s);
            r.json(&["volume", "snapshot", "v"]);
            let t = r.scratch("tv");
            r.restore("volume:v@latest", &t);
            assert!(std::fs::read(t.join("v.img")).unwrap() == img, "the source");
            let list = r.json(&["volume", "list"]);
            assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
        }
    }
}

/// The volume's file system fills while a client writes: the writes that
/// cannot be kept get an error (ENOSPC, or EIO once destaging has
/// failed), reads go on, the server still stops on SIGTERM saying why,
/// and once space is freed the volume opens again (its journal replayed)
/// with every write that a successful FLUSH covered, and checks clean.
#[test]
fn a_full_disk_fails_writes_and_loses_no_flushed_one() {
    let Some((mnt, r)) = repo_on_tmpfs("strata-e2e-volfull-", 40) else {
        return;
    };
    r.json(&["init"]);
    r.json(&["volume", "create", "v", "--size", "64M"]);
    let mut s = serve(&r, "v");
    // Its stderr read as it comes (a full pipe would stop the server).
    let mut err_pipe = s.child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut e = String::new();
        let _ = err_pipe.read_to_string(&mut e);
        e
    });
    let mut c = nbd_handshake(&s.addr, "v");
    let mut handle = 0u64;
    let mut write =
        |c: &mut TcpStream, off: u64, data: &[u8]| write_flushed(c, &mut handle, off, data);
    // 8 MiB written and flushed while there is room.
    let first = prng(1, 8 << 20);
    for (k, chunk) in first.chunks(1 << 20).enumerate() {
        assert_eq!(write(&mut c, (k as u64) << 20, chunk), (0, 0), "chunk {k}");
    }
    // Then the disk fills, all but 6 MiB.
    fill_filesystem(&mnt.0.join("filler"), 6 << 20);
    let mut kept = Vec::new();
    let mut failed = None;
    for k in 16..56u64 {
        let chunk = prng(100 + k, 1 << 20);
        match write(&mut c, k << 20, &chunk) {
            (0, 0) => kept.push((k, chunk)),
            e => {
                failed = Some(e);
                break;
            }
        }
    }
    let (w, f) = failed.expect("40 MiB written to 6 MiB of free space without an error");
    let code = if w != 0 { w } else { f };
    eprintln!(
        "{} MiB kept after the fill, then error {w}/{f} (write/flush)",
        kept.len()
    );
    assert_eq!(code, 28, "error {code} (ENOSPC expected)");
    // Reads go on, on this connection and a new one.
    let mut back = vec![0u8; 1 << 20];
    for conn in [&mut c, &mut nbd_handshake(&s.addr, "v")] {
        handle += 1;
        request(conn, 0, handle, 3 << 20, 1 << 20);
        assert_eq!(reply(conn), (0, handle));
        conn.read_exact(&mut back).unwrap();
        assert!(
            back == first[3 << 20..4 << 20],
            "read after the disk filled"
        );
    }
    drop(c);
    // SIGTERM: the server ends (what it could not write stays in its
    // journal), saying why if it could not close cleanly.
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(
        &mut s.child,
        Duration::from_secs(60),
        "the server after SIGTERM",
    );
    let err = stderr.join().unwrap();
    // What it could not destage (the journal filled the disk) it says.
    assert!(!status.success(), "{err}");
    assert!(err.contains("No space left"), "{err}");
    assert!(err.contains("free some space, then serve"), "{err}");
    drop(s);
    // Space freed: everything flushed is there.
    std::fs::remove_file(mnt.0.join("filler")).unwrap();
    let s = serve(&r, "v");
    let got = nbd_read(&s, 0, 64 << 20);
    assert!(got[..8 << 20] == first[..], "first 8 MiB after the restart");
    for (k, chunk) in &kept {
        let at = (*k as usize) << 20;
        assert!(
            got[at..at + (1 << 20)] == chunk[..],
            "flushed chunk {k} lost"
        );
    }
    stop(s);
    let v = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");
    // Unmounted before the repository's directory is removed.
    drop(mnt);
}

/// A repository directory on a tmpfs of `mib` MiB (none where mounting is
/// not allowed), and the mount (unmounted when dropped).
fn repo_on_tmpfs(prefix: &str, mib: u32) -> Option<(Tmpfs, Repo)> {
    let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let mnt = Tmpfs::mount(&tmp.path().join("mnt"), mib)?;
    let r = Repo {
        path: mnt.0.join("repo"),
        tmp,
        password: None,
    };
    Some((mnt, r))
}

/// NBD WRITE of `data` at `off`, then FLUSH: (error of the write, error
/// of the flush after it).
fn write_flushed(c: &mut TcpStream, handle: &mut u64, off: u64, data: &[u8]) -> (u32, u32) {
    *handle += 1;
    request(c, 1, *handle, off, data.len() as u32);
    c.write_all(data).unwrap();
    let (w, h) = reply(c);
    assert_eq!(h, *handle);
    if w != 0 {
        return (w, 0);
    }
    *handle += 1;
    request(c, 3, *handle, 0, 0);
    let (f, h) = reply(c);
    assert_eq!(h, *handle);
    (0, f)
}

/// A disk that fills pauses a volume's writes, not the volume: writes get
/// ENOSPC while the disk has no room for the batch the volume holds, and
/// once space is freed the same server takes writes again — no restart,
/// every flushed write kept — and closes cleanly.
#[test]
fn a_full_disk_pauses_writes_until_space_is_freed() {
    let Some((mnt, r)) = repo_on_tmpfs("strata-e2e-volpause-", 40) else {
        return;
    };
    r.json(&["init"]);
    r.json(&["volume", "create", "v", "--size", "64M"]);
    let mut s = serve(&r, "v");
    let mut c = nbd_handshake(&s.addr, "v");
    let mut h = 0u64;
    let mut want = vec![0u8; 64 << 20];
    let first = prng(1, 4 << 20);
    assert_eq!(write_flushed(&mut c, &mut h, 0, &first), (0, 0));
    want[..4 << 20].copy_from_slice(&first);
    // (Destaged before the disk fills.)
    wait_until(Duration::from_secs(30), "the first batch", || {
        std::thread::sleep(Duration::from_millis(100));
        r.json(&["volume", "stats", "v"])["data_file_blocks"] == 1024
    });
    // The disk fills, all but 6 MiB; then 4 MiB is written and flushed:
    // it fits in the journal (which acknowledges it) but not also in the
    // data file, so its batch waits and the next write is refused.
    fill_filesystem(&mnt.0.join("filler"), 6 << 20);
    let big = prng(2, 4 << 20);
    assert_eq!(write_flushed(&mut c, &mut h, 8 << 20, &big), (0, 0));
    want[8 << 20..12 << 20].copy_from_slice(&big);
    std::thread::sleep(Duration::from_millis(1500));
    let (k, chunk) = (20u64, prng(3, 1 << 20));
    let e = write_flushed(&mut c, &mut h, k << 20, &chunk);
    assert!(
        e == (28, 0) || e == (0, 28),
        "error {e:?} (ENOSPC expected)"
    );
    // Reads go on meanwhile, the waiting batch's included; `stats` says
    // why writes are refused.
    assert!(
        nbd_read(&s, 0, 16 << 20) == want[..16 << 20],
        "read while full"
    );
    let st = r.json(&["volume", "stats", "v"]);
    let waiting = &st["waiting_for_space_bytes"];
    assert!(waiting.as_u64().unwrap_or(0) > 4 << 20, "{st}");
    let text = String::from_utf8(r.run(&["volume", "stats", "v"]).ok().stdout).unwrap();
    assert!(text.contains("writes paused"), "{text}");
    // Not one free byte left: the live figures are still written (over
    // their own bytes), so `stats` goes on counting the reads served.
    fill_filesystem(&mnt.0.join("filler2"), 0);
    fill_to_the_last_byte(&mnt.0.join("filler3"));
    // (Counted from what was saved once the disk was full: the reads
    // before are in it by now.)
    std::thread::sleep(Duration::from_millis(1200));
    let live = r.path.join("volumes/v/live.json");
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&live).unwrap());
    let reads = r.json(&["volume", "stats", "v"])["reads"].as_u64().unwrap();
    assert!(
        nbd_read(&s, 0, 4 << 20) == want[..4 << 20],
        "read on a full disk"
    );
    wait_until(
        Duration::from_secs(10),
        "live figures on a full disk",
        || {
            std::thread::sleep(Duration::from_millis(200));
            let st = r.json(&["volume", "stats", "v"]);
            st["reads"].as_u64().unwrap() >= reads + 4 && st["waiting_for_space_bytes"] == *waiting
        },
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&live).unwrap()),
        inode,
        "live.json written over its own bytes"
    );
    std::fs::remove_file(mnt.0.join("filler2")).unwrap();
    std::fs::remove_file(mnt.0.join("filler3")).unwrap();
    // Space freed: the refused write is taken once the batch the volume
    // holds has reached the disk.
    std::fs::remove_file(mnt.0.join("filler")).unwrap();
    let t0 = Instant::now();
    loop {
        match write_flushed(&mut c, &mut h, k << 20, &chunk) {
            (0, 0) => break,
            e if t0.elapsed() < Duration::from_secs(30) => {
                assert!(e == (28, 0) || e == (0, 28), "error {e:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
            e => panic!("writes did not resume after space was freed: {e:?}"),
        }
    }
    want[(k as usize) << 20..][..1 << 20].copy_from_slice(&chunk);
    let more = prng(300, 2 << 20);
    assert_eq!(write_flushed(&mut c, &mut h, 60 << 20, &more), (0, 0));
    want[60 << 20..62 << 20].copy_from_slice(&more);
    drop(c);
    assert!(
        nbd_read(&s, 0, 64 << 20) == want,
        "read back after the pause"
    );
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut s.child, Duration::from_secs(60), "the server");
    assert!(status.success(), "closed cleanly after the pause");
    drop(s);
    let st = r.json(&["volume", "stats", "v"]);
    assert_eq!(st["waiting_for_space_bytes"], 0, "{st}");
    let v = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");
    drop(mnt);
}

/// Writes `file` a block at a time until the file system holding it has
/// no free block left (checked).
fn fill_to_the_last_byte(file: &std::path::Path) {
    let mut f = std::fs::File::create(file).unwrap();
    loop {
        match f.write(&[0x5a; 4096]) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the file system: {e}"),
        }
    }
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs of a path we own into a zeroed struct.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_bavail, 0, "the file system is full");
}

/// `len` bytes from `off` of the served volume, read over one connection
/// in 1 MiB requests.
fn nbd_read(s: &Served, off: u64, len: usize) -> Vec<u8> {
    let mut c = nbd_handshake(&s.addr, "v");
    let mut out = vec![0u8; len];
    for (k, dst) in out.chunks_mut(1 << 20).enumerate() {
        let h = 1000 + k as u64;
        request(&mut c, 0, h, off + ((k as u64) << 20), dst.len() as u32);
        assert_eq!(reply(&mut c), (0, h));
        c.read_exact(dst).unwrap();
    }
    out
}

/// Under a seccomp filter that kills the process on `cachestat(2)` (as a
/// hardened service's filter may for a call it does not know), the server
/// never makes that call: it tells page-cache misses by reading with
/// `RWF_NOWAIT` instead, and serves every read.
#[test]
fn a_seccomp_filter_does_not_end_the_server() {
    use std::os::unix::process::CommandExt;
    let r = Repo::new();
    let data = prng(5, 4 << 20);
    create_from(&r, &data);
    let mut c = r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]);
    // SAFETY: between fork and exec only prctl is called, with a filter
    // program that lives on this stack frame until the call returns.
    unsafe {
        c.pre_exec(|| {
            const CACHESTAT: u32 = 451;
            let prog = [
                // A = seccomp_data.nr
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 0,
                },
                // if A == cachestat: kill, else allow
                libc::sock_filter {
                    code: 0x15,
                    jt: 0,
                    jf: 1,
                    k: CACHESTAT,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: libc::SECCOMP_RET_KILL_PROCESS,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: libc::SECCOMP_RET_ALLOW,
                },
            ];
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let s = serve_cmd(c);
    let got = nbd_read(&s, 0, data.len());
    assert!(got == data, "reads under the filter");
    // Still there: SIGTERM closes it cleanly.
    stop(s);
    // And it said how it told misses.
    let st = r.json(&["volume", "stats", "v"]);
    assert_eq!(st["readahead_miss_probe"], "read-nowait", "{st}");
    let s = serve(&r, "v");
    nbd_read(&s, 0, 1 << 20);
    stop(s);
    let st = r.json(&["volume", "stats", "v"]);
    let probe = st["readahead_miss_probe"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        ["cachestat", "read-nowait", "off"].contains(&probe.as_str()),
        "{st}"
    );
}

/// A FUSE mount of a served volume by nbdfuse, unmounted when dropped.
struct NbdFuse {
    mnt: std::path::PathBuf,
    child: Child,
}

impl Drop for NbdFuse {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&self.mnt)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nbdfuse shows the served volume as a file: what a program writes into
/// it and syncs reads back through the file and from the server, two
/// copies of the same data are deduplicated, and the volume checks clean.
#[test]
fn nbdfuse_shows_the_volume_as_a_file() {
    use std::os::unix::fs::FileExt;
    if !have("nbdfuse") || !have("fusermount3") {
        return;
    }
    let r = new_volume("16M");
    let s = serve(&r, "v");
    let mnt = r.scratch("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let pidfile = r.scratch("nbdfuse.pid");
    let child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&mnt)
        .arg(&s.url)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut fuse = NbdFuse {
        mnt: mnt.clone(),
        child,
    };
    // Ready once it writes its pid; an exit first means no FUSE here.
    let t = Instant::now();
    while !pidfile.exists() {
        if let Some(st) = fuse.child.try_wait().unwrap() {
            let mut e = String::new();
            let _ = fuse.child.stderr.take().unwrap().read_to_string(&mut e);
            eprintln!("SKIPPED: nbdfuse cannot mount here ({st}): {e}");
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nbdfuse did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let file = mnt.join("nbd");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    assert_eq!(f.metadata().unwrap().len(), 16 << 20);
    let data = prng(11, 1 << 20);
    f.write_all_at(&data, 2 << 20).unwrap();
    f.write_all_at(&data, 8 << 20).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; 1 << 20];
    f.read_exact_at(&mut back, 8 << 20).unwrap();
    assert!(back == data, "read back through the file");
    drop(f);
    let img = nbd_read(&s, 0, 16 << 20);
    assert!(img[2 << 20..3 << 20] == data[..] && img[8 << 20..9 << 20] == data[..]);
    assert!(
        img[..2 << 20].iter().all(|&b| b == 0),
        "nothing else written"
    );
    drop(fuse);
    stop(s);
    let st = r.json(&["volume", "stats", "v"]);
    assert!(st["dedup_ratio"].as_f64().unwrap() > 1.9, "{st}");
    let v = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");
}

/// A sparse image file and a mostly empty volume are copied without
/// reading their holes (`volume create --from`, `volume copy`): a 1 GiB
/// image with 1 MiB and 4 KiB of data reads about that, and the copies
/// hold the image exactly.
#[test]
fn holes_are_not_read_by_an_import_or_a_copy() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let r = Repo::with_init(&[], None);
    let src = r.scratch("sparse.raw");
    let len = (1u64 << 30) + 512;
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(len).unwrap();
    let (a, b) = (prng(41, 1 << 20), prng(42, 4096));
    f.write_all_at(&a, 0).unwrap();
    f.write_all_at(&b, (600 << 20) + 4096).unwrap();
    drop(f);
    let sparse = std::fs::metadata(&src).unwrap().blocks() * 512 < 16 << 20;
    let c = r.json(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    assert_eq!(c["imported_bytes"], len, "{c}");
    assert_eq!(c["written_bytes"], (1 << 20) + 4096, "{c}");
    if sparse {
        assert!(
            c["read_bytes"].as_u64().unwrap() <= 3 << 20,
            "holes not read: {c}"
        );
    } else {
        eprintln!("the file system does not keep the image sparse: every byte read");
    }
    let w = r.json(&["volume", "copy", "v", "w"]);
    assert_eq!(w["size"], len.div_ceil(4096) * 4096, "{w}");
    assert_eq!(w["read_bytes"], 2 << 20, "two MiB with data read: {w}");
    assert_eq!(w["written_bytes"], (1 << 20) + 4096, "{w}");
    r.json(&["volume", "snapshot", "w"]);
    let t = r.scratch("t");
    r.restore("volume:w@latest", &t);
    let got = std::fs::File::open(t.join("w.img")).unwrap();
    assert_eq!(got.metadata().unwrap().len(), len.div_ceil(4096) * 4096);
    let mut buf = vec![0u8; 1 << 20];
    got.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == a, "the first MiB");
    got.read_exact_at(&mut buf[..4096], (600 << 20) + 4096)
        .unwrap();
    assert!(buf[..4096] == b[..], "the block at 600 MiB");
    got.read_exact_at(&mut buf, 300 << 20).unwrap();
    assert!(buf.iter().all(|&x| x == 0), "a hole reads as zeros");
    r.json(&["volume", "check", "w", "--read-data"]);
}

/// `--volumes-dir` (`$STRATA_VOLUMES_DIR`) keeps a local repository's
/// volumes elsewhere (a fast disk beside a repository on a slow one):
/// made, listed, snapshotted into the repository and restored from it;
/// the directory is bound to the repository, so another one is refused.
#[test]
fn volumes_elsewhere_than_the_repository() {
    let r = Repo::with_init(&[], None);
    let fast = r.dir().join("fast");
    let src = r.scratch("disk.raw");
    let mut img = prng(11, 2 << 20);
    img.resize(8 << 20, 0);
    std::fs::write(&src, &img).unwrap();
    let with_env = |args: &[&str]| {
        let mut c = r.cmd(&[&["--json"], args].concat());
        c.env("STRATA_VOLUMES_DIR", &fast);
        run_cmd(c, None).ok().json()
    };
    with_env(&["volume", "create", "v", "--from", src.to_str().unwrap()]);
    assert!(fast.join("v/volume.json").exists());
    assert!(fast.join("repository.json").exists());
    assert!(!r.path.join("volumes/v").exists());
    let list = with_env(&["volume", "list"]);
    assert_eq!(list[0]["name"], "v", "{list}");
    // Without the directory, the repository's own (none).
    assert_eq!(r.json(&["volume", "list"]), serde_json::json!([]));
    let e = r.run(&["volume", "snapshot", "v"]).expect_code(1);
    assert!(e.stderr.contains("no volume"), "{}", e.stderr);
    // The flag, after the subcommand too.
    let s = r.json(&[
        "volume",
        "snapshot",
        "v",
        "--volumes-dir",
        fast.to_str().unwrap(),
    ]);
    assert_eq!(s["series"], "volume:v", "{s}");
    let t = r.dir().join("t");
    r.json(&[
        "restore",
        "volume:v@latest",
        "--target",
        t.to_str().unwrap(),
    ]);
    assert!(std::fs::read(t.join("v.img")).unwrap() == img);
    let other = Repo::with_init(&[], None);
    let e = other
        .run(&["volume", "--volumes-dir", fast.to_str().unwrap(), "list"])
        .expect_code(1);
    assert!(
        e.stderr.contains("belong to another repository"),
        "{}",
        e.stderr
    );
}

/// A volume that keeps disk blocks for the repository (a hold: linked
/// snapshots read them) is neither deleted nor defragmented, and says why.
#[test]
fn a_volume_holding_blocks_for_the_repository_is_kept() {
    let r = new_volume("1M");
    let dir = r.path.join("volumes/v");
    let holds = dir.join(strata_volume::holds::DIR);
    std::fs::create_dir_all(&holds).unwrap();
    std::fs::write(
        holds.join("c0ffee.hold"),
        strata_volume::holds::encode(&[(0, 1)]),
    )
    .unwrap();
    for args in [
        vec!["volume", "delete", "v", "--yes"],
        vec!["volume", "defrag", "v"],
    ] {
        let e = r.run(&args).expect_code(1);
        assert!(
            e.stderr.contains("keeps disk blocks"),
            "{args:?}: {}",
            e.stderr
        );
    }
    assert!(dir.join("volume.json").exists());
    std::fs::remove_file(holds.join("c0ffee.hold")).unwrap();
    r.json(&["volume", "delete", "v", "--yes"]);
    assert!(!dir.exists());
}
