//! Comparing and searching versions' trees: the library side of `strata
//! diff SNAP1 SNAP2` ([`diff`]) and `strata find PATTERN` ([`find`]). Both
//! work on recipes only (a version's whole tree without chunks, and for
//! diff each file's content hash, both read a recipe part at a time) and
//! never read file data.

mod diff;
mod find;

pub use diff::{
    diff, diff_hashed, diff_snapshots, Change, ContentHash, ContentHashes, DiffEntry, DiffSummary,
};
pub use find::{find, find_in, FindHit, Matcher};

#[cfg(test)]
mod tests;
