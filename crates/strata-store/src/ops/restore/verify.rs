//! `restore --verify`: the restored files read back against the
//! recipe's fingerprints.

use super::options::RestoreOptions;
use super::select::{safe_rel, select_entries};
use super::source::RecipeSource;
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use strata_core::format::{Node, NodeKind, Recipe};

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
    verify_from(repo, RecipeSource::Memory(recipe), opts)
}

/// Chunks checked at once (several files, or pieces of one, side by
/// side): what is held of the recipe at a time.
const BATCH_CHUNKS: usize = 1 << 18;
/// Files (or pieces) checked at once at most.
const BATCH_NODES: usize = 4096;

/// [`verify`] of a recipe read from `source`, a piece at a time.
pub fn verify_from(
    repo: &Repository,
    source: RecipeSource,
    opts: &RestoreOptions,
) -> Result<VerifyReport> {
    let skeleton = source.skeleton()?;
    let selection = select_entries(&skeleton, &opts.include, &opts.exclude);
    let files: Vec<(&Node, &[u8])> = selection
        .iter()
        .filter(|(n, _)| n.kind == NodeKind::File)
        .map(|(n, c)| (&**n, *c))
        .collect();
    let mut full = Vec::with_capacity(files.len());
    for (n, _) in &files {
        full.push(opts.target.join(safe_rel(&n.path)?));
    }
    let content: HashMap<&[u8], usize> = files
        .iter()
        .enumerate()
        .map(|(i, (_, c))| (*c, i))
        .collect();
    // The first difference found in each file, and where its chunks end.
    let mut found: Vec<Option<String>> = vec![None; files.len()];
    let mut ends = vec![0u64; files.len()];
    let mut batch: Vec<(usize, Node, u64)> = Vec::new();
    let mut chunks = 0;
    let check = |batch: &mut Vec<(usize, Node, u64)>, found: &mut Vec<Option<String>>| {
        let results: Vec<Result<Option<String>>> = batch
            .par_iter()
            .map(|(fi, n, off)| match found[*fi] {
                Some(_) => Ok(None),
                None => verify_piece(repo, &full[*fi], n, *off),
            })
            .collect();
        for ((fi, _, _), r) in batch.drain(..).zip(results) {
            if let (None, Some(m)) = (&found[fi], r?) {
                found[fi] = Some(m);
            }
        }
        Ok::<(), StoreError>(())
    };
    source.for_each_piece(|n, off| {
        let Some(&fi) = content
            .get(n.path.as_slice())
            .filter(|_| n.kind == NodeKind::File)
        else {
            return Ok(());
        };
        let len: u64 = n.segments.iter().map(|s| s.len()).sum();
        ends[fi] = ends[fi].max(off.saturating_add(len));
        if found[fi].is_some() || n.segments.is_empty() {
            return Ok(());
        }
        chunks += n.segments.iter().map(|s| s.chunks.len()).sum::<usize>();
        batch.push((fi, n.clone(), off));
        if chunks >= BATCH_CHUNKS || batch.len() >= BATCH_NODES {
            chunks = 0;
            check(&mut batch, &mut found)?;
        }
        Ok(())
    })?;
    check(&mut batch, &mut found)?;
    let mut rep = VerifyReport::default();
    for (fi, (n, _)) in files.iter().enumerate() {
        rep.files += 1;
        rep.bytes += n.size;
        let shown = full[fi].display();
        let m = found[fi]
            .take()
            .or_else(|| match fs::symlink_metadata(&full[fi]) {
                Ok(m) if m.len() > ends[fi] => Some(format!("{shown}: longer than the snapshot's")),
                Ok(m) if m.len() < ends[fi] => {
                    Some(format!("{shown}: shorter than the snapshot's"))
                }
                Ok(_) => None,
                Err(e) => Some(format!("{shown}: cannot read: {e}")),
            });
        rep.mismatches.extend(m);
    }
    Ok(rep)
}

/// `None` when the restored file `full` holds `n`'s chunks from `off` on.
fn verify_piece(repo: &Repository, full: &Path, n: &Node, off: u64) -> Result<Option<String>> {
    use std::io::{Read, Seek};
    let shown = full.display().to_string();
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(full)
        .and_then(|mut f| f.seek(std::io::SeekFrom::Start(off)).map(|_| f));
    let mut f = match opened {
        Ok(f) => std::io::BufReader::with_capacity(1 << 20, f),
        Err(e) => return Ok(Some(format!("{shown}: cannot read: {e}"))),
    };
    let mut buf = Vec::new();
    let mut at = off;
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
                "{shown}: differs from the snapshot at byte {at}"
            )));
        }
        at += c.len as u64;
    }
    Ok(None)
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
