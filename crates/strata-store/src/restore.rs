//! Restore and dump (DESIGN.md "Data flow", restore line).
//!
//! Restore resolves every chunk reference of the selected entries to a
//! (container, region) pair, builds a read plan ordered by container and
//! region, reads each needed region exactly once (adjacent regions are
//! coalesced into one ranged read, the next container is prefetched) and
//! writes the pieces with positional writes, several containers in
//! parallel. All-zero chunks are never read: files are created sparse at
//! their full size and zero chunks stay holes.
//!
//! Safety: every path in a recipe is checked (relative, no `.`/`..`/empty
//! components); parent directories must be real directories (never
//! symlinks) and files are opened with `O_NOFOLLOW`; symlinks are created
//! last, so nothing restore writes can pass through one. A malicious
//! repository therefore cannot make restore write outside its target.

use crate::container::open_region;
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::{data_name, Repository};
pub use crate::resolver::{recipe_refs, resolver_for, Resolved, Resolver, MAX_CHAIN};
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::format::{ContainerId, Node, NodeKind, Recipe, RegionInfo, Snapshot};

/// Checks a recipe path and turns it into a relative path.
pub fn safe_rel(path: &[u8]) -> Result<PathBuf> {
    let bad = || StoreError::UnsafePath(String::from_utf8_lossy(path).into_owned());
    if path.is_empty() || path[0] == b'/' || path.contains(&0) {
        return Err(bad());
    }
    let mut out = PathBuf::new();
    for comp in path.split(|&b| b == b'/') {
        if comp.is_empty() || comp == b"." || comp == b".." {
            return Err(bad());
        }
        out.push(std::ffi::OsStr::from_bytes(comp));
    }
    Ok(out)
}

/// Checks that every ancestor of a path below the restore root is a real
/// directory (never a symlink), remembering verified directories so each
/// is checked once per restore.
struct ParentCheck<'a> {
    root: &'a Path,
    verified: std::collections::HashSet<PathBuf>,
}

impl<'a> ParentCheck<'a> {
    fn new(root: &'a Path) -> Self {
        ParentCheck {
            root,
            verified: Default::default(),
        }
    }

    fn check(&mut self, rel: &Path) -> Result<()> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        if parent.as_os_str().is_empty() || self.verified.contains(parent) {
            return Ok(());
        }
        let mut sofar = PathBuf::new();
        for c in parent.components() {
            sofar.push(c);
            if self.verified.contains(&sofar) {
                continue;
            }
            let p = self.root.join(&sofar);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_dir() => {
                    self.verified.insert(sofar.clone());
                }
                Ok(_) => return Err(StoreError::UnsafePath(rel.display().to_string())),
                Err(e) => return Err(StoreError::io("check", p.display().to_string(), e)),
            }
        }
        Ok(())
    }
}

/// What restore does with a name that already exists in the target
/// (restic's `--overwrite`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overwrite {
    /// Replace it.
    Always,
    /// Replace it unless it already is the same kind with the same size
    /// and modification time (a symlink: the same target).
    IfChanged,
    /// Replace it only when the snapshot's version is newer.
    IfNewer,
    /// Leave it as it is.
    Never,
}

#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub target: PathBuf,
    /// Restore only these paths (and what is below them).
    pub include: Vec<Vec<u8>>,
    /// Leave out these paths (and what is below them).
    pub exclude: Vec<Vec<u8>>,
    /// What to do with files that already exist in the target.
    pub overwrite: Overwrite,
    /// Restore ownership (default: when running as root).
    pub owner: bool,
    pub progress: Arc<Progress>,
    /// Reads in flight at once (0: one per core). Reads from a remote
    /// store wait on the network, so more than the cores keep them busy.
    pub readers: usize,
    /// Set directories' metadata (mode, times) at the end. Off for the
    /// first of two passes into one tree (a version's cloud part): a
    /// read-only directory would refuse the second pass's files.
    pub dir_metadata: bool,
}

impl RestoreOptions {
    pub fn new(target: impl Into<PathBuf>) -> Self {
        RestoreOptions {
            target: target.into(),
            include: vec![],
            exclude: vec![],
            overwrite: Overwrite::Always,
            // SAFETY: geteuid cannot fail.
            owner: unsafe { libc::geteuid() } == 0,
            progress: Arc::new(Progress::default()),
            readers: 0,
            dir_metadata: true,
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RestoreReport {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    pub containers_read: u64,
    pub regions_read: u64,
    pub bytes_read: u64,
    /// Newer versions followed to resolve indirect references.
    pub chain_hops: u32,
    /// Names left as they were in the target (`Overwrite`).
    pub skipped: u64,
    pub warnings: Vec<String>,
}

impl RestoreReport {
    /// Adds the restore of one part of a version (its cloud part, then its
    /// active part) to the total; the parts share their directories, which
    /// count once (the `last` pass's).
    pub fn add(&mut self, r: RestoreReport, last: bool) {
        self.files += r.files;
        if last {
            self.dirs = r.dirs;
        }
        self.bytes += r.bytes;
        self.containers_read += r.containers_read;
        self.regions_read += r.regions_read;
        self.bytes_read += r.bytes_read;
        self.chain_hops += r.chain_hops;
        self.skipped += r.skipped;
        self.warnings.extend(r.warnings);
    }
}

/// Whether the name `full` already holds something `policy` says to keep
/// instead of restoring `n` there. Directories are merged, never kept or
/// replaced (`never` and `if-newer` keep their metadata too).
fn keep_existing(full: &Path, n: &Node, policy: Overwrite) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::symlink_metadata(full) else {
        return false;
    };
    match policy {
        Overwrite::Always => false,
        Overwrite::Never => true,
        Overwrite::IfNewer => {
            let have = m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128;
            have >= n.mtime_ns as i128
        }
        Overwrite::IfChanged => match n.kind {
            NodeKind::File => {
                let have = m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128;
                m.is_file() && m.len() == n.size && have == n.mtime_ns as i128
            }
            NodeKind::Symlink => fs::read_link(full)
                .map(|t| t.as_os_str().as_bytes() == n.target.as_deref().unwrap_or_default())
                .unwrap_or(false),
            _ => false,
        },
    }
}

/// Removes what is at `full` unless it is a directory (restore replaces
/// a name; it never deletes a tree). Never follows a symlink.
fn remove_non_dir(full: &Path) {
    if fs::symlink_metadata(full).is_ok_and(|m| !m.is_dir()) {
        let _ = fs::remove_file(full);
    }
}

/// `pattern` without a leading or trailing `/` (paths in a recipe are
/// relative to the snapshot root).
fn trim_slashes(mut p: &[u8]) -> &[u8] {
    while let [b'/', rest @ ..] = p {
        p = rest;
    }
    while let [rest @ .., b'/'] = p {
        p = rest;
    }
    p
}

/// Whether `path` (a recipe node's) is `pattern` or below it, as `ls`,
/// `restore --include/--exclude` and `dump` take paths (a leading and a
/// trailing `/` ignored; an empty pattern is the root). Bytes, so names
/// that are not UTF-8 can be selected.
pub fn under(path: &[u8], pattern: &[u8]) -> bool {
    let p = trim_slashes(pattern);
    p.is_empty() || (path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/'))
}

/// True when `path` is selected by the include list (or is an ancestor
/// directory of a selected path).
pub fn selected(path: &[u8], include: &[Vec<u8>]) -> bool {
    include.is_empty()
        || include.iter().any(|inc| {
            let inc = trim_slashes(inc);
            under(path, inc) || (inc.starts_with(path) && inc.get(path.len()) == Some(&b'/'))
        })
}

/// True when `path` is an excluded path or below one.
pub fn excluded(path: &[u8], exclude: &[Vec<u8>]) -> bool {
    exclude
        .iter()
        .any(|e| !trim_slashes(e).is_empty() && under(path, e))
}

/// The patterns that select nothing in `recipe` (a typo would otherwise
/// print or restore nothing and succeed).
pub fn unmatched<'a>(recipe: &Recipe, patterns: &'a [Vec<u8>]) -> Vec<&'a [u8]> {
    patterns
        .iter()
        .filter(|p| !recipe.nodes.iter().any(|n| under(&n.path, p)))
        .map(Vec::as_slice)
        .collect()
}

/// The regions to read from one container, each with the pieces it fills.
type RegionPlan = BTreeMap<u32, (RegionInfo, Vec<Piece>)>;

struct Piece {
    file: u32,
    file_off: u64,
    reg_off: u32,
    len: u32,
}

/// Adds `p` to a region's pieces, as part of the last one when it goes on
/// from it in both the region and the file (a disk image's chunks, stored
/// in the order of the image: one piece per region run instead of one
/// per 4 KiB chunk, in memory and in writes).
fn add_piece(pieces: &mut Vec<Piece>, p: Piece) {
    if let Some(last) = pieces.last_mut() {
        let joins = last.file == p.file
            && last.file_off + last.len as u64 == p.file_off
            && last.reg_off.checked_add(last.len) == Some(p.reg_off);
        if let (true, Some(len)) = (joins, last.len.checked_add(p.len)) {
            last.len = len;
            return;
        }
    }
    pieces.push(p)
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| StoreError::UnsafePath(p.display().to_string()))
}

fn set_times(p: &Path, mtime_ns: i64) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    let times = [ts, ts];
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The nodes an include list selects. A hard link whose first name is not
/// selected becomes a regular file with that name's content (the first such
/// link of a group); the group's other selected links point at it.
pub fn select_nodes<'a>(
    recipe: &'a Recipe,
    include: &[Vec<u8>],
    exclude: &[Vec<u8>],
) -> Vec<Cow<'a, Node>> {
    let all_selected = include.is_empty() && exclude.is_empty();
    let selected = |p: &[u8], include: &[Vec<u8>]| selected(p, include) && !excluded(p, exclude);
    let by_path: HashMap<&[u8], &Node> = if all_selected {
        HashMap::new()
    } else {
        recipe
            .nodes
            .iter()
            .map(|n| (n.path.as_slice(), n))
            .collect()
    };
    let mut moved: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut out = Vec::new();
    for n in recipe.nodes.iter().filter(|n| selected(&n.path, include)) {
        let target = n.target.as_deref().unwrap_or_default();
        if all_selected || n.kind != NodeKind::Hardlink || selected(target, include) {
            out.push(Cow::Borrowed(n));
        } else if let Some(first) = moved.get(target) {
            let mut link = n.clone();
            link.target = Some(first.clone());
            out.push(Cow::Owned(link));
        } else if let Some(orig) = by_path.get(target).filter(|o| o.kind == NodeKind::File) {
            let mut file = (*orig).clone();
            file.path = n.path.clone();
            moved.insert(target.to_vec(), n.path.clone());
            out.push(Cow::Owned(file));
        } else {
            out.push(Cow::Borrowed(n));
        }
    }
    out
}

fn set_xattr(p: &Path, name: &[u8], value: &[u8]) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes())?;
    let n = CString::new(name)?;
    // SAFETY: valid C strings and a value buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Restores a snapshot (whose recipe the caller loaded) into `opts.target`.
/// Where restored pieces go, and what reading them counted.
struct Sink<'a> {
    /// Restored files (full path, recipe path) by index.
    files: &'a [(PathBuf, String)],
    progress: &'a Progress,
    regions_read: AtomicU64,
    bytes_read: AtomicU64,
}

/// One ranged read: neighbouring regions of one container.
struct ReadGroup<'p> {
    cid: &'p ContainerId,
    regions: Vec<&'p (RegionInfo, Vec<Piece>)>,
    start: u64,
    end: u64,
}

/// Regions closer than this are read together (the gap is read and
/// dropped).
const MAX_READ_GAP: u64 = 64 << 10;
/// Longest single read. Readers take reads, not containers, so even a
/// restore of a few containers has several reads in flight and decodes
/// one while the next downloads; from a bucket this is ≤ 128 GETs per GB
/// read.
const MAX_READ: u64 = 8 << 20;

/// The plan's reads, container by container in physical order.
fn read_groups(plan: &[(ContainerId, RegionPlan)]) -> Vec<ReadGroup<'_>> {
    let mut out = Vec::new();
    for (cid, regions) in plan {
        let regs: Vec<&(RegionInfo, Vec<Piece>)> = regions.values().collect();
        let mut i = 0;
        while i < regs.len() {
            let start = regs[i].0.offset;
            let end_of = |k: usize| regs[k].0.offset + regs[k].0.stored_len as u64;
            let mut j = i;
            while j + 1 < regs.len()
                && regs[j + 1].0.offset.saturating_sub(end_of(j)) <= MAX_READ_GAP
                && end_of(j + 1) - start <= MAX_READ
            {
                j += 1;
            }
            out.push(ReadGroup {
                cid,
                regions: regs[i..=j].to_vec(),
                start,
                end: end_of(j),
            });
            i = j + 1;
        }
    }
    out
}

/// Reads every region of the plan once and writes its pieces, `readers`
/// reads at once (0: one per core), each hinting the read two ahead.
fn read_plan(
    repo: &Repository,
    plan: &[(ContainerId, RegionPlan)],
    sink: &Sink,
    readers: usize,
) -> Result<()> {
    let groups = read_groups(plan);
    let backend = repo.backend();
    let pool = match readers {
        0 => None,
        n => rayon::ThreadPoolBuilder::new().num_threads(n).build().ok(),
    };
    let read_all = || {
        groups.par_iter().enumerate().try_for_each_init(
            HashMap::<u32, File>::new,
            |open, (gi, g)| -> Result<()> {
                if let Some(next) = groups.get(gi + 2) {
                    backend.will_need(&data_name(next.cid), next.start, next.end - next.start);
                }
                restore_group(repo, g, sink, open)
            },
        )
    };
    match &pool {
        Some(p) => p.install(read_all),
        None => read_all(),
    }
}

/// One read: its regions opened and their pieces written into the files
/// (`open` keeps this reader's open files, at most 128).
fn restore_group(
    repo: &Repository,
    g: &ReadGroup,
    sink: &Sink,
    open: &mut HashMap<u32, File>,
) -> Result<()> {
    if sink.progress.is_cancelled() {
        return Err(StoreError::Cancelled);
    }
    let name = data_name(g.cid);
    let buf = repo.backend().get_range(&name, g.start, g.end - g.start)?;
    sink.bytes_read
        .fetch_add(g.end - g.start, Ordering::Relaxed);
    for (reg, pieces) in &g.regions {
        // Offsets come from container metadata: checked, not trusted.
        let stored = reg
            .offset
            .checked_sub(g.start)
            .and_then(|a| buf.get(a as usize..(a as usize).checked_add(reg.stored_len as usize)?))
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name}: a region lies outside the range read (damaged container metadata; run `strata check`)"
                ))
            })?;
        let plain = open_region(repo, &name, stored, reg)?;
        sink.regions_read.fetch_add(1, Ordering::Relaxed);
        for p in pieces {
            let data = plain
                .get(p.reg_off as usize..p.reg_off as usize + p.len as usize)
                .ok_or_else(|| StoreError::Invalid(format!("{name}: chunk outside its region")))?;
            if open.len() > 128 && !open.contains_key(&p.file) {
                open.clear();
            }
            let path = &sink.files[p.file as usize].0;
            let f = match open.entry(p.file) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(
                    OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(path)
                        .map_err(|e| StoreError::io("open", path.display().to_string(), e))?,
                ),
            };
            f.write_all_at(data, p.file_off)
                .map_err(|e| StoreError::io("write", path.display().to_string(), e))?;
            sink.progress
                .bytes_done
                .fetch_add(p.len as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    recipe: &Recipe,
    opts: &RestoreOptions,
) -> Result<RestoreReport> {
    let root = &opts.target;
    fs::create_dir_all(root)
        .map_err(|e| StoreError::io("create", root.display().to_string(), e))?;
    let mut report = RestoreReport::default();
    let nodes = select_nodes(recipe, &opts.include, &opts.exclude);
    let mut rels = Vec::with_capacity(nodes.len());
    for n in &nodes {
        rels.push(safe_rel(&n.path)?);
    }
    let progress = &opts.progress;
    let total: u64 = nodes.iter().map(|n| n.size).sum();
    progress.bytes_total.store(total, Ordering::Relaxed);
    progress.files_total.store(
        nodes.iter().filter(|n| n.kind == NodeKind::File).count() as u64,
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);

    let mut parents = ParentCheck::new(root);
    // Existing directories are merged; `never` and `if-newer` leave their
    // metadata as it is (the others make the target match the snapshot).
    let mut created_dirs: HashSet<usize> = HashSet::new();
    // Directories (sorted order puts parents first).
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[a].path.cmp(&nodes[b].path));
    for &i in &order {
        if nodes[i].kind != NodeKind::Dir {
            continue;
        }
        parents.check(&rels[i])?;
        let full = root.join(&rels[i]);
        match fs::create_dir(&full) {
            Ok(()) => {
                created_dirs.insert(i);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = fs::symlink_metadata(&full)
                    .map_err(|e| StoreError::io("stat", full.display().to_string(), e))?;
                if !m.is_dir() {
                    return Err(StoreError::Invalid(format!(
                        "{} exists in the target and is not a directory (the snapshot has a directory there)",
                        full.display()
                    )));
                }
            }
            Err(e) => {
                return Err(StoreError::io(
                    "create directory",
                    full.display().to_string(),
                    e,
                ))
            }
        }
        report.dirs += 1;
    }

    // Files: create at full size (sparse), then fill from the read plan.
    let mut kept: HashSet<usize> = HashSet::new();
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    let mut file_nodes: Vec<usize> = Vec::new();
    for &i in &order {
        if nodes[i].kind != NodeKind::File {
            continue;
        }
        parents.check(&rels[i])?;
        let full = root.join(&rels[i]);
        if keep_existing(&full, &nodes[i], opts.overwrite) {
            kept.insert(i);
            progress
                .bytes_done
                .fetch_add(nodes[i].size, Ordering::Relaxed);
            continue;
        }
        // A name is replaced, never written through: an existing file may
        // be a hard link to something outside the target, a symlink, or a
        // FIFO. It goes first; the file is then created new.
        remove_non_dir(&full);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&full)
            .map_err(|e| StoreError::io("create", full.display().to_string(), e))?;
        f.set_len(nodes[i].size)
            .map_err(|e| StoreError::io("write", full.display().to_string(), e))?;
        files.push((full, nodes[i].path_str()));
        file_nodes.push(i);
        report.files += 1;
        report.bytes += nodes[i].size;
    }

    let selected: Vec<&Node> = file_nodes.iter().map(|&i| &*nodes[i]).collect();
    let resolver = resolver_for(repo, snapshot, recipe, &selected)?;
    report.chain_hops = resolver.chain_hops;
    // container → region index → (region, pieces)
    let mut plan: BTreeMap<ContainerId, BTreeMap<u32, (RegionInfo, Vec<Piece>)>> = BTreeMap::new();
    let mut zero_bytes = 0u64;
    for (fi, &i) in file_nodes.iter().enumerate() {
        let mut off = 0u64;
        for s in &nodes[i].segments {
            for c in &s.chunks {
                if c.is_zero() {
                    zero_bytes += c.len as u64;
                } else {
                    let r = resolver.resolve(c, &files[fi].1)?;
                    let pieces = &mut plan
                        .entry(r.container)
                        .or_default()
                        .entry(r.region_idx)
                        .or_insert_with(|| (r.region, Vec::new()))
                        .1;
                    add_piece(
                        pieces,
                        Piece {
                            file: fi as u32,
                            file_off: off,
                            reg_off: r.offset,
                            len: c.len,
                        },
                    );
                }
                off += c.len as u64;
            }
        }
    }
    progress.bytes_done.fetch_add(zero_bytes, Ordering::Relaxed);
    let plan: Vec<(ContainerId, RegionPlan)> = plan.into_iter().collect();
    let sink = Sink {
        files: &files,
        progress,
        regions_read: AtomicU64::new(0),
        bytes_read: AtomicU64::new(0),
    };
    read_plan(repo, &plan, &sink, opts.readers)?;
    report.containers_read = plan.len() as u64;
    report.regions_read = sink.regions_read.load(Ordering::Relaxed);
    report.bytes_read = sink.bytes_read.load(Ordering::Relaxed);

    // Hardlinks, special files, then symlinks (last: nothing is written
    // through them).
    for &i in &order {
        let n = &*nodes[i];
        let full = root.join(&rels[i]);
        if !matches!(
            n.kind,
            NodeKind::Dir | NodeKind::File | NodeKind::Symlink | NodeKind::Socket
        ) {
            if keep_existing(&full, n, opts.overwrite) {
                kept.insert(i);
                continue;
            }
            if n.kind != NodeKind::Hardlink {
                remove_non_dir(&full);
            }
        }
        match n.kind {
            NodeKind::Hardlink => {
                let first = n.target.as_deref().map(safe_rel).transpose()?;
                match first {
                    Some(first) => {
                        parents.check(&rels[i])?;
                        // The source too: a symlink already in the target
                        // must not lead the link to a file outside it.
                        parents.check(&first)?;
                        let first = root.join(first);
                        if fs::symlink_metadata(&first).is_ok_and(|m| !m.is_file()) {
                            return Err(StoreError::UnsafePath(format!(
                                "{}: hard link to something that is not a restored file",
                                full.display()
                            )));
                        }
                        let _ = fs::remove_file(&full);
                        if let Err(e) = fs::hard_link(&first, &full) {
                            report
                                .warnings
                                .push(format!("{}: cannot create hard link: {e}", full.display()));
                        }
                    }
                    _ => report
                        .warnings
                        .push(format!("{}: hard link target not restored", full.display())),
                }
            }
            NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
                parents.check(&rels[i])?;
                let c = cstr(&full)?;
                // SAFETY: valid C string; mknod only creates a node.
                let r = unsafe {
                    libc::mknod(c.as_ptr(), n.mode as libc::mode_t, n.rdev as libc::dev_t)
                };
                if r != 0 {
                    report.warnings.push(format!(
                        "{}: cannot create special file: {}",
                        full.display(),
                        std::io::Error::last_os_error()
                    ));
                }
            }
            _ => {}
        }
    }
    for &i in &order {
        let n = &*nodes[i];
        if n.kind != NodeKind::Symlink {
            continue;
        }
        parents.check(&rels[i])?;
        let full = root.join(&rels[i]);
        if keep_existing(&full, n, opts.overwrite) {
            kept.insert(i);
            continue;
        }
        remove_non_dir(&full);
        let target = std::ffi::OsStr::from_bytes(n.target.as_deref().unwrap_or_default());
        if let Err(e) = std::os::unix::fs::symlink(target, &full) {
            report
                .warnings
                .push(format!("{}: cannot create symlink: {e}", full.display()));
        }
    }

    report.skipped = kept.len() as u64;
    // Metadata, deepest first so directory times stick.
    for &i in order.iter().rev() {
        let n = &*nodes[i];
        if matches!(n.kind, NodeKind::Hardlink | NodeKind::Socket)
            || (n.kind == NodeKind::Dir
                && (!opts.dir_metadata
                    || (matches!(opts.overwrite, Overwrite::Never | Overwrite::IfNewer)
                        && !created_dirs.contains(&i))))
            || kept.contains(&i)
        {
            continue;
        }
        let full = root.join(&rels[i]);
        // Only touch what restore created as this node: a name that is
        // something else (say, a symlink a malicious recipe put where a
        // special file failed to be created) is left alone, so chmod can
        // never reach through a link.
        let kind_matches = fs::symlink_metadata(&full)
            .map(|m| {
                use std::os::unix::fs::FileTypeExt;
                let t = m.file_type();
                match n.kind {
                    NodeKind::Dir => t.is_dir(),
                    NodeKind::File => t.is_file(),
                    NodeKind::Symlink => t.is_symlink(),
                    NodeKind::Fifo => t.is_fifo(),
                    NodeKind::CharDevice => t.is_char_device(),
                    NodeKind::BlockDevice => t.is_block_device(),
                    NodeKind::Hardlink | NodeKind::Socket => false,
                }
            })
            .unwrap_or(false);
        if !kind_matches {
            continue;
        }
        if opts.owner {
            if let Err(e) = std::os::unix::fs::lchown(&full, Some(n.uid), Some(n.gid)) {
                report
                    .warnings
                    .push(format!("{}: cannot restore owner: {e}", full.display()));
            }
        }
        for (name, value) in &n.xattrs {
            if let Err(e) = set_xattr(&full, name, value) {
                report.warnings.push(format!(
                    "{}: cannot restore extended attribute {}: {e}",
                    full.display(),
                    String::from_utf8_lossy(name)
                ));
            }
        }
        if n.kind != NodeKind::Symlink {
            use std::os::unix::fs::PermissionsExt;
            if let Err(e) = fs::set_permissions(&full, fs::Permissions::from_mode(n.mode & 0o7777))
            {
                report.warnings.push(format!(
                    "{}: cannot restore permissions: {e}",
                    full.display()
                ));
            }
        }
        if let Err(e) = set_times(&full, n.mtime_ns) {
            report
                .warnings
                .push(format!("{}: cannot restore times: {e}", full.display()));
        }
    }
    Ok(report)
}

/// What [`verify`] found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct VerifyReport {
    pub files: u64,
    pub bytes: u64,
    /// Files whose content in the target is not the snapshot's.
    pub mismatches: Vec<String>,
}

/// Reads the files `opts` selects back from the target and checks every
/// chunk against the fingerprint the recipe records — no repository data
/// is read, so this checks the restore end to end (`restore --verify`).
pub fn verify(repo: &Repository, recipe: &Recipe, opts: &RestoreOptions) -> Result<VerifyReport> {
    let nodes = select_nodes(recipe, &opts.include, &opts.exclude);
    let files: Vec<&Node> = nodes
        .iter()
        .map(|n| &**n)
        .filter(|n| n.kind == NodeKind::File)
        .collect();
    let results: Vec<Result<Option<String>>> = files
        .par_iter()
        .map(|n| verify_file(repo, &opts.target, n))
        .collect();
    let mut rep = VerifyReport::default();
    for (n, r) in files.iter().zip(results) {
        rep.files += 1;
        rep.bytes += n.size;
        if let Some(m) = r? {
            rep.mismatches.push(m);
        }
    }
    Ok(rep)
}

/// `None` when the restored file holds exactly `n`'s content.
fn verify_file(repo: &Repository, root: &Path, n: &Node) -> Result<Option<String>> {
    use std::io::Read;
    let full = root.join(safe_rel(&n.path)?);
    let shown = full.display().to_string();
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&full)
    {
        Ok(f) => std::io::BufReader::with_capacity(1 << 20, f),
        Err(e) => return Ok(Some(format!("{shown}: cannot read: {e}"))),
    };
    let mut buf = Vec::new();
    let mut off = 0u64;
    for c in n.segments.iter().flat_map(|s| &s.chunks) {
        let read = match c.is_zero() {
            // (A run of zero chunks, a MiB at a time.)
            true => all_zeros(&mut f, c.len as u64, &mut buf),
            false => {
                buf.resize(c.len as usize, 0);
                f.read_exact(&mut buf)
                    .map(|()| repo.hasher().hash(&buf) == c.fp)
            }
        };
        let same = match read {
            Ok(same) => same,
            Err(e) => return Ok(Some(format!("{shown}: shorter than the snapshot's ({e})"))),
        };
        if !same {
            return Ok(Some(format!(
                "{shown}: differs from the snapshot at byte {off}"
            )));
        }
        off += c.len as u64;
    }
    let mut extra = [0u8; 1];
    match f.read(&mut extra) {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(format!("{shown}: longer than the snapshot's"))),
        Err(e) => Ok(Some(format!("{shown}: cannot read: {e}"))),
    }
}

/// Whether the next `len` bytes of `f` are all zeros (read through `buf`,
/// a MiB at a time).
fn all_zeros(f: &mut impl std::io::Read, mut len: u64, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut zeros = true;
    while len > 0 {
        let n = len.min(1 << 20) as usize;
        buf.resize(n, 0);
        f.read_exact(buf)?;
        zeros &= buf.iter().all(|b| *b == 0);
        len -= n as u64;
    }
    Ok(zeros)
}

/// Writes one file's content to `out` in order.
pub fn dump(
    repo: &Repository,
    snapshot: &Snapshot,
    recipe: &Recipe,
    node: &Node,
    out: &mut dyn Write,
) -> Result<u64> {
    let path = node.path_str();
    let resolver = resolver_for(repo, snapshot, recipe, &[node])?;
    let mut cached: Option<((ContainerId, u32), Vec<u8>)> = None;
    let zeros = vec![0u8; 1 << 16];
    let mut written = 0u64;
    let werr = |e| StoreError::io("write", "output", e);
    for s in &node.segments {
        for c in &s.chunks {
            if c.is_zero() {
                let mut left = c.len as usize;
                while left > 0 {
                    let n = left.min(zeros.len());
                    out.write_all(&zeros[..n]).map_err(werr)?;
                    left -= n;
                }
            } else {
                let r = resolver.resolve(c, &path)?;
                let key = (r.container, r.region_idx);
                if cached.as_ref().map(|c| c.0) != Some(key) {
                    let plain = crate::container::read_region(repo, &r.container, &r.region)?;
                    cached = Some((key, plain));
                }
                let plain = &cached.as_ref().expect("filled above").1;
                let data = plain
                    .get(r.offset as usize..r.offset as usize + c.len as usize)
                    .ok_or_else(|| {
                        StoreError::Invalid(format!("{path}: chunk outside its region"))
                    })?;
                out.write_all(data).map_err(werr)?;
            }
            written += c.len as u64;
        }
    }
    out.flush().map_err(werr)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks that go on from one another in the region and in the file
    /// are one piece; a gap in either, or another file, starts a new one.
    #[test]
    fn consecutive_chunks_are_one_piece() {
        let p = |file, file_off, reg_off, len| Piece {
            file,
            file_off,
            reg_off,
            len,
        };
        let mut v = Vec::new();
        for (i, q) in [
            p(0, 0, 0, 4096),
            p(0, 4096, 4096, 4096),
            p(0, 8192, 8192, 100),
            p(0, 16384, 8292, 4096),      // a gap in the file
            p(0, 20480, 20000, 10),       // a gap in the region
            p(1, 20490, 20010, 10),       // another file
            p(1, 20500, 20020, u32::MAX), // too long to join
        ]
        .into_iter()
        .enumerate()
        {
            add_piece(&mut v, q);
            assert!(v.len() <= i + 1);
        }
        let got: Vec<_> = v
            .iter()
            .map(|q| (q.file, q.file_off, q.reg_off, q.len))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, 8292),
                (0, 16384, 8292, 4096),
                (0, 20480, 20000, 10),
                (1, 20490, 20010, 10),
                (1, 20500, 20020, u32::MAX),
            ]
        );
    }

    /// Reads cover every region once, in order, never longer than
    /// `MAX_READ` (unless one region is), never across a gap wider than
    /// `MAX_READ_GAP`, never across containers.
    #[test]
    fn reads_are_bounded_and_cover_the_plan() {
        let region = |offset: u64, len: u32| {
            let info = RegionInfo {
                offset,
                stored_len: len,
                raw_len: len,
            };
            (info, Vec::new())
        };
        let mut plan = Vec::new();
        for c in 0..2u8 {
            let mut regions = RegionPlan::new();
            let mut off = 0u64;
            for r in 0..40u32 {
                // 1 MiB regions, a wide gap every 7th, one 12 MiB region.
                let len = if r == 20 { 12 << 20 } else { 1 << 20 };
                if r % 7 == 6 {
                    off += MAX_READ_GAP + 1;
                }
                regions.insert(r, region(off, len));
                off += len as u64;
            }
            plan.push((ContainerId([c; 16]), regions));
        }
        let groups = read_groups(&plan);
        let mut seen = 0;
        for g in &groups {
            assert!(g.end - g.start <= MAX_READ || g.regions.len() == 1);
            let mut prev_end = g.start;
            for (r, _) in &g.regions {
                assert!(r.offset >= prev_end && r.offset - prev_end <= MAX_READ_GAP);
                prev_end = r.offset + r.stored_len as u64;
            }
            assert_eq!(prev_end, g.end);
            seen += g.regions.len();
        }
        assert_eq!(seen, 80);
        assert!(groups.len() > 2 * 40 / 8, "{} reads", groups.len());
        assert!(groups.iter().any(|g| g.end - g.start == 12 << 20));
    }

    #[test]
    fn unsafe_paths_rejected() {
        for bad in [
            &b"../x"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"a//b",
            b"",
            b"./a",
            b"a/.",
            b"a\0b",
        ] {
            assert!(safe_rel(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(safe_rel(b"a/b c/d").unwrap(), PathBuf::from("a/b c/d"));
    }

    #[test]
    fn include_selection() {
        let inc = vec![b"/home/u/proj/".to_vec()];
        assert!(selected(b"home", &inc));
        assert!(selected(b"home/u/proj", &inc));
        assert!(selected(b"home/u/proj/a", &inc));
        assert!(!selected(b"home/u/projx", &inc));
        assert!(!selected(b"home/v", &inc));
        let ex = vec![b"home/u/proj/a".to_vec()];
        assert!(excluded(b"home/u/proj/a/b", &ex));
        assert!(!excluded(b"home/u/proj/ab", &ex));
        assert!(!excluded(b"home/u/proj", &ex));
        assert!(!excluded(b"x", &[b"/".to_vec()]));
        // Names that are not UTF-8 select as bytes.
        assert!(under(b"d/n\xff/f", b"/d/n\xff"));
        assert!(!under(b"d/n\xfe", b"/d/n\xff"));
    }
}
