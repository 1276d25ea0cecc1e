//! Repacked weight rows: the same bytes as a ggml row, rearranged so decode is cheap.
//!
//! Decode (one token) reads every weight once, so it is bound by how fast each core can
//! unpack blocks as they stream in. Q5_0, the format the Q4_K_M files use for every matrix
//! whose width is not a multiple of 256 (most of a small model's weights), is the costly
//! one in ggml's layout: each 22-byte block needs a broadcast, a shuffle and a compare to
//! spread its 32 fifth bits over 32 bytes, a 128-bit insert to line up its two nibble
//! halves, and a scalar f16 conversion for its scale. Measured on one Zen core, the AVX2
//! kernel reads ggml-layout Q5_0 at ~7.5 GB/s, under the ~16 GB/s a core can stream.
//!
//! A packed row keeps every byte but regroups four consecutive blocks (128 weights, 88
//! bytes) as:
//!
//! | bytes | contents |
//! |---|---|
//! | `0..8` | the four f16 scales `d0..d3` |
//! | `8..24` | fifth bits, transposed: bit `k` of byte `i` is the fifth bit of element `i` of block `k`, bit `4 + k` that of element `16 + i` |
//! | `24..56` | low nibbles of blocks 0 and 1: byte `i` is `lo(b0[i]) \| lo(b1[i]) << 4` for element `i` in `0..32` |
//! | `56..88` | the same for blocks 2 and 3 |
//!
//! so four scales convert in one instruction, one shift and one mask place a block's fifth
//! bits, and one mask (or shift and mask) yields a block's 32 low nibbles. Blocks after the
//! last whole group of a row stay in ggml's layout. The result: the packed AVX2 kernel
//! reads ~14 GB/s per core and decode becomes bound by memory, not by unpacking.
//!
//! Packing is a pure permutation of bits within a row: [`unpack_rows`] restores the ggml
//! bytes exactly, and every product computes the same integer sums as on the ggml layout
//! (the scalar reference [`q5_0_dot_q8`] equals [`crate::q8::q5_0`] bit for bit).

use crate::error::QuantError;
use crate::formats::{legacy, BlockFormat};
use crate::q8::{add_legacy_block, common_blocks, Q8_0Slice, Q8_0_BLOCK};
use crate::types::GgmlType;
use rayon::prelude::*;

/// Blocks per packed group.
pub const GROUP_BLOCKS: usize = 4;
/// Bytes of one Q5_0 block.
const Q5_0_BYTES: usize = 22;
/// Bytes per packed group.
pub const GROUP_BYTES: usize = GROUP_BLOCKS * Q5_0_BYTES;

/// Whether sparrow has a packed layout for `ty` (only Q5_0: the other formats' ggml
/// layouts already decode at memory speed).
pub fn is_packable(ty: GgmlType) -> bool {
    ty == GgmlType::Q5_0
}

/// Checks `ty`, that rows are whole blocks and that `src`/`dst` are whole rows.
fn check(ty: GgmlType, src: &[u8], dst: &[u8], row_bytes: usize) -> Result<(), QuantError> {
    if !is_packable(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    if row_bytes == 0 || !row_bytes.is_multiple_of(ty.block_bytes()) {
        return Err(QuantError::LenMismatch {
            what: "row bytes (not a whole number of blocks)",
            expected: row_bytes / ty.block_bytes() * ty.block_bytes(),
            actual: row_bytes,
        });
    }
    if !src.len().is_multiple_of(row_bytes) {
        return Err(QuantError::LenMismatch {
            what: "matrix data (not a whole number of rows)",
            expected: src.len() / row_bytes * row_bytes,
            actual: src.len(),
        });
    }
    if dst.len() != src.len() {
        return Err(QuantError::LenMismatch {
            what: "packed output",
            expected: src.len(),
            actual: dst.len(),
        });
    }
    Ok(())
}

/// Packs rows of `row_bytes` bytes of format `ty` from ggml's layout (`src`) into `dst`
/// (same length). [`QuantError::Unsupported`] for a type without a packed layout (see
/// [`is_packable`]), [`QuantError::LenMismatch`] if the lengths are not whole rows of
/// whole blocks.
pub fn pack_rows(
    ty: GgmlType,
    src: &[u8],
    row_bytes: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    map_groups(ty, src, row_bytes, dst, pack_group)
}

/// The inverse of [`pack_rows`]: restores ggml's layout exactly.
pub fn unpack_rows(
    ty: GgmlType,
    src: &[u8],
    row_bytes: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    map_groups(ty, src, row_bytes, dst, unpack_group)
}

/// After [`check`]ing the arguments, writes `f` of every whole group of every row of `src`
/// to `dst`, copying the blocks after a row's last whole group as they are; rows in
/// parallel (a model holds a few hundred MB of them).
fn map_groups(
    ty: GgmlType,
    src: &[u8],
    row_bytes: usize,
    dst: &mut [u8],
    f: fn(&[u8; GROUP_BYTES]) -> [u8; GROUP_BYTES],
) -> Result<(), QuantError> {
    check(ty, src, dst, row_bytes)?;
    src.par_chunks(row_bytes)
        .zip(dst.par_chunks_mut(row_bytes))
        .for_each(|(s, d)| {
            let whole = s.len() / GROUP_BYTES * GROUP_BYTES;
            for (g, o) in s[..whole]
                .chunks_exact(GROUP_BYTES)
                .zip(d[..whole].chunks_exact_mut(GROUP_BYTES))
            {
                o.copy_from_slice(&f(g.try_into().expect("group size")));
            }
            d[whole..].copy_from_slice(&s[whole..]);
        });
    Ok(())
}

/// `SPREAD[v]`: byte `i` holds bit `i` of `v` (0 or 1).
static SPREAD: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut v = 0;
    while v < 256 {
        let mut i = 0;
        while i < 8 {
            t[v] |= (((v >> i) & 1) as u64) << (8 * i);
            i += 1;
        }
        v += 1;
    }
    t
};

/// Bits `0..16` of `v` as 16 bytes of 0 or 1 (little-endian: byte `i` is bit `i`).
fn spread16(v: u32) -> u128 {
    SPREAD[(v & 0xFF) as usize] as u128 | (SPREAD[((v >> 8) & 0xFF) as usize] as u128) << 64
}

/// Four ggml Q5_0 blocks → one packed group (see the module docs).
fn pack_group(src: &[u8; GROUP_BYTES]) -> [u8; GROUP_BYTES] {
    let mut o = [0u8; GROUP_BYTES];
    let mut fifth = 0u128;
    for k in 0..GROUP_BLOCKS {
        let b = &src[k * Q5_0_BYTES..(k + 1) * Q5_0_BYTES];
        o[2 * k..2 * k + 2].copy_from_slice(&b[0..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        // every byte of a spread is 0 or 1, so shifting the whole word by < 8 moves each
        // bit within its own byte
        fifth |= spread16(qh) << k | spread16(qh >> 16) << (k + 4);
        let nibbles = &mut o[24 + 32 * (k / 2)..][..32];
        let shift = 4 * (k % 2);
        for i in 0..16 {
            nibbles[i] |= (b[6 + i] & 0x0F) << shift;
            nibbles[16 + i] |= (b[6 + i] >> 4) << shift;
        }
    }
    o[8..24].copy_from_slice(&fifth.to_le_bytes());
    o
}

/// One packed group → four ggml Q5_0 blocks.
fn unpack_group(src: &[u8; GROUP_BYTES]) -> [u8; GROUP_BYTES] {
    let mut o = [0u8; GROUP_BYTES];
    let fifth = u128::from_le_bytes(src[8..24].try_into().expect("16 bytes"));
    for k in 0..GROUP_BLOCKS {
        let b = &mut o[k * Q5_0_BYTES..(k + 1) * Q5_0_BYTES];
        b[0..2].copy_from_slice(&src[2 * k..2 * k + 2]);
        let qh = gather16(fifth >> k) | gather16(fifth >> (k + 4)) << 16;
        b[2..6].copy_from_slice(&qh.to_le_bytes());
        let nibbles = &src[24 + 32 * (k / 2)..][..32];
        let shift = 4 * (k % 2);
        for i in 0..16 {
            b[6 + i] = (nibbles[i] >> shift) & 0x0F | ((nibbles[16 + i] >> shift) & 0x0F) << 4;
        }
    }
    o
}

/// The inverse of [`spread16`]: bit 0 of each of the 16 bytes of `v`, as bits `0..16`.
fn gather16(v: u128) -> u32 {
    // With bytes of 0 or 1, the product places byte i's bit at bit 56 + i with no carries
    // into the top byte (the classic "movemask" multiply).
    let gather8 =
        |w: u64| ((w & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32;
    gather8(v as u64) | gather8((v >> 64) as u64) << 8
}

/// Calls `f(block index, ggml block bytes)` for every block of a packed Q5_0 row, in
/// order (groups are unpacked into a stack buffer on the way).
pub(crate) fn for_each_block(row: &[u8], mut f: impl FnMut(usize, &[u8])) {
    let whole = row.len() / GROUP_BYTES * GROUP_BYTES;
    for (g, packed) in row[..whole].chunks_exact(GROUP_BYTES).enumerate() {
        let blocks = unpack_group(packed.try_into().expect("group size"));
        for (k, b) in blocks.chunks_exact(Q5_0_BYTES).enumerate() {
            f(g * GROUP_BLOCKS + k, b);
        }
    }
    let first = whole / Q5_0_BYTES;
    for (k, b) in row[whole..].chunks_exact(Q5_0_BYTES).enumerate() {
        f(first + k, b);
    }
}

/// Dequantizes a packed Q5_0 row (scalar; exact, as ggml's reference).
pub(crate) fn q5_0_dequantize(row: &[u8], out: &mut [f32]) {
    for_each_block(row, |k, b| {
        legacy::Q5_0::dequantize_row(b, &mut out[k * 32..(k + 1) * 32]);
    });
}

/// Dot of a packed Q5_0 row with f32 activations (scalar, block by block).
pub(crate) fn q5_0_dot(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for_each_block(row, |k, b| {
        acc += legacy::Q5_0::dot_row(b, &x[k * 32..(k + 1) * 32]);
    });
    acc
}

/// Dot of a packed Q5_0 row with Q8_0 activations: the scalar reference, equal to
/// [`crate::q8::q5_0`] on the unpacked row bit for bit (same integer sums, same order of
/// the f32 operations).
pub fn q5_0_dot_q8(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let blocks = common_blocks(row, Q5_0_BYTES, x);
    let mut acc = 0f32;
    for_each_block(row, |k, b| {
        if k < blocks {
            let xq = &x.qs[k * Q8_0_BLOCK..(k + 1) * Q8_0_BLOCK];
            add_legacy_block(&mut acc, GgmlType::Q5_0, b, xq, x.d[k], x.sum[k]);
        }
    });
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arbitrary bytes: the top byte of a multiplicative hash of the index.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        (0..n as u64)
            .map(|i| ((i ^ seed << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    }

    #[test]
    fn pack_then_unpack_restores_every_byte() {
        for blocks in [1usize, 3, 4, 5, 8, 28, 31] {
            let rb = blocks * Q5_0_BYTES;
            let src = bytes(3 * rb, blocks as u64);
            let mut packed = vec![0; src.len()];
            let mut back = vec![0; src.len()];
            pack_rows(GgmlType::Q5_0, &src, rb, &mut packed).unwrap();
            unpack_rows(GgmlType::Q5_0, &packed, rb, &mut back).unwrap();
            assert_eq!(back, src, "{blocks} blocks per row");
            if blocks >= GROUP_BLOCKS {
                assert_ne!(packed, src, "a whole group must be rearranged");
            }
        }
    }

    #[test]
    fn blocks_iterate_in_ggml_layout() {
        let rb = 7 * Q5_0_BYTES;
        let src = bytes(rb, 9);
        let mut packed = vec![0; rb];
        pack_rows(GgmlType::Q5_0, &src, rb, &mut packed).unwrap();
        let mut seen = vec![];
        for_each_block(&packed, |k, b| {
            assert_eq!(b, &src[k * Q5_0_BYTES..(k + 1) * Q5_0_BYTES]);
            seen.push(k);
        });
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn bad_inputs_are_refused() {
        let src = vec![0u8; 44];
        let mut dst = vec![0u8; 44];
        assert!(matches!(
            pack_rows(GgmlType::Q4_0, &src, 18, &mut dst),
            Err(QuantError::Unsupported(_))
        ));
        assert!(pack_rows(GgmlType::Q5_0, &src, 21, &mut dst).is_err());
        assert!(pack_rows(GgmlType::Q5_0, &src, 0, &mut dst).is_err());
        assert!(pack_rows(GgmlType::Q5_0, &src[..40], 22, &mut dst[..40]).is_err());
        assert!(pack_rows(GgmlType::Q5_0, &src, 22, &mut dst[..22]).is_err());
    }
}
