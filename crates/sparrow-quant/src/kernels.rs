//! The kernel dispatch table: the seam where faster implementations plug in.
//!
//! Everything that computes (the free functions [`crate::dequantize`] / [`crate::dot`],
//! [`crate::QMatrix`], [`crate::matvec`], [`crate::matmul`]) looks a type's kernels up here
//! once per call and then calls plain function pointers, so the per-row cost of dispatch is
//! one indirect call.
//!
//! Today every entry is the scalar reference from [`crate::formats`]. To add SIMD kernels
//! (next step): write them as functions with the same signatures, build a second set of
//! `static` tables, and make [`Kernels::get`] pick the table once from runtime CPU feature
//! detection (`is_x86_feature_detected!`), caching the choice. The scalar table stays
//! reachable through [`Kernels::scalar`] as the oracle the fast ones are tested against.
//!
//! int8-activation kernels (quantize `x` to Q8_0/Q8_K once per matvec, then integer dots)
//! change the activation operand, so they get their own optional entry rather than
//! replacing `dot`: a future field such as
//! `dot_q8: Option<fn(row: &[u8], xq: &[u8]) -> f32>` plus an `act_type: GgmlType`, used by
//! `matvec` when present. Their results differ from the f32 reference by the activation
//! rounding, so they need a tolerance-based comparison, not bit equality.

use crate::formats::{float, kquants, legacy, BlockFormat};
use crate::GgmlType;

/// The kernels of one block format.
///
/// Both functions require slices already validated by the caller: `bytes` a whole number of
/// blocks, and `out`/`x` exactly the matching element count. They may panic otherwise;
/// the crate's public functions never pass them anything else.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    /// The format these kernels decode.
    pub ty: GgmlType,
    /// Dequantize whole blocks into `out`.
    pub dequantize: fn(bytes: &[u8], out: &mut [f32]),
    /// Fused dequant-dot of whole blocks with `x`.
    pub dot: fn(bytes: &[u8], x: &[f32]) -> f32,
}

const fn table_of<F: BlockFormat>() -> Kernels {
    Kernels {
        ty: F::TYPE,
        dequantize: F::dequantize_row,
        dot: F::dot_row,
    }
}

static SCALAR: &[Kernels] = &[
    table_of::<float::F32>(),
    table_of::<float::F16>(),
    table_of::<float::BF16>(),
    table_of::<legacy::Q4_0>(),
    table_of::<legacy::Q4_1>(),
    table_of::<legacy::Q5_0>(),
    table_of::<legacy::Q5_1>(),
    table_of::<legacy::Q8_0>(),
    table_of::<kquants::Q2_K>(),
    table_of::<kquants::Q3_K>(),
    table_of::<kquants::Q4_K>(),
    table_of::<kquants::Q5_K>(),
    table_of::<kquants::Q6_K>(),
    table_of::<kquants::Q8_K>(),
];

impl Kernels {
    /// The best kernels available for `ty` on this machine, or `None` if sparrow has none.
    /// Currently always the scalar reference.
    pub fn get(ty: GgmlType) -> Option<&'static Kernels> {
        Self::scalar(ty)
    }

    /// The scalar reference kernels for `ty`: portable, and bit-exact with ggml's reference
    /// dequantization. Kept separately reachable so faster kernels can be tested against it.
    pub fn scalar(ty: GgmlType) -> Option<&'static Kernels> {
        SCALAR.iter().find(|k| k.ty == ty)
    }
}
