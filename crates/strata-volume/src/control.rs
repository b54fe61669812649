//! The control socket of a served volume (`control.sock` in its
//! directory): `strata volume snapshot` of a volume another process
//! serves asks that process for a frozen image ([`Volume::freeze`]) and
//! holds it while it reads; the freeze ends when the connection does
//! (also when the snapshot process dies).
//!
//! Protocol: the client sends `freeze\n`; the server answers one JSON
//! line, `{"map": PATH, "base": ID, "segments": N, "changed": [K…]}` (the
//! frozen map copy; the snapshot the volume's changes count from, if any,
//! and the 2 MiB segments written since, if known) or `{"error":
//! MESSAGE}`. Once the snapshot is committed the client sends `committed
//! ID\n` (the volume's changes count from that version from then on),
//! then closes; a freeze that ends without it gives its changes back.
//!
//! While the freeze holds, the client may also send `hold NAME
//! START:LEN,…\n` (linked snapshots: the blocks a repository container
//! links, as runs of disk blocks the frozen image names): the server
//! takes hold NAME ([`Volume::hold`], durable) and answers `{"ok":true}`
//! or `{"error": MESSAGE}`. The freeze is what keeps those blocks from
//! reuse until the hold does.

use crate::changes::SEGMENT_BLOCKS;
use crate::config::BLOCK;
use crate::state::Volume;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The socket's name in a volume's directory.
pub const SOCKET: &str = "control.sock";

/// The serving side; stops (and removes the socket) when dropped.
pub struct Control {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on the control socket of the volume in `dir` (which this
/// process has open, so a socket file left there is stale).
pub fn start(vol: Arc<Volume>, dir: &Path) -> io::Result<Control> {
    let path = dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        while !s.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((conn, _)) => {
                    let v = vol.clone();
                    std::thread::spawn(move || handle(&v, conn));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    });
    Ok(Control { path, stop })
}

fn handle(vol: &Arc<Volume>, conn: UnixStream) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut rd = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if rd.by_ref().take(64).read_line(&mut line).is_err() || line.trim() != "freeze" {
        let _ = (&conn).write_all(b"{\"error\":\"unknown request\"}\n");
        return;
    }
    let frozen = vol.freeze();
    let reply = match &frozen {
        Ok(f) => {
            let (base, changed) = f.changes();
            let changed = changed.map(|c| {
                (0..c.len())
                    .filter(|&k| c[k])
                    .map(|k| k as u64)
                    .collect::<Vec<u64>>()
            });
            serde_json::json!({
                "map": f.map.file_name().map(|n| n.to_string_lossy().into_owned()),
                "base": base,
                "segments": vol.size().div_ceil(SEGMENT_BLOCKS * BLOCK as u64),
                "changed": changed,
            })
        }
        Err(e) => serde_json::json!({"error": e.to_string()}),
    };
    if (&conn).write_all(format!("{reply}\n").as_bytes()).is_err() {
        return;
    }
    let Ok(frozen) = frozen else {
        return;
    };
    // Held until the client closes (or dies): no timeout from here on.
    let _ = conn.set_read_timeout(None);
    loop {
        line.clear();
        match rd.by_ref().take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with('\n') => {
                let _ = (&conn).write_all(b"{\"error\":\"request too long\"}\n");
                break;
            }
            Ok(_) => {
                let l = line.trim();
                if let Some(id) = l.strip_prefix("committed ") {
                    if valid_id(id) {
                        frozen.committed(id);
                    }
                } else if let Some(req) = l.strip_prefix("hold ") {
                    let reply = match take_hold(vol, req) {
                        Ok(()) => serde_json::json!({"ok": true}),
                        Err(e) => serde_json::json!({"error": e}),
                    };
                    if (&conn).write_all(format!("{reply}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            }
        }
    }
    drop(frozen);
}

/// The longest request line after the freeze (a hold's runs).
const MAX_LINE: u64 = 4 << 20;
/// The most blocks one hold may name (16 GiB).
const MAX_HOLD_BLOCKS: u64 = 1 << 22;

/// `NAME START:LEN,…` → the hold taken.
fn take_hold(vol: &Volume, req: &str) -> Result<(), String> {
    let (name, runs) = req.split_once(' ').unwrap_or((req, ""));
    if !crate::holds::valid_name(name) {
        return Err(format!("{name:?} cannot name a hold"));
    }
    let runs = parse_runs(runs)?;
    let dbns: Vec<u64> = runs.iter().flat_map(|&(s, l)| s..s + l).collect();
    vol.hold(name, &dbns).map_err(|e| e.to_string())
}

/// `START:LEN,…` as runs; at most [`MAX_HOLD_BLOCKS`] blocks in all.
fn parse_runs(text: &str) -> Result<Vec<(u64, u64)>, String> {
    let mut total = 0u64;
    let mut out = Vec::new();
    for r in text.split(',').filter(|r| !r.is_empty()) {
        let bad = || format!("{r:?} is not a run of disk blocks (START:LEN)");
        let (s, l) = r.split_once(':').ok_or_else(bad)?;
        let (s, l): (u64, u64) = (s.parse().map_err(|_| bad())?, l.parse().map_err(|_| bad())?);
        total = total.saturating_add(l);
        if l == 0 || s.checked_add(l).is_none() || total > MAX_HOLD_BLOCKS {
            return Err(bad());
        }
        out.push((s, l));
    }
    if out.is_empty() {
        return Err("a hold of no blocks".into());
    }
    Ok(out)
}

/// Has the server holding a freeze over `conn` take hold `name` of disk
/// blocks `dbns` (which the frozen image names), durably, before the
/// freeze ends ([`Volume::hold`] in the serving process).
pub fn hold_remote(conn: &UnixStream, name: &str, dbns: &[u64]) -> io::Result<()> {
    let runs: Vec<String> = crate::holds::runs_of(dbns.to_vec())
        .iter()
        .map(|(s, l)| format!("{s}:{l}"))
        .collect();
    let req = format!("hold {name} {}\n", runs.join(","));
    if req.len() as u64 > MAX_LINE {
        return Err(io::Error::other("a hold of too many runs for one request"));
    }
    // A server that stops answering (a hung disk) must not hold the
    // snapshot, its repository lock and the freeze for ever.
    conn.set_read_timeout(Some(Duration::from_secs(300)))?;
    conn.set_write_timeout(Some(Duration::from_secs(300)))?;
    let mut c = conn;
    c.write_all(req.as_bytes())?;
    // (The server answers nothing else after the freeze: one line each.)
    let mut line = String::new();
    let mut rd = BufReader::new(conn.try_clone()?).take(64 << 10);
    rd.read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::Error::other(
            "the volume's server ended before it took the hold",
        ));
    }
    let v: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| io::Error::other(format!("the volume's server answered {line:?}: {e}")))?;
    match (v["ok"].as_bool(), v["error"].as_str()) {
        (Some(true), _) => Ok(()),
        (_, Some(e)) => Err(io::Error::other(format!("the volume's server: {e}"))),
        _ => Err(io::Error::other(format!(
            "the volume's server answered {line:?}"
        ))),
    }
}

/// A snapshot id as the repository names them (hex).
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A freeze held by [`freeze_remote`]: the connection (the freeze lasts
/// while it is open; `committed ID\n` on it tells the server the
/// snapshot's version), the frozen map's path, and what changed since the
/// volume's last snapshot.
pub struct RemoteFreeze {
    pub conn: UnixStream,
    pub map: PathBuf,
    /// The snapshot the changes count from.
    pub base: Option<String>,
    /// Per 2 MiB segment, whether it may have changed (none: unknown).
    pub changed: Option<Vec<bool>>,
}

/// Asks the process serving the volume in `dir` for a frozen image.
pub fn freeze_remote(dir: &Path) -> io::Result<RemoteFreeze> {
    let mut conn = UnixStream::connect(dir.join(SOCKET))?;
    // The server destages one batch and copies the map first.
    conn.set_read_timeout(Some(Duration::from_secs(300)))?;
    conn.write_all(b"freeze\n")?;
    let mut line = String::new();
    BufReader::new(conn.try_clone()?)
        .take(64 << 10)
        .read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| io::Error::other(format!("the volume's server answered {line:?}: {e}")))?;
    if let Some(e) = v["error"].as_str() {
        return Err(io::Error::other(format!("the volume's server: {e}")));
    }
    let map = v["map"]
        .as_str()
        .ok_or_else(|| io::Error::other(format!("the volume's server answered {line:?}")))?;
    // A file name of the volume's own directory, nothing else.
    let ok = map
        .strip_prefix("map.frozen.")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(io::Error::other(format!(
            "the volume's server named {map:?}, not a frozen map"
        )));
    }
    conn.set_read_timeout(None)?;
    // What changed: only if the answer is whole and consistent.
    let base = v["base"]
        .as_str()
        .filter(|b| valid_id(b))
        .map(str::to_string);
    let changed = match (v["segments"].as_u64(), v["changed"].as_array()) {
        (Some(n), Some(ks)) if n <= 1 << 32 => {
            let mut c = vec![false; n as usize];
            let all = ks.iter().all(|k| match k.as_u64() {
                Some(k) if k < n => {
                    c[k as usize] = true;
                    true
                }
                _ => false,
            });
            all.then_some(c)
        }
        _ => None,
    };
    Ok(RemoteFreeze {
        conn,
        map: dir.join(map),
        base,
        changed,
    })
}

/// Whether the server holding a freeze over `conn` is still there (the
/// freeze ends with it: what was read after that may be reused blocks).
pub fn still_frozen(conn: &UnixStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: a one-byte peek into a local buffer on a socket we own.
    let r = unsafe {
        libc::recv(
            conn.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match r {
        0 => Err(io::Error::other(
            "the volume's server ended during the snapshot (its frozen image is gone)",
        )),
        n if n > 0 => Ok(()),
        _ => {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                _ => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_is_gone_when_its_server_is() {
        let (a, b) = UnixStream::pair().unwrap();
        still_frozen(&a).unwrap();
        drop(b);
        let e = still_frozen(&a).unwrap_err().to_string();
        assert!(e.contains("ended during the snapshot"), "{e}");
    }

    #[test]
    fn hold_requests_are_parsed_strictly() {
        assert_eq!(parse_runs("3:2,9:1").unwrap(), [(3, 2), (9, 1)]);
        for bad in [
            "",
            "3",
            "3:0",
            "x:1",
            "3:-1",
            "18446744073709551615:2",
            "0:4194305",
            "0:4194304,9:1",
        ] {
            assert!(parse_runs(bad).is_err(), "{bad:?}");
        }
    }

    /// A server that names anything but a frozen map of the volume's own
    /// directory is refused (the client reads only such a file).
    #[test]
    fn a_map_outside_the_volume_is_refused() {
        for (reply, ok) in [
            (r#"{"map":"map.frozen.7"}"#, true),
            (r#"{"map":"../data"}"#, false),
            (r#"{"map":"/etc/passwd"}"#, false),
            (r#"{"map":"map.frozen."}"#, false),
            (r#"{"error":"the volume is closing"}"#, false),
            ("not json", false),
        ] {
            let d = tempfile::tempdir().unwrap();
            let l = UnixListener::bind(d.path().join(SOCKET)).unwrap();
            let reply = reply.to_string();
            let t = std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let mut line = String::new();
                BufReader::new(c.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                assert_eq!(line, "freeze\n");
                c.write_all(format!("{reply}\n").as_bytes()).unwrap();
            });
            let r = freeze_remote(d.path());
            t.join().unwrap();
            match r {
                Ok(f) => {
                    assert!(ok, "accepted {:?}", f.map);
                    assert_eq!(f.map, d.path().join("map.frozen.7"));
                }
                Err(e) => assert!(!ok, "refused a good reply: {e}"),
            }
        }
    }
}
