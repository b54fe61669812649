//! Output helpers: human vs JSON results, warnings, progress bars.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_store::progress::Progress;

/// Set once the reader of stdout has gone (a closed pipe).
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// One line on stdout. When the reader has gone (`strata ls | head`),
/// further output is dropped and the command finishes its work (a
/// `forget` whose listing nobody reads still forgets); no panic.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|_| o.write_all(b"\n")) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write the output: {e}");
        }
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

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

    /// A warning, on stderr (with `--json` too: stdout stays the JSON).
    pub fn warn(&self, msg: &str) {
        eprintln!("warning: {msg}");
    }
}

/// An id's first 8 characters, as listings show it (the whole name when
/// it is shorter: a stray object must not crash a listing).
pub fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A size for people, in binary units (`1.50 KiB`).
pub fn fmt_bytes(n: u64) -> String {
    humansize::format_size(n, humansize::BINARY)
}

/// A time for people: local time, `YYYY-MM-DD HH:MM:SS`.
pub fn fmt_time(ns: i64) -> String {
    fmt_time_in(ns, &local_zone())
}

/// A time for scripts (`--json`): RFC 3339 with the local offset.
pub fn json_time(ns: i64) -> String {
    json_time_in(ns, &local_zone())
}

fn local_zone() -> jiff::tz::TimeZone {
    static ZONE: std::sync::OnceLock<jiff::tz::TimeZone> = std::sync::OnceLock::new();
    ZONE.get_or_init(jiff::tz::TimeZone::system).clone()
}

fn timestamp(ns: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_nanosecond(ns as i128).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

fn fmt_time_in(ns: i64, tz: &jiff::tz::TimeZone) -> String {
    timestamp(ns)
        .to_zoned(tz.clone())
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string()
}

fn json_time_in(ns: i64, tz: &jiff::tz::TimeZone) -> String {
    let ts = timestamp(ns);
    ts.display_with_offset(tz.to_offset(ts)).to_string()
}

/// A progress bar fed from [`Progress`] counters by a polling thread.
pub struct ProgressDisplay {
    pub progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ProgressDisplay {
    pub fn start(what: &str, enabled: bool) -> Self {
        Self::watch(what, enabled, Arc::new(Progress::default()))
    }

    /// A display of `progress`, counters a command was given beforehand.
    pub fn watch(what: &str, enabled: bool, progress: Arc<Progress>) -> Self {
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
        let utc = jiff::tz::TimeZone::UTC;
        assert_eq!(fmt_time_in(0, &utc), "1970-01-01 00:00:00");
        assert_eq!(
            fmt_time_in(1_700_000_000 * 1_000_000_000, &utc),
            "2023-11-14 22:13:20"
        );
        let plus2 = jiff::tz::TimeZone::fixed(jiff::tz::offset(2));
        assert_eq!(
            fmt_time_in(1_700_000_000 * 1_000_000_000, &plus2),
            "2023-11-15 00:13:20"
        );
        assert_eq!(
            json_time_in(1_700_000_000_500_000_000, &plus2),
            "2023-11-15T00:13:20.5+02:00"
        );
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
    }
}
