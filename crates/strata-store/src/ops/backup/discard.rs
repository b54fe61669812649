//! What a backup that fails takes back. Its containers that no index
//! object lists yet are known to nobody else: they are deleted at once
//! (on a full disk, that is the space the failure needs back). Those an
//! index object of this backup lists may already be in use by a backup
//! started since; they stay for `gc`, which is said.

use crate::engine::writer::Written;
use crate::error::StoreError;
use crate::repo::{links, meta_name, Repository};
use std::sync::Mutex;

/// Deletes the unlisted containers of `written`, says what stays, and
/// hands back `error` (the backup's, unchanged).
pub(crate) fn take_back(
    repo: &Repository,
    written: &Mutex<Written>,
    error: StoreError,
) -> StoreError {
    let w = std::mem::take(&mut *written.lock().unwrap_or_else(|e| e.into_inner()));
    let mut deleted = 0usize;
    let mut failed = None;
    for id in &w.unlisted {
        // A linked container gives its blocks back to its volume.
        let gone = links::delete_data(repo, id)
            .and_then(|()| Ok(repo.backend().delete(&meta_name(id))?));
        match gone {
            Ok(()) => deleted += 1,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if deleted > 0 {
        tracing::info!("deleted the {deleted} container(s) this failed backup wrote");
    }
    // One line, whatever is left: those an index object lists, and those
    // that could not be deleted (the storage is gone too, say).
    let left = w.unlisted.len() - deleted + w.listed;
    if left > 0 {
        let why = match failed {
            Some(e) => format!("; deleting them failed: {e}"),
            None => format!(
                " (listed in its index objects, {} MB)",
                w.listed_bytes / 1_000_000
            ),
        };
        tracing::warn!("{left} container(s) this failed backup wrote stay until `strata gc`{why}");
    }
    error
}
