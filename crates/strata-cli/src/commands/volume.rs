//! `strata volume …`: thin, deduplicated block volumes kept in a local
//! repository (`REPO/volumes/NAME/`), or on this host for a bucket or
//! wherever `--volumes-dir` says (`root.rs`), and served over NBD to real
//! clients (qemu-img, nbdcopy, nbdfuse, fio, a VM's disk), with iDedup's
//! threshold-based inline dedup; their snapshots go to the repository.

use crate::output::{fmt_bytes, Out};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use strata_core::size::parse_size;
use strata_link::VolumesDir;
use strata_volume::Volume;

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a thin block volume (nothing is allocated until written).
    ///
    /// In an encrypted repository the volume is encrypted too (its blocks,
    /// journal and fingerprints; XTS-AES-256 as LUKS, the key from the
    /// repository's): `create`, `serve` and `snapshot` ask for the repository's
    /// password.
    Create(create::CreateArgs),
    /// Serve a volume over NBD until SIGTERM or Ctrl-C.
    ///
    /// Then everything acknowledged is destaged and the volume closed cleanly.
    Serve {
        /// The volume's name (letters, digits, `-`, `_`, `.`).
        name: String,
        /// HOST:PORT, or unix:PATH (or /PATH) for a Unix socket.
        #[arg(long, default_value = "127.0.0.1:10809")]
        listen: String,
        /// Require TLS of every client (NBD STARTTLS), with the X.509
        /// certificate and key in this directory, laid out as qemu-nbd's
        /// and nbdkit's: server-cert.pem (the chain, the server's own
        /// first) and server-key.pem. Clients connect with nbds:// URIs
        /// (`?tls-certificates=DIR` naming a directory with the CA's
        /// ca-cert.pem) or qemu's tls-creds-x509.
        #[arg(long, value_name = "DIR")]
        tls_certificates: Option<std::path::PathBuf>,
        /// Also require a client certificate signed by DIR/ca-cert.pem
        /// (mutual TLS): only clients holding such a certificate and its
        /// key get in.
        #[arg(long, requires = "tls_certificates")]
        tls_verify_peer: bool,
        /// Serve a stored version instead, read-only, straight from the
        /// repository (or its cloud tier), nothing restored first: a
        /// snapshot of series volume:NAME — `latest`, its version
        /// number, or its id. The volume itself is not opened (it may be
        /// served meanwhile, or deleted). A VM can boot from it with a
        /// qcow2 overlay: `qemu-img create -f qcow2 -F raw -b URL top.qcow2`.
        #[arg(long, value_name = "SNAPSHOT")]
        at: Option<String>,
        /// With --at: memory for the version's recently read regions
        /// (decrypted, decompressed), in MiB.
        #[arg(long, value_name = "MIB", requires = "at", default_value_t = 64)]
        cache_mib: usize,
    },
    /// A volume's dedup ratio, cache hit rate, fragmentation and latency.
    ///
    /// Dedup ratio, cache hit rate, duplicate sequence lengths, read
    /// fragmentation, latency percentiles (from the last serve).
    Stats {
        /// The volume's name.
        name: String,
    },
    /// Store the volume's current contents as a snapshot (a version in the repository).
    ///
    /// Series `volume:NAME`, one file `NAME.img` in fixed 4 KiB blocks
    /// (deduplicated against everything the repository holds; holes are not
    /// read). A volume of a local repository (in its `volumes/`, with dedup;
    /// served or stopped) keeps the new blocks for the repository, which writes
    /// a link instead of a second copy (one under `--volumes-dir` or of a
    /// bucket does not: the repository stores a copy). Only the 2 MiB segments
    /// written since the last snapshot are read (everything after a crash of
    /// the server). A served volume is frozen by its server for the snapshot (a
    /// point in time; clients go on writing). `strata restore
    /// volume:NAME@latest --target DIR` writes it back as a sparse image.
    Snapshot {
        /// The volume's name.
        name: String,
        /// Tag the snapshot (repeatable).
        #[arg(long)]
        tag: Vec<String>,
        /// Read every written block, not only what changed since the
        /// last snapshot (a 2 MiB stretch never written, or trimmed or
        /// zeroed, is known to be zeros and not read).
        #[arg(long)]
        read_all: bool,
    },
    /// Check a stopped volume's files against one another, changing nothing.
    ///
    /// The block map names only blocks the data file has, the reference counts
    /// agree with it, the journals read. Exit code 1 if something is wrong.
    Check {
        /// The volume's name.
        name: String,
        /// Read every block in use too, and (with dedup) compare each with
        /// its fingerprint: finds blocks changed on the host's disk, by
        /// the logical blocks that read them. An encrypted volume asks
        /// for the repository's password.
        #[arg(long)]
        read_data: bool,
    },
    /// Change a stopped volume's size.
    ///
    /// Larger (the new blocks read as zeros; nothing is allocated) or, with
    /// `--shrink`, smaller (what lies past the new end is dropped and its space
    /// freed). Clients see the new size when they connect again; the next
    /// snapshot reads everything.
    Resize {
        /// The volume's name.
        name: String,
        /// The new size (e.g. 200G; a multiple of 4 KiB).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Allow a smaller size: the blocks past it are lost.
        #[arg(long)]
        shrink: bool,
    },
    /// Write a stopped volume again in its own block order (fewer, larger disk reads).
    ///
    /// After many overwrites a volume with dedup lies in pieces across its data
    /// file (a log), and reads of a stretch of it become many small disk reads.
    /// The volume is checked first (with dedup: every block against its
    /// fingerprint); the copy is deduplicated again, has the same settings and
    /// key, and takes the volume's place in one step; the volume is locked
    /// until then. Needs free space for the copy. The statistics are the
    /// copy's.
    Defrag {
        /// The volume's name.
        name: String,
    },
    /// Copy a stopped volume into a new one.
    ///
    /// A template for several VMs, or a copy to try something on: the same size
    /// and settings, its own key in an encrypted repository, deduplicated as it
    /// is written, blocks of zeros left unwritten (and 1 MiB stretches never
    /// written not even read). The new volume is there only once whole.
    Copy {
        /// The volume to copy.
        from: String,
        /// The new volume's name (letters, digits, `-`, `_`, `.`).
        to: String,
    },
    /// The repository's volumes.
    List,
    /// Delete a volume (its snapshots stay restorable).
    ///
    /// Refused while it is served. What its snapshots read from its blocks is
    /// stored in the repository again first, so every snapshot stays
    /// restorable.
    Delete {
        /// The volume's name (letters, digits, `-`, `_`, `.`).
        name: String,
        /// Required: the volume's data cannot be recovered afterwards.
        #[arg(long)]
        yes: bool,
    },
}

mod access;
mod create;
mod root;
mod serve;
mod text;

pub(crate) use access::link_err;
use access::{progress_fn, Access};

impl VolumeCmd {
    /// `serve` runs until a signal and handles it itself.
    pub fn serves(&self) -> bool {
        matches!(self, VolumeCmd::Serve { .. })
    }
}

pub fn run(
    cli: &crate::cli::Cli,
    out: &Out,
    cmd: &VolumeCmd,
    volumes_dir: Option<&std::path::Path>,
) -> Result<i32> {
    // A stored version is read from the repository itself, wherever it is
    // (a bucket too): no volumes directory.
    if let VolumeCmd::Serve {
        name,
        listen,
        tls_certificates,
        tls_verify_peer,
        at: Some(at),
        cache_mib,
    } = cmd
    {
        let tls = serve::tls_config(tls_certificates.as_deref(), *tls_verify_peer)?;
        let cache = cache_mib.saturating_mul(1 << 20);
        return serve::serve_at(cli, out, name, (at, cache), listen, tls);
    }
    let root = root::find(cli, volumes_dir)?;
    match cmd {
        VolumeCmd::Create(a) => create::create(cli, out, &root, a),
        VolumeCmd::Serve {
            name,
            listen,
            tls_certificates,
            tls_verify_peer,
            ..
        } => {
            let tls = serve::tls_config(tls_certificates.as_deref(), *tls_verify_peer)?;
            serve::serve(cli, out, &root, name, listen, tls)
        }
        VolumeCmd::Snapshot {
            name,
            tag,
            read_all,
        } => snapshot(cli, out, &root, name, tag, *read_all),
        VolumeCmd::Check { name, read_data } => check(cli, out, &root, name, *read_data),
        VolumeCmd::Resize { name, size, shrink } => {
            let dir = root.existing(name).map_err(link_err)?;
            let old = Volume::resize(&dir, *size, *shrink)
                .with_context(|| format!("resizing volume {name}"))?;
            out.result(
                &serde_json::json!({"volume": name, "old_size": old, "size": size}),
                || format!("volume {name}: {} → {}", fmt_bytes(old), fmt_bytes(*size)),
            );
            Ok(0)
        }
        VolumeCmd::Copy { from, to } => copy(cli, out, &root, from, to),
        VolumeCmd::Defrag { name } => defrag(cli, out, &root, name),
        VolumeCmd::Stats { name } => {
            let dir = root.existing(name).map_err(link_err)?;
            let r = strata_volume::report::report(&dir, name)?;
            let v = serde_json::to_value(&r)?;
            out.result(&v, || text::stats_text(&r));
            Ok(0)
        }
        VolumeCmd::Delete { name, yes } => delete(cli, out, &root, name, *yes),
        VolumeCmd::List => {
            let names = root.list();
            out.result(&serde_json::to_value(&names)?, || text::list_text(&names));
            Ok(0)
        }
    }
}

/// `volume check`.
fn check(
    cli: &crate::cli::Cli,
    out: &Out,
    root: &VolumesDir,
    name: &str,
    read_data: bool,
) -> Result<i32> {
    let pd = crate::cli::progress_for(cli, "check");
    let r = strata_link::manage::check(
        &Access(cli),
        root,
        name,
        read_data,
        &progress_fn(&pd.progress),
    );
    pd.finish();
    let r = r.map_err(link_err)?;
    out.result(&serde_json::to_value(&r)?, || {
        text::check_text(name, &r, read_data)
    });
    Ok(if r.ok() { 0 } else { 1 })
}

/// `volume copy`.
fn copy(cli: &crate::cli::Cli, out: &Out, root: &VolumesDir, from: &str, to: &str) -> Result<i32> {
    let pd = crate::cli::progress_for(cli, "import");
    let r = strata_link::manage::copy(&Access(cli), root, (from, to), &progress_fn(&pd.progress));
    pd.finish();
    let c = r.map_err(link_err)?;
    out.result(
        &serde_json::json!({"volume": to, "from": from, "size": c.size,
            "read_bytes": c.read, "written_bytes": c.written}),
        || {
            format!(
                "volume {to} copied from {from}: {} ({} read, the rest never written; {} not zeros)",
                fmt_bytes(c.size),
                fmt_bytes(c.read),
                fmt_bytes(c.written)
            )
        },
    );
    Ok(0)
}

/// `volume defrag`.
fn defrag(cli: &crate::cli::Cli, out: &Out, root: &VolumesDir, name: &str) -> Result<i32> {
    let mut warnings = Vec::new();
    // (The check, then the copy.)
    let pd = crate::cli::progress_for(cli, "defrag");
    let p = pd.progress.clone();
    let p = progress_fn(&p);
    let d = strata_link::manage::defrag(&Access(cli), root, name, &mut warnings, (&p, &p));
    pd.finish();
    for w in &warnings {
        out.warn(w);
    }
    let d = d.map_err(link_err)?;
    out.result(&text::defrag_json(name, &d), || text::defrag_text(name, &d));
    Ok(0)
}

/// `volume delete`.
fn delete(
    cli: &crate::cli::Cli,
    out: &Out,
    root: &VolumesDir,
    name: &str,
    yes: bool,
) -> Result<i32> {
    root.existing(name).map_err(link_err)?;
    if !yes {
        bail!("deleting volume {name} destroys its data: add --yes");
    }
    let d = strata_link::delete::delete(&Access(cli), root, name);
    let d = d.map_err(link_err)?;
    for w in &d.warnings {
        out.warn(w);
    }
    text::deleted(out, name, &d.unlinked);
    Ok(0)
}

/// `volume snapshot`: the volume's current contents as a version of
/// series `volume:NAME`.
fn snapshot(
    cli: &crate::cli::Cli,
    out: &Out,
    root: &VolumesDir,
    name: &str,
    tags: &[String],
    read_all: bool,
) -> Result<i32> {
    root.existing(name).map_err(link_err)?;
    let repo = crate::cli::open(cli)?;
    // Linked only into the repository whose own `volumes/` these are.
    let own_dir = crate::cli::repo_location(cli)
        .ok()
        .and_then(|l| strata_link::volumes::own_dir(&l))
        .as_deref()
        == Some(root.path.as_path());
    let pd = crate::cli::progress_for(cli, "volume snapshot");
    let opts = strata_link::snapshot::SnapshotOptions {
        tags: tags.to_vec(),
        read_all,
        own_dir,
        progress: pd.progress.clone(),
    };
    let res = strata_link::snapshot::snapshot(&repo, &root.path, name, opts);
    pd.finish();
    let s = res.map_err(link_err)?;
    crate::interrupt::committed(format!("snapshot {}", crate::output::short(&s.report.id)));
    for w in &s.warnings {
        out.warn(w);
    }
    text::snapshot_result(out, name, &s);
    Ok(0)
}
