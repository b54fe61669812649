//! The buffers a large file's blocks are read into, used again: a block's
//! buffer goes back to its pool when the last segment sharing it is
//! stored, so the next block is read into memory already mapped (a fresh
//! multi-MiB allocation costs a page fault per 4 KiB on first touch —
//! more system time than the read itself).

use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// Idle block buffers.
#[derive(Default)]
pub(crate) struct BufferPool {
    idle: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// Buffers kept idle at most (beyond these, a returned one is freed):
/// the read-ahead bound keeps fewer in use at once.
const IDLE_MAX: usize = 4;

impl BufferPool {
    /// An idle buffer (empty), or a new one.
    pub fn take(&self) -> Vec<u8> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = idle.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// `data` as a block's bytes, back to this pool when dropped.
    pub fn share(&self, data: Vec<u8>) -> BlockData {
        Arc::new(Pooled {
            data,
            pool: Some(self.idle.clone()),
        })
    }
}

/// A block's bytes, shared by the segments that take chunks from it.
pub(crate) type BlockData = Arc<Pooled>;

/// Bytes that go back to their pool (if any) when dropped.
#[derive(Default)]
pub(crate) struct Pooled {
    data: Vec<u8>,
    pool: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
}

impl Deref for Pooled {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            let mut idle = pool.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_MAX {
                idle.push(std::mem::take(&mut self.data));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer comes back to its pool when its last holder drops it,
    /// with its memory.
    #[test]
    fn buffers_come_back() {
        let pool = BufferPool::default();
        let mut v = pool.take();
        v.extend_from_slice(&[7; 1000]);
        let cap = v.capacity();
        let a = pool.share(v);
        let b = a.clone();
        drop(a);
        assert_eq!(pool.idle.lock().unwrap().len(), 0);
        assert_eq!(&b[..3], &[7, 7, 7]);
        drop(b);
        let again = pool.take();
        assert!(again.capacity() >= cap);
    }
}
