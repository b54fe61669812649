use crate::error::{MountError, Result};
use crate::layout::*;
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};
use strata_core::format::{NodeKind, Snapshot, Tier};
use strata_core::id::SnapshotId;
use strata_store::engine::fsread::{FileReader, RegionCache, SnapshotReader};
use strata_store::repo::skeleton::Skeleton;
use strata_store::tier::Tiers;
use strata_store::Repository;

/// A directory entry as listed: inode, kind, name, and the offset of the
/// entry after it (its position, so entries left out keep the others'
/// offsets).
type Entry<'a> = (u64, FileType, &'a OsStr, u64);

/// The longest name a directory entry may have (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// Whether a name can be listed: one longer than `NAME_MAX` would end the
/// listing in the kernel (and no program could open it), so it is left
/// out and the entries after it listed.
fn listable(name: &OsStr) -> bool {
    name.len() <= NAME_MAX
}

/// A series as a directory: its versions, by number.
pub(crate) struct SeriesDir {
    name: OsString,
    /// (directory name, snapshot index), in version order.
    versions: Vec<(OsString, usize)>,
    /// Index into `versions` of the newest.
    latest: Option<usize>,
    mtime: SystemTime,
}

/// A snapshot and its tree once loaded.
pub(crate) struct SnapEntry {
    id: SnapshotId,
    snap: Snapshot,
    series: usize,
    loaded: Mutex<Option<Arc<Loaded>>>,
}

/// The file system: the snapshots listed at mount time, their trees as
/// they are used, open files, and the shared region cache.
pub(crate) struct StrataFs {
    repo: Repository,
    /// The repository and its cloud tier (opened on first use).
    tiers: Tiers,
    cache: Arc<RegionCache>,
    pub(crate) snaps: Vec<SnapEntry>,
    pub(crate) series: Vec<SeriesDir>,
    /// (directory name, snapshot index), sorted by name.
    ids: Vec<(OsString, usize)>,
    files: Mutex<HashMap<u64, Arc<FileReader>>>,
    next_fh: AtomicU64,
    uid: u32,
    gid: u32,
    mounted: SystemTime,
    /// Unmounts the session; taken by whoever ends it first (a signal, or
    /// [`Filesystem::destroy`] once the kernel let go).
    pub(crate) unmounter: Arc<Mutex<Option<fuser::SessionUnmounter>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replies EIO for a repository error, with a warning in the log.
fn eio(what: &str, e: impl std::fmt::Display) -> Errno {
    tracing::warn!("{what}: {e:#}");
    Errno::EIO
}

impl StrataFs {
    /// The layout of `snapshots` (oldest first), restricted to the series
    /// in `only` when it is not empty.
    pub(crate) fn new(
        tiers: Tiers,
        snapshots: Vec<(SnapshotId, Snapshot)>,
        only: &[String],
        cache: Arc<RegionCache>,
    ) -> StrataFs {
        let mut snapshots = snapshots;
        if !only.is_empty() {
            snapshots.retain(|(_, s)| only.contains(&s.series));
        }
        // Series by directory name (lookups search it), versions by
        // number (then time, then id: the last is `SERIES@latest`).
        let mut snapshots: Vec<(String, SnapshotId, Snapshot)> = snapshots
            .into_iter()
            .map(|(id, s)| (escape_component(&s.series), id, s))
            .collect();
        snapshots.sort_by(|a, b| {
            (&a.0, a.2.version, a.2.time_ns, &a.1).cmp(&(&b.0, b.2.version, b.2.time_ns, &b.1))
        });
        let mut series: Vec<SeriesDir> = Vec::new();
        let mut snaps = Vec::with_capacity(snapshots.len());
        for (i, (name, id, s)) in snapshots.into_iter().enumerate() {
            let name = OsString::from(name);
            if series.last().is_none_or(|d| d.name != name) {
                series.push(SeriesDir {
                    name,
                    versions: Vec::new(),
                    latest: None,
                    mtime: UNIX_EPOCH,
                });
            }
            let k = series.len() - 1;
            let d = &mut series[k];
            let mut vname = s.version.to_string();
            if d.versions.iter().any(|(n, _)| n == vname.as_str()) {
                // Two snapshots claim one version: the second by its id too.
                vname = format!("{vname}-{}", escape_component(&id));
            }
            d.versions.push((OsString::from(vname), i));
            d.latest = Some(d.versions.len() - 1);
            d.mtime = d.mtime.max(time_of(s.time_ns));
            snaps.push(SnapEntry {
                id,
                snap: s,
                series: k,
                loaded: Mutex::new(None),
            });
        }
        let ids = short_ids(&snaps);
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        StrataFs {
            repo: tiers.active().clone(),
            tiers,
            cache,
            snaps,
            series,
            ids,
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            uid,
            gid,
            mounted: SystemTime::now(),
            unmounter: Arc::default(),
        }
    }

    /// Snapshot `s`'s tree, loading its recipes the first time.
    fn loaded(&self, s: usize) -> Result<Arc<Loaded>, Errno> {
        let e = self.snaps.get(s).ok_or(Errno::ENOENT)?;
        let mut g = lock(&e.loaded);
        if let Some(l) = &*g {
            return Ok(l.clone());
        }
        let what = format!("snapshot {} ({}@{})", e.id, e.snap.series, e.snap.version);
        let mut parts = Vec::new();
        let mut add = |snapshot: Snapshot, cloud: bool| -> Result<(), Errno> {
            let tree = Skeleton::load(&self.repo, &snapshot.recipe)
                .map_err(|err| eio(&format!("{what}: loading its recipe"), err))?;
            parts.push(Part {
                snapshot,
                tree: Arc::new(tree),
                cloud,
                reader: Mutex::new(None),
            });
            Ok(())
        };
        add(e.snap.clone(), e.snap.tier == Tier::Cloud)?;
        if let Some(p) = strata_store::repo::tiers::part_snapshot(&e.snap) {
            add(p, true)?;
        }
        let (nodes, skipped) = build_tree(&parts);
        if skipped > 0 {
            tracing::warn!("{what}: {skipped} entries with unusable paths left out");
        }
        let l = Arc::new(Loaded { parts, nodes });
        *g = Some(l.clone());
        Ok(l)
    }

    /// The reader of one recipe of a version (its data repository opened
    /// on first use).
    fn part_reader(&self, l: &Loaded, p: usize) -> Result<Arc<SnapshotReader>> {
        let part = l
            .parts
            .get(p)
            .ok_or_else(|| MountError::Invalid("no such recipe part".into()))?;
        let mut g = lock(&part.reader);
        if let Some(r) = &*g {
            return Ok(r.clone());
        }
        let data = if part.cloud {
            self.tiers.cloud()?
        } else {
            self.repo.clone()
        };
        let r = Arc::new(SnapshotReader::stored(
            data,
            part.snapshot.clone(),
            part.tree.clone(),
            self.repo.clone(),
            self.cache.clone(),
        ));
        *g = Some(r.clone());
        Ok(r)
    }

    /// Attributes of a directory of the fixed layout.
    fn dir_attr(&self, ino: u64, mtime: SystemTime) -> FileAttr {
        self.attr(ino, FileType::Directory, 0o555, 0, mtime)
    }

    fn attr(&self, ino: u64, kind: FileType, perm: u16, size: u64, mtime: SystemTime) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Attributes of entry `local` of a snapshot's tree.
    fn tree_attr(&self, ino: u64, s: &SnapEntry, l: &Loaded, local: u64) -> Option<FileAttr> {
        let t = l.node(local)?;
        let Some(n) = l.recipe_node(t) else {
            return Some(self.dir_attr(ino, time_of(s.snap.time_ns)));
        };
        let kind = match n.kind {
            NodeKind::Dir => FileType::Directory,
            NodeKind::File | NodeKind::Hardlink => FileType::RegularFile,
            NodeKind::Symlink => FileType::Symlink,
            NodeKind::Fifo => FileType::NamedPipe,
            NodeKind::CharDevice => FileType::CharDevice,
            NodeKind::BlockDevice => FileType::BlockDevice,
            NodeKind::Socket => FileType::Socket,
        };
        let mut a = self.attr(
            ino,
            kind,
            (n.mode & 0o7777) as u16,
            t.size,
            time_of(n.mtime_ns),
        );
        a.ctime = time_of(n.ctime_ns);
        a.uid = n.uid;
        a.gid = n.gid;
        a.rdev = kernel_dev(n.rdev);
        if kind == FileType::RegularFile {
            a.nlink = n.nlink.clamp(1, u32::MAX as u64) as u32;
        }
        Some(a)
    }

    /// Attributes of any inode.
    fn getattr_of(&self, ino: u64) -> Result<FileAttr, Errno> {
        let newest = || {
            self.series
                .iter()
                .map(|d| d.mtime)
                .max()
                .unwrap_or(self.mounted)
        };
        match Ino::decode(ino).ok_or(Errno::ENOENT)? {
            Ino::Root | Ino::SeriesDir | Ino::IdsDir => Ok(self.dir_attr(ino, newest())),
            Ino::Series(k) => {
                let d = self.series.get(k).ok_or(Errno::ENOENT)?;
                Ok(self.dir_attr(ino, d.mtime))
            }
            Ino::Latest(k) => {
                let d = self.series.get(k).ok_or(Errno::ENOENT)?;
                let (name, _) = d
                    .latest
                    .and_then(|i| d.versions.get(i))
                    .ok_or(Errno::ENOENT)?;
                let size = name.len() as u64;
                Ok(self.attr(ino, FileType::Symlink, 0o777, size, d.mtime))
            }
            Ino::Tree { snap, local, .. } => {
                let s = self.snaps.get(snap).ok_or(Errno::ENOENT)?;
                if local == 0 {
                    // A version's root is always made up: `ls -l` of a
                    // series loads no recipe.
                    return Ok(self.dir_attr(ino, time_of(s.snap.time_ns)));
                }
                let l = self.loaded(snap)?;
                self.tree_attr(ino, s, &l, local).ok_or(Errno::ENOENT)
            }
        }
    }

    /// The inode `name` names in directory `parent`.
    fn lookup_ino(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        let find = |v: &[(OsString, usize)]| {
            v.binary_search_by(|(n, _)| n.as_os_str().cmp(name))
                .ok()
                .map(|i| v[i].1)
        };
        let ino = match Ino::decode(parent).ok_or(Errno::ENOENT)? {
            Ino::Root => match name.as_bytes() {
                b"series" => Ino::SeriesDir,
                b"ids" => Ino::IdsDir,
                _ => return Err(Errno::ENOENT),
            },
            Ino::SeriesDir => {
                let k = self
                    .series
                    .binary_search_by(|d| d.name.as_os_str().cmp(name))
                    .map_err(|_| Errno::ENOENT)?;
                Ino::Series(k)
            }
            Ino::IdsDir => Ino::Tree {
                snap: find(&self.ids).ok_or(Errno::ENOENT)?,
                via: Via::Ids,
                local: 0,
            },
            Ino::Series(k) => {
                let d = self.series.get(k).ok_or(Errno::ENOENT)?;
                if name == "latest" && d.latest.is_some() {
                    Ino::Latest(k)
                } else {
                    let i = d.versions.iter().position(|(n, _)| n == name);
                    Ino::Tree {
                        snap: d.versions[i.ok_or(Errno::ENOENT)?].1,
                        via: Via::Series,
                        local: 0,
                    }
                }
            }
            Ino::Latest(_) => return Err(Errno::ENOTDIR),
            Ino::Tree { snap, via, local } => {
                let l = self.loaded(snap)?;
                if !l.is_dir(local) {
                    return Err(Errno::ENOTDIR);
                }
                let c = l.child(local, name.as_bytes()).ok_or(Errno::ENOENT)?;
                Ino::Tree {
                    snap,
                    via,
                    local: c,
                }
            }
        };
        Ok(ino.encode())
    }

    /// The entries of directory `ino` from index `from` on (`.` and `..`
    /// are 0 and 1), handed to `add` until it says the reply is full.
    fn list(
        &self,
        ino: u64,
        from: usize,
        add: &mut dyn FnMut(Entry<'_>) -> bool,
    ) -> Result<(), Errno> {
        use FileType::{Directory as D, Symlink as L};
        // (parent, children) of the fixed layout; a tree lists itself.
        let (parent, children): (u64, Vec<(u64, FileType, OsString)>) = match Ino::decode(ino)
            .ok_or(Errno::ENOENT)?
        {
            Ino::Root => (
                INO_ROOT,
                vec![(INO_SERIES, D, "series".into()), (INO_IDS, D, "ids".into())],
            ),
            Ino::SeriesDir => (
                INO_ROOT,
                (self.series.iter().enumerate())
                    .map(|(k, d)| (Ino::Series(k).encode(), D, d.name.clone()))
                    .collect(),
            ),
            Ino::IdsDir => (
                INO_ROOT,
                (self.ids.iter())
                    .map(|(n, s)| (tree_root(*s, Via::Ids), D, n.clone()))
                    .collect(),
            ),
            Ino::Series(k) => {
                let d = self.series.get(k).ok_or(Errno::ENOENT)?;
                let mut c: Vec<_> = (d.versions.iter())
                    .map(|(n, s)| (tree_root(*s, Via::Series), D, n.clone()))
                    .collect();
                if d.latest.is_some() {
                    c.push((Ino::Latest(k).encode(), L, "latest".into()));
                }
                (INO_SERIES, c)
            }
            Ino::Latest(_) => return Err(Errno::ENOTDIR),
            Ino::Tree { snap, via, local } => return self.list_tree(snap, via, local, from, add),
        };
        let dots = [(ino, D, OsString::from(".")), (parent, D, "..".into())];
        for (at, (e, kind, name)) in dots.into_iter().chain(children).enumerate().skip(from) {
            if listable(&name) && add((e, kind, &name, at as u64 + 1)) {
                break;
            }
        }
        Ok(())
    }

    /// [`Self::list`] for a directory of a snapshot's tree.
    fn list_tree(
        &self,
        snap: usize,
        via: Via,
        local: u64,
        from: usize,
        add: &mut dyn FnMut(Entry<'_>) -> bool,
    ) -> Result<(), Errno> {
        let l = self.loaded(snap)?;
        if !l.is_dir(local) {
            return Err(Errno::ENOTDIR);
        }
        let t = l.node(local).ok_or(Errno::ENOENT)?;
        let ino = |local| Ino::Tree { snap, via, local }.encode();
        let parent = match (local, via) {
            (0, Via::Series) => Ino::Series(self.snaps[snap].series).encode(),
            (0, Via::Ids) => INO_IDS,
            _ => ino(t.parent),
        };
        let dots = [(ino(local), OsStr::new(".")), (parent, OsStr::new(".."))];
        for (at, (e, name)) in dots.into_iter().enumerate().skip(from) {
            if add((e, FileType::Directory, name, at as u64 + 1)) {
                return Ok(());
            }
        }
        let children = t.children.iter().enumerate().map(|(i, c)| (i + 2, c));
        for (at, &c) in children.skip(from.saturating_sub(2)) {
            let Some(ct) = l.node(c) else { continue };
            let name = OsStr::from_bytes(&ct.name);
            if !listable(name) {
                continue;
            }
            let target = ct.link.unwrap_or(c);
            let kind = self
                .tree_attr(0, &self.snaps[snap], &l, target)
                .map_or(FileType::RegularFile, |a| a.kind);
            if add((ino(target), kind, name, at as u64 + 1)) {
                break;
            }
        }
        Ok(())
    }

    /// Opens a file of a snapshot for reading.
    fn open_file(&self, ino: u64) -> Result<u64, Errno> {
        let Some(Ino::Tree { snap, local, .. }) = Ino::decode(ino) else {
            return Err(Errno::EISDIR);
        };
        let l = self.loaded(snap)?;
        let t = l.node(local).ok_or(Errno::ENOENT)?;
        let n = l.recipe_node(t).ok_or(Errno::EISDIR)?;
        let (p, i) = t.src.ok_or(Errno::EISDIR)?;
        let path = n.path_str();
        match n.kind {
            NodeKind::File => {}
            NodeKind::Dir => return Err(Errno::EISDIR),
            NodeKind::Hardlink => {
                return Err(eio(&path, "hard link to a file missing from the snapshot"))
            }
            _ => return Err(Errno::EACCES),
        }
        let reader = self
            .part_reader(&l, p)
            .and_then(|r| Ok(r.open_node(i)?))
            .map_err(|e| eio(&format!("{path}: opening"), e))?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.files).insert(fh, Arc::new(reader));
        Ok(fh)
    }

    /// The extended attributes of an entry of a snapshot's tree.
    fn xattrs(&self, ino: u64) -> Result<Xattrs, Errno> {
        let Some(Ino::Tree { snap, local, .. }) = Ino::decode(ino) else {
            return Ok(Vec::new());
        };
        let l = self.loaded(snap)?;
        let t = l.node(local).ok_or(Errno::ENOENT)?;
        Ok(l.recipe_node(t)
            .map(|n| n.xattrs.clone())
            .unwrap_or_default())
    }
}

/// Extended attributes: (name, value).
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Inode of snapshot `s`'s tree root reached through `via`.
fn tree_root(s: usize, via: Via) -> u64 {
    Ino::Tree {
        snap: s,
        via,
        local: 0,
    }
    .encode()
}

/// Directory names of `/ids`: 8 hex digits of each id, the whole id where
/// two share them; sorted by name.
fn short_ids(snaps: &[SnapEntry]) -> Vec<(OsString, usize)> {
    let short = |id: &str| id.get(..8).unwrap_or(id).to_string();
    let mut count: HashMap<String, usize> = HashMap::new();
    for s in snaps {
        *count.entry(short(&s.id)).or_default() += 1;
    }
    let mut ids: Vec<(OsString, usize)> = snaps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let name = match count.get(&short(&s.id)) {
                Some(1) => short(&s.id),
                _ => s.id.to_string(),
            };
            (OsString::from(escape_component(&name)), i)
        })
        .collect();
    ids.sort();
    ids.dedup_by(|a, b| a.0 == b.0);
    ids
}

/// Replies for an xattr request: the size when asked for it, ERANGE when
/// the buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl Filesystem for StrataFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        Ok(())
    }

    /// The kernel ended the session (someone unmounted the file system).
    /// `fuser` would then try to unmount it again as the session ends, and
    /// log that failure: the unmounter taken here leaves it nothing to do.
    fn destroy(&mut self) {
        if let Some(mut u) = lock(&self.unmounter).take() {
            let _ = u.unmount();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .lookup_ino(parent.0, name)
            .and_then(|ino| self.getattr_of(ino))
        {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_of(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = match Ino::decode(ino.0) {
            Some(Ino::Latest(k)) => self
                .series
                .get(k)
                .and_then(|d| d.versions.get(d.latest?))
                .map(|(n, _)| n.as_bytes().to_vec()),
            Some(Ino::Tree { snap, local, .. }) => match self.loaded(snap) {
                Ok(l) => l
                    .node(local)
                    .and_then(|t| l.recipe_node(t))
                    .filter(|n| n.kind == NodeKind::Symlink)
                    .map(|n| n.target.clone().unwrap_or_default()),
                Err(e) => return reply.error(e),
            },
            _ => None,
        };
        match target {
            Some(t) => reply.data(&t),
            None => reply.error(Errno::EINVAL),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.open_file(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = lock(&self.files).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        match f.read_at(offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(eio(&format!("reading {} at {offset}", f.path()), e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.files).remove(&fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        let res = self.list(ino.0, from, &mut |(e, kind, name, next)| {
            reply.add(INodeNo(e), next, kind, name)
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, NAME_MAX as u32, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.xattrs(ino.0) {
            Ok(x) => match x.iter().find(|(n, _)| n.as_slice() == name.as_bytes()) {
                Some((_, v)) => reply_xattr(reply, size, v),
                None => reply.error(Errno::NO_XATTR),
            },
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.xattrs(ino.0) {
            Ok(x) => {
                let mut names = Vec::new();
                for (n, _) in &x {
                    names.extend_from_slice(n);
                    names.push(0);
                }
                reply_xattr(reply, size, &names)
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }

    // Everything that would change the file system: read-only.

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS)
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS)
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS)
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(Errno::EROFS)
    }
}

/// Set by SIGINT / SIGTERM.
#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::format::Node;
    use strata_core::id::SnapshotId;

    #[test]
    fn escaped_names_are_single_distinct_components() {
        let names = [
            "", ".", "..", "a/b", "a%2Fb", "%", "a\0b", "ok", "...", "a∕b",
        ];
        let esc: Vec<String> = names.iter().map(|n| escape_component(n)).collect();
        for e in &esc {
            assert!(!e.contains('/') && !e.contains('\0') && e != "." && e != "..");
        }
        let mut uniq = esc.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), names.len(), "{esc:?}");
        assert_eq!(escape_component("home/alice"), "home%2Falice");
    }

    #[test]
    fn device_numbers_in_the_kernel_encoding() {
        assert_eq!(kernel_dev(libc::makedev(8, 1)), (8 << 8) | 1);
        assert_eq!(
            kernel_dev(libc::makedev(259, 0x12345)),
            0x45 | (259 << 8) | (0x123 << 20)
        );
    }

    #[test]
    fn inode_numbers_round_trip() {
        for i in [
            Ino::Root,
            Ino::SeriesDir,
            Ino::IdsDir,
            Ino::Series(0),
            Ino::Latest(0),
            Ino::Series(12345),
            Ino::Latest(12345),
            Ino::Tree {
                snap: 0,
                via: Via::Series,
                local: 0,
            },
            Ino::Tree {
                snap: 7,
                via: Via::Ids,
                local: LOCAL_MASK,
            },
        ] {
            assert_eq!(Ino::decode(i.encode()), Some(i), "{i:?}");
        }
        assert_eq!(Ino::decode(0), None);
    }

    fn snapshot(series: &str, version: u32) -> Snapshot {
        Snapshot {
            series: series.into(),
            version,
            time_ns: version as i64,
            host: String::new(),
            paths: Vec::new(),
            tags: Vec::new(),
            recipe: strata_core::id::RecipeId::parse(&"0".repeat(64)).unwrap(),
            parent: None,
            chunker: strata_core::chunker::ChunkerParams::cdc(8192),
            stats: Default::default(),
            archival: None,
            tier: Tier::Active,
            cloud_part: None,
        }
    }

    /// Series whose escaped names sort differently from the names
    /// themselves are all found; `latest` is the highest version.
    #[test]
    fn layout_finds_every_series_and_version() {
        let backend = Arc::new(strata_store::backend::MemoryBackend::new());
        let repo = Repository::init(backend, Default::default()).unwrap();
        let names = ["a/b", "a-b", "a", "a%b", "", "é/x"];
        let mut snaps = Vec::new();
        for (i, n) in names.iter().enumerate() {
            for v in [2, 1, 3] {
                let id = SnapshotId::parse(&format!("abcdef0{i}{v}{}", "0".repeat(55))).unwrap();
                snaps.push((id, snapshot(n, v)));
            }
        }
        let only = SnapshotId::parse(&format!("ffff{}", "0".repeat(60))).unwrap();
        snaps.push((only, snapshot("only", 1)));
        let no_cloud = Arc::new(
            |_: &str| -> strata_store::Result<Arc<dyn strata_store::Backend>> {
                Err(strata_store::StoreError::Invalid(
                    "no cloud tier here".into(),
                ))
            },
        );
        let fs = StrataFs::new(Tiers::new(&repo, no_cloud), snaps, &[], Arc::default());
        let mut listed = Vec::new();
        fs.list(INO_SERIES, 0, &mut |(_, _, n, _)| {
            listed.push(n.to_os_string());
            false
        })
        .unwrap();
        assert_eq!(listed.len(), names.len() + 3);
        for n in names {
            let dir = fs.lookup_ino(INO_SERIES, OsStr::new(&escape_component(n)));
            let dir = dir.unwrap_or_else(|_| panic!("series {n:?} not found"));
            let latest = fs.lookup_ino(dir, OsStr::new("latest")).unwrap();
            let Some(Ino::Latest(k)) = Ino::decode(latest) else {
                panic!("latest of {n:?}")
            };
            let d = &fs.series[k];
            let (vname, s) = &d.versions[d.latest.unwrap()];
            assert_eq!(vname, "3");
            assert_eq!(fs.snaps[*s].snap.series, n);
            for v in ["1", "2", "3"] {
                assert!(fs.lookup_ino(dir, OsStr::new(v)).is_ok(), "{n:?}/{v}");
            }
            assert!(fs.lookup_ino(dir, OsStr::new("4")).is_err());
        }
        // Short ids, the whole id where 8 digits are ambiguous.
        assert!(fs.lookup_ino(INO_IDS, OsStr::new("ffff0000")).is_ok());
        assert!(fs.lookup_ino(INO_IDS, OsStr::new("abcdef00")).is_err());
        let whole = format!("abcdef001{}", "0".repeat(55));
        assert!(fs.lookup_ino(INO_IDS, OsStr::new(&whole)).is_ok());
    }

    fn node(path: &str, kind: NodeKind, target: Option<&str>) -> Node {
        Node {
            mode: 0o644,
            target: target.map(|t| t.as_bytes().to_vec()),
            ..Node::new(path.as_bytes().to_vec(), kind)
        }
    }

    fn part(nodes: Vec<Node>) -> Part {
        Part {
            snapshot: snapshot("", 1),
            tree: Arc::new(Skeleton::of_nodes(nodes)),
            cloud: false,
            reader: Mutex::new(None),
        }
    }

    /// Missing ancestors are made up, bad paths and entries below files
    /// left out, hard links resolved, children sorted, names raw bytes.
    #[test]
    fn tree_from_recipe() {
        let mut odd = node("x", NodeKind::File, None);
        odd.path = b"home/\xff\xfe".to_vec();
        let parts = vec![part(vec![
            node("home", NodeKind::Dir, None),
            node("home/b", NodeKind::File, None),
            node("home/b/under-a-file", NodeKind::File, None),
            node("home/a", NodeKind::Hardlink, Some("home/b")),
            node("../evil", NodeKind::File, None),
            node("deep/er/file", NodeKind::File, None),
            node("home/dangling", NodeKind::Hardlink, Some("nope")),
            odd,
        ])];
        let (nodes, skipped) = build_tree(&parts);
        assert_eq!(skipped, 2);
        let l = Loaded { parts, nodes };
        let home = l.child(0, b"home").unwrap();
        assert!(l.is_dir(home));
        let b = l.child(home, b"b").unwrap();
        assert_eq!(l.child(home, b"a"), Some(b), "hard link → its file");
        assert!(l.child(b, b"under-a-file").is_none());
        let dangling = l.child(home, b"dangling").unwrap();
        assert!(l.node(dangling).unwrap().link.is_none());
        assert!(l.child(home, b"\xff\xfe").is_some());
        let deep = l.child(0, b"deep").unwrap();
        assert!(l.is_dir(deep) && l.node(deep).unwrap().src.is_none());
        let er = l.child(deep, b"er").unwrap();
        assert!(l.child(er, b"file").is_some());
        let names: Vec<&[u8]> = (l.node(home).unwrap().children.iter())
            .map(|c| l.node(*c).unwrap().name.as_slice())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }

    /// A name longer than NAME_MAX (a crafted recipe) is left out of its
    /// directory's listing, and the entries after it are listed — also
    /// when the listing resumes at an offset past it.
    #[test]
    fn an_over_long_name_does_not_end_the_listing() {
        let long = format!("d/{}", "x".repeat(300));
        let parts = vec![part(vec![
            node("d", NodeKind::Dir, None),
            node("d/a", NodeKind::File, None),
            node(&long, NodeKind::File, None),
            node("d/z1", NodeKind::File, None),
            node("d/z2", NodeKind::File, None),
        ])];
        let (nodes, _) = build_tree(&parts);
        let backend = Arc::new(strata_store::backend::MemoryBackend::new());
        let repo = Repository::init(backend, Default::default()).unwrap();
        let id = SnapshotId::parse(&"ab".repeat(32)).unwrap();
        let no_cloud = Arc::new(
            |_: &str| -> strata_store::Result<Arc<dyn strata_store::Backend>> {
                Err(strata_store::StoreError::Invalid("no cloud".into()))
            },
        );
        let fs = StrataFs::new(
            Tiers::new(&repo, no_cloud),
            vec![(id, snapshot("s", 1))],
            &[],
            Arc::default(),
        );
        *lock(&fs.snaps[0].loaded) = Some(Arc::new(Loaded { parts, nodes }));
        let root = tree_root(0, Via::Ids);
        let d = fs.lookup_ino(root, OsStr::new("d")).unwrap();
        let list = |from: usize| {
            let mut out = Vec::new();
            fs.list(d, from, &mut |(_, _, n, next)| {
                out.push((n.to_string_lossy().into_owned(), next));
                false
            })
            .unwrap();
            out
        };
        let all = list(0);
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [".", "..", "a", "z1", "z2"]);
        // Resuming after "a" (the offset it gave) lists z1 and z2 once.
        let after_a = all[2].1 as usize;
        let rest: Vec<String> = list(after_a).into_iter().map(|(n, _)| n).collect();
        assert_eq!(rest, ["z1", "z2"]);
    }
}
