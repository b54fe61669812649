//! Strata core: the pieces every other crate shares.
//!
//! * [`chunker`] — content-defined (FastCDC) and fixed-size chunking with
//!   segments cut on chunk boundaries in the same pass (docs/design.md "Chunking").
//! * [`fingerprint`] — BLAKE3-256 fingerprints, keyed when the repository is
//!   encrypted (docs/design.md "Vocabulary").
//! * [`crypto`] — master keys wrapped by Argon2id, and the sealed *envelope*
//!   that every stored byte goes through (checksum or AEAD tag).
//! * [`format`] — the versioned on-disk structures: container metadata,
//!   recipes, snapshots, index objects (docs/design.md "Vocabulary", "Data flow").
//! * [`sketch`] and [`delta`] — resemblance sketches of chunks and their
//!   delta encoding against a similar base (docs/design.md "Delta compression").
//!
//! The byte-level layout of every structure is documented in
//! `docs/architecture.md`; the constants here are the source of truth.

pub mod chunker;
pub mod crypto;
pub mod delta;
pub mod error;
pub mod fingerprint;
pub mod format;
pub mod id;
pub mod size;
pub mod sketch;

/// The block of a volume, of the images Strata serves and snapshots, and
/// of a linked container's regions: 4 KiB, the page and file-system block
/// of the hosts. Defined here once; every crate takes it from here.
pub const BLOCK_SIZE: usize = 4096;

pub use error::{CoreError, Result};
pub use fingerprint::{Fingerprint, Hasher};
