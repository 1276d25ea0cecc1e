//! The inner loops of dense attention, each written twice: a scalar reference here, and a
//! vector version (`simd`'s loops over AVX2 (+FMA, F16C) primitives on x86_64 or NEON ones
//! on AArch64), chosen at run time. Both follow the same order of operations, so they
//! differ only by FMA contraction and the vector `exp` (Cephes' polynomial, within 2 ulp).
//!
//! The layouts, for one tile of `n` keys and a block of query rows padded to `rw` (a
//! multiple of 8 for the SIMD paths):
//! - keys / values: `n` rows of `hd` floats, `stride` apart (the cache's rows for one kv
//!   head, or a tile converted from f16 or dequantized from Q8_0);
//! - queries transposed: `qt[d * rw + r]`, so 8 rows share one vector;
//! - scores / probabilities: `s[t * rw + r]`, so the softmax runs 8 rows per vector;
//! - output accumulators: `o[r * hd + d]`.

use super::level::Level;
#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
pub use super::view::Tile;
#[cfg(feature = "fp16")]
use half::{f16, slice::HalfFloatSliceExt};

#[cfg(feature = "fp16")]
/// `dst[t * width + j] = src[t * stride + j]` as f32, for `t < n`, `j < width`.
pub fn convert_tile(
    level: Level,
    src: &[f16],
    stride: usize,
    n: usize,
    width: usize,
    dst: &mut [f32],
) {
    let src = Tile::new(src, stride, n, width);
    src.check();
    assert!(dst.len() >= n * width, "tile out of bounds");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU just above (`usable`).
        unsafe { avx2::convert_tile(src, dst) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if level == Level::Neon {
        // SAFETY: NEON is part of the AArch64 baseline; the bounds the kernel relies on
        // were asserted above.
        unsafe { neon::convert_tile(src, dst) };
        return;
    }
    let _ = level;
    for t in 0..n {
        src.row(t)
            .convert_to_f32_slice(&mut dst[t * width..][..width]);
    }
}

#[cfg(feature = "fp16")]
/// Dequantize Q8_0 rows: `dst[t * 32·width + j] = value j of blocks src[t * stride..][..width]`
/// for `t < n`, with `stride` and `width` counted in blocks. Each value is `q as f32 * d` (one
/// rounding), so both levels give identical results.
pub fn dequant_q8_0_tile(
    level: Level,
    src: &[BlockQ8_0],
    stride: usize,
    n: usize,
    width: usize,
    dst: &mut [f32],
) {
    let src = Tile::new(src, stride, n, width);
    src.check();
    assert!(dst.len() >= n * width * QK8_0, "tile out of bounds");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU just above (`usable`); the
        // bounds the kernel relies on were asserted above.
        unsafe { avx2::dequant_q8_0_tile(src, dst) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if level == Level::Neon {
        // SAFETY: NEON is part of the AArch64 baseline; the bounds the kernel relies on
        // were asserted above.
        unsafe { neon::dequant_q8_0_tile(src, dst) };
        return;
    }
    let _ = level;
    for t in 0..n {
        let out = &mut dst[t * width * QK8_0..][..width * QK8_0];
        for (b, o) in src.row(t).iter().zip(out.chunks_exact_mut(QK8_0)) {
            b.dequantize(o);
        }
    }
}

/// Scores of a tile: `s[t * rw + r] = scale * Σ_d k.row(t)[d] * qt[d * rw + r]` for
/// `t < k.n`, `r < rw` — the keys against a query block transposed (`qt[d * rw + r]`, so 8
/// rows share one vector), `rw` the block's rows padded.
pub fn scores(level: Level, k: Tile<'_>, qt: &[f32], rw: usize, scale: f32, s: &mut [f32]) {
    let (n, hd) = (k.n, k.width);
    k.check();
    assert!(
        qt.len() >= hd * rw && s.len() >= n * rw,
        "tile out of bounds"
    );
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let job = ScoreTile {
        k: k.raw(),
        qt: qt.as_ptr(),
        s: s.as_mut_ptr(),
        rw,
        scale,
    };
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() && rw.is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above and `rw` is a multiple of 8.
        unsafe { avx2::scores(job) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if level == Level::Neon && rw.is_multiple_of(8) {
        // SAFETY: NEON is part of the AArch64 baseline; the bounds the kernel relies on
        // were asserted above and `rw` is a multiple of 8.
        unsafe { neon::scores(job) };
        return;
    }
    for t in 0..n {
        let kt = k.row(t);
        for r in 0..rw {
            let mut acc = 0.0f32;
            for (d, &kv) in kt.iter().enumerate() {
                acc += kv * qt[d * rw + r];
            }
            s[t * rw + r] = acc * scale;
        }
    }
}

/// One tile of online softmax for every row `r < rw`: with `mx` the tile's maximum score,
/// `m' = max(m, mx)`, `corr[r] = exp(m - m')`, `s ← exp(s - m')`, `l ← l·corr + Σ s`,
/// `m ← m'`. A row whose scores are all `-inf` so far keeps `m = -inf` and gets zeros.
pub fn softmax_tile(
    level: Level,
    s: &mut [f32],
    n: usize,
    rw: usize,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    assert!(s.len() >= n * rw, "tile out of bounds");
    assert!(m.len() >= rw && l.len() >= rw && corr.len() >= rw);
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() && rw.is_multiple_of(8) {
        let job = SoftmaxTile {
            s,
            n,
            rw,
            m,
            l,
            corr,
        };
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above and `rw` is a multiple of 8.
        unsafe { avx2::softmax_tile(job) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if level == Level::Neon && rw.is_multiple_of(4) {
        let job = SoftmaxTile {
            s,
            n,
            rw,
            m,
            l,
            corr,
        };
        // SAFETY: NEON is part of the AArch64 baseline; the bounds the kernel relies on
        // were asserted above and `rw` is a multiple of 4.
        unsafe { neon::softmax_tile(job) };
        return;
    }
    for r in 0..rw {
        let mut mx = f32::NEG_INFINITY;
        for t in 0..n {
            mx = mx.max(s[t * rw + r]);
        }
        let m_new = m[r].max(mx);
        let m_use = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        let c = (m[r] - m_use).exp();
        let mut sum = 0.0f32;
        for t in 0..n {
            let p = (s[t * rw + r] - m_use).exp();
            s[t * rw + r] = p;
            sum += p;
        }
        l[r] = l[r] * c + sum;
        m[r] = m_new;
        corr[r] = c;
    }
}

/// Weighted values: `o[r * hd + d] += Σ_t p[t * rw + r] · v.row(t)[d]` for `r < rows`,
/// `d < hd = v.width`, `t < v.n` — a block's probabilities (`p[t * rw + r]`, `rw` its
/// padded rows, the first `rows` real) times a tile of values into its output
/// accumulators.
pub fn pv(level: Level, p: &[f32], rw: usize, rows: usize, v: Tile<'_>, o: &mut [f32]) {
    let (n, hd) = (v.n, v.width);
    v.check();
    assert!(rows <= rw && p.len() >= n * rw && o.len() >= rows * hd);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let job = PvTile {
        p: p.as_ptr(),
        rw,
        v: v.raw(),
        o: o.as_mut_ptr(),
        o_stride: hd,
    };
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above.
        unsafe { avx2::pv(job, rows) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if level == Level::Neon {
        // SAFETY: NEON is part of the AArch64 baseline; the bounds the kernel relies on
        // were asserted above.
        unsafe { neon::pv(job, rows) };
        return;
    }
    for r in 0..rows {
        let acc = &mut o[r * hd..(r + 1) * hd];
        for t in 0..n {
            let w = p[t * rw + r];
            acc.iter_mut().zip(v.row(t)).for_each(|(a, &x)| *a += w * x);
        }
    }
}

/// `x ← exp((x - top) · scale)` in place, a NaN becoming 0, and the sum of the results: the
/// exponentials of a softmax over many scores at once (a selection policy's estimated
/// logits over every key). The AVX2 level runs 8 lanes through the kernels' `exp`
/// (within 2.5e-7 of libm's, see its test); this loop is its reference.
pub fn exp_shifted_sum(level: Level, x: &mut [f32], top: f32, scale: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2 and FMA were detected on this CPU (`usable`).
        return unsafe { avx2::exp_shifted_sum(x, top, scale) };
    }
    let _ = level; // (elsewhere only this loop exists)
    let mut total = 0.0f64;
    for v in x.iter_mut() {
        *v = if v.is_nan() {
            0.0
        } else {
            ((*v - top) * scale).exp()
        };
        total += *v as f64;
    }
    total
}

#[cfg(target_arch = "x86_64")]
use super::avx2;
#[cfg(target_arch = "aarch64")]
use super::neon;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::simd::{PvTile, ScoreTile, SoftmaxTile};

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "fp16")]
    use crate::kernel::reference::uniform as rng;

    #[cfg(feature = "fp16")]
    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let ok = (x == y) || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()));
            assert!(ok, "element {i}: {x} vs {y}");
        }
    }

    /// A vector `exp` of `lanes` lanes against libm: within 2.5e-7 relative over
    /// [-87.33, 88], 0 (or the subnormal result) below, `exp(0)` exactly 1.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn check_exp(lanes: usize, exp: impl Fn(&[f32]) -> Vec<f32>) {
        let mut xs: Vec<f32> = (0..4000).map(|i| -100.0 + i as f32 * 0.0251).collect();
        xs.extend([
            0.0,
            -0.0,
            -1e-8,
            f32::NEG_INFINITY,
            -87.3,
            -87.4,
            -88.5,
            88.0,
        ]);
        while !xs.len().is_multiple_of(lanes) {
            xs.push(-1.0);
        }
        for c in xs.chunks(lanes) {
            for (&x, g) in c.iter().zip(exp(c)) {
                let want = x.exp();
                if x < -87.33 {
                    assert!(g == 0.0 || (g - want).abs() < 1e-37, "{x}: {g}");
                } else {
                    assert!(
                        (g - want).abs() <= 2.5e-7 * want,
                        "exp({x}) = {g}, want {want}"
                    );
                }
            }
        }
        assert!(exp(&vec![0.0; lanes]).iter().all(|&y| y == 1.0));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp8_matches_libm() {
        if !Level::Avx2.usable() {
            return;
        }
        use std::arch::x86_64::*;
        check_exp(8, |c| {
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; `c` and `got` hold 8 floats.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(c.as_ptr()))) };
            got.to_vec()
        });
    }

    /// Every level's shifted exponentials equal the scalar loop's within the vector `exp`'s
    /// error, NaN to 0 and -inf to 0, at lengths around the lane count; the sums agree.
    #[test]
    fn exp_shifted_sum_matches_the_scalar_loop_at_every_level() {
        for level in Level::supported() {
            for n in [0usize, 1, 7, 8, 9, 63, 64, 65, 600] {
                let x: Vec<f32> = (0..n)
                    .map(|i| match i % 17 {
                        5 => f32::NAN,
                        11 => f32::NEG_INFINITY,
                        _ => (i as f32 * 0.731).sin() * 40.0,
                    })
                    .collect();
                let (mut got, mut want) = (x.clone(), x.clone());
                let s_got = exp_shifted_sum(level, &mut got, 12.5, 0.75);
                let s_want = exp_shifted_sum(Level::Scalar, &mut want, 12.5, 0.75);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 5e-7 * w.abs() + 1e-37,
                        "{level:?} n {n} [{i}]: {g} vs {w}"
                    );
                    if i % 17 == 5 || i % 17 == 11 {
                        assert_eq!(*g, 0.0);
                    }
                }
                assert!((s_got - s_want).abs() <= 1e-6 * s_want, "{level:?} n {n}");
            }
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn exp4_matches_libm() {
        use std::arch::aarch64::*;
        check_exp(4, |c| {
            let mut got = [0.0f32; 4];
            // SAFETY: NEON is part of the AArch64 baseline; `c` and `got` hold 4 floats.
            unsafe { vst1q_f32(got.as_mut_ptr(), neon::exp4(vld1q_f32(c.as_ptr()))) };
            got.to_vec()
        });
    }

    /// The Q8_0 tile dequantizer: each level equals the blocks' own scalar dequantization
    /// exactly (extreme quants ±127 and -128, zero, tiny, huge and subnormal scales), for
    /// strided head slices of several widths.
    #[cfg(feature = "fp16")]
    #[test]
    fn q8_0_dequant_matches_scalar() {
        let mut r = rng(11);
        for &(stride, width, off) in &[
            (4usize, 2usize, 2usize),
            (4, 4, 0),
            (8, 2, 6),
            (1, 1, 0),
            (6, 3, 3),
        ] {
            for &n in &[1usize, 2, 7, 64] {
                let blocks: Vec<BlockQ8_0> = (0..n * stride)
                    .map(|i| {
                        let mut qs = [0i8; QK8_0];
                        qs.iter_mut().for_each(|q| *q = (r() * 127.9) as i8);
                        qs[i % QK8_0] = 127;
                        qs[(i + 5) % QK8_0] = -127;
                        qs[(i + 9) % QK8_0] = -128;
                        let d = match i % 5 {
                            0 => f16::from_f32(r().abs() * 0.05),
                            1 => f16::ZERO,
                            2 => f16::from_f32(-3.5),
                            3 => f16::from_bits(1), // smallest subnormal
                            _ => f16::MAX,
                        };
                        BlockQ8_0 { d, qs }
                    })
                    .collect();
                let src = &blocks[off..];
                let rows = n - usize::from(off + width > stride);
                let mut want = vec![0.0f32; rows * width * QK8_0];
                for t in 0..rows {
                    for b in 0..width {
                        let blk = &src[t * stride + b];
                        for j in 0..QK8_0 {
                            want[(t * width + b) * QK8_0 + j] = blk.qs[j] as f32 * blk.d.to_f32();
                        }
                    }
                }
                for level in Level::supported() {
                    let mut got = vec![f32::NAN; rows * width * QK8_0];
                    dequant_q8_0_tile(level, src, stride, rows, width, &mut got);
                    assert_eq!(
                        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{level:?} stride {stride} width {width} n {rows}"
                    );
                }
            }
        }
    }

    #[cfg(feature = "fp16")]
    #[test]
    fn kernels_match_scalar() {
        let mut r = rng(7);
        for &hd in &[64usize, 3, 8, 20, 41, 96, 128] {
            for &rw in &[8usize, 16, 24, 56] {
                for &n in &[1usize, 3, 4, 9, 64] {
                    let stride = hd + 5;
                    let kh: Vec<f16> = (0..n * stride).map(|_| f16::from_f32(r() * 2.0)).collect();
                    let k: Vec<f32> = (0..n * stride).map(|_| r()).collect();
                    let v: Vec<f32> = (0..n * stride).map(|_| r()).collect();
                    let qt: Vec<f32> = (0..hd * rw).map(|_| r()).collect();
                    let (keys, values) =
                        (Tile::new(&k, stride, n, hd), Tile::new(&v, stride, n, hd));
                    let mut want_t = vec![0.0; n * hd];
                    convert_tile(Level::Scalar, &kh, stride, n, hd, &mut want_t);
                    let mut want_s = vec![0.0; n * rw];
                    scores(Level::Scalar, keys, &qt, rw, 0.3, &mut want_s);
                    // Some rows start from a previous state, some see only -inf.
                    let mut m0: Vec<f32> = (0..rw).map(|i| (i as f32) * 0.1 - 0.5).collect();
                    m0[1] = f32::NEG_INFINITY;
                    m0[2] = f32::NEG_INFINITY;
                    let mut s_in = want_s.clone();
                    for t in 0..n {
                        s_in[t * rw + 2] = f32::NEG_INFINITY;
                        if t % 2 == 0 {
                            s_in[t * rw + 3] = f32::NEG_INFINITY;
                        }
                    }
                    let l0: Vec<f32> = (0..rw).map(|i| i as f32 * 0.5).collect();
                    let (mut wm, mut wl, mut wc) = (m0.clone(), l0.clone(), vec![0.0; rw]);
                    let mut want_p = s_in.clone();
                    softmax_tile(Level::Scalar, &mut want_p, n, rw, &mut wm, &mut wl, &mut wc);
                    // Every row-block decomposition: 1..=rw rows.
                    let mut want_os = Vec::new();
                    for rows in 1..=rw {
                        let o0: Vec<f32> = (0..rows * hd).map(|_| r()).collect();
                        let mut want_o = o0.clone();
                        pv(Level::Scalar, &want_p, rw, rows, values, &mut want_o);
                        want_os.push((rows, o0, want_o));
                    }
                    assert_eq!(wm[2], f32::NEG_INFINITY);
                    assert_eq!((wl[2], wc[2]), (0.0, 0.0));

                    for level in Level::supported() {
                        let mut got_t = vec![0.0; n * hd];
                        convert_tile(level, &kh, stride, n, hd, &mut got_t);
                        assert_eq!(got_t, want_t, "{level:?} convert hd {hd}");
                        let mut got_s = vec![0.0; n * rw];
                        scores(level, keys, &qt, rw, 0.3, &mut got_s);
                        close(&got_s, &want_s, 1e-6);
                        let (mut gm, mut gl, mut gc) = (m0.clone(), l0.clone(), vec![0.0; rw]);
                        let mut got_p = s_in.clone();
                        softmax_tile(level, &mut got_p, n, rw, &mut gm, &mut gl, &mut gc);
                        assert_eq!(gm, wm);
                        close(&got_p, &want_p, 1e-6);
                        close(&gl, &wl, 1e-6);
                        close(&gc, &wc, 1e-6);
                        for (rows, o0, want_o) in &want_os {
                            let mut got_o = o0.clone();
                            pv(level, &want_p, rw, *rows, values, &mut got_o);
                            close(&got_o, want_o, 1e-6);
                        }
                    }
                }
            }
        }
    }
}
