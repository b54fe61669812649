//! Resemblance sketches of chunks (docs/design.md "Delta compression").
//!
//! Two chunks that differ by a small edit share most of their content, but
//! not their fingerprint. A *sketch* is a few numbers computed from a
//! chunk's content such that similar chunks very likely share at least one
//! of them:
//!
//! 1. A Gear rolling hash runs over the chunk (one shift and one add per
//!    byte, the same hash FastCDC cuts with).
//! 2. Positions where the rolling hash has its low [`SAMPLE_BITS`] bits
//!    zero are *sampled* — content-defined, so an insertion moves the
//!    samples with the content instead of shifting all of them (Odess's
//!    content-defined sampling).
//! 3. Each of [`FEATURES`] linear transforms `m·h + a` of the sampled
//!    hashes keeps its maximum: a *feature* (Broder's min-wise sketches,
//!    with N transforms instead of N hash functions).
//! 4. Features are grouped [`FEATURES_PER_SUPER`] at a time and each group
//!    hashed into a *super-feature*. Two chunks sharing a super-feature
//!    share that whole group of features — with 12 features in 3 groups
//!    this happens with high probability when the chunks are ~90 % alike,
//!    and rarely when they are not.
//!
//! A chunk too short or too uniform to have samples has no sketch.

/// Low bits of the rolling hash that must be zero at a sampled position:
/// one position in 32 on average.
pub const SAMPLE_BITS: u32 = 5;
/// Features per sketch.
pub const FEATURES: usize = 12;
/// Features hashed into one super-feature.
pub const FEATURES_PER_SUPER: usize = 4;
/// Super-features per sketch.
pub const SUPER_FEATURES: usize = FEATURES / FEATURES_PER_SUPER;
/// Samples a sketch needs: fewer leave most features undecided.
pub const MIN_SAMPLES: usize = 4;

/// The super-features of one chunk. Two sketches *resemble* when they
/// have a super-feature in the same place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sketch(pub [u64; SUPER_FEATURES]);

impl Sketch {
    /// How many super-features `self` and `other` share (in the same
    /// place): 0 means not alike, [`SUPER_FEATURES`] very alike.
    pub fn shared(&self, other: &Sketch) -> usize {
        self.0.iter().zip(&other.0).filter(|(a, b)| a == b).count()
    }
}

/// splitmix64: the constants of the Gear table and the transforms, and
/// the mixing of features into super-features.
const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const fn gear_table() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = mix(0x5354_5241_5441_0000 ^ i as u64);
        i += 1;
    }
    t
}

/// Multipliers (odd) and addends of the feature transforms.
const fn transforms() -> [(u64, u64); FEATURES] {
    let mut t = [(0u64, 0u64); FEATURES];
    let mut i = 0;
    while i < FEATURES {
        t[i] = (mix(0xF00D ^ i as u64) | 1, mix(0xBEEF ^ i as u64));
        i += 1;
    }
    t
}

static GEAR: [u64; 256] = gear_table();
static TRANSFORMS: [(u64, u64); FEATURES] = transforms();

/// The sketch of `data`, or None when it has fewer than [`MIN_SAMPLES`]
/// sampled positions (short or uniform data: nothing to go on).
pub fn sketch(data: &[u8]) -> Option<Sketch> {
    let mask = (1u64 << SAMPLE_BITS) - 1;
    let mut features = [0u64; FEATURES];
    let mut samples = 0usize;
    let mut h = 0u64;
    for &b in data {
        h = (h << 1).wrapping_add(GEAR[b as usize]);
        // Bit k of a Gear hash depends on the last k + 1 bytes: sample on
        // bits 40..45, which the last 45 bytes all reach.
        if (h >> 40) & mask == 0 {
            samples += 1;
            for (f, (m, a)) in features.iter_mut().zip(TRANSFORMS.iter()) {
                let v = h.wrapping_mul(*m).wrapping_add(*a);
                if v > *f {
                    *f = v;
                }
            }
        }
    }
    if samples < MIN_SAMPLES {
        return None;
    }
    let mut sf = [0u64; SUPER_FEATURES];
    for (s, group) in sf.iter_mut().zip(features.chunks(FEATURES_PER_SUPER)) {
        *s = group
            .iter()
            .fold(0x5346_u64, |acc, f| mix(acc ^ *f))
            // 0 is reserved: an empty slot of a sketch table.
            .max(1);
    }
    Some(Sketch(sf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn random(len: usize, seed: u64) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (mix(seed ^ (i / 8)) >> ((i % 8) * 8)) as u8)
            .collect()
    }

    #[test]
    fn short_or_uniform_data_has_no_sketch() {
        assert_eq!(sketch(&[]), None);
        assert_eq!(sketch(&random(40, 1)), None);
        assert_eq!(sketch(&vec![0u8; 8192]), None);
    }

    #[test]
    fn the_same_data_has_the_same_sketch() {
        let d = random(8192, 7);
        assert_eq!(sketch(&d), sketch(&d.clone()));
        assert!(sketch(&d).is_some());
    }

    /// Small edits (a few bytes changed, inserted, deleted) keep at least
    /// one super-feature in most chunks; unrelated chunks share none.
    #[test]
    fn similar_chunks_resemble_and_unrelated_ones_do_not() {
        let mut alike = 0;
        let mut unrelated = 0;
        for seed in 0..200u64 {
            let a = random(8192, seed);
            let mut b = a.clone();
            let at = (mix(seed) % 8000) as usize;
            match seed % 3 {
                0 => b[at..at + 40].iter_mut().for_each(|x| *x ^= 0x5a),
                1 => b.splice(at..at, random(30, seed + 1000)).for_each(drop),
                _ => b.drain(at..at + 30).for_each(drop),
            }
            let (sa, sb) = (sketch(&a).unwrap(), sketch(&b).unwrap());
            alike += usize::from(sa.shared(&sb) > 0);
            let c = random(8192, seed + 1_000_000);
            unrelated += usize::from(sa.shared(&sketch(&c).unwrap()) > 0);
        }
        assert!(alike >= 190, "{alike} of 200 edited chunks resemble");
        assert_eq!(unrelated, 0);
    }

    proptest! {
        /// Any input sketches without panicking, and a sketch is a
        /// function of the content alone.
        #[test]
        fn sketches_are_deterministic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = sketch(&data);
            prop_assert_eq!(s, sketch(&data));
            if let Some(s) = s {
                prop_assert!(s.0.iter().all(|&x| x != 0));
            }
        }
    }
}
