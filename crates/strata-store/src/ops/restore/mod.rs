//! Restore and dump (docs/design.md "Data flow", restore line).
//!
//! Restore resolves every chunk reference of the selected entries to a
//! (container, region) pair, builds a read plan ordered by container and
//! region, reads each needed region once per plan (adjacent regions are
//! coalesced into one ranged read, the next read is hinted) and writes
//! the pieces with positional writes, several reads in parallel. A stored
//! recipe is read a part at a time and a plan is read when it is full
//! (`RestoreOptions::plan_pieces`), so memory holds the tree's metadata,
//! not its chunk lists. All-zero chunks are never read: files are created sparse at
//! their full size and zero chunks stay holes.
//!
//! Safety: every path in a recipe is checked (relative, no `.`/`..`/empty
//! components); parent directories must be real directories (never
//! symlinks) and files are opened with `O_NOFOLLOW`; symlinks are created
//! last, so nothing restore writes can pass through one. A malicious
//! repository therefore cannot make restore write outside its target.

mod files;
mod meta;
mod options;
mod plan;
mod select;
mod source;
mod verify;

pub use crate::engine::resolver::{recipe_refs, resolver_for, Resolved, Resolver, MAX_CHAIN};
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use files::RestoreFile;
use meta::{apply, MetaOpts, Target};
pub use options::{Overwrite, RestoreOptions};
pub use plan::PLAN_PIECES;
use rayon::prelude::*;
use select::select_entries;
pub use select::{excluded, safe_rel, select_nodes, selected, under, unmatched};
pub use source::RecipeSource;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use strata_core::format::{Node, NodeKind, Recipe, Snapshot};
pub use verify::{verify, verify_from, VerifyReport};

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
    /// Read plans gone through: more than one when the chunks to restore
    /// do not fit one (`RestoreOptions::plan_pieces`).
    pub plans: u64,
    /// Names left as they were in the target (`Overwrite`).
    pub skipped: u64,
    /// Device nodes and FIFOs not created (`RestoreOptions::no_special`).
    pub specials_left_out: u64,
    /// Chunks read from another stored copy because the one the recipe
    /// names is damaged (each named in a warning).
    pub second_copies: u64,
    /// Files and directories restored without their set-id bits or file
    /// capabilities (`RestoreOptions::no_setuid`).
    pub privileges_dropped: u64,
    /// Where the time went, step by step, and the readers' busy time.
    pub phases: Vec<Phase>,
    pub warnings: Vec<String>,
}

/// One step of a restore and its seconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub phase: &'static str,
    /// `wall`: a step, run after the one before it; `busy`: the readers'
    /// time in one kind of work, summed over them (during `reads`).
    pub kind: &'static str,
    pub seconds: f64,
}

/// Times a restore's steps.
struct Clock {
    at: std::time::Instant,
    phases: Vec<Phase>,
}

impl Clock {
    fn new() -> Self {
        Clock {
            at: std::time::Instant::now(),
            phases: Vec::new(),
        }
    }

    /// Ends the step `phase` (begun when the last one ended).
    fn lap(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        let seconds = (now - self.at).as_secs_f64();
        self.phases.push(Phase {
            phase,
            kind: "wall",
            seconds,
        });
        self.at = now;
    }

    fn busy(&mut self, phase: &'static str, ns: &std::sync::atomic::AtomicU64) {
        let seconds = ns.load(Ordering::Relaxed) as f64 / 1e9;
        self.phases.push(Phase {
            phase,
            kind: "busy",
            seconds,
        });
    }
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
        self.plans += r.plans;
        self.skipped += r.skipped;
        self.specials_left_out += r.specials_left_out;
        self.second_copies += r.second_copies;
        self.privileges_dropped += r.privileges_dropped;
        self.phases.extend(r.phases);
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

/// Whether `m` has the set-group-id bit (on a directory: new names in
/// it take its group).
fn is_setgid(m: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o2000 != 0
}

/// Whether the directory `p` passes its group on (true when unknown).
fn is_setgid_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).map_or(true, |m| is_setgid(&m))
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| StoreError::UnsafePath(p.display().to_string()))
}

/// Restores the version `snapshot` whose recipe is `recipe` (in memory)
/// into `opts.target`; see [`restore_from`].
pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    recipe: &Recipe,
    opts: &RestoreOptions,
) -> Result<RestoreReport> {
    restore_from(repo, snapshot, RecipeSource::Memory(recipe), opts)
}

/// Restores the version `snapshot` into `opts.target`, its data read from
/// `repo` and its recipe from `source` — for a stored recipe, a part at a
/// time: the tree's metadata is held, never its whole chunk list, and the
/// data is read a plan of bounded size at a time (`opts.plan_pieces`).
/// Directories first, then the files, each created and finished (size,
/// owner, mode, times) by the readers that write it, then hard links and
/// special files, symlinks, and the other names' metadata last.
pub fn restore_from(
    repo: &Repository,
    snapshot: &Snapshot,
    source: RecipeSource,
    opts: &RestoreOptions,
) -> Result<RestoreReport> {
    let mut clock = Clock::new();
    let root = &opts.target;
    fs::create_dir_all(root)
        .map_err(|e| StoreError::io("create", root.display().to_string(), e))?;
    let skeleton = source.skeleton()?;
    let selection = select_entries(&skeleton, &opts.include, &opts.exclude);
    let mut run = Run::new(opts, &selection)?;
    clock.lap("plan");
    run.make_dirs()?;
    clock.lap("directories");
    let (files, content) = run.make_files()?;
    let mut meta = MetaOpts::new(opts.owner, opts.no_setuid);
    if run.setgid_dirs {
        // New files take a directory's group: fchown always.
        meta.creator = None;
    }
    let sink = plan::Sink::new(&files, &opts.progress, opts.readers, meta);
    let content: HashMap<&[u8], u32> = content.into_iter().collect();
    run.report.chain_hops = plan::fill(
        repo,
        snapshot,
        source,
        &skeleton.containers,
        &content,
        &sink,
        opts.plan_pieces.max(1),
    )?;
    clock.lap("reads");
    clock.busy("fetch", &sink.fetch_ns);
    clock.busy("decode", &sink.decode_ns);
    clock.busy("write", &sink.write_ns);
    sink.finished.rest(&files, meta, sink.pool.as_ref())?;
    clock.lap("unwritten files");
    run.report.privileges_dropped += sink.finished.privileges_dropped.load(Ordering::Relaxed);
    run.report.warnings.extend(std::mem::take(
        &mut *sink
            .finished
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    ));
    run.report.plans = sink.plans.load(Ordering::Relaxed);
    run.report.containers_read = sink.containers_read();
    run.report.regions_read = sink.regions_read.load(Ordering::Relaxed);
    run.report.bytes_read = sink.bytes_read.load(Ordering::Relaxed);
    let second = std::mem::take(&mut *sink.second_copies.lock().unwrap_or_else(|e| e.into_inner()));
    for (cid, n) in second {
        run.report.second_copies += n;
        run.report.warnings.push(format!(
            "{} is damaged: {n} chunk(s) read from their other stored copies (`strata check --read-data` reports it)",
            crate::repo::data_name(&cid)
        ));
    }
    // Hardlinks, special files, then symlinks (last: nothing is written
    // through them).
    run.make_links_and_specials()?;
    run.make_symlinks()?;
    clock.lap("links");
    run.report.skipped = run.kept.len() as u64;
    run.set_metadata(meta);
    clock.lap("metadata");
    run.report.phases = clock.phases;
    Ok(run.report)
}

/// One restore's state as it goes through its steps.
struct Run<'s> {
    opts: &'s RestoreOptions,
    nodes: Vec<&'s Node>,
    /// Where each node's content comes from (see [`select_entries`]).
    content: Vec<&'s [u8]>,
    rels: Vec<PathBuf>,
    /// Node indices in path order (parents first).
    order: Vec<usize>,
    parents: ParentCheck<'s>,
    /// Directories this restore created (`never` and `if-newer` leave the
    /// metadata of existing ones alone).
    created_dirs: HashSet<usize>,
    /// Names left as they were (`Overwrite`).
    kept: HashSet<usize>,
    /// A directory files are created in (the target, or one that was
    /// there) passes its group on to them.
    setgid_dirs: bool,
    report: RestoreReport,
}

impl<'s> Run<'s> {
    fn new(opts: &'s RestoreOptions, selection: &'s [(Cow<'s, Node>, &'s [u8])]) -> Result<Self> {
        let nodes: Vec<&Node> = selection.iter().map(|(n, _)| &**n).collect();
        let rels = nodes
            .iter()
            .map(|n| safe_rel(&n.path))
            .collect::<Result<Vec<_>>>()?;
        let progress = &opts.progress;
        let total: u64 = nodes.iter().map(|n| n.size).sum();
        progress.bytes_total.store(total, Ordering::Relaxed);
        progress.files_total.store(
            nodes.iter().filter(|n| n.kind == NodeKind::File).count() as u64,
            Ordering::Relaxed,
        );
        progress.totals_known.store(true, Ordering::Relaxed);
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by(|&a, &b| nodes[a].path.cmp(&nodes[b].path));
        Ok(Run {
            opts,
            content: selection.iter().map(|(_, c)| *c).collect(),
            nodes,
            rels,
            order,
            parents: ParentCheck::new(&opts.target),
            created_dirs: HashSet::new(),
            kept: HashSet::new(),
            setgid_dirs: is_setgid_dir(&opts.target),
            report: RestoreReport::default(),
        })
    }

    fn full(&self, i: usize) -> PathBuf {
        self.opts.target.join(&self.rels[i])
    }

    /// Directories, parents first; existing ones are merged.
    fn make_dirs(&mut self) -> Result<()> {
        // Level by level (a directory's parent is on the level before), the
        // directories of one level created at once on every core.
        let mut levels: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &i in &self.order {
            if self.nodes[i].kind == NodeKind::Dir {
                levels
                    .entry(self.rels[i].components().count())
                    .or_default()
                    .push(i);
            }
        }
        for level in levels.values() {
            for &i in level {
                self.parents.check(&self.rels[i])?;
            }
            let made: Vec<std::io::Result<()>> = level
                .par_iter()
                .map(|&i| fs::create_dir(self.full(i)))
                .collect();
            for (&i, r) in level.iter().zip(made) {
                let full = self.full(i);
                match r {
                    Ok(()) => {
                        self.created_dirs.insert(i);
                        // A real directory: its children need not look again.
                        self.parents.verified.insert(self.rels[i].clone());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let m = fs::symlink_metadata(&full)
                            .map_err(|e| StoreError::io("stat", full.display().to_string(), e))?;
                        self.setgid_dirs |= is_setgid(&m);
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
                self.report.dirs += 1;
            }
        }
        Ok(())
    }

    /// The files to restore (each created by the reader that first
    /// writes into it, see `files`), and for each the recipe path whose
    /// chunks fill it with its index.
    #[allow(clippy::type_complexity)]
    fn make_files(&mut self) -> Result<(Vec<RestoreFile<'s>>, Vec<(&'s [u8], u32)>)> {
        let mut files = Vec::new();
        let mut content = Vec::new();
        for k in 0..self.order.len() {
            let i = self.order[k];
            let n = self.nodes[i];
            if n.kind != NodeKind::File {
                continue;
            }
            self.parents.check(&self.rels[i])?;
            let full = self.full(i);
            // `always` replaces whatever has the name when the file is
            // created; the other policies look first.
            if self.opts.overwrite != Overwrite::Always {
                if keep_existing(&full, n, self.opts.overwrite) {
                    self.kept.insert(i);
                    self.opts
                        .progress
                        .bytes_done
                        .fetch_add(n.size, Ordering::Relaxed);
                    continue;
                }
                remove_non_dir(&full);
            }
            content.push((self.content[i], files.len() as u32));
            files.push(RestoreFile::new(full, n));
            self.report.files += 1;
            self.report.bytes += n.size;
        }
        Ok((files, content))
    }

    /// Hard links and special files.
    fn make_links_and_specials(&mut self) -> Result<()> {
        for k in 0..self.order.len() {
            let i = self.order[k];
            let n = self.nodes[i];
            let full = self.full(i);
            let special = matches!(
                n.kind,
                NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice
            );
            if special && self.opts.no_special {
                // Not created, and so never given metadata either.
                self.kept.insert(i);
                self.report.specials_left_out += 1;
                continue;
            }
            if !matches!(
                n.kind,
                NodeKind::Dir | NodeKind::File | NodeKind::Symlink | NodeKind::Socket
            ) {
                if keep_existing(&full, n, self.opts.overwrite) {
                    self.kept.insert(i);
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
                            self.parents.check(&self.rels[i])?;
                            // The source too: a symlink already in the target
                            // must not lead the link to a file outside it.
                            self.parents.check(&first)?;
                            let first = self.opts.target.join(first);
                            if fs::symlink_metadata(&first).is_ok_and(|m| !m.is_file()) {
                                return Err(StoreError::UnsafePath(format!(
                                    "{}: hard link to something that is not a restored file",
                                    full.display()
                                )));
                            }
                            let _ = fs::remove_file(&full);
                            if let Err(e) = fs::hard_link(&first, &full) {
                                self.report.warnings.push(format!(
                                    "{}: cannot create hard link: {e}",
                                    full.display()
                                ));
                            }
                        }
                        _ => self
                            .report
                            .warnings
                            .push(format!("{}: hard link target not restored", full.display())),
                    }
                }
                NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
                    self.parents.check(&self.rels[i])?;
                    let c = cstr(&full)?;
                    // SAFETY: valid C string; mknod only creates a node.
                    let r = unsafe {
                        libc::mknod(c.as_ptr(), n.mode as libc::mode_t, n.rdev as libc::dev_t)
                    };
                    if r != 0 {
                        self.report.warnings.push(format!(
                            "{}: cannot create special file: {}",
                            full.display(),
                            std::io::Error::last_os_error()
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Symlinks, last of all names: nothing restore writes passes
    /// through one.
    fn make_symlinks(&mut self) -> Result<()> {
        for k in 0..self.order.len() {
            let i = self.order[k];
            let n = self.nodes[i];
            if n.kind != NodeKind::Symlink {
                continue;
            }
            self.parents.check(&self.rels[i])?;
            let full = self.full(i);
            if keep_existing(&full, n, self.opts.overwrite) {
                self.kept.insert(i);
                continue;
            }
            remove_non_dir(&full);
            let target = std::ffi::OsStr::from_bytes(n.target.as_deref().unwrap_or_default());
            if let Err(e) = std::os::unix::fs::symlink(target, &full) {
                self.report
                    .warnings
                    .push(format!("{}: cannot create symlink: {e}", full.display()));
            }
        }
        Ok(())
    }

    /// Owner, extended attributes, mode and times of every name but the
    /// files (finished as they were written), deepest first so directory
    /// times stick.
    fn set_metadata(&mut self, meta: MetaOpts) {
        for k in (0..self.order.len()).rev() {
            let i = self.order[k];
            let n = self.nodes[i];
            if matches!(
                n.kind,
                NodeKind::File | NodeKind::Hardlink | NodeKind::Socket
            ) || (n.kind == NodeKind::Dir
                && (!self.opts.dir_metadata
                    || (matches!(self.opts.overwrite, Overwrite::Never | Overwrite::IfNewer)
                        && !self.created_dirs.contains(&i))))
                || self.kept.contains(&i)
            {
                continue;
            }
            let full = self.full(i);
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
                        NodeKind::Symlink => t.is_symlink(),
                        NodeKind::Fifo => t.is_fifo(),
                        NodeKind::CharDevice => t.is_char_device(),
                        NodeKind::BlockDevice => t.is_block_device(),
                        NodeKind::File | NodeKind::Hardlink | NodeKind::Socket => false,
                    }
                })
                .unwrap_or(false);
            if !kind_matches {
                continue;
            }
            // A directory this restore made has mkdir's mode less the
            // umask, and the creator's owner (unless a directory above
            // passes its group or set-group-id bit on).
            let created = (self.created_dirs.contains(&i) && !self.setgid_dirs).then_some(0o777);
            let dropped = apply(
                Target::Name(&full),
                &full,
                (n, created),
                meta,
                &mut self.report.warnings,
            );
            if dropped {
                self.report.privileges_dropped += 1;
            }
        }
    }
}

/// Writes one file's content to `out` in order (`node`, of `recipe`).
pub fn dump(
    repo: &Repository,
    snapshot: &Snapshot,
    recipe: &Recipe,
    node: &Node,
    out: &mut dyn Write,
) -> Result<u64> {
    let resolver = Arc::new(resolver_for(repo, snapshot, recipe, &[node])?);
    let cache = Arc::new(crate::engine::fsread::RegionCache::new(0));
    crate::engine::fsread::FileReader::new(repo, node, resolver, cache).copy_to(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
