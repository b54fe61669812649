//! The read plan: which regions of which containers to read, and where
//! in which restored files their chunks go. Regions are read once per
//! plan, container by container in physical order, neighbouring regions
//! in one ranged read, several reads in flight. A plan is read when it
//! holds so many pieces ([`PLAN_PIECES`] unless the options say
//! otherwise), so restore's memory does not grow with
//! the size of what it restores.

use super::files::{Finished, RestoreFile};
use super::meta::MetaOpts;
use super::source::RecipeSource;
use crate::engine::copies::{is_damage, rebuild_region};
use crate::engine::resolver::{mark_needed, resolver_with, Resolver};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::region::open_region;
use crate::repo::{data_name, Repository};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use strata_core::format::{ContainerId, Node, NodeKind, RegionInfo, Snapshot};

/// Pieces a plan holds before it is read: 24 bytes each when regions
/// fill several, about 160 when each region has its own (its entry and
/// list), so at most about 40 MB. A disk image stored in order takes one
/// piece per region: a plan then covers well over 16 GiB of it.
pub const PLAN_PIECES: usize = 1 << 18;

/// The regions to read from one container, each with the pieces it fills.
type RegionPlan = BTreeMap<u32, (RegionInfo, Vec<Piece>)>;

struct Piece {
    file: u32,
    file_off: u64,
    reg_off: u32,
    len: u32,
}

/// Adds `p` to a region's pieces, as part of the last one when it goes on
/// from it in both the region and the file (a disk image's chunks, stored
/// in the order of the image: one piece per region run instead of one
/// per 4 KiB chunk, in memory and in writes).
/// Returns whether `p` became a piece of its own.
fn add_piece(pieces: &mut Vec<Piece>, p: Piece) -> bool {
    if let Some(last) = pieces.last_mut() {
        let joins = last.file == p.file
            && last.file_off + last.len as u64 == p.file_off
            && last.reg_off.checked_add(last.len) == Some(p.reg_off);
        if let (true, Some(len)) = (joins, last.len.checked_add(p.len)) {
            last.len = len;
            return false;
        }
    }
    pieces.push(p);
    true
}

/// Where restored pieces go, and what reading them counted.
pub(super) struct Sink<'a> {
    /// Restored files by index.
    pub files: &'a [RestoreFile<'a>],
    pub progress: &'a Progress,
    /// The readers' own pool (`None`: rayon's, one per core).
    pub pool: Option<rayon::ThreadPool>,
    /// Owners and privileges of the files finished.
    pub meta: MetaOpts,
    pub finished: Finished,
    pub plans: AtomicU64,
    /// Containers read from (in any plan).
    containers: Mutex<HashSet<ContainerId>>,
    pub regions_read: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Readers' busy nanoseconds: fetching ranges, opening regions
    /// (decrypting, decompressing), creating and writing files.
    pub fetch_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub write_ns: AtomicU64,
    /// Chunks read from another stored copy, by the damaged container
    /// they could not be read from.
    pub second_copies: Mutex<BTreeMap<ContainerId, u64>>,
}

impl<'a> Sink<'a> {
    /// A sink for `files`, `readers` reads in flight at once (0: one per
    /// core).
    pub fn new(
        files: &'a [RestoreFile<'a>],
        progress: &'a Progress,
        readers: usize,
        meta: MetaOpts,
    ) -> Self {
        Sink {
            files,
            progress,
            meta,
            finished: Finished::default(),
            pool: match readers {
                0 => None,
                n => rayon::ThreadPoolBuilder::new().num_threads(n).build().ok(),
            },
            plans: AtomicU64::new(0),
            containers: Mutex::new(HashSet::new()),
            regions_read: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            fetch_ns: AtomicU64::new(0),
            decode_ns: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            second_copies: Mutex::new(BTreeMap::new()),
        }
    }

    /// Containers read from, each counted once however many plans used it.
    pub fn containers_read(&self) -> u64 {
        self.containers.lock().map_or(0, |c| c.len() as u64)
    }
}

/// A read plan being built: container → region → pieces.
#[derive(Default)]
struct Plan {
    regions: BTreeMap<ContainerId, RegionPlan>,
    pieces: usize,
    /// Bytes of zero chunks added (never read: the files are sparse).
    zero_bytes: u64,
}

impl Plan {
    /// Adds the chunks of `n`, a piece of file `fi` (`file`) that begins
    /// at `off` in it.
    fn add_node(
        &mut self,
        resolver: &Resolver,
        n: &Node,
        (fi, file): (u32, &RestoreFile),
        mut off: u64,
    ) -> Result<()> {
        for c in n.segments.iter().flat_map(|s| &s.chunks) {
            if c.is_zero() {
                self.zero_bytes += c.len as u64;
                file.hole(c.len as u64);
            } else {
                let r = resolver.resolve(c, &file.path)?;
                let pieces = &mut self
                    .regions
                    .entry(r.container)
                    .or_default()
                    .entry(r.region_idx)
                    .or_insert_with(|| (r.region, Vec::new()))
                    .1;
                let piece = Piece {
                    file: fi,
                    file_off: off,
                    reg_off: r.offset,
                    len: c.len,
                };
                self.pieces += add_piece(pieces, piece) as usize;
            }
            off = off.saturating_add(c.len as u64);
        }
        Ok(())
    }

    /// Reads what the plan holds into the files and empties it.
    fn read(&mut self, repo: &Repository, sink: &Sink) -> Result<()> {
        let plan: Vec<(ContainerId, RegionPlan)> =
            std::mem::take(&mut self.regions).into_iter().collect();
        let zeros = std::mem::take(&mut self.zero_bytes);
        sink.progress.bytes_done.fetch_add(zeros, Ordering::Relaxed);
        self.pieces = 0;
        if plan.is_empty() {
            return Ok(());
        }
        sink.plans.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut seen) = sink.containers.lock() {
            seen.extend(plan.iter().map(|(c, _)| *c));
        }
        read_plan(repo, &plan, sink)
    }
}

/// Fills the restored files with their chunks, reading the recipe twice
/// a piece at a time: once for the containers and indirect references
/// the files need (one resolver for the whole restore), then to plan and
/// read, a plan of at most `max_pieces` pieces at a time. `content`
/// maps the recipe path whose chunks a file takes (its own, or for a hard
/// link restored as a file, its first name's) to its index in
/// `sink.files`; `containers` is the table the source numbers references
/// in. Returns the newer versions followed for indirect references.
pub(super) fn fill(
    repo: &Repository,
    snapshot: &Snapshot,
    source: RecipeSource,
    containers: &[ContainerId],
    content: &HashMap<&[u8], u32>,
    sink: &Sink,
    max_pieces: usize,
) -> Result<u32> {
    if content.is_empty() {
        return Ok(0);
    }
    let wanted = |n: &Node| match n.kind {
        NodeKind::File => content.get(n.path.as_slice()).copied(),
        _ => None,
    };
    let mut used = vec![false; containers.len()];
    let mut indirect = HashSet::new();
    source.for_each_piece(|n, _| {
        if wanted(n).is_some() {
            let chunks = n.segments.iter().flat_map(|s| &s.chunks);
            mark_needed(chunks, &mut used, &mut indirect);
        }
        Ok(())
    })?;
    let resolver = resolver_with(repo, snapshot, containers, &used, indirect)?;
    let mut plan = Plan::default();
    source.for_each_piece(|n, off| {
        let Some((fi, file)) = wanted(n).and_then(|fi| Some((fi, sink.files.get(fi as usize)?)))
        else {
            return Ok(());
        };
        plan.add_node(&resolver, n, (fi, file), off)?;
        if plan.pieces >= max_pieces {
            plan.read(repo, sink)?;
        }
        Ok(())
    })?;
    plan.read(repo, sink)?;
    Ok(resolver.chain_hops)
}

/// One ranged read: neighbouring regions of one container.
struct ReadGroup<'p> {
    cid: &'p ContainerId,
    regions: Vec<&'p (RegionInfo, Vec<Piece>)>,
    start: u64,
    end: u64,
}

/// Regions closer than this are read together (the gap is read and
/// dropped).
const MAX_READ_GAP: u64 = 64 << 10;
/// Longest single read. Readers take reads, not containers, so even a
/// restore of a few containers has several reads in flight and decodes
/// one while the next downloads; from a bucket this is ≤ 128 GETs per GB
/// read.
const MAX_READ: u64 = 8 << 20;

/// The plan's reads, container by container in physical order.
fn read_groups(plan: &[(ContainerId, RegionPlan)]) -> Vec<ReadGroup<'_>> {
    let mut out = Vec::new();
    for (cid, regions) in plan {
        let mut regs: Vec<&(RegionInfo, Vec<Piece>)> = regions.values().collect();
        // By offset: a container's regions are numbered as they are begun,
        // and a delta region begun before a plain one may be written after.
        regs.sort_by_key(|r| r.0.offset);
        let mut i = 0;
        while i < regs.len() {
            let start = regs[i].0.offset;
            let end_of = |k: usize| regs[k].0.offset + regs[k].0.stored_len as u64;
            let mut j = i;
            while j + 1 < regs.len()
                && regs[j + 1].0.offset.saturating_sub(end_of(j)) <= MAX_READ_GAP
                && end_of(j + 1).saturating_sub(start) <= MAX_READ
            {
                j += 1;
            }
            out.push(ReadGroup {
                cid,
                regions: regs[i..=j].to_vec(),
                start,
                end: end_of(j),
            });
            i = j + 1;
        }
    }
    out
}

/// Reads every region of the plan once and writes its pieces, `readers`
/// reads at once (0: one per core), each hinting the read two ahead.
fn read_plan(repo: &Repository, plan: &[(ContainerId, RegionPlan)], sink: &Sink) -> Result<()> {
    let groups = read_groups(plan);
    let backend = repo.backend();
    let read_all = || {
        groups.par_iter().enumerate().try_for_each_init(
            HashMap::<u32, File>::new,
            |open, (gi, g)| -> Result<()> {
                if let Some(next) = groups.get(gi + 2) {
                    backend.will_need(&data_name(next.cid), next.start, next.end - next.start);
                }
                restore_group(repo, g, sink, open)
            },
        )
    };
    match &sink.pool {
        Some(p) => p.install(read_all),
        None => read_all(),
    }
}

/// One read: its regions opened and their pieces written into the files
/// (`open` keeps this reader's open files, at most 128).
fn restore_group(
    repo: &Repository,
    g: &ReadGroup,
    sink: &Sink,
    open: &mut HashMap<u32, File>,
) -> Result<()> {
    if sink.progress.is_cancelled() {
        return Err(StoreError::Cancelled);
    }
    let name = data_name(g.cid);
    // A linked container's regions are read from the volume, one by one.
    let linked = repo.link_of(g.cid)?;
    let t = Instant::now();
    let buf: Result<Vec<u8>> = match &linked {
        None => repo
            .backend()
            .get_range(&name, g.start, g.end - g.start)
            .map_err(StoreError::from),
        Some(_) => Ok(Vec::new()),
    };
    // A damaged or missing container: its regions from other copies.
    let buf = match buf {
        Err(e) if !is_damage(&e) => return Err(e),
        b => b,
    };
    sink.bytes_read
        .fetch_add(g.end - g.start, Ordering::Relaxed);
    lap(&sink.fetch_ns, t);
    for (reg, pieces) in &g.regions {
        let t = Instant::now();
        let read = match (&linked, &buf) {
            (Some(l), _) => l.region(repo, &name, reg),
            (None, Ok(buf)) => {
                // Offsets come from container metadata: checked, not trusted.
                reg.offset
                    .checked_sub(g.start)
                    .and_then(|a| {
                        buf.get(a as usize..(a as usize).checked_add(reg.stored_len as usize)?)
                    })
                    .ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "{name}: a region lies outside the range read (damaged container metadata; run `strata check`)"
                        ))
                    })
                    .and_then(|stored| open_region(repo, &name, stored, reg))
            }
            (None, Err(e)) => Err(StoreError::corrupt(
                &name,
                strata_core::CoreError::Damaged(e.to_string()),
            )),
        };
        let plain = match read {
            Ok(p) => p,
            // The chunks the pieces need, from their other copies.
            Err(e) if is_damage(&e) => recover(repo, g.cid, reg, pieces, sink).ok_or(e)?,
            Err(e) => return Err(e),
        };
        sink.regions_read.fetch_add(1, Ordering::Relaxed);
        let t = lap(&sink.decode_ns, t);
        for p in pieces {
            let data = plain
                .get(p.reg_off as usize..p.reg_off as usize + p.len as usize)
                .ok_or_else(|| StoreError::Invalid(format!("{name}: chunk outside its region")))?;
            if open.len() > 128 && !open.contains_key(&p.file) {
                open.clear();
            }
            let rf = &sink.files[p.file as usize];
            let f = match open.entry(p.file) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(rf.open()?),
            };
            f.write_all_at(data, p.file_off)
                .map_err(|e| StoreError::io("write", rf.full.display().to_string(), e))?;
            if rf.wrote(p.len as u64) {
                if let Some(f) = open.remove(&p.file) {
                    sink.finished.finish(rf, &f, sink.meta)?;
                }
            }
            sink.progress
                .bytes_done
                .fetch_add(p.len as u64, Ordering::Relaxed);
        }
        lap(&sink.write_ns, t);
    }
    Ok(())
}

/// Adds the time since `t` to `ns`; returns now.
fn lap(ns: &AtomicU64, t: Instant) -> Instant {
    let now = Instant::now();
    ns.fetch_add((now - t).as_nanos() as u64, Ordering::Relaxed);
    now
}

/// The plaintext of damaged region `reg` of container `cid` as far as
/// `pieces` need it, from other stored copies of its chunks; `None` when
/// a needed chunk has none.
fn recover(
    repo: &Repository,
    cid: &ContainerId,
    reg: &RegionInfo,
    pieces: &[Piece],
    sink: &Sink,
) -> Option<Vec<u8>> {
    let ranges: Vec<(u32, u32)> = pieces.iter().map(|p| (p.reg_off, p.len)).collect();
    let (plain, chunks) = rebuild_region(repo, cid, reg, &ranges)?;
    if let Ok(mut m) = sink.second_copies.lock() {
        *m.entry(*cid).or_default() += chunks;
    }
    Some(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks that go on from one another in the region and in the file
    /// are one piece; a gap in either, or another file, starts a new one.
    #[test]
    fn consecutive_chunks_are_one_piece() {
        let p = |file, file_off, reg_off, len| Piece {
            file,
            file_off,
            reg_off,
            len,
        };
        let mut v = Vec::new();
        for (i, q) in [
            p(0, 0, 0, 4096),
            p(0, 4096, 4096, 4096),
            p(0, 8192, 8192, 100),
            p(0, 16384, 8292, 4096),      // a gap in the file
            p(0, 20480, 20000, 10),       // a gap in the region
            p(1, 20490, 20010, 10),       // another file
            p(1, 20500, 20020, u32::MAX), // too long to join
        ]
        .into_iter()
        .enumerate()
        {
            add_piece(&mut v, q);
            assert!(v.len() <= i + 1);
        }
        let got: Vec<_> = v
            .iter()
            .map(|q| (q.file, q.file_off, q.reg_off, q.len))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, 8292),
                (0, 16384, 8292, 4096),
                (0, 20480, 20000, 10),
                (1, 20490, 20010, 10),
                (1, 20500, 20020, u32::MAX),
            ]
        );
    }

    /// Reads cover every region once, in order, never longer than
    /// `MAX_READ` (unless one region is), never across a gap wider than
    /// `MAX_READ_GAP`, never across containers.
    #[test]
    fn reads_are_bounded_and_cover_the_plan() {
        let region = |offset: u64, len: u32| {
            let info = RegionInfo {
                offset,
                stored_len: len,
                raw_len: len,
            };
            (info, Vec::new())
        };
        let mut plan = Vec::new();
        for c in 0..2u8 {
            let mut regions = RegionPlan::new();
            let mut off = 0u64;
            for r in 0..40u32 {
                // 1 MiB regions, a wide gap every 7th, one 12 MiB region.
                let len = if r == 20 { 12 << 20 } else { 1 << 20 };
                if r % 7 == 6 {
                    off += MAX_READ_GAP + 1;
                }
                regions.insert(r, region(off, len));
                off += len as u64;
            }
            plan.push((ContainerId([c; 16]), regions));
        }
        let groups = read_groups(&plan);
        let mut seen = 0;
        for g in &groups {
            assert!(g.end - g.start <= MAX_READ || g.regions.len() == 1);
            let mut prev_end = g.start;
            for (r, _) in &g.regions {
                assert!(r.offset >= prev_end && r.offset - prev_end <= MAX_READ_GAP);
                prev_end = r.offset + r.stored_len as u64;
            }
            assert_eq!(prev_end, g.end);
            seen += g.regions.len();
        }
        assert_eq!(seen, 80);
        assert!(groups.len() > 2 * 40 / 8, "{} reads", groups.len());
        assert!(groups.iter().any(|g| g.end - g.start == 12 << 20));
    }
}
