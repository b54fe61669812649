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
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use strata_store::backend::Location;

/// The file naming the repository whose volumes a directory holds.
pub const MARKER: &str = "repository.json";

#[derive(Serialize, Deserialize)]
struct Marker {
    /// The repository config's id.
    id: String,
    /// Where the repository was when the first volume was made (for the
    /// error message only).
    location: String,
}

/// The directory of the repository's volumes, and whether it must be
/// bound to the repository (`repository.json`) before a volume is made
/// there.
pub struct Root {
    pub path: PathBuf,
    bound_to: Option<(String, String)>,
}

impl Root {
    /// Where the volumes of `--repo` live (`given`: `--volumes-dir`).
    /// A directory already bound to another repository is refused.
    pub fn find(cli: &crate::Cli, given: Option<&Path>) -> Result<Root> {
        let loc = location::location(cli.repo.as_deref())?;
        if let Location::Local(p) = &loc {
            if !p.join("config").exists() {
                bail!("no repository at {} (strata init creates one)", p.display());
            }
            if given.is_none() {
                return Ok(Root {
                    path: p.join("volumes"),
                    bound_to: None,
                });
            }
        }
        let id = repository_id(&loc)?;
        let path = match given {
            Some(d) => d.to_path_buf(),
            None => directories::BaseDirs::new()
                .ok_or_else(|| {
                    anyhow!(
                        "no home directory to keep the bucket's volumes in: give --volumes-dir DIR"
                    )
                })?
                .data_dir()
                .join("strata/volumes")
                .join(&id[..16]),
        };
        let root = Root {
            path,
            bound_to: Some((id, location::describe(&loc))),
        };
        root.check_marker()?;
        Ok(root)
    }

    /// Refuses a directory bound to another repository.
    fn check_marker(&self) -> Result<()> {
        let Some((id, loc)) = &self.bound_to else {
            return Ok(());
        };
        let file = self.path.join(MARKER);
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        let m: Marker = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is damaged: it should name the repository whose volumes are in {}",
                file.display(),
                self.path.display()
            )
        })?;
        if &m.id != id {
            bail!(
                "the volumes in {} belong to another repository ({}, id {}), not to {loc}: \
                 give --volumes-dir a directory of this repository's volumes (or a new one)",
                self.path.display(),
                m.location,
                short_id(&m.id)
            );
        }
        Ok(())
    }

    /// Makes the directory and binds it to the repository, before a
    /// volume is made in it.
    pub fn prepare(&self) -> Result<()> {
        std::fs::create_dir_all(&self.path)
            .with_context(|| format!("making the volumes directory {}", self.path.display()))?;
        let Some((id, loc)) = &self.bound_to else {
            return Ok(());
        };
        let file = self.path.join(MARKER);
        if file.exists() {
            return Ok(());
        }
        let m = Marker {
            id: id.clone(),
            location: loc.clone(),
        };
        // Whole and durable: a half-written marker would lock every
        // volume command out of the directory.
        let tmp = self.path.join(format!(".{MARKER}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&m)?)
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|_| std::fs::rename(&tmp, &file))
            .and_then(|_| std::fs::File::open(&self.path)?.sync_all())
            .with_context(|| format!("writing {}", file.display()))
    }
}

/// The repository's id, from its config (no password needed). A local
/// repository's config was already seen to exist.
fn repository_id(loc: &Location) -> Result<String> {
    let backend = location::backend(loc, false)?;
    let config = strata_store::repo::Repository::read_config(&*backend)
        .with_context(|| format!("reading the config of {}", location::describe(loc)))?;
    // Checked by read_config: 32 hex digits, safe in a path.
    Ok(config.id)
}

/// At most 16 characters of an id read from a file, for a message.
fn short_id(id: &str) -> String {
    id.chars().take(16).collect()
}
