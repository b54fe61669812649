//! A mutex whose poisoning is passed over: a panic elsewhere leaves the
//! data as consistent as every other path of the volume leaves it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it even when a panic poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
