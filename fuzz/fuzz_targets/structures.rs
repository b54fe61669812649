//! Every structure decoded from repository bytes (after the envelope is
//! opened): config, key slots, snapshots, recipes and their parts,
//! container metadata and footers, index objects and summaries, locks,
//! link stubs.
//! The first byte picks the decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_core::format::{
    decode, decode_index_summary, decode_key_slot, decode_lock, decode_recipe_object,
    decode_snapshot, ContainerFooter, ContainerMeta, IndexObject, LinkStub, Recipe, RepoConfig,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    match sel % 11 {
        0 => drop(decode::<RepoConfig>("config", b)),
        1 => drop(decode_key_slot(b)),
        2 => drop(decode_snapshot(b)),
        3 => drop(decode_recipe_object(b)),
        4 => drop(decode::<Recipe>("recipe part", b)),
        5 => drop(decode::<ContainerMeta>("container metadata", b)),
        6 => drop(ContainerFooter::parse(b)),
        7 => drop(decode::<IndexObject>("index", b)),
        8 => drop(decode_index_summary(b)),
        10 => drop(decode::<LinkStub>("link stub", b)),
        _ => drop(decode_lock(b)),
    }
});
