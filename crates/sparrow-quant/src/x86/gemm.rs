//! Micro-kernels of the batched product (see `crate::gemm`).
//!
//! * AVX-512 VNNI: 32 decoded rows times 4 tokens per pass (8 for the k-quants, see
//!   `tile_scale_per_block`), `vpdpbusd` on 16 rows per register.
//! * AVX2 (+FMA): 16 rows times 2 tokens per pass, `vpmaddubsw` on 8 rows per register
//!   (see the AVX2 section below).

use core::arch::x86_64::*;

use super::avx2::{ld32, ld8f};
use super::avx512::ld16f;
use crate::panel::{BatchActs, Layout, Panel, PANEL};
use crate::q8::Q8K_BLOCK;

#[inline]
#[target_feature(enable = "avx512f")]
fn ld64(p: &[u8]) -> __m512i {
    let p: &[u8; 64] = p.first_chunk().expect("64 bytes");
    // SAFETY: `p` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn st16f(p: &mut [f32], v: __m512) {
    let p: &mut [f32; 16] = p.first_chunk_mut().expect("16 floats");
    // SAFETY: `p` is 16 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm512_storeu_ps(p.as_mut_ptr(), v) }
}

/// Group `gi`'s integer sums for `T` tokens, rows 0–15 and 16–31 of the panel: each token's
/// `-off * sum(x)` plus the stored `s + off` times its quants over the group's `G` columns,
/// one `vpdpbusd` per 16 rows and 4 columns. Fixed-size views keep the step loop free of
/// bounds checks.
#[inline(always)]
fn group_ints<const T: usize, const G: usize>(
    p: &Panel,
    xq: &[&[u8]; T],
    nc: &[&[i32]; T],
    gi: usize,
) -> [[__m512i; 2]; T] {
    // SAFETY (for the intrinsics below): only called from the tiles of `panel_avx512`,
    // whose `#[target_feature]` enables AVX-512 F/BW/VL/VNNI, checked at dispatch.
    unsafe {
        let mut ia: [[__m512i; 2]; T] = core::array::from_fn(|t| {
            let c = _mm512_set1_epi32(nc[t][gi]);
            [c, c]
        });
        let xg: [&[u8; G]; T] =
            core::array::from_fn(|t| xq[t][gi * G..].first_chunk().expect("G quants"));
        let (quads, _) = p.q[gi * G * PANEL..][..G * PANEL].as_chunks::<128>();
        for (j, quad) in quads.iter().enumerate() {
            let w0 = ld64(&quad[..64]);
            let w1 = ld64(&quad[64..]);
            for t in 0..T {
                let b: &[u8; 4] = xg[t][4 * j..].first_chunk().expect("4 bytes");
                let xb = _mm512_set1_epi32(i32::from_le_bytes(*b));
                ia[t][0] = _mm512_dpbusd_epi32(ia[t][0], w0, xb);
                ia[t][1] = _mm512_dpbusd_epi32(ia[t][1], w1, xb);
            }
        }
        ia
    }
}

/// Adds group `gi`'s minimums times each token's `s[t]` (its quants' sum, scaled or not)
/// to the tile's float sums.
#[inline(always)]
fn add_mins<const T: usize>(p: &Panel, gi: usize, s: [f32; T], acc: &mut [[__m512; 2]; T]) {
    // SAFETY (for the intrinsics below): as in `group_ints`.
    unsafe {
        let m0 = ld16f(&p.mw[gi * PANEL..]);
        let m1 = ld16f(&p.mw[gi * PANEL + 16..]);
        for t in 0..T {
            let sb = _mm512_set1_ps(s[t]);
            acc[t][0] = _mm512_fmadd_ps(m0, sb, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(m1, sb, acc[t][1]);
        }
    }
}

/// `T` tokens starting at `t0` through the panel; writes `res[(t0 + t) * PANEL ..][..32]`.
/// For the legacy formats, whose activation scale `dx` changes with every group: the float
/// sums stay in registers and each group adds `cvt(ints) * (dw * dx)`.
#[inline(always)]
fn tile_scale_per_group<const T: usize, const G: usize, const MINS: bool>(
    p: &Panel,
    a: &BatchActs,
    t0: usize,
    res: &mut [f32],
) {
    let ng = a.groups;
    let cols = a.cols;
    // SAFETY (for the intrinsics below): only called from `panel_avx512`, whose
    // `#[target_feature]` enables AVX-512 F/BW/VL/VNNI, checked at dispatch.
    unsafe {
        let mut fa = [[_mm512_setzero_ps(); 2]; T];
        let xq: [&[u8]; T] = core::array::from_fn(|t| &a.qs[(t0 + t) * cols..][..cols]);
        let dx: [&[f32]; T] = core::array::from_fn(|t| &a.dx[(t0 + t) * ng..][..ng]);
        let nc: [&[i32]; T] = core::array::from_fn(|t| &a.negc[(t0 + t) * ng..][..ng]);
        let xs: [&[f32]; T] = core::array::from_fn(|t| &a.xs[(t0 + t) * ng..][..ng]);
        for gi in 0..ng {
            let ia = group_ints::<T, G>(p, &xq, &nc, gi);
            let d0 = ld16f(&p.dw[gi * PANEL..]);
            let d1 = ld16f(&p.dw[gi * PANEL + 16..]);
            for t in 0..T {
                let dxb = _mm512_set1_ps(dx[t][gi]);
                fa[t][0] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(ia[t][0]),
                    _mm512_mul_ps(d0, dxb),
                    fa[t][0],
                );
                fa[t][1] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(ia[t][1]),
                    _mm512_mul_ps(d1, dxb),
                    fa[t][1],
                );
            }
            if MINS {
                add_mins(p, gi, core::array::from_fn(|t| xs[t][gi]), &mut fa);
            }
        }
        for (t, f) in fa.iter().enumerate() {
            let o = &mut res[(t0 + t) * PANEL..][..PANEL];
            st16f(&mut o[..16], f[0]);
            st16f(&mut o[16..], f[1]);
        }
    }
}

/// `T` tokens starting at `t0` through the panel; writes `res[(t0 + t) * PANEL ..][..32]`.
/// For the k-quants, whose activation scale `dx` holds for 256 elements (`256 / G`
/// groups): each group adds `cvt(ints) * dw` (and `mw * sum(x)`) to a block sum, and `dx`
/// scales the block sum once — one float product a group fewer than `dw * dx`. The running
/// totals live in `res`, leaving the registers to the tile's integer and block sums, so
/// the tile can hold more tokens (each weight load serves `T` of them).
#[inline(always)]
fn tile_scale_per_block<const T: usize, const G: usize, const MINS: bool>(
    p: &Panel,
    a: &BatchActs,
    t0: usize,
    res: &mut [f32],
) {
    let ng = a.groups;
    let cols = a.cols;
    // Q8_K's scale holds for 256 elements; `cols` is a multiple of 256
    let per = Q8K_BLOCK / G;
    // SAFETY (for the intrinsics below): only called from `panel_avx512`, whose
    // `#[target_feature]` enables AVX-512 F/BW/VL/VNNI, checked at dispatch.
    unsafe {
        let xq: [&[u8]; T] = core::array::from_fn(|t| &a.qs[(t0 + t) * cols..][..cols]);
        let dx: [&[f32]; T] = core::array::from_fn(|t| &a.dx[(t0 + t) * ng..][..ng]);
        let nc: [&[i32]; T] = core::array::from_fn(|t| &a.negc[(t0 + t) * ng..][..ng]);
        let sums: [&[f32]; T] = core::array::from_fn(|t| &a.sums[(t0 + t) * ng..][..ng]);
        for t in 0..T {
            res[(t0 + t) * PANEL..][..PANEL].fill(0.0);
        }
        for b0 in (0..ng).step_by(per) {
            let mut fb = [[_mm512_setzero_ps(); 2]; T];
            // `gi` indexes the panel and every token's groups, not one slice
            #[allow(clippy::needless_range_loop)]
            for gi in b0..b0 + per {
                let ia = group_ints::<T, G>(p, &xq, &nc, gi);
                let d0 = ld16f(&p.dw[gi * PANEL..]);
                let d1 = ld16f(&p.dw[gi * PANEL + 16..]);
                for t in 0..T {
                    fb[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), d0, fb[t][0]);
                    fb[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), d1, fb[t][1]);
                }
                if MINS {
                    add_mins(p, gi, core::array::from_fn(|t| sums[t][gi]), &mut fb);
                }
            }
            for (t, f) in fb.iter().enumerate() {
                let dxb = _mm512_set1_ps(dx[t][b0]);
                let o = &mut res[(t0 + t) * PANEL..][..PANEL];
                let lo = _mm512_fmadd_ps(f[0], dxb, ld16f(o));
                let hi = _mm512_fmadd_ps(f[1], dxb, ld16f(&o[16..]));
                st16f(&mut o[..16], lo);
                st16f(&mut o[16..], hi);
            }
        }
    }
}

/// Tiles of `T` tokens from token `t`, while `T` remain; returns the first token left.
/// Each instance is its own function (not inlined), so the register allocation of one
/// tile shape does not constrain another's: inlined together, the Q6_K block tile ran
/// 15% slower.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline(never)]
fn tiles<const T: usize, const G: usize, const MINS: bool, const BLOCK: bool>(
    p: &Panel,
    a: &BatchActs,
    mut t: usize,
    n: usize,
    res: &mut [f32],
) -> usize {
    while t + T <= n {
        if BLOCK {
            tile_scale_per_block::<T, G, MINS>(p, a, t, res);
        } else {
            tile_scale_per_group::<T, G, MINS>(p, a, t, res);
        }
        t += T;
    }
    t
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn panel_impl<const G: usize, const MINS: bool>(
    p: &Panel,
    a: &BatchActs,
    n: usize,
    res: &mut [f32],
    scale_per_block: bool,
) {
    let t = if scale_per_block {
        tiles::<TOKENS_PER_BLOCK_TILE, G, MINS, true>(p, a, 0, n, res)
    } else {
        tiles::<TOKENS_PER_GROUP_TILE, G, MINS, false>(p, a, 0, n, res)
    };
    tiles::<1, G, MINS, false>(p, a, t, n, res);
}

/// Tokens per tile of [`tile_scale_per_group`]: `2 * T` integer and `2 * T` float sums in
/// registers, beside two weight registers and a broadcast (32 registers).
const TOKENS_PER_GROUP_TILE: usize = 4;

/// Tokens per tile of [`tile_scale_per_block`]: its `2 * T` integer and `2 * T` block sums
/// fill the 32 registers at 8 and spill a few; measured on Qwen2.5 shapes (`cargo bench
/// -p sparrow-quant --bench gemm`, Zen 4, one thread, same sitting), 8 ran Q4_K at 112
/// GMAC/s and Q6_K at 108 against 109 / 100 at 6 and 103 / 95 at 4; with the group size
/// a constant, Q4_K ~155 at both 8 and 6, Q6_K ~147 at 8 against ~128 at 6.
const TOKENS_PER_BLOCK_TILE: usize = 8;

/// The AVX-512 VNNI panel kernel: same contract as `crate::gemm::panel_scalar`.
pub(crate) fn panel_avx512(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    // SAFETY: only handed out by `crate::gemm` for `SimdLevel::Avx512` (or `Amx`) after
    // `is_supported()` confirmed AVX-512 F/BW/VL/VNNI, AVX2 and FMA on this CPU.
    unsafe {
        // Q8_K activations (the k-quants) keep one scale per 256 elements, Q8_0 per group
        let per_block = !lay.legacy;
        match (lay.g, lay.mins) {
            (16, false) => panel_impl::<16, false>(p, a, n, res, per_block),
            (16, true) => panel_impl::<16, true>(p, a, n, res, per_block),
            (32, false) => panel_impl::<32, false>(p, a, n, res, per_block),
            (32, true) => panel_impl::<32, true>(p, a, n, res, per_block),
            // no other group size exists today; the portable kernel keeps this total
            _ => crate::panel::panel_scalar(lay, p, a, n, res),
        }
    }
}

// ---- AVX2 ------------------------------------------------------------------------------
//
// AVX2 has no `vpdpbusd`: `vpmaddubsw` multiplies unsigned weight bytes by signed activation
// bytes and sums pairs into *saturating* i16, then `vpmaddwd` against ones widens pairs to
// i32. With `u <= qmax` and `|x| <= 127` a pair is at most `2 * 127 * qmax`, exact for
// `qmax <= 128`; `FLUSH` consecutive pair sums are added in i16 (`vpaddw`, exact while
// `FLUSH * 2 * 127 * qmax <= 32767`) before one widening, which keeps the multiply port
// for the `vpmaddubsw`s. The 8-bit formats (stored `s + 128`, up to 255) take the sign
// trick instead: `|s| * (x * sign s)`, one 4-column step per widening.
//
// A tile is 16 rows (two 8-row registers: the panel's 128-byte column quads hold rows
// 0-7, 8-15, 16-23, 24-31 in consecutive 32-byte registers) times `T` tokens, with its f32
// sums in registers; the panel is walked in chunks of `CHUNK` columns so the chunk's
// weights stay in L1 while every token passes through it.

/// Columns of the panel per pass over the tokens (32 rows x 512 = 16 KiB of weights).
const CHUNK: usize = 512;

/// How the AVX2 tile turns a weight register and an activation broadcast into i16 pairs.
mod mode {
    /// Unsigned `s + off` with `off == 0`: no integer correction.
    pub(super) const PLAIN: u8 = 0;
    /// Unsigned `s + off`, `off > 0`: each group's i32 sum starts at `-off * sum(x)`.
    pub(super) const OFFSET: u8 = 1;
    /// Signed 8-bit (`s + 128` stored): `|s| * (x * sign s)`, no correction.
    pub(super) const SIGNED: u8 = 2;
}

#[inline]
#[target_feature(enable = "avx2")]
fn st8f(p: &mut [f32], v: __m256) {
    let p: &mut [f32; 8] = p.first_chunk_mut().expect("8 floats");
    // SAFETY: `p` is 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(p.as_mut_ptr(), v) }
}

/// Tokens `t0 .. t0 + T`, rows `R0 .. R0 + 16` of the panel, groups `g0 .. g1`: adds to
/// `res[(t0 + t) * PANEL + R0 ..][..16]`.
#[inline(always)]
fn tile2<
    const T: usize,
    const R0: usize,
    const G: usize,
    const FLUSH: usize,
    const MODE: u8,
    const MINS: bool,
>(
    p: &Panel,
    a: &BatchActs,
    t0: usize,
    (g0, g1): (usize, usize),
    res: &mut [f32],
) {
    let ng = a.groups;
    let cols = a.cols;
    let mut outs = res[t0 * PANEL..].chunks_exact_mut(PANEL);
    let o: [&mut [f32; 16]; T] = core::array::from_fn(|_| {
        let row = outs.next().expect("T tokens of output");
        row[R0..].first_chunk_mut().expect("16 rows")
    });
    // SAFETY (for the intrinsics below): only called from `panel_avx2_impl`, whose
    // `#[target_feature]` enables AVX2 and FMA, checked at dispatch.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        for gi in g0..g1 {
            let xg: [&[u8; G]; T] = core::array::from_fn(|t| {
                a.qs[(t0 + t) * cols + gi * G..]
                    .first_chunk()
                    .expect("G quants")
            });
            let (quads, _) = p.q[gi * G * PANEL..][..G * PANEL].as_chunks::<128>();
            let mut ia = [[_mm256_setzero_si256(); 2]; T];
            if MODE == mode::OFFSET {
                for (t, v) in ia.iter_mut().enumerate() {
                    let c = _mm256_set1_epi32(a.negc[(t0 + t) * ng + gi]);
                    *v = [c, c];
                }
            }
            for f in 0..G / 4 / FLUSH {
                let mut ps = [[_mm256_setzero_si256(); 2]; T];
                // a rolled loop: unrolled, LLVM hoists the loads of every step and spills
                let n_steps = if FLUSH > 1 {
                    core::hint::black_box(FLUSH)
                } else {
                    1
                };
                for s in 0..n_steps {
                    let j = f * FLUSH + s;
                    let q = &quads[j];
                    let mut w0 = ld32(&q[R0 * 4..]);
                    let mut w1 = ld32(&q[R0 * 4 + 32..]);
                    // signed weights and their magnitudes (`mode::SIGNED` only)
                    let (s0, s1) = (_mm256_xor_si256(w0, flip), _mm256_xor_si256(w1, flip));
                    if MODE == mode::SIGNED {
                        w0 = _mm256_abs_epi8(s0);
                        w1 = _mm256_abs_epi8(s1);
                    }
                    for t in 0..T {
                        let b: &[u8; 4] = xg[t][4 * j..].first_chunk().expect("4 bytes");
                        let xb = _mm256_set1_epi32(i32::from_le_bytes(*b));
                        let (x0, x1) = if MODE == mode::SIGNED {
                            (_mm256_sign_epi8(xb, s0), _mm256_sign_epi8(xb, s1))
                        } else {
                            (xb, xb)
                        };
                        let p0 = _mm256_maddubs_epi16(w0, x0);
                        let p1 = _mm256_maddubs_epi16(w1, x1);
                        ps[t][0] = _mm256_add_epi16(ps[t][0], p0);
                        ps[t][1] = _mm256_add_epi16(ps[t][1], p1);
                    }
                }
                for t in 0..T {
                    for k in 0..2 {
                        ia[t][k] = _mm256_add_epi32(ia[t][k], _mm256_madd_epi16(ps[t][k], ones));
                    }
                }
            }
            let dw: &[f32; 16] = p.dw[gi * PANEL + R0..].first_chunk().expect("16 scales");
            let d = [ld8f(dw), ld8f(&dw[8..])];
            let m = if MINS {
                let mw: &[f32; 16] = p.mw[gi * PANEL + R0..].first_chunk().expect("16 mins");
                [ld8f(mw), ld8f(&mw[8..])]
            } else {
                [_mm256_setzero_ps(); 2]
            };
            for t in 0..T {
                let dxb = _mm256_set1_ps(a.dx[(t0 + t) * ng + gi]);
                let sb = _mm256_set1_ps(if MINS { a.xs[(t0 + t) * ng + gi] } else { 0.0 });
                for k in 0..2 {
                    let mut acc = ld8f(&o[t][8 * k..]);
                    acc = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(ia[t][k]),
                        _mm256_mul_ps(d[k], dxb),
                        acc,
                    );
                    if MINS {
                        acc = _mm256_fmadd_ps(m[k], sb, acc);
                    }
                    st8f(&mut o[t][8 * k..], acc);
                }
            }
        }
    }
}

/// Tokens per AVX2 tile for `steps / FLUSH` i16 flushes per group: the tile's i16 and i32
/// sums, two weight registers and a broadcast must fit the 16 registers.
const fn tokens_per_tile(flushes: usize) -> usize {
    if flushes > 1 {
        3
    } else {
        4
    }
}

#[target_feature(enable = "avx2,fma")]
fn panel_avx2_impl<const G: usize, const FLUSH: usize, const MODE: u8, const MINS: bool>(
    p: &Panel,
    a: &BatchActs,
    n: usize,
    res: &mut [f32],
) {
    res[..n * PANEL].fill(0.0);
    let gc = (CHUNK / G).max(1);
    let tt = tokens_per_tile(G / 4 / FLUSH);
    let mut g0 = 0;
    while g0 < a.groups {
        let g = (g0, (g0 + gc).min(a.groups));
        let mut t = 0;
        while t + tt <= n {
            if tt == 4 {
                tile2::<4, 0, G, FLUSH, MODE, MINS>(p, a, t, g, res);
                tile2::<4, 16, G, FLUSH, MODE, MINS>(p, a, t, g, res);
            } else {
                tile2::<3, 0, G, FLUSH, MODE, MINS>(p, a, t, g, res);
                tile2::<3, 16, G, FLUSH, MODE, MINS>(p, a, t, g, res);
            }
            t += tt;
        }
        while t < n {
            tile2::<1, 0, G, FLUSH, MODE, MINS>(p, a, t, g, res);
            tile2::<1, 16, G, FLUSH, MODE, MINS>(p, a, t, g, res);
            t += 1;
        }
        g0 = g.1;
    }
}

/// The AVX2 panel kernel: same contract as `crate::gemm::panel_scalar`.
pub(crate) fn panel_avx2(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    // The widest i16 flush that cannot saturate (see the section comment), as a power of
    // two dividing the group's 4-column steps.
    let steps = lay.g / 4;
    let signed = lay.qmax > 128;
    let flush = if signed {
        1
    } else {
        let fit = 32767 / (2 * 127 * (lay.qmax as usize).max(1));
        [8, 4, 2, 1]
            .into_iter()
            .find(|&f| f <= fit && steps.is_multiple_of(f))
            .unwrap_or(1)
    };
    let m = if signed {
        mode::SIGNED
    } else if lay.off > 0 {
        mode::OFFSET
    } else {
        mode::PLAIN
    };
    // SAFETY: only handed out by `crate::gemm` for `SimdLevel::Avx2` (or above) after
    // `is_supported()` confirmed AVX2 and FMA on this CPU.
    unsafe {
        match (lay.g, flush, m, lay.mins) {
            // legacy: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
            (32, 8, mode::OFFSET, false) => {
                panel_avx2_impl::<32, 8, { mode::OFFSET }, false>(p, a, n, res)
            }
            (32, 8, mode::PLAIN, true) => {
                panel_avx2_impl::<32, 8, { mode::PLAIN }, true>(p, a, n, res)
            }
            (32, 4, mode::OFFSET, false) => {
                panel_avx2_impl::<32, 4, { mode::OFFSET }, false>(p, a, n, res)
            }
            (32, 4, mode::PLAIN, true) => {
                panel_avx2_impl::<32, 4, { mode::PLAIN }, true>(p, a, n, res)
            }
            (32, 1, mode::SIGNED, false) => {
                panel_avx2_impl::<32, 1, { mode::SIGNED }, false>(p, a, n, res)
            }
            // k-quants: Q2_K, Q4_K, Q5_K (mins), Q3_K, Q6_K (offset), Q8_K
            (16, 4, mode::PLAIN, true) => {
                panel_avx2_impl::<16, 4, { mode::PLAIN }, true>(p, a, n, res)
            }
            (16, 4, mode::OFFSET, false) => {
                panel_avx2_impl::<16, 4, { mode::OFFSET }, false>(p, a, n, res)
            }
            (16, 2, mode::OFFSET, false) => {
                panel_avx2_impl::<16, 2, { mode::OFFSET }, false>(p, a, n, res)
            }
            (16, 1, mode::SIGNED, false) => {
                panel_avx2_impl::<16, 1, { mode::SIGNED }, false>(p, a, n, res)
            }
            // no other layout exists today; the portable kernel keeps this total
            _ => crate::panel::panel_scalar(lay, p, a, n, res),
        }
    }
}
