//! Delta compression end to end (`strata init --delta on`): a changed
//! file's chunks are stored as deltas against the previous version's, the
//! repository takes less than one without deltas, every version restores
//! byte-exact, and the lifecycle keeps the bases live deltas need (forget
//! and gc of the versions that first held them, maintain, copy into
//! another repository), with `check --read-data` clean after each step.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;

/// Text-like bytes (words of random letters): zstd halves them, a delta
/// against an edited copy takes a few bytes.
fn words(seed: u64, n: usize) -> Vec<u8> {
    prng(seed, n)
        .iter()
        .map(|b| match b % 7 {
            0 => b' ',
            _ => b'a' + b % 26,
        })
        .collect()
}

/// Version `v` of the tree: 24 files of 6–40 KB; each version inserts a
/// line into every third file and changes a word in every fifth; 300
/// small files no version changes; and from version 1 a new 400 KB file.
fn write_version(dir: &Path, v: u64) {
    for f in 0..24u64 {
        let mut data = words(f + 1, 6_000 + (f as usize * 1_500));
        for k in 1..=v {
            if (f + k) % 3 == 0 {
                let at = (data.len() as u64 * k / (v + 2)) as usize;
                data.splice(at..at, format!("\nversion {k} of file {f}\n").bytes());
            }
            if (f + k) % 5 == 0 {
                let at = (data.len() / 2 + k as usize * 97) % data.len();
                data[at..at + 4].copy_from_slice(b"EDIT");
            }
        }
        let p = dir.join(format!("d{}/f{f}.txt", f % 3));
        write(&p, &data);
        // As unpacked from a release archive: a file's time is its
        // release's, so the recipe of an unchanged file is the same.
        touch(&p, "2026-01-01 00:00:00");
    }
    // Files no version changes: most of a release's recipe.
    for f in 0..300u64 {
        let p = dir.join(format!("static/s{f:03}.txt"));
        write(&p, &words(1000 + f, 700));
        touch(&p, "2026-01-01 00:00:00");
    }
    // New in each version, after the edited files: its chunks fill plain
    // regions (written as they fill) while the container's delta region
    // is still open, so regions are written out of their index order.
    if v > 0 {
        write(
            &dir.join(format!("d2/new{v}.txt")),
            &words(100 + v, 400_000),
        );
    }
}

fn delta_figure(v: &Value, key: &str) -> u64 {
    v["delta"][key].as_u64().unwrap_or(0)
}

fn stored(repo: &Repo) -> u64 {
    walk_files(&repo.path)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn deltas_store_less_and_survive_the_lifecycle() {
    let repo = Repo::with_init(&["--delta", "on", "--encrypt"], Some("pw"));
    let plain = Repo::with_init(&["--delta", "off", "--encrypt"], Some("pw"));
    let src = repo.dir().join("src");
    let mut ids = Vec::new();
    let mut kept = Vec::new();
    for v in 0..4u64 {
        if src.exists() {
            fs::remove_dir_all(&src).unwrap();
        }
        write_version(&src, v);
        let b = repo.backup(&[&src], &[]);
        plain.backup(&[&src], &[]);
        if v > 0 {
            assert!(delta_figure(&b, "chunks") > 0, "version {v}: {b:#}");
            assert!(delta_figure(&b, "recipe_parts") > 0, "version {v}: {b:#}");
            assert!(
                delta_figure(&b, "delta_bytes") * 4 < delta_figure(&b, "alone_bytes"),
                "{b:#}"
            );
        }
        ids.push(b["id"].as_str().unwrap().to_string());
        // (Kept with its times, to compare restores with.)
        let copy = repo.dir().join(format!("v{v}"));
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(ok.success());
        kept.push(copy);
    }
    let (with, without) = (stored(&repo), stored(&plain));
    assert!(
        with < without,
        "{with} bytes with deltas, {without} without"
    );
    repo.assert_clean("after the backups");
    for (v, id) in ids.iter().enumerate() {
        let t = repo.scratch(&format!("r{v}"));
        repo.restore(id, &t);
        assert_trees_equal(&kept[v], &restored(&t, &src));
    }

    // Into another repository (without deltas): read whole, written whole.
    let other = Repo::with_init(&[], None);
    let pw = repo.dir().join("pw");
    fs::write(&pw, "pw").unwrap();
    other.json(&[
        "copy",
        "--from-repo",
        repo.path.to_str().unwrap(),
        "--from-password-file",
        pw.to_str().unwrap(),
    ]);
    other.assert_clean("the copy");
    let last = other.snapshots().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let t = other.scratch("copied");
    other.restore(&last, &t);
    assert_trees_equal(&kept[3], &restored(&t, &src));

    // Reverse dedup, then the versions that first held the bases go.
    repo.json(&["maintain"]);
    repo.assert_clean("after maintain");
    let docs = repo
        .run(&["--json", "forget", "--keep-last", "1", "--prune"])
        .ok()
        .json_stream();
    repo.assert_clean("after forget --prune");
    let t = repo.scratch("newest");
    repo.restore(&ids[3], &t);
    assert_trees_equal(&kept[3], &restored(&t, &src));
    let pinned: u64 = docs
        .iter()
        .filter_map(|d| d["containers_pinned"].as_u64())
        .sum::<u64>()
        + repo.json(&["gc"])["containers_pinned"].as_u64().unwrap();
    assert!(pinned > 0, "{docs:#?}");
    repo.assert_clean("after gc");
}

/// A damaged base takes its deltas down, and says so: `check
/// --read-data` names each delta region that cannot be read and the base
/// it needs, and counts the versions that use them damaged.
#[test]
fn a_damaged_base_names_the_deltas_it_takes_down() {
    let repo = Repo::with_init(&["--delta", "on"], None);
    let src = repo.dir().join("src");
    write_version(&src, 0);
    repo.backup(&[&src], &[]);
    let first = repo.objects("data/");
    fs::remove_dir_all(&src).unwrap();
    write_version(&src, 1);
    let b = repo.backup(&[&src], &[]);
    assert!(delta_figure(&b, "chunks") > 0, "{b:#}");
    let second: Vec<String> = repo
        .objects("data/")
        .into_iter()
        .filter(|o| !first.contains(o))
        .collect();
    // Every container of the first version damaged (a byte flipped every
    // 16 KiB): the second version's deltas lose their bases.
    for o in &first {
        let p = repo.path.join(o);
        let mut data = fs::read(&p).unwrap();
        for at in (20..data.len() / 2).step_by(16 << 10) {
            data[at] ^= 1;
        }
        fs::write(&p, data).unwrap();
    }
    let (code, v) = repo.check(true);
    assert_eq!(code, 1, "{v:#}");
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let named = errors.iter().any(|e| {
        e.contains("a delta region whose base cannot be read")
            && second.iter().any(|o| e.contains(o.as_str()))
            && first.iter().any(|o| e.contains(o.as_str()))
    });
    assert!(named, "{errors:#?}");
    let damaged = v["damaged_snapshots"].as_array().unwrap();
    assert!(
        damaged.iter().any(|s| s.as_str() == b["id"].as_str()),
        "{v:#}"
    );
}
