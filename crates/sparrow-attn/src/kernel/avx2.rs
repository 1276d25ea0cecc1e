//! The AVX2 kernels. Every function here requires AVX2, FMA and F16C (checked by the
//! callers in the parent module) and the slice bounds the parent's wrappers assert.

#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
#[cfg(feature = "fp16")]
use half::f16;
use std::arch::x86_64::*;

/// `exp(x)` for 8 lanes (Cephes `expf`: range reduction by ln 2 in two parts and a
/// degree-5 polynomial). Inputs below -87.33 give 0, `exp(0)` is exactly 1.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp8(x: __m256) -> __m256 {
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_54));
    let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_54));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
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

#[cfg(feature = "fp16")]
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

#[cfg(feature = "fp16")]
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

/// Quest's group bound for `n` blocks: `out[p] = Σ_d sum[d]·center[p·stride + d] +
/// abs_sum[d]·radius[p·stride + d]`, the width being `sum.len()` (see
/// `policy::quest::group_upper_bounds`, whose scalar loop this twins).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn group_bounds(
    sum: &[f32],
    abs_sum: &[f32],
    center: &[f32],
    radius: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let width = sum.len();
    let full = width / 8 * 8;
    for (p, o) in out.iter_mut().enumerate() {
        let c = &center[p * stride..][..width];
        let r = &radius[p * stride..][..width];
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut j = 0;
        while j < full {
            // SAFETY: `j + 8 <= width`, the length of `sum`, `abs_sum`, `c` and `r`.
            unsafe {
                a0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(sum.as_ptr().add(j)),
                    _mm256_loadu_ps(c.as_ptr().add(j)),
                    a0,
                );
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(abs_sum.as_ptr().add(j)),
                    _mm256_loadu_ps(r.as_ptr().add(j)),
                    a1,
                );
            }
            j += 8;
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(a0, a1)) };
        let tail: f32 = (full..width)
            .map(|d| sum[d] * c[d] + abs_sum[d] * r[d])
            .sum();
        *o = lanes.iter().sum::<f32>() + tail;
    }
}

/// `out[r] = scales[r] · Σ_d q[d] · rows[r · dim + d]` with `dim = q.len()` (see
/// `policy::int8_rows::scaled_row_dots`, whose scalar loop this twins): eight quants at a
/// time widened to f32 and multiplied in, four rows at once (one accumulator each, so four
/// independent chains) and their sums reduced together.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scaled_i8_dots(rows: &[i8], scales: &[f32], q: &[f32], out: &mut [f32]) {
    let dim = q.len();
    let whole = dim / 8 * 8;
    // Eight quants of `row` from `j` (`j + 8 <= dim`) as f32, times `q[j..j + 8]` plus `acc`.
    #[inline(always)]
    unsafe fn step(row: &[i8], q: &[f32], j: usize, acc: __m256) -> __m256 {
        // SAFETY: the callers keep `j + 8 <= dim`, the length of `row` and `q`.
        unsafe {
            let k = _mm_loadl_epi64(row.as_ptr().add(j) as *const __m128i);
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(k));
            _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(j)), v, acc)
        }
    }
    let tail = |row: &[i8]| -> f32 { (whole..dim).map(|d| q[d] * row[d] as f32).sum() };
    let groups = out.len() / 4;
    for g in 0..groups {
        let r0 = g * 4;
        let row = |i: usize| &rows[(r0 + i) * dim..][..dim];
        let (w0, w1, w2, w3) = (row(0), row(1), row(2), row(3));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut j = 0;
        while j < whole {
            // SAFETY: `j + 8 <= whole <= dim`.
            unsafe {
                acc[0] = step(w0, q, j, acc[0]);
                acc[1] = step(w1, q, j, acc[1]);
                acc[2] = step(w2, q, j, acc[2]);
                acc[3] = step(w3, q, j, acc[3]);
            }
            j += 8;
        }
        // Lanes of the four sums, then each 128-bit half's pairs: [s0, s1, s2, s3].
        let t01 = _mm256_hadd_ps(acc[0], acc[1]);
        let t23 = _mm256_hadd_ps(acc[2], acc[3]);
        let t = _mm256_hadd_ps(t01, t23);
        let sums = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
        let tails = _mm_setr_ps(tail(w0), tail(w1), tail(w2), tail(w3));
        // SAFETY: `r0 + 4 <= out.len() <= scales.len()`.
        unsafe {
            let sc = _mm_loadu_ps(scales.as_ptr().add(r0));
            _mm_storeu_ps(
                out.as_mut_ptr().add(r0),
                _mm_mul_ps(sc, _mm_add_ps(sums, tails)),
            );
        }
    }
    for r in groups * 4..out.len() {
        let w = &rows[r * dim..][..dim];
        let mut acc = _mm256_setzero_ps();
        let mut j = 0;
        while j < whole {
            // SAFETY: `j + 8 <= whole <= dim`.
            acc = unsafe { step(w, q, j, acc) };
            j += 8;
        }
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        out[r] = scales[r] * (_mm_cvtss_f32(s) + tail(w));
    }
}
