//! Lists of extents `(source, offset, length)` describing a stream as
//! pieces of content sources, with batched cuts and inserts in one pass
//! (O(extents + edits)), so that generations of a large stream can be
//! derived from the previous one without materialising the data. Used by
//! `ddgen` (byte extents) and `trace` (chunk-id extents).

use super::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub src: u64,
    pub off: u64,
    pub len: u64,
}

impl Extent {
    fn head(self, n: u64) -> Extent {
        Extent { len: n, ..self }
    }
    fn tail(self, n: u64) -> Extent {
        Extent {
            src: self.src,
            off: self.off + n,
            len: self.len - n,
        }
    }
}

pub(crate) fn total(ext: &[Extent]) -> u64 {
    ext.iter().map(|e| e.len).sum()
}

/// Appends `e`, merging it with the last extent when contiguous.
pub(crate) fn push_merge(out: &mut Vec<Extent>, e: Extent) {
    if e.len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.src == e.src && last.off + last.len == e.off {
            last.len += e.len;
            return;
        }
    }
    out.push(e);
}

/// Removes the sorted, non-overlapping `ranges` `(start, len)`; returns
/// the rest and the removed pieces of each range.
pub(crate) fn cut(ext: &[Extent], ranges: &[(u64, u64)]) -> (Vec<Extent>, Vec<Vec<Extent>>) {
    let mut out = Vec::with_capacity(ext.len() + ranges.len());
    let mut pieces = vec![Vec::new(); ranges.len()];
    let mut ri = 0;
    let mut pos = 0u64;
    for &e0 in ext {
        let mut e = e0;
        while e.len > 0 {
            while ri < ranges.len() && ranges[ri].0 + ranges[ri].1 <= pos {
                ri += 1;
            }
            if ri == ranges.len() {
                push_merge(&mut out, e);
                pos += e.len;
                break;
            }
            let (rs, rl) = ranges[ri];
            let n = if pos < rs {
                let n = (rs - pos).min(e.len);
                push_merge(&mut out, e.head(n));
                n
            } else {
                let n = (rs + rl - pos).min(e.len);
                push_merge(&mut pieces[ri], e.head(n));
                n
            };
            e = e.tail(n);
            pos += n;
        }
    }
    (out, pieces)
}

/// Inserts pieces at positions (sorted; in the coordinates of `ext`;
/// positions past the end append).
pub(crate) fn insert(ext: &[Extent], ins: &[(u64, Vec<Extent>)]) -> Vec<Extent> {
    let mut out = Vec::with_capacity(ext.len() + 3 * ins.len());
    let mut ii = 0;
    let mut pos = 0u64;
    for &e0 in ext {
        let mut e = e0;
        loop {
            while ii < ins.len() && ins[ii].0 <= pos {
                for &p in &ins[ii].1 {
                    push_merge(&mut out, p);
                }
                ii += 1;
            }
            if e.len == 0 {
                break;
            }
            let next = if ii < ins.len() { ins[ii].0 } else { u64::MAX };
            let n = (next - pos).min(e.len);
            push_merge(&mut out, e.head(n));
            e = e.tail(n);
            pos += n;
        }
    }
    for (_, piece) in &ins[ii..] {
        for &p in piece {
            push_merge(&mut out, p);
        }
    }
    out
}

/// Places ranges of the given lengths uniformly at random in `[0, total)`
/// without overlap (lengths that do not fit are dropped); sorted by start.
pub(crate) fn random_ranges(rng: &mut Rng, total: u64, lens: &[u64]) -> Vec<(u64, u64)> {
    let mut lens: Vec<u64> = lens.to_vec();
    let mut sum: u64 = lens.iter().sum();
    while sum > total {
        sum -= lens.pop().unwrap_or(0);
    }
    let free = total - sum;
    let mut points: Vec<u64> = (0..lens.len()).map(|_| rng.below(free + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::with_capacity(lens.len());
    let mut before = 0;
    for (p, l) in points.into_iter().zip(lens) {
        out.push((p + before, l));
        before += l;
    }
    out
}

/// Sorted uniform positions in `[0, total]`.
pub(crate) fn random_positions(rng: &mut Rng, total: u64, n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).map(|_| rng.below(total + 1)).collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(ext: &[Extent]) -> Vec<(u64, u64)> {
        ext.iter()
            .flat_map(|e| (e.off..e.off + e.len).map(move |o| (e.src, o)))
            .collect()
    }

    #[test]
    fn cut_and_insert_match_a_naive_model() {
        let mut rng = Rng::new(4);
        let mut ext = vec![Extent {
            src: 0,
            off: 0,
            len: 1000,
        }];
        let mut model = expand(&ext);
        let mut next_src = 1;
        for _ in 0..50 {
            let t = total(&ext);
            let lens: Vec<u64> = (0..5).map(|_| rng.range(0, 40)).collect();
            let ranges = random_ranges(&mut rng, t, &lens);
            assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
            let (rest, pieces) = cut(&ext, &ranges);
            for (r, p) in ranges.iter().zip(&pieces).rev() {
                let removed: Vec<_> = model.drain(r.0 as usize..(r.0 + r.1) as usize).collect();
                assert_eq!(removed, expand(p));
            }
            assert_eq!(expand(&rest), model);
            let t = total(&rest);
            let pos = random_positions(&mut rng, t, 4);
            let ins: Vec<(u64, Vec<Extent>)> = pos
                .iter()
                .map(|&p| {
                    next_src += 1;
                    (
                        p,
                        vec![Extent {
                            src: next_src,
                            off: 0,
                            len: rng.range(1, 30),
                        }],
                    )
                })
                .collect();
            for (p, e) in ins.iter().rev() {
                let at = *p as usize;
                let new = expand(e);
                model.splice(at..at, new);
            }
            ext = insert(&rest, &ins);
            assert_eq!(expand(&ext), model);
        }
    }
}
