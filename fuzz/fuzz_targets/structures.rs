//! Every structure decoded from repository bytes (after the envelope is
//! opened): config, key slots, snapshots, recipes and their parts,
//! container metadata and footers, index objects and summaries, locks,
//! link stubs, delta frames, recipe part deltas.
//! The first byte picks the decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_core::format::{
    decode, decode_index_object, decode_index_summary, decode_key_slot, decode_lock, decode_meta,
    decode_recipe_object, decode_snapshot, ContainerFooter, LinkStub, PartDelta, Recipe, RepoConfig,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    match sel % 13 {
        0 => drop(decode::<RepoConfig>("config", b)),
        1 => drop(decode_key_slot(b)),
        2 => drop(decode_snapshot(b)),
        3 => drop(decode_recipe_object(b)),
        4 => drop(decode::<Recipe>("recipe part", b)),
        5 => drop(decode_meta(b)),
        6 => drop(ContainerFooter::parse(b)),
        7 => drop(decode_index_object(b)),
        8 => drop(decode_index_summary(b)),
        9 => drop(strata_core::delta::decode(b, &b[..b.len() / 2], b.len() * 4)),
        10 => drop(decode::<LinkStub>("link stub", b)),
        11 => drop(decode::<PartDelta>("recipe part delta", b)),
        _ => drop(decode_lock(b)),
    }
});
