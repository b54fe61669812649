//! TLS for NBD connections (`NBD_OPT_STARTTLS`), as `qemu-nbd` and
//! `nbdkit` offer it: X.509 certificates from a directory laid out as
//! theirs are (`server-cert.pem`, `server-key.pem`, and `ca-cert.pem` when
//! clients must show a certificate signed by it).
//!
//! After the TLS handshake a connection's TLS state is driven by two
//! threads of its own: one reads records from the network and hands the
//! plaintext on, the other encrypts what the NBD side writes. The NBD
//! side sees one end of a socket pair — a plain stream it can clone
//! for its reader and its workers, as it does a TCP connection.

use crate::conn::Conn;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a TLS configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0}: {1}")]
    Read(PathBuf, String),
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A server's TLS settings (cheap to clone).
#[derive(Clone)]
pub struct TlsConfig {
    server: Arc<ServerConfig>,
    verify_peer: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("verify_peer", &self.verify_peer)
            .finish_non_exhaustive()
    }
}

fn certs(p: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(p)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Read(p.into(), e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(p.into()));
    }
    Ok(certs)
}

impl TlsConfig {
    /// The certificate and key in `dir` (`server-cert.pem`: the chain,
    /// the server's own first; `server-key.pem`). With `verify_peer`,
    /// clients must show a certificate `dir/ca-cert.pem` signed.
    pub fn from_dir(dir: &Path, verify_peer: bool) -> Result<TlsConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = certs(&dir.join("server-cert.pem"))?;
        let kp = dir.join("server-key.pem");
        let key =
            PrivateKeyDer::from_pem_file(&kp).map_err(|e| TlsError::Read(kp, e.to_string()))?;
        let config = |e: rustls::Error| TlsError::Config(e.to_string());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config)?;
        let builder = if verify_peer {
            let mut roots = RootCertStore::empty();
            for c in certs(&dir.join("ca-cert.pem"))? {
                roots.add(c).map_err(config)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let server = builder.with_single_cert(chain, key).map_err(config)?;
        Ok(TlsConfig {
            server: Arc::new(server),
            verify_peer,
        })
    }

    /// Whether clients must show a certificate.
    pub fn verifies_peer(&self) -> bool {
        self.verify_peer
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The TLS state and the network side's writer. Locked in that order;
/// a thread holds the writer, not the state, while bytes go out (the
/// other thread meanwhile decrypts what comes in), so records leave in
/// the order they were made.
struct Shared {
    tls: Mutex<ServerConnection>,
    net_out: Mutex<Box<dyn Conn>>,
}

impl Shared {
    /// Sends what the TLS state has to send (records made under `tls`,
    /// in the caller's buffer `out`, kept from one call to the next).
    fn send(&self, mut tls: MutexGuard<'_, ServerConnection>, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        while tls.wants_write() {
            tls.write_tls(out)?;
        }
        if out.is_empty() {
            return Ok(());
        }
        let mut net = lock(&self.net_out);
        drop(tls);
        let sent = net.write_all(out).and_then(|_| net.flush());
        // (A long reply's records are not kept for the connection's life.)
        if out.capacity() > 4 << 20 {
            *out = Vec::new();
        }
        sent
    }
}

/// Runs the TLS handshake on `net` (an NBD connection that has just
/// agreed to `NBD_OPT_STARTTLS`); returns the stream the NBD side goes on
/// with, in plaintext.
pub(crate) fn accept(mut net: Box<dyn Conn>, cfg: &TlsConfig) -> io::Result<Box<dyn Conn>> {
    let mut tls = ServerConnection::new(cfg.server.clone()).map_err(io::Error::other)?;
    // Replies may be long (32 MiB reads): what the NBD side writes is
    // taken whole and sent as it is encrypted.
    tls.set_buffer_limit(None);
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut net) {
            // (The alert that says why, if there is one to send.)
            let mut out = Vec::new();
            while tls.wants_write() && tls.write_tls(&mut out).is_ok() {}
            let _ = net.write_all(&out);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake: {e}"),
            ));
        }
    }
    // The NBD side times its own reads from here on.
    net.set_timeout(None)?;
    let (nbd_side, pump) = UnixStream::pair()?;
    let net_in = net.try_clone_box()?;
    let shared = Arc::new(Shared {
        tls: Mutex::new(tls),
        net_out: Mutex::new(net),
    });
    let (s, to_nbd) = (shared.clone(), pump.try_clone()?);
    std::thread::Builder::new()
        .name("strata-nbd-tls-in".into())
        .spawn(move || {
            if let Err(e) = inbound(&s, net_in, to_nbd) {
                tracing::debug!("nbd TLS connection, inbound: {e}");
            }
        })?;
    std::thread::Builder::new()
        .name("strata-nbd-tls-out".into())
        .spawn(move || {
            if let Err(e) = outbound(&shared, pump) {
                tracing::debug!("nbd TLS connection, outbound: {e}");
            }
        })?;
    Ok(Box::new(nbd_side))
}

/// Network to the NBD side: records in, plaintext out. At the end (the
/// client's close, or an error) the NBD side reads end of file.
fn inbound(s: &Shared, mut net: Box<dyn Conn>, mut to_nbd: UnixStream) -> io::Result<()> {
    let mut buf = vec![0u8; 256 << 10];
    let (mut data, mut out) = (vec![0u8; 512 << 10], Vec::new());
    let result = (|| -> io::Result<()> {
        // (What came with the end of the handshake is there already.)
        let mut n = 0;
        loop {
            let mut filled = 0;
            let mut closed = false;
            let mut tls = lock(&s.tls);
            let mut rest = &buf[..n];
            loop {
                // (Nothing is taken after the client's close_notify:
                // what follows it is dropped, not read again and again.)
                let took = match rest.is_empty() {
                    true => 0,
                    false => tls.read_tls(&mut rest)?,
                };
                if took > 0 {
                    if let Err(e) = tls.process_new_packets() {
                        // The alert goes out, then the connection ends.
                        s.send(tls, &mut out)?;
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                }
                closed |= drain(&mut tls, &mut data, &mut filled)?;
                if rest.is_empty() || closed || took == 0 {
                    break;
                }
            }
            s.send(tls, &mut out)?;
            to_nbd.write_all(&data[..filled])?;
            if closed {
                return Ok(());
            }
            n = loop {
                match net.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
        }
    })();
    let _ = to_nbd.shutdown(std::net::Shutdown::Write);
    result
}

/// Moves the plaintext the TLS state holds into `data` after its first
/// `filled` bytes (read into it, not through a buffer of its own; grown
/// when short); whether the client has closed its side (`close_notify`).
fn drain(tls: &mut ServerConnection, data: &mut Vec<u8>, filled: &mut usize) -> io::Result<bool> {
    loop {
        if data.len() - *filled < 16 << 10 {
            data.resize(data.len() * 2, 0);
        }
        match tls.reader().read(&mut data[*filled..]) {
            Ok(0) => return Ok(true),
            Ok(k) => *filled += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// The NBD side to the network: plaintext in, records out. At the end
/// (the NBD side closed) the client is told (`close_notify`) and the
/// network connection shut.
fn outbound(s: &Shared, mut from_nbd: UnixStream) -> io::Result<()> {
    let (mut buf, mut out) = (vec![0u8; 256 << 10], Vec::new());
    let result = (|| -> io::Result<()> {
        loop {
            let n = match from_nbd.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut tls = lock(&s.tls);
            tls.writer().write_all(&buf[..n])?;
            s.send(tls, &mut out)?;
        }
    })();
    let mut tls = lock(&s.tls);
    tls.send_close_notify();
    let _ = s.send(tls, &mut out);
    lock(&s.net_out).shutdown();
    // (The NBD side's writes now fail rather than wait.)
    let _ = from_nbd.shutdown(std::net::Shutdown::Both);
    result
}
