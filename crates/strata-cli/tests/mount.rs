//! End-to-end test of `strata mount`: two versions of a tree backed up to
//! an encrypted repository, mounted, read back byte for byte, writes
//! refused, unmounted. Skipped (with a message) where FUSE is unavailable:
//! no /dev/fuse or no `fusermount3` (Debian package fuse3).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why FUSE cannot be used here, if it cannot.
fn fuse_missing() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
        .unwrap_or(false);
    if !on_path {
        return Some("fusermount3 is not on PATH (apt-get install fuse3)".into());
    }
    None
}

/// A running `strata mount`; unmounts and reaps it when dropped, so a
/// failing test leaves no mount behind.
struct Mounted {
    dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Mounted {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z", "--"])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every regular file and symlink below `root`, relative path → content
/// (a symlink's: "-> target").
fn snapshot_of(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {}: {e}", d.display())) {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                let mut v = b"-> ".to_vec();
                v.extend_from_slice(t.as_os_str().as_bytes());
                out.insert(rel, v);
            } else {
                let data = fs::read(e.path())
                    .unwrap_or_else(|err| panic!("read {}: {err}", e.path().display()));
                out.insert(rel, data);
            }
        }
    }
    out
}

fn assert_same(expected: &BTreeMap<PathBuf, Vec<u8>>, dir: &Path, what: &str) {
    let got = snapshot_of(dir);
    let names = |m: &BTreeMap<PathBuf, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&got), names(expected), "{what}: entries differ");
    for (p, data) in expected {
        assert!(
            got[p] == *data,
            "{what}: {} differs ({} bytes, expected {})",
            p.display(),
            got[p].len(),
            data.len()
        );
    }
}

/// `series/<name>` as the mount escapes a series name.
fn escaped(series: &str) -> String {
    series.replace('%', "%25").replace('/', "%2F")
}

#[test]
fn mount_shows_every_version_read_only() {
    if let Some(why) = fuse_missing() {
        eprintln!("skipping mount test: {why}");
        return;
    }
    let repo = Repo::with_init(&["--encrypt"], Some("mount test password"));
    let src = repo.dir().join("src");
    write(&src.join("small.txt"), b"hello from version one\n");
    write(&src.join("empty"), b"");
    let mut big = prng(1, 3 << 20);
    big[1 << 20..(1 << 20) + (300 << 10)].fill(0);
    write(&src.join("sub/big.bin"), &big);
    write(&src.join("sub/deeper/x"), &prng(2, 70_000));
    write(
        &src.join(OsStr::from_bytes(b"caf\xe9.txt")),
        b"latin-1 name",
    );
    std::os::unix::fs::symlink("sub/big.bin", src.join("link")).unwrap();
    fs::hard_link(src.join("small.txt"), src.join("hard.txt")).unwrap();
    let v1 = snapshot_of(&src);
    let b1 = repo.backup(&[&src], &[]);
    // Version 2: one file changed in the middle, one gone, one new.
    big[2_000_000..2_000_100].fill(7);
    write(&src.join("sub/big.bin"), &big);
    fs::remove_file(src.join("sub/deeper/x")).unwrap();
    write(&src.join("new.txt"), b"only in version two");
    let v2 = snapshot_of(&src);
    let b2 = repo.backup(&[&src], &[]);
    let series = b2["series"].as_str().expect("series in backup --json");
    assert_eq!(b2["version"], 2, "{b2}");

    let dir = repo.dir().join("mnt");
    fs::create_dir(&dir).unwrap();
    let log = repo.dir().join("mount.log");
    let mut cmd = repo.cmd(&["mount", dir.to_str().unwrap()]);
    cmd.stdout(fs::File::create(repo.dir().join("mount.out")).unwrap())
        .stderr(fs::File::create(&log).unwrap());
    let mut m = Mounted {
        dir: dir.clone(),
        child: Some(cmd.spawn().expect("spawn strata mount")),
        log,
    };
    let start = Instant::now();
    while !dir.join("series").is_dir() {
        if let Some(s) = m.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("strata mount exited ({s}) before mounting:\n{}", m.log());
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no mount after 30 s:\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let sdir = dir.join("series").join(escaped(series));
    let rel = src.strip_prefix("/").unwrap();
    assert_same(&v1, &sdir.join("1").join(rel), "version 1");
    assert_same(&v2, &sdir.join("2").join(rel), "version 2");
    assert_eq!(fs::read_link(sdir.join("latest")).unwrap(), Path::new("2"));
    assert_same(&v2, &sdir.join("latest").join(rel), "latest");
    let id1 = b1["id"].as_str().unwrap();
    assert_same(&v1, &dir.join("ids").join(&id1[..8]).join(rel), "ids/");

    // Metadata, hard links, random access.
    let tree1 = sdir.join("1").join(rel);
    let (orig, mounted) = (
        fs::metadata(src.join("small.txt")).unwrap(),
        fs::metadata(tree1.join("small.txt")).unwrap(),
    );
    assert_eq!(mounted.len(), orig.len());
    assert_eq!(mounted.mode() & 0o7777, orig.mode() & 0o7777);
    assert_eq!(mounted.mtime(), orig.mtime());
    let hard = fs::metadata(tree1.join("hard.txt")).unwrap();
    assert_eq!(hard.ino(), mounted.ino(), "a hard link is its file");
    let f = fs::File::open(sdir.join("2").join(rel).join("sub/big.bin")).unwrap();
    for off in [0u64, 999_999, 1 << 20, 2_000_050, (3 << 20) - 10] {
        let mut buf = vec![0u8; 100_000];
        let n = f.read_at(&mut buf, off).unwrap();
        let end = (off as usize + 100_000).min(big.len());
        assert!(buf[..n] == big[off as usize..end], "read at {off}");
    }

    // Read-only: every kind of change fails with EROFS.
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{what}: {e}");
    };
    erofs(fs::File::create(tree1.join("new")).map(|_| ()), "create");
    erofs(
        fs::OpenOptions::new()
            .write(true)
            .open(tree1.join("small.txt"))
            .map(|_| ()),
        "open for writing",
    );
    erofs(fs::create_dir(tree1.join("d")), "mkdir");
    erofs(fs::remove_file(tree1.join("small.txt")), "unlink");
    erofs(fs::create_dir(dir.join("series/x")), "mkdir in the layout");

    // Unmounted from outside: the command ends, exit 0.
    drop(f);
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "fusermount3 -u failed:\n{}", m.log());
    let mut child = m.child.take().unwrap();
    let code = exit_code(wait_timeout(
        &mut child,
        Duration::from_secs(10),
        "strata mount",
    ));
    assert_eq!(code, 0, "strata mount after unmount:\n{}", m.log());
    assert!(!m.log().contains("WARN"), "warnings:\n{}", m.log());
    assert!(!dir.join("series").exists());
}

/// SIGTERM unmounts and exits 0.
#[test]
fn mount_stops_cleanly_on_sigterm() {
    if let Some(why) = fuse_missing() {
        eprintln!("skipping mount test: {why}");
        return;
    }
    let repo = Repo::new();
    let src = repo.dir().join("src");
    write(&src.join("f"), b"x");
    repo.backup(&[&src], &[]);
    let dir = repo.dir().join("mnt");
    fs::create_dir(&dir).unwrap();
    let log = repo.dir().join("mount.log");
    let mut cmd = repo.cmd(&["mount", dir.to_str().unwrap()]);
    cmd.stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    let mut m = Mounted {
        dir: dir.clone(),
        child: Some(cmd.spawn().expect("spawn strata mount")),
        log,
    };
    let start = Instant::now();
    while !dir.join("ids").is_dir() {
        if let Some(s) = m.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("strata mount exited ({s}) before mounting:\n{}", m.log());
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{}", m.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut child = m.child.take().unwrap();
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let code = exit_code(wait_timeout(
        &mut child,
        Duration::from_secs(10),
        "strata mount",
    ));
    assert_eq!(code, 0, "strata mount after SIGTERM:\n{}", m.log());
    assert!(!m.log().contains("WARN"), "warnings:\n{}", m.log());
    assert!(!dir.join("ids").exists(), "still mounted after SIGTERM");
}

/// EROFS, without a libc dependency in the tests.
fn libc_erofs() -> i32 {
    30
}
