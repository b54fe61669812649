//! What a repository handle holds of the volumes its linked containers
//! live in: the caller's [`Volumes`], and the linked containers read so
//! far. (Reading and releasing them: [`crate::repo::links`].)

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use strata_core::format::{ContainerId, LinkStub};

/// The volumes of a repository, as its linked containers need them: the
/// blocks a volume holds read, and a hold released. Given by the caller
/// (the store depends on no volume code).
pub trait Volumes: Send + Sync {
    /// Volume `volume`'s disk blocks, decrypted with `key` where the volume
    /// is encrypted. Opening costs nothing: its data file is opened on the
    /// first read.
    fn blocks(&self, volume: &str, key: Option<[u8; 32]>) -> Arc<dyn HeldBlocks>;
    /// Releases hold `hold` of volume `volume` (the volume gives the
    /// blocks back at its next checkpoint).
    fn release(&self, volume: &str, hold: &str) -> std::result::Result<(), String>;
}

/// A volume's disk blocks, as a linked container reads them.
pub trait HeldBlocks: Send + Sync {
    /// Fills `out` (`dbns.len()` whole blocks) with the plaintext of disk
    /// blocks `dbns`.
    fn read(&self, dbns: &[u64], out: &mut [u8]) -> std::io::Result<()>;
    /// The length of the volume's data file in bytes (read without
    /// opening the blocks: `check` without `--read-data`).
    fn data_len(&self) -> std::io::Result<u64>;
    /// Where they are, for messages (the data file's path).
    fn describe(&self) -> String;
}

/// What a repository handle knows of its linked containers: where the
/// volumes are (set by the caller), which containers are linked (listed
/// once), and the stubs read so far.
#[derive(Default)]
pub(crate) struct Links {
    /// A local repository's volumes; None where no volume can be.
    pub volumes: Option<Arc<dyn Volumes>>,
    /// A what-if handle: holds are never released.
    pub dry: bool,
    pub(crate) listed: Mutex<Option<Arc<HashSet<ContainerId>>>>,
    pub(crate) loaded: Mutex<HashMap<ContainerId, Arc<Linked>>>,
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
    /// The volume's blocks.
    pub(crate) blocks: Arc<dyn HeldBlocks>,
    pub(crate) by_offset: HashMap<u64, usize>,
    /// The stub's bytes (what `check` and `stats` count).
    pub stub_len: u64,
}
