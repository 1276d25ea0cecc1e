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

use crate::formats::kquants::scale_min_k4;
use crate::formats::BlockFormat;
use crate::q8::{
    common_blocks, legacy_layout, q3_k_scales, scales_mins_k4, Q8KSlice, Q8_0Slice, Q8K_BLOCK,
};

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

/// How far ahead of the current position the row kernels prefetch weights: the hardware
/// prefetcher alone leaves one core short of its streaming rate (measured on Zen 3: the
/// packed Q5_0 kernel read ~10% faster from DRAM with 1 KiB). On Zen 4 (session 19,
/// `bandwidth` example, two threads, medians of five) farther is better up to ~8 KiB:
/// Q4_K matvec 29.6 / 34.5 / 35.9 / 36.8 GB/s at 1 / 4 / 8 / 16 KiB, Q6_K 30.6 / 38.8 /
/// 41.7 / 41.0, Q8_0 33.1 / 38.5 / 40.1 / 42.0 (a plain read: ~28); decode of the 1.5B
/// 26–27 / 31–32 / 31–32 tok/s at 1 / 4 / 8 KiB, of the 0.5B 56–64 / 68–70 / 71–76. What
/// runs past a thread's last row is at most this much per product.
const PREFETCH_BYTES: usize = 8192;

/// Asks for every cache line of the `SPAN` bytes `PREFETCH_BYTES` past `p` (hints: never
/// fault, even past the end of the row). A caller passes the bytes it consumes per call, so
/// consecutive calls cover the row without gaps: one line per call left two lines in five
/// of a Q4_K row (144-byte blocks) to the hardware prefetcher, and covering them all (still
/// 1 KiB ahead) took matvec on two threads from 20 to 27 GB/s for Q4_K and 23.5 to 26 for
/// Q6_K (Zen 4, `cargo run --release -p sparrow-quant --example bandwidth`, medians of six).
#[inline(always)]
pub(super) fn prefetch_ahead<const SPAN: usize>(p: *const u8) {
    prefetch_at::<SPAN, PREFETCH_BYTES>(p)
}

/// [`prefetch_ahead`] at a distance of `DIST` bytes (a kernel that consumes its bytes
/// faster needs its lines asked for further ahead to cover the same latency).
#[inline(always)]
pub(super) fn prefetch_at<const SPAN: usize, const DIST: usize>(p: *const u8) {
    let ahead = p.wrapping_add(DIST);
    let mut off = 0;
    while off < SPAN {
        // SAFETY: a prefetch is a hint that cannot fault on any address; `wrapping_add`
        // keeps the pointer arithmetic defined past the end of the allocation. SSE is
        // baseline on x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off).cast()) };
        off += 64;
    }
    // the span's last line, where it straddles one more than `SPAN / 64` lines
    // SAFETY: as above.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(SPAN - 1).cast()) };
}

/// The f16 at `p`, widened with F16C.
///
/// # Safety
/// `p` must point to two readable bytes; F16C must be available.
#[inline(always)]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    let bits = core::ptr::read_unaligned(p.cast::<u16>());
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Number of whole blocks a legacy-format row has in common with every token's
/// activations (see [`common_blocks`]).
#[inline(always)]
pub(super) fn common_blocks_all<const N: usize>(
    row: &[u8],
    block_bytes: usize,
    xs: &[Q8_0Slice<'_>; N],
) -> usize {
    xs.iter().fold(row.len() / block_bytes, |n, &x| {
        n.min(common_blocks(row, block_bytes, x))
    })
}

/// One Q8_0 block (`b`, block index `k` of the row) times block `k` of each token's
/// activations, accumulated into `acc[t]`: `|w|` and the f16 scale are computed once, then
/// per token `acc[t] += (d_w * d_x) * sum(w * x)`, the same operations as for one token.
///
/// # Safety
/// `b` must point to a whole 34-byte block and each `q[t]`, `d[t]` to at least `k + 1`
/// blocks of quants and scales; features as [`acc_u8i8`] plus FMA and F16C.
#[inline(always)]
unsafe fn q8_0_step<const V: bool, const N: usize>(
    b: *const u8,
    q: &[*const i8; N],
    d: &[*const f32; N],
    k: usize,
    acc: &mut [__m256; N],
) {
    let wq = _mm256_loadu_si256(b.add(2).cast());
    let aw = _mm256_sign_epi8(wq, wq);
    let dw = f16_ptr(b);
    for t in 0..N {
        let xq = _mm256_loadu_si256(q[t].add(32 * k).cast());
        let p = acc_u8i8::<V>(_mm256_setzero_si256(), aw, _mm256_sign_epi8(xq, wq));
        let s = _mm256_set1_ps(dw * *d[t].add(k));
        acc[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[t]);
    }
}

/// Q8_0 weights against `N` tokens: signed bytes, two blocks per iteration into two
/// accumulators per token (even and odd blocks; kept in registers: explicit pointers and
/// constant indices only, as an accumulator indexed by a run-time value was spilled to the
/// stack, chaining every block through a store and a load). `N = 1` is the single-token
/// kernel; each token's result is the same for every `N`.
///
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
pub(super) unsafe fn q8_0_body<const V: bool, const N: usize>(
    row: &[u8],
    xs: &[Q8_0Slice<'_>; N],
) -> [f32; N] {
    let n = common_blocks_all(row, 34, xs);
    let w = row.as_ptr();
    let q: [*const i8; N] = core::array::from_fn(|t| xs[t].qs.as_ptr());
    let d: [*const f32; N] = core::array::from_fn(|t| xs[t].d.as_ptr());
    let mut acc0 = [_mm256_setzero_ps(); N];
    let mut acc1 = [_mm256_setzero_ps(); N];
    let mut k = 0;
    // SAFETY (all block reads below): `k < n` (or `k + 1 < n`), and `n` whole blocks of
    // weights, and of every token's quants and scales, are in bounds by `common_blocks_all`.
    while k + 1 < n {
        prefetch_ahead::<68>(w.add(34 * k));
        q8_0_step::<V, N>(w.add(34 * k), &q, &d, k, &mut acc0);
        q8_0_step::<V, N>(w.add(34 * k + 34), &q, &d, k + 1, &mut acc1);
        k += 2;
    }
    if k < n {
        q8_0_step::<V, N>(w.add(34 * k), &q, &d, k, &mut acc0);
    }
    core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc0[t], acc1[t])))
}

/// One legacy block times its activation block: the integer sums (offset removed) as f32
/// lanes and the combined scale `d_w * d_x`.
///
/// # Safety
/// `b` must point to a whole block of format `TY`, `q` to 32 readable quants; features as
/// [`acc_u8i8`] plus F16C.
#[inline(always)]
unsafe fn legacy_block<const TY: u8, const V: bool>(
    b: *const u8,
    q: *const i8,
    dx: f32,
    sx: i32,
) -> (__m256, __m256) {
    let l = legacy_layout(TY);
    let qs = _mm_loadu_si128(b.add(l.qs_off).cast());
    let qs = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
    let mut u = _mm256_and_si256(qs, _mm256_set1_epi8(0x0F));
    if l.has_qh {
        let qh = core::ptr::read_unaligned(b.add(l.qh_off).cast::<u32>());
        u = _mm256_or_si256(
            u,
            _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)),
        );
    }
    let mut p = acc_u8i8::<V>(_mm256_setzero_si256(), u, _mm256_loadu_si256(q.cast()));
    if l.off != 0 {
        p = _mm256_sub_epi32(p, lane0(l.off * sx));
    }
    (_mm256_set1_ps(f16_ptr(b) * dx), _mm256_cvtepi32_ps(p))
}

/// Q4_0, Q4_1, Q5_0, Q5_1: nibbles (plus a fifth bit from `qh`) as unsigned bytes; the
/// offset (8 or 16) is removed in integers via the activation sum, the minimum (`_1`
/// formats) applied as `m * d_x * sum`. Two blocks per iteration, as [`q8_0_body`].
///
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn legacy_body<const TY: u8, const V: bool>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let l = legacy_layout(TY);
    let n = common_blocks(row, l.bytes, x);
    let (w, q, d, sum) = (row.as_ptr(), x.qs.as_ptr(), x.d.as_ptr(), x.sum.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut macc = 0f32;
    let mut k = 0;
    // SAFETY (all block reads below): `k < n` (or `k + 1 < n`), and `n` whole blocks of
    // weights, quants, scales and sums are in bounds by `common_blocks`.
    while k + 1 < n {
        let b0 = w.add(l.bytes * k);
        let b1 = b0.add(l.bytes);
        let (s0, p0) = legacy_block::<TY, V>(b0, q.add(32 * k), *d.add(k), *sum.add(k));
        let (s1, p1) =
            legacy_block::<TY, V>(b1, q.add(32 * k + 32), *d.add(k + 1), *sum.add(k + 1));
        acc0 = _mm256_fmadd_ps(s0, p0, acc0);
        acc1 = _mm256_fmadd_ps(s1, p1, acc1);
        if l.has_min {
            macc += f16_ptr(b0.add(2)) * (*d.add(k) * *sum.add(k) as f32);
            macc += f16_ptr(b1.add(2)) * (*d.add(k + 1) * *sum.add(k + 1) as f32);
        }
        k += 2;
    }
    if k < n {
        let b0 = w.add(l.bytes * k);
        let (s0, p0) = legacy_block::<TY, V>(b0, q.add(32 * k), *d.add(k), *sum.add(k));
        acc0 = _mm256_fmadd_ps(s0, p0, acc0);
        if l.has_min {
            macc += f16_ptr(b0.add(2)) * (*d.add(k) * *sum.add(k) as f32);
        }
    }
    hsum_ps(_mm256_add_ps(acc0, acc1)) + macc
}

/// Q5_0 rows in the packed layout (see `crate::packed`) against `N` tokens: per group of
/// four blocks, one conversion for the four scales, one shift for the transposed fifth
/// bits, and per block a shift and a mask for its fifth bits and one or two operations for
/// its nibbles, all shared by the tokens; per block and token one multiply-accumulate, the
/// offset removal and one FMA. The integer sums (offset removed per block, as in
/// [`legacy_body`]) equal the scalar reference's; blocks after the last whole group are in
/// ggml's layout. `N = 1` is the single-token kernel; each token's result is the same for
/// every `N`.
///
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q5_0_packed_body<const V: bool, const N: usize>(
    row: &[u8],
    xs: &[Q8_0Slice<'_>; N],
) -> [f32; N] {
    use crate::packed::{GROUP_BLOCKS, GROUP_BYTES};
    let n = common_blocks_all(row, 22, xs);
    let groups = n / GROUP_BLOCKS;
    let w = row.as_ptr();
    let q: [*const i8; N] = core::array::from_fn(|t| xs[t].qs.as_ptr());
    let d: [*const f32; N] = core::array::from_fn(|t| xs[t].d.as_ptr());
    let sum: [*const i32; N] = core::array::from_fn(|t| xs[t].sum.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    // Shifts the upper 128 bits' bytes right by 4, bringing elements 16..32's fifth bits
    // (bits 4..8 of each byte) down to bits 0..4, where elements 0..16's sit below.
    let upper_by_4 = _mm256_setr_epi64x(0, 0, 4, 4);
    let mut acc0 = [_mm256_setzero_ps(); N];
    let mut acc1 = [_mm256_setzero_ps(); N];
    for g in 0..groups {
        // SAFETY: group `g < groups` lies within the row's first `n` blocks (22 bytes
        // each, 88 per group), and its 4 blocks of quants, scales and sums within every
        // token's first `n` (see `common_blocks_all`).
        let gp = w.add(g * GROUP_BYTES);
        prefetch_ahead::<GROUP_BYTES>(gp);
        let k0 = g * GROUP_BLOCKS;
        let wscales = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(gp.cast())));
        let hi = _mm256_srlv_epi64(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(gp.add(8).cast())),
            upper_by_4,
        );
        let q01 = _mm256_loadu_si256(gp.add(24).cast());
        let q23 = _mm256_loadu_si256(gp.add(56).cast());
        for k in 0..GROUP_BLOCKS {
            // Block k's nibbles, and its fifth bits (at bit k of `hi`) shifted to bit 4.
            let (lows, fifth) = match k {
                0 => (q01, _mm256_slli_epi16(hi, 4)),
                1 => (_mm256_srli_epi16(q01, 4), _mm256_slli_epi16(hi, 3)),
                2 => (q23, _mm256_slli_epi16(hi, 2)),
                _ => (_mm256_srli_epi16(q23, 4), _mm256_slli_epi16(hi, 1)),
            };
            let u = _mm256_or_si256(_mm256_and_si256(lows, m4), _mm256_and_si256(fifth, b4));
            let dw = _mm256_permutevar8x32_ps(wscales, _mm256_set1_epi32(k as i32));
            for t in 0..N {
                let xq = _mm256_loadu_si256(q[t].add(32 * (k0 + k)).cast());
                let p = acc_u8i8::<V>(_mm256_setzero_si256(), u, xq);
                let p = _mm256_sub_epi32(p, lane0(16 * *sum[t].add(k0 + k)));
                // `d_w * d_x` in every lane, as one lane of the four scales' product
                let s = _mm256_mul_ps(dw, _mm256_set1_ps(*d[t].add(k0 + k)));
                if k % 2 == 0 {
                    acc0[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc0[t]);
                } else {
                    acc1[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc1[t]);
                }
            }
        }
    }
    for k in groups * GROUP_BLOCKS..n {
        for t in 0..N {
            // SAFETY: `k < n`: a whole ggml-layout block and every token's activations
            // for it are in bounds.
            let (s, p) = legacy_block::<2, V>(
                w.add(22 * k),
                q[t].add(32 * k),
                *d[t].add(k),
                *sum[t].add(k),
            );
            acc0[t] = _mm256_fmadd_ps(s, p, acc0[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc0[t], acc1[t])))
}

// ---- int8 dots, k-quants (Q8_K activations) ---------------------------------------------

/// `vpshufb` control that broadcasts 16-bit lane `j` (of each 128-bit half) to all lanes.
#[inline(always)]
pub(super) unsafe fn splat_i16_lane(j: usize) -> __m256i {
    _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16)
}

/// Every token's Q8_K quants, super-block scales and 16-element sums as pointers, which a
/// k-quant body steps through by super-block once [`common_k_blocks`] has bounded the count.
#[inline(always)]
pub(super) fn k_pointers<const N: usize>(
    xs: &[Q8KSlice<'_>; N],
) -> ([*const i8; N], [*const f32; N], [*const i16; N]) {
    (
        core::array::from_fn(|t| xs[t].qs.as_ptr()),
        core::array::from_fn(|t| xs[t].d.as_ptr()),
        core::array::from_fn(|t| xs[t].bsums.as_ptr()),
    )
}

/// Number of whole super-blocks (of `block_bytes`) a k-quant row has in common with every
/// token's Q8_K activations (the shortest decides, as a zip of the blocks would).
#[inline(always)]
pub(super) fn common_k_blocks<const N: usize>(
    row: &[u8],
    block_bytes: usize,
    xs: &[Q8KSlice<'_>; N],
) -> usize {
    xs.iter().fold(row.len() / block_bytes, |n, x| {
        n.min(x.d.len())
            .min(x.qs.len() / Q8K_BLOCK)
            .min(x.bsums.len() / 16)
    })
}

/// Q4_K against `N` tokens: sub-blocks `2c`, `2c+1` are the low/high nibbles of
/// `qs[32c..32c+32]`. The 6-bit scales are unpacked once per super-block into i16 lanes
/// and broadcast per sub-block with one shuffle; the minimums meet the activation `bsums`
/// in one `madd` (each minimum paired with its sub-block's two 16-element sums),
/// accumulated in f32 lanes. Unpacking is shared by the tokens; `N = 1` is the
/// single-token kernel, and each token's result is the same for every `N`.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q4_k_body<const V: bool, const N: usize>(row: &[u8], xs: &[Q8KSlice<'_>; N]) -> [f32; N] {
    let m4 = _mm256_set1_epi8(0x0F);
    let nsb = common_k_blocks(row, 144, xs);
    let (q, d, bs) = k_pointers(xs);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut macc = [_mm256_setzero_ps(); N];
    for (i, b) in row.chunks_exact(144).take(nsb).enumerate() {
        prefetch_ahead::<144>(b.as_ptr());
        let (sc8, m8) = scales_mins_k4(&b[4..16]);
        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64)));
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let qv = ld32(&b[16 + 32 * c..]);
            let lo = _mm256_and_si256(qv, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            let s0 = _mm256_shuffle_epi8(sc, splat_i16_lane(2 * c));
            let s1 = _mm256_shuffle_epi8(sc, splat_i16_lane(2 * c + 1));
            for t in 0..N {
                // SAFETY: super-block `i < nsb`: 256 quants of every token in bounds.
                let xq = q[t].add(Q8K_BLOCK * i + 64 * c);
                let x0 = _mm256_loadu_si256(xq.cast());
                let x1 = _mm256_loadu_si256(xq.add(32).cast());
                sumi[t] = acc_scaled::<V>(sumi[t], lo, x0, s0);
                sumi[t] = acc_scaled::<V>(sumi[t], hi, x1, s1);
            }
        }
        let m = _mm_cvtsi64_si128(m8 as i64);
        let m_pairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
        let (dw, dmin) = (f16s(b, 0), f16s(b, 2));
        for t in 0..N {
            // SAFETY: super-block `i < nsb`: its 16 bsums and scale are in bounds.
            let bsums = _mm256_loadu_si256(bs[t].add(16 * i).cast());
            let dx = *d[t].add(i);
            let msum = _mm256_madd_epi16(m_pairs, bsums);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            macc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dmin), _mm256_cvtepi32_ps(msum), macc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]) - hsum_ps(macc[t]))
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
    for (b, xq, dx, bs) in x.blocks(row, 176) {
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

/// Step `s` (0..4) of half `h` of a Q6_K super-block: its 32 unsigned 6-bit quants (from
/// `ql0`, `ql1`, the half's two 32-byte runs of low nibbles, and `qh`, its high bits) and
/// its two scales (groups `8h + 2s` and `8h + 2s + 1` of the block's sixteen signed scales
/// `sc`), widened to i16 over the step's low and high 16 bytes.
///
/// # Safety
/// AVX2 must be available.
#[inline(always)]
pub(super) unsafe fn q6_k_step(
    ql0: __m256i,
    ql1: __m256i,
    qh: __m256i,
    sc: __m128i,
    h: usize,
    s: usize,
) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let lo = match s {
        0 => _mm256_and_si256(ql0, m4),
        1 => _mm256_and_si256(ql1, m4),
        2 => _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
        _ => _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
    };
    let hb = _mm256_and_si256(
        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s as i32)),
        _mm256_set1_epi8(0x03),
    );
    let qv = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    let (g, g1) = ((h * 8 + 2 * s) as i8, (h * 8 + 2 * s + 1) as i8);
    let pair = _mm_setr_epi8(g, g, g, g, g, g, g, g, g1, g1, g1, g1, g1, g1, g1, g1);
    (qv, _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pair)))
}

/// Q6_K against `N` tokens: unsigned 6-bit quants `ql | qh << 4`. The sixteen signed
/// scales are widened to i16 once per super-block; each pair `(g, g+1)` (low and high 16
/// elements of a 32-byte step) is spread over the two halves with one shuffle and one
/// widening; the `-32` bias is removed in integers as `32 * sum_g sc_g * bsum_g`, one
/// `madd` of scales and bsums. Unpacking is shared by the tokens; `N = 1` is the
/// single-token kernel, and each token's result is the same for every `N`.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q6_k_body<const V: bool, const N: usize>(row: &[u8], xs: &[Q8KSlice<'_>; N]) -> [f32; N] {
    let nsb = common_k_blocks(row, 210, xs);
    let (q, d, bs) = k_pointers(xs);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, b) in row.chunks_exact(210).take(nsb).enumerate() {
        prefetch_ahead::<210>(b.as_ptr());
        let sc = ld16(&b[192..]);
        let sc16 = _mm256_cvtepi8_epi16(sc);
        let mut sumi: [__m256i; N] = core::array::from_fn(|t| {
            // SAFETY: super-block `i < nsb`: its 16 bsums are in bounds.
            let bsums = _mm256_loadu_si256(bs[t].add(16 * i).cast());
            let corr = _mm256_madd_epi16(sc16, bsums);
            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5))
        });
        for h in 0..2 {
            let ql0 = ld32(&b[h * 64..]);
            let ql1 = ld32(&b[h * 64 + 32..]);
            let qh = ld32(&b[128 + h * 32..]);
            for s in 0..4 {
                let (qv, scv) = q6_k_step(ql0, ql1, qh, sc, h, s);
                for t in 0..N {
                    // SAFETY: super-block `i < nsb`: 256 quants of every token in bounds.
                    let xq = q[t].add(Q8K_BLOCK * i + h * 128 + s * 32);
                    sumi[t] = acc_scaled::<V>(sumi[t], qv, _mm256_loadu_si256(xq.cast()), scv);
                }
            }
        }
        let dw = f16s(b, 208);
        for t in 0..N {
            // SAFETY: super-block `i < nsb`: its scale is in bounds.
            let d = _mm256_set1_ps(*d[t].add(i) * dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}

/// Q2_K: 2-bit quants laid out like Q6_K's high bits; scale and minimum per 16 elements.
/// # Safety
/// As [`acc_u8i8`], plus FMA and F16C.
#[inline(always)]
unsafe fn q2_k_body<const V: bool>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    let mut macc = 0f32;
    for (b, xq, dx, bs) in x.blocks(row, 84) {
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
    for (b, xq, dx, bs) in x.blocks(row, 110) {
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
    for (b, xq, dx, _) in x.blocks(row, 292) {
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

// For each kernel body, an AVX2 entry point and an AVX-512 VNNI one.
crate::entry_points::entry_pairs! {
    lo [#[target_feature(enable = "avx2,fma,f16c")]],
    hi [#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]];
    q4_0, q4_0_vnni = legacy_body::<0,>(Q8_0Slice<'_>);
    q4_1, q4_1_vnni = legacy_body::<1,>(Q8_0Slice<'_>);
    q5_0, q5_0_vnni = legacy_body::<2,>(Q8_0Slice<'_>);
    q5_1, q5_1_vnni = legacy_body::<3,>(Q8_0Slice<'_>);
    q2_k, q2_k_vnni = q2_k_body::<>(Q8KSlice<'_>);
    q3_k, q3_k_vnni = q3_k_body::<>(Q8KSlice<'_>);
    q5_k, q5_k_vnni = q5_k_body::<>(Q8KSlice<'_>);
    q8_k, q8_k_vnni = q8_k_body::<>(Q8KSlice<'_>);
}

/// Runs the tokens `xs` through `$body::<$v, W>` (or `$body::<W>` for a body without the
/// VNNI parameter) in groups, the widest `W` of the list (widest first, ending with 1)
/// that the remaining tokens fill, writing `out[t]`.
macro_rules! run_groups {
    ($body:ident::<$v:literal>, $row:expr, $xs:expr, $out:expr, [$($w:literal),*]) => {
        $crate::x86::avx2::run_groups!(@run $row, $xs, $out, [$($w => $body::<$v, $w>),*])
    };
    ($body:ident, $row:expr, $xs:expr, $out:expr, [$($w:literal),*]) => {
        $crate::x86::avx2::run_groups!(@run $row, $xs, $out, [$($w => $body::<$w>),*])
    };
    (@run $row:expr, $xs:expr, $out:expr, [$($w:literal => $f:expr),*]) => {{
        let (mut xs, mut out) = ($xs, $out);
        assert_eq!(xs.len(), out.len(), "one output per token");
        while !xs.is_empty() {
            let done = match xs.len() {
                $(
                    n if n >= $w => {
                        let group: &[_; $w] = xs[..$w].try_into().expect("a whole group");
                        out[..$w].copy_from_slice(&$f($row, group));
                        $w
                    }
                )*
                _ => unreachable!("the group widths end with 1"),
            };
            xs = &xs[done..];
            out = &mut out[done..];
        }
    }};
}
pub(super) use run_groups;

/// For each kernel body generic over a flag and the token count (`V`, then `N`): a
/// single-token and a multi-token entry point with the given target features and flag
/// (here: may use VNNI), the multi-token one taking tokens in groups of the listed widths.
macro_rules! multi_entries {
    (
        features = $features:literal, flag = $v:literal;
        $($single:ident, $multi:ident [$($w:literal),*] = $body:ident($x:ty);)*
    ) => {$(
        #[target_feature(enable = $features)]
        pub(crate) fn $single(row: &[u8], x: $x) -> f32 {
            // SAFETY: the body, with this flag, needs only the features enabled here (AVX2,
            // FMA and F16C, plus AVX-512 VL + VNNI where it uses them).
            unsafe { $body::<$v, 1>(row, &[x])[0] }
        }

        #[target_feature(enable = $features)]
        pub(crate) fn $multi(row: &[u8], xs: &[$x], out: &mut [f32]) {
            // SAFETY: as for the single-token entry point above.
            unsafe { $crate::x86::avx2::run_groups!($body::<$v>, row, xs, out, [$($w),*]) }
        }
    )*};
}

multi_entries! {
    features = "avx2,fma,f16c", flag = false;
    q8_0, q8_0_multi [4, 3, 2, 1] = q8_0_body(Q8_0Slice<'_>);
    q5_0_packed, q5_0_packed_multi [4, 3, 2, 1] = q5_0_packed_body(Q8_0Slice<'_>);
    q4_k, q4_k_multi [2, 1] = q4_k_body(Q8KSlice<'_>);
    q6_k, q6_k_multi [2, 1] = q6_k_body(Q8KSlice<'_>);
}

// (The AVX-512 level's Q8_0 is `super::avx512::q8_0`, which runs this Q8_0 body for an odd
// last block.)
multi_entries! {
    features = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", flag = true;
    q5_0_packed_vnni, q5_0_packed_vnni_multi [4, 3, 2, 1] = q5_0_packed_body(Q8_0Slice<'_>);
}
