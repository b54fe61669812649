//! Backup: walk → chunk → fingerprint → index → pack → commit
//! (docs/design.md "Data flow").
//!
//! The walk runs on the calling thread and records every entry's metadata.
//! Files whose size, mtime, ctime and inode match the series' previous
//! version reuse its recipe without being read. The others are read by
//! worker threads (one per core); each worker chunks and fingerprints its
//! file, asks the index strategy about a segment at a time, claims the new
//! chunks and packs them into its own open container, so a file's new
//! chunks stay contiguous. Finished containers are compressed, sealed and
//! written by the [`ContainerSink`]. The commit order is: containers →
//! index object → recipe → snapshot; the snapshot write is the atomic
//! switch, so a crash at any earlier point leaves only unreferenced objects
//! that `gc` removes.

mod blockbuf;
pub(crate) mod commit;
pub(crate) mod dedup;
mod delta;
mod discard;
mod flow;
pub(crate) mod job;
mod lost;
mod parent;
pub mod patch;
mod pipeline;
mod walk;

pub use crate::progress::Progress;
pub use flow::FlowLimits;
pub use walk::{read_xattrs, Excludes};

use crate::engine::index::ContainerTable;
use crate::error::{Result, StoreError};
use crate::repo::index::RepoIndex;
use crate::repo::lock;
use crate::repo::{now_ns, Repository};
use crate::stages::{Stage, StageReport, Stages};
use job::{Ctx, CtxParts};
use parent::Parent;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use strata_core::chunker::ChunkerParams;
use strata_core::format::{ContainerId, Node, NodeKind, Snapshot, SnapshotStats, Tier};
use strata_core::id::{RecipeId, SnapshotId};
use walk::{Source, Walker};

/// A stream to back up as one file.
pub struct StdinSource {
    pub reader: Box<dyn Read + Send>,
    pub name: String,
}

/// A tree that is not read from the file system (`strata copy`): its
/// entries, each file with a reader of its content, and the time, host
/// and paths the new snapshot records (those of the original).
pub struct Import {
    pub entries: Vec<(Node, Option<Box<dyn Read + Send>>)>,
    pub time_ns: i64,
    pub host: String,
    pub paths: Vec<String>,
}

pub struct BackupOptions {
    /// A tree to store instead of `paths` (needs `series`).
    pub import: Option<Import>,
    /// Paths to back up (made absolute by the caller or here).
    pub paths: Vec<PathBuf>,
    pub stdin: Option<StdinSource>,
    /// An image of which only the changed segments are read (needs the
    /// fixed chunker; not with `stdin` or `import`).
    pub image: Option<patch::ImagePatch>,
    pub series: Option<String>,
    pub tags: Vec<String>,
    pub force_read: bool,
    /// Overrides the repository's chunker (e.g. fixed-size for images).
    pub chunker: Option<ChunkerParams>,
    pub threads: usize,
    pub progress: Arc<Progress>,
    /// Glob patterns to leave out: matched against the file name, or
    /// against the absolute path when the pattern contains `/`. `*` and `?`
    /// stay within one path component, `**` crosses them.
    pub excludes: Vec<String>,
    /// Absolute paths to leave out (the repository itself, for example).
    pub exclude_paths: Vec<PathBuf>,
    /// Directories holding a file of one of these names are left out.
    pub exclude_if_present: Vec<String>,
    /// Do not cross into other file systems below a root.
    pub one_file_system: bool,
    /// Files at least this large (and streams) are cut into blocks whose
    /// fingerprinting, lookups, packing and compression spread over every
    /// worker; smaller files are one worker's task each.
    pub large_file: u64,
    /// What the walk may hold ahead of the workers and the recipe.
    pub limits: FlowLimits,
    /// Containers known to be damaged (a salvage's): never deduplicated
    /// against, as if their data were gone.
    pub avoid: std::collections::HashSet<ContainerId>,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            import: None,
            paths: vec![],
            stdin: None,
            image: None,
            series: None,
            tags: vec![],
            force_read: false,
            chunker: None,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            progress: Arc::new(Progress::default()),
            excludes: vec![],
            exclude_paths: vec![],
            exclude_if_present: vec![],
            one_file_system: false,
            large_file: pipeline::LARGE,
            limits: FlowLimits::default(),
            avoid: Default::default(),
        }
    }
}

/// What a backup tells the lifecycle about the version before it.
///
/// A backup already deduplicates each changed file against its previous
/// version chunk by chunk, so reverse-deduplicating that version against
/// the new one frees space only where the new version stored again what
/// the old one holds elsewhere (moved or renamed content). The backup
/// estimates that from a 1-in-64 sample of the old version's fingerprints;
/// when it is negligible, the lifecycle marks the old version archival
/// without rewriting its recipe (all references stay direct), which costs
/// one small object instead of loading and rewriting two recipes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReverseHint {
    /// The version that leaves the live window.
    pub previous: SnapshotId,
    /// The new version.
    pub next: SnapshotId,
    /// Non-zero chunk references of `previous` and their bytes.
    pub direct_chunks: u64,
    pub direct_bytes: u64,
    /// Estimated bytes of new chunks the new version stored that
    /// `previous` also holds.
    pub stored_again_bytes: u64,
}

impl ReverseHint {
    /// Whether reverse dedup of `previous` would free next to nothing:
    /// less than 1 % of its bytes.
    pub fn negligible(&self) -> bool {
        self.stored_again_bytes.saturating_mul(100) < self.direct_bytes.max(1)
    }
}

#[derive(Debug, Clone)]
pub struct BackupReport {
    pub id: SnapshotId,
    pub snapshot: Snapshot,
    pub warnings: Vec<String>,
    pub index_ram_bytes: u64,
    pub reused_files: u64,
    /// Bytes of changed files found in their previous version chunk by
    /// chunk (not stored again).
    pub parent_bytes: u64,
    /// Of those, bytes of a patched image whose recipe pieces were taken
    /// over as they were (not decoded or written again).
    pub carried_bytes: u64,
    /// Bytes of new segments found in similar stored segments (`segment`).
    pub similar_bytes: u64,
    /// Busy time and bytes of each pipeline stage, per worker.
    pub stages: Vec<StageReport>,
    /// What the lifecycle needs to know of the previous version: how much
    /// reverse-deduplicating it against this one could free.
    pub reverse_hint: Option<ReverseHint>,
    /// Worker threads used.
    pub threads: usize,
    /// Containers the index lists whose data object is gone: none of
    /// their chunks was referenced (the last warning names them).
    pub lost_containers: Vec<ContainerId>,
    /// What the delta stage did (a repository with deltas on).
    pub delta: Option<DeltaReport>,
}

/// What storing new chunks as deltas did in one backup.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeltaReport {
    /// New chunks that had a chunk of the previous version at their place.
    pub candidates: u64,
    /// New chunks stored as deltas, and their bytes.
    pub chunks: u64,
    pub raw_bytes: u64,
    /// What those chunks take compressed alone, and as deltas (each
    /// alone; their regions compress them together). A chunk whose delta
    /// is an eighth of it or less counts an eighth as its size alone (zstd
    /// alone is not run for it).
    pub alone_bytes: u64,
    pub delta_bytes: u64,
    /// Base regions read from the repository (the others were cached).
    pub base_reads: u64,
    /// Recipe parts stored as deltas against the previous version's.
    pub recipe_parts: u64,
}

impl BackupReport {
    /// Says again which versions the lost containers damage (the last
    /// warning), once something after the backup (the lifecycle) may
    /// have re-pointed them.
    pub fn restate_lost(&mut self, repo: &Repository) -> Result<()> {
        if !self.lost_containers.is_empty() {
            if let Some(w) = self.warnings.last_mut() {
                *w = lost::warning(repo, &self.lost_containers)?;
            }
        }
        Ok(())
    }
}

/// Default series name: host and the absolute paths.
pub fn default_series(paths: &[PathBuf], stdin_name: Option<&str>) -> String {
    let mut parts: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    if let Some(n) = stdin_name {
        parts.push(format!("stdin:{n}"));
    }
    format!("{}:{}", lock::hostname(), parts.join(","))
}

/// Absolute, lexically normalised roots (`.` and `..` resolved, symlinks
/// not followed), without those inside another root.
fn normalise_paths(given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for p in given {
        let abs = if p.is_absolute() {
            p.clone()
        } else {
            std::env::current_dir()
                .map_err(|e| StoreError::io("resolve", p.display().to_string(), e))?
                .join(p)
        };
        let mut clean = PathBuf::from("/");
        for c in abs.components() {
            match c {
                std::path::Component::ParentDir => {
                    clean.pop();
                }
                std::path::Component::Normal(n) => clean.push(n),
                _ => {}
            }
        }
        paths.push(clean);
    }
    paths.sort();
    paths.dedup();
    let all = paths.clone();
    paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    Ok(paths)
}

/// The newest version of `series`, and what a backup can use of it. An
/// archival version (possible only after its newer versions were
/// forgotten) or one made with another chunker offers nothing.
fn load_parent<'a>(
    repo: &'a Repository,
    series: &str,
    chunker: ChunkerParams,
    index: &RepoIndex,
    table: &'a ContainerTable,
    strategy: &'a dyn crate::engine::index::IndexStrategy,
) -> Result<(Option<SnapshotId>, Parent<'a>)> {
    let (snapshots, _) = repo.list_snapshots_tolerant()?;
    let Some((id, ps)) = snapshots
        .into_iter()
        .filter(|(_, s)| s.series == series)
        .max_by_key(|(_, s)| (s.version, s.time_ns))
    else {
        return Ok((None, Parent::none(strategy)));
    };
    // An archival version, one in the cloud tier (a separate dedup
    // domain) or one cut with another chunker offers nothing.
    if ps.chunker != chunker || ps.archival.is_some() || ps.tier != Tier::Active {
        return Ok((Some(id), Parent::none(strategy)));
    }
    let parent = Parent::open(repo, &ps.recipe, index, table, strategy)?;
    Ok((Some(id), parent))
}

/// The entries of a stream (`--stdin`) backed up as one file named
/// `name`: its parent directories and the file.
fn stdin_entries(s: StdinSource, progress: &Progress) -> Result<Vec<(Node, Option<Source>)>> {
    let source = Source::Stream(Mutex::new(Some(s.reader)));
    stream_entries(&s.name, source, None, progress)
}

/// The entries of a patched image; what it says changed counts only if
/// the series' newest version (`parent`) is the one it counts from.
fn image_entries(
    p: patch::ImagePatch,
    parent: Option<&SnapshotId>,
    progress: &Progress,
) -> Result<Vec<(Node, Option<Source>)>> {
    let changed = p
        .changed
        .filter(|_| p.base.is_some() && p.base.as_deref() == parent.map(|p| p.as_str()));
    let source = Source::Patch(Mutex::new(Some(patch::PatchSource {
        source: p.source,
        size: p.size,
        end: p.size,
        changed,
        clean: Default::default(),
        prev: None,
        at: 0,
        hole: None,
    })));
    stream_entries(&p.name, source, Some(p.time_ns), progress)
}

/// A file named `name` read from `source`, and its parent directories.
fn stream_entries(
    name: &str,
    source: Source,
    time_ns: Option<i64>,
    progress: &Progress,
) -> Result<Vec<(Node, Option<Source>)>> {
    let now = time_ns.unwrap_or_else(now_ns);
    let shown = name;
    let name = name.trim_start_matches('/').as_bytes().to_vec();
    if crate::ops::restore::safe_rel(&name).is_err() {
        return Err(StoreError::Invalid(format!(
            "--stdin-name {shown:?} must be a relative path without empty, `.` or `..` components"
        )));
    }
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let synthetic = |path: Vec<u8>, kind: NodeKind, mode: u32| Node {
        mode,
        uid,
        gid,
        mtime_ns: now,
        ctime_ns: now,
        ..Node::new(path, kind)
    };
    let mut out = Vec::new();
    // Parent directories of a name like `dumps/db.sql`.
    for (i, _) in name.iter().enumerate().filter(|(_, &b)| b == b'/') {
        out.push((synthetic(name[..i].to_vec(), NodeKind::Dir, 0o40755), None));
    }
    out.push((synthetic(name, NodeKind::File, 0o100644), Some(source)));
    progress.files_total.fetch_add(1, Ordering::Relaxed);
    Ok(out)
}

/// The entries of an imported tree, files with their readers as streams
/// (their chunks are cut anew with this repository's chunker and keys).
fn import_entries(
    entries: Vec<(Node, Option<Box<dyn Read + Send>>)>,
    progress: &Progress,
) -> Vec<(Node, Option<Source>)> {
    entries
        .into_iter()
        .map(|(mut n, r)| {
            n.segments.clear();
            if r.is_some() {
                progress.files_total.fetch_add(1, Ordering::Relaxed);
            }
            (n, r.map(|r| Source::Stream(Mutex::new(Some(r)))))
        })
        .collect()
}

/// Refuses what cannot be backed up: a root that does not exist (one
/// that vanishes during the walk stays a warning), nothing at all, or
/// sources that do not go together.
fn check_request(opts: &BackupOptions, paths: &[PathBuf], chunker: ChunkerParams) -> Result<()> {
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| {
            matches!(std::fs::symlink_metadata(p),
                     Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        })
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(StoreError::Invalid(format!(
            "{} does not exist: nothing backed up",
            missing.join(", ")
        )));
    }
    let refuse = |why: &str| Err(StoreError::Invalid(why.into()));
    if opts.image.is_some() && (opts.stdin.is_some() || opts.import.is_some()) {
        return refuse("an image is backed up without --stdin or an import");
    }
    if opts.image.is_some() && chunker != ChunkerParams::fixed() {
        return refuse("an image of which only changes are read needs the fixed chunker");
    }
    if paths.is_empty() && opts.stdin.is_none() && opts.import.is_none() && opts.image.is_none() {
        return refuse("nothing to back up: give paths or --stdin");
    }
    if opts.import.is_some() && (opts.series.is_none() || !paths.is_empty() || opts.stdin.is_some())
    {
        return refuse("an imported tree is stored alone, in a named series");
    }
    Ok(())
}

/// Where an imported tree's version says it was made: time, host, paths.
type ImportedFrom = (i64, String, Vec<String>);

/// The entries that are not walked — a stream, an image (and the volume
/// its new containers link to), an imported tree — taken out of `opts`.
type Synthetic = (
    Option<Vec<(Node, Option<Source>)>>,
    Option<Arc<dyn crate::engine::writer::Linker>>,
    Option<ImportedFrom>,
);

fn synthetic_entries(
    opts: &mut BackupOptions,
    parent: Option<&SnapshotId>,
    progress: &Progress,
) -> Result<Synthetic> {
    let mut entries = opts
        .stdin
        .take()
        .map(|s| stdin_entries(s, progress))
        .transpose()?;
    let mut link = None;
    if let Some(mut image) = opts.image.take() {
        link = image.link.take();
        entries = Some(image_entries(image, parent, progress)?);
    }
    let import = opts.import.take().map(|i| {
        entries = Some(import_entries(i.entries, progress));
        (i.time_ns, i.host, i.paths)
    });
    Ok((entries, link, import))
}

/// What the walk found besides what it fed the pipeline.
#[derive(Default)]
struct Walked {
    warnings: Vec<String>,
    reused: u64,
    carried: u64,
}

/// The series a backup goes to: `--series`, else one named after what
/// it reads.
fn series_of(opts: &BackupOptions, paths: &[PathBuf]) -> String {
    if let Some(s) = &opts.series {
        return s.clone();
    }
    let name = (opts.stdin.as_ref().map(|s| s.name.as_str()))
        .or(opts.image.as_ref().map(|i| i.name.as_str()));
    default_series(paths, name)
}

/// Runs a backup and commits a new version. (The RevDedup lifecycle that
/// follows it, out of line: `crate::revdedup::backup`.)
pub fn backup(repo: &Repository, mut opts: BackupOptions) -> Result<BackupReport> {
    let started = std::time::Instant::now();
    let lock = lock::acquire(repo, false, "backup")?;
    let chunker = opts.chunker.unwrap_or(repo.config().chunker);
    chunker.validate()?;
    let paths = normalise_paths(&opts.paths)?;
    check_request(&opts, &paths, chunker)?;
    let excludes =
        Excludes::new(&opts.excludes, &opts.exclude_paths)?.if_present(&opts.exclude_if_present)?;
    let series = series_of(&opts, &paths);

    // Index and parent, then the walk, with everything after it.
    let threads = opts.threads.clamp(1, 256);
    let stages = Arc::new(Stages::new(threads));
    let table = Arc::new(ContainerTable::default());
    let (strategy, repo_index, lost) = lost::load_index(repo, &table, &opts.avoid)?;
    let (parent_id, mut parent) = load_parent(
        repo,
        &series,
        chunker,
        &repo_index,
        &table,
        strategy.as_ref(),
    )?;
    drop(repo_index);
    let progress = opts.progress.clone();
    let (synthetic, link, import) = synthetic_entries(&mut opts, parent_id.as_ref(), &progress)?;
    let ctx = Ctx::new(CtxParts {
        repo,
        strategy: strategy.as_ref(),
        table: table.clone(),
        chunker,
        progress: &progress,
        stages: stages.clone(),
        large_file: opts.large_file,
        link,
    });
    let mut walked = Walked::default();
    let run = pipeline::run(
        &ctx,
        threads,
        opts.limits,
        recipe_writer(repo, &parent),
        |feed| {
            let walk_started = std::time::Instant::now();
            let mut walker = Walker::new(feed, &mut parent, opts.force_read, &progress, &excludes);
            walker.one_file_system = opts.one_file_system;
            walker.add_synthetic(synthetic.unwrap_or_default());
            let r = paths
                .iter()
                .try_for_each(|p| walker.walk_root(p))
                .and_then(|_| walker.finish());
            progress.totals_known.store(true, Ordering::Relaxed);
            walked = Walked {
                warnings: std::mem::take(&mut walker.warnings),
                reused: walker.reused,
                carried: walker.carried_bytes,
            };
            drop(walker);
            // Busy time: not the waits for workers to make room.
            let busy = walk_started.elapsed().saturating_sub(feed.waited);
            stages.add_ns(Stage::Walk, busy.as_nanos() as u64, 0);
            r
        },
    )?;
    let mut warnings = std::mem::take(&mut walked.warnings);
    warnings.extend(run.warnings);
    if import.is_some() {
        whole_import(repo, &warnings, &run.tracked)?;
    }
    let commit_started = std::time::Instant::now();
    let stats = stats_of(&run.counts, &ctx, warnings.len());
    if !lost.is_empty() {
        // (The last warning: restated after the lifecycle.)
        warnings.push(lost::warning(repo, &lost)?);
    }
    let time_ns = now_ns();
    let snapshot = |recipe| {
        let mut s = Snapshot {
            series,
            // Assigned at commit.
            version: 0,
            time_ns,
            host: lock::hostname(),
            paths: paths.iter().map(|p| p.display().to_string()).collect(),
            tags: opts.tags.clone(),
            recipe,
            parent: parent_id.clone(),
            chunker,
            stats,
            archival: None,
            tier: Default::default(),
            cloud_part: None,
        };
        if let Some((time, host, paths)) = import {
            (s.time_ns, s.host, s.paths) = (time, host, paths);
        }
        s
    };
    let tracked = run.tracked;
    let parts_as_deltas = run.recipe.parts_as_deltas();
    let (id, snapshot) = commit(repo, run.written, &tracked, run.recipe, snapshot, started)
        .map_err(|e| discard::take_back(repo, &tracked, e))?;
    drop(lock);
    stages.add(Stage::Commit, commit_started, 0);
    Ok(BackupReport {
        id: id.clone(),
        snapshot,
        warnings,
        index_ram_bytes: strategy.ram_bytes(),
        reused_files: walked.reused,
        parent_bytes: ctx.parent_bytes.load(Ordering::Relaxed) + walked.carried,
        carried_bytes: walked.carried,
        similar_bytes: ctx.similar_bytes.load(Ordering::Relaxed),
        stages: stages.report(started.elapsed().as_secs_f64()),
        threads,
        reverse_hint: parent_id.map(|previous| reverse_hint(previous, id, &parent, &ctx)),
        lost_containers: lost,
        delta: ctx.delta.as_ref().map(|d| d.report(repo, &parts_as_deltas)),
    })
}

/// The writer of the new version's recipe: parts found damaged in the
/// previous version written again, and with deltas on, new parts stored
/// as deltas against the previous version's.
fn recipe_writer<'r>(
    repo: &'r Repository,
    parent: &Parent<'_>,
) -> crate::repo::recipe::writer::RecipeWriter<'r> {
    let w = crate::repo::recipe::writer::RecipeWriter::new(repo).with_suspects(parent.suspects());
    match parent.part_bases() {
        Some(b) if repo.config().delta => w.with_part_bases(b),
        _ => w,
    }
}

/// An imported tree is all or nothing: a file that could not be read
/// (one of `warnings`) would be missing from a copy that counts as done,
/// so nothing is committed and what the run wrote is taken back.
fn whole_import(
    repo: &Repository,
    warnings: &[String],
    tracked: &Mutex<crate::engine::writer::Written>,
) -> Result<()> {
    if warnings.is_empty() {
        return Ok(());
    }
    Err(discard::take_back(
        repo,
        tracked,
        StoreError::Invalid(format!(
            "nothing committed: {} file(s) could not be read from the source: {}",
            warnings.len(),
            warnings.join("; ")
        )),
    ))
}

/// The figures a snapshot records of its backup (what the commit adds
/// is filled in there).
fn stats_of(counts: &flow::TreeCounts, ctx: &Ctx<'_>, warnings: usize) -> SnapshotStats {
    SnapshotStats {
        files: counts.files,
        dirs: counts.dirs,
        logical_bytes: counts.logical_bytes,
        read_bytes: ctx.read_bytes.load(Ordering::Relaxed),
        new_chunks: ctx.new_chunks.load(Ordering::Relaxed),
        new_raw_bytes: ctx.new_raw.load(Ordering::Relaxed),
        new_stored_bytes: 0,
        duration_ms: 0,
        warnings: warnings as u64,
    }
}

/// What reverse dedup needs to know of the backup of `next` over
/// `previous`.
fn reverse_hint(
    previous: SnapshotId,
    next: SnapshotId,
    parent: &Parent<'_>,
    ctx: &Ctx<'_>,
) -> ReverseHint {
    ReverseHint {
        previous,
        next,
        direct_chunks: parent.direct_chunks,
        direct_bytes: parent.direct_bytes,
        // The samples hold 1 in 64 fingerprints.
        stored_again_bytes: parent
            .stored_again(&ctx.stored_sample.lock().unwrap_or_else(|e| e.into_inner()))
            * 64,
    }
}

/// Commits the snapshot `snapshot` makes of its recipe: the containers
/// written and not yet indexed go into an index object, then the recipe's
/// last part and index, then the snapshot object (the atomic switch).
/// Returns its id, and the snapshot as committed.
fn commit(
    repo: &Repository,
    written: crate::engine::writer::SinkResult,
    tracked: &Mutex<crate::engine::writer::Written>,
    recipe: crate::repo::recipe::writer::RecipeWriter<'_>,
    snapshot: impl FnOnce(RecipeId) -> Snapshot,
    started: std::time::Instant,
) -> Result<(SnapshotId, Snapshot)> {
    let mut stored = written.stored_bytes;
    if !written.metas.is_empty() {
        let bytes = written.metas.iter().map(|m| m.data_len).sum();
        let (_, n) = crate::repo::index::put_index_object_then(repo, written.metas, || {
            tracked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .listed_now(bytes)
        })?;
        stored += n;
    }
    let (recipe_id, rn) = recipe.finish()?;
    let mut snapshot = snapshot(recipe_id);
    snapshot.stats.new_stored_bytes = stored + rn;
    snapshot.stats.duration_ms = started.elapsed().as_millis() as u64;
    let id = commit::commit_snapshot(repo, &mut snapshot)?;
    Ok((id, snapshot))
}
