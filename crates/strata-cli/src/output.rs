//! Output helpers: human vs JSON results, warnings, progress bars.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_store::progress::Progress;

pub struct Out {
    pub json: bool,
    pub quiet: bool,
}

impl Out {
    pub fn new(json: bool, quiet: bool) -> Self {
        Out { json, quiet }
    }

    /// Prints the result: the JSON value with --json, else the text.
    /// Prints a command's result: `v` with `--json` (plus, for an object,
    /// `requests`: what the command asked of the repository's storage, and
    /// `cloud_requests` of its cloud tier when it used it), else `text`.
    pub fn result(&self, v: &serde_json::Value, text: impl FnOnce() -> String) {
        if self.json {
            let mut v = v.clone();
            let meters = [
                ("requests", crate::location::METER.get()),
                ("cloud_requests", crate::location::CLOUD_METER.get()),
            ];
            for (key, meter) in meters {
                if let (Some(o), Some(m)) = (v.as_object_mut(), meter) {
                    let m = m.read();
                    o.entry(key).or_insert(serde_json::json!({
                        "puts": m.puts, "gets": m.gets, "ranged_gets": m.ranged_gets,
                        "lists": m.lists, "deletes": m.deletes, "heads": m.heads,
                        "bytes_sent": m.bytes_sent, "bytes_received": m.bytes_received,
                    }));
                }
            }
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        } else if !self.quiet {
            println!("{}", text());
        }
    }

    pub fn warn(&self, msg: &str) {
        if !self.json {
            eprintln!("warning: {msg}");
        }
    }
}

pub fn fmt_bytes(n: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// UTC time as `YYYY-MM-DD HH:MM:SS` (civil-from-days, no time zone data).
pub fn fmt_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// A progress bar fed from [`Progress`] counters by a polling thread.
pub struct ProgressDisplay {
    pub progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ProgressDisplay {
    pub fn start(what: &str, enabled: bool) -> Self {
        let progress = Arc::new(Progress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let handle = enabled.then(|| {
            let (p, s, what) = (progress.clone(), stop.clone(), what.to_string());
            std::thread::spawn(move || {
                let bar = ProgressBar::new(0);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_prefix(what);
                while !s.load(Ordering::Relaxed) {
                    bar.set_length(p.bytes_total.load(Ordering::Relaxed));
                    bar.set_position(p.bytes_done.load(Ordering::Relaxed));
                    let ft = p.files_total.load(Ordering::Relaxed);
                    if ft > 0 {
                        bar.set_message(format!("{}/{} files", p.files_done.load(Ordering::Relaxed), ft));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                bar.finish_and_clear();
            })
        });
        ProgressDisplay {
            progress,
            stop,
            handle,
        }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_and_bytes() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00");
        assert_eq!(
            fmt_time(1_700_000_000 * 1_000_000_000),
            "2023-11-14 22:13:20"
        );
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
    }
}
