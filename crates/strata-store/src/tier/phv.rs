//! The perfect-hash vector (Data Domain Cloud Tier §3.1): a minimal
//! perfect hash function over a fixed set of fingerprints (`boomphf`) and
//! one bit per fingerprint — about 3 bits per fingerprint in all, where an
//! exact set would take 32 bytes or more. It answers only for fingerprints
//! of the set it was built over: any other key lands on some slot.

use boomphf::Mphf;
use strata_core::Fingerprint;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Phv {
    mphf: Mphf<Fingerprint>,
    bits: Vec<u64>,
    len: usize,
}

impl Phv {
    /// Builds the function over `keys` (duplicates removed here).
    pub fn build(mut keys: Vec<Fingerprint>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        let len = keys.len();
        let mphf = Mphf::new(1.7, &keys);
        Phv {
            mphf,
            bits: vec![0; len.div_ceil(64)],
            len,
        }
    }

    fn slot(&self, fp: &Fingerprint) -> Option<usize> {
        self.mphf
            .try_hash(fp)
            .map(|h| h as usize)
            .filter(|&h| h < self.len)
    }

    pub fn set(&mut self, fp: &Fingerprint) {
        if let Some(i) = self.slot(fp) {
            self.bits[i / 64] |= 1 << (i % 64);
        }
    }

    pub fn clear(&mut self, fp: &Fingerprint) {
        if let Some(i) = self.slot(fp) {
            self.bits[i / 64] &= !(1 << (i % 64));
        }
    }

    pub fn get(&self, fp: &Fingerprint) -> bool {
        self.slot(fp)
            .is_some_and(|i| self.bits[i / 64] & (1 << (i % 64)) != 0)
    }

    /// Fingerprints in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bits set.
    pub fn count(&self) -> u64 {
        self.bits.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Bytes of memory the function and the bits take (roughly).
    pub fn ram_bytes(&self) -> u64 {
        // boomphf: about 1.7 × 1.44 bits a key at γ = 1.7, plus ranks.
        (self.len as f64 * 3.0 / 8.0) as u64 + self.bits.len() as u64 * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fingerprint {
        Fingerprint(*blake3::hash(&i.to_le_bytes()).as_bytes())
    }

    #[test]
    fn marks_and_unmarks_each_key_alone() {
        let keys: Vec<Fingerprint> = (0..10_000).map(fp).collect();
        let mut v = Phv::build(keys.clone());
        assert_eq!(v.len(), 10_000);
        for k in keys.iter().step_by(3) {
            v.set(k);
        }
        assert_eq!(v.count(), 3334);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(v.get(k), i % 3 == 0, "{i}");
        }
        for k in keys.iter().step_by(6) {
            v.clear(k);
        }
        assert_eq!(v.count(), 3334 - 1667);
        assert!(v.ram_bytes() < 10_000);
    }
}
