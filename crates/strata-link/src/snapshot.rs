//! A volume's snapshot: the volume's bytes, read through the volume
//! (buffered writes and holes included), backed up as one image `NAME.img`
//! of series `volume:NAME`, of which only the segments written since the
//! last snapshot are read. A volume nobody serves is opened here; a served
//! one is frozen by its server (a point in time while clients go on
//! writing). A volume of the repository's own `volumes/` (with dedup)
//! keeps the new blocks for the repository: the new containers are linked
//! to its blocks ([`crate::sink`]), never written to the repository.

use crate::error::{Context as _, LinkError, Result};
use crate::keys::volume_key;
use crate::leftovers;
use crate::sink::{LinkSink, SinkCounts, VolumeLink};
use std::io::{self, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_store::engine::writer::Linker;
use strata_store::ops::backup::patch::{ImagePatch, ReadAt};
use strata_store::ops::backup::{BackupOptions, BackupReport};
use strata_store::progress::Progress;
use strata_store::Repository;
use strata_volume::{ChangeSet, FrozenMap, ImageSource, Volume};

/// What a snapshot is asked.
#[derive(Default)]
pub struct SnapshotOptions {
    /// Tags of the new version.
    pub tags: Vec<String>,
    /// Read every written block, not only what changed since the last
    /// snapshot.
    pub read_all: bool,
    /// Whether the volumes directory is the repository's own
    /// (`REPO/volumes`): only then are the new blocks linked.
    pub own_dir: bool,
    pub progress: Arc<Progress>,
}

/// What a snapshot did.
pub struct Snapshotted {
    pub report: BackupReport,
    /// What was linked to the volume's blocks.
    pub linked: SinkCounts,
    /// Containers killed snapshots of the volume had left linked, released
    /// first.
    pub released_leftovers: u64,
    /// What went wrong without failing the snapshot.
    pub warnings: Vec<String>,
}

/// The image a snapshot reads, at any offset.
struct ImageAt(ImageSource);

impl ReadAt for ImageAt {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(offset, buf)
    }

    fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        self.0.unwritten(offset, len)
    }
}

/// Who holds the image a snapshot reads: this process (a volume nobody
/// serves, opened here) or the volume's server (a freeze, over the
/// control connection).
enum Held {
    Here(Arc<Volume>, ChangeSet),
    Server(Arc<Mutex<UnixStream>>, Arc<FrozenMap>),
}

impl Held {
    /// The image's blocks and holds, for the link sink: the stopped
    /// volume's own, or the frozen map's, held by the server over the
    /// control connection (while the freeze holds).
    fn link(&self) -> Arc<dyn VolumeLink> {
        match self {
            Held::Here(v, _) => Arc::new(HereLink(v.clone())),
            Held::Server(conn, map) => Arc::new(ServerLink(
                conn.clone(),
                map.clone(),
                AtomicBool::new(false),
            )),
        }
    }

    /// The snapshot is over (`committed`: the version, if it was): the
    /// volume's changes count from it now (or, if none was committed,
    /// from the one before, as if nothing was taken).
    fn done(self, committed: Option<&str>) -> io::Result<()> {
        match self {
            Held::Here(v, cs) => {
                v.snapshot_done(cs, committed);
                v.close()
            }
            Held::Server(conn, _) => {
                tell_committed(&conn.lock().unwrap_or_else(|e| e.into_inner()), committed);
                Ok(())
            }
        }
    }
}

/// A volume opened here, as the link sink sees it.
struct HereLink(Arc<Volume>);

impl VolumeLink for HereLink {
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
struct ServerLink(Arc<Mutex<UnixStream>>, Arc<FrozenMap>, AtomicBool);

impl VolumeLink for ServerLink {
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

/// The image a snapshot of the volume in `dir` reads, who holds it, and
/// what changed since the last snapshot (the base version and its
/// changed segments).
type Opened = (Held, ImageSource, Option<String>, Option<Vec<bool>>);

/// Opens the volume in `dir` for a snapshot: here when nobody serves it,
/// else frozen by its server (held while the reader's connection to it
/// stays open).
fn open_image(dir: &Path, name: &str, key: Option<&strata_volume::VolumeKey>) -> Result<Opened> {
    match Volume::open_to_read(dir, key) {
        Ok(v) => {
            let cs = v.take_changes();
            let (base, changed) = (cs.base.clone(), cs.changed());
            let src = ImageSource::Live {
                vol: v.clone(),
                pos: 0,
            };
            Ok((Held::Here(v, cs), src, base, changed))
        }
        Err(e) if dir.join(strata_volume::control::SOCKET).exists() => {
            let f = strata_volume::control::freeze_remote(dir).map_err(|c| {
                LinkError::Invalid(format!(
                    "{e}; and its server did not give a frozen image: {c}"
                ))
            })?;
            // The reader holds the connection, and with it the freeze
            // (until the backup is done with it); this end tells the
            // server the commit.
            let tell = f
                .conn
                .try_clone()
                .map_err(LinkError::io("the control connection"))?;
            let frozen_map = FrozenMap::open(dir, &f.map)?;
            let src = ImageSource::open_frozen(dir, &f.map, Some(f.conn), key)?;
            let held = Held::Server(Arc::new(Mutex::new(tell)), Arc::new(frozen_map));
            Ok((held, src, f.base, f.changed))
        }
        Err(e) => Err(LinkError::from(e).context(format!("opening volume {name}"))),
    }
}

/// The image's time in every version: the volume's creation (when
/// volume.json was written), so that a version's recipe shares the pieces
/// that did not change with the one before.
fn image_time(dir: &Path) -> i64 {
    std::fs::metadata(dir.join("volume.json"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Snapshots volume `name` (in `dir`, of the volumes directory `root`)
/// into `repo`.
pub fn snapshot(
    repo: &Repository,
    root: &Path,
    name: &str,
    opts: SnapshotOptions,
) -> Result<Snapshotted> {
    let dir = root.join(name);
    let cfg = Volume::config(&dir)?;
    let key = volume_key(repo, &cfg)?;
    let time_ns = image_time(&dir);
    let (held, source, base, changed) = open_image(&dir, name, key.as_ref())?;
    // (Of the volume as opened: a resize cannot come between.)
    let size = source.size();
    let mut warnings = Vec::new();
    // The version's new containers link to the volume's own blocks (a
    // volume of this repository, with dedup): never written to the
    // repository at all. What killed snapshots of the volume left linked
    // is released first.
    let linkable = cfg.dedup && opts.own_dir;
    let (running, released_leftovers) = match linkable {
        true => {
            let (r, n) = leftovers::start(&mut warnings, root, name, repo)?;
            (Some(r), n)
        }
        false => (None, 0),
    };
    let link = match linkable {
        true => {
            let salt = cfg.encryption.as_ref().and_then(|e| e.salt_bytes());
            match LinkSink::new(repo, name, salt.as_deref(), held.link()) {
                Ok(l) => Some(l),
                Err(e) => {
                    warnings.push(format!(
                        "the snapshot's new blocks are stored in the repository (not handed \
                         over to the volume): {e}"
                    ));
                    None
                }
            }
        }
        false => None,
    };
    let backup = BackupOptions {
        image: Some(ImagePatch {
            name: format!("{name}.img"),
            source: Box::new(ImageAt(source)),
            size,
            base,
            // Read everything: the version still becomes the base.
            changed: changed.filter(|_| !opts.read_all),
            time_ns,
            link: link.clone().map(|l| l as Arc<dyn Linker>),
        }),
        series: Some(format!("volume:{name}")),
        tags: opts.tags,
        chunker: Some(ChunkerParams::fixed()),
        progress: opts.progress,
        ..Default::default()
    };
    let res = strata_store::ops::backup::backup(repo, backup);
    let closed = held.done(res.as_ref().ok().map(|r| r.id.as_str()));
    // (A failed snapshot's record stays: the next one releases what it
    // linked.)
    match (&res, running) {
        (Err(_), Some(r)) => r.keep(),
        (_, r) => drop(r),
    }
    let report = res?;
    closed.with_context(|| format!("closing volume {name}"))?;
    let linked = link.map(|l| l.counts()).unwrap_or_default();
    if linked.hold_failed > 0 {
        warnings.push(format!(
            "the volume did not keep the blocks of {} containers: they are stored in the \
             repository instead (see the log)",
            linked.hold_failed
        ));
    }
    Ok(Snapshotted {
        report,
        linked,
        released_leftovers,
        warnings,
    })
}

/// Tells the volume's server the committed version (its changes count
/// from it on).
fn tell_committed(conn: &UnixStream, committed: Option<&str>) {
    if let Some(id) = committed {
        if let Err(e) = (&*conn).write_all(format!("committed {id}\n").as_bytes()) {
            // The version is committed all the same; the next snapshot
            // reads everything.
            tracing::warn!("telling the volume's server the snapshot: {e}");
        }
    }
}
