//! Keys and the sealed envelope (docs/design.md "Principles": every stored byte
//! is authenticated).
//!
//! Every object and every compression region is stored as an *envelope*:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | envelope version (`ENVELOPE_VERSION` = 1) |
//! | 1 | 1 | kind (what the payload is; see [`Kind`]) — bound as associated data |
//! | 2 | 1 | flags: bit 0 = payload is zstd-compressed, bit 1 = encrypted, bit 2 = bound to its name |
//! | 3 | 24 | XChaCha20 nonce (encrypted only) |
//! | … | n | payload (ciphertext when encrypted) |
//! | end-16 | 16 | Poly1305 tag (encrypted) or BLAKE3(header ‖ payload)[..16] (plain) |
//!
//! Unencrypted repositories thus still detect any corruption, and encrypted
//! ones detect any tampering. The kind byte stops an attacker (or a bug)
//! from substituting, say, a region for a snapshot. An envelope *bound to
//! its name* (bit 2; snapshot objects from repository format 3) also
//! authenticates the object's name, after the header: a valid object
//! copied under another name no longer opens.
//!
//! The master key is 32 random bytes, stored wrapped by a key derived from
//! the password with Argon2id ([`KeyFile`]). From it two subkeys are
//! derived with BLAKE3's key derivation: one for the AEAD, one for keyed
//! fingerprints.

use crate::error::{CoreError, Result};
use crate::fingerprint::Hasher;
use chacha20poly1305::aead::{Aead, AeadInPlace, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

pub const ENVELOPE_VERSION: u8 = 1;
const FLAG_ZSTD: u8 = 1;
const FLAG_ENCRYPTED: u8 = 2;
const FLAG_NAMED: u8 = 4;
const TAG_LEN: usize = 16;
const NONCE_LEN: usize = 24;
const HEADER_LEN: usize = 3;

/// What an envelope holds. Stored in byte 1 and authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Config = 1,
    Key = 2,
    Region = 3,
    ContainerMeta = 4,
    Index = 5,
    Recipe = 6,
    Snapshot = 7,
    Lock = 8,
    Policy = 9,
    /// Index-strategy data kept on the side (SiLo blocks and similarity
    /// table, Extreme Binning bins): derived, rebuildable.
    IndexData = 10,
    /// The container summaries of one index object (`isum/`): what every
    /// command but chunk lookups needs, without the chunk entries.
    IndexSummary = 11,
    /// The lifecycle's bookkeeping (`lifecycle/state`): bytes the
    /// incremental lifecycle released since the pool was last compacted.
    LifecycleState = 12,
    /// One part of a version's recipe (`parts/`): nodes of consecutive
    /// paths and their container table.
    RecipePart = 13,
    /// How a repository and its cloud tier know each other (`tier/config`).
    TierConfig = 14,
    /// A cloud-tier job's saved progress (`tier/seed`).
    TierState = 15,
    /// A link stub (`data/ID` of a container whose regions a volume holds:
    /// [`crate::format::LinkStub`]).
    Link = 16,
    /// A compression region stored as a delta: a zstd frame made with its
    /// bases' plaintexts as the reference prefix (the container's
    /// metadata lists the bases: [`crate::format::DeltaRegion`]). Sealed
    /// uncompressed — the frame is the compression.
    DeltaRegion = 17,
    /// A recipe part stored as a delta against another part
    /// ([`crate::format::PartDelta`]).
    RecipePartDelta = 18,
}

/// The kind byte an envelope claims (None: too short to be one). Only a
/// hint for choosing how to open it: opening checks it.
pub fn claimed_kind(envelope: &[u8]) -> Option<u8> {
    envelope.get(1).copied()
}

impl Kind {
    /// The most an object of this kind decompresses to, by what the format
    /// allows for it: a small crafted object that claims more (a
    /// decompression bomb) is refused before it is expanded. Regions are
    /// held to the size their container's metadata declares
    /// ([`Sealer::open_within`]); kinds whose size grows with the
    /// repository keep the global [`MAX_DECOMPRESSED`].
    pub fn max_plain(self) -> u64 {
        match self {
            // A few fields each.
            Kind::Config
            | Kind::Key
            | Kind::Lock
            | Kind::Policy
            | Kind::TierConfig
            | Kind::LifecycleState => 1 << 20,
            // Paths and tags of one version.
            Kind::Snapshot => 16 << 20,
            // At most 4 MiB of nodes plus one node (a piece of at most
            // 16 384 chunk references, its path and extended attributes).
            Kind::RecipePart | Kind::RecipePartDelta => 16 << 20,
            // A stub: the volume's name and each region's blocks.
            Kind::Link => 64 << 20,
            // A region: at most a container (32 MiB by default, 1 GiB at
            // most); callers that know its declared size hold it to that.
            Kind::Region | Kind::DeltaRegion => 1 << 30,
            // Recipe indexes (and whole recipes of the first recipe
            // version), container metadata, index objects and their
            // summaries, index-strategy data, a tier job's progress.
            _ => MAX_DECOMPRESSED,
        }
    }

    /// What an object of this kind that takes `stored` bytes may expand
    /// to: [`Self::max_plain`], and for the kinds that grow with the
    /// repository and are mostly fingerprints and ids (random bytes zstd
    /// cannot shrink) at most 64 times its stored size plus 1 MiB — a
    /// frame that claims more is a bomb, whatever the kind's cap.
    pub fn max_plain_of(self, stored: usize) -> u64 {
        match self {
            Kind::ContainerMeta | Kind::Index | Kind::IndexSummary | Kind::IndexData => self
                .max_plain()
                .min((stored as u64).saturating_mul(64).saturating_add(1 << 20)),
            _ => self.max_plain(),
        }
    }
}

/// zstd-compresses `data` with a context kept per thread: creating one
/// per region (tens of thousands per backup) cost ~3 % of a backup.
fn zstd_compress(data: &[u8], level: i32) -> Result<Vec<u8>> {
    thread_local! {
        static CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
            const { std::cell::RefCell::new(None) };
    }
    let err = |e: std::io::Error| CoreError::Encode(format!("zstd: {e}"));
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_some_and(|(l, _)| *l != level) {
            *c = None;
        }
        let (_, cctx) = match &mut *c {
            Some(x) => x,
            slot @ None => slot.insert((level, zstd::bulk::Compressor::new(level).map_err(err)?)),
        };
        let mut out = cctx.compress(data).map_err(err)?;
        // The buffer was sized for the worst case; a large structure
        // (a recipe) would hold twice its size until sealed.
        if out.capacity() > (1 << 20) && out.capacity() > 2 * out.len() {
            out.shrink_to_fit();
        }
        Ok(out)
    })
}

/// [`zstd_decompress_within`] the global cap.
#[cfg(test)]
fn zstd_decompress(payload: &[u8]) -> Result<Vec<u8>> {
    zstd_decompress_within(payload, MAX_DECOMPRESSED)
}

/// Decompresses a zstd payload. Frames written by [`zstd_compress`] carry
/// their size, so a per-thread context decompresses them in one call
/// (a context per region cost ~8 % of a restore); a larger frame, or one
/// that does not say its size, is streamed — never past `max` (at most
/// [`MAX_DECOMPRESSED`]), so a small crafted object cannot expand beyond
/// what its kind may hold (a decompression bomb).
fn zstd_decompress_within(payload: &[u8], max: u64) -> Result<Vec<u8>> {
    const MAX_ONE_SHOT: u64 = 256 << 20;
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let err = |e: std::io::Error| CoreError::Decompress(e.to_string());
    match zstd::zstd_safe::get_frame_content_size(payload) {
        // zstd itself rejects a frame whose content differs from its size.
        Ok(Some(n)) if n <= MAX_ONE_SHOT.min(max) => DCTX.with(|d| {
            let mut d = d.borrow_mut();
            let dctx = match &mut *d {
                Some(x) => x,
                slot @ None => slot.insert(zstd::bulk::Decompressor::new().map_err(err)?),
            };
            dctx.decompress(payload, n as usize).map_err(err)
        }),
        Ok(Some(n)) if n > max => Err(CoreError::Decompress(format!(
            "the frame says it holds {n} bytes, more than any object holds ({max})"
        ))),
        _ => {
            use std::io::Read;
            let dec = zstd::stream::read::Decoder::new(payload).map_err(err)?;
            let mut out = Vec::new();
            dec.take(max + 1).read_to_end(&mut out).map_err(err)?;
            if out.len() as u64 > max {
                return Err(CoreError::Decompress(format!(
                    "decompresses to more than any object holds ({max} bytes)"
                )));
            }
            Ok(out)
        }
    }
}

/// The most any compressed region or structure may decompress to (4 GiB):
/// regions are at most a container (32 MiB by default), recipes are cut
/// into parts of 4 MiB, and the largest other structures (index tables)
/// stay far below it even for repositories of billions of chunks.
pub const MAX_DECOMPRESSED: u64 = 4 << 30;

/// Fills `buf` with cryptographically secure random bytes.
pub fn random_bytes(buf: &mut [u8]) -> Result<()> {
    getrandom::getrandom(buf).map_err(|e| CoreError::Random(e.to_string()))
}

/// The repository master key and its derived subkeys.
#[derive(Clone)]
pub struct MasterKey {
    secret: [u8; 32],
}

/// The key does not outlive its holder in memory.
impl Drop for MasterKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.secret);
    }
}

impl MasterKey {
    pub fn generate() -> Result<Self> {
        let mut secret = [0u8; 32];
        random_bytes(&mut secret)?;
        Ok(MasterKey { secret })
    }

    fn aead_key(&self) -> [u8; 32] {
        blake3::derive_key("strata 2026 aead key v1", &self.secret)
    }

    pub fn fingerprint_key(&self) -> [u8; 32] {
        blake3::derive_key("strata 2026 fingerprint key v1", &self.secret)
    }

    /// The key of a block volume of the repository, told apart by its
    /// random `salt` (volumes, and a volume made again under a name, never
    /// share one).
    pub fn volume_key(&self, salt: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key("strata 2026 volume key v1");
        h.update(&self.secret);
        h.update(salt);
        *h.finalize().as_bytes()
    }
}

/// Argon2id parameters stored with each key file so they can be raised
/// later without breaking old repositories.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KdfParams {
    pub m_cost_kib: u32,
    pub t_cost: u32,
    pub p_cost: u32,
    pub salt: [u8; 16],
}

/// The cost of the password hash (Argon2id) a new key slot gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfCost {
    pub memory_kib: u32,
    pub iterations: u32,
}

impl Default for KdfCost {
    /// 64 MiB, 3 passes: about half a second on a small machine.
    fn default() -> Self {
        KdfCost {
            memory_kib: 64 * 1024,
            iterations: 3,
        }
    }
}

impl KdfCost {
    /// The most a key slot may ask for: a crafted slot read from a
    /// repository must not make opening it take the host's memory or
    /// hours of CPU (4 GiB, 64 passes).
    pub const MAX_MEMORY_KIB: u32 = 4 << 20;
    pub const MAX_ITERATIONS: u32 = 64;

    /// Refuses costs Argon2id cannot run with, or above the ceiling.
    pub fn validate(self) -> Result<Self> {
        if self.memory_kib > Self::MAX_MEMORY_KIB || self.iterations > Self::MAX_ITERATIONS {
            return Err(CoreError::Kdf(format!(
                "password hash cost {} KiB x {} passes is above the ceiling \
                 ({} KiB x {} passes)",
                self.memory_kib,
                self.iterations,
                Self::MAX_MEMORY_KIB,
                Self::MAX_ITERATIONS
            )));
        }
        argon2::Params::new(self.memory_kib, self.iterations, 1, Some(32))
            .map_err(|e| CoreError::Kdf(e.to_string()))?;
        Ok(self)
    }
}

impl KdfParams {
    /// A fresh salt with `cost`.
    pub fn new(cost: KdfCost) -> Result<Self> {
        let mut salt = [0u8; 16];
        random_bytes(&mut salt)?;
        Ok(KdfParams {
            m_cost_kib: cost.validate()?.memory_kib,
            t_cost: cost.iterations,
            p_cost: 1,
            salt,
        })
    }

    /// The cost these parameters were made with.
    pub fn cost(&self) -> KdfCost {
        KdfCost {
            memory_kib: self.m_cost_kib,
            iterations: self.t_cost,
        }
    }

    fn derive(&self, password: &[u8]) -> Result<[u8; 32]> {
        self.cost().validate()?;
        if !(1..=16).contains(&self.p_cost) {
            return Err(CoreError::Kdf(format!(
                "password hash parallelism {} is outside 1..=16",
                self.p_cost
            )));
        }
        let params = argon2::Params::new(self.m_cost_kib, self.t_cost, self.p_cost, Some(32))
            .map_err(|e| CoreError::Kdf(e.to_string()))?;
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = [0u8; 32];
        a.hash_password_into(password, &self.salt, &mut out)
            .map_err(|e| CoreError::Kdf(e.to_string()))?;
        Ok(out)
    }
}

/// The master key wrapped by a password-derived key.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyFile {
    pub kdf: KdfParams,
    pub nonce: [u8; 24],
    pub wrapped: Vec<u8>,
}

impl KeyFile {
    pub fn wrap(master: &MasterKey, password: &[u8], cost: KdfCost) -> Result<Self> {
        let kdf = KdfParams::new(cost)?;
        let kek = zeroize::Zeroizing::new(kdf.derive(password)?);
        let mut nonce = [0u8; 24];
        random_bytes(&mut nonce)?;
        let cipher = XChaCha20Poly1305::new((&*kek).into());
        let wrapped = cipher
            .encrypt(XNonce::from_slice(&nonce), master.secret.as_slice())
            .map_err(|_| CoreError::Authentication)?;
        Ok(KeyFile {
            kdf,
            nonce,
            wrapped,
        })
    }

    pub fn unwrap_key(&self, password: &[u8]) -> Result<MasterKey> {
        let kek = zeroize::Zeroizing::new(self.kdf.derive(password)?);
        let cipher = XChaCha20Poly1305::new((&*kek).into());
        let plain = zeroize::Zeroizing::new(
            cipher
                .decrypt(XNonce::from_slice(&self.nonce), self.wrapped.as_slice())
                .map_err(|_| CoreError::WrongPassword)?,
        );
        let secret: [u8; 32] = plain
            .as_slice()
            .try_into()
            .map_err(|_| CoreError::WrongPassword)?;
        Ok(MasterKey { secret })
    }
}

/// The magic of a zstd skippable frame (RFC 8878 §3.1.2), which a
/// decompressor passes over.
const SKIPPABLE_FRAME: u32 = 0x184D_2A50;

/// Seals and opens envelopes. Cheap to clone; shared by all threads.
#[derive(Clone)]
pub struct Sealer {
    cipher: Option<XChaCha20Poly1305>,
    zstd_level: i32,
}

impl Sealer {
    /// A sealer for an unencrypted repository (checksums only).
    pub fn plain(zstd_level: i32) -> Self {
        Sealer {
            cipher: None,
            zstd_level,
        }
    }

    pub fn encrypted(key: &MasterKey, zstd_level: i32) -> Self {
        Sealer {
            cipher: Some(XChaCha20Poly1305::new((&key.aead_key()).into())),
            zstd_level,
        }
    }

    pub fn is_encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// The bytes an envelope adds to its payload: what `data` stored as it
    /// is (uncompressed) seals to is `data.len()` plus this.
    pub fn overhead(&self) -> usize {
        HEADER_LEN
            + TAG_LEN
            + match self.cipher {
                Some(_) => NONCE_LEN,
                None => 0,
            }
    }

    /// Seals `data`. When `compress` is set the payload is zstd-compressed,
    /// unless that does not save at least 2 % (then it is stored raw).
    pub fn seal(&self, kind: Kind, data: &[u8], compress: bool) -> Result<Vec<u8>> {
        self.seal_as(kind, None, data, compress)
    }

    /// [`Self::seal`], bound to the object's `name`: only
    /// [`Self::open_named`] with the same name opens it.
    pub fn seal_named(
        &self,
        kind: Kind,
        name: &str,
        data: &[u8],
        compress: bool,
    ) -> Result<Vec<u8>> {
        self.seal_as(kind, Some(name.as_bytes()), data, compress)
    }

    fn seal_as(
        &self,
        kind: Kind,
        name: Option<&[u8]>,
        data: &[u8],
        compress: bool,
    ) -> Result<Vec<u8>> {
        let mut flags = 0u8;
        let compressed;
        let payload: &[u8] = if compress && !data.is_empty() {
            compressed = zstd_compress(data, self.zstd_level)?;
            if compressed.len() < data.len() - data.len() / 50 {
                flags |= FLAG_ZSTD;
                &compressed
            } else {
                data
            }
        } else {
            data
        };
        self.seal_bound(kind, payload, flags, name)
    }

    /// Seals `data` compressed into exactly `len` bytes (an envelope whose
    /// length is fixed already: a region stored again where its container
    /// says, by a zstd that may compress it otherwise than the one that
    /// first did): zstd at this sealer's level — failing that, at the
    /// others — then a skippable frame filling the rest, which
    /// decompression passes over; or `data` as it is when that is its
    /// length. None when no level gives that length or leaves room for
    /// the frame (8 bytes at least).
    pub fn seal_padded(&self, kind: Kind, data: &[u8], len: usize) -> Result<Option<Vec<u8>>> {
        let Some(payload_len) = len.checked_sub(self.overhead()) else {
            return Ok(None);
        };
        if data.len() == payload_len {
            // Stored as it is (compression saved too little).
            return self.seal_payload(kind, data, 0).map(Some);
        }
        for level in std::iter::once(self.zstd_level).chain(1..=19) {
            let mut c = zstd_compress(data, level)?;
            if c.len() == payload_len {
                return self.seal_payload(kind, &c, FLAG_ZSTD).map(Some);
            }
            let Some(pad) = payload_len.checked_sub(c.len() + 8) else {
                continue;
            };
            let Ok(pad) = u32::try_from(pad) else {
                return Ok(None);
            };
            c.extend_from_slice(&SKIPPABLE_FRAME.to_le_bytes());
            c.extend_from_slice(&pad.to_le_bytes());
            c.resize(payload_len, 0);
            return self.seal_payload(kind, &c, FLAG_ZSTD).map(Some);
        }
        Ok(None)
    }

    /// An envelope of `payload` as it is, with `flags`.
    fn seal_payload(&self, kind: Kind, payload: &[u8], flags: u8) -> Result<Vec<u8>> {
        self.seal_bound(kind, payload, flags, None)
    }

    /// [`Self::seal_payload`], bound to `name` when given.
    fn seal_bound(
        &self,
        kind: Kind,
        payload: &[u8],
        mut flags: u8,
        name: Option<&[u8]>,
    ) -> Result<Vec<u8>> {
        if name.is_some() {
            flags |= FLAG_NAMED;
        }
        match &self.cipher {
            Some(cipher) => {
                flags |= FLAG_ENCRYPTED;
                let header = [ENVELOPE_VERSION, kind as u8, flags];
                let aad = associated(&header, name);
                let mut nonce = [0u8; NONCE_LEN];
                random_bytes(&mut nonce)?;
                // Encrypt in place in the output buffer: one copy of the
                // payload, not two.
                let mut out = Vec::with_capacity(HEADER_LEN + NONCE_LEN + payload.len() + TAG_LEN);
                out.extend_from_slice(&header);
                out.extend_from_slice(&nonce);
                out.extend_from_slice(payload);
                let tag = cipher
                    .encrypt_in_place_detached(
                        XNonce::from_slice(&nonce),
                        &aad,
                        &mut out[HEADER_LEN + NONCE_LEN..],
                    )
                    .map_err(|_| CoreError::Authentication)?;
                out.extend_from_slice(&tag);
                Ok(out)
            }
            None => {
                let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TAG_LEN);
                out.extend_from_slice(&[ENVELOPE_VERSION, kind as u8, flags]);
                out.extend_from_slice(payload);
                let sum = plain_sum(&out, name);
                out.extend_from_slice(&sum.as_bytes()[..TAG_LEN]);
                Ok(out)
            }
        }
    }

    /// Verifies and opens an envelope, returning the plaintext (at most
    /// [`Kind::max_plain`] bytes).
    pub fn open(&self, kind: Kind, data: &[u8]) -> Result<Vec<u8>> {
        self.open_within(kind, data, kind.max_plain_of(data.len()))
    }

    /// [`Self::open`] for an object whose plaintext is known to be at most
    /// `max` bytes (a region, whose size its container's metadata says):
    /// a payload that would decompress to more is refused unexpanded.
    pub fn open_within(&self, kind: Kind, data: &[u8], max: u64) -> Result<Vec<u8>> {
        self.open_as(kind, None, false, data, max)
    }

    /// Opens an envelope sealed by [`Self::seal_named`] under `name`. One
    /// not bound to a name opens only unless `bound` requires it (a
    /// repository whose format binds every object of this kind).
    pub fn open_named(&self, kind: Kind, name: &str, bound: bool, data: &[u8]) -> Result<Vec<u8>> {
        self.open_as(
            kind,
            Some(name.as_bytes()),
            bound,
            data,
            kind.max_plain_of(data.len()),
        )
    }

    fn open_as(
        &self,
        kind: Kind,
        name: Option<&[u8]>,
        bound: bool,
        data: &[u8],
        max: u64,
    ) -> Result<Vec<u8>> {
        if data.len() < HEADER_LEN + TAG_LEN {
            return Err(CoreError::Truncated(
                "envelope shorter than its header and tag",
            ));
        }
        let header = [data[0], data[1], data[2]];
        if header[0] != ENVELOPE_VERSION {
            return Err(CoreError::UnknownVersion {
                what: "envelope",
                found: header[0],
                supported: ENVELOPE_VERSION,
            });
        }
        let flags = header[2];
        // The name is authenticated only when the envelope says it is
        // bound (the flag is authenticated too); a name asked for but not
        // bound is refused where the format binds them all.
        let name = match (flags & FLAG_NAMED != 0, name) {
            (true, Some(n)) => Some(n),
            (true, None) => return Err(CoreError::Authentication),
            (false, Some(n)) if bound => {
                return Err(CoreError::Unbound(String::from_utf8_lossy(n).into_owned()))
            }
            (false, _) => None,
        };
        let aad = associated(&header, name);
        let payload: Vec<u8> = if flags & FLAG_ENCRYPTED != 0 {
            let cipher = self.cipher.as_ref().ok_or(CoreError::Authentication)?;
            if data.len() < HEADER_LEN + NONCE_LEN + TAG_LEN {
                return Err(CoreError::Truncated("encrypted envelope"));
            }
            let nonce = &data[HEADER_LEN..HEADER_LEN + NONCE_LEN];
            cipher
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: &data[HEADER_LEN + NONCE_LEN..],
                        aad: &aad,
                    },
                )
                .map_err(|_| CoreError::Authentication)?
        } else {
            if self.cipher.is_some() {
                // An unencrypted object in an encrypted repository is an
                // attempt to bypass authentication.
                return Err(CoreError::Authentication);
            }
            let (body, tag) = data.split_at(data.len() - TAG_LEN);
            if &plain_sum(body, name).as_bytes()[..TAG_LEN] != tag {
                return Err(CoreError::Checksum);
            }
            body[HEADER_LEN..].to_vec()
        };
        if header[1] != kind as u8 {
            return Err(CoreError::KindMismatch {
                expected: kind as u8,
                found: header[1],
            });
        }
        if flags & FLAG_ZSTD != 0 {
            zstd_decompress_within(&payload, max.min(MAX_DECOMPRESSED))
        } else if payload.len() as u64 > max {
            Err(CoreError::Decompress(format!(
                "holds {} bytes, more than a {kind:?} object may ({max})",
                payload.len()
            )))
        } else {
            Ok(payload)
        }
    }

    /// Builds the fingerprint hasher matching this repository's mode.
    pub fn hasher(key: Option<&MasterKey>) -> Hasher {
        match key {
            Some(k) => Hasher::keyed(k.fingerprint_key()),
            None => Hasher::plain(),
        }
    }
}

/// What an envelope authenticates besides its payload: its header, then
/// the object's name when it is bound to one.
fn associated(header: &[u8; HEADER_LEN], name: Option<&[u8]>) -> Vec<u8> {
    let mut aad = header.to_vec();
    aad.extend_from_slice(name.unwrap_or_default());
    aad
}

/// An unencrypted envelope's checksum of `body` (header and payload), and
/// of the name it is bound to (after the header).
fn plain_sum(body: &[u8], name: Option<&[u8]>) -> blake3::Hash {
    match name {
        None => blake3::hash(body),
        Some(n) => {
            let mut h = blake3::Hasher::new();
            h.update(&body[..HEADER_LEN]);
            h.update(n);
            h.update(&body[HEADER_LEN..]);
            h.finalize()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An envelope sealed to a given length opens to the same plaintext;
    /// one too short for any level is refused, not cut.
    #[test]
    fn an_envelope_sealed_to_a_length_opens_the_same() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251 / 7) as u8).collect();
        let key = MasterKey::generate().unwrap();
        for sealer in [Sealer::plain(3), Sealer::encrypted(&key, 3)] {
            let normal = sealer.seal(Kind::Region, &data, true).unwrap();
            for extra in [8usize, 9, 1000, 100_000] {
                let len = normal.len() + extra;
                let env = sealer
                    .seal_padded(Kind::Region, &data, len)
                    .unwrap()
                    .unwrap();
                assert_eq!(env.len(), len);
                assert_eq!(sealer.open(Kind::Region, &env).unwrap(), data, "+{extra}");
            }
            assert!(sealer
                .seal_padded(Kind::Region, &data, 40)
                .unwrap()
                .is_none());
            // The same length as this level gives: the same envelope but
            // its nonce; a shorter one than this level gives: another
            // level's, padded, or none.
            let same = sealer
                .seal_padded(Kind::Region, &data, normal.len())
                .unwrap()
                .unwrap();
            assert_eq!(same.len(), normal.len());
            assert_eq!(sealer.open(Kind::Region, &same).unwrap(), data);
            let best = (1..=19)
                .map(|l| zstd_compress(&data, l).unwrap().len())
                .min()
                .unwrap();
            let shorter = normal.len() - (normal.len() - best.min(normal.len())) / 2;
            if let Some(env) = sealer.seal_padded(Kind::Region, &data, shorter).unwrap() {
                assert_eq!(env.len(), shorter);
                assert_eq!(sealer.open(Kind::Region, &env).unwrap(), data);
            }
        }
    }

    /// A small frame that expands past the ceiling is refused, whether it
    /// says its size or not (a decompression bomb).
    #[test]
    fn zstd_bombs_are_refused() {
        let zeros = vec![0u8; 1 << 20];
        let streamed = zstd::stream::encode_all(&zeros[..], 19).unwrap();
        let sized = zstd_compress(&zeros, 19).unwrap();
        assert!(streamed.len() < 1024 && sized.len() < 1024);
        for z in [&streamed, &sized] {
            let e = zstd_decompress_within(z, 64 << 10).unwrap_err().to_string();
            assert!(e.contains("more than any object holds"), "{e}");
            assert_eq!(zstd_decompress_within(z, 1 << 20).unwrap(), zeros);
        }
    }

    /// A key slot asking for more than the ceiling is refused before the
    /// hash runs.
    #[test]
    fn kdf_cost_has_a_ceiling() {
        let master = MasterKey::generate().unwrap();
        let cheap = KdfCost {
            memory_kib: 256,
            iterations: 1,
        };
        let mut slot = KeyFile::wrap(&master, b"pw", cheap).unwrap();
        assert!(slot.unwrap_key(b"pw").is_ok());
        slot.kdf.m_cost_kib = u32::MAX;
        let e = slot.unwrap_key(b"pw").err().unwrap().to_string();
        assert!(e.contains("ceiling"), "{e}");
        slot.kdf.m_cost_kib = 256;
        slot.kdf.t_cost = 1_000_000;
        assert!(slot.unwrap_key(b"pw").is_err());
        slot.kdf.t_cost = 1;
        slot.kdf.p_cost = 1000;
        assert!(slot.unwrap_key(b"pw").is_err());
        let big = KdfCost {
            memory_kib: KdfCost::MAX_MEMORY_KIB + 1,
            iterations: 1,
        };
        assert!(KeyFile::wrap(&master, b"pw", big).is_err());
    }

    /// Each kind opens no more than it may hold; a region no more than
    /// its declared size (issue 40 item 1).
    #[test]
    fn objects_open_no_larger_than_their_kind_allows() {
        let s = Sealer::plain(3);
        let big = vec![0u8; (16 << 20) + 1];
        let env = s.seal(Kind::RecipePart, &big, true).unwrap();
        assert!(env.len() < 1 << 20, "zeros compress");
        let e = s.open(Kind::RecipePart, &env).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        // The same bytes as another kind that may hold them open.
        let env = s.seal(Kind::Recipe, &big, true).unwrap();
        assert_eq!(s.open(Kind::Recipe, &env).unwrap().len(), big.len());
        // Not as an index object: mostly fingerprints, it cannot expand to
        // more than 64 times its stored size (plus 1 MiB).
        let env = s.seal(Kind::Index, &big, true).unwrap();
        let e = s.open(Kind::Index, &env).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        let mut random = vec![0u8; 4 << 20];
        random_bytes(&mut random).unwrap();
        random.extend_from_slice(&[0u8; 1 << 20]);
        let env = s.seal(Kind::Index, &random, true).unwrap();
        assert_eq!(s.open(Kind::Index, &env).unwrap(), random);
        // Uncompressed, too.
        let small = vec![7u8; (1 << 20) + 1];
        let env = s.seal(Kind::Config, &small, false).unwrap();
        assert!(s.open(Kind::Config, &env).is_err());
        // A region is held to its declared size.
        let region = vec![1u8; 1000];
        let env = s.seal(Kind::Region, &region, true).unwrap();
        assert_eq!(s.open_within(Kind::Region, &env, 1000).unwrap(), region);
        assert!(s.open_within(Kind::Region, &env, 999).is_err());
    }

    #[test]
    fn zstd_frames_with_and_without_size_decompress() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i / 7).to_le_bytes())
            .collect();
        // Ours carry the size: the one-shot path, repeatedly on one context.
        for level in [1, 3, 1] {
            let z = zstd_compress(&data, level).unwrap();
            assert!(z.len() < data.len() / 4);
            assert_eq!(zstd_decompress(&z).unwrap(), data);
        }
        // A streamed frame does not: the streaming path.
        let streamed = zstd::stream::encode_all(&data[..], 3).unwrap();
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&streamed).ok(),
            Some(None)
        );
        assert_eq!(zstd_decompress(&streamed).unwrap(), data);
        // Damage is an error, never a panic or a short result.
        let mut bad = zstd_compress(&data, 3).unwrap();
        let at = bad.len() / 2;
        bad[at] ^= 0xFF;
        bad.truncate(bad.len() - 3);
        assert!(zstd_decompress(&bad).is_err());
        assert!(zstd_decompress(b"not zstd at all").is_err());
    }

    /// Cheap Argon2 for the tests.
    const FAST: KdfCost = KdfCost {
        memory_kib: 256,
        iterations: 1,
    };

    #[test]
    fn plain_roundtrip_and_corruption() {
        let s = Sealer::plain(3);
        let data = b"abcabcabcabcabcabcabcabcabcabcabcabc".repeat(100);
        let env = s.seal(Kind::Region, &data, true).unwrap();
        assert!(env.len() < data.len());
        assert_eq!(s.open(Kind::Region, &env).unwrap(), data);
        let mut bad = env.clone();
        bad[5] ^= 1;
        assert!(matches!(
            s.open(Kind::Region, &bad),
            Err(CoreError::Checksum)
        ));
        assert!(s.open(Kind::Region, &env[..2]).is_err());
        assert!(matches!(
            s.open(Kind::Snapshot, &env),
            Err(CoreError::KindMismatch { .. })
        ));
    }

    #[test]
    fn incompressible_is_stored_raw() {
        let s = Sealer::plain(3);
        let mut data = vec![0u8; 4096];
        random_bytes(&mut data).unwrap();
        let env = s.seal(Kind::Region, &data, true).unwrap();
        assert_eq!(env[2] & FLAG_ZSTD, 0);
        assert_eq!(s.open(Kind::Region, &env).unwrap(), data);
    }

    #[test]
    fn encrypted_roundtrip_tamper_and_wrong_key() {
        let mk = MasterKey::generate().unwrap();
        let s = Sealer::encrypted(&mk, 3);
        let env = s.seal(Kind::Recipe, b"secret recipe", true).unwrap();
        assert_eq!(s.open(Kind::Recipe, &env).unwrap(), b"secret recipe");
        let mut bad = env.clone();
        let n = bad.len();
        bad[n - 1] ^= 0x80;
        assert!(matches!(
            s.open(Kind::Recipe, &bad),
            Err(CoreError::Authentication)
        ));
        let other = Sealer::encrypted(&MasterKey::generate().unwrap(), 3);
        assert!(other.open(Kind::Recipe, &env).is_err());
        // A plain envelope must not pass in an encrypted repository.
        let plain = Sealer::plain(3).seal(Kind::Recipe, b"x", false).unwrap();
        assert!(s.open(Kind::Recipe, &plain).is_err());
    }

    #[test]
    fn keyfile_wrong_password() {
        let mk = MasterKey::generate().unwrap();
        let kf = KeyFile::wrap(&mk, b"right", FAST).unwrap();
        assert_eq!(kf.kdf.cost(), FAST);
        assert!(KdfCost {
            memory_kib: 1,
            iterations: 1
        }
        .validate()
        .is_err());
        let back = kf.unwrap_key(b"right").unwrap();
        assert_eq!(back.secret, mk.secret);
        assert!(matches!(
            kf.unwrap_key(b"wrong"),
            Err(CoreError::WrongPassword)
        ));
    }
}
