//! Summary vectors kept as 8-bit rows with one scale each, scored against a query: for
//! policies that score thousands of small summaries per decode step (Saap's cells: 4,096 per
//! KV head and layer at 32K), where reading them as f32 would cost four times the memory
//! traffic and a general quantized format's per-block scales buy nothing.
//!
//! A row `x` is stored as `round(x / s)` with `s = max|x| / 127`, so each value is within
//! `s / 2` of its own ([`quantize_row`]). The query is quantized the same way, so
//! [`scaled_row_dots`] sums integer products exactly and scales once: `s · s_q · Σ_d q_d ·
//! row_d` for every row. Why 8-bit queries: widening each quant to f32 for an FMA takes four
//! instructions per eight values, integer pair products one group of five per 32, so the
//! products keep up with the rows' reads even where memory is fast; the sums are exact, so
//! every level gives the same bits; and the query's quantization moves a score by at most
//! `s_q / 2 · Σ_d |row_d|`, a few hundredths of a logit for summaries that rank cells, not
//! weigh values.

use crate::kernel::Level;

/// Quantizes `x` into `out` (same length) and returns the row's scale `max|x| / 127` (0 for
/// a zero row; NaN or infinite values give a scale that is not finite, which scores carry).
pub fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(x.len(), out.len(), "a row and its quants differ in length");
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    if x.iter().any(|v| !v.is_finite()) {
        return f32::NAN;
    }
    scale
}

/// `out[r] = Σ_d q[d] · rows[r · dim + d] · (scales[r] · q_scale)` for each of `out.len()`
/// rows of `dim = q.len()` quants, `q` a query quantized by [`quantize_row`] with scale
/// `q_scale`: the sum exact in i32, so every level gives the same bits (the AVX2 kernel when
/// `level` allows; this portable loop is its reference). Quants must lie within ±127, as
/// [`quantize_row`] makes them.
pub fn scaled_row_dots(
    level: Level,
    rows: &[i8],
    scales: &[f32],
    q: &[i8],
    q_scale: f32,
    out: &mut [f32],
) {
    let dim = q.len();
    assert!(
        rows.len() >= out.len() * dim && scales.len() >= out.len(),
        "fewer rows than scores asked for"
    );
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2 is available (`usable`); the lengths are checked above.
        unsafe { crate::kernel::avx2::scaled_i8_dots(rows, scales, q, q_scale, out) };
        return;
    }
    let _ = level; // (elsewhere than x86_64 only the portable loop below exists)
    for (r, o) in out.iter_mut().enumerate() {
        let row = &rows[r * dim..][..dim];
        let sum: i32 = row.iter().zip(q).map(|(&k, &x)| k as i32 * x as i32).sum();
        *o = sum as f32 * (scales[r] * q_scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::reference::uniform;

    #[test]
    fn quantized_values_are_within_half_a_scale_of_their_own() {
        let mut r = uniform(3);
        for dim in [1usize, 5, 64, 130] {
            let x: Vec<f32> = (0..dim).map(|_| r() * 4.0).collect();
            let mut q = vec![0i8; dim];
            let s = quantize_row(&x, &mut q);
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!((s - amax / 127.0).abs() <= f32::EPSILON * amax);
            for (&v, &k) in x.iter().zip(&q) {
                assert!(
                    (v - k as f32 * s).abs() <= s * 0.5 * (1.0 + 1e-5),
                    "{v} vs {k}·{s}"
                );
            }
        }
        let mut q = [5i8; 3];
        assert_eq!(quantize_row(&[0.0; 3], &mut q), 0.0);
        assert_eq!(q, [0; 3]);
        assert!(quantize_row(&[1.0, f32::NAN, 2.0], &mut q).is_nan());
        assert!(!quantize_row(&[1.0, f32::INFINITY], &mut [0; 2]).is_finite());
    }

    /// Every level gives the exact integer sum of the same quants, scaled, bit for bit alike,
    /// at widths with and without a partial 32-quant group, with a row count that is not a
    /// multiple of anything, and at the quants' extremes (±127 everywhere: the largest pair
    /// sums the kernel's 16-bit step holds).
    #[test]
    fn every_level_scores_the_rows_as_the_exact_integer_sum() {
        let mut r = uniform(11);
        for dim in [1usize, 7, 31, 32, 64, 67, 130] {
            let n = 37;
            let mut q: Vec<i8> = (0..dim).map(|_| (r() * 127.0) as i8).collect();
            let mut rows: Vec<i8> = (0..n * dim).map(|_| (r() * 127.0) as i8).collect();
            let scales: Vec<f32> = (0..n).map(|_| r().abs() * 0.05).collect();
            let q_scale = 0.0137;
            for extreme in [false, true] {
                if extreme {
                    q.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x = if i % 3 == 0 { -127 } else { 127 });
                    rows.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x = if i % 5 == 0 { 127 } else { -127 });
                }
                let mut first: Option<Vec<f32>> = None;
                for level in Level::supported() {
                    let mut got = vec![f32::NAN; n];
                    scaled_row_dots(level, &rows, &scales, &q, q_scale, &mut got);
                    for (i, &g) in got.iter().enumerate() {
                        let sum: i64 = (0..dim)
                            .map(|d| q[d] as i64 * rows[i * dim + d] as i64)
                            .sum();
                        let want = sum as f64 * scales[i] as f64 * q_scale as f64;
                        // Two f32 roundings of the products and one of the sum's conversion.
                        assert!(
                            (g as f64 - want).abs() <= want.abs() * 4.0 * f32::EPSILON as f64,
                            "{level:?} dim {dim} row {i}: {g} vs {want}"
                        );
                    }
                    match &first {
                        None => first = Some(got),
                        Some(f) => assert_eq!(f, &got, "{level:?} differs from the scalar loop"),
                    }
                }
            }
        }
    }
}
