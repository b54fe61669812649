//! Linked containers (`docs/design-linked-snapshots.md`): a container
//! whose regions a volume holds in its own disk blocks. Its data object
//! `data/ID` is a link stub (`LINK_MAGIC`, then a sealed [`LinkStub`]: the
//! volume, and each region's disk blocks and fingerprint), and an empty
//! marker `links/ID` tells readers which containers to look at; its
//! metadata, index entries and the recipes that use it are those of an
//! ordinary container (the marker names the volume, so deleting the
//! container releases the hold however far linking got). A region of a
//! linked container reads the same plaintext as a stored one would: its
//! blocks read from the volume's data file, decrypted, joined, and checked
//! against the region's fingerprint.
//!
//! A volume's snapshot links the containers it writes as it writes them
//! (`link/sink.rs`: each region checked against the volume's blocks, the
//! volume holding them before the stub is put); [`delete_data`] releases
//! the hold before the stub goes (gc, compaction, forget), and
//! [`unlink_volume`] stores a volume's linked containers again.

mod sink;
pub(crate) use sink::BlockWindow;
pub use sink::{LinkSink, SinkCounts, VolumeLink};

use crate::error::{Result, StoreError};
use crate::repo::{data_name, Repository};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{
    decode, ContainerId, ContainerMeta, LinkStub, RegionInfo, CONTAINER_MAGIC, LINK_MAGIC,
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
    /// for a stored one — also when its marker is left over from linking
    /// that did not get to put the stub (its hold not taken).
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
        read_blocks(data, self.cipher.as_ref(), &lr.blocks, &mut out).map_err(|e| {
            StoreError::io(
                "read",
                format!(
                    "{} (held blocks of {name})",
                    self.dir.join("data").display()
                ),
                e,
            )
        })?;
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
    // The marker names the volume: its hold is released even when
    // linking stopped before the stub was put. (Looked
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

/// Fills `out` (`dbns.len()` blocks) with the plaintext of the volume's
/// disk blocks `dbns` from its data file `data` (runs of neighbours read
/// at once), decrypted with `cipher` when the volume is encrypted.
fn read_blocks(
    data: &File,
    cipher: Option<&DataCipher>,
    dbns: &[u64],
    out: &mut [u8],
) -> std::io::Result<()> {
    if out.len() != dbns.len() * BLOCK {
        return Err(std::io::Error::other("a read of whole blocks"));
    }
    let mut i = 0;
    while i < dbns.len() {
        let mut j = i + 1;
        while j < dbns.len() && dbns[j - 1].checked_add(1) == Some(dbns[j]) {
            j += 1;
        }
        let at = dbns[i].checked_mul(BLOCK as u64).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no block {} in a volume", dbns[i]),
            )
        })?;
        data.read_exact_at(&mut out[i * BLOCK..j * BLOCK], at)?;
        i = j;
    }
    if let Some(c) = cipher {
        for (k, &d) in dbns.iter().enumerate() {
            c.open(d, &mut out[k * BLOCK..(k + 1) * BLOCK]);
        }
    }
    Ok(())
}

/// Releases what killed snapshots of volume `volume` left linked: each
/// container its marker names that no index lists (a snapshot's
/// containers are indexed as it commits, or every 256 Ki chunks) —
/// its hold released, its stub or data, metadata and marker deleted, as
/// gc does for any container no index lists, and as gc refused when a
/// version needs chunks only such a container holds. Only under the
/// repository's exclusive lock, so no backup is writing containers it has
/// not indexed yet: when another command holds a lock, nothing is done
/// (`None`). The caller makes sure no other snapshot of the volume runs.
/// Returns the containers released. (What a killed snapshot had indexed
/// already waits for gc.)
pub fn sweep_unindexed(repo: &Repository, volume: &str) -> Result<Option<u64>> {
    if repo.links.dry {
        return Ok(Some(0));
    }
    let _lock = match crate::lock::acquire(repo, true, "volume snapshot (leftovers)") {
        Ok(l) => l,
        Err(StoreError::Locked { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    repo.forget_listed();
    let ids: Vec<ContainerId> = repo.linked_ids()?.iter().copied().collect();
    if ids.is_empty() {
        return Ok(Some(0));
    }
    let indexed = crate::index::RepoIndex::load_summaries(repo)?.containers;
    let mut candidates = Vec::new();
    for id in ids.into_iter().filter(|id| !indexed.contains_key(id)) {
        if marked_for(repo, &id, volume)? {
            candidates.push(id);
        }
    }
    // As gc: none goes while a version needs chunks only it holds (an
    // index object lost or damaged: `strata repair index` first).
    let names: Vec<String> = candidates.iter().map(data_name).collect();
    crate::gc::refuse_needed_orphans(repo, &names)?;
    for id in &candidates {
        repo.backend().delete(&crate::repo::meta_name(id))?;
        delete_data(repo, id)?;
    }
    repo.forget_listed();
    Ok(Some(candidates.len() as u64))
}

/// Whether container `id` has a marker, and it names volume `volume`.
fn marked_for(repo: &Repository, id: &ContainerId, volume: &str) -> Result<bool> {
    match repo.backend().get(&marker_name(id)) {
        Ok(raw) => Ok(raw == volume.as_bytes()),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
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
    /// Of those stored again, containers the link sink had linked (their
    /// metadata gives them uncompressed) whose data compresses: copied
    /// forward into compressed containers, the recipes pointing at them
    /// rewritten, and the bytes that freed.
    pub recompressed: u64,
    pub recompressed_freed_bytes: u64,
    /// Why that copy failed, if it did (they stay stored uncompressed).
    pub recompress_failed: Option<String>,
}

/// Stores again every container linked to volume `volume` (before the
/// volume is deleted or replaced), reading each linked region once.
///
/// A container the link sink linked (its metadata gives every region
/// uncompressed) is copied forward into compressed containers, with the
/// recipes pointing at it rewritten (pool compaction of those alone, as
/// gc does; deleting the original releases its hold). Any other — or one
/// the copy leaves behind — is sealed again into a data object laid out
/// exactly as its metadata says (the same regions at the same offsets:
/// zstd and the envelope give the same lengths for the same plaintext;
/// where another zstd does not, each region and the metadata are sealed
/// to the length they had, padded with a frame decompression passes
/// over), which replaces the stub; then the hold is released and the
/// marker goes. A container whose blocks do not check out, or that would
/// not come out the same, stays linked and held (`damaged`, `failed`).
/// Holds the repository's lock.
pub fn unlink_volume(repo: &Repository, volume: &str) -> Result<UnlinkReport> {
    if repo.links.dry {
        return Err(StoreError::Invalid(
            "a what-if handle stores nothing again".into(),
        ));
    }
    let _lock = crate::lock::acquire(repo, true, "volume unlink")?;
    repo.forget_listed();
    let mut rep = UnlinkReport::default();
    let mut compressible = HashSet::new();
    let mut direct: Vec<(ContainerId, u64)> = Vec::new();
    let ids: Vec<ContainerId> = repo.linked_ids()?.iter().copied().collect();
    for id in ids {
        match unlink_one(repo, volume, &id, true, &mut rep)? {
            Unlinked::Copy(bytes) => direct.push((id, bytes)),
            Unlinked::Compressible => drop(compressible.insert(id)),
            Unlinked::Done => {}
        }
    }
    repo.forget_listed();
    // Linked by the sink, or stored uncompressed: copied forward
    // compressed, whatever their fill (all of them in one pass).
    let mut first: Option<String> = None;
    if !direct.is_empty() || !compressible.is_empty() {
        let these = compressible
            .iter()
            .copied()
            .chain(direct.iter().map(|d| d.0));
        match recompress(repo, these.collect(), &mut rep) {
            Ok(()) => compressible.clear(),
            Err(e) => first = Some(e.to_string()),
        }
    }
    // What the copy left linked (it failed — a region that does not check
    // out — or passed it over), stored again one by one, then copied
    // forward once more.
    let (damaged, failed) = (rep.damaged.len(), rep.failed.len());
    for (id, bytes) in direct {
        if repo.backend().size(&marker_name(&id))?.is_some() {
            if let Unlinked::Compressible = unlink_one(repo, volume, &id, false, &mut rep)? {
                compressible.insert(id);
            }
        } else {
            rep.containers += 1;
            rep.stored_bytes += bytes;
        }
    }
    repo.forget_listed();
    // The first copy's failure is told unless what it failed on is named
    // already (damaged, or failed to store again).
    if rep.damaged.len() > damaged || rep.failed.len() > failed {
        first = None;
    }
    if !compressible.is_empty() {
        if let Err(e) = recompress(repo, compressible, &mut rep) {
            first = Some(e.to_string());
        }
    }
    rep.recompress_failed = first;
    rep.stored_bytes = rep
        .stored_bytes
        .saturating_sub(rep.recompressed_freed_bytes);
    Ok(rep)
}

/// What [`unlink_one`] made of a linked container.
enum Unlinked {
    /// Linked by the sink: left linked, to be copied forward (its stored
    /// bytes, as its metadata gives them).
    Copy(u64),
    /// Stored (again), uncompressed, though its data may compress.
    Compressible,
    /// Stored again as it was, damaged, failed, or not this volume's.
    Done,
}

/// Container `id`, if its marker names `volume`: stored again and its
/// hold released — unless the sink linked it and `defer` (then left for
/// the copy forward).
fn unlink_one(
    repo: &Repository,
    volume: &str,
    id: &ContainerId,
    defer: bool,
    rep: &mut UnlinkReport,
) -> Result<Unlinked> {
    if !marked_for(repo, id, volume)? {
        return Ok(Unlinked::Done);
    }
    // (A container half deleted by an interrupted gc has nothing to
    // store again: its hold and marker just go.)
    let linked = match repo.link_of(id) {
        Err(StoreError::NotFound(_)) => None,
        Err(StoreError::Backend(e)) if e.is_not_found() => None,
        r => r?,
    };
    let mut done = Unlinked::Done;
    if linked.is_none() && stored_uncompressed(repo, id) {
        // Stored, its marker kept (the sink's hold failed): as the
        // sink wrote it, uncompressed.
        done = Unlinked::Compressible;
    }
    let meta = match linked {
        None => None,
        Some(l) => match crate::container::read_meta(repo, id) {
            Ok(m) => Some((l, m)),
            Err(StoreError::NotFound(_)) => None,
            Err(StoreError::Backend(e)) if e.is_not_found() => None,
            Err(e) => return Err(e),
        },
    };
    if let Some((l, m)) = meta {
        if defer && uncompressed(repo, &m) {
            return Ok(Unlinked::Copy(m.data_bytes()));
        }
        match store_again(repo, &m, &l) {
            Ok(shorter) => {
                rep.containers += 1;
                rep.stored_bytes += m.data_bytes();
                if shorter {
                    done = Unlinked::Compressible;
                }
            }
            Err(e @ StoreError::Corrupt { .. }) => {
                rep.damaged.push((*id, e.to_string()));
                return Ok(Unlinked::Done);
            }
            Err(e) => {
                rep.failed.push(e.to_string());
                return Ok(Unlinked::Done);
            }
        }
    }
    // Stored (again, or linked no further than its marker): the volume
    // may let the blocks go.
    let dir = repo.volume_dir(&data_name(id), volume)?;
    strata_volume::holds::release(&dir, &id.to_hex()).map_err(|e| {
        StoreError::Invalid(format!("releasing the blocks of {}: {e}", data_name(id)))
    })?;
    repo.backend().delete(&marker_name(id))?;
    Ok(done)
}

/// Pool compaction of containers `only`, whatever their fill: their live
/// chunks copied forward compressed, the recipes rewritten, the originals
/// deleted (a linked one's hold released); counted in `rep`.
fn recompress(repo: &Repository, only: HashSet<ContainerId>, rep: &mut UnlinkReport) -> Result<()> {
    let mut gc = crate::gc::GcReport::default();
    let opts = crate::gc::GcOptions {
        only: Some(only),
        ..Default::default()
    };
    crate::compact::compact_pool(repo, &opts, &mut gc)?;
    rep.recompressed += gc.containers_rewritten;
    rep.recompressed_freed_bytes += gc.bytes_freed;
    Ok(())
}

/// Whether container `id` is stored and every region of it uncompressed
/// (its length the plaintext's plus the envelope's), as the link sink
/// stores a container whose hold the volume did not take.
fn stored_uncompressed(repo: &Repository, id: &ContainerId) -> bool {
    crate::container::read_meta(repo, id).is_ok_and(|m| uncompressed(repo, &m))
}

/// Whether container `m`'s metadata gives every region uncompressed (its
/// length the plaintext's plus the envelope's), as the link sink lays
/// them out.
fn uncompressed(repo: &Repository, m: &ContainerMeta) -> bool {
    let overhead = repo.sealer().overhead() as u64;
    !m.regions.is_empty()
        && m.regions
            .iter()
            .all(|r| r.stored_len as u64 == r.raw_len as u64 + overhead)
}

/// Container `m`'s data object made again from its linked regions and
/// put in place of the stub. Returns whether a region would compress
/// shorter than its metadata lets it be here (one the link sink linked,
/// which its metadata gives uncompressed).
fn store_again(repo: &Repository, m: &ContainerMeta, l: &Linked) -> Result<bool> {
    let name = data_name(&m.id);
    let (data, shorter) = stored_bytes(repo, m, |r| l.region(repo, &name, r))?;
    repo.backend().put(&name, &data)?;
    repo.backend().evict(&name);
    repo.links
        .loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&m.id);
    Ok(shorter)
}

/// Container `m`'s data object laid out exactly as its metadata says,
/// each region's plaintext from `plain` (sealed compressed, or to the
/// length the metadata gives it where that differs); and whether a region
/// would compress shorter than that length.
pub(crate) fn stored_bytes(
    repo: &Repository,
    m: &ContainerMeta,
    plain: impl Fn(&RegionInfo) -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, bool)> {
    let name = data_name(&m.id);
    let differs = |what: &str| {
        StoreError::Invalid(format!(
            "{name}: stored again, {what} would differ from its metadata; it stays linked"
        ))
    };
    let mut data = strata_core::format::container_header().to_vec();
    let mut regions: Vec<&RegionInfo> = m.regions.iter().collect();
    regions.sort_by_key(|r| r.offset);
    let mut shorter = false;
    for r in regions {
        let plain = plain(r)?;
        let mut sealed = crate::container::seal_region(repo, &plain)?;
        shorter |= sealed.len() < r.stored_len as usize;
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
    let tail = match crate::container::container_tail(repo, &mut meta, data.len() as u64) {
        Ok(tail) if meta == *m => tail,
        // (Another zstd, or one that does not settle: the metadata sealed
        // to the length it had.)
        _ => crate::container::container_tail_sized(repo, m, data.len() as u64)?
            .ok_or_else(|| differs("its metadata"))?,
    };
    data.extend_from_slice(&tail);
    if data.len() as u64 != m.data_len {
        return Err(differs("its metadata"));
    }
    Ok((data, shorter))
}
