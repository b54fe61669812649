//! `strata volume …`: thin, deduplicated block volumes kept in a local
//! repository (`REPO/volumes/NAME/`), or on this host for a bucket or
//! wherever `--volumes-dir` says (`root.rs`), and served over NBD to real
//! clients (qemu-img, nbdcopy, nbdfuse, fio, a VM's disk), with iDedup's
//! threshold-based inline dedup; their snapshots go to the repository.

use crate::location;
use crate::output::{fmt_bytes, Out};
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use strata_core::chunker::ChunkerParams;
use strata_core::size::parse_size;
use strata_store::ops::backup::patch::{ImagePatch, ReadAt};
use strata_store::ops::backup::BackupOptions;
use strata_store::Repository;
use strata_volume::nbd::{Export, Listen, Server};
use strata_volume::{Encryption, Volume, VolumeConfig, VolumeKey};

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

mod at;
mod create;
mod defrag;
mod import;
mod leftovers;
mod root;

/// Removes what killed `volume delete`s left (`.NAME.deleting-PID-N`, of
/// any volume, whose process is gone), as far as it can. (Nothing else
/// has that shape: a volume named `a.deleting-1-2` has a defrag copy
/// `.a.deleting-1-2.defrag`, which does not end in digits.)
fn sweep_deleted(root: &std::path::Path) {
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some((_, rest)) = n.rsplit_once(".deleting-").filter(|_| n.starts_with('.')) else {
            continue;
        };
        let Some((pid, nanos)) = rest.split_once('-') else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let Some(pid) = pid.parse::<u32>().ok().filter(|_| digits(nanos)) else {
            continue;
        };
        // (One whose delete still runs is its own to remove.)
        if leftovers::gone(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The directory of volume `name`, which must exist.
fn existing(root: &std::path::Path, name: &str) -> Result<PathBuf> {
    check_name(name)?;
    let dir = root.join(name);
    if !dir.join("volume.json").exists() {
        bail!("no volume {name:?} (strata volume list)");
    }
    Ok(dir)
}

/// Whether the repository is encrypted (read from its config, without
/// the password).
fn repo_encrypted(cli: &crate::Cli) -> Result<bool> {
    let loc = location::location(cli.repo.as_deref())?;
    let backend = location::backend(&loc, false)?;
    let config = strata_store::repo::Repository::read_config(&*backend)
        .with_context(|| format!("reading the config of {}", location::describe(&loc)))?;
    Ok(config.encrypted)
}

/// The key of an encrypted volume (its blocks, journal and fingerprints
/// are encrypted, see `strata_volume::crypt`): derived from the
/// repository's master key and the volume's salt. None for a volume that
/// is not encrypted.
fn volume_key(repo: &Repository, cfg: &VolumeConfig) -> Result<Option<VolumeKey>> {
    let Some(e) = &cfg.encryption else {
        if repo.config().encrypted {
            bail!("{}", PLAIN_IN_ENCRYPTED);
        }
        return Ok(None);
    };
    let salt = e.salt_bytes().ok_or_else(|| {
        anyhow!(
            "the volume's salt {:?} is not hex (a damaged volume.json)",
            e.salt
        )
    })?;
    let key = repo.volume_key(&salt).ok_or_else(|| {
        anyhow!(
            "the volume is encrypted, but its repository is not: it belongs to another repository"
        )
    })?;
    Ok(Some(VolumeKey(key)))
}

/// Opens the repository (asking for its password) when the volume in
/// `dir` is encrypted, for its key.
fn key_for_dir(cli: &crate::Cli, dir: &std::path::Path) -> Result<Option<VolumeKey>> {
    let cfg = Volume::config(dir)?;
    if cfg.encryption.is_none() {
        if repo_encrypted(cli)? {
            bail!("{}", PLAIN_IN_ENCRYPTED);
        }
        return Ok(None);
    }
    volume_key(&crate::open(cli)?, &cfg)
}

/// In an encrypted repository a new volume is encrypted too, with a key
/// of its own from the repository's: set in `cfg`, and returned.
fn new_key(cli: &crate::Cli, cfg: &mut VolumeConfig) -> Result<Option<VolumeKey>> {
    cfg.encryption = None;
    if !repo_encrypted(cli)? {
        return Ok(None);
    }
    let repo = crate::open(cli)?;
    let mut salt = [0u8; 16];
    strata_core::crypto::random_bytes(&mut salt)?;
    let k = repo
        .volume_key(&salt)
        .map(VolumeKey)
        .context("the repository's key")?;
    cfg.encryption = Some(Encryption::new(salt, &k));
    Ok(Some(k))
}

/// A volume that is not encrypted in a repository that is: not made by
/// `volume create` here (copied in?); not served or snapshotted, as its
/// blocks would be in plain beside the repository.
const PLAIN_IN_ENCRYPTED: &str = "this volume is not encrypted, but its repository is (a volume copied in from \
     another repository?): it is not used here. Create a new volume in this repository and copy the data over";

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "{name:?} is not a volume name: letters, digits, `-`, `_`, `.` (not first), at most 64"
        ))
    }
}

impl VolumeCmd {
    /// `serve` runs until a signal and handles it itself.
    pub fn serves(&self) -> bool {
        matches!(self, VolumeCmd::Serve { .. })
    }
}

pub fn run(
    cli: &crate::Cli,
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
        let tls = tls_config(tls_certificates.as_deref(), *tls_verify_peer)?;
        let cache = cache_mib.saturating_mul(1 << 20);
        return serve_at(cli, out, name, (at, cache), listen, tls);
    }
    let where_ = root::Root::find(cli, volumes_dir)?;
    let root = where_.path.clone();
    match cmd {
        VolumeCmd::Create(a) => create::create(cli, out, &where_, a),
        VolumeCmd::Serve {
            name,
            listen,
            tls_certificates,
            tls_verify_peer,
            ..
        } => {
            let tls = tls_config(tls_certificates.as_deref(), *tls_verify_peer)?;
            serve(cli, out, &root, name, listen, tls)
        }
        VolumeCmd::Snapshot {
            name,
            tag,
            read_all,
        } => snapshot(cli, out, &root, name, tag, *read_all),
        VolumeCmd::Check { name, read_data } => check(cli, out, &root, name, *read_data),
        VolumeCmd::Resize { name, size, shrink } => {
            let dir = existing(&root, name)?;
            let old = Volume::resize(&dir, *size, *shrink)
                .with_context(|| format!("resizing volume {name}"))?;
            out.result(
                &serde_json::json!({"volume": name, "old_size": old, "size": size}),
                || format!("volume {name}: {} → {}", fmt_bytes(old), fmt_bytes(*size)),
            );
            Ok(0)
        }
        VolumeCmd::Copy { from, to } => copy(cli, out, &root, from, to),
        VolumeCmd::Defrag { name } => {
            let dir = existing(&root, name)?;
            unlink(cli, out, &dir, name, false)?;
            let key = key_for_dir(cli, &dir)?;
            let d = defrag::defrag(cli, &dir, name, key.as_ref())
                .with_context(|| format!("defragmenting volume {name}"))?;
            out.result(&d.json(name), || d.text(name));
            Ok(0)
        }
        VolumeCmd::Stats { name } => {
            let dir = existing(&root, name)?;
            let r = strata_volume::report::report(&dir, name)?;
            let v = serde_json::to_value(&r)?;
            out.result(&v, || stats_text(&r));
            Ok(0)
        }
        VolumeCmd::Delete { name, yes } => delete(cli, out, &root, name, *yes),
        VolumeCmd::List => {
            let mut names = Vec::new();
            if let Ok(rd) = std::fs::read_dir(&root) {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    // (`.NAME.import`, `.NAME.defrag`: a volume being filled.)
                    if n.starts_with('.') {
                        continue;
                    }
                    if let Ok(c) = Volume::config(&e.path()) {
                        names.push((n, c.size, c.dedup, c.encryption.is_some()));
                    }
                }
            }
            names.sort();
            let v = serde_json::json!(names
                .iter()
                .map(|(n, s, d, e)| serde_json::json!({"name": n, "size": s, "dedup": d, "encrypted": e}))
                .collect::<Vec<_>>());
            out.result(&v, || {
                names
                    .iter()
                    .map(|(n, s, d, e)| {
                        let mut t = format!("{n}\t{}", fmt_bytes(*s));
                        if !d {
                            t += "\tdedup off";
                        }
                        if *e {
                            t += "\tencrypted";
                        }
                        t
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(0)
        }
    }
}

/// `volume delete`: what the volume's snapshots link to its blocks stored
/// in the repository again, then its directory moved aside in one step
/// and removed.
fn delete(
    cli: &crate::Cli,
    out: &Out,
    root: &std::path::Path,
    name: &str,
    yes: bool,
) -> Result<i32> {
    let dir = existing(root, name)?;
    if !yes {
        bail!("deleting volume {name} destroys its data: add --yes");
    }
    let lock = Volume::lock(&dir)?;
    let r = unlink(cli, out, &dir, name, true)?;
    // Gone in one step (a kill while its files are removed leaves
    // no half volume under its name), then removed.
    sweep_deleted(root);
    let gone = root.join(format!(
        ".{name}.deleting-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    std::fs::rename(&dir, &gone).with_context(|| {
        format!(
            "moving {} to {} to delete it",
            dir.display(),
            gone.display()
        )
    })?;
    // A stopped defrag's copy, and its lock file; killed
    // snapshots' records (before a new volume of the name can be).
    let _ = std::fs::remove_dir_all(root.join(format!(".{name}.defrag")));
    let _ = std::fs::remove_file(root.join(format!(".{name}.defrag.lock")));
    leftovers::forget(root, name);
    drop(lock);
    if let Err(e) = std::fs::remove_dir_all(&gone) {
        out.warn(&format!(
            "volume {name} is deleted, but removing its files ({}) failed: {e}; \
             the next `strata volume delete` or `create` tries again",
            gone.display()
        ));
    }
    let unlinked = r.stored_bytes;
    out.result(
        &serde_json::json!({
            "deleted": name,
            "stored_again_bytes": unlinked,
            "stored_again_containers": r.containers,
            "recompressed_containers": r.recompressed,
            "damaged_containers": r.damaged.len(),
        }),
        || {
            let mut t = format!("volume {name} deleted");
            if unlinked > 0 {
                t += &format!(
                    " (first {} its snapshots linked to stored in the repository again)",
                    fmt_bytes(unlinked)
                );
            }
            t
        },
    );
    Ok(0)
}

/// Before a volume's data file goes (delete, defrag): the containers its
/// snapshots link to its blocks are stored in the repository again, and
/// their holds released (`strata_link::unlink_volume`). Returns
/// what it did. A container that cannot be (its blocks changed
/// on the host) fails a defrag; a delete (`deleting`) goes on with a
/// warning — the versions using it are damaged already.
fn unlink(
    cli: &crate::Cli,
    out: &Out,
    dir: &std::path::Path,
    name: &str,
    deleting: bool,
) -> Result<strata_link::UnlinkReport> {
    if strata_volume::holds::held(dir)?.is_empty() {
        return Ok(Default::default());
    }
    let repo = crate::open(cli)?;
    let r = strata_link::unlink_volume(&repo, name).with_context(|| {
        format!("storing again what snapshots of volume {name} link to its blocks")
    })?;
    if !r.failed.is_empty() {
        bail!(
            "{} container(s) linked to volume {name} could not be stored in the repository \
             again, so the volume is kept as it is: {}",
            r.failed.len(),
            r.failed.join("; ")
        );
    }
    if !r.damaged.is_empty() {
        let why: Vec<&str> = r.damaged.iter().map(|(_, w)| w.as_str()).collect();
        if !deleting {
            bail!(
                "{} container(s) linked to volume {name} no longer match its blocks, so the \
                 volume is kept as it is: {}",
                r.damaged.len(),
                why.join("; ")
            );
        }
        // Deleted all the same: what they held is gone already.
        for (id, _) in &r.damaged {
            strata_volume::holds::release(dir, &id.to_hex())?;
        }
        out.warn(&format!(
            "{} container(s) linked to volume {name} no longer match its blocks and could not be \
             stored again (the versions using them were damaged already; `strata check` names \
             them): {}",
            r.damaged.len(),
            why.join("; ")
        ));
    }
    if let Some(why) = &r.recompress_failed {
        out.warn(&format!(
            "the containers of volume {name}'s snapshots are stored in the repository again, \
             uncompressed: compressing them failed ({why})"
        ));
    }
    let left = strata_volume::holds::held(dir)?;
    if !left.is_empty() {
        bail!(
            "volume {name} still keeps disk blocks for {} container(s) this repository does not \
             link (another repository's?), so it is kept. If no repository's snapshots link to \
             it, remove {} and try again",
            left.len(),
            dir.join(strata_volume::holds::DIR).display()
        );
    }
    Ok(r)
}

/// `volume copy`: the stopped volume `from` copied into a new volume `to`.
fn copy(cli: &crate::Cli, out: &Out, root: &std::path::Path, from: &str, to: &str) -> Result<i32> {
    check_name(to)?;
    let src = existing(root, from)?;
    let dst = root.join(to);
    let key = key_for_dir(cli, &src)?;
    let mut cfg = Volume::config(&src)?;
    let new = new_key(cli, &mut cfg)?;
    let vol = Volume::open_to_read(&src, key.as_ref())
        .with_context(|| format!("opening volume {from}"))?;
    let source = import::Source::volume(format!("volume {from}"), vol.image_reader(), vol.size());
    let copied = import::create_filled(cli, &dst, cfg, new.as_ref(), source);
    let closed = vol
        .close()
        .with_context(|| format!("closing volume {from}"));
    let copied = copied?;
    closed?;
    out.result(
        &serde_json::json!({"volume": to, "from": from, "size": copied.size,
            "read_bytes": copied.read, "written_bytes": copied.written}),
        || {
            format!(
                "volume {to} copied from {from}: {} ({} read, the rest never written; {} not zeros)",
                fmt_bytes(copied.size),
                fmt_bytes(copied.read),
                fmt_bytes(copied.written)
            )
        },
    );
    Ok(0)
}

/// `volume check`.
fn check(
    cli: &crate::Cli,
    out: &Out,
    root: &std::path::Path,
    name: &str,
    read_data: bool,
) -> Result<i32> {
    let dir = existing(root, name)?;
    // Only a deduplicated volume's data is decrypted (to compare it with
    // its fingerprints).
    let cfg = Volume::config(&dir)?;
    let key = match read_data && cfg.dedup && cfg.encryption.is_some() {
        true => key_for_dir(cli, &dir)?,
        false => None,
    };
    let progress = crate::progress_for(cli, "check");
    let p = progress.progress.clone();
    let r = strata_volume::check::check(&dir, key.as_ref(), read_data, &|done, total| {
        p.bytes_total.store(total, Ordering::Relaxed);
        p.bytes_done.store(done, Ordering::Relaxed);
    });
    progress.finish();
    let r = r.with_context(|| format!("checking volume {name}"))?;
    out.result(&serde_json::to_value(&r)?, || {
        let mut t = format!(
            "volume {name}: {} logical blocks mapped to {} disk blocks ({} in the data file){}",
            r.logical_blocks_mapped,
            r.disk_blocks_in_use,
            r.data_file_blocks,
            if r.clean { "" } else { ", not closed cleanly" }
        );
        t += &format!(
            "\nlayout: {:.1} % of the blocks follow the block before them on disk",
            r.in_order() * 100.0
        );
        if r.in_order() < 0.5 && r.blocks_after_mapped > 0 {
            t += &format!(" (`strata volume defrag {name}` lays them out in order)");
        }
        if r.holds > 0 {
            t += &format!(
                "\n{} disk blocks kept for the repository ({} holds)",
                r.held_blocks, r.holds
            );
        }
        if read_data {
            t += &format!(
                "\n{} blocks read, {} compared with their fingerprints",
                r.blocks_read, r.blocks_verified
            );
        }
        for n in &r.notes {
            t += &format!("\nnote: {n}");
        }
        for p in &r.problems {
            t += &format!("\nerror: {p}");
        }
        t += match r.ok() {
            true => "\nno problems found",
            false => "\nproblems found",
        };
        t
    });
    Ok(if r.ok() { 0 } else { 1 })
}

/// The image a snapshot reads, at any offset.
struct ImageAt(strata_volume::ImageSource);

impl ReadAt for ImageAt {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(offset, buf)
    }

    fn unwritten(&mut self, offset: u64, len: u64) -> std::io::Result<bool> {
        self.0.unwritten(offset, len)
    }
}

/// Who holds the image a snapshot reads: this process (a volume nobody
/// serves, opened here) or the volume's server (a freeze, over the
/// control connection).
enum Held {
    Here(std::sync::Arc<Volume>, strata_volume::ChangeSet),
    Server(
        Arc<std::sync::Mutex<std::os::unix::net::UnixStream>>,
        Arc<strata_volume::FrozenMap>,
    ),
}

impl Held {
    /// The image's blocks and holds, for the link sink: the stopped
    /// volume's own, or the frozen map's, held by the server over the
    /// control connection (while the freeze holds).
    fn link(&self) -> Result<Arc<dyn strata_link::VolumeLink>> {
        Ok(match self {
            Held::Here(v, _) => Arc::new(HereLink(v.clone())),
            Held::Server(conn, map) => Arc::new(ServerLink(
                conn.clone(),
                map.clone(),
                AtomicBool::new(false),
            )),
        })
    }
}

/// A volume opened here, as the link sink sees it.
struct HereLink(Arc<Volume>);

impl strata_link::VolumeLink for HereLink {
    fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        self.0.disk_blocks(first, n)
    }
    fn hold(&self, name: &str, dbns: &[u64]) -> io::Result<()> {
        self.0.hold(name, dbns).map_err(io::Error::other)
    }
}

/// A volume frozen by its server, as the link sink sees it (one request
/// at a time on the control connection; none after one failed, since an
/// answer that comes late would be read as the next one's).
struct ServerLink(
    Arc<std::sync::Mutex<std::os::unix::net::UnixStream>>,
    Arc<strata_volume::FrozenMap>,
    AtomicBool,
);

impl strata_link::VolumeLink for ServerLink {
    fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        self.1.disk_blocks(first, n)
    }
    fn hold(&self, name: &str, dbns: &[u64]) -> io::Result<()> {
        let conn = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if self.2.load(Ordering::SeqCst) {
            return Err(io::Error::other("an earlier hold request failed"));
        }
        let r = strata_volume::control::hold_remote(&conn, name, dbns);
        if r.is_err() {
            self.2.store(true, Ordering::SeqCst);
        }
        r
    }
}

/// `volume snapshot`: the volume's bytes, read through the volume
/// (buffered writes and holes included), backed up as one image of which
/// only the segments written since the last snapshot are read.
fn snapshot(
    cli: &crate::Cli,
    out: &Out,
    root: &std::path::Path,
    name: &str,
    tags: &[String],
    read_all: bool,
) -> Result<i32> {
    let dir = existing(root, name)?;
    let repo = crate::open(cli)?;
    let cfg = Volume::config(&dir)?;
    let key = volume_key(&repo, &cfg)?;
    // The image's time in every version: the volume's creation (when
    // volume.json was written), so that a version's recipe shares the
    // pieces that did not change with the one before.
    let time_ns = std::fs::metadata(dir.join("volume.json"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64);
    // A volume nobody serves is opened here; a served one is frozen by
    // its server (a point in time while clients go on writing), held
    // while the reader's connection to it stays open.
    let (held, source, base, changed) = match Volume::open_to_read(&dir, key.as_ref()) {
        Ok(v) => {
            let cs = v.take_changes();
            let (base, changed) = (cs.base.clone(), cs.changed());
            let src = strata_volume::ImageSource::Live {
                vol: v.clone(),
                pos: 0,
            };
            (Held::Here(v, cs), src, base, changed)
        }
        Err(e) if dir.join(strata_volume::control::SOCKET).exists() => {
            let f = strata_volume::control::freeze_remote(&dir)
                .map_err(|c| anyhow!("{e}; and its server did not give a frozen image: {c}"))?;
            // The reader holds the connection, and with it the freeze
            // (until the backup is done with it); this end tells the
            // server the commit.
            let tell = f.conn.try_clone().context("the control connection")?;
            let frozen_map = strata_volume::FrozenMap::open(&dir, &f.map)?;
            let src =
                strata_volume::ImageSource::open_frozen(&dir, &f.map, Some(f.conn), key.as_ref())?;
            (
                Held::Server(Arc::new(std::sync::Mutex::new(tell)), Arc::new(frozen_map)),
                src,
                f.base,
                f.changed,
            )
        }
        Err(e) => return Err(e).with_context(|| format!("opening volume {name}")),
    };
    // (Of the volume as opened: a resize cannot come between.)
    let size = source.size();
    // The version's new containers link to the volume's own blocks (a
    // volume of this repository, with dedup): never written to the
    // repository at all.
    let linkable = cfg.dedup
        && crate::repo_location(cli)
            .ok()
            .and_then(|l| location::volumes_of(&l))
            .as_deref()
            == Some(root);
    // What killed snapshots of the volume left linked is released first.
    let (running, leftovers) = match linkable {
        true => {
            let (r, n) = leftovers::start(out, root, name, &repo)?;
            (Some(r), n)
        }
        false => (None, 0),
    };
    let link = match linkable {
        true => {
            let salt = cfg.encryption.as_ref().and_then(|e| e.salt_bytes());
            match strata_link::LinkSink::new(&repo, name, salt.as_deref(), held.link()?) {
                Ok(l) => Some(l),
                Err(e) => {
                    out.warn(&format!(
                        "the snapshot's new blocks are stored in the repository (not handed \
                         over to the volume): {e}"
                    ));
                    None
                }
            }
        }
        false => None,
    };
    let pd = crate::progress_for(cli, "volume snapshot");
    let opts = BackupOptions {
        image: Some(ImagePatch {
            name: format!("{name}.img"),
            source: Box::new(ImageAt(source)),
            size,
            base,
            // Read everything: the version still becomes the base.
            changed: changed.filter(|_| !read_all),
            time_ns,
            link: link
                .clone()
                .map(|l| l as Arc<dyn strata_store::engine::writer::Linker>),
        }),
        series: Some(format!("volume:{name}")),
        tags: tags.to_vec(),
        chunker: Some(ChunkerParams::fixed()),
        progress: pd.progress.clone(),
        ..Default::default()
    };
    let res = strata_store::ops::backup::backup(&repo, opts);
    pd.finish();
    // The volume's changes count from this version now (or, if it was
    // not committed, from the one before, as if nothing was taken).
    let committed = res.as_ref().ok().map(|r| r.id.as_str());
    let closed = match held {
        Held::Here(v, cs) => {
            v.snapshot_done(cs, committed);
            v.close()
        }
        Held::Server(conn, _) => {
            tell_committed(&conn.lock().unwrap_or_else(|e| e.into_inner()), committed);
            Ok(())
        }
    };
    // (A failed snapshot's record stays: the next one releases what it
    // linked.)
    match (&res, running) {
        (Err(_), Some(r)) => r.keep(),
        (_, r) => drop(r),
    }
    let rep = res?;
    closed.with_context(|| format!("closing volume {name}"))?;
    crate::interrupt::committed(format!("snapshot {}", crate::output::short(&rep.id)));
    let l = link.map(|l| l.counts()).unwrap_or_default();
    if l.hold_failed > 0 {
        out.warn(&format!(
            "the volume did not keep the blocks of {} containers: they are stored in the \
             repository instead (see the log)",
            l.hold_failed
        ));
    }
    snapshot_result(out, name, &rep, &l, leftovers);
    Ok(0)
}

/// `volume snapshot`'s result: the version, what was read and added,
/// what was linked.
fn snapshot_result(
    out: &Out,
    name: &str,
    rep: &strata_store::ops::backup::BackupReport,
    l: &strata_link::SinkCounts,
    leftovers: u64,
) {
    let s = &rep.snapshot;
    let secs = s.stats.duration_ms as f64 / 1000.0;
    out.result(
        &serde_json::json!({"id": rep.id, "series": s.series, "version": s.version,
            "logical_bytes": s.stats.logical_bytes, "read_bytes": s.stats.read_bytes,
            "unchanged_bytes": rep.parent_bytes, "parts_taken_over_bytes": rep.carried_bytes,
            "new_raw_bytes": s.stats.new_raw_bytes,
            "new_stored_bytes": s.stats.new_stored_bytes,
            "linked_containers": l.containers, "linked_stored_bytes": l.bytes,
            "linked_blocks": l.blocks, "stored_instead_containers": l.stored_instead,
            "hold_failed_containers": l.hold_failed,
            "released_leftover_containers": leftovers, "seconds": secs}),
        || {
            let mut t = format!(
                "snapshot {} saved: {}@{}\n  {} of volume {name} ({} read: what changed), {} new data, {} added to the repository, {secs:.1}s",
                crate::output::short(&rep.id),
                s.series,
                s.version,
                fmt_bytes(s.stats.logical_bytes),
                fmt_bytes(s.stats.read_bytes),
                fmt_bytes(s.stats.new_raw_bytes),
                fmt_bytes(s.stats.new_stored_bytes),
            );
            if l.containers > 0 {
                t += &format!(
                    "\n  {} of it handed over to the volume's own blocks ({} containers): the \
                     volume keeps them for the repository",
                    fmt_bytes(l.bytes),
                    l.containers
                );
            }
            t
        },
    );
}

/// Tells the volume's server the committed version (its changes count
/// from it on).
fn tell_committed(conn: &std::os::unix::net::UnixStream, committed: Option<&str>) {
    if let Some(id) = committed {
        if let Err(e) = (&*conn).write_all(format!("committed {id}\n").as_bytes()) {
            // The version is committed all the same; the next snapshot
            // reads everything.
            tracing::warn!("telling the volume's server the snapshot: {e}");
        }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn serve(
    cli: &crate::Cli,
    out: &Out,
    root: &std::path::Path,
    name: &str,
    listen: &str,
    tls: Option<strata_volume::tls::TlsConfig>,
) -> Result<i32> {
    big_buffers_from_the_heap();
    check_name(name)?;
    let dir = root.join(name);
    if !dir.join("volume.json").exists() {
        bail!("no volume {name:?} (strata volume create {name} --size …)");
    }
    let key = key_for_dir(cli, &dir)?;
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
fn tls_config(
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
fn serve_at(
    cli: &crate::Cli,
    out: &Out,
    name: &str,
    (at, cache): (&str, usize),
    listen: &str,
    tls: Option<strata_volume::tls::TlsConfig>,
) -> Result<i32> {
    big_buffers_from_the_heap();
    check_name(name)?;
    let opened = at::open(cli, name, at, cache)?;
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

fn stats_text(r: &strata_volume::report::VolumeReport) -> String {
    let us = |v: Option<f64>| {
        v.map(|x| format!("{x:.0} µs"))
            .unwrap_or_else(|| "–".into())
    };
    let mut t = format!(
        "volume {} ({}), threshold {} (in use: {}), cache {}{}\n",
        r.name,
        fmt_bytes(r.size),
        r.threshold,
        r.threshold_used,
        fmt_bytes(r.cache_bytes),
        match (r.dedup, r.encrypted) {
            (true, false) => "",
            (true, true) => ", encrypted",
            (false, false) => ", dedup off",
            (false, true) => ", dedup off, encrypted",
        }
    );
    t += &format!(
        "dedup ratio {:.3}: {} blocks written, {} stored new, {} deduplicated ({} duplicates in runs below the threshold)\n",
        r.dedup_ratio,
        r.logical_blocks_written,
        r.physical_blocks_written,
        r.deduplicated_blocks,
        r.duplicates_below_threshold
    );
    t += &format!(
        "disk blocks in use {} of {} in the data file ({} on the host's disk)\n",
        r.physical_blocks_in_use,
        r.data_file_blocks,
        fmt_bytes(r.data_file_allocated_bytes)
    );
    if let Some(h) = r.cache_hit_rate {
        t += &format!(
            "cache: {:.1} % hits, {} of {} blocks, {} in memory\n",
            h * 100.0,
            r.live.cache_blocks,
            r.live.cache_capacity_blocks,
            fmt_bytes(r.live.cache_memory_bytes)
        );
    }
    if r.live.waiting_for_space_bytes > 0 {
        t += &format!(
            "writes paused: the disk holding the volume lacks room for its buffered writes \
             ({} needed); they resume once space is freed\n",
            fmt_bytes(r.live.waiting_for_space_bytes)
        );
    }
    if r.live.readahead_miss_probe == "off" && r.live.reads > 0 {
        t += "readahead around misses: off (this kernel can tell no page-cache miss)\n";
    }
    if r.live.readahead_blocks_asked > 0 {
        t += &format!(
            "readahead around misses (told by {}): {} blocks asked for, {:.1} % of them read; \
             cluster now {}\n",
            r.live.readahead_miss_probe,
            r.live.readahead_blocks_asked,
            100.0 * r.live.readahead_blocks_used as f64 / r.live.readahead_blocks_asked as f64,
            fmt_bytes(
                r.live
                    .readahead_cluster_blocks
                    .saturating_mul(strata_volume::volume::BLOCK as u64)
            )
        );
    }
    t += &format!(
        "latency: read p50 {} p99 {} ({} reads), write p50 {} p99 {} ({} writes)",
        us(r.live.read_p50_us),
        us(r.live.read_p99_us),
        r.live.reads,
        us(r.live.write_p50_us),
        us(r.live.write_p99_us),
        r.live.writes
    );
    t
}

#[cfg(test)]
mod tests {
    /// Only a killed delete's leftover is swept: `.NAME.deleting-PID-N`
    /// of a process that is gone — not one whose delete still runs, nor a
    /// volume's defrag copy or import whose name holds `.deleting-`.
    #[test]
    fn only_a_killed_delete_s_leftover_is_swept() {
        let root = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let dead = gone.id();
        let names = [
            (format!(".v.deleting-{dead}-17"), false),
            (format!(".v.deleting-{}-17", std::process::id()), false),
            // pid 1 runs.
            (".w.deleting-1-17".to_string(), true),
            (".a.deleting-x.defrag".to_string(), true),
            (format!(".a.deleting-{dead}-2.defrag"), true),
            (format!(".a.deleting-{dead}-2.import"), true),
            (format!("a.deleting-{dead}-2"), true),
        ];
        for (n, _) in &names {
            std::fs::create_dir_all(root.path().join(n).join("sub")).unwrap();
        }
        super::sweep_deleted(root.path());
        for (n, kept) in &names {
            assert_eq!(root.path().join(n).exists(), *kept, "{n}");
        }
    }
}
