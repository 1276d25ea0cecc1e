//! Row groups: Q4_K, Q6_K and Q5_0 rows regrouped sixteen at a time, so a kernel holds one
//! weight of each of 16 rows in the 16 lanes of a register.
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
//! **Q5_0** (`16 × 22`; a permutation of bits, not only of bytes, for the fifth bits):
//!
//! | bytes | contents |
//! |---|---|
//! | `0..32` | the 16 rows' `d` (f16) |
//! | `32..96` | eight 64-bit masks: bit `4 r + e` of mask `u` (bytes `32 + 8 u ..`) is the fifth bit of element `4 u + e` of row `r` |
//! | `96..352` | for quad `q` (0..4), 64 bytes at `96 + 64 q`: bytes `4 q .. 4 q + 4` of each row's `qs`, row after row |
//!
//! so one 64-byte load holds elements `4 q .. 4 q + 4` (low nibbles) and `16 + 4 q ..` (high
//! nibbles) of all 16 rows, and mask `u` marks, byte for byte, which of the 64 values of unit
//! `u` (`q = u` low nibbles, `q = u − 4` high) has its fifth bit set. Why Q5_0: it is the
//! format of every matrix of a small Qwen whose width is not a multiple of 256 (the 0.5B's
//! attention and gate/up, 175 of the 278 MB a draft step reads), and its row kernels spend
//! more instructions per byte than a core streams: they read ~24 GB/s where Q8_0 reads ~35.
//!
//! Matrices of other formats, or whose rows are not a whole number of groups, keep ggml's
//! layout (see [`is_groupable`]).

use crate::error::QuantError;
use crate::formats::kquants::scale_min_k4;
use crate::q8::{Q8KSlice, Q8_0Slice, Q8K_BLOCK, Q8_0_BLOCK};
use crate::types::GgmlType;
use rayon::prelude::*;

/// A row-group kernel: one group of 16 rows (`blocks` blocks each, in the grouped layout)
/// against every token of `xs`, `out[t * 16 + r]`. Every row and token gets the bits of
/// the block-totals numerics ([`q4_k_group_scalar`] spells them out), whatever the number
/// of tokens.
pub type Q8KGroups = fn(group: &[u8], blocks: usize, xs: &[Q8KSlice<'_>], out: &mut [f32]);

/// A row-group kernel of a legacy format, on Q8_0 activations (as [`Q8KGroups`]; the
/// numerics are the scalar row kernel's, [`crate::q8::q5_0`], spelled out by
/// [`q5_0_group_scalar`]).
pub type Q8_0Groups = fn(group: &[u8], blocks: usize, xs: &[Q8_0Slice<'_>], out: &mut [f32]);

/// A format's row-group kernel, by the activations it takes (named as the variants of
/// [`crate::Q8Dot`]).
#[derive(Clone, Copy, Debug)]
pub enum GroupDot {
    /// A k-quant's, on Q8_K activations.
    Q8K(Q8KGroups),
    /// A legacy format's, on Q8_0 activations.
    Q8_0(Q8_0Groups),
}

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
/// Bytes of one Q5_0 block.
const Q5_0_BYTES: usize = 22;
/// Bytes of one block column of a Q5_0 group.
pub const Q5_0_GROUP_BYTES: usize = GROUP_ROWS * Q5_0_BYTES;
/// Where a Q5_0 group's fifth-bit masks start (after the 16 scales).
pub const Q5_0_MASKS: usize = 32;
/// Where a Q5_0 group's quads of nibbles start (after the eight masks).
pub const Q5_0_QUADS: usize = 96;

/// Whether a `rows`-row matrix of `ty` can be stored in row groups: Q4_K, Q6_K and Q5_0,
/// in whole groups.
pub fn is_groupable(ty: GgmlType, rows: usize) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q5_0)
        && rows > 0
        && rows.is_multiple_of(GROUP_ROWS)
}

/// Where byte `i` of block `b` of row `r` of a Q5_0 group goes, for the bytes that move
/// whole (the scale and the nibbles; `None` for the four bytes of fifth bits, which
/// [`q5_0_fifth_bits`] spreads).
#[inline]
fn q5_0_offset(r: usize, b: usize, i: usize) -> Option<usize> {
    let base = b * Q5_0_GROUP_BYTES;
    match i {
        0..2 => Some(base + 2 * r + i),
        2..6 => None,
        _ => {
            let j = i - 6; // byte of qs
            Some(base + Q5_0_QUADS + 64 * (j / 4) + 4 * r + j % 4)
        }
    }
}

/// Where nibble `u` of row `r`'s fifth bits (the bits of elements `4 u .. 4 u + 4`) of block
/// `b` goes: the byte, and the shift within it.
#[inline]
fn q5_0_fifth_bits(r: usize, b: usize, u: usize) -> (usize, u32) {
    (
        b * Q5_0_GROUP_BYTES + Q5_0_MASKS + 8 * u + r / 2,
        4 * (r as u32 % 2),
    )
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
    if ty == GgmlType::Q5_0 {
        src.par_chunks_exact(group)
            .zip(dst.par_chunks_exact_mut(group))
            .for_each(|(s, d)| group_q5_0(s, row_bytes, d));
        return Ok(());
    }
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

/// Row `r` of one block column `blk` of a Q5_0 group: its scale, and its 32 values as
/// unsigned 5-bit integers (`q + 16`), unit by unit (element `4 u + e` at `4 u + e`).
pub(crate) fn q5_0_group_row(blk: &[u8], r: usize) -> (f32, [u8; 32]) {
    let d = half::f16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]).to_f32();
    let values = std::array::from_fn(|k| {
        let (u, e) = (k / 4, k % 4);
        let q = blk[q5_0_offset(r, 0, 6 + 4 * (u % 4) + e).expect("a byte of qs")];
        let nibble = if u < 4 { q & 0x0F } else { q >> 4 };
        let (at, shift) = q5_0_fifth_bits(r, 0, u);
        nibble | ((blk[at] >> (shift + e as u32)) & 1) << 4
    });
    (d, values)
}

/// One group of 16 Q5_0 rows (`src`, ggml's layout) into `dst`.
fn group_q5_0(src: &[u8], row_bytes: usize, dst: &mut [u8]) {
    dst.fill(0); // the masks are built by or-ing nibbles in
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        for (b, block) in row.chunks_exact(Q5_0_BYTES).enumerate() {
            for (i, &v) in block.iter().enumerate() {
                if let Some(o) = q5_0_offset(r, b, i) {
                    dst[o] = v;
                }
            }
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            for u in 0..8 {
                let (o, shift) = q5_0_fifth_bits(r, b, u);
                dst[o] |= (((qh >> (4 * u)) & 0xF) as u8) << shift;
            }
        }
    }
}

/// Writes row `r` of the group `group` (16 rows of `ty` in the grouped layout, as long as
/// `out` is) to `out` in ggml's layout.
pub fn ungroup_row(ty: GgmlType, group: &[u8], r: usize, out: &mut [u8]) {
    if ty == GgmlType::Q5_0 {
        for (b, block) in out.chunks_exact_mut(Q5_0_BYTES).enumerate() {
            let mut qh = 0u32;
            for u in 0..8 {
                let (o, shift) = q5_0_fifth_bits(r, b, u);
                qh |= (((group[o] >> shift) & 0xF) as u32) << (4 * u);
            }
            block[2..6].copy_from_slice(&qh.to_le_bytes());
            for (i, v) in block.iter_mut().enumerate() {
                if let Some(o) = q5_0_offset(r, b, i) {
                    *v = group[o];
                }
            }
        }
        return;
    }
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
pub(crate) fn check_group_args<X: GroupActs>(
    ty: GgmlType,
    group: &[u8],
    blocks: usize,
    xs: &[X],
    out: &[f32],
) {
    assert!(
        group.len() >= blocks * GROUP_ROWS * ty.block_bytes(),
        "a whole group"
    );
    assert!(out.len() >= xs.len() * GROUP_ROWS, "16 outputs per token");
    for x in xs {
        assert!(x.covers(blocks), "every token covers the row");
    }
}

/// Quantized activations a group kernel takes: whether they cover `blocks` weight blocks.
pub(crate) trait GroupActs {
    fn covers(&self, blocks: usize) -> bool;
}

impl GroupActs for Q8KSlice<'_> {
    fn covers(&self, blocks: usize) -> bool {
        self.d.len() >= blocks
            && self.qs.len() >= blocks * Q8K_BLOCK
            && self.bsums.len() >= 16 * blocks
            && self.pairs.len() >= 4 * blocks
    }
}

impl GroupActs for Q8_0Slice<'_> {
    fn covers(&self, blocks: usize) -> bool {
        self.d.len() >= blocks && self.qs.len() >= blocks * Q8_0_BLOCK && self.sum.len() >= blocks
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

/// The portable Q5_0 row-group kernel: the scalar row kernel [`crate::q8::q5_0`] on each
/// row put back together, whose numerics every Q5_0 group kernel reproduces bit for bit —
/// per row and token, block by block, the block's exact integer dot `T = Σ q·x` (`q` the
/// 5-bit value − 16), then `acc += (d · dx) · T` (a product, then a sum: no fused
/// multiply-add).
pub fn q5_0_group_scalar(group: &[u8], blocks: usize, xs: &[Q8_0Slice<'_>], out: &mut [f32]) {
    each_row_and_token(GgmlType::Q5_0, group, blocks, xs, out, |row, x| {
        crate::q8::q5_0(row, *x)
    });
}

/// `out[t * 16 + r] = dot(row r in ggml's layout, token t)` for the group's 16 rows (of
/// `blocks` blocks of `ty`), after the group kernels' argument checks.
fn each_row_and_token<X: GroupActs>(
    ty: GgmlType,
    group: &[u8],
    blocks: usize,
    xs: &[X],
    out: &mut [f32],
    dot: impl Fn(&[u8], &X) -> f32,
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
pub fn scalar_kernel(ty: GgmlType) -> Option<GroupDot> {
    match ty {
        GgmlType::Q4_K => Some(GroupDot::Q8K(q4_k_group_scalar)),
        GgmlType::Q6_K => Some(GroupDot::Q8K(q6_k_group_scalar)),
        GgmlType::Q5_0 => Some(GroupDot::Q8_0(q5_0_group_scalar)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_is_a_permutation_that_ungroups_exactly() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0] {
            let (rows, blocks) = (32, 3);
            let row_bytes = blocks * ty.block_bytes();
            let src: Vec<u8> = (0..rows * row_bytes)
                .map(|i| (i * 7 + i / 251) as u8)
                .collect();
            let mut dst = vec![0u8; src.len()];
            group_rows(ty, &src, row_bytes, &mut dst).unwrap();
            // Every bit lands in its own place: grouping one group with a single bit set
            // sets a single bit, a different one for every source bit.
            let group = GROUP_ROWS * row_bytes;
            let mut seen = vec![false; 8 * group];
            let (mut one, mut out) = (vec![0u8; group], vec![0u8; group]);
            for bit in 0..8 * group {
                one.fill(0);
                one[bit / 8] = 1 << (bit % 8);
                group_rows(ty, &one, row_bytes, &mut out).unwrap();
                let set: Vec<usize> = (0..8 * group)
                    .filter(|&o| out[o / 8] >> (o % 8) & 1 == 1)
                    .collect();
                assert_eq!(set.len(), 1, "{ty:?}: source bit {bit} gave {set:?}");
                assert!(!seen[set[0]], "{ty:?}: bit {} taken twice", set[0]);
                seen[set[0]] = true;
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
