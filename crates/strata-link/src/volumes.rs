//! A local repository's volumes (`REPO/volumes/NAME`), as the store reads
//! linked containers from them: a volume's disk blocks read from its data
//! file and decrypted with its key, and a hold released in its `holds/`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use strata_core::BLOCK_SIZE as BLOCK;
use strata_store::backend::Location;
use strata_store::repo::links::{HeldBlocks, Volumes};
use strata_volume::crypt::DataCipher;
use strata_volume::VolumeKey;

/// The volumes in a directory (a local repository's `volumes/`).
pub struct DirVolumes {
    root: PathBuf,
}

impl DirVolumes {
    /// The volumes in `root`, as a repository handle takes them
    /// (`Repository::with_volumes`).
    pub fn at(root: &Path) -> Arc<dyn Volumes> {
        Arc::new(DirVolumes {
            root: root.to_path_buf(),
        })
    }

    /// The volumes that may hold containers of the repository at `loc`
    /// (linked snapshots): a local repository's own `volumes/`; None for a
    /// bucket (its volumes never hold its containers).
    pub fn of(loc: &Location) -> Option<Arc<dyn Volumes>> {
        own_dir(loc).map(|r| Self::at(&r))
    }
}

/// A local repository's own volumes directory, `REPO/volumes` (None for
/// a bucket).
pub fn own_dir(loc: &Location) -> Option<PathBuf> {
    match loc {
        Location::Local(p) => Some(p.join(OWN_DIR)),
        Location::S3(_) => None,
    }
}

/// The name of a local repository's own volumes directory.
pub const OWN_DIR: &str = "volumes";

impl Volumes for DirVolumes {
    fn blocks(&self, volume: &str, key: Option<[u8; 32]>) -> Arc<dyn HeldBlocks> {
        Arc::new(DataFile::new(
            self.root.join(volume).join("data"),
            key.map(|k| DataCipher::new(&VolumeKey(k))),
        ))
    }

    fn release(&self, volume: &str, hold: &str) -> Result<(), String> {
        strata_volume::holds::release(&self.root.join(volume), hold)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A volume's data file, opened on the first read (not per region).
pub struct DataFile {
    path: PathBuf,
    file: OnceLock<File>,
    cipher: Option<DataCipher>,
}

impl DataFile {
    /// The data file at `path`, its blocks decrypted with `cipher`.
    pub fn new(path: PathBuf, cipher: Option<DataCipher>) -> DataFile {
        DataFile {
            path,
            file: OnceLock::new(),
            cipher,
        }
    }

    fn file(&self) -> std::io::Result<&File> {
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let f = File::open(&self.path)?;
        Ok(self.file.get_or_init(|| f))
    }
}

impl HeldBlocks for DataFile {
    fn read(&self, dbns: &[u64], out: &mut [u8]) -> std::io::Result<()> {
        read_blocks(self.file()?, self.cipher.as_ref(), dbns, out)
    }

    fn data_len(&self) -> std::io::Result<u64> {
        Ok(std::fs::metadata(&self.path)?.len())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Fills `out` (`dbns.len()` blocks) with the plaintext of the volume's
/// disk blocks `dbns` from its data file `data` (runs of neighbours read
/// at once), decrypted with `cipher` when the volume is encrypted.
fn read_blocks(
    data: &File,
    cipher: Option<&DataCipher>,
    dbns: &[u64],
    out: &mut [u8],
) -> std::io::Result<()> {
    if out.len() != dbns.len() * BLOCK {
        return Err(std::io::Error::other("a read of whole blocks"));
    }
    let mut i = 0;
    while i < dbns.len() {
        let mut j = i + 1;
        while j < dbns.len() && dbns[j - 1].checked_add(1) == Some(dbns[j]) {
            j += 1;
        }
        let at = dbns[i].checked_mul(BLOCK as u64).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no block {} in a volume", dbns[i]),
            )
        })?;
        data.read_exact_at(&mut out[i * BLOCK..j * BLOCK], at)?;
        i = j;
    }
    if let Some(c) = cipher {
        for (k, &d) in dbns.iter().enumerate() {
            c.open(d, &mut out[k * BLOCK..(k + 1) * BLOCK]);
        }
    }
    Ok(())
}
