//! Random sequences of backup, forget, gc, maintain and copy, each step
//! possibly crashing at a random write, over in-memory repositories: after
//! every step the storage is opened again as a new process would, and
//! every committed version must still be listed and restore byte-exact,
//! nothing else may appear, and check must read everything clean
//! (`strata_store::opseq`). The fuzz target `opseq` runs the same harness
//! on inputs libFuzzer grows.

use proptest::prelude::*;
use strata_store::opseq::{decode, run, Op, Step};

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn op_sequences_with_crashes_lose_nothing(bytes in proptest::collection::vec(any::<u8>(), 3..30)) {
        let tmp = tempfile::tempdir().unwrap();
        let steps = decode(&bytes);
        if let Err(e) = run(&steps, tmp.path()) {
            prop_assert!(false, "{:?}: {}", steps, e);
        }
    }
}

/// Every kind of step crashes at each of its first writes (the first 12;
/// a backup's first 40), between backups that give the others something
/// to do.
#[test]
fn every_step_crashes_at_each_of_its_first_writes() {
    let mut sequences = 0;
    let mut deltas = 0;
    let mut crashes = std::collections::BTreeMap::<String, usize>::new();
    for n in 0..40u64 {
        for op in [
            Op::Backup { seed: 3 },
            Op::Forget { pick: 0 },
            Op::Gc,
            Op::Maintain,
            Op::Copy,
        ] {
            if n >= 12 && !matches!(op, Op::Backup { .. }) {
                continue;
            }
            let plain = |seed| Step {
                op: Op::Backup { seed },
                crash_after: None,
            };
            let steps = [
                plain(1),
                plain(2),
                Step {
                    op: Op::Copy,
                    crash_after: None,
                },
                plain(4),
                Step {
                    op,
                    crash_after: Some(n),
                },
                plain(5),
                Step {
                    op: Op::Copy,
                    crash_after: None,
                },
            ];
            let tmp = tempfile::tempdir().unwrap();
            let out = run(&steps, tmp.path())
                .unwrap_or_else(|e| panic!("{op:?} crashing after {n} writes: {e}"));
            sequences += 1;
            deltas += out.delta_chunks;
            let kind = format!("{op:?}")
                .split([' ', '{'])
                .next()
                .unwrap_or("")
                .to_string();
            *crashes.entry(kind).or_default() += out.crashes;
        }
    }
    eprintln!("{sequences} sequences, {deltas} delta chunks, crashes by step: {crashes:?}");
    assert!(deltas > 0, "the sequences store chunks as deltas");
    assert_eq!(crashes.len(), 5, "{crashes:?}");
    assert!(crashes.values().all(|&n| n >= 3), "{crashes:?}");
}
