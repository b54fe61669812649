//! Encryption of a volume in an encrypted repository.
//!
//! A volume's blocks are encrypted as a disk encryption layer does it
//! (LUKS's default, IEEE 1619): XTS-AES-256, each 4 KiB block a sector
//! whose number is the tweak. It is length-preserving, so blocks stay
//! where the map says, reads and writes stay single `pread`s and
//! `pwrite`s, and writing a block over in place needs no per-block
//! metadata. Like a disk's, the blocks are not authenticated: XTS keeps
//! their content from a reader of the files, not from one who rewrites
//! them (who can put back an older block of the same place).
//!
//! Keys, all derived from the volume's key (which the repository derives
//! from its master key and the volume's random salt, so two volumes, or a
//! volume made again under the same name, never share one):
//! - the data file's XTS keys, tweak = the disk block number;
//! - the journal's XTS keys, tweak = the logical block number (a journal
//!   record holds whole blocks of the volume);
//! - the fingerprint key: dedup fingerprints are keyed BLAKE3, so the
//!   `fps` file does not let anyone confirm a guess of a block's content;
//! - a check value stored in `volume.json`: a wrong key is refused at
//!   open instead of reading garbage.
//!
//! What stays in plain: the block map and reference counts (which logical
//! blocks share a disk block: that two places hold the same 4 KiB), and
//! the sizes and counters in `volume.json` and `state.json`.

use crate::idedup::Fp;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::Aes256;
use serde::{Deserialize, Serialize};
use strata_core::BLOCK_SIZE as BLOCK;
use zeroize::Zeroize;

/// A volume's key (32 bytes), handed in by whoever opens the volume (the
/// CLI derives it from the repository's master key).
pub struct VolumeKey(pub [u8; 32]);

impl Drop for VolumeKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// How a volume is encrypted (in `volume.json`; absent: not encrypted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// `xts-aes-256`.
    pub cipher: String,
    /// Random, hex: the repository derives the volume's key from it.
    pub salt: String,
    /// BLAKE3 of the key under its own context, hex: tells a wrong key.
    pub check: String,
}

/// The only cipher there is.
pub const CIPHER: &str = "xts-aes-256";

impl Encryption {
    /// A new volume's encryption: `salt` from the caller (random), the
    /// check value of `key`.
    pub fn new(salt: [u8; 16], key: &VolumeKey) -> Encryption {
        Encryption {
            cipher: CIPHER.into(),
            salt: hex(&salt),
            check: hex(&check_value(key)),
        }
    }

    /// The salt's bytes (none if it is not hex).
    pub fn salt_bytes(&self) -> Option<Vec<u8>> {
        let s = self.salt.as_bytes();
        if !s.len().is_multiple_of(2) {
            return None;
        }
        s.chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
            .collect()
    }

    /// Whether `key` is this volume's.
    pub fn accepts(&self, key: &VolumeKey) -> bool {
        self.cipher == CIPHER && self.check == hex(&check_value(key))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn check_value(key: &VolumeKey) -> [u8; 32] {
    blake3::derive_key("strata 2026 volume key check v1", &key.0)
}

/// XTS-AES-256 (IEEE 1619) over sectors of one block each, without
/// ciphertext stealing (a block is a multiple of 16 bytes). Each sector's
/// 16-byte blocks go through AES [`BATCH`] at a time, so the cipher's
/// pipelined instructions work on several at once (the `xts-mode` crate,
/// which the tests check this against, takes them one by one: half the
/// speed of an unencrypted volume).
struct Xts {
    /// Encrypts the data.
    k1: Aes256,
    /// Encrypts the sector number into the first tweak.
    k2: Aes256,
}

/// 16-byte blocks per call of the cipher.
const BATCH: usize = 16;

/// The tweak of the next 16-byte block: times α in GF(2^128), the
/// little-endian convention of IEEE 1619.
fn times_alpha(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

impl Xts {
    fn new(key: &VolumeKey, context: &str) -> Xts {
        let mut k = [0u8; 64];
        let mut h = blake3::Hasher::new_derive_key(context);
        h.update(&key.0);
        h.finalize_xof().fill(&mut k);
        let x = Xts {
            k1: Aes256::new(GenericArray::from_slice(&k[..32])),
            k2: Aes256::new(GenericArray::from_slice(&k[32..])),
        };
        k.zeroize();
        x
    }

    /// One sector (`data`: a multiple of 16 × [`BATCH`] bytes) numbered
    /// `index`, in place.
    fn sector(&self, index: u128, data: &mut [u8], encrypt: bool) {
        let mut t = GenericArray::from(index.to_le_bytes());
        self.k2.encrypt_block(&mut t);
        let mut tweak = u128::from_le_bytes(t.into());
        for chunk in data.chunks_exact_mut(16 * BATCH) {
            let mut blocks = [GenericArray::from([0u8; 16]); BATCH];
            let mut tweaks = [0u128; BATCH];
            for (j, (b, t)) in blocks.iter_mut().zip(&mut tweaks).enumerate() {
                let mut p = [0u8; 16];
                p.copy_from_slice(&chunk[16 * j..16 * (j + 1)]);
                *t = tweak;
                *b = GenericArray::from((u128::from_le_bytes(p) ^ tweak).to_le_bytes());
                tweak = times_alpha(tweak);
            }
            match encrypt {
                true => self.k1.encrypt_blocks(&mut blocks),
                false => self.k1.decrypt_blocks(&mut blocks),
            }
            for (j, (b, t)) in blocks.iter().zip(&tweaks).enumerate() {
                let c = u128::from_le_bytes((*b).into()) ^ t;
                chunk[16 * j..16 * (j + 1)].copy_from_slice(&c.to_le_bytes());
            }
        }
    }
}

/// The cipher of a volume's data blocks alone: what its repository needs
/// to read the blocks the volume holds for it (`crate::holds`).
pub struct DataCipher(Xts);

impl DataCipher {
    pub fn new(key: &VolumeKey) -> DataCipher {
        DataCipher(Xts::new(key, "strata 2026 volume data xts v1"))
    }

    /// Decrypts whole blocks read from disk blocks `dbn..` in place (a
    /// block of zeros — a hole — stays zeros, as [`Crypt`] reads it).
    pub fn open(&self, dbn: u64, buf: &mut [u8]) {
        for (i, b) in buf.chunks_exact_mut(BLOCK).enumerate() {
            if b.iter().any(|&x| x != 0) {
                self.0.sector(dbn as u128 + i as u128, b, false);
            }
        }
    }
}

/// The ciphers of an open volume.
pub struct Crypt {
    data: Xts,
    journal: Xts,
    fp_key: [u8; 32],
}

impl Drop for Crypt {
    fn drop(&mut self) {
        self.fp_key.zeroize();
    }
}

impl Crypt {
    pub(crate) fn new(key: &VolumeKey) -> Crypt {
        Crypt {
            data: Xts::new(key, "strata 2026 volume data xts v1"),
            journal: Xts::new(key, "strata 2026 volume journal xts v1"),
            fp_key: blake3::derive_key("strata 2026 volume fingerprint v1", &key.0),
        }
    }

    /// Encrypts whole blocks that go to disk blocks `dbn..` in place.
    pub(crate) fn seal_data(&self, dbn: u64, buf: &mut [u8]) {
        area(&self.data, dbn, buf, true)
    }

    /// Decrypts whole blocks read from disk blocks `dbn..` in place. A
    /// block of zeros stays zeros: a hole (a freed block punched, which
    /// after a power loss a map entry of an unflushed write may name)
    /// reads as zeros, as in a volume that is not encrypted; no
    /// ciphertext is 4 KiB of zeros but by a 2^-32768 chance.
    pub(crate) fn open_data(&self, dbn: u64, buf: &mut [u8]) {
        for (i, b) in buf.chunks_exact_mut(BLOCK).enumerate() {
            if b.iter().any(|&x| x != 0) {
                self.data.sector(dbn as u128 + i as u128, b, false);
            }
        }
    }

    /// Encrypts a journal record's blocks of logical blocks `block..`.
    pub(crate) fn seal_journal(&self, block: u64, buf: &mut [u8]) {
        area(&self.journal, block, buf, true)
    }

    /// Decrypts a journal record's blocks of logical blocks `block..`.
    pub(crate) fn open_journal(&self, block: u64, buf: &mut [u8]) {
        area(&self.journal, block, buf, false)
    }

    /// A block's dedup fingerprint (keyed).
    pub(crate) fn fingerprint(&self, block: &[u8]) -> Fp {
        let h = blake3::keyed_hash(&self.fp_key, block);
        let mut f = [0u8; 16];
        f.copy_from_slice(&h.as_bytes()[..16]);
        f
    }
}

/// XTS over whole blocks of `buf`, block `i` the sector `first + i` (a
/// trailing partial block, which no caller passes, is left as it is).
fn area(x: &Xts, first: u64, buf: &mut [u8], encrypt: bool) {
    for (i, sector) in buf.chunks_exact_mut(BLOCK).enumerate() {
        x.sector(first as u128 + i as u128, sector, encrypt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> VolumeKey {
        VolumeKey([b; 32])
    }

    #[test]
    fn blocks_round_trip_and_depend_on_place_and_key() {
        let c = Crypt::new(&key(1));
        let plain: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8).collect();
        let mut a = plain.clone();
        c.seal_data(7, &mut a);
        assert_ne!(a, plain);
        // The same content at another disk block encrypts differently.
        let mut b = plain[BLOCK..2 * BLOCK].to_vec();
        c.seal_data(7, &mut b);
        assert_ne!(&a[BLOCK..2 * BLOCK], &b[..]);
        // Block by block or all at once: the same.
        let mut one = plain[BLOCK..2 * BLOCK].to_vec();
        c.seal_data(8, &mut one);
        assert_eq!(&a[BLOCK..2 * BLOCK], &one[..]);
        let mut back = a.clone();
        c.open_data(7, &mut back);
        assert_eq!(back, plain);
        // The journal's key is not the data's.
        let mut j = plain.clone();
        c.seal_journal(7, &mut j);
        assert_ne!(j, a);
        c.open_journal(7, &mut j);
        assert_eq!(j, plain);
        // A hole (zeros on disk) reads as zeros.
        let mut hole = vec![0u8; 2 * BLOCK];
        c.open_data(3, &mut hole);
        assert!(hole.iter().all(|&x| x == 0));
        // Another key reads garbage.
        let mut other = a.clone();
        Crypt::new(&key(2)).open_data(7, &mut other);
        assert_ne!(other, plain);
    }

    #[test]
    fn the_check_value_tells_the_key() {
        let e = Encryption::new([9; 16], &key(1));
        assert_eq!(e.salt_bytes(), Some(vec![9; 16]));
        let mut bad = e.clone();
        bad.salt = "0g".into();
        assert_eq!(bad.salt_bytes(), None);
        bad.salt = "abc".into();
        assert_eq!(bad.salt_bytes(), None);
        assert!(e.accepts(&key(1)));
        assert!(!e.accepts(&key(2)));
        let mut wrong = e.clone();
        wrong.cipher = "rot13".into();
        assert!(!wrong.accepts(&key(1)));
    }

    /// The same bytes as an independent implementation of XTS-AES-256
    /// (the `xts-mode` crate) with the same keys, sector numbers up to
    /// the top of u64, both ways.
    #[test]
    fn xts_agrees_with_the_xts_mode_crate() {
        use xts_mode::{get_tweak_default, Xts128};
        let k = key(3);
        let mine = Xts::new(&k, "test");
        let mut raw = [0u8; 64];
        let mut h = blake3::Hasher::new_derive_key("test");
        h.update(&k.0);
        h.finalize_xof().fill(&mut raw);
        let theirs = Xts128::new(
            Aes256::new(GenericArray::from_slice(&raw[..32])),
            Aes256::new(GenericArray::from_slice(&raw[32..])),
        );
        let mut seed = 1u64;
        for first in [0u64, 1, 255, 1 << 20, u64::MAX - 3] {
            let plain: Vec<u8> = (0..4 * BLOCK)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            let mut a = plain.clone();
            area(&mine, first, &mut a, true);
            let mut b = plain.clone();
            theirs.encrypt_area(&mut b, BLOCK, first as u128, get_tweak_default);
            assert!(a == b, "sector {first}");
            area(&mine, first, &mut a, false);
            assert!(a == plain, "sector {first} back");
        }
    }

    #[test]
    fn fingerprints_are_keyed() {
        let b = vec![5u8; BLOCK];
        let (one, two) = (Crypt::new(&key(1)), Crypt::new(&key(2)));
        assert_eq!(one.fingerprint(&b), one.fingerprint(&b));
        assert_ne!(one.fingerprint(&b), two.fingerprint(&b));
        assert_ne!(one.fingerprint(&b), crate::idedup::fingerprint(&b));
    }
}
