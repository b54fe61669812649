//! The write-ahead journal (the NVRAM of iDedup's write path): every
//! acknowledged write is a record here before it is answered; `sync`
//! makes them durable (FLUSH, FUA). A journal file covers the writes of
//! one destage batch: when a batch starts, writes go to the next file,
//! and the batch's file is deleted once its blocks are on disk. Opening a
//! volume replays every journal file left, in order; a torn record at the
//! end (a crash mid-append) ends the replay of that file.
//!
//! Record: magic `JRN1`, kind (1 write, 2 zeros), first block (u64),
//! block count (u32), a 16-byte BLAKE3 of the header and the data, then
//! the data (writes: count × block size).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"JRN1";
const HEADER: usize = 4 + 1 + 8 + 4 + 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Whole blocks from `block`.
    Write { block: u64, data: Vec<u8> },
    /// `count` blocks from `block` read back as zeros (TRIM, WRITE_ZEROES).
    Zero { block: u64, count: u32 },
}

fn digest(kind: u8, block: u64, count: u32, data: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    h.update(&block.to_le_bytes());
    h.update(&count.to_le_bytes());
    h.update(data);
    let mut d = [0u8; 16];
    d.copy_from_slice(&h.finalize().as_bytes()[..16]);
    d
}

/// Encodes one record (header and data) into `out`.
pub fn encode(rec: &Record, block_size: usize, out: &mut Vec<u8>) {
    match rec {
        Record::Write { block, data } => encode_write(*block, data, block_size, out),
        Record::Zero { block, count } => encode_raw(2, *block, *count, &[], out),
    }
}

/// Encodes a write record of whole blocks from borrowed data.
pub fn encode_write(block: u64, data: &[u8], block_size: usize, out: &mut Vec<u8>) {
    encode_raw(1, block, (data.len() / block_size) as u32, data, out)
}

fn encode_raw(kind: u8, block: u64, count: u32, data: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&digest(kind, block, count, data));
    out.extend_from_slice(data);
}

/// Decodes the records of a journal file's bytes; stops at the first
/// record that is torn or does not check out.
pub fn decode(mut b: &[u8], block_size: usize) -> Vec<Record> {
    let mut out = Vec::new();
    while b.len() >= HEADER && &b[..4] == MAGIC {
        let kind = b[4];
        let block = u64::from_le_bytes(b[5..13].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(b[13..17].try_into().unwrap_or_default());
        let sum: [u8; 16] = b[17..33].try_into().unwrap_or_default();
        let dlen = match kind {
            1 => count as usize * block_size,
            2 => 0,
            _ => break,
        };
        let Some(data) = b.get(HEADER..HEADER + dlen) else {
            break;
        };
        if digest(kind, block, count, data) != sum {
            break;
        }
        out.push(match kind {
            1 => Record::Write {
                block,
                data: data.to_vec(),
            },
            _ => Record::Zero { block, count },
        });
        b = &b[HEADER + dlen..];
    }
    out
}

/// One open journal file, appended to.
pub struct Journal {
    file: File,
    pub path: PathBuf,
    pub generation: u64,
    pub bytes: u64,
}

/// `journal.<generation>` in `dir`.
pub fn path_of(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal.{generation:012}"))
}

/// The journal files in `dir`, oldest first.
pub fn existing(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(g) = name
            .to_str()
            .and_then(|n| n.strip_prefix("journal."))
            .and_then(|g| g.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((g, e.path()));
    }
    out.sort();
    Ok(out)
}

/// Reads a journal file's records.
pub fn read(path: &Path, block_size: usize) -> io::Result<Vec<Record>> {
    let mut b = Vec::new();
    File::open(path)?.read_to_end(&mut b)?;
    Ok(decode(&b, block_size))
}

impl Journal {
    /// Creates (or truncates) journal `generation` in `dir`.
    pub fn create(dir: &Path, generation: u64) -> io::Result<Journal> {
        let path = path_of(dir, generation);
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)?;
        // The file's name must survive a crash too.
        File::open(dir)?.sync_all()?;
        Ok(Journal {
            file,
            path,
            generation,
            bytes: 0,
        })
    }

    /// Appends encoded records (not yet durable).
    pub fn append(&mut self, encoded: &[u8]) -> io::Result<()> {
        self.file.write_all(encoded)?;
        self.bytes += encoded.len() as u64;
        Ok(())
    }

    /// Makes everything appended durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_dropped() {
        let recs = vec![
            Record::Write {
                block: 7,
                data: vec![3u8; 8192],
            },
            Record::Zero {
                block: 1,
                count: 99,
            },
            Record::Write {
                block: 0,
                data: vec![1u8; 4096],
            },
        ];
        let mut b = Vec::new();
        for r in &recs {
            encode(r, 4096, &mut b);
        }
        assert_eq!(decode(&b, 4096), recs);
        // Cut anywhere inside the last record: the first two survive.
        let last_start = b.len() - (HEADER + 4096);
        for cut in [last_start + 1, last_start + HEADER, b.len() - 1] {
            assert_eq!(decode(&b[..cut], 4096), recs[..2].to_vec(), "cut at {cut}");
        }
        // A flipped data byte ends the replay there.
        let mut bad = b.clone();
        bad[HEADER + 10] ^= 1;
        assert!(decode(&bad, 4096).is_empty());
        // Garbage decodes to nothing.
        assert!(decode(&[0xffu8; 100], 4096).is_empty());
    }
}
