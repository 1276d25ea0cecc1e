//! Summary vectors kept as 8-bit rows with one scale each, scored against a query: for
//! policies that score thousands of small summaries per decode step (Saap's cells: 4,096 per
//! KV head and layer at 32K), where reading them as f32 would cost four times the memory
//! traffic and a general quantized format's per-block scales buy nothing.
//!
//! A row `x` is stored as `round(x / s)` with `s = max|x| / 127`, so each value is within
//! `s / 2` of its own ([`quantize_row`]); [`scaled_row_dots`] gives `s · Σ_d q_d · row_d`
//! in f32 for every row.

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

/// `out[r] = scales[r] · Σ_d q[d] · rows[r · dim + d]` for each of `out.len()` rows of
/// `dim = q.len()` quants; on the AVX2 kernel when `level` allows, the portable loop (eight
/// partial sums per row, as the kernel's lanes) being its reference.
pub fn scaled_row_dots(level: Level, rows: &[i8], scales: &[f32], q: &[f32], out: &mut [f32]) {
    let dim = q.len();
    assert!(
        rows.len() >= out.len() * dim && scales.len() >= out.len(),
        "fewer rows than scores asked for"
    );
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2 and FMA are available (`usable`); the lengths are checked above.
        unsafe { crate::kernel::avx2::scaled_i8_dots(rows, scales, q, out) };
        return;
    }
    let _ = level; // (elsewhere than x86_64 only the portable loop below exists)
    const LANES: usize = 8;
    let whole = dim / LANES * LANES;
    for (r, o) in out.iter_mut().enumerate() {
        let row = &rows[r * dim..][..dim];
        let mut acc = [0.0f32; LANES];
        for i in (0..whole).step_by(LANES) {
            for l in 0..LANES {
                acc[l] += q[i + l] * row[i + l] as f32;
            }
        }
        let tail: f32 = (whole..dim).map(|d| q[d] * row[d] as f32).sum();
        *o = scales[r] * (acc.iter().sum::<f32>() + tail);
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

    /// Every level against an f64 sum of the same quants, at widths with and without a
    /// partial lane group, with a row count that is not a multiple of anything.
    #[test]
    fn every_level_scores_the_rows_as_the_f64_reference() {
        let mut r = uniform(11);
        for dim in [1usize, 7, 8, 16, 64, 67, 130] {
            let n = 37;
            let q: Vec<f32> = (0..dim).map(|_| r() * 2.0).collect();
            let rows: Vec<i8> = (0..n * dim).map(|_| (r() * 127.0) as i8).collect();
            let scales: Vec<f32> = (0..n).map(|_| r().abs() * 0.05).collect();
            // f32 rounding of `dim` products and sums, each within ε of the running total
            // (at most Σ|q| · 127), then the scale's product.
            let eps = f32::EPSILON as f64;
            let bound =
                q.iter().map(|x| x.abs() as f64).sum::<f64>() * 127.0 * (dim + 2) as f64 * eps;
            for level in Level::supported() {
                let mut got = vec![f32::NAN; n];
                scaled_row_dots(level, &rows, &scales, &q, &mut got);
                for (i, &g) in got.iter().enumerate() {
                    let want = scales[i] as f64
                        * (0..dim)
                            .map(|d| q[d] as f64 * rows[i * dim + d] as f64)
                            .sum::<f64>();
                    assert!(
                        (g as f64 - want).abs() <= bound * scales[i] as f64,
                        "{level:?} dim {dim} row {i}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
