//! Model-based property test: random trees, random edits, backups, forgets,
//! gc runs and index repairs. After every step every retained version must
//! restore byte-exact to the tree it captured, and `check --read-data` must
//! be clean.

mod common;

use common::backup_with_lifecycle as backup;
use common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use strata_core::chunker::ChunkerParams;
use strata_core::id::{RecipeId, SnapshotId};
use strata_store::ops::backup::BackupOptions;
use strata_store::ops::forget::forget;
use strata_store::ops::gc::compact::mark_live;
use strata_store::ops::gc::{gc, repair_index, GcOptions};
use strata_store::repo::index::RepoIndex;
use strata_store::Repository;

const DIRS: &[&str] = &["", "d1", "d1/d2", "d3"];
const MAX_FILE: usize = 200 << 10;

/// A piece of file content.
#[derive(Clone, Debug)]
enum Piece {
    Random {
        seed: u64,
        len: usize,
    },
    /// A short random pattern repeated.
    Pattern {
        seed: u64,
        period: usize,
        len: usize,
    },
    Zeros {
        len: usize,
    },
    /// A slice of another (existing) file.
    CopyOf {
        src: Index,
        start: Index,
        len: usize,
    },
}

#[derive(Clone, Debug)]
enum Edit {
    /// Overwrite bytes in place (size unchanged).
    Modify {
        file: Index,
        pos: Index,
        len: usize,
        seed: u64,
    },
    Insert {
        file: Index,
        pos: Index,
        piece: Piece,
    },
    Append {
        file: Index,
        piece: Piece,
    },
    Truncate {
        file: Index,
        to: Index,
    },
    Delete {
        file: Index,
    },
    Add {
        dir: Index,
        pieces: Vec<Piece>,
    },
    Duplicate {
        file: Index,
        dir: Index,
    },
}

#[derive(Clone, Debug)]
enum Step {
    Backup {
        edits: Vec<Edit>,
        fixed: Option<bool>,
        force_read: bool,
        threads: usize,
    },
    /// Edits, then a backup that fails: the disk fills after `budget`
    /// bytes, or the process dies after `crash` writes.
    FailedBackup {
        edits: Vec<Edit>,
        budget: Option<u64>,
        crash: u64,
    },
    Forget(Index),
    Gc(f64),
    /// gc killed after `crash` writes. Deleting a container's data and
    /// metadata objects counts as one write: the gap between the two is a
    /// known bug (see faults.rs `interrupted_gc_between_data_and_meta_delete`).
    InterruptedGc {
        threshold: f64,
        crash: u64,
    },
    Repair,
}

#[derive(Clone, Debug)]
struct Case {
    encrypted: bool,
    /// Index strategy of the repository.
    index: &'static str,
    /// 0 = CDC, 1 = fixed, 2 = mixed per backup.
    chunking: u8,
    files: Vec<(Index, Vec<Piece>)>,
    steps: Vec<Step>,
}

fn piece_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        3 => 1..4096usize,
        4 => 4096..72_000usize,
    ]
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        3 => (any::<u64>(), piece_len()).prop_map(|(seed, len)| Piece::Random { seed, len }),
        2 => (any::<u64>(), 1..64usize, piece_len())
            .prop_map(|(seed, period, len)| Piece::Pattern { seed, period, len }),
        1 => piece_len().prop_map(|len| Piece::Zeros { len }),
        2 => (any::<Index>(), any::<Index>(), piece_len())
            .prop_map(|(src, start, len)| Piece::CopyOf { src, start, len }),
    ]
}

fn pieces() -> impl Strategy<Value = Vec<Piece>> {
    prop::collection::vec(piece(), 1..4)
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<Index>(), 1..5000usize, any::<u64>())
            .prop_map(|(file, pos, len, seed)| Edit::Modify { file, pos, len, seed }),
        2 => (any::<Index>(), any::<Index>(), piece())
            .prop_map(|(file, pos, piece)| Edit::Insert { file, pos, piece }),
        2 => (any::<Index>(), piece()).prop_map(|(file, piece)| Edit::Append { file, piece }),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(file, to)| Edit::Truncate { file, to }),
        1 => any::<Index>().prop_map(|file| Edit::Delete { file }),
        2 => (any::<Index>(), pieces()).prop_map(|(dir, pieces)| Edit::Add { dir, pieces }),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(file, dir)| Edit::Duplicate { file, dir }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (
            prop::collection::vec(edit(), 0..5),
            prop_oneof![Just(None), Just(Some(false)), Just(Some(true))],
            prop::bool::weighted(0.15),
            1..4usize,
        )
            .prop_map(|(edits, fixed, force_read, threads)| Step::Backup {
                edits,
                fixed,
                force_read,
                threads,
            }),
        1 => (
            prop::collection::vec(edit(), 0..3),
            prop_oneof![Just(None), (0..1_500_000u64).prop_map(Some)],
            0..40u64,
        )
            .prop_map(|(edits, budget, crash)| Step::FailedBackup {
                edits,
                budget,
                crash,
            }),
        2 => any::<Index>().prop_map(Step::Forget),
        2 => (0.0..0.9f64).prop_map(Step::Gc),
        1 => (0.0..0.9f64, 0..30u64)
            .prop_map(|(threshold, crash)| Step::InterruptedGc { threshold, crash }),
        1 => Just(Step::Repair),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::bool::weighted(0.3),
        prop::sample::select(vec!["exact", "segment", "silo", "binning"]),
        0..3u8,
        prop::collection::vec((any::<Index>(), pieces()), 1..16),
        prop::collection::vec(step(), 2..7),
    )
        .prop_map(|(encrypted, index, chunking, files, steps)| Case {
            encrypted,
            index,
            chunking,
            files,
            steps,
        })
}

/// Builds the bytes of some pieces; `CopyOf` draws from `existing`.
fn build(pieces: &[Piece], existing: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        let room = MAX_FILE.saturating_sub(out.len());
        match p {
            Piece::Random { seed, len } => out.extend(random_bytes(*seed, (*len).min(room))),
            Piece::Pattern { seed, period, len } => {
                let pat = random_bytes(*seed, *period);
                out.extend(pat.iter().cycle().take((*len).min(room)));
            }
            Piece::Zeros { len } => out.extend(std::iter::repeat_n(0u8, (*len).min(room))),
            Piece::CopyOf { src, start, len } => {
                let files: Vec<&Vec<u8>> = existing.values().filter(|v| !v.is_empty()).collect();
                if files.is_empty() {
                    out.extend(random_bytes(*len as u64, (*len).min(room)));
                } else {
                    let f = src.get(&files);
                    let s = start.index(f.len());
                    let e = (s + (*len).min(room)).min(f.len());
                    out.extend_from_slice(&f[s..e]);
                }
            }
        }
    }
    out
}

struct World {
    src: std::path::PathBuf,
    model: BTreeMap<String, Vec<u8>>,
    next_name: usize,
}

impl World {
    fn pick(&self, i: &Index) -> Option<String> {
        let names: Vec<&String> = self.model.keys().collect();
        if names.is_empty() {
            None
        } else {
            Some(i.get(&names).to_string())
        }
    }

    fn new_name(&mut self, dir: &Index) -> String {
        let d = dir.get(DIRS);
        self.next_name += 1;
        if d.is_empty() {
            format!("f{}", self.next_name)
        } else {
            format!("{d}/f{}", self.next_name)
        }
    }

    fn write(&mut self, name: &str, data: Vec<u8>) {
        fs::write(self.src.join(name), &data).unwrap();
        self.model.insert(name.to_string(), data);
    }

    fn apply(&mut self, e: &Edit) {
        let pick = |w: &World, i: &Index| w.pick(i);
        match e {
            Edit::Modify {
                file,
                pos,
                len,
                seed,
            } => {
                let Some(name) = pick(self, file) else { return };
                let cur = self.model.get_mut(&name).unwrap();
                if cur.is_empty() {
                    return;
                }
                let p = pos.index(cur.len());
                let n = (*len).min(cur.len() - p);
                let mut patch = random_bytes(*seed, n);
                // Make sure the content really changes.
                if patch[..] == cur[p..p + n] {
                    patch[0] ^= 0xff;
                }
                cur[p..p + n].copy_from_slice(&patch);
                // In place, keeping the inode and the size.
                let f = fs::OpenOptions::new()
                    .write(true)
                    .open(self.src.join(&name))
                    .unwrap();
                f.write_all_at(&patch, p as u64).unwrap();
            }
            Edit::Insert { file, pos, piece } => {
                let Some(name) = pick(self, file) else { return };
                let ins = build(std::slice::from_ref(piece), &self.model);
                let cur = &self.model[&name];
                let p = pos.index(cur.len() + 1);
                let mut v = cur[..p].to_vec();
                v.extend_from_slice(&ins);
                v.extend_from_slice(&cur[p..]);
                self.write(&name, v);
            }
            Edit::Append { file, piece } => {
                let Some(name) = pick(self, file) else { return };
                let add = build(std::slice::from_ref(piece), &self.model);
                let mut v = self.model[&name].clone();
                v.extend_from_slice(&add);
                self.write(&name, v);
            }
            Edit::Truncate { file, to } => {
                let Some(name) = pick(self, file) else { return };
                let cur = self.model.get_mut(&name).unwrap();
                let n = to.index(cur.len() + 1);
                cur.truncate(n);
                let f = fs::OpenOptions::new()
                    .write(true)
                    .open(self.src.join(&name))
                    .unwrap();
                f.set_len(n as u64).unwrap();
            }
            Edit::Delete { file } => {
                let Some(name) = pick(self, file) else { return };
                fs::remove_file(self.src.join(&name)).unwrap();
                self.model.remove(&name);
            }
            Edit::Add { dir, pieces } => {
                let data = build(pieces, &self.model);
                let name = self.new_name(dir);
                self.write(&name, data);
            }
            Edit::Duplicate { file, dir } => {
                let Some(name) = pick(self, file) else { return };
                let data = self.model[&name].clone();
                let new = self.new_name(dir);
                self.write(&new, data);
            }
        }
    }

    fn tree(&self) -> Tree {
        Tree {
            files: self.model.clone(),
            dirs: DIRS
                .iter()
                .filter(|d| !d.is_empty())
                .map(|d| d.to_string())
                .collect(),
            symlinks: Default::default(),
        }
    }
}

/// After gc with `threshold`, no container holds only dead chunks and none
/// has a dead fraction above the threshold (liveness by location: the
/// chunks direct references point at).
fn assert_gc_invariant(repo: &Repository, threshold: f64, what: &str) {
    let live = mark_live(repo).unwrap();
    let mut metas = Vec::new();
    RepoIndex::load(repo, |m| metas.push(m.clone())).unwrap();
    for m in &metas {
        let raw = m.raw_bytes().max(1);
        let marks = live.get(&m.id);
        let live_bytes: u64 = m
            .chunks
            .iter()
            .filter(|c| marks.is_some_and(|s| s.contains(&(c.region, c.offset))))
            .map(|c| c.len as u64)
            .sum();
        assert!(
            live_bytes > 0,
            "{what}: container {} kept with no live chunk",
            m.id
        );
        let dead = (raw - live_bytes) as f64 / raw as f64;
        assert!(
            dead <= threshold + 1e-9,
            "{what}: container {} has {dead:.3} dead after gc with threshold {threshold}",
            m.id
        );
    }
}

fn verify(
    repo: &Repository,
    versions: &HashMap<SnapshotId, (RecipeId, Tree)>,
    src: &Path,
    scratch: &Path,
    what: &str,
) {
    let listed: HashSet<SnapshotId> = repo
        .list_snapshots()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let expected: HashSet<SnapshotId> = versions.keys().cloned().collect();
    assert_eq!(listed, expected, "{what}: snapshot list");
    for (id, (_, tree)) in versions {
        assert_restores(
            repo,
            id,
            src,
            scratch,
            tree,
            &format!("{what}: snapshot {id}"),
        );
    }
    assert_check_ok(repo, true, what);
}

fn run_case(c: &Case) {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    let src = tmp.path().join("src");
    let scratch = tmp.path().join("scratch");
    fs::create_dir_all(&scratch).unwrap();
    let fb = FaultBackend::new(&repo_dir);
    let mut opts = small_init(c.encrypted);
    opts.index = c.index.into();
    let repo = Repository::init(fb.clone(), opts).unwrap();

    let mut w = World {
        src: src.clone(),
        model: BTreeMap::new(),
        next_name: 0,
    };
    for d in DIRS {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for (dir, pieces) in &c.files {
        let data = build(pieces, &w.model);
        let name = w.new_name(dir);
        w.write(&name, data);
    }

    let repo_chunker = repo.config().chunker;
    let chunker_for = |fixed: Option<bool>| -> Option<ChunkerParams> {
        match (c.chunking, fixed) {
            (0, _) => None,
            (1, _) => Some(ChunkerParams::fixed()),
            (_, None) => None,
            (_, Some(false)) => Some(repo_chunker),
            (_, Some(true)) => Some(ChunkerParams::fixed()),
        }
    };

    let mut versions: HashMap<SnapshotId, (RecipeId, Tree)> = HashMap::new();
    let mut order: Vec<SnapshotId> = Vec::new();
    let do_backup = |w: &World,
                     fixed: Option<bool>,
                     force_read: bool,
                     threads: usize,
                     versions: &mut HashMap<SnapshotId, (RecipeId, Tree)>,
                     order: &mut Vec<SnapshotId>,
                     what: &str| {
        let expected = w.tree();
        assert_eq!(read_tree(&src), expected, "{what}: test model out of sync");
        let r = backup(
            &repo,
            BackupOptions {
                paths: vec![src.clone()],
                series: Some("prop".into()),
                chunker: chunker_for(fixed),
                force_read,
                threads,
                // Every other thread count sends every file through the
                // block pipeline that large files take.
                large_file: if threads.is_multiple_of(2) {
                    0
                } else {
                    BackupOptions::default().large_file
                },
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{what}: backup failed: {e}"));
        assert!(r.warnings.is_empty(), "{what}: warnings {:?}", r.warnings);
        if std::env::var_os("PROP_VERBOSE").is_some() {
            eprintln!(
                "{what}: {} files, {} bytes, {} read, {} new chunks, {} reused files",
                expected.files.len(),
                expected.files.values().map(|v| v.len()).sum::<usize>(),
                r.snapshot.stats.read_bytes,
                r.snapshot.stats.new_chunks,
                r.reused_files
            );
        }
        versions.insert(r.id.clone(), (r.snapshot.recipe.clone(), expected));
        order.push(r.id);
    };

    do_backup(
        &w,
        None,
        false,
        2,
        &mut versions,
        &mut order,
        "initial backup",
    );
    verify(&repo, &versions, &src, &scratch, "after initial backup");

    for (i, s) in c.steps.iter().enumerate() {
        let what = format!("step {i} ({s:?})");
        if std::env::var_os("PROP_VERBOSE").is_some() {
            eprintln!("step {i}: {}", what.chars().take(120).collect::<String>());
        }
        match s {
            Step::Backup {
                edits,
                fixed,
                force_read,
                threads,
            } => {
                for e in edits {
                    w.apply(e);
                }
                do_backup(
                    &w,
                    *fixed,
                    *force_read,
                    *threads,
                    &mut versions,
                    &mut order,
                    &what,
                );
            }
            Step::FailedBackup {
                edits,
                budget,
                crash,
            } => {
                for e in edits {
                    w.apply(e);
                }
                let expected = w.tree();
                {
                    let mut f = fb.faults();
                    match budget {
                        Some(b) => f.budget = Some(*b),
                        None => f.mutations_left = Some(*crash),
                    }
                }
                let r = backup(
                    &repo,
                    BackupOptions {
                        paths: vec![src.clone()],
                        series: Some("prop".into()),
                        chunker: chunker_for(None),
                        // Crashes inside the block pipeline.
                        large_file: 0,
                        ..Default::default()
                    },
                );
                fb.heal();
                if budget.is_some() {
                    let locks = object_names(fb.as_ref(), "locks/");
                    assert!(locks.is_empty(), "{what}: locks left: {locks:?}");
                } else {
                    // The dead process' lock stays behind; remove it.
                    strata_store::repo::lock::unlock(&repo, true).unwrap();
                }
                // With enough room (or a late crash) the backup commits.
                if let Ok(r) = r {
                    versions.insert(r.id.clone(), (r.snapshot.recipe.clone(), expected));
                    order.push(r.id);
                }
            }
            Step::Forget(idx) => {
                if order.is_empty() {
                    continue;
                }
                let id = order.remove(idx.index(order.len()));
                forget(&repo, &[id.to_string()])
                    .unwrap_or_else(|e| panic!("{what}: forget failed: {e}"));
                versions.remove(&id);
            }
            Step::Gc(threshold) => {
                gc(
                    &repo,
                    &GcOptions {
                        threshold: *threshold,
                        ..Default::default()
                    },
                )
                .unwrap_or_else(|e| panic!("{what}: gc failed: {e}"));
                assert_gc_invariant(&repo, *threshold, &what);
            }
            Step::InterruptedGc { threshold, crash } => {
                {
                    let mut f = fb.faults();
                    f.mutations_left = Some(*crash);
                    f.atomic_container_delete = true;
                }
                let r = gc(
                    &repo,
                    &GcOptions {
                        threshold: *threshold,
                        ..Default::default()
                    },
                );
                fb.heal();
                fb.faults().atomic_container_delete = false;
                strata_store::repo::lock::unlock(&repo, true).unwrap();
                if r.is_ok() {
                    assert_gc_invariant(&repo, *threshold, &what);
                }
            }
            Step::Repair => {
                let (_, problems) =
                    repair_index(&repo).unwrap_or_else(|e| panic!("{what}: repair failed: {e}"));
                assert!(problems.is_empty(), "{what}: repair problems {problems:?}");
            }
        }
        verify(&repo, &versions, &src, &scratch, &what);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES overrides the default for longer bug hunts.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(24),
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_histories_restore_exactly(c in case()) {
        run_case(&c);
    }
}
