//! Quest (Tang et al., 2024): query-aware block selection for decode. Each sealed block keeps
//! the element-wise minimum and maximum of its keys per KV head; for a query `q` the score
//! `Σ_d max(q_d · min_d, q_d · max_d)` is an upper bound of `q · k` for every key `k` in the
//! block, so ranking blocks by it and reading the top ones (within a token budget) keeps the
//! keys that can matter most.

use crate::kernel::tile::exp_shifted_sum;
use crate::kernel::Level;

/// Widen the element-wise bounds `min`/`max` (`width` values each) to cover every row of
/// `rows` (row-major, `width` values per row): Quest's page summary, computed in one place
/// for whoever builds it (at seal time or catching up from the cache).
pub fn key_bounds(rows: &[f32], width: usize, min: &mut [f32], max: &mut [f32]) {
    for row in rows.chunks_exact(width.max(1)) {
        for ((l, h), &x) in min.iter_mut().zip(max.iter_mut()).zip(row) {
            *l = l.min(x);
            *h = h.max(x);
        }
    }
}

/// `Σ_d max(q_d · min_d, q_d · max_d)`: no key with `min ≤ k ≤ max` element-wise can have a
/// larger dot product with `q`.
///
/// A decode query scores every block of a long context with this (2,000 blocks per KV head
/// per layer at 32K), so it is written with eight independent partial sums, which the
/// compiler turns into vector code; a single running sum would be a serial chain.
pub fn upper_bound_score(q: &[f32], min: &[f32], max: &[f32]) -> f32 {
    const LANES: usize = 8;
    let n = q.len().min(min.len()).min(max.len());
    let (q, min, max) = (&q[..n], &min[..n], &max[..n]);
    let mut acc = [0.0f32; LANES];
    let whole = n / LANES * LANES;
    for ((qc, lc), hc) in q[..whole]
        .chunks_exact(LANES)
        .zip(min[..whole].chunks_exact(LANES))
        .zip(max[..whole].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] += (qc[i] * lc[i]).max(qc[i] * hc[i]);
        }
    }
    let tail: f32 = q[whole..]
        .iter()
        .zip(min[whole..].iter().zip(&max[whole..]))
        .map(|(&q, (&lo, &hi))| (q * lo).max(q * hi))
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// A block's bounds in the form group scoring reads: per value the centre `(min + max) / 2`
/// and the radius `(max − min) / 2` (`min ≤ max`).
pub fn center_radius(min: &[f32], max: &[f32], center: &mut [f32], radius: &mut [f32]) {
    for (((c, r), &lo), &hi) in center.iter_mut().zip(radius.iter_mut()).zip(min).zip(max) {
        *c = 0.5 * (lo + hi);
        *r = 0.5 * (hi - lo);
    }
}

/// The query side of [`group_upper_bound`] for the query heads of one GQA group (`q_group`:
/// heads × `sum.len()` values): per value, the sum of the heads' values and the sum of their
/// magnitudes.
pub fn group_query(q_group: &[f32], sum: &mut [f32], abs_sum: &mut [f32]) {
    sum.fill(0.0);
    abs_sum.fill(0.0);
    for q in q_group.chunks_exact(sum.len().max(1)) {
        for ((s, a), &x) in sum.iter_mut().zip(abs_sum.iter_mut()).zip(q) {
            *s += x;
            *a += x.abs();
        }
    }
}

/// `Σ_h upper_bound_score(q_h, min, max)` over a group of query heads for `out.len()`
/// blocks, each in one dot product of twice the head size instead of one bound per head:
/// for `l ≤ h`, `max(q·l, q·h) = q·(l + h)/2 + |q|·(h − l)/2`, so the group's sum is
/// `Σ_d Q_d·c_d + A_d·r_d` with `Q = Σ_h q_h`, `A = Σ_h |q_h|` ([`group_query`]) and the
/// block's centre `c` and radius `r` ([`center_radius`]). Block `p`'s centre and radius
/// start at `p · stride` of `center` and `radius`; the width is `sum.len()`.
///
/// A decode query scores every block of a long context (1,000 per KV head per layer at
/// 16K), so this runs on the AVX2 kernels when `level` allows; the scalar loop (eight
/// independent partial sums, which the compiler vectorises) is their reference.
pub fn group_upper_bounds(
    level: Level,
    sum: &[f32],
    abs_sum: &[f32],
    center: &[f32],
    radius: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let width = sum.len();
    assert_eq!(abs_sum.len(), width, "query sums of different widths");
    if let Some(last) = out.len().checked_sub(1) {
        assert!(
            center.len() >= last * stride + width && radius.len() >= last * stride + width,
            "block bounds out of range"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        use crate::kernel::avx2::{group_bounds, Blocks};
        let blocks = Blocks {
            center,
            radius,
            stride,
        };
        // SAFETY: AVX2 and FMA are available (`usable`); the bounds are checked above.
        unsafe { group_bounds(sum, abs_sum, blocks, out) };
        return;
    }
    let _ = level; // (elsewhere than x86_64 only the portable loop below exists)
    const LANES: usize = 8;
    let whole = width / LANES * LANES;
    for (p, o) in out.iter_mut().enumerate() {
        let c = &center[p * stride..][..width];
        let r = &radius[p * stride..][..width];
        let mut acc = [0.0f32; LANES];
        for i in (0..whole).step_by(LANES) {
            for l in 0..LANES {
                acc[l] += sum[i + l] * c[i + l] + abs_sum[i + l] * r[i + l];
            }
        }
        let tail: f32 = (whole..width)
            .map(|d| sum[d] * c[d] + abs_sum[d] * r[d])
            .sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// Each block's estimated share of a GQA group's attention: for every query head of
/// `q_group` (rows of `head_dim`), its upper bounds over the blocks ([`group_upper_bounds`]
/// with that head alone) scaled by `1/√head_dim` as attention scales logits and put through
/// a softmax over the blocks, then summed over the heads into `out` (one value per block,
/// `0 ≤ out ≤ heads`).
///
/// Why not the sum of the heads' bounds: heads differ in the range of their logits, so in a
/// plain sum the broad heads outvote a retrieval head whose one sharp peak decides the
/// answer (a needle among look-alike needles is lost that way). Normalising per head first
/// is the criterion of the exact oracle (summed per-head probabilities), applied to bounds.
/// A bound that is not a number counts as no mass.
pub fn group_block_mass(
    level: Level,
    q_group: &[f32],
    head_dim: usize,
    center: &[f32],
    radius: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let mut abs = vec![0.0f32; head_dim];
    softmax_sum_over_heads(level, q_group, head_dim, out, |q, logits| {
        for (a, &x) in abs.iter_mut().zip(q) {
            *a = x.abs();
        }
        group_upper_bounds(level, q, &abs, center, radius, stride, logits);
    });
}

/// Each key's exact share of a GQA group's attention among `out.len()` keys (`rows`, key
/// `t` from `t · stride`, `head_dim` wide): per query head of `q_group` the softmax of its
/// scaled logits over these keys, summed over the heads — the oracle's criterion within a
/// candidate set. The dots run on [`group_upper_bounds`]' kernel: with a magnitude of zero
/// its radius term vanishes and the bound is the exact `q · k` (the keys stand in for the
/// radius, multiplied by zero), so no second buffer is needed.
pub fn group_row_mass(
    level: Level,
    q_group: &[f32],
    head_dim: usize,
    rows: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let zero = vec![0.0f32; head_dim];
    softmax_sum_over_heads(level, q_group, head_dim, out, |q, logits| {
        group_upper_bounds(level, q, &zero, rows, rows, stride, logits);
    });
}

/// `out = Σ_h softmax(logits_h / √head_dim)` over the query heads of `q_group`, where
/// `logits(q_h, buf)` writes head `h`'s unscaled logits (one per entry of `out`). A logit
/// that is not a number counts as no mass; a head without a finite logit adds nothing.
/// The criterion every mass-ranking selection shares (bounds, exact keys, sketches).
pub fn softmax_sum_over_heads(
    level: Level,
    q_group: &[f32],
    head_dim: usize,
    out: &mut [f32],
    mut logits: impl FnMut(&[f32], &mut [f32]),
) {
    out.fill(0.0);
    let scale = 1.0 / (head_dim.max(1) as f32).sqrt();
    let mut buf = vec![0.0f32; out.len()];
    for q in q_group.chunks_exact(head_dim.max(1)) {
        logits(q, &mut buf);
        add_softmax(level, &mut buf, scale, out);
    }
}

/// `out += softmax(logits · scale)`, the logits turned into their exponentials in place (at
/// `level`, [`exp_shifted_sum`]): one head's share in [`softmax_sum_over_heads`], for a
/// caller that has every head's logits at once. NaN counts as no mass; logits without a
/// finite one add nothing.
pub fn add_softmax(level: Level, logits: &mut [f32], scale: f32, out: &mut [f32]) {
    let top = max_ignoring_nan(logits);
    if !top.is_finite() {
        return;
    }
    let total = exp_shifted_sum(level, logits, top, scale);
    let inv = (1.0 / total) as f32;
    for (o, &e) in out.iter_mut().zip(logits.iter()) {
        *o += e * inv;
    }
}

/// The largest value of `x` that is a number (`-inf` when there is none). In 16 lanes, so
/// the compiler vectorizes it: a selection policy takes it over every key's estimated logit
/// per query head and decode step.
fn max_ignoring_nan(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            // A NaN compares false and is passed over.
            *l = if v > *l { v } else { *l };
        }
    }
    rest.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::KeysView;

    #[test]
    fn the_largest_number_passes_over_nans_at_every_length() {
        for n in [0usize, 1, 15, 16, 17, 40] {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 3 == 1 {
                        f32::NAN
                    } else {
                        (i as f32 * 1.7).sin()
                    }
                })
                .collect();
            let want = x
                .iter()
                .filter(|v| !v.is_nan())
                .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            assert_eq!(max_ignoring_nan(&x), want, "n {n}");
        }
        assert_eq!(max_ignoring_nan(&[f32::NAN; 20]), f32::NEG_INFINITY);
    }

    #[test]
    fn the_lane_split_score_equals_the_f64_sum_at_every_length() {
        let mut r = crate::kernel::reference::uniform(5);
        for n in [0usize, 1, 7, 8, 9, 16, 63, 64, 65, 130] {
            let q: Vec<f32> = (0..n).map(|_| r() * 2.0).collect();
            let lo: Vec<f32> = (0..n).map(|_| r() * 3.0 - 1.0).collect();
            let hi: Vec<f32> = lo.iter().map(|&l| l + r().abs() * 2.0).collect();
            let want: f64 = (0..n)
                .map(|d| (q[d] as f64 * lo[d] as f64).max(q[d] as f64 * hi[d] as f64))
                .sum();
            let got = upper_bound_score(&q, &lo, &hi) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "n {n}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn the_score_bounds_every_key_in_the_block() {
        let mut r = crate::kernel::reference::uniform(9);
        for _ in 0..200 {
            let (rows, heads, dim) = (16, 2, 8);
            let keys: Vec<f32> = (0..rows * heads * dim).map(|_| r() * 3.0).collect();
            let view = KeysView::new(&keys, rows, heads, dim).unwrap();
            let width = heads * dim;
            let (mut lo, mut hi) = (vec![f32::INFINITY; width], vec![f32::NEG_INFINITY; width]);
            key_bounds(view.as_slice(), width, &mut lo, &mut hi);
            let q: Vec<f32> = (0..dim).map(|_| r()).collect();
            for h in 0..heads {
                let head = h * dim..(h + 1) * dim;
                let bound = upper_bound_score(&q, &lo[head.clone()], &hi[head]);
                for row in 0..rows {
                    let dot: f32 = q.iter().zip(view.key(row, h)).map(|(a, b)| a * b).sum();
                    assert!(dot <= bound + 1e-4, "{dot} > {bound}");
                }
            }
        }
    }

    /// A group's queries and random block bounds (min, max, centre, radius; `stride` apart).
    struct Blocks {
        q: Vec<f32>,
        lo: Vec<f32>,
        hi: Vec<f32>,
        c: Vec<f32>,
        rad: Vec<f32>,
    }

    fn random_blocks(
        r: &mut impl FnMut() -> f32,
        heads: usize,
        dim: usize,
        blocks: usize,
        stride: usize,
    ) -> Blocks {
        let q: Vec<f32> = (0..heads * dim).map(|_| r() * 2.0).collect();
        let lo: Vec<f32> = (0..blocks * stride).map(|_| r() * 3.0 - 1.0).collect();
        let hi: Vec<f32> = lo.iter().map(|&l| l + r().abs() * 2.0).collect();
        let (mut c, mut rad) = (vec![0.0; lo.len()], vec![0.0; lo.len()]);
        center_radius(&lo, &hi, &mut c, &mut rad);
        Blocks { q, lo, hi, c, rad }
    }

    #[test]
    fn the_group_bound_is_the_sum_of_the_heads_bounds_at_every_level() {
        let mut r = crate::kernel::reference::uniform(21);
        for (heads, dim) in [(1usize, 1usize), (7, 64), (2, 13), (4, 8), (3, 130)] {
            let (blocks, stride) = (5, dim + 3);
            let Blocks { q, lo, hi, c, rad } = random_blocks(&mut r, heads, dim, blocks, stride);
            let (mut s, mut a) = (vec![0.0; dim], vec![0.0; dim]);
            group_query(&q, &mut s, &mut a);
            let scale: f64 = q.iter().map(|x| x.abs() as f64).sum::<f64>() * 3.0;
            for level in Level::supported() {
                let mut got = vec![0.0; blocks];
                group_upper_bounds(level, &s, &a, &c, &rad, stride, &mut got);
                for (p, &g) in got.iter().enumerate() {
                    let span = p * stride..p * stride + dim;
                    let want: f64 = q
                        .chunks_exact(dim)
                        .map(|q| upper_bound_score(q, &lo[span.clone()], &hi[span.clone()]) as f64)
                        .sum();
                    assert!(
                        (g as f64 - want).abs() <= 1e-5 * (1.0 + scale),
                        "{level:?} {heads}x{dim} block {p}: {g} vs {want}"
                    );
                }
            }
        }
    }

    /// f64 reference: per head, the softmax over blocks of the scaled bound, summed.
    fn block_mass_f64(q: &[f32], dim: usize, lo: &[f32], hi: &[f32], stride: usize) -> Vec<f64> {
        let blocks = lo.len() / stride;
        let scale = 1.0 / (dim as f64).sqrt();
        let mut mass = vec![0.0f64; blocks];
        for q in q.chunks_exact(dim) {
            let b: Vec<f64> = (0..blocks)
                .map(|p| {
                    let span = p * stride..p * stride + dim;
                    (0..dim)
                        .map(|d| {
                            let (x, l, h) = (
                                q[d] as f64,
                                lo[span.start + d] as f64,
                                hi[span.start + d] as f64,
                            );
                            (x * l).max(x * h)
                        })
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let top = b.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = b.iter().map(|x| (x - top).exp()).sum();
            for (m, x) in mass.iter_mut().zip(&b) {
                *m += (x - top).exp() / total;
            }
        }
        mass
    }

    #[test]
    fn the_block_mass_is_the_per_head_softmax_of_bounds_summed_at_every_level() {
        let mut r = crate::kernel::reference::uniform(33);
        for (heads, dim) in [(1usize, 1usize), (6, 128), (2, 13), (4, 8), (3, 130)] {
            let (blocks, stride) = (9, dim + 3);
            let Blocks { q, lo, hi, c, rad } = random_blocks(&mut r, heads, dim, blocks, stride);
            let want = block_mass_f64(&q, dim, &lo, &hi, stride);
            for level in Level::supported() {
                let mut got = vec![0.0; blocks];
                group_block_mass(level, &q, dim, &c, &rad, stride, &mut got);
                for (p, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 1e-4 * heads as f64,
                        "{level:?} {heads}x{dim} block {p}: {g} vs {w}"
                    );
                }
                let total: f32 = got.iter().sum();
                assert!(
                    (total - heads as f32).abs() < 1e-3,
                    "{total} over {heads} heads"
                );
            }
        }
    }

    #[test]
    fn the_row_mass_is_the_exact_per_head_softmax_summed_at_every_level() {
        let mut r = crate::kernel::reference::uniform(45);
        for (heads, dim) in [(1usize, 1usize), (6, 128), (2, 13), (3, 130)] {
            let (rows, stride) = (11, dim + 5);
            let q: Vec<f32> = (0..heads * dim).map(|_| r() * 2.0).collect();
            let keys: Vec<f32> = (0..rows * stride).map(|_| r() * 3.0).collect();
            // A key is a block of one: min = max = the key.
            let want = block_mass_f64(&q, dim, &keys, &keys, stride);
            for level in Level::supported() {
                let mut got = vec![0.0; rows];
                group_row_mass(level, &q, dim, &keys, stride, &mut got);
                for (t, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 1e-4 * heads as f64,
                        "{level:?} {heads}x{dim} key {t}: {g} vs {w}"
                    );
                }
            }
        }
    }

    /// The reason for normalising per head: in a group of six, five broad heads prefer
    /// block 0 a little and one sharp head prefers block 1 strongly, among 100 blocks.
    /// Summed bounds (5 × 1 against 4.5) pick block 0; summed per-head mass picks block 1,
    /// where the sharp head puts a fifth of its attention while the broad ones spread theirs.
    #[test]
    fn a_sharp_head_is_not_outvoted_by_broad_ones() {
        let (dim, blocks) = (2, 100);
        let mut c = vec![0.0f32; blocks * dim];
        c[0] = 1.0; // block 0: [1, 0]
        c[3] = 4.5; // block 1: [0, 4.5]
        let rad = vec![0.0f32; c.len()];
        let mut q = [1.0f32, 0.0].repeat(5);
        q.extend([0.0, 1.0]);
        let (mut s, mut a) = (vec![0.0; dim], vec![0.0; dim]);
        group_query(&q, &mut s, &mut a);
        let mut summed = vec![0.0; blocks];
        group_upper_bounds(Level::Scalar, &s, &a, &c, &rad, dim, &mut summed);
        let mut mass = vec![0.0; blocks];
        group_block_mass(Level::Scalar, &q, dim, &c, &rad, dim, &mut mass);
        let best = |v: &[f32]| (0..v.len()).max_by(|&x, &y| v[x].total_cmp(&v[y])).unwrap();
        assert_eq!(best(&summed), 0, "summed bounds {:?}", &summed[..3]);
        assert_eq!(best(&mass), 1, "block mass {:?}", &mass[..3]);
    }

    #[test]
    fn a_nan_bound_counts_as_no_mass() {
        let c = [1.0f32, f32::NAN, 0.5];
        let rad = [0.0f32; 3];
        let mut mass = vec![0.0; 3];
        group_block_mass(Level::Scalar, &[1.0], 1, &c, &rad, 1, &mut mass);
        assert_eq!(mass[1], 0.0);
        assert!(
            (mass[0] + mass[2] - 1.0).abs() < 1e-6 && mass[0] > mass[2],
            "{mass:?}"
        );
    }

    #[test]
    fn bad_views_are_errors() {
        assert!(KeysView::new(&[0.0; 8], 2, 2, 2).is_ok());
        assert!(KeysView::new(&[0.0; 7], 2, 2, 2).is_err());
        assert!(KeysView::new(&[], 0, 2, 2).is_err());
        assert!(KeysView::new(&[0.0; 8], usize::MAX, 2, 2).is_err());
    }

    #[test]
    fn key_bounds_cover_every_row() {
        let rows = [1.0, -2.0, 3.0, 0.5, 4.0, -1.0];
        let (mut lo, mut hi) = ([f32::INFINITY; 2], [f32::NEG_INFINITY; 2]);
        key_bounds(&rows, 2, &mut lo, &mut hi);
        assert_eq!((lo, hi), ([1.0, -2.0], [4.0, 0.5]));
    }
}
