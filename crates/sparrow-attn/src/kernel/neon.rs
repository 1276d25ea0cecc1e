//! The NEON kernels (AArch64, where Advanced SIMD is part of the baseline): the AVX2
//! kernels' twins on 4-lane vectors — the shared loops of [`super::simd`] over [`Neon`]'s
//! primitives, with the same order of operations as the scalar reference (so they differ
//! from it only by FMA contraction and the vector `exp`). This module picks their register
//! blocking for 32 vector registers. Every function requires the slice bounds the parent's
//! wrappers assert.
//!
//! The functions are `unsafe fn`s: they read and write through raw pointers within bounds
//! their callers guarantee. f16 widening is `fcvtl` in inline assembly (the Rust intrinsic
//! for it still needs the unstable `f16` type).

#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
use super::simd::{self, PvTile, ScoreTile, Simd, SoftmaxTile};
#[cfg(feature = "fp16")]
use super::view::Tile;
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

/// AArch64 Advanced SIMD, 4 lanes (always present on this target).
pub(crate) struct Neon;

impl Simd for Neon {
    type V = float32x4_t;
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn splat(x: f32) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> float32x4_t {
        // SAFETY: the caller guarantees 4 readable floats at `p`.
        unsafe { vld1q_f32(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: float32x4_t) {
        // SAFETY: the caller guarantees 4 writable floats at `p`.
        unsafe { vst1q_f32(p, v) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: float32x4_t, a: float32x4_t, b: f32) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vfmaq_n_f32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vsubq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { vmaxq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn exp(x: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe { exp4(x) }
    }
    #[inline(always)]
    unsafe fn zero_neg_inf(x: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is part of the AArch64 baseline.
        unsafe {
            let none = vceqq_f32(x, vdupq_n_f32(f32::NEG_INFINITY));
            vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(x), none))
        }
    }
    #[cfg(feature = "fp16")]
    #[inline(always)]
    unsafe fn widen8(src: *const f16, dst: *mut f32) {
        // SAFETY: the caller guarantees 8 f16 at `src` (`f16` is a transparent `u16`, so
        // they are the 128 bits loaded) and 8 floats at `dst`.
        unsafe {
            let (lo, hi) = cvt_f16x8(vld1q_u16(src.cast::<u16>()));
            vst1q_f32(dst, lo);
            vst1q_f32(dst.add(4), hi);
        }
    }
    #[cfg(feature = "fp16")]
    #[inline(always)]
    unsafe fn dequant_block(b: &BlockQ8_0, dst: *mut f32) {
        // SAFETY: `b.qs` holds 32 bytes, read 16 at a time at offsets 0 and 16; the caller
        // guarantees 32 floats at `dst`, written 4 at a time at offsets 0..32.
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
                    vst1q_f32(dst.add(j + 4 * i), vmulq_f32(vcvtq_f32_s32(p), d));
                }
            }
        }
    }
}

/// # Safety
/// The bounds `tile::convert_tile` asserts.
#[cfg(feature = "fp16")]
pub(super) unsafe fn convert_tile(src: Tile<'_, f16>, dst: &mut [f32]) {
    // SAFETY: the bounds are the caller's.
    unsafe { simd::convert_tile::<Neon>(src, dst) }
}

/// # Safety
/// The bounds `tile::dequant_q8_0_tile` asserts.
#[cfg(feature = "fp16")]
pub(super) unsafe fn dequant_q8_0_tile(src: Tile<'_, BlockQ8_0>, dst: &mut [f32]) {
    // SAFETY: the bounds are the caller's.
    unsafe { simd::dequant_q8_0_tile::<Neon>(src, dst) }
}

/// Scores of a tile: four row vectors (16 rows) against blocks of 6 keys (24 accumulators
/// and 4 query vectors), then the two vectors left (`rw` is a multiple of 8) against
/// blocks of 8.
///
/// # Safety
/// The bounds `tile::scores` asserts, and `rw` a multiple of 8.
pub(super) unsafe fn scores(j: ScoreTile) {
    let vecs = j.rw / 4;
    // SAFETY (every call): row vectors `v..v + RB` with `v + RB <= vecs`, within the bounds
    // the wrapper asserted.
    unsafe {
        let mut v = 0;
        while v + 4 <= vecs {
            simd::score_rows::<Neon, 6, 4>(j.at(0, v * 4));
            v += 4;
        }
        if v < vecs {
            simd::score_rows::<Neon, 8, 2>(j.at(0, v * 4));
        }
    }
}

/// # Safety
/// The bounds `tile::softmax_tile` asserts, and `rw` a multiple of 4.
pub(super) unsafe fn softmax_tile(j: SoftmaxTile<'_>) {
    // SAFETY: the bounds are the caller's.
    unsafe { simd::softmax_tile::<Neon>(j) }
}

/// P·V of a tile for the block's first `rows` rows: blocks of 4 rows × 4 vectors (16
/// accumulators and 4 value vectors), the rest as one block of 1–3 rows.
///
/// # Safety
/// The bounds `tile::pv` asserts.
pub(super) unsafe fn pv(j: PvTile, rows: usize) {
    // SAFETY (every call below): rows `r..r + RB` with `r + RB <= rows <= rw`, within the
    // bounds the wrapper asserted.
    unsafe {
        let mut r = 0;
        while r + 4 <= rows {
            simd::pv_rows::<Neon, 4, 4>(j.rows_from(r));
            r += 4;
        }
        let j = j.rows_from(r);
        match rows - r {
            1 => simd::pv_rows::<Neon, 1, 8>(j),
            2 => simd::pv_rows::<Neon, 2, 8>(j),
            3 => simd::pv_rows::<Neon, 3, 4>(j),
            _ => {}
        }
    }
}
