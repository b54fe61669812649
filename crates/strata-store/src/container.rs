//! Data containers (DESIGN.md "Vocabulary": container, compression region).
//!
//! A data container object is laid out as
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | header: `STRC`, format version, 3 reserved bytes |
//! | 8 | … | compression regions, each a sealed envelope (zstd + AEAD/checksum) |
//! | m | … | metadata section: sealed [`ContainerMeta`] |
//! | end-16 | 16 | footer: metadata offset (u64 LE), metadata length (u32 LE), `STRF` |
//!
//! The metadata section is also written as its own `meta/` object so that
//! index, GC and check never read data; the copy inside the data object lets
//! `repair index` rebuild everything from data objects alone.
//!
//! Writers fill regions and containers in stream order on the backup
//! worker threads; a [`ContainerSink`] thread compresses and seals the
//! regions of each finished container in parallel and writes it, so reading
//! and chunking continue while the previous container is compressed.

use crate::error::{Result, StoreError};
use crate::index::{ChunkLoc, ContainerTable};
use crate::repo::{data_name, meta_name, now_ns, Repository};
use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::crypto::{random_bytes, Kind};
use strata_core::format::{
    container_header, decode, encode, ChunkEntry, ContainerFooter, ContainerId, ContainerMeta,
    RegionInfo, SegmentEntry, Stamp, CONTAINER_FOOTER_LEN, CONTAINER_HEADER_LEN, CONTAINER_MAGIC,
};
use strata_core::Fingerprint;

/// A container whose regions are filled but not yet compressed or sealed.
pub struct RawContainer {
    pub id: ContainerId,
    pub stamp: Option<Stamp>,
    pub regions: Vec<Vec<u8>>,
    pub chunks: Vec<ChunkEntry>,
    pub segments: Vec<SegmentEntry>,
}

/// Compresses and seals the regions (in parallel) and lays out the object.
pub fn seal_container(repo: &Repository, raw: RawContainer) -> Result<(Vec<u8>, ContainerMeta)> {
    let sealer = repo.sealer();
    let sealed: Vec<Vec<u8>> = raw
        .regions
        .par_iter()
        .map(|r| sealer.seal(Kind::Region, r, true))
        .collect::<Result<_, _>>()?;
    let total: usize = sealed.iter().map(|s| s.len()).sum();
    let mut data = Vec::with_capacity(CONTAINER_HEADER_LEN + total + 4096);
    data.extend_from_slice(&container_header());
    let mut regions = Vec::with_capacity(sealed.len());
    for (s, r) in sealed.iter().zip(&raw.regions) {
        regions.push(RegionInfo {
            offset: data.len() as u64,
            stored_len: s.len() as u32,
            raw_len: r.len() as u32,
        });
        data.extend_from_slice(s);
    }
    let meta_offset = data.len() as u64;
    let mut meta = ContainerMeta {
        id: raw.id,
        data_len: 0,
        created: now_ns() / 1_000_000_000,
        stamp: raw.stamp,
        regions,
        chunks: raw.chunks,
        segments: raw.segments,
    };
    // The data length is part of the metadata, and the metadata's own length
    // depends on it; postcard varints make the fixed point reachable in a
    // couple of rounds.
    let mut env;
    loop {
        env = sealer.seal(Kind::ContainerMeta, &encode(&meta)?, true)?;
        let len = meta_offset + env.len() as u64 + CONTAINER_FOOTER_LEN as u64;
        if len == meta.data_len {
            break;
        }
        meta.data_len = len;
    }
    data.extend_from_slice(&env);
    data.extend_from_slice(
        &ContainerFooter {
            meta_offset,
            meta_len: env.len() as u32,
        }
        .to_bytes(),
    );
    debug_assert_eq!(data.len() as u64, meta.data_len);
    Ok((data, meta))
}

/// Writes a sealed container: data object first, then its metadata object.
pub fn write_container(repo: &Repository, data: &[u8], meta: &ContainerMeta) -> Result<u64> {
    repo.backend().put(&data_name(&meta.id), data)?;
    let env = repo
        .sealer()
        .seal(Kind::ContainerMeta, &encode(meta)?, true)?;
    repo.backend().put(&meta_name(&meta.id), &env)?;
    Ok(data.len() as u64 + env.len() as u64)
}

/// What a sink wrote.
#[derive(Default)]
pub struct SinkResult {
    pub metas: Vec<ContainerMeta>,
    pub stored_bytes: u64,
}

/// Background threads that seal and write finished containers: one seals
/// (compressing regions in parallel), one writes and fsyncs, so the cores
/// compress the next container while the disk takes the last one.
pub struct ContainerSink {
    tx: Option<Sender<RawContainer>>,
    sealer: Option<std::thread::JoinHandle<Result<()>>>,
    handle: Option<std::thread::JoinHandle<Result<SinkResult>>>,
    pub stored_bytes: Arc<AtomicU64>,
}

impl ContainerSink {
    pub fn start(repo: &Repository) -> Self {
        let (tx, rx): (Sender<RawContainer>, Receiver<RawContainer>) = bounded(2);
        // A rendezvous: at most one sealed container waits for the disk.
        let (stx, srx) = bounded::<(Vec<u8>, ContainerMeta)>(0);
        let sealer = {
            let repo = repo.clone();
            std::thread::spawn(move || -> Result<()> {
                for raw in rx {
                    let sealed = seal_container(&repo, raw)?;
                    if stx.send(sealed).is_err() {
                        // The writer failed; its error is the one to report.
                        break;
                    }
                }
                Ok(())
            })
        };
        let repo = repo.clone();
        let stored = Arc::new(AtomicU64::new(0));
        let stored2 = stored.clone();
        let handle = std::thread::spawn(move || {
            let mut res = SinkResult::default();
            for (data, meta) in srx {
                let n = write_container(&repo, &data, &meta)?;
                stored2.fetch_add(n, Ordering::Relaxed);
                res.stored_bytes += n;
                res.metas.push(meta);
            }
            Ok(res)
        });
        ContainerSink {
            tx: Some(tx),
            sealer: Some(sealer),
            handle: Some(handle),
            stored_bytes: stored,
        }
    }

    pub fn sender(&self) -> Sender<RawContainer> {
        self.tx.clone().expect("sink is open until finish")
    }

    /// Waits for every container to be written.
    pub fn finish(mut self) -> Result<SinkResult> {
        drop(self.tx.take());
        let panicked = || StoreError::Invalid("container writer thread panicked".into());
        let sealed = self.sealer.take().map(|h| h.join());
        let written = match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            _ => Err(panicked()),
        };
        // A write error stops the sealer too, so it comes first.
        let res = written?;
        match sealed {
            Some(Ok(r)) => r.map(|()| res),
            _ => Err(panicked()),
        }
    }
}

struct OpenContainer {
    id: ContainerId,
    cidx: u32,
    regions: Vec<Vec<u8>>,
    cur: Vec<u8>,
    chunks: Vec<ChunkEntry>,
    segments: Vec<SegmentEntry>,
    raw: usize,
}

/// Packs chunks into regions and containers in stream order.
pub struct ContainerWriter {
    table: Arc<ContainerTable>,
    sink: Sender<RawContainer>,
    region_size: usize,
    container_size: usize,
    stamp: Option<Stamp>,
    open: Option<OpenContainer>,
    /// Index of the first chunk of the segment being packed whole, if any.
    segment_start: Option<(u32, u32)>,
}

impl ContainerWriter {
    pub fn new(repo: &Repository, table: Arc<ContainerTable>, sink: Sender<RawContainer>) -> Self {
        ContainerWriter {
            table,
            sink,
            region_size: repo.config().region_size as usize,
            container_size: repo.config().container_size as usize,
            stamp: None,
            open: None,
            segment_start: None,
        }
    }

    /// Starts packing a segment of `bytes` new bytes whole: rolls over to a
    /// new container first unless it fits (a segment larger than a
    /// container gets a container of its own), and keeps the container
    /// open until [`Self::end_segment`].
    pub fn begin_segment(&mut self, bytes: usize) -> Result<()> {
        if let Some(c) = &self.open {
            if c.raw > 0 && c.raw + bytes > self.container_size {
                self.flush()?;
            }
        }
        self.segment_start = Some((u32::MAX, 0));
        Ok(())
    }

    /// Ends a segment started with [`Self::begin_segment`]; records it in
    /// the container's metadata when all of it was appended there.
    pub fn end_segment(&mut self, fp: Fingerprint, appended: u32) -> bool {
        let start = self.segment_start.take();
        match (start, self.open.as_mut()) {
            (Some((cidx, first)), Some(c))
                if cidx == c.cidx && appended > 0 && c.chunks.len() as u32 == first + appended =>
            {
                c.segments.push(SegmentEntry {
                    fp,
                    first_chunk: first,
                    chunks: appended,
                });
                true
            }
            _ => false,
        }
    }

    /// Containers written from now on carry this lifecycle stamp.
    pub fn set_stamp(&mut self, stamp: Option<Stamp>) {
        self.stamp = stamp;
    }

    /// Ends the current compression region: the next chunk starts a new
    /// one. Copy-forward keeps the chunks of one source region together,
    /// so their compression is never worse than where they came from.
    pub fn end_region(&mut self) {
        if let Some(c) = self.open.as_mut() {
            Self::close_region(c);
        }
    }

    fn close_region(c: &mut OpenContainer) {
        if !c.cur.is_empty() {
            // Keep the next region's buffer at full size from the start:
            // growing it chunk by chunk would reallocate five times.
            let cap = c.cur.capacity();
            c.regions
                .push(std::mem::replace(&mut c.cur, Vec::with_capacity(cap)));
        }
    }

    /// Where the next chunk of `len` bytes will go, rolling over to a new
    /// region or container first when it would not fit.
    pub fn next_loc(&mut self, len: usize) -> Result<ChunkLoc> {
        let in_segment = self.segment_start.is_some();
        if let Some(c) = &self.open {
            if !in_segment && c.raw > 0 && c.raw + len > self.container_size {
                self.flush()?;
            }
        }
        if self.open.is_none() {
            let mut id = [0u8; 16];
            random_bytes(&mut id)?;
            let id = ContainerId(id);
            self.open = Some(OpenContainer {
                id,
                cidx: self.table.intern(id),
                regions: Vec::new(),
                cur: Vec::with_capacity(self.region_size),
                chunks: Vec::new(),
                segments: Vec::new(),
                raw: 0,
            });
        }
        let c = self.open.as_mut().expect("opened above");
        if self.segment_start == Some((u32::MAX, 0)) {
            self.segment_start = Some((c.cidx, c.chunks.len() as u32));
        }
        if !c.cur.is_empty() && c.cur.len() + len > self.region_size {
            Self::close_region(c);
        }
        Ok(ChunkLoc {
            container: c.cidx,
            region: c.regions.len() as u32,
            offset: c.cur.len() as u32,
            len: len as u32,
        })
    }

    /// Appends a chunk at the location [`Self::next_loc`] returned.
    pub fn append(&mut self, fp: Fingerprint, data: &[u8]) {
        let c = self.open.as_mut().expect("next_loc opens a container");
        c.chunks.push(ChunkEntry {
            fp,
            region: c.regions.len() as u32,
            offset: c.cur.len() as u32,
            len: data.len() as u32,
        });
        c.cur.extend_from_slice(data);
        c.raw += data.len();
    }

    /// Hands the open container to the sink.
    pub fn flush(&mut self) -> Result<()> {
        if let Some(mut c) = self.open.take() {
            Self::close_region(&mut c);
            if c.chunks.is_empty() {
                return Ok(());
            }
            self.sink
                .send(RawContainer {
                    id: c.id,
                    stamp: self.stamp.clone(),
                    regions: c.regions,
                    chunks: c.chunks,
                    segments: c.segments,
                })
                .map_err(|_| {
                    StoreError::Invalid("container writer stopped (see the error above)".into())
                })?;
        }
        Ok(())
    }
}

/// Reads and opens one region, checking its length.
pub fn read_region(repo: &Repository, id: &ContainerId, r: &RegionInfo) -> Result<Vec<u8>> {
    let name = data_name(id);
    let raw = repo
        .backend()
        .get_range(&name, r.offset, r.stored_len as u64)?;
    open_region(repo, &name, &raw, r)
}

/// Opens a region envelope read as part of a larger range.
pub fn open_region(repo: &Repository, name: &str, env: &[u8], r: &RegionInfo) -> Result<Vec<u8>> {
    let plain = repo
        .sealer()
        .open(Kind::Region, env)
        .map_err(|e| StoreError::corrupt(format!("{name} (region at offset {})", r.offset), e))?;
    if plain.len() != r.raw_len as usize {
        return Err(StoreError::corrupt(
            format!("{name} (region at offset {})", r.offset),
            strata_core::CoreError::Truncated("region shorter than its metadata says"),
        ));
    }
    Ok(plain)
}

/// Reads the metadata section from a data object alone (for repair).
pub fn read_meta_from_data(repo: &Repository, id: &ContainerId) -> Result<ContainerMeta> {
    let name = data_name(id);
    let size = repo
        .backend()
        .size(&name)?
        .ok_or_else(|| StoreError::NotFound(name.clone()))?;
    let corrupt = |e| StoreError::corrupt(name.clone(), e);
    if size < (CONTAINER_HEADER_LEN + CONTAINER_FOOTER_LEN) as u64 {
        return Err(corrupt(strata_core::CoreError::Truncated("data container")));
    }
    let head = repo
        .backend()
        .get_range(&name, 0, CONTAINER_HEADER_LEN as u64)?;
    if head[..4] != CONTAINER_MAGIC {
        return Err(corrupt(strata_core::CoreError::BadMagic("data container")));
    }
    let foot = repo.backend().get_range(
        &name,
        size - CONTAINER_FOOTER_LEN as u64,
        CONTAINER_FOOTER_LEN as u64,
    )?;
    let f = ContainerFooter::parse(&foot).map_err(corrupt)?;
    if f.meta_offset + f.meta_len as u64 + CONTAINER_FOOTER_LEN as u64 != size {
        return Err(corrupt(strata_core::CoreError::Truncated(
            "container footer points outside the object",
        )));
    }
    let env = repo
        .backend()
        .get_range(&name, f.meta_offset, f.meta_len as u64)?;
    let bytes = repo
        .sealer()
        .open(Kind::ContainerMeta, &env)
        .map_err(corrupt)?;
    let meta: ContainerMeta = decode("container metadata", &bytes).map_err(corrupt)?;
    if meta.id != *id {
        return Err(StoreError::Invalid(format!(
            "{name} holds metadata of another container ({})",
            meta.id
        )));
    }
    Ok(meta)
}

/// Reads a container's `meta/` object.
pub fn read_meta(repo: &Repository, id: &ContainerId) -> Result<ContainerMeta> {
    repo.get_struct(Kind::ContainerMeta, &meta_name(id), "container metadata")
}
