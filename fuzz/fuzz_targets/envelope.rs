//! Sealed envelopes (every object in a repository is one): opening
//! arbitrary bytes as any kind, plain or encrypted, returns an error or
//! the plaintext — never a panic. (Decompression is not yet bounded: a
//! small frame can expand a lot; libFuzzer's -rss_limit_mb catches blow-ups.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_core::crypto::{Kind, MasterKey, Sealer};

const KINDS: [Kind; 18] = [
    Kind::Config,
    Kind::Key,
    Kind::Region,
    Kind::ContainerMeta,
    Kind::Index,
    Kind::Recipe,
    Kind::Snapshot,
    Kind::Lock,
    Kind::Policy,
    Kind::IndexData,
    Kind::IndexSummary,
    Kind::LifecycleState,
    Kind::RecipePart,
    Kind::TierConfig,
    Kind::TierState,
    Kind::Link,
    Kind::DeltaRegion,
    Kind::RecipePartDelta,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let kind = KINDS[sel as usize % KINDS.len()];
    let _ = Sealer::plain(3).open(kind, body);
    thread_local! {
        static KEY: MasterKey = MasterKey::generate().expect("random key");
    }
    KEY.with(|k| {
        let _ = Sealer::encrypted(k, 3).open(kind, body);
    });
});
