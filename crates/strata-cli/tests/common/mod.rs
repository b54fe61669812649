//! Helpers for the end-to-end tests: running the `strata` binary against a
//! temporary repository, generating test data, and comparing file trees.

#![allow(dead_code)]

pub mod nbd;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A JSON string, or a panic naming what was there.
pub fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

/// A JSON number, or a panic naming what was there.
pub fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected a number, got {v}"))
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `init` options for a cheap password hash: encrypted test repositories
/// open in milliseconds.
pub const FAST_KDF: [&str; 4] = ["--kdf-memory-kib", "256", "--kdf-iterations", "1"];

/// `init --encrypt` with [`FAST_KDF`].
pub const INIT_ENCRYPTED: [&str; 6] = [
    "init",
    "--encrypt",
    FAST_KDF[0],
    FAST_KDF[1],
    FAST_KDF[2],
    FAST_KDF[3],
];

/// Path of the binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_strata")
}

/// A `strata` command with a clean environment: no repository or
/// password inherited from the caller, stdin not a terminal.
pub fn strata() -> Command {
    let mut c = Command::new(bin());
    scrub(&mut c);
    c
}

/// Applies the test environment to any command that ends up running strata.
pub fn scrub(c: &mut Command) {
    c.env_remove("STRATA_REPO")
        .env_remove("STRATA_PASSWORD")
        .env_remove("STRATA_PASSWORD_FILE")
        .env_remove("STRATA_PASSWORD_COMMAND")
        .env_remove("STRATA_NEW_PASSWORD")
        .env_remove("STRATA_LOG")
        .env_remove("STRATA_VOLUMES_DIR")
        .env(
            "STRATA_CACHE_DIR",
            std::env::temp_dir().join("strata-test-cache"),
        )
        .stdin(Stdio::null());
}

/// Result of one finished command.
pub struct Run {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub what: String,
}

impl Run {
    pub fn from_output(what: String, o: std::process::Output) -> Run {
        Run {
            code: exit_code(o.status),
            stdout: o.stdout,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            what,
        }
    }

    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The single JSON document on stdout.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "{}: stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.what,
                self.out(),
                self.stderr
            )
        })
    }

    /// All JSON documents on stdout, in order.
    pub fn json_stream(&self) -> Vec<Value> {
        serde_json::Deserializer::from_slice(&self.stdout)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{}: bad JSON stream ({e}):\n{}", self.what, self.out()))
    }

    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(
            self.code,
            code,
            "{}: exit code {} (expected {code})\nstdout:\n{}\nstderr:\n{}",
            self.what,
            self.code,
            self.out(),
            self.stderr
        );
        self
    }

    pub fn ok(self) -> Run {
        self.expect_code(0)
    }
}

/// Exit code, or 128+signal for a killed process.
pub fn exit_code(s: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

pub fn run_cmd(mut c: Command, input: Option<&[u8]>) -> Run {
    let what = format!("{c:?}");
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    if let Some(data) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let data = data.to_vec();
        // A writer thread so a full stdout pipe cannot deadlock us.
        let t = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let o = child.wait_with_output().expect("wait");
        t.join().expect("stdin writer");
        return Run::from_output(what, o);
    }
    Run::from_output(what, child.wait_with_output().expect("wait"))
}

/// A repository in a temporary directory (which also holds the test's other
/// files: sources, restore targets).
pub struct Repo {
    pub tmp: tempfile::TempDir,
    pub path: PathBuf,
    pub password: Option<String>,
}

impl Repo {
    /// Initialises an unencrypted repository.
    pub fn new() -> Repo {
        Repo::with_init(&[], None)
    }

    pub fn with_init(extra: &[&str], password: Option<&str>) -> Repo {
        let tmp = tempfile::Builder::new()
            .prefix("strata-e2e-")
            .tempdir()
            .expect("tempdir");
        let path = tmp.path().join("repo");
        let r = Repo {
            tmp,
            path,
            password: password.map(str::to_string),
        };
        let mut args = vec!["init"];
        args.extend_from_slice(extra);
        if extra.contains(&"--encrypt") {
            args.extend_from_slice(&FAST_KDF);
        }
        let v = r.json(&args);
        assert_eq!(v["encrypted"], Value::Bool(password.is_some()), "{v}");
        r
    }

    /// The scratch directory next to the repository.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// A fresh, not yet existing path in the scratch directory.
    pub fn scratch(&self, name: &str) -> PathBuf {
        let p = self.dir().join(name);
        assert!(!p.exists(), "{} already exists", p.display());
        p
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = strata();
        c.arg("--repo").arg(&self.path).args(args);
        if let Some(pw) = &self.password {
            c.env("STRATA_PASSWORD", pw);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        run_cmd(self.cmd(args), None)
    }

    pub fn run_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        run_cmd(self.cmd(args), Some(input))
    }

    /// Runs with `--json`, expects exit 0 and one JSON document.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        self.run(&a).ok().json()
    }

    /// `backup --json PATHS... EXTRA...`, expecting exit 0 and no warnings.
    pub fn backup(&self, paths: &[&Path], extra: &[&str]) -> Value {
        let r = self.backup_run(paths, extra).ok();
        let v = r.json();
        assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
        v
    }

    pub fn backup_run(&self, paths: &[&Path], extra: &[&str]) -> Run {
        let mut a: Vec<&str> = vec!["--json", "backup"];
        for p in paths {
            a.push(p.to_str().expect("utf-8 path"));
        }
        a.extend_from_slice(extra);
        self.run(&a)
    }

    /// `restore --json SNAP --target TARGET`, expecting success.
    pub fn restore(&self, snap: &str, target: &Path) -> Value {
        let v = self.json(&["restore", snap, "--target", target.to_str().unwrap()]);
        assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
        v
    }

    pub fn snapshots(&self) -> Vec<Value> {
        match self.json(&["snapshots"]) {
            Value::Array(a) => a,
            v => panic!("snapshots --json is not an array: {v}"),
        }
    }

    pub fn snapshot_ids(&self) -> BTreeSet<String> {
        self.snapshots()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// `check [--read-data] --json`, whatever the exit code.
    pub fn check(&self, read_data: bool) -> (i32, Value) {
        let mut a = vec!["--json", "check"];
        if read_data {
            a.push("--read-data");
        }
        let r = self.run(&a);
        assert!(r.code == 0 || r.code == 1, "check crashed: {}", r.stderr);
        let v = r.json();
        (r.code, v)
    }

    /// Asserts that `check --read-data` finds no errors.
    pub fn assert_clean(&self, ctx: &str) -> Value {
        let (code, v) = self.check(true);
        assert_eq!(code, 0, "{ctx}: check --read-data failed: {v:#}");
        assert_eq!(v["errors"], serde_json::json!([]), "{ctx}: {v:#}");
        assert_eq!(
            v["damaged_snapshots"],
            serde_json::json!([]),
            "{ctx}: {v:#}"
        );
        v
    }

    /// Names (relative to the repository, e.g. `data/ab/ab12…`) of the
    /// objects under `prefix`, ignoring temporary files.
    pub fn objects(&self, prefix: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let root = self.path.join(prefix);
        if !root.exists() {
            return out;
        }
        for p in walk_files(&root) {
            let name = p.file_name().unwrap().to_string_lossy();
            if name.starts_with(".tmp-") {
                continue;
            }
            out.insert(
                p.strip_prefix(&self.path)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        out
    }
}

/// Every regular file below `root` (no symlink following).
pub fn walk_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {}: {e}", d.display())) {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Where a restore into `target` puts the snapshot path `src` (restic
/// style: the absolute path below the target).
pub fn restored(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").expect("absolute source path"))
}

// ---------------------------------------------------------------------------
// Data generation

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn prng(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    if s == 0 {
        s = 1;
    }
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let b = s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    v
}

pub fn write(p: &Path, data: &[u8]) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Sets the mtime (and atime) of `p` without following symlinks, with
/// `touch -h -d DATE`.
pub fn touch(p: &Path, date: &str) {
    let st = Command::new("touch")
        .arg("-h")
        .arg("-d")
        .arg(date)
        .arg(p)
        .status()
        .expect("run touch");
    assert!(st.success(), "touch -h -d {date} {}", p.display());
}

pub fn euid() -> u32 {
    fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1)
}

// ---------------------------------------------------------------------------
// Tree comparison

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Other(String),
}

/// Everything the comparison looks at for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits incl. setuid/setgid/sticky (not for symlinks).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i128,
    /// Regular files: size, content hash and link count.
    pub size: u64,
    pub content: Option<[u64; 2]>,
    pub nlink: u64,
    pub target: Option<PathBuf>,
}

/// Entries by path relative to the root (the root itself is "").
pub type Manifest = BTreeMap<PathBuf, Entry>;

/// Two-lane 64-bit hash of a file's content (not cryptographic; the tests
/// have no adversary, and a difference in any byte changes both lanes).
pub fn content_hash(d: &[u8]) -> [u64; 2] {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325 ^ d.len() as u64;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    let mut it = d.chunks_exact(8);
    for c in &mut it {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        a = (a ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
        b = (b.wrapping_add(w).wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ (b >> 31);
    }
    for &x in it.remainder() {
        a = (a ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
        b = (b ^ x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    [a, b]
}

fn entry(p: &Path) -> Entry {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    let ft = m.file_type();
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_char_device() {
        Kind::Other(format!("char device {:x}", m.rdev()))
    } else if ft.is_block_device() {
        Kind::Other(format!("block device {:x}", m.rdev()))
    } else {
        Kind::Other(format!("{ft:?}"))
    };
    let mut e = Entry {
        mode: if kind == Kind::Symlink {
            0
        } else {
            m.mode() & 0o7777
        },
        uid: m.uid(),
        gid: m.gid(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        size: 0,
        content: None,
        nlink: 0,
        target: None,
        kind,
    };
    match e.kind {
        Kind::File => {
            e.size = m.len();
            e.nlink = m.nlink();
            // Unreadable files (as non-root) keep `content: None`.
            if let Ok(mut f) = fs::File::open(p) {
                let mut buf = Vec::with_capacity(m.len() as usize);
                f.read_to_end(&mut buf).unwrap();
                e.content = Some(content_hash(&buf));
            }
        }
        Kind::Symlink => e.target = Some(fs::read_link(p).unwrap()),
        _ => {}
    }
    e
}

/// Describes the tree below (and including) `root`.
pub fn manifest(root: &Path) -> Manifest {
    let mut out = Manifest::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let full = if rel.as_os_str().is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        let e = entry(&full);
        if e.kind == Kind::Dir {
            if let Ok(rd) = fs::read_dir(&full) {
                for c in rd {
                    stack.push(rel.join(c.unwrap().file_name()));
                }
            }
        }
        out.insert(rel, e);
    }
    out
}

/// Panics with a readable diff unless the manifests are equal.
pub fn assert_manifest_eq(expected: &Manifest, actual: &Manifest, ctx: &str) {
    if expected == actual {
        return;
    }
    let mut diffs = Vec::new();
    for (p, e) in expected {
        match actual.get(p) {
            None => diffs.push(format!("missing: {}", p.display())),
            Some(a) if a != e => diffs.push(format!(
                "differs: {}\n    expected {e:?}\n    actual   {a:?}",
                p.display()
            )),
            _ => {}
        }
    }
    for p in actual.keys() {
        if !expected.contains_key(p) {
            diffs.push(format!("unexpected: {}", p.display()));
        }
    }
    let n = diffs.len();
    diffs.truncate(25);
    panic!("{ctx}: trees differ in {n} entries:\n{}", diffs.join("\n"));
}

/// Compares two trees on disk: paths, types, permissions, owners, mtimes,
/// content, link counts and symlink targets.
pub fn assert_trees_equal(expected: &Path, actual: &Path) {
    assert_manifest_eq(
        &manifest(expected),
        &manifest(actual),
        &format!("{} vs {}", expected.display(), actual.display()),
    );
}

// ---------------------------------------------------------------------------
// Processes

/// Waits for a child up to `limit`; kills it and panics on timeout.
pub fn wait_timeout(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls until `cond` holds (or panics after `limit`).
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A tmpfs mounted for a test (unmounted when dropped).
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB at `at`; `None` (with a message) where
    /// this process may not mount (not root, or no CAP_SYS_ADMIN).
    pub fn mount(at: &Path, mib: u32) -> Option<Tmpfs> {
        fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::piped())
            .output();
        match st {
            Ok(o) if o.status.success() => Some(Tmpfs(at.to_path_buf())),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here ({}); CI runs this as root",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: no mount command ({e})");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem holding `dir` with one file, then gives back
/// `leave` bytes of it.
pub fn fill_filesystem(file: &Path, leave: u64) {
    let mut f = fs::File::create(file).unwrap();
    let block = vec![0x5au8; 1 << 16];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the filesystem: {e}"),
        }
    }
    let _ = f.flush();
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(leave)).unwrap();
}

/// Sets an extended attribute (following links); false where the file
/// system refuses it.
pub fn set_xattr(p: &Path, name: &str, value: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and value buffer.
    unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        ) == 0
    }
}

/// An extended attribute's value, if the file has it.
pub fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::getxattr(
            c.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// An unencrypted repository's envelope of kind `kind` around an already
/// zstd-compressed `payload` (version, kind, flags; BLAKE3 checksum),
/// bound to the object's `name` when given.
pub fn plain_zstd_envelope(kind: u8, payload: &[u8], name: Option<&str>) -> Vec<u8> {
    let flags = 1 | if name.is_some() { 4 } else { 0 };
    let header = [strata_core::crypto::ENVELOPE_VERSION, kind, flags];
    let mut h = blake3::Hasher::new();
    h.update(&header);
    h.update(name.unwrap_or_default().as_bytes());
    h.update(payload);
    let mut out = header.to_vec();
    out.extend_from_slice(payload);
    out.extend_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// A zstd frame of `n` zeros with no size in its header (a reader must
/// stream it): a decompression bomb of a few hundred bytes per GiB.
pub fn zeros_frame(n: u64) -> Vec<u8> {
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let block = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len() as u64) as usize;
        enc.write_all(&block[..k]).unwrap();
        left -= k as u64;
    }
    enc.finish().unwrap()
}
