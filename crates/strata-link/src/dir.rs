//! A repository's volumes directory: volume names, the volumes in it,
//! what killed deletes left, and the marker binding a directory other
//! than `REPO/volumes/` to its repository.

use crate::error::{LinkError, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use strata_volume::Volume;

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

/// The directory of a repository's volumes, and whether it must be bound
/// to the repository (`repository.json`) before a volume is made there.
/// (A local repository's `volumes/` is its own; any other directory holds
/// the volumes of one repository: its first volume binds it, and every
/// later command checks the binding, so that a volume is never
/// snapshotted into, or keyed from, another repository by mistake.)
pub struct VolumesDir {
    pub path: PathBuf,
    bound_to: Option<(String, String)>,
}

impl VolumesDir {
    /// A local repository's own `volumes/`.
    pub fn own(path: PathBuf) -> VolumesDir {
        VolumesDir {
            path,
            bound_to: None,
        }
    }

    /// A directory for the volumes of the repository `id` (at `location`,
    /// for messages): refused when it is bound to another repository.
    pub fn bound(path: PathBuf, id: String, location: String) -> Result<VolumesDir> {
        let d = VolumesDir {
            path,
            bound_to: Some((id, location)),
        };
        d.check_marker()?;
        Ok(d)
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
            Err(e) => return Err(LinkError::Io(format!("reading {}", file.display()), e)),
        };
        let m: Marker = serde_json::from_slice(&bytes).map_err(|e| {
            LinkError::Invalid(format!(
                "{} is damaged: it should name the repository whose volumes are in {}: {e}",
                file.display(),
                self.path.display()
            ))
        })?;
        if &m.id != id {
            return Err(LinkError::Invalid(format!(
                "the volumes in {} belong to another repository ({}, id {}), not to {loc}: \
                 give --volumes-dir a directory of this repository's volumes (or a new one)",
                self.path.display(),
                m.location,
                m.id.chars().take(16).collect::<String>()
            )));
        }
        Ok(())
    }

    /// Makes the directory and binds it to the repository, before a
    /// volume is made in it.
    pub fn prepare(&self) -> Result<()> {
        std::fs::create_dir_all(&self.path).map_err(LinkError::io(format!(
            "making the volumes directory {}",
            self.path.display()
        )))?;
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
        let bytes = serde_json::to_vec_pretty(&m)
            .map_err(|e| LinkError::Invalid(format!("encoding {MARKER}: {e}")))?;
        std::fs::write(&tmp, bytes)
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|_| std::fs::rename(&tmp, &file))
            .and_then(|_| std::fs::File::open(&self.path)?.sync_all())
            .map_err(LinkError::io(format!("writing {}", file.display())))
    }

    /// The directory of volume `name`, which must exist.
    pub fn existing(&self, name: &str) -> Result<PathBuf> {
        check_name(name)?;
        let dir = self.path.join(name);
        if !dir.join("volume.json").exists() {
            return Err(LinkError::Invalid(format!(
                "no volume {name:?} (strata volume list)"
            )));
        }
        Ok(dir)
    }

    /// The volumes here, by name (a volume being filled, `.NAME.import`
    /// or `.NAME.defrag`, is not one yet).
    pub fn list(&self) -> Vec<Listed> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with('.') {
                continue;
            }
            if let Ok(c) = Volume::config(&e.path()) {
                out.push(Listed {
                    name: n,
                    size: c.size,
                    dedup: c.dedup,
                    encrypted: c.encryption.is_some(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes what killed `volume delete`s left (`.NAME.deleting-PID-N`,
    /// of any volume, whose process is gone), as far as it can. (Nothing
    /// else has that shape: a volume named `a.deleting-1-2` has a defrag
    /// copy `.a.deleting-1-2.defrag`, which does not end in digits.)
    pub fn sweep_deleted(&self) {
        for e in std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some((_, rest)) = n.rsplit_once(".deleting-").filter(|_| n.starts_with('.')) else {
                continue;
            };
            let Some((pid, nanos)) = rest.split_once('-') else {
                continue;
            };
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let Some(pid) = pid.parse::<u32>().ok().filter(|_| digits(nanos)) else {
                continue;
            };
            // (One whose delete still runs is its own to remove.)
            if crate::leftovers::gone(pid) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A volume of a directory.
#[derive(Clone, Debug, Serialize)]
pub struct Listed {
    pub name: String,
    pub size: u64,
    pub dedup: bool,
    pub encrypted: bool,
}

/// Refuses what cannot be a volume's name: letters, digits, `-`, `_`,
/// `.` (not first), at most 64.
pub fn check_name(name: &str) -> Result<()> {
    match strata_store::repo::links::valid_volume_name(name) {
        true => Ok(()),
        false => Err(LinkError::Invalid(format!(
            "{name:?} is not a volume name: letters, digits, `-`, `_`, `.` (not first), at most 64"
        ))),
    }
}

#[cfg(test)]
mod tests {
    /// Only a killed delete's leftover is swept: `.NAME.deleting-PID-N`
    /// of a process that is gone — not one whose delete still runs, nor a
    /// volume's defrag copy or import whose name holds `.deleting-`.
    #[test]
    fn only_a_killed_delete_s_leftover_is_swept() {
        let root = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let dead = gone.id();
        let names = [
            (format!(".v.deleting-{dead}-17"), false),
            (format!(".v.deleting-{}-17", std::process::id()), false),
            // pid 1 runs.
            (".w.deleting-1-17".to_string(), true),
            (".a.deleting-x.defrag".to_string(), true),
            (format!(".a.deleting-{dead}-2.defrag"), true),
            (format!(".a.deleting-{dead}-2.import"), true),
            (format!("a.deleting-{dead}-2"), true),
        ];
        for (n, _) in &names {
            std::fs::create_dir_all(root.path().join(n).join("sub")).unwrap();
        }
        super::VolumesDir::own(root.path().to_path_buf()).sweep_deleted();
        for (n, kept) in &names {
            assert_eq!(root.path().join(n).exists(), *kept, "{n}");
        }
    }
}
