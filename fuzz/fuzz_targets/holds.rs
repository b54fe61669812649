//! Volume hold files (`strata-volume`'s disk blocks kept for the
//! repository, read at every recount and check): any bytes decode without
//! a panic, and what decodes is sorted, non-empty, non-overlapping runs
//! that encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_volume::holds::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(runs) = decode(data) else { return };
    let mut next = 0u64;
    for &(s, l) in &runs {
        assert!(l > 0 && s >= next);
        next = s + l;
    }
    assert_eq!(encode(&runs), data);
});
