//! The NEON kernels (AArch64, where Advanced SIMD is part of the baseline): the AVX2
//! kernels' twins on 4-lane vectors, with the same order of operations as the scalar
//! reference (so they differ from it only by FMA contraction and the vector `exp`). Every
//! function requires the slice bounds the parent's wrappers assert.
//!
//! The functions are `unsafe fn`s: they read and write through raw pointers within bounds
//! their callers guarantee. f16 widening is `fcvtl` in inline assembly (the Rust intrinsic
//! for it still needs the unstable `f16` type).

#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
#[cfg(feature = "fp16")]
use half::f16;
use std::arch::aarch64::*;

/// `exp(x)` for 4 lanes: the reduction and polynomial of `avx2::exp8` (Cephes `expf`:
/// `x = n ln 2 + r` with `ln 2` in two parts, a degree-5 polynomial in `r`, `2^n` built in
/// the exponent field). Inputs below -87.33 give 0, `exp(0)` is exactly 1.
///
/// # Safety
/// None beyond NEON, which this target always has.
#[inline(always)]
pub(crate) unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let tiny = vcltq_f32(x, vdupq_n_f32(-87.336_54));
    let x = vminq_f32(x, vdupq_n_f32(88.0));
    let x = vmaxq_f32(x, vdupq_n_f32(-87.336_54));
    let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(std::f32::consts::LOG2_E)));
    let r = vfmsq_f32(x, n, vdupq_n_f32(0.693_359_4));
    let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
    let r2 = vmulq_f32(r, r);
    let mut y = vdupq_n_f32(1.987_569_1e-4);
    y = vfmaq_f32(vdupq_n_f32(1.398_199_9e-3), y, r);
    y = vfmaq_f32(vdupq_n_f32(8.333_452e-3), y, r);
    y = vfmaq_f32(vdupq_n_f32(4.166_579_6e-2), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.666_666_5e-1), y, r);
    y = vfmaq_f32(vdupq_n_f32(0.5), y, r);
    let y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0)), y, r2);
    let e = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));
    let pow2n = vreinterpretq_f32_s32(vshlq_n_s32::<23>(e));
    let v = vreinterpretq_u32_f32(vmulq_f32(y, pow2n));
    vreinterpretq_f32_u32(vbicq_u32(v, tiny))
}

/// Widens eight f16 (bit patterns) to two vectors of four f32.
///
/// # Safety
/// None beyond NEON.
#[cfg(feature = "fp16")]
#[inline(always)]
unsafe fn cvt_f16x8(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: `fcvtl`/`fcvtl2` are base AArch64 Advanced SIMD instructions; they read one
    // register and write another, touching no memory.
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    (lo, hi)
}

/// # Safety
/// The bounds `tile::convert_tile` asserts.
#[cfg(feature = "fp16")]
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
            // transparent `u16`, so 8 of them are the 128 bits loaded.
            unsafe {
                let h = vld1q_u16(s.as_ptr().add(j).cast::<u16>());
                let (lo, hi) = cvt_f16x8(h);
                vst1q_f32(d.as_mut_ptr().add(j), lo);
                vst1q_f32(d.as_mut_ptr().add(j + 4), hi);
            }
            j += 8;
        }
        for j in full..width {
            d[j] = s[j].to_f32();
        }
    }
}

/// # Safety
/// The bounds `tile::dequant_q8_0_tile` asserts.
#[cfg(feature = "fp16")]
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
            // SAFETY: `b.qs` holds 32 bytes, read 16 at a time at offsets 0 and 16; `o`
            // holds 32 floats, written 4 at a time at offsets 0..32.
            unsafe {
                let d = vdupq_n_f32(b.d.to_f32());
                let q = b.qs.as_ptr().cast::<i8>();
                for j in (0..QK8_0).step_by(16) {
                    let v = vld1q_s8(q.add(j));
                    let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
                    let parts = [
                        vmovl_s16(vget_low_s16(lo)),
                        vmovl_high_s16(lo),
                        vmovl_s16(vget_low_s16(hi)),
                        vmovl_high_s16(hi),
                    ];
                    for (i, p) in parts.into_iter().enumerate() {
                        vst1q_f32(
                            o.as_mut_ptr().add(j + 4 * i),
                            vmulq_f32(vcvtq_f32_s32(p), d),
                        );
                    }
                }
            }
        }
    }
}

/// `KB` keys × `RB` row vectors (4 rows each) of scores; `k` points at the first key's
/// row, `qt` at the first row vector of dimension 0, `s` at the first key's first row
/// vector.
///
/// # Safety
/// Keys `0..KB` (rows `stride` apart, `hd` long), query vectors `0..RB` of each of the
/// `hd` dimensions and score vectors `0..RB` of keys `0..KB` must be in bounds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_block<const KB: usize, const RB: usize>(
    k: *const f32,
    stride: usize,
    hd: usize,
    qt: *const f32,
    rw: usize,
    scale: f32,
    s: *mut f32,
) {
    let mut acc = [[vdupq_n_f32(0.0); RB]; KB];
    for d in 0..hd {
        let mut qv = [vdupq_n_f32(0.0); RB];
        for (j, v) in qv.iter_mut().enumerate() {
            *v = vld1q_f32(qt.add(d * rw + j * 4));
        }
        for (i, a) in acc.iter_mut().enumerate() {
            let kv = *k.add(i * stride + d);
            for (x, &q) in a.iter_mut().zip(&qv) {
                *x = vfmaq_n_f32(*x, q, kv);
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        for (j, &x) in a.iter().enumerate() {
            vst1q_f32(s.add(i * rw + j * 4), vmulq_n_f32(x, scale));
        }
    }
}

/// Keys `0..n` for `RB` row vectors: blocks of `KB` keys, then single keys.
///
/// # Safety
/// As [`score_block`], for keys `0..n`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_rows<const KB: usize, const RB: usize>(
    k: *const f32,
    stride: usize,
    n: usize,
    hd: usize,
    qt: *const f32,
    rw: usize,
    scale: f32,
    s: *mut f32,
) {
    let mut t = 0;
    while t + KB <= n {
        score_block::<KB, RB>(k.add(t * stride), stride, hd, qt, rw, scale, s.add(t * rw));
        t += KB;
    }
    while t < n {
        score_block::<1, RB>(k.add(t * stride), stride, hd, qt, rw, scale, s.add(t * rw));
        t += 1;
    }
}

/// # Safety
/// The bounds `tile::scores` asserts, and `rw` a multiple of 8.
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
    let (kp, qp, sp) = (k.as_ptr(), qt.as_ptr(), s.as_mut_ptr());
    // SAFETY (every call): keys `0..n` and row vectors `v..v + 4` (16 rows) or `v..v + 2`
    // with the end within `rw / 4`, covered by the wrapper's asserts (`k`: `n` rows of
    // `stride`; `qt`: `hd × rw`; `s`: `n × rw`). 6 × 4 accumulators, 4 query vectors.
    unsafe {
        let vecs = rw / 4;
        let mut v = 0;
        while v + 4 <= vecs {
            score_rows::<6, 4>(kp, stride, n, hd, qp.add(v * 4), rw, scale, sp.add(v * 4));
            v += 4;
        }
        if v < vecs {
            // `rw` is a multiple of 8: two vectors are left.
            score_rows::<8, 2>(kp, stride, n, hd, qp.add(v * 4), rw, scale, sp.add(v * 4));
        }
    }
}

/// # Safety
/// The bounds `tile::softmax_tile` asserts, and `rw` a multiple of 4.
pub(super) unsafe fn softmax_tile(
    s: &mut [f32],
    n: usize,
    rw: usize,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    let sp = s.as_mut_ptr();
    let ninf = vdupq_n_f32(f32::NEG_INFINITY);
    for v in 0..rw / 4 {
        let o = v * 4;
        // SAFETY: `o + 4 <= rw`, within `m`, `l`, `corr` (≥ rw) and, for `t < n`, within
        // `s` (≥ n × rw), as the wrapper asserted.
        unsafe {
            let m_old = vld1q_f32(m.as_ptr().add(o));
            let mut mx = ninf;
            for t in 0..n {
                mx = vmaxq_f32(mx, vld1q_f32(sp.add(t * rw + o)));
            }
            let m_new = vmaxq_f32(m_old, mx);
            // Rows with every score -inf so far subtract 0 (and get zeros).
            let none = vceqq_f32(m_new, ninf);
            let m_use = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(m_new), none));
            let c = exp4(vsubq_f32(m_old, m_use));
            let mut sum = vdupq_n_f32(0.0);
            for t in 0..n {
                let at = sp.add(t * rw + o);
                let p = exp4(vsubq_f32(vld1q_f32(at), m_use));
                vst1q_f32(at, p);
                sum = vaddq_f32(sum, p);
            }
            let l_old = vld1q_f32(l.as_ptr().add(o));
            vst1q_f32(l.as_mut_ptr().add(o), vaddq_f32(vmulq_f32(l_old, c), sum));
            vst1q_f32(m.as_mut_ptr().add(o), m_new);
            vst1q_f32(corr.as_mut_ptr().add(o), c);
        }
    }
}

/// `RB` rows × `CB` vectors of 4 output dimensions; `p` points at the first row's
/// probability of key 0, `v` at key 0's first dimension, `o` at the first row's first
/// dimension.
///
/// # Safety
/// Rows `0..RB` of `p` (for keys `0..n`, `rw` apart) and of `o` (`hd` apart), and
/// dimensions `0..4·CB` of `v` and `o`, must be in bounds.
#[inline(always)]
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
    let mut acc = [[vdupq_n_f32(0.0); CB]; RB];
    for (r, a) in acc.iter_mut().enumerate() {
        for (c, x) in a.iter_mut().enumerate() {
            *x = vld1q_f32(o.add(r * hd + c * 4));
        }
    }
    for t in 0..n {
        let mut vv = [vdupq_n_f32(0.0); CB];
        for (c, x) in vv.iter_mut().enumerate() {
            *x = vld1q_f32(v.add(t * stride + c * 4));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let w = *p.add(t * rw + r);
            for (x, &y) in a.iter_mut().zip(&vv) {
                *x = vfmaq_n_f32(*x, y, w);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (c, &x) in a.iter().enumerate() {
            vst1q_f32(o.add(r * hd + c * 4), x);
        }
    }
}

/// One block of `RB` rows over every dimension: vectors of `4·CB`, then of 4, then a
/// scalar tail.
///
/// # Safety
/// Rows `0..RB` of `p` and `o` and dimensions `0..hd` of `v` and `o` must be in bounds.
#[inline(always)]
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
    let mut d = 0;
    while d + 4 * CB <= hd {
        pv_block::<RB, CB>(p, rw, v.add(d), stride, n, o.add(d), hd);
        d += 4 * CB;
    }
    while d + 4 <= hd {
        pv_block::<RB, 1>(p, rw, v.add(d), stride, n, o.add(d), hd);
        d += 4;
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

/// # Safety
/// The bounds `tile::pv` asserts.
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
    // SAFETY (every call below): rows `r..r + RB` with `r + RB <= rows <= rw`, which the
    // wrapper's asserts (`p` ≥ n × rw, `o` ≥ rows × hd, `v` holds `n` rows of `stride`
    // with `hd` used) cover. 4 × 4 accumulators and 4 value vectors per block.
    unsafe {
        let mut r = 0;
        while r + 4 <= rows {
            pv_rows::<4, 4>(pp.add(r), rw, vp, stride, n, op.add(r * hd), hd);
            r += 4;
        }
        let (pr, or) = (pp.add(r), op.add(r * hd));
        match rows - r {
            1 => pv_rows::<1, 8>(pr, rw, vp, stride, n, or, hd),
            2 => pv_rows::<2, 8>(pr, rw, vp, stride, n, or, hd),
            3 => pv_rows::<3, 4>(pr, rw, vp, stride, n, or, hd),
            _ => {}
        }
    }
}
