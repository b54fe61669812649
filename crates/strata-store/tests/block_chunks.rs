//! A large file is chunked in blocks on every worker, each from its own
//! start, and joined in order: its chunks must be exactly those of
//! chunking it from start to end (as small files are), or a later
//! backup would store again what it already holds.

mod common;

use common::*;
use std::fs;
use strata_core::format::Recipe;
use strata_store::ops::backup::BackupOptions;

/// The (fingerprint, length) of every chunk of the one file in `recipe`.
fn chunks_of(recipe: &Recipe) -> Vec<([u8; 32], u32)> {
    let files: Vec<_> = recipe
        .nodes
        .iter()
        .filter(|n| !n.segments.is_empty())
        .collect();
    assert_eq!(files.len(), 1);
    files[0]
        .segments
        .iter()
        .flat_map(|s| &s.chunks)
        .map(|c| (c.fp.0, c.len))
        .collect()
}

#[test]
fn blocks_chunk_as_the_whole_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    // Random data, a run of zeros (cut at the longest chunk, where guesses
    // from a block's start rarely meet the true cuts), random again, and
    // an odd end.
    let mut data = random_bytes(1, 3 << 20);
    data.resize(data.len() + (1 << 20) + 12_345, 0);
    data.extend(random_bytes(2, (2 << 20) + 777));
    fs::write(src.join("f"), &data).unwrap();
    let mut got = Vec::new();
    let mut changes = Vec::new();
    for (large_file, threads) in [(u64::MAX, 1), (0, 1), (0, 3), (100_000, 2), (4 << 20, 2)] {
        let repo = init_repo(&tmp.path().join(format!("r-{large_file}-{threads}")), false);
        let back_up = |force_read| {
            backup_with_lifecycle(
                &repo,
                BackupOptions {
                    paths: vec![src.clone()],
                    series: Some("t".into()),
                    // 0: blocks of 64 KiB, so two of the three kinds of
                    // data span many blocks; 4 MiB: blocks that hold the
                    // whole run of zeros (one reference in the recipe).
                    large_file,
                    threads,
                    force_read,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let r = back_up(false);
        let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
        got.push(chunks_of(&recipe));
        let want = &got[0];
        let now = got.last().unwrap();
        assert_eq!(
            now.len(),
            want.len(),
            "large_file {large_file}, {threads} threads"
        );
        assert!(
            now == want,
            "large_file {large_file}, {threads} threads: other chunks"
        );
        // The second backup, checked against the first's chunks where the
        // file did not change, cuts the same chunks and stores nothing
        // again; a changed file (bytes changed in place, among them the
        // first byte of a chunk, on whose value the cut before it
        // depends) is cut as a whole-file read cuts it.
        let again = |data: &[u8]| {
            fs::write(src.join("f"), data).unwrap();
            let r = back_up(true);
            let chunks = chunks_of(&repo.load_recipe(&r.snapshot.recipe).unwrap());
            (r.snapshot.stats.new_chunks, chunks)
        };
        let (new, same) = again(&data);
        assert_eq!(new, 0, "large_file {large_file}");
        assert!(
            same == got[0],
            "large_file {large_file}: unchanged file cut otherwise"
        );
        let mut changed = data.clone();
        let mut at = 0usize;
        for (i, (_, len)) in got[0].iter().enumerate() {
            if i % 50 == 25 {
                changed[at] ^= 0xff;
            }
            at += *len as usize;
        }
        changed[100_000] ^= 1;
        let (_, chunks) = again(&changed);
        changes.push(chunks);
        assert!(
            changes.last() == changes.first(),
            "large_file {large_file}, {threads} threads: the changed file cut otherwise"
        );
        fs::write(src.join("f"), &data).unwrap();
    }
}
