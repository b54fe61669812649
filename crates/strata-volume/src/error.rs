//! Errors of a volume, and why one stopped taking writes.

use std::io;

#[derive(thiserror::Error, Debug)]
pub enum VolumeError {
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    #[error("{0}")]
    Invalid(String),
}

pub(crate) type Result<T> = std::result::Result<T, VolumeError>;

impl VolumeError {
    /// This error said in the light of `what` ("what: the error"); an
    /// I/O error stays one (a full disk is still told apart).
    pub fn context(self, what: impl std::fmt::Display) -> VolumeError {
        match self {
            VolumeError::Io(c, e) => VolumeError::Io(format!("{what}: {c}"), e),
            VolumeError::Invalid(m) => VolumeError::Invalid(format!("{what}: {m}")),
        }
    }

    /// An I/O error of `what`.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> VolumeError {
        let what = what.to_string();
        move |e| VolumeError::Io(what, e)
    }
}

/// Why a volume stopped taking writes, and the kind of error that made
/// it (a full disk is told apart: clients get ENOSPC, and the CLI says to
/// free space).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) why: String,
    pub(crate) kind: io::ErrorKind,
}

impl Failure {
    pub(crate) fn new(why: String, e: Option<&io::Error>) -> Failure {
        // Only a full disk (or quota) is told apart: any other kind (an
        // EINVAL of a write to the data file, say) would tell the client
        // its own request was wrong.
        let full = e.is_some_and(|e| {
            matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
                || matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                )
        });
        let kind = match full {
            true => io::ErrorKind::StorageFull,
            false => io::ErrorKind::Other,
        };
        Failure { why, kind }
    }

    pub(crate) fn of(e: &VolumeError) -> Failure {
        match e {
            VolumeError::Io(_, io) => Failure::new(e.to_string(), Some(io)),
            VolumeError::Invalid(_) => Failure::new(e.to_string(), None),
        }
    }

    /// The error writes (and syncs) get from now on.
    pub(crate) fn error(&self) -> io::Error {
        io::Error::new(self.kind, format!("the volume stopped: {}", self.why))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

pub(crate) fn ioe(what: impl Into<String>) -> impl FnOnce(io::Error) -> VolumeError {
    let w = what.into();
    move |e| VolumeError::Io(w, e)
}

/// The error of a write while the disk has no room for the `need` bytes
/// of the batch the volume holds (ENOSPC to NBD clients).
pub(crate) fn no_room(need: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "{} (the volume's buffered writes need {need} bytes on its disk): \
             writes resume once space is freed",
            io::Error::from_raw_os_error(libc::ENOSPC)
        ),
    )
}
