//! `strata mount MOUNTPOINT`: the repository as a read-only file system
//! (FUSE, `strata-mount`), served until it is unmounted or the command
//! gets Ctrl-C / SIGTERM.

use anyhow::Result;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use strata_mount::{Mount, MountOptions};
use strata_store::Repository;

/// Arguments of `strata mount`.
#[derive(clap::Args)]
pub struct MountArgs {
    /// Directory to mount the repository on (must exist). Runs in the
    /// foreground until it is unmounted (`fusermount3 -u MOUNTPOINT`) or
    /// gets Ctrl-C / SIGTERM.
    pub mountpoint: PathBuf,
    /// Let other users use the mount (non-root users need
    /// `user_allow_other` in /etc/fuse.conf). The kernel then checks the
    /// snapshot's permissions, and the mount goes away by itself should
    /// strata die.
    #[arg(long)]
    pub allow_other: bool,
    /// Only these series (repeatable; all by default).
    #[arg(long, value_name = "NAME")]
    pub series: Vec<String>,
    /// Memory for recently read regions (decrypted, decompressed), in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub cache_mib: usize,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// `strata mount`: serves the repository until unmounted or signalled.
pub fn run(repo: Repository, out: &crate::output::Out, a: &MountArgs) -> Result<i32> {
    let opts = MountOptions {
        mountpoint: a.mountpoint.clone(),
        allow_other: a.allow_other,
        series: a.series.clone(),
        cache_bytes: a.cache_mib.saturating_mul(1 << 20),
    };
    // Before mounting, so that a signal from now on unmounts.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let m = Mount::start(crate::cli::tiers(&repo), &opts)?;
    for (id, e) in &m.left_out {
        out.warn(&format!("snapshot {id} left out: {e}"));
    }
    let (n_snaps, n_series, at) = (m.snapshots, m.series, m.mountpoint.display().to_string());
    out.result(
        &serde_json::json!({"mountpoint": at, "snapshots": n_snaps, "series": n_series}),
        || {
            format!(
                "{n_snaps} snapshots of {n_series} series mounted at {at}; \
                 unmount with `fusermount3 -u {at}` or Ctrl-C"
            )
        },
    );
    m.wait(&STOP)?;
    Ok(0)
}
