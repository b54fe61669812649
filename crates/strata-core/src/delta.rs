//! Delta encoding of data against a base it resembles (docs/design.md
//! "Delta compression"): zstd with the base as a *reference prefix* — the
//! base's bytes are the history zstd's matches may point into, so what
//! the data shares with it costs a few bytes per match. This is zstd's
//! own `--patch-from` mode; no delta codec of our own.
//!
//! Decoding needs exactly the same base bytes and is held to the length
//! the caller expects: a frame that would expand further is refused
//! unexpanded.

use crate::error::{CoreError, Result};
use std::cell::RefCell;
use zstd::zstd_safe::{CCtx, CParameter, DCtx, DParameter, ResetDirective};

/// Largest window a delta frame may need: base and data together stay
/// below this (a region and its bases are far smaller).
pub const MAX_WINDOW_LOG: u32 = 27;

/// The window that covers `n` bytes of history and data.
fn window_log(n: usize) -> u32 {
    (usize::BITS - n.max(1 << 10).saturating_sub(1).leading_zeros()).clamp(10, MAX_WINDOW_LOG)
}

fn zstd_err(what: &str, code: usize) -> String {
    format!("{what}: {}", zstd::zstd_safe::get_error_name(code))
}

thread_local! {
    /// One compression and one decompression context per thread, used
    /// again: a context made per call allocated (and page-faulted) its
    /// tables every time, a large share of a delta's cost.
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// `prefix` as the context's reference prefix for its next frame.
///
/// # Safety
///
/// zstd keeps the prefix's address only until the end of the next frame
/// (`ZSTD_CCtx_refPrefix`, `ZSTD_DCtx_refPrefix`: "single usage"): the
/// callers below start that frame at once, with `prefix` still borrowed,
/// and reset the session when it fails, so no later frame sees it.
unsafe fn forever(prefix: &[u8]) -> &'static [u8] {
    // SAFETY: see above; the reference never outlives the call it is
    // made for.
    unsafe { std::mem::transmute::<&[u8], &'static [u8]>(prefix) }
}

/// `data` compressed at `level` with `base` as zstd's reference prefix.
pub fn encode(data: &[u8], base: &[u8], level: i32) -> Result<Vec<u8>> {
    let err = |c| CoreError::Encode(zstd_err("zstd delta", c));
    if base.len() + data.len() >= 1 << MAX_WINDOW_LOG {
        return Err(CoreError::Encode(format!(
            "a delta over {} bytes of base and data is larger than its window",
            base.len() + data.len()
        )));
    }
    CCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let cctx = slot.get_or_insert_with(CCtx::create);
        let run = |cctx: &mut CCtx<'static>| -> Result<Vec<u8>> {
            cctx.reset(ResetDirective::SessionAndParameters)
                .map_err(err)?;
            cctx.set_parameter(CParameter::CompressionLevel(level))
                .map_err(err)?;
            cctx.set_parameter(CParameter::WindowLog(window_log(base.len() + data.len())))
                .map_err(err)?;
            cctx.set_parameter(CParameter::ContentSizeFlag(true))
                .map_err(err)?;
            // SAFETY: the frame is made right below, `base` still borrowed.
            cctx.ref_prefix(unsafe { forever(base) }).map_err(err)?;
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
            cctx.compress2(&mut out, data).map_err(err)?;
            Ok(out)
        };
        let r = run(cctx);
        if r.is_err() {
            // Whatever it holds (the prefix included) is let go.
            *slot = None;
        }
        r
    })
}

/// The data of delta `frame` over `base`, at most `max` bytes long (the
/// caller checks what it is, e.g. against its hash).
pub fn decode_within(frame: &[u8], base: &[u8], max: usize) -> Result<Vec<u8>> {
    decompress(frame, base, max)
}

/// The data of delta `frame` over `base`, which must be exactly `len`
/// bytes long.
pub fn decode(frame: &[u8], base: &[u8], len: usize) -> Result<Vec<u8>> {
    // One byte of room more than expected: a frame that fills it is
    // longer than it should be, and is refused without growing further.
    let out = decompress(frame, base, len + 1)?;
    if out.len() != len {
        return Err(CoreError::Decompress(format!(
            "a delta decodes to {} bytes where {len} were expected",
            out.len()
        )));
    }
    Ok(out)
}

/// Decompresses `frame` over `base` into at most `cap` bytes.
fn decompress(frame: &[u8], base: &[u8], cap: usize) -> Result<Vec<u8>> {
    let err = |c| CoreError::Decompress(zstd_err("delta", c));
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let dctx = slot.get_or_insert_with(DCtx::create);
        let run = |dctx: &mut DCtx<'static>| -> Result<Vec<u8>> {
            dctx.reset(ResetDirective::SessionAndParameters)
                .map_err(err)?;
            dctx.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))
                .map_err(err)?;
            // SAFETY: the frame is decoded right below, `base` still borrowed.
            dctx.ref_prefix(unsafe { forever(base) }).map_err(err)?;
            let mut out = Vec::with_capacity(cap);
            dctx.decompress(&mut out, frame).map_err(err)?;
            Ok(out)
        };
        let r = run(dctx);
        if r.is_err() {
            *slot = None;
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` words of 2–9 random lowercase letters: text zstd alone shrinks
    /// by about half.
    fn text(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let mut out = Vec::new();
        for _ in 0..n {
            let len = 2 + next() % 8;
            out.extend((0..len).map(|_| b'a' + (next() % 26) as u8));
            out.push(if next() % 8 == 0 { b'\n' } else { b' ' });
        }
        out
    }

    #[test]
    fn a_small_edit_costs_a_few_bytes() {
        let base = text(2000, 3);
        let mut data = base.clone();
        data.splice(500..520, b"an edit in the middle".iter().copied());
        let frame = encode(&data, &base, 3).unwrap();
        let alone = zstd::bulk::compress(&data, 3).unwrap();
        assert!(
            frame.len() * 10 < alone.len(),
            "{} vs {}",
            frame.len(),
            alone.len()
        );
        assert_eq!(decode(&frame, &base, data.len()).unwrap(), data);
    }

    #[test]
    fn the_wrong_base_or_length_is_refused() {
        let base = text(500, 5);
        let data = [&base[..], b"more"].concat();
        let frame = encode(&data, &base, 3).unwrap();
        assert!(decode(&frame, &base, data.len() - 1).is_err());
        assert!(decode(&frame, &base, data.len() + 1).is_err());
        // Another base of the same length decodes to other bytes, or not
        // at all: callers check the fingerprints of what they decode.
        let other = text(500, 6);
        assert_ne!(decode(&frame, &other, data.len()).ok(), Some(data.clone()));
        assert!(decode(b"not a frame", &base, 10).is_err());
    }

    proptest! {
        #[test]
        fn deltas_round_trip(
            base in proptest::collection::vec(any::<u8>(), 0..3000),
            edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 0..20),
            tail in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let mut data = base.clone();
            for (at, b) in edits {
                if !data.is_empty() {
                    let i = at as usize % data.len();
                    data[i] = b;
                }
            }
            data.extend_from_slice(&tail);
            let frame = encode(&data, &base, 3).unwrap();
            prop_assert_eq!(decode(&frame, &base, data.len()).unwrap(), data);
        }

        /// Garbage never panics and never decodes past the length asked.
        #[test]
        fn garbage_is_refused_or_bounded(
            frame in proptest::collection::vec(any::<u8>(), 0..200),
            base in proptest::collection::vec(any::<u8>(), 0..200),
            len in 0usize..1000,
        ) {
            if let Ok(d) = decode(&frame, &base, len) {
                prop_assert_eq!(d.len(), len);
            }
        }
    }
}
