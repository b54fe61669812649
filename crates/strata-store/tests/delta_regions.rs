//! Delta regions at the container level: chunks stored as deltas against
//! bases in another container read back byte-exact through the one
//! region reader every command uses, in plain and encrypted repositories;
//! a delta region whose base is gone or damaged fails naming it; a
//! location asked for and never used leaves a well-formed container.

use std::sync::Arc;
use strata_core::format::{BaseRef, ContainerMeta};
use strata_store::engine::index::ContainerTable;
use strata_store::engine::writer::ContainerSink;
use strata_store::repo::container::read_meta;
use strata_store::repo::index::put_index_object;
use strata_store::repo::region::read_region;
use strata_store::{InitOptions, LocalBackend, Repository};

fn text(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    (0..n)
        .flat_map(|_| {
            let len = 2 + next() % 8;
            let mut w: Vec<u8> = (0..len).map(|_| b'a' + (next() % 26) as u8).collect();
            w.push(b' ');
            w
        })
        .collect()
}

fn repo(dir: &std::path::Path, password: Option<&[u8]>) -> Repository {
    let opts = InitOptions {
        password: password.map(<[u8]>::to_vec),
        kdf: strata_core::crypto::KdfCost {
            memory_kib: 64,
            iterations: 1,
        },
        container_size: 256 << 10,
        region_size: 32 << 10,
        delta: true,
        ..Default::default()
    };
    Repository::init(Arc::new(LocalBackend::new(dir)), opts).unwrap()
}

/// Every chunk of `meta`, read through the region reader.
fn chunks_read(repo: &Repository, meta: &ContainerMeta) -> Vec<Vec<u8>> {
    meta.chunks
        .iter()
        .map(|c| {
            let plain = read_region(repo, &meta.id, &meta.regions[c.region as usize]).unwrap();
            plain[c.offset as usize..(c.offset + c.len) as usize].to_vec()
        })
        .collect()
}

/// Writes `bases` whole into one container, then `edits` (one per base,
/// each a small change of it) as deltas, interleaved with new chunks
/// stored whole, into another. Returns both containers' metadata.
fn write_both(
    repo: &Repository,
    bases: &[Vec<u8>],
    edits: &[Vec<u8>],
    fresh: &[Vec<u8>],
) -> (ContainerMeta, ContainerMeta) {
    let table = Arc::new(ContainerTable::default());
    let sink = ContainerSink::start(repo);
    let mut w = sink.writer(repo, table.clone());
    let mut base_refs = Vec::new();
    for b in bases {
        let fp = repo.hasher().hash(b);
        let loc = w.next_loc(b.len()).unwrap();
        w.append(fp, b);
        base_refs.push((fp, loc));
    }
    w.flush().unwrap();
    drop(w);
    let first = sink.finish().unwrap().metas.remove(0);
    let base_refs: Vec<BaseRef> = base_refs
        .into_iter()
        .map(|(fp, loc)| BaseRef {
            fp,
            container: first.id,
            region: loc.region,
            offset: loc.offset,
            len: loc.len,
        })
        .collect();

    let sink = ContainerSink::start(repo);
    let mut w = sink.writer(repo, table);
    // A location asked for and given up (another worker stored the chunk).
    w.next_loc(100).unwrap();
    for (i, e) in edits.iter().enumerate() {
        let fp = repo.hasher().hash(e);
        let b = base_refs[i];
        w.next_delta_loc(e.len(), &b).unwrap().unwrap();
        w.append_delta(fp, e, b, Arc::new(bases[i].clone()));
        if let Some(f) = fresh.get(i) {
            w.next_loc(f.len()).unwrap();
            w.append(repo.hasher().hash(f), f);
        }
    }
    // And one delta location given up at the end.
    w.next_delta_loc(10, &base_refs[0]).unwrap();
    w.flush().unwrap();
    drop(w);
    let second = sink.finish().unwrap().metas;
    put_index_object(repo, vec![first.clone()]).unwrap();
    put_index_object(repo, second.clone()).unwrap();
    assert_eq!(second.len(), 1, "one container of deltas");
    (first, second.into_iter().next().unwrap())
}

#[test]
fn delta_regions_read_back_exactly() {
    for password in [None, Some(&b"pw"[..])] {
        let t = tempfile::tempdir().unwrap();
        let repo = repo(t.path(), password);
        let bases: Vec<Vec<u8>> = (0..12).map(|i| text(1500, 10 + i)).collect();
        let edits: Vec<Vec<u8>> = bases
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut e = b.clone();
                e.splice(100 + i..120 + i, b"an edit".iter().copied());
                e
            })
            .collect();
        let fresh: Vec<Vec<u8>> = (0..5).map(|i| text(900, 100 + i)).collect();
        let (first, second) = write_both(&repo, &bases, &edits, &fresh);
        assert!(first.deltas.is_empty());
        assert!(!second.deltas.is_empty());
        // Metadata as stored says the same.
        assert_eq!(read_meta(&repo, &second.id).unwrap(), second);
        let got = chunks_read(&repo, &second);
        let mut want: Vec<Vec<u8>> = Vec::new();
        for (i, e) in edits.iter().enumerate() {
            want.push(e.clone());
            if let Some(f) = fresh.get(i) {
                want.push(f.clone());
            }
        }
        assert_eq!(got, want);
        // Deltas take a fraction of what the edits take compressed alone.
        let delta_bytes: u64 = second
            .deltas
            .iter()
            .map(|d| second.regions[d.region as usize].stored_len as u64)
            .sum();
        let alone: usize = edits
            .iter()
            .map(|e| {
                repo.sealer()
                    .seal(strata_core::crypto::Kind::Region, e, true)
                    .unwrap()
                    .len()
            })
            .sum();
        assert!(
            delta_bytes * 5 < alone as u64,
            "{delta_bytes} bytes of deltas against {alone} alone"
        );
        assert!(
            repo.deltas()
                .base_reads
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
    }
}

#[test]
fn a_delta_whose_base_is_gone_or_damaged_fails_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let repo1 = repo(t.path(), None);
    let bases: Vec<Vec<u8>> = (0..3).map(|i| text(1500, 20 + i)).collect();
    let edits: Vec<Vec<u8>> = bases.iter().map(|b| [&b[..], b"tail"].concat()).collect();
    let (first, second) = write_both(&repo1, &bases, &edits, &[]);
    let data = |id: &strata_core::format::ContainerId| {
        let h = id.to_hex();
        t.path().join("data").join(&h[..2]).join(h)
    };
    // Damaged: a byte of the base's region flipped.
    let path = data(&first.id);
    let orig = std::fs::read(&path).unwrap();
    let mut bad = orig.clone();
    let at = first.regions[0].offset as usize + 20;
    bad[at] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let d = &second.deltas[0];
    let repo2 =
        Repository::open(Arc::new(LocalBackend::new(t.path())), &|| Ok(Vec::new())).unwrap();
    let e = read_region(&repo2, &second.id, &second.regions[d.region as usize])
        .unwrap_err()
        .to_string();
    assert!(e.contains(&first.id.to_hex()), "{e}");
    // Gone.
    std::fs::remove_file(&path).unwrap();
    let h = first.id.to_hex();
    std::fs::remove_file(t.path().join("meta").join(&h[..2]).join(&h)).unwrap();
    let repo3 =
        Repository::open(Arc::new(LocalBackend::new(t.path())), &|| Ok(Vec::new())).unwrap();
    let e = read_region(&repo3, &second.id, &second.regions[d.region as usize])
        .unwrap_err()
        .to_string();
    assert!(e.contains(&first.id.to_hex()) && e.contains("gone"), "{e}");
}
