//! Key slots: the master key wrapped by one password.

use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// Version byte of [`KeySlot`]: 1 was the bare [`crate::crypto::KeyFile`]
/// (no host, user or time), still read.
pub const KEY_SLOT_VERSION: u8 = 2;

/// One key slot (`keys/ID`): the master key wrapped by one password, and
/// who made it when (`strata key list`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeySlot {
    pub key: crate::crypto::KeyFile,
    pub host: String,
    pub user: String,
    pub created_ns: i64,
}

pub fn encode_key_slot(k: &KeySlot) -> Result<Vec<u8>> {
    postcard::to_extend(k, vec![KEY_SLOT_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

/// Decodes a key slot of either version.
pub fn decode_key_slot(bytes: &[u8]) -> Result<KeySlot> {
    let what = "key file";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(what))?;
    let err = |e: postcard::Error| super::codec::decode_error(what, e);
    match v {
        1 => Ok(KeySlot {
            key: postcard::from_bytes(body).map_err(err)?,
            host: String::new(),
            user: String::new(),
            created_ns: 0,
        }),
        KEY_SLOT_VERSION => postcard::from_bytes(body).map_err(err),
        found => Err(CoreError::UnknownVersion {
            what,
            found,
            supported: KEY_SLOT_VERSION,
        }),
    }
}
