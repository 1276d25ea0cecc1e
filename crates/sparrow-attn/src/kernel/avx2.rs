//! The AVX2 kernels. Every function here requires AVX2, FMA and F16C (checked by the
//! callers in the parent module) and the slice bounds the parent's wrappers assert.
//!
//! The tile kernels are the shared loops of [`super::simd`] over [`Avx2`]'s 8-lane
//! primitives, instantiated inside `#[target_feature]` entry points (which is where the
//! intrinsics inline); this module picks their register blocking for 16 vector registers.

#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
use super::simd::{self, PvTile, ScoreTile, Simd, SoftmaxTile};
#[cfg(feature = "fp16")]
use super::view::Tile;
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

/// [`super::tile::exp_shifted_sum`] on 8 lanes: `x ← exp((x - top) · scale)`, NaN to 0,
/// returning the sum (lanes summed in f32, the vectors' totals in f64).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp_shifted_sum(x: &mut [f32], top: f32, scale: f32) -> f64 {
    let whole = x.len() / 8 * 8;
    let (top_v, scale_v) = (_mm256_set1_ps(top), _mm256_set1_ps(scale));
    let mut total = 0.0f64;
    let mut acc = _mm256_setzero_ps();
    for (i, chunk) in x[..whole].chunks_exact_mut(8).enumerate() {
        // SAFETY: `chunk` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(chunk.as_ptr()) };
        let number = _mm256_cmp_ps::<_CMP_ORD_Q>(v, v);
        let e = _mm256_and_ps(
            number,
            exp8(_mm256_mul_ps(_mm256_sub_ps(v, top_v), scale_v)),
        );
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), e) };
        acc = _mm256_add_ps(acc, e);
        if i % 64 == 63 {
            total += lane_sum(acc);
            acc = _mm256_setzero_ps();
        }
    }
    total += lane_sum(acc);
    for v in &mut x[whole..] {
        *v = if v.is_nan() {
            0.0
        } else {
            ((*v - top) * scale).exp()
        };
        total += *v as f64;
    }
    total
}

/// The sum of 8 lanes, in f64.
#[target_feature(enable = "avx2")]
fn lane_sum(v: __m256) -> f64 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    lanes.iter().map(|&l| l as f64).sum()
}

/// AVX2 + FMA + F16C, 8 lanes. Its primitives are only called from the entry points
/// below, which enable those features.
pub(crate) struct Avx2;

impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable floats at `p`.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the caller guarantees 8 writable floats at `p`.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: __m256, a: __m256, b: f32) -> __m256 {
        // SAFETY: FMA is enabled by the entry point this is inlined into.
        unsafe { _mm256_fmadd_ps(_mm256_set1_ps(b), a, acc) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn exp(x: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA are enabled by the entry point this is inlined into.
        unsafe { exp8(x) }
    }
    #[inline(always)]
    unsafe fn zero_neg_inf(x: __m256) -> __m256 {
        let none = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY));
        _mm256_andnot_ps(none, x)
    }
    #[cfg(feature = "fp16")]
    #[inline(always)]
    unsafe fn widen8(src: *const f16, dst: *mut f32) {
        // SAFETY: the caller guarantees 8 f16 at `src` (`f16` is a transparent `u16`, so
        // they are the 128 bits `cvtph` reads) and 8 floats at `dst`; F16C is enabled by
        // the entry point.
        unsafe {
            let h = _mm_loadu_si128(src as *const __m128i);
            _mm256_storeu_ps(dst, _mm256_cvtph_ps(h));
        }
    }
    #[cfg(feature = "fp16")]
    #[inline(always)]
    unsafe fn dequant_block(b: &BlockQ8_0, dst: *mut f32) {
        // SAFETY: `b.qs` holds 32 bytes, read 8 at a time at offsets 0, 8, 16, 24; the
        // caller guarantees 32 floats at `dst`, written at the same offsets.
        unsafe {
            let d = _mm256_set1_ps(b.d.to_f32());
            let q = b.qs.as_ptr();
            for j in (0..QK8_0).step_by(8) {
                let bytes = _mm_loadl_epi64(q.add(j) as *const __m128i);
                let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                _mm256_storeu_ps(dst.add(j), _mm256_mul_ps(x, d));
            }
        }
    }
}

#[cfg(feature = "fp16")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn convert_tile(src: Tile<'_, f16>, dst: &mut [f32]) {
    // SAFETY: the features are enabled here; the bounds are the wrapper's.
    unsafe { simd::convert_tile::<Avx2>(src, dst) }
}

#[cfg(feature = "fp16")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_q8_0_tile(src: Tile<'_, BlockQ8_0>, dst: &mut [f32]) {
    // SAFETY: the features are enabled here; the bounds are the wrapper's.
    unsafe { simd::dequant_q8_0_tile::<Avx2>(src, dst) }
}

/// Scores of a tile (`rw` a multiple of 8): pairs of row vectors against blocks of 6 keys
/// (12 accumulators, 2 query vectors and a broadcast: 15 of the 16 registers), then a lone
/// vector against blocks of 12.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores(j: ScoreTile) {
    let vecs = j.rw / 8;
    // SAFETY (every call below): row vectors `v..v + RB` with `v + RB <= vecs`, within the
    // bounds the wrapper asserted.
    unsafe {
        let mut v = 0;
        while v + 2 <= vecs {
            simd::score_rows::<Avx2, 6, 2>(j.at(0, v * 8));
            v += 2;
        }
        if v < vecs {
            simd::score_rows::<Avx2, 12, 1>(j.at(0, v * 8));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn softmax_tile(j: SoftmaxTile<'_>) {
    // SAFETY: the features are enabled here; the bounds (and `rw` a multiple of 8) are the
    // wrapper's.
    unsafe { simd::softmax_tile::<Avx2>(j) }
}

/// [`simd::pv_rows`] as a function of its own, which the compiler may keep out of line (as it
/// does for the common blockings): inlining every blocking into [`pv`] measured a few
/// percent slower.
#[target_feature(enable = "avx2,fma")]
unsafe fn pv_rows<const RB: usize, const CB: usize>(j: PvTile) {
    // SAFETY: the features are enabled here; the bounds are the caller's.
    unsafe { simd::pv_rows::<Avx2, RB, CB>(j) }
}

/// P·V of a tile for the block's first `rows` rows: blocks of 6 rows × 2 vectors; a
/// remainder of 1 after some is taken as 5 + 2 (a lone row keeps too few accumulators in
/// flight). `RB × CB` accumulators plus `CB` values and a broadcast stay within the 16
/// vector registers.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pv(j: PvTile, rows: usize) {
    let mut sixes = rows / 6;
    let mut rest = rows % 6;
    if rest == 1 && sixes > 0 {
        sixes -= 1;
        rest = 7;
    }
    // SAFETY (every call below): rows `r..r + RB` with `r + RB <= rows <= rw`, within the
    // bounds the wrapper asserted.
    unsafe {
        let mut r = 0;
        for _ in 0..sixes {
            pv_rows::<6, 2>(j.rows_from(r));
            r += 6;
        }
        let j = j.rows_from(r);
        match rest {
            0 => {}
            1 => pv_rows::<1, 4>(j),
            2 => pv_rows::<2, 4>(j),
            3 => pv_rows::<3, 2>(j),
            4 => pv_rows::<4, 2>(j),
            5 => pv_rows::<5, 2>(j),
            _ => {
                pv_rows::<5, 2>(j);
                pv_rows::<2, 4>(j.rows_from(5));
            }
        }
    }
}

/// Blocks' centres and radii for Quest's bounds, block `p`'s starting at `p · stride` of each.
pub(crate) struct Blocks<'a> {
    pub center: &'a [f32],
    pub radius: &'a [f32],
    pub stride: usize,
}

/// Quest's group bound for `n` blocks: `out[p] = Σ_d sum[d]·center[p·stride + d] +
/// abs_sum[d]·radius[p·stride + d]`, the width being `sum.len()` (see
/// `policy::quest::group_upper_bounds`, whose scalar loop this twins).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn group_bounds(
    sum: &[f32],
    abs_sum: &[f32],
    blocks: Blocks<'_>,
    out: &mut [f32],
) {
    let Blocks {
        center,
        radius,
        stride,
    } = blocks;
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

/// `out[r] = Σ_d q[d] · rows[r · dim + d] as f32 · (scales[r] · q_scale)` with `dim =
/// q.len()`, the sums exact in i32 (see `policy::int8_rows::scaled_row_dots`, whose portable
/// loop this twins bit for bit): 32 quants at a time, `|q|` times `row` signed as `q` is
/// (`maddubs`: no pair of products of quants within ±127 overflows i16), then pairs summed
/// to i32 (`madd` by ones); four rows at once, their sums reduced together.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn scaled_i8_dots(
    rows: &[i8],
    scales: &[f32],
    q: &[i8],
    q_scale: f32,
    out: &mut [f32],
) {
    let dim = q.len();
    let whole = dim / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    // `acc` plus the products of 32 quants of `row` and `q` from `j` (`j + 32 <= dim`), as
    // eight i32 partial sums; `qv` is `q[j..j + 32]`, `qa` its absolute values.
    #[inline(always)]
    unsafe fn step(
        row: &[i8],
        j: usize,
        qv: __m256i,
        qa: __m256i,
        ones: __m256i,
        acc: __m256i,
    ) -> __m256i {
        // SAFETY: the callers keep `j + 32 <= dim`, the length of `row`.
        unsafe {
            let k = _mm256_loadu_si256(row.as_ptr().add(j) as *const __m256i);
            let p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(k, qv));
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
        }
    }
    let tail = |row: &[i8]| -> i32 { (whole..dim).map(|d| q[d] as i32 * row[d] as i32).sum() };
    let groups = out.len() / 4;
    for g in 0..groups {
        let r0 = g * 4;
        let row = |i: usize| &rows[(r0 + i) * dim..][..dim];
        let (w0, w1, w2, w3) = (row(0), row(1), row(2), row(3));
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut j = 0;
        while j < whole {
            // SAFETY: `j + 32 <= whole <= dim`, the length of `q` and of each row.
            unsafe {
                let qv = _mm256_loadu_si256(q.as_ptr().add(j) as *const __m256i);
                let qa = _mm256_sign_epi8(qv, qv);
                acc[0] = step(w0, j, qv, qa, ones, acc[0]);
                acc[1] = step(w1, j, qv, qa, ones, acc[1]);
                acc[2] = step(w2, j, qv, qa, ones, acc[2]);
                acc[3] = step(w3, j, qv, qa, ones, acc[3]);
            }
            j += 32;
        }
        // Lanes of the four sums, then each 128-bit half's pairs: [s0, s1, s2, s3].
        let t01 = _mm256_hadd_epi32(acc[0], acc[1]);
        let t23 = _mm256_hadd_epi32(acc[2], acc[3]);
        let t = _mm256_hadd_epi32(t01, t23);
        let sums = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let tails = _mm_setr_epi32(tail(w0), tail(w1), tail(w2), tail(w3));
        // SAFETY: `r0 + 4 <= out.len() <= scales.len()`.
        unsafe {
            let sc = _mm_mul_ps(_mm_loadu_ps(scales.as_ptr().add(r0)), _mm_set1_ps(q_scale));
            let dots = _mm_cvtepi32_ps(_mm_add_epi32(sums, tails));
            _mm_storeu_ps(out.as_mut_ptr().add(r0), _mm_mul_ps(dots, sc));
        }
    }
    for r in groups * 4..out.len() {
        let w = &rows[r * dim..][..dim];
        let mut acc = _mm256_setzero_si256();
        let mut j = 0;
        while j < whole {
            // SAFETY: `j + 32 <= whole <= dim`.
            acc = unsafe {
                let qv = _mm256_loadu_si256(q.as_ptr().add(j) as *const __m256i);
                step(w, j, qv, _mm256_sign_epi8(qv, qv), ones, acc)
            };
            j += 32;
        }
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256::<1>(acc),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        let sum = _mm_cvtsi128_si32(s) + tail(w);
        out[r] = sum as f32 * (scales[r] * q_scale);
    }
}

/// What [`int8_tile_scores`] scores: `n` rows of `tiles` (`[channel / 4][row][channel % 4]`
/// bytes, each a quant plus 128, `width` channels a row, a multiple of 4; `scales` one per
/// row) against `queries` (`width` quants each, `q_scales` one per query, `sums` each
/// query's quant sum).
pub(crate) struct TileJob<'a> {
    pub tiles: &'a [u8],
    pub scales: &'a [f32],
    pub width: usize,
    pub queries: &'a [i8],
    pub q_scales: &'a [f32],
    pub sums: &'a [i32],
    pub n: usize,
}

/// Queries a pass over the tiles takes (one accumulator register each).
const TILE_QUERIES: usize = 8;

/// How many tiles ahead a pass asks the memory for.
const PREFETCH_TILES: usize = 4;

/// `out[h · n + r] = Σ_d q_h[d] · row_r[d] · (scales[r] · q_scales[h])` (`policy::int8_tiles`,
/// whose portable loop this twins bit for bit). One 32-byte load is four channels of eight
/// rows; each query's four quants of those channels, broadcast, multiply it into eight
/// per-row i32 sums — with `vnni`, by one `vpdpbusd` on the offset bytes (the offset's
/// `128 · Σ q` taken off at the end); without, by flipping the offset back and the sign
/// trick (`|q|` times the row signed as `q`, `maddubs` then `madd` by ones: no pair of
/// products of quants within ±127 overflows i16). Queries go eight at a time (the last
/// pass padded with zero queries), so each tile is loaded once per eight queries.
///
/// # Safety
/// AVX2 must be available, and AVX-512 VL + VNNI when `vnni`; `job.tiles` must hold
/// `⌈n / 8⌉ · 8 · width` bytes, `job.scales` `n` rows, `job.queries` `width` quants per
/// query of `job.q_scales`, `out` `q_scales.len() · n` values.
pub(crate) unsafe fn int8_tile_scores(vnni: bool, job: &TileJob<'_>, out: &mut [f32]) {
    // Checked in every build (once a call): the loads below trust these bounds.
    assert!(job.width.is_multiple_of(4));
    assert!(job.tiles.len() >= job.n.div_ceil(8) * 8 * job.width);
    assert!(job.queries.len() >= job.q_scales.len() * job.width);
    assert!(out.len() >= job.q_scales.len() * job.n);
    for h0 in (0..job.q_scales.len()).step_by(TILE_QUERIES) {
        // SAFETY: as this function's contract.
        unsafe {
            if vnni {
                tiles_vnni(job, h0, out)
            } else {
                tiles_avx2(job, h0, out)
            }
        }
    }
}

/// [`int8_tile_scores`] for queries `h0..h0 + 8`, with AVX-512 VL + VNNI.
///
/// # Safety
/// As [`int8_tile_scores`], on a CPU with AVX-512 VL + VNNI.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn tiles_vnni(job: &TileJob<'_>, h0: usize, out: &mut [f32]) {
    // SAFETY: forwarded contract; VNNI is enabled here.
    unsafe { tiles_body::<true>(job, h0, out) }
}

/// [`int8_tile_scores`] for queries `h0..h0 + 8`, with plain AVX2.
///
/// # Safety
/// As [`int8_tile_scores`].
#[target_feature(enable = "avx2")]
unsafe fn tiles_avx2(job: &TileJob<'_>, h0: usize, out: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { tiles_body::<false>(job, h0, out) }
}

/// The body of both entry points (inlined into each, under its target features): queries
/// `h0..h0 + 8` (those past the last, zeros whose scores are not stored).
///
/// # Safety
/// As [`int8_tile_scores`]; AVX-512 VL + VNNI enabled by the caller when `V`.
#[inline(always)]
unsafe fn tiles_body<const V: bool>(job: &TileJob<'_>, h0: usize, out: &mut [f32]) {
    const H: usize = TILE_QUERIES;
    let TileJob {
        tiles,
        scales,
        width,
        queries,
        q_scales,
        sums,
        n,
    } = *job;
    let heads = (q_scales.len() - h0).min(H);
    let groups = width / 4;
    let tile_bytes = 8 * width;
    // Each query's quants as i32 lanes of four (what a broadcast takes), group by group.
    let mut q4 = vec![0i32; groups * H];
    for h in 0..heads {
        let q = &queries[(h0 + h) * width..][..width];
        for g in 0..groups {
            let b = &q[4 * g..4 * g + 4];
            q4[g * H + h] = i32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]);
        }
    }
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut tail = [0f32; 8];
    for t in 0..n.div_ceil(8) {
        let tile = &tiles[t * tile_bytes..][..tile_bytes];
        // The tiles are read once per pass, from memory: ask for one a few ahead.
        if let Some(ahead) =
            tiles.get((t + PREFETCH_TILES) * tile_bytes..(t + PREFETCH_TILES + 1) * tile_bytes)
        {
            for line in (0..tile_bytes).step_by(64) {
                // SAFETY: `line < tile_bytes`, within `ahead`; a prefetch has no effect on results.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().add(line) as *const i8) };
            }
        }
        let mut acc = [_mm256_setzero_si256(); H];
        for g in 0..groups {
            let q = &q4[g * H..][..H];
            // SAFETY: `32 · g + 32 <= tile_bytes`.
            let k = unsafe { _mm256_loadu_si256(tile.as_ptr().add(32 * g) as *const __m256i) };
            if V {
                for (a, &q) in acc.iter_mut().zip(q) {
                    *a = _mm256_dpbusd_epi32(*a, k, _mm256_set1_epi32(q));
                }
            } else {
                let k = _mm256_xor_si256(k, flip);
                for (a, &q) in acc.iter_mut().zip(q) {
                    let q = _mm256_set1_epi32(q);
                    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(k, q));
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(p, ones));
                }
            }
        }
        let rows = (n - 8 * t).min(8);
        let row_scales = if rows == 8 {
            // SAFETY: `8 · t + 8 <= n <= scales.len()`.
            unsafe { _mm256_loadu_ps(scales.as_ptr().add(8 * t)) }
        } else {
            tail = [0f32; 8];
            tail[..rows].copy_from_slice(&scales[8 * t..n]);
            // SAFETY: `tail` holds 8 floats.
            unsafe { _mm256_loadu_ps(tail.as_ptr()) }
        };
        for (h, a) in acc.iter().enumerate().take(heads) {
            let hq = h0 + h;
            let dots = if V {
                _mm256_sub_epi32(*a, _mm256_set1_epi32(128 * sums[hq]))
            } else {
                *a
            };
            let s = _mm256_mul_ps(row_scales, _mm256_set1_ps(q_scales[hq]));
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(dots), s);
            let dst = &mut out[hq * n + 8 * t..][..rows];
            if rows == 8 {
                // SAFETY: `dst` holds 8 floats.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) };
            } else {
                // SAFETY: `tail` holds 8 floats.
                unsafe { _mm256_storeu_ps(tail.as_mut_ptr(), v) };
                dst.copy_from_slice(&tail[..rows]);
            }
        }
    }
}
