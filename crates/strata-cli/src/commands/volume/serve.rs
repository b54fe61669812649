//! `volume serve`: a volume, or a stored version of one (`--at`), served
//! over NBD until SIGTERM or Ctrl-C.

use super::access::{link_err, Access};
use crate::output::Out;
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use strata_link::VolumesDir;
use strata_volume::nbd::{Export, Listen, Server};
use strata_volume::Volume;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub(super) fn serve(
    cli: &crate::cli::Cli,
    out: &Out,
    root: &VolumesDir,
    name: &str,
    listen: &str,
    tls: Option<strata_volume::tls::TlsConfig>,
) -> Result<i32> {
    big_buffers_from_the_heap();
    strata_link::dir::check_name(name).map_err(link_err)?;
    let dir = root.path.join(name);
    if !dir.join("volume.json").exists() {
        anyhow::bail!("no volume {name:?} (strata volume create {name} --size …)");
    }
    let key = strata_link::keys::key_for_dir(&Access(cli), &dir).map_err(link_err)?;
    let vol =
        Volume::open_keyed(&dir, key.as_ref()).with_context(|| format!("opening volume {name}"))?;
    drop(key);
    // `volume snapshot` of this volume while it is served asks here.
    let control = match strata_volume::control::start(vol.clone(), &dir) {
        Ok(c) => Some(c),
        Err(e) => {
            // Served all the same; only snapshots while served need it.
            out.warn(&format!(
                "no control socket for volume {name} ({e}): `strata volume snapshot {name}` will need the server stopped"
            ));
            None
        }
    };
    let device = vol.clone() as Arc<dyn strata_volume::nbd::BlockDevice>;
    let what = format!("volume {name}");
    let server = announce(out, name, &what, listen, tls, device, serde_json::json!({}))?;
    wait_for_a_signal();
    server.stop();
    drop(control);
    if let Err(e) = vol.close() {
        if disk_full(&e) {
            anyhow::bail!(
                "closing volume {name}: {e}\nthe disk holding the volume is full: every \
                 acknowledged write is kept in its journal; free some space, then serve the \
                 volume again (the journal is replayed)"
            );
        }
        return Err(anyhow::Error::new(e).context("closing the volume"));
    }
    eprintln!("volume {name} closed cleanly");
    Ok(0)
}

/// The TLS settings `--tls-certificates` and `--tls-verify-peer` give.
pub(super) fn tls_config(
    dir: Option<&std::path::Path>,
    verify_peer: bool,
) -> Result<Option<strata_volume::tls::TlsConfig>> {
    let Some(dir) = dir else { return Ok(None) };
    let cfg = strata_volume::tls::TlsConfig::from_dir(dir, verify_peer)
        .with_context(|| format!("loading the TLS certificate and key from {}", dir.display()))?;
    Ok(Some(cfg))
}

/// Request buffers (up to 32 MiB each) come and go with every request:
/// from the heap, reused, rather than a fresh mapping per request whose
/// every page faults in (a tenth of a sequential write's time).
fn big_buffers_from_the_heap() {
    // SAFETY: mallopt only changes allocator thresholds.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Serves `device` as export `name` on `listen` (TLS required with
/// `tls`) and says where (JSON: `extra`'s fields too). SIGTERM and
/// SIGINT from then on ask for a clean close ([`wait_for_a_signal`]).
fn announce(
    out: &Out,
    name: &str,
    what: &str,
    listen: &str,
    tls: Option<strata_volume::tls::TlsConfig>,
    device: Arc<dyn strata_volume::nbd::BlockDevice>,
    extra: serde_json::Value,
) -> Result<Server> {
    // Before anything is said of the server: a signal from then on asks
    // for a clean close.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let secured = tls.is_some();
    let read_only = device.read_only();
    let server = Server::start(
        &Listen::parse(listen),
        vec![Export {
            name: name.to_string(),
            device,
        }],
        tls,
    )
    .with_context(|| format!("cannot listen on {listen}"))?;
    let open_to_the_network = server
        .addr()
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| !a.ip().to_canonical().is_loopback());
    let exposed = (open_to_the_network && !secured).then(|| {
        format!(
            "anyone who can reach {} can read{} {what}, unencrypted: \
             give --tls-certificates DIR (and --tls-verify-peer to admit only clients \
             with a certificate), or listen on 127.0.0.1 or a Unix socket",
            server.addr(),
            if read_only { "" } else { " and write" }
        )
    });
    if let Some(w) = &exposed {
        out.warn(w);
    }
    let scheme = if secured { "nbds" } else { "nbd" };
    let url = match server.addr().strip_prefix("unix:") {
        Some(p) => format!("{scheme}+unix:///{name}?socket={p}"),
        None => format!("{scheme}://{}/{name}", server.addr()),
    };
    let mut doc = serde_json::json!({
        "volume": name, "listening": server.addr(), "url": url, "tls": secured,
        "read_only": read_only, "warning": exposed,
    });
    if let (Some(d), serde_json::Value::Object(more)) = (doc.as_object_mut(), extra) {
        d.extend(more);
    }
    out.result(&doc, || {
        let ro = if read_only { " (read-only)" } else { "" };
        format!("serving {what}{ro} at {url}")
    });
    Ok(server)
}

/// Waits for SIGTERM or SIGINT (see [`announce`]).
fn wait_for_a_signal() {
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `volume serve NAME --at SNAPSHOT`: a stored version, read-only
/// ([`at`]).
pub(super) fn serve_at(
    cli: &crate::cli::Cli,
    out: &Out,
    name: &str,
    (at, cache): (&str, usize),
    listen: &str,
    tls: Option<strata_volume::tls::TlsConfig>,
) -> Result<i32> {
    big_buffers_from_the_heap();
    let repo = crate::cli::open(cli)?;
    let opened =
        strata_link::at::open(&crate::cli::tiers(&repo), name, at, cache).map_err(link_err)?;
    // The recipe decoded to open the image is gone: its memory goes back
    // to the system, not kept for a peak that will not come again.
    // SAFETY: malloc_trim only returns free heap memory.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    let (id, snap) = (&opened.id, &opened.snapshot);
    let extra = serde_json::json!({
        "snapshot": id, "series": snap.series, "version": snap.version,
        "cache_bytes": cache,
    });
    let what = format!(
        "version {} of volume {name} (snapshot {})",
        snap.version,
        crate::output::short(id)
    );
    let server = announce(out, name, &what, listen, tls, opened.image.clone(), extra)?;
    wait_for_a_signal();
    server.stop();
    eprintln!("stopped serving {what}");
    Ok(0)
}

/// Whether `e`, or an error it came from, is a full file system.
fn disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(libc::ENOSPC)
                || io.kind() == std::io::ErrorKind::StorageFull
            {
                return true;
            }
            // An error wrapping another: its source() skips the inner one.
            if io.get_ref().is_some_and(|inner| disk_full(inner)) {
                return true;
            }
        }
        at = e.source();
    }
    false
}
