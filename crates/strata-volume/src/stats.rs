//! What `strata volume stats` reports: counters, the histogram of
//! duplicate sequence lengths, the read fragmentation profile (§5.4:
//! physical runs per read) and latency percentiles (§5.5).

use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::Duration;

/// Counts by small value: `counts[v]` for v < len-1, the last bucket
/// holds everything at least len-1.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Histogram {
    pub counts: Vec<u64>,
}

impl Histogram {
    pub fn with_buckets(n: usize) -> Histogram {
        Histogram { counts: vec![0; n] }
    }

    pub fn add(&mut self, v: usize, n: u64) {
        if self.counts.is_empty() {
            return;
        }
        let i = v.min(self.counts.len() - 1);
        self.counts[i] += n;
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Cumulative fractions: `cdf()[v]` = share of samples ≤ v.
    pub fn cdf(&self) -> Vec<f64> {
        let t = self.total().max(1) as f64;
        let mut acc = 0u64;
        self.counts
            .iter()
            .map(|c| {
                acc += c;
                acc as f64 / t
            })
            .collect()
    }
}

/// Latencies in buckets a quarter of a power of two wide (≤ 19 % error),
/// from 1 µs to ~1 h.
#[derive(Default)]
pub struct Latency {
    buckets: Mutex<Vec<u64>>,
}

const LAT_BUCKETS: usize = 4 * 32;

fn bucket_of(us: u64) -> usize {
    if us <= 1 {
        return 0;
    }
    let l = 63 - us.leading_zeros() as usize;
    // Two bits below the top one pick the quarter.
    let frac = if l >= 2 {
        ((us >> (l - 2)) & 3) as usize
    } else {
        ((us << (2 - l)) & 3) as usize
    };
    (l * 4 + frac).min(LAT_BUCKETS - 1)
}

fn bucket_value(b: usize) -> f64 {
    let (l, frac) = (b / 4, b % 4);
    (1u64 << l) as f64 * (1.0 + frac as f64 / 4.0 + 0.125)
}

impl Latency {
    pub fn record(&self, d: Duration) {
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_empty() {
            b.resize(LAT_BUCKETS, 0);
        }
        b[bucket_of(d.as_micros() as u64)] += 1;
    }

    /// The p-th percentile (0..=100) in microseconds, `None` without
    /// samples.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        let b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let total: u64 = b.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, c) in b.iter().enumerate() {
            acc += c;
            if acc >= want {
                return Some(bucket_value(i));
            }
        }
        None
    }

    pub fn count(&self) -> u64 {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .sum()
    }
}

/// Counters kept across restarts (`stats.json` beside the volume).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Persistent {
    /// Non-zero blocks destaged (what clients wrote, after the buffer
    /// absorbed overwrites).
    pub logical_blocks_written: u64,
    /// Of those, blocks that became references to existing blocks.
    pub deduplicated_blocks: u64,
    /// Blocks written to new disk blocks.
    pub physical_blocks_written: u64,
    /// Lengths of the duplicate sequences deduplicated (last bucket: ≥ 64).
    pub sequence_lengths: Histogram,
    /// Duplicate blocks found in the cache but left to short runs.
    pub duplicates_below_threshold: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_a_bucket() {
        let l = Latency::default();
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        let p50 = l.percentile(50.0).unwrap();
        let p99 = l.percentile(99.0).unwrap();
        assert!((400.0..=640.0).contains(&p50), "{p50}");
        assert!((800.0..=1250.0).contains(&p99), "{p99}");
        assert!(Latency::default().percentile(50.0).is_none());
        let mut h = Histogram::with_buckets(4);
        h.add(1, 2);
        h.add(10, 2);
        assert_eq!(h.cdf(), vec![0.0, 0.5, 0.5, 1.0]);
    }
}
