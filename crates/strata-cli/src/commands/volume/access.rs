//! How the volume commands reach the library: the repository as
//! `strata-link` asks for it, its errors as the CLI reports them, and
//! progress counters.

use crate::location;
use anyhow::{Context, Result};
use std::sync::atomic::Ordering;
use strata_link::{LinkError, RepoAccess};
use strata_store::Repository;

/// The repository as the volume operations reach it: its config read
/// without the password, opened (asking for it) only when needed.
pub(super) struct Access<'a>(pub(super) &'a crate::cli::Cli);

impl RepoAccess for Access<'_> {
    fn encrypted(&self) -> strata_link::Result<bool> {
        let read = || -> Result<bool> {
            let loc = location::location(self.0.repo.as_deref())?;
            let backend = location::backend(&loc, false)?;
            let config = Repository::read_config(&*backend)
                .with_context(|| format!("reading the config of {}", loc))?;
            Ok(config.encrypted)
        };
        read().map_err(store_err)
    }

    fn open(&self) -> strata_link::Result<Repository> {
        crate::cli::open(self.0).map_err(store_err)
    }
}

/// A front-end error as the library takes it: the store's own where there
/// is one (its exit code kept), else its text.
fn store_err(e: anyhow::Error) -> LinkError {
    match e.downcast::<strata_store::StoreError>() {
        Ok(s) => LinkError::Store(s),
        Err(e) => LinkError::Invalid(format!("{e:#}")),
    }
}

/// A volume operation's error as the CLI reports it: the store's, the
/// volume's and I/O errors as themselves (their exit codes, a full disk
/// told apart), with the context said before them.
pub(crate) fn link_err(e: LinkError) -> anyhow::Error {
    match e {
        LinkError::Store(s) => s.into(),
        LinkError::Volume(v) => v.into(),
        LinkError::Os(io) => io.into(),
        LinkError::Io(what, io) => anyhow::Error::new(io).context(what),
        LinkError::Context { what, source } => link_err(*source).context(what),
        e @ LinkError::Invalid(_) => e.into(),
    }
}

/// A progress display's counters, as the volume crate reports progress.
pub(super) fn progress_fn(p: &strata_store::progress::Progress) -> impl Fn(u64, u64) + '_ {
    move |done, total| {
        p.bytes_total.store(total, Ordering::Relaxed);
        p.bytes_done.store(done, Ordering::Relaxed);
    }
}
