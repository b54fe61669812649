//! The cloud tier's logic on any backend (a second directory here; the CLI
//! tests run it against a real S3 server): estimate, migrate, gc of the
//! active tier, restore from the cloud tier, the bucket alone as a
//! repository, refusals, and a migration killed half-way.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use strata_core::format::Tier;
use strata_core::id::SnapshotId;
use strata_store::ops::backup::BackupReport;
use strata_store::ops::gc::{gc, GcOptions};
use strata_store::progress::Progress;
use strata_store::repo::index::RepoIndex;
use strata_store::tier::estimate::estimate;
use strata_store::tier::migrate::migrate;
use strata_store::tier::select::Selection;
use strata_store::{Backend, Repository};

fn stored(repo: &Repository) -> u64 {
    RepoIndex::load_summaries(repo).unwrap().stored_bytes()
}

fn segment_repo(dir: &Path, encrypted: bool) -> Repository {
    let mut o = small_init(encrypted);
    o.index = "segment".into();
    Repository::init(local(dir), o).unwrap()
}

/// Four versions: each edits some files and adds one; the first file set
/// leaves after version 2.
fn history(src: &Path, repo: &Repository) -> Vec<(BackupReport, Tree)> {
    history_with(src, repo, true)
}

/// [`history`]; without the lifecycle after each backup, a later
/// `maintain` rewrites the old versions with indirect references.
fn history_with(src: &Path, repo: &Repository, lifecycle: bool) -> Vec<(BackupReport, Tree)> {
    let mut out = Vec::new();
    let mut rng = Rng(7);
    for v in 0..4u64 {
        for i in 0..6u64 {
            if v == 0 || i % 3 == v % 3 {
                let n = 20_000 + rng.below(200_000) as usize;
                fs::create_dir_all(src.join(format!("d{}", i % 2))).unwrap();
                fs::write(src.join(format!("d{}/f{i}", i % 2)), rng.bytes(n)).unwrap();
            }
        }
        fs::write(src.join(format!("new{v}")), rng.bytes(300_000)).unwrap();
        if v == 2 {
            fs::remove_file(src.join("new0")).unwrap();
        }
        let r = strata_store::revdedup::backup(
            repo,
            strata_store::ops::backup::BackupOptions {
                paths: vec![src.to_path_buf()],
                series: Some("test".into()),
                ..Default::default()
            },
            match lifecycle {
                true => strata_store::revdedup::After::Lifecycle,
                false => strata_store::revdedup::After::Nothing,
            },
            &mut |_| {},
        )
        .unwrap()
        .report;
        out.push((r, read_tree(src)));
    }
    out
}

/// Restores version `id` (named in `namespace`) from `data`, the
/// repository holding its data, and compares it with `tree`.
fn assert_restores_from(
    namespace: &Repository,
    data: &Repository,
    id: &SnapshotId,
    src: &Path,
    scratch: &Path,
    tree: &Tree,
    what: &str,
) {
    let s = namespace.load_snapshot(id).unwrap();
    let recipe = namespace.load_recipe(&s.recipe).unwrap();
    let target = tempfile::tempdir_in(scratch).unwrap();
    strata_store::ops::restore::restore(
        data,
        &s,
        &recipe,
        &strata_store::ops::restore::RestoreOptions::new(target.path()),
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = read_tree(&restored_path(target.path(), src));
    assert!(got == *tree, "{what}: {}", tree.diff(&got));
}

/// Reverse dedup makes every version of `series` but the newest point
/// into its next one.
fn reverse_dedup_all_but_newest(repo: &Repository, series: &str) {
    strata_store::repo::lifecycle::set_policy(
        repo,
        &strata_store::repo::lifecycle::Policy {
            series: series.to_string(),
            live: 1,
            retain: None,
            retain_days: None,
        },
    )
    .unwrap();
    strata_store::revdedup::maintain(repo, &Default::default()).unwrap();
}

fn sel(ids: &[&SnapshotId]) -> Selection {
    Selection {
        snapshots: ids.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn migrate_estimate_gc_restore() {
    for encrypted in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let repo = segment_repo(&tmp.path().join("repo"), encrypted);
        let versions = history(&src, &repo);
        let cloud_dir = tmp.path().join("bucket");
        fs::create_dir_all(&cloud_dir).unwrap();
        let cloud = strata_store::tier::attach(&repo, local(&cloud_dir), "test://bucket").unwrap();
        // Attaching again is fine; another location is refused.
        strata_store::tier::attach(&repo, local(&cloud_dir), "test://bucket").unwrap();
        assert!(strata_store::tier::attach(&repo, local(&cloud_dir), "test://other").is_err());

        let old: Vec<&SnapshotId> = versions[..2].iter().map(|(r, _)| &r.id).collect();
        let before_estimate = stored(&repo);
        let e = estimate(&repo, &sel(&old), true).unwrap();
        assert!(e.freed_bytes > 0 && e.exact, "{e:?}");
        assert_eq!(
            stored(&repo),
            before_estimate,
            "the estimate changed the repository"
        );
        let before = stored(&repo);
        let m = migrate(&repo, &cloud, &sel(&old), &Progress::default()).unwrap();
        assert_eq!(m.versions.len(), 2);
        assert!(m.chunks_sent > 0 && m.chunks_deduplicated > 0, "{m:?}");
        gc(&repo, &GcOptions::default()).unwrap();
        let freed = before as i64 - stored(&repo) as i64;
        // To the byte (gc's copies may take a few bytes more than the
        // originals, so not necessarily every whole container's worth).
        assert_eq!(freed, e.freed_bytes, "estimate {e:?}");
        let all = repo.list_snapshots().unwrap();
        let tiers: Vec<Tier> = all.iter().map(|(_, s)| s.tier).collect();
        assert_eq!(
            tiers,
            [Tier::Cloud, Tier::Cloud, Tier::Active, Tier::Active]
        );
        assert_check_ok(&repo, true, "active tier after migrate + gc");
        // The cloud versions restore from the bucket; the active ones as before.
        for (i, (r, tree)) in versions.iter().enumerate() {
            let data = if i < 2 { &cloud } else { &repo };
            let s = repo.load_snapshot(&r.id).unwrap();
            assert_eq!(s.tier == Tier::Cloud, i < 2);
            assert_restores_from(&repo, data, &r.id, &src, tmp.path(), tree, "a version");
        }
        // The bucket alone is a repository holding the cloud versions.
        let alone = open_repo(local(&cloud_dir));
        let snaps = alone.list_snapshots().unwrap();
        assert_eq!(snaps.len(), 2);
        for (id, _) in &snaps {
            let (_, tree) = versions.iter().find(|(r, _)| &r.id == id).unwrap();
            assert_restores(&alone, id, &src, tmp.path(), tree, "from the bucket alone");
        }
        assert_check_ok(&alone, true, "the cloud tier");
        // Backups go on; a later migration sends only what is new.
        fs::write(src.join("new9"), b"after the migration").unwrap();
        let v5 = backup_paths(&repo, &[&src]).unwrap();
        let m = migrate(
            &repo,
            &cloud,
            &sel(&[&versions[2].0.id]),
            &Progress::default(),
        )
        .unwrap();
        assert!(m.raw_bytes_sent < m.logical_bytes / 2, "{m:?}");
        assert_restores(&repo, &v5.id, &src, tmp.path(), &read_tree(&src), "v5");
    }
}

#[test]
fn a_chain_into_a_moving_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), false);
    let versions = history(&src, &repo);
    // Reverse dedup makes the old versions point into their next ones.
    reverse_dedup_all_but_newest(&repo, &versions[0].0.snapshot.series);
    let s1 = repo.load_snapshot(&versions[0].0.id).unwrap();
    let next = s1
        .archival
        .as_ref()
        .and_then(|a| a.next.clone())
        .expect("v1 is archival and points into v2");
    let cloud_dir = tmp.path().join("bucket");
    fs::create_dir_all(&cloud_dir).unwrap();
    let cloud = strata_store::tier::attach(&repo, local(&cloud_dir), "test://b").unwrap();
    let e = migrate(&repo, &cloud, &sel(&[&next]), &Progress::default()).unwrap_err();
    assert!(e.to_string().contains("select it too"), "{e}");
    // With the older version selected too, it goes, chains resolved.
    migrate(
        &repo,
        &cloud,
        &sel(&[&versions[0].0.id, &next]),
        &Progress::default(),
    )
    .unwrap();
    gc(&repo, &GcOptions::default()).unwrap();
    assert_restores(
        &repo,
        &versions[3].0.id,
        &src,
        tmp.path(),
        &versions[3].1,
        "v4",
    );
    let alone = open_repo(local(&cloud_dir));
    assert_restores(
        &alone,
        &versions[0].0.id,
        &src,
        tmp.path(),
        &versions[0].1,
        "v1 in the cloud",
    );
}

#[test]
fn a_migration_killed_half_way_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), false);
    let versions = history(&src, &repo);
    let cloud_dir = tmp.path().join("bucket");
    let faulty = FaultBackend::new(&cloud_dir);
    let cloud_backend: Arc<dyn Backend> = faulty.clone();
    let cloud = strata_store::tier::attach(&repo, cloud_backend, "test://b").unwrap();
    let ids: Vec<&SnapshotId> = versions[..3].iter().map(|(r, _)| &r.id).collect();
    for budget in [1u64, 3, 8, 20] {
        faulty.faults().mutations_left = Some(budget);
        let r = migrate(&repo, &cloud, &sel(&ids), &Progress::default());
        faulty.heal();
        strata_store::repo::lock::unlock(&repo, true).unwrap();
        strata_store::repo::lock::unlock(&cloud, true).unwrap();
        if r.is_ok() {
            break;
        }
        // Every version restores from wherever its snapshot says it is.
        for (r, tree) in &versions {
            let s = repo.load_snapshot(&r.id).unwrap();
            let data = if s.tier == Tier::Cloud { &cloud } else { &repo };
            assert_restores_from(&repo, data, &r.id, &src, tmp.path(), tree, "after a kill");
        }
    }
    // Finishing the job: the rest moves, the first attempts' objects reused.
    migrate(
        &repo,
        &cloud,
        &Selection {
            series: vec![versions[0].0.snapshot.series.clone()],
            ..Default::default()
        },
        &Progress::default(),
    )
    .unwrap();
    gc(&repo, &GcOptions::default()).unwrap();
    assert_check_ok(&repo, true, "after the migrations");
    let alone = open_repo(local(&cloud_dir));
    for (r, tree) in &versions {
        assert_restores(&alone, &r.id, &src, tmp.path(), tree, "from the bucket");
    }
}

/// Recall brings versions back, reading only what the active tier lacks;
/// after a lost site, the bucket alone rebuilds it.
#[test]
fn recall_and_disaster_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), true);
    let versions = history(&src, &repo);
    let cloud_dir = tmp.path().join("bucket");
    fs::create_dir_all(&cloud_dir).unwrap();
    let cloud = strata_store::tier::attach(&repo, local(&cloud_dir), "test://b").unwrap();
    let old: Vec<&SnapshotId> = versions[..3].iter().map(|(r, _)| &r.id).collect();
    migrate(&repo, &cloud, &sel(&old), &Progress::default()).unwrap();
    gc(&repo, &GcOptions::default()).unwrap();

    // Recall version 2: most of it is still in the active tier (version 4
    // shares it), so little is read from the bucket.
    let r =
        strata_store::tier::migrate::recall(&repo, &cloud, &sel(&[old[1]]), &Progress::default())
            .unwrap();
    assert!(r.chunks_deduplicated > 0, "{r:?}");
    let s = repo.load_snapshot(old[1]).unwrap();
    assert_eq!(s.tier, Tier::Active);
    assert_restores(
        &repo,
        old[1],
        &src,
        tmp.path(),
        &versions[1].1,
        "recalled v2",
    );
    assert_check_ok(&repo, true, "after recall");
    let alone = open_repo(local(&cloud_dir));
    assert_eq!(
        alone.list_snapshots().unwrap().len(),
        2,
        "the bucket let go of v2"
    );
    assert_check_ok(&alone, true, "the bucket after recall");

    // The site is lost: rebuild it from the bucket into a new directory.
    let rebuilt_dir = tmp.path().join("rebuilt");
    let (rebuilt, report) =
        strata_store::tier::dr_rebuild(local(&rebuilt_dir), &alone, "test://b", "segment").unwrap();
    assert_eq!(report.snapshots, 2, "{report:?}");
    assert_eq!(rebuilt.config().id, repo.config().id);
    let rebuilt = open_repo(local(&rebuilt_dir));
    let cloud2 = strata_store::tier::open_cloud_in(&rebuilt, local(&cloud_dir)).unwrap();
    for i in [0usize, 2] {
        let (r, tree) = &versions[i];
        assert_eq!(rebuilt.load_snapshot(&r.id).unwrap().tier, Tier::Cloud);
        assert_restores_from(
            &rebuilt,
            &cloud2,
            &r.id,
            &src,
            tmp.path(),
            tree,
            "after the rebuild",
        );
    }
    // The rebuilt site backs up and recalls like the lost one.
    let v = backup_paths(&rebuilt, &[&src]).unwrap();
    assert_restores(
        &rebuilt,
        &v.id,
        &src,
        tmp.path(),
        &read_tree(&src),
        "new backup",
    );
    strata_store::tier::migrate::recall(&rebuilt, &cloud2, &sel(&[old[0]]), &Progress::default())
        .unwrap();
    assert_restores(
        &rebuilt,
        old[0],
        &src,
        tmp.path(),
        &versions[0].1,
        "recalled v1",
    );
    assert!(
        strata_store::tier::dr_rebuild(local(&rebuilt_dir), &alone, "test://b", "segment").is_err()
    );
}

/// The cloud tier is cleaned region by region: after a cloud version is
/// forgotten, containers only it used go, partly dead ones are copied
/// forward, and every remaining version still restores from the bucket.
#[test]
fn cloud_gc_cleans_by_region() {
    use strata_store::tier::cloud_gc::{cloud_gc, CloudGcOptions};
    use strata_store::tier::copy_forward::Download;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), false);
    let versions = history(&src, &repo);
    let cloud_dir = tmp.path().join("bucket");
    fs::create_dir_all(&cloud_dir).unwrap();
    let cloud = strata_store::tier::attach(&repo, local(&cloud_dir), "test://b").unwrap();
    let ids: Vec<SnapshotId> = versions.iter().map(|(r, _)| r.id.clone()).collect();
    let refs: Vec<&SnapshotId> = ids.iter().collect();
    migrate(&repo, &cloud, &sel(&refs), &Progress::default()).unwrap();
    let copier = Download(cloud.backend().clone());
    // Nothing dead yet: nothing to do.
    let r = cloud_gc(&repo, &cloud, &copier, &CloudGcOptions::default()).unwrap();
    assert_eq!((r.containers_deleted, r.dead_bytes_freed), (0, 0), "{r:?}");
    // Versions 1 and 3 go; their chunks no other version has are dead.
    strata_store::tier::forget_cloud(&repo, &cloud, &[ids[0].clone(), ids[2].clone()]).unwrap();
    let dry = cloud_gc(
        &repo,
        &cloud,
        &copier,
        &CloudGcOptions {
            dry_run: true,
            threshold: 0.0,
        },
    )
    .unwrap();
    assert!(dry.dead_bytes_freed > 0, "{dry:?}");
    let before = stored(&cloud);
    let r = cloud_gc(
        &repo,
        &cloud,
        &copier,
        &CloudGcOptions {
            dry_run: false,
            threshold: 0.0,
        },
    )
    .unwrap();
    assert_eq!(r.dead_bytes_freed, dry.dead_bytes_freed, "{r:?}");
    assert!(r.containers_deleted > 0, "{r:?}");
    assert!(
        r.containers_copied_forward > 0 && r.containers_written > 0 && r.recipes_rewritten > 0,
        "the copy-forward path ran: {r:?}"
    );
    assert!((0.0..=1.0).contains(&r.efficiency_loss));
    let after = stored(&cloud);
    assert!(after < before, "{before} -> {after}");
    assert_eq!(r.bytes_after, after);
    let alone = open_repo(local(&cloud_dir));
    assert_check_ok(&alone, true, "the cloud tier after its gc");
    for i in [1usize, 3] {
        let (v, tree) = &versions[i];
        assert_restores(&alone, &v.id, &src, tmp.path(), tree, "after the cloud gc");
        assert_restores_from(
            &repo,
            &cloud,
            &v.id,
            &src,
            tmp.path(),
            tree,
            "via the local namespace",
        );
    }
    // A second run finds nothing more.
    let again = cloud_gc(&repo, &cloud, &copier, &CloudGcOptions::default()).unwrap();
    assert_eq!(again.containers_deleted, 0, "{again:?}");
}

/// Seeding sends every chunk of the selected versions once, in physical
/// order, and survives being killed: run again, it goes on from its saved
/// vector and position.
#[test]
fn seeding_resumes_after_kills() {
    use strata_store::tier::seed::seed;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), true);
    let versions = history(&src, &repo);
    let cloud_dir = tmp.path().join("bucket");
    let faulty = FaultBackend::new(&cloud_dir);
    let cloud_backend: Arc<dyn Backend> = faulty.clone();
    let cloud = strata_store::tier::attach(&repo, cloud_backend, "test://b").unwrap();
    let ids: Vec<&SnapshotId> = versions[..3].iter().map(|(r, _)| &r.id).collect();
    let mut resumed = false;
    let mut done = None;
    for budget in [2u64, 5, 9, 30, 1000] {
        faulty.faults().mutations_left = Some(budget);
        let r = seed(&repo, &cloud, &sel(&ids), &Progress::default());
        faulty.heal();
        strata_store::repo::lock::unlock(&repo, true).unwrap();
        strata_store::repo::lock::unlock(&cloud, true).unwrap();
        match r {
            Ok(r) => {
                done = Some(r);
                break;
            }
            Err(e) => {
                eprintln!("seed with {budget} writes: {e}");
                // Nothing flipped yet: every version restores locally.
                for (r, tree) in &versions {
                    let s = repo.load_snapshot(&r.id).unwrap();
                    if s.tier == Tier::Active {
                        assert_restores(&repo, &r.id, &src, tmp.path(), tree, "during the seed");
                    }
                }
                resumed = true;
            }
        }
    }
    let r = done.expect("the seed finished");
    assert!(resumed && r.resumed, "{r:?}");
    assert!(r.fingerprints > 0 && r.chunks_sent > 0);
    let tiers: Vec<Tier> = repo
        .list_snapshots()
        .unwrap()
        .iter()
        .map(|(_, s)| s.tier)
        .collect();
    assert_eq!(tiers, [Tier::Cloud, Tier::Cloud, Tier::Cloud, Tier::Active]);
    gc(&repo, &GcOptions::default()).unwrap();
    let alone = open_repo(local(&cloud_dir));
    for (r, tree) in &versions[..3] {
        assert_restores(&alone, &r.id, &src, tmp.path(), tree, "seeded");
    }
    assert_check_ok(&alone, true, "the seeded bucket");
    assert_restores(
        &repo,
        &versions[3].0.id,
        &src,
        tmp.path(),
        &versions[3].1,
        "v4",
    );
    // A later migration sends only what the seed did not.
    let m = migrate(
        &repo,
        &cloud,
        &sel(&[&versions[3].0.id]),
        &Progress::default(),
    )
    .unwrap();
    assert!(m.chunks_deduplicated > m.chunks_sent, "{m:?}");
}

/// Restores version `id` whole: its recipe from wherever the snapshot
/// says, then its cloud part (files moved with `--path`) from `cloud`.
fn restore_whole(
    repo: &Repository,
    cloud: &Repository,
    id: &SnapshotId,
    scratch: &Path,
) -> tempfile::TempDir {
    let s = repo.load_snapshot(id).unwrap();
    let target = tempfile::tempdir_in(scratch).unwrap();
    // The cloud part first, its directories' metadata left to the rest.
    let mut parts: Vec<_> = strata_store::repo::tiers::part_snapshot(&s)
        .map(|p| (cloud, p))
        .into_iter()
        .collect();
    parts.push((if s.tier == Tier::Cloud { cloud } else { repo }, s.clone()));
    let n = parts.len();
    for (i, (data, part)) in parts.into_iter().enumerate() {
        let recipe = repo.load_recipe(&part.recipe).unwrap();
        let mut opts = strata_store::ops::restore::RestoreOptions::new(target.path());
        opts.dir_metadata = i + 1 == n;
        strata_store::ops::restore::restore(data, &part, &recipe, &opts).unwrap();
    }
    target
}

/// Attaches a cloud tier in `dir/bucket`.
fn bucket(repo: &Repository, dir: &Path) -> (Repository, std::path::PathBuf) {
    let cloud_dir = dir.join("bucket");
    fs::create_dir_all(&cloud_dir).unwrap();
    let cloud = strata_store::tier::attach(repo, local(&cloud_dir), "test://b").unwrap();
    (cloud, cloud_dir)
}

/// The d0 files of the versions `ids`.
fn d0(ids: &[&SnapshotId]) -> Selection {
    Selection {
        paths: vec!["**/d0/**".into()],
        ..sel(ids)
    }
}

fn assert_restore_whole(
    repo: &Repository,
    cloud: &Repository,
    id: &SnapshotId,
    src: &Path,
    tree: &Tree,
    what: &str,
) {
    let t = restore_whole(repo, cloud, id, src.parent().unwrap());
    let got = read_tree(&restored_path(t.path(), src));
    assert!(got == *tree, "{what}: {}", tree.diff(&got));
}

/// `tier migrate --path` through reverse-dedup chains: a move that would
/// leave an older version's indirect references without a holder is
/// refused; with the older versions' paths selected too, it goes, and
/// every version restores whole.
#[test]
fn paths_move_through_reverse_dedup_chains() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), false);
    let versions = history_with(&src, &repo, false);
    reverse_dedup_all_but_newest(&repo, &versions[0].0.snapshot.series);
    let ids: Vec<&SnapshotId> = versions.iter().map(|(r, _)| &r.id).collect();
    let indirect = |id: &SnapshotId| {
        let s = repo.load_snapshot(id).unwrap();
        s.archival.map_or(0, |a| a.indirect_chunks)
    };
    assert!(indirect(ids[0]) > 0, "reverse dedup made nothing indirect");
    let (cloud, _) = bucket(&repo, tmp.path());
    // Version 1's unchanged d0 files are indirect into version 2's.
    let e = migrate(&repo, &cloud, &d0(&ids[1..2]), &Progress::default()).unwrap_err();
    assert!(e.to_string().contains("through reverse dedup"), "{e}");
    assert!(repo.load_snapshot(ids[1]).unwrap().cloud_part.is_none());
    let m = migrate(&repo, &cloud, &d0(&ids[..3]), &Progress::default()).unwrap();
    assert_eq!(m.versions.len(), 3, "{m:?}");
    gc(&repo, &GcOptions::default()).unwrap();
    for (i, (r, tree)) in versions.iter().enumerate() {
        assert_restore_whole(&repo, &cloud, &r.id, &src, tree, &format!("v{}", i + 1));
    }
    assert_check_ok(&repo, true, "after moving paths");
}

/// `tier migrate --path`: the files a glob selects leave the active tier,
/// the rest of each version stays; versions restore whole from both
/// tiers, the bucket alone restores the moved files; whole migration,
/// recall and forget of a split version.
#[test]
fn paths_move_to_the_cloud_and_back() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let repo = segment_repo(&tmp.path().join("repo"), true);
    let versions = history(&src, &repo);
    let (cloud, cloud_dir) = bucket(&repo, tmp.path());
    let ids: Vec<&SnapshotId> = versions.iter().map(|(r, _)| &r.id).collect();
    let before = stored(&repo);
    let m = migrate(&repo, &cloud, &d0(&ids[..3]), &Progress::default()).unwrap();
    assert_eq!(m.versions.len(), 3, "{m:?}");
    assert!(m.files >= 3 && m.chunks_sent > 0, "{m:?}");
    gc(
        &repo,
        &GcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    // The d0 contents no active file has any more are freed.
    let kept: std::collections::HashSet<&Vec<u8>> = versions[3].1.files.values().collect();
    let gone: std::collections::HashSet<&Vec<u8>> = versions[..3]
        .iter()
        .flat_map(|(_, t)| t.files.iter())
        .filter(|(p, d)| p.contains("d0/") && !kept.contains(d))
        .map(|(_, d)| d)
        .collect();
    let gone: u64 = gone.iter().map(|d| d.len() as u64).sum();
    let freed = before - stored(&repo);
    assert!(
        freed as f64 > 0.95 * gone as f64,
        "freed {freed} of {gone} moved-only bytes"
    );
    for (i, (r, tree)) in versions.iter().enumerate() {
        let s = repo.load_snapshot(&r.id).unwrap();
        assert_eq!(s.tier, Tier::Active);
        assert_eq!(s.cloud_part.is_some(), i < 3, "v{}", i + 1);
        assert_restore_whole(&repo, &cloud, &r.id, &src, tree, &format!("v{}", i + 1));
        // The listing shows the whole tree.
        let whole = strata_store::repo::tiers::whole_recipe(&repo, &s).unwrap();
        let local = repo.load_recipe(&s.recipe).unwrap();
        if i < 3 {
            assert!(local.nodes.iter().all(|n| !n.path_str().contains("/d0/")));
            assert!(whole.nodes.iter().any(|n| n.path_str().contains("/d0/")));
        } else {
            assert_eq!(whole, local);
        }
    }
    assert_check_ok(&repo, true, "after moving paths");
    // The bucket alone holds the moved files of each version.
    let alone = open_repo(local(&cloud_dir));
    assert_eq!(alone.list_snapshots().unwrap().len(), 3);
    let s = alone.load_snapshot(ids[0]).unwrap();
    let t = restore_whole(&alone, &alone, ids[0], tmp.path());
    let got = read_tree(&restored_path(t.path(), &src));
    assert_eq!(got.files.len() as u64, s.cloud_part.unwrap().files);
    assert!(got
        .files
        .iter()
        .all(|(p, d)| p.contains("d0/") && versions[0].1.files.get(p) == Some(d)));

    // Version 1 moves whole (its part goes along); version 2's part comes
    // back; version 3 is forgotten, the bucket's part with it.
    migrate(&repo, &cloud, &sel(&ids[..1]), &Progress::default()).unwrap();
    let s1 = repo.load_snapshot(ids[0]).unwrap();
    assert_eq!((s1.tier, s1.cloud_part.is_some()), (Tier::Cloud, false));
    let r =
        strata_store::tier::migrate::recall(&repo, &cloud, &sel(&ids[1..2]), &Progress::default())
            .unwrap();
    assert!(r.files > 0, "{r:?}");
    let s2 = repo.load_snapshot(ids[1]).unwrap();
    assert_eq!((s2.tier, s2.cloud_part.is_some()), (Tier::Active, false));
    // Forgotten locally only (as the lifecycle's expiry does, or a forget
    // killed before the bucket's part went): the cloud gc drops the part.
    strata_store::ops::forget::forget(&repo, &[ids[2].to_string()]).unwrap();
    gc(&repo, &GcOptions::default()).unwrap();
    let g = strata_store::tier::cloud_gc::cloud_gc(
        &repo,
        &cloud,
        &strata_store::tier::copy_forward::Download(cloud.backend().clone()),
        &strata_store::tier::cloud_gc::CloudGcOptions {
            threshold: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(g.bytes_after < g.bytes_before, "{g:?}");
    assert_eq!(g.orphan_parts_dropped, 1, "{g:?}");
    let in_bucket: Vec<SnapshotId> = alone
        .list_snapshots()
        .unwrap()
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(in_bucket, vec![ids[0].clone()]);
    for i in [0usize, 1, 3] {
        let what = format!("v{} at the end", i + 1);
        assert_restore_whole(&repo, &cloud, ids[i], &src, &versions[i].1, &what);
    }
    assert_check_ok(&repo, true, "at the end");
    assert_check_ok(&alone, true, "the bucket at the end");
}
