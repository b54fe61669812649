//! The checks every backend passes (restic's backend test suite is the
//! model): naming, whole and ranged reads, missing objects, listing,
//! deletion, streamed writes that appear only when finished, concurrency.
//! Backends' tests call [`run`]; it works inside a fresh folder, so it can
//! run against a shared bucket, and removes what it wrote.

use crate::object::{Backend, ErrorKind, ObjectWriter};
use std::sync::Arc;

type Check = std::result::Result<(), String>;

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[seed as usize % 4] ^ seed)
        .collect()
}

/// Runs every check on `b`; the first failure is returned in words.
pub fn run(b: Arc<dyn Backend>) -> Check {
    let mut id = [0u8; 6];
    let _ = getrandom::getrandom(&mut id);
    let dir = format!("conformance-{}", hex::encode(id));
    let r = (|| {
        names(b.as_ref(), &dir)?;
        whole_objects(b.as_ref(), &dir)?;
        ranges(b.as_ref(), &dir)?;
        listing(b.as_ref(), &dir)?;
        streamed(&b, &dir)?;
        concurrent(&b, &dir)
    })();
    if let Ok(all) = b.list(&format!("{dir}/")) {
        for o in all {
            let _ = b.delete(&o.name);
        }
    }
    r
}

fn names(b: &dyn Backend, dir: &str) -> Check {
    for bad in [
        "../escape",
        "/abs",
        "a//b",
        "a/./b",
        "x/../../y",
        ".hidden",
        "a b",
    ] {
        let e = b.put(bad, b"x").err();
        ensure(
            e.as_ref().is_some_and(|e| e.kind == ErrorKind::Invalid),
            || format!("put of the invalid name {bad:?} gave {e:?}, not an Invalid error"),
        )?;
        ensure(b.get(bad).is_err() && b.size(bad).is_err(), || {
            format!("reading the invalid name {bad:?} was not refused")
        })?;
    }
    ensure(b.list("no-slash").is_err(), || {
        "a list prefix without a trailing / was accepted".into()
    })?;
    let _ = dir;
    Ok(())
}

fn whole_objects(b: &dyn Backend, dir: &str) -> Check {
    let n = format!("{dir}/whole/a");
    let e = |x: crate::BackendError| format!("{x}");
    ensure(b.size(&n).map_err(e)?.is_none(), || {
        "a new name has a size".into()
    })?;
    let missing = b.get(&n).err();
    ensure(missing.as_ref().is_some_and(|e| e.is_not_found()), || {
        format!("get of a missing object gave {missing:?}, not NotFound")
    })?;
    b.delete(&n)
        .map_err(|x| format!("deleting a missing object failed: {x}"))?;
    b.put(&n, b"").map_err(e)?;
    ensure(
        b.get(&n).map_err(e)?.is_empty() && b.size(&n).map_err(e)? == Some(0),
        || "an empty object did not read back empty".into(),
    )?;
    let data = pattern(1, 300_001);
    b.put(&n, &data).map_err(e)?;
    ensure(b.get(&n).map_err(e)? == data, || {
        "an object did not read back as written".into()
    })?;
    ensure(b.size(&n).map_err(e)? == Some(data.len() as u64), || {
        "wrong size".into()
    })?;
    b.put(&n, b"replaced").map_err(e)?;
    ensure(b.get(&n).map_err(e)? == b"replaced", || {
        "a put did not replace the object".into()
    })?;
    b.delete(&n).map_err(e)?;
    let gone = b.get(&n).err();
    ensure(gone.as_ref().is_some_and(|e| e.is_not_found()), || {
        format!("a deleted object still reads: {gone:?}")
    })
}

fn ranges(b: &dyn Backend, dir: &str) -> Check {
    let n = format!("{dir}/ranges/r");
    let data = pattern(2, 1 << 20);
    let e = |x: crate::BackendError| format!("{x}");
    b.put(&n, &data).map_err(e)?;
    for (off, len) in [
        (0u64, 1u64),
        (1, 100),
        (65_536, 131_072),
        ((1 << 20) - 7, 7),
    ] {
        let got = b.get_range(&n, off, len).map_err(e)?;
        ensure(got == data[off as usize..(off + len) as usize], || {
            format!("range {off}+{len} read wrong bytes")
        })?;
    }
    let past = b.get_range(&n, (1 << 20) - 3, 10).err();
    ensure(
        past.as_ref().is_some_and(|e| e.kind == ErrorKind::Corrupt),
        || format!("a range past the end gave {past:?}, not a Corrupt error"),
    )?;
    let missing = b.get_range(&format!("{dir}/ranges/none"), 0, 1).err();
    ensure(missing.as_ref().is_some_and(|e| e.is_not_found()), || {
        format!("a range of a missing object gave {missing:?}")
    })
}

fn listing(b: &dyn Backend, dir: &str) -> Check {
    let e = |x: crate::BackendError| format!("{x}");
    let names = [
        format!("{dir}/list/data/ab/ab01"),
        format!("{dir}/list/data/cd/cd02"),
        format!("{dir}/list/data/ab/ab00"),
        format!("{dir}/list/data2/x"),
        format!("{dir}/list/config"),
    ];
    for (i, n) in names.iter().enumerate() {
        b.put(n, &pattern(i as u8, i * 10)).map_err(e)?;
    }
    let got = b.list(&format!("{dir}/list/data/")).map_err(e)?;
    let want = [&names[2], &names[0], &names[1]];
    ensure(
        got.len() == 3 && got.iter().zip(want).all(|(o, w)| &o.name == w),
        || format!("list of a folder gave {got:?}"),
    )?;
    ensure(got[1].size == 0 && got[2].size == 10, || {
        format!("wrong sizes in {got:?}")
    })?;
    let none = b.list(&format!("{dir}/list/nothing/")).map_err(e)?;
    ensure(none.is_empty(), || {
        format!("an empty folder lists {none:?}")
    })?;
    let all = b.list(&format!("{dir}/list/")).map_err(e)?;
    ensure(all.len() == 5, || {
        format!("the whole folder lists {} objects", all.len())
    })
}

fn streamed(b: &Arc<dyn Backend>, dir: &str) -> Check {
    let e = |x: crate::BackendError| format!("{x}");
    let n = format!("{dir}/stream/big");
    // Larger than a multipart part, in uneven pieces.
    let data = pattern(3, (12 << 20) + 12_345);
    let mut w: Box<dyn ObjectWriter> = crate::object::create_object(b, &n).map_err(e)?;
    for piece in data.chunks(777_777) {
        w.write(piece).map_err(e)?;
    }
    ensure(w.written() == data.len() as u64, || {
        "written() is wrong".into()
    })?;
    ensure(b.size(&n).map_err(e)?.is_none(), || {
        "a streamed object is visible before it is finished".into()
    })?;
    w.finish().map_err(e)?;
    ensure(b.get(&n).map_err(e)? == data, || {
        "a streamed object read back wrong".into()
    })?;
    let gone = format!("{dir}/stream/abandoned");
    let mut w = crate::object::create_object(b, &gone).map_err(e)?;
    w.write(&data[..1 << 20]).map_err(e)?;
    drop(w);
    ensure(b.size(&gone).map_err(e)?.is_none(), || {
        "an abandoned stream left an object".into()
    })?;
    let listed = b.list(&format!("{dir}/stream/")).map_err(e)?;
    ensure(listed.len() == 1, || {
        format!("the stream folder lists {listed:?}")
    })
}

fn concurrent(b: &Arc<dyn Backend>, dir: &str) -> Check {
    let results: Vec<Check> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8u8)
            .map(|t| {
                let b = b.clone();
                s.spawn(move || -> Check {
                    for i in 0..10u8 {
                        let n = format!("{dir}/conc/{t}-{i}");
                        let data = pattern(t ^ i, 1000 + i as usize);
                        b.put(&n, &data).map_err(|e| e.to_string())?;
                        ensure(b.get(&n).map_err(|e| e.to_string())? == data, || {
                            format!("{n} read back wrong under concurrency")
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    results.into_iter().collect::<Check>()?;
    let all = b.list(&format!("{dir}/conc/")).map_err(|e| e.to_string())?;
    ensure(all.len() == 80, || {
        format!("{} of 80 objects listed", all.len())
    })
}
