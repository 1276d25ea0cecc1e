//! sparrow-quant: ggml block formats, dequantization and fused dequant-dot kernels.
//!
//! Model weights in GGUF files are stored in ggml's block formats (F32, F16, BF16, the
//! legacy Q4_0..Q8_0 and the k-quants Q2_K..Q6_K). This crate turns such bytes into numbers,
//! either all at once ([`dequantize`]) or fused into a dot product with an f32 vector
//! ([`dot`]) so a matrix-vector product never materialises a dequantized row.
//! [`QMatrix`] is a validated view of a 2-D weight tensor, and [`matvec`] / [`matmul`] are
//! its (multi-threaded) products.
//!
//! # Threads
//!
//! [`matvec`] and [`matmul`] run on the *current* rayon thread pool: the global pool by
//! default (one thread per core), or whichever pool the caller entered with
//! [`rayon::ThreadPool::install`]. To cap the thread count, build a pool once and run the
//! model inside it:
//!
//! ```
//! # use sparrow_quant::{GgmlType, QMatrix, matvec};
//! let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
//! let w = vec![0u8; 4 * 8 * 4]; // 4 x 8 F32 matrix
//! let m = QMatrix::new(GgmlType::F32, &w, 4, 8).unwrap();
//! let mut out = [0f32; 4];
//! pool.install(|| matvec(&m, &[1.0; 8], &mut out)).unwrap();
//! ```
//!
//! # Extending
//!
//! The code for each format lives in [`formats`] as a type implementing
//! [`formats::BlockFormat`] (the scalar reference); [`q8`] holds the int8-activation
//! machinery and its scalar reference; every format with kernels is named once, in the
//! kernel catalogue (`src/catalogue.rs`), from which each SIMD level's table follows;
//! [`kernels::Kernels`] is the dispatch table that picks SIMD kernels (AVX2, AVX-512; NEON
//! on AArch64) at run time; [`packed`] is sparrow's own row layout for Q5_0, which decodes
//! faster than ggml's ([`QMatrix::new_packed`] views it).
//!
//! # int8 activations
//!
//! [`matvec`] and [`matmul`] quantize the activations to 8 bits once per call (as ggml and
//! llama.cpp do) and use integer dot products for every quantized weight format; float
//! weight formats keep f32 activations. [`matvec_f32`] / [`matmul_f32`] keep the f32
//! activations throughout (the reference, [`dot`] per row).

#![warn(missing_docs)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod catalogue;
mod entry_points;
mod error;
pub mod formats;
#[doc(hidden)]
pub mod gemm;
pub mod kernels;
mod level;
mod matrix;
pub mod packed;
mod panel;
mod products;
pub mod q8;
pub mod q8_tiles;
pub mod row_groups;
mod types;
#[cfg(target_arch = "x86_64")]
mod x86;

use error::check_len;
pub use error::QuantError;
pub use kernels::{Kernels, SimdLevel};
pub use matrix::QMatrix;
pub use products::{
    matmul, matmul_at_level, matmul_f32, matmul_multi, matmul_rowwise, matvec, matvec_f32,
    matvec_multi, matvec_rows,
};
pub use types::GgmlType;

/// The kernels for `ty`, or [`QuantError::Unsupported`].
fn kernels_for(ty: GgmlType) -> Result<&'static Kernels, QuantError> {
    Kernels::get(ty).ok_or(QuantError::Unsupported(ty))
}

/// Number of elements in `len` bytes of `ty`, or [`QuantError::PartialBlock`].
pub(crate) fn elems_in(ty: GgmlType, len: usize) -> Result<usize, QuantError> {
    let bb = ty.block_bytes();
    if !len.is_multiple_of(bb) {
        return Err(QuantError::PartialBlock {
            ty,
            len,
            block_bytes: bb,
        });
    }
    // Sub-byte formats hold more elements than bytes, so in principle this can overflow.
    (len / bb)
        .checked_mul(ty.block_elems())
        .ok_or(QuantError::SizeOverflow {
            rows: 1,
            cols: usize::MAX,
        })
}

/// Decode `bytes` (a whole number of `ty` blocks) into `out`, which must hold exactly the
/// corresponding number of elements.
///
/// The result is bit-identical to ggml's reference dequantization (and to the `gguf`
/// Python package's), which the fixture tests check.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let k = kernels_for(ty)?;
    let n = elems_in(ty, bytes.len())?;
    check_len("out", n, out.len())?;
    (k.dequantize)(bytes, out);
    Ok(())
}

/// `sum_i w_i * x_i` where `w` is `row` (a whole number of `ty` blocks) dequantized, and `x`
/// has exactly as many elements. The weights are decoded on the fly, never stored.
///
/// Accuracy: each block is summed in f32 (eight interleaved partial sums) and block sums
/// are carried in f64; the result agrees with an f64 dequantize-then-dot to about 1e-6
/// relative to `sum_i |w_i * x_i|`.
pub fn dot(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let k = kernels_for(ty)?;
    let n = elems_in(ty, row.len())?;
    check_len("x", n, x.len())?;
    Ok((k.dot)(row, x))
}

/// The int8-activation dot that [`matvec`] computes per row: `x` is quantized to Q8_0 or
/// Q8_K blocks (see [`q8`]) and dotted with `row` by the active level's integer kernel.
/// For formats without an int8 kernel (F32, F16, BF16) this is [`dot`].
///
/// It differs from [`dot`] by the activation rounding, at most
/// [`q8::act_error_bound`] plus f32 rounding.
pub fn dot_q8(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let k = kernels_for(ty)?;
    let n = elems_in(ty, row.len())?;
    check_len("x", n, x.len())?;
    Ok(match k.dot_q8 {
        Some(q) => q.quantize_and_dot(row, x),
        None => (k.dot)(row, x),
    })
}
