//! Unit tests of the on-disk structures: round trips, versions, limits.

use super::index::IndexSummaryV1;
use super::*;
use crate::chunker::ChunkerParams;
use crate::error::CoreError;
use crate::fingerprint::Fingerprint;
use crate::id::{PartId, RecipeId, SnapshotId};
use serde::Serialize;

#[test]
fn zero_chunks_decode_as_runs() {
    let data = |b: u8| ChunkRef {
        fp: Fingerprint([b; 32]),
        len: 4096,
        container: 0,
        region: 1,
        offset: 4096 * b as u32,
    };
    let zero = ChunkRef::zeros(4096, 1);
    // As builds before zero runs wrote it: one reference per chunk.
    let written = SegmentRef {
        fp: Fingerprint([9; 32]),
        chunks: vec![zero, zero, data(1), zero, zero, zero, data(2), zero],
    };
    let bytes = encode(&written).unwrap();
    let read: SegmentRef = decode("segment", &bytes).unwrap();
    assert_eq!(
        read.chunks,
        vec![
            ChunkRef::zeros(8192, 2),
            data(1),
            ChunkRef::zeros(3 * 4096, 3),
            data(2),
            zero
        ]
    );
    assert_eq!((read.len(), read.chunk_count()), (8 * 4096, 8));
    assert_eq!(read.fp, written.fp);
    // Runs merge with runs, and a run encoded decodes as itself.
    let mut again = SegmentRef {
        fp: read.fp,
        chunks: Vec::new(),
    };
    for c in read.chunks.iter().chain(&read.chunks) {
        again.push(*c);
    }
    assert_eq!(again.chunk_count(), 16);
    assert_eq!(again.chunks[4], ChunkRef::zeros(3 * 4096, 3));
    let back: SegmentRef = decode("segment", &encode(&again).unwrap()).unwrap();
    assert_eq!(back, again);
    // A run never overflows its length: a new one starts.
    let mut big = Vec::new();
    push_chunk(&mut big, ChunkRef::zeros(u32::MAX - 10, 7));
    push_chunk(&mut big, ChunkRef::zeros(4096, 1));
    assert_eq!(big.len(), 2);
}

#[test]
fn path_order_is_a_depth_first_walk_by_name() {
    use std::cmp::Ordering::*;
    let mut v: Vec<&[u8]> = vec![b"a.txt", b"a/b", b"a", b"ab", b"a/b/c", b"a/a", b"b"];
    v.sort_by(|x, y| path_cmp(x, y));
    let want: Vec<&[u8]> = vec![b"a", b"a/a", b"a/b", b"a/b/c", b"a.txt", b"ab", b"b"];
    assert_eq!(v, want);
    assert_eq!(path_cmp(b"x", b"x"), Equal);
    assert_eq!(path_cmp(b"x/", b"x"), Greater);
}

#[test]
fn index_summaries_of_both_versions_decode() {
    let fp = |b: u8| Fingerprint([b; 32]);
    let entry = |b: u8| ChunkEntry {
        fp: fp(b),
        region: 0,
        offset: 0,
        len: 4096,
    };
    let meta = ContainerMeta {
        id: ContainerId([3; 16]),
        data_len: 100,
        created: 5,
        stamp: None,
        regions: vec![],
        chunks: vec![entry(9), entry(2), entry(7), entry(1)],
        segments: vec![
            SegmentEntry {
                fp: fp(40),
                first_chunk: 0,
                chunks: 3,
            },
            // A run past the chunk entries: no representatives.
            SegmentEntry {
                fp: fp(41),
                first_chunk: 3,
                chunks: u32::MAX,
            },
        ],
        deltas: Vec::new(),
    };
    let s = IndexSummary::of("index/ab".into(), std::slice::from_ref(&meta));
    let segs = s.segments.as_ref().unwrap();
    assert_eq!(segs[0][0].reps, Some([fp(2), fp(9)]));
    assert_eq!(segs[0][1].reps, None);
    let v2 = encode_index_summary(&s).unwrap();
    assert_eq!(v2[0], INDEX_SUMMARY_VERSION);
    assert_eq!(decode_index_summary(&v2).unwrap(), s);
    // Version 1 (what earlier builds wrote): no segments.
    let v1 = encode(&IndexSummaryV1 {
        index: s.index.clone(),
        containers: s.containers.clone(),
    })
    .unwrap();
    let old = decode_index_summary(&v1).unwrap();
    assert_eq!((old.index, old.segments), (s.index.clone(), None));
    assert_eq!(old.containers, s.containers);
    // Segments that do not match the containers one to one.
    let mut bad = s.clone();
    bad.segments = Some(vec![]);
    assert!(decode_index_summary(&encode_index_summary(&bad).unwrap()).is_err());
    let mut future = v2.clone();
    future[0] = 9;
    assert!(matches!(
        decode_index_summary(&future),
        Err(CoreError::UnknownVersion { found: 9, .. })
    ));
    assert!(decode_index_summary(&[]).is_err());
}

#[test]
fn recipe_objects_of_both_versions_decode() {
    let whole = Recipe {
        containers: vec![ContainerId([7; 16])],
        nodes: vec![],
    };
    assert_eq!(
        decode_recipe_object(&encode(&whole).unwrap()).unwrap(),
        RecipeObject::Whole(whole)
    );
    let idx = RecipeIndex {
        containers: vec![ContainerId([1; 16])],
        parts: vec![PartRef {
            id: PartId::parse(&"ab".repeat(32)).unwrap(),
            first: b"a/b".to_vec(),
            nodes: 3,
            containers: vec![0],
            piece: None,
            base: None,
        }],
        continued: false,
    };
    let bytes = encode_recipe_index(&idx).unwrap();
    assert_eq!(bytes[0], RECIPE_INDEX_VERSION);
    assert_eq!(
        decode_recipe_object(&bytes).unwrap(),
        RecipeObject::Index(idx.clone())
    );
    // With continued files: the same encoding under version 3.
    let cont = RecipeIndex {
        continued: true,
        ..idx.clone()
    };
    let b3 = encode_recipe_index(&cont).unwrap();
    assert_eq!(b3[0], RECIPE_INDEX_CONTINUED);
    assert_eq!(b3[1..], bytes[1..]);
    assert_eq!(
        decode_recipe_object(&b3).unwrap(),
        RecipeObject::Index(cont.clone())
    );
    // A part that says which piece it holds: version 4, continued.
    let mut pieces = cont.clone();
    pieces.parts[0].piece = Some(PieceRef {
        offset: 64 << 20,
        len: 2 << 20,
        meta: Fingerprint([5; 32]),
        segment: 2 << 20,
        direct_chunks: 512,
        direct_bytes: 2 << 20,
    });
    let b4 = encode_recipe_index(&pieces).unwrap();
    assert_eq!(b4[0], RECIPE_INDEX_PIECES);
    assert_eq!(
        decode_recipe_object(&b4).unwrap(),
        RecipeObject::Index(pieces.clone())
    );
    // Without continued files no piece is kept: version 2.
    let plain = RecipeIndex {
        continued: false,
        ..pieces
    };
    assert_eq!(encode_recipe_index(&plain).unwrap(), bytes);
    let mut future = bytes.clone();
    future[0] = 9;
    assert!(decode_recipe_object(&future).is_err());
    assert!(decode_recipe_object(&[]).is_err());
    assert!(decode_recipe_object(&bytes[..bytes.len() - 1]).is_err());
}

#[test]
fn version_is_checked() {
    let l = LockInfo {
        host: "h".into(),
        pid: 1,
        time: 2,
        exclusive: true,
        operation: "gc".into(),
        expires: 3,
    };
    let mut b = encode_lock(&l).unwrap();
    assert_eq!(decode_lock(&b).unwrap(), l);
    b[0] = 9;
    assert!(matches!(
        decode_lock(&b),
        Err(CoreError::UnknownVersion { found: 9, .. })
    ));
    assert!(decode_lock(&[]).is_err());
    assert!(decode_lock(&[LOCK_VERSION, 1]).is_err());
    // A lock of version 1 (no lease) still reads, never expiring.
    let v1 = encode(&(&l.host, l.pid, l.time, l.exclusive, &l.operation)).unwrap();
    assert_eq!(decode_lock(&v1).unwrap(), LockInfo { expires: 0, ..l });
}

#[test]
fn snapshots_of_versions_1_and_2_still_read() {
    #[derive(Serialize)]
    struct V1Archival {
        next: Option<String>,
        converted_ns: i64,
        direct_chunks: u64,
        direct_bytes: u64,
        indirect_chunks: u64,
        indirect_bytes: u64,
    }
    let mut s = Snapshot {
        series: "s".into(),
        version: 3,
        time_ns: 5,
        host: "h".into(),
        paths: vec!["/p".into()],
        tags: vec![],
        recipe: RecipeId::parse(&"11".repeat(32)).unwrap(),
        parent: None,
        chunker: ChunkerParams::cdc(8192),
        stats: SnapshotStats::default(),
        archival: None,
        tier: Tier::Active,
        cloud_part: None,
    };
    // A version-1 object: the same fields, the archival record without
    // released_bytes.
    let old = (
        &s.series,
        s.version,
        s.time_ns,
        &s.host,
        &s.paths,
        &s.tags,
        &s.recipe,
        &s.parent,
        s.chunker,
        &s.stats,
        Some(V1Archival {
            next: Some("ee".repeat(32)),
            converted_ns: 7,
            direct_chunks: 1,
            direct_bytes: 2,
            indirect_chunks: 3,
            indirect_bytes: 4,
        }),
    );
    let bytes = postcard::to_extend(&old, vec![1]).unwrap();
    let got = decode_snapshot(&bytes).unwrap();
    s.archival = Some(Archival {
        next: Some(SnapshotId::parse(&"ee".repeat(32)).unwrap()),
        converted_ns: 7,
        direct_chunks: 1,
        direct_bytes: 2,
        indirect_chunks: 3,
        indirect_bytes: 4,
        released_bytes: 0,
    });
    assert_eq!(got, s);
    // A version-2 object: no tier; it reads as active.
    s.archival.as_mut().unwrap().released_bytes = 9;
    let v2 = (
        &s.series,
        s.version,
        s.time_ns,
        &s.host,
        &s.paths,
        &s.tags,
        &s.recipe,
        &s.parent,
        s.chunker,
        &s.stats,
        &s.archival,
    );
    let bytes = postcard::to_extend(&v2, vec![2]).unwrap();
    assert_eq!(decode_snapshot(&bytes).unwrap(), s);
    // A version-3 object: a tier, no cloud part.
    s.tier = Tier::Cloud;
    let v3 = (
        &s.series,
        s.version,
        s.time_ns,
        &s.host,
        &s.paths,
        &s.tags,
        &s.recipe,
        &s.parent,
        s.chunker,
        &s.stats,
        &s.archival,
        s.tier,
    );
    let bytes = postcard::to_extend(&v3, vec![3]).unwrap();
    assert_eq!(decode_snapshot(&bytes).unwrap(), s);
    // Version 4 round-trips, with the new fields.
    s.cloud_part = Some(CloudPart {
        recipe: RecipeId::parse(&"22".repeat(32)).unwrap(),
        paths: vec!["/logs/**".into()],
        files: 2,
        logical_bytes: 3,
        moved_ns: 4,
    });
    assert_eq!(decode_snapshot(&encode_snapshot(&s).unwrap()).unwrap(), s);
    assert_eq!(
        s.recipes().map(|r| r.as_str()).collect::<Vec<_>>(),
        ["11".repeat(32), "22".repeat(32)]
    );
    assert!(matches!(
        decode_snapshot(&[5, 0]),
        Err(CoreError::UnknownVersion { found: 5, .. })
    ));
}

#[test]
fn footer_roundtrip() {
    let f = ContainerFooter {
        meta_offset: 12345,
        meta_len: 77,
    };
    assert_eq!(ContainerFooter::parse(&f.to_bytes()).unwrap(), f);
    let mut b = f.to_bytes();
    b[15] = 0;
    assert!(ContainerFooter::parse(&b).is_err());
}

#[test]
fn a_snapshot_naming_a_bad_id_is_refused_in_words() {
    // Version 3's layout, with the recipe id given.
    let v3 = |recipe: String| {
        let fields = (
            "s",
            1u32,
            5i64,
            "h",
            Vec::<String>::new(),
            Vec::<String>::new(),
            recipe,
            None::<String>,
            ChunkerParams::cdc(8192),
            SnapshotStats::default(),
            None::<Archival>,
            Tier::Active,
        );
        postcard::to_extend(&fields, vec![3]).unwrap()
    };
    // A recipe id that is not 64 hex digits.
    let e = decode_snapshot(&v3("../../config".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("64 lowercase hex digits"), "{e}");
    // The same with a real id decodes.
    assert_eq!(
        decode_snapshot(&v3("ab".repeat(32)))
            .unwrap()
            .recipe
            .as_str(),
        "ab".repeat(32)
    );
}

/// Container metadata and index objects without delta regions encode as
/// version 1, exactly what builds before deltas wrote (those decode them);
/// with delta regions as version 2, which round-trips; malformed delta
/// regions are refused.
#[test]
fn metadata_with_and_without_delta_regions() {
    let fp = |b: u8| Fingerprint([b; 32]);
    let mut meta = ContainerMeta {
        id: ContainerId([3; 16]),
        data_len: 100,
        created: 5,
        stamp: None,
        regions: vec![
            RegionInfo {
                offset: 8,
                stored_len: 40,
                raw_len: 4096,
            };
            2
        ],
        chunks: vec![ChunkEntry {
            fp: fp(1),
            region: 1,
            offset: 0,
            len: 4096,
        }],
        segments: vec![],
        deltas: vec![],
    };
    // Version 1: the fields before deltas, in order.
    #[derive(serde::Serialize)]
    struct Before<'a> {
        id: &'a ContainerId,
        data_len: u64,
        created: i64,
        stamp: &'a Option<Stamp>,
        regions: &'a [RegionInfo],
        chunks: &'a [ChunkEntry],
        segments: &'a [SegmentEntry],
    }
    let before = |m: &ContainerMeta| {
        encode(&Before {
            id: &m.id,
            data_len: m.data_len,
            created: m.created,
            stamp: &m.stamp,
            regions: &m.regions,
            chunks: &m.chunks,
            segments: &m.segments,
        })
        .unwrap()
    };
    assert_eq!(encode_meta(&meta).unwrap(), before(&meta));
    assert_eq!(decode_meta(&before(&meta)).unwrap(), meta);
    let object = IndexObject {
        containers: vec![meta.clone(), meta.clone()],
    };
    let v1 = encode_index_object(&object).unwrap();
    assert_eq!(v1[0], 1);
    assert_eq!(decode_index_object(&v1).unwrap(), object);

    let base = BaseRef {
        fp: fp(9),
        container: ContainerId([4; 16]),
        region: 0,
        offset: 0,
        len: 4000,
    };
    meta.deltas = vec![DeltaRegion {
        region: 1,
        bases: vec![base],
        chunk_bases: vec![0],
    }];
    let v2 = encode_meta(&meta).unwrap();
    assert_eq!(v2[0], DELTA_META_VERSION);
    assert_eq!(decode_meta(&v2).unwrap(), meta);
    assert_eq!(meta.delta_of(1).unwrap().bases, vec![base]);
    assert!(meta.delta_of(0).is_none());
    assert_eq!(meta.base_of(1, 0), Some(&base));
    assert_eq!(meta.base_of(1, 5), None);
    let object = IndexObject {
        containers: vec![object.containers[0].clone(), meta.clone()],
    };
    let v2 = encode_index_object(&object).unwrap();
    assert_eq!(v2[0], DELTA_META_VERSION);
    assert_eq!(decode_index_object(&v2).unwrap(), object);

    let refused = |m: &ContainerMeta| decode_meta(&encode_meta(m).unwrap()).is_err();
    let mut bad = meta.clone();
    bad.deltas[0].region = 2;
    assert!(refused(&bad), "a region the container lacks");
    let mut bad = meta.clone();
    bad.deltas.push(bad.deltas[0].clone());
    assert!(refused(&bad), "a region twice");
    let mut bad = meta.clone();
    bad.deltas[0].bases.clear();
    assert!(refused(&bad), "no base");
    let mut bad = meta.clone();
    bad.deltas[0].bases[0].container = meta.id;
    assert!(refused(&bad), "a base in its own container");
    let mut bad = meta.clone();
    bad.deltas[0].chunk_bases = vec![1];
    assert!(refused(&bad), "a chunk's base not listed");
    let mut bad = meta.clone();
    bad.deltas[0].chunk_bases = vec![0, 0];
    assert!(refused(&bad), "more chunk bases than chunks");
    let mut bad = meta.clone();
    bad.deltas[0].bases = vec![base; MAX_DELTA_BASES + 1];
    assert!(refused(&bad), "too many bases");
    let mut bad = meta.clone();
    bad.deltas[0].bases[0].len = (MAX_DELTA_PREFIX + 1) as u32;
    assert!(refused(&bad), "too long a prefix");
    let mut future = encode_meta(&meta).unwrap();
    future[0] = 3;
    assert!(decode_meta(&future).is_err());
}
