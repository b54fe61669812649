//! `strata-bench limits`: what this machine allows, so results can be
//! quoted as a fraction of it — FastCDC chunking, BLAKE3 hashing and zstd
//! (default level) compression on one core, and sequential disk write and
//! read of the work directory's filesystem.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;
use strata_core::chunker::{ChunkStream, ChunkerParams};

#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// How much data each measurement uses.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Sample for FastCDC and BLAKE3.
    pub sample_mib: usize,
    /// Part of the sample compressed with zstd.
    pub zstd_mib: usize,
    /// Disk test file (written with fsync, read back after a cache drop).
    pub disk_mib: usize,
}

impl Sizes {
    /// `strata-bench limits`: 256 MiB sample, 64 MiB zstd, `disk_mib` disk.
    pub fn full(disk_mib: usize) -> Sizes {
        Sizes {
            sample_mib: 256,
            zstd_mib: 64,
            disk_mib,
        }
    }

    /// The pass at the start of `run`: 128 MiB sample, 32 MiB zstd and the
    /// same 1 GiB disk file as `limits` (smaller files flatter the disk
    /// through its write cache); about 4 s on a 2-core VM.
    pub fn quick() -> Sizes {
        Sizes {
            sample_mib: 128,
            zstd_mib: 32,
            disk_mib: 1024,
        }
    }
}

pub fn measure(work: &Path, disk_mib: usize) -> Result<Limits> {
    measure_sized(work, Sizes::full(disk_mib))
}

pub fn measure_sized(work: &Path, sizes: Sizes) -> Result<Limits> {
    let sample_mib = sizes.sample_mib.max(sizes.zstd_mib).max(1);
    let zstd_mib = sizes.zstd_mib.max(1);
    let disk_mib = sizes.disk_mib.max(8);
    let data = sample(sample_mib << 20);
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
    for r in data[..zstd_mib << 20].chunks(128 << 10) {
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
    let disk_mib = disk_mib / 8 * 8;
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
        zstd3_mb_s: (zstd_mib << 20) as f64 / 1e6 / zsecs,
        zstd3_ratio: (zstd_mib << 20) as f64 / out as f64,
        disk_write_mb_s: write,
        disk_read_mb_s: read,
        disk_read_cache_dropped: dropped,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    })
}
