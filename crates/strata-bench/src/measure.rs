//! Process measurements: wall time, peak RSS (the child's sampled VmHWM) and I/O
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

/// Samples a child's peak resident set (`VmHWM` of `/proc/PID/status`,
/// the high-water mark of the child's own address space) until stopped.
/// The mark only grows, so the last sample before the exit misses at most
/// the growth of the final few milliseconds.
struct PeakSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakSampler {
    fn start(pid: libc::pid_t) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let path = format!("/proc/{pid}/status");
        let thread = std::thread::spawn(move || {
            let mut peak = 0u64;
            loop {
                let done = flag.load(std::sync::atomic::Ordering::Acquire);
                if let Some(kib) = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| vm_hwm_kib(&s))
                {
                    peak = peak.max(kib * 1024);
                }
                if done {
                    return peak;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        PeakSampler { stop, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().unwrap_or(0)
    }
}

/// The `VmHWM` line of a `/proc/PID/status` text, in KiB.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
    let sampler = PeakSampler::start(pid);
    // Wait for the exit but leave the child a zombie, so its pid cannot be
    // reused while the sampler still reads /proc/PID.
    // SAFETY: zeroed siginfo is a valid out-parameter; pid is our child.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    while unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    } < 0
    {
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    let sampled_peak = sampler.finish();
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
        peak_rss_bytes: child_peak(sampled_peak, ru.ru_maxrss as u64 * 1024),
        storage_read_bytes: after.read_bytes.saturating_sub(before.read_bytes),
        syscall_read_bytes: after.rchar.saturating_sub(before.rchar),
        storage_write_bytes: after.write_bytes.saturating_sub(before.write_bytes),
        stdout,
    })
}

/// The child's peak resident set from what was observed. rusage's maxrss
/// is floored by this program's own peak (Linux carries the spawning
/// process's high-water mark into the child at exec), so the child's own
/// VmHWM, sampled, comes first. A child that exited before the first
/// sample is known only if its maxrss exceeds this program's peak —
/// otherwise the figure would be ours, and 0 ("not measured") is the
/// honest answer; such a child lived for a few milliseconds.
fn child_peak(sampled: u64, rusage_max: u64) -> u64 {
    if sampled > 0 {
        return sampled;
    }
    let own = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| vm_hwm_kib(&s))
        .map_or(u64::MAX, |k| k * 1024);
    if rusage_max > own {
        rusage_max
    } else {
        0
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_the_childs_own() {
        // This process grows first: rusage alone would report at least
        // this much for every child spawned afterwards.
        let big = vec![1u8; 256 << 20];
        std::hint::black_box(&big);
        let small = run(&mut Command::new("true"), &[0]).unwrap();
        assert!(
            small.peak_rss_bytes < 64 << 20,
            "`true` peaked at {} bytes",
            small.peak_rss_bytes
        );
        // dd touches its whole 96 MiB buffer on the first of 20 reads, so
        // the sampler sees it for a good while before the exit.
        let dd = run(
            Command::new("dd").args(["if=/dev/zero", "of=/dev/null", "bs=96M", "count=20"]),
            &[0],
        )
        .unwrap();
        assert!(
            (96 << 20..200 << 20).contains(&dd.peak_rss_bytes),
            "dd peaked at {} bytes",
            dd.peak_rss_bytes
        );
        drop(big);
    }

    #[test]
    fn unsampled_child_is_not_given_our_peak() {
        assert_eq!(child_peak(5 << 20, 900 << 20), 5 << 20);
        // A maxrss no larger than our own peak may be ours: not measured.
        assert_eq!(child_peak(0, 1 << 20), 0);
        assert_eq!(child_peak(0, u64::MAX / 2), u64::MAX / 2);
    }

    #[test]
    fn vm_hwm_line_is_parsed() {
        let s = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(vm_hwm_kib(s), Some(1234));
        assert_eq!(vm_hwm_kib("Name:\tzombie\n"), None);
    }
}
