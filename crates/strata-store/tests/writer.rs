//! `DedupWriter`: byte streams deduplicated into a repository the way a
//! backup's files are, readable back through a recipe that points at them.

mod common;

use common::*;
use strata_core::chunker::ChunkerParams;
use strata_core::format::{Node, NodeKind, Recipe, Snapshot};
use strata_store::ops::backup::{DedupWriter, StoredStream};
use strata_store::{Repository, StoreError};

fn node_of(s: &StoredStream) -> Node {
    Node {
        mode: 0o100644,
        size: s.size,
        segments: s.segments.clone(),
        ..Node::new(b"stream".to_vec(), NodeKind::File)
    }
}

/// Reads a stored stream back through a recipe of its own.
fn read_back(repo: &Repository, s: &StoredStream) -> Vec<u8> {
    let node = node_of(s);
    let recipe = Recipe {
        containers: s.containers.clone(),
        nodes: vec![node.clone()],
    };
    let snapshot = Snapshot {
        series: "writer".into(),
        version: 1,
        time_ns: 0,
        host: "h".into(),
        paths: vec![],
        tags: vec![],
        recipe: String::new(),
        parent: None,
        chunker: repo.config().chunker,
        stats: Default::default(),
        archival: None,
        tier: Default::default(),
        cloud_part: None,
    };
    let mut out = Vec::new();
    strata_store::ops::restore::dump(repo, &snapshot, &recipe, &node, &mut out).unwrap();
    out
}

#[test]
fn streams_dedup_and_read_back() {
    for index in ["segment", "exact"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = small_init(false);
        opts.index = index.into();
        let repo = Repository::init(local(&tmp.path().join("repo")), opts).unwrap();
        let a = random_bytes(1, 3 << 20);
        let mut c = a.clone();
        c[1 << 20..(1 << 20) + 100].copy_from_slice(&[7u8; 100]);
        let w = DedupWriter::open(&repo, None).unwrap();
        let sa = w.write(&mut &a[..]).unwrap();
        assert_eq!(sa.size, a.len() as u64);
        // The same stream again stores nothing; an edited one little.
        let sb = w.write(&mut &a[..]).unwrap();
        let sc = w.write(&mut &c[..]).unwrap();
        // While it is open, no gc can sweep what it wrote.
        let g = strata_store::ops::gc::gc(&repo, &Default::default());
        assert!(
            matches!(g, Err(StoreError::Locked { .. })),
            "{index}: {g:?}"
        );
        let done = w.finish().unwrap();
        assert!(done.index_object.is_some(), "{index}: {done:?}");
        assert!(
            done.new_raw_bytes < a.len() as u64 + (256 << 10),
            "{index}: {done:?}"
        );
        assert_eq!(read_back(&repo, &sa), a, "{index}");
        assert_eq!(read_back(&repo, &sb), a, "{index}");
        assert_eq!(read_back(&repo, &sc), c, "{index}");
    }
}

#[test]
fn fixed_chunks_for_block_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(local(&tmp.path().join("repo")), small_init(false)).unwrap();
    let w = DedupWriter::open(&repo, Some(ChunkerParams::fixed())).unwrap();
    let mut blocks = vec![0u8; 8 << 20];
    blocks[..1 << 20].copy_from_slice(&random_bytes(3, 1 << 20));
    let s = w.write(&mut &blocks[..]).unwrap();
    // 4 KiB chunks; zero blocks are not stored, and a segment's are one
    // run.
    for g in &s.segments {
        assert!(g
            .chunks
            .iter()
            .all(|c| c.len as u64 == 4096 * c.chunk_count()));
        assert!(g.chunks.iter().filter(|c| c.is_zero()).count() <= 1);
    }
    let zero_runs: Vec<_> = s
        .segments
        .iter()
        .flat_map(|g| &g.chunks)
        .filter(|c| c.is_zero())
        .collect();
    assert_eq!(
        zero_runs.iter().map(|c| c.chunk_count()).sum::<u64>(),
        7 << 8
    );
    let done = w.finish().unwrap();
    assert!(done.new_raw_bytes <= 1 << 20, "{done:?}");
    assert_eq!(read_back(&repo, &s), blocks);
}
