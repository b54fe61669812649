//! The control socket of a served volume (`control.sock` in its
//! directory): `strata volume snapshot` of a volume another process
//! serves asks that process for a frozen image ([`Volume::freeze`]) and
//! holds it while it reads; the freeze ends when the connection does
//! (also when the snapshot process dies).
//!
//! Protocol: the client sends `freeze\n`; the server answers one JSON
//! line, `{"map": PATH}` (the frozen map copy) or `{"error": MESSAGE}`,
//! then waits for the client to close.

use crate::volume::Volume;
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
        Ok(f) => serde_json::json!({"map": f.map.display().to_string()}),
        Err(e) => serde_json::json!({"error": e.to_string()}),
    };
    if (&conn).write_all(format!("{reply}\n").as_bytes()).is_err() || frozen.is_err() {
        return;
    }
    // Held until the client closes (or dies): no timeout from here on.
    let _ = conn.set_read_timeout(None);
    let mut sink = [0u8; 64];
    while matches!(rd.read(&mut sink), Ok(n) if n > 0) {}
    drop(frozen);
}

/// Asks the process serving the volume in `dir` for a frozen image.
/// Returns the connection (the freeze lasts while it is open) and the
/// frozen map's path.
pub fn freeze_remote(dir: &Path) -> io::Result<(UnixStream, PathBuf)> {
    let mut conn = UnixStream::connect(dir.join(SOCKET))?;
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
    // The map copy must be in the volume's own directory.
    let map = PathBuf::from(map);
    if map.parent() != Some(dir)
        && map.parent().map(|p| p.canonicalize().ok()) != Some(dir.canonicalize().ok())
    {
        return Err(io::Error::other(
            "the volume's server named a map outside the volume",
        ));
    }
    Ok((conn, map))
}
