//! gc merges the small containers backups leave (about one per worker
//! each) only once there are enough of them to pay for rewriting them:
//! a prune after a few backups does not decrypt, recompress and write
//! their leftovers again.

mod common;

use common::*;
use std::fs;
use strata_store::ops::backup::{backup, BackupOptions};
use strata_store::ops::gc::compact::SMALL_TO_MERGE;
use strata_store::ops::gc::{gc, GcOptions};

#[test]
fn small_containers_are_merged_once_there_are_enough() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init_repo(&tmp.path().join("repo"), false);
    let target = repo.config().container_size as usize;
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let mut merged_at = None;
    for i in 0..SMALL_TO_MERGE + 1 {
        // A new file a tenth of a container: each backup leaves one
        // small container; together they fill half a container by the
        // fifth.
        fs::write(
            src.join(format!("f{i}")),
            random_bytes(i as u64, target / 10),
        )
        .unwrap();
        backup(
            &repo,
            BackupOptions {
                paths: vec![src.clone()],
                series: Some("s".into()),
                threads: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let r = gc(&repo, &GcOptions::default()).unwrap();
        if r.containers_merged > 0 {
            merged_at = Some((i + 1, r.containers_merged));
            break;
        }
    }
    let (backups, merged) = merged_at.expect("the small containers were never merged");
    assert_eq!(backups, SMALL_TO_MERGE, "merged after {backups} backups");
    assert_eq!(merged as usize, SMALL_TO_MERGE);
    assert_check_ok(&repo, true, "after the merge");
    let src_tree = read_tree(&src);
    let snaps = repo.list_snapshots().unwrap();
    let (id, _) = snaps.iter().max_by_key(|(_, s)| s.version).unwrap();
    assert_restores(&repo, id, &src, tmp.path(), &src_tree, "after the merge");
}
