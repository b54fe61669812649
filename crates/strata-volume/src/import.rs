//! A raw disk image (a file, a block device, standard input, or another
//! volume's image) copied into a new volume through its write path —
//! deduplicated as a client's writes are, blocks of zeros left unwritten
//! (the volume stays thin) — and made durable before it returns
//! (`volume create --from`, `volume copy`, and defrag's copy).

use crate::config::{VolumeConfig, BLOCK};
use crate::error::{Result, VolumeError};
use crate::state::Volume;
use crate::VolumeKey;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How far a copy got: bytes done, of the image's bytes (0 when not
/// known).
pub type Progress<'a> = &'a dyn Fn(u64, u64);
/// Bytes read and written at a time.
const CHUNK: usize = 1 << 20;

/// Where the image comes from.
pub struct Source {
    pub name: String,
    input: Input,
    /// Bytes, when known (not for standard input).
    size: Option<u64>,
}

/// How the image is read.
enum Input {
    /// Front to back (standard input, a block device).
    Stream(Box<dyn Read>),
    /// A regular file: its holes (`SEEK_DATA`) are passed over unread.
    File(File),
    /// A volume's image: its unwritten blocks are passed over unread.
    Volume(crate::ImageReader),
}

impl Source {
    /// The image of a volume, `size` bytes.
    pub fn volume(name: String, reader: crate::ImageReader, size: u64) -> Source {
        Source {
            name,
            input: Input::Volume(reader),
            size: Some(size),
        }
    }

    /// The image at `path` (`-`: standard input).
    pub fn open(path: &Path) -> Result<Source> {
        if path == Path::new("-") {
            return Ok(Source {
                name: "standard input".into(),
                input: Input::Stream(Box::new(std::io::stdin())),
                size: None,
            });
        }
        let name = path.display().to_string();
        let mut f = File::open(path).map_err(VolumeError::io(format!("opening {name}")))?;
        let meta = f
            .metadata()
            .map_err(VolumeError::io(format!("reading {name}")))?;
        if meta.is_dir() {
            return Err(VolumeError::Invalid(format!(
                "{name} is a directory, not a disk image"
            )));
        }
        if meta.is_file() {
            return Ok(Source {
                name,
                input: Input::File(f),
                size: Some(meta.len()),
            });
        }
        // A block device's size is where its end is (a pipe has none).
        let size = match f.seek(SeekFrom::End(0)) {
            Ok(n) => {
                f.rewind()
                    .map_err(VolumeError::io(format!("reading {name}")))?;
                Some(n).filter(|&n| n > 0)
            }
            Err(_) => None,
        };
        Ok(Source {
            name,
            input: Input::Stream(Box::new(f)),
            size,
        })
    }

    /// The volume size the image needs: its bytes rounded up to 4 KiB.
    pub fn size_hint(&self) -> Option<u64> {
        self.size.map(|s| s.div_ceil(BLOCK as u64) * BLOCK as u64)
    }

    /// Where the image's next data may begin, at or after byte `at` (a
    /// block boundary): a hole of a file, or unwritten blocks of a volume,
    /// are passed over; a stream has none.
    fn next_data(&mut self, at: u64) -> std::io::Result<u64> {
        let size = self.size.unwrap_or(u64::MAX);
        match &mut self.input {
            Input::Stream(_) => Ok(at),
            Input::File(f) => Ok(match crate::files::next_data(f, at)? {
                Some(d) => (d / BLOCK as u64 * BLOCK as u64).max(at),
                None => size.max(at),
            }),
            Input::Volume(r) => {
                let mut at = at;
                while at < size {
                    let n = (size - at).min(CHUNK as u64);
                    if !r.unwritten(at, n)? {
                        break;
                    }
                    at += n;
                }
                Ok(at)
            }
        }
    }

    /// Fills `buf` from byte `at` unless the image ends first; returns the
    /// bytes read.
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.input {
            Input::Stream(r) => read_full(r, buf),
            Input::File(f) => {
                f.seek(SeekFrom::Start(at))?;
                read_full(f, buf)
            }
            Input::Volume(r) => {
                r.skip_to(at)?;
                read_full(r, buf)
            }
        }
    }
}

/// What an import did.
pub struct Imported {
    pub name: String,
    /// Bytes of the image.
    pub size: u64,
    /// Bytes read from it (its holes, or a volume's unwritten blocks, are
    /// not).
    pub read: u64,
    /// Bytes written to the volume (those not zeros).
    pub written: u64,
}

/// Creates the volume `dir` with `cfg`, filled from `src`. It is made
/// and filled as `.NAME.import` beside it and renamed when closed: an
/// import that fails or is stopped (Ctrl-C, kill) leaves no volume `NAME`
/// (what it leaves is removed by the next import of `NAME`).
pub fn create_filled(
    dir: &Path,
    cfg: VolumeConfig,
    key: Option<&VolumeKey>,
    src: Source,
    progress: Progress<'_>,
) -> Result<Imported> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if dir.join("volume.json").exists() {
        return Err(VolumeError::Invalid(format!(
            "a volume {name} exists already (strata volume list)"
        )));
    }
    let tmp = dir.with_file_name(format!(".{name}.import"));
    if tmp.exists() {
        // Held while another import of the name runs.
        drop(
            Volume::lock(&tmp)
                .map_err(|e| e.context(format!("an import of {name} is under way")))?,
        );
        std::fs::remove_dir_all(&tmp).map_err(VolumeError::io(format!(
            "removing a stopped import ({})",
            tmp.display()
        )))?;
    }
    Volume::create(&tmp, cfg)?;
    let filled = fill(&tmp, key, src, progress).and_then(|i| {
        std::fs::rename(&tmp, dir).map_err(VolumeError::io(format!(
            "renaming {} to {}",
            tmp.display(),
            dir.display()
        )))?;
        Ok(i)
    });
    if filled.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    filled
}

/// Copies `src` into the (new, empty) volume in `dir` and closes it.
pub fn fill(
    dir: &Path,
    key: Option<&VolumeKey>,
    mut src: Source,
    progress: Progress<'_>,
) -> Result<Imported> {
    let vol = Volume::open_keyed(dir, key).map_err(|e| e.context("opening the new volume"))?;
    let size = vol.size();
    let total = src.size.unwrap_or(0);
    progress(0, total);
    let mut buf = vec![0u8; CHUNK];
    let (mut at, mut written, mut read) = (0u64, 0u64, 0u64);
    let copied = (|| -> Result<()> {
        if let Some(s) = src.size.filter(|&s| s > size) {
            return Err(VolumeError::Invalid(format!(
                "{} ({s} bytes) is larger than the volume ({size} bytes): give a larger --size",
                src.name
            )));
        }
        loop {
            at = src.next_data(at).map_err(VolumeError::io(format!(
                "reading {} at byte {at}",
                src.name
            )))?;
            progress(at, total);
            if src.size.is_some_and(|s| at >= s) {
                return Ok(());
            }
            let n = src.read_at(at, &mut buf).map_err(VolumeError::io(format!(
                "reading {} at byte {at}",
                src.name
            )))?;
            if n == 0 {
                return Ok(());
            }
            read += n as u64;
            if at + n as u64 > size {
                return Err(VolumeError::Invalid(format!(
                    "{} is larger than the volume ({size} bytes): give a larger --size",
                    src.name
                )));
            }
            // (Short only at the end: the last block is padded with zeros.)
            let whole = n.div_ceil(BLOCK) * BLOCK;
            buf[n..whole].fill(0);
            for (i, j) in data_runs(&buf[..whole]) {
                vol.write_at(at + (i * BLOCK) as u64, &buf[i * BLOCK..j * BLOCK], false)
                    .map_err(VolumeError::io(format!("writing the volume at byte {at}")))?;
                written += ((j - i) * BLOCK) as u64;
            }
            at += n as u64;
            progress(at, total);
            if n < CHUNK {
                return Ok(());
            }
        }
    })();
    // Destaged and synced (or, after an error, closed all the same).
    let closed = vol.close().map_err(VolumeError::io("closing the volume"));
    copied?;
    closed?;
    Ok(Imported {
        name: src.name,
        size: at,
        read,
        written,
    })
}

/// Fills `buf` unless the reader ends first; returns the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The runs `i..j` of blocks of `buf` that are not all zeros.
fn data_runs(buf: &[u8]) -> Vec<(usize, usize)> {
    let zero: Vec<bool> = buf
        .chunks(BLOCK)
        .map(|b| b.iter().all(|&x| x == 0))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < zero.len() {
        if zero[i] {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < zero.len() && !zero[j] {
            j += 1;
        }
        out.push((i, j));
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_data_skip_zero_blocks() {
        let mut b = vec![0u8; 6 * BLOCK];
        b[BLOCK + 5] = 1;
        b[2 * BLOCK] = 1;
        b[5 * BLOCK + BLOCK - 1] = 1;
        assert_eq!(data_runs(&b), vec![(1, 3), (5, 6)]);
        assert!(data_runs(&vec![0u8; 2 * BLOCK]).is_empty());
    }
}
