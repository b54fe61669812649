//! Stage 3b on a partition's host: the new blocks' references merged
//! into the index partitions, and the dup-with-new requests answered
//! with them (sent back for stage 4).

use super::args::StageArgs;
use super::detect::{route, Answers};
use super::records::{external_sort, RecordReader, RecordWriter};
use super::{Kind, Loc, ENTRY_LEN, REQ_LEN};
use crate::error::{Result, StoreError};
use serde_json::{json, Value};

/// Stage 3b.
pub fn update(a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    let routed = route(&dir, &shape, "ref", ENTRY_LEN, budget)?;
    let each = (budget / 4 / (shape.hosts as usize + 2)).clamp(4096, 1 << 20);
    let mut answers = Answers::create(&dir, "dwn", shape.hosts, each)?;
    let tmp = dir.tmp();
    std::fs::create_dir_all(&tmp)
        .map_err(|e| StoreError::io("create", tmp.display().to_string(), e))?;
    let (mut added, mut entries, mut resolved, mut unresolved) = (0u64, 0u64, 0u64, 0u64);
    for l in 0..shape.q {
        let sorted = tmp.join("ref-sorted");
        external_sort(&dir.part("ref", l), &sorted, ENTRY_LEN, budget / 2, &tmp)?;
        let index = dir.index(shape.global(l));
        let next = index.with_extension("next");
        let (a, e) = merge_index(&index, &sorted, &next)?;
        added += a;
        entries += e;
        // Dup-with-new requests (sorted by fingerprint) against the new
        // references (sorted too).
        let mut refs = RecordReader::open(&sorted, ENTRY_LEN, 128 << 10)?;
        let mut pend = RecordReader::open(&dir.part("pend", l), REQ_LEN, 128 << 10)?;
        let mut r = [0u8; ENTRY_LEN];
        let mut have = refs.next_into(&mut r)?;
        let mut q = [0u8; REQ_LEN];
        while pend.next_into(&mut q)? {
            while have && r[..32] < q[..32] {
                have = refs.next_into(&mut r)?;
            }
            if have && r[..32] == q[..32] {
                answers.put(&q, Kind::Duplicate, &Loc::get(&r[32..]))?;
                resolved += 1;
            } else {
                // Its storer found the block changed and stored other
                // content: the requester stores it in stage 4.
                answers.put(&q, Kind::Pending, &Loc::default())?;
                unresolved += 1;
            }
        }
        // The partition switches to its new version here: a rerun merges
        // the same references again, which adds nothing.
        std::fs::rename(&next, &index)
            .map_err(|e| StoreError::io("rename", index.display().to_string(), e))?;
        super::remove(&sorted)?;
    }
    let sent = answers.finish()?;
    Ok(
        json!({"references": routed, "index_added": added, "index_entries": entries,
              "dup_with_new_resolved": resolved, "dup_with_new_unresolved": unresolved,
              "sent_bytes": sent, "peak_rss": super::rss_peak()}),
    )
}

/// Merges sorted references into a sorted index partition (an entry
/// already there is kept); returns the entries added and the total.
fn merge_index(
    index: &std::path::Path,
    refs: &std::path::Path,
    out: &std::path::Path,
) -> Result<(u64, u64)> {
    let mut a = RecordReader::open(index, ENTRY_LEN, 256 << 10)?;
    let mut b = RecordReader::open(refs, ENTRY_LEN, 256 << 10)?;
    let mut w = RecordWriter::create(out, 256 << 10)?;
    let (mut ea, mut eb) = ([0u8; ENTRY_LEN], [0u8; ENTRY_LEN]);
    let (mut ha, mut hb) = (a.next_into(&mut ea)?, b.next_into(&mut eb)?);
    let (mut added, mut total) = (0u64, 0u64);
    let mut last: Option<[u8; 32]> = None;
    while ha || hb {
        let take_a = ha && (!hb || ea[..32] <= eb[..32]);
        let rec = if take_a { ea } else { eb };
        if last.as_ref().map(|l| l[..] != rec[..32]).unwrap_or(true) {
            w.put(&rec)?;
            total += 1;
            added += !take_a as u64;
            last = Some(rec[..32].try_into().expect("32 bytes"));
        }
        match take_a {
            true => ha = a.next_into(&mut ea)?,
            false => hb = b.next_into(&mut eb)?,
        }
    }
    w.finish()?;
    Ok((added, total))
}

/// Stage 0, at a job's start: the host's index partitions made valid for
/// this job. Entries whose container is no longer in the repository (a gc
/// or compaction since the last job; the job's shared lock keeps any from
/// going while it runs) are dropped. When the partitions were made for
/// another shape (hosts × partitions), or there are none while the
/// repository holds data (a new or replaced host), they are rebuilt from
/// the repository's container metadata (see [`rebuild`]).
pub fn validate(repo: &crate::repo::Repository, a: &StageArgs) -> Result<Value> {
    let shape = a.shape()?;
    let dir = a.dir()?;
    let budget = super::budget(a.memory)?;
    let live: std::collections::HashSet<strata_core::format::ContainerId> = repo
        .backend()
        .list("data/")?
        .into_iter()
        .filter_map(|o| crate::repo::container_id_of(&o.name))
        .collect();
    let want = format!("{} {}\n", shape.hosts, shape.q);
    let shape_file = dir.root.join("shape");
    let have = std::fs::read_to_string(&shape_file).unwrap_or_default();
    let any = (0..shape.q).any(|l| dir.index(shape.global(l)).exists());
    if have != want || (!any && !live.is_empty()) {
        let r = rebuild(repo, &dir, &shape, budget, &live)?;
        std::fs::write(&shape_file, &want)
            .map_err(|e| StoreError::io("write", shape_file.display().to_string(), e))?;
        return Ok(json!({"rebuilt": true, "index_entries": r, "dropped": 0,
                         "containers": live.len(), "peak_rss": super::rss_peak()}));
    }
    let (mut kept, mut dropped) = (0u64, 0u64);
    for l in 0..shape.q {
        let index = dir.index(shape.global(l));
        if !index.exists() {
            continue;
        }
        let next = index.with_extension("next");
        let mut r = RecordReader::open(&index, ENTRY_LEN, 256 << 10)?;
        let mut w = RecordWriter::create(&next, 256 << 10)?;
        let mut e = [0u8; ENTRY_LEN];
        let mut gone = 0;
        while r.next_into(&mut e)? {
            match live.contains(&Loc::get(&e[32..]).container) {
                true => {
                    w.put(&e)?;
                    kept += 1;
                }
                false => gone += 1,
            }
        }
        w.finish()?;
        match gone {
            0 => super::remove(&next)?,
            _ => std::fs::rename(&next, &index)
                .map_err(|e| StoreError::io("rename", index.display().to_string(), e))?,
        }
        dropped += gone;
    }
    Ok(
        json!({"rebuilt": false, "index_entries": kept, "dropped": dropped, "containers": live.len(),
              "peak_rss": super::rss_peak()}),
    )
}

/// Rebuilds this host's index partitions from the repository: every
/// chunk of every pool container (not the stamped containers of archival
/// versions, which go when their version expires) whose fingerprint falls
/// in one of this host's partitions. Returns the entries.
fn rebuild(
    repo: &crate::repo::Repository,
    dir: &super::HostDir,
    shape: &super::Shape,
    budget: usize,
    live: &std::collections::HashSet<strata_core::format::ContainerId>,
) -> Result<u64> {
    let tmp = dir.tmp();
    std::fs::create_dir_all(&tmp)
        .map_err(|e| StoreError::io("create", tmp.display().to_string(), e))?;
    let each = (budget / 4 / (shape.q as usize + 1)).clamp(4096, 1 << 20);
    let mut parts = (0..shape.q)
        .map(|l| RecordWriter::create(&tmp.join(format!("rebuild-{l}")), each))
        .collect::<Result<Vec<_>>>()?;
    let mut e = [0u8; ENTRY_LEN];
    let mut ids: Vec<_> = live.iter().copied().collect();
    ids.sort();
    for id in ids {
        let m = match crate::repo::container::read_meta(repo, &id) {
            Ok(m) => m,
            // A container without readable metadata is left out: its
            // chunks are stored again if met (never a wrong reference).
            Err(_) => continue,
        };
        if m.stamp.is_some() {
            continue;
        }
        for c in &m.chunks {
            let (h, l) = shape.owner(&c.fp);
            if h != shape.me {
                continue;
            }
            e[..32].copy_from_slice(&c.fp.0);
            Loc {
                container: id,
                region: c.region,
                offset: c.offset,
                len: c.len,
            }
            .put(&mut e[32..]);
            parts[l as usize].put(&e)?;
        }
    }
    for w in parts {
        w.finish()?;
    }
    let mut total = 0;
    for l in 0..shape.q {
        let unsorted = tmp.join(format!("rebuild-{l}"));
        let sorted = tmp.join("rebuild-sorted");
        external_sort(&unsorted, &sorted, ENTRY_LEN, budget / 2, &tmp)?;
        super::remove(&unsorted)?;
        // One entry per fingerprint (a chunk stored twice keeps its first).
        let index = dir.index(shape.global(l));
        let mut r = RecordReader::open(&sorted, ENTRY_LEN, 256 << 10)?;
        let mut w = RecordWriter::create(&index.with_extension("next"), 256 << 10)?;
        let mut last: Option<[u8; 32]> = None;
        while r.next_into(&mut e)? {
            if last.as_ref().is_some_and(|f| f[..] == e[..32]) {
                continue;
            }
            last = Some(e[..32].try_into().expect("32 bytes"));
            w.put(&e)?;
            total += 1;
        }
        w.finish()?;
        std::fs::rename(index.with_extension("next"), &index)
            .map_err(|e| StoreError::io("rename", index.display().to_string(), e))?;
        super::remove(&sorted)?;
    }
    // Partitions of another shape left over are no longer read.
    Ok(total)
}
