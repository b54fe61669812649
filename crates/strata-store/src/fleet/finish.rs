//! Stage 4b on a VM's host: the dup-with-new answers applied, each VM's
//! recipe built from its scan and block map (clean segments taken from
//! the previous version) and its snapshot committed — the VM's commit
//! point.

use super::args::{StageArgs, VmArgs};
use super::scan::ImageSegments;
use super::store::{
    apply_answers, failed, slot_at, slot_range, source, BlockStore, DirtySegment, ScanReader,
};
use super::{u32_at, HostDir, Kind, Loc, SEGMENT, SLOT_LEN};
use crate::error::{Result, StoreError};
use crate::repo::{now_ns, Repository};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use strata_core::chunker::ChunkerParams;
use strata_core::format::{
    ChunkRef, ContainerId, Node, NodeKind, SegmentRef, Snapshot, SnapshotStats,
};
use strata_core::id::{RecipeId, SnapshotId};
use strata_core::Fingerprint;

fn io(op: &'static str, p: &std::path::Path, e: std::io::Error) -> StoreError {
    StoreError::io(op, p.display().to_string(), e)
}

/// Stage 4b.
pub fn finish(repo: &Repository, a: &StageArgs) -> Result<Value> {
    let (shape, dir) = (a.shape()?, a.dir()?);
    super::budget(a.memory)?;
    let answered = apply_answers(&dir, &shape, &a.vms, "dwn")?;
    let existing = repo.list_snapshots()?;
    let mut vms = Vec::new();
    for vm in &a.vms {
        if failed(&dir, vm.vm) {
            let p = dir.vm_file(vm.vm, "failed");
            let msg = std::fs::read_to_string(&p).unwrap_or_default();
            vms.push(json!({"vm": vm.vm, "name": vm.name, "error": msg}));
            continue;
        }
        // A rerun after a crash: a VM already committed by this round.
        if let Some((id, _)) = existing
            .iter()
            .find(|(_, s)| s.series == vm.name && !vm.tags.is_empty() && s.tags == vm.tags)
        {
            vms.push(json!({"vm": vm.vm, "name": vm.name, "snapshot": id, "already": true}));
            continue;
        }
        vms.push(finish_vm(repo, &dir, vm)?);
    }
    Ok(json!({"answers": answered, "vms": vms, "peak_rss": super::rss_peak()}))
}

/// A recipe's container table being built.
#[derive(Default)]
struct Table {
    ids: Vec<ContainerId>,
    at: HashMap<ContainerId, u32>,
}

impl Table {
    fn intern(&mut self, id: ContainerId) -> u32 {
        *self.at.entry(id).or_insert_with(|| {
            self.ids.push(id);
            self.ids.len() as u32 - 1
        })
    }
}

/// The previous version's clean segment `i`, its references interned
/// into `table`. Segments are taken in increasing order.
fn clean_segment(
    prev: Option<&mut ImageSegments>,
    i: usize,
    table: &mut Table,
    name: &str,
) -> Result<SegmentRef> {
    let bad = |what: &str| StoreError::Invalid(format!("{name}: {what}"));
    let image = prev.ok_or_else(|| bad("a clean segment without a previous version"))?;
    if image.at > i {
        return Err(bad("clean segments out of order"));
    }
    let (mut s, ids) = loop {
        match image.next_segment()? {
            Some(s) if image.at > i => break s,
            Some(_) => continue,
            None => return Err(bad(&format!("segment {i} is not in the previous version"))),
        }
    };
    for c in &mut s.chunks {
        if c.is_zero() {
            continue;
        }
        let id = ids
            .get(c.container as usize)
            .filter(|_| c.is_direct())
            .ok_or_else(|| bad("the previous version holds a reference this job cannot copy"))?;
        c.container = table.intern(*id);
    }
    Ok(s)
}

/// The image's recipe as it is built: pieces of its node (at most
/// [`crate::repo::recipe::PIECE_CHUNKS`] chunks, as the writer would cut a
/// whole node) go to the writer as they fill.
struct ImageRecipe<'r> {
    writer: crate::repo::recipe::writer::RecipeWriter<'r>,
    head: Node,
    piece: Vec<SegmentRef>,
    chunks: usize,
    pushed: bool,
    size: u64,
}

impl ImageRecipe<'_> {
    fn add(&mut self, s: SegmentRef, table: &Table) -> Result<()> {
        self.size += s.len();
        self.chunks += s.chunk_count() as usize;
        self.piece.push(s);
        if self.chunks >= crate::repo::recipe::PIECE_CHUNKS {
            self.flush(table)?;
        }
        Ok(())
    }

    fn flush(&mut self, table: &Table) -> Result<()> {
        let segments = std::mem::take(&mut self.piece);
        self.chunks = 0;
        self.pushed = true;
        let node = Node {
            segments,
            ..self.head.clone()
        };
        self.writer
            .push(node, |i| table.ids.get(i as usize).copied())
    }

    /// Writes the last piece and the recipe: its id and the bytes written.
    fn finish(mut self, table: &Table, name: &str) -> Result<(RecipeId, u64)> {
        if !self.piece.is_empty() || !self.pushed {
            self.flush(table)?;
        }
        if self.size != self.head.size {
            return Err(StoreError::Invalid(format!(
                "{name}: the image read as {} bytes, its scan saw {}",
                self.size, self.head.size
            )));
        }
        self.writer.finish()
    }
}

fn finish_vm(repo: &Repository, dir: &HostDir, vm: &VmArgs) -> Result<Value> {
    let mut prev = previous(repo, dir, vm)?;
    let size = image_size(dir, vm)?;
    let (mut blocks, mut scan) = Blocks::open(repo, dir, vm)?;
    let mut out = ImageRecipe {
        // Parts of 1 MiB: what this stage holds of the recipe it writes,
        // and of the previous version's when the next job reads it.
        writer: crate::repo::recipe::writer::RecipeWriter::new(repo).with_part_bytes(1 << 20),
        head: image_node(&vm.image, size)?,
        piece: Vec::new(),
        chunks: 0,
        pushed: false,
        size: 0,
    };
    let mut i = 0;
    while let Some(seg) = scan.next()? {
        let s = match seg {
            None => {
                let prev = prev.as_mut().map(|p| &mut p.1);
                clean_segment(prev, i, &mut blocks.table, &vm.name)?
            }
            Some(seg) => blocks.segment(&seg, i)?,
        };
        out.add(s, &blocks.table)?;
        i += 1;
    }
    let Blocks {
        table,
        bs,
        stored_blocks,
        stored_raw,
        ..
    } = blocks;
    let stored_blocks = stored_blocks + bs.blocks;
    let stored_raw = stored_raw + bs.bytes;
    // The recipe's parts are written as it goes, naming containers
    // stored here; the snapshot is committed only after both.
    let mut stored = bs.finish()?;
    let parent = prev.map(|p| p.0);
    let (recipe, n) = out.finish(&table, &vm.name)?;
    stored += n;
    let stats = SnapshotStats {
        files: 1,
        logical_bytes: size,
        new_chunks: stored_blocks,
        new_raw_bytes: stored_raw,
        new_stored_bytes: stored,
        ..Default::default()
    };
    let mut snapshot = vm_snapshot(vm, recipe, parent, stats);
    let id = crate::ops::backup::commit::commit_snapshot(repo, &mut snapshot)?;
    Ok(
        json!({"vm": vm.vm, "name": vm.name, "snapshot": id, "version": snapshot.version,
              "logical_bytes": size, "new_blocks": stored_blocks, "new_raw_bytes": stored_raw}),
    )
}

/// The previous version stage 1a compared the VM with, by id, opened for
/// its segments (`None`: there is none).
fn previous<'r>(
    repo: &'r Repository,
    dir: &HostDir,
    vm: &VmArgs,
) -> Result<Option<(SnapshotId, ImageSegments<'r>)>> {
    // The parent stage 1a compared with (not the series' latest now).
    let pp = dir.vm_file(vm.vm, "parent");
    let parent_id = std::fs::read_to_string(&pp).map_err(|e| io("read", &pp, e))?;
    Ok(match parent_id.as_str() {
        "" => None,
        id => {
            let id = SnapshotId::parse(id.trim())
                .map_err(|e| StoreError::Invalid(format!("{}: {e}", pp.display())))?;
            let s = repo.load_snapshot(&id)?;
            ImageSegments::open(repo, &s)?.map(|image| (id, image))
        }
    })
}

/// The image's size as its scan recorded it.
fn image_size(dir: &HostDir, vm: &VmArgs) -> Result<u64> {
    let sp = dir.vm_file(vm.vm, "size");
    std::fs::read_to_string(&sp)
        .map_err(|e| io("read", &sp, e))?
        .trim()
        .parse()
        .map_err(|_| StoreError::Invalid(format!("{}: damaged", sp.display())))
}

/// What the dirty segments of a VM's image are built from and into.
struct Blocks<'r> {
    /// The image, and its path.
    img: File,
    src: std::path::PathBuf,
    /// The block map, and its path.
    map: File,
    mp: std::path::PathBuf,
    /// A segment's slots of the block map, and one block of the image.
    slots: Vec<u8>,
    block: Vec<u8>,
    hasher: &'r strata_core::Hasher,
    table: Table,
    bs: BlockStore,
    /// Blocks (and their raw bytes) this VM stored new (in stage 2b).
    stored_blocks: u64,
    stored_raw: u64,
}

impl<'r> Blocks<'r> {
    /// Opens the VM's image, block map and scan.
    fn open(repo: &'r Repository, dir: &HostDir, vm: &VmArgs) -> Result<(Self, ScanReader)> {
        let src = source(dir, vm.vm)?;
        let img = File::open(&src).map_err(|e| io("open", &src, e))?;
        let mp = dir.vm_file(vm.vm, "map");
        let map = File::open(&mp).map_err(|e| io("open", &mp, e))?;
        let scan = ScanReader::open(&dir.vm_file(vm.vm, "scan"))?;
        let table = Table::default();
        let bs = BlockStore::new(repo);
        let blocks = Blocks {
            img,
            src,
            map,
            mp,
            slots: Vec::new(),
            block: vec![0u8; super::BLOCK],
            hasher: repo.hasher(),
            table,
            bs,
            stored_blocks: 0,
            stored_raw: 0,
        };
        Ok((blocks, scan))
    }

    /// Dirty segment `i`'s reference, its blocks' slots read from the map.
    fn segment(&mut self, seg: &DirtySegment, i: usize) -> Result<SegmentRef> {
        if let Some((first, last)) = slot_range(seg) {
            self.slots.resize((last - first + 1) as usize * SLOT_LEN, 0);
            self.map
                .read_exact_at(&mut self.slots, first as u64 * SLOT_LEN as u64)
                .map_err(|e| io("read", &self.mp, e))?;
        }
        let mut chunks = Vec::with_capacity(seg.blocks.len());
        let first = slot_range(seg).map(|r| r.0).unwrap_or(0);
        let mut off = i as u64 * SEGMENT as u64;
        for &(len, slot) in &seg.blocks {
            let at = off;
            off += len as u64;
            chunks.push(self.chunk(len, slot, first, at)?);
        }
        let fp = self.hasher.hash_fingerprints(chunks.iter().map(|c| &c.fp));
        // (Its zero chunks as runs, once they are hashed.)
        Ok(SegmentRef::with_runs(fp, chunks))
    }

    /// The reference to the block of `len` bytes at `at` in slot `slot`
    /// (the segment's slots start at `first`): located, or stored now.
    fn chunk(&mut self, len: u32, slot: u32, first: u32, at: u64) -> Result<ChunkRef> {
        if slot == u32::MAX {
            return Ok(ChunkRef::zeros(len, 1));
        }
        let s = &*slot_at(&mut self.slots, first, slot)?;
        let mut fp = super::fp_at(s, 0);
        let kind = Kind::from_u32(u32_at(s, 32))?;
        let loc = if kind.located() {
            if kind == Kind::Stored {
                self.stored_blocks += 1;
                self.stored_raw += len as u64;
            }
            Loc::get(&s[36..])
        } else {
            // Unanswered (its storer found other content): store it.
            let data = &mut self.block[..len as usize];
            self.img
                .read_exact_at(data, at)
                .map_err(|e| io("read", &self.src, e))?;
            let (f, zero) = crate::ops::backup::job::chunk_fp(self.hasher, data);
            fp = f;
            match zero {
                true => Loc::default(),
                false => self.bs.put(fp, data)?,
            }
        };
        if fp == Fingerprint::ZERO {
            return Ok(ChunkRef::zeros(len, 1));
        }
        Ok(ChunkRef {
            fp,
            len,
            container: self.table.intern(loc.container),
            region: loc.region,
            offset: loc.offset,
        })
    }
}

/// The snapshot of VM `vm`'s image with recipe `recipe`, not yet committed.
fn vm_snapshot(
    vm: &VmArgs,
    recipe: RecipeId,
    parent: Option<SnapshotId>,
    stats: SnapshotStats,
) -> Snapshot {
    Snapshot {
        series: vm.name.clone(),
        version: 0,
        time_ns: now_ns(),
        host: vm.host_name.clone(),
        paths: vec![vm.image.display().to_string()],
        tags: vm.tags.clone(),
        recipe,
        parent,
        chunker: ChunkerParams::fixed(),
        stats,
        archival: None,
        tier: Default::default(),
        cloud_part: None,
    }
}

/// The image's node: named by its file name, with its metadata.
fn image_node(image: &std::path::Path, size: u64) -> Result<Node> {
    let md = std::fs::metadata(image).map_err(|e| io("stat", image, e))?;
    let name = image
        .file_name()
        .ok_or_else(|| StoreError::Invalid(format!("{}: not a file name", image.display())))?;
    Ok(Node {
        mode: md.mode(),
        uid: md.uid(),
        gid: md.gid(),
        mtime_ns: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
        ctime_ns: md.ctime() * 1_000_000_000 + md.ctime_nsec(),
        size,
        ..Node::new(name.as_encoded_bytes().to_vec(), NodeKind::File)
    })
}
