//! Operation sequences with crashes: the harness behind the
//! crash-consistency property test (`tests/opseq.rs`) and fuzz target
//! (`fuzz/fuzz_targets/opseq.rs`), as redb tests its own commits.
//!
//! A sequence of steps — backup, forget, gc, maintain, copy to a second
//! repository — runs over in-memory repositories behind a
//! [`strata_backend::Crash`] wrapper. A step may "crash" at a chosen write:
//! every write from then on fails, as if the process had been killed. The
//! storage is then revived and the repositories opened again, as a new
//! process would (the dead process's locks removed, as `strata unlock`
//! would once its lease ran out), and the invariants are checked:
//!
//! * every version committed (and not forgotten) is listed, and nothing
//!   else: a crashed backup or copy committed its version or nothing;
//! * every listed version restores byte-exact to the tree it was made of;
//! * `check --read-data` finds no error.

use crate::backend::Backend;
use crate::error::Result;
use crate::ops::backup::BackupOptions;
use crate::ops::check::{check, CheckOptions};
use crate::ops::gc::{gc, GcOptions};
use crate::ops::repo_copy::{copy_version, CopyOptions};
use crate::ops::restore::{restore, RestoreOptions};
use crate::repo::{lock, InitOptions, Repository};
use crate::revdedup::{backup, maintain, After, MaintainOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_backend::{Crash, MemoryBackend};
use strata_core::chunker::ChunkerParams;
use strata_core::id::SnapshotId;

/// What one step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Changes some files of the tree (by `seed`), then backs it up.
    Backup {
        seed: u8,
    },
    /// Forgets the committed version `pick` (modulo how many there are).
    Forget {
        pick: u8,
    },
    Gc,
    Maintain,
    /// Copies the newest version to the second repository.
    Copy,
}

/// One step: an operation and, optionally, the write it crashes at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub crash_after: Option<u64>,
}

/// Steps from arbitrary bytes (three per step): what the fuzz target and
/// the property test feed [`run`].
pub fn decode(bytes: &[u8]) -> Vec<Step> {
    bytes
        .chunks_exact(3)
        .map(|b| Step {
            op: match b[0] % 6 {
                0 | 1 => Op::Backup { seed: b[1] },
                2 => Op::Forget { pick: b[1] },
                3 => Op::Gc,
                4 => Op::Maintain,
                _ => Op::Copy,
            },
            crash_after: (b[2] & 0x80 != 0).then_some(u64::from(b[2] & 0x3f)),
        })
        .collect()
}

/// What a run went through.
#[derive(Debug, Default)]
pub struct Outcome {
    pub steps: usize,
    /// Steps whose crash happened (the countdown ran out).
    pub crashes: usize,
    /// Versions restored and compared in all.
    pub restores: usize,
    /// Chunks backups stored as deltas.
    pub delta_chunks: u64,
}

/// A file tree, by name.
type Tree = BTreeMap<String, Vec<u8>>;

/// One repository: its storage, its handle and what it must hold.
struct Side {
    crash: Arc<Crash>,
    repo: Repository,
    /// Committed versions and the trees they hold.
    versions: BTreeMap<SnapshotId, Tree>,
}

impl Side {
    fn new(opts: InitOptions) -> std::result::Result<Side, String> {
        let crash = Arc::new(Crash::new(Arc::new(MemoryBackend::new())));
        let repo = Repository::init(crash.clone(), opts).map_err(|e| e.to_string())?;
        Ok(Side {
            crash,
            repo,
            versions: BTreeMap::new(),
        })
    }

    /// The storage revived and the repository opened again, as a new
    /// process: the dead one's locks removed.
    fn reopen(&mut self) -> std::result::Result<(), String> {
        self.crash.revive();
        let backend: Arc<dyn Backend> = self.crash.clone();
        self.repo = Repository::open(backend, &|| Ok(Vec::new())).map_err(|e| e.to_string())?;
        lock::unlock(&self.repo, true).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn listed(&self) -> std::result::Result<Vec<SnapshotId>, String> {
        Ok(self
            .repo
            .list_snapshots()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }
}

/// Small chunks, segments, regions and containers: a small tree spreads
/// over many objects, so crashes land between many writes.
fn init_options() -> InitOptions {
    let mut chunker = ChunkerParams::cdc(1024);
    chunker.avg_segment = 16 << 10;
    InitOptions {
        chunker,
        container_size: 64 << 10,
        region_size: 16 << 10,
        ..Default::default()
    }
}

/// Runs `steps` in a fresh pair of repositories, with the trees under
/// `work` (an empty directory); the first broken invariant is the error.
pub fn run(steps: &[Step], work: &Path) -> std::result::Result<Outcome, String> {
    let src = work.join("src");
    std::fs::create_dir_all(&src).map_err(|e| e.to_string())?;
    // Deltas on where versions are made: edited files are stored as
    // deltas against earlier versions' chunks, whose bases the lifecycle
    // must keep (`copy` writes into a repository without them).
    let mut a = Side::new(InitOptions {
        delta: true,
        ..init_options()
    })?;
    let mut b = Side::new(init_options())?;
    let mut tree = Tree::new();
    let mut out = Outcome::default();
    for (i, step) in steps.iter().enumerate() {
        let side = if step.op == Op::Copy { &mut b } else { &mut a };
        if let Some(n) = step.crash_after {
            side.crash.crash_after(n);
        }
        let before = side.listed()?;
        // The tree a version this step commits holds.
        let pending = match step.op {
            Op::Backup { seed } => {
                change(&mut tree, seed, i);
                Some(tree.clone())
            }
            Op::Copy => to_copy(&a, &b)?.map(|(_, t)| t),
            _ => None,
        };
        let made = apply(step.op, &a, &b, &src, &tree);
        if let Ok(n) = &made {
            out.delta_chunks += n;
        }
        let side = if step.op == Op::Copy { &mut b } else { &mut a };
        let crashed = side.crash.crashed();
        out.crashes += crashed as usize;
        if let Err(e) = &made {
            if !crashed {
                return Err(format!("step {i} {step:?} failed without a crash: {e}"));
            }
        }
        side.reopen()?;
        account(side, &before, step.op, pending, i)?;
        for s in [&a, &b] {
            out.restores += verify(s, work, i)?;
        }
        out.steps += 1;
    }
    Ok(out)
}

/// Runs one step (a backup of `tree`, written to `src` first); the
/// chunks a backup stored as deltas.
fn apply(op: Op, a: &Side, b: &Side, src: &Path, tree: &Tree) -> Result<u64> {
    match op {
        Op::Backup { .. } => {
            write_tree(src, tree)?;
            let opts = BackupOptions {
                paths: vec![src.to_path_buf()],
                series: Some("s".into()),
                threads: 2,
                ..Default::default()
            };
            backup(&a.repo, opts, After::Lifecycle, &mut |_| {})
                .map(|b| b.report.delta.map_or(0, |d| d.chunks))
        }
        Op::Forget { pick } => match pick_one(&a.versions, pick) {
            Some(id) => crate::ops::forget::forget(&a.repo, &[id.to_string()]).map(|_| 0),
            None => Ok(0),
        },
        Op::Gc => gc(&a.repo, &GcOptions::default()).map(|_| 0),
        Op::Maintain => maintain(&a.repo, &MaintainOptions::default()).map(|_| 0),
        Op::Copy => {
            let Some((id, _)) = to_copy(a, b).map_err(crate::error::StoreError::Invalid)? else {
                return Ok(0);
            };
            let s = a.repo.load_snapshot(&id)?;
            let opts = CopyOptions {
                threads: 2,
                progress: Default::default(),
            };
            copy_version(&[(a.repo.clone(), s.clone())], &s, &b.repo, opts).map(|_| 0)
        }
    }
}

/// The first version of `a` (by id) that `b` has no copy of, and its
/// tree.
fn to_copy(a: &Side, b: &Side) -> std::result::Result<Option<(SnapshotId, Tree)>, String> {
    let have = b.repo.list_snapshots().map_err(|e| e.to_string())?;
    for (id, t) in &a.versions {
        let s = a.repo.load_snapshot(id).map_err(|e| e.to_string())?;
        if !crate::ops::repo_copy::already_copied(&have, &s) {
            return Ok(Some((id.clone(), t.clone())));
        }
    }
    Ok(None)
}

fn pick_one(versions: &BTreeMap<SnapshotId, Tree>, pick: u8) -> Option<SnapshotId> {
    let n = versions.len().max(1);
    versions.keys().nth(pick as usize % n).cloned()
}

/// What the step changed in what `side` must hold: a version committed
/// (at most one, only by a backup or copy), a forgotten one gone (only
/// the one forgotten); anything else is an error.
fn account(
    side: &mut Side,
    before: &[SnapshotId],
    op: Op,
    made: Option<Tree>,
    i: usize,
) -> std::result::Result<(), String> {
    let after = side.listed()?;
    let new: Vec<&SnapshotId> = after.iter().filter(|id| !before.contains(id)).collect();
    let gone: Vec<&SnapshotId> = before.iter().filter(|id| !after.contains(id)).collect();
    match (new.as_slice(), made) {
        ([], _) => {}
        // Committed, whether or not the step failed after its commit.
        ([id], Some(t)) => {
            side.versions.insert((*id).clone(), t);
        }
        _ => return Err(format!("step {i} {op:?}: unexpected new versions {new:?}")),
    }
    for id in gone {
        if !matches!(op, Op::Forget { .. }) || side.versions.remove(id).is_none() {
            return Err(format!("step {i} {op:?}: version {id} vanished"));
        }
    }
    Ok(())
}

/// Every listed version restores to its tree, and check reads all clean.
/// Returns the versions restored.
fn verify(side: &Side, work: &Path, i: usize) -> std::result::Result<usize, String> {
    let at = |what: &str, e: &dyn std::fmt::Display| format!("after step {i}: {what}: {e}");
    let rep = check(
        &side.repo,
        &CheckOptions {
            read_data: true,
            ..Default::default()
        },
    )
    .map_err(|e| at("check", &e))?;
    if !rep.errors.is_empty() {
        return Err(at("check", &rep.errors.join("; ")));
    }
    for (id, tree) in &side.versions {
        let target: PathBuf = work.join(format!("r{i}-{id}"));
        let s = side.repo.load_snapshot(id).map_err(|e| at("load", &e))?;
        let recipe = side
            .repo
            .load_recipe(&s.recipe)
            .map_err(|e| at("recipe", &e))?;
        restore(&side.repo, &s, &recipe, &RestoreOptions::new(&target))
            .map_err(|e| at(&format!("restore {id}"), &e))?;
        let got = read_tree(&target).map_err(|e| at("read", &e))?;
        let _ = std::fs::remove_dir_all(&target);
        if &got != tree {
            return Err(at(&format!("version {id}"), &"restores other content"));
        }
    }
    Ok(side.versions.len())
}

/// Changes the tree: by `seed`, a file rewritten or edited in place (a
/// few bytes changed, a few inserted: what deltas store), one added, one
/// removed.
fn change(tree: &mut Tree, seed: u8, i: usize) {
    let mut x = u64::from(seed) << 32 | i as u64;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let name = format!("f{}", next() % 6);
    if seed % 3 == 1 {
        if let Some(old) = tree.get(&name).filter(|d| d.len() > 64) {
            let mut data = old.clone();
            for _ in 0..3 {
                let at = (next() % data.len() as u64) as usize;
                data[at] ^= 0x5a;
            }
            let at = (next() % data.len() as u64) as usize;
            data.splice(at..at, (0..10).map(|_| next() as u8));
            tree.insert(name, data);
            return;
        }
    }
    let len = (next() % 40_000) as usize;
    let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
    // Half the files share a prefix with another: duplicates across files.
    if seed.is_multiple_of(2) {
        if let Some(other) = tree.values().next() {
            data.splice(0..0, other.iter().take(16_000).copied());
        }
    }
    tree.insert(name, data);
    if seed.is_multiple_of(5) && tree.len() > 1 {
        let gone = format!("f{}", next() % 6);
        tree.remove(&gone);
    }
}

fn write_tree(src: &Path, tree: &Tree) -> Result<()> {
    let io = |e| crate::error::StoreError::io("write", src.display().to_string(), e);
    for e in std::fs::read_dir(src).map_err(io)? {
        std::fs::remove_file(e.map_err(io)?.path()).map_err(io)?;
    }
    for (name, data) in tree {
        std::fs::write(src.join(name), data).map_err(io)?;
    }
    Ok(())
}

/// The files below `target` (a restore puts them at their absolute path),
/// by name.
fn read_tree(target: &Path) -> std::io::Result<Tree> {
    let mut out = Tree::new();
    let mut stack = vec![target.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path())?,
                );
            }
        }
    }
    Ok(out)
}
