//! Ranking thousands of summaries per decode step: each one's estimated log-mass (one key's
//! term plus the others' count times their mean's) and an integer key that sorts it,
//! highest first.
//!
//! Why a kernel: Saap scores every cell of every sparse layer and KV head each step (4,096
//! per head at 32K, ~190,000 per token on Qwen2.5-0.5B). At that count the library's
//! `exp`/`ln`, and a branch per cell to skip empty ones, cost more than the cells' 8-bit
//! products (a profile at depth 32K: the loop that turned products into masses and pushed
//! them took 4.6% of decode, the products 3.5%). So both loops are branch-free for the
//! compiler to vectorize, and compiled twice — at the baseline and under AVX2 + FMA, chosen
//! at run time. The same operations in the same order (Rust never contracts a product and a
//! sum into an FMA), so every level gives the same bits.

use crate::kernel::Level;

/// `ln(exp(a) + exp(b))`, within 1e-5 of exact, without overflow (`b = −∞` gives `a`; NaN
/// in both gives NaN). Branch-free, so a loop of it vectorizes. `hi + ln(1 + 2^x)` with
/// `x = (lo − hi) · log₂e ≤ 0`: `2^x` from its integer part put in the exponent bits and a
/// polynomial of the fraction, `ln(1 + t) = 2 atanh(t / (2 + t))` from its odd series
/// (`t / (2 + t) ≤ 1/3`).
#[inline(always)]
fn log_add_exp(a: f32, b: f32) -> f32 {
    // 1.5 · 2²³: adding it rounds to an integer, which lands in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let hi = a.max(b);
    let x = ((a.min(b) - hi) * std::f32::consts::LOG2_E).max(-125.0);
    let z = x + ROUND;
    let k = z.to_bits().wrapping_sub(ROUND.to_bits());
    let f = x - (z - ROUND);
    // 2^f for |f| ≤ 1/2: its Taylor series to f⁶.
    let p = 1.0
        + f * (std::f32::consts::LN_2
            + f * (0.240_226_5
                + f * (0.055_504_1 + f * (0.009_618_1 + f * (0.001_333_4 + f * 0.000_154_0)))));
    let t = p * f32::from_bits(k.wrapping_add(127) << 23);
    let u = t / (2.0 + t);
    let u2 = u * u;
    hi + 2.0 * u * (1.0 + u2 * (1.0 / 3.0 + u2 * (0.2 + u2 * (1.0 / 7.0 + u2 / 9.0))))
}

/// `rests[i] ← ln(exp(scale · longest[i]) + exp(ln_counts[i] + scale · rests[i]))` for
/// every `i`: a summary's estimated log-mass from its one apart key's product
/// (`longest`), its other keys' mean product (`rests`, overwritten) and the logarithm of
/// their count (`ln_counts`, −∞ for none), each product scaled to a logit by `scale`.
pub fn log_masses(level: Level, longest: &[f32], rests: &mut [f32], ln_counts: &[f32], scale: f32) {
    assert!(
        longest.len() >= rests.len() && ln_counts.len() >= rests.len(),
        "fewer products than masses asked for"
    );
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2 and FMA are available (`usable`); the loop only indexes within the
        // slices (zipped).
        unsafe { log_masses_avx2(longest, rests, ln_counts, scale) };
        return;
    }
    let _ = level; // (elsewhere than x86_64 the baseline loop, which NEON vectorizes)
    log_masses_loop(longest, rests, ln_counts, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_masses_avx2(longest: &[f32], rests: &mut [f32], ln_counts: &[f32], scale: f32) {
    log_masses_loop(longest, rests, ln_counts, scale);
}

#[inline(always)]
fn log_masses_loop(longest: &[f32], rests: &mut [f32], ln_counts: &[f32], scale: f32) {
    for ((r, &l), &ln) in rests.iter_mut().zip(longest).zip(ln_counts) {
        *r = log_add_exp(scale * l, ln + scale * *r);
    }
}

/// A key that sorts summary `id` of score `score` ascending by score descending, then by
/// id: the score's bits made order-preserving as an unsigned integer (NaN as −∞) and
/// inverted, above the id. Every key is below `u64::MAX`, which [`rank_keys`] gives the
/// empty summaries.
#[inline(always)]
pub fn rank_key(score: f32, id: u32) -> u64 {
    let score = if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score
    };
    let bits = score.to_bits();
    let ordered = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    (u64::from(!ordered) << 32) | u64::from(id)
}

/// `keys` ← the [`rank_key`] of each summary `i` (`scores[i]`, id `i`), or `u64::MAX` where
/// `sizes[i]` is 0, so sorting the keys puts the empty summaries after every other; returns
/// how many are not empty.
pub fn rank_keys(level: Level, scores: &[f32], sizes: &[u32], keys: &mut Vec<u64>) -> usize {
    assert!(sizes.len() >= scores.len(), "fewer sizes than scores");
    assert!(
        u32::try_from(scores.len()).is_ok(),
        "more summaries than ids"
    );
    // Every key is written below: only a longer list needs new (zeroed) room.
    keys.resize(scores.len(), 0);
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2 and FMA are available (`usable`); the loop only indexes within the
        // slices (zipped).
        return unsafe { rank_keys_avx2(scores, sizes, keys) };
    }
    let _ = level;
    rank_keys_loop(scores, sizes, keys)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rank_keys_avx2(scores: &[f32], sizes: &[u32], keys: &mut [u64]) -> usize {
    rank_keys_loop(scores, sizes, keys)
}

#[inline(always)]
fn rank_keys_loop(scores: &[f32], sizes: &[u32], keys: &mut [u64]) -> usize {
    let mut live = 0;
    for (i, ((k, &s), &n)) in keys.iter_mut().zip(scores).zip(sizes).enumerate() {
        *k = if n == 0 {
            u64::MAX
        } else {
            rank_key(s, i as u32)
        };
        live += usize::from(n != 0);
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::reference::uniform;

    /// The fast log-add-exp against f64 over gaps from 0 to past f32's exponent range, both
    /// orders, signs and magnitudes, and its edges.
    #[test]
    fn log_add_exp_is_within_1e5_of_f64() {
        let mut worst = 0f64;
        for i in 0..20_000 {
            let a = ((i as f64 * 0.37).sin() * 60.0) as f32;
            let b = a - (i % 400) as f32 * 0.3 - (i as f32 * 0.001);
            for (x, y) in [(a, b), (b, a)] {
                let (x64, y64) = (x as f64, y as f64);
                let hi = x64.max(y64);
                let want = hi + ((x64 - hi).exp() + (y64 - hi).exp()).ln();
                let err = (log_add_exp(x, y) as f64 - want).abs();
                worst = worst.max(err);
            }
        }
        assert!(worst < 1e-5, "worst error {worst}");
        assert_eq!(log_add_exp(1.5, f32::NEG_INFINITY), 1.5);
        assert_eq!(log_add_exp(f32::NEG_INFINITY, -3.0), -3.0);
        assert!((log_add_exp(2.0, 2.0) - (2.0 + std::f32::consts::LN_2)).abs() < 1e-6);
        assert!(log_add_exp(f32::NAN, f32::NAN).is_nan());
    }

    /// Every level gives the bits of the one-at-a-time `log_add_exp`, which is within 1e-5
    /// of f64; at lengths that leave partial vectors, with empty rests (−∞), NaN and
    /// infinite products among them.
    #[test]
    fn every_level_gives_each_mass_as_one_log_add_exp() {
        let mut r = uniform(5);
        for n in [0usize, 1, 7, 8, 9, 31, 100, 4099] {
            let longest: Vec<f32> = (0..n).map(|_| r() * 40.0).collect();
            let mut rests: Vec<f32> = (0..n).map(|_| r() * 40.0).collect();
            let mut ln_counts: Vec<f32> = (0..n).map(|i| ((i % 12) as f32).ln()).collect();
            if n > 9 {
                rests[3] = f32::NAN;
                ln_counts[5] = f32::INFINITY;
                rests[8] = f32::NEG_INFINITY;
            }
            let scale = 0.0179;
            let want: Vec<f32> = (0..n)
                .map(|i| log_add_exp(scale * longest[i], ln_counts[i] + scale * rests[i]))
                .collect();
            for (i, &w) in want.iter().enumerate() {
                let (a, b) = (
                    (scale * longest[i]) as f64,
                    (ln_counts[i] + scale * rests[i]) as f64,
                );
                if a.is_finite() && b.is_finite() {
                    let hi = a.max(b);
                    let exact = hi + ((a - hi).exp() + (b - hi).exp()).ln();
                    assert!((w as f64 - exact).abs() < 1e-5, "cell {i}: {w} vs {exact}");
                }
            }
            for level in Level::supported() {
                let mut got = rests.clone();
                log_masses(level, &longest, &mut got, &ln_counts, scale);
                let (g, w): (Vec<u32>, Vec<u32>) = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (g.to_bits(), w.to_bits()))
                    .unzip();
                assert_eq!(g, w, "{level:?}, {n} cells");
            }
        }
    }

    /// Keys sort by score descending, then by id; NaN ranks with −∞, below every number;
    /// empty summaries sort after all of them and are not counted; every level alike.
    #[test]
    fn rank_keys_sort_by_score_descending_then_id_with_empty_ones_last() {
        let scores = [
            0.5,
            -1.0,
            f32::NAN,
            3.0,
            0.5,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            f32::INFINITY,
            2.0,
            -7.5,
        ];
        let sizes = [3, 1, 2, 5, 1, 4, 1, 1, 2, 0, 6];
        let mut first: Option<Vec<u64>> = None;
        for level in Level::supported() {
            let mut keys = Vec::new();
            let live = rank_keys(level, &scores, &sizes, &mut keys);
            assert_eq!(live, 10);
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            let ids: Vec<u64> = sorted
                .iter()
                .map(|&k| if k == u64::MAX { 99 } else { k & 0xffff_ffff })
                .collect();
            // -0.0 and 0.0 order by their bits: 0.0 above -0.0.
            assert_eq!(ids, [8, 3, 0, 4, 7, 6, 1, 10, 2, 5, 99], "{level:?}");
            match &first {
                None => first = Some(keys),
                Some(f) => assert_eq!(f, &keys, "{level:?} differs from the baseline loop"),
            }
        }
    }
}
