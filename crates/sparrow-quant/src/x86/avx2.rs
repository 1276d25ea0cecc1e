//! AVX2 + FMA + F16C kernels.
//!
//! int8 dots follow one pattern: weights are unpacked to *unsigned* bytes (the stored
//! quants, before any offset), multiplied with the signed activation bytes by `maddubs`
//! (pairs summed into i16; no saturation is possible since `|q| <= 63`, `|x| <= 127`) and
//! widened by `madd` (against ones, or against the sub-block scales for k-quants). Offsets
//! such as Q5_0's `-16` are folded back exactly in integers using the activation sums, so
//! the integer part equals the scalar reference bit for bit; only the per-block f32
//! scaling is done in vector lanes. Signed weights (Q8_0, Q8_K) use the `sign` trick:
//! `|w| * (x * sign w)`.
//!
//! Every function here is `#[target_feature]`: calling one is only sound on a CPU with
//! those features, which the dispatch in `crate::kernels` checks once at start-up.

use core::arch::x86_64::*;

use crate::formats::BlockFormat;
use crate::q8::{q3_k_scales, scale_min_k4, Q8KSlice, Q8_0Slice, Q8K_BLOCK, Q8_0_BLOCK};

// ---- small helpers ---------------------------------------------------------------------

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld32(p: &[u8]) -> __m256i {
    let p: &[u8; 32] = p.first_chunk().expect("32 bytes");
    // SAFETY: `p` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld32i(p: &[i8]) -> __m256i {
    let p: &[i8; 32] = p.first_chunk().expect("32 bytes");
    // SAFETY: `p` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld16(p: &[u8]) -> __m128i {
    let p: &[u8; 16] = p.first_chunk().expect("16 bytes");
    // SAFETY: `p` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld8f(p: &[f32]) -> __m256 {
    let p: &[f32; 8] = p.first_chunk().expect("8 floats");
    // SAFETY: `p` is 8 readable f32; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(p.as_ptr()) }
}

/// Little-endian f16 at `off` of `b`, widened with F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16s(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `i32` placed in lane 0 of an otherwise zero vector.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lane0(v: i32) -> __m256i {
    _mm256_zextsi128_si256(_mm_cvtsi32_si128(v))
}

/// Bit `i` of `bits` as byte `i`: 0xFF if set, 0 if clear.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bits_to_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m)
}

// The integer multiply-accumulate helpers below are generic over `V` (VNNI): `false` is
// plain AVX2 (`maddubs` + `madd` + add), `true` the AVX-512 VNNI fused forms (`vpdpbusd`,
// `vpdpwssd` on 256-bit registers, needing AVX-512 VL + VNNI). They and the kernel bodies
// are `#[inline(always)] unsafe fn`s without target features so that one body serves both
// instruction sets: it is inlined into an entry point (see `entries!`) whose
// `#[target_feature]` covers everything the instantiation uses.

/// `acc + sum of fours of (unsigned u * signed x)`.
///
/// # Safety
/// AVX2 must be available, and AVX-512 VL + VNNI too when `V`.
#[inline(always)]
unsafe fn acc_u8i8<const V: bool>(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
    if V {
        return _mm256_dpbusd_epi32(acc, u, x);
    }
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)),
    )
}

/// `acc + sum of fours of (signed w * signed x)`, `x != -128`, via `|w| * (x sign w)`.
///
/// # Safety
/// As [`acc_u8i8`].
#[inline(always)]
unsafe fn acc_i8i8<const V: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    acc_u8i8::<V>(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// `acc +` unsigned `u` times signed `x`, pairs summed to i16, times the i16 scales `sc`
/// (one per 16-bit lane), pairs summed into i32 lanes.
///
/// # Safety
/// As [`acc_u8i8`].
#[inline(always)]
unsafe fn acc_scaled<const V: bool>(acc: __m256i, u: __m256i, x: __m256i, sc: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(u, x);
    if V {
        return _mm256_dpwssd_epi32(acc, p, sc);
    }
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc))
}

/// Two i16 scales: `a` for the low 16 bytes, `b` for the high 16.
#[inline]
#[target_feature(enable = "avx2")]
fn scales2(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

// ---- f32-activation dots ----------------------------------------------------------------

/// F32 weights.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut wc = row.chunks_exact(64);
    let mut xc = x.chunks_exact(16);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let wv = _mm256_castsi256_ps(ld32(&w[32 * k..]));
            acc[k] = _mm256_fmadd_ps(wv, ld8f(&xx[8 * k..]), acc[k]);
        }
    }
    let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    for (b, &xv) in wc.remainder().chunks_exact(4).zip(xc.remainder()) {
        s += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * xv;
    }
    s
}

/// F16 weights, widened with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut wc = row.chunks_exact(32);
    let mut xc = x.chunks_exact(16);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let wv = _mm256_cvtph_ps(ld16(&w[16 * k..]));
            acc[k] = _mm256_fmadd_ps(wv, ld8f(&xx[8 * k..]), acc[k]);
        }
    }
    let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    for (b, &xv) in wc.remainder().chunks_exact(2).zip(xc.remainder()) {
        s += half::f16::from_le_bytes([b[0], b[1]]).to_f32() * xv;
    }
    s
}

/// BF16 weights (widening is a 16-bit shift).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut wc = row.chunks_exact(32);
    let mut xc = x.chunks_exact(16);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let h = _mm256_cvtepu16_epi32(ld16(&w[16 * k..]));
            let wv = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
            acc[k] = _mm256_fmadd_ps(wv, ld8f(&xx[8 * k..]), acc[k]);
        }
    }
    let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    for (b, &xv) in wc.remainder().chunks_exact(2).zip(xc.remainder()) {
        s += f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) * xv;
    }
    s
}

/// Any block format: each block decoded by the scalar reference (bit-exact, and
/// auto-vectorised under these target features) into a stack buffer, then an FMA dot.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
    let mut buf = [0f32; 256];
    let buf = &mut buf[..F::BLOCK_ELEMS];
    let mut acc = [_mm256_setzero_ps(); 2];
    for (b, xb) in row
        .chunks_exact(F::BLOCK_BYTES)
        .zip(x.chunks_exact(F::BLOCK_ELEMS))
    {
        F::dequantize_block(b, buf);
        for (k, (w8, x8)) in buf.chunks_exact(8).zip(xb.chunks_exact(8)).enumerate() {
            acc[k & 1] = _mm256_fmadd_ps(ld8f(w8), ld8f(x8), acc[k & 1]);
        }
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

// ---- int8 dots, legacy formats (Q8_0 activations) ----------------------------------------

/// Q8_0 weights: signed bytes, two blocks per iteration into two accumulators.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q8_0_body<const V: bool>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    for (k, ((b, xq), &dx)) in row
        .chunks_exact(34)
        .zip(x.qs.chunks_exact(Q8_0_BLOCK))
        .zip(x.d)
        .enumerate()
    {
        let p = acc_i8i8::<V>(_mm256_setzero_si256(), ld32(&b[2..]), ld32i(xq));
        let d = _mm256_set1_ps(f16s(b, 0) * dx);
        acc[k & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[k & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// Q4_0 (`TY = 0`), Q4_1 (1), Q5_0 (2), Q5_1 (3): nibbles (plus a fifth bit from `qh`)
/// as unsigned bytes; the offset (8 or 16) is removed in integers via the activation sum,
/// the minimum (`_1` formats) applied as `m * d_x * sum`.
///
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn legacy_body<const TY: u8, const V: bool>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let (bb, has_min, has_qh, off): (usize, bool, bool, i32) = match TY {
        0 => (18, false, false, 8),
        1 => (20, true, false, 0),
        2 => (22, false, true, 16),
        _ => (24, true, true, 0),
    };
    let qh_off = if has_min { 4 } else { 2 };
    let qs_off = 2 + 2 * has_min as usize + 4 * has_qh as usize;
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut macc = 0f32;
    for (k, (((b, xq), &dx), &sx)) in row
        .chunks_exact(bb)
        .zip(x.qs.chunks_exact(Q8_0_BLOCK))
        .zip(x.d)
        .zip(x.sum)
        .enumerate()
    {
        let qs = ld16(&b[qs_off..]);
        let qs = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
        let mut q = _mm256_and_si256(qs, m4);
        if has_qh {
            let qh = u32::from_le_bytes([b[qh_off], b[qh_off + 1], b[qh_off + 2], b[qh_off + 3]]);
            q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(qh), b4));
        }
        let mut p = acc_u8i8::<V>(_mm256_setzero_si256(), q, ld32i(xq));
        if off != 0 {
            p = _mm256_sub_epi32(p, lane0(off * sx));
        }
        let d = _mm256_set1_ps(f16s(b, 0) * dx);
        acc[k & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[k & 1]);
        if has_min {
            macc += f16s(b, 2) * (dx * sx as f32);
        }
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1])) + macc
}

// ---- int8 dots, k-quants (Q8_K activations) ---------------------------------------------

/// Iterates the super-blocks of a k-quant row with their activation block, scale and bsums.
macro_rules! k_blocks {
    ($row:expr, $bb:expr, $x:expr) => {
        $row.chunks_exact($bb)
            .zip($x.qs.chunks_exact(Q8K_BLOCK))
            .zip($x.d)
            .zip($x.bsums.chunks_exact(16))
            .map(|(((b, xq), &dx), bs)| (b, xq, dx, bs))
    };
}

/// Q4_K: sub-blocks `2c`, `2c+1` are the low/high nibbles of `qs[32c..32c+32]`; scales via
/// `madd`, minimums via the activation `bsums`.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q4_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut macc = 0f32;
    for (b, xq, dx, bs) in k_blocks!(row, 144, x) {
        let scales = &b[4..16];
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for c in 0..4 {
            let (s0, m0) = scale_min_k4(scales, 2 * c);
            let (s1, m1) = scale_min_k4(scales, 2 * c + 1);
            summ += m0 as i32 * (bs[4 * c] as i32 + bs[4 * c + 1] as i32)
                + m1 as i32 * (bs[4 * c + 2] as i32 + bs[4 * c + 3] as i32);
            let q = ld32(&b[16 + 32 * c..]);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let x0 = ld32i(&xq[64 * c..]);
            let x1 = ld32i(&xq[64 * c + 32..]);
            sumi = acc_scaled::<V>(sumi, lo, x0, _mm256_set1_epi16(s0 as i16));
            sumi = acc_scaled::<V>(sumi, hi, x1, _mm256_set1_epi16(s1 as i16));
        }
        let d = _mm256_set1_ps(dx * f16s(b, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        macc += (dx * f16s(b, 2)) * summ as f32;
    }
    hsum_ps(acc) - macc
}

/// Q5_K: Q4_K plus bit `j` of `qh[l]` as bit 4 of element `32j + l`.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q5_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut macc = 0f32;
    for (b, xq, dx, bs) in k_blocks!(row, 176, x) {
        let scales = &b[4..16];
        let qh = ld32(&b[16..]);
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for c in 0..4 {
            let (s0, m0) = scale_min_k4(scales, 2 * c);
            let (s1, m1) = scale_min_k4(scales, 2 * c + 1);
            summ += m0 as i32 * (bs[4 * c] as i32 + bs[4 * c + 1] as i32)
                + m1 as i32 * (bs[4 * c + 2] as i32 + bs[4 * c + 3] as i32);
            let q = ld32(&b[48 + 32 * c..]);
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
            let h1 = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                one,
            );
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h0, 4));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                _mm256_slli_epi16(h1, 4),
            );
            let x0 = ld32i(&xq[64 * c..]);
            let x1 = ld32i(&xq[64 * c + 32..]);
            sumi = acc_scaled::<V>(sumi, lo, x0, _mm256_set1_epi16(s0 as i16));
            sumi = acc_scaled::<V>(sumi, hi, x1, _mm256_set1_epi16(s1 as i16));
        }
        let d = _mm256_set1_ps(dx * f16s(b, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        macc += (dx * f16s(b, 2)) * summ as f32;
    }
    hsum_ps(acc) - macc
}

/// Q6_K: unsigned 6-bit quants `ql | qh << 4`; the `-32` bias is removed in integers as
/// `32 * sum_g sc_g * bsum_g`.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q6_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    for (b, xq, dx, bs) in k_blocks!(row, 210, x) {
        let sc: [i8; 16] = core::array::from_fn(|g| b[192 + g] as i8);
        let mut corr = 0i32;
        for g in 0..16 {
            corr += sc[g] as i32 * bs[g] as i32;
        }
        let mut sumi = lane0(-32 * corr);
        for h in 0..2 {
            let ql0 = ld32(&b[h * 64..]);
            let ql1 = ld32(&b[h * 64 + 32..]);
            let qh = ld32(&b[128 + h * 32..]);
            let lows = [
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            ];
            for (s, lo) in lows.into_iter().enumerate() {
                let hb =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s as i32)), m2);
                let q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                let g = h * 8 + 2 * s;
                let scv = scales2(sc[g] as i16, sc[g + 1] as i16);
                sumi = acc_scaled::<V>(sumi, q, ld32i(&xq[h * 128 + s * 32..]), scv);
            }
        }
        let d = _mm256_set1_ps(dx * f16s(b, 208));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q2_K: 2-bit quants laid out like Q6_K's high bits; scale and minimum per 16 elements.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q2_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    let mut macc = 0f32;
    for (b, xq, dx, bs) in k_blocks!(row, 84, x) {
        let scales = &b[0..16];
        let mut summ = 0i32;
        for g in 0..16 {
            summ += (scales[g] >> 4) as i32 * bs[g] as i32;
        }
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qs = ld32(&b[16 + h * 32..]);
            for s in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * s as i32)), m2);
                let g = h * 8 + 2 * s;
                let scv = scales2((scales[g] & 0x0F) as i16, (scales[g + 1] & 0x0F) as i16);
                sumi = acc_scaled::<V>(sumi, q, ld32i(&xq[h * 128 + s * 32..]), scv);
            }
        }
        let d = _mm256_set1_ps(dx * f16s(b, 80));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        macc += (dx * f16s(b, 82)) * summ as f32;
    }
    hsum_ps(acc) - macc
}

/// Q3_K: Q2_K's low bits plus a high bit from `hmask` (unsigned `low + 4*high`), the `-4`
/// removed in integers through the bsums; signed 6-bit scales.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q3_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m2 = _mm256_set1_epi8(0x03);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    for (b, xq, dx, bs) in k_blocks!(row, 110, x) {
        let sc = q3_k_scales(&b[96..108]);
        let mut corr = 0i32;
        for g in 0..16 {
            corr += sc[g] as i32 * bs[g] as i32;
        }
        let mut sumi = lane0(-4 * corr);
        let hm = ld32(&b[0..]);
        for h in 0..2 {
            let qs = ld32(&b[32 + h * 32..]);
            for s in 0..4 {
                let lo =
                    _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * s as i32)), m2);
                let hb = _mm256_and_si256(
                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + s) as i32)),
                    one,
                );
                let q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
                let g = h * 8 + 2 * s;
                let scv = scales2(sc[g] as i16, sc[g + 1] as i16);
                sumi = acc_scaled::<V>(sumi, q, ld32i(&xq[h * 128 + s * 32..]), scv);
            }
        }
        let d = _mm256_set1_ps(dx * f16s(b, 108));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q8_K weights: signed bytes, f32 scale.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q8_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, xq, dx, _) in k_blocks!(row, 292, x) {
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            sumi = acc_i8i8::<V>(sumi, ld32(&b[4 + 32 * c..]), ld32i(&xq[32 * c..]));
        }
        let dw = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

// ---- entry points --------------------------------------------------------------------

/// For each kernel body, an AVX2 entry point and (when compiled) an AVX-512 VNNI one.
macro_rules! entries {
    ($($avx2:ident, $vnni:ident = $body:ident::<$($c:literal,)*>($x:ty);)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) fn $avx2(row: &[u8], x: $x) -> f32 {
            // SAFETY: the body with `V = false` needs AVX2, FMA and F16C, enabled here.
            unsafe { $body::<$($c,)* false>(row, x) }
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $vnni(row: &[u8], x: $x) -> f32 {
            // SAFETY: the body with `V = true` needs AVX2, FMA, F16C and AVX-512 VL + VNNI,
            // all enabled here.
            unsafe { $body::<$($c,)* true>(row, x) }
        }
    )*};
}

entries! {
    q4_0, q4_0_vnni = legacy_body::<0,>(Q8_0Slice<'_>);
    q4_1, q4_1_vnni = legacy_body::<1,>(Q8_0Slice<'_>);
    q5_0, q5_0_vnni = legacy_body::<2,>(Q8_0Slice<'_>);
    q5_1, q5_1_vnni = legacy_body::<3,>(Q8_0Slice<'_>);
    q8_0, q8_0_vnni = q8_0_body::<>(Q8_0Slice<'_>);
    q2_k, q2_k_vnni = q2_k_body::<>(Q8KSlice<'_>);
    q3_k, q3_k_vnni = q3_k_body::<>(Q8KSlice<'_>);
    q4_k, q4_k_vnni = q4_k_body::<>(Q8KSlice<'_>);
    q5_k, q5_k_vnni = q5_k_body::<>(Q8KSlice<'_>);
    q6_k, q6_k_vnni = q6_k_body::<>(Q8KSlice<'_>);
    q8_k, q8_k_vnni = q8_k_body::<>(Q8KSlice<'_>);
}
