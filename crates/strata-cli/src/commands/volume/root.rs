//! Where a repository's volumes live. A local repository keeps them in
//! `REPO/volumes/`; a bucket cannot hold a block device's data file, so a
//! bucket's volumes live on this host, in `strata/volumes/ID` of the
//! user's data directory (ID: the first 16 hex digits of the repository's
//! id); `--volumes-dir` (`$STRATA_VOLUMES_DIR`) puts them anywhere, for
//! either kind. Snapshots go to the repository wherever the volumes are.
//!
//! A directory other than `REPO/volumes/` holds the volumes of one
//! repository: its first volume writes `repository.json` there (the
//! repository's id and where it was), and every later command checks it,
//! so a volume is never snapshotted into, or keyed from, another
//! repository by mistake.

use crate::location;
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use strata_link::VolumesDir;
use strata_store::backend::Location;

/// Where the volumes of `--repo` live (`given`: `--volumes-dir`). A
/// directory already bound to another repository is refused.
pub fn find(cli: &crate::cli::Cli, given: Option<&Path>) -> Result<VolumesDir> {
    let loc = location::location(cli.repo.as_deref())?;
    if let Location::Local(p) = &loc {
        if !p.join("config").exists() {
            bail!("no repository at {} (strata init creates one)", p.display());
        }
        if given.is_none() {
            return Ok(VolumesDir::own(p.join(strata_link::volumes::OWN_DIR)));
        }
    }
    let id = repository_id(&loc)?;
    let path = match given {
        Some(d) => d.to_path_buf(),
        None => directories::BaseDirs::new()
            .ok_or_else(|| {
                anyhow!("no home directory to keep the bucket's volumes in: give --volumes-dir DIR")
            })?
            .data_dir()
            .join("strata/volumes")
            .join(&id[..16]),
    };
    VolumesDir::bound(path, id, loc.to_string()).map_err(super::access::link_err)
}

/// The repository's id, from its config (no password needed). A local
/// repository's config was already seen to exist.
fn repository_id(loc: &Location) -> Result<String> {
    let backend = location::backend(loc, false)?;
    let config = strata_store::repo::Repository::read_config(&*backend)
        .with_context(|| format!("reading the config of {}", loc))?;
    // Checked by read_config: 32 hex digits, safe in a path.
    Ok(config.id)
}
