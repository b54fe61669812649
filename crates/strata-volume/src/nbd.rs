//! A Network Block Device server (the NBD protocol's fixed newstyle
//! handshake and transmission phase, as `qemu-img`, `nbdcopy`, `nbdfuse`,
//! `fio --ioengine=nbd` and the kernel client speak it).
//!
//! Handshake: `NBD_OPT_EXPORT_NAME`, `NBD_OPT_GO`, `NBD_OPT_INFO`
//! (export and block-size information), `NBD_OPT_LIST`, `NBD_OPT_ABORT`,
//! `NBD_OPT_STARTTLS` (a server given TLS settings requires it before
//! any other option: [`crate::tls`]),
//! `NBD_OPT_STRUCTURED_REPLY` (then reads answer in structured chunks and
//! runs of zeros go back as holes); other options are answered
//! "unsupported". Transmission: READ, WRITE (with FUA), FLUSH, TRIM,
//! WRITE_ZEROES, CACHE, DISC. Every connection has eight workers that
//! take turns reading requests (replies may come back out of order, as
//! the protocol allows);
//! `CAN_MULTI_CONN` is advertised because a FLUSH on any connection makes
//! every acknowledged write durable (the device's journal is shared).
//!
//! A protocol error (bad magic, unknown command) ends that connection
//! only; a request outside the device or longer than [`MAX_REQUEST`] gets
//! an error reply.

use crate::conn::Conn;
use crate::tls::TlsConfig;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_LIST_META_CONTEXT: u32 = 9;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TFLAG_HAS_FLAGS: u16 = 1;
const TFLAG_READ_ONLY: u16 = 1 << 1;
const TFLAG_SEND_FLUSH: u16 = 1 << 2;
const TFLAG_SEND_FUA: u16 = 1 << 3;
const TFLAG_SEND_TRIM: u16 = 1 << 5;
const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
const TFLAG_SEND_DF: u16 = 1 << 7;
const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
const TFLAG_SEND_CACHE: u16 = 1 << 10;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_CACHE: u16 = 5;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;

const CMD_FLAG_FUA: u16 = 1;
const CMD_FLAG_DF: u16 = 1 << 2;
const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;

/// The one metadata context served: which ranges hold data.
const BASE_ALLOCATION: &str = "base:allocation";
/// Its id on every connection.
const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` states: a hole (nothing allocated), reads as zeros.
const STATE_HOLE: u32 = 1;
const STATE_ZERO: u32 = 2;
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Error numbers the protocol defines.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;

/// Longest READ or WRITE a client may send (qemu and nbdcopy use ≤ 32 MiB).
pub const MAX_REQUEST: u32 = 32 << 20;

/// What the server serves. Offsets and lengths are checked against
/// [`BlockDevice::size`] before any call.
pub trait BlockDevice: Send + Sync {
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; also says which block-aligned byte
    /// ranges of it are known zeros (sent as holes when the client asked
    /// for structured replies). Returning an empty list is always right.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<Vec<(u64, u64)>>;
    /// Acknowledged writes are readable at once and survive a crash after
    /// the next `flush` (or at once with `fua`).
    /// `data` is the request's payload, handed over (no copy needed).
    fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()>;
    fn flush(&self) -> io::Result<()>;
    /// Reads of a trimmed range return zeros.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;
    /// The preferred I/O size (the block size).
    fn block_size(&self) -> u32 {
        4096
    }
    /// A device clients may only read: the export says so
    /// (`NBD_FLAG_READ_ONLY`), and writes, trims and zero writes get
    /// EPERM without reaching the device.
    fn read_only(&self) -> bool {
        false
    }
    /// `len` bytes from `offset` as runs (bytes, unallocated) in order,
    /// covering the range (`NBD_CMD_BLOCK_STATUS`, `base:allocation`): an
    /// unallocated run reads as zeros and need not be copied. One run of
    /// data is always right.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        let _ = offset;
        Ok(vec![(len, false)])
    }
}

/// One export: a name and its device.
#[derive(Clone)]
pub struct Export {
    pub name: String,
    pub device: Arc<dyn BlockDevice>,
}

/// Where to listen.
#[derive(Clone, Debug)]
pub enum Listen {
    Tcp(String),
    Unix(std::path::PathBuf),
}

impl Listen {
    /// `unix:PATH` or a path starting with `/` is a Unix socket, anything
    /// else `HOST:PORT`.
    pub fn parse(s: &str) -> Listen {
        if let Some(p) = s.strip_prefix("unix:") {
            Listen::Unix(p.into())
        } else if s.starts_with('/') {
            Listen::Unix(s.into())
        } else {
            Listen::Tcp(s.to_string())
        }
    }
}

/// A running server: stop it with [`Server::stop`] (what SIGTERM does in
/// the CLI); open connections finish their current request and close.
pub struct Server {
    stop: Arc<AtomicBool>,
    addr: String,
}

impl Server {
    /// Binds and starts accepting in a background thread. With `tls`,
    /// every client must start TLS (`NBD_OPT_STARTTLS`) before anything
    /// else: other options are refused (`NBD_REP_ERR_TLS_REQD`).
    pub fn start(
        listen: &Listen,
        exports: Vec<Export>,
        tls: Option<TlsConfig>,
    ) -> io::Result<Server> {
        let stop = Arc::new(AtomicBool::new(false));
        let exports = Arc::new(exports);
        let (addr, accept): (String, Acceptor) = match listen {
            Listen::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                l.set_nonblocking(true)?;
                let addr = l.local_addr()?.to_string();
                let accept = move || {
                    let (c, _) = l.accept()?;
                    c.set_nonblocking(false)?;
                    let _ = c.set_nodelay(true);
                    Ok(Box::new(c) as Box<dyn Conn>)
                };
                (addr, Box::new(accept))
            }
            Listen::Unix(p) => {
                remove_stale_socket(p)?;
                let l = UnixListener::bind(p)?;
                l.set_nonblocking(true)?;
                let accept = move || {
                    let (c, _) = l.accept()?;
                    c.set_nonblocking(false)?;
                    Ok(Box::new(c) as Box<dyn Conn>)
                };
                (format!("unix:{}", p.display()), Box::new(accept))
            }
        };
        let (s, e) = (stop.clone(), exports.clone());
        let tls = tls.map(Arc::new);
        std::thread::spawn(move || accept_loop(&s, accept, &e, tls));
        Ok(Server { stop, addr })
    }

    /// `HOST:PORT` (with the port chosen when 0 was asked) or `unix:PATH`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A socket file left by a server that died is removed; anything else at
/// the path is an error.
fn remove_stale_socket(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(p).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running server", p.display()),
                ));
            }
            std::fs::remove_file(p)
        }
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", p.display()),
        )),
        Err(_) => Ok(()),
    }
}

/// Takes the next connection from a listener (`WouldBlock` when none).
type Acceptor = Box<dyn FnMut() -> io::Result<Box<dyn Conn>> + Send>;

/// Accepts connections (the listener is non-blocking, so `stop` is
/// seen within 20 ms) and serves each on its own threads.
fn accept_loop(
    stop: &AtomicBool,
    mut accept: Acceptor,
    exports: &Arc<Vec<Export>>,
    tls: Option<Arc<TlsConfig>>,
) {
    while !stop.load(Ordering::SeqCst) {
        match accept() {
            Ok(c) => {
                let (e, tls) = (exports.clone(), tls.clone());
                std::thread::spawn(move || {
                    if let Err(err) = serve(c, &e, tls.as_deref()) {
                        tracing::debug!("nbd connection ended: {err}");
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                tracing::warn!("nbd accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// One connection: handshake (TLS first where the server has it), then
/// requests until DISC or EOF.
fn serve(mut conn: Box<dyn Conn>, exports: &[Export], tls: Option<&TlsConfig>) -> io::Result<()> {
    let mut session = Session {
        tls_required: tls.is_some(),
        ..Session::default()
    };
    loop {
        // (A client that says nothing for 30 s during the handshake is
        // let go.)
        conn.set_timeout(Some(Duration::from_secs(30)))?;
        let mut r = BufReader::with_capacity(256 << 10, conn.try_clone_box()?);
        let mut w = BufWriter::with_capacity(256 << 10, conn.try_clone_box()?);
        match handshake(&mut r, &mut w, exports, &mut session)? {
            Haggled::Aborted => return Ok(()),
            Haggled::StartTls => {
                let Some(cfg) = tls else {
                    return Err(proto("STARTTLS without TLS"));
                };
                // The client waits for the reply before its TLS hello:
                // bytes already here would be read as plaintext.
                if !r.buffer().is_empty() {
                    return Err(proto("data after STARTTLS before the TLS handshake"));
                }
                drop((r, w));
                conn = crate::tls::accept(conn, cfg)?;
                session.secured = true;
            }
            Haggled::Go(export) => {
                // Clients may sit idle between requests for as long as
                // they like.
                conn.set_timeout(None)?;
                w.flush()?;
                let agreed = Agreed {
                    structured: session.structured,
                    base_allocation: session.base_allocation.as_deref() == Some(&export.name),
                };
                return transmission(&mut r, &mut w, &*export.device, agreed);
            }
        }
    }
}

/// What the option haggling has agreed so far (it goes on over TLS
/// after `NBD_OPT_STARTTLS`).
#[derive(Default)]
struct Session {
    /// The greeting was sent and the client's flags read.
    greeted: bool,
    no_zeroes: bool,
    structured: bool,
    /// Nothing but STARTTLS (or ABORT) before TLS.
    tls_required: bool,
    secured: bool,
    /// `base:allocation` selected (`NBD_OPT_SET_META_CONTEXT`), for the
    /// export named then: it holds only if the client goes on to that
    /// export.
    base_allocation: Option<String>,
}

/// What the transmission phase may use.
#[derive(Clone, Copy)]
struct Agreed {
    structured: bool,
    base_allocation: bool,
}

/// How a round of option haggling ended.
enum Haggled<'e> {
    Go(&'e Export),
    Aborted,
    /// TLS agreed: the handshake goes on over it.
    StartTls,
}

fn opt_reply(w: &mut impl Write, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(&OPT_REPLY_MAGIC.to_be_bytes())?;
    w.write_all(&opt.to_be_bytes())?;
    w.write_all(&kind.to_be_bytes())?;
    w.write_all(&(data.len() as u32).to_be_bytes())?;
    w.write_all(data)
}

fn transmission_flags(dev: &dyn BlockDevice) -> u16 {
    let both = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_DF
        | TFLAG_CAN_MULTI_CONN
        | TFLAG_SEND_CACHE;
    match dev.read_only() {
        // (Nothing to trim, zero or write through.)
        true => both | TFLAG_READ_ONLY,
        false => both | TFLAG_SEND_FUA | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES,
    }
}

/// The option haggling, until the client chooses an export, aborts or
/// starts TLS (`session` keeps what was agreed).
fn handshake<'e>(
    r: &mut impl Read,
    w: &mut impl Write,
    exports: &'e [Export],
    session: &mut Session,
) -> io::Result<Haggled<'e>> {
    if !session.greeted {
        greet(r, w, session)?;
    }
    loop {
        let (opt, data) = read_option(r)?;
        let ended = if session.tls_required && !session.secured {
            option_before_tls(w, opt, &data)?
        } else {
            option(w, opt, &data, exports, session)?
        };
        if let Some(haggled) = ended {
            return Ok(haggled);
        }
        w.flush()?;
    }
}

/// Sends the fixed-newstyle greeting and reads the client's flags.
fn greet(r: &mut impl Read, w: &mut impl Write, session: &mut Session) -> io::Result<()> {
    w.write_all(&NBDMAGIC.to_be_bytes())?;
    w.write_all(&IHAVEOPT.to_be_bytes())?;
    w.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())?;
    w.flush()?;
    let client_flags = read_u32(r)?;
    if client_flags & u32::from(FLAG_FIXED_NEWSTYLE) == 0 {
        return Err(proto("client does not speak fixed newstyle"));
    }
    // The protocol: a server that does not know a flag the client set
    // closes the connection (rather than wait for options).
    if client_flags & !u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) != 0 {
        return Err(proto(
            "client set handshake flags this server does not know",
        ));
    }
    session.no_zeroes = client_flags & u32::from(FLAG_NO_ZEROES) != 0;
    session.greeted = true;
    Ok(())
}

/// Reads the client's next option: its number and data.
fn read_option(r: &mut impl Read) -> io::Result<(u32, Vec<u8>)> {
    if read_u64(r)? != IHAVEOPT {
        return Err(proto("bad option magic"));
    }
    let opt = read_u32(r)?;
    let len = read_u32(r)?;
    if len > 64 << 10 {
        return Err(proto("option too long"));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok((opt, data))
}

/// The export named `name`, if there is one.
fn find<'e>(exports: &'e [Export], name: &str) -> Option<&'e Export> {
    // The empty name is the default export (the first).
    if name.is_empty() {
        exports.first()
    } else {
        exports.iter().find(|e| e.name == name)
    }
}

/// Answers an option while TLS is required and not yet on: the end of
/// the haggling (STARTTLS, ABORT), or `None` to go on.
fn option_before_tls<'e>(
    w: &mut impl Write,
    opt: u32,
    data: &[u8],
) -> io::Result<Option<Haggled<'e>>> {
    match opt {
        OPT_STARTTLS if data.is_empty() => {
            opt_reply(w, opt, REP_ACK, &[])?;
            w.flush()?;
            return Ok(Some(Haggled::StartTls));
        }
        OPT_STARTTLS => opt_reply(w, opt, REP_ERR_INVALID, b"STARTTLS takes no data")?,
        OPT_ABORT => {
            opt_reply(w, opt, REP_ACK, &[])?;
            w.flush()?;
            return Ok(Some(Haggled::Aborted));
        }
        // No reply can refuse it: the connection ends.
        OPT_EXPORT_NAME => return Err(proto("EXPORT_NAME before TLS")),
        _ => opt_reply(w, opt, REP_ERR_TLS_REQD, b"this server requires TLS")?,
    }
    Ok(None)
}

/// Answers an option: the end of the haggling (an export chosen, ABORT),
/// or `None` to go on.
fn option<'e>(
    w: &mut impl Write,
    opt: u32,
    data: &[u8],
    exports: &'e [Export],
    session: &mut Session,
) -> io::Result<Option<Haggled<'e>>> {
    match opt {
        OPT_STARTTLS if session.secured => {
            opt_reply(w, opt, REP_ERR_INVALID, b"TLS is already on")?
        }
        OPT_EXPORT_NAME => return export_name(w, data, exports, session.no_zeroes).map(Some),
        OPT_ABORT => {
            opt_reply(w, opt, REP_ACK, &[])?;
            w.flush()?;
            return Ok(Some(Haggled::Aborted));
        }
        OPT_LIST => {
            if !data.is_empty() {
                opt_reply(w, opt, REP_ERR_INVALID, b"LIST takes no data")?;
            } else {
                for e in exports {
                    let mut d = (e.name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(e.name.as_bytes());
                    opt_reply(w, opt, REP_SERVER, &d)?;
                }
                opt_reply(w, opt, REP_ACK, &[])?;
            }
        }
        OPT_STRUCTURED_REPLY => {
            if data.is_empty() {
                session.structured = true;
                opt_reply(w, opt, REP_ACK, &[])?;
            } else {
                opt_reply(w, opt, REP_ERR_INVALID, &[])?;
            }
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            meta_context(w, opt, data, session, |name| find(exports, name).is_some())?
        }
        OPT_INFO | OPT_GO => return info(w, opt, data, exports),
        _ => opt_reply(w, opt, REP_ERR_UNSUP, &[])?,
    }
    Ok(None)
}

/// `NBD_OPT_EXPORT_NAME`: the export's size and flags sent, it is chosen
/// (an unknown one ends the connection).
fn export_name<'e>(
    w: &mut impl Write,
    data: &[u8],
    exports: &'e [Export],
    no_zeroes: bool,
) -> io::Result<Haggled<'e>> {
    let name = String::from_utf8_lossy(data);
    let Some(e) = find(exports, &name) else {
        return Err(proto(format!("no export {name:?}")));
    };
    w.write_all(&e.device.size().to_be_bytes())?;
    w.write_all(&transmission_flags(&*e.device).to_be_bytes())?;
    if !no_zeroes {
        w.write_all(&[0u8; 124])?;
    }
    w.flush()?;
    Ok(Haggled::Go(e))
}

/// `NBD_OPT_INFO` / `NBD_OPT_GO`: the export's size, flags and (when
/// asked) block sizes; GO chooses it (`Some`).
fn info<'e>(
    w: &mut impl Write,
    opt: u32,
    data: &[u8],
    exports: &'e [Export],
) -> io::Result<Option<Haggled<'e>>> {
    let Some((name, wants)) = parse_info_request(data) else {
        opt_reply(w, opt, REP_ERR_INVALID, b"malformed request")?;
        return Ok(None);
    };
    let Some(e) = find(exports, &name) else {
        let msg = format!("no export named {name:?}");
        opt_reply(w, opt, REP_ERR_UNKNOWN, msg.as_bytes())?;
        return Ok(None);
    };
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&e.device.size().to_be_bytes());
    d.extend_from_slice(&transmission_flags(&*e.device).to_be_bytes());
    opt_reply(w, opt, REP_INFO, &d)?;
    if wants.contains(&INFO_BLOCK_SIZE) {
        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&e.device.block_size().to_be_bytes());
        d.extend_from_slice(&MAX_REQUEST.to_be_bytes());
        opt_reply(w, opt, REP_INFO, &d)?;
    }
    opt_reply(w, opt, REP_ACK, &[])?;
    if opt == OPT_GO {
        w.flush()?;
        return Ok(Some(Haggled::Go(e)));
    }
    Ok(None)
}

/// `NBD_OPT_LIST_META_CONTEXT` / `SET_META_CONTEXT`: `base:allocation`
/// is the one context (`base:` lists it, as does an empty list of
/// queries); SET needs structured replies first and selects it or
/// nothing.
fn meta_context(
    w: &mut impl Write,
    opt: u32,
    data: &[u8],
    session: &mut Session,
    known: impl Fn(&str) -> bool,
) -> io::Result<()> {
    let set = opt == OPT_SET_META_CONTEXT;
    if set {
        // (A SET replaces what was selected, even one that fails.)
        session.base_allocation = None;
    }
    let Some((name, queries)) = parse_meta_request(data) else {
        return opt_reply(w, opt, REP_ERR_INVALID, b"malformed request");
    };
    if set && !session.structured {
        return opt_reply(w, opt, REP_ERR_INVALID, b"structured replies first");
    }
    if !known(&name) {
        let msg = format!("no export named {name:?}");
        return opt_reply(w, opt, REP_ERR_UNKNOWN, msg.as_bytes());
    }
    let wanted = match set {
        true => queries.iter().any(|q| q == BASE_ALLOCATION),
        false => queries.is_empty() || queries.iter().any(|q| q == BASE_ALLOCATION || q == "base:"),
    };
    if set && wanted {
        session.base_allocation = Some(name);
    }
    if wanted {
        // (A listed context's id is 0: only SET gives one.)
        let id = if set { BASE_ALLOCATION_ID } else { 0 };
        let mut d = id.to_be_bytes().to_vec();
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        opt_reply(w, opt, REP_META_CONTEXT, &d)?;
    }
    opt_reply(w, opt, REP_ACK, &[])
}

/// Meta-context request data: name length, name, count, queries (each
/// length, text).
fn parse_meta_request(d: &[u8]) -> Option<(String, Vec<String>)> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(
            d.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    let n = u32_at(0)? as usize;
    let name = String::from_utf8(d.get(4..4usize.checked_add(n)?)?.to_vec()).ok()?;
    let mut at = 4 + n;
    let count = u32_at(at)?;
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = u32_at(at)? as usize;
        at += 4;
        let q = d.get(at..at.checked_add(len)?)?;
        queries.push(String::from_utf8_lossy(q).into_owned());
        at += len;
    }
    (at == d.len()).then_some((name, queries))
}

/// `NBD_OPT_INFO`/`GO` data: name length, name, count, info types.
fn parse_info_request(d: &[u8]) -> Option<(String, Vec<u16>)> {
    let n = u32::from_be_bytes(d.get(..4)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(d.get(4..4 + n)?).ok()?.to_string();
    let rest = d.get(4 + n..)?;
    let k = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let infos = rest.get(2..2 + 2 * k)?;
    if rest.len() != 2 + 2 * k {
        return None;
    }
    Some((
        name,
        infos
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}

struct Request {
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    len: u32,
}

fn read_request(r: &mut impl Read) -> io::Result<Request> {
    if read_u32(r)? != REQUEST_MAGIC {
        return Err(proto("bad request magic"));
    }
    Ok(Request {
        flags: read_u16(r)?,
        kind: read_u16(r)?,
        handle: read_u64(r)?,
        offset: read_u64(r)?,
        len: read_u32(r)?,
    })
}

fn simple_reply(w: &mut impl Write, handle: u64, err: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(&SIMPLE_REPLY_MAGIC.to_be_bytes())?;
    w.write_all(&err.to_be_bytes())?;
    w.write_all(&handle.to_be_bytes())?;
    w.write_all(data)
}

fn chunk_header(
    w: &mut impl Write,
    flags: u16,
    kind: u16,
    handle: u64,
    len: u32,
) -> io::Result<()> {
    w.write_all(&STRUCTURED_REPLY_MAGIC.to_be_bytes())?;
    w.write_all(&flags.to_be_bytes())?;
    w.write_all(&kind.to_be_bytes())?;
    w.write_all(&handle.to_be_bytes())?;
    w.write_all(&len.to_be_bytes())
}

/// An error answer, simple or structured.
fn error_reply(w: &mut impl Write, structured: bool, handle: u64, err: u32) -> io::Result<()> {
    if structured {
        chunk_header(w, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6)?;
        w.write_all(&err.to_be_bytes())?;
        w.write_all(&0u16.to_be_bytes())
    } else {
        simple_reply(w, handle, err, &[])
    }
}

pub(crate) fn errno(e: &io::Error) -> u32 {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => ENOSPC,
        _ if e.kind() == io::ErrorKind::StorageFull => ENOSPC,
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS) => EPERM,
        _ if e.kind() == io::ErrorKind::InvalidInput => EINVAL,
        _ => EIO,
    }
}

/// A structured read answer: data chunks, and holes for the zero ranges
/// the device reported (unless the client forbade fragmenting).
fn structured_read(
    w: &mut impl Write,
    req: &Request,
    buf: &[u8],
    zeros: &[(u64, u64)],
) -> io::Result<()> {
    let mut pieces: Vec<(u64, u64, bool)> = Vec::new();
    let mut at = 0u64;
    if req.flags & CMD_FLAG_DF == 0 {
        for &(z0, z1) in zeros {
            let (z0, z1) = (z0.max(at), z1.min(buf.len() as u64));
            if z1 <= z0 {
                continue;
            }
            if z0 > at {
                pieces.push((at, z0, false));
            }
            pieces.push((z0, z1, true));
            at = z1;
        }
    }
    if at < buf.len() as u64 || pieces.is_empty() {
        pieces.push((at, buf.len() as u64, false));
    }
    let last = pieces.len() - 1;
    for (i, (a, b, hole)) in pieces.into_iter().enumerate() {
        let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
        if hole {
            chunk_header(w, flags, REPLY_TYPE_OFFSET_HOLE, req.handle, 12)?;
            w.write_all(&(req.offset + a).to_be_bytes())?;
            w.write_all(&((b - a) as u32).to_be_bytes())?;
        } else {
            chunk_header(
                w,
                flags,
                REPLY_TYPE_OFFSET_DATA,
                req.handle,
                8 + (b - a) as u32,
            )?;
            w.write_all(&(req.offset + a).to_be_bytes())?;
            w.write_all(&buf[a as usize..b as usize])?;
        }
    }
    Ok(())
}

/// Requests served at once per connection (clients keep several in
/// flight: qemu, nbdcopy, fio with an iodepth).
const WORKERS: usize = 8;

/// The reading side of a connection, taken in turns by its workers.
struct Input<'a> {
    r: &'a mut BufReader<Box<dyn Conn>>,
    /// How the request stream ended (DISC, EOF, an error), once it has.
    ended: Option<io::Result<()>>,
}

/// Requests until DISC or EOF, served by [`WORKERS`] threads in turns
/// (as nbdkit's parallel model does): a worker takes the reading side,
/// reads one request (and its payload), lets the next worker read while
/// it serves it, and sends the reply whole as soon as it is ready — so
/// replies may come back out of order, as the protocol allows (the handle
/// says which request they answer). No hand-off between threads per
/// request.
fn transmission(
    r: &mut BufReader<Box<dyn Conn>>,
    w: &mut BufWriter<Box<dyn Conn>>,
    dev: &dyn BlockDevice,
    agreed: Agreed,
) -> io::Result<()> {
    let input = std::sync::Mutex::new(Input { r, ended: None });
    let out = std::sync::Mutex::new(w);
    let send = |reply: &[u8]| -> io::Result<()> {
        let mut w = out.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(reply)?;
        w.flush()
    };
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            let (input, send) = (&input, &send);
            s.spawn(move || serve_in_turn(input, send, dev, agreed));
        }
    });
    let ended = input.into_inner().unwrap_or_else(|e| e.into_inner()).ended;
    ended.unwrap_or(Ok(()))
}

/// One worker of [`transmission`].
fn serve_in_turn(
    input: &std::sync::Mutex<Input<'_>>,
    send: &dyn Fn(&[u8]) -> io::Result<()>,
    dev: &dyn BlockDevice,
    agreed: Agreed,
) {
    let mut buf = Vec::new();
    loop {
        let (req, payload) = {
            let mut i = input.lock().unwrap_or_else(|e| e.into_inner());
            if i.ended.is_some() {
                return;
            }
            match next_request(i.r, send, agreed.structured) {
                Ok(Some(q)) => q,
                Ok(None) => {
                    i.ended = Some(Ok(()));
                    return;
                }
                Err(e) => {
                    i.ended = Some(Err(e));
                    return;
                }
            }
        };
        buf.clear();
        if let Err(e) = answer(&mut buf, &req, payload, dev, agreed).and_then(|_| send(&buf)) {
            // The connection is broken: the others stop at their next turn.
            let mut i = input.lock().unwrap_or_else(|e| e.into_inner());
            i.ended.get_or_insert(Err(e));
            return;
        }
    }
}

/// The next request and its payload; `None` at DISC or EOF.
fn next_request(
    r: &mut BufReader<Box<dyn Conn>>,
    send: &dyn Fn(&[u8]) -> io::Result<()>,
    structured: bool,
) -> io::Result<Option<(Request, Vec<u8>)>> {
    let req = match read_request(r) {
        Ok(q) => q,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut payload = Vec::new();
    match req.kind {
        CMD_DISC => return Ok(None),
        CMD_WRITE if req.len > MAX_REQUEST => {
            // The payload cannot be skipped safely: answer, then end.
            let mut b = Vec::new();
            error_reply(&mut b, structured, req.handle, EOVERFLOW)?;
            send(&b)?;
            return Err(proto("write longer than the maximum"));
        }
        CMD_WRITE => {
            // Read into fresh capacity: no zero-filling first.
            payload.reserve_exact(req.len as usize);
            let got = r
                .by_ref()
                .take(u64::from(req.len))
                .read_to_end(&mut payload)?;
            if got != req.len as usize {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        _ => {}
    }
    Ok(Some((req, payload)))
}

/// The reply to one request, into `w`.
fn answer(
    w: &mut Vec<u8>,
    req: &Request,
    mut buf: Vec<u8>,
    dev: &dyn BlockDevice,
    agreed: Agreed,
) -> io::Result<()> {
    let structured = agreed.structured;
    let size = dev.size();
    let in_range = req
        .offset
        .checked_add(u64::from(req.len))
        .is_some_and(|end| end <= size);
    let fua = req.flags & CMD_FLAG_FUA != 0;
    match req.kind {
        CMD_READ => {
            if req.len > MAX_REQUEST {
                error_reply(w, structured, req.handle, EOVERFLOW)
            } else if !in_range {
                error_reply(w, structured, req.handle, EINVAL)
            } else {
                buf.resize(req.len as usize, 0);
                match dev.read(req.offset, &mut buf) {
                    Ok(zeros) if structured => structured_read(w, req, &buf, &zeros),
                    Ok(_) => simple_reply(w, req.handle, 0, &buf),
                    Err(e) => error_reply(w, structured, req.handle, errno(&e)),
                }
            }
        }
        CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES if dev.read_only() => {
            done(w, structured, req.handle, Err(EPERM))
        }
        CMD_WRITE => {
            let res = if !in_range {
                Err(ENOSPC)
            } else {
                dev.write(req.offset, buf, fua).map_err(|e| errno(&e))
            };
            done(w, structured, req.handle, res)
        }
        CMD_FLUSH => done(
            w,
            structured,
            req.handle,
            dev.flush().map_err(|e| errno(&e)),
        ),
        CMD_TRIM | CMD_WRITE_ZEROES => {
            let res = if !in_range {
                Err(ENOSPC)
            } else if req.kind == CMD_TRIM {
                dev.trim(req.offset, u64::from(req.len), fua)
                    .map_err(|e| errno(&e))
            } else {
                dev.write_zeroes(req.offset, u64::from(req.len), fua)
                    .map_err(|e| errno(&e))
            };
            done(w, structured, req.handle, res)
        }
        CMD_CACHE => {
            let res = if in_range { Ok(()) } else { Err(EINVAL) };
            done(w, structured, req.handle, res)
        }
        CMD_BLOCK_STATUS if agreed.base_allocation && in_range && req.len > 0 => {
            match dev.extents(req.offset, u64::from(req.len)) {
                Ok(runs) => block_status(w, req, &runs),
                Err(e) => error_reply(w, structured, req.handle, errno(&e)),
            }
        }
        CMD_BLOCK_STATUS => error_reply(w, structured, req.handle, EINVAL),
        _ => error_reply(w, structured, req.handle, ENOTSUP),
    }
}

/// The `base:allocation` extents of a BLOCK_STATUS request, one chunk
/// (at most one extent with `REQ_ONE`; none past the request).
fn block_status(w: &mut impl Write, req: &Request, runs: &[(u64, bool)]) -> io::Result<()> {
    let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    let mut left = u64::from(req.len);
    // (A reply needs one extent at least: with none told, one of data,
    // which is always right.)
    let data = [(u64::from(req.len), false)];
    let runs = if runs.iter().any(|r| r.0 > 0) {
        runs
    } else {
        &data[..]
    };
    for &(len, hole) in runs.iter().take(1 << 20) {
        let len = len.min(left);
        if len == 0 {
            continue;
        }
        let state = if hole { STATE_HOLE | STATE_ZERO } else { 0 };
        // (len ≤ the request's u32 length.)
        d.extend_from_slice(&(len as u32).to_be_bytes());
        d.extend_from_slice(&state.to_be_bytes());
        left -= len;
        if req.flags & CMD_FLAG_REQ_ONE != 0 || left == 0 {
            break;
        }
    }
    chunk_header(
        w,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        req.handle,
        d.len() as u32,
    )?;
    w.write_all(&d)
}

/// The answer to a command without data.
fn done(w: &mut impl Write, structured: bool, handle: u64, res: Result<(), u32>) -> io::Result<()> {
    match res {
        Ok(()) if structured => chunk_header(w, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0),
        Ok(()) => simple_reply(w, handle, 0, &[]),
        Err(e) => error_reply(w, structured, handle, e),
    }
}
