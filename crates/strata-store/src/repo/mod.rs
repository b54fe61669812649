//! The repository: configuration, keys, typed object access and snapshot
//! lookup (docs/design.md "Principles", "Vocabulary").
//!
//! Object names:
//!
//! | name | content |
//! |---|---|
//! | `config` | [`RepoConfig`], plain envelope (readable before the password) |
//! | `keys/default`, `keys/ID` | key slots (`KeySlot`): the master key wrapped by Argon2id(password), see [`crate::repo::keys`] |
//! | `data/XX/ID` | data container: regions + metadata section + footer |
//! | `meta/XX/ID` | the container's metadata section on its own |
//! | `index/HASH` | [`IndexObject`]: metadata of many containers |
//! | `isum/HASH` | [`IndexSummary`] of `index/HASH`: the same containers without chunk entries, with their whole segments |
//! | `recipes/HASH` | [`strata_core::format::RecipeIndex`] of one version: its parts |
//! | `parts/NAME` | [`Recipe`]: one part of a version's tree (NAME: keyed hash of its bytes) |
//! | `snapshots/HASH` | [`Snapshot`]: the commit record of one version |
//! | `locks/ID` | [`strata_core::format::LockInfo`] of a running command |
//!
//! `HASH` is the BLAKE3 of the stored bytes at first write (for
//! `isum/HASH`, of its index object's bytes); the local cache checks its
//! copies against it. Objects read from the repository are not yet checked
//! against their names (docs/security.md §5).

pub mod container;
pub mod delta;
pub mod index;
pub mod keys;
pub mod lifecycle;
pub mod links;
pub mod lock;
mod open;
pub mod recipe;
pub mod region;
pub mod skeleton;
pub mod snapshots;
pub mod tiers;
pub mod volumes;

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use strata_core::chunker::ChunkerParams;
use strata_core::crypto::{KdfCost, Kind, MasterKey, Sealer};
use strata_core::format::{decode, encode, ContainerId, RepoConfig, Snapshot};
use strata_core::id::SnapshotId;
use strata_core::Hasher;

/// Options for `strata init`.
#[derive(Clone, Debug)]
pub struct InitOptions {
    pub password: Option<Vec<u8>>,
    /// The password hash's cost for the first key slot (later slots take
    /// the cost of the slot that opened the repository).
    pub kdf: KdfCost,
    pub chunker: ChunkerParams,
    pub zstd_level: i32,
    pub container_size: u32,
    pub region_size: u32,
    pub index: String,
    /// Store new chunks that resemble stored ones as deltas.
    pub delta: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            password: None,
            kdf: KdfCost::default(),
            chunker: ChunkerParams::cdc(8192),
            zstd_level: 3,
            container_size: 32 << 20,
            region_size: 128 << 10,
            index: "segment".into(),
            delta: false,
        }
    }
}

impl InitOptions {
    /// The options `strata init` assembles (and the Python bindings too):
    /// an index spec (`silo:block-mib=128`), and the sizes left `None`
    /// take the strategy's defaults. The spec is checked here, before
    /// anything is created.
    pub fn with_defaults(
        index: String,
        avg_chunk: u32,
        segment_kib: Option<u32>,
        zstd_level: i32,
        container_mib: Option<u32>,
        password: Option<Vec<u8>>,
    ) -> Result<Self> {
        let name = IndexSpec::parse(&index)?.name;
        Ok(InitOptions {
            password,
            chunker: ChunkerParams {
                avg_segment: segment_kib
                    .map(|k| k.saturating_mul(1024))
                    .unwrap_or_else(|| default_segment_size(&name)),
                ..ChunkerParams::cdc(avg_chunk)
            },
            zstd_level,
            container_size: container_mib
                .map(|m| m.max(1) << 20)
                .unwrap_or_else(|| default_container_size(&name)),
            index,
            ..Default::default()
        })
    }
}

/// The objects a client may keep a copy of (a bucket's, on local disk):
/// those written once under names that never change contents — recipe
/// parts and indexes, container metadata. (Index objects have their own
/// cache, by repository id.)
pub const IMMUTABLE_PREFIXES: &[&str] = &["parts/", "recipes/", "meta/"];

/// Index strategies this build knows; the first is the default.
pub const INDEX_STRATEGIES: &[&str] = &["segment", "exact", "silo", "binning"];

/// Tuning options each index strategy accepts, with their allowed ranges.
const INDEX_OPTIONS: &[(&str, &str, u64, u64)] = &[
    ("silo", "block-mib", 1, 4096),
    ("silo", "cache-blocks", 1, 4096),
    ("silo", "reps", 1, 16),
    ("silo", "record-duplicates", 0, 1),
];

/// An index strategy and its tuning options, as the repository config
/// stores them: `silo`, or `silo:block-mib=128,cache-blocks=16`. Options
/// are fixed at `init` — they shape on-disk index objects — and strategies
/// read them with [`IndexSpec::get`], falling back to their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSpec {
    pub name: String,
    pub options: std::collections::BTreeMap<String, u64>,
}

impl IndexSpec {
    /// Parses and validates a spec against the strategies this build knows.
    pub fn parse(spec: &str) -> Result<Self> {
        let (name, opts) = spec.split_once(':').unwrap_or((spec, ""));
        if !INDEX_STRATEGIES.contains(&name) {
            return Err(StoreError::Invalid(format!(
                "unknown index strategy {name:?}; known: {}",
                INDEX_STRATEGIES.join(", ")
            )));
        }
        let mut options = std::collections::BTreeMap::new();
        for kv in opts.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                StoreError::Invalid(format!("index option {kv:?} is not KEY=VALUE"))
            })?;
            let known: Vec<&str> = INDEX_OPTIONS
                .iter()
                .filter(|o| o.0 == name)
                .map(|o| o.1)
                .collect();
            let &(_, _, lo, hi) = INDEX_OPTIONS
                .iter()
                .find(|o| o.0 == name && o.1 == k)
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "index {name:?} has no option {k:?}; its options: {}",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ))
                })?;
            let v: u64 = v
                .parse()
                .ok()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "index option {k}={v:?}: expected a whole number from {lo} to {hi}"
                    ))
                })?;
            options.insert(k.to_string(), v);
        }
        Ok(IndexSpec {
            name: name.to_string(),
            options,
        })
    }

    /// An option's value, or `default` when the spec does not set it.
    pub fn get(&self, key: &str, default: u64) -> u64 {
        self.options.get(key).copied().unwrap_or(default)
    }
}

impl std::fmt::Display for IndexSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        for (i, (k, v)) in self.options.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { ':' } else { ',' })?;
        }
        Ok(())
    }
}

/// Default container size of an index strategy: RevDedup's 32 MiB for
/// `segment` (whole 4 MiB segments per container, few containers per
/// restore), 8 MiB otherwise.
pub fn default_container_size(index: &str) -> u32 {
    match index {
        "segment" => 32 << 20,
        _ => 8 << 20,
    }
}

/// Default average segment size of an index strategy: SiLo's 2 MiB for
/// `silo` (its similarity unit), RevDedup's 4 MiB otherwise.
pub fn default_segment_size(index: &str) -> u32 {
    match index {
        "silo" => 2 << 20,
        _ => 4 << 20,
    }
}

/// An open repository. Cheap to clone.
#[derive(Clone)]
pub struct Repository {
    backend: Arc<dyn Backend>,
    config: RepoConfig,
    sealer: Sealer,
    hasher: Hasher,
    /// An encrypted repository's master key and the key slot (`keys/ID`)
    /// the password opened.
    key: Option<(MasterKey, String)>,
    /// A what-if copy (see [`Repository::dry_run`]) uses no local cache.
    no_cache: bool,
    /// Where local caches live (a directory per repository id below it);
    /// `None`: no cache. Set by the caller ([`Repository::with_cache`]);
    /// the library reads no environment.
    cache_base: Option<PathBuf>,
    /// Linked containers: where the volumes are, and what was read of
    /// them ([`crate::repo::links`]).
    pub(crate) links: Arc<volumes::Links>,
    /// What delta regions read: metadata and base regions ([`delta`]).
    deltas: Arc<delta::DeltaCache>,
}

impl Repository {
    /// A handle on an opened (or new) repository, without cache or volumes.
    fn assemble(
        backend: Arc<dyn Backend>,
        config: RepoConfig,
        (sealer, hasher): (Sealer, Hasher),
        key: Option<(MasterKey, String)>,
    ) -> Self {
        Repository {
            backend,
            config,
            sealer,
            hasher,
            key,
            no_cache: false,
            cache_base: None,
            links: Default::default(),
            deltas: Default::default(),
        }
    }
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub fn data_name(id: &ContainerId) -> String {
    let h = id.to_hex();
    format!("data/{}/{}", &h[..2], h)
}

pub fn meta_name(id: &ContainerId) -> String {
    let h = id.to_hex();
    format!("meta/{}/{}", &h[..2], h)
}

/// The container id encoded in a `data/` or `meta/` object name.
pub fn container_id_of(name: &str) -> Option<ContainerId> {
    ContainerId::from_hex(name.rsplit('/').next()?)
}

impl Repository {
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn config(&self) -> &RepoConfig {
        &self.config
    }

    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// The cache and counters of delta regions read through this handle.
    pub fn deltas(&self) -> &delta::DeltaCache {
        &self.deltas
    }

    /// The key of the block volume with `salt` (see
    /// [`MasterKey::volume_key`]); none in an unencrypted repository.
    pub fn volume_key(&self, salt: &[u8]) -> Option<[u8; 32]> {
        self.key.as_ref().map(|(k, _)| k.volume_key(salt))
    }

    /// The master key and the slot the password opened (encrypted
    /// repositories).
    pub(crate) fn key(&self) -> Option<&(MasterKey, String)> {
        self.key.as_ref()
    }

    /// A repository with this one's keys in another backend (its cloud
    /// tier): same sealer and fingerprint key, so chunks and recipe parts
    /// are the same bytes and names on both sides.
    pub(crate) fn sibling(&self, backend: Arc<dyn Backend>, config: RepoConfig) -> Repository {
        Repository {
            backend,
            config,
            sealer: self.sealer.clone(),
            hasher: self.hasher.clone(),
            key: self.key.clone(),
            no_cache: self.no_cache,
            cache_base: self.cache_base.clone(),
            // (The other tier's own: a bucket has no volumes.)
            links: Default::default(),
            deltas: Default::default(),
        }
    }

    /// This repository seen through a what-if layer: commands run on it
    /// exactly as on the repository, but nothing they write or delete
    /// reaches it (data objects keep only their sizes), and the local cache
    /// is left alone. Dropped, it leaves no trace.
    pub fn dry_run(&self) -> Repository {
        let layer = strata_backend::OverlayBackend::new(self.backend.clone(), &["data/"]);
        Repository {
            backend: Arc::new(layer),
            config: self.config.clone(),
            sealer: self.sealer.clone(),
            hasher: self.hasher.clone(),
            key: self.key.clone(),
            no_cache: true,
            cache_base: None,
            links: Arc::new(self.links.like(true)),
            deltas: Default::default(),
        }
    }

    /// Seals and stores a structure under `prefix/HASH`; returns the id
    /// (HASH) and the stored size.
    pub fn put_struct<T: Serialize>(
        &self,
        kind: Kind,
        prefix: &str,
        value: &T,
    ) -> Result<(String, u64)> {
        self.put_encoded(kind, prefix, &encode(value)?)
    }

    /// [`Self::put_struct`] for a structure already encoded (with
    /// [`encode`]): lets a caller drop a large structure (a recipe's tree)
    /// before it is compressed and sealed.
    pub fn put_encoded(&self, kind: Kind, prefix: &str, bytes: &[u8]) -> Result<(String, u64)> {
        let env = self.sealer.seal(kind, bytes, true)?;
        let id = blake3::hash(&env).to_hex().to_string();
        self.backend.put(&format!("{prefix}/{id}"), &env)?;
        Ok((id, env.len() as u64))
    }

    /// Reads, verifies and decodes a structure.
    pub fn get_struct<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
        what: &'static str,
    ) -> Result<T> {
        self.get_struct_within(kind, name, what, u64::MAX)
    }

    /// [`Self::get_struct`] of an object known to hold at most `max`
    /// bytes (a bomb claiming more is refused unexpanded).
    pub fn get_struct_within<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
        what: &'static str,
        max: u64,
    ) -> Result<T> {
        self.read_verified(name, |raw| {
            let bytes = self
                .sealer
                .open_within(kind, raw, max.min(kind.max_plain_of(raw.len())))
                .map_err(|e| StoreError::corrupt(name, e))?;
            decode(what, &bytes).map_err(|e| StoreError::corrupt(name, e))
        })
    }

    /// Reads object `name` and hands it to `parse`; when that finds it
    /// damaged, a local copy (a cache's) is dropped and the object read
    /// once more from storage before the damage is reported.
    pub fn read_verified<T>(&self, name: &str, parse: impl Fn(&[u8]) -> Result<T>) -> Result<T> {
        let raw = self.backend.get(name)?;
        match parse(&raw) {
            Err(StoreError::Corrupt { .. }) => {
                self.backend.evict(name);
                parse(&self.backend.get(name)?)
            }
            r => r,
        }
    }

    /// [`Self::get_struct`] for an object that may not exist.
    pub fn get_struct_opt<T: DeserializeOwned>(
        &self,
        kind: Kind,
        name: &str,
        what: &'static str,
    ) -> Result<Option<T>> {
        match self.get_struct(kind, name, what) {
            Ok(v) => Ok(Some(v)),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads one snapshot by id.
    pub fn load_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        self.get_snapshot(&id.object_name())
    }

    /// Reads, verifies and decodes the snapshot object `name`.
    pub fn get_snapshot(&self, name: &str) -> Result<Snapshot> {
        let raw = self.backend.get(name)?;
        let bytes = self
            .sealer
            .open_named(Kind::Snapshot, name, self.binds_names(), &raw)
            .map_err(|e| StoreError::corrupt(name, e))?;
        strata_core::format::decode_snapshot(&bytes).map_err(|e| StoreError::corrupt(name, e))
    }

    /// Whether this repository's format binds every snapshot object to
    /// its name (format 3 on): one copied under another name is refused.
    pub fn binds_names(&self) -> bool {
        self.config.format_version >= strata_core::format::NAMES_BOUND_FROM
    }

    /// A snapshot object's envelope, bound to `name` where the format
    /// binds them (format 2 repositories keep writing what their builds
    /// read).
    fn seal_snapshot(&self, name: &str, snapshot: &Snapshot) -> Result<Vec<u8>> {
        let plain = strata_core::format::encode_snapshot(snapshot)?;
        Ok(match self.binds_names() {
            true => self.sealer.seal_named(Kind::Snapshot, name, &plain, true)?,
            false => self.sealer.seal(Kind::Snapshot, &plain, true)?,
        })
    }

    /// Writes a new snapshot object. Its id is the hash of its bytes where
    /// they do not depend on the name; where the format binds the name,
    /// it is random.
    pub fn put_snapshot(&self, snapshot: &Snapshot) -> Result<SnapshotId> {
        let (id, env) = if self.binds_names() {
            let mut r = [0u8; 32];
            strata_core::crypto::random_bytes(&mut r)?;
            let id = SnapshotId::of_hash(&blake3::hash(&r));
            let env = self.seal_snapshot(&id.object_name(), snapshot)?;
            (id, env)
        } else {
            let env = self.seal_snapshot("", snapshot)?;
            (SnapshotId::of_hash(&blake3::hash(&env)), env)
        };
        self.backend.put(&id.object_name(), &env)?;
        Ok(id)
    }

    /// Replaces a snapshot object under its existing id: the atomic switch
    /// with which lifecycle commands (maintain, gc, forget) give a version a
    /// new recipe. The id stays the one it was written under.
    pub fn replace_snapshot(&self, id: &SnapshotId, snapshot: &Snapshot) -> Result<()> {
        let name = id.object_name();
        let env = self.seal_snapshot(&name, snapshot)?;
        Ok(self.backend.put(&name, &env)?)
    }

    /// Keeps local caches (index objects and summaries) under `base`, a
    /// directory per repository id; `None` turns caching off (the
    /// default). The CLI passes `$STRATA_CACHE_DIR` or the user's cache
    /// directory.
    pub fn with_cache(mut self, base: Option<PathBuf>) -> Self {
        self.cache_base = base;
        self
    }

    /// The local cache directory of this repository, if it has one.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        Some(self.cache_base.as_ref()?.join(&self.config.id))
    }

    /// Reads a content-addressed object (`prefix/HASH`) from the local cache
    /// when a copy there still hashes to its name, else from the backend,
    /// keeping a copy. Cache problems are never errors: the repository is
    /// the truth and the cache only saves reads from (remote) backends.
    pub fn get_cached(&self, name: &str) -> Result<Vec<u8>> {
        let want = name.rsplit('/').next().unwrap_or_default();
        self.get_cached_if(name, |bytes| blake3::hash(bytes).to_hex().as_str() == want)
    }

    /// [`Self::get_cached`] for objects whose name is not their hash: a
    /// copy counts (in the cache, or to be kept there) when `valid` says so.
    fn get_cached_if(&self, name: &str, valid: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
        let path = self.cache_dir().map(|d| d.join(name));
        if let Some(p) = &path {
            if let Ok(bytes) = std::fs::read(p) {
                if valid(&bytes) {
                    return Ok(bytes);
                }
            }
        }
        let bytes = self.backend.get(name)?;
        if let Some(p) = &path {
            if valid(&bytes) {
                if let Some(dir) = p.parent() {
                    let tmp = dir.join(format!(
                        ".tmp-{}-{:?}",
                        std::process::id(),
                        std::thread::current().id()
                    ));
                    let _ = std::fs::create_dir_all(dir)
                        .and_then(|_| std::fs::write(&tmp, &bytes))
                        .and_then(|_| std::fs::rename(&tmp, p));
                }
            }
        }
        Ok(bytes)
    }

    /// Drops the local cache's copy of object `name` (one whose name is
    /// not its hash, rewritten in storage: a summary upgraded or
    /// repaired).
    pub fn uncache(&self, name: &str) {
        if let Some(d) = self.cache_dir() {
            let _ = std::fs::remove_file(d.join(name));
        }
    }

    /// Drops cached copies of objects under `prefix` that no longer exist.
    pub fn prune_cache(&self, prefix: &str, live: &[String]) {
        let Some(dir) = self
            .cache_dir()
            .map(|d| d.join(prefix.trim_end_matches('/')))
        else {
            return;
        };
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        let prefix = prefix.trim_end_matches('/');
        for e in rd.flatten() {
            let name = format!("{prefix}/{}", e.file_name().to_string_lossy());
            if !live.contains(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// All snapshots, oldest first. A snapshot object that cannot be read
    /// is an error: commands that decide what data is still needed (gc,
    /// maintain, forget) must not guess.
    pub fn list_snapshots(&self) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let (out, damaged) = self.list_snapshots_tolerant()?;
        if let Some((id, e)) = damaged.into_iter().next() {
            return Err(StoreError::Invalid(format!(
                "{e}; refusing to go on while snapshot {id} cannot be read \
                 (`strata check` lists the damage; `strata forget {id}` drops the snapshot)"
            )));
        }
        Ok(out)
    }

    /// The snapshots whose data is in this repository (not moved to the
    /// cloud tier), oldest first; strict like [`Self::list_snapshots`].
    /// Everything that reads or moves stored data works on these.
    pub fn list_active_snapshots(&self) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let mut all = self.list_snapshots()?;
        all.retain(|(_, s)| s.tier == strata_core::format::Tier::Active);
        Ok(all)
    }

    /// The readable snapshots, oldest first, and the ids of those whose
    /// object is damaged (with the error), for commands that only read:
    /// one damaged snapshot must not hide the others.
    #[allow(clippy::type_complexity)]
    pub fn list_snapshots_tolerant(
        &self,
    ) -> Result<(Vec<(SnapshotId, Snapshot)>, Vec<(String, StoreError)>)> {
        let mut out = Vec::new();
        let mut damaged = Vec::new();
        for o in self.backend.list("snapshots/")? {
            // Snapshot ids are the 64 hex digits of their object's hash;
            // anything else there is a stray object, not a snapshot.
            let Some(id) = SnapshotId::from_object_name(&o.name) else {
                let e = StoreError::Invalid(format!(
                    "{}: not a snapshot (the name is not a snapshot id)",
                    o.name
                ));
                tracing::warn!("skipping {e}");
                damaged.push((o.name.trim_start_matches("snapshots/").to_string(), e));
                continue;
            };
            match self.get_snapshot(&o.name) {
                Ok(s) => out.push((id, s)),
                Err(e @ StoreError::Corrupt { .. }) | Err(e @ StoreError::Core(_)) => {
                    tracing::warn!("skipping damaged snapshot {id}: {e}");
                    damaged.push((id.to_string(), e))
                }
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| (a.1.time_ns, &a.0).cmp(&(b.1.time_ns, &b.0)));
        Ok((out, damaged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rewrites the (checksummed, not authenticated) config of `b`.
    fn forge_config(b: &Arc<dyn Backend>, change: impl Fn(&mut RepoConfig)) {
        let raw = b.get("config").unwrap();
        let plain = Sealer::plain(3).open(Kind::Config, &raw).unwrap();
        let mut c: RepoConfig = strata_core::format::decode_config(&plain).unwrap();
        change(&mut c);
        let env = Sealer::plain(3)
            .seal(
                Kind::Config,
                &strata_core::format::encode_config(&c).unwrap(),
                false,
            )
            .unwrap();
        b.put("config", &env).unwrap();
    }

    #[test]
    fn forged_configs_are_refused() {
        let pw = || Ok(b"pw".to_vec());
        for (encrypted, change) in [
            // An id that would lead the cache directory elsewhere.
            (
                false,
                (|c: &mut RepoConfig| c.id = "../../../../tmp/x".into()) as fn(&mut RepoConfig),
            ),
            // "Unencrypted" beside key slots: a downgrade.
            (true, |c: &mut RepoConfig| c.encrypted = false),
        ] {
            let b: Arc<dyn Backend> = Arc::new(strata_backend::MemoryBackend::default());
            let opts = InitOptions {
                password: encrypted.then(|| b"pw".to_vec()),
                kdf: KdfCost {
                    memory_kib: 256,
                    iterations: 1,
                },
                ..Default::default()
            };
            Repository::init(b.clone(), opts).unwrap();
            assert!(Repository::open(b.clone(), &pw).is_ok());
            forge_config(&b, change);
            let e = Repository::open(b.clone(), &pw)
                .err()
                .expect("forged config opened");
            assert!(e.to_string().contains("damaged or forged"), "{e}");
        }
    }

    #[test]
    fn index_specs_parse_validate_and_normalise() {
        let s = IndexSpec::parse("silo:reps=2,block-mib=128").unwrap();
        assert_eq!(s.name, "silo");
        assert_eq!(s.get("reps", 1), 2);
        assert_eq!(s.get("cache-blocks", 8), 8);
        // Options print sorted, so one configuration has one spelling.
        assert_eq!(s.to_string(), "silo:block-mib=128,reps=2");
        assert_eq!(IndexSpec::parse("exact").unwrap().to_string(), "exact");
        assert_eq!(IndexSpec::parse("silo:").unwrap().to_string(), "silo");
        for bad in [
            "silox",
            "silo:reps",
            "silo:reps=0",
            "silo:reps=x",
            "silo:colour=1",
            "segment:reps=2",
            "silo:record-duplicates=2",
        ] {
            assert!(
                matches!(IndexSpec::parse(bad), Err(StoreError::Invalid(_))),
                "{bad} accepted"
            );
        }
    }
}
