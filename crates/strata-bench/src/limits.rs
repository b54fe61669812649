//! `strata-bench limits`: what this machine allows, so results can be
//! quoted as a fraction of it — FastCDC chunking, BLAKE3 hashing and zstd
//! (default level) compression on one core, and sequential disk write and
//! read of the work directory's filesystem.

use anyhow::Result;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;
use strata_core::chunker::{ChunkStream, ChunkerParams};

#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    pub fastcdc_mb_s: f64,
    pub blake3_8k_mb_s: f64,
    pub zstd3_mb_s: f64,
    pub zstd3_ratio: f64,
    pub disk_write_mb_s: f64,
    pub disk_read_mb_s: f64,
    pub disk_read_cache_dropped: bool,
    pub cores: usize,
}

/// Mixed sample data, as the workloads generate it (about 2× with zstd -3).
fn sample(n: usize) -> Vec<u8> {
    crate::gen::content::ContentGen::new(1, crate::gen::content::Mix::TYPICAL).bytes(n)
}

pub fn measure(work: &Path, disk_mib: usize) -> Result<Limits> {
    let data = sample(256 << 20);
    let t = Instant::now();
    let mut s = ChunkStream::new(&data[..], ChunkerParams::cdc(8192));
    let mut n = 0usize;
    while let Some((_, c)) = s.next_chunk()? {
        n += c.len();
    }
    let fastcdc = n as f64 / 1e6 / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut acc = 0u8;
    for c in data.chunks(8192) {
        acc ^= blake3::hash(c).as_bytes()[0];
    }
    std::hint::black_box(acc);
    let blake = data.len() as f64 / 1e6 / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut out = 0usize;
    for r in data[..64 << 20].chunks(128 << 10) {
        out += zstd::bulk::compress(r, 3)?.len();
    }
    let zsecs = t.elapsed().as_secs_f64();

    std::fs::create_dir_all(work)?;
    let path = work.join("limits-disk.tmp");
    let block = sample(8 << 20);
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&path)?;
        for _ in 0..disk_mib / 8 {
            f.write_all(&block)?;
        }
        f.sync_all()?;
    }
    let write = (disk_mib as f64 * 1.048_576) / t.elapsed().as_secs_f64();
    let dropped = crate::measure::drop_caches();
    let t = Instant::now();
    {
        let mut f = std::fs::File::open(&path)?;
        let mut buf = vec![0u8; 8 << 20];
        while f.read(&mut buf)? > 0 {}
    }
    let read = (disk_mib as f64 * 1.048_576) / t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok(Limits {
        fastcdc_mb_s: fastcdc,
        blake3_8k_mb_s: blake,
        zstd3_mb_s: (64 << 20) as f64 / 1e6 / zsecs,
        zstd3_ratio: (64 << 20) as f64 / out as f64,
        disk_write_mb_s: write,
        disk_read_mb_s: read,
        disk_read_cache_dropped: dropped,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    })
}
