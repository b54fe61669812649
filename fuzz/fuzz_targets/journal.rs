//! Volume journal files (`strata-volume`'s write-ahead journal, read back
//! after a crash): any bytes decode without a panic to the records that
//! check out, and those records encode to bytes that decode to them again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_volume::journal::{decode, encode};

fuzz_target!(|data: &[u8]| {
    for block_size in [4096usize, 512] {
        let recs = decode(data, block_size);
        let mut again = Vec::new();
        for r in &recs {
            encode(r, block_size, &mut again);
        }
        assert_eq!(decode(&again, block_size), recs);
    }
});
