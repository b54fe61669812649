//! Fingerprints: BLAKE3-256 of a chunk's plaintext (docs/design.md "Vocabulary").
//!
//! Encrypted repositories key the hash with a key derived from the master key
//! so that fingerprints stored next to ciphertext reveal nothing about
//! content an attacker could guess.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A 32-byte content fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub const ZERO: Fingerprint = Fingerprint([0; 32]);

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 8 bytes as an integer: uniformly distributed, used for
    /// segment boundaries and partitioning.
    pub fn prefix_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fp({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Computes fingerprints: plain BLAKE3 or BLAKE3 keyed with the
/// repository's fingerprint key.
#[derive(Clone)]
pub struct Hasher {
    key: Option<[u8; 32]>,
}

impl Hasher {
    pub fn plain() -> Self {
        Hasher { key: None }
    }

    pub fn keyed(key: [u8; 32]) -> Self {
        Hasher { key: Some(key) }
    }

    pub fn hash(&self, data: &[u8]) -> Fingerprint {
        match &self.key {
            Some(k) => Fingerprint(*blake3::keyed_hash(k, data).as_bytes()),
            None => Fingerprint(*blake3::hash(data).as_bytes()),
        }
    }

    /// Fingerprint of a segment: the hash of its chunks' fingerprints in
    /// order, so a segment is identified without rereading its data.
    pub fn hash_fingerprints<'a>(
        &self,
        fps: impl IntoIterator<Item = &'a Fingerprint>,
    ) -> Fingerprint {
        let mut h = match &self.key {
            Some(k) => blake3::Hasher::new_keyed(k),
            None => blake3::Hasher::new(),
        };
        for fp in fps {
            h.update(&fp.0);
        }
        Fingerprint(*h.finalize().as_bytes())
    }
}

/// True when every byte of `data` is zero. Such chunks are never stored:
/// restore leaves a hole (docs/design.md "Chunking").
pub fn is_zero(data: &[u8]) -> bool {
    // Compare in 16-byte strides; the compiler vectorises this well.
    // SAFETY: every bit pattern is a valid u128, and align_to only hands out
    // the correctly aligned middle part.
    let (prefix, body, suffix) = unsafe { data.align_to::<u128>() };
    prefix.iter().all(|&b| b == 0) && body.iter().all(|&w| w == 0) && suffix.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_differs_from_plain() {
        let d = b"hello world";
        assert_ne!(Hasher::plain().hash(d), Hasher::keyed([7; 32]).hash(d));
        assert_eq!(Hasher::plain().hash(d), Hasher::plain().hash(d));
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0u8; 4096]));
        assert!(is_zero(&[]));
        let mut v = vec![0u8; 4097];
        v[4096] = 1;
        assert!(!is_zero(&v));
        v[4096] = 0;
        v[3] = 1;
        assert!(!is_zero(&v[1..]));
    }
}
