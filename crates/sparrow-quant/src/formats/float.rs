//! Plain floating-point "formats": F32, F16 and BF16, one element per block.
//!
//! They implement [`BlockFormat`] like the quantized formats so that dispatch is uniform,
//! but override the row functions: a per-element block call would be absurd here.

use super::{BlockFormat, Lanes};
use crate::types::GgmlType;

/// Elements per f32 partial sum in the row dots; the partials are carried in f64 (as the
/// quantized formats carry their block sums) so long rows keep f32-level relative accuracy.
const CHUNK: usize = 256;

/// Shared dot loop over elements of `EB` bytes each, decoded by `get`. Works in groups of
/// eight consecutive elements into eight lanes, a shape the compiler turns into vector code.
#[inline(always)]
fn dot_with<const EB: usize>(bytes: &[u8], x: &[f32], get: impl Fn(&[u8]) -> f32) -> f32 {
    let mut acc = 0f64;
    for (bc, xc) in bytes.chunks(CHUNK * EB).zip(x.chunks(CHUNK)) {
        let mut lanes = Lanes::default();
        let mut b8 = bc.chunks_exact(8 * EB);
        let mut x8 = xc.chunks_exact(8);
        for (b, xx) in (&mut b8).zip(&mut x8) {
            for (k, &xk) in xx.iter().enumerate() {
                lanes.add(k, get(&b[k * EB..k * EB + EB]) * xk);
            }
        }
        for (k, (b, &xk)) in b8
            .remainder()
            .chunks_exact(EB)
            .zip(x8.remainder())
            .enumerate()
        {
            lanes.add(k, get(b) * xk);
        }
        acc += lanes.sum() as f64;
    }
    acc as f32
}

/// IEEE-754 single precision, little-endian.
pub struct F32;

impl BlockFormat for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 4;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    }

    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        f32::from_le_bytes([block[0], block[1], block[2], block[3]]) * x[0]
    }

    fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
        for (b, o) in bytes.chunks_exact(4).zip(out.iter_mut()) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    fn dot_row(bytes: &[u8], x: &[f32]) -> f32 {
        dot_with::<4>(bytes, x, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// IEEE-754 half precision, little-endian. Widening to f32 is exact (subnormals, infinities
/// and NaN payloads included), so dequantization is bit-exact by construction.
pub struct F16;

#[inline(always)]
fn f16_elem(bytes: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32()
}

impl BlockFormat for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f16_elem(block, 0);
    }

    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        f16_elem(block, 0) * x[0]
    }

    fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = f16_elem(bytes, i);
        }
    }

    fn dot_row(bytes: &[u8], x: &[f32]) -> f32 {
        dot_with::<2>(bytes, x, |b| f16_elem(b, 0))
    }
}

/// bfloat16: the top 16 bits of an f32, little-endian. Widening is a shift, hence exact.
pub struct BF16;

#[inline(always)]
fn bf16_elem(bytes: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32) << 16)
}

impl BlockFormat for BF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK_ELEMS: usize = 1;
    const BLOCK_BYTES: usize = 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = bf16_elem(block, 0);
    }

    fn dot_block(block: &[u8], x: &[f32]) -> f32 {
        bf16_elem(block, 0) * x[0]
    }

    fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = bf16_elem(bytes, i);
        }
    }

    fn dot_row(bytes: &[u8], x: &[f32]) -> f32 {
        dot_with::<2>(bytes, x, |b| bf16_elem(b, 0))
    }
}
