//! `strata volume check`: a stopped volume's files checked against one
//! another, nothing changed. The block map names only disk blocks the
//! data file has; the reference counts agree with the map (after a clean
//! stop: an unclean one has them recounted by the next open); the
//! journals left for the next open to replay read. With `--read-data`,
//! every disk block in use is read, and — a deduplicated volume keeps a
//! fingerprint of each — compared with its fingerprint: a block changed
//! on the host's disk is found, with the logical blocks that read it.

use crate::config::{read_state, BLOCK};
use crate::crypt::Crypt;
use crate::error::{Result, VolumeError};
use crate::files::{read_counts, read_full_at, read_u64s};
use crate::idedup::Fp;
use crate::journal;
use crate::state::Volume;
use crate::VolumeKey;
use serde::Serialize;
use std::fs::File;
use std::path::Path;

/// What a check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    /// Closed cleanly (else the next open replays the journals and
    /// recounts the references).
    pub clean: bool,
    pub journals: usize,
    pub logical_blocks_mapped: u64,
    pub disk_blocks_in_use: u64,
    pub data_file_blocks: u64,
    /// Disk blocks read (`--read-data`), and of those compared with their
    /// fingerprints (a volume with dedup).
    pub blocks_read: u64,
    pub blocks_verified: u64,
    /// Mapped blocks after a mapped block, and of those the ones right
    /// after it on disk too: how much of the volume reads in order
    /// (`volume defrag` lays it out so).
    pub blocks_after_mapped: u64,
    pub blocks_in_order: u64,
    /// Holds of disk blocks for the repository (released ones not yet
    /// given back included), and the blocks they name.
    pub holds: usize,
    pub held_blocks: u64,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

impl CheckReport {
    /// The share of blocks that follow the block before them on disk
    /// ([`CheckReport::blocks_in_order`]); 1 for a volume without such
    /// blocks.
    pub fn in_order(&self) -> f64 {
        match self.blocks_after_mapped {
            0 => 1.0,
            n => self.blocks_in_order as f64 / n as f64,
        }
    }

    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Most problems of one kind listed one by one.
const LIST: usize = 10;
/// Disk blocks read at once.
const RUN: usize = 256;

/// Checks the volume in `dir` (refused while it is served). `key` is
/// needed only to read an encrypted volume's data; `progress` gets the
/// bytes of data read so far and the bytes to read.
pub fn check(
    dir: &Path,
    key: Option<&VolumeKey>,
    read_data: bool,
    progress: &dyn Fn(u64, u64),
) -> Result<CheckReport> {
    let _lock = Volume::lock(dir)?;
    let cfg = Volume::config(dir)?;
    // Only a deduplicated volume's blocks are compared (decrypted) with
    // their fingerprints.
    let crypt = match read_data && cfg.dedup {
        true => Volume::crypt(dir, &cfg, key)?,
        false => None,
    };
    let state = read_state(dir)?;
    let mut rep = CheckReport {
        clean: state.clean,
        ..Default::default()
    };
    let open = |name: &str| {
        File::open(dir.join(name)).map_err(|e| VolumeError::Io(format!("opening {name}"), e))
    };
    let (map, data, refs, fps) = (open("map")?, open("data")?, open("refs")?, open("fps")?);
    let len = data
        .metadata()
        .map_err(|e| VolumeError::Io("data".into(), e))?
        .len();
    let end = len / BLOCK as u64;
    rep.data_file_blocks = end;
    check_journals(dir, &mut rep)?;
    let mut counts = count_refs(&map, cfg.size / BLOCK as u64, end, &mut rep)?;
    count_holds(dir, &mut counts, &mut rep)?;
    rep.disk_blocks_in_use = counts.iter().filter(|&&c| c != 0).count() as u64;
    compare_refs(&refs, &counts, &mut rep)?;
    if read_data {
        let bad = read_blocks(
            &data,
            &fps,
            &counts,
            cfg.dedup,
            crypt.as_deref(),
            &mut rep,
            progress,
        )?;
        if !bad.is_empty() {
            name_logical(&map, cfg.size / BLOCK as u64, &bad, &mut rep)?;
        }
        if !cfg.dedup {
            rep.notes.push(
                "without dedup the volume keeps no fingerprints: its blocks were read, not verified"
                    .into(),
            );
        }
    }
    Ok(rep)
}

fn check_journals(dir: &Path, rep: &mut CheckReport) -> Result<()> {
    let journals =
        journal::existing(dir).map_err(|e| VolumeError::Io(dir.display().to_string(), e))?;
    rep.journals = journals.len();
    for (_, p) in &journals {
        let b = match std::fs::read(p) {
            Ok(b) => b,
            Err(e) => {
                rep.problems
                    .push(format!("journal {} cannot be read: {e}", p.display()));
                continue;
            }
        };
        let (_, used) = journal::decode_prefix(&b, BLOCK);
        if used == b.len() {
            continue;
        }
        // A torn last record is a write that was never acknowledged; a
        // damaged one with records after it loses those at the replay.
        match journal::any_record_in(&b[used + 1..]) {
            true => rep.problems.push(format!(
                "journal {} is damaged at byte {used}: the records after it would be lost at the next open",
                p.display()
            )),
            false => rep.notes.push(format!(
                "journal {} ends in {} bytes of a torn record (a write never acknowledged)",
                p.display(),
                b.len() - used
            )),
        }
    }
    if !rep.clean {
        rep.notes.push(format!(
            "the volume was not closed cleanly: the next open replays its {} journal file(s) and recounts its references",
            journals.len()
        ));
    }
    Ok(())
}

/// Calls `each(logical block, disk block)` for every mapped block of the
/// first `nblocks` of `map`.
fn each_mapped(map: &File, nblocks: u64, mut each: impl FnMut(u64, u64)) -> Result<()> {
    let step = 1 << 16;
    let mut at = 0;
    while at < nblocks {
        let n = step.min(nblocks - at) as usize;
        let entries = read_u64s(map, at, n).map_err(|e| VolumeError::Io("map".into(), e))?;
        for (i, &e) in entries.iter().enumerate() {
            if e != 0 {
                each(at + i as u64, e - 1);
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// References to each disk block, from the map; entries past the data
/// file are problems.
fn count_refs(map: &File, nblocks: u64, end: u64, rep: &mut CheckReport) -> Result<Vec<u32>> {
    let mut counts = vec![0u32; end as usize];
    let mut past = Vec::new();
    // The last mapped block: (logical, disk).
    let mut last: Option<(u64, u64)> = None;
    each_mapped(map, nblocks, |b, d| {
        rep.logical_blocks_mapped += 1;
        if let Some((lb, ld)) = last {
            if lb + 1 == b {
                rep.blocks_after_mapped += 1;
                rep.blocks_in_order += u64::from(ld.checked_add(1) == Some(d));
            }
        }
        last = Some((b, d));
        match counts.get_mut(d as usize) {
            Some(c) => *c = c.saturating_add(1),
            None => past.push((b, d)),
        }
    })?;
    if !past.is_empty() {
        let listed: Vec<String> = past
            .iter()
            .take(LIST)
            .map(|(b, d)| format!("{b} → {d}"))
            .collect();
        let what = format!(
            "{} logical block(s) map to disk blocks past the data file's end ({end} blocks): {}",
            past.len(),
            listed.join(", ")
        );
        match rep.clean {
            true => rep.problems.push(what),
            // Data a crash lost with the file's growth (never flushed): the
            // next open reads those blocks as zeros.
            false => rep
                .notes
                .push(what + " (lost in a crash before a flush: the next open zeros them)"),
        }
    }
    Ok(counts)
}

/// Adds the holds' blocks to `counts`: a hold that cannot be read, or
/// names blocks past the data file, is a problem.
fn count_holds(dir: &Path, counts: &mut [u32], rep: &mut CheckReport) -> Result<()> {
    let held = crate::holds::count_into(dir, counts, true)?;
    rep.holds = held.names.len();
    rep.held_blocks = held.blocks;
    rep.problems.extend(held.damaged);
    if let Some(first) = held.past_first {
        rep.problems.push(format!(
            "{} held disk block(s) lie past the data file's end (first: {first})",
            held.past
        ));
    }
    Ok(())
}

/// The reference counts on file against the map's.
fn compare_refs(refs: &File, counts: &[u32], rep: &mut CheckReport) -> Result<()> {
    let on_file = read_counts(refs, counts.len() as u64)?;
    let mut wrong = Vec::new();
    for (d, (&r, &c)) in on_file.iter().zip(counts).enumerate() {
        if r != c {
            wrong.push((d, r, c));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = wrong
        .iter()
        .take(LIST)
        .map(|(d, r, c)| format!("disk block {d}: {r} counted, {c} in the map and holds"))
        .collect();
    let what = format!(
        "{} reference count(s) differ from the block map ({})",
        wrong.len(),
        listed.join("; ")
    );
    match rep.clean {
        true => rep.problems.push(what),
        // Recounted by the next open.
        false => rep.notes.push(what),
    }
    Ok(())
}

/// Reads every disk block in use (runs of neighbours at once) and, with
/// dedup, compares each with its fingerprint; returns the bad ones.
fn read_blocks(
    data: &File,
    fps: &File,
    counts: &[u32],
    dedup: bool,
    crypt: Option<&Crypt>,
    rep: &mut CheckReport,
    progress: &dyn Fn(u64, u64),
) -> Result<Vec<u64>> {
    let total = counts.iter().filter(|&&c| c != 0).count() as u64 * BLOCK as u64;
    let mut bad = Vec::new();
    let mut unreadable = Vec::new();
    let mut buf = vec![0u8; RUN * BLOCK];
    let mut fbuf = vec![0u8; RUN * 16];
    let mut d = 0usize;
    while d < counts.len() {
        if counts[d] == 0 {
            d += 1;
            continue;
        }
        let mut e = d + 1;
        while e < counts.len() && counts[e] != 0 && e - d < RUN {
            e += 1;
        }
        let n = e - d;
        let dst = &mut buf[..n * BLOCK];
        let read = match read_full_at(data, dst, (d * BLOCK) as u64) {
            Ok(k) if k == dst.len() => true,
            Ok(_) => {
                unreadable.push(format!("disk blocks {d}..{e}: the data file ends"));
                false
            }
            Err(err) => {
                unreadable.push(format!("disk blocks {d}..{e}: {err}"));
                false
            }
        };
        rep.blocks_read += n as u64;
        if dedup && read {
            let f = &mut fbuf[..n * 16];
            let got = read_full_at(fps, f, (d * 16) as u64)
                .map_err(|err| VolumeError::Io("fps".into(), err))?;
            f[got..].fill(0);
            for i in 0..n {
                let block = &mut dst[i * BLOCK..(i + 1) * BLOCK];
                if let Some(c) = crypt {
                    c.open_data((d + i) as u64, block);
                }
                let fp = match crypt {
                    Some(c) => c.fingerprint(block),
                    None => crate::idedup::fingerprint(block),
                };
                let want: Fp = f[i * 16..(i + 1) * 16].try_into().unwrap_or_default();
                if fp != want {
                    bad.push((d + i) as u64);
                }
                rep.blocks_verified += 1;
            }
        }
        progress(rep.blocks_read * BLOCK as u64, total);
        d = e;
    }
    if !unreadable.is_empty() {
        rep.problems.push(format!(
            "{} read(s) of the data file failed: {}",
            unreadable.len(),
            unreadable[..unreadable.len().min(LIST)].join("; ")
        ));
    }
    Ok(bad)
}

/// Reports the bad disk blocks with the logical blocks that read them.
fn name_logical(map: &File, nblocks: u64, bad: &[u64], rep: &mut CheckReport) -> Result<()> {
    let set: std::collections::HashSet<u64> = bad.iter().copied().collect();
    let mut logical = Vec::new();
    each_mapped(map, nblocks, |b, d| {
        if set.contains(&d) {
            logical.push(b);
        }
    })?;
    let listed: Vec<String> = logical.iter().take(LIST).map(u64::to_string).collect();
    rep.problems.push(format!(
        "{} disk block(s) do not match their fingerprints (changed on the host's disk): read by {} logical block(s) (byte offset = block × 4096): {}{}",
        bad.len(),
        logical.len(),
        listed.join(", "),
        if logical.len() > LIST { ", …" } else { "" }
    ));
    Ok(())
}
