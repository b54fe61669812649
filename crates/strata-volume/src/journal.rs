//! The write-ahead journal (the NVRAM of iDedup's write path): every
//! acknowledged write is a record here before it is answered; `sync`
//! makes them durable (FLUSH, FUA). A journal file covers the writes of
//! one destage batch: when a batch starts, writes go to the next file,
//! and the batch's file is deleted once its blocks are on disk. Opening a
//! volume replays every journal file left, in order; a torn record at the
//! end (a crash mid-append) ends the replay of that file.
//!
//! Record: magic `JRN2`, kind (1 write, 2 zeros, 3 placed), first block
//! (u64), block count (u32), CRC-32C of the data (u32), CRC-32C of the
//! header before it (u32), then the data (writes: count × block size;
//! placed: the disk block the data was written to (u64) and the CRC-32C
//! of each of its blocks (u32 each) — a first write of a volume without
//! dedup goes to its new disk blocks at once, and only where it went is
//! journaled). The
//! checksums find a torn or unwritten tail (the kernel's own journal uses
//! CRC-32C for the same), at a fraction of a cryptographic hash's cost on
//! every byte written. Records of version 1 (`JRN1`: a 16-byte BLAKE3 of
//! header and data in place of the two CRCs) are still replayed.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC_V1: &[u8; 4] = b"JRN1";
const HEADER_V1: usize = 4 + 1 + 8 + 4 + 16;
const MAGIC: &[u8; 4] = b"JRN2";
/// Bytes of a record's header.
pub const HEADER: usize = 4 + 1 + 8 + 4 + 4 + 4;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Whole blocks from `block`.
    Write { block: u64, data: Vec<u8> },
    /// `count` blocks from `block` read back as zeros (TRIM, WRITE_ZEROES).
    Zero { block: u64, count: u32 },
    /// Blocks from `block` were written to disk blocks `dbn..`, block `i`
    /// with CRC-32C `crcs[i]` (a replay takes a block only if its disk
    /// block still has it: an unflushed write may not have reached the
    /// disk).
    Placed {
        block: u64,
        dbn: u64,
        crcs: Vec<u32>,
    },
}

/// The bytes of a placed record.
pub fn placed(block: u64, dbn: u64, crcs: &[u32]) -> Vec<u8> {
    let mut d = Vec::with_capacity(8 + 4 * crcs.len());
    d.extend_from_slice(&dbn.to_le_bytes());
    for c in crcs {
        d.extend_from_slice(&c.to_le_bytes());
    }
    let mut out = header(3, block, crcs.len() as u32, &d).to_vec();
    out.extend_from_slice(&d);
    out
}

fn digest_v1(kind: u8, block: u64, count: u32, data: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    h.update(&block.to_le_bytes());
    h.update(&count.to_le_bytes());
    h.update(data);
    let mut d = [0u8; 16];
    d.copy_from_slice(&h.finalize().as_bytes()[..16]);
    d
}

/// The header of a record over `data`.
pub fn header(kind: u8, block: u64, count: u32, data: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(MAGIC);
    h[4] = kind;
    h[5..13].copy_from_slice(&block.to_le_bytes());
    h[13..17].copy_from_slice(&count.to_le_bytes());
    h[17..21].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
    let own = crc32c::crc32c(&h[..21]);
    h[21..25].copy_from_slice(&own.to_le_bytes());
    h
}

/// The header of a write record of whole blocks.
pub fn write_header(block: u64, data: &[u8], block_size: usize) -> [u8; HEADER] {
    header(1, block, (data.len() / block_size) as u32, data)
}

/// Encodes one record (header and data) into `out`.
pub fn encode(rec: &Record, block_size: usize, out: &mut Vec<u8>) {
    match rec {
        Record::Write { block, data } => encode_write(*block, data, block_size, out),
        Record::Zero { block, count } => out.extend_from_slice(&header(2, *block, *count, &[])),
        Record::Placed { block, dbn, crcs } => out.extend_from_slice(&placed(*block, *dbn, crcs)),
    }
}

/// Encodes a write record of whole blocks from borrowed data.
pub fn encode_write(block: u64, data: &[u8], block_size: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&write_header(block, data, block_size));
    out.extend_from_slice(data);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

/// Decodes the records of a journal file's bytes; stops at the first
/// record that is torn or does not check out.
pub fn decode(b: &[u8], block_size: usize) -> Vec<Record> {
    decode_prefix(b, block_size).0
}

/// [`decode`], and the bytes of `b` the records take (the rest is a torn
/// or damaged record and whatever follows it).
pub fn decode_prefix(b: &[u8], block_size: usize) -> (Vec<Record>, usize) {
    let whole = b.len();
    let mut b = b;
    let mut out = Vec::new();
    loop {
        let v2 = b.len() >= HEADER && &b[..4] == MAGIC;
        let v1 = b.len() >= HEADER_V1 && &b[..4] == MAGIC_V1;
        if !v1 && !v2 {
            break;
        }
        if v2 && crc32c::crc32c(&b[..21]) != u32_at(b, 21) {
            break;
        }
        let kind = b[4];
        let block = u64::from_le_bytes(b[5..13].try_into().unwrap_or_default());
        let count = u32_at(b, 13);
        let dlen = match kind {
            1 => count as usize * block_size,
            2 => 0,
            3 if v2 => 8 + 4 * count as usize,
            _ => break,
        };
        let head = if v2 { HEADER } else { HEADER_V1 };
        let Some(data) = b.get(head..head + dlen) else {
            break;
        };
        let ok = if v2 {
            crc32c::crc32c(data) == u32_at(b, 17)
        } else {
            b[17..33] == digest_v1(kind, block, count, data)
        };
        if !ok {
            break;
        }
        out.push(match kind {
            1 => Record::Write {
                block,
                data: data.to_vec(),
            },
            2 => Record::Zero { block, count },
            _ => Record::Placed {
                block,
                dbn: u64::from_le_bytes(data[..8].try_into().unwrap_or_default()),
                crcs: (0..count as usize)
                    .map(|i| u32_at(data, 8 + 4 * i))
                    .collect(),
            },
        });
        b = &b[head + dlen..];
    }
    (out, whole - b.len())
}

/// Whether a record whose header checks out starts anywhere in `b` (after
/// a damaged one: records a replay would not reach).
pub fn any_record_in(b: &[u8]) -> bool {
    (0..b.len().saturating_sub(HEADER - 1)).any(|i| {
        let r = &b[i..];
        &r[..4] == MAGIC && crc32c::crc32c(&r[..21]) == u32_at(r, 21)
    })
}

/// One open journal file, appended to.
pub struct Journal {
    file: File,
    pub path: PathBuf,
    pub generation: u64,
    pub bytes: u64,
    /// A failed write could not be cut off: no more appends.
    broken: bool,
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
            broken: false,
        })
    }

    /// Appends encoded records (not yet durable).
    pub fn append(&mut self, encoded: &[u8]) -> io::Result<()> {
        self.append_record(encoded, &[])
    }

    /// Appends a record given as its header and its data, without
    /// copying them together (not yet durable).
    pub fn append_record(&mut self, head: &[u8], data: &[u8]) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "the journal could not be repaired after a failed write",
            ));
        }
        let mut bufs = [IoSlice::new(head), IoSlice::new(data)];
        let mut bufs = &mut bufs[..];
        let total = (head.len() + data.len()) as u64;
        while !bufs.is_empty() {
            match self.file.write_vectored(bufs) {
                Ok(0) => return self.undo(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.undo(e),
            }
        }
        self.bytes += total;
        Ok(())
    }

    /// Cuts a record that was written in part (a full disk): the next
    /// record must follow the last whole one, or replay would stop at the
    /// torn one and lose every record after it.
    fn undo(&mut self, e: io::Error) -> io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let cut = self
            .file
            .set_len(self.bytes)
            .and_then(|_| self.file.seek(SeekFrom::Start(self.bytes)));
        if cut.is_err() {
            self.broken = true;
        }
        Err(e)
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
            Record::Placed {
                block: 40,
                dbn: 1 << 33,
                crcs: vec![1, 0xdead_beef, 3],
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
        // Cut anywhere inside the last record: the others survive.
        let last_start = b.len() - (HEADER + 4096);
        for cut in [last_start + 1, last_start + HEADER, b.len() - 1] {
            assert_eq!(decode(&b[..cut], 4096), recs[..3].to_vec(), "cut at {cut}");
        }
        // A placed record cut inside its CRCs ends the replay there.
        let placed_end = last_start;
        assert_eq!(decode(&b[..placed_end - 2], 4096), recs[..2].to_vec());
        // A flipped data byte ends the replay there.
        let mut bad = b.clone();
        bad[HEADER + 10] ^= 1;
        assert!(decode(&bad, 4096).is_empty());
        // Garbage decodes to nothing.
        assert!(decode(&[0xffu8; 100], 4096).is_empty());
        // A flipped header byte too.
        let mut bad = b.clone();
        bad[6] ^= 1;
        assert!(decode(&bad, 4096).is_empty());
    }

    /// Journal files of version 1 (BLAKE3 records), left by an older
    /// build's crash, are still replayed.
    #[test]
    fn version_1_records_are_replayed() {
        let data = vec![9u8; 8192];
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC_V1);
        b.push(1);
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&digest_v1(1, 3, 2, &data));
        b.extend_from_slice(&data);
        let mut z = Vec::new();
        encode(&Record::Zero { block: 0, count: 1 }, 4096, &mut z);
        b.extend_from_slice(&z);
        assert_eq!(
            decode(&b, 4096),
            vec![
                Record::Write { block: 3, data },
                Record::Zero { block: 0, count: 1 }
            ]
        );
    }

    #[test]
    fn a_record_appended_in_two_parts_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let mut j = Journal::create(d.path(), 1).unwrap();
        let data = vec![5u8; 4096 * 3];
        j.append_record(&write_header(11, &data, 4096), &data)
            .unwrap();
        assert_eq!(
            read(&j.path, 4096).unwrap(),
            vec![Record::Write { block: 11, data }]
        );
    }
}
