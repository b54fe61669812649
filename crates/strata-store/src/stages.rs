//! Busy time and bytes per pipeline stage, per worker thread: what
//! `strata backup --json` reports as `stages`, so anyone can see which
//! stage bounds a run and whether a stage's work is spread over the
//! workers.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A stage of the backup pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Listing the tree and reading metadata (one thread).
    Walk,
    /// `read` calls on source files.
    Read,
    /// Content-defined chunk boundaries (serial within one stream).
    Chunk,
    /// BLAKE3 fingerprints of chunks.
    Hash,
    /// Index and previous-version lookups, segment cuts.
    Lookup,
    /// Packing new chunks into regions.
    Store,
    /// Compressing and sealing regions.
    Compress,
    /// Writing container bytes to the backend.
    Write,
    /// Making containers durable (fsync, rename, metadata objects).
    Sync,
    /// Index object, recipe and snapshot.
    Commit,
}

const STAGES: [Stage; 10] = [
    Stage::Walk,
    Stage::Read,
    Stage::Chunk,
    Stage::Hash,
    Stage::Lookup,
    Stage::Store,
    Stage::Compress,
    Stage::Write,
    Stage::Sync,
    Stage::Commit,
];

/// Counters of one thread (or of every thread outside the worker pool).
#[derive(Default)]
struct Slot {
    ns: [AtomicU64; 10],
    bytes: [AtomicU64; 10],
}

/// Busy nanoseconds and bytes per stage, per worker thread.
pub struct Stages {
    /// One slot per worker, then one for every other thread.
    slots: Vec<Slot>,
}

impl Default for Stages {
    fn default() -> Self {
        Stages::new(1)
    }
}

/// One stage's figures.
#[derive(Clone, Debug, Serialize)]
pub struct StageReport {
    pub stage: Stage,
    /// Busy seconds summed over threads.
    pub busy_seconds: f64,
    pub bytes: u64,
    /// Busy seconds per worker thread (then one entry for the other
    /// threads: walk, sealing of leftovers, the writer).
    pub threads: Vec<f64>,
    /// Busy seconds over the run's wall time: above 1 the stage ran on
    /// several threads at once; a stage that is serial by nature and near
    /// 1 bounds the run.
    pub busy_of_wall: f64,
}

impl Stages {
    pub fn new(workers: usize) -> Self {
        Stages {
            slots: (0..workers.max(1) + 1).map(|_| Slot::default()).collect(),
        }
    }

    fn slot(&self) -> &Slot {
        let last = self.slots.len() - 1;
        let i = rayon::current_thread_index().map_or(last, |i| i.min(last));
        &self.slots[i]
    }

    /// Adds busy time and bytes to a stage, on the calling thread's slot.
    pub fn add(&self, stage: Stage, started: Instant, bytes: u64) {
        let s = self.slot();
        let i = stage as usize;
        s.ns[i].fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        s.bytes[i].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Adds `ns` nanoseconds of busy time and bytes to a stage.
    pub fn add_ns(&self, stage: Stage, ns: u64, bytes: u64) {
        let s = self.slot();
        s.ns[stage as usize].fetch_add(ns, Ordering::Relaxed);
        s.bytes[stage as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Runs `f` as busy time of `stage`.
    pub fn time<T>(&self, stage: Stage, bytes: u64, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.add(stage, t, bytes);
        r
    }

    /// Every stage with some work, against `wall_seconds`.
    pub fn report(&self, wall_seconds: f64) -> Vec<StageReport> {
        STAGES
            .iter()
            .filter_map(|&stage| {
                let i = stage as usize;
                let threads: Vec<f64> = self
                    .slots
                    .iter()
                    .map(|s| s.ns[i].load(Ordering::Relaxed) as f64 / 1e9)
                    .collect();
                let busy: f64 = threads.iter().sum();
                let bytes = self
                    .slots
                    .iter()
                    .map(|s| s.bytes[i].load(Ordering::Relaxed))
                    .sum();
                (busy > 0.0 || bytes > 0).then(|| StageReport {
                    stage,
                    busy_seconds: busy,
                    bytes,
                    threads,
                    busy_of_wall: busy / wall_seconds.max(1e-9),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_add_up_per_thread() {
        let s = Stages::new(2);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|_| {
                    s.time(Stage::Hash, 10, || {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    })
                });
            }
        });
        s.time(Stage::Walk, 0, || ());
        let r = s.report(0.02);
        let hash = r.iter().find(|x| x.stage == Stage::Hash).unwrap();
        assert_eq!(hash.bytes, 20);
        assert_eq!(hash.threads.len(), 3);
        assert!(hash.busy_seconds >= 0.04, "{hash:?}");
        assert!(hash.busy_of_wall >= 2.0, "{hash:?}");
        assert_eq!(hash.threads[2], 0.0, "only pool threads hashed");
        assert!(r.iter().all(|x| x.stage != Stage::Compress));
    }
}
