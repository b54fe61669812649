//! Backup: walk → chunk → fingerprint → index → pack → commit
//! (DESIGN.md "Data flow").
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

use crate::container::{ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::index::{build_strategy, ChunkLoc, ContainerTable, IndexStrategy};
use crate::lock;
use crate::repo::{now_ns, Repository};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::chunker::{ChunkStream, ChunkerParams, Segmenter};
use strata_core::crypto::Kind;
use strata_core::fingerprint::is_zero;
use strata_core::format::{
    ChunkRef, ContainerId, Node, NodeKind, Recipe, SegmentRef, Snapshot, SnapshotStats, ZERO_CHUNK,
};
use strata_core::Fingerprint;

/// Live counters for progress display; the CLI polls them.
#[derive(Default, Debug)]
pub struct Progress {
    pub files_total: AtomicU64,
    pub bytes_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_done: AtomicU64,
    /// Set once the walk has finished and the totals are final.
    pub totals_known: AtomicBool,
}

/// A stream to back up as one file.
pub struct StdinSource {
    pub reader: Box<dyn Read + Send>,
    pub name: String,
}

pub struct BackupOptions {
    /// Paths to back up (made absolute by the caller or here).
    pub paths: Vec<PathBuf>,
    pub stdin: Option<StdinSource>,
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
}

/// Matches a glob pattern (`*`, `?`, `**`) against `text`.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) if rest.first() == Some(&b'*') => {
            let rest = &rest[1..];
            (0..=text.len()).any(|i| glob_match(rest, &text[i..]))
        }
        Some((b'*', rest)) => {
            for i in 0..=text.len() {
                if glob_match(rest, &text[i..]) {
                    return true;
                }
                if text.get(i) == Some(&b'/') {
                    break;
                }
            }
            false
        }
        Some((b'?', rest)) => {
            matches!(text.split_first(), Some((c, t)) if *c != b'/' && glob_match(rest, t))
        }
        Some((c, rest)) => {
            matches!(text.split_first(), Some((d, t)) if d == c && glob_match(rest, t))
        }
    }
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            paths: vec![],
            stdin: None,
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn small_files_of_a_directory_are_grouped() {
        use super::{group_small_files, Job, Source};
        use strata_core::format::{Node, NodeKind};
        let node = |path: &str, size: u64| Node {
            path: path.as_bytes().to_vec(),
            kind: NodeKind::File,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            ino: 0,
            dev: 0,
            rdev: 0,
            nlink: 1,
            size,
            target: None,
            segments: vec![],
            xattrs: vec![],
        };
        let nodes = vec![
            node("a/1", 100),
            node("a/2", 100),
            node("a/big", 10_000),
            node("a/3", 100),
            node("b/1", 100),
            node("b/2", 200),
            node("b/3", 200),
        ];
        let jobs: Vec<Job> = (0..nodes.len())
            .map(|i| Job {
                node: i,
                source: Source::Path(std::path::PathBuf::from("x")),
            })
            .collect();
        // Segment 1000: small = at most 250 bytes, a unit holds ~1000.
        let units = group_small_files(&jobs, &nodes, 1000);
        assert_eq!(units, vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6]]);
        // Segment 400: only 100-byte files are small.
        let units = group_small_files(&jobs, &nodes, 400);
        assert_eq!(
            units,
            vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5], vec![6]]
        );
        // Segment 800: b's files are small; a unit closes once it holds a
        // segment's worth.
        let units = group_small_files(&jobs, &nodes, 800);
        assert_eq!(units, vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6]]);
        let many: Vec<Node> = (0..10).map(|i| node(&format!("c/{i}"), 200)).collect();
        let jobs: Vec<Job> = (0..10)
            .map(|i| Job {
                node: i,
                source: Source::Path(std::path::PathBuf::from("x")),
            })
            .collect();
        let units = group_small_files(&jobs, &many, 800);
        assert_eq!(units, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"*.o", b"main.o"));
        assert!(!glob_match(b"*.o", b"main.c"));
        assert!(glob_match(b"/home/*/cache", b"/home/u/cache"));
        assert!(!glob_match(b"/home/*/cache", b"/home/u/v/cache"));
        assert!(glob_match(b"/home/**/cache", b"/home/u/v/cache"));
        assert!(glob_match(b"fil?.txt", b"file.txt"));
        assert!(!glob_match(b"fil?.txt", b"fil/.txt"));
        assert!(glob_match(b"target", b"target"));
    }
}

#[derive(Debug, Clone)]
pub struct BackupReport {
    pub id: String,
    pub snapshot: Snapshot,
    pub warnings: Vec<String>,
    pub index_ram_bytes: u64,
    pub reused_files: u64,
}

/// Default series name: host and the absolute paths.
pub fn default_series(paths: &[PathBuf], stdin_name: Option<&str>) -> String {
    let mut parts: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    if let Some(n) = stdin_name {
        parts.push(format!("stdin:{n}"));
    }
    format!("{}:{}", lock::hostname(), parts.join(","))
}

fn rel_bytes(p: &Path) -> Vec<u8> {
    let b = p.as_os_str().as_bytes();
    let mut s = 0;
    while s < b.len() && b[s] == b'/' {
        s += 1;
    }
    b[s..].to_vec()
}

fn node_from_meta(path: Vec<u8>, m: &Metadata) -> Node {
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        NodeKind::Dir
    } else if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_fifo() {
        NodeKind::Fifo
    } else if ft.is_char_device() {
        NodeKind::CharDevice
    } else if ft.is_block_device() {
        NodeKind::BlockDevice
    } else if ft.is_socket() {
        NodeKind::Socket
    } else {
        NodeKind::File
    };
    Node {
        path,
        kind,
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        ino: m.ino(),
        dev: m.dev(),
        rdev: m.rdev(),
        nlink: m.nlink(),
        size: if kind == NodeKind::File { m.len() } else { 0 },
        target: None,
        segments: vec![],
        xattrs: vec![],
    }
}

/// Extended attributes of a path (not following a final symlink). A file
/// system without xattr support simply yields none.
pub fn read_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return vec![];
    };
    let mut names = vec![0u8; 1024];
    let n = loop {
        // SAFETY: valid C string and a buffer of the given length.
        let n = unsafe {
            libc::llistxattr(
                c.as_ptr(),
                names.as_mut_ptr() as *mut libc::c_char,
                names.len(),
            )
        };
        if n >= 0 {
            break n as usize;
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE)
            && names.len() < 1 << 20
        {
            names.resize(names.len() * 4, 0);
            continue;
        }
        return vec![];
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let Ok(cn) = std::ffi::CString::new(name) else {
            continue;
        };
        let mut val = vec![0u8; 256];
        loop {
            // SAFETY: valid C strings and a buffer of the given length.
            let r = unsafe {
                libc::lgetxattr(
                    c.as_ptr(),
                    cn.as_ptr(),
                    val.as_mut_ptr() as *mut libc::c_void,
                    val.len(),
                )
            };
            if r >= 0 {
                val.truncate(r as usize);
                out.push((name.to_vec(), val));
                break;
            }
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE)
                && val.len() < 1 << 24
            {
                val.resize(val.len() * 4, 0);
                continue;
            }
            break;
        }
    }
    out
}

enum Source {
    Path(PathBuf),
    Stream(Mutex<Option<Box<dyn Read + Send>>>),
}

struct Job {
    node: usize,
    source: Source,
}

enum Outcome {
    Done {
        segments: Vec<SegmentRef>,
        size: u64,
        warning: Option<String>,
    },
    Failed(String),
}

struct Walker<'a> {
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    warnings: Vec<String>,
    seen: HashSet<Vec<u8>>,
    hardlinks: HashMap<(u64, u64), Vec<u8>>,
    parent: &'a HashMap<Vec<u8>, Node>,
    reuse: &'a dyn Fn(&Node, &Node) -> Option<Vec<SegmentRef>>,
    force_read: bool,
    progress: &'a Progress,
    reused: u64,
    excludes: &'a [String],
    exclude_paths: &'a [PathBuf],
    /// (device, inode) of the excluded paths, so they are recognised
    /// whatever path (symlinks, bind mounts) leads to them.
    exclude_ids: Vec<(u64, u64)>,
}

impl Walker<'_> {
    fn excluded(&self, abs: &Path) -> bool {
        if self.exclude_paths.iter().any(|p| p == abs) {
            return true;
        }
        let full = abs.as_os_str().as_bytes();
        let name = abs.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        self.excludes.iter().any(|pat| {
            let p = pat.as_bytes();
            if p.contains(&b'/') {
                glob_match(p, full)
            } else {
                glob_match(p, name)
            }
        })
    }

    /// Records one entry. `dedup` is set for roots and their ancestors, the
    /// only entries two roots can share (nested roots are merged before the
    /// walk), so the set of seen paths stays small.
    fn add(&mut self, abs: &Path, m: &Metadata, dedup: bool) {
        let rel = rel_bytes(abs);
        // `/` itself has no name to restore; its children are recorded.
        if rel.is_empty() || (dedup && !self.seen.insert(rel.clone())) {
            return;
        }
        let mut node = node_from_meta(rel.clone(), m);
        node.xattrs = read_xattrs(abs);
        match node.kind {
            NodeKind::Symlink => match fs::read_link(abs) {
                Ok(t) => node.target = Some(t.as_os_str().as_bytes().to_vec()),
                Err(e) => {
                    self.warnings
                        .push(format!("{}: cannot read link: {e}", abs.display()));
                    return;
                }
            },
            NodeKind::File => {
                if node.nlink > 1 {
                    if let Some(first) = self.hardlinks.get(&(node.dev, node.ino)) {
                        node.kind = NodeKind::Hardlink;
                        node.target = Some(first.clone());
                        node.size = 0;
                        self.nodes.push(node);
                        return;
                    }
                    self.hardlinks.insert((node.dev, node.ino), rel.clone());
                }
                self.progress.files_total.fetch_add(1, Ordering::Relaxed);
                self.progress
                    .bytes_total
                    .fetch_add(node.size, Ordering::Relaxed);
                if !self.force_read {
                    if let Some(segs) = self
                        .parent
                        .get(&rel)
                        .and_then(|old| (self.reuse)(old, &node))
                    {
                        node.segments = segs;
                        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
                        self.progress
                            .bytes_done
                            .fetch_add(node.size, Ordering::Relaxed);
                        self.reused += 1;
                        self.nodes.push(node);
                        return;
                    }
                }
                self.jobs.push(Job {
                    node: self.nodes.len(),
                    source: Source::Path(abs.to_path_buf()),
                });
            }
            _ => {}
        }
        self.nodes.push(node);
    }

    fn walk_root(&mut self, root: &Path) {
        // Record the ancestors so restore can recreate them with metadata.
        let mut anc: Vec<&Path> = root
            .ancestors()
            .skip(1)
            .filter(|a| a.parent().is_some())
            .collect();
        anc.reverse();
        for a in anc {
            if let Ok(m) = fs::symlink_metadata(a) {
                self.add(a, &m, true);
            }
        }
        let m = match fs::symlink_metadata(root) {
            Ok(m) => m,
            Err(e) => {
                self.warnings.push(format!("{}: {e}", root.display()));
                return;
            }
        };
        self.add(root, &m, true);
        if !m.is_dir() {
            return;
        }
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) => {
                    self.warnings
                        .push(format!("{}: cannot read directory: {e}", dir.display()));
                    continue;
                }
            };
            let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            entries.sort();
            let mut subdirs = Vec::new();
            for p in entries {
                if self.excluded(&p) {
                    continue;
                }
                match fs::symlink_metadata(&p) {
                    Ok(m) if m.is_dir() && self.exclude_ids.contains(&(m.dev(), m.ino())) => {}
                    Ok(m) => {
                        self.add(&p, &m, false);
                        if m.is_dir() {
                            subdirs.push(p);
                        }
                    }
                    Err(e) => self.warnings.push(format!("{}: {e}", p.display())),
                }
            }
            // Depth first, in name order.
            subdirs.reverse();
            stack.extend(subdirs);
        }
    }
}

/// Per-backup state shared by the workers.
struct Ctx<'a> {
    repo: &'a Repository,
    strategy: &'a dyn IndexStrategy,
    chunker: ChunkerParams,
    progress: &'a Progress,
    abort: AtomicBool,
    new_chunks: AtomicU64,
    new_raw: AtomicU64,
    read_bytes: AtomicU64,
}

/// A chunk's fingerprint, and whether it is all zeros (never stored, so
/// not hashed).
fn chunk_fp(hasher: &strata_core::Hasher, chunk: &[u8]) -> (Fingerprint, bool) {
    if is_zero(chunk) {
        (Fingerprint::ZERO, true)
    } else {
        (hasher.hash(chunk), false)
    }
}

/// Bytes of a segment's non-zero chunks the strategy did not find.
fn new_bytes_of(chunks: &[PendingChunk], found: &[Option<ChunkLoc>]) -> usize {
    chunks
        .iter()
        .filter(|c| !c.zero)
        .zip(found)
        .filter(|(_, f)| f.is_none())
        .map(|(c, _)| c.len as usize)
        .sum()
}

/// Buffers a worker reuses from file to file.
#[derive(Default)]
struct WorkerBuffers {
    read: Vec<u8>,
    segment: Vec<u8>,
}

struct PendingChunk {
    fp: Fingerprint,
    start: usize,
    len: u32,
    zero: bool,
}

impl Ctx<'_> {
    fn finish_segment(
        &self,
        writer: &mut ContainerWriter,
        data: &[u8],
        chunks: &mut Vec<PendingChunk>,
        out: &mut Vec<SegmentRef>,
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let hasher = self.repo.hasher();
        let seg_fp = hasher.hash_fingerprints(chunks.iter().map(|c| &c.fp));
        let fps: Vec<Fingerprint> = chunks.iter().filter(|c| !c.zero).map(|c| c.fp).collect();
        let found: Vec<Option<ChunkLoc>> = self.strategy.lookup_segment(&seg_fp, &fps);
        // Segment-level strategies store a new segment whole, in one
        // container; `appended` counts what this segment added there.
        let whole = self.strategy.whole_segments() && found.iter().any(|f| f.is_none());
        let all_new = found.iter().all(|f| f.is_none());
        let stored = if whole {
            writer
                .begin_segment(new_bytes_of(chunks, &found))
                .and_then(|()| self.store_chunks(writer, data, chunks.drain(..), found))
        } else {
            self.store_chunks(writer, data, chunks.drain(..), found)
        };
        let (refs, appended, stored_locs) = match stored {
            Ok(v) => v,
            Err(e) => {
                // Workers waiting for this segment must not wait in vain.
                self.strategy.release_segment(&seg_fp);
                return Err(e);
            }
        };
        if whole {
            if writer.end_segment(seg_fp, appended) && all_new {
                self.strategy.record_segment(&seg_fp, &stored_locs);
            } else {
                self.strategy.release_segment(&seg_fp);
            }
        }
        self.segment_done(&seg_fp, &refs, appended as usize)?;
        out.push(SegmentRef {
            fp: seg_fp,
            chunks: refs,
        });
        Ok(())
    }

    /// Stores the chunks the strategy did not find (claiming each, so two
    /// workers never store one twice) and returns every chunk's reference,
    /// how many this call appended, and where.
    fn store_chunks(
        &self,
        writer: &mut ContainerWriter,
        data: &[u8],
        chunks: impl Iterator<Item = PendingChunk>,
        found: Vec<Option<ChunkLoc>>,
    ) -> Result<(Vec<ChunkRef>, u32, Vec<ChunkLoc>)> {
        let mut appended = 0u32;
        let mut stored_locs = Vec::new();
        let mut found = found.into_iter();
        let mut refs = Vec::new();
        for c in chunks {
            if c.zero {
                refs.push(ChunkRef {
                    fp: Fingerprint::ZERO,
                    len: c.len,
                    container: ZERO_CHUNK,
                    region: 0,
                    offset: 0,
                });
                continue;
            }
            let loc = match found.next().flatten() {
                Some(l) => l,
                None => {
                    let loc = writer.next_loc(c.len as usize)?;
                    match self.strategy.claim(&c.fp, loc) {
                        None => {
                            writer.append(c.fp, &data[c.start..c.start + c.len as usize]);
                            self.new_chunks.fetch_add(1, Ordering::Relaxed);
                            self.new_raw.fetch_add(c.len as u64, Ordering::Relaxed);
                            appended += 1;
                            stored_locs.push(loc);
                            loc
                        }
                        Some(existing) => existing,
                    }
                }
            };
            refs.push(ChunkRef {
                fp: c.fp,
                len: c.len,
                container: loc.container,
                region: loc.region,
                offset: loc.offset,
            });
        }
        Ok((refs, appended, stored_locs))
    }

    /// Small files of one directory looked up as one segment (SiLo §3.2,
    /// P1): each file is read and chunked whole, then one lookup covers
    /// them all; each file still gets its own segment in the recipe.
    fn process_group(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        jobs: &[&Job],
        nodes: &[Node],
    ) -> Result<Vec<(usize, Outcome)>> {
        let hasher = self.repo.hasher();
        let data = &mut bufs.segment;
        data.clear();
        let mut pending: Vec<PendingChunk> = Vec::new();
        // Per file: node, first pending chunk, size, warning.
        let mut files: Vec<(usize, usize, u64, Option<String>)> = Vec::new();
        let mut out = Vec::new();
        for job in jobs {
            if self.abort.load(Ordering::Relaxed) {
                return Err(StoreError::Cancelled);
            }
            let Source::Path(p) = &job.source else {
                return Err(StoreError::Invalid(
                    "only files are grouped for lookup".into(),
                ));
            };
            let mut f = match open_source(p) {
                Ok(f) => f,
                Err(e) => {
                    out.push((job.node, Outcome::Failed(format!("{}: {e}", p.display()))));
                    continue;
                }
            };
            let (first, data_mark) = (pending.len(), data.len());
            // The worker's read buffer (MBs) is reused: zeroing a fresh one
            // per small file cost more than reading the file.
            let mut stream = ChunkStream::with_buffer(
                &mut f as &mut dyn Read,
                self.chunker,
                std::mem::take(&mut bufs.read),
            );
            let mut failed = None;
            loop {
                let next = match stream.next_chunk() {
                    Ok(n) => n,
                    Err(e) => {
                        failed = Some(format!("read error: {e}"));
                        break;
                    }
                };
                let Some((_, chunk)) = next else { break };
                let (fp, zero) = chunk_fp(hasher, chunk);
                pending.push(PendingChunk {
                    fp,
                    start: data.len(),
                    len: chunk.len() as u32,
                    zero,
                });
                if !zero {
                    data.extend_from_slice(chunk);
                }
                self.progress
                    .bytes_done
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                self.read_bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            let size = stream.position();
            bufs.read = stream.into_buffer();
            if let Some(m) = failed {
                pending.truncate(first);
                data.truncate(data_mark);
                out.push((job.node, Outcome::Failed(format!("{}: {m}", p.display()))));
                continue;
            }
            self.progress.files_done.fetch_add(1, Ordering::Relaxed);
            files.push((
                job.node,
                first,
                size,
                changed_warning(&f, p, size, &nodes[job.node]),
            ));
        }
        if pending.is_empty() {
            for (node, _, size, warning) in files {
                out.push((
                    node,
                    Outcome::Done {
                        segments: vec![],
                        size,
                        warning,
                    },
                ));
            }
            return Ok(out);
        }
        let group_fp = hasher.hash_fingerprints(pending.iter().map(|c| &c.fp));
        let fps: Vec<Fingerprint> = pending.iter().filter(|c| !c.zero).map(|c| c.fp).collect();
        let found = self.strategy.lookup_segment(&group_fp, &fps);
        let per_file: Vec<Fingerprint> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let end = files.get(i + 1).map_or(pending.len(), |n| n.1);
                hasher.hash_fingerprints(pending[f.1..end].iter().map(|c| &c.fp))
            })
            .collect();
        let total = pending.len();
        let (refs, appended, _) = self.store_chunks(writer, data, pending.drain(..), found)?;
        self.segment_done(&group_fp, &refs, appended as usize)?;
        for (i, (node, first, size, warning)) in files.iter().enumerate() {
            let end = files.get(i + 1).map_or(total, |n| n.1);
            let chunks = refs[*first..end].to_vec();
            let segments = if chunks.is_empty() {
                vec![]
            } else {
                vec![SegmentRef {
                    fp: per_file[i],
                    chunks,
                }]
            };
            out.push((
                *node,
                Outcome::Done {
                    segments,
                    size: *size,
                    warning: warning.clone(),
                },
            ));
        }
        Ok(out)
    }

    /// Tells the strategy a segment (or group) is stored.
    fn segment_done(&self, seg_fp: &Fingerprint, refs: &[ChunkRef], new: usize) -> Result<()> {
        let chunks: Vec<(Fingerprint, ChunkLoc)> = refs
            .iter()
            .filter(|c| c.is_direct())
            .map(|c| {
                (
                    c.fp,
                    ChunkLoc {
                        container: c.container,
                        region: c.region,
                        offset: c.offset,
                        len: c.len,
                    },
                )
            })
            .collect();
        let bytes = refs.iter().map(|c| c.len as u64).sum();
        self.strategy.segment_done(seg_fp, &chunks, bytes, new)
    }

    /// Reads one source. `Ok(Err(msg))` is a per-file problem (a warning);
    /// `Err` is fatal for the whole backup.
    fn process(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        reader: &mut dyn Read,
    ) -> Result<Result<(Vec<SegmentRef>, u64), String>> {
        let mut stream =
            ChunkStream::with_buffer(reader, self.chunker, std::mem::take(&mut bufs.read));
        let r = self.process_stream(writer, &mut bufs.segment, &mut stream);
        bufs.read = stream.into_buffer();
        r
    }

    fn process_stream(
        &self,
        writer: &mut ContainerWriter,
        data: &mut Vec<u8>,
        stream: &mut ChunkStream<&mut dyn Read>,
    ) -> Result<Result<(Vec<SegmentRef>, u64), String>> {
        let mut seg = Segmenter::new(&self.chunker);
        data.clear();
        let mut pending: Vec<PendingChunk> = Vec::new();
        let mut segments = Vec::new();
        let hasher = self.repo.hasher();
        loop {
            if self.abort.load(Ordering::Relaxed) {
                return Err(StoreError::Cancelled);
            }
            let next = match stream.next_chunk() {
                Ok(n) => n,
                Err(e) => return Ok(Err(format!("read error: {e}"))),
            };
            let Some((_, chunk)) = next else { break };
            let (fp, zero) = chunk_fp(hasher, chunk);
            let len = chunk.len() as u32;
            pending.push(PendingChunk {
                fp,
                start: data.len(),
                len,
                zero,
            });
            if !zero {
                data.extend_from_slice(chunk);
            }
            self.progress
                .bytes_done
                .fetch_add(len as u64, Ordering::Relaxed);
            self.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
            if seg.push(&fp, len) {
                self.finish_segment(writer, data, &mut pending, &mut segments)?;
                data.clear();
            }
        }
        self.finish_segment(writer, data, &mut pending, &mut segments)?;
        Ok(Ok((segments, stream.position())))
    }

    fn process_job(
        &self,
        writer: &mut ContainerWriter,
        bufs: &mut WorkerBuffers,
        job: &Job,
        expect: &Node,
    ) -> Result<Outcome> {
        match &job.source {
            Source::Stream(m) => {
                let mut r = m
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .ok_or_else(|| StoreError::Invalid("stream read twice".into()))?;
                Ok(match self.process(writer, bufs, &mut r)? {
                    Ok((segments, size)) => Outcome::Done {
                        segments,
                        size,
                        warning: None,
                    },
                    Err(m) => Outcome::Failed(format!("stdin: {m}")),
                })
            }
            Source::Path(p) => {
                let mut f = match open_source(p) {
                    Ok(f) => f,
                    Err(e) => return Ok(Outcome::Failed(format!("{}: {e}", p.display()))),
                };
                let r = self.process(writer, bufs, &mut f)?;
                let (segments, size) = match r {
                    Ok(x) => x,
                    Err(m) => return Ok(Outcome::Failed(format!("{}: {m}", p.display()))),
                };
                self.progress.files_done.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::Done {
                    segments,
                    size,
                    warning: changed_warning(&f, p, size, expect),
                })
            }
        }
    }
}

/// Opens a file to back up, never following a symlink (and without
/// touching its atime where the file system allows).
fn open_source(p: &Path) -> std::io::Result<File> {
    File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME)
        .open(p)
        .or_else(|_| {
            File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
        })
}

/// A file modified while it was read is kept as read, with a warning
/// (restic and borg do the same).
fn changed_warning(f: &File, p: &Path, size: u64, expect: &Node) -> Option<String> {
    let after = f.metadata().ok()?;
    let t = after.mtime() * 1_000_000_000 + after.mtime_nsec();
    (after.len() != size || t != expect.mtime_ns || size != expect.size).then(|| {
        format!(
            "{}: file changed while it was read; stored the {size} bytes read",
            p.display()
        )
    })
}

/// Groups consecutive jobs that are small files of one directory (each at
/// most a quarter of a segment) into units of up to `segment` bytes; every
/// other job is a unit of its own. The walk lists a directory's files
/// together, so consecutive is enough.
fn group_small_files(jobs: &[Job], nodes: &[Node], segment: u64) -> Vec<Vec<usize>> {
    let small = |j: &Job| matches!(j.source, Source::Path(_)) && nodes[j.node].size <= segment / 4;
    let dir = |j: &Job| {
        let p = &nodes[j.node].path;
        p[..p.iter().rposition(|&b| b == b'/').unwrap_or(0)].to_vec()
    };
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    let mut cur_dir: Option<Vec<u8>> = None;
    for (i, j) in jobs.iter().enumerate() {
        if !small(j) {
            if !cur.is_empty() {
                units.push(std::mem::take(&mut cur));
            }
            units.push(vec![i]);
            cur_dir = None;
            cur_bytes = 0;
            continue;
        }
        let d = dir(j);
        if cur_dir.as_ref() != Some(&d) || cur_bytes >= segment {
            if !cur.is_empty() {
                units.push(std::mem::take(&mut cur));
            }
            cur_dir = Some(d);
            cur_bytes = 0;
        }
        cur_bytes += nodes[j.node].size;
        cur.push(i);
    }
    if !cur.is_empty() {
        units.push(cur);
    }
    units
}

/// Writes the snapshot object — the commit point — with the next free
/// version number of its series. Two backups of one series may run at once
/// (they share the lock); should both pick the same number, the one with
/// the larger id withdraws its object and takes the next number.
fn commit_snapshot(repo: &Repository, snapshot: &mut Snapshot) -> Result<String> {
    let next = |repo: &Repository, series: &str| -> Result<u32> {
        Ok(repo
            .list_snapshots_tolerant()?
            .0
            .iter()
            .filter(|(_, s)| s.series == series)
            .map(|(_, s)| s.version)
            .max()
            .unwrap_or(0)
            + 1)
    };
    snapshot.version = next(repo, &snapshot.series)?;
    for _ in 0..16 {
        let (id, _) = repo.put_struct(Kind::Snapshot, "snapshots", snapshot)?;
        let clash = repo
            .list_snapshots_tolerant()?
            .0
            .into_iter()
            .any(|(other, s)| {
                other < id && s.series == snapshot.series && s.version == snapshot.version
            });
        if !clash {
            return Ok(id);
        }
        repo.backend().delete(&format!("snapshots/{id}"))?;
        snapshot.version = next(repo, &snapshot.series)?.max(snapshot.version + 1);
    }
    Err(StoreError::Invalid(format!(
        "could not find a free version number in series {:?}; retry the backup",
        snapshot.series
    )))
}

/// Runs a backup and commits a new version.
pub fn backup(repo: &Repository, mut opts: BackupOptions) -> Result<BackupReport> {
    let started = std::time::Instant::now();
    let _lock = lock::acquire(repo, false, "backup")?;
    let chunker = opts.chunker.unwrap_or(repo.config().chunker);
    chunker.validate()?;
    let mut paths = Vec::new();
    for p in &opts.paths {
        let abs = if p.is_absolute() {
            p.clone()
        } else {
            std::env::current_dir()
                .map_err(|e| StoreError::io("resolve", p.display().to_string(), e))?
                .join(p)
        };
        // Normalise `.` and `..` lexically; symlinks are not followed.
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
    // A root inside another root is already covered by it.
    paths.sort();
    paths.dedup();
    let all = paths.clone();
    paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    if paths.is_empty() && opts.stdin.is_none() {
        return Err(StoreError::Invalid(
            "nothing to back up: give paths or --stdin".into(),
        ));
    }
    let series = opts
        .series
        .clone()
        .unwrap_or_else(|| default_series(&paths, opts.stdin.as_ref().map(|s| s.name.as_str())));

    // Index and parent.
    let table = Arc::new(ContainerTable::default());
    let (strategy, repo_index) = build_strategy(repo, &table)?;
    let (snapshots, _) = repo.list_snapshots_tolerant()?;
    let parent = snapshots
        .iter()
        .filter(|(_, s)| s.series == series)
        .max_by_key(|(_, s)| (s.version, s.time_ns))
        .cloned();
    let mut parent_nodes: HashMap<Vec<u8>, Node> = HashMap::new();
    let mut parent_containers: Vec<ContainerId> = vec![];
    if let Some((_, ps)) = &parent {
        // An archival parent's references are indirect or into its own
        // stamped containers, which expire with it: never reuse them.
        if ps.chunker == chunker && ps.archival.is_none() {
            let r = repo.load_recipe(&ps.recipe)?;
            parent_containers = r.containers;
            for n in r.nodes {
                if n.kind == NodeKind::File {
                    parent_nodes.insert(n.path.clone(), n);
                }
            }
        }
    }
    let reuse = |old: &Node, new: &Node| -> Option<Vec<SegmentRef>> {
        if old.size != new.size
            || old.mtime_ns != new.mtime_ns
            || old.ctime_ns != new.ctime_ns
            || old.ino != new.ino
        {
            return None;
        }
        let mut segs = old.segments.clone();
        for s in &mut segs {
            for c in &mut s.chunks {
                if c.is_zero() {
                    continue;
                }
                let id = parent_containers.get(c.container as usize)?;
                if repo_index.containers.contains_key(id) {
                    c.container = table.intern(*id);
                } else {
                    // Moved by gc since: take the current location.
                    let l = strategy.lookup_chunk(&c.fp)?;
                    c.container = l.container;
                    c.region = l.region;
                    c.offset = l.offset;
                }
            }
        }
        Some(segs)
    };

    let progress = opts.progress.clone();
    let mut walker = Walker {
        nodes: Vec::new(),
        jobs: Vec::new(),
        warnings: Vec::new(),
        seen: HashSet::new(),
        hardlinks: HashMap::new(),
        parent: &parent_nodes,
        reuse: &reuse,
        force_read: opts.force_read,
        progress: &progress,
        reused: 0,
        excludes: &opts.excludes,
        exclude_paths: &opts.exclude_paths,
        exclude_ids: opts
            .exclude_paths
            .iter()
            .filter_map(|p| fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))
            .collect(),
    };
    for p in &paths {
        walker.walk_root(p);
    }
    if let Some(s) = opts.stdin.take() {
        let now = now_ns();
        let name = s.name.trim_start_matches('/').as_bytes().to_vec();
        if crate::restore::safe_rel(&name).is_err() {
            return Err(StoreError::Invalid(format!(
                "--stdin-name {:?} must be a relative path without empty, `.` or `..` components",
                s.name
            )));
        }
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let synthetic = |path: Vec<u8>, kind: NodeKind, mode: u32| Node {
            path,
            kind,
            mode,
            uid,
            gid,
            mtime_ns: now,
            ctime_ns: now,
            ino: 0,
            dev: 0,
            rdev: 0,
            nlink: 1,
            size: 0,
            target: None,
            segments: vec![],
            xattrs: vec![],
        };
        // Parent directories of a name like `dumps/db.sql`.
        for (i, _) in name.iter().enumerate().filter(|(_, &b)| b == b'/') {
            let dir = name[..i].to_vec();
            if walker.seen.insert(dir.clone()) {
                walker.nodes.push(synthetic(dir, NodeKind::Dir, 0o40755));
            }
        }
        walker.jobs.push(Job {
            node: walker.nodes.len(),
            source: Source::Stream(Mutex::new(Some(s.reader))),
        });
        walker.nodes.push(synthetic(name, NodeKind::File, 0o100644));
        progress.files_total.fetch_add(1, Ordering::Relaxed);
    }
    progress.totals_known.store(true, Ordering::Relaxed);
    let Walker {
        mut nodes,
        jobs,
        mut warnings,
        reused,
        ..
    } = walker;

    // Read, chunk, dedup and pack on the workers.
    let ctx = Ctx {
        repo,
        strategy: strategy.as_ref(),
        chunker,
        progress: &progress,
        abort: AtomicBool::new(false),
        new_chunks: AtomicU64::new(0),
        new_raw: AtomicU64::new(0),
        read_bytes: AtomicU64::new(0),
    };
    // Work units: one job each, or — for strategies that look small files
    // up together (SiLo) — runs of small files of one directory, up to a
    // segment's worth of data.
    let units: Vec<Vec<usize>> = if strategy.groups_small_files() {
        group_small_files(&jobs, &nodes, chunker.avg_segment as u64)
    } else {
        (0..jobs.len()).map(|i| vec![i]).collect()
    };
    let sink = ContainerSink::start(repo);
    let next = AtomicUsize::new(0);
    let threads = opts.threads.clamp(1, 64);
    let results: Vec<Result<Vec<(usize, Outcome)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let sender = sink.sender();
                let (ctx, jobs, units, next, table, nodes) =
                    (&ctx, &jobs, &units, &next, &table, &nodes);
                s.spawn(move || -> Result<Vec<(usize, Outcome)>> {
                    let mut writer = ContainerWriter::new(ctx.repo, table.clone(), sender);
                    let mut bufs = WorkerBuffers::default();
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(unit) = units.get(i) else { break };
                        let r = match unit.as_slice() {
                            [j] => {
                                let job = &jobs[*j];
                                ctx.process_job(&mut writer, &mut bufs, job, &nodes[job.node])
                                    .map(|o| vec![(job.node, o)])
                            }
                            many => {
                                let group: Vec<&Job> = many.iter().map(|j| &jobs[*j]).collect();
                                ctx.process_group(&mut writer, &mut bufs, &group, nodes)
                            }
                        };
                        match r {
                            Ok(o) => out.extend(o),
                            Err(e) => {
                                ctx.abort.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    writer.flush()?;
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(StoreError::Invalid("backup worker panicked".into())))
            })
            .collect()
    });
    // The writer thread's error comes first: when it fails, the workers
    // only see a closed channel.
    let sink_result = sink.finish()?;
    // With the containers durable, the strategy may persist what points
    // at them (its side data is derived; a crash later costs nothing).
    if results.iter().all(|r| r.is_ok()) {
        strategy.finish()?;
    }
    let mut failed: HashSet<usize> = HashSet::new();
    for r in results {
        for (ni, o) in r? {
            match o {
                Outcome::Done {
                    segments,
                    size,
                    warning,
                } => {
                    warnings.extend(warning);
                    let n = &mut nodes[ni];
                    n.segments = segments;
                    n.size = size;
                }
                Outcome::Failed(msg) => {
                    warnings.push(msg);
                    failed.insert(ni);
                }
            }
        }
    }
    if !failed.is_empty() {
        let mut i = 0;
        nodes.retain(|_| {
            i += 1;
            !failed.contains(&(i - 1))
        });
    }

    // Commit: index object → recipe → snapshot.
    let mut stored = sink_result.stored_bytes;
    if !sink_result.metas.is_empty() {
        let (_, n) = crate::index::put_index_object(repo, sink_result.metas)?;
        stored += n;
    }
    let mut local: HashMap<u32, u32> = HashMap::new();
    let mut containers = Vec::new();
    for n in &mut nodes {
        for s in &mut n.segments {
            for c in &mut s.chunks {
                if c.is_zero() {
                    continue;
                }
                let g = c.container;
                c.container = *local.entry(g).or_insert_with(|| {
                    containers.push(table.get(g));
                    containers.len() as u32 - 1
                });
            }
        }
    }
    nodes.sort_by(|a, b| a.path.cmp(&b.path));
    let stats = SnapshotStats {
        files: nodes.iter().filter(|n| n.kind == NodeKind::File).count() as u64,
        dirs: nodes.iter().filter(|n| n.kind == NodeKind::Dir).count() as u64,
        logical_bytes: nodes.iter().map(|n| n.size).sum(),
        read_bytes: ctx.read_bytes.load(Ordering::Relaxed),
        new_chunks: ctx.new_chunks.load(Ordering::Relaxed),
        new_raw_bytes: ctx.new_raw.load(Ordering::Relaxed),
        new_stored_bytes: 0,
        duration_ms: 0,
        warnings: warnings.len() as u64,
    };
    let (recipe_id, rn) =
        repo.put_struct(Kind::Recipe, "recipes", &Recipe { containers, nodes })?;
    stored += rn;
    let mut snapshot = Snapshot {
        series,
        // Assigned at commit.
        version: 0,
        time_ns: now_ns(),
        host: lock::hostname(),
        paths: paths.iter().map(|p| p.display().to_string()).collect(),
        tags: opts.tags.clone(),
        recipe: recipe_id,
        parent: parent.map(|p| p.0),
        chunker,
        stats,
        archival: None,
    };
    snapshot.stats.new_stored_bytes = stored;
    snapshot.stats.duration_ms = started.elapsed().as_millis() as u64;
    let id = commit_snapshot(repo, &mut snapshot)?;
    Ok(BackupReport {
        id,
        snapshot,
        warnings,
        index_ram_bytes: strategy.ram_bytes(),
        reused_files: reused,
    })
}
