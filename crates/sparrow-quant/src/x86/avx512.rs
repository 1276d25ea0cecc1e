//! AVX-512 kernels (F, BW, VL, VNNI).
//!
//! * f32 activations: 512-bit FMA, F16 widened with `vcvtph2ps` on 16 lanes.
//! * int8, Q8_0 and Q5_0 (the formats most of a Q4_K_M model is made of): two 32-element
//!   blocks per 512-bit register and `vpdpbusd`. Q8_0's signed weights become unsigned
//!   with `w ^ 0x80 = w + 128`; the `128 * sum(x)` this adds is removed exactly by a second
//!   `vpdpbusd` of `128` and the activations (per token, so the multi-token kernel shares
//!   the weight work), Q5_0's `-16` offset by starting the i32 accumulator at `-16 * sum(x)`
//!   per block.
//! * int8, Q4_K and Q6_K (nearly all of a Q4_K_M model's bytes): sums in *block totals*
//!   (see [`half_totals`]), the numerics the row-group kernels (`super::row_groups`, 16
//!   rows in the lanes) and the AMX tile kernels reproduce, so every token gets the same
//!   bits whichever of them computes it and at any batch size. The row kernels here take
//!   two 32-byte steps of each token per 512-bit product (see [`q4_k_body`]).
//! * int8, every other format: the AVX2 algorithms with 256-bit VNNI (`vpdpbusd`,
//!   `vpdpwssd`), i.e. the `*_vnni` entry points of [`super::avx2`].

use core::arch::x86_64::*;

use super::avx2::{self, ld16, ld32};
use crate::formats::BlockFormat;
use crate::q8::{scales_mins_k4, Q8KSlice, Q8_0Slice, Q8K_BLOCK, Q8_0_BLOCK};

#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn ld16f(p: &[f32]) -> __m512 {
    let p: &[f32; 16] = p.first_chunk().expect("16 floats");
    // SAFETY: `p` is 16 readable f32; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_ps(p.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ld64i(p: &[i8]) -> __m512i {
    let p: &[i8; 64] = p.first_chunk().expect("64 bytes");
    // SAFETY: `p` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(p.as_ptr().cast()) }
}

/// `[a, b]` as one 512-bit register (`a` in the low half).
#[inline]
#[target_feature(enable = "avx512f")]
fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
}

/// `v` in lane 0 and `w` in lane 8 of an otherwise zero vector (one move and one expand).
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes_0_8(v: i32, w: i32) -> __m512i {
    let pair = (v as u32 as u64 | (w as u32 as u64) << 32) as i64;
    _mm512_maskz_expand_epi32(0x0101, _mm512_castsi128_si512(_mm_cvtsi64_si128(pair)))
}

/// Eight lanes of `f16(b[o0..]) * d[0]`, then eight of `f16(b[o1..]) * d[1]`: both scales
/// widened by one `vcvtph2ps`, multiplied as a pair, spread by one permute.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn scale_pair(b: &[u8], o0: usize, o1: usize, d: &[f32]) -> __m512 {
    let h0 = u16::from_le_bytes([b[o0], b[o0 + 1]]) as u32;
    let h1 = u16::from_le_bytes([b[o1], b[o1 + 1]]) as u32;
    let w = _mm_cvtph_ps(_mm_cvtsi32_si128((h0 | h1 << 16) as i32));
    let dx = (d[0].to_bits() as u64 | (d[1].to_bits() as u64) << 32) as i64;
    let s = _mm_mul_ps(w, _mm_castsi128_ps(_mm_cvtsi64_si128(dx)));
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s))
}

// ---- f32 activations --------------------------------------------------------------------

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut wc = row.chunks_exact(128);
    let mut xc = x.chunks_exact(32);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let wv = _mm512_castsi512_ps(join(ld32(&w[64 * k..]), ld32(&w[64 * k + 32..])));
            acc[k] = _mm512_fmadd_ps(wv, ld16f(&xx[16 * k..]), acc[k]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
        + avx2::dot_f32(wc.remainder(), xc.remainder())
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut wc = row.chunks_exact(64);
    let mut xc = x.chunks_exact(32);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let wv = _mm512_cvtph_ps(ld32(&w[32 * k..]));
            acc[k] = _mm512_fmadd_ps(wv, ld16f(&xx[16 * k..]), acc[k]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
        + avx2::dot_f16(wc.remainder(), xc.remainder())
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut wc = row.chunks_exact(64);
    let mut xc = x.chunks_exact(32);
    for (w, xx) in (&mut wc).zip(&mut xc) {
        for k in 0..2 {
            let h = _mm512_cvtepu16_epi32(ld32(&w[32 * k..]));
            let wv = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
            acc[k] = _mm512_fmadd_ps(wv, ld16f(&xx[16 * k..]), acc[k]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
        + avx2::dot_bf16(wc.remainder(), xc.remainder())
}

/// Any block format: decoded by the scalar reference into a stack buffer, then 512-bit
/// FMA (blocks of 32 or 256 elements are whole 16-lane groups).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
    let mut buf = [0f32; 256];
    let buf = &mut buf[..F::BLOCK_ELEMS];
    let mut acc = [_mm512_setzero_ps(); 2];
    for (b, xb) in row
        .chunks_exact(F::BLOCK_BYTES)
        .zip(x.chunks_exact(F::BLOCK_ELEMS))
    {
        F::dequantize_block(b, buf);
        for (k, (w16, x16)) in buf.chunks_exact(16).zip(xb.chunks_exact(16)).enumerate() {
            acc[k & 1] = _mm512_fmadd_ps(ld16f(w16), ld16f(x16), acc[k & 1]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

// ---- int8: Q8_0 and Q5_0, two blocks per register ----------------------------------------

/// Q8_0 weights against `N` tokens, two blocks per iteration; an odd last block goes to
/// the 256-bit kernel. The weights' `w + 128` and their two f16 scales are computed once
/// per pair of blocks; per token, one `vpdpbusd` of them and one of `128` (the offset,
/// removed exactly in integers), the scales `d_w * d_x` as a pair, and one FMA. `N = 1` is the single-token kernel; each
/// token's result is the same for every `N`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C must be available.
#[inline(always)]
unsafe fn q8_0_body<const N: usize>(row: &[u8], xs: &[Q8_0Slice<'_>; N]) -> [f32; N] {
    let flip = _mm512_set1_epi8(-128);
    let n = avx2::common_blocks_all(row, 34, xs);
    let pairs = n / 2;
    let w = row.as_ptr();
    let q: [*const i8; N] = core::array::from_fn(|t| xs[t].qs.as_ptr());
    let d: [*const f32; N] = core::array::from_fn(|t| xs[t].d.as_ptr());
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..pairs {
        // SAFETY: blocks `2i`, `2i + 1` < `n`: the 68 weight bytes and, for every token,
        // 64 quants, two scales and two sums are in bounds (`common_blocks_all`).
        let b = w.add(68 * i);
        avx2::prefetch_ahead::<68>(b);
        let wv = join(
            _mm256_loadu_si256(b.add(2).cast()),
            _mm256_loadu_si256(b.add(36).cast()),
        );
        let u = _mm512_xor_si512(wv, flip); // w + 128 as unsigned
        let h = core::ptr::read_unaligned(b.cast::<u16>()) as u32
            | (core::ptr::read_unaligned(b.add(34).cast::<u16>()) as u32) << 16;
        let dw = _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32));
        for t in 0..N {
            let xq = _mm512_loadu_si512(q[t].add(64 * i).cast());
            // `sum (w + 128) x - sum 128 x`, per four bytes
            let p = _mm512_sub_epi32(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xq),
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, xq),
            );
            // `d_w * d_x` of both blocks, spread to eight lanes each
            let s = _mm_mul_ps(
                dw,
                _mm_castsi128_ps(_mm_loadl_epi64(d[t].add(2 * i).cast())),
            );
            let dv = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
            acc[t] = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(p), acc[t]);
        }
    }
    let mut s: [f32; N] = core::array::from_fn(|t| _mm512_reduce_add_ps(acc[t]));
    if n > 2 * pairs {
        let tails: [Q8_0Slice<'_>; N] = core::array::from_fn(|t| Q8_0Slice {
            d: &xs[t].d[2 * pairs..],
            sum: &xs[t].sum[2 * pairs..],
            qs: &xs[t].qs[64 * pairs..],
        });
        let tail = avx2::q8_0_body::<true, N>(&row[pairs * 68..], &tails);
        for t in 0..N {
            s[t] += tail[t];
        }
    }
    s
}

/// Q8_0 weights, one token (see [`q8_0_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q8_0(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { q8_0_body::<1>(row, &[x])[0] }
}

/// Q8_0 weights, any number of tokens, four at a time (see [`q8_0_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q8_0_multi(row: &[u8], xs: &[Q8_0Slice<'_>], out: &mut [f32]) {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { avx2::run_groups!(q8_0_body, row, xs, out, [8, 4, 3, 2, 1]) }
}

/// Q5_0 weights, two blocks per iteration: both blocks' nibbles in one register, the 64
/// fifth bits expanded by a byte mask (`vpmovm2b`-style masked move).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q5_0(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let m4 = _mm512_set1_epi8(0x0F);
    let b4 = _mm512_set1_epi8(0x10);
    let mut acc = _mm512_setzero_ps();
    let pairs = row.len() / 44;
    for (((b, xq), d), s) in row
        .chunks_exact(44)
        .zip(x.qs.chunks_exact(2 * Q8_0_BLOCK))
        .zip(x.d.chunks_exact(2))
        .zip(x.sum.chunks_exact(2))
    {
        avx2::prefetch_ahead::<44>(b.as_ptr());
        // 128-bit lanes [qs0, qs0, qs1, qs1], odd lanes shifted -> [lo0, hi0, lo1, hi1]
        let qs = _mm512_castsi256_si512(_mm256_set_m128i(ld16(&b[28..]), ld16(&b[6..])));
        let v = _mm512_shuffle_i64x2(qs, qs, 0b01_01_00_00);
        let q = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFF00_FF00, v, 4), m4);
        let qh0 = u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as u64;
        let qh1 = u32::from_le_bytes([b[24], b[25], b[26], b[27]]) as u64;
        let q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(qh0 | qh1 << 32, b4));
        let init = lanes_0_8(-16 * s[0], -16 * s[1]);
        let p = _mm512_dpbusd_epi32(init, q, ld64i(xq));
        let dv = scale_pair(b, 0, 22, d);
        acc = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(p), acc);
    }
    let mut s = _mm512_reduce_add_ps(acc);
    if row.len() > pairs * 44 {
        let tail = Q8_0Slice {
            d: &x.d[2 * pairs..],
            sum: &x.sum[2 * pairs..],
            qs: &x.qs[64 * pairs..],
        };
        s += avx2::q5_0_vnni(&row[pairs * 44..], tail);
    }
    s
}

// ---- int8, k-quants against several tokens: two 32-byte steps per register ---------------

/// `[a, b]` as one 512-bit register of floats (`a` in the low half).
#[inline(always)]
unsafe fn join_ps(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
    ))
}

/// The low and high 256-bit halves of `v`.
#[inline(always)]
unsafe fn split_ps(v: __m512) -> (__m256, __m256) {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    (_mm512_castps512_ps256(v), high)
}

/// The 256-bit halves of `v` added: the sums of a 512-bit accumulator whose halves held two
/// steps of what the 256-bit kernels accumulate in one register (integers, so exactly theirs).
#[inline(always)]
unsafe fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Q4_K against `N` tokens in block totals (see [`half_totals`]): each 32-byte step's low
/// nibbles (sub-block `2c`) and high nibbles (`2c + 1`) in the two halves of one register,
/// against the token's 64 contiguous quants of that step in one load (one `maddubs` and
/// one `vpdpwssd` per token and step); the block's sums and its minimums' sums reduced to
/// two integers (two tokens' reductions share a vector, see [`pair_totals`]) and scaled in
/// one FMA. Every token's result is the same for every `N`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C must be available.
#[inline(always)]
unsafe fn q4_k_body<const N: usize>(row: &[u8], xs: &[Q8KSlice<'_>; N]) -> [f32; N] {
    let m4 = _mm512_set1_epi8(0x0F);
    let nsb = avx2::common_k_blocks(row, 144, xs);
    let (q, d, bs) = avx2::k_pointers(xs);
    // Per token, the block sums in the low eight f32 lanes and the minimums' in the high
    // eight: one conversion and one FMA a block where the 256-bit kernel takes two of each,
    // lane for lane the same products and sums.
    let mut acc = [_mm512_setzero_ps(); N];
    for (i, b) in row.chunks_exact(144).take(nsb).enumerate() {
        avx2::prefetch_ahead::<144>(b.as_ptr());
        let (sc8, m8) = scales_mins_k4(&b[4..16]);
        let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64)));
        let mut sumi = [_mm512_setzero_si512(); N];
        for c in 0..4 {
            let qv = ld32(&b[16 + 32 * c..]);
            let w = _mm512_and_si512(join(qv, _mm256_srli_epi16(qv, 4)), m4);
            let pick = join(avx2::splat_i16_lane(2 * c), avx2::splat_i16_lane(2 * c + 1));
            let s = _mm512_shuffle_epi8(sc, pick);
            for t in 0..N {
                // SAFETY: super-block `i < nsb`: 256 quants of every token in bounds.
                let xq = _mm512_loadu_si512(q[t].add(Q8K_BLOCK * i + 64 * c).cast());
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(w, xq), s);
            }
        }
        let m = _mm_cvtsi64_si128(m8 as i64);
        let m_pairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
        let (dw, dmin) = (avx2::f16s(b, 0), avx2::f16s(b, 2));
        let scales = join_ps(_mm256_set1_ps(dw), _mm256_set1_ps(dmin));
        let both: [__m512i; N] = core::array::from_fn(|t| {
            // SAFETY: super-block `i < nsb`: its 16 bsums are in bounds.
            let bsums = _mm256_loadu_si256(bs[t].add(16 * i).cast());
            let msum = _mm256_madd_epi16(m_pairs, bsums);
            // [high half of the sums, minimums' sums], then the low half added to the first.
            let high_mins =
                _mm512_shuffle_i64x2::<0b01_00_11_10>(sumi[t], _mm512_castsi256_si512(msum));
            _mm512_mask_add_epi32(high_mins, 0x00FF, sumi[t], high_mins)
        });
        // SAFETY: super-block `i < nsb`: every token's scale is in bounds.
        let dx: [f32; N] = core::array::from_fn(|t| *d[t].add(i));
        let mut t = 0;
        // Two tokens per vector: [sums, minimums] of each as four-lane totals.
        let scales4 = _mm512_shuffle_f32x4::<0b10_00_10_00>(scales, scales);
        while t + 1 < N {
            let v = pair_totals(both[t], both[t + 1]);
            let dxv =
                _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(dx[t]), _mm512_set1_ps(dx[t + 1]));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dxv, scales4), _mm512_cvtepi32_ps(v), acc[t]);
            t += 2;
        }
        for t in t..N {
            let v = half_totals(both[t]);
            let dxv = _mm512_set1_ps(dx[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dxv, scales), _mm512_cvtepi32_ps(v), acc[t]);
        }
    }
    let lanes = |v: __m512| {
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), v);
        l
    };
    core::array::from_fn(|t| {
        // pairs of tokens: token 2k in lanes 0 (sums) and 4 (minimums) of acc[2k], token
        // 2k + 1 in lanes 8 and 12; an odd last token alone, in lanes 0 and 8
        if N % 2 == 1 && t == N - 1 {
            let l = lanes(acc[t]);
            return l[0] - l[8];
        }
        let l = lanes(acc[t - t % 2]);
        let o = 8 * (t % 2);
        l[o] - l[o + 4]
    })
}

/// Two tokens' `[sums | minimums]` vectors (eight lanes each, see [`q4_k_body`]) reduced
/// to four totals in one vector: 128-bit lanes `[x's sums, x's minimums, y's sums, y's
/// minimums]`, each total in all four of its lanes (integers: exact). The block totals of
/// two tokens in seven instructions where [`half_totals`] takes six per token.
#[inline(always)]
unsafe fn pair_totals(x: __m512i, y: __m512i) -> __m512i {
    let even = _mm512_shuffle_i32x4::<0b10_00_10_00>(x, y);
    let odd = _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y);
    let v = _mm512_add_epi32(even, odd);
    let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
    _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v))
}

/// Q6_K against `N` tokens in block totals (see [`half_totals`]): two 32-byte steps (`s`,
/// `s + 1` of a half) per register against the token's 64 contiguous quants of them, the
/// `-32` correction starting the low half; the halves added and reduced to the block's
/// total in integers (two tokens per vector) before its float scaling. Every token's result
/// is the same for every `N`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C must be available.
#[inline(always)]
unsafe fn q6_k_body<const N: usize>(row: &[u8], xs: &[Q8KSlice<'_>; N]) -> [f32; N] {
    let nsb = avx2::common_k_blocks(row, 210, xs);
    let (q, d, bs) = avx2::k_pointers(xs);
    let mut acc = [_mm256_setzero_ps(); N];
    // block totals: two tokens per vector, token 2k in the low half of pairs[2k]
    let mut pairs = [_mm512_setzero_ps(); N];
    for (i, b) in row.chunks_exact(210).take(nsb).enumerate() {
        avx2::prefetch_ahead::<210>(b.as_ptr());
        let sc = ld16(&b[192..]);
        let sc16 = _mm256_cvtepi8_epi16(sc);
        let mut sumi: [__m512i; N] = core::array::from_fn(|t| {
            // SAFETY: super-block `i < nsb`: its 16 bsums are in bounds.
            let bsums = _mm256_loadu_si256(bs[t].add(16 * i).cast());
            let corr = _mm256_madd_epi16(sc16, bsums);
            let low = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
            _mm512_zextsi256_si512(low)
        });
        for h in 0..2 {
            let ql0 = ld32(&b[h * 64..]);
            let ql1 = ld32(&b[h * 64 + 32..]);
            let qh = ld32(&b[128 + h * 32..]);
            for s in [0, 2] {
                let (q0, s0) = avx2::q6_k_step(ql0, ql1, qh, sc, h, s);
                let (q1, s1) = avx2::q6_k_step(ql0, ql1, qh, sc, h, s + 1);
                let (w, scv) = (join(q0, q1), join(s0, s1));
                for t in 0..N {
                    // SAFETY: super-block `i < nsb`: 256 quants of every token in bounds.
                    let xq = q[t].add(Q8K_BLOCK * i + h * 128 + s * 32);
                    let x = _mm512_loadu_si512(xq.cast());
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(w, x), scv);
                }
            }
        }
        let dw = avx2::f16s(b, 208);
        // SAFETY: super-block `i < nsb`: every token's scale is in bounds.
        let scale: [f32; N] = core::array::from_fn(|t| *d[t].add(i) * dw);
        let mut t = 0;
        while t + 1 < N {
            let v = join(fold_halves(sumi[t]), fold_halves(sumi[t + 1]));
            let both = join_ps(_mm256_set1_ps(scale[t]), _mm256_set1_ps(scale[t + 1]));
            pairs[t] = _mm512_fmadd_ps(both, _mm512_cvtepi32_ps(half_totals(v)), pairs[t]);
            t += 2;
        }
        for t in t..N {
            let sums = total_in_every_lane(fold_halves(sumi[t]));
            let d = _mm256_set1_ps(scale[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc[t]);
        }
    }
    core::array::from_fn(|t| {
        if N % 2 == 1 && t == N - 1 {
            return _mm256_cvtss_f32(acc[t]);
        }
        let (low, high) = split_ps(pairs[t - t % 2]);
        _mm256_cvtss_f32(if t % 2 == 0 { low } else { high })
    })
}

/// The eight lanes of `v` summed into every lane (integers: exact; see [`half_totals`]).
#[inline(always)]
unsafe fn total_in_every_lane(v: __m256i) -> __m256i {
    let v = _mm256_add_epi32(v, _mm256_permute2x128_si256::<1>(v, v));
    let v = _mm256_add_epi32(v, _mm256_shuffle_epi32::<0b01_00_11_10>(v));
    _mm256_add_epi32(v, _mm256_shuffle_epi32::<0b10_11_00_01>(v))
}

// ---- k-quants in block totals: the numerics a matrix unit can reproduce ------------------

/// Each 256-bit half of `v` summed into every lane of that half (integers: exact).
///
/// This is what the AVX-512 and AMX levels' Q4_K and Q6_K kernels sum in: *block totals*,
/// each super-block's integer sums (and its minimums' sums) reduced to one integer before
/// any float, then `acc = fma(dx * d, total, acc)` block after block (a second accumulator,
/// `dx * dmin`, for the minimums) and `acc - mins` at the end. The tile kernels
/// (`super::amx`) and the row-group kernels (`super::row_groups`), which get whole sums
/// out of tiles or out of lanes holding 16 rows rather than the row kernels' vector lanes,
/// compute exactly that per row and token, so the levels' single-token, multi-token, rows
/// and group kernels all give the same bits.
#[inline(always)]
unsafe fn half_totals(v: __m512i) -> __m512i {
    let v = _mm512_add_epi32(v, _mm512_shuffle_i32x4::<0b10_11_00_01>(v, v));
    let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
    _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v))
}

/// Q4_K weights in block totals, one token (see [`q4_k_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q4_k_totals(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { q4_k_body::<1>(row, &[x])[0] }
}

/// Q4_K weights in block totals, any number of tokens (see [`q4_k_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q4_k_totals_multi(row: &[u8], xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { avx2::run_groups!(q4_k_body, row, xs, out, [8, 4, 3, 2, 1]) }
}

/// Q6_K weights in block totals, one token (see [`q6_k_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q6_k_totals(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { q6_k_body::<1>(row, &[x])[0] }
}

/// Q6_K weights in block totals, any number of tokens (see [`q6_k_body`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q6_k_totals_multi(row: &[u8], xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    // SAFETY: every feature the body needs is enabled here.
    unsafe { avx2::run_groups!(q6_k_body, row, xs, out, [8, 4, 3, 2, 1]) }
}
