//! Row groups: Q4_K and Q6_K rows regrouped sixteen at a time, so a kernel holds one weight
//! of each of 16 rows in the 16 lanes of a register.
//!
//! Why: a product of a few tokens (a speculative check, a batch of serving slots) is bound
//! by arithmetic, not by reading weights, and the per-row kernels spend it badly: lanes hold
//! one row's columns, so every 64 products of every token pay a `maddubs` and a `vpdpwssd`
//! (the second only to apply the sub-block's scale), and each block's float work is done
//! per row and token. With a weight of each of 16 rows in the lanes, one `vpdpbusd` per
//! token does 64 products of 16 rows, a sub-block's scale is one multiply for all 16, and
//! the quants and scales are unpacked once per group for every token. The one-token product
//! reads the same layout, so every token gets the same bits at any batch size.
//!
//! A group is a pure permutation of the bytes of 16 consecutive rows (the same size, so a
//! matrix keeps its length, and a group's rows start where the first of them did). Per
//! 256-column block, `16 ×` the block's bytes, in this order:
//!
//! **Q4_K** (`16 × 144`):
//!
//! | bytes | contents |
//! |---|---|
//! | `0..32` | the 16 rows' `d` (f16) |
//! | `32..64` | the 16 rows' `dmin` (f16) |
//! | `64..256` | the 12 packed scale bytes: byte `j` of row `r` at `64 + 16 j + r` |
//! | `256..2304` | for step `k` (0..4) and quad `q` (0..8), 64 bytes at `256 + 64 (8 k + q)`: bytes `32 k + 4 q .. + 4` of each row's `qs`, row after row |
//!
//! so one 64-byte load holds 4 columns of sub-block `2k` (low nibbles) and 4 of `2k + 1`
//! (high nibbles) for all 16 rows.
//!
//! **Q6_K** (`16 × 210`):
//!
//! | bytes | contents |
//! |---|---|
//! | `0..32` | the 16 rows' `d` (f16) |
//! | `32..288` | the 16 i8 scales: scale `j` of row `r` at `32 + 16 j + r` |
//! | `288..3360` | for half `h` (0..2) and quad `q` (0..8), 192 bytes at `288 + 192 (8 h + q)`: `ql[64 h + 4 q .. + 4]`, then `ql[64 h + 32 + 4 q .. + 4]`, then `qh[32 h + 4 q .. + 4]`, each 64 bytes of 16 rows |
//!
//! so three 64-byte loads give 4 columns of each of the four 32-element runs of half `h`
//! (the low and high nibbles of the two `ql` loads, with their two top bits from `qh`).
//!
//! Matrices of other formats, or whose rows are not a whole number of groups, keep ggml's
//! layout (see [`is_groupable`]).

use crate::error::QuantError;
use crate::formats::kquants::scale_min_k4;
use crate::q8::{Q8KSlice, Q8K_BLOCK};
use crate::types::GgmlType;
use rayon::prelude::*;

/// A row-group kernel: one group of 16 rows (`blocks` blocks each, in the grouped layout)
/// against every token of `xs`, `out[t * 16 + r]`. Every row and token gets the bits of
/// the block-totals numerics ([`q4_k_group_scalar`] spells them out), whatever the number
/// of tokens.
pub type Q8KGroups = fn(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]);

/// Rows per group.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one Q4_K block.
const Q4_K_BYTES: usize = 144;
/// Bytes of one Q6_K block.
const Q6_K_BYTES: usize = 210;
/// Bytes of one block column of a Q4_K group.
pub const Q4_K_GROUP_BYTES: usize = GROUP_ROWS * Q4_K_BYTES;
/// Bytes of one block column of a Q6_K group.
pub const Q6_K_GROUP_BYTES: usize = GROUP_ROWS * Q6_K_BYTES;

/// Whether a `rows`-row matrix of `ty` can be stored in row groups: Q4_K and Q6_K, in
/// whole groups.
pub fn is_groupable(ty: GgmlType, rows: usize) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) && rows > 0 && rows.is_multiple_of(GROUP_ROWS)
}

/// Where byte `i` of block `b` of row `r` (of a group of `ty`) goes within the group.
#[inline]
fn grouped_offset(ty: GgmlType, r: usize, b: usize, i: usize) -> usize {
    if ty == GgmlType::Q4_K {
        b * Q4_K_GROUP_BYTES
            + match i {
                0..2 => 2 * r + i,
                2..4 => 32 + 2 * r + (i - 2),
                4..16 => 64 + 16 * (i - 4) + r,
                _ => {
                    let j = i - 16; // byte of qs
                    let (k, q, e) = (j / 32, (j % 32) / 4, j % 4);
                    256 + 64 * (8 * k + q) + 4 * r + e
                }
            }
    } else {
        let unit = |h: usize, l: usize, part: usize| {
            288 + 192 * (8 * h + l / 4) + 64 * part + 4 * r + l % 4
        };
        b * Q6_K_GROUP_BYTES
            + match i {
                0..128 => unit(i / 64, i % 32, (i % 64) / 32), // ql
                128..192 => unit((i - 128) / 32, (i - 128) % 32, 2), // qh
                192..208 => 32 + 16 * (i - 192) + r,           // scales
                _ => 2 * r + (i - 208),                        // d
            }
    }
}

fn check(ty: GgmlType, src: &[u8], dst: &[u8], row_bytes: usize) -> Result<(), QuantError> {
    if !is_groupable(ty, GROUP_ROWS) {
        return Err(QuantError::Unsupported(ty));
    }
    let group = GROUP_ROWS * row_bytes;
    if row_bytes == 0
        || !row_bytes.is_multiple_of(ty.block_bytes())
        || !src.len().is_multiple_of(group)
    {
        return Err(QuantError::LenMismatch {
            what: "row groups (not whole groups of 16 rows of whole blocks)",
            expected: src.len() / group.max(1) * group,
            actual: src.len(),
        });
    }
    if dst.len() != src.len() {
        return Err(QuantError::LenMismatch {
            what: "row groups destination",
            expected: src.len(),
            actual: dst.len(),
        });
    }
    Ok(())
}

/// Regroups `src` (whole groups of 16 ggml rows of `row_bytes` each) into `dst`.
pub fn group_rows(
    ty: GgmlType,
    src: &[u8],
    row_bytes: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    check(ty, src, dst, row_bytes)?;
    let group = GROUP_ROWS * row_bytes;
    // In parallel over groups, and four bytes at a time where they stay together (the
    // quants move in runs of four): a model's worth of matrices is regrouped at load.
    src.par_chunks_exact(group)
        .zip(dst.par_chunks_exact_mut(group))
        .for_each(|(s, d)| {
            for (r, row) in s.chunks_exact(row_bytes).enumerate() {
                for (b, block) in row.chunks_exact(ty.block_bytes()).enumerate() {
                    for (i, run) in block.chunks(4).enumerate() {
                        let at = grouped_offset(ty, r, b, 4 * i);
                        let together = run.len() == 4
                            && (1..4).all(|e| grouped_offset(ty, r, b, 4 * i + e) == at + e);
                        if together {
                            d[at..at + 4].copy_from_slice(run);
                        } else {
                            for (e, &v) in run.iter().enumerate() {
                                d[grouped_offset(ty, r, b, 4 * i + e)] = v;
                            }
                        }
                    }
                }
            }
        });
    Ok(())
}

/// Writes row `r` of the group `group` (16 rows of `ty` in the grouped layout, as long as
/// `out` is) to `out` in ggml's layout.
pub fn ungroup_row(ty: GgmlType, group: &[u8], r: usize, out: &mut [u8]) {
    for (b, block) in out.chunks_exact_mut(ty.block_bytes()).enumerate() {
        for (i, v) in block.iter_mut().enumerate() {
            *v = group[grouped_offset(ty, r, b, i)];
        }
    }
}

/// Checks a group kernel's arguments (the kernels index by them).
///
/// # Panics
/// If `group` is shorter than `blocks` block columns, `out` than 16 values a token, or a
/// token has fewer than `blocks` blocks of quants, scales or pair sums.
pub(crate) fn check_group_args(
    ty: GgmlType,
    group: &[u8],
    blocks: usize,
    xs: &[Q8KSlice<'_>],
    out: &[f32],
) {
    assert!(
        group.len() >= blocks * GROUP_ROWS * ty.block_bytes(),
        "a whole group"
    );
    assert!(out.len() >= xs.len() * GROUP_ROWS, "16 outputs per token");
    for x in xs {
        assert!(
            x.d.len() >= blocks
                && x.qs.len() >= blocks * Q8K_BLOCK
                && x.bsums.len() >= 16 * blocks
                && x.pairs.len() >= 4 * blocks,
            "every token covers the row"
        );
    }
}

/// The portable row-group kernel, and the definition of the numerics every group kernel
/// reproduces bit for bit. Per row and token, block by block: the block's integer total
/// `T = Σ_g sc_g · (w_g · x_g)` over its eight 32-element sub-blocks and its minimums'
/// `M = Σ_g m_g · Σ x_g` (exact), then `acc = fma(dx · d, T, acc)` and `mins = fma(dx ·
/// dmin, M, mins)`; the result `acc − mins`. (The AVX-512 level's Q4_K row kernels,
/// `q4_k_totals`, compute the same.)
pub fn q4_k_group_scalar(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    each_row_and_token(GgmlType::Q4_K, group, blocks, xs, out, |row, x| {
        let (mut acc, mut mins) = (0f32, 0f32);
        for (b, blk) in row.chunks_exact(Q4_K_BYTES).enumerate() {
            let f16 = |o: usize| half::f16::from_le_bytes([blk[o], blk[o + 1]]).to_f32();
            let (d, dmin) = (f16(0), f16(2));
            let xq = &x.qs[b * Q8K_BLOCK..][..Q8K_BLOCK];
            let (mut total, mut m_total) = (0i32, 0i32);
            for g in 0..8 {
                let (sc, m) = scale_min_k4(&blk[4..16], g);
                let qs = &blk[16 + 32 * (g / 2)..][..32];
                let dot: i32 = (0..32)
                    .map(|i| {
                        let w = if g % 2 == 0 { qs[i] & 0xF } else { qs[i] >> 4 };
                        w as i32 * xq[32 * g + i] as i32
                    })
                    .sum();
                total += sc as i32 * dot;
                let sum: i32 = xq[32 * g..][..32].iter().map(|&v| v as i32).sum();
                m_total += m as i32 * sum;
            }
            let dx = x.d[b];
            acc = (dx * d).mul_add(total as f32, acc);
            mins = (dx * dmin).mul_add(m_total as f32, mins);
        }
        acc - mins
    });
}

/// The portable Q6_K row-group kernel, and the definition of its numerics: per row and
/// token, block by block, the block's integer total `T = Σ_j sc_j · (q_j · x_j)` over its
/// sixteen 16-element sub-blocks (`q = 6-bit − 32`; exact), then `acc = fma(dx · d, T,
/// acc)`. (The AVX-512 level's Q6_K row kernels, `q6_k_totals`, compute the same.)
pub fn q6_k_group_scalar(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]) {
    each_row_and_token(GgmlType::Q6_K, group, blocks, xs, out, |row, x| {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(Q6_K_BYTES).enumerate() {
            let d = half::f16::from_le_bytes([blk[208], blk[209]]).to_f32();
            let xq = &x.qs[b * Q8K_BLOCK..][..Q8K_BLOCK];
            let mut total = 0i32;
            for e in 0..256 {
                let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
                let lo = (blk[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
                let hi = (blk[128 + 32 * h + l] >> (2 * s)) & 3;
                let q = (lo | hi << 4) as i32 - 32;
                total += blk[192 + e / 16] as i8 as i32 * q * xq[e] as i32;
            }
            acc = (x.d[b] * d).mul_add(total as f32, acc);
        }
        acc
    });
}

/// `out[t * 16 + r] = dot(row r in ggml's layout, token t)` for the group's 16 rows (of
/// `blocks` blocks of `ty`), after the group kernels' argument checks.
fn each_row_and_token(
    ty: GgmlType,
    group: &[u8],
    blocks: usize,
    xs: &[Q8KSlice<'_>],
    out: &mut [f32],
    dot: impl Fn(&[u8], &Q8KSlice<'_>) -> f32,
) {
    check_group_args(ty, group, blocks, xs, out);
    let mut row = vec![0u8; blocks * ty.block_bytes()];
    for r in 0..GROUP_ROWS {
        ungroup_row(ty, group, r, &mut row);
        for (t, x) in xs.iter().enumerate() {
            out[t * GROUP_ROWS + r] = dot(&row, x);
        }
    }
}

/// The portable row-group kernel of `ty`, if it has row groups.
pub fn scalar_kernel(ty: GgmlType) -> Option<Q8KGroups> {
    match ty {
        GgmlType::Q4_K => Some(q4_k_group_scalar),
        GgmlType::Q6_K => Some(q6_k_group_scalar),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_is_a_permutation_that_ungroups_exactly() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let (rows, blocks) = (32, 3);
            let row_bytes = blocks * ty.block_bytes();
            let src: Vec<u8> = (0..rows * row_bytes)
                .map(|i| (i * 7 + i / 251) as u8)
                .collect();
            let mut dst = vec![0u8; src.len()];
            group_rows(ty, &src, row_bytes, &mut dst).unwrap();
            // Every byte lands in its own place: the offsets are a bijection.
            let mut seen = vec![false; GROUP_ROWS * row_bytes];
            for r in 0..GROUP_ROWS {
                for b in 0..blocks {
                    for i in 0..ty.block_bytes() {
                        let o = grouped_offset(ty, r, b, i);
                        assert!(!seen[o], "{ty:?}: offset {o} taken twice");
                        seen[o] = true;
                    }
                }
            }
            let mut row = vec![0u8; row_bytes];
            for r in 0..rows {
                let g = r / GROUP_ROWS;
                ungroup_row(
                    ty,
                    &dst[g * GROUP_ROWS * row_bytes..],
                    r % GROUP_ROWS,
                    &mut row,
                );
                assert_eq!(row, src[r * row_bytes..][..row_bytes], "{ty:?} row {r}");
            }
        }
    }

    #[test]
    fn grouping_rejects_what_it_cannot_regroup() {
        let row_bytes = Q4_K_BYTES;
        let src = vec![0u8; 15 * row_bytes];
        let mut dst = vec![0u8; src.len()];
        assert!(group_rows(GgmlType::Q4_K, &src, row_bytes, &mut dst).is_err());
        let src = vec![0u8; 16 * row_bytes];
        let mut dst = vec![0u8; src.len()];
        assert!(group_rows(GgmlType::Q5_K, &src, row_bytes, &mut dst).is_err());
        assert!(group_rows(GgmlType::Q4_K, &src, row_bytes, &mut dst[1..]).is_err());
        assert!(!is_groupable(GgmlType::Q4_K, 24));
        assert!(is_groupable(GgmlType::Q4_K, 32));
    }
}
