//! Fixed-size records in host-local scratch files: buffered appends, a
//! streaming reader, and an external sort whose memory is bounded (runs
//! of at most `budget` bytes, merged a small buffer each).

use crate::error::{Result, StoreError};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

fn io(op: &'static str, p: &Path, e: std::io::Error) -> StoreError {
    StoreError::io(op, p.display().to_string(), e)
}

/// Appends records of `size` bytes to a file through a buffer of
/// `buffer` bytes (the file is created, or appended to).
pub struct RecordWriter {
    path: PathBuf,
    out: BufWriter<File>,
    pub written: u64,
}

impl RecordWriter {
    pub fn append(path: &Path, buffer: usize) -> Result<Self> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(|e| io("create", d, e))?;
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| io("open", path, e))?;
        Ok(RecordWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(buffer.max(4096), f),
            written: 0,
        })
    }

    pub fn create(path: &Path, buffer: usize) -> Result<Self> {
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| io("remove", path, e))?;
        }
        Self::append(path, buffer)
    }

    pub fn put(&mut self, rec: &[u8]) -> Result<()> {
        self.written += rec.len() as u64;
        self.out
            .write_all(rec)
            .map_err(|e| io("write", &self.path, e))
    }

    /// Flushes and fsyncs (a stage's outputs are durable before the stage
    /// reports done, so a rerun never reads half a file).
    pub fn finish(self) -> Result<u64> {
        let f = self
            .out
            .into_inner()
            .map_err(|e| io("write", &self.path, e.into_error()))?;
        f.sync_data().map_err(|e| io("sync", &self.path, e))?;
        Ok(self.written)
    }
}

/// Reads records of `size` bytes in order; a missing file reads empty.
pub struct RecordReader {
    path: PathBuf,
    inner: Option<BufReader<File>>,
    size: usize,
}

impl RecordReader {
    pub fn open(path: &Path, size: usize, buffer: usize) -> Result<Self> {
        let inner = match File::open(path) {
            Ok(f) => {
                let len = f.metadata().map_err(|e| io("stat", path, e))?.len();
                if len % size as u64 != 0 {
                    return Err(StoreError::Invalid(format!(
                        "{}: {len} bytes is not a whole number of {size}-byte records (a damaged scratch file: remove the fleet's work directory of this host)",
                        path.display()
                    )));
                }
                Some(BufReader::with_capacity(buffer.max(4096), f))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("open", path, e)),
        };
        Ok(RecordReader {
            path: path.to_path_buf(),
            inner,
            size,
        })
    }

    /// As [`Self::open`], but a missing file is an error (an exchange's
    /// received file always exists, empty or not).
    pub fn open_required(path: &Path, size: usize, buffer: usize) -> Result<Self> {
        if !path.exists() {
            return Err(StoreError::Invalid(format!(
                "{} is missing: the exchange before this stage did not finish (run the job again)",
                path.display()
            )));
        }
        Self::open(path, size, buffer)
    }

    /// The next record into `buf` (`size` bytes); false at the end.
    pub fn next_into(&mut self, buf: &mut [u8]) -> Result<bool> {
        let Some(r) = &mut self.inner else {
            return Ok(false);
        };
        match r.read_exact(&mut buf[..self.size]) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(io("read", &self.path, e)),
        }
    }
}

/// Sorts the records of `input` (by their first `key` bytes, then the
/// rest) into `output`, holding at most `budget` bytes of records at
/// once; runs go to `tmp` and are merged.
pub fn external_sort(
    input: &Path,
    output: &Path,
    size: usize,
    budget: usize,
    tmp: &Path,
) -> Result<u64> {
    let per_run = (budget / size).max(1024);
    let mut reader = RecordReader::open(input, size, 128 << 10)?;
    let mut runs = Vec::new();
    let mut buf = vec![0u8; size];
    let mut total = 0u64;
    loop {
        let mut run: Vec<u8> = Vec::with_capacity(per_run.min(1 << 16) * size);
        let mut n = 0;
        while n < per_run && reader.next_into(&mut buf)? {
            run.extend_from_slice(&buf);
            n += 1;
        }
        if n == 0 {
            break;
        }
        total += n as u64;
        let mut recs: Vec<&[u8]> = run.chunks_exact(size).collect();
        recs.sort_unstable();
        let path = tmp.join(format!("run-{}", runs.len()));
        let mut w = RecordWriter::create(&path, 256 << 10)?;
        for r in recs {
            w.put(r)?;
        }
        w.finish()?;
        runs.push(path);
        if n < per_run {
            break;
        }
    }
    match runs.len() {
        0 => {
            RecordWriter::create(output, 4096)?.finish()?;
        }
        1 => std::fs::rename(&runs[0], output).map_err(|e| io("rename", output, e))?,
        _ => merge_runs(&runs, output, size, budget)?,
    }
    for r in &runs {
        let _ = std::fs::remove_file(r);
    }
    Ok(total)
}

struct Head {
    rec: Vec<u8>,
    run: usize,
}

impl PartialEq for Head {
    fn eq(&self, o: &Self) -> bool {
        self.rec == o.rec
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Head {
    // A min-heap on the record bytes.
    fn cmp(&self, o: &Self) -> Ordering {
        o.rec.cmp(&self.rec)
    }
}

fn merge_runs(runs: &[PathBuf], output: &Path, size: usize, budget: usize) -> Result<()> {
    let each = (budget / (runs.len() + 1)).clamp(4096, 1 << 20);
    let mut readers = runs
        .iter()
        .map(|r| RecordReader::open(r, size, each))
        .collect::<Result<Vec<_>>>()?;
    let mut heap = BinaryHeap::new();
    for (i, r) in readers.iter_mut().enumerate() {
        let mut rec = vec![0u8; size];
        if r.next_into(&mut rec)? {
            heap.push(Head { rec, run: i });
        }
    }
    let mut w = RecordWriter::create(output, each)?;
    while let Some(mut h) = heap.pop() {
        w.put(&h.rec)?;
        if readers[h.run].next_into(&mut h.rec)? {
            heap.push(h);
        }
    }
    w.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_sort_sorts_across_runs() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("in");
        let mut w = RecordWriter::create(&input, 4096).unwrap();
        let mut want = Vec::new();
        let mut x: u64 = 12345;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let rec = x.to_be_bytes();
            want.push(rec);
            w.put(&rec).unwrap();
        }
        w.finish().unwrap();
        want.sort();
        let out = d.path().join("out");
        // 1 KiB budget: runs of 1024 records (the floor), ten runs merged.
        let n = external_sort(&input, &out, 8, 1024, d.path()).unwrap();
        assert_eq!(n, 10_000);
        let got = std::fs::read(&out).unwrap();
        let got: Vec<[u8; 8]> = got.chunks(8).map(|c| c.try_into().unwrap()).collect();
        assert_eq!(got, want);
        // An empty or missing input sorts to an empty file.
        let n = external_sort(&d.path().join("none"), &out, 8, 1024, d.path()).unwrap();
        assert_eq!(n, 0);
        assert_eq!(std::fs::read(&out).unwrap().len(), 0);
    }
}
