//! A fault-injecting TCP proxy on loopback, for tests against a real S3
//! server: it forwards connections to the server and, on a schedule,
//! answers `503 Slow Down` instead, cuts a connection after some bytes of
//! request (an upload dropped mid-way) or of response (a download dropped
//! mid-way), or delays every chunk. No mock: the server behind it is real,
//! and the client sees what a flaky network and a throttling store do.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to the connections it accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every n-th connection gets `503 Slow Down` to its first request.
    pub slow_down_every: u64,
    /// The next n connections (from when these faults are set) get `503
    /// Slow Down` to their first request: a server that throttles, then
    /// recovers.
    pub slow_down_next: u64,
    /// Every n-th connection is cut after this many request bytes.
    pub cut_upload_every: u64,
    pub cut_upload_after: u64,
    /// Every n-th connection is cut after this many response bytes.
    pub cut_download_every: u64,
    pub cut_download_after: u64,
    /// Delay before forwarding each chunk, in milliseconds.
    pub delay_ms: u64,
    /// Refuse everything: every connection is closed at once.
    pub down: bool,
    /// Refuse every connection after the n-th (counted from the start):
    /// the server goes away in the middle of a command.
    pub down_after: u64,
    /// Go down (as `down`) once this many request bytes have passed since
    /// these faults were set, on whichever connections: the server goes
    /// away in the middle of an upload however the client reuses them.
    pub down_after_upload_bytes: u64,
}

/// Counts of what the proxy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub connections: u64,
    pub slow_downs: u64,
    pub cut_uploads: u64,
    pub cut_downloads: u64,
    pub refused: u64,
}

pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    counts: Arc<Mutex<Injected>>,
    stop: Arc<AtomicBool>,
    /// Request bytes forwarded since the faults were last set.
    uploaded: Arc<AtomicU64>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `upstream`
    /// (`host:port`).
    pub fn start(upstream: &str) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Mutex::new(Faults::default()));
        let counts = Arc::new(Mutex::new(Injected::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let (f, c, s) = (faults.clone(), counts.clone(), stop.clone());
        let uploaded = Arc::new(AtomicU64::new(0));
        let u = uploaded.clone();
        let seq = AtomicU64::new(0);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let n = seq.fetch_add(1, Ordering::SeqCst) + 1;
                let plan = {
                    let mut g = f.lock().unwrap_or_else(|e| e.into_inner());
                    let plan = *g;
                    g.slow_down_next = g.slow_down_next.saturating_sub(1);
                    plan
                };
                let (up, counts, live) = (upstream.clone(), c.clone(), f.clone());
                let shared = Shared {
                    counts,
                    live,
                    uploaded: u.clone(),
                };
                std::thread::spawn(move || serve(client, &up, n, plan, &shared));
            }
        });
        Ok(FaultProxy {
            addr,
            faults,
            counts,
            stop,
            uploaded,
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, f: Faults) {
        let mut live = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        self.uploaded.store(0, Ordering::SeqCst);
        *live = f;
    }

    pub fn injected(&self) -> Injected {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
    }
}

fn every(n: u64, k: u64) -> bool {
    k > 0 && n.is_multiple_of(k)
}

/// What every connection's threads share: the counts, the faults as set
/// now, the request bytes since they were set.
#[derive(Clone)]
struct Shared {
    counts: Arc<Mutex<Injected>>,
    live: Arc<Mutex<Faults>>,
    uploaded: Arc<AtomicU64>,
}

fn serve(client: TcpStream, upstream: &str, n: u64, f: Faults, shared: &Shared) {
    let counts = &shared.counts;
    let bump = |g: fn(&mut Injected)| g(&mut counts.lock().unwrap_or_else(|e| e.into_inner()));
    bump(|c| c.connections += 1);
    if f.down || (f.down_after > 0 && n > f.down_after) {
        bump(|c| c.refused += 1);
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    if f.slow_down_next > 0 || every(n, f.slow_down_every) {
        bump(|c| c.slow_downs += 1);
        slow_down(client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let up_limit = every(n, f.cut_upload_every).then_some(f.cut_upload_after);
    let down_limit = every(n, f.cut_download_every).then_some(f.cut_download_after);
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let delay = Duration::from_millis(f.delay_ms);
    let up_shared = shared.clone();
    let upload = std::thread::spawn(move || {
        pump(
            client,
            server,
            up_limit,
            delay,
            &up_shared.live,
            Some(&up_shared.uploaded),
        )
    });
    let cut_down = pump(s2, c2, down_limit, delay, &shared.live, None);
    let cut_up = upload.join().unwrap_or(false);
    if cut_up {
        bump(|c| c.cut_uploads += 1);
    }
    if cut_down {
        bump(|c| c.cut_downloads += 1);
    }
}

/// Reads the request head, answers 503 with S3's `SlowDown` and closes.
fn slow_down(mut client: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = client.set_read_timeout(Some(Duration::from_secs(5)));
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 1 << 16 {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(k) => head.extend_from_slice(&buf[..k]),
        }
    }
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
    let _ = write!(
        client,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.shutdown(Shutdown::Both);
}

/// Copies `from` → `to` until EOF, or cuts both after `limit` bytes (or
/// once the server is taken down: open connections die with it). Request
/// bytes are added to `uploaded`, which takes the server down past
/// `down_after_upload_bytes`. Returns whether it cut on `limit`.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    limit: Option<u64>,
    delay: Duration,
    live: &Mutex<Faults>,
    uploaded: Option<&AtomicU64>,
) -> bool {
    let mut buf = vec![0u8; 64 << 10];
    let mut sent = 0u64;
    loop {
        let k = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        if let Some(total) = uploaded {
            let t = total.fetch_add(k as u64, Ordering::SeqCst) + k as u64;
            let mut f = live.lock().unwrap_or_else(|e| e.into_inner());
            if f.down_after_upload_bytes > 0 && t > f.down_after_upload_bytes {
                f.down = true;
            }
        }
        if live.lock().unwrap_or_else(|e| e.into_inner()).down {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return false;
        }
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let k = match limit {
            Some(l) if sent + k as u64 >= l => {
                let part = (l - sent) as usize;
                let _ = to.write_all(&buf[..part]);
                let _ = from.shutdown(Shutdown::Both);
                let _ = to.shutdown(Shutdown::Both);
                return true;
            }
            _ => k,
        };
        if to.write_all(&buf[..k]).is_err() {
            // The other side is gone (a server closing an idle connection):
            // close this one too, so the client sees it at once rather than
            // waiting for an answer that cannot come.
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return false;
        }
        sent += k as u64;
    }
    let _ = to.shutdown(Shutdown::Write);
    false
}
