//! Stage 2b on a VM's host: the answers applied to each VM's block map,
//! the dirty segments read again and the blocks this host must store
//! written to the shared repository; their references go to the
//! partitions' hosts (stage 3).

use super::args::{StageArgs, VmArgs};
use super::records::{RecordReader, RecordWriter};
use super::{u32_at, HostDir, Kind, Loc, Shape, ANSWER_LEN, BLOCK, ENTRY_LEN, SEGMENT, SLOT_LEN};
use crate::engine::index::ContainerTable;
use crate::engine::writer::{ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::repo::Repository;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use strata_core::Fingerprint;

fn io(op: &'static str, p: &std::path::Path, e: std::io::Error) -> StoreError {
    StoreError::io(op, p.display().to_string(), e)
}

/// Writes the answers of `recv/KIND-from-*` into the block maps of this
/// round's VMs.
pub(crate) fn apply_answers(
    dir: &HostDir,
    shape: &Shape,
    vms: &[VmArgs],
    kind: &str,
) -> Result<u64> {
    // The block maps of the VMs whose scan worked (a failed VM's answers
    // are dropped), with their slot counts.
    let mut maps: HashMap<u32, (File, u64)> = HashMap::new();
    for vm in vms.iter().filter(|v| !failed(dir, v.vm)) {
        let p = dir.vm_file(vm.vm, "map");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| io("open", &p, e))?;
        let slots = f.metadata().map_err(|e| io("stat", &p, e))?.len() / SLOT_LEN as u64;
        maps.insert(vm.vm, (f, slots));
    }
    let known: std::collections::HashSet<u32> = vms.iter().map(|v| v.vm).collect();
    let mut a = [0u8; ANSWER_LEN];
    let mut kind_now = [0u8; 4];
    let mut n = 0;
    for h in 0..shape.hosts {
        let mut r = RecordReader::open_required(&dir.recv(kind, h), ANSWER_LEN, 128 << 10)?;
        while r.next_into(&mut a)? {
            let (vm, slot) = (u32_at(&a, 0), u32_at(&a, 4));
            Kind::from_u32(u32_at(&a, 8))?;
            let Some((f, slots)) = maps.get(&vm) else {
                if known.contains(&vm) {
                    continue;
                }
                return Err(StoreError::Invalid(format!(
                    "an answer for VM {vm}, not one of this host's in this round"
                )));
            };
            if slot as u64 >= *slots {
                return Err(StoreError::Invalid(format!(
                    "an answer for slot {slot} of VM {vm}, whose map has {slots}"
                )));
            }
            let at = slot as u64 * SLOT_LEN as u64 + 32;
            let mp = dir.vm_file(vm, "map");
            // A block this VM stored itself (new, or changed since its
            // scan: the slot holds its new fingerprint) keeps its own
            // location: an answer to the old request (or the same answer
            // applied again by a rerun) must not replace it.
            f.read_exact_at(&mut kind_now, at)
                .map_err(|e| io("read", &mp, e))?;
            if Kind::from_u32(u32::from_le_bytes(kind_now))? == Kind::Stored {
                continue;
            }
            f.write_all_at(&a[8..], at)
                .map_err(|e| io("write", &mp, e))?;
            n += 1;
        }
    }
    for (f, _) in maps.values() {
        f.sync_data().map_err(|e| io("sync", &dir.round_dir(), e))?;
    }
    Ok(n)
}

/// Whether VM `vm`'s scan failed this round (it is then left out).
pub(crate) fn failed(dir: &HostDir, vm: u32) -> bool {
    dir.vm_file(vm, "failed").exists()
}

/// The slot `slot` of a segment's slots read from `first` on, checked.
pub(crate) fn slot_at(slots: &mut [u8], first: u32, slot: u32) -> Result<&mut [u8]> {
    slot.checked_sub(first)
        .map(|i| i as usize * SLOT_LEN)
        .and_then(|at| slots.get_mut(at..at + SLOT_LEN))
        .ok_or_else(|| {
            StoreError::Invalid(format!(
                "slot {slot} out of order in a scan file (damaged scratch file)"
            ))
        })
}

/// One dirty segment of a VM's scan file: its blocks' lengths and slots
/// (`u32::MAX`: an all-zero block).
pub(crate) struct DirtySegment {
    pub blocks: Vec<(u32, u32)>,
}

/// Reads a VM's scan file: per segment, clean (`None`) or dirty.
pub(crate) struct ScanReader {
    data: std::io::BufReader<File>,
    path: std::path::PathBuf,
}

impl ScanReader {
    pub fn open(p: &std::path::Path) -> Result<Self> {
        let f = File::open(p).map_err(|e| io("open", p, e))?;
        Ok(ScanReader {
            data: std::io::BufReader::with_capacity(256 << 10, f),
            path: p.to_path_buf(),
        })
    }

    fn read<const N: usize>(&mut self) -> Result<Option<[u8; N]>> {
        use std::io::Read;
        let mut b = [0u8; N];
        match self.data.read_exact(&mut b) {
            Ok(()) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(io("read", &self.path, e)),
        }
    }

    /// The next segment: `None` at the end, `Some(None)` clean.
    pub fn next(&mut self) -> Result<Option<Option<DirtySegment>>> {
        let Some([state]) = self.read::<1>()? else {
            return Ok(None);
        };
        if state == 0 {
            return Ok(Some(None));
        }
        let path = self.path.clone();
        let bad = || StoreError::Invalid(format!("{}: truncated scan file", path.display()));
        let n = u32::from_le_bytes(self.read::<4>()?.ok_or_else(bad)?);
        if n as usize > SEGMENT / BLOCK {
            return Err(StoreError::Invalid(format!(
                "{}: damaged scan file",
                self.path.display()
            )));
        }
        let mut blocks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let len = u32::from_le_bytes(self.read::<4>()?.ok_or_else(bad)?);
            let slot = u32::from_le_bytes(self.read::<4>()?.ok_or_else(bad)?);
            blocks.push((len, slot));
        }
        Ok(Some(Some(DirtySegment { blocks })))
    }
}

/// The slots of a dirty segment's non-zero blocks (consecutive).
pub(crate) fn slot_range(seg: &DirtySegment) -> Option<(u32, u32)> {
    let mut it = seg.blocks.iter().map(|b| b.1).filter(|&s| s != u32::MAX);
    let first = it.next()?;
    Some((first, it.next_back().unwrap_or(first)))
}

/// Stores blocks into the repository's containers.
pub(crate) struct BlockStore {
    pub table: Arc<ContainerTable>,
    sink: Option<ContainerSink>,
    writer: Option<ContainerWriter>,
    repo: Repository,
    pub blocks: u64,
    pub bytes: u64,
    /// Bytes stored since the containers were last closed, and bytes
    /// written by closes so far.
    since: u64,
    stored: u64,
}

/// Raw bytes stored between two closes of a [`BlockStore`]'s containers.
const ROTATE: u64 = 64 << 20;

impl BlockStore {
    pub fn new(repo: &Repository) -> Self {
        BlockStore {
            table: Arc::new(ContainerTable::default()),
            sink: None,
            writer: None,
            repo: repo.clone(),
            blocks: 0,
            bytes: 0,
            since: 0,
            stored: 0,
        }
    }

    /// Stores a block; every [`ROTATE`] bytes the containers so far are
    /// made durable and indexed, so the metadata held (and the index object
    /// written) stays bounded whatever a stage stores.
    pub fn put(&mut self, fp: Fingerprint, data: &[u8]) -> Result<Loc> {
        if self.since >= ROTATE {
            self.stored += self.close()?;
        }
        if self.writer.is_none() {
            let sink = ContainerSink::start(&self.repo);
            self.writer = Some(sink.writer(&self.repo, self.table.clone()));
            self.sink = Some(sink);
        }
        let w = self.writer.as_mut().expect("opened above");
        let loc = w.next_loc(data.len())?;
        w.append(fp, data);
        self.blocks += 1;
        self.bytes += data.len() as u64;
        self.since += data.len() as u64;
        Ok(Loc {
            container: self.table.get(loc.container),
            region: loc.region,
            offset: loc.offset,
            len: loc.len,
        })
    }

    /// Makes every container durable and lists them in an index object;
    /// returns the bytes written to the repository.
    pub fn finish(mut self) -> Result<u64> {
        Ok(self.stored + self.close()?)
    }

    fn close(&mut self) -> Result<u64> {
        self.since = 0;
        let Some(sink) = self.sink.take() else {
            return Ok(0);
        };
        let mut w = self.writer.take().expect("with its sink");
        let flushed = w.flush();
        drop(w);
        let written = sink.finish()?;
        flushed?;
        let mut n = written.stored_bytes;
        if !written.metas.is_empty() {
            n += crate::repo::index::put_index_object(&self.repo, written.metas)?.1;
        }
        Ok(n)
    }
}

/// Stage 2b.
pub fn store(repo: &Repository, a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    let budget = super::budget(a.memory)?;
    let answered = apply_answers(&dir, &shape, &a.vms, "ans")?;
    let each = ((budget.saturating_sub(SEGMENT + (4 << 20))) / (shape.hosts as usize + 2))
        .clamp(4096, 1 << 20);
    let mut refs: Vec<RecordWriter> = (0..shape.hosts)
        .map(|h| RecordWriter::create(&dir.send("ref", h), each))
        .collect::<Result<_>>()?;
    let mut sent = vec![0u64; shape.hosts as usize];
    let mut bs = BlockStore::new(repo);
    let mut buf = vec![0u8; SEGMENT];
    let mut vms = Vec::new();
    for vm in a.vms.iter().filter(|v| !failed(&dir, v.vm)) {
        let (read, changed) = store_vm(
            repo, &dir, &shape, vm, &mut bs, &mut buf, &mut refs, &mut sent,
        )?;
        vms.push(json!({"vm": vm.vm, "bytes_read": read, "changed_blocks": changed}));
    }
    let (blocks, bytes) = (bs.blocks, bs.bytes);
    let stored = bs.finish()?;
    for w in refs {
        w.finish()?;
    }
    Ok(
        json!({"answers": answered, "stored_blocks": blocks, "stored_raw_bytes": bytes,
              "stored_bytes": stored, "vms": vms, "sent_bytes": sent, "peak_rss": super::rss_peak()}),
    )
}

/// The path stage 1a read the VM from (its reflink copy, or the image).
pub(crate) fn source(dir: &HostDir, vm: u32) -> Result<std::path::PathBuf> {
    let p = dir.vm_file(vm, "src");
    let raw = std::fs::read(&p).map_err(|e| io("read", &p, e))?;
    // SAFETY: written by stage 1a from an OsStr of this platform.
    Ok(std::path::PathBuf::from(unsafe {
        std::ffi::OsString::from_encoded_bytes_unchecked(raw)
    }))
}

#[allow(clippy::too_many_arguments)]
fn store_vm(
    repo: &Repository,
    dir: &HostDir,
    shape: &Shape,
    vm: &VmArgs,
    bs: &mut BlockStore,
    buf: &mut [u8],
    refs: &mut [RecordWriter],
    sent: &mut [u64],
) -> Result<(u64, u64)> {
    let src = source(dir, vm.vm)?;
    let f = File::open(&src).map_err(|e| io("open", &src, e))?;
    let mp = dir.vm_file(vm.vm, "map");
    let map = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&mp)
        .map_err(|e| io("open", &mp, e))?;
    let mut scan = ScanReader::open(&dir.vm_file(vm.vm, "scan"))?;
    let hasher = repo.hasher();
    let (mut i, mut read, mut changed) = (0u64, 0u64, 0u64);
    let mut slots = Vec::new();
    let mut entry = [0u8; ENTRY_LEN];
    while let Some(seg) = scan.next()? {
        let off = i * SEGMENT as u64;
        i += 1;
        let Some(seg) = seg else { continue };
        let Some((first, last)) = slot_range(&seg) else {
            continue;
        };
        let len: usize = seg.blocks.iter().map(|b| b.0 as usize).sum();
        if len > SEGMENT {
            return Err(StoreError::Invalid(format!(
                "{}: damaged scan file",
                src.display()
            )));
        }
        f.read_exact_at(&mut buf[..len], off)
            .map_err(|e| io("read", &src, e))?;
        read += len as u64;
        slots.resize((last - first + 1) as usize * SLOT_LEN, 0);
        map.read_exact_at(&mut slots, first as u64 * SLOT_LEN as u64)
            .map_err(|e| io("read", &mp, e))?;
        let mut at = 0usize;
        for &(blen, slot) in &seg.blocks {
            let data = &buf[at..at + blen as usize];
            at += blen as usize;
            if slot == u32::MAX {
                continue;
            }
            let s = slot_at(&mut slots, first, slot)?;
            let (fp, zero) = crate::ops::backup::job::chunk_fp(hasher, data);
            let kind = Kind::from_u32(u32_at(s, 32))?;
            if fp.0 != s[..32] || zero {
                // The image changed since stage 1a (no reflink copy): the
                // block is stored as it is now, outside detection.
                changed += 1;
                let loc = match zero {
                    true => Loc::default(),
                    false => bs.put(fp, data)?,
                };
                s[..32].copy_from_slice(&fp.0);
                s[32..36].copy_from_slice(&(Kind::Stored as u32).to_le_bytes());
                loc.put(&mut s[36..]);
                continue;
            }
            if kind == Kind::New {
                let loc = bs.put(fp, data)?;
                s[32..36].copy_from_slice(&(Kind::Stored as u32).to_le_bytes());
                loc.put(&mut s[36..]);
                entry[..32].copy_from_slice(&fp.0);
                loc.put(&mut entry[32..]);
                let (h, _) = shape.owner(&fp);
                refs[h as usize].put(&entry)?;
                sent[h as usize] += ENTRY_LEN as u64;
            }
        }
        map.write_all_at(&slots, first as u64 * SLOT_LEN as u64)
            .map_err(|e| io("write", &mp, e))?;
    }
    map.sync_data().map_err(|e| io("sync", &mp, e))?;
    Ok((read, changed))
}
