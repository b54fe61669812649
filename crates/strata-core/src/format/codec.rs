//! How a structure becomes bytes: a version byte, then postcard.

use crate::error::{CoreError, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version of the repository layout (config, object names, structures)
/// that `init` writes.
/// 2: lifecycle stamps name their owner version, snapshots record their
/// reverse-dedup state, chunk references can be indirect.
/// 3: every snapshot object is bound to its name (the envelope
/// authenticates it), and its id is random.
pub const REPO_FORMAT_VERSION: u8 = 3;
/// The oldest repository format this build opens (and keeps writing in
/// that format's way).
pub const OLDEST_REPO_FORMAT: u8 = 2;
/// The first format whose snapshot objects are all bound to their names.
pub const NAMES_BOUND_FROM: u8 = 3;
/// Version byte of each structure below.
pub const STRUCT_VERSION: u8 = 1;

/// Encodes a structure: version byte + postcard.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    // Serialised straight after the version byte: recipes of large trees
    // run to tens of MB and are not worth a second copy.
    postcard::to_extend(value, vec![STRUCT_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

/// Decodes a structure encoded by [`encode`], checking its version.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T> {
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(what))?;
    if v != STRUCT_VERSION {
        return Err(CoreError::UnknownVersion {
            what,
            found: v,
            supported: STRUCT_VERSION,
        });
    }
    postcard::from_bytes(body).map_err(|e| decode_error(what, e))
}

/// A decoding error of `what`, in words: a value its type refuses (an id
/// that is not 64 lowercase hex digits) is named as such, not by the
/// decoder's generic text.
pub(crate) fn decode_error(what: &'static str, e: postcard::Error) -> CoreError {
    let msg = match e {
        postcard::Error::SerdeDeCustom => {
            "a field holds a value its type refuses (an id that is not 64 lowercase hex digits)"
                .to_string()
        }
        e => e.to_string(),
    };
    CoreError::Decode { what, msg }
}
