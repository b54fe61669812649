//! Stage 1a on a VM's host: level-1 dirty segments, and a detection
//! request per non-zero block of each dirty segment, sent to the host of
//! its fingerprint's partition (one send buffer per host: Option 2).

use super::args::{StageArgs, VmArgs};
use super::records::RecordWriter;
use super::{HostDir, Shape, BLOCK, REQ_LEN, SEGMENT, SLOT_LEN};
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_core::format::{ContainerId, Node, NodeKind, SegmentRef, Snapshot};
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

/// The version a VM's new snapshot builds on: the latest of its series,
/// with the parent rules of a backup (an archival version, one in the
/// cloud tier — a separate dedup domain — or one cut with another chunker
/// offers nothing). Returns its id and snapshot.
pub(crate) fn parent_of(
    all: &[(SnapshotId, Snapshot)],
    name: &str,
) -> Option<(SnapshotId, Snapshot)> {
    let (id, s) = all
        .iter()
        .filter(|(_, s)| s.series == name)
        .max_by_key(|(_, s)| (s.version, s.time_ns))?;
    let usable = s.archival.is_none()
        && s.tier == strata_core::format::Tier::Active
        && s.chunker == strata_core::chunker::ChunkerParams::fixed();
    usable.then(|| (id.clone(), s.clone()))
}

/// The image of a VM snapshot (its recipe's first file), read a part at a
/// time: its segments in order, each with the container table of the
/// part it came from. Neither scan nor finish holds the image's whole
/// chunk list (a 40 GB image has ten million): only a part, and the
/// segment being used.
pub(crate) struct ImageSegments<'r> {
    parts: crate::repo::recipe::Parts<'r>,
    /// The rest of the current part, its table, and the image's first
    /// piece (metadata only) to recognise its further pieces by.
    nodes: VecDeque<Node>,
    table: Arc<Vec<ContainerId>>,
    head: Node,
    /// Segments of the piece being read.
    segments: VecDeque<SegmentRef>,
    /// Index of the next segment.
    pub at: usize,
}

impl<'r> ImageSegments<'r> {
    /// The image of snapshot `s`; `None` if its recipe holds no file.
    pub fn open(repo: &'r Repository, s: &Snapshot) -> Result<Option<Self>> {
        let mut parts = crate::repo::recipe::Parts::open(repo, &s.recipe)?;
        while let Some(part) = parts.next_part()? {
            let mut nodes: VecDeque<Node> = part.nodes.into();
            while let Some(mut n) = nodes.pop_front() {
                if n.kind != NodeKind::File {
                    continue;
                }
                let segments = std::mem::take(&mut n.segments).into();
                return Ok(Some(ImageSegments {
                    parts,
                    nodes,
                    table: Arc::new(part.containers),
                    head: n,
                    segments,
                    at: 0,
                }));
            }
        }
        Ok(None)
    }

    /// The next segment and the container table its direct references
    /// index.
    pub fn next_segment(&mut self) -> Result<Option<(SegmentRef, Arc<Vec<ContainerId>>)>> {
        loop {
            if let Some(s) = self.segments.pop_front() {
                self.at += 1;
                return Ok(Some((s, self.table.clone())));
            }
            if self.nodes.is_empty() {
                match self.parts.next_part()? {
                    Some(p) => {
                        self.nodes = p.nodes.into();
                        self.table = Arc::new(p.containers);
                    }
                    None => return Ok(None),
                }
                continue;
            }
            match self.nodes.pop_front() {
                Some(n) if crate::repo::recipe::continues(&self.head, &n) => {
                    self.segments = n.segments.into();
                }
                _ => {
                    // The image ends here: nothing after it is read.
                    self.nodes.clear();
                    self.parts = crate::repo::recipe::Parts::empty(self.parts.repo());
                    return Ok(None);
                }
            }
        }
    }
}

/// Makes the image's view for this round: a reflink copy in the work
/// directory where the file system has them (a consistent snapshot the
/// guest cannot change between the two reads), else the image itself (a
/// block whose fingerprint changed by the second read is then stored as
/// it is then). Returns the path to read and whether it is a copy.
fn consistent_view(image: &Path, copy: &Path) -> Result<(PathBuf, bool)> {
    let src =
        File::open(image).map_err(|e| StoreError::io("open", image.display().to_string(), e))?;
    if let Some(d) = copy.parent() {
        std::fs::create_dir_all(d)
            .map_err(|e| StoreError::io("create", d.display().to_string(), e))?;
    }
    let dst =
        File::create(copy).map_err(|e| StoreError::io("create", copy.display().to_string(), e))?;
    use std::os::fd::AsRawFd;
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: both descriptors are open for the duration of the call.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    if r == 0 {
        return Ok((copy.to_path_buf(), true));
    }
    drop(dst);
    super::remove(copy)?;
    Ok((image.to_path_buf(), false))
}

/// Which segments the changed extents touch (`None`: compare all).
fn changed_segments(changed: &Option<Vec<(u64, u64)>>, segments: usize) -> Option<Vec<bool>> {
    let list = changed.as_ref()?;
    let mut dirty = vec![false; segments];
    for &(off, len) in list {
        if len == 0 {
            continue;
        }
        let first = (off / SEGMENT as u64) as usize;
        let last = ((off.saturating_add(len) - 1) / SEGMENT as u64) as usize;
        for d in dirty.iter_mut().take(last.saturating_add(1)).skip(first) {
            *d = true;
        }
    }
    Some(dirty)
}

struct Sender {
    out: Vec<RecordWriter>,
    sent: Vec<u64>,
}

/// Stage 1a: scans this host's VMs of the round.
pub fn scan(repo: &Repository, a: &StageArgs) -> Result<Value> {
    let shape = a.shape()?;
    let dir = a.dir()?;
    let budget = super::budget(a.memory)?;
    let each =
        ((budget - SEGMENT.min(budget / 2)) / (shape.hosts as usize + 4)).clamp(4096, 4 << 20);
    let mut send = Sender {
        out: (0..shape.hosts)
            .map(|h| RecordWriter::create(&dir.send("req", h), each))
            .collect::<Result<_>>()?,
        sent: vec![0; shape.hosts as usize],
    };
    let mut vms = Vec::new();
    let mut buf = vec![0u8; SEGMENT];
    let all = repo.list_snapshots()?;
    for vm in &a.vms {
        // A VM that cannot be read fails alone: the requests it sent are
        // answered and dropped, its blocks others wait for are stored by
        // them in stage 4.
        match scan_vm(repo, &all, &dir, &shape, vm, &mut send, &mut buf, each) {
            Ok(v) => vms.push(v),
            Err(e) => {
                let msg = format!("VM {}: {e}", vm.name);
                let p = dir.vm_file(vm.vm, "failed");
                std::fs::write(&p, &msg)
                    .map_err(|e| StoreError::io("write", p.display().to_string(), e))?;
                vms.push(
                    json!({"vm": vm.vm, "name": vm.name, "error": msg, "bytes_read": 0,
                                "dirty_segments": 0}),
                );
            }
        }
    }
    for w in send.out {
        w.finish()?;
    }
    Ok(
        json!({"vms": vms, "sent_bytes": send.sent, "budget": budget, "peak_rss": super::rss_peak()}),
    )
}

#[allow(clippy::too_many_arguments)]
fn scan_vm(
    repo: &Repository,
    all: &[(SnapshotId, Snapshot)],
    dir: &HostDir,
    shape: &Shape,
    vm: &VmArgs,
    send: &mut Sender,
    buf: &mut [u8],
    each: usize,
) -> Result<Value> {
    let hasher = repo.hasher();
    // Only the previous version's segment fingerprints and lengths.
    super::remove(&dir.vm_file(vm.vm, "failed"))?;
    // The parent is fixed here, for stage 4 to build on the same version.
    let parent = parent_of(all, &vm.name);
    let ppath = dir.vm_file(vm.vm, "parent");
    if let Some(d) = ppath.parent() {
        std::fs::create_dir_all(d)
            .map_err(|e| StoreError::io("create", d.display().to_string(), e))?;
    }
    std::fs::write(&ppath, parent.as_ref().map(|p| p.0.as_str()).unwrap_or(""))
        .map_err(|e| StoreError::io("write", ppath.display().to_string(), e))?;
    let mut prev: Vec<(Fingerprint, u64)> = Vec::new();
    if let Some(mut image) = match &parent {
        Some((_, s)) => ImageSegments::open(repo, s)?,
        None => None,
    } {
        while let Some((s, _)) = image.next_segment()? {
            prev.push((s.fp, s.len()));
        }
    }
    let (src, copied) = consistent_view(&vm.image, &dir.vm_file(vm.vm, "img"))?;
    std::fs::write(
        dir.vm_file(vm.vm, "src"),
        src.as_os_str().as_encoded_bytes(),
    )
    .map_err(|e| StoreError::io("write", dir.vm_file(vm.vm, "src").display().to_string(), e))?;
    let f = File::open(&src).map_err(|e| StoreError::io("open", src.display().to_string(), e))?;
    let size = f
        .metadata()
        .map_err(|e| StoreError::io("stat", src.display().to_string(), e))?
        .len();
    // Stage 4 writes the image's node a piece at a time, with its size
    // first: the size of the view read here.
    let sp = dir.vm_file(vm.vm, "size");
    std::fs::write(&sp, size.to_string())
        .map_err(|e| StoreError::io("write", sp.display().to_string(), e))?;
    let segments = size.div_ceil(SEGMENT as u64) as usize;
    let cbt = changed_segments(&vm.changed, segments);
    let mut scan = RecordWriter::create(&dir.vm_file(vm.vm, "scan"), 256 << 10)?;
    let mut map = RecordWriter::create(&dir.vm_file(vm.vm, "map"), each)?;
    let (mut slot, mut read, mut dirty, mut zero) = (0u32, 0u64, 0u64, 0u64);
    let mut slotrec = [0u8; SLOT_LEN];
    let mut req = [0u8; REQ_LEN];
    for i in 0..segments {
        let off = i as u64 * SEGMENT as u64;
        let len = (size - off).min(SEGMENT as u64) as usize;
        let same_len = prev.get(i).is_some_and(|p| p.1 == len as u64);
        if cbt.as_ref().is_some_and(|d| !d[i]) && same_len {
            scan.put(&[0])?;
            continue;
        }
        f.read_exact_at(&mut buf[..len], off)
            .map_err(|e| StoreError::io("read", src.display().to_string(), e))?;
        read += len as u64;
        let chunks: Vec<(Fingerprint, bool)> = buf[..len]
            .chunks(BLOCK)
            .map(|c| crate::ops::backup::job::chunk_fp(hasher, c))
            .collect();
        let seg_fp = hasher.hash_fingerprints(chunks.iter().map(|c| &c.0));
        if same_len && prev[i].0 == seg_fp {
            scan.put(&[0])?;
            continue;
        }
        dirty += 1;
        scan.put(&[1])?;
        scan.put(&(chunks.len() as u32).to_le_bytes())?;
        for (c, (fp, is_zero)) in buf[..len].chunks(BLOCK).zip(&chunks) {
            scan.put(&(c.len() as u32).to_le_bytes())?;
            if *is_zero {
                zero += 1;
                scan.put(&u32::MAX.to_le_bytes())?;
                continue;
            }
            scan.put(&slot.to_le_bytes())?;
            slotrec[..32].copy_from_slice(&fp.0);
            map.put(&slotrec)?;
            req[..32].copy_from_slice(&fp.0);
            req[32..36].copy_from_slice(&shape.me.to_le_bytes());
            req[36..40].copy_from_slice(&vm.vm.to_le_bytes());
            req[40..44].copy_from_slice(&slot.to_le_bytes());
            let (h, _) = shape.owner(fp);
            send.out[h as usize].put(&req)?;
            send.sent[h as usize] += REQ_LEN as u64;
            slot += 1;
        }
    }
    scan.finish()?;
    map.finish()?;
    Ok(
        json!({"vm": vm.vm, "name": vm.name, "size": size, "segments": segments,
              "dirty_segments": dirty, "bytes_read": read, "requests": slot,
              "zero_blocks": zero, "previous_segments": prev.len(), "reflink": copied}),
    )
}
