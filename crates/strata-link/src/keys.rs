//! An encrypted volume's key (its blocks, journal and fingerprints are
//! encrypted, see `strata_volume::crypt`): derived from the repository's
//! master key and the volume's salt; and the repository, as volume
//! operations reach it (opened only when needed: opening asks for its
//! password).

use crate::error::{LinkError, Result};
use std::path::Path;
use strata_store::Repository;
use strata_volume::{Encryption, Volume, VolumeConfig, VolumeKey};

/// The repository of a volumes directory, as the operations reach it.
pub trait RepoAccess {
    /// Whether the repository is encrypted (from its config, without the
    /// password).
    fn encrypted(&self) -> Result<bool>;
    /// The repository, opened (asking for its password).
    fn open(&self) -> Result<Repository>;
}

/// A volume that is not encrypted in a repository that is: not made by
/// `volume create` here (copied in?); not served or snapshotted, as its
/// blocks would be in plain beside the repository.
pub const PLAIN_IN_ENCRYPTED: &str = "this volume is not encrypted, but its repository is (a volume copied in from \
     another repository?): it is not used here. Create a new volume in this repository and copy the data over";

/// The key of the volume whose config is `cfg`, from `repo`'s master key;
/// None for a volume that is not encrypted.
pub fn volume_key(repo: &Repository, cfg: &VolumeConfig) -> Result<Option<VolumeKey>> {
    let Some(e) = &cfg.encryption else {
        if repo.config().encrypted {
            return Err(LinkError::Invalid(PLAIN_IN_ENCRYPTED.into()));
        }
        return Ok(None);
    };
    let salt = e.salt_bytes().ok_or_else(|| {
        LinkError::Invalid(format!(
            "the volume's salt {:?} is not hex (a damaged volume.json)",
            e.salt
        ))
    })?;
    let key = repo.volume_key(&salt).ok_or_else(|| {
        LinkError::Invalid(
            "the volume is encrypted, but its repository is not: it belongs to another repository"
                .into(),
        )
    })?;
    Ok(Some(VolumeKey(key)))
}

/// The key of the volume in `dir`: the repository is opened (asking for
/// its password) only when the volume is encrypted.
pub fn key_for_dir(repo: &dyn RepoAccess, dir: &Path) -> Result<Option<VolumeKey>> {
    let cfg = Volume::config(dir)?;
    if cfg.encryption.is_none() {
        if repo.encrypted()? {
            return Err(LinkError::Invalid(PLAIN_IN_ENCRYPTED.into()));
        }
        return Ok(None);
    }
    volume_key(&repo.open()?, &cfg)
}

/// In an encrypted repository a new volume is encrypted too, with a key
/// of its own from the repository's: set in `cfg`, and returned.
pub fn new_key(repo: &dyn RepoAccess, cfg: &mut VolumeConfig) -> Result<Option<VolumeKey>> {
    cfg.encryption = None;
    if !repo.encrypted()? {
        return Ok(None);
    }
    let repo = repo.open()?;
    let mut salt = [0u8; 16];
    strata_core::crypto::random_bytes(&mut salt)
        .map_err(|e| LinkError::Invalid(format!("a random salt: {e}")))?;
    let k = repo.volume_key(&salt).map(VolumeKey).ok_or_else(|| {
        LinkError::Invalid("the repository's key: an encrypted repository has one".into())
    })?;
    cfg.encryption = Some(Encryption::new(salt, &k));
    Ok(Some(k))
}
