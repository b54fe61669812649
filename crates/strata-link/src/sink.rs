//! The link sink (`docs/design-linked-snapshots.md`, step 6): a snapshot
//! of a volume links the containers it writes as it writes them. A
//! container whose every chunk is a 4 KiB block of the image that the
//! volume has on disk is never compressed, sealed or written: its
//! regions are checked against the volume's blocks (byte for byte) as
//! they close, and the container goes to the repository as a link stub —
//! its marker, then the volume's hold, then the stub, then its metadata,
//! as a relink did before (stop 37). A chunk the volume does not place (a block
//! still in its write buffer, a hole) or a block that does not hold its
//! chunk turns the container back into an ordinary one: the regions
//! linked so far are read back from the volume (checked against their
//! hash), sealed and written.
//!
//! Its metadata says what the container would hold stored uncompressed
//! (each region's length the plaintext's plus the envelope's), so storing
//! it again (`volume unlink`, `volume delete`) writes it at the offsets
//! the metadata gives without compressing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::crypto::Kind;
use strata_core::format::{encode, ContainerMeta, LinkStub, LinkedRegion, LINK_MAGIC};
use strata_store::engine::writer::Linker;
use strata_store::repo::links::{marker_name, stored_bytes, HeldBlocks};
use strata_store::repo::{data_name, Repository};
use strata_store::{Result, StoreError};

/// The volume whose image a snapshot reads, as the link sink needs it:
/// where each image block is on disk, and a way to have the volume hold
/// blocks. The volume must not change meanwhile (stopped and opened by the
/// caller, or frozen by its server).
pub trait VolumeLink: Send + Sync {
    /// The disk blocks of image blocks `first..first + n` (None: not on
    /// disk — a hole, or a block still in the volume's write buffer).
    fn disk_blocks(&self, first: u64, n: usize) -> std::io::Result<Vec<Option<u64>>>;
    /// Has the volume keep disk blocks `dbns` under hold `name`, durably.
    fn hold(&self, name: &str, dbns: &[u64]) -> std::io::Result<()>;
}

/// What the link sink did in one backup.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SinkCounts {
    /// Containers linked, the blocks the volume holds for them, and the
    /// bytes they would have stored uncompressed.
    pub containers: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// Containers begun linked and stored after all (a chunk the volume
    /// did not place or hold), and containers whose hold the volume did
    /// not take (stored from its blocks instead).
    pub stored_instead: u64,
    pub hold_failed: u64,
}

/// A backup's link to the volume it reads (see the module's text).
pub struct LinkSink {
    volume: String,
    salt: Option<Vec<u8>>,
    source: Arc<dyn VolumeLink>,
    /// The volume's blocks, read to check and read back regions.
    data: Arc<dyn HeldBlocks>,
    containers: AtomicU64,
    blocks: AtomicU64,
    bytes: AtomicU64,
    stored_instead: AtomicU64,
    hold_failed: AtomicU64,
    /// A hold the volume did not take (its server gone, say): containers
    /// opened from then on are stored as usual, compressed.
    given_up: std::sync::atomic::AtomicBool,
}

impl LinkSink {
    /// The sink for volume `volume` (its salt `salt` when encrypted) of
    /// `repo`, whose blocks `source` places and holds.
    pub fn new(
        repo: &Repository,
        volume: &str,
        salt: Option<&[u8]>,
        source: Arc<dyn VolumeLink>,
    ) -> Result<Arc<LinkSink>> {
        let key = match salt {
            Some(s) => Some(repo.volume_key(s).ok_or_else(|| {
                StoreError::Invalid("an encrypted volume in a repository that is not".into())
            })?),
            None => None,
        };
        let data = repo
            .volumes(&format!("volume {volume}"), volume)?
            .blocks(volume, key);
        // Opened now: a volume without its data file links nothing.
        data.data_len()
            .map_err(|e| StoreError::io("open", data.describe(), e))?;
        Ok(Arc::new(LinkSink {
            volume: volume.to_string(),
            salt: salt.map(<[u8]>::to_vec),
            source,
            data,
            containers: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stored_instead: AtomicU64::new(0),
            hold_failed: AtomicU64::new(0),
            given_up: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// What it did so far.
    pub fn counts(&self) -> SinkCounts {
        SinkCounts {
            containers: self.containers.load(Ordering::Relaxed),
            blocks: self.blocks.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            stored_instead: self.stored_instead.load(Ordering::Relaxed),
            hold_failed: self.hold_failed.load(Ordering::Relaxed),
        }
    }

    /// Container `meta` as a data object, its regions read back from the
    /// volume and stored at the offsets its metadata gives (uncompressed:
    /// the lengths the sink gave them).
    fn stored_form(
        &self,
        repo: &Repository,
        meta: &ContainerMeta,
        regions: &[LinkedRegion],
    ) -> Result<Vec<u8>> {
        let plain = |r: &strata_core::format::RegionInfo| match regions
            .iter()
            .find(|lr| lr.offset == r.offset)
        {
            Some(lr) => self.read_back(repo, lr),
            None => Err(StoreError::Invalid(format!(
                "{}: no linked region at offset {}",
                data_name(&meta.id),
                r.offset
            ))),
        };
        Ok(stored_bytes(repo, meta, plain)?.0)
    }
}

impl Linker for LinkSink {
    /// Whether containers opened now are to be linked (no hold failed
    /// yet).
    fn linking(&self) -> bool {
        !self.given_up.load(Ordering::Relaxed)
    }

    fn disk_blocks(&self, first: u64, n: usize) -> std::io::Result<Vec<Option<u64>>> {
        self.source.disk_blocks(first, n)
    }

    /// Whether the volume's blocks `dbns` hold `plain`, byte for byte.
    fn holds(&self, dbns: &[u64], plain: &[u8]) -> bool {
        let mut got = vec![0u8; plain.len()];
        self.data.read(dbns, &mut got).is_ok() && got == plain
    }

    /// A region linked earlier, read back from the volume and checked
    /// against its hash (a container stored after all).
    fn read_back(&self, repo: &Repository, lr: &LinkedRegion) -> Result<Vec<u8>> {
        let mut out = vec![0u8; lr.raw_len as usize];
        self.data.read(&lr.blocks, &mut out).map_err(|e| {
            StoreError::io(
                "read",
                format!("{} (volume {})", self.data.describe(), self.volume),
                e,
            )
        })?;
        if repo.hasher().hash(&out) != lr.hash {
            return Err(StoreError::Invalid(format!(
                "volume {}: its blocks changed while a snapshot read them (is another process \
                 writing its data file?)",
                self.volume
            )));
        }
        Ok(out)
    }

    /// Counts a container begun linked and stored after all.
    fn note_stored_instead(&self) {
        self.stored_instead.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts container `meta` (its regions `regions`) into the repository
    /// as linked: its marker, the volume's hold, then its stub. Where the
    /// volume does not take the hold, the container is stored from the
    /// volume's blocks instead (its marker stays: deleting it releases
    /// whatever the volume may have taken). Returns the data object's
    /// bytes.
    fn commit(
        &self,
        repo: &Repository,
        meta: &ContainerMeta,
        regions: Vec<LinkedRegion>,
    ) -> Result<u64> {
        let id = meta.id;
        let name = data_name(&id);
        repo.backend()
            .put(&marker_name(&id), self.volume.as_bytes())?;
        repo.note_linked(id);
        let all: Vec<u64> = regions
            .iter()
            .flat_map(|r| r.blocks.iter().copied())
            .collect();
        // After a hold failed, none is asked again: a served volume's
        // control connection may be out of step (an answer that came late
        // would be read as the next request's).
        let held = match self.linking() {
            true => self.source.hold(&id.to_hex(), &all),
            false => Err(std::io::Error::other("an earlier hold failed")),
        };
        if let Err(e) = held {
            tracing::warn!(
                "{name}: volume {} did not hold its blocks ({e}): stored",
                self.volume
            );
            self.hold_failed.fetch_add(1, Ordering::Relaxed);
            self.given_up.store(true, Ordering::Relaxed);
            let data = self.stored_form(repo, meta, &regions)?;
            repo.backend().put(&name, &data)?;
            return Ok(data.len() as u64);
        }
        let stub = LinkStub {
            volume: self.volume.clone(),
            salt: self.salt.clone(),
            regions,
        };
        let mut bytes = LINK_MAGIC.to_vec();
        bytes.extend(repo.sealer().seal(Kind::Link, &encode(&stub)?, true)?);
        repo.backend().put(&name, &bytes)?;
        self.containers.fetch_add(1, Ordering::Relaxed);
        self.blocks.fetch_add(all.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(meta.data_bytes(), Ordering::Relaxed);
        Ok(bytes.len() as u64)
    }
}
