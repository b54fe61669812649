//! Versioned on-disk structures (docs/design.md "Vocabulary", "Data flow").
//!
//! Every structure is encoded as one format-version byte followed by its
//! postcard encoding, and the result is stored inside a sealed envelope
//! ([`crate::crypto`]), which adds the envelope version and the checksum or
//! AEAD tag. Data containers additionally have a small fixed binary frame
//! (see [`container_header`] and [`ContainerFooter`]) so that their metadata
//! section can be found without any other object.

mod codec;
mod config;
mod container;
mod index;
mod keys;
mod lock;
mod recipe;
mod snapshot;

pub use codec::{
    decode, encode, NAMES_BOUND_FROM, OLDEST_REPO_FORMAT, REPO_FORMAT_VERSION, STRUCT_VERSION,
};
pub use config::*;
pub use container::*;
pub use index::*;
pub use keys::*;
pub use lock::*;
pub use recipe::*;
pub use snapshot::*;

#[cfg(test)]
mod tests;
