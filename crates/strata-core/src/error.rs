//! Typed errors of the core crate.

use thiserror::Error;

/// Everything that can go wrong while encoding, decoding, sealing or opening
/// core structures.
#[derive(Debug, Error)]
pub enum CoreError {
    #[error("object is truncated ({0})")]
    Truncated(&'static str),
    /// The storage found the object damaged; its reason in words (a
    /// symbolic link where an object should be, an object shorter than a
    /// read asked, …).
    #[error("{0}")]
    Damaged(String),
    #[error("unknown format version {found} for {what} (this strata understands version {supported}); upgrade strata")]
    UnknownVersion {
        what: &'static str,
        found: u8,
        supported: u8,
    },
    #[error("bad magic for {0}: not a strata object")]
    BadMagic(&'static str),
    #[error("checksum mismatch: object is corrupted")]
    Checksum,
    #[error("authentication failed: object is corrupted or was sealed with another key")]
    Authentication,
    #[error("{0} is not bound to its name: this repository's format binds every such object, so it was copied here from elsewhere")]
    Unbound(String),
    #[error("object kind mismatch: expected {expected:?}, found {found}")]
    KindMismatch { expected: u8, found: u8 },
    #[error("wrong password (the key could not be unwrapped)")]
    WrongPassword,
    #[error("decoding {what}: {msg}")]
    Decode { what: &'static str, msg: String },
    #[error("encoding: {0}")]
    Encode(String),
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("key derivation failed: {0}")]
    Kdf(String),
    #[error("random number generator failed: {0}")]
    Random(String),
    #[error("{id:?} is not a {what} id (64 lowercase hex digits)")]
    BadId { what: &'static str, id: String },
    #[error("invalid chunker parameters: {0}")]
    ChunkerParams(String),
    #[error("I/O error while chunking: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
