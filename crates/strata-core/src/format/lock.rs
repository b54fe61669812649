//! Locks: a lease held by a running command.

use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// A lock held by a running command: a lease, refreshed while it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub host: String,
    pub pid: u32,
    /// When it was taken or last refreshed (seconds since the epoch).
    pub time: i64,
    pub exclusive: bool,
    pub operation: String,
    /// When the lease runs out unless refreshed (seconds since the epoch);
    /// 0 for locks written before leases (structure version 1).
    pub expires: i64,
}

/// Version byte of [`LockInfo`]: 2 added `expires`; version-1 locks are
/// still read (they never expire by time).
pub const LOCK_VERSION: u8 = 2;

pub fn encode_lock(l: &LockInfo) -> Result<Vec<u8>> {
    postcard::to_extend(l, vec![LOCK_VERSION]).map_err(|e| CoreError::Encode(e.to_string()))
}

pub fn decode_lock(bytes: &[u8]) -> Result<LockInfo> {
    const WHAT: &str = "lock";
    #[derive(Deserialize)]
    struct V1 {
        host: String,
        pid: u32,
        time: i64,
        exclusive: bool,
        operation: String,
    }
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let err = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    match v {
        LOCK_VERSION => postcard::from_bytes(body).map_err(err),
        1 => postcard::from_bytes::<V1>(body)
            .map_err(err)
            .map(|l| LockInfo {
                host: l.host,
                pid: l.pid,
                time: l.time,
                exclusive: l.exclusive,
                operation: l.operation,
                expires: 0,
            }),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: LOCK_VERSION,
        }),
    }
}
