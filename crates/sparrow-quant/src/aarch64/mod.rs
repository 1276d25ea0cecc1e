//! AArch64 SIMD kernels, selected at run time.
//!
//! [`neon`] holds every kernel body once, compiled twice: for [`SimdLevel::Neon`] (plain
//! Advanced SIMD, which every AArch64 CPU has and this target enables by default) and for
//! [`SimdLevel::NeonDot`] (adds `sdot`, the `dotprod` extension of Armv8.2+, detected at
//! run time with `is_aarch64_feature_detected!`). Each level is a [`KernelSet`]; the
//! `NeonDot` one wraps each `#[target_feature(enable = "dotprod")]` entry point in a plain
//! `fn` by [`checked!`]. Its table is only handed out by
//! [`crate::kernels::Kernels::for_level`] after [`SimdLevel::is_supported`] confirmed the
//! extension, which is what makes the wrappers sound. The f32-activation dots need only
//! NEON and are the same at both levels.

pub(crate) mod gemm;
pub(crate) mod neon;

use crate::catalogue::{int8, Int8, KernelSet, RowDot};
use crate::entry_points::checked;
use crate::formats::BlockFormat;
use crate::level::SimdLevel;
use crate::q8::{Q8KSlice, Q8_0Slice};

/// The plain NEON kernels.
pub(crate) struct Neon;

impl KernelSet for Neon {
    const LEVEL: SimdLevel = SimdLevel::Neon;
    const F32: RowDot = neon::dot_f32;
    const F16: RowDot = neon::dot_f16;
    const BF16: RowDot = neon::dot_bf16;
    const Q4_0: int8::Q8_0 = Int8::new(neon::q4_0);
    const Q4_1: int8::Q8_0 = Int8::new(neon::q4_1);
    const Q5_0: int8::Q8_0 = Int8::new(neon::q5_0);
    const Q5_1: int8::Q8_0 = Int8::new(neon::q5_1);
    const Q8_0: int8::Q8_0 = Int8::new(neon::q8_0);
    const Q2_K: int8::Q8K = Int8::new(neon::q2_k);
    const Q3_K: int8::Q8K = Int8::new(neon::q3_k);
    const Q4_K: int8::Q8K = Int8::new(neon::q4_k);
    const Q5_K: int8::Q8K = Int8::new(neon::q5_k);
    const Q6_K: int8::Q8K = Int8::new(neon::q6_k);
    const Q8_K: int8::Q8K = Int8::new(neon::q8_k);
    const Q5_0_PACKED: int8::Q8_0 = Int8::new(neon::q5_0_packed);

    fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
        neon::dot_dequant::<F>(row, x)
    }
}

/// The NEON kernels with `sdot` (the `dotprod` extension).
pub(crate) struct NeonDot;

impl KernelSet for NeonDot {
    const LEVEL: SimdLevel = SimdLevel::NeonDot;
    const F32: RowDot = Neon::F32;
    const F16: RowDot = Neon::F16;
    const BF16: RowDot = Neon::BF16;
    const Q4_0: int8::Q8_0 = Int8::new(checked!(neon::q4_0_dot: Q8_0Slice<'_>));
    const Q4_1: int8::Q8_0 = Int8::new(checked!(neon::q4_1_dot: Q8_0Slice<'_>));
    const Q5_0: int8::Q8_0 = Int8::new(checked!(neon::q5_0_dot: Q8_0Slice<'_>));
    const Q5_1: int8::Q8_0 = Int8::new(checked!(neon::q5_1_dot: Q8_0Slice<'_>));
    const Q8_0: int8::Q8_0 = Int8::new(checked!(neon::q8_0_dot: Q8_0Slice<'_>));
    const Q2_K: int8::Q8K = Int8::new(checked!(neon::q2_k_dot: Q8KSlice<'_>));
    const Q3_K: int8::Q8K = Int8::new(checked!(neon::q3_k_dot: Q8KSlice<'_>));
    const Q4_K: int8::Q8K = Int8::new(checked!(neon::q4_k_dot: Q8KSlice<'_>));
    const Q5_K: int8::Q8K = Int8::new(checked!(neon::q5_k_dot: Q8KSlice<'_>));
    const Q6_K: int8::Q8K = Int8::new(checked!(neon::q6_k_dot: Q8KSlice<'_>));
    const Q8_K: int8::Q8K = Int8::new(checked!(neon::q8_k_dot: Q8KSlice<'_>));
    const Q5_0_PACKED: int8::Q8_0 = Int8::new(checked!(neon::q5_0_packed_dot: Q8_0Slice<'_>));

    fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
        Neon::dot_dequant::<F>(row, x)
    }
}
