//! NEON kernels, each integer body written once and compiled twice: with `D = false`
//! (plain NEON widening multiplies, any AArch64 CPU) and `D = true` (`sdot`, the
//! `dotprod` extension, checked at run time).
//!
//! int8 dots follow one pattern: weights are unpacked to *signed* bytes with their offset
//! already removed (Q4_0's `-8`, Q5_0's `-16`, Q6_K's `-32`, Q3_K's `-4`: NEON multiplies
//! signed by signed, so there is no need for x86's unsigned trick), multiplied with the
//! activation bytes and summed into i32 lanes exactly:
//!
//! * `D = true`: `sdot` sums four adjacent products into each 32-bit lane;
//! * `D = false`: `smull`/`smlal2` multiply into i16 lanes (two or four products per lane,
//!   bounded below `i16::MAX`: see [`dot2`]) and `sadalp` widens pairs into i32 lanes.
//!
//! Only the lane *total* of such a vector is meaningful (the two variants spread the sum
//! differently), so every vector of products covers one scale group; per-group totals are
//! gathered with pairwise adds (`addp`: four vectors give one vector of four totals), which
//! then meet the scales in one vector multiply. The integer sums equal the scalar
//! reference's (`crate::q8`) bit for bit; only the few f32 operations per block differ in
//! order. Activations never hold -128 (the quantizers clamp to -127..=127), which the i16
//! bounds rely on.
//!
//! The helpers and bodies are `unsafe fn`s because the NEON intrinsics are
//! `#[target_feature(enable = "neon")]` functions; NEON is part of this target's baseline,
//! so the one requirement left to callers is the one each states (bounds, `dotprod`).
//!
//! f16 scales are widened with `fcvtl` (half-precision conversion is part of the base
//! AArch64 SIMD set; the Rust intrinsics for it still need the unstable `f16` type, so
//! they are written as inline assembly), `sdot` likewise (its intrinsic is unstable).

use core::arch::aarch64::*;
use core::arch::asm;

use crate::formats::BlockFormat;
use crate::q8::{common_blocks, legacy_layout, q3_k_scales, scales_mins_k4, Q8KSlice, Q8_0Slice};

// ---- small helpers ---------------------------------------------------------------------

/// Widens four f16 (bit patterns) to f32.
#[inline(always)]
pub(crate) unsafe fn cvt_f16x4(h: uint16x4_t) -> float32x4_t {
    let o: float32x4_t;
    // SAFETY: `fcvtl` is a base AArch64 Advanced SIMD instruction (NEON is always present
    // on this target); it reads one register and writes another, touching no memory.
    unsafe {
        asm!("fcvtl {o:v}.4s, {i:v}.4h", i = in(vreg) h, o = lateout(vreg) o,
             options(pure, nomem, nostack, preserves_flags));
    }
    o
}

/// Widens the upper four f16 (bit patterns) of `h` to f32.
#[inline(always)]
pub(crate) unsafe fn cvt_f16x4_high(h: uint16x8_t) -> float32x4_t {
    let o: float32x4_t;
    // SAFETY: as `cvt_f16x4` (`fcvtl2`, base AArch64 SIMD, registers only).
    unsafe {
        asm!("fcvtl2 {o:v}.4s, {i:v}.8h", i = in(vreg) h, o = lateout(vreg) o,
             options(pure, nomem, nostack, preserves_flags));
    }
    o
}

/// Four little-endian f16 values packed in a `u64` (value `i` in bits `16i..16i+16`).
#[inline(always)]
unsafe fn cvt_f16_u64(v: u64) -> float32x4_t {
    cvt_f16x4(vcreate_u16(v))
}

/// The f16 at `p`, widened.
///
/// # Safety
/// `p` must point to two readable bytes.
#[inline(always)]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    let bits = core::ptr::read_unaligned(p.cast::<u16>());
    vgetq_lane_f32::<0>(cvt_f16_u64(bits as u64))
}

/// The f16 at `off` of `b`, widened.
#[inline(always)]
unsafe fn f16s(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    vgetq_lane_f32::<0>(cvt_f16_u64(bits as u64))
}

#[inline(always)]
pub(crate) unsafe fn ld16(p: &[u8]) -> uint8x16_t {
    let p: &[u8; 16] = p.first_chunk().expect("16 bytes");
    // SAFETY: `p` is 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_u8(p.as_ptr()) }
}

#[inline(always)]
unsafe fn ld16i(p: &[i8]) -> int8x16_t {
    let p: &[i8; 16] = p.first_chunk().expect("16 bytes");
    // SAFETY: `p` is 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_s8(p.as_ptr()) }
}

#[inline(always)]
pub(crate) unsafe fn ld4f(p: &[f32]) -> float32x4_t {
    let p: &[f32; 4] = p.first_chunk().expect("4 floats");
    // SAFETY: `p` is 4 readable f32; `ld1` has no alignment requirement.
    unsafe { vld1q_f32(p.as_ptr()) }
}

#[inline(always)]
unsafe fn ld8h(p: &[i16]) -> int16x8_t {
    let p: &[i16; 8] = p.first_chunk().expect("8 i16");
    // SAFETY: `p` is 8 readable i16; `ld1` has no alignment requirement.
    unsafe { vld1q_s16(p.as_ptr()) }
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// `[Σ a, Σ b, Σ c, Σ d]` (lane totals of four vectors).
#[inline(always)]
unsafe fn hsum4(a: int32x4_t, b: int32x4_t, c: int32x4_t, d: int32x4_t) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d))
}

/// Eight unsigned bytes (of a `u64`) as two vectors of four i32.
#[inline(always)]
unsafe fn widen_u8x8(v: u64) -> (int32x4_t, int32x4_t) {
    let h = vmovl_u8(vcreate_u8(v));
    (
        vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
        vreinterpretq_s32_u32(vmovl_high_u16(h)),
    )
}

/// Sixteen signed bytes as four vectors of four i32.
#[inline(always)]
unsafe fn widen_s8x16(v: int8x16_t) -> [int32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_high_s16(lo),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_high_s16(hi),
    ]
}

/// `acc + sdot(a, b)`: each i32 lane gains the sum of its four byte products.
///
/// # Safety
/// The CPU must have the `dotprod` extension.
#[inline]
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` needs `dotprod`, which the caller guarantees; registers only.
    unsafe {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a,
             b = in(vreg) b, options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// The products of 16 weight bytes `w` and activation bytes `x`, summed into i32 lanes
/// (only the lane total is meaningful).
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn dot1<const D: bool>(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    if D {
        return sdot(vdupq_n_s32(0), w, x);
    }
    // |w x| <= 128 * 127: two products per i16 lane fit.
    let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    vpaddlq_s16(vmlal_high_s8(p, w, x))
}

/// The products of 32 weight bytes `(w0, w1)` and activation bytes `(x0, x1)`, summed into
/// i32 lanes (only the lane total is meaningful). `WIDE`: weights may use all 8 bits; else
/// `|w| <= 32`, so four products (`4 * 32 * 127 < 2^15`) share an i16 lane.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn dot2<const D: bool, const WIDE: bool>(
    w0: int8x16_t,
    x0: int8x16_t,
    w1: int8x16_t,
    x1: int8x16_t,
) -> int32x4_t {
    if D {
        return sdot(sdot(vdupq_n_s32(0), w0, x0), w1, x1);
    }
    let a = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
    let a = vmlal_high_s8(a, w0, x0);
    if WIDE {
        let b = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
        let b = vmlal_high_s8(b, w1, x1);
        vpadalq_s16(vpaddlq_s16(a), b)
    } else {
        let a = vmlal_s8(a, vget_low_s8(w1), vget_low_s8(x1));
        vpaddlq_s16(vmlal_high_s8(a, w1, x1))
    }
}

// ---- f32-activation dots ----------------------------------------------------------------

/// F32 weights.
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: NEON is part of this target's baseline; every load reads a whole chunk
    // of the slices it is given (see the helpers).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        let mut wc = row.chunks_exact(32);
        let mut xc = x.chunks_exact(8);
        for (w, xx) in (&mut wc).zip(&mut xc) {
            for k in 0..2 {
                let wv = vreinterpretq_f32_u8(ld16(&w[16 * k..]));
                acc[k] = vfmaq_f32(acc[k], wv, ld4f(&xx[4 * k..]));
            }
        }
        let mut s = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
        for (b, &xv) in wc.remainder().chunks_exact(4).zip(xc.remainder()) {
            s += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * xv;
        }
        s
    }
}

/// F16 weights, widened with `fcvtl`.
pub(crate) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: NEON is part of this target's baseline; every load reads a whole chunk
    // of the slices it is given (see the helpers).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        let mut wc = row.chunks_exact(16);
        let mut xc = x.chunks_exact(8);
        for (w, xx) in (&mut wc).zip(&mut xc) {
            let h = vreinterpretq_u16_u8(ld16(w));
            acc[0] = vfmaq_f32(acc[0], cvt_f16x4(vget_low_u16(h)), ld4f(xx));
            acc[1] = vfmaq_f32(acc[1], cvt_f16x4_high(h), ld4f(&xx[4..]));
        }
        let mut s = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
        for (b, &xv) in wc.remainder().chunks_exact(2).zip(xc.remainder()) {
            s += half::f16::from_le_bytes([b[0], b[1]]).to_f32() * xv;
        }
        s
    }
}

/// BF16 weights (widening is a 16-bit shift).
pub(crate) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: NEON is part of this target's baseline; every load reads a whole chunk
    // of the slices it is given (see the helpers).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        let mut wc = row.chunks_exact(16);
        let mut xc = x.chunks_exact(8);
        for (w, xx) in (&mut wc).zip(&mut xc) {
            let h = vreinterpretq_u16_u8(ld16(w));
            let lo = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h)));
            let hi = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h));
            acc[0] = vfmaq_f32(acc[0], lo, ld4f(xx));
            acc[1] = vfmaq_f32(acc[1], hi, ld4f(&xx[4..]));
        }
        let mut s = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
        for (b, &xv) in wc.remainder().chunks_exact(2).zip(xc.remainder()) {
            s += f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) * xv;
        }
        s
    }
}

/// Any block format: each block decoded by the scalar reference (bit-exact) into a stack
/// buffer, then a vector dot.
pub(crate) fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: NEON is part of this target's baseline; every load reads a whole chunk
    // of the slices it is given (see the helpers).
    unsafe {
        let mut buf = [0f32; 256];
        let buf = &mut buf[..F::BLOCK_ELEMS];
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (b, xb) in row
            .chunks_exact(F::BLOCK_BYTES)
            .zip(x.chunks_exact(F::BLOCK_ELEMS))
        {
            F::dequantize_block(b, buf);
            for (k, (w4, x4)) in buf.chunks_exact(4).zip(xb.chunks_exact(4)).enumerate() {
                acc[k & 1] = vfmaq_f32(acc[k & 1], ld4f(w4), ld4f(x4));
            }
        }
        vaddvq_f32(vaddq_f32(acc[0], acc[1]))
    }
}

// ---- int8 dots, legacy formats (Q8_0 activations) ----------------------------------------

/// Byte `i` of the result is byte `i / 8` of `qh` (lanes 0..8 take byte `lo`, 8..16 byte
/// `lo + 1`), tested against bit `i % 8`: 0xFF where element `i`'s fifth bit is set.
#[inline(always)]
unsafe fn qh_bits(qh: uint8x16_t, lo: u8) -> uint8x16_t {
    let idx = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(lo + 1));
    let bits = vcreate_u8(0x8040_2010_0804_0201);
    vtstq_u8(vqtbl1q_u8(qh, idx), vcombine_u8(bits, bits))
}

/// One legacy block's signed weights (offset removed) as two vectors of 16 (elements
/// `0..16`, `16..32`).
///
/// # Safety
/// `b` must point to a whole block of format `TY`.
#[inline(always)]
unsafe fn legacy_weights<const TY: u8>(b: *const u8) -> (int8x16_t, int8x16_t) {
    let l = legacy_layout(TY);
    if TY == 4 {
        return (vld1q_s8(b.add(2).cast()), vld1q_s8(b.add(18).cast()));
    }
    let qs = vld1q_u8(b.add(l.qs_off));
    let m4 = vdupq_n_u8(0x0F);
    let (lo, hi) = (vandq_u8(qs, m4), vshrq_n_u8::<4>(qs));
    if !l.has_qh {
        if l.has_min {
            return (s8(lo), s8(hi));
        }
        let off = vdupq_n_u8(l.off as u8); // Q4_0: 8
        return (s8(vsubq_u8(lo, off)), s8(vsubq_u8(hi, off)));
    }
    let qh = vreinterpretq_u8_u32(vdupq_n_u32(core::ptr::read_unaligned(
        b.add(l.qh_off).cast::<u32>(),
    )));
    let (t0, t1) = (qh_bits(qh, 0), qh_bits(qh, 2));
    let b4 = vdupq_n_u8(0x10);
    if l.has_min {
        // Q5_1: nibble | fifth bit << 4
        (
            s8(vorrq_u8(lo, vandq_u8(t0, b4))),
            s8(vorrq_u8(hi, vandq_u8(t1, b4))),
        )
    } else {
        // Q5_0: (nibble | fifth << 4) - 16 = nibble - 16 where the fifth bit is clear
        (
            s8(vsubq_u8(lo, vbicq_u8(b4, t0))),
            s8(vsubq_u8(hi, vbicq_u8(b4, t1))),
        )
    }
}

/// One legacy block times its 32 activation quants at `q`: the integer sum in i32 lanes.
///
/// # Safety
/// `b` must point to a whole block of format `TY`, `q` to 32 readable quants; `dotprod`
/// when `D`.
#[inline(always)]
unsafe fn legacy_block<const TY: u8, const D: bool>(b: *const u8, q: *const i8) -> int32x4_t {
    let (w0, w1) = legacy_weights::<TY>(b);
    let (x0, x1) = (vld1q_s8(q), vld1q_s8(q.add(16)));
    if TY == 4 {
        dot2::<D, true>(w0, x0, w1, x1)
    } else {
        dot2::<D, false>(w0, x0, w1, x1)
    }
}

/// The f16 at byte `off` of four consecutive blocks `bytes` apart from `b`, as a `u64`.
///
/// # Safety
/// The four f16 must be readable.
#[inline(always)]
unsafe fn gather_f16(b: *const u8, bytes: usize, off: usize) -> u64 {
    let h = |k: usize| core::ptr::read_unaligned(b.add(k * bytes + off).cast::<u16>()) as u64;
    h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48
}

/// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: four blocks per step; their integer sums are gathered
/// into one vector (one lane per block) that meets the four combined scales
/// `d_w * d_x` in one FMA; the minimum (`_1` formats) is applied as `m * (d_x * sum)`.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn legacy_body<const TY: u8, const D: bool>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let l = legacy_layout(TY);
    let n = common_blocks(row, l.bytes, x);
    let (w, q, d, sum) = (row.as_ptr(), x.qs.as_ptr(), x.d.as_ptr(), x.sum.as_ptr());
    let (mut acc, mut macc) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut k = 0;
    // SAFETY (all reads below): blocks `k..k + 4 <= n` (then `k < n`) of the weights, and
    // of the quants, scales and sums, are in bounds by `common_blocks`.
    while k + 4 <= n {
        let b = w.add(l.bytes * k);
        let p = |i: usize| legacy_block::<TY, D>(b.add(l.bytes * i), q.add(32 * (k + i)));
        let isum = hsum4(p(0), p(1), p(2), p(3));
        let dx = vld1q_f32(d.add(k));
        let dw = cvt_f16_u64(gather_f16(b, l.bytes, 0));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(isum), vmulq_f32(dw, dx));
        if l.has_min {
            let mw = cvt_f16_u64(gather_f16(b, l.bytes, 2));
            let sx = vmulq_f32(dx, vcvtq_f32_s32(vld1q_s32(sum.add(k))));
            macc = vfmaq_f32(macc, mw, sx);
        }
        k += 4;
    }
    let mut tail = 0f32;
    while k < n {
        let b = w.add(l.bytes * k);
        let isum = vaddvq_s32(legacy_block::<TY, D>(b, q.add(32 * k)));
        tail += (f16_ptr(b) * *d.add(k)) * isum as f32;
        if l.has_min {
            tail += f16_ptr(b.add(2)) * (*d.add(k) * *sum.add(k) as f32);
        }
        k += 1;
    }
    vaddvq_f32(vaddq_f32(acc, macc)) + tail
}

/// Q5_0 rows in the packed layout (see `crate::packed`): per group of four blocks, one
/// `fcvtl` for the four scales, and per block one mask or shift for its nibbles and a
/// test + clear + subtract for its fifth bits (transposed: bit `k` of byte `i` is element
/// `i` of block `k`, bit `4 + k` element `16 + i`). Blocks after the last whole group are
/// in ggml's layout.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q5_0_packed_body<const D: bool>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    use crate::packed::{GROUP_BLOCKS, GROUP_BYTES};
    let n = common_blocks(row, 22, x);
    let groups = n / GROUP_BLOCKS;
    let (w, q, d) = (row.as_ptr(), x.qs.as_ptr(), x.d.as_ptr());
    let m4 = vdupq_n_u8(0x0F);
    let b4 = vdupq_n_u8(0x10);
    let mut acc = vdupq_n_f32(0.0);
    for g in 0..groups {
        // SAFETY: group `g < groups` lies within the row's first `n` blocks (22 bytes
        // each, 88 per group), and its 4 blocks of quants and scales within `x`'s first
        // `n` (see `common_blocks`).
        let gp = w.add(g * GROUP_BYTES);
        let k0 = g * GROUP_BLOCKS;
        let dw = cvt_f16_u64(core::ptr::read_unaligned(gp.cast::<u64>()));
        let scales = vmulq_f32(dw, vld1q_f32(d.add(k0)));
        let hi = vld1q_u8(gp.add(8));
        let q01 = [vld1q_u8(gp.add(24)), vld1q_u8(gp.add(40))];
        let q23 = [vld1q_u8(gp.add(56)), vld1q_u8(gp.add(72))];
        let block = |k: usize, nib: [uint8x16_t; 2]| {
            let t0 = vtstq_u8(hi, vdupq_n_u8(1 << k));
            let t1 = vtstq_u8(hi, vdupq_n_u8(16 << k));
            let w0 = s8(vsubq_u8(nib[0], vbicq_u8(b4, t0)));
            let w1 = s8(vsubq_u8(nib[1], vbicq_u8(b4, t1)));
            let xq = q.add(32 * (k0 + k));
            dot2::<D, false>(w0, vld1q_s8(xq), w1, vld1q_s8(xq.add(16)))
        };
        let lo = |v: [uint8x16_t; 2]| [vandq_u8(v[0], m4), vandq_u8(v[1], m4)];
        let up = |v: [uint8x16_t; 2]| [vshrq_n_u8::<4>(v[0]), vshrq_n_u8::<4>(v[1])];
        let isum = hsum4(
            block(0, lo(q01)),
            block(1, up(q01)),
            block(2, lo(q23)),
            block(3, up(q23)),
        );
        acc = vfmaq_f32(acc, vcvtq_f32_s32(isum), scales);
    }
    let mut tail = 0f32;
    for k in groups * GROUP_BLOCKS..n {
        // SAFETY: `k < n`: a whole ggml-layout block and its activations are in bounds.
        let b = w.add(22 * k);
        let isum = vaddvq_s32(legacy_block::<2, D>(b, q.add(32 * k)));
        tail += (f16_ptr(b) * *d.add(k)) * isum as f32;
    }
    vaddvq_f32(acc) + tail
}

// ---- int8 dots, k-quants (Q8_K activations) ---------------------------------------------

/// `Σ_g sc[g] * p[g]` over 16 groups whose integer sums are the lane totals of `p`: totals
/// gathered four by four, times the scales widened to i32.
#[inline(always)]
unsafe fn scaled16(p: &[int32x4_t; 16], sc: [int32x4_t; 4]) -> int32x4_t {
    let mut s = vdupq_n_s32(0);
    for (c, &scv) in sc.iter().enumerate() {
        let t = hsum4(p[4 * c], p[4 * c + 1], p[4 * c + 2], p[4 * c + 3]);
        s = vmlaq_s32(s, t, scv);
    }
    s
}

/// `Σ_j m[j] * (bs[2j] + bs[2j+1])`, the eight unsigned minimums given as bytes of `m8`.
#[inline(always)]
unsafe fn mins8(m8: u64, bs: &[i16]) -> int32x4_t {
    let pairs = vpaddq_s16(ld8h(bs), ld8h(&bs[8..]));
    let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m8)));
    vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs)
}

/// The end of a Q4_K/Q5_K block `b`: its eight sub-block sums (the lane totals of `p`)
/// times the unpacked 6-bit scales, into `acc.0` with `d * dx`; its minimums times the
/// pairwise-added activation sums `bs`, into `acc.1` with `dmin * dx`.
#[inline(always)]
unsafe fn k4_block_end(
    (acc, macc): (float32x4_t, float32x4_t),
    b: &[u8],
    p: &[int32x4_t; 8],
    bs: &[i16],
    dx: f32,
) -> (float32x4_t, float32x4_t) {
    let (sc8, m8) = scales_mins_k4(&b[4..16]);
    let (sc_lo, sc_hi) = widen_u8x8(sc8);
    let sumi = vmlaq_s32(
        vmulq_s32(hsum4(p[0], p[1], p[2], p[3]), sc_lo),
        hsum4(p[4], p[5], p[6], p[7]),
        sc_hi,
    );
    let dm = cvt_f16_u64(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64);
    let summ = mins8(m8, bs);
    (
        vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * vgetq_lane_f32::<0>(dm)),
        vfmaq_n_f32(macc, vcvtq_f32_s32(summ), dx * vgetq_lane_f32::<1>(dm)),
    )
}

/// Q4_K: sub-blocks `2c`, `2c+1` are the low/high nibbles of `qs[32c..32c+32]`; the
/// eight sub-block sums meet the unpacked 6-bit scales in two vector multiplies, the
/// minimums meet the pairwise-added activation `bsums` in two widening multiplies.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q4_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m4 = vdupq_n_u8(0x0F);
    let (mut acc, mut macc) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for (b, xq, dx, bs) in x.blocks(row, 144) {
        let mut p = [vdupq_n_s32(0); 8];
        for c in 0..4 {
            let (q0, q1) = (ld16(&b[16 + 32 * c..]), ld16(&b[32 + 32 * c..]));
            let xs = &xq[64 * c..];
            p[2 * c] = dot2::<D, false>(
                s8(vandq_u8(q0, m4)),
                ld16i(xs),
                s8(vandq_u8(q1, m4)),
                ld16i(&xs[16..]),
            );
            p[2 * c + 1] = dot2::<D, false>(
                s8(vshrq_n_u8::<4>(q0)),
                ld16i(&xs[32..]),
                s8(vshrq_n_u8::<4>(q1)),
                ld16i(&xs[48..]),
            );
        }
        (acc, macc) = k4_block_end((acc, macc), b, &p, bs, dx);
    }
    vaddvq_f32(acc) - vaddvq_f32(macc)
}

/// Q5_K: Q4_K plus bit `j` of `qh[l]` as bit 4 of element `32j + l` (the `qh` bytes shifted
/// right by two per 64 elements, so the bits needed sit at bits 0 and 1).
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q5_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m4 = vdupq_n_u8(0x0F);
    let b4 = vdupq_n_u8(0x10);
    let (mut acc, mut macc) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for (b, xq, dx, bs) in x.blocks(row, 176) {
        let mut qh = [ld16(&b[16..]), ld16(&b[32..])];
        let mut p = [vdupq_n_s32(0); 8];
        for c in 0..4 {
            let (q0, q1) = (ld16(&b[48 + 32 * c..]), ld16(&b[64 + 32 * c..]));
            let lo5 = |q: uint8x16_t, h: uint8x16_t| {
                s8(vorrq_u8(vandq_u8(q, m4), vandq_u8(vshlq_n_u8::<4>(h), b4)))
            };
            let hi5 = |q: uint8x16_t, h: uint8x16_t| {
                s8(vorrq_u8(
                    vshrq_n_u8::<4>(q),
                    vandq_u8(vshlq_n_u8::<3>(h), b4),
                ))
            };
            let xs = &xq[64 * c..];
            p[2 * c] =
                dot2::<D, false>(lo5(q0, qh[0]), ld16i(xs), lo5(q1, qh[1]), ld16i(&xs[16..]));
            p[2 * c + 1] = dot2::<D, false>(
                hi5(q0, qh[0]),
                ld16i(&xs[32..]),
                hi5(q1, qh[1]),
                ld16i(&xs[48..]),
            );
            qh = [vshrq_n_u8::<2>(qh[0]), vshrq_n_u8::<2>(qh[1])];
        }
        (acc, macc) = k4_block_end((acc, macc), b, &p, bs, dx);
    }
    vaddvq_f32(acc) - vaddvq_f32(macc)
}

/// Q6_K: 6-bit quants `ql | qh << 4` biased by 32, one signed scale per 16 elements.
/// Element `128h + 32s + l` takes the low (`s < 2`) or high nibble of
/// `ql[64h + 32(s % 2) + l]` and bits `2s..2s+2` of `qh[32h + l]`.
///
/// The quants are dotted unbiased (0..63, a valid signed byte) and the bias comes off
/// through the activation sums `bsums` Q8_K carries: `Σ_g sc[g] (Σ q x - 32 bsum[g])`.
/// Without `sdot` this is [`q6_k_widening_body`]; with it, [`q6_k_sdot_block`].
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q6_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    if !D {
        return q6_k_widening_body(row, x);
    }
    let m33 = vdupq_n_u8(0x33);
    let m32 = vdupq_n_s16(-32);
    let mut acc = vdupq_n_f32(0.0);
    for (b, xq, dx, bs) in x.blocks(row, 210) {
        let b: &[u8; 210] = b.try_into().expect("a Q6_K block");
        let xq: &[i8; 256] = xq.try_into().expect("a Q8_K block");
        // Each group's total starts at its bias, -32 bsum[g].
        let (b_lo, b_hi) = (ld8h(bs), ld8h(&bs[8..]));
        let g = [
            vmull_s16(vget_low_s16(b_lo), vget_low_s16(m32)),
            vmull_high_s16(b_lo, m32),
            vmull_s16(vget_low_s16(b_hi), vget_low_s16(m32)),
            vmull_high_s16(b_hi, m32),
        ];
        // SAFETY: the block and activations are whole (typed above); `dotprod` is the
        // caller's guarantee.
        let g = unsafe { q6_k_sdot_block(b, xq, m33, g) };
        let sc8 = vreinterpretq_s8_u8(ld16(&b[192..]));
        let (sc_lo, sc_hi) = (vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8));
        let sumi = vmulq_s32(g[0], vmovl_s16(vget_low_s16(sc_lo)));
        let sumi = vmlaq_s32(sumi, g[1], vmovl_high_s16(sc_lo));
        let sumi = vmlaq_s32(sumi, g[2], vmovl_s16(vget_low_s16(sc_hi)));
        let sumi = vmlaq_s32(sumi, g[3], vmovl_high_s16(sc_hi));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * f16s(b, 208));
    }
    vaddvq_f32(acc)
}

/// One Q6_K block against its activations with `sdot`: adds `Σ q x` of group `4c + i` to
/// lane `i` of `g[c]` (16 groups of 16 elements).
///
/// The layout is de-interleaved by `ld4`, which splits 64 bytes into four vectors of every
/// fourth byte: byte `j` of vector `k` of `ql[64h..64h + 64]` is then the low nibble of
/// element `128h + 4j + k` and the high nibble of element `128h + 64 + 4j + k`, so an
/// `ld4` of the activations at `128h` (and `128h + 64`) lines up with it, and 32-bit lane
/// `i` lies in group `8h + i` (`8h + 4 + i`). Four `sdot`s chained into one accumulator
/// thus give four group totals: no zeroed accumulator per group, no pairwise adds. The
/// `qh` bits come from one `ld4` of all 64 `qh` bytes (vector `k`: `qh[4j + k]`, half 0's
/// bytes then half 1's), masked to bits 0–1 and 4–5, and the same shifted right by two
/// (bits 2–3 and 6–7 moved down): `zip1`/`zip2` of the two give, for half 0/1, the first
/// 8 bytes' bits (low nibbles' positions 0–7) and the last 8's (32 positions further).
/// Then `sri` (`qh` bits 4–5 above `ql >> 4`) builds a high-nibble quant and `sli`
/// (`ql & 0x0f` below the bits 0–1) a low-nibble one, one instruction each.
///
/// In assembly because the compiler, given the same steps as intrinsics, hoists the
/// `ld4`s (each needs four consecutive registers) above the arithmetic, runs out of NEON
/// registers and spills: measured 25 stack accesses and ~140 guest instructions per block,
/// against ~100 here.
///
/// # Safety
/// The CPU must have `dotprod`.
#[inline(always)]
unsafe fn q6_k_sdot_block(
    b: &[u8; 210],
    xq: &[i8; 256],
    m33: uint8x16_t,
    g: [int32x4_t; 4],
) -> [int32x4_t; 4] {
    let [mut g0, mut g1, mut g2, mut g3] = g;
    // SAFETY: reads the 192 bytes of `ql`/`qh` of `b` and the 256 of `xq` (post-indexed
    // through copies of their pointers); writes only the registers named as outputs or
    // clobbers; `sdot` needs `dotprod` (the caller's guarantee).
    unsafe {
        asm!(
            // v20-v23: qh & 0x33; v0-v3: (qh >> 2) & 0x33.
            "ld4 {{v20.16b-v23.16b}}, [{qh}]",
            "ushr v0.16b, v20.16b, #2",
            "ushr v1.16b, v21.16b, #2",
            "ushr v2.16b, v22.16b, #2",
            "ushr v3.16b, v23.16b, #2",
            "and v20.16b, v20.16b, {m33:v}.16b",
            "and v21.16b, v21.16b, {m33:v}.16b",
            "and v22.16b, v22.16b, {m33:v}.16b",
            "and v23.16b, v23.16b, {m33:v}.16b",
            "and v0.16b, v0.16b, {m33:v}.16b",
            "and v1.16b, v1.16b, {m33:v}.16b",
            "and v2.16b, v2.16b, {m33:v}.16b",
            "and v3.16b, v3.16b, {m33:v}.16b",
            // Half 0: v16-v19 ql, then low quants; v28-v31 high quants; v24-v27 x.
            "ld4 {{v16.16b-v19.16b}}, [{ql}], #64",
            "ld4 {{v24.16b-v27.16b}}, [{x}], #64",
            "zip1 v4.2d, v20.2d, v0.2d",
            "zip1 v28.2d, v20.2d, v0.2d",
            "sri v28.16b, v16.16b, #4",
            "sli v16.16b, v4.16b, #4",
            "sdot {g0:v}.4s, v16.16b, v24.16b",
            "zip1 v4.2d, v21.2d, v1.2d",
            "zip1 v29.2d, v21.2d, v1.2d",
            "sri v29.16b, v17.16b, #4",
            "sli v17.16b, v4.16b, #4",
            "sdot {g0:v}.4s, v17.16b, v25.16b",
            "zip1 v4.2d, v22.2d, v2.2d",
            "zip1 v30.2d, v22.2d, v2.2d",
            "sri v30.16b, v18.16b, #4",
            "sli v18.16b, v4.16b, #4",
            "sdot {g0:v}.4s, v18.16b, v26.16b",
            "zip1 v4.2d, v23.2d, v3.2d",
            "zip1 v31.2d, v23.2d, v3.2d",
            "sri v31.16b, v19.16b, #4",
            "sli v19.16b, v4.16b, #4",
            "sdot {g0:v}.4s, v19.16b, v27.16b",
            "ld4 {{v24.16b-v27.16b}}, [{x}], #64",
            "sdot {g1:v}.4s, v28.16b, v24.16b",
            "sdot {g1:v}.4s, v29.16b, v25.16b",
            "sdot {g1:v}.4s, v30.16b, v26.16b",
            "sdot {g1:v}.4s, v31.16b, v27.16b",
            // Half 1: the same with zip2.
            "ld4 {{v16.16b-v19.16b}}, [{ql}]",
            "ld4 {{v24.16b-v27.16b}}, [{x}], #64",
            "zip2 v4.2d, v20.2d, v0.2d",
            "zip2 v28.2d, v20.2d, v0.2d",
            "sri v28.16b, v16.16b, #4",
            "sli v16.16b, v4.16b, #4",
            "sdot {g2:v}.4s, v16.16b, v24.16b",
            "zip2 v4.2d, v21.2d, v1.2d",
            "zip2 v29.2d, v21.2d, v1.2d",
            "sri v29.16b, v17.16b, #4",
            "sli v17.16b, v4.16b, #4",
            "sdot {g2:v}.4s, v17.16b, v25.16b",
            "zip2 v4.2d, v22.2d, v2.2d",
            "zip2 v30.2d, v22.2d, v2.2d",
            "sri v30.16b, v18.16b, #4",
            "sli v18.16b, v4.16b, #4",
            "sdot {g2:v}.4s, v18.16b, v26.16b",
            "zip2 v4.2d, v23.2d, v3.2d",
            "zip2 v31.2d, v23.2d, v3.2d",
            "sri v31.16b, v19.16b, #4",
            "sli v19.16b, v4.16b, #4",
            "sdot {g2:v}.4s, v19.16b, v27.16b",
            "ld4 {{v24.16b-v27.16b}}, [{x}]",
            "sdot {g3:v}.4s, v28.16b, v24.16b",
            "sdot {g3:v}.4s, v29.16b, v25.16b",
            "sdot {g3:v}.4s, v30.16b, v26.16b",
            "sdot {g3:v}.4s, v31.16b, v27.16b",
            ql = inout(reg) b.as_ptr() => _,
            qh = in(reg) b.as_ptr().add(128),
            x = inout(reg) xq.as_ptr() => _,
            m33 = in(vreg) m33,
            g0 = inout(vreg) g0,
            g1 = inout(vreg) g1,
            g2 = inout(vreg) g2,
            g3 = inout(vreg) g3,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    [g0, g1, g2, g3]
}

/// Q6_K without `sdot` (see [`q6_k_body`] for the layout): one vector of products per
/// group of 16 elements, widened into i16 lanes, the totals gathered by pairwise adds.
///
/// The quants are dotted unbiased (0..63, a valid signed byte) and the bias comes off once
/// per super-block: `Σ_g sc[g] (Σ q x - 32 bsum[g])`, with the activation sums `bsums`
/// Q8_K carries. Each 16-weight vector is one shift-insert (`sli`/`sri`) and one mask;
/// weights, `qh` and activations are loaded 64 bytes at a time.
#[inline(always)]
unsafe fn q6_k_widening_body(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m6 = vdupq_n_u8(0x3F);
    let mut acc = vdupq_n_f32(0.0);
    for (b, xq, dx, bs) in x.blocks(row, 210) {
        let b: &[u8; 210] = b.try_into().expect("a Q6_K block");
        let xq: &[i8; 256] = xq.try_into().expect("a Q8_K block");
        let (bp, xp) = (b.as_ptr(), xq.as_ptr());
        // SAFETY: `b` is 210 bytes (ql at 0..128, qh at 128..192), `xq` 256.
        let (ql, qh) = unsafe {
            (
                [vld1q_u8_x4(bp), vld1q_u8_x4(bp.add(64))],
                vld1q_u8_x4(bp.add(128)),
            )
        };
        let qh = [[qh.0, qh.1], [qh.2, qh.3]];
        let mut p = [vdupq_n_s32(0); 16];
        for h in 0..2 {
            // SAFETY: activations `128h .. 128h + 128` of the 256.
            let xs = unsafe {
                [
                    vld1q_s8_x4(xp.add(128 * h)),
                    vld1q_s8_x4(xp.add(128 * h + 64)),
                ]
            };
            let xv = [
                xs[0].0, xs[0].1, xs[0].2, xs[0].3, xs[1].0, xs[1].1, xs[1].2, xs[1].3,
            ];
            let l = [ql[h].0, ql[h].1, ql[h].2, ql[h].3];
            for half in 0..2 {
                let (l0, l1, hh) = (l[half], l[2 + half], qh[h][half]);
                let hh2 = vshrq_n_u8::<2>(hh);
                let w = [
                    vandq_u8(vsliq_n_u8::<4>(l0, hh), m6),
                    vandq_u8(vsliq_n_u8::<4>(l1, hh2), m6),
                    vandq_u8(vsriq_n_u8::<4>(hh, l0), m6),
                    vandq_u8(vsriq_n_u8::<4>(hh2, l1), m6),
                ];
                for (s, w) in w.into_iter().enumerate() {
                    p[8 * h + 2 * s + half] = dot1::<false>(s8(w), xv[2 * s + half]);
                }
            }
        }
        let sc8 = vreinterpretq_s8_u8(ld16(&b[192..]));
        let (sc_lo, sc_hi) = (vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8));
        let sc = [
            vmovl_s16(vget_low_s16(sc_lo)),
            vmovl_high_s16(sc_lo),
            vmovl_s16(vget_low_s16(sc_hi)),
            vmovl_high_s16(sc_hi),
        ];
        let (b_lo, b_hi) = (ld8h(bs), ld8h(&bs[8..]));
        let bias = vmlal_high_s16(
            vmull_s16(vget_low_s16(sc_lo), vget_low_s16(b_lo)),
            sc_lo,
            b_lo,
        );
        let bias = vmlal_high_s16(
            vmlal_s16(bias, vget_low_s16(sc_hi), vget_low_s16(b_hi)),
            sc_hi,
            b_hi,
        );
        let sumi = vmlsq_s32(scaled16(&p, sc), bias, vdupq_n_s32(32));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * f16s(b, 208));
    }
    vaddvq_f32(acc)
}

/// Q2_K: 2-bit quants (element `128h + 32s + l` is bits `2s..2s+2` of `qs[32h + l]`), a
/// 4-bit scale and minimum per 16 elements.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q2_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m2 = vdupq_n_u8(0x03);
    let m4 = vdupq_n_u8(0x0F);
    let (mut acc, mut macc) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for (b, xq, dx, bs) in x.blocks(row, 84) {
        let scales = ld16(b);
        let mut p = [vdupq_n_s32(0); 16];
        for h in 0..2 {
            for half in 0..2 {
                let mut qs = ld16(&b[16 + 32 * h + 16 * half..]);
                for s in 0..4 {
                    let e = 128 * h + 32 * s + 16 * half;
                    p[e / 16] = dot1::<D>(s8(vandq_u8(qs, m2)), ld16i(&xq[e..]));
                    qs = vshrq_n_u8::<2>(qs);
                }
            }
        }
        let sc = widen_s8x16(s8(vandq_u8(scales, m4)));
        let sumi = scaled16(&p, sc);
        let mins = vshrq_n_u8::<4>(scales);
        let m_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        let m_hi = vreinterpretq_s16_u16(vmovl_high_u8(mins));
        let (b_lo, b_hi) = (ld8h(bs), ld8h(&bs[8..]));
        let summ = vmlal_high_s16(
            vmull_s16(vget_low_s16(m_lo), vget_low_s16(b_lo)),
            m_lo,
            b_lo,
        );
        let summ = vmlal_high_s16(
            vmlal_s16(summ, vget_low_s16(m_hi), vget_low_s16(b_hi)),
            m_hi,
            b_hi,
        );
        let dm = cvt_f16_u64(u32::from_le_bytes([b[80], b[81], b[82], b[83]]) as u64);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * vgetq_lane_f32::<0>(dm));
        macc = vfmaq_n_f32(macc, vcvtq_f32_s32(summ), dx * vgetq_lane_f32::<1>(dm));
    }
    vaddvq_f32(acc) - vaddvq_f32(macc)
}

/// Q3_K: Q2_K's low bits minus 4 where the high bit (`hmask`) is clear; signed 6-bit
/// scales.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q3_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m2 = vdupq_n_u8(0x03);
    let four = vdupq_n_u8(4);
    let mut acc = vdupq_n_f32(0.0);
    for (b, xq, dx, _) in x.blocks(row, 110) {
        let mut p = [vdupq_n_s32(0); 16];
        for half in 0..2 {
            let hm = ld16(&b[16 * half..]);
            for h in 0..2 {
                let mut qs = ld16(&b[32 + 32 * h + 16 * half..]);
                for s in 0..4 {
                    let e = 128 * h + 32 * s + 16 * half;
                    let t = vtstq_u8(hm, vdupq_n_u8(1 << (4 * h + s)));
                    let w = vsubq_u8(vandq_u8(qs, m2), vbicq_u8(four, t));
                    p[e / 16] = dot1::<D>(s8(w), ld16i(&xq[e..]));
                    qs = vshrq_n_u8::<2>(qs);
                }
            }
        }
        let sc = q3_k_scales(&b[96..108]);
        // SAFETY: `sc` holds 16 readable bytes.
        let sc = widen_s8x16(unsafe { vld1q_s8(sc.as_ptr()) });
        let sumi = scaled16(&p, sc);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * f16s(b, 108));
    }
    vaddvq_f32(acc)
}

/// Q8_K weights: signed bytes, f32 scale.
///
/// # Safety
/// `dotprod` must be available when `D`.
#[inline(always)]
unsafe fn q8_k_body<const D: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for (b, xq, dx, _) in x.blocks(row, 292) {
        let mut sumi = vdupq_n_s32(0);
        for c in 0..8 {
            let w = &b[4 + 32 * c..];
            let xs = &xq[32 * c..];
            sumi = vaddq_s32(
                sumi,
                dot2::<D, true>(s8(ld16(w)), ld16i(xs), s8(ld16(&w[16..])), ld16i(&xs[16..])),
            );
        }
        let dw = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), dx * dw);
    }
    vaddvq_f32(acc)
}

// ---- entry points --------------------------------------------------------------------

// For each kernel body, a plain NEON entry point and a `dotprod` one.
crate::entry_points::entry_pairs! {
    lo [], hi [#[target_feature(enable = "dotprod")]];
    q4_0, q4_0_dot = legacy_body::<0,>(Q8_0Slice<'_>);
    q4_1, q4_1_dot = legacy_body::<1,>(Q8_0Slice<'_>);
    q5_0, q5_0_dot = legacy_body::<2,>(Q8_0Slice<'_>);
    q5_1, q5_1_dot = legacy_body::<3,>(Q8_0Slice<'_>);
    q8_0, q8_0_dot = legacy_body::<4,>(Q8_0Slice<'_>);
    q5_0_packed, q5_0_packed_dot = q5_0_packed_body::<>(Q8_0Slice<'_>);
    q2_k, q2_k_dot = q2_k_body::<>(Q8KSlice<'_>);
    q3_k, q3_k_dot = q3_k_body::<>(Q8KSlice<'_>);
    q4_k, q4_k_dot = q4_k_body::<>(Q8KSlice<'_>);
    q5_k, q5_k_dot = q5_k_body::<>(Q8KSlice<'_>);
    q6_k, q6_k_dot = q6_k_body::<>(Q8KSlice<'_>);
    q8_k, q8_k_dot = q8_k_body::<>(Q8KSlice<'_>);
}
