//! Stage 1a (receiving side) and 1b on a partition's host: received
//! requests into q request partitions, then partition by partition the
//! requests, sorted, merged with the index partition.

use super::args::StageArgs;
use super::records::{external_sort, RecordReader, RecordWriter};
use super::{fp_at, u32_at, HostDir, Kind, Loc, Shape, ANSWER_LEN, ENTRY_LEN, REQ_LEN};
use crate::error::Result;
use serde_json::{json, Value};

/// Moves the records of `recv/KIND-from-*` into q local partitions
/// `KIND/part-L` (one disk buffer each), by fingerprint.
pub(crate) fn route(
    dir: &HostDir,
    shape: &Shape,
    kind: &str,
    size: usize,
    budget: usize,
) -> Result<u64> {
    let each = (budget / (shape.q as usize + 2)).clamp(4096, 1 << 20);
    let mut out = (0..shape.q)
        .map(|l| RecordWriter::create(&dir.part(kind, l), each))
        .collect::<Result<Vec<_>>>()?;
    let mut rec = vec![0u8; size];
    let mut n = 0;
    for h in 0..shape.hosts {
        let mut r = RecordReader::open_required(&dir.recv(kind, h), size, 128 << 10)?;
        while r.next_into(&mut rec)? {
            let (owner, l) = shape.owner(&fp_at(&rec, 0));
            if owner != shape.me {
                return Err(crate::error::StoreError::Invalid(format!(
                    "a {kind} record for host {owner} reached host {}: the hosts disagree on the fleet's shape",
                    shape.me
                )));
            }
            out[l as usize].put(&rec)?;
            n += 1;
        }
    }
    for w in out {
        w.finish()?;
    }
    Ok(n)
}

/// Stage 1a, receiving side: requests into partitions.
pub fn route_requests(a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    let n = route(&dir, &shape, "req", REQ_LEN, budget)?;
    Ok(json!({"requests": n, "peak_rss": super::rss_peak()}))
}

/// Answers to each requesting host.
pub(crate) struct Answers {
    out: Vec<RecordWriter>,
    pub sent: Vec<u64>,
}

impl Answers {
    pub fn create(dir: &HostDir, kind: &str, hosts: u32, each: usize) -> Result<Answers> {
        Ok(Answers {
            out: (0..hosts)
                .map(|h| RecordWriter::create(&dir.send(kind, h), each))
                .collect::<Result<_>>()?,
            sent: vec![0; hosts as usize],
        })
    }

    /// Answers request `req` (fingerprint, host, VM, slot).
    pub fn put(&mut self, req: &[u8], kind: Kind, loc: &Loc) -> Result<()> {
        let host = u32_at(req, 32) as usize;
        let mut a = [0u8; ANSWER_LEN];
        a[..8].copy_from_slice(&req[36..44]);
        a[8..12].copy_from_slice(&(kind as u32).to_le_bytes());
        loc.put(&mut a[12..]);
        let w = self.out.get_mut(host).ok_or_else(|| {
            crate::error::StoreError::Invalid(format!(
                "a request names host {host}, beyond the fleet"
            ))
        })?;
        w.put(&a)?;
        self.sent[host] += ANSWER_LEN as u64;
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<u64>> {
        for w in self.out {
            w.finish()?;
        }
        Ok(self.sent)
    }
}

/// Stage 1b: every local partition's requests against its index.
pub fn compare(a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    let each = (budget / 4 / (shape.hosts as usize + 2)).clamp(4096, 1 << 20);
    let mut answers = Answers::create(&dir, "ans", shape.hosts, each)?;
    let (mut dup, mut new, mut dwn, mut entries) = (0u64, 0u64, 0u64, 0u64);
    let tmp = dir.tmp();
    std::fs::create_dir_all(&tmp)
        .map_err(|e| crate::error::StoreError::io("create", tmp.display().to_string(), e))?;
    for l in 0..shape.q {
        let sorted = tmp.join("req-sorted");
        // Half the budget sorts; the rest reads and writes.
        external_sort(&dir.part("req", l), &sorted, REQ_LEN, budget / 2, &tmp)?;
        let mut reqs = RecordReader::open(&sorted, REQ_LEN, 256 << 10)?;
        let mut index = RecordReader::open(&dir.index(shape.global(l)), ENTRY_LEN, 256 << 10)?;
        let mut pend = RecordWriter::create(&dir.part("pend", l), 256 << 10)?;
        let mut entry = [0u8; ENTRY_LEN];
        let mut have_entry = index.next_into(&mut entry)?;
        entries += have_entry as u64;
        let mut req = [0u8; REQ_LEN];
        let mut last_new: Option<[u8; 32]> = None;
        while reqs.next_into(&mut req)? {
            let fp = &req[..32];
            while have_entry && &entry[..32] < fp {
                have_entry = index.next_into(&mut entry)?;
                entries += have_entry as u64;
            }
            if have_entry && &entry[..32] == fp {
                answers.put(&req, Kind::Duplicate, &Loc::get(&entry[32..]))?;
                dup += 1;
            } else if last_new.as_ref().is_some_and(|f| f.as_slice() == fp) {
                // Dup-with-new: answered in stage 3 once the block is stored.
                pend.put(&req)?;
                dwn += 1;
            } else {
                answers.put(&req, Kind::New, &Loc::default())?;
                last_new = Some(fp.try_into().expect("32 bytes"));
                new += 1;
            }
        }
        while have_entry {
            have_entry = index.next_into(&mut entry)?;
            entries += have_entry as u64;
        }
        pend.finish()?;
        super::remove(&sorted)?;
    }
    let sent = answers.finish()?;
    Ok(
        json!({"duplicates": dup, "new": new, "dup_with_new": dwn, "index_entries": entries,
              "sent_bytes": sent, "peak_rss": super::rss_peak()}),
    )
}
