//! Operation sequences with crashes (`strata_store::opseq`): the input is
//! read three bytes a step (an operation, its argument, and whether and
//! at which write it crashes), at most 12 steps; after every step the
//! repositories are opened again and every committed version must be
//! listed, restore byte-exact and check clean. Any broken invariant
//! panics, with the steps.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicU64, Ordering};

static RUNS: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let steps = strata_store::opseq::decode(&data[..data.len().min(36)]);
    if steps.is_empty() {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "strata-opseq-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let r = strata_store::opseq::run(&steps, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = r {
        panic!("{steps:?}: {e}");
    }
});
