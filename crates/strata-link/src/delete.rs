//! A volume deleted, and what its snapshots link to its blocks stored in
//! the repository again first (also before a defrag replaces its data
//! file).

use crate::dir::VolumesDir;
use crate::error::{Context as _, LinkError, Result};
use crate::keys::RepoAccess;
use crate::unlink::{unlink_volume, UnlinkReport};
use std::path::Path;
use strata_volume::holds;
use strata_volume::Volume;

/// Before a volume's data file goes (delete, defrag): the containers its
/// snapshots link to its blocks are stored in the repository again, and
/// their holds released ([`unlink_volume`]). Returns what it did. A
/// container that cannot be (its blocks changed on the host) fails a
/// defrag; a delete (`deleting`) goes on with a warning — the versions
/// using it are damaged already.
pub fn unlink_before_removal(
    repo: &dyn RepoAccess,
    dir: &Path,
    name: &str,
    deleting: bool,
    warnings: &mut Vec<String>,
) -> Result<UnlinkReport> {
    if holds::held(dir)?.is_empty() {
        return Ok(Default::default());
    }
    let repo = repo.open()?;
    let r = unlink_volume(&repo, name).with_context(|| {
        format!("storing again what snapshots of volume {name} link to its blocks")
    })?;
    if !r.failed.is_empty() {
        return Err(LinkError::Invalid(format!(
            "{} container(s) linked to volume {name} could not be stored in the repository \
             again, so the volume is kept as it is: {}",
            r.failed.len(),
            r.failed.join("; ")
        )));
    }
    if !r.damaged.is_empty() {
        let why: Vec<&str> = r.damaged.iter().map(|(_, w)| w.as_str()).collect();
        if !deleting {
            return Err(LinkError::Invalid(format!(
                "{} container(s) linked to volume {name} no longer match its blocks, so the \
                 volume is kept as it is: {}",
                r.damaged.len(),
                why.join("; ")
            )));
        }
        // Deleted all the same: what they held is gone already.
        for (id, _) in &r.damaged {
            holds::release(dir, &id.to_hex())?;
        }
        warnings.push(format!(
            "{} container(s) linked to volume {name} no longer match its blocks and could not be \
             stored again (the versions using them were damaged already; `strata check` names \
             them): {}",
            r.damaged.len(),
            why.join("; ")
        ));
    }
    if let Some(why) = &r.recompress_failed {
        warnings.push(format!(
            "the containers of volume {name}'s snapshots are stored in the repository again, \
             uncompressed: compressing them failed ({why})"
        ));
    }
    let left = holds::held(dir)?;
    if !left.is_empty() {
        return Err(LinkError::Invalid(format!(
            "volume {name} still keeps disk blocks for {} container(s) this repository does not \
             link (another repository's?), so it is kept. If no repository's snapshots link to \
             it, remove {} and try again",
            left.len(),
            dir.join(holds::DIR).display()
        )));
    }
    Ok(r)
}

/// What a delete did.
pub struct Deleted {
    /// What its snapshots linked, stored in the repository again.
    pub unlinked: UnlinkReport,
    pub warnings: Vec<String>,
}

/// Deletes volume `name` of `root`: what its snapshots link to its blocks
/// stored in the repository again, then its directory moved aside in one
/// step (a kill while its files are removed leaves no half volume under
/// its name) and removed.
pub fn delete(repo: &dyn RepoAccess, root: &VolumesDir, name: &str) -> Result<Deleted> {
    let dir = root.existing(name)?;
    let lock = Volume::lock(&dir)?;
    let mut warnings = Vec::new();
    let unlinked = unlink_before_removal(repo, &dir, name, true, &mut warnings)?;
    root.sweep_deleted();
    let gone = root.path.join(format!(
        ".{name}.deleting-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    std::fs::rename(&dir, &gone).map_err(LinkError::io(format!(
        "moving {} to {} to delete it",
        dir.display(),
        gone.display()
    )))?;
    // A stopped defrag's copy, and its lock file; killed snapshots'
    // records (before a new volume of the name can be).
    let _ = std::fs::remove_dir_all(root.path.join(format!(".{name}.defrag")));
    let _ = std::fs::remove_file(root.path.join(format!(".{name}.defrag.lock")));
    crate::leftovers::forget(&root.path, name);
    drop(lock);
    if let Err(e) = std::fs::remove_dir_all(&gone) {
        warnings.push(format!(
            "volume {name} is deleted, but removing its files ({}) failed: {e}; \
             the next `strata volume delete` or `create` tries again",
            gone.display()
        ));
    }
    Ok(Deleted { unlinked, warnings })
}
