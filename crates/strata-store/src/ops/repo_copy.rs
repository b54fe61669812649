//! `strata copy`: versions from another repository stored in this one, as
//! backups of a tree read from there — cut with this repository's chunker,
//! fingerprinted with its key, deduplicated against what it holds (and
//! against the previous version of the series), encrypted with its key.
//! The copy keeps the original's series, time, host, paths and tags; a
//! version whose series, host and time this repository already has counts
//! as copied, so running the command again copies only what is new.

use crate::engine::fsread::{FileReader, RegionCache, SnapshotReader};
use crate::error::{Result, StoreError};
use crate::ops::backup::{backup, BackupOptions, BackupReport, Import};
use crate::progress::Progress;
use crate::repo::skeleton::Skeleton;
use crate::repo::Repository;
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use strata_core::format::{Node, NodeKind, Snapshot};
use strata_core::id::SnapshotId;

/// Settings of one copy.
pub struct CopyOptions {
    pub threads: usize,
    pub progress: Arc<Progress>,
}

/// Whether `have` (this repository's snapshots) already holds a copy of
/// `s`: the same series, host and time.
pub fn already_copied(have: &[(SnapshotId, Snapshot)], s: &Snapshot) -> bool {
    copy_of(have, s).is_some()
}

/// The id of the copy of `s` that `have` holds, if it holds one.
pub fn copy_of<'a>(have: &'a [(SnapshotId, Snapshot)], s: &Snapshot) -> Option<&'a str> {
    have.iter()
        .find(|(_, h)| h.series == s.series && h.host == s.host && h.time_ns == s.time_ns)
        .map(|(id, _)| id.as_str())
}

/// Why `s` cannot join its series in `dst`, if it cannot: a series'
/// versions are numbered in time order and the lifecycle reverse-
/// deduplicates each against the next, so a version older than the
/// series' newest there would be numbered after newer data.
pub fn out_of_order(have: &[(SnapshotId, Snapshot)], s: &Snapshot) -> Option<String> {
    let newest = have
        .iter()
        .filter(|(_, h)| h.series == s.series)
        .max_by_key(|(_, h)| h.time_ns)?;
    (newest.1.time_ns > s.time_ns).then(|| {
        format!(
            "series {} here already has a newer version ({}@{}); a copy would be numbered after it",
            s.series, newest.1.series, newest.1.version
        )
    })
}

/// Stores version `original` of another repository in `dst`. `parts` are
/// where its tree lives: (repository holding the data, the snapshot as that
/// repository records it) — one pair, or two for a version some of whose
/// files moved to a cloud tier. Returns the new snapshot's backup report.
pub fn copy_version(
    parts: &[(Repository, Snapshot)],
    original: &Snapshot,
    dst: &Repository,
    opts: CopyOptions,
) -> Result<BackupReport> {
    store_version(parts, original, dst, opts, &Stored::same())
}

/// Where a stored version goes and what it leaves out.
pub(crate) struct Stored<'a> {
    /// Its series (`None`: the original's).
    pub series: Option<String>,
    /// Tags added to the original's.
    pub tags: Vec<String>,
    /// Paths left out (with hard links to them).
    pub skip: Option<&'a std::collections::HashSet<Vec<u8>>>,
    /// Containers the new version must not deduplicate against (damaged).
    pub avoid: Option<&'a std::collections::HashSet<strata_core::format::ContainerId>>,
}

impl Stored<'_> {
    fn same() -> Self {
        Stored {
            series: None,
            tags: vec![],
            skip: None,
            avoid: None,
        }
    }
}

/// [`copy_version`], storing the version as `how` says.
pub(crate) fn store_version(
    parts: &[(Repository, Snapshot)],
    original: &Snapshot,
    dst: &Repository,
    opts: CopyOptions,
    how: &Stored,
) -> Result<BackupReport> {
    let skipped =
        |p: Option<&[u8]>| matches!((how.skip, p), (Some(skip), Some(p)) if skip.contains(p));
    // Nothing the source's gc or forget does may pull data from under the
    // copy: a shared lock on every repository read from.
    let _locks = parts
        .iter()
        .map(|(repo, _)| crate::repo::lock::acquire(repo, false, "copy (source)"))
        .collect::<Result<Vec<_>>>()?;
    let cache = Arc::new(RegionCache::new(64 << 20));
    let mut entries: Vec<(Node, Option<Box<dyn Read + Send>>)> = Vec::new();
    // A directory can be in two parts; it is stored once (the last part's,
    // the active one, as restore sets it last).
    let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
    for (repo, part) in parts {
        // The tree without chunks: a file's are read from the parts
        // holding it as the backup reads the file.
        let tree = Arc::new(Skeleton::load(repo, &part.recipe)?);
        let reader = Arc::new(SnapshotReader::stored(
            repo.clone(),
            part.clone(),
            tree.clone(),
            repo.clone(),
            cache.clone(),
        ));
        for (i, n) in tree.recipe.nodes.iter().enumerate() {
            let hardlink_to_skipped = n.kind == NodeKind::Hardlink && skipped(n.target.as_deref());
            if skipped(Some(&n.path)) || hardlink_to_skipped {
                continue;
            }
            let content: Option<Box<dyn Read + Send>> = match n.kind {
                NodeKind::File => Some(Box::new(Content {
                    snapshot: reader.clone(),
                    node: i,
                    file: None,
                    offset: 0,
                })),
                _ => None,
            };
            match at.get(&n.path) {
                Some(&i) => entries[i] = (n.clone(), content),
                None => {
                    at.insert(n.path.clone(), entries.len());
                    entries.push((n.clone(), content));
                }
            }
        }
    }
    let opts = BackupOptions {
        import: Some(Import {
            entries,
            time_ns: original.time_ns,
            host: original.host.clone(),
            paths: original.paths.clone(),
        }),
        series: Some(
            how.series
                .clone()
                .unwrap_or_else(|| original.series.clone()),
        ),
        tags: original.tags.iter().chain(&how.tags).cloned().collect(),
        threads: opts.threads,
        progress: opts.progress,
        chunker: Some(dst.config().chunker),
        avoid: how.avoid.cloned().unwrap_or_default(),
        ..Default::default()
    };
    backup(dst, opts)
}

/// A file's content read on demand from the other repository.
struct Content {
    snapshot: Arc<SnapshotReader>,
    /// The file's node in the snapshot's tree.
    node: usize,
    file: Option<FileReader>,
    offset: u64,
}

impl Read for Content {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let to_io = |e: StoreError| std::io::Error::other(e.to_string());
        if self.file.is_none() {
            self.file = Some(self.snapshot.open_node(self.node).map_err(to_io)?);
        }
        let Some(file) = &self.file else {
            return Ok(0);
        };
        let data = file
            .read_at(self.offset, buf.len().min(1 << 20))
            .map_err(to_io)?;
        buf[..data.len()].copy_from_slice(&data);
        self.offset += data.len() as u64;
        Ok(data.len())
    }
}
