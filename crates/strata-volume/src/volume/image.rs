//! A volume's image as a snapshot reads it: the volume frozen by its
//! server, its frozen map, and readers of the image at any offset.

use crate::blockmap::disk_runs;
use crate::changes::ChangeSet;
use crate::config::*;
use crate::crypt::{Crypt, VolumeKey};
use crate::error::*;
use crate::files::*;
use crate::mutex::lock;
use crate::readahead::{prefetch, will_need};
use crate::state::*;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

impl Volume {
    /// A point-in-time image of the volume while it is served: everything
    /// acknowledged so far is destaged (not synced: the image is read
    /// through the page cache), the block map is
    /// copied (under the destage lock: the map after a whole batch, so a
    /// prefix of the writes — crash-consistent), and until the returned
    /// [`Frozen`] is dropped no freed block is reused, so the blocks the
    /// copy names keep their data while clients go on writing (new data
    /// always goes to other blocks).
    pub fn freeze(self: &Arc<Self>) -> Result<Frozen> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(VolumeError::Invalid("the volume is closing".into()));
        }
        let changes;
        {
            // Writes in place are checked under the mem lock: none starts
            // from here on. Those under way finish before the map is
            // copied (placed writes take blocks no map names).
            let mut m = lock(&self.mem);
            self.holds.fetch_add(1, Ordering::SeqCst);
            // Every write marked so far is in the buffer, destaged below.
            changes = m.changes.take();
        }
        drop(self.direct_io.write().unwrap_or_else(|e| e.into_inner()));
        let frozen = Frozen {
            vol: self.clone(),
            changes: Mutex::new(Some(changes)),
            map: self.dir.join(format!(
                "map.frozen.{}",
                FROZEN_SEQ.fetch_add(1, Ordering::SeqCst)
            )),
        };
        self.destage_current()
            .map_err(|e| VolumeError::Io("destage".into(), e))?;
        {
            let _d = lock(&self.disk);
            self.map
                .copy_to(&self.dir.join("map"), &frozen.map, clone_or_copy)
                .map_err(ioe("map copy"))?;
        }
        // Writes after the take may be in the copy: their marks too (each
        // was marked before it could reach the map).
        if let Some(c) = lock(&frozen.changes).as_mut() {
            lock(&self.mem).changes.widen(c);
        }
        Ok(frozen)
    }
}

impl Volume {
    /// A snapshot of the volume (stopped: no writes while it reads) takes
    /// what changed since the last one; it ends with
    /// [`Volume::snapshot_done`].
    pub fn take_changes(&self) -> ChangeSet {
        lock(&self.mem).changes.take()
    }

    /// The snapshot that took `cs` was committed as version `committed`,
    /// or was not (its changes come back).
    pub fn snapshot_done(&self, cs: ChangeSet, committed: Option<&str>) {
        lock(&self.mem).changes.give_back(cs, committed);
    }
}

pub(crate) static FROZEN_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A frozen image of a served volume ([`Volume::freeze`]).
pub struct Frozen {
    pub(crate) vol: Arc<Volume>,
    /// The copy of the block map.
    pub map: PathBuf,
    /// What changed since the last snapshot, up to the image.
    pub(crate) changes: Mutex<Option<ChangeSet>>,
}

impl Frozen {
    /// The version the image's changes count from, and which segments
    /// may differ from it (none: read everything).
    pub fn changes(&self) -> (Option<String>, Option<Vec<bool>>) {
        match &*lock(&self.changes) {
            Some(c) => (c.base.clone(), c.changed()),
            None => (None, None),
        }
    }

    /// The image was committed as version `id`: the volume's changes
    /// count from it now.
    pub fn committed(&self, id: &str) {
        if let Some(c) = lock(&self.changes).take() {
            self.vol.snapshot_done(c, Some(id));
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.map);
        if let Some(c) = lock(&self.changes).take() {
            self.vol.snapshot_done(c, None);
        }
        self.vol.holds.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes of a volume image per read of its source: whole blocks, at most
/// 1 MiB ([`ImageReader`] hands them out in any sizes).
pub(crate) const IMAGE_READ: usize = 1 << 20;

/// A volume image as a stream: a live volume ([`Volume::image_reader`])
/// or a frozen one ([`ImageSource::frozen`]), read 1 MiB at a time.
pub struct ImageReader {
    pub(crate) src: ImageSource,
    pub(crate) buf: Vec<u8>,
    /// Bytes of `buf` handed out.
    pub(crate) at: usize,
}

impl io::Read for ImageReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.buf.len() {
            self.src.fill(&mut self.buf)?;
            self.at = 0;
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl ImageReader {
    /// Goes on reading at byte `offset` (a block boundary within the
    /// image): what lies between is passed over unread.
    pub fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        if !offset.is_multiple_of(BLOCK as u64) || offset > self.src.size() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a skip to byte {offset} of the image"),
            ));
        }
        self.buf.clear();
        self.at = 0;
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = &mut self.src;
        *pos = offset;
        Ok(())
    }

    /// See [`ImageSource::unwritten`].
    pub fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        self.src.unwritten(offset, len)
    }
}

/// Where an [`ImageReader`] reads from.
pub enum ImageSource {
    Live {
        vol: Arc<Volume>,
        pos: u64,
    },
    /// The map copy and the data file of a frozen image (whose blocks a
    /// served volume's new writes never overwrite while the freeze holds).
    Frozen {
        /// The connection holding the freeze (checked after every read).
        conn: Option<std::os::unix::net::UnixStream>,
        map: File,
        data: File,
        crypt: Option<Arc<Crypt>>,
        size: u64,
        pos: u64,
    },
}

impl ImageSource {
    pub(crate) fn reader(self) -> ImageReader {
        ImageReader {
            src: self,
            buf: Vec::new(),
            at: 0,
        }
    }

    /// Reads the frozen image of the volume in `dir` through the map copy
    /// at `map`, while `conn` (from [`crate::control::freeze_remote`])
    /// holds the freeze: each read is checked to have ended while the
    /// server still held it.
    pub fn frozen(
        dir: &Path,
        map: &Path,
        conn: Option<std::os::unix::net::UnixStream>,
        key: Option<&VolumeKey>,
    ) -> Result<ImageReader> {
        Ok(Self::open_frozen(dir, map, conn, key)?.reader())
    }

    /// [`ImageSource::frozen`], read at any offset
    /// ([`ImageSource::read_exact_at`]).
    pub fn open_frozen(
        dir: &Path,
        map: &Path,
        conn: Option<std::os::unix::net::UnixStream>,
        key: Option<&VolumeKey>,
    ) -> Result<ImageSource> {
        let cfg = Volume::config(dir)?;
        let crypt = Volume::crypt(dir, &cfg, key)?;
        Ok(ImageSource::Frozen {
            conn,
            map: File::open(map).map_err(ioe(map.display().to_string()))?,
            data: File::open(dir.join("data")).map_err(ioe("data"))?,
            crypt,
            size: cfg.size,
            pos: 0,
        })
    }
}

/// The frozen map copy of a served volume, read for the disk blocks the
/// frozen image names (linked snapshots: the blocks a version's
/// containers link, held by the server before the freeze ends).
pub struct FrozenMap {
    pub(crate) map: File,
    pub(crate) blocks: u64,
}

impl FrozenMap {
    /// The frozen map at `map` (from [`crate::control::freeze_remote`]) of
    /// the volume in `dir`.
    pub fn open(dir: &Path, map: &Path) -> Result<FrozenMap> {
        let cfg = Volume::config(dir)?;
        Ok(FrozenMap {
            map: File::open(map).map_err(ioe(map.display().to_string()))?,
            blocks: cfg.size.div_ceil(BLOCK as u64),
        })
    }

    /// The disk blocks of logical blocks `first..first + n` in the frozen
    /// image (None: never written, trimmed or zeroed) — as
    /// [`Volume::disk_blocks`] of a stopped volume.
    pub fn disk_blocks(&self, first: u64, n: usize) -> io::Result<Vec<Option<u64>>> {
        if first.checked_add(n as u64).is_none_or(|e| e > self.blocks) {
            return Err(io::Error::other(format!(
                "blocks {first}..+{n} are past the volume's end ({} blocks)",
                self.blocks
            )));
        }
        Ok(read_u64s(&self.map, first, n)?
            .into_iter()
            .map(|e| e.checked_sub(1))
            .collect())
    }
}

/// Fills `out` (whole blocks from block `first`) through a frozen `map`
/// copy from `data`; the disk runs after the first are asked for before
/// the first is read (read side by side).
pub(crate) fn read_frozen(
    map: &File,
    data: &File,
    crypt: Option<&Crypt>,
    first: u64,
    out: &mut [u8],
) -> io::Result<()> {
    let n = out.len() / BLOCK;
    let map = read_u64s(map, first, n)?;
    out.fill(0);
    let runs = disk_runs(&map, |_| true);
    for &(i, j, dbn) in runs.iter().skip(1) {
        will_need(data, dbn, (j - i) as u64);
    }
    for (i, j, dbn) in runs {
        let dst = &mut out[i * BLOCK..j * BLOCK];
        let off = dbn
            .checked_mul(BLOCK as u64)
            .ok_or_else(|| io::Error::other("the frozen map names a block past any disk"))?;
        if read_full_at(data, dst, off)? < dst.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the volume's data is shorter than its frozen map says",
            ));
        }
        if let Some(c) = crypt {
            c.open_data(dbn, dst);
        }
    }
    Ok(())
}

impl ImageSource {
    /// The image's bytes at `offset` (block-aligned; `buf` whole blocks,
    /// or up to the end of the image) — a snapshot that reads only what
    /// changed. A frozen image's disk blocks are asked for all at once.
    pub fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bs = BLOCK as u64;
        let end = offset.checked_add(buf.len() as u64);
        if !offset.is_multiple_of(bs)
            || !buf.len().is_multiple_of(BLOCK)
            || end.is_none_or(|e| e > self.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a read of {} bytes at {offset} of the image", buf.len()),
            ));
        }
        match self {
            ImageSource::Live { vol, .. } => {
                vol.read_range(offset, buf, false)?;
            }
            ImageSource::Frozen {
                conn,
                map,
                data,
                crypt,
                ..
            } => {
                read_frozen(map, data, crypt.as_deref(), offset / bs, buf)?;
                if let Some(c) = conn {
                    crate::control::still_frozen(c)?;
                }
            }
        }
        Ok(())
    }

    /// Whether the image's bytes `offset..offset+len` (whole blocks) are
    /// known to be zeros without reading them: blocks never written, or
    /// last trimmed or zeroed (a snapshot hands such a stretch on as
    /// zeros, neither read nor fingerprinted).
    pub fn unwritten(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        let bs = BLOCK as u64;
        if !offset.is_multiple_of(bs)
            || !len.is_multiple_of(bs)
            || offset.checked_add(len).is_none_or(|e| e > self.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} of the image"),
            ));
        }
        let (first, n) = (offset / bs, (len / bs) as usize);
        match self {
            ImageSource::Live { vol, .. } => vol.unwritten(first, n),
            ImageSource::Frozen { map, .. } => {
                Ok(read_u64s(map, first, n)?.iter().all(|&e| e == 0))
            }
        }
    }

    /// The image's bytes.
    pub fn size(&self) -> u64 {
        match self {
            ImageSource::Live { vol, .. } => vol.size(),
            ImageSource::Frozen { size, .. } => *size,
        }
    }

    /// The next whole blocks (at most [`IMAGE_READ`] bytes) into `buf`;
    /// empty at the end.
    pub(crate) fn fill(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let size = self.size();
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = self;
        let at = *pos;
        let n = (size.saturating_sub(at) as usize).min(IMAGE_READ);
        buf.resize(n, 0);
        if n == 0 {
            return Ok(());
        }
        // The image is read from start to end: a frozen image's disk
        // blocks of the next read are asked for before this one is read.
        if let ImageSource::Frozen { map, data, .. } = self {
            let next = (at + n as u64) / BLOCK as u64;
            let left = (size.saturating_sub(at + n as u64) as usize).min(IMAGE_READ);
            if let Ok(dbns) = read_u64s(map, next, left / BLOCK) {
                prefetch(&dbns, data);
            }
        }
        self.read_exact_at(at, buf)?;
        let (ImageSource::Live { pos, .. } | ImageSource::Frozen { pos, .. }) = self;
        *pos += n as u64;
        Ok(())
    }
}
