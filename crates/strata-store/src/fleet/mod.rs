//! Fleet-wide batch dedup of VM images (Parallel VM batch dedup, §3):
//! the per-host stages that `python/strata_fleet` runs on each host of a
//! Ray cluster, one short single-threaded worker process per stage, each
//! within a memory cap M.
//!
//! The global fingerprint index is partitioned by fingerprint into p × q
//! partitions, q on each of the p hosts' local disks (`index/part-G`,
//! sorted entries fingerprint → location). A round backs up a set of VMs:
//!
//! | stage | where | what |
//! |---|---|---|
//! | 1a scan | VM owner | level 1: 2 MiB segments unchanged since the previous version (changed-block list, or segment fingerprint equal) are clean; dirty ones are cut into 4 KiB blocks, each non-zero block a detection request sent to its partition's host (p send buffers, Option 2) |
//! | 1a route | partition owner | received requests into q request partitions (q disk buffers) |
//! | 1b compare | partition owner | partition by partition: requests sorted (external sort) and merged with the index partition: duplicate (with its location), new (the first requester of an unknown fingerprint stores it), or dup-with-new (kept for stage 3) |
//! | 2b store | VM owner | answers applied to each VM's block map; dirty segments read again, new blocks written to the shared repository's containers, their references sent to the partition owners |
//! | 3b update | partition owner | new references merged into the index partitions; dup-with-new requests resolved and sent back |
//! | 4b finish | VM owner | recipes built from the block maps (clean segments from the previous version) and each VM's snapshot committed |
//!
//! The exchanges between the stages (files `send/KIND-to-H` moved to
//! `recv/KIND-from-H`) are done by the coordinator, which counts the
//! bytes. Every stage writes its outputs before it reports done and can be
//! run again after a crash; the snapshot of a VM is its commit point. The
//! job holds a shared repository lock from start to end, so no gc removes
//! containers the index points at; at its start each host drops index
//! entries whose container is gone (`validate`).

pub mod args;
pub mod detect;
pub mod finish;
pub mod records;
pub mod scan;
pub mod store;
pub mod sweep;
pub mod update;

use crate::error::{Result, StoreError};
use std::path::{Path, PathBuf};
use strata_core::format::ContainerId;
use strata_core::Fingerprint;

/// Block (chunk) size: fixed 4 KiB blocks, as a virtual disk's.
pub const BLOCK: usize = strata_core::BLOCK_SIZE;
/// Segment size: the unit of level-1 dirty detection.
pub const SEGMENT: usize = 2 << 20;

/// Where a stored block is: container, region, offset in the region's
/// plaintext, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub container: ContainerId,
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

pub const LOC_LEN: usize = 28;

impl Default for Loc {
    fn default() -> Self {
        Loc {
            container: ContainerId([0; 16]),
            region: 0,
            offset: 0,
            len: 0,
        }
    }
}

impl Loc {
    pub fn put(&self, out: &mut [u8]) {
        out[..16].copy_from_slice(&self.container.0);
        out[16..20].copy_from_slice(&self.region.to_le_bytes());
        out[20..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..28].copy_from_slice(&self.len.to_le_bytes());
    }

    pub fn get(b: &[u8]) -> Loc {
        Loc {
            container: ContainerId(b[..16].try_into().expect("16 bytes")),
            region: u32_at(b, 16),
            offset: u32_at(b, 20),
            len: u32_at(b, 24),
        }
    }
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn fp_at(b: &[u8], at: usize) -> Fingerprint {
    Fingerprint(b[at..at + 32].try_into().expect("32 bytes"))
}

/// A detection request: fingerprint, requesting host, VM, block-map slot.
pub const REQ_LEN: usize = 44;
/// An index entry or a new block's reference: fingerprint, location.
pub const ENTRY_LEN: usize = 32 + LOC_LEN;
/// An answer to a request: VM, slot, kind, location.
pub const ANSWER_LEN: usize = 12 + LOC_LEN;
/// A block-map slot: fingerprint, kind, location.
pub const SLOT_LEN: usize = 32 + 4 + LOC_LEN;

/// What a block-map slot (or an answer) says of its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// Not answered yet (dup-with-new until stage 4 answers it).
    Pending = 0,
    /// Stored before: the location is known.
    Duplicate = 1,
    /// This requester stores it (stage 2b).
    New = 2,
    /// Stored by this VM's stage 2b: the location is known.
    Stored = 3,
}

impl Kind {
    pub fn from_u32(v: u32) -> Result<Kind> {
        Ok(match v {
            0 => Kind::Pending,
            1 => Kind::Duplicate,
            2 => Kind::New,
            3 => Kind::Stored,
            _ => {
                return Err(StoreError::Invalid(format!(
                    "bad block kind {v} in a fleet scratch file"
                )))
            }
        })
    }

    /// Whether the slot's location is final.
    pub fn located(self) -> bool {
        matches!(self, Kind::Duplicate | Kind::Stored)
    }
}

/// The global partition of a fingerprint among `partitions` (= p × q).
pub fn partition_of(fp: &Fingerprint, partitions: u32) -> u32 {
    (fp.prefix_u64() % partitions as u64) as u32
}

/// The fleet's shape: p hosts (this one is `me`), q partitions per host.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hosts: u32,
    pub q: u32,
    pub me: u32,
}

impl Shape {
    pub fn check(&self) -> Result<()> {
        if self.hosts == 0 || self.q == 0 || self.me >= self.hosts {
            return Err(StoreError::Invalid(format!(
                "bad fleet shape: {} hosts, {} partitions each, this host {}",
                self.hosts, self.q, self.me
            )));
        }
        Ok(())
    }

    pub fn partitions(&self) -> u32 {
        self.hosts * self.q
    }

    /// The host owning `fp`'s partition, and the partition's index there.
    pub fn owner(&self, fp: &Fingerprint) -> (u32, u32) {
        let g = partition_of(fp, self.partitions());
        (g / self.q, g % self.q)
    }

    /// The global number of local partition `l`.
    pub fn global(&self, l: u32) -> u32 {
        self.me * self.q + l
    }
}

/// A host's work directory: its index partitions (kept between jobs) and
/// a round's scratch files.
#[derive(Clone, Debug)]
pub struct HostDir {
    pub root: PathBuf,
    pub round: String,
}

impl HostDir {
    pub fn index(&self, g: u32) -> PathBuf {
        self.root.join("index").join(format!("part-{g:06}"))
    }
    pub fn round_dir(&self) -> PathBuf {
        self.root.join("rounds").join(&self.round)
    }
    pub fn send(&self, kind: &str, host: u32) -> PathBuf {
        self.round_dir()
            .join("send")
            .join(format!("{kind}-to-{host}"))
    }
    pub fn recv(&self, kind: &str, host: u32) -> PathBuf {
        self.round_dir()
            .join("recv")
            .join(format!("{kind}-from-{host}"))
    }
    pub fn part(&self, kind: &str, l: u32) -> PathBuf {
        self.round_dir().join(kind).join(format!("part-{l:06}"))
    }
    pub fn vm_file(&self, vm: u32, what: &str) -> PathBuf {
        self.round_dir().join("vms").join(format!("{vm}.{what}"))
    }
    pub fn tmp(&self) -> PathBuf {
        self.round_dir().join("tmp")
    }
}

/// The process's resident memory now (`VmRSS`), in bytes.
pub fn rss_now() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// The process's peak resident memory (`VmHWM`), in bytes.
pub fn rss_peak() -> u64 {
    status_kib("VmHWM:") * 1024
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The bytes a stage may use for its buffers: the cap less what the
/// process already holds, less a margin for the allocator and stacks.
pub fn budget(memory: u64) -> Result<usize> {
    const MARGIN: u64 = 2 << 20;
    let held = rss_now();
    let left = memory.saturating_sub(held + MARGIN);
    if left < (4 << 20) {
        return Err(StoreError::Invalid(format!(
            "a memory cap of {} MB leaves {} MB for the stage once the worker holds {} MB: raise --memory",
            memory >> 20,
            left >> 20,
            held >> 20
        )));
    }
    Ok(left as usize)
}

/// A round's name becomes a directory name: letters, digits, `-`, `_`,
/// `.` only (and not `.`/`..`).
pub fn valid_round(r: &str) -> Result<()> {
    let ok = !r.is_empty()
        && r.len() <= 64
        && r != "."
        && r != ".."
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match ok {
        true => Ok(()),
        false => Err(StoreError::Invalid(format!("bad round name {r:?}"))),
    }
}

/// Removes a file if it exists.
pub fn remove(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("remove", p.display().to_string(), e)),
    }
}
