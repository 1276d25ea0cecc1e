//! The inner loops of dense attention, each written twice: a scalar reference and an AVX2
//! (+FMA, F16C) version chosen at run time. Both follow the same order of operations, so they
//! differ only by FMA contraction and the vector `exp` (Cephes' polynomial, within 2 ulp).
//!
//! The layouts, for one tile of `n` keys and a block of query rows padded to `rw` (a
//! multiple of 8 for the SIMD paths):
//! - keys / values: `n` rows of `hd` floats, `stride` apart (the cache's rows for one kv
//!   head, or a tile converted from f16 or dequantized from Q8_0);
//! - queries transposed: `qt[d * rw + r]`, so 8 rows share one vector;
//! - scores / probabilities: `s[t * rw + r]`, so the softmax runs 8 rows per vector;
//! - output accumulators: `o[r * hd + d]`.

use crate::kv_cache::{BlockQ8_0, QK8_0};
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::sync::OnceLock;

/// Instruction set of the attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar,
    Avx2,
}

impl Level {
    /// The levels usable on this CPU, lowest first.
    pub fn supported() -> Vec<Level> {
        let mut v = vec![Level::Scalar];
        if avx2_available() {
            v.push(Level::Avx2);
        }
        v
    }

    /// The best supported level, capped to scalar by `SPARROW_SIMD=scalar`; detected once.
    pub fn active() -> Level {
        static ACTIVE: OnceLock<Level> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let capped = std::env::var("SPARROW_SIMD").is_ok_and(|v| v.trim() == "scalar");
            if capped || !avx2_available() {
                Level::Scalar
            } else {
                Level::Avx2
            }
        })
    }

    /// Whether this level's kernels may run (falls back to scalar otherwise).
    fn usable(self) -> bool {
        match self {
            Level::Scalar => true,
            Level::Avx2 => avx2_available(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

fn check_rows(len: usize, n: usize, stride: usize, width: usize) {
    assert!(width <= stride || n <= 1, "rows overlap");
    assert!(
        n == 0 || len >= (n - 1) * stride + width,
        "tile out of bounds"
    );
}

/// `dst[t * width + j] = src[t * stride + j]` as f32, for `t < n`, `j < width`.
pub fn convert_tile(
    level: Level,
    src: &[f16],
    stride: usize,
    n: usize,
    width: usize,
    dst: &mut [f32],
) {
    check_rows(src.len(), n, stride, width);
    assert!(dst.len() >= n * width, "tile out of bounds");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU just above (`usable`).
        unsafe { avx2::convert_tile(src, stride, n, width, dst) };
        return;
    }
    let _ = level;
    for t in 0..n {
        src[t * stride..t * stride + width].convert_to_f32_slice(&mut dst[t * width..][..width]);
    }
}

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
    check_rows(src.len(), n, stride, width);
    assert!(dst.len() >= n * width * QK8_0, "tile out of bounds");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU just above (`usable`); the
        // bounds the kernel relies on were asserted above.
        unsafe { avx2::dequant_q8_0_tile(src, stride, n, width, dst) };
        return;
    }
    let _ = level;
    for t in 0..n {
        let row = &src[t * stride..][..width];
        let out = &mut dst[t * width * QK8_0..][..width * QK8_0];
        for (b, o) in row.iter().zip(out.chunks_exact_mut(QK8_0)) {
            b.dequantize(o);
        }
    }
}

/// Scores of a tile: `s[t * rw + r] = scale * Σ_d k[t * stride + d] * qt[d * rw + r]` for
/// `t < n`, `r < rw`.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    level: Level,
    k: &[f32],
    stride: usize,
    n: usize,
    hd: usize,
    qt: &[f32],
    rw: usize,
    scale: f32,
    s: &mut [f32],
) {
    check_rows(k.len(), n, stride, hd);
    assert!(
        qt.len() >= hd * rw && s.len() >= n * rw,
        "tile out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() && rw.is_multiple_of(8) {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above and `rw` is a multiple of 8.
        unsafe { avx2::scores(k, stride, n, hd, qt, rw, scale, s) };
        return;
    }
    for t in 0..n {
        let kt = &k[t * stride..][..hd];
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
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above and `rw` is a multiple of 8.
        unsafe { avx2::softmax_tile(s, n, rw, m, l, corr) };
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

/// Weighted values: `o[r * hd + d] += Σ_t p[t * rw + r] · v[t * stride + d]` for
/// `r < rows`, `d < hd`, `t < n`.
#[allow(clippy::too_many_arguments)]
pub fn pv(
    level: Level,
    p: &[f32],
    rw: usize,
    rows: usize,
    v: &[f32],
    stride: usize,
    n: usize,
    hd: usize,
    o: &mut [f32],
) {
    check_rows(v.len(), n, stride, hd);
    assert!(rows <= rw && p.len() >= n * rw && o.len() >= rows * hd);
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU (`usable`); the bounds the
        // kernel relies on were asserted above.
        unsafe { avx2::pv(p, rw, rows, v, stride, n, hd, o) };
        return;
    }
    for r in 0..rows {
        let acc = &mut o[r * hd..(r + 1) * hd];
        for t in 0..n {
            let w = p[t * rw + r];
            let vt = &v[t * stride..][..hd];
            acc.iter_mut().zip(vt).for_each(|(a, &x)| *a += w * x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernels. Every function here requires AVX2, FMA and F16C (checked by the
    //! callers in the parent module) and the slice bounds the parent's wrappers assert.

    use crate::kv_cache::{BlockQ8_0, QK8_0};
    use half::f16;
    use std::arch::x86_64::*;

    /// `exp(x)` for 8 lanes (Cephes `expf`: range reduction by ln 2 in two parts and a
    /// degree-5 polynomial). Inputs below -87.33 give 0, `exp(0)` is exactly 1.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp8(x: __m256) -> __m256 {
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_54));
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_54));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let r2 = _mm256_mul_ps(r, r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.398_199_9e-3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.333_452e-3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.166_579_6e-2));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.666_666_5e-1));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5));
        let y = _mm256_fmadd_ps(y, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
        _mm256_andnot_ps(tiny, _mm256_mul_ps(y, pow2n))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn convert_tile(
        src: &[f16],
        stride: usize,
        n: usize,
        width: usize,
        dst: &mut [f32],
    ) {
        let full = width / 8 * 8;
        for t in 0..n {
            let s = &src[t * stride..][..width];
            let d = &mut dst[t * width..][..width];
            let mut j = 0;
            while j < full {
                // SAFETY: `j + 8 <= width`, the length of both `s` and `d`; `f16` is a
                // transparent `u16`, so 8 of them are the 128 bits `cvtph` reads.
                unsafe {
                    let h = _mm_loadu_si128(s.as_ptr().add(j) as *const __m128i);
                    _mm256_storeu_ps(d.as_mut_ptr().add(j), _mm256_cvtph_ps(h));
                }
                j += 8;
            }
            for j in full..width {
                d[j] = s[j].to_f32();
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequant_q8_0_tile(
        src: &[BlockQ8_0],
        stride: usize,
        n: usize,
        width: usize,
        dst: &mut [f32],
    ) {
        for t in 0..n {
            let row = &src[t * stride..][..width];
            let out = &mut dst[t * width * QK8_0..][..width * QK8_0];
            for (b, o) in row.iter().zip(out.chunks_exact_mut(QK8_0)) {
                // SAFETY: `b.qs` holds 32 bytes, read 8 at a time at offsets 0, 8, 16, 24;
                // `o` holds 32 floats, written 8 at a time at the same offsets.
                unsafe {
                    let d = _mm256_set1_ps(b.d.to_f32());
                    let q = b.qs.as_ptr();
                    for j in (0..QK8_0).step_by(8) {
                        let bytes = _mm_loadl_epi64(q.add(j) as *const __m128i);
                        let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                        _mm256_storeu_ps(o.as_mut_ptr().add(j), _mm256_mul_ps(x, d));
                    }
                }
            }
        }
    }

    /// `KB` keys × `RB` row vectors of scores; `k` points at the first key's row, `qt` at the
    /// first row vector of dimension 0, `s` at the first key's first row vector.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn score_block<const KB: usize, const RB: usize>(
        k: *const f32,
        stride: usize,
        hd: usize,
        qt: *const f32,
        rw: usize,
        scale: __m256,
        s: *mut f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); RB]; KB];
        for d in 0..hd {
            // SAFETY (whole block): the caller guarantees keys `0..KB` (rows `stride` apart,
            // `hd` long), query vectors `0..RB` of each of the `hd` dimensions and score
            // vectors `0..RB` of keys `0..KB` are in bounds.
            unsafe {
                let mut qv = [_mm256_setzero_ps(); RB];
                for (j, v) in qv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(qt.add(d * rw + j * 8));
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    let b = _mm256_broadcast_ss(&*k.add(i * stride + d));
                    for (x, &q) in a.iter_mut().zip(&qv) {
                        *x = _mm256_fmadd_ps(b, q, *x);
                    }
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (j, &x) in a.iter().enumerate() {
                // SAFETY: see above.
                unsafe { _mm256_storeu_ps(s.add(i * rw + j * 8), _mm256_mul_ps(x, scale)) };
            }
        }
    }

    /// Keys `0..n` for `RB` row vectors starting at vector `v`: blocks of `KB` keys, then
    /// of 4, then single keys.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn score_rows<const KB: usize, const RB: usize>(
        k: *const f32,
        stride: usize,
        n: usize,
        hd: usize,
        qt: *const f32,
        rw: usize,
        scale: __m256,
        s: *mut f32,
    ) {
        // SAFETY (every call): keys `t..t + block` with `t + block <= n` and the `RB` row
        // vectors at `qt`/`s`, which the caller guarantees are in bounds.
        unsafe {
            let mut t = 0;
            while t + KB <= n {
                score_block::<KB, RB>(k.add(t * stride), stride, hd, qt, rw, scale, s.add(t * rw));
                t += KB;
            }
            while t + 4 <= n {
                score_block::<4, RB>(k.add(t * stride), stride, hd, qt, rw, scale, s.add(t * rw));
                t += 4;
            }
            while t < n {
                score_block::<1, RB>(k.add(t * stride), stride, hd, qt, rw, scale, s.add(t * rw));
                t += 1;
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn scores(
        k: &[f32],
        stride: usize,
        n: usize,
        hd: usize,
        qt: &[f32],
        rw: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        let scale = _mm256_set1_ps(scale);
        let (kp, qp, sp) = (k.as_ptr(), qt.as_ptr(), s.as_mut_ptr());
        let vecs = rw / 8;
        // SAFETY (every call below): keys `0..n` and row vectors `v..v + RB` with
        // `v + RB <= vecs`, which the wrapper's asserts on `k`, `qt` and `s` (`n` rows of
        // `stride`, `hd × rw`, `n × rw`) cover. Blocks use at most 15 vector registers.
        unsafe {
            let mut v = 0;
            while v + 2 <= vecs {
                let (q, o) = (qp.add(v * 8), sp.add(v * 8));
                score_rows::<6, 2>(kp, stride, n, hd, q, rw, scale, o);
                v += 2;
            }
            if v < vecs {
                let (q, o) = (qp.add(v * 8), sp.add(v * 8));
                score_rows::<12, 1>(kp, stride, n, hd, q, rw, scale, o);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn softmax_tile(
        s: &mut [f32],
        n: usize,
        rw: usize,
        m: &mut [f32],
        l: &mut [f32],
        corr: &mut [f32],
    ) {
        let sp = s.as_mut_ptr();
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        for v in 0..rw / 8 {
            let o = v * 8;
            // SAFETY: `o + 8 <= rw`, within `m`, `l`, `corr` (≥ rw) and, for `t < n`, within
            // `s` (≥ n × rw), as the wrapper asserted.
            unsafe {
                let m_old = _mm256_loadu_ps(m.as_ptr().add(o));
                let mut mx = ninf;
                for t in 0..n {
                    mx = _mm256_max_ps(mx, _mm256_loadu_ps(sp.add(t * rw + o)));
                }
                let m_new = _mm256_max_ps(m_old, mx);
                let none = _mm256_cmp_ps::<_CMP_EQ_OQ>(m_new, ninf);
                let m_use = _mm256_andnot_ps(none, m_new);
                let c = exp8(_mm256_sub_ps(m_old, m_use));
                let mut sum = _mm256_setzero_ps();
                for t in 0..n {
                    let at = sp.add(t * rw + o);
                    let p = exp8(_mm256_sub_ps(_mm256_loadu_ps(at), m_use));
                    _mm256_storeu_ps(at, p);
                    sum = _mm256_add_ps(sum, p);
                }
                let l_old = _mm256_loadu_ps(l.as_ptr().add(o));
                _mm256_storeu_ps(
                    l.as_mut_ptr().add(o),
                    _mm256_add_ps(_mm256_mul_ps(l_old, c), sum),
                );
                _mm256_storeu_ps(m.as_mut_ptr().add(o), m_new);
                _mm256_storeu_ps(corr.as_mut_ptr().add(o), c);
            }
        }
    }

    /// `RB` rows × `CB` vectors of 8 output dimensions; `p` points at the first row's
    /// probability of key 0, `v` at key 0's first dimension, `o` at the first row's first
    /// dimension.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv_block<const RB: usize, const CB: usize>(
        p: *const f32,
        rw: usize,
        v: *const f32,
        stride: usize,
        n: usize,
        o: *mut f32,
        hd: usize,
    ) {
        // SAFETY (whole function): the caller guarantees rows `0..RB` of `p` (for keys
        // `0..n`, `rw` apart) and of `o` (`hd` apart), and dimensions `0..8·CB` of `v` and
        // `o`, are in bounds.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); CB]; RB];
            for (r, a) in acc.iter_mut().enumerate() {
                for (c, x) in a.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(o.add(r * hd + c * 8));
                }
            }
            for t in 0..n {
                let mut vv = [_mm256_setzero_ps(); CB];
                for (c, x) in vv.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(v.add(t * stride + c * 8));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let b = _mm256_broadcast_ss(&*p.add(t * rw + r));
                    for (x, &y) in a.iter_mut().zip(&vv) {
                        *x = _mm256_fmadd_ps(b, y, *x);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (c, &x) in a.iter().enumerate() {
                    _mm256_storeu_ps(o.add(r * hd + c * 8), x);
                }
            }
        }
    }

    /// One block of `RB` rows over every dimension: vectors of `8·CB`, then of 8, then a
    /// scalar tail. `RB × CB` accumulators plus `CB` values and a broadcast stay within the
    /// 16 vector registers.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv_rows<const RB: usize, const CB: usize>(
        p: *const f32,
        rw: usize,
        v: *const f32,
        stride: usize,
        n: usize,
        o: *mut f32,
        hd: usize,
    ) {
        // SAFETY (whole function): the caller guarantees rows `0..RB` of `p` and `o` and
        // dimensions `0..hd` of `v` and `o` are in bounds; each call below covers a
        // sub-range of those dimensions.
        unsafe {
            let mut d = 0;
            while d + 8 * CB <= hd {
                pv_block::<RB, CB>(p, rw, v.add(d), stride, n, o.add(d), hd);
                d += 8 * CB;
            }
            while d + 8 <= hd {
                pv_block::<RB, 1>(p, rw, v.add(d), stride, n, o.add(d), hd);
                d += 8;
            }
            for r in 0..RB {
                for dd in d..hd {
                    let mut acc = *o.add(r * hd + dd);
                    for t in 0..n {
                        acc += *p.add(t * rw + r) * *v.add(t * stride + dd);
                    }
                    *o.add(r * hd + dd) = acc;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn pv(
        p: &[f32],
        rw: usize,
        rows: usize,
        v: &[f32],
        stride: usize,
        n: usize,
        hd: usize,
        o: &mut [f32],
    ) {
        let (pp, vp, op) = (p.as_ptr(), v.as_ptr(), o.as_mut_ptr());
        // Blocks of 6 rows; a remainder of 1 after some is taken as 5 + 2 (a lone row keeps
        // too few accumulators in flight).
        let mut sixes = rows / 6;
        let mut rest = rows % 6;
        if rest == 1 && sixes > 0 {
            sixes -= 1;
            rest = 7;
        }
        // SAFETY (every call below): rows `r..r + RB` with `r + RB <= rows <= rw`, which the
        // wrapper's asserts (`p` ≥ n × rw, `o` ≥ rows × hd, `v` holds `n` rows of `stride`
        // with `hd` used) cover.
        unsafe {
            let at = |r: usize| (pp.add(r), op.add(r * hd));
            let mut r = 0;
            for _ in 0..sixes {
                let (p6, o6) = at(r);
                pv_rows::<6, 2>(p6, rw, vp, stride, n, o6, hd);
                r += 6;
            }
            let (pr, or) = at(r);
            match rest {
                0 => {}
                1 => pv_rows::<1, 4>(pr, rw, vp, stride, n, or, hd),
                2 => pv_rows::<2, 4>(pr, rw, vp, stride, n, or, hd),
                3 => pv_rows::<3, 2>(pr, rw, vp, stride, n, or, hd),
                4 => pv_rows::<4, 2>(pr, rw, vp, stride, n, or, hd),
                5 => pv_rows::<5, 2>(pr, rw, vp, stride, n, or, hd),
                _ => {
                    pv_rows::<5, 2>(pr, rw, vp, stride, n, or, hd);
                    let (p2, o2) = at(r + 5);
                    pv_rows::<2, 4>(p2, rw, vp, stride, n, o2, hd);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let ok = (x == y) || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()));
            assert!(ok, "element {i}: {x} vs {y}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp8_matches_libm() {
        if !avx2_available() {
            return;
        }
        use std::arch::x86_64::*;
        let mut xs: Vec<f32> = (0..4000).map(|i| -100.0 + i as f32 * 0.0251).collect();
        xs.extend([0.0, -0.0, -1e-8, f32::NEG_INFINITY, -87.3, -87.4, -88.5]);
        while !xs.len().is_multiple_of(8) {
            xs.push(-1.0);
        }
        for c in xs.chunks(8) {
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; `c` and `got` hold 8 floats.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(c.as_ptr()))) };
            for (&x, &g) in c.iter().zip(&got) {
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
        let mut one = [0.0f32; 8];
        // SAFETY: AVX2 and FMA were detected above; `one` holds 8 floats.
        unsafe { _mm256_storeu_ps(one.as_mut_ptr(), avx2::exp8(_mm256_setzero_ps())) };
        assert_eq!(one, [1.0; 8]);
    }

    /// The Q8_0 tile dequantizer: each level equals the blocks' own scalar dequantization
    /// exactly (extreme quants ±127 and -128, zero, tiny, huge and subnormal scales), for
    /// strided head slices of several widths.
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
                    let mut want_t = vec![0.0; n * hd];
                    convert_tile(Level::Scalar, &kh, stride, n, hd, &mut want_t);
                    let mut want_s = vec![0.0; n * rw];
                    scores(Level::Scalar, &k, stride, n, hd, &qt, rw, 0.3, &mut want_s);
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
                        pv(
                            Level::Scalar,
                            &want_p,
                            rw,
                            rows,
                            &v,
                            stride,
                            n,
                            hd,
                            &mut want_o,
                        );
                        want_os.push((rows, o0, want_o));
                    }
                    assert_eq!(wm[2], f32::NEG_INFINITY);
                    assert_eq!((wl[2], wc[2]), (0.0, 0.0));

                    for level in Level::supported() {
                        let mut got_t = vec![0.0; n * hd];
                        convert_tile(level, &kh, stride, n, hd, &mut got_t);
                        assert_eq!(got_t, want_t, "{level:?} convert hd {hd}");
                        let mut got_s = vec![0.0; n * rw];
                        scores(level, &k, stride, n, hd, &qt, rw, 0.3, &mut got_s);
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
                            pv(level, &want_p, rw, *rows, &v, stride, n, hd, &mut got_o);
                            close(&got_o, want_o, 1e-6);
                        }
                    }
                }
            }
        }
    }
}
