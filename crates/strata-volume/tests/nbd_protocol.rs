//! The NBD server at the protocol level, with an in-memory device (and a
//! rustls client for TLS): what a well-behaved client (nbdcopy, qemu-img:
//! the CLI tests) never sends — options before TLS, a close_notify with
//! more bytes behind it in the same segment, writes to a read-only
//! export.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strata_volume::nbd::{BlockDevice, Export, Listen, Server};
use strata_volume::tls::TlsConfig;

/// A device in memory (read-only or not).
struct Mem(Mutex<Vec<u8>>, bool);

impl BlockDevice for Mem {
    fn read_only(&self) -> bool {
        self.1
    }
    /// 4 KiB blocks of zeros are unallocated.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        let d = self.0.lock().unwrap();
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let next = ((at / 4096 + 1) * 4096).min(offset + len);
            let hole = d[(at / 4096 * 4096) as usize..][..4096]
                .iter()
                .all(|&b| b == 0);
            match runs.last_mut() {
                Some((l, h)) if *h == hole => *l += next - at,
                _ => runs.push((next - at, hole)),
            }
            at = next;
        }
        Ok(runs)
    }
    fn size(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<Vec<(u64, u64)>> {
        let d = self.0.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(Vec::new())
    }
    fn write(&self, offset: u64, data: Vec<u8>, _fua: bool) -> io::Result<()> {
        self.0.lock().unwrap()[offset as usize..offset as usize + data.len()]
            .copy_from_slice(&data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.write_zeroes(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
}

/// A TLS server of a 1 MiB device named `v`.
fn server() -> Server {
    let tls = TlsConfig::from_dir(&fixtures(), false).unwrap();
    server_of(Mem(Mutex::new(vec![0u8; 1 << 20]), false), Some(tls))
}

fn server_of(dev: Mem, tls: Option<TlsConfig>) -> Server {
    Server::start(
        &Listen::Tcp("127.0.0.1:0".into()),
        vec![Export {
            name: "v".into(),
            device: Arc::new(dev),
        }],
        tls,
    )
    .unwrap()
}

/// Connected, greeted (fixed newstyle, no zeroes).
fn greeted(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 18];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap();
    c
}

fn option(c: &mut impl Write, opt: u32, data: &[u8]) {
    let mut q = b"IHAVEOPT".to_vec();
    q.extend_from_slice(&opt.to_be_bytes());
    q.extend_from_slice(&(data.len() as u32).to_be_bytes());
    q.extend_from_slice(data);
    c.write_all(&q).unwrap();
    c.flush().unwrap();
}

/// An option reply: (option, type, data).
fn option_reply(c: &mut impl Read) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    let n = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; n];
    c.read_exact(&mut d).unwrap();
    let be = |r: std::ops::Range<usize>| u32::from_be_bytes(h[r].try_into().unwrap());
    (be(8..12), be(12..16), d)
}

const STARTTLS: u32 = 5;
const GO: u32 = 7;
const ACK: u32 = 1;
const INFO: u32 = 3;
const TLS_REQD: u32 = (1 << 31) + 5;

fn client() -> ClientConnection {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(fixtures().join("ca-cert.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    ClientConnection::new(Arc::new(cfg), ServerName::try_from("127.0.0.1").unwrap()).unwrap()
}

/// Greeted, TLS started: the TLS stream.
fn secured(addr: &str) -> rustls::StreamOwned<ClientConnection, TcpStream> {
    let mut c = greeted(addr);
    option(&mut c, STARTTLS, &[]);
    assert_eq!(option_reply(&mut c), (STARTTLS, ACK, Vec::new()));
    let mut tls = client();
    while tls.is_handshaking() {
        tls.complete_io(&mut c).unwrap();
    }
    rustls::StreamOwned::new(tls, c)
}

/// GO for export `v`: its transmission flags.
fn go(c: &mut impl ReadWrite) -> u16 {
    let mut d = 1u32.to_be_bytes().to_vec();
    d.push(b'v');
    d.extend_from_slice(&0u16.to_be_bytes());
    option(c, GO, &d);
    let mut flags = None;
    loop {
        let (opt, kind, data) = option_reply(c);
        assert_eq!(opt, GO);
        match kind {
            // NBD_INFO_EXPORT: type, size, flags.
            INFO if data[..2] == [0, 0] => {
                flags = Some(u16::from_be_bytes(data[10..12].try_into().unwrap()))
            }
            INFO => continue,
            ACK => return flags.expect("NBD_INFO_EXPORT"),
            k => panic!("GO answered {k:#x}"),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// NBD request header.
fn request(kind: u16, handle: u64, off: u64, len: u32) -> Vec<u8> {
    let mut q = 0x2560_9513u32.to_be_bytes().to_vec();
    q.extend_from_slice(&0u16.to_be_bytes());
    q.extend_from_slice(&kind.to_be_bytes());
    q.extend_from_slice(&handle.to_be_bytes());
    q.extend_from_slice(&off.to_be_bytes());
    q.extend_from_slice(&len.to_be_bytes());
    q
}

/// Before TLS nothing but STARTTLS is answered; after it, the export is
/// served over TLS, writes and reads of 256 KiB through the pump.
#[test]
fn options_wait_for_tls_and_data_goes_over_it() {
    let s = server();
    let mut c = greeted(s.addr());
    for opt in [3u32, 6, 7, 8] {
        option(&mut c, opt, &[]);
        assert_eq!(option_reply(&mut c).1, TLS_REQD, "option {opt} before TLS");
    }
    drop(c);
    let mut t = secured(s.addr());
    // STARTTLS again: refused, the session goes on.
    option(&mut t, STARTTLS, &[]);
    assert_eq!(option_reply(&mut t).1, (1 << 31) + 3);
    go(&mut t);
    let data: Vec<u8> = (0..256 << 10)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    let mut q = request(1, 1, 4096, data.len() as u32);
    q.extend_from_slice(&data);
    t.write_all(&q).unwrap();
    t.flush().unwrap();
    let mut r = [0u8; 16];
    t.read_exact(&mut r).unwrap();
    assert_eq!(&r[4..8], &[0, 0, 0, 0], "write over TLS");
    t.write_all(&request(0, 2, 4096, data.len() as u32))
        .unwrap();
    t.flush().unwrap();
    t.read_exact(&mut r).unwrap();
    assert_eq!(&r[4..8], &[0, 0, 0, 0]);
    let mut back = vec![0u8; data.len()];
    t.read_exact(&mut back).unwrap();
    assert!(back == data, "read back over TLS");
}

/// A client's close_notify with more bytes behind it in one segment:
/// the server closes the connection (it neither reads those bytes as
/// records over and over nor leaves the connection hanging).
#[test]
fn close_notify_with_bytes_behind_it_ends_the_connection() {
    let s = server();
    let t = secured(s.addr());
    let (mut tls, mut tcp) = (t.conn, t.sock);
    tls.send_close_notify();
    let mut out = Vec::new();
    while tls.wants_write() {
        tls.write_tls(&mut out).unwrap();
    }
    out.extend(std::iter::repeat_n(0x17u8, 8 << 10));
    tcp.write_all(&out).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    tcp.read_to_end(&mut rest)
        .expect("the server closed the connection");
    // And it goes on serving others.
    let mut t = secured(s.addr());
    go(&mut t);
}

/// A read-only export says so and refuses writes, trims and zero writes
/// with EPERM; reads go on, and the device is unchanged.
#[test]
fn a_read_only_export_refuses_writes() {
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let s = server_of(Mem(Mutex::new(data.clone()), true), None);
    let mut c = greeted(s.addr());
    let flags = go(&mut c);
    assert_ne!(flags & 2, 0, "NBD_FLAG_READ_ONLY in {flags:#x}");
    assert_eq!(
        flags & (1 << 5 | 1 << 6),
        0,
        "no TRIM or WRITE_ZEROES: {flags:#x}"
    );
    let mut q = request(1, 1, 0, 4096);
    q.extend_from_slice(&[0xee; 4096]);
    c.write_all(&q).unwrap();
    for (kind, handle) in [(4u16, 2u64), (6, 3)] {
        c.write_all(&request(kind, handle, 0, 4096)).unwrap();
    }
    let mut r = [0u8; 16];
    // (Replies may come back in any order.)
    let mut handles = Vec::new();
    for _ in 1..=3u64 {
        c.read_exact(&mut r).unwrap();
        assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 1, "EPERM");
        handles.push(u64::from_be_bytes(r[8..16].try_into().unwrap()));
    }
    handles.sort_unstable();
    assert_eq!(handles, [1, 2, 3]);
    // FLUSH and CACHE are fine.
    for (kind, handle) in [(3u16, 5u64), (5, 6)] {
        c.write_all(&request(kind, handle, 0, if kind == 3 { 0 } else { 4096 }))
            .unwrap();
        c.read_exact(&mut r).unwrap();
        assert_eq!(
            &r[4..16],
            &[&[0u8; 4][..], &handle.to_be_bytes()].concat()[..]
        );
    }
    c.write_all(&request(0, 4, 0, 8192)).unwrap();
    c.read_exact(&mut r).unwrap();
    assert_eq!(&r[4..8], &[0, 0, 0, 0]);
    let mut back = vec![0u8; 8192];
    c.read_exact(&mut back).unwrap();
    assert!(back == data[..8192], "unchanged");
}

/// A meta-context request for export `v`: the queries.
fn meta_request(queries: &[&str]) -> Vec<u8> {
    let mut d = 1u32.to_be_bytes().to_vec();
    d.push(b'v');
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// `base:allocation`: listed, selected only after structured replies,
/// then BLOCK_STATUS tells holes (HOLE|ZERO) from data, in request
/// order, at most one extent with REQ_ONE, never past the request.
#[test]
fn block_status_tells_holes_from_data() {
    let mut data = vec![0u8; 1 << 20];
    data[4096..3 * 4096].fill(7);
    let s = server_of(Mem(Mutex::new(data), false), None);
    let mut c = greeted(s.addr());
    const LIST: u32 = 9;
    const SET: u32 = 10;
    const META: u32 = 4;
    const STRUCTURED: u32 = 8;
    let context = |d: &[u8]| {
        (
            u32::from_be_bytes(d[..4].try_into().unwrap()),
            d[4..].to_vec(),
        )
    };
    option(&mut c, LIST, &meta_request(&["base:"]));
    let (_, kind, d) = option_reply(&mut c);
    assert_eq!(
        (kind, context(&d)),
        (META, (0, b"base:allocation".to_vec()))
    );
    assert_eq!(option_reply(&mut c).1, ACK);
    // SET before structured replies: refused.
    option(&mut c, SET, &meta_request(&["base:allocation"]));
    assert_eq!(option_reply(&mut c).1, (1 << 31) + 3);
    option(&mut c, STRUCTURED, &[]);
    assert_eq!(option_reply(&mut c).1, ACK);
    // An unknown context alone: nothing selected.
    option(&mut c, SET, &meta_request(&["qemu:dirty-bitmap:x"]));
    assert_eq!(option_reply(&mut c).1, ACK);
    option(
        &mut c,
        SET,
        &meta_request(&["qemu:dirty-bitmap:x", "base:allocation"]),
    );
    let (_, kind, d) = option_reply(&mut c);
    assert_eq!((kind, context(&d).0), (META, 1));
    assert_eq!(option_reply(&mut c).1, ACK);
    // A SET that fails clears it; set again.
    option(&mut c, SET, b"junk");
    assert_eq!(option_reply(&mut c).1, (1 << 31) + 3);
    option(&mut c, SET, &meta_request(&["base:allocation"]));
    assert_eq!(option_reply(&mut c).1, META);
    assert_eq!(option_reply(&mut c).1, ACK);
    go(&mut c);
    // (offset, length, flags): the extents told.
    let mut status = |h: u64, off: u64, len: u32, flags: u16| -> Vec<(u32, u32)> {
        let mut q = request(7, h, off, len);
        q[4..6].copy_from_slice(&flags.to_be_bytes());
        c.write_all(&q).unwrap();
        let mut head = [0u8; 20];
        c.read_exact(&mut head).unwrap();
        assert_eq!(
            u16::from_be_bytes(head[6..8].try_into().unwrap()),
            5,
            "BLOCK_STATUS chunk"
        );
        let n = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        let mut d = vec![0u8; n];
        c.read_exact(&mut d).unwrap();
        assert_eq!(u32::from_be_bytes(d[..4].try_into().unwrap()), 1);
        d[4..]
            .chunks(8)
            .map(|e| {
                let be = |r: std::ops::Range<usize>| u32::from_be_bytes(e[r].try_into().unwrap());
                (be(0..4), be(4..8))
            })
            .collect()
    };
    assert_eq!(
        status(1, 0, 1 << 20, 0),
        [(4096, 3), (8192, 0), ((1 << 20) - 3 * 4096, 3)]
    );
    assert_eq!(
        status(2, 10240, 4096, 0),
        [(2048, 0), (2048, 3)],
        "unaligned"
    );
    assert_eq!(status(3, 0, 1 << 20, 1 << 3), [(4096, 3)], "REQ_ONE");
    // A SET that fails leaves nothing selected: BLOCK_STATUS is refused.
    let mut c = greeted(s.addr());
    option(&mut c, STRUCTURED, &[]);
    assert_eq!(option_reply(&mut c).1, ACK);
    option(&mut c, SET, &meta_request(&["base:allocation"]));
    assert_eq!(option_reply(&mut c).1, META);
    assert_eq!(option_reply(&mut c).1, ACK);
    option(&mut c, SET, b"junk");
    assert_eq!(option_reply(&mut c).1, (1 << 31) + 3);
    go(&mut c);
    c.write_all(&request(7, 9, 0, 4096)).unwrap();
    let mut head = [0u8; 20];
    c.read_exact(&mut head).unwrap();
    let kind = u16::from_be_bytes(head[6..8].try_into().unwrap());
    assert_eq!(kind, (1 << 15) + 1, "an error chunk, not extents");
}
