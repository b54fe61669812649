//! A small, fast, seeded PRNG for the workload generators: splitmix64 to
//! expand a seed, xoshiro256** for the stream (Blackman & Vigna), plus the
//! distributions the generators need (uniform ranges, Bernoulli, shuffles,
//! distinct samples, normal, lognormal, Pareto, exponential, geometric).
//!
//! Nothing here comes from a paper; it exists so that every generator is
//! deterministic from its seed without depending on the `rand` crate (whose
//! streams change between versions).

/// The splitmix64 finaliser: a cheap, high-quality 64-bit mixer
/// (a bijection, so distinct inputs give distinct outputs).
#[inline]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One step of splitmix64: advances `state` and returns the next output.
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix64(*state)
}

/// Derives an independent seed from a seed and a path of integers (series
/// number, version, day, object id …). Different paths give unrelated seeds.
pub fn derive_seed(seed: u64, parts: &[u64]) -> u64 {
    let mut h = mix64(seed ^ 0x6a09_e667_f3bc_c908);
    for (i, &p) in parts.iter().enumerate() {
        h = mix64(
            h.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_add(i as u64)
                ^ mix64(p ^ 0xbb67_ae85_84ca_a73b),
        );
    }
    h
}

/// xoshiro256** seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `seed` (any value, including 0, is fine).
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // splitmix64 never yields four zero words in a row, but be explicit.
        if s == [0; 4] {
            return Rng { s: [1, 2, 3, 4] };
        }
        Rng { s }
    }

    /// A generator for the seed derived from `seed` and `parts`
    /// (see [`derive_seed`]).
    pub fn derive(seed: u64, parts: &[u64]) -> Rng {
        Rng::new(derive_seed(seed, parts))
    }

    /// An independent child generator (consumes one output of `self`).
    pub fn fork(&mut self, tag: u64) -> Rng {
        let x = self.next_u64();
        Rng::new(derive_seed(x, &[tag]))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, n)` (Lemire's multiply-shift with rejection; unbiased).
    /// Returns 0 when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let t = n.wrapping_neg() % n;
            while (m as u64) < t {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in `[lo, hi)`; returns `lo` when the range is empty.
    #[inline]
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo)
        }
    }

    /// Uniform `usize` in `[lo, hi)`; returns `lo` when the range is empty.
    #[inline]
    pub fn range_usize(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as u64, hi as u64) as usize
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `(0, 1]` (safe to take the logarithm of).
    #[inline]
    pub fn f64_open0(&mut self) -> f64 {
        1.0 - self.f64()
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Rounds `x ≥ 0` to an integer randomly so that the expectation is `x`
    /// (keeps small-scale rates unbiased: 0.3 files/day → 0 or 1).
    pub fn round_random(&mut self, x: f64) -> u64 {
        if x <= 0.0 || !x.is_finite() {
            return 0;
        }
        let f = x.floor();
        f as u64 + u64::from(self.chance(x - f))
    }

    /// A uniformly chosen element, `None` for an empty slice.
    pub fn choose<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        if xs.is_empty() {
            None
        } else {
            Some(&xs[self.below(xs.len() as u64) as usize])
        }
    }

    /// An index chosen with probability proportional to `weights[i]`
    /// (non-positive weights are never chosen; 0 if all are).
    pub fn choose_weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
        if total <= 0.0 {
            return 0;
        }
        let mut x = self.f64() * total;
        let mut last = 0;
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                if x < w {
                    return i;
                }
                x -= w;
                last = i;
            }
        }
        last
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }

    /// `k` distinct indices from `0..n` (all of them if `k ≥ n`), in
    /// ascending order.
    pub fn sample_distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        if k >= n {
            return (0..n).collect();
        }
        let mut out: Vec<usize> = if k * 4 >= n {
            // Dense: partial shuffle.
            let mut all: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + self.below((n - i) as u64) as usize;
                all.swap(i, j);
            }
            all.truncate(k);
            all
        } else {
            // Sparse: Floyd's algorithm.
            let mut set = std::collections::HashSet::with_capacity(k * 2);
            for j in (n - k)..n {
                let t = self.below(j as u64 + 1) as usize;
                if !set.insert(t) {
                    set.insert(j);
                }
            }
            set.into_iter().collect()
        };
        out.sort_unstable();
        out
    }

    /// Fills `buf` with random bytes.
    pub fn fill_bytes(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let x = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&x[..rest.len()]);
        }
    }

    /// Standard normal (Box–Muller, one value per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64_open0();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Lognormal with the given median and shape `sigma`
    /// (mean = median·e^{σ²/2}).
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// Pareto with scale `xm` (the minimum) and tail index `alpha`.
    pub fn pareto(&mut self, xm: f64, alpha: f64) -> f64 {
        xm / self.f64_open0().powf(1.0 / alpha)
    }

    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.f64_open0().ln()
    }

    /// Geometric on `1, 2, 3, …` with the given mean (≥ 1).
    pub fn geometric(&mut self, mean: f64) -> u64 {
        if mean <= 1.0 {
            return 1;
        }
        let p = 1.0 / mean;
        let u = self.f64_open0();
        1 + (u.ln() / (1.0 - p).ln()).floor() as u64
    }
}

/// A long-tailed size distribution (file sizes, VM sizes, run lengths),
/// truncated to `[min, max]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LongTail {
    /// Lognormal with `median` and shape `sigma`.
    LogNormal {
        median: f64,
        sigma: f64,
        min: u64,
        max: u64,
    },
    /// Pareto with minimum `xm` and tail index `alpha`.
    Pareto {
        xm: f64,
        alpha: f64,
        min: u64,
        max: u64,
    },
}

impl LongTail {
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let (x, min, max) = match *self {
            LongTail::LogNormal {
                median,
                sigma,
                min,
                max,
            } => (rng.lognormal(median, sigma), min, max),
            LongTail::Pareto {
                xm,
                alpha,
                min,
                max,
            } => (rng.pareto(xm, alpha), min, max),
        };
        let x = if x.is_finite() { x.round() } else { max as f64 };
        (x.max(min as f64).min(max as f64)) as u64
    }

    /// The untruncated mean (∞ for a Pareto with α ≤ 1).
    pub fn mean(&self) -> f64 {
        match *self {
            LongTail::LogNormal { median, sigma, .. } => median * (sigma * sigma / 2.0).exp(),
            LongTail::Pareto { xm, alpha, .. } => {
                if alpha <= 1.0 {
                    f64::INFINITY
                } else {
                    alpha * xm / (alpha - 1.0)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seed_sensitive() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(8);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(derive_seed(1, &[0, 1]), derive_seed(1, &[1, 0]));
        assert_ne!(derive_seed(1, &[0]), derive_seed(1, &[0, 0]));
    }

    #[test]
    fn ranges_and_distributions() {
        let mut r = Rng::new(1);
        let mut hist = [0u32; 10];
        for _ in 0..100_000 {
            let x = r.below(10);
            hist[x as usize] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_000..11_000).contains(&h)),
            "{hist:?}"
        );
        for _ in 0..1000 {
            let x = r.range(5, 9);
            assert!((5..9).contains(&x));
            let f = r.f64();
            assert!((0.0..1.0).contains(&f));
        }
        let n = 50_000;
        let mean_g: f64 = (0..n).map(|_| r.geometric(2.92) as f64).sum::<f64>() / n as f64;
        assert!((mean_g - 2.92).abs() < 0.1, "{mean_g}");
        let mean_e: f64 = (0..n).map(|_| r.exponential(3.0)).sum::<f64>() / n as f64;
        assert!((mean_e - 3.0).abs() < 0.1, "{mean_e}");
        let mut ln: Vec<f64> = (0..n).map(|_| r.lognormal(100.0, 1.0)).collect();
        ln.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let med = ln[n / 2];
        assert!((90.0..110.0).contains(&med), "{med}");
        let t = LongTail::Pareto {
            xm: 1.0,
            alpha: 1.3,
            min: 1,
            max: 256,
        };
        assert!((0..1000)
            .map(|_| t.sample(&mut r))
            .all(|x| (1..=256).contains(&x)));
    }

    #[test]
    fn sampling_helpers() {
        let mut r = Rng::new(3);
        for (n, k) in [(100, 5), (100, 60), (10, 20), (0, 3)] {
            let s = r.sample_distinct(n, k);
            assert_eq!(s.len(), k.min(n));
            assert!(s.windows(2).all(|w| w[0] < w[1]));
            assert!(s.iter().all(|&i| i < n));
        }
        let mut v: Vec<u32> = (0..50).collect();
        r.shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
        assert_ne!(v, s);
        let w = [0.0, 1.0, 3.0];
        let mut c = [0; 3];
        for _ in 0..10_000 {
            c[r.choose_weighted(&w)] += 1;
        }
        assert_eq!(c[0], 0);
        assert!((2_200..2_800).contains(&c[1]), "{c:?}");
        let mut buf = [0u8; 13];
        r.fill_bytes(&mut buf);
        assert!(buf.iter().any(|&b| b != 0));
        let total: u64 = (0..10_000).map(|_| r.round_random(0.3)).sum();
        assert!((2_700..3_300).contains(&total), "{total}");
    }
}
