//! Linked containers (`docs/design-linked-snapshots.md`): a container
//! whose regions a volume holds in its own disk blocks. Its data object
//! `data/ID` is replaced by a link stub (`LINK_MAGIC`, then a sealed
//! [`LinkStub`]: the volume, and each region's disk blocks and fingerprint),
//! and an empty marker `links/ID` tells readers which containers to look
//! at; the recipes, index objects and metadata stay as the backup wrote
//! them (the marker names the volume, so deleting the container releases
//! the hold however far a relink got). A region of a linked container reads the same plaintext as it
//! did stored: its blocks read from the volume's data file, decrypted,
//! joined, and checked against the region's fingerprint.
//!
//! [`relink`] makes a container linked (the volume holds the blocks first,
//! each checked against its chunk's fingerprint); [`delete_data`] releases
//! the hold before the stub goes (gc, compaction, forget).

use crate::error::{Result, StoreError};
use crate::repo::{data_name, Repository};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{
    decode, encode, ContainerId, ContainerMeta, LinkStub, LinkedRegion, RegionInfo,
    CONTAINER_MAGIC, LINK_MAGIC,
};
use strata_volume::crypt::DataCipher;
use strata_volume::VolumeKey;

/// A volume block.
pub const BLOCK: usize = 4096;

/// The marker of linked container `id`.
pub fn marker_name(id: &ContainerId) -> String {
    format!("links/{}", id.to_hex())
}

/// What a repository handle knows of its linked containers: where the
/// volumes are (set by the caller), which containers are linked (listed
/// once), and the stubs read so far.
#[derive(Default)]
pub(crate) struct Links {
    /// `REPO/volumes` of a local repository; None where no volume can be.
    pub volumes: Option<PathBuf>,
    /// A what-if handle: holds are never released.
    pub dry: bool,
    listed: Mutex<Option<Arc<HashSet<ContainerId>>>>,
    loaded: Mutex<HashMap<ContainerId, Arc<Linked>>>,
}

impl Links {
    /// A handle's links with the same volumes (a what-if copy: `dry`).
    pub(crate) fn like(&self, dry: bool) -> Links {
        Links {
            volumes: self.volumes.clone(),
            dry,
            ..Default::default()
        }
    }
}

/// A linked container, its stub read: reads its regions from the volume.
pub struct Linked {
    pub stub: LinkStub,
    /// The volume's directory.
    dir: PathBuf,
    /// Its data file, opened on the first read (not per region).
    data: std::sync::OnceLock<File>,
    cipher: Option<DataCipher>,
    by_offset: HashMap<u64, usize>,
    /// The stub's bytes (what `check` and `stats` count).
    pub stub_len: u64,
}

fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl Repository {
    /// Forgets the list of linked containers (read again on next use).
    fn forget_listed(&self) {
        *self.links.listed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Where this repository's volumes are (`REPO/volumes` of a local
    /// repository): needed to read linked containers and release their
    /// holds. The library reads no environment: the caller says.
    pub fn with_volumes(mut self, dir: Option<PathBuf>) -> Self {
        self.links = Arc::new(Links {
            volumes: dir,
            dry: self.links.dry,
            ..Default::default()
        });
        self
    }

    /// The containers marked linked (`links/`), listed once per handle.
    pub(crate) fn linked_ids(&self) -> Result<Arc<HashSet<ContainerId>>> {
        let mut l = self.links.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*l {
            return Ok(s.clone());
        }
        let ids: HashSet<ContainerId> = self
            .backend()
            .list("links/")?
            .iter()
            .filter_map(|o| o.name.strip_prefix("links/"))
            .filter_map(ContainerId::from_hex)
            .collect();
        let ids = Arc::new(ids);
        *l = Some(ids.clone());
        Ok(ids)
    }

    /// Notes that container `id` is marked linked now (this handle wrote
    /// its marker).
    fn note_linked(&self, id: ContainerId) {
        let mut l = self.links.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = l.as_mut() {
            Arc::make_mut(set).insert(id);
        }
    }

    /// Container `id` if it is linked (its stub read and checked); None
    /// for a stored one — also when its marker is left over from a relink
    /// that did not get to replace the data object.
    pub fn link_of(&self, id: &ContainerId) -> Result<Option<Arc<Linked>>> {
        if !self.linked_ids()?.contains(id) {
            return Ok(None);
        }
        if let Some(l) = self
            .links
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Ok(Some(l.clone()));
        }
        let name = data_name(id);
        let head = self
            .backend()
            .get_range(&name, 0, LINK_MAGIC.len() as u64)?;
        if head.starts_with(&CONTAINER_MAGIC) {
            return Ok(None);
        }
        let bytes = self.backend().get(&name)?;
        let stub = self.open_stub(&name, &bytes)?;
        let l = Arc::new(self.linked(&name, stub, bytes.len() as u64)?);
        self.links
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*id, l.clone());
        Ok(Some(l))
    }

    /// The stub in `bytes` (data object `name`), checked.
    fn open_stub(&self, name: &str, bytes: &[u8]) -> Result<LinkStub> {
        let corrupt = |e| StoreError::corrupt(name.to_string(), e);
        let env = bytes
            .strip_prefix(&LINK_MAGIC)
            .ok_or_else(|| corrupt(strata_core::CoreError::BadMagic("data container or link")))?;
        let plain = self.sealer().open(Kind::Link, env).map_err(corrupt)?;
        let stub: LinkStub = decode("link stub", &plain).map_err(corrupt)?;
        if !valid_volume_name(&stub.volume) {
            return Err(StoreError::Invalid(format!(
                "{name}: links to {:?}, which is not a volume name",
                stub.volume
            )));
        }
        for r in &stub.regions {
            if r.blocks.len() as u64 * BLOCK as u64 != r.raw_len as u64 {
                return Err(StoreError::Invalid(format!(
                    "{name}: a region of {} bytes in {} blocks",
                    r.raw_len,
                    r.blocks.len()
                )));
            }
        }
        Ok(stub)
    }

    fn linked(&self, name: &str, stub: LinkStub, stub_len: u64) -> Result<Linked> {
        let dir = self.volume_dir(name, &stub.volume)?;
        let cipher = match &stub.salt {
            None => None,
            Some(salt) => {
                let key = self.volume_key(salt).ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "{name}: links to an encrypted volume, and the repository is not encrypted"
                    ))
                })?;
                Some(DataCipher::new(&VolumeKey(key)))
            }
        };
        let by_offset = stub
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| (r.offset, i))
            .collect();
        Ok(Linked {
            stub,
            dir,
            data: std::sync::OnceLock::new(),
            cipher,
            by_offset,
            stub_len,
        })
    }

    /// The directory of volume `volume`, which container `name` links to.
    fn volume_dir(&self, name: &str, volume: &str) -> Result<PathBuf> {
        let root = self.links.volumes.as_ref().ok_or_else(|| {
            StoreError::Invalid(format!(
                "{name} links to blocks of volume {volume}, and this repository's volumes are not \
                 reachable from here (a local repository's are in its `volumes/`)"
            ))
        })?;
        Ok(root.join(volume))
    }
}

impl Linked {
    /// The plaintext of region `r` (as the container's metadata gives it),
    /// read from the volume's blocks and checked against its fingerprint.
    pub fn region(&self, repo: &Repository, name: &str, r: &RegionInfo) -> Result<Vec<u8>> {
        let lr = self
            .by_offset
            .get(&r.offset)
            .map(|&i| &self.stub.regions[i])
            .filter(|lr| lr.raw_len == r.raw_len)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name}: the link stub has no region at offset {} of {} bytes",
                    r.offset, r.raw_len
                ))
            })?;
        let data = self.data_file()?;
        let mut out = vec![0u8; lr.raw_len as usize];
        let mut i = 0;
        while i < lr.blocks.len() {
            let mut j = i + 1;
            while j < lr.blocks.len() && lr.blocks[j] == lr.blocks[j - 1].wrapping_add(1) {
                j += 1;
            }
            let buf = &mut out[i * BLOCK..j * BLOCK];
            let at = lr.blocks[i].checked_mul(BLOCK as u64).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{name}: the link stub names block {}",
                    lr.blocks[i]
                ))
            })?;
            data.read_exact_at(buf, at).map_err(|e| {
                StoreError::io(
                    "read",
                    format!(
                        "{} (held blocks of {name})",
                        self.dir.join("data").display()
                    ),
                    e,
                )
            })?;
            if let Some(c) = &self.cipher {
                c.open(lr.blocks[i], buf);
            }
            i = j;
        }
        if repo.hasher().hash(&out) != lr.hash {
            return Err(StoreError::corrupt(
                format!(
                    "{name} (region at offset {}, held by volume {})",
                    r.offset, self.stub.volume
                ),
                strata_core::CoreError::Truncated(
                    "the volume's blocks no longer hold what the container held",
                ),
            ));
        }
        Ok(out)
    }

    /// The volume's data file.
    fn data_file(&self) -> Result<&File> {
        if let Some(f) = self.data.get() {
            return Ok(f);
        }
        let path = self.dir.join("data");
        let f =
            File::open(&path).map_err(|e| StoreError::io("open", path.display().to_string(), e))?;
        Ok(self.data.get_or_init(|| f))
    }

    /// Checks, without reading them, that the volume's data file has
    /// every block the stub names (`check` without `--read-data`).
    pub fn verify_reachable(&self, name: &str) -> Result<()> {
        let data = self.dir.join("data");
        let len = std::fs::metadata(&data)
            .map_err(|e| {
                StoreError::io(
                    "open",
                    format!("{} (held blocks of {name})", data.display()),
                    e,
                )
            })?
            .len();
        match self.blocks().max() {
            Some(b) if b.saturating_add(1).saturating_mul(BLOCK as u64) > len => {
                Err(StoreError::Invalid(format!(
                    "{name}: links to block {b} of volume {}, past the end of its data file",
                    self.stub.volume
                )))
            }
            _ => Ok(()),
        }
    }

    /// The blocks the volume holds for this container.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.stub
            .regions
            .iter()
            .flat_map(|r| r.blocks.iter().copied())
    }
}

/// Deletes container `id`'s data object: a linked one's hold is released
/// first (the volume gives its blocks back at its next checkpoint), and
/// its marker goes last.
pub(crate) fn delete_data(repo: &Repository, id: &ContainerId) -> Result<()> {
    // The marker names the volume: its hold is released even when a
    // relink stopped before the stub replaced the data object. (Looked
    // up, not taken from the list: another process may have linked it
    // since this handle listed them.)
    release_by_marker(repo, id)?;
    repo.backend().delete(&data_name(id))?;
    repo.backend().delete(&marker_name(id))?;
    repo.links
        .loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
    Ok(())
}

/// Releases the hold of container `id` in the volume its marker names
/// (nothing without a marker, or on a what-if handle). Returns whether
/// there was a marker.
pub(crate) fn release_by_marker(repo: &Repository, id: &ContainerId) -> Result<bool> {
    let raw = match repo.backend().get(&marker_name(id)) {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if repo.links.dry {
        return Ok(true);
    }
    let volume = String::from_utf8(raw).unwrap_or_default();
    if !valid_volume_name(&volume) {
        return Err(StoreError::Invalid(format!(
            "{}: its marker names no volume (damaged)",
            marker_name(id)
        )));
    }
    let dir = repo.volume_dir(&data_name(id), &volume)?;
    strata_volume::holds::release(&dir, &id.to_hex()).map_err(|e| {
        StoreError::Invalid(format!("releasing the blocks of {}: {e}", data_name(id)))
    })?;
    Ok(true)
}

/// Where a container's chunks are in a volume: `(region, offset in the
/// region)` → the disk block holding that chunk's 4 KiB.
pub type BlockOf = HashMap<(u32, u32), u64>;

/// Makes container `m` linked to volume `volume` (its directory `dir`, its
/// salt `salt`): every region must be whole 4 KiB chunks, each found in
/// `blocks`, each block (read from the volume's data file) holding its
/// chunk — else nothing changes and `Ok(false)`. `hold` has the volume
/// keep the blocks (named by the container's id) before the data object
/// is replaced. Returns whether it was linked.
pub fn relink(
    repo: &Repository,
    m: &ContainerMeta,
    volume: &str,
    salt: Option<&[u8]>,
    blocks: &BlockOf,
    hold: &mut dyn FnMut(&str, &[u64]) -> Result<()>,
) -> Result<bool> {
    let name = data_name(&m.id);
    // A marker already: another volume's relink got there first (left as
    // it is), or one of this volume stopped half-way — between its marker
    // and its stub — and is taken up again (the hold is taken once).
    let marked = match repo.backend().get(&marker_name(&m.id)) {
        Ok(b) if b == volume.as_bytes() => true,
        Ok(_) => return Ok(false),
        Err(e) if e.is_not_found() => false,
        Err(e) => return Err(e.into()),
    };
    let head = repo
        .backend()
        .get_range(&name, 0, LINK_MAGIC.len() as u64)?;
    if !head.starts_with(&CONTAINER_MAGIC) {
        return Ok(false);
    }
    let dir = repo.volume_dir(&name, volume)?;
    let cipher = match salt {
        Some(s) => Some(DataCipher::new(&VolumeKey(repo.volume_key(s).ok_or_else(
            || StoreError::Invalid("an encrypted volume in a repository that is not".into()),
        )?))),
        None => None,
    };
    let Some(regions) = linked_regions(repo, m, &dir, cipher.as_ref(), blocks)? else {
        return Ok(false);
    };
    let all: Vec<u64> = regions
        .iter()
        .flat_map(|r| r.blocks.iter().copied())
        .collect();
    // The marker before the hold: whatever is interrupted, deleting the
    // container releases what was held.
    if !marked {
        repo.backend().put(&marker_name(&m.id), volume.as_bytes())?;
    }
    repo.note_linked(m.id);
    if let Err(e) = hold(&m.id.to_hex(), &all) {
        if !marked {
            return Err(e);
        }
        // Taken up again, and the volume keeps this container's hold on
        // other blocks (its data written again elsewhere since, as a
        // replayed journal does): it stays stored, held until deleted,
        // and the walk goes on (a server gone fails the next one).
        tracing::debug!("{name}: stays stored: {e}");
        return Ok(false);
    }
    let stub = LinkStub {
        volume: volume.to_string(),
        salt: salt.map(<[u8]>::to_vec),
        regions,
    };
    let mut bytes = LINK_MAGIC.to_vec();
    bytes.extend(repo.sealer().seal(Kind::Link, &encode(&stub)?, true)?);
    repo.backend().put(&name, &bytes)?;
    repo.backend().evict(&name);
    Ok(true)
}

/// The regions of `m` as runs of the volume's blocks, each block checked
/// against its chunk; None if a region is not whole 4 KiB chunks that
/// `blocks` places, or a block does not hold its chunk.
fn linked_regions(
    repo: &Repository,
    m: &ContainerMeta,
    dir: &Path,
    cipher: Option<&DataCipher>,
    blocks: &BlockOf,
) -> Result<Option<Vec<LinkedRegion>>> {
    let data = File::open(dir.join("data"))
        .map_err(|e| StoreError::io("open", dir.join("data").display().to_string(), e))?;
    let mut by_region: Vec<Vec<(u32, u32, strata_core::Fingerprint)>> =
        vec![Vec::new(); m.regions.len()];
    for c in &m.chunks {
        match by_region.get_mut(c.region as usize) {
            Some(v) => v.push((c.offset, c.len, c.fp)),
            None => return Ok(None),
        }
    }
    // Regions read and checked side by side (hashing is most of a
    // relink's time), each by whichever thread is free.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(m.regions.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let by_region = &by_region;
    let done: Vec<Vec<(usize, LinkedRegion)>> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let ri = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if ri >= m.regions.len()
                            || failed.load(std::sync::atomic::Ordering::Relaxed)
                        {
                            return mine;
                        }
                        let r = &m.regions[ri];
                        match link_region(repo, &data, cipher, ri as u32, r, &by_region[ri], blocks)
                        {
                            Some(l) => mine.push((ri, l)),
                            None => failed.store(true, std::sync::atomic::Ordering::Relaxed),
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all: Vec<(usize, LinkedRegion)> = done.into_iter().flatten().collect();
    if failed.into_inner() || all.len() != m.regions.len() {
        return Ok(None);
    }
    all.sort_unstable_by_key(|(ri, _)| *ri);
    Ok(Some(all.into_iter().map(|(_, l)| l).collect()))
}

/// Region `ri` (`r`, its chunks `chunks`: offset, length, fingerprint) as
/// the volume's blocks `blocks` places them: whole 4 KiB chunks, read
/// (runs of neighbouring blocks at once), decrypted and each checked
/// against its fingerprint; None where that fails.
fn link_region(
    repo: &Repository,
    data: &File,
    cipher: Option<&DataCipher>,
    ri: u32,
    r: &RegionInfo,
    chunks: &[(u32, u32, strata_core::Fingerprint)],
    blocks: &BlockOf,
) -> Option<LinkedRegion> {
    let mut chunks = chunks.to_vec();
    chunks.sort_unstable_by_key(|c| c.0);
    chunks.dedup_by_key(|c| c.0);
    let mut dbns = Vec::with_capacity(chunks.len());
    for (k, &(off, len, _)) in chunks.iter().enumerate() {
        if len as usize != BLOCK || off as usize != k * BLOCK {
            return None;
        }
        dbns.push(*blocks.get(&(ri, off))?);
    }
    if dbns.len() * BLOCK != r.raw_len as usize {
        return None;
    }
    let mut plain = vec![0u8; dbns.len() * BLOCK];
    let mut i = 0;
    while i < dbns.len() {
        let mut j = i + 1;
        while j < dbns.len() && dbns[j - 1].checked_add(1) == Some(dbns[j]) {
            j += 1;
        }
        let at = dbns[i].checked_mul(BLOCK as u64)?;
        data.read_exact_at(&mut plain[i * BLOCK..j * BLOCK], at)
            .ok()?;
        i = j;
    }
    let hasher = repo.hasher();
    for (k, (&d, &(_, _, fp))) in dbns.iter().zip(&chunks).enumerate() {
        let b = &mut plain[k * BLOCK..(k + 1) * BLOCK];
        if let Some(c) = cipher {
            c.open(d, b);
        }
        if hasher.hash(b) != fp {
            return None;
        }
    }
    Some(LinkedRegion {
        offset: r.offset,
        raw_len: r.raw_len,
        blocks: dbns,
        hash: hasher.hash(&plain),
    })
}

/// What [`relink_version`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RelinkReport {
    /// Containers of the version now linked to the volume, their chunk
    /// data as they were stored, and the blocks the volume holds for them.
    pub containers: u64,
    pub stored_bytes: u64,
    pub blocks: u64,
    /// Containers of the version left stored (a chunk the image does not
    /// place, one of another size, or a block that does not hold it).
    pub left_stored: u64,
    /// Why the relink stopped before the end (a hold the volume did not
    /// take — its server gone —, a write that failed): the containers not
    /// linked by then stay stored.
    pub stopped: Option<String>,
}

/// Links the containers that version recipe `rid` (an image of volume
/// `volume`, salt `salt`) references and that the volume can hold whole:
/// the recipe is walked a piece at a time, each reference at image offset
/// *o* placed at the disk block `disk_blocks` gives for block *o* / 4096
/// (asked a piece at a time: `(first block, count)`); a container is
/// [`relink`]ed as soon as every chunk of it is placed, so what is kept
/// meanwhile is the places of the containers still being filled, not of
/// the whole image. `hold` has the volume keep blocks (the volume must not
/// change meanwhile: stopped and opened by the caller, or frozen).
pub fn relink_version(
    repo: &Repository,
    rid: &str,
    volume: &str,
    salt: Option<&[u8]>,
    disk_blocks: &dyn Fn(u64, usize) -> Result<Vec<Option<u64>>>,
    hold: &mut dyn FnMut(&str, &[u64]) -> Result<()>,
) -> Result<RelinkReport> {
    // Containers being placed: their places so far and how many distinct
    // chunks they hold; and those not to link (linked already, stamped,
    // or done).
    // One relink at a time, and none while gc or forget delete
    // containers (they could miss a marker written meanwhile).
    let _lock = crate::lock::acquire(repo, true, "volume snapshot (linking)")?;
    repo.forget_listed();
    let mut pending: HashMap<ContainerId, (BlockOf, usize)> = HashMap::new();
    let mut skip: HashSet<ContainerId> = HashSet::new();
    let mut rep = RelinkReport::default();
    let walked = crate::recipe::for_each_piece_in_part(repo, rid, |n, offset, _, table| {
        let chunks: Vec<_> = n.segments.iter().flat_map(|s| &s.chunks).collect();
        let Some(end) = chunks
            .iter()
            .try_fold(offset, |at, c| at.checked_add(c.len as u64))
        else {
            return Ok(());
        };
        if !offset.is_multiple_of(BLOCK as u64) || end == offset {
            return Ok(());
        }
        let first = offset / BLOCK as u64;
        let dbns = disk_blocks(
            first,
            end.div_ceil(BLOCK as u64).saturating_sub(first) as usize,
        )?;
        let mut at = offset;
        for c in chunks {
            let here = at;
            at += c.len as u64;
            if !(c.is_direct() && c.len as usize == BLOCK && here.is_multiple_of(BLOCK as u64)) {
                continue;
            }
            let (Some(d), Some(cid)) = (
                dbns.get(((here / BLOCK as u64) - first) as usize)
                    .copied()
                    .flatten(),
                table.get(c.container as usize).copied(),
            ) else {
                continue;
            };
            if skip.contains(&cid) {
                continue;
            }
            let (places, want) = match pending.entry(cid) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let m = crate::container::read_meta(repo, &cid)?;
                    // Only the pool's: a stamped container goes with its
                    // version.
                    if m.stamp.is_some() || repo.link_of(&cid)?.is_some() {
                        skip.insert(cid);
                        continue;
                    }
                    let distinct: HashSet<(u32, u32)> =
                        m.chunks.iter().map(|e| (e.region, e.offset)).collect();
                    v.insert((BlockOf::new(), distinct.len()))
                }
            };
            places.insert((c.region, c.offset), d);
            if places.len() < *want {
                continue;
            }
            // Every chunk placed: linked now.
            let (places, _) = pending.remove(&cid).unwrap_or_default();
            skip.insert(cid);
            let m = crate::container::read_meta(repo, &cid)?;
            match relink(repo, &m, volume, salt, &places, hold) {
                Ok(true) => {
                    rep.containers += 1;
                    rep.stored_bytes += m.data_bytes();
                    rep.blocks += m.chunks.len() as u64;
                }
                Ok(false) => rep.left_stored += 1,
                // The version is stored; this container and those after
                // it stay so (one left half-way — its marker and maybe
                // its hold — is taken up by the next snapshot that places
                // it, or released when it is deleted).
                Err(e) => {
                    rep.stopped = Some(format!("{}: {e}", data_name(&cid)));
                    return Err(StoreError::Cancelled);
                }
            }
        }
        Ok(())
    });
    match walked {
        Err(StoreError::Cancelled) if rep.stopped.is_some() => {}
        other => {
            other?;
        }
    }
    rep.left_stored += pending.len() as u64;
    Ok(rep)
}

/// What [`unlink_volume`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct UnlinkReport {
    /// Containers stored again in the repository, and their bytes.
    pub containers: u64,
    pub stored_bytes: u64,
    /// Containers whose blocks no longer hold what they held (changed on
    /// the host): their versions are damaged already. They stay linked and
    /// held.
    pub damaged: Vec<(ContainerId, String)>,
    /// Containers that could not be stored again for another reason (an
    /// I/O error, a full disk, a region that would not seal to the same
    /// length), with why: they stay linked and held.
    pub failed: Vec<String>,
}

/// Stores again every container linked to volume `volume` (before the
/// volume is deleted or replaced): each region read through the link
/// (checked), sealed again into a data object laid out exactly as the
/// container's metadata says (the same regions at the same offsets: zstd
/// and the envelope give the same lengths for the same plaintext; where
/// another zstd does not, each region and the metadata are sealed to the
/// length they had, padded with a frame decompression passes over), which
/// replaces the stub; then the hold is released and the marker goes. A
/// container whose blocks do not check out, or that would not come out
/// the same, stays linked and held (`failed`). Holds the repository's
/// lock.
pub fn unlink_volume(repo: &Repository, volume: &str) -> Result<UnlinkReport> {
    if repo.links.dry {
        return Err(StoreError::Invalid(
            "a what-if handle stores nothing again".into(),
        ));
    }
    let _lock = crate::lock::acquire(repo, true, "volume unlink")?;
    repo.forget_listed();
    let mut rep = UnlinkReport::default();
    let ids: Vec<ContainerId> = repo.linked_ids()?.iter().copied().collect();
    for id in ids {
        let raw = match repo.backend().get(&marker_name(&id)) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        if raw != volume.as_bytes() {
            continue;
        }
        // (A container half deleted by an interrupted gc has nothing to
        // store again: its hold and marker just go.)
        let linked = match repo.link_of(&id) {
            Err(StoreError::NotFound(_)) => None,
            Err(StoreError::Backend(e)) if e.is_not_found() => None,
            r => r?,
        };
        let meta = match linked {
            None => None,
            Some(l) => match crate::container::read_meta(repo, &id) {
                Ok(m) => Some((l, m)),
                Err(StoreError::NotFound(_)) => None,
                Err(StoreError::Backend(e)) if e.is_not_found() => None,
                Err(e) => return Err(e),
            },
        };
        if let Some((l, m)) = meta {
            match store_again(repo, &m, &l) {
                Ok(()) => {
                    rep.containers += 1;
                    rep.stored_bytes += m.data_bytes();
                }
                Err(e @ StoreError::Corrupt { .. }) => {
                    rep.damaged.push((id, e.to_string()));
                    continue;
                }
                Err(e) => {
                    rep.failed.push(e.to_string());
                    continue;
                }
            }
        }
        // Stored (again, or a relink that stopped before its stub): the
        // volume may let the blocks go.
        let dir = repo.volume_dir(&data_name(&id), volume)?;
        strata_volume::holds::release(&dir, &id.to_hex()).map_err(|e| {
            StoreError::Invalid(format!("releasing the blocks of {}: {e}", data_name(&id)))
        })?;
        repo.backend().delete(&marker_name(&id))?;
    }
    repo.forget_listed();
    Ok(rep)
}

/// Container `m`'s data object made again from its linked regions and
/// put in place of the stub.
fn store_again(repo: &Repository, m: &ContainerMeta, l: &Linked) -> Result<()> {
    let name = data_name(&m.id);
    let differs = |what: &str| {
        StoreError::Invalid(format!(
            "{name}: stored again, {what} would differ from its metadata; it stays linked"
        ))
    };
    let mut data = strata_core::format::container_header().to_vec();
    let mut regions: Vec<&RegionInfo> = m.regions.iter().collect();
    regions.sort_by_key(|r| r.offset);
    for r in regions {
        let plain = l.region(repo, &name, r)?;
        let mut sealed = crate::container::seal_region(repo, &plain)?;
        if sealed.len() != r.stored_len as usize {
            // Another zstd compresses it otherwise: sealed to the length
            // the container gives it, padded.
            sealed = repo
                .sealer()
                .seal_padded(Kind::Region, &plain, r.stored_len as usize)?
                .ok_or_else(|| differs("a region"))?;
        }
        if data.len() as u64 != r.offset {
            return Err(differs("a region"));
        }
        data.extend_from_slice(&sealed);
    }
    let mut meta = m.clone();
    let mut tail = crate::container::container_tail(repo, &mut meta, data.len() as u64)?;
    if meta != *m {
        // (Another zstd: the metadata sealed to the length it had.)
        tail = crate::container::container_tail_sized(repo, m, data.len() as u64)?
            .ok_or_else(|| differs("its metadata"))?;
    }
    data.extend_from_slice(&tail);
    if data.len() as u64 != m.data_len {
        return Err(differs("its metadata"));
    }
    repo.backend().put(&name, &data)?;
    repo.backend().evict(&name);
    repo.links
        .loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&m.id);
    Ok(())
}
