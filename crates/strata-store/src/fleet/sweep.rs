//! Parallel mark-and-sweep over the index partitions (Parallel VM batch
//! dedup §3, "Snapshot deletion"): after expired snapshots are forgotten,
//! each VM's host sends a mark for every block its VMs' remaining
//! snapshots reference to the block's partition host (stage 1); each
//! partition host sorts its marks and drops the index entries nothing
//! marked (stage 2), so no later job deduplicates against a block that
//! compaction (`strata gc`) frees. The counts of dead bytes per container
//! are the deletion log that tells whether a compaction pays.

use super::args::StageArgs;
use super::detect::route;
use super::records::{external_sort, RecordReader, RecordWriter};
use super::{Loc, ENTRY_LEN};
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use strata_core::Fingerprint;

/// A mark: a fingerprint some remaining snapshot references.
pub const MARK_LEN: usize = 32;

/// Stage 1 (a VM's host): marks for the blocks of every remaining
/// snapshot of this host's VMs. A segment met again (unchanged between
/// versions) is marked once per VM.
pub fn mark(repo: &Repository, a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    let each = (budget / 4 / (shape.hosts as usize + 2)).clamp(4096, 1 << 20);
    let mut out = (0..shape.hosts)
        .map(|h| RecordWriter::create(&dir.send("mark", h), each))
        .collect::<Result<Vec<_>>>()?;
    let mut sent = vec![0u64; shape.hosts as usize];
    let all = repo.list_snapshots()?;
    let (mut snapshots, mut marks) = (0u64, 0u64);
    for vm in &a.vms {
        let mut seen: HashSet<Fingerprint> = HashSet::new();
        for (_, s) in all.iter().filter(|(_, s)| s.series == vm.name) {
            snapshots += 1;
            // A part at a time: an image's chunk list is never whole here.
            crate::repo::recipe::for_each_part(repo, &s.recipe, |part| {
                for seg in part.nodes.iter().flat_map(|n| &n.segments) {
                    if !seen.insert(seg.fp) {
                        continue;
                    }
                    for c in seg.chunks.iter().filter(|c| !c.is_zero()) {
                        let (h, _) = shape.owner(&c.fp);
                        out[h as usize].put(&c.fp.0)?;
                        sent[h as usize] += MARK_LEN as u64;
                        marks += 1;
                    }
                }
                Ok(())
            })?;
        }
    }
    for w in out {
        w.finish()?;
    }
    Ok(
        json!({"snapshots": snapshots, "marks": marks, "sent_bytes": sent, "peak_rss": super::rss_peak()}),
    )
}

/// Stage 2 (a partition's host): the index entries no mark names are
/// dropped; returns the dead bytes per container (the deletion log).
pub fn sweep(a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    route(&dir, &shape, "mark", MARK_LEN, budget)?;
    let tmp = dir.tmp();
    std::fs::create_dir_all(&tmp)
        .map_err(|e| StoreError::io("create", tmp.display().to_string(), e))?;
    let (mut kept, mut dead, mut dead_bytes) = (0u64, 0u64, 0u64);
    let mut log: HashMap<String, u64> = HashMap::new();
    for l in 0..shape.q {
        let sorted = tmp.join("mark-sorted");
        external_sort(&dir.part("mark", l), &sorted, MARK_LEN, budget / 2, &tmp)?;
        let index = dir.index(shape.global(l));
        if !index.exists() {
            super::remove(&sorted)?;
            continue;
        }
        let next = index.with_extension("next");
        let mut marks = RecordReader::open(&sorted, MARK_LEN, 256 << 10)?;
        let mut entries = RecordReader::open(&index, ENTRY_LEN, 256 << 10)?;
        let mut w = RecordWriter::create(&next, 256 << 10)?;
        let (mut m, mut e) = ([0u8; MARK_LEN], [0u8; ENTRY_LEN]);
        let mut have = marks.next_into(&mut m)?;
        while entries.next_into(&mut e)? {
            while have && m[..] < e[..32] {
                have = marks.next_into(&mut m)?;
            }
            if have && m[..] == e[..32] {
                w.put(&e)?;
                kept += 1;
            } else {
                let loc = Loc::get(&e[32..]);
                dead += 1;
                dead_bytes += loc.len as u64;
                *log.entry(loc.container.to_hex()).or_default() += loc.len as u64;
            }
        }
        w.finish()?;
        std::fs::rename(&next, &index)
            .map_err(|e| StoreError::io("rename", index.display().to_string(), e))?;
        super::remove(&sorted)?;
    }
    Ok(
        json!({"index_entries": kept, "dead_entries": dead, "dead_bytes": dead_bytes,
              "deletion_log": log, "peak_rss": super::rss_peak()}),
    )
}
