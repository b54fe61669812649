//! Unit tests of recipes in parts: reading, writing, sharing.
use super::writer::{put, RecipeWriter};
use super::*;
use crate::backend::LocalBackend;
use crate::repo::InitOptions;
use std::sync::Arc;
use strata_core::format::{ChunkRef, NodeKind, SegmentRef};
use strata_core::Fingerprint;

fn repo(dir: &std::path::Path) -> Repository {
    Repository::init(Arc::new(LocalBackend::new(dir)), InitOptions::default()).unwrap()
}

fn node(path: &str, container: u32) -> Node {
    Node {
        mode: 0o644,
        size: 5,
        segments: vec![SegmentRef {
            fp: Fingerprint([1; 32]),
            chunks: vec![ChunkRef {
                fp: Fingerprint([2; 32]),
                len: 5,
                container,
                region: 0,
                offset: 0,
            }],
        }],
        ..Node::new(path.as_bytes().to_vec(), NodeKind::File)
    }
}

fn tree(n: usize) -> Recipe {
    Recipe {
        containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
        nodes: (0..n)
            .map(|i| node(&format!("d{}/f{i:05}", i % 7), (i % 4) as u32))
            .collect(),
    }
}

/// The container each node's reference names, by path.
fn refs(r: &Recipe) -> Vec<(Vec<u8>, ContainerId)> {
    let mut v: Vec<_> = r
        .nodes
        .iter()
        .map(|n| {
            (
                n.path.clone(),
                r.containers[n.segments[0].chunks[0].container as usize],
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn parts_round_trip_and_are_shared() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let t = tree(5000);
    let (id, _) = put(&repo, t.clone()).unwrap();
    let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
        panic!("a new recipe is an index")
    };
    assert!(idx.parts.len() > 2, "{} parts", idx.parts.len());
    let back = load_whole(&repo, &id).unwrap();
    assert_eq!(back.nodes.len(), 5000);
    assert_eq!(refs(&back), refs(&t));
    assert!(back
        .nodes
        .windows(2)
        .all(|w| path_cmp(&w[0].path, &w[1].path).is_lt()));
    // One file changed: most parts are those of the first version.
    let mut t2 = t.clone();
    t2.nodes[2500].size = 6;
    let mut w = RecipeWriter::new(&repo);
    w.push_recipe(t2).unwrap();
    let (written, reused) = (w.parts_written, w.parts_reused);
    let (id2, _) = w.finish().unwrap();
    assert_eq!(written, 1, "{reused} reused");
    assert!(reused >= 2);
    // Deleting the first recipe keeps the parts the second uses.
    assert_eq!(delete_unused(&repo, [&id, &id2]).unwrap(), 2);
    assert!(repo.backend().list("parts/").unwrap().is_empty());
}

#[test]
fn version_1_recipes_still_read() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let t = tree(10);
    let (id, _) = repo.put_struct(Kind::Recipe, "recipes", &t).unwrap();
    let id = RecipeId::parse(&id).unwrap();
    assert_eq!(load_whole(&repo, &id).unwrap(), t);
    assert!(part_ids(&repo, &id).unwrap().is_empty());
}

/// A crafted recipe naming one path twice (version 1), or with its
/// parts swapped (each part intact), is refused, not restored twice.
#[test]
fn duplicate_and_disordered_paths_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let mut t = tree(10);
    t.nodes[5].path = t.nodes[3].path.clone();
    let (id, _) = repo.put_struct(Kind::Recipe, "recipes", &t).unwrap();
    let id = RecipeId::parse(&id).unwrap();
    let e = load_whole(&repo, &id).unwrap_err().to_string();
    assert!(
        e.contains("appears twice") && e.contains(id.as_str()),
        "{e}"
    );

    let (id, _) = put(&repo, tree(3000)).unwrap();
    let RecipeObject::Index(mut idx) = load_object(&repo, &id).unwrap() else {
        panic!("a new recipe is an index")
    };
    idx.parts.swap(0, 1);
    let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
    let (bad, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
    let bad = RecipeId::parse(&bad).unwrap();
    let e = load_whole(&repo, &bad).unwrap_err().to_string();
    assert!(e.contains("comes after"), "{e}");
    assert!(
        e.contains(&part_name(&idx.parts[1].id)) || e.contains("parts/"),
        "{e}"
    );
}

#[test]
fn bad_names_and_swapped_parts_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    // A whole recipe stored under another recipe's name.
    let (r1, _) = put(&repo, tree(10)).unwrap();
    let (r2, _) = put(&repo, tree(20)).unwrap();
    let other = repo.backend().get(&format!("recipes/{r2}")).unwrap();
    repo.backend()
        .put(&format!("recipes/{r1}"), &other)
        .unwrap();
    let e = load_whole(&repo, &r1).unwrap_err().to_string();
    assert!(e.contains("does not match its name"), "{e}");
    // Names that would leave the object's path are no ids at all.
    assert!(RecipeId::parse("../config").is_err());
    assert!(PartId::parse("../../etc/passwd").is_err());
    let (id, _) = put(&repo, tree(3000)).unwrap();
    // Such a name forged into a stored recipe index (in its bytes: no
    // part id of that name can be made) is refused where it is read.
    let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
        panic!("a recipe in parts is stored as an index")
    };
    let good = idx.parts[0].id.to_string();
    let evil = format!("{}etc/passwd", "../".repeat(18));
    assert_eq!(evil.len(), good.len());
    let mut bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
    // (Unforged, the same bytes load.)
    let (same, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
    load_whole(&repo, &RecipeId::parse(&same).unwrap()).unwrap();
    let at = bytes
        .windows(good.len())
        .position(|w| w == good.as_bytes())
        .expect("the part's name in the encoding");
    bytes[at..at + evil.len()].copy_from_slice(evil.as_bytes());
    let (forged, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
    let forged = RecipeId::parse(&forged).unwrap();
    let e = load_object(&repo, &forged).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
    assert!(part_ids(&repo, &forged).is_err());
    assert!(load_whole(&repo, &forged).is_err());
    let ids = part_ids(&repo, &id).unwrap();
    let (a, b) = (part_name(&ids[0]), part_name(&ids[1]));
    let other = repo.backend().get(&b).unwrap();
    repo.backend().put(&a, &other).unwrap();
    let e = load_whole(&repo, &id).unwrap_err().to_string();
    assert!(e.contains("does not match its name"), "{e}");
}

#[test]
fn out_of_order_nodes_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let mut w = RecipeWriter::new(&repo);
    w.push(node("b", 0), |_| Some(ContainerId([0; 16])))
        .unwrap();
    assert!(w
        .push(node("a", 0), |_| Some(ContainerId([0; 16])))
        .is_err());
}

/// A file of `segments` segments of 512 chunks each (the pieces cut
/// every [`PIECE_CHUNKS`] chunks), its chunks spread over 4 containers.
fn big_file(path: &str, segments: usize) -> Node {
    let segments: Vec<SegmentRef> = (0..segments)
        .map(|s| SegmentRef {
            fp: Fingerprint([s as u8; 32]),
            chunks: (0..512u32)
                .map(|c| ChunkRef {
                    fp: Fingerprint([(c % 251) as u8; 32]),
                    len: 4096,
                    container: (s as u32 + c) % 4,
                    region: s as u32,
                    offset: c * 4096,
                })
                .collect(),
        })
        .collect();
    let size = segments.iter().map(SegmentRef::len).sum();
    Node {
        mode: 0o600,
        size,
        segments,
        ..Node::new(path.as_bytes().to_vec(), NodeKind::File)
    }
}

/// Each whole piece of a large file is a part of its own: a version
/// that changes one chunk of the file writes one part again (the
/// piece's), and shares all the others with the version before.
#[test]
fn a_changed_piece_is_the_only_part_written_again() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let mut t = Recipe {
        nodes: vec![big_file("vm.img", 256)], // 131072 chunks: 8 pieces
        containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
    };
    let (v1, _) = put(&repo, t.clone()).unwrap();
    let p1 = part_ids(&repo, &v1).unwrap();
    assert_eq!(p1.len(), 8, "one part per piece");
    t.nodes[0].segments[100].chunks[7].offset += 1;
    let (v2, _) = put(&repo, t).unwrap();
    let p2 = part_ids(&repo, &v2).unwrap();
    let new: Vec<_> = p2.iter().filter(|p| !p1.contains(p)).collect();
    assert_eq!(new.len(), 1, "{new:?}");
}

/// Each whole piece's part reference tells the piece (structure
/// version 4): where it begins, its bytes and segments, its metadata's
/// hash; a reference telling another piece than its part holds (which
/// a new version would take over unread) is refused by every reader.
#[test]
fn a_part_tells_its_piece_and_a_wrong_one_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let t = Recipe {
        nodes: vec![big_file("vm.img", 96)], // 3 pieces
        containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
    };
    let (id, _) = put(&repo, t).unwrap();
    let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
        panic!("a new recipe is an index")
    };
    assert!(idx.continued, "pieces");
    let told: Vec<(u64, u64, u32, u64)> = idx
        .parts
        .iter()
        .map(|p| p.piece.as_ref().expect("each part holds a piece"))
        .map(|p| (p.offset, p.len, p.segment, p.direct_chunks))
        .collect();
    let piece = 32 * (2 << 20);
    assert_eq!(
        told,
        [0, 1, 2]
            .map(|k| (k * piece, piece, 2 << 20, 16384))
            .to_vec()
    );
    assert!(load_whole(&repo, &id).is_ok());
    for bad in 0..3 {
        let mut idx = idx.clone();
        let p = idx.parts[1].piece.as_mut().unwrap();
        match bad {
            0 => p.offset += 4096,
            1 => p.meta = Fingerprint([9; 32]),
            _ => p.len -= 4096,
        }
        let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
        let (wrong, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
        let wrong = RecipeId::parse(&wrong).unwrap();
        let e = load_whole(&repo, &wrong).unwrap_err().to_string();
        assert!(e.contains("another piece"), "{bad}: {e}");
    }
}

/// A part taken over (`push_part`) ends the part in the making first,
/// reads back as the file's piece, and is refused when it comes
/// first, when its metadata differs, with a mirror, and (at the end)
/// when it was found damaged meanwhile.
#[test]
fn a_part_taken_over_reads_back_and_is_checked() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let table: Vec<ContainerId> = (0..4).map(|i| ContainerId([i as u8; 16])).collect();
    let of = |i: u32| table.get(i as usize).copied();
    // An earlier version's parts: three whole pieces of vm.img.
    let (v1, _) = put(
        &repo,
        Recipe {
            nodes: vec![big_file("vm.img", 96)],
            containers: table.clone(),
        },
    )
    .unwrap();
    let old = match load_object(&repo, &v1).unwrap() {
        RecipeObject::Index(i) => i,
        RecipeObject::Whole(_) => unreachable!(),
    };
    let piece = |k: usize| {
        let p = &old.parts[k];
        let ids: Vec<ContainerId> = p
            .containers
            .iter()
            .map(|&c| old.containers[c as usize])
            .collect();
        (
            PartRef {
                containers: Vec::new(),
                ..p.clone()
            },
            ids,
        )
    };
    let file = big_file("vm.img", 96);
    let meta = Node {
        segments: Vec::new(),
        ..file.clone()
    };
    let first = Node {
        segments: file.segments[..32].to_vec(),
        ..meta.clone()
    };
    // Piece 0 pushed, pieces 1 and 2 taken over: the same recipe.
    let mut w = RecipeWriter::new(&repo);
    w.push(first.clone(), of).unwrap();
    for k in 1..3 {
        let (p, ids) = piece(k);
        w.push_part(&p, &ids, &meta).unwrap();
    }
    assert_eq!(w.parts_reused, 3, "piece 0 existed too");
    let (v2, _) = w.finish().unwrap();
    assert_eq!(v2, v1);
    assert!(load_whole(&repo, &v2).unwrap().nodes[0] == file);
    // After a short piece still in the making: it is cut first.
    let mut w = RecipeWriter::new(&repo);
    w.push(
        Node {
            segments: file.segments[..3].to_vec(),
            ..meta.clone()
        },
        of,
    )
    .unwrap();
    let (p, ids) = piece(1);
    w.push_part(&p, &ids, &meta).unwrap();
    assert_eq!(w.parts_written, 1);
    let got = load_whole(&repo, &w.finish().unwrap().0).unwrap();
    assert_eq!(got.nodes[0].segments.len(), 3 + 32);
    // Refused: first, other metadata, a mirror.
    let mut w = RecipeWriter::new(&repo);
    assert!(w.push_part(&p, &ids, &meta).is_err());
    w.push(first.clone(), of).unwrap();
    let other = Node {
        mtime_ns: 1,
        ..meta.clone()
    };
    assert!(w.push_part(&p, &ids, &other).is_err());
    let d2 = tempfile::tempdir().unwrap();
    let mirror = super::tests::repo(d2.path());
    let mut w = RecipeWriter::new(&repo).with_mirror(&mirror);
    w.push(first.clone(), of).unwrap();
    assert!(w.push_part(&p, &ids, &meta).is_err());
    // Found damaged before the end: nothing committed.
    let suspects: Arc<Mutex<HashSet<PartId>>> = Arc::default();
    let mut w = RecipeWriter::new(&repo).with_suspects(suspects.clone());
    w.push(first, of).unwrap();
    w.push_part(&p, &ids, &meta).unwrap();
    suspects.lock().unwrap().insert(p.id.clone());
    let e = w.finish().unwrap_err();
    assert!(e.to_string().contains("found damaged"), "{e}");
}

/// A file larger than a piece is stored as several nodes of its path
/// (a recipe of structure version 3, over several parts) and read back
/// as one node; pushing it a piece at a time writes the same parts.
#[test]
fn large_files_are_stored_in_pieces() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let mut t = tree(20);
    t.nodes.push(big_file("d3/huge", 400)); // 204800 chunks: 13 pieces
    t.nodes.push(node("d3/z", 1));
    let (id, _) = put(&repo, t.clone()).unwrap();
    let RecipeObject::Index(idx) = load_object(&repo, &id).unwrap() else {
        panic!("a new recipe is an index")
    };
    assert!(idx.continued);
    assert!(idx.parts.len() >= 2, "{} parts", idx.parts.len());
    let mut pieces = 0;
    let mut largest = 0;
    for_each_part(&repo, &id, |p| {
        for n in &p.nodes {
            let c: usize = n.segments.iter().map(|s| s.chunks.len()).sum();
            largest = largest.max(c);
            pieces += (n.path == b"d3/huge") as usize;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(pieces, 13);
    assert!(largest <= PIECE_CHUNKS, "{largest}");
    let back = load_whole(&repo, &id).unwrap();
    let mut sorted = t.clone();
    sorted.nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
    assert_eq!(back.nodes.len(), sorted.nodes.len());
    for (a, b) in back.nodes.iter().zip(&sorted.nodes) {
        let refs = |n: &Node, r: &Recipe| -> Vec<(Fingerprint, ContainerId, u32, u32)> {
            n.segments
                .iter()
                .flat_map(|s| &s.chunks)
                .map(|c| (c.fp, r.containers[c.container as usize], c.region, c.offset))
                .collect()
        };
        assert_eq!(refs(a, &back), refs(b, &sorted));
        assert_eq!(
            Node {
                segments: vec![],
                ..a.clone()
            },
            Node {
                segments: vec![],
                ..b.clone()
            }
        );
    }
    // The same file pushed as pieces by a caller: the same recipe.
    let table = t.containers.clone();
    let mut w = RecipeWriter::new(&repo);
    let mut nodes = sorted.nodes.clone();
    for n in nodes.drain(..) {
        if n.path != b"d3/huge" {
            w.push(n, |i| table.get(i as usize).copied()).unwrap();
            continue;
        }
        for piece in n.segments.chunks(32) {
            let p = Node {
                segments: piece.to_vec(),
                ..n.clone()
            };
            w.push(p, |i| table.get(i as usize).copied()).unwrap();
        }
    }
    assert_eq!(w.finish().unwrap().0, id);
    // A recipe without pieces keeps structure version 2.
    let (small, _) = put(&repo, tree(20)).unwrap();
    let RecipeObject::Index(i2) = load_object(&repo, &small).unwrap() else {
        panic!("a new recipe is an index")
    };
    assert!(!i2.continued);
}

/// Pieces are refused where they cannot be: a version-2 recipe naming
/// a path twice, or pieces that disagree on the file's metadata.
#[test]
fn pieces_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let (id, _) = put(
        &repo,
        Recipe {
            containers: (0..4).map(|i| ContainerId([i as u8; 16])).collect(),
            nodes: vec![big_file("f", 40)],
        },
    )
    .unwrap();
    let RecipeObject::Index(mut idx) = load_object(&repo, &id).unwrap() else {
        panic!("a new recipe is an index")
    };
    idx.continued = false;
    let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
    let (v2, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
    let v2 = RecipeId::parse(&v2).unwrap();
    let e = load_whole(&repo, &v2).unwrap_err().to_string();
    assert!(e.contains("appears twice"), "{e}");

    // The writer refuses a path twice unless as pieces of one file.
    let table = [ContainerId([0; 16]); 4];
    let mut w = RecipeWriter::new(&repo);
    let f = big_file("f", 2);
    w.push(f.clone(), |i| table.get(i as usize).copied())
        .unwrap();
    let e = w
        .push(
            Node {
                mode: 0o644,
                ..f.clone()
            },
            |i| table.get(i as usize).copied(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    // A recipe whose pieces disagree (two recipes' parts, joined by
    // hand) is refused.
    let one = Recipe {
        containers: table.to_vec(),
        nodes: vec![f.clone()],
    };
    let two = Recipe {
        containers: table.to_vec(),
        nodes: vec![Node { mode: 0o644, ..f }],
    };
    let (r1, _) = put(&repo, one).unwrap();
    let (r2, _) = put(&repo, two).unwrap();
    let (RecipeObject::Index(mut idx), RecipeObject::Index(i2)) = (
        load_object(&repo, &r1).unwrap(),
        load_object(&repo, &r2).unwrap(),
    ) else {
        panic!("new recipes are indexes")
    };
    idx.parts.extend(i2.parts);
    idx.continued = true;
    let bytes = strata_core::format::encode_recipe_index(&idx).unwrap();
    let (bad, _) = repo.put_encoded(Kind::Recipe, "recipes", &bytes).unwrap();
    let bad = RecipeId::parse(&bad).unwrap();
    let e = load_whole(&repo, &bad).unwrap_err().to_string();
    assert!(e.contains("disagree"), "{e}");
}

/// With the previous version's parts as bases, a new version whose nodes
/// changed a little stores its parts as deltas: they read back the same,
/// and the recipe needs their bases.
#[test]
fn parts_are_stored_as_deltas_against_the_previous_version() {
    let d = tempfile::tempdir().unwrap();
    let repo = repo(d.path());
    let mut t = tree(5000);
    // Fingerprints as random as real ones.
    for n in &mut t.nodes {
        let fp = repo.hasher().hash(&n.path);
        n.segments[0].fp = fp;
        n.segments[0].chunks[0].fp = repo.hasher().hash(&fp.0);
    }
    let (id1, _) = put(&repo, t.clone()).unwrap();
    let RecipeObject::Index(idx1) = load_object(&repo, &id1).unwrap() else {
        panic!("a new recipe is an index")
    };
    let mut t2 = t.clone();
    for (i, n) in t2.nodes.iter_mut().enumerate() {
        n.mtime_ns = 1_700_000_000_000_000_000 + i as i64;
    }
    let mut w =
        RecipeWriter::new(&repo).with_part_bases(super::writer::PartBases::of_parts(&idx1.parts));
    w.push_recipe(t2.clone()).unwrap();
    let (deltas, written) = (w.parts_as_deltas(), w.parts_written);
    let (id2, _) = w.finish().unwrap();
    let deltas = deltas.load(std::sync::atomic::Ordering::Relaxed);
    // (The last part is written by `finish`.)
    assert_eq!(deltas, written + 1, "every part written is a delta");
    assert!(deltas >= 2);
    let back = load_whole(&repo, &id2).unwrap();
    assert_eq!(back.nodes.len(), 5000);
    t2.nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
    assert!(back
        .nodes
        .iter()
        .zip(&t2.nodes)
        .all(|(a, b)| a.mtime_ns == b.mtime_ns && a.path == b.path));
    let needed: HashSet<PartId> = needed_parts(&repo, &id2).unwrap().into_iter().collect();
    assert!(idx1.parts.iter().all(|p| needed.contains(&p.id)));
    // A base gone: the part names it.
    let base = &idx1.parts[0].id;
    repo.backend().delete(&part_name(base)).unwrap();
    let e = load_whole(&repo, &id2).unwrap_err().to_string();
    assert!(e.contains(base.as_str()), "{e}");
}
