//! `strata volume serve --tls-certificates`: NBD over TLS with real
//! clients (nbdcopy and nbdinfo through libnbd's GnuTLS, qemu-img through
//! its tls-creds-x509), certificates made by `openssl`.

mod common;

use common::nbd::*;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Whether `openssl` runs here (a message when not: the test skips).
fn have_openssl() -> bool {
    let ok = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("openssl is missing: skipping (apt-get install openssl)");
    }
    ok
}

/// Certificate directories under `root`, laid out as qemu's and
/// libnbd's: `srv` (the server's certificate for 127.0.0.1 and its key,
/// and the CA), `cli` (the CA, and a client certificate it signed),
/// `foreign` (the CA, and a client certificate another CA signed),
/// `nocert` (the CA only).
struct Certs {
    srv: PathBuf,
    cli: PathBuf,
    foreign: PathBuf,
    nocert: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    sh(Command::new("openssl").current_dir(dir).args(args));
}

/// A P-256 key `NAME-key.pem` and a certificate `NAME-cert.pem`: signed by
/// `ca` (a leaf, for `usage`, naming `san`), or self-signed (a CA).
fn cert(dir: &Path, name: &str, ca: Option<&str>, san: &str, usage: &str) {
    let (key, crt) = (format!("{name}-key.pem"), format!("{name}-cert.pem"));
    let subj = format!("/CN={name}");
    let new_key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let Some(ca) = ca else {
        let mut a = vec![
            "req", "-x509", "-days", "30", "-subj", &subj, "-keyout", &key,
        ];
        a.extend(new_key);
        a.extend(["-out", &crt]);
        return openssl(dir, &a);
    };
    let (csr, ext) = (format!("{name}.csr"), format!("{name}.ext"));
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"),
    )
    .unwrap();
    let mut a = vec!["req", "-subj", &subj, "-keyout", &key, "-out", &csr];
    a.extend(new_key);
    openssl(dir, &a);
    let (ca_crt, ca_key) = (format!("{ca}-cert.pem"), format!("{ca}-key.pem"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    );
}

fn certs(root: &Path) -> Certs {
    let work = root.join("pki");
    std::fs::create_dir_all(&work).unwrap();
    cert(&work, "ca", None, "", "");
    cert(&work, "other-ca", None, "", "");
    cert(
        &work,
        "server",
        Some("ca"),
        "IP:127.0.0.1,DNS:localhost",
        "serverAuth",
    );
    cert(&work, "client", Some("ca"), "DNS:client", "clientAuth");
    cert(
        &work,
        "stranger",
        Some("other-ca"),
        "DNS:client",
        "clientAuth",
    );
    let dir = |name: &str, files: &[(&str, &str)]| -> PathBuf {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (from, to) in files {
            std::fs::copy(work.join(from), d.join(to)).unwrap();
        }
        d
    };
    let ca = ("ca-cert.pem", "ca-cert.pem");
    Certs {
        srv: dir(
            "srv",
            &[
                ca,
                ("server-cert.pem", "server-cert.pem"),
                ("server-key.pem", "server-key.pem"),
            ],
        ),
        cli: dir(
            "cli",
            &[
                ca,
                ("client-cert.pem", "client-cert.pem"),
                ("client-key.pem", "client-key.pem"),
            ],
        ),
        foreign: dir(
            "foreign",
            &[
                ca,
                ("stranger-cert.pem", "client-cert.pem"),
                ("stranger-key.pem", "client-key.pem"),
            ],
        ),
        nocert: dir("nocert", &[ca]),
    }
}

fn serve_tls(r: &Repo, srv: &Path, verify_peer: bool) -> Served {
    let mut args = vec!["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"];
    args.extend(["--tls-certificates", path_str(srv)]);
    if verify_peer {
        args.push("--tls-verify-peer");
    }
    serve_cmd(r.cmd(&args))
}

/// The served volume's URL for libnbd, with the client's certificates.
fn url(s: &Served, dir: &Path) -> String {
    format!("{}?tls-certificates={}", s.url, dir.display())
}

/// `nbdinfo --size` of `url`: the size, or the error it printed.
fn nbd_size(url: &str) -> Result<u64, String> {
    let o = Command::new("nbdinfo")
        .args(["--size", url])
        .output()
        .unwrap();
    match o.status.success() {
        true => Ok(String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()),
        false => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
    }
}

/// One option over a fresh plain connection (no TLS): the reply's type.
fn plain_option(addr: &str, opt: u32, data: &[u8]) -> u32 {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 18];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap();
    c.write_all(b"IHAVEOPT").unwrap();
    c.write_all(&opt.to_be_bytes()).unwrap();
    c.write_all(&(data.len() as u32).to_be_bytes()).unwrap();
    c.write_all(data).unwrap();
    let mut b = [0u8; 20];
    c.read_exact(&mut b).unwrap();
    assert_eq!(u32::from_be_bytes(b[8..12].try_into().unwrap()), opt);
    u32::from_be_bytes(b[12..16].try_into().unwrap())
}

/// Data written over TLS by nbdcopy reads back through qemu-img's TLS; a
/// client without TLS is refused before it learns anything (every option
/// but STARTTLS answered "TLS required", EXPORT_NAME ends the
/// connection), and the server goes on serving.
#[test]
fn nbd_over_tls_with_nbdcopy_and_qemu_img() {
    if !(have("nbdcopy") && have("qemu-img") && have("nbdinfo") && have_openssl()) {
        return;
    }
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", "16M"]);
    let c = certs(&r.scratch("tls"));
    let s = serve_tls(&r, &c.srv, false);
    assert!(s.url.starts_with("nbds://127.0.0.1:"), "{}", s.url);
    let data = prng(41, 16 << 20);
    let img = r.scratch("in.raw");
    std::fs::write(&img, &data).unwrap();
    sh(Command::new("nbdcopy").arg(&img).arg(url(&s, &c.cli)));
    // qemu-img: x509 credentials from the same directory.
    let out = r.scratch("out.raw");
    let (host, port) = s.addr.rsplit_once(':').unwrap();
    sh(Command::new("qemu-img")
        .args(["convert", "-O", "raw", "--object"])
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            c.cli.display()
        ))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,host={host},port={port},export=v,tls-creds=tls0"
        ))
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "read back over TLS");
    // Without TLS: refused.
    let plain = s.url.replacen("nbds://", "nbd://", 1);
    assert!(nbd_size(&plain).is_err(), "a plain client got in");
    const LIST: u32 = 3;
    const STARTTLS: u32 = 5;
    const STRUCTURED_REPLY: u32 = 8;
    const TLS_REQD: u32 = (1 << 31) + 5;
    const INVALID: u32 = (1 << 31) + 3;
    assert_eq!(plain_option(&s.addr, LIST, &[]), TLS_REQD);
    assert_eq!(plain_option(&s.addr, STRUCTURED_REPLY, &[]), TLS_REQD);
    assert_eq!(plain_option(&s.addr, STARTTLS, b"x"), INVALID);
    {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 18];
        c.read_exact(&mut b).unwrap();
        c.write_all(&3u32.to_be_bytes()).unwrap();
        c.write_all(b"IHAVEOPT").unwrap();
        c.write_all(&1u32.to_be_bytes()).unwrap(); // EXPORT_NAME
        c.write_all(&1u32.to_be_bytes()).unwrap();
        c.write_all(b"v").unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest)
            .expect("the connection closed (not left hanging)");
        assert!(
            rest.is_empty(),
            "EXPORT_NAME before TLS got {} bytes",
            rest.len()
        );
    }
    assert_eq!(nbd_size(&url(&s, &c.cli)), Ok(16 << 20), "served still");
    stop(s);
    let v = r.json(&["volume", "check", "v", "--read-data"]);
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");
}

/// `--tls-verify-peer`: only a client with a certificate the CA signed
/// gets in; one with a certificate another CA signed (which GnuTLS may
/// not even offer, the server naming its CA), or without any, is refused.
#[test]
fn tls_verify_peer_admits_only_certified_clients() {
    if !(have("nbdinfo") && have_openssl()) {
        return;
    }
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", "8M"]);
    let c = certs(&r.scratch("tls"));
    let s = serve_tls(&r, &c.srv, true);
    assert_eq!(nbd_size(&url(&s, &c.cli)), Ok(8 << 20));
    assert!(
        nbd_size(&url(&s, &c.foreign)).is_err(),
        "a foreign client got in"
    );
    assert!(
        nbd_size(&url(&s, &c.nocert)).is_err(),
        "a client without a certificate got in"
    );
    assert_eq!(nbd_size(&url(&s, &c.cli)), Ok(8 << 20), "served still");
    stop(s);
}

/// The error a command that had to fail printed.
trait Fails {
    fn fails_with(self) -> String;
}
impl Fails for Run {
    fn fails_with(self) -> String {
        assert!(self.code != 0, "{}: succeeded", self.what);
        self.stderr
    }
}

/// Certificates that cannot be loaded stop `serve` before it listens,
/// saying which file; listening beyond loopback without TLS warns.
#[test]
fn tls_settings_errors_and_the_open_network_warning() {
    let r = Repo::with_init(&[], None);
    r.json(&["volume", "create", "v", "--size", "8M"]);
    let empty = r.scratch("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // `volume serve v` on loopback with `more`: the error it stops with.
    let refused = |more: &[&str]| {
        let mut args = vec!["volume", "serve", "v", "--listen", "127.0.0.1:0"];
        args.extend(more);
        r.run(&args).fails_with()
    };
    let e = refused(&["--tls-certificates"]);
    assert!(e.contains("--tls-certificates"), "{e}");
    let e = refused(&["--tls-certificates", path_str(&empty)]);
    assert!(e.contains("server-cert.pem"), "{e}");
    // Not PEM at all.
    std::fs::write(empty.join("server-cert.pem"), b"not a certificate").unwrap();
    std::fs::write(empty.join("server-key.pem"), b"not a key").unwrap();
    let e = refused(&["--tls-certificates", path_str(&empty)]);
    assert!(
        e.contains("server-cert.pem") && e.contains("no certificate"),
        "{e}"
    );
    let e = refused(&["--tls-verify-peer"]);
    assert!(e.contains("--tls-certificates"), "{e}");
    // A server without TLS answers STARTTLS "unsupported" and goes on.
    let s = serve_cmd(r.cmd(&["volume", "serve", "v", "--listen", "127.0.0.1:0", "--json"]));
    const UNSUP: u32 = (1 << 31) + 1;
    const REP_SERVER: u32 = 2;
    assert_eq!(plain_option(&s.addr, 5, &[]), UNSUP);
    assert_eq!(
        plain_option(&s.addr, 3, &[]),
        REP_SERVER,
        "LIST without TLS"
    );
    stop(s);
    // Beyond loopback without TLS: served, with a warning that says how.
    let mut c = r.cmd(&["volume", "serve", "v", "--listen", "0.0.0.0:0"]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(
        line.contains("anyone who can reach") && line.contains("--tls-certificates"),
        "{line}"
    );
}
