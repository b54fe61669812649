//! Process measurements: wall time, peak RSS (from `wait4` rusage) and I/O
//! (from `/proc/self/io`, which includes the I/O of reaped children — so
//! the delta around one child is that child's I/O, for any system).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Measured {
    pub seconds: f64,
    pub peak_rss_bytes: u64,
    /// Bytes the child read from storage (`read_bytes`).
    pub storage_read_bytes: u64,
    /// Bytes the child read through syscalls, cache or not (`rchar`).
    pub syscall_read_bytes: u64,
    pub storage_write_bytes: u64,
    pub stdout: String,
}

#[derive(Default, Clone, Copy)]
struct Io {
    rchar: u64,
    read_bytes: u64,
    write_bytes: u64,
}

fn self_io() -> Io {
    let mut io = Io::default();
    if let Ok(s) = std::fs::read_to_string("/proc/self/io") {
        for line in s.lines() {
            let mut it = line.split(':');
            let (Some(k), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let v: u64 = v.trim().parse().unwrap_or(0);
            match k {
                "rchar" => io.rchar = v,
                "read_bytes" => io.read_bytes = v,
                "write_bytes" => io.write_bytes = v,
                _ => {}
            }
        }
    }
    io
}

/// Runs a command to completion and measures it. Exit codes other than
/// those in `ok_codes` are an error carrying the command's stderr.
pub fn run(cmd: &mut Command, ok_codes: &[i32]) -> Result<Measured> {
    let before = self_io();
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    // Drain pipes on threads so a chatty child cannot block.
    let mut so = child.stdout.take();
    let mut se = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = so.as_mut() {
            let _ = std::io::Read::read_to_string(o, &mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = se.as_mut() {
            let _ = std::io::Read::read_to_string(o, &mut s);
        }
        s
    });
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter for wait4.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pid of our own child and valid pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let seconds = start.elapsed().as_secs_f64();
    if r < 0 {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    // The child is reaped by wait4; make std forget it without waiting again.
    std::mem::forget(child);
    let after = self_io();
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    if !ok_codes.contains(&code) {
        bail!(
            "{cmd:?} exited with {code}: {}",
            stderr
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>()
        );
    }
    Ok(Measured {
        seconds,
        peak_rss_bytes: ru.ru_maxrss as u64 * 1024,
        storage_read_bytes: after.read_bytes.saturating_sub(before.read_bytes),
        syscall_read_bytes: after.rchar.saturating_sub(before.rchar),
        storage_write_bytes: after.write_bytes.saturating_sub(before.write_bytes),
        stdout,
    })
}

/// Sum of the sizes of the regular files below `dir` (apparent size).
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.len();
            }
        }
    }
    total
}

/// Drops the page cache if permitted; returns whether it was.
pub fn drop_caches() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}
