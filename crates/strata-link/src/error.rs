//! Errors of the volume operations: the store's, the volume's, or their
//! own, each perhaps said in the light of what was being done.

use strata_store::StoreError;
use strata_volume::VolumeError;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(transparent)]
    Os(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
    /// `source`, said in the light of `what` (a front end prints "what:
    /// source").
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<LinkError>,
    },
}

pub type Result<T, E = LinkError> = std::result::Result<T, E>;

impl LinkError {
    /// This error said in the light of `what`.
    pub fn context(self, what: impl std::fmt::Display) -> LinkError {
        LinkError::Context {
            what: what.to_string(),
            source: Box::new(self),
        }
    }

    /// An I/O error of `what`.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> LinkError {
        let what = what.to_string();
        move |e| LinkError::Io(what, e)
    }
}

/// `.context(...)` on results of any error that becomes a [`LinkError`].
pub trait Context<T> {
    fn context(self, what: impl std::fmt::Display) -> Result<T>;
    fn with_context<D: std::fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<LinkError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(what))
    }

    fn with_context<D: std::fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}
