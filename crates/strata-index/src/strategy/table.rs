//! Where chunks are: interned container ids and the in-RAM maps the
//! strategies keep.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use strata_core::format::ContainerId;
use strata_core::Fingerprint;

/// Where a chunk is stored. `container` is an interned id (see
/// [`ContainerTable`]) so an entry stays 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLoc {
    pub container: u32,
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

/// Interns container ids to small integers for compact in-RAM entries.
#[derive(Default)]
pub struct ContainerTable {
    inner: RwLock<(Vec<ContainerId>, HashMap<ContainerId, u32>)>,
}

impl ContainerTable {
    pub fn intern(&self, id: ContainerId) -> u32 {
        if let Some(&i) = self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(&id)
        {
            return i;
        }
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = g.1.get(&id) {
            return i;
        }
        let i = g.0.len() as u32;
        g.0.push(id);
        g.1.insert(id, i);
        i
    }

    pub fn get(&self, i: u32) -> ContainerId {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0[i as usize]
    }

    /// [`Self::get`] for an index that may be out of range.
    pub fn try_get(&self, i: u32) -> Option<ContainerId> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .get(i as usize)
            .copied()
    }

    pub fn lookup(&self, id: &ContainerId) -> Option<u32> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(id)
            .copied()
    }

    pub fn len(&self) -> usize {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

const SHARDS: usize = 64;

/// Fingerprint-keyed hash maps split into shards, so parallel workers
/// rarely contend; shared by the in-RAM strategies.
pub(crate) struct Sharded<V> {
    shards: Vec<Mutex<HashMap<Fingerprint, V>>>,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl<V> Sharded<V> {
    pub(crate) fn shard(
        &self,
        fp: &Fingerprint,
    ) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, V>> {
        self.shards[fp.0[31] as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
            .sum()
    }

    /// Key + value + hashbrown's control byte, times allocated capacity.
    pub(crate) fn ram_bytes(&self) -> u64 {
        let per = (std::mem::size_of::<Fingerprint>() + std::mem::size_of::<V>() + 1) as u64;
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).capacity() as u64 * per)
            .sum()
    }
}
