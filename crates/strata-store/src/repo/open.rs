//! Creating a repository and opening one: its config checked, its key
//! slot unlocked with the password.

use super::{now_ns, IndexSpec, InitOptions, Repository};
use crate::backend::Backend;
use crate::error::{Result, StoreError};
use std::sync::Arc;
use strata_core::crypto::{random_bytes, Kind, MasterKey, Sealer};
use strata_core::format::{
    decode_config, encode_config, RepoConfig, OLDEST_REPO_FORMAT, REPO_FORMAT_VERSION,
};
use strata_core::Hasher;

/// No `config`: no repository — unless repository objects are there, in
/// which case the config was lost and `strata init` is the wrong advice.
fn missing_config(backend: &dyn Backend) -> StoreError {
    for prefix in ["keys/", "snapshots/", "index/", "data/"] {
        if let Ok(list) = backend.list(prefix) {
            if let Some(o) = list.first() {
                return StoreError::Invalid(format!(
                    "{}: the repository's config is missing, but it holds repository objects ({}): \
                     the repository is damaged; put back `config` from a copy (do not run `strata init` over it)",
                    backend.describe(),
                    o.name
                ));
            }
        }
    }
    StoreError::NoRepository(backend.describe())
}

impl Repository {
    /// Creates a new repository in an empty backend.
    pub fn init(backend: Arc<dyn Backend>, opts: InitOptions) -> Result<Self> {
        if backend.size("config")?.is_some() {
            return Err(StoreError::AlreadyExists(backend.describe()));
        }
        opts.chunker.validate()?;
        if opts.password.as_ref().is_some_and(|p| p.is_empty()) {
            return Err(StoreError::Invalid(
                "the password is empty: an encrypted repository needs one".into(),
            ));
        }
        // Stored normalised, so `stats` shows exactly what is in effect.
        let index = IndexSpec::parse(&opts.index)?.to_string();
        if !(1..=22).contains(&opts.zstd_level) {
            return Err(StoreError::Invalid(
                "zstd level must be between 1 and 22".into(),
            ));
        }
        if opts.region_size < 16 << 10 || opts.container_size < 2 * opts.region_size {
            return Err(StoreError::Invalid(
                "region size must be at least 16 KiB and containers hold at least two regions"
                    .into(),
            ));
        }
        let mut id = [0u8; 16];
        random_bytes(&mut id)?;
        let config = RepoConfig {
            format_version: REPO_FORMAT_VERSION,
            id: hex::encode(id),
            created: now_ns() / 1_000_000_000,
            chunker: opts.chunker,
            zstd_level: opts.zstd_level,
            container_size: opts.container_size,
            region_size: opts.region_size,
            encrypted: opts.password.is_some(),
            index,
            delta: opts.delta,
        };
        let (sealer, hasher, key) = match &opts.password {
            Some(pw) => {
                let mk = MasterKey::generate()?;
                super::keys::write_slot(&backend, "keys/default", &mk, pw, opts.kdf)?;
                (
                    Sealer::encrypted(&mk, opts.zstd_level),
                    Sealer::hasher(Some(&mk)),
                    Some((mk, "keys/default".to_string())),
                )
            }
            None => (Sealer::plain(opts.zstd_level), Hasher::plain(), None),
        };
        let env = Sealer::plain(3).seal(Kind::Config, &encode_config(&config)?, false)?;
        // The config is written last: it is what makes this a repository.
        backend.put("config", &env)?;
        Ok(Repository::assemble(backend, config, (sealer, hasher), key))
    }

    /// The repository's config, checked (it is readable without the
    /// password: whether the repository is encrypted, its chunker, …).
    pub fn read_config(backend: &dyn Backend) -> Result<RepoConfig> {
        let raw = match backend.get("config") {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Err(missing_config(backend)),
            Err(e) => return Err(e.into()),
        };
        let plain = Sealer::plain(3);
        let bytes = plain
            .open(Kind::Config, &raw)
            .map_err(|e| StoreError::corrupt("config", e))?;
        let config = decode_config(&bytes).map_err(|e| StoreError::corrupt("config", e))?;
        if !(OLDEST_REPO_FORMAT..=REPO_FORMAT_VERSION).contains(&config.format_version) {
            return Err(StoreError::Core(strata_core::CoreError::UnknownVersion {
                what: "repository format",
                found: config.format_version,
                supported: REPO_FORMAT_VERSION,
            }));
        }
        // The id names the local cache directory: 32 hex digits, nothing
        // that could reach elsewhere on this host.
        if config.id.len() != 32 || !config.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::Invalid(format!(
                "the repository config's id {:?} is not a repository id: the config is damaged or forged",
                config.id
            )));
        }
        // A config claiming "unencrypted" beside key slots is a downgrade
        // (the config is only checksummed): refuse rather than read plain.
        if !config.encrypted && !backend.list("keys/")?.is_empty() {
            return Err(StoreError::Invalid(
                "the repository has key slots but its config says it is not encrypted: the config is damaged or forged".into(),
            ));
        }
        Ok(config)
    }

    /// Opens an existing repository. `password` is only called when the
    /// repository is encrypted.
    pub fn open(backend: Arc<dyn Backend>, password: &dyn Fn() -> Result<Vec<u8>>) -> Result<Self> {
        let config = Self::read_config(&*backend)?;
        let (sealer, hasher, key) = if config.encrypted {
            let pw = zeroize::Zeroizing::new(password()?);
            let (mk, slot) = super::keys::unlock(&backend, &pw)?;
            (
                Sealer::encrypted(&mk, config.zstd_level),
                Sealer::hasher(Some(&mk)),
                Some((mk, slot)),
            )
        } else {
            (Sealer::plain(config.zstd_level), Hasher::plain(), None)
        };
        Ok(Repository::assemble(backend, config, (sealer, hasher), key))
    }
}
