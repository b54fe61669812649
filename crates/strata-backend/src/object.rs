//! The [`Backend`] trait: immutable named objects, their writers and
//! errors, and the grammar every object name keeps to.

use std::sync::Arc;
use thiserror::Error;

/// What went wrong, as callers need to tell it apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object (or bucket) does not exist.
    NotFound,
    /// Credentials refused, or the operation not allowed.
    Permission,
    /// Worth retrying: a timeout, a dropped connection, throttling, a 5xx.
    Transient,
    /// The object is not what it should be (shorter than asked for, …).
    Corrupt,
    /// No space left where the objects are kept.
    DiskFull,
    /// A name outside the repository's grammar, a bad location.
    Invalid,
    /// Anything else.
    Other,
}

/// A backend error: its kind, the operation and object, and the cause in
/// words (part of the message, so printing the chain does not repeat it).
#[derive(Debug, Error)]
#[error("{op} {name}: {message}")]
pub struct BackendError {
    pub kind: ErrorKind,
    pub op: &'static str,
    pub name: String,
    pub message: String,
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

impl BackendError {
    pub fn new(
        kind: ErrorKind,
        op: &'static str,
        name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        BackendError {
            kind,
            op,
            name: name.into(),
            message: message.into(),
        }
    }

    /// An I/O error of a local file, classified.
    pub fn io(op: &'static str, name: impl Into<String>, e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match (e.raw_os_error(), e.kind()) {
            (Some(libc::ENOSPC | libc::EDQUOT), _) => ErrorKind::DiskFull,
            (_, K::NotFound) => ErrorKind::NotFound,
            (_, K::PermissionDenied) => ErrorKind::Permission,
            (_, K::Interrupted | K::TimedOut | K::WouldBlock) => ErrorKind::Transient,
            (_, K::UnexpectedEof) => ErrorKind::Corrupt,
            _ => ErrorKind::Other,
        };
        BackendError::new(kind, op, name, e.to_string())
    }

    pub fn not_found(op: &'static str, name: impl Into<String>) -> Self {
        BackendError::new(ErrorKind::NotFound, op, name, "no such object")
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

/// An object name and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub name: String,
    pub size: u64,
}

/// Object-store semantics shared by every backend.
pub trait Backend: Send + Sync {
    /// Stores a whole object atomically, replacing any object of that name.
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Reads a whole object.
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads `len` bytes at `offset`; fails (as corrupt) if the object is
    /// shorter.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Lists the objects in folder `prefix` (such as `data/`; empty for
    /// all), sorted by name.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// Deletes an object; deleting a missing object is not an error.
    fn delete(&self, name: &str) -> Result<()>;
    /// Size of an object, or `None` when it does not exist.
    fn size(&self, name: &str) -> Result<Option<u64>>;
    /// Hints that these ranges will be read soon (prefetch).
    fn will_need(&self, _name: &str, _offset: u64, _len: u64) {}
    /// Drops any local copy of an object a reader found damaged, so the
    /// next read goes to storage ([`cache::Cache`]); wrappers pass it on.
    fn evict(&self, _name: &str) {}
    /// A writer that streams a new object to storage as it is produced,
    /// where the backend can (see [`create_object`]); `None` when objects
    /// are put whole.
    fn stream(&self, _name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        Ok(None)
    }
    /// Deletes what writers killed half-way left behind (a local
    /// directory's temporary files, a bucket's unfinished multipart
    /// uploads), of those begun or last changed more than `older_than`
    /// ago; what it deleted. Only under the repository's exclusive lock
    /// (no writer at work). Nothing by default.
    fn sweep_temporaries(&self, _older_than: std::time::Duration) -> Result<Swept> {
        Ok(Swept::default())
    }
    /// Where the objects are, for messages.
    fn describe(&self) -> String;
}

/// What [`Backend::sweep_temporaries`] deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub files: u64,
    pub bytes: u64,
}

/// An object being written piece by piece. It becomes visible under its
/// name, whole and durable, only at [`ObjectWriter::finish`]; dropped
/// before that, it leaves nothing behind.
pub trait ObjectWriter: Send {
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Bytes written so far.
    fn written(&self) -> u64;
    /// Makes the object durable and visible.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A writer for a new object `name`: streamed where the backend supports
/// it (a local file or an S3 multipart upload is written as it goes, so
/// memory holds only what is being produced), else buffered and put whole
/// at the end.
pub fn create_object(backend: &Arc<dyn Backend>, name: &str) -> Result<Box<dyn ObjectWriter>> {
    if let Some(w) = backend.stream(name)? {
        return Ok(w);
    }
    Ok(Box::new(Buffered {
        backend: backend.clone(),
        name: name.to_string(),
        buf: Vec::new(),
    }))
}

/// [`ObjectWriter`] over a whole-object put.
struct Buffered {
    backend: Arc<dyn Backend>,
    name: String,
    buf: Vec<u8>,
}

impl ObjectWriter for Buffered {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn written(&self) -> u64 {
        self.buf.len() as u64
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.backend.put(&self.name, &self.buf)
    }
}

/// Bytes `offset..offset + len` of object `name` held in memory as
/// `whole`; a range past its end is a corrupt (short) object.
pub fn slice_range(name: &str, whole: &[u8], offset: u64, len: u64) -> Result<Vec<u8>> {
    match offset.checked_add(len).filter(|&e| e <= whole.len() as u64) {
        Some(end) => Ok(whole[offset as usize..end as usize].to_vec()),
        None => Err(BackendError::new(
            ErrorKind::Corrupt,
            "read",
            name,
            format!("object shorter than {} bytes", offset.saturating_add(len)),
        )),
    }
}

/// Longest object name a backend accepts.
pub const MAX_NAME: usize = 512;

/// Checks an object name against the repository's grammar: components of
/// ASCII letters, digits, `.`, `_` and `-`, separated by single `/`, none
/// empty, `.` or `..`, not starting with `.` (temporary files), at most
/// [`MAX_NAME`] bytes. Every backend calls this before a name touches a
/// path or a URL.
pub fn check_name(op: &'static str, name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(BackendError::new(
            ErrorKind::Invalid,
            op,
            name.chars().take(100).collect::<String>(),
            format!("not a valid object name ({why})"),
        ))
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("empty or too long");
    }
    for c in name.split('/') {
        if c.is_empty() || c.starts_with('.') {
            return bad("empty, hidden, `.` or `..` component");
        }
        if !c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return bad("characters outside [A-Za-z0-9._-]");
        }
    }
    Ok(())
}

/// Checks a list prefix: empty (everything), or a folder — a valid name
/// followed by `/`.
pub fn check_prefix(prefix: &str) -> Result<()> {
    match prefix.strip_suffix('/') {
        _ if prefix.is_empty() => Ok(()),
        Some(p) => check_name("list", p),
        None => Err(BackendError::new(
            ErrorKind::Invalid,
            "list",
            prefix,
            "a list prefix is a folder ending with `/`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_grammar_are_refused() {
        for ok in [
            "config",
            "data/ab/abcdef",
            "keys/default",
            "silo/blk/x-1_2.3",
        ] {
            assert!(check_name("t", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/",
            "a/./b",
            ".tmp-1",
            "a b",
            "a\\b",
            "snapshots/\u{e9}",
            &"x".repeat(600),
        ] {
            let e = check_name("t", bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{bad}");
        }
        assert!(check_prefix("data/").is_ok());
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("../").is_err());
        assert!(check_prefix("data").is_err());
    }

    #[test]
    fn io_errors_are_classified() {
        let e = BackendError::io(
            "write",
            "x",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(e.kind, ErrorKind::DiskFull);
        let e = BackendError::io("read", "x", std::io::ErrorKind::NotFound.into());
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "read x: entity not found");
    }
}
