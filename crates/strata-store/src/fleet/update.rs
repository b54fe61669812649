//! Stage 3b on a partition's host: the new blocks' references merged
//! into the index partitions, and the dup-with-new requests answered
//! with them (sent back for stage 4).

use super::detect::{route, Answers};
use super::records::{external_sort, RecordReader, RecordWriter};
use super::{Kind, Loc, StageArgs, ENTRY_LEN, REQ_LEN};
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

/// Stage 0, at a job's start: drops the index entries whose container
/// is no longer in the repository (a gc or compaction since the last job;
/// the job's shared lock keeps any from going while it runs).
pub fn validate(repo: &crate::repo::Repository, a: &StageArgs) -> Result<Value> {
    let shape = a.shape()?;
    let dir = a.dir()?;
    let live: std::collections::HashSet<strata_core::format::ContainerId> = repo
        .backend()
        .list("data/")?
        .into_iter()
        .filter_map(|o| crate::repo::container_id_of(&o.name))
        .collect();
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
        json!({"index_entries": kept, "dropped": dropped, "containers": live.len(),
              "peak_rss": super::rss_peak()}),
    )
}
