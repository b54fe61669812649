//! NBD helpers of the volume tests: the client tools, a served volume.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Whether `tool` runs here (a message when not: the test skips).
pub fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("{tool} is missing: skipping (apt-get install qemu-utils libnbd-bin fio)");
    }
    ok
}

/// A serving volume: the child process and its NBD URL.
pub struct Served {
    pub child: Child,
    pub url: String,
    pub addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `c` (a `volume serve … --json`) and reads where it listens.
pub fn serve_cmd(mut c: Command) -> Served {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // The JSON document (pretty-printed) ends with a line `}`.
    let mut rd = BufReader::new(child.stdout.take().unwrap());
    let mut doc = String::new();
    let v: serde_json::Value = loop {
        let mut line = String::new();
        if rd.read_line(&mut line).unwrap() == 0 {
            panic!("serve ended: {doc:?}");
        }
        doc += &line;
        if let Ok(v) = serde_json::from_str(&doc) {
            break v;
        }
    };
    let (Some(url), Some(addr)) = (v["url"].as_str(), v["listening"].as_str()) else {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "serve did not start: {doc}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    Served {
        url: url.to_string(),
        addr: addr.to_string(),
        child,
    }
}

/// SIGTERM: the server destages, closes the volume cleanly and exits 0.
pub fn stop(mut s: Served) {
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    assert!(s.child.wait().unwrap().success());
}

/// Runs `cmd`; its output, or a panic with it when it failed.
pub fn sh(cmd: &mut Command) -> std::process::Output {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A Python with libnbd's module (`python3-libnbd`): Debian's, whatever
/// `python3` comes first on the PATH. None (with a message) without one.
pub fn libnbd_python() -> Option<&'static str> {
    let found = ["/usr/bin/python3", "python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import nbd"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        eprintln!("libnbd's Python module is missing: skipping (apt-get install python3-libnbd)");
    }
    found
}

/// A structured read of `len` bytes at `offset` through libnbd: its
/// chunks as (offset, length, "data" or "hole"), in order, neighbours of
/// one kind merged (a server may cut a reply where it likes).
pub fn structured_read(py: &str, url: &str, offset: u64, len: u64) -> Vec<(u64, u64, String)> {
    let script = format!(
        "import nbd\n\
         h = nbd.NBD()\n\
         h.connect_uri({url:?})\n\
         got = []\n\
         def chunk(buf, offset, status, err):\n\
         \x20   got.append((offset, len(buf), {{nbd.READ_DATA: 'data', nbd.READ_HOLE: 'hole'}}[status]))\n\
         h.pread_structured({len}, {offset}, chunk)\n\
         h.shutdown()\n\
         for o, n, k in sorted(got):\n\
         \x20   print(o, n, k)\n"
    );
    let o = Command::new(py).args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_string(),
            )
        })
        .fold(Vec::new(), |mut got: Vec<(u64, u64, String)>, c| {
            match got.last_mut() {
                Some(a) if a.2 == c.2 && a.0 + a.1 == c.0 => a.1 += c.1,
                _ => got.push(c),
            }
            got
        })
}
