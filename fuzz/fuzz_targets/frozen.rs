//! Frozen hash tables (SiLo blocks, Extreme Binning bins): a table read
//! from the repository is checked before use, and lookups in any table
//! that passes end (no infinite probe) and stay in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_core::Fingerprint;
use strata_index::frozen::Frozen;
use strata_index::PosLoc;

fuzz_target!(|data: &[u8]| {
    let Ok(t) = Frozen::<Fingerprint, PosLoc>::from_bytes("fuzz", data.to_vec()) else {
        return;
    };
    let _ = t.reps().count();
    let n = t.entries().count();
    assert_eq!(n, t.len());
    for i in 0..4u8 {
        let _ = t.get(&Fingerprint([i; 32]));
    }
});
