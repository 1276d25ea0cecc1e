//! The AVX-512 VNNI kernels of Q4_K, Q6_K and Q5_0 row groups ([`crate::row_groups`]): 16
//! rows in the lanes.
//!
//! Per block and token: one `vpdpbusd` per 4 columns of 16 rows (64 products), each
//! sub-block's integer dots scaled by its 6-bit scale in one `vpmulld` for all 16 rows and
//! summed to the block's total, the minimums' total in four `vpdpwssd` of the 16 rows' minimum
//! pairs against the token's pair sums, then `acc = fma(dx · d, total, acc)` and likewise for
//! the minimums: the block-totals numerics of `super::avx512::q4_k_totals`, so every row and
//! token gets that kernel's bits (integers are exact in any order, and the floats see the
//! same totals in the same order).

use core::arch::x86_64::*;

use crate::q8::{Q8KSlice, Q8_0Slice, Q8K_BLOCK, Q8_0_BLOCK};
use crate::row_groups::{
    check_group_args, GROUP_ROWS, Q4_K_GROUP_BYTES, Q5_0_GROUP_BYTES, Q5_0_MASKS, Q5_0_QUADS,
    Q6_K_GROUP_BYTES,
};
use crate::types::GgmlType;

/// How far ahead the group kernels ask for their lines: 8 KiB, as the row kernels. 64 KiB
/// (these kernels consume bytes faster) was measured slower: the 1.5B's one-token pass
/// 29.9–31.8 ms against 27.5–29.2, passes of 2 and 4 tokens likewise (`steps_cost`, three
/// pairs alternated).
const PREFETCH_BYTES: usize = 8192;

/// 16 × u8 lanes shifted right by `N` bits (within bytes).
#[inline(always)]
unsafe fn srli_u8<const N: i32>(v: __m128i, mask: __m128i) -> __m128i {
    _mm_and_si128(_mm_srli_epi16::<N>(v), mask)
}

/// Rows `0..16` of one group against `N` tokens: `out[t][r]`.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI, F16C and FMA must be available; `group` holds `blocks` block
/// columns; every token has `blocks` blocks of quants, scales and pair sums.
#[inline(always)]
unsafe fn q4_k_body<const N: usize>(
    group: &[u8],
    blocks: usize,
    xs: &[Q8KSlice<'_>; N],
) -> [[f32; GROUP_ROWS]; N] {
    debug_assert!(group.len() >= blocks * Q4_K_GROUP_BYTES);
    let m4 = _mm512_set1_epi8(0x0F);
    let (m6, m4x, m2) = (_mm_set1_epi8(63), _mm_set1_epi8(0x0F), _mm_set1_epi8(0x03));
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_m = [_mm512_setzero_ps(); N];
    for b in 0..blocks {
        let base = group.as_ptr().add(b * Q4_K_GROUP_BYTES);
        // Prefetches spread over the block as it is consumed (its scales now, each step's
        // quants with the step): all 36 lines at once overran the misses a core keeps in
        // flight, and decode waited on the loads.
        super::avx2::prefetch_at::<256, PREFETCH_BYTES>(base);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(32).cast()));
        let s: [__m128i; 12] =
            core::array::from_fn(|j| _mm_loadu_si128(base.add(64 + 16 * j).cast()));
        // The 6-bit scales and minimums, 16 rows a vector (ggml's `get_scale_min_k4`).
        let sc: [__m128i; 8] = core::array::from_fn(|j| {
            if j < 4 {
                _mm_and_si128(s[j], m6)
            } else {
                let hi = _mm_slli_epi16::<4>(srli_u8::<6>(s[j - 4], m2));
                _mm_or_si128(_mm_and_si128(s[j + 4], m4x), hi)
            }
        });
        let mn: [__m128i; 8] = core::array::from_fn(|j| {
            if j < 4 {
                _mm_and_si128(s[j + 4], m6)
            } else {
                let hi = _mm_slli_epi16::<4>(srli_u8::<6>(s[j], m2));
                _mm_or_si128(srli_u8::<4>(s[j + 4], m4x), hi)
            }
        });
        // Minimum pairs (m[2p], m[2p + 1]) of each row as i16 lanes, rows in order.
        let mpairs: [__m512i; 4] = core::array::from_fn(|p| {
            let lo = _mm_unpacklo_epi8(mn[2 * p], mn[2 * p + 1]);
            let hi = _mm_unpackhi_epi8(mn[2 * p], mn[2 * p + 1]);
            _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo))
        });
        let mut tot = [_mm512_setzero_si512(); N];
        for k in 0..4 {
            super::avx2::prefetch_at::<512, PREFETCH_BYTES>(base.add(256 + 512 * k));
            let w: [__m512i; 8] = core::array::from_fn(|q| {
                _mm512_loadu_si512(base.add(256 + 64 * (8 * k + q)).cast())
            });
            let lo: [__m512i; 8] = core::array::from_fn(|q| _mm512_and_si512(w[q], m4));
            let hi: [__m512i; 8] =
                core::array::from_fn(|q| _mm512_and_si512(_mm512_srli_epi16::<4>(w[q]), m4));
            let (s0, s1) = (
                _mm512_cvtepu8_epi32(sc[2 * k]),
                _mm512_cvtepu8_epi32(sc[2 * k + 1]),
            );
            for t in 0..N {
                let xq = xs[t].qs.as_ptr().add(Q8K_BLOCK * b + 64 * k);
                let (mut a0, mut a1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for q in 0..8 {
                    let x0 = _mm512_set1_epi32(core::ptr::read_unaligned(xq.add(4 * q).cast()));
                    let x1 =
                        _mm512_set1_epi32(core::ptr::read_unaligned(xq.add(32 + 4 * q).cast()));
                    a0 = _mm512_dpbusd_epi32(a0, lo[q], x0);
                    a1 = _mm512_dpbusd_epi32(a1, hi[q], x1);
                }
                let scaled =
                    _mm512_add_epi32(_mm512_mullo_epi32(a0, s0), _mm512_mullo_epi32(a1, s1));
                tot[t] = _mm512_add_epi32(tot[t], scaled);
            }
        }
        for t in 0..N {
            let pr = xs[t].pairs.as_ptr().add(4 * b);
            let mut mt = _mm512_setzero_si512();
            for (p, mp) in mpairs.iter().enumerate() {
                mt = _mm512_dpwssd_epi32(mt, *mp, _mm512_set1_epi32(*pr.add(p)));
            }
            let dx = _mm512_set1_ps(*xs[t].d.as_ptr().add(b));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(tot[t]), acc[t]);
            acc_m[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dmin), _mm512_cvtepi32_ps(mt), acc_m[t]);
        }
    }
    core::array::from_fn(|t| {
        let mut o = [0f32; GROUP_ROWS];
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(acc[t], acc_m[t]));
        o
    })
}

/// Rows `0..16` of one Q5_0 group against `N` tokens: `out[t][r]`. Per block: four 64-byte
/// loads hold the 16 rows' nibbles, each unit of 4 columns gets its fifth bits from one
/// 64-bit mask (a masked byte add of 16), and per token eight `vpdpbusd` (the activation's 4
/// bytes broadcast) give the 16 rows' sums of `(q + 16) · x`; the block's `16 Σ x` comes off
/// in integers, and `acc += (d · dx) · T` as the scalar row kernel ([`crate::q8::q5_0`])
/// does it, so every row and token gets its bits.
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI and F16C must be available; `group` holds `blocks` block
/// columns; every token has `blocks` blocks of quants, scales and sums.
#[inline(always)]
unsafe fn q5_0_body<const N: usize>(
    group: &[u8],
    blocks: usize,
    xs: &[Q8_0Slice<'_>; N],
) -> [[f32; GROUP_ROWS]; N] {
    debug_assert!(group.len() >= blocks * Q5_0_GROUP_BYTES);
    let (m4, sixteen) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..blocks {
        let base = group.as_ptr().add(b * Q5_0_GROUP_BYTES);
        super::avx2::prefetch_at::<Q5_0_GROUP_BYTES, PREFETCH_BYTES>(base);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
        let w: [__m512i; 4] =
            core::array::from_fn(|q| _mm512_loadu_si512(base.add(Q5_0_QUADS + 64 * q).cast()));
        // Unit `u`: columns `4 u .. 4 u + 4` of the 16 rows as unsigned 5-bit values.
        let v: [__m512i; 8] = core::array::from_fn(|u| {
            let nibbles = match u {
                0..4 => _mm512_and_si512(w[u], m4),
                _ => _mm512_and_si512(_mm512_srli_epi16::<4>(w[u - 4]), m4),
            };
            let fifth: __mmask64 =
                core::ptr::read_unaligned(base.add(Q5_0_MASKS + 8 * u).cast::<u64>());
            _mm512_mask_add_epi8(nibbles, fifth, nibbles, sixteen)
        });
        for t in 0..N {
            let xq = xs[t].qs.as_ptr().add(Q8_0_BLOCK * b);
            let mut a = [_mm512_setzero_si512(); 4];
            for (u, vu) in v.iter().enumerate() {
                let x = _mm512_set1_epi32(core::ptr::read_unaligned(xq.add(4 * u).cast()));
                a[u % 4] = _mm512_dpbusd_epi32(a[u % 4], *vu, x);
            }
            let sum = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
            let offset = _mm512_set1_epi32(16 * *xs[t].sum.as_ptr().add(b));
            let total = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset));
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*xs[t].d.as_ptr().add(b)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(scale, total));
        }
    }
    core::array::from_fn(|t| {
        let mut o = [0f32; GROUP_ROWS];
        _mm512_storeu_ps(o.as_mut_ptr(), acc[t]);
        o
    })
}

/// Runs `$body` over the tokens of `xs` in tiles of 8, 4, 2 and 1, writing `out[t * 16 + r]`.
macro_rules! run_tiles {
    ($body:ident, $group:expr, $blocks:expr, $xs:expr, $out:expr) => {{
        let (xs, out) = ($xs, $out);
        let mut t = 0;
        for n in [8, 4, 2, 1] {
            while xs.len() - t >= n {
                let r: &mut [f32] = &mut out[t * GROUP_ROWS..(t + n) * GROUP_ROWS];
                let x = &xs[t..t + n];
                // SAFETY: the caller enables the body's features; lengths were checked.
                unsafe {
                    match n {
                        8 => put($body::<8>($group, $blocks, x.try_into().expect("8")), r),
                        4 => put($body::<4>($group, $blocks, x.try_into().expect("4")), r),
                        2 => put($body::<2>($group, $blocks, x.try_into().expect("2")), r),
                        _ => put($body::<1>($group, $blocks, x.try_into().expect("1")), r),
                    }
                }
                t += n;
            }
        }
    }};
}

/// Copies a tile's per-token rows into `out` (token after token).
#[inline(always)]
fn put<const N: usize>(tile: [[f32; GROUP_ROWS]; N], out: &mut [f32]) {
    for (o, v) in out.chunks_exact_mut(GROUP_ROWS).zip(tile.iter()) {
        o.copy_from_slice(v);
    }
}

/// Rows `0..16` of one Q6_K group against `N` tokens: `out[t][r]`. Per half and 16-column
/// stretch, three loads give 4 columns of 16 sub-blocks' worth of runs (see
/// [`crate::row_groups`]); the weights enter `vpdpbusd` as their unsigned 6-bit values, and
/// the block total's `−32 Σ sc · x` is removed in integers from the token's 16-element sums
/// (`vpdpwssd` of the 16 rows' scale pairs against the sums' pairs).
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI, F16C and FMA must be available; `group` holds `blocks` block
/// columns; every token has `blocks` blocks of quants, scales and sums.
#[inline(always)]
unsafe fn q6_k_body<const N: usize>(
    group: &[u8],
    blocks: usize,
    xs: &[Q8KSlice<'_>; N],
) -> [[f32; GROUP_ROWS]; N] {
    debug_assert!(group.len() >= blocks * Q6_K_GROUP_BYTES);
    let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..blocks {
        let base = group.as_ptr().add(b * Q6_K_GROUP_BYTES);
        // Prefetches spread over the block, as in `q4_k_body`.
        super::avx2::prefetch_at::<288, PREFETCH_BYTES>(base);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.cast()));
        let sc8 = |j: usize| _mm_loadu_si128(base.add(32 + 16 * j).cast());
        // The block total's `−32 Σ sc · x` first (what it needs dies before the products):
        // scale pairs (sc[2p], sc[2p + 1]) of each row as i16 lanes, rows in order, against
        // the token's pairs of 16-element sums.
        let mut corr = [_mm512_setzero_si512(); N];
        for p in 0..8 {
            let lo = _mm_unpacklo_epi8(sc8(2 * p), sc8(2 * p + 1));
            let hi = _mm_unpackhi_epi8(sc8(2 * p), sc8(2 * p + 1));
            let pairs = _mm512_cvtepi8_epi16(_mm256_set_m128i(hi, lo));
            for t in 0..N {
                let bs = xs[t].bsums.as_ptr().add(16 * b + 2 * p);
                let pair = _mm512_set1_epi32(core::ptr::read_unaligned(bs.cast::<i32>()));
                corr[t] = _mm512_dpwssd_epi32(corr[t], pairs, pair);
            }
        }
        let mut tot: [__m512i; N] = core::array::from_fn(|t| {
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<5>(corr[t]))
        });
        for h in 0..2 {
            for half in 0..2 {
                super::avx2::prefetch_at::<768, PREFETCH_BYTES>(
                    base.add(288 + 768 * (2 * h + half)),
                );
                // Quads `4 half .. 4 half + 4` of half `h`: 16 columns of each of the four
                // 32-element runs `s`, i.e. sub-block `8 h + 2 s + half` of each.
                // (Plain loops: intrinsics in a closure nested this deep were left as calls.)
                let mut w = [[_mm512_setzero_si512(); 4]; 4];
                for (i, wi) in w.iter_mut().enumerate() {
                    let u = base.add(288 + 192 * (8 * h + 4 * half + i));
                    let a = _mm512_loadu_si512(u.cast());
                    let bb = _mm512_loadu_si512(u.add(64).cast());
                    let c = _mm512_loadu_si512(u.add(128).cast());
                    // Run `s`'s two top bits, `(c >> 2 s) & 3`, as bits 4..6 of each byte
                    // (16-bit shifts: the bits crossing bytes are masked off).
                    let t0 = _mm512_and_si512(_mm512_slli_epi16::<4>(c), m30);
                    let t1 = _mm512_and_si512(_mm512_slli_epi16::<2>(c), m30);
                    let t2 = _mm512_and_si512(c, m30);
                    let t3 = _mm512_and_si512(_mm512_srli_epi16::<2>(c), m30);
                    wi[0] = _mm512_or_si512(_mm512_and_si512(a, m4), t0);
                    wi[1] = _mm512_or_si512(_mm512_and_si512(bb, m4), t1);
                    wi[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(a), m4), t2);
                    wi[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(bb), m4), t3);
                }
                let scale: [__m512i; 4] =
                    core::array::from_fn(|s| _mm512_cvtepi8_epi32(sc8(8 * h + 2 * s + half)));
                for t in 0..N {
                    let xq = xs[t].qs.as_ptr().add(Q8K_BLOCK * b + 128 * h + 16 * half);
                    let mut a = [_mm512_setzero_si512(); 4];
                    for (i, wq) in w.iter().enumerate() {
                        for s in 0..4 {
                            let x = _mm512_set1_epi32(core::ptr::read_unaligned(
                                xq.add(32 * s + 4 * i).cast(),
                            ));
                            a[s] = _mm512_dpbusd_epi32(a[s], wq[s], x);
                        }
                    }
                    for s in 0..4 {
                        tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(a[s], scale[s]));
                    }
                }
            }
        }
        for t in 0..N {
            let dx = _mm512_set1_ps(*xs[t].d.as_ptr().add(b));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(tot[t]), acc[t]);
        }
    }
    core::array::from_fn(|t| {
        let mut o = [0f32; GROUP_ROWS];
        _mm512_storeu_ps(o.as_mut_ptr(), acc[t]);
        o
    })
}

/// One Q6_K group of 16 rows against every token of `xs` (see [`q4_k_group`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q6_k_group(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    check_group_args(GgmlType::Q6_K, group, blocks, xs, out);
    run_tiles!(q6_k_body, group, blocks, xs, out);
}

/// One Q5_0 group of 16 rows against every token of `xs` (see [`q4_k_group`] and
/// [`crate::row_groups::Q8_0Groups`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q5_0_group(group: &[u8], blocks: usize, xs: &[Q8_0Slice<'_>], out: &mut [f32]) {
    check_group_args(GgmlType::Q5_0, group, blocks, xs, out);
    run_tiles!(q5_0_body, group, blocks, xs, out);
}

/// One group of 16 rows (`blocks` blocks each, grouped) against every token of `xs`:
/// `out[t * 16 + r]` (see [`crate::row_groups::Q8KGroups`]).
///
/// # Panics
/// If a token has fewer than `blocks` blocks, or `group`/`out` are short.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q4_k_group(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    check_group_args(GgmlType::Q4_K, group, blocks, xs, out);
    run_tiles!(q4_k_body, group, blocks, xs, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::{Q8KActs, Q8_0Acts};
    use crate::row_groups::{group_rows, scalar_kernel, GroupDot};
    use crate::x86::avx512;

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random rows of `ty` with finite scales (small f16 of either sign in the f16 fields).
    fn rows(ty: GgmlType, n: usize, blocks: usize, s: &mut u64) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut w: Vec<u8> = (0..n * blocks * bb).map(|_| xorshift(s) as u8).collect();
        let fields: &[usize] = if ty == GgmlType::Q4_K {
            &[0, 2]
        } else {
            &[208]
        };
        for b in w.chunks_exact_mut(bb) {
            for &o in fields {
                let v = ((xorshift(s) % 2000) as f32 - 1000.0) / 64_000.0;
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        w
    }

    fn acts(n: usize, blocks: usize, s: &mut u64) -> Vec<Q8KActs> {
        (0..n)
            .map(|t| {
                let x: Vec<f32> = (0..blocks * 256)
                    .map(|i| {
                        // an extreme token (every quant ±127) among ordinary ones
                        if t == 2 {
                            return if i % 3 == 0 { -50.0 } else { 50.0 };
                        }
                        ((xorshift(s) % 20001) as f32 - 10000.0) / (1000.0 + t as f32)
                    })
                    .collect();
                Q8KActs::new(&x)
            })
            .collect()
    }

    /// The AVX-512 group kernels give, for every row and token and any token count, the bits
    /// of the level's block-totals row kernels on the ungrouped rows, and of the portable
    /// group kernels.
    #[test]
    fn groups_give_the_block_totals_kernels_bits_for_every_token_count() {
        if !crate::level::SimdLevel::Avx512.is_supported() {
            return;
        }
        type Row = unsafe fn(&[u8], Q8KSlice<'_>) -> f32;
        type Group = unsafe fn(&[u8], usize, &[Q8KSlice<'_>], &mut [f32]);
        let cases: [(GgmlType, Row, Group); 2] = [
            (GgmlType::Q4_K, avx512::q4_k_totals, q4_k_group),
            (GgmlType::Q6_K, avx512::q6_k_totals, q6_k_group),
        ];
        let mut s = 0x1234_5678_9abc_def1u64;
        for (ty, row_kernel, group_kernel) in cases {
            let (n, blocks) = (32, 3);
            let bb = ty.block_bytes();
            let w = rows(ty, n, blocks, &mut s);
            let mut g = vec![0u8; w.len()];
            group_rows(ty, &w, blocks * bb, &mut g).unwrap();
            let a = acts(11, blocks, &mut s);
            let xs: Vec<Q8KSlice<'_>> = a.iter().map(|a| a.as_slice()).collect();
            let Some(GroupDot::Q8K(scalar)) = scalar_kernel(ty) else {
                panic!("{ty:?} has a portable group kernel");
            };
            for tokens in 1..=xs.len() {
                for gi in 0..n / GROUP_ROWS {
                    let group = &g[gi * GROUP_ROWS * blocks * bb..][..GROUP_ROWS * blocks * bb];
                    let mut out = vec![0f32; tokens * GROUP_ROWS];
                    // SAFETY: AVX-512 checked above.
                    unsafe { group_kernel(group, blocks, &xs[..tokens], &mut out) };
                    let mut portable = vec![0f32; tokens * GROUP_ROWS];
                    scalar(group, blocks, &xs[..tokens], &mut portable);
                    for t in 0..tokens {
                        for r in 0..GROUP_ROWS {
                            let row = &w[(gi * GROUP_ROWS + r) * blocks * bb..][..blocks * bb];
                            // SAFETY: AVX-512 checked above.
                            let want = unsafe { row_kernel(row, xs[t]) };
                            let got = out[t * GROUP_ROWS + r];
                            let at = format!(
                                "{ty:?}, {tokens} tokens: row {r} of group {gi}, token {t}"
                            );
                            assert_eq!(got.to_bits(), want.to_bits(), "{at}: {got} vs {want}");
                            assert_eq!(
                                portable[t * GROUP_ROWS + r].to_bits(),
                                want.to_bits(),
                                "{at} (portable)"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AVX-512 Q5_0 group kernel gives, for every row and token and any token count,
    /// the bits of the scalar row kernel on the ungrouped rows (and of the portable group
    /// kernel), extreme activations and scales of either sign included.
    #[test]
    fn q5_0_groups_give_the_scalar_kernels_bits_for_every_token_count() {
        if !crate::level::SimdLevel::Avx512.is_supported() {
            return;
        }
        let ty = GgmlType::Q5_0;
        let mut s = 0x0fed_cba9_8765_4321u64;
        let (n, blocks) = (48, 7);
        let bb = ty.block_bytes();
        let mut w: Vec<u8> = (0..n * blocks * bb)
            .map(|_| xorshift(&mut s) as u8)
            .collect();
        for b in w.chunks_exact_mut(bb) {
            let v = ((xorshift(&mut s) % 2000) as f32 - 1000.0) / 64_000.0;
            b[..2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        let mut g = vec![0u8; w.len()];
        group_rows(ty, &w, blocks * bb, &mut g).unwrap();
        let a: Vec<Q8_0Acts> = (0..11)
            .map(|t| {
                let x: Vec<f32> = (0..blocks * 32)
                    .map(|i| match t {
                        2 => [-50.0, 50.0, 50.0][i % 3],
                        _ => ((xorshift(&mut s) % 20001) as f32 - 10000.0) / (1000.0 + t as f32),
                    })
                    .collect();
                Q8_0Acts::new(&x)
            })
            .collect();
        let xs: Vec<Q8_0Slice<'_>> = a.iter().map(|a| a.as_slice()).collect();
        let Some(GroupDot::Q8_0(portable)) = scalar_kernel(ty) else {
            panic!("Q5_0 has a portable group kernel");
        };
        let gb = GROUP_ROWS * blocks * bb;
        for tokens in 1..=xs.len() {
            for (gi, group) in g.chunks_exact(gb).enumerate() {
                let mut out = vec![0f32; tokens * GROUP_ROWS];
                // SAFETY: AVX-512 checked above.
                unsafe { q5_0_group(group, blocks, &xs[..tokens], &mut out) };
                let mut port = vec![0f32; tokens * GROUP_ROWS];
                portable(group, blocks, &xs[..tokens], &mut port);
                for t in 0..tokens {
                    for r in 0..GROUP_ROWS {
                        let row = &w[(gi * GROUP_ROWS + r) * blocks * bb..][..blocks * bb];
                        let want = crate::q8::q5_0(row, xs[t]);
                        let got = out[t * GROUP_ROWS + r];
                        let at = format!("{tokens} tokens: row {r} of group {gi}, token {t}");
                        assert_eq!(got.to_bits(), want.to_bits(), "{at}: {got} vs {want}");
                        assert_eq!(port[t * GROUP_ROWS + r].to_bits(), want.to_bits(), "{at}");
                    }
                }
            }
        }
    }

    /// GMAC/s of the group kernels against the AVX-512 multi-token row kernels, one thread:
    /// `cargo test --release -p sparrow-quant --lib row_groups::tests::speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn speed() {
        assert!(
            crate::level::SimdLevel::Avx512.is_supported(),
            "needs AVX-512"
        );
        type Multi = unsafe fn(&[u8], &[Q8KSlice<'_>], &mut [f32]);
        type Group = unsafe fn(&[u8], usize, &[Q8KSlice<'_>], &mut [f32]);
        let cases: [(GgmlType, Multi, Group); 2] = [
            (GgmlType::Q4_K, avx512::q4_k_totals_multi, q4_k_group),
            (GgmlType::Q6_K, avx512::q6_k_totals_multi, q6_k_group),
        ];
        let mut s = 0x1234_5678_9abc_def1u64;
        for (ty, multi, group_kernel) in cases {
            for (n, blocks) in [(8960usize, 6usize), (1536, 35)] {
                let bb = ty.block_bytes();
                let w = rows(ty, n, blocks, &mut s);
                let mut g = vec![0u8; w.len()];
                group_rows(ty, &w, blocks * bb, &mut g).unwrap();
                for tokens in [1usize, 2, 4, 8, 16] {
                    let a = acts(tokens, blocks, &mut s);
                    let xs: Vec<Q8KSlice<'_>> = a.iter().map(|a| a.as_slice()).collect();
                    let mut out = vec![0f32; tokens * GROUP_ROWS];
                    let mut o = vec![0f32; tokens];
                    let macs = (n * blocks * 256 * tokens) as f64;
                    let mut best = [f64::MAX; 2];
                    for _ in 0..7 {
                        let t0 = std::time::Instant::now();
                        for gr in g.chunks_exact(GROUP_ROWS * blocks * bb) {
                            // SAFETY: an ignored benchmark, run on AVX-512 hosts only.
                            unsafe { group_kernel(gr, blocks, &xs, &mut out) };
                        }
                        best[0] = best[0].min(t0.elapsed().as_secs_f64());
                        let t0 = std::time::Instant::now();
                        for row in w.chunks_exact(blocks * bb) {
                            // SAFETY: as above.
                            unsafe { multi(row, &xs, &mut o) };
                        }
                        best[1] = best[1].min(t0.elapsed().as_secs_f64());
                    }
                    std::hint::black_box((&out, &o));
                    println!(
                        "{ty:?} {n}x{} T={tokens}: groups {:.1} GMAC/s, rows {:.1} ({:.2}x)",
                        blocks * 256,
                        macs / best[0] / 1e9,
                        macs / best[1] / 1e9,
                        best[1] / best[0]
                    );
                }
            }
        }
    }
}
