//! Batched products (prefill) as matrix-matrix: weight panels decoded once per batch.
//!
//! [`crate::matmul`] with many tokens spends its time in integer multiply-accumulates, not
//! in memory traffic, so the per-row kernels (which unpack every weight block once per
//! token) waste most of the core on shuffles and per-block scaling. Here instead:
//!
//! 1. The activations of every token are quantized once (Q8_0 or Q8_K, exactly as the
//!    per-row path does) and regrouped per scale group `G` of the weights (32 elements for
//!    the legacy formats and for Q4_K/Q5_K's sub-blocks, 16 for the other k-quants):
//!    quants, the f32 scale `dx`, `-off * sum(quants)` and `dx * sum(quants)`.
//! 2. The weight rows are decoded `PANEL` (32) rows at a time to signed integers plus one
//!    f32 factor `dw` (and, for formats with minimums, an offset `mw`) per group, so that
//!    `w_i = dw * s_i + mw`, and stored interleaved: for every 4 consecutive columns, the 4
//!    bytes of row 0, then row 1, ... (each as `s + off`, unsigned, with the format's
//!    smallest `off` that makes it non-negative: 0 for Q4_K, 16 for Q5_0, 32 for Q6_K, 128
//!    for the 8-bit formats; see `crate::catalogue`). One 64-byte register then holds 4 columns of
//!    16 rows, one 32-byte register 4 columns of 8 rows.
//! 3. A micro-kernel runs every token of the batch through the decoded panel, a few tokens
//!    at a time: per 4 columns, one 32-bit broadcast of each token's 4 activation bytes
//!    and one multiply-accumulate per register of rows accumulate 8 or 16 rows' integer
//!    dots at once; per group, one conversion and two float operations apply `dw * dx` to
//!    all of them. The `+off` added to the weights is removed exactly by starting each
//!    group's integer sum at `-off * sum(x)`.
//!    * AVX-512 VNNI (`x86::gemm::panel_avx512`, from 16 tokens, 64 for Q4_K / Q6_K):
//!      `vpdpbusd` on 16 rows, 32 rows times 4 tokens per pass for the legacy formats,
//!      times 8 for the k-quants, whose activation scale holds for 256 elements: their
//!      groups sum `cvt(ints) * dw` per block and apply `dx` once per block.
//!    * NEON with `sdot` (`aarch64::gemm::panel_neondot`, from 8 tokens): `sdot` on 4 rows
//!      per register, one token at a time; plain NEON has no panel kernel (its per-row
//!      kernels run batches).
//!    * AVX2 (`x86::gemm::panel_avx2`, from 16 tokens): `vpmaddubsw`
//!      (unsigned weights times signed activations, pairs summed in saturating i16) on 8
//!      rows, several steps summed in i16 as far as `qmax` of the format proves exact, then
//!      `vpmaddwd` against ones into i32; the 8-bit formats (`qmax` 255) take the sign
//!      trick `|s| * (x * sign s)` instead. 16 rows times 4 tokens (3 when a group needs
//!      two i16 flushes) per pass, over 512-column chunks of the panel.
//!
//! Each weight byte is thus unpacked once per batch rather than once per token, and the
//! per-group float work is shared by 16 rows. The integer part of every group equals the
//! scalar reference's exactly; only the order of the few f32 operations per group differs,
//! so results agree with [`crate::dot_q8`] to f32 rounding (not bit for bit).

use rayon::prelude::*;

use crate::catalogue::panel_layout;
use crate::level::SimdLevel;
use crate::matrix::QMatrix;
use crate::panel::{panel_scalar, BatchActs, Layout, Panel, PanelKernel, PANEL};
use crate::q8::{k_ints, legacy_ints};
use crate::row_groups::GROUP_ROWS;
use crate::types::GgmlType;

/// Fewest tokens for which decoding panels pays off against the per-row kernels, with the
/// AVX-512 VNNI micro-kernel. Measured on Qwen2.5-0.5B Q4_K_M, 2 threads (`sparrow bench
/// -p 8,12,16`): with panels from 6 tokens, pp8 ran at 30 tok/s against 59 through the
/// row kernels, and the two meet near 16 — where batched decode (several sequences' tokens
/// in one pass) lives, the row kernels must run.
#[cfg(target_arch = "x86_64")]
pub(crate) const MIN_TOKENS: usize = 16;

/// As [`MIN_TOKENS`] for Q4_K and Q6_K, whose AVX-512 multi-token row kernels (two 32-byte
/// steps per 512-bit product) keep ~80 GMAC/s at any batch on two cores: measured on the
/// Qwen2.5-1.5B shapes (1536 × 8960 and 8960 × 1536, 2 threads), the panels ran 33–40
/// GMAC/s at 16 tokens, 57–64 at 32, 74–77 at 48 against the rows' 74–89, and passed them
/// only from 64 (87–94). Below it a batch's rows also keep the one-token kernel's bits.
/// With the 8-token k-quant tile the panels pass the rows from about 48 tokens (0.5B
/// shapes, one thread, `SPARROW_BENCH_TOKENS=32,48 cargo bench --bench gemm`: 50 against
/// 62 GMAC/s at 32, 62 against 56 at 48); kept at 64, a step of batched decode or a
/// speculative check rarely lands between, and there the rows keep their bits.
#[cfg(target_arch = "x86_64")]
pub(crate) const MIN_TOKENS_AVX512_K: usize = 64;

/// The fewest tokens a matrix in row groups (of those the panels read: Q5_0) runs through
/// the panels for, at any level: its group kernel keeps ahead of them for longer. Measured
/// at AVX-512 on Qwen2.5-0.5B (its Q5_0 matrices grouped, 2 threads, `sparrow bench -p
/// 16,64,128,256,512`, two runs per threshold), with the panels from 64
/// tokens pp64 ran at 430–468 tok/s, from 256 at 564–689; pp128 at 610–672 against 729–749;
/// pp256 and pp512 alike either way (808–834, 858–914).
const MIN_TOKENS_GROUPS: usize = 256;

/// As [`MIN_TOKENS`] for the AVX2 micro-kernel, whose per-row kernels are relatively
/// cheaper against the (scalar) panel decoding: measured on Zen 3, the panels win from
/// about 8 tokens for Q5_0 and 12 for Q4_K / Q6_K.
#[cfg(target_arch = "x86_64")]
pub(crate) const MIN_TOKENS_AVX2: usize = 16;

/// As [`MIN_TOKENS`] for the NEON `sdot` micro-kernel. Not measured on hardware yet (qemu
/// cannot time it): set between the AVX-512 and AVX2 thresholds, whose per-token work it
/// resembles (one 4-byte dot per instruction, no i16 stage).
#[cfg(target_arch = "aarch64")]
pub(crate) const MIN_TOKENS_NEON: usize = 8;

/// Decodes rows `r0 .. r0 + PANEL` of `m` (whose type has layout `lay`) into `p`.
fn decode(p: &mut Panel, lay: Layout, m: &QMatrix<'_>, r0: usize) {
    let cols = m.cols();
    let groups = cols / lay.g;
    p.q.resize(cols * PANEL, 0);
    p.dw.resize(groups * PANEL, 0.0);
    p.mw.resize(if lay.mins { groups * PANEL } else { 0 }, 0.0);
    let ty = m.ty();
    let bb = ty.block_bytes();
    for r in 0..PANEL {
        if r0 + r >= m.rows() {
            // padding rows of the last panel: zero weights
            for j in 0..cols / 4 {
                p.q[(j * PANEL + r) * 4..][..4].fill(lay.off);
            }
            for gi in 0..groups {
                p.dw[gi * PANEL + r] = 0.0;
                if lay.mins {
                    p.mw[gi * PANEL + r] = 0.0;
                }
            }
            continue;
        }
        if m.is_grouped() {
            // (only Q5_0's groups reach the panels: see `reads_groups`)
            decode_q5_0_group_row(p, m, r0 + r, r);
            continue;
        }
        let row = m.row(r0 + r);
        if lay.legacy {
            let mut put = |bi: usize, b: &[u8]| {
                let w = legacy_ints(ty, b);
                put_q(&mut p.q, lay.off, r, bi * 32, &w.q);
                p.dw[bi * PANEL + r] = w.d;
                if lay.mins {
                    p.mw[bi * PANEL + r] = w.m;
                }
            };
            if m.is_packed() {
                crate::packed::for_each_block(row, put);
            } else {
                for (bi, b) in row.chunks_exact(bb).enumerate() {
                    put(bi, b);
                }
            }
        } else {
            for (bi, b) in row.chunks_exact(bb).enumerate() {
                let k = k_ints(ty, b);
                put_q(&mut p.q, lay.off, r, bi * 256, &k.q);
                // `k.sc` and `k.m` hold one entry per 16 elements
                let per_block = 256 / lay.g;
                for g in 0..per_block {
                    let gi = bi * per_block + g;
                    let sub = g * lay.g / 16;
                    p.dw[gi * PANEL + r] = k.d * k.sc[sub] as f32;
                    if lay.mins {
                        p.mw[gi * PANEL + r] = -(k.dmin * k.m[sub] as f32);
                    }
                }
            }
        }
    }
}

/// Whether the panels read a matrix of `ty` in row groups (Q5_0, whose group layout holds
/// a panel's bytes nearly as they are: [`decode_q5_0_group_row`]); a k-quant in row groups
/// runs its group kernels at every batch size.
pub(crate) fn reads_groups(ty: GgmlType) -> bool {
    ty == GgmlType::Q5_0
}

/// Decodes row `row` of a Q5_0 matrix in row groups into panel row `r`: per block, the
/// row's unsigned 5-bit values are `s + 16`, what the panel stores, and its scale.
fn decode_q5_0_group_row(p: &mut Panel, m: &QMatrix<'_>, row: usize, r: usize) {
    use crate::row_groups::{q5_0_group_row, Q5_0_GROUP_BYTES};
    let (group, i) = (m.group(row / GROUP_ROWS), row % GROUP_ROWS);
    for (b, blk) in group.chunks_exact(Q5_0_GROUP_BYTES).enumerate() {
        let (d, values) = q5_0_group_row(blk, i);
        p.dw[b * PANEL + r] = d;
        for (u, four) in values.chunks_exact(4).enumerate() {
            p.q[((8 * b + u) * PANEL + r) * 4..][..4].copy_from_slice(four);
        }
    }
}

/// Stores the signed quants `q` of row `r`, starting at column `c0`, into the interleaved
/// panel (offset by `off`, wrapping: `-128 + 128` is 0).
#[inline]
fn put_q(panel: &mut [u8], off: u8, r: usize, c0: usize, q: &[i8]) {
    for (j, c4) in q.chunks_exact(4).enumerate() {
        let base = ((c0 / 4 + j) * PANEL + r) * 4;
        let dst = &mut panel[base..base + 4];
        for (d, &s) in dst.iter_mut().zip(c4) {
            *d = (s as u8).wrapping_add(off);
        }
    }
}

/// The panel micro-kernel of `level`, if it has one, and the fewest tokens of `ty` it is
/// used for (more for a format whose multi-token row kernels at that level stay ahead for
/// longer, and for a matrix in row groups, whose group kernel does: at every level, so a
/// matrix in groups gives each token of a shorter batch the one-token bits everywhere).
fn panel_kernel(level: SimdLevel, ty: GgmlType, grouped: bool) -> Option<(PanelKernel, usize)> {
    let _ = ty; // (only x86_64's AVX-512 level has a per-format threshold)
    let (kernel, min): (PanelKernel, usize) = match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 | SimdLevel::Amx if level.is_supported() => {
            let min = match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => MIN_TOKENS_AVX512_K,
                _ => MIN_TOKENS,
            };
            (crate::x86::gemm::panel_avx512, min)
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if level.is_supported() => (crate::x86::gemm::panel_avx2, MIN_TOKENS_AVX2),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::NeonDot if level.is_supported() => {
            (crate::aarch64::gemm::panel_neondot, MIN_TOKENS_NEON)
        }
        _ => return None,
    };
    Some((
        kernel,
        if grouped {
            min.max(MIN_TOKENS_GROUPS)
        } else {
            min
        },
    ))
}

/// `out[t * rows + r]` for every token and every row, through panels, if `level` has a
/// panel kernel for `m`'s type and the batch is big enough; `false` (nothing written)
/// otherwise. `xs` holds `n` rows of `m.cols()` elements; `out` holds `n * m.rows()`.
pub(crate) fn matmul_panels(
    level: SimdLevel,
    m: &QMatrix<'_>,
    xs: &[f32],
    n: usize,
    out: &mut [f32],
) -> bool {
    match panel_plan(level, m, n) {
        Some((lay, kernel)) => {
            run_panels(lay, kernel, m, xs, n, out);
            true
        }
        None => false,
    }
}

/// Whether [`matmul_panels`] takes a batch of `n` tokens of `m` at `level`.
pub(crate) fn panels_take(level: SimdLevel, m: &QMatrix<'_>, n: usize) -> bool {
    panel_plan(level, m, n).is_some()
}

/// The panel layout and micro-kernel for `n` tokens of `m` at `level`: `None` without a
/// panel kernel for its format there, or below that kernel's threshold.
fn panel_plan(level: SimdLevel, m: &QMatrix<'_>, n: usize) -> Option<(Layout, PanelKernel)> {
    let lay = panel_layout(m.ty())?;
    let (kernel, min_tokens) = panel_kernel(level, m.ty(), m.is_grouped())?;
    (n >= min_tokens && m.cols() > 0).then_some((lay, kernel))
}

/// As [`matmul_panels`] with the portable micro-kernel (for tests).
#[doc(hidden)]
pub fn matmul_panels_scalar(m: &QMatrix<'_>, xs: &[f32], out: &mut [f32]) -> bool {
    let Some(lay) = panel_layout(m.ty()) else {
        return false;
    };
    let n = xs.len() / m.cols();
    run_panels(lay, panel_scalar, m, xs, n, out);
    true
}

fn run_panels(
    lay: Layout,
    kernel: PanelKernel,
    m: &QMatrix<'_>,
    xs: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let rows = m.rows();
    let acts = BatchActs::new(lay, xs, m.cols(), n);
    let n_panels = rows.div_ceil(PANEL);
    let parts: Vec<Vec<f32>> = (0..n_panels)
        .into_par_iter()
        .map_init(Panel::default, |p, pi| {
            decode(p, lay, m, pi * PANEL);
            let mut res = vec![0f32; n * PANEL];
            kernel(lay, p, &acts, n, &mut res);
            res
        })
        .collect();
    // Scatter into token-major `out`, in parallel over tokens.
    out.par_chunks_mut(rows).enumerate().for_each(|(t, o)| {
        for (dst, part) in o.chunks_mut(PANEL).zip(&parts) {
            dst.copy_from_slice(&part[t * PANEL..][..dst.len()]);
        }
    });
}
