//! Fault injection and failure handling: full disks, corrupted reads,
//! interrupted commands, wrong passwords, unknown formats, locks, and gc
//! copy-forward.

mod common;

use common::backup_with_lifecycle as backup;
use common::*;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_core::crypto::{Kind, Sealer};
use strata_core::format::{encode_lock, LockInfo, RepoConfig, REPO_FORMAT_VERSION};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::CoreError;
use strata_store::ops::backup::{BackupOptions, BackupReport};
use strata_store::ops::check::{check, CheckOptions, CheckReport};
use strata_store::ops::forget::forget;
use strata_store::ops::gc::{gc, GcOptions};
use strata_store::ops::restore::{restore, RestoreOptions};
use strata_store::repo::data_name;
use strata_store::repo::index::RepoIndex;
use strata_store::repo::lock;
use strata_store::{Backend, LocalBackend, Repository, Result, StoreError};

// ---------------------------------------------------------------------------
// Scenario helpers.

struct Env {
    tmp: tempfile::TempDir,
    src: PathBuf,
    scratch: PathBuf,
}

impl Env {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let scratch = tmp.path().join("scratch");
        fs::create_dir_all(&src).unwrap();
        fs::create_dir_all(&scratch).unwrap();
        Env { tmp, src, scratch }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn write(&self, name: &str, data: &[u8]) {
        let p = self.src.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }

    fn tree(&self) -> Tree {
        read_tree(&self.src)
    }

    fn backup(&self, repo: &Repository) -> Result<BackupReport> {
        backup(
            repo,
            BackupOptions {
                paths: vec![self.src.clone()],
                series: Some("faults".into()),
                ..Default::default()
            },
        )
    }

    /// Backs up and returns (snapshot id, recipe id, tree).
    fn version(&self, repo: &Repository) -> Version {
        let tree = self.tree();
        let r = self
            .backup(repo)
            .unwrap_or_else(|e| panic!("backup failed: {e}"));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        Version {
            id: r.id,
            recipe: r.snapshot.recipe,
            tree,
        }
    }

    fn assert_versions(&self, repo: &Repository, versions: &[Version], what: &str) {
        for v in versions {
            assert_restores(
                repo,
                &v.id,
                &self.src,
                &self.scratch,
                &v.tree,
                &format!("{what}: snapshot {}", v.id),
            );
        }
    }
}

#[derive(Clone, Debug)]
struct Version {
    id: SnapshotId,
    recipe: RecipeId,
    tree: Tree,
}

fn check_report(repo: &Repository, read_data: bool) -> CheckReport {
    check(
        repo,
        &CheckOptions {
            read_data,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("check failed to run: {e}"))
}

/// A tree of a few files with shared and unique content.
fn populate(env: &Env, seed: u64) {
    env.write("a.bin", &random_bytes(seed, 150_000));
    env.write("sub/b.bin", &random_bytes(seed + 1, 90_000));
    let mut c = random_bytes(seed + 2, 40_000);
    c.extend(std::iter::repeat_n(0u8, 30_000));
    c.extend(random_bytes(seed, 50_000));
    env.write("sub/c.bin", &c);
    env.write("empty", b"");
}

/// Changes part of the tree.
fn mutate(env: &Env, seed: u64) {
    let p = env.src.join("a.bin");
    let mut a = fs::read(&p).unwrap();
    let at = (seed as usize * 7919) % a.len();
    a.splice(at..at, random_bytes(seed, 3000));
    fs::write(&p, a).unwrap();
    env.write(&format!("new{seed}.bin"), &random_bytes(seed * 31, 60_000));
    // Overwrite a block of a file with unique content, so that the chunks
    // it replaces die when this version's predecessors are forgotten.
    let p = env.src.join("sub/b.bin");
    let mut b = fs::read(&p).unwrap();
    let at = ((seed as usize * 3) % 10) * 8192;
    b[at..at + 8192].copy_from_slice(&random_bytes(seed + 5000, 8192));
    fs::write(&p, b).unwrap();
}

fn assert_no_locks(backend: &dyn Backend, what: &str) {
    let l = object_names(backend, "locks/");
    assert!(l.is_empty(), "{what}: locks left behind: {l:?}");
}

// ---------------------------------------------------------------------------
// a. Disk full.

/// Checks the state after a failed backup: no lock, no new snapshot, check
/// clean, every committed version restores.
fn assert_intact(
    env: &Env,
    fb: &FaultBackend,
    repo: &Repository,
    versions: &[Version],
    what: &str,
) {
    assert_no_locks(fb, what);
    assert_eq!(
        repo.list_snapshots().unwrap().len(),
        versions.len(),
        "{what}: a failed backup committed a snapshot"
    );
    let rep = check_report(repo, true);
    assert!(rep.ok(), "{what}: check errors {:?}", rep.errors);
    env.assert_versions(repo, versions, what);
}

/// Container objects (data and metadata) no index object lists.
fn unindexed_containers(fb: &FaultBackend, repo: &Repository) -> Vec<String> {
    let idx = RepoIndex::load_summaries(repo).unwrap();
    let mut names: Vec<String> = ["data/", "meta/"]
        .iter()
        .flat_map(|p| fb.list(p).unwrap())
        .map(|o| o.name)
        .filter(|n| {
            let id = n.rsplit('/').next().unwrap();
            !idx.containers.keys().any(|c| c.to_string() == id)
        })
        .collect();
    names.sort();
    names
}

/// Backups that run out of space at different points fail, leave every
/// committed version intact, and the next backup (with space again)
/// succeeds.
#[test]
fn disk_full_during_backup_is_recoverable() {
    let env = Env::new();
    let fb = FaultBackend::new(&env.path("repo"));
    let repo = Repository::init(fb.clone(), small_init(false)).unwrap();
    populate(&env, 1);
    let mut versions = vec![env.version(&repo)];
    mutate(&env, 2);
    versions.push(env.version(&repo));

    // A large new file: many containers.
    env.write("big.bin", &random_bytes(99, 1_500_000));
    mutate(&env, 3);

    // The disk fills after some bytes.
    for budget in [0u64, 200, 20_000, 300_000, 700_000, 1_200_000, 1_520_000] {
        let what = format!("budget {budget}");
        fb.faults().budget = Some(budget);
        let r = env.backup(&repo);
        fb.heal();
        if r.is_ok() {
            panic!("{what}: backup succeeded on a full disk");
        }
        assert_intact(&env, &fb, &repo, &versions, &what);
        // What the failed backup wrote is gone with it (no index object
        // listed its containers yet): nothing waits for gc.
        assert_eq!(
            unindexed_containers(&fb, &repo),
            Vec::<String>::new(),
            "{what}"
        );
    }

    // The disk is full when a given kind of object is written. Outside the
    // container writer (see `disk_full_error_is_not_masked_by_worker_error`
    // for that one) the error says so.
    for prefix in [
        "locks/",
        "data/",
        "meta/",
        "index/",
        "isum/",
        "recipes/",
        "snapshots/",
    ] {
        let what = format!("full when writing {prefix}");
        fb.faults().full_for = Some(prefix);
        let r = env.backup(&repo);
        fb.heal();
        let e = match r {
            Ok(_) => panic!("{what}: backup succeeded on a full disk"),
            Err(e) => e,
        };
        if !matches!(prefix, "data/" | "meta/") {
            let msg = e.to_string();
            assert!(
                matches!(&e, StoreError::DiskFull(n) if n.starts_with(prefix)),
                "{what}: expected DiskFull naming a {prefix} object, got {e:?}"
            );
            assert!(
                msg.contains("disk") && msg.contains("full"),
                "{what}: error does not say the disk is full: {msg}"
            );
        }
        assert_intact(&env, &fb, &repo, &versions, &what);
        // Until its index object is written, a failed backup's containers
        // are known to nobody else and are deleted; after, gc's.
        if matches!(prefix, "locks/" | "data/" | "meta/" | "index/") {
            assert_eq!(
                unindexed_containers(&fb, &repo),
                Vec::<String>::new(),
                "{what}"
            );
        }
    }

    versions.push(env.version(&repo));
    env.assert_versions(&repo, &versions, "after recovery");
    // Leftovers of the failed attempts are garbage; gc removes them.
    gc(&repo, &GcOptions::default()).unwrap();
    let rep = check_report(&repo, true);
    assert!(rep.ok(), "{:?}", rep.errors);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    env.assert_versions(&repo, &versions, "after gc");
}

/// The disk fills while the container writer is storing the first of many
/// containers: the error reported must be the disk-full one, not the
/// follow-on "container writer stopped" of the workers.
#[test]
fn disk_full_error_is_not_masked_by_worker_error() {
    let env = Env::new();
    let fb = FaultBackend::new(&env.path("repo"));
    let repo = Repository::init(fb.clone(), small_init(false)).unwrap();
    populate(&env, 1);
    env.version(&repo);
    env.write("big.bin", &random_bytes(5, 3_000_000));
    // Room for the lock, not for a container.
    fb.faults().budget = Some(10_000);
    let r = env.backup(&repo);
    fb.heal();
    match r {
        Err(StoreError::DiskFull(name)) => assert!(name.starts_with("data/"), "{name}"),
        Err(e) => panic!("expected DiskFull, got: {e} ({e:?})"),
        Ok(_) => panic!("backup succeeded on a full disk"),
    }
}

/// A repository with two versions of one big file, the first forgotten, so
/// that gc with threshold 0 rewrites every container.
fn half_dead_repo(env: &Env, fb: &Arc<FaultBackend>) -> (Repository, Vec<Version>) {
    let repo = Repository::init(fb.clone(), small_init(false)).unwrap();
    let mut versions = Vec::new();
    env.write("big.bin", &random_bytes(5, 2_000_000));
    versions.push(env.version(&repo));
    // Rewrite every other 64 KiB block, so every container is half dead
    // once the first version is forgotten.
    let mut big = fs::read(env.src.join("big.bin")).unwrap();
    for (i, blk) in big.chunks_mut(64 << 10).enumerate() {
        if i % 2 == 0 {
            blk.copy_from_slice(&random_bytes(1000 + i as u64, blk.len()));
        }
    }
    env.write("big.bin", &big);
    versions.push(env.version(&repo));
    forget(&repo, &[versions[0].id.to_string()]).unwrap();
    versions.remove(0);
    (repo, versions)
}

fn gc0(repo: &Repository) -> Result<strata_store::ops::gc::GcReport> {
    gc(
        repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
}

/// gc's copy-forward runs out of space: nothing is lost, and gc succeeds
/// once there is space.
#[test]
fn disk_full_during_gc_is_harmless() {
    let env = Env::new();
    let fb = FaultBackend::new(&env.path("repo"));
    let (repo, versions) = half_dead_repo(&env, &fb);
    for (budget, prefix) in [
        (Some(0), None),
        (Some(10_000), None),
        (Some(600_000), None),
        (None, Some("data/")),
        (None, Some("meta/")),
        (None, Some("index/")),
        (None, Some("isum/")),
    ] {
        let what = format!("gc with budget {budget:?}, full for {prefix:?}");
        {
            let mut f = fb.faults();
            f.budget = budget;
            f.full_for = prefix;
        }
        let r = gc0(&repo);
        fb.heal();
        assert!(r.is_err(), "{what}: gc succeeded on a full disk");
        assert_no_locks(fb.as_ref(), &what);
        env.assert_versions(&repo, &versions, &what);
        let rep = check_report(&repo, true);
        assert!(rep.ok(), "{what}: {:?}", rep.errors);
    }
    let r = gc0(&repo).unwrap();
    assert!(r.containers_rewritten > 0);
    env.assert_versions(&repo, &versions, "after gc");
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");
}

/// gc's error on a full disk says the disk is full.
#[test]
fn disk_full_during_gc_is_reported() {
    let env = Env::new();
    let fb = FaultBackend::new(&env.path("repo"));
    let (repo, _) = half_dead_repo(&env, &fb);
    fb.faults().full_for = Some("data/");
    let r = gc0(&repo);
    fb.heal();
    match r {
        Err(StoreError::DiskFull(name)) => assert!(name.starts_with("data/"), "{name}"),
        Err(e) => panic!("expected DiskFull, got: {e} ({e:?})"),
        Ok(_) => panic!("gc succeeded on a full disk"),
    }
}

// ---------------------------------------------------------------------------
// b. Corrupted reads.

fn corrupted_read_is_reported(encrypted: bool) {
    let env = Env::new();
    let dir = env.path("repo");
    let repo = init_repo(&dir, encrypted);
    populate(&env, 11);
    let v = env.version(&repo);
    let recipe = repo.load_recipe(&v.recipe).unwrap();
    let victim = recipe.containers[0];
    let meta = strata_store::repo::container::read_meta(&repo, &victim).unwrap();
    let region = meta.regions[meta.regions.len() / 2];
    let name = data_name(&victim);

    let fb = FaultBackend::new(&dir);
    fb.faults().flip = Some((name.clone(), region.offset + region.stored_len as u64 / 2));
    let bad = open_repo(fb.clone());

    let target = tempfile::tempdir_in(&env.scratch).unwrap();
    let vsnap = bad.load_snapshot(&v.id).unwrap();
    match restore(&bad, &vsnap, &recipe, &RestoreOptions::new(target.path())) {
        Ok(_) => panic!("restore of a corrupted container succeeded"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&victim.to_hex()),
                "restore error does not name the object {name}: {msg}"
            );
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
        }
    }
    // dump too.
    let node = recipe
        .nodes
        .iter()
        .filter(|n| n.kind == strata_core::format::NodeKind::File)
        .find(|n| {
            n.segments.iter().any(|s| {
                s.chunks.iter().any(|c| {
                    !c.is_zero() && c.container == 0 && c.region as usize == meta.regions.len() / 2
                })
            })
        })
        .expect("a file with a chunk in the corrupted region");
    let snap = bad.load_snapshot(&v.id).unwrap();
    let e = strata_store::ops::restore::dump(&bad, &snap, &recipe, node, &mut std::io::sink())
        .expect_err("dump of a corrupted region succeeded");
    assert!(e.to_string().contains(&victim.to_hex()), "{e}");

    let rep = check_report(&bad, true);
    assert!(!rep.ok(), "check --read-data missed the corruption");
    assert!(
        rep.errors.iter().any(|e| e.contains(&name)),
        "check errors do not name {name}: {:?}",
        rep.errors
    );
    assert_eq!(rep.damaged_snapshots, vec![v.id.to_string()]);
    // Structure alone is fine.
    assert!(check_report(&bad, false).ok());

    // The data itself is intact: a healthy backend restores.
    env.assert_versions(&repo, std::slice::from_ref(&v), "healthy backend");
}

#[test]
fn corrupted_read_is_reported_plain() {
    corrupted_read_is_reported(false);
}

#[test]
fn corrupted_read_is_reported_encrypted() {
    corrupted_read_is_reported(true);
}

// ---------------------------------------------------------------------------
// c. Wrong password.

#[test]
fn wrong_password_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    init_repo(tmp.path(), true);
    let r = Repository::open(local(tmp.path()), &|| Ok(b"not the password".to_vec()));
    match r {
        Err(StoreError::Core(CoreError::WrongPassword)) => {}
        Err(e) => panic!("expected WrongPassword, got {e:?}"),
        Ok(_) => panic!("opened with a wrong password"),
    }
    // And the right one works.
    open_repo(local(tmp.path()));
}

// ---------------------------------------------------------------------------
// d. Unknown repository format.

fn rewrite_config(dir: &Path, f: impl FnOnce(&mut RepoConfig)) {
    let b = LocalBackend::new(dir);
    let raw = b.get("config").unwrap();
    let bytes = Sealer::plain(3).open(Kind::Config, &raw).unwrap();
    let mut cfg: RepoConfig = strata_core::format::decode_config(&bytes).unwrap();
    assert_eq!(cfg.format_version, REPO_FORMAT_VERSION);
    f(&mut cfg);
    let env = Sealer::plain(3)
        .seal(
            Kind::Config,
            &strata_core::format::encode_config(&cfg).unwrap(),
            false,
        )
        .unwrap();
    b.put("config", &env).unwrap();
}

#[test]
fn unknown_format_version_is_refused() {
    for encrypted in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        init_repo(tmp.path(), encrypted);
        rewrite_config(tmp.path(), |c| c.format_version = 99);
        let asked = std::sync::atomic::AtomicBool::new(false);
        let r = Repository::open(local(tmp.path()), &|| {
            asked.store(true, std::sync::atomic::Ordering::SeqCst);
            password()
        });
        let e = match r {
            Err(e) => e,
            Ok(_) => panic!("opened a format-99 repository"),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("99") && msg.contains("version"),
            "error does not mention the version: {msg}"
        );
        assert!(
            matches!(
                e,
                StoreError::Core(CoreError::UnknownVersion { found: 99, .. })
            ),
            "{e:?}"
        );
        assert!(
            !asked.load(std::sync::atomic::Ordering::SeqCst),
            "asked for a password before checking the format"
        );
    }

    // A structure version the build does not know (the byte before the
    // postcard encoding) is refused too.
    let tmp = tempfile::tempdir().unwrap();
    init_repo(tmp.path(), false);
    let b = LocalBackend::new(tmp.path());
    let raw = b.get("config").unwrap();
    let mut bytes = Sealer::plain(3).open(Kind::Config, &raw).unwrap();
    bytes[0] = 7;
    b.put(
        "config",
        &Sealer::plain(3).seal(Kind::Config, &bytes, false).unwrap(),
    )
    .unwrap();
    match Repository::open(local(tmp.path()), &password) {
        Err(e) => assert!(e.to_string().contains("version 7"), "{e}"),
        Ok(_) => panic!("opened a config with structure version 7"),
    }

    // A config that is not a config (kind byte) or is damaged.
    let tmp = tempfile::tempdir().unwrap();
    init_repo(tmp.path(), false);
    let b = LocalBackend::new(tmp.path());
    let mut raw = b.get("config").unwrap();
    let n = raw.len();
    raw[n / 2] ^= 1;
    b.put("config", &raw).unwrap();
    assert!(Repository::open(local(tmp.path()), &password).is_err());

    // No repository at all.
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        Repository::open(local(tmp.path()), &password),
        Err(StoreError::NoRepository(_))
    ));
}

// ---------------------------------------------------------------------------
// e. Locks.

fn put_lock(repo: &Repository, info: &LockInfo) -> String {
    let env = repo
        .sealer()
        .seal(Kind::Lock, &encode_lock(info).unwrap(), false)
        .unwrap();
    let mut id = [0u8; 16];
    strata_core::crypto::random_bytes(&mut id).unwrap();
    let name = format!("locks/{}", hex::encode(id));
    repo.backend().put(&name, &env).unwrap();
    name
}

fn expect_locked<T>(r: Result<T>, what: &str) -> (String, String) {
    match r {
        Err(StoreError::Locked { holder, hint }) => (holder, hint),
        Err(e) => panic!("{what}: expected Locked, got {e}"),
        Ok(_) => panic!("{what}: was not refused"),
    }
}

#[test]
fn locks_exclude_conflicting_commands() {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), false);
    populate(&env, 21);
    let v1 = env.version(&repo);
    let b = repo.backend().clone();

    // Exclusive lock held by a gc.
    let g = lock::acquire(&repo, true, "gc").unwrap();
    let r = gc(&repo, &GcOptions::default());
    let msg = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
    let (holder, hint) = expect_locked(r, "gc under gc");
    assert!(hint.contains("another gc is already running"), "{hint}");
    assert!(msg.contains("another gc is already running"), "{msg}");
    assert!(holder.contains(&std::process::id().to_string()), "{holder}");
    assert!(holder.contains("exclusive"), "{holder}");
    expect_locked(env.backup(&repo), "backup under gc");
    expect_locked(forget(&repo, &[v1.id.to_string()]), "forget under gc");
    expect_locked(check(&repo, &CheckOptions::default()), "check under gc");
    expect_locked(
        strata_store::ops::gc::repair_index(&repo),
        "repair under gc",
    );
    expect_locked(
        lock::acquire(&repo, false, "backup"),
        "shared under exclusive",
    );
    // Refused commands removed their own lock objects.
    assert_eq!(object_names(b.as_ref(), "locks/").len(), 1);
    assert_eq!(repo.list_snapshots().unwrap().len(), 1);
    drop(g);
    assert_no_locks(b.as_ref(), "after dropping the gc lock");

    // Shared lock held by a backup: more backups and checks may run, gc
    // and forget may not.
    let s = lock::acquire(&repo, false, "backup").unwrap();
    mutate(&env, 22);
    let v2 = env.version(&repo);
    assert!(check_report(&repo, false).ok());
    let (holder, hint) = expect_locked(
        gc(&repo, &GcOptions::default()),
        "gc under a running backup",
    );
    assert!(
        holder.contains("backup") && holder.contains("shared"),
        "{holder}"
    );
    assert!(!hint.contains("another gc"), "{hint}");
    expect_locked(forget(&repo, &[v1.id.to_string()]), "forget under backup");
    assert_eq!(object_names(b.as_ref(), "locks/").len(), 1);
    drop(s);
    gc(&repo, &GcOptions::default()).unwrap();
    assert_no_locks(b.as_ref(), "after gc");
    env.assert_versions(&repo, &[v1, v2], "after lock games");
}

#[test]
fn stale_locks_are_ignored_and_removed() {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), true);
    populate(&env, 31);
    let v1 = env.version(&repo);
    let b = repo.backend().clone();

    let dead = LockInfo {
        host: lock::hostname(),
        pid: 4_000_000,
        time: 1,
        exclusive: true,
        operation: "gc".into(),
        expires: 0,
    };
    assert!(lock::is_stale(&dead));
    let dead_name = put_lock(&repo, &dead);
    // Another host's lock without a lease cannot be judged: it counts.
    let foreign = LockInfo {
        host: "elsewhere.invalid".into(),
        pid: 4_000_000,
        time: 1,
        exclusive: false,
        operation: "backup".into(),
        expires: 0,
    };
    assert!(!lock::is_stale(&foreign));

    // The stale exclusive lock does not block anything.
    mutate(&env, 32);
    let v2 = env.version(&repo);
    gc(&repo, &GcOptions::default()).unwrap();
    assert!(check_report(&repo, true).ok());
    let g = lock::acquire(&repo, true, "gc").unwrap();
    drop(g);
    assert_eq!(object_names(b.as_ref(), "locks/"), vec![dead_name.clone()]);

    let foreign_name = put_lock(&repo, &foreign);
    expect_locked(
        gc(&repo, &GcOptions::default()),
        "gc under a foreign backup",
    );

    let removed = lock::unlock(&repo, false).unwrap();
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(removed[0].contains("4000000"), "{removed:?}");
    assert_eq!(object_names(b.as_ref(), "locks/"), vec![foreign_name]);
    let listed: Vec<LockInfo> = lock::list_locks(&repo)
        .unwrap()
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    assert_eq!(listed, vec![foreign.clone()]);

    // `unlock --all` removes the rest.
    let removed = lock::unlock(&repo, true).unwrap();
    assert_eq!(removed.len(), 1);
    assert_no_locks(b.as_ref(), "after unlock --all");
    gc(&repo, &GcOptions::default()).unwrap();
    env.assert_versions(&repo, &[v1, v2], "after unlock");
}

/// Leases: another host's lock counts until its lease ran out (allowing
/// for clock skew), then it is stale everywhere; a held lock is refreshed.
#[test]
fn lock_leases_expire_and_are_refreshed() {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), false);
    populate(&env, 33);
    env.version(&repo);
    let now = strata_store::repo::now_ns() / 1_000_000_000;
    let skew = lock::SKEW.as_secs() as i64;
    let foreign = |expires: i64| LockInfo {
        host: "elsewhere.invalid".into(),
        pid: 1,
        time: expires - 900,
        exclusive: true,
        operation: "gc".into(),
        expires,
    };
    // Running out a minute ago is within the skew allowed for its clock.
    let recent = put_lock(&repo, &foreign(now - 60));
    let (holder, _) = expect_locked(lock::acquire(&repo, false, "backup"), "a recent lease");
    assert!(holder.contains("lease ran out"), "{holder}");
    repo.backend().delete(&recent).unwrap();
    // Long run out: stale on this host as on any other.
    let old = foreign(now - skew - 60);
    assert!(lock::is_stale(&old));
    let old_name = put_lock(&repo, &old);
    gc(&repo, &GcOptions::default()).unwrap();
    assert_eq!(lock::unlock(&repo, false).unwrap().len(), 1);
    assert!(repo.backend().size(&old_name).unwrap().is_none());

    // A held lock's lease moves forward while it is held, and the lock
    // goes with its guard.
    let g = lock::acquire_with_lease(&repo, false, "backup", std::time::Duration::from_secs(3))
        .unwrap();
    let first = lock::list_locks(&repo).unwrap()[0].1.expires;
    // (Refreshed every second: looked at until it is, or for 30 s on a
    // machine slow enough to delay the refresher.)
    let t = std::time::Instant::now();
    let mut later = first;
    while later <= first && t.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        later = lock::list_locks(&repo).unwrap()[0].1.expires;
    }
    assert!(later > first, "refreshed: {first} -> {later}");
    drop(g);
    assert!(lock::list_locks(&repo).unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// f. gc copy-forward.

#[test]
fn gc_copy_forward_keeps_old_recipes_restorable() {
    for encrypted in [false, true] {
        gc_copy_forward(encrypted);
    }
}

fn gc_copy_forward(encrypted: bool) {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), encrypted);
    let b = repo.backend().clone();
    populate(&env, 41);
    let mut versions = Vec::new();
    for i in 0..8u64 {
        mutate(&env, 100 + i);
        if i % 3 == 2 {
            fs::remove_file(env.src.join(format!("new{}.bin", 100 + i - 1))).unwrap();
        }
        versions.push(env.version(&repo));
    }
    env.assert_versions(&repo, &versions, "before gc");
    // Forget every other version.
    let forgotten: Vec<String> = versions
        .iter()
        .step_by(2)
        .map(|v| v.id.to_string())
        .collect();
    forget(&repo, &forgotten).unwrap();
    versions.retain(|v| !forgotten.iter().any(|f| v.id == *f));
    let before: HashSet<String> = object_names(b.as_ref(), "data/").into_iter().collect();

    let r = gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.containers_rewritten > 0, "{r:?}");
    assert!(r.containers_written > 0, "{r:?}");
    assert!(r.bytes_freed > 0, "{r:?}");
    let after: HashSet<String> = object_names(b.as_ref(), "data/").into_iter().collect();
    // Retained recipes referenced containers that gc replaced: they were
    // rewritten to the copies, so none points at a vanished container.
    assert!(
        r.recipes_remapped > 0,
        "no retained recipe lost a container; test is too weak: {r:?}"
    );
    assert!(before.iter().any(|c| !after.contains(c)));
    for v in &versions {
        let s = repo.load_snapshot(&v.id).unwrap();
        let recipe = repo.load_recipe(&s.recipe).unwrap();
        for c in &recipe.containers {
            assert!(after.contains(&data_name(c)), "stale reference to {c}");
        }
    }
    env.assert_versions(&repo, &versions, "after copy-forward");
    let rep = check_report(&repo, true);
    assert!(rep.ok(), "{:?}", rep.errors);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);

    // A backup whose parent points at rewritten containers reuses its
    // unchanged files at their new locations.
    env.write("after-gc.bin", &random_bytes(77, 10_000));
    let r = env.backup(&repo).unwrap();
    assert!(r.reused_files > 0);
    versions.push(Version {
        id: r.id,
        recipe: r.snapshot.recipe,
        tree: env.tree(),
    });
    env.assert_versions(&repo, &versions, "after backup following gc");

    // Nothing left to rewrite.
    let r = gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.containers_rewritten, 0, "{r:?}");
    assert_eq!(r.containers_deleted, 0, "{r:?}");

    // Forget all but the newest; gc drops and rewrites again.
    let old: Vec<String> = versions[..versions.len() - 1]
        .iter()
        .map(|v| v.id.to_string())
        .collect();
    forget(&repo, &old).unwrap();
    versions.drain(..versions.len() - 1);
    gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    env.assert_versions(&repo, &versions, "after final gc");
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");

    // Forget everything: gc empties the repository.
    forget(&repo, &[versions[0].id.to_string()]).unwrap();
    gc(&repo, &GcOptions::default()).unwrap();
    assert!(object_names(b.as_ref(), "data/").is_empty());
    assert!(object_names(b.as_ref(), "meta/").is_empty());
    assert!(object_names(b.as_ref(), "index/").is_empty());
    assert!(object_names(b.as_ref(), "isum/").is_empty());
    assert!(object_names(b.as_ref(), "recipes/").is_empty());
}

// ---------------------------------------------------------------------------
// Interrupted commands: every prefix of a command's writes must leave the
// repository consistent.

/// Builds a repository with some history and returns it with its versions.
fn history(env: &Env, dir: &Path) -> Vec<Version> {
    let repo = init_repo(dir, false);
    populate(env, 51);
    let mut versions = Vec::new();
    for i in 0..4u64 {
        mutate(env, 200 + i);
        versions.push(env.version(&repo));
    }
    let gone: Vec<String> = vec![versions[0].id.to_string(), versions[2].id.to_string()];
    forget(&repo, &gone).unwrap();
    versions.retain(|v| !gone.iter().any(|g| v.id == *g));
    let plan = gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(plan.containers_rewritten > 0, "{plan:?}");
    versions
}

/// Runs `op` against a copy of `base` whose backend dies after `n`
/// mutations, then checks the survivors with a healthy backend. Returns
/// whether `op` completed.
fn crash_after(
    env: &Env,
    base: &Path,
    n: u64,
    atomic_container_delete: bool,
    versions: &[Version],
    op: &dyn Fn(&Repository) -> Result<()>,
) -> bool {
    let dir = env.path(&format!("crash-{n}"));
    copy_dir(base, &dir);
    let fb = FaultBackend::new(&dir);
    let repo = open_repo(fb.clone());
    {
        let mut f = fb.faults();
        f.mutations_left = Some(n);
        f.atomic_container_delete = atomic_container_delete;
    }
    let r = op(&repo);
    fb.heal();
    let what = format!("interrupted after {n} writes");
    let done = r.is_ok();
    // The dead process' lock stays behind; the user removes it.
    lock::unlock(&repo, true).unwrap();
    env.assert_versions(&repo, versions, &what);
    let rep = check_report(&repo, true);
    assert!(rep.ok(), "{what}: check errors {:?}", rep.errors);
    // gc cleans up whatever the interrupted command left.
    gc(&repo, &GcOptions::default()).unwrap_or_else(|e| panic!("{what}: gc failed: {e}"));
    env.assert_versions(&repo, versions, &format!("{what}, then gc"));
    let rep = check_report(&repo, true);
    assert!(rep.ok(), "{what}, then gc: {:?}", rep.errors);
    assert!(
        rep.warnings.is_empty(),
        "{what}, then gc: {:?}",
        rep.warnings
    );
    let _ = fs::remove_dir_all(&dir);
    done
}

#[test]
fn interrupted_backup_leaves_repository_consistent() {
    let env = Env::new();
    let base = env.path("base");
    let versions = history(&env, &base);
    env.write("big.bin", &random_bytes(61, 900_000));
    mutate(&env, 62);
    let next = env.tree();
    let mut n = 0;
    loop {
        let done = crash_after(&env, &base, n, false, &versions, &|repo| {
            env.backup(repo).map(|_| ())
        });
        if done {
            break;
        }
        n += 1;
        assert!(n < 200, "backup never completes");
    }
    assert!(n > 5, "backup made only {n} writes");
    // The complete backup is restorable.
    let dir = env.path("final");
    copy_dir(&base, &dir);
    let repo = open_repo(local(&dir));
    let r = env.backup(&repo).unwrap();
    let mut all = versions.clone();
    all.push(Version {
        id: r.id,
        recipe: r.snapshot.recipe,
        tree: next,
    });
    env.assert_versions(&repo, &all, "complete backup");
}

fn interrupted_gc(atomic_container_delete: bool) {
    let env = Env::new();
    let base = env.path("base");
    let versions = history(&env, &base);
    let mut n = 0;
    loop {
        let done = crash_after(
            &env,
            &base,
            n,
            atomic_container_delete,
            &versions,
            &|repo| gc0(repo).map(|_| ()),
        );
        if done {
            break;
        }
        n += 1;
        assert!(n < 500, "gc never completes");
    }
    assert!(n > 5, "gc made only {n} writes");
}

/// gc killed after any number of writes leaves every snapshot restorable
/// and the repository clean — if deleting a container's data and metadata
/// objects were one step (see the next test for the gap between them).
#[test]
fn interrupted_gc_leaves_repository_consistent() {
    interrupted_gc(true);
}

/// Same, killing gc also between deleting a container's data object and
/// its metadata object.
#[test]
fn interrupted_gc_between_data_and_meta_delete() {
    interrupted_gc(false);
}

/// Direct reproduction of the interrupted-gc problem: the data object of a
/// rewritten container is gone, its metadata object is not (gc died between
/// the two deletes). `check` says the repository is fine, restore fails.
#[test]
fn leftover_meta_object_of_rewritten_container() {
    let env = Env::new();
    let dir = env.path("repo");
    let versions = history(&env, &dir);
    let repo = open_repo(local(&dir));
    let metas_before: BTreeMap<String, Vec<u8>> = object_names(repo.backend().as_ref(), "meta/")
        .into_iter()
        .map(|n| {
            let v = repo.backend().get(&n).unwrap();
            (n, v)
        })
        .collect();
    gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    // Put back the meta objects gc deleted, as if it had died right after
    // deleting the data objects.
    let mut restored = 0;
    for (n, v) in &metas_before {
        if repo.backend().size(n).unwrap().is_none() {
            repo.backend().put(n, v).unwrap();
            restored += 1;
        }
    }
    assert!(restored > 0);
    let rep = check_report(&repo, true);
    assert!(rep.ok(), "{:?}", rep.errors);
    env.assert_versions(&repo, &versions, "with leftover meta objects");
}

// ---------------------------------------------------------------------------
// Index summaries (`isum/HASH` beside `index/HASH`).

/// A repository with the `segment` index strategy in `env`'s `repo`.
fn segment_repo(env: &Env, encrypted: bool) -> (PathBuf, Repository) {
    let dir = env.path("repo");
    let opts = strata_store::InitOptions {
        index: "segment".into(),
        ..small_init(encrypted)
    };
    let repo = Repository::init(local(&dir), opts).unwrap();
    (dir, repo)
}

/// A `segment` backup learns the index from the summaries alone (each
/// container's whole segments and their representatives): with every
/// index object damaged, a backup of the same tree under another series
/// (no parent to skip files with) still finds its segments.
#[test]
fn segment_backups_learn_the_index_from_summaries() {
    let env = Env::new();
    let (dir, repo) = segment_repo(&env, false);
    populate(&env, 3);
    let v1 = env.version(&repo);
    mutate(&env, 4);
    let v2 = env.version(&repo);
    let mut whole = Vec::new();
    RepoIndex::load(&repo, |m| whole.push((m.id, m.segment_summaries()))).unwrap();
    let mut summed = Vec::new();
    RepoIndex::load_segments(&repo, true, |c, s| summed.push((c.id, s.to_vec()))).unwrap();
    assert!(whole.iter().any(|(_, s)| !s.is_empty()), "no segments");
    assert_eq!(whole, summed);
    let b = repo.backend().clone();
    let saved: Vec<(String, Vec<u8>)> = object_names(b.as_ref(), "index/")
        .into_iter()
        .map(|n| {
            let v = b.get(&n).unwrap();
            (n, v)
        })
        .collect();
    for (n, v) in &saved {
        let mut bad = v.clone();
        let k = bad.len() / 2;
        bad[k] ^= 0xff;
        b.put(n, &bad).unwrap();
    }
    let again = open_repo(local(&dir));
    let r = backup(
        &again,
        BackupOptions {
            paths: vec![env.src.clone()],
            series: Some("elsewhere".into()),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("a segment backup read an index object: {e}"));
    // A segment like a stored one (found by a representative) stores
    // its chunks the stored one lacks, whichever that is: a few KB here.
    // Without the summaries' segments, everything would be new.
    let st = &r.snapshot.stats;
    assert!(st.read_bytes > 300_000, "{st:?}");
    assert!(st.new_raw_bytes * 10 < st.read_bytes, "{st:?}");
    for (n, v) in &saved {
        b.put(n, v).unwrap();
    }
    let rep = check_report(&again, true);
    assert!(rep.ok(), "{:?}", rep.errors);
    env.assert_versions(&again, &[v1, v2], "end");
}

/// A repository of an earlier build has summaries of version 1 (no
/// segments): a segment backup reads those index objects whole, and
/// stores their summaries again with segments, so the next one need not.
#[test]
fn a_backup_upgrades_summaries_without_segments() {
    use strata_core::format::{decode_index_summary, encode_index_summary};
    let env = Env::new();
    let (dir, repo) = segment_repo(&env, true);
    populate(&env, 3);
    let v1 = env.version(&repo);
    let b = repo.backend().clone();
    let sums = object_names(b.as_ref(), "isum/");
    assert!(!sums.is_empty());
    let has_segments = |n: &str| repo.read_index_summary(n).unwrap().segments.is_some();
    for n in &sums {
        assert!(has_segments(n), "{n}: written with segments");
        // What an earlier build wrote: version 1.
        let raw = repo
            .sealer()
            .open(Kind::IndexSummary, &b.get(n).unwrap())
            .unwrap();
        let mut s = decode_index_summary(&raw).unwrap();
        s.segments = None;
        let old = encode_index_summary(&s).unwrap();
        assert_eq!(old[0], 1);
        b.put(
            n,
            &repo.sealer().seal(Kind::IndexSummary, &old, true).unwrap(),
        )
        .unwrap();
        assert!(!has_segments(n));
    }
    // Two clients with local caches, which now hold the old summaries.
    let cached = |c: &str| open_repo(local(&dir)).with_cache(Some(env.path(c)));
    let (one, other) = (cached("cache-1"), cached("cache-2"));
    for r in [&one, &other] {
        RepoIndex::load_summaries(r).unwrap();
    }
    mutate(&env, 4);
    let v2 = env.version(&one);
    for n in &sums {
        assert!(has_segments(n), "{n}: upgraded by the backup");
    }
    // Neither reads an index object whole again: the one that upgraded
    // them dropped its cached copies, the other finds its copies old.
    for r in [&one, &other] {
        let idx = RepoIndex::load_segments(r, true, |_, _| {}).unwrap();
        assert!(idx.stale_summaries.is_empty());
    }
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");
    env.assert_versions(&repo, &[v1, v2], "end");
}

/// Every index object gets a summary, and the summaries say exactly what
/// the index objects say, after backups, gc and repair alike.
#[test]
fn index_summaries_mirror_index_objects() {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), true);
    let b = repo.backend().clone();
    let agree = |what: &str| {
        let index = object_names(b.as_ref(), "index/");
        let sums = object_names(b.as_ref(), "isum/");
        let want: Vec<String> = index
            .iter()
            .map(|n| strata_store::repo::index::summary_name(n))
            .collect();
        assert_eq!(sums, want, "{what}: one summary per index object");
        let full = RepoIndex::load(&repo, |_| {}).unwrap();
        let light = RepoIndex::load_summaries(&repo).unwrap();
        assert!(!full.containers.is_empty(), "{what}");
        assert_eq!(full.containers, light.containers, "{what}");
        assert_eq!(full.contents, light.contents, "{what}");
    };
    populate(&env, 3);
    let mut versions = vec![env.version(&repo)];
    agree("after the first backup");
    mutate(&env, 4);
    versions.push(env.version(&repo));
    agree("after the second backup");
    forget(&repo, &[versions[0].id.to_string()]).unwrap();
    versions.remove(0);
    gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    agree("after gc");
    strata_store::ops::gc::repair_index(&repo).unwrap();
    agree("after repair index");
    env.assert_versions(&repo, &versions, "end");
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");
}

/// SiLo and Extreme Binning keep chunk locations on the side: their
/// backups read the small summaries, never the index objects' chunk
/// entries, while the in-RAM strategies must read them.
#[test]
fn similarity_backups_read_summaries_not_chunk_entries() {
    for (index, reads_index) in [("silo", false), ("binning", false), ("exact", true)] {
        let env = Env::new();
        let fb = FaultBackend::new(&env.path("repo"));
        let mut opts = small_init(false);
        opts.index = index.into();
        let repo = Repository::init(fb.clone(), opts).unwrap();
        populate(&env, 5);
        let mut versions = vec![env.version(&repo)];
        mutate(&env, 6);
        fb.faults().gets.clear();
        // The backup alone (the lifecycle after it reads summaries).
        let tree = env.tree();
        let r = strata_store::ops::backup::backup(
            &repo,
            BackupOptions {
                paths: vec![env.src.clone()],
                series: Some("faults".into()),
                ..Default::default()
            },
        )
        .unwrap();
        let gets = std::mem::take(&mut fb.faults().gets);
        versions.push(Version {
            id: r.id,
            recipe: r.snapshot.recipe,
            tree,
        });
        let index_reads = gets.iter().filter(|n| n.starts_with("index/")).count();
        let summary_reads = gets.iter().filter(|n| n.starts_with("isum/")).count();
        assert_eq!(index_reads > 0, reads_index, "{index}: read {gets:?}");
        assert_eq!(summary_reads > 0, !reads_index, "{index}: read {gets:?}");
        env.assert_versions(&repo, &versions, index);
    }
}

/// A damaged summary costs a whole-object read, not data: commands fall
/// back to the index object, check names the summary, and repair index
/// rewrites it.
#[test]
fn damaged_summary_falls_back_and_is_repaired() {
    let env = Env::new();
    let fb = FaultBackend::new(&env.path("repo"));
    let mut opts = small_init(false);
    opts.index = "silo".into();
    let repo = Repository::init(fb.clone(), opts).unwrap();
    populate(&env, 7);
    let mut versions = vec![env.version(&repo)];
    let sum = object_names(fb.as_ref(), "isum/").remove(0);
    let path = env.path("repo").join(&sum);
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    // (No local cache: the library caches only when given a directory.)
    let light = RepoIndex::load_summaries(&repo).unwrap();
    let full = RepoIndex::load(&repo, |_| {}).unwrap();
    assert_eq!(light.containers, full.containers);
    mutate(&env, 8);
    versions.push(env.version(&repo));
    env.assert_versions(&repo, &versions, "with a damaged summary");
    let rep = check_report(&repo, false);
    assert!(
        rep.errors.iter().any(|e| e.contains(&sum)),
        "check must name {sum}: {:?}",
        rep.errors
    );
    strata_store::ops::gc::repair_index(&repo).unwrap();
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");
    env.assert_versions(&repo, &versions, "after repair");
}

/// A summary whose index object is gone (a crash between the two deletes)
/// is reported by check and removed by gc.
#[test]
fn orphan_summary_is_reported_and_swept() {
    let env = Env::new();
    let repo = init_repo(&env.path("repo"), false);
    populate(&env, 9);
    let versions = vec![env.version(&repo)];
    let b = repo.backend().clone();
    let sum = object_names(b.as_ref(), "isum/").remove(0);
    let orphan = format!("isum/{}", "0".repeat(64));
    b.put(&orphan, &b.get(&sum).unwrap()).unwrap();
    let rep = check_report(&repo, false);
    assert!(rep.ok(), "{:?}", rep.errors);
    assert!(
        rep.warnings.iter().any(|w| w.contains(&orphan)),
        "{:?}",
        rep.warnings
    );
    // Loading ignores it: it names another index object.
    RepoIndex::load_summaries(&repo).unwrap();
    gc(&repo, &GcOptions::default()).unwrap();
    assert!(!object_names(b.as_ref(), "isum/").contains(&orphan));
    let rep = check_report(&repo, true);
    assert!(rep.ok() && rep.warnings.is_empty(), "{rep:?}");
    env.assert_versions(&repo, &versions, "after gc");
}
