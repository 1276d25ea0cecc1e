//! Scalar reference implementations of the ggml block formats.
//!
//! Each format is a zero-sized type implementing [`BlockFormat`]. The scalar code here is
//! the *reference*: it reproduces, operation for operation, the f32 arithmetic of ggml's
//! reference dequantizers (and of the `gguf` Python package), so its `dequantize` output is
//! bit-identical to theirs. Faster kernels (SIMD, int8 activations) are to be checked
//! against these, and plugged in through [`crate::kernels::Kernels`].
//!
//! Layouts are from ggml's `ggml-common.h` block structs; all multi-byte fields are
//! little-endian and blocks are packed (no padding, no alignment assumed).

pub mod float;
pub mod kquants;
pub mod legacy;

use crate::types::GgmlType;

/// One ggml block format: a fixed number of elements stored in a fixed number of bytes.
///
/// The block functions are called with slices of exactly the stated sizes; the row
/// functions with whole numbers of blocks. Sizes are validated once by the public
/// dispatch functions ([`crate::dequantize`], [`crate::dot`], [`crate::QMatrix`]), which is
/// why these can be infallible.
pub trait BlockFormat {
    /// The catalogue entry this implements.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK_ELEMS: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;

    /// Decode one block (`block.len() == BLOCK_BYTES`) into `out` (`BLOCK_ELEMS` floats).
    fn dequantize_block(block: &[u8], out: &mut [f32]);

    /// `sum_i w_i * x_i` over one block, with `x.len() == BLOCK_ELEMS`, decoding the weights
    /// on the fly rather than through a scratch buffer.
    fn dot_block(block: &[u8], x: &[f32]) -> f32;

    /// Decode a whole number of blocks. Formats with one-element "blocks" (F32, F16, BF16)
    /// override this with a straight loop.
    fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
        for (b, o) in bytes
            .chunks_exact(Self::BLOCK_BYTES)
            .zip(out.chunks_exact_mut(Self::BLOCK_ELEMS))
        {
            Self::dequantize_block(b, o);
        }
    }

    /// Fused dequant-dot of a whole number of blocks with `x`.
    ///
    /// Each block is summed in f32 and the block sums in f64: the f64 carry costs one add
    /// per block and keeps long rows (tens of thousands of elements) from drifting.
    fn dot_row(bytes: &[u8], x: &[f32]) -> f32 {
        let mut acc = 0f64;
        for (b, xb) in bytes
            .chunks_exact(Self::BLOCK_BYTES)
            .zip(x.chunks_exact(Self::BLOCK_ELEMS))
        {
            acc += Self::dot_block(b, xb) as f64;
        }
        acc as f32
    }
}

/// Little-endian f16 at `off`, widened to f32 (exact: every f16 is an f32).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Eight independent partial sums. Summing into one f32 would serialise every add; eight
/// lanes let the compiler vectorise the scalar code and also halve the rounding error.
#[derive(Default)]
pub(crate) struct Lanes([f32; 8]);

impl Lanes {
    #[inline(always)]
    pub(crate) fn add(&mut self, i: usize, v: f32) {
        self.0[i & 7] += v;
    }

    #[inline(always)]
    pub(crate) fn sum(&self) -> f32 {
        let a = &self.0;
        ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
    }
}

/// Implements [`BlockFormat`] for each format listed, from one `each(block, f)` function
/// that calls `f(index, weight)` for every element of the block. Dequantize stores the
/// weights, dot multiplies them into `x` as they are produced; sharing the decoder
/// guarantees the two agree, and `#[inline(always)]` on `each` lets the closure fuse into
/// the loop.
macro_rules! block_formats {
    ($($(#[$m:meta])* $name:ident, $ty:expr, $elems:expr, $bytes:expr, $each:path;)*) => {$(
        $(#[$m])*
        #[allow(non_camel_case_types)] // named as in ggml, like GgmlType's variants
        pub struct $name;

        impl $crate::formats::BlockFormat for $name {
            const TYPE: $crate::types::GgmlType = $ty;
            const BLOCK_ELEMS: usize = $elems;
            const BLOCK_BYTES: usize = $bytes;

            fn dequantize_block(block: &[u8], out: &mut [f32]) {
                let out = &mut out[..$elems];
                $each(&block[..$bytes], |i, w| out[i] = w);
            }

            fn dot_block(block: &[u8], x: &[f32]) -> f32 {
                let x = &x[..$elems];
                let mut lanes = $crate::formats::Lanes::default();
                $each(&block[..$bytes], |i, w| lanes.add(i, w * x[i]));
                lanes.sum()
            }
        }
    )*};
}
pub(crate) use block_formats;
