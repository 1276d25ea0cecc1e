//! AArch64 SIMD kernels, selected at run time.
//!
//! [`neon`] holds every kernel body once, compiled twice: for [`SimdLevel::Neon`] (plain
//! Advanced SIMD, which every AArch64 CPU has and this target enables by default) and for
//! [`SimdLevel::NeonDot`] (adds `sdot`, the `dotprod` extension of Armv8.2+, detected at
//! run time with `is_aarch64_feature_detected!`). The `NeonDot` tables wrap each
//! `#[target_feature(enable = "dotprod")]` entry point in a plain `fn`; they are only
//! handed out by [`crate::kernels::Kernels::for_level`] after [`has_dotprod`] confirmed
//! the extension, which is what makes the wrappers sound.

pub(crate) mod gemm;
pub(crate) mod neon;

use crate::formats::{float, kquants, legacy, BlockFormat};
use crate::kernels::{Kernels, SimdLevel};
use crate::q8::{Q8Dot, Q8KSlice, Q8_0Slice};
use crate::GgmlType;

/// Whether the `dotprod` kernels may run here.
pub(crate) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

const fn k(
    level: SimdLevel,
    ty: GgmlType,
    dequantize: fn(&[u8], &mut [f32]),
    dot: fn(&[u8], &[f32]) -> f32,
    dot_q8: Option<Q8Dot>,
) -> Kernels {
    Kernels {
        ty,
        level,
        dequantize,
        dot,
        dot_q8,
        dot_q8_multi: None,
        packed: false,
    }
}

/// The kernel table of one level, from its int8 entry points (the f32-activation dots
/// need only NEON and are shared).
macro_rules! table {
    ($level:expr, $q4_0:expr, $q4_1:expr, $q5_0:expr, $q5_1:expr, $q8_0:expr, $q2_k:expr,
     $q3_k:expr, $q4_k:expr, $q5_k:expr, $q6_k:expr, $q8_k:expr) => {
        &[
            k(
                $level,
                GgmlType::F32,
                float::F32::dequantize_row,
                neon::dot_f32,
                None,
            ),
            k(
                $level,
                GgmlType::F16,
                float::F16::dequantize_row,
                neon::dot_f16,
                None,
            ),
            k(
                $level,
                GgmlType::BF16,
                float::BF16::dequantize_row,
                neon::dot_bf16,
                None,
            ),
            k(
                $level,
                GgmlType::Q4_0,
                legacy::Q4_0::dequantize_row,
                neon::dot_dequant::<legacy::Q4_0>,
                Some(Q8Dot::Q8_0($q4_0)),
            ),
            k(
                $level,
                GgmlType::Q4_1,
                legacy::Q4_1::dequantize_row,
                neon::dot_dequant::<legacy::Q4_1>,
                Some(Q8Dot::Q8_0($q4_1)),
            ),
            k(
                $level,
                GgmlType::Q5_0,
                legacy::Q5_0::dequantize_row,
                neon::dot_dequant::<legacy::Q5_0>,
                Some(Q8Dot::Q8_0($q5_0)),
            ),
            k(
                $level,
                GgmlType::Q5_1,
                legacy::Q5_1::dequantize_row,
                neon::dot_dequant::<legacy::Q5_1>,
                Some(Q8Dot::Q8_0($q5_1)),
            ),
            k(
                $level,
                GgmlType::Q8_0,
                legacy::Q8_0::dequantize_row,
                neon::dot_dequant::<legacy::Q8_0>,
                Some(Q8Dot::Q8_0($q8_0)),
            ),
            k(
                $level,
                GgmlType::Q2_K,
                kquants::Q2_K::dequantize_row,
                neon::dot_dequant::<kquants::Q2_K>,
                Some(Q8Dot::Q8K($q2_k)),
            ),
            k(
                $level,
                GgmlType::Q3_K,
                kquants::Q3_K::dequantize_row,
                neon::dot_dequant::<kquants::Q3_K>,
                Some(Q8Dot::Q8K($q3_k)),
            ),
            k(
                $level,
                GgmlType::Q4_K,
                kquants::Q4_K::dequantize_row,
                neon::dot_dequant::<kquants::Q4_K>,
                Some(Q8Dot::Q8K($q4_k)),
            ),
            k(
                $level,
                GgmlType::Q5_K,
                kquants::Q5_K::dequantize_row,
                neon::dot_dequant::<kquants::Q5_K>,
                Some(Q8Dot::Q8K($q5_k)),
            ),
            k(
                $level,
                GgmlType::Q6_K,
                kquants::Q6_K::dequantize_row,
                neon::dot_dequant::<kquants::Q6_K>,
                Some(Q8Dot::Q8K($q6_k)),
            ),
            k(
                $level,
                GgmlType::Q8_K,
                kquants::Q8_K::dequantize_row,
                neon::dot_dequant::<kquants::Q8_K>,
                Some(Q8Dot::Q8K($q8_k)),
            ),
        ]
    };
}

/// Kernels for rows in the packed layout (`crate::packed`) at `level`.
const fn packed(level: SimdLevel, dot_q8: fn(&[u8], Q8_0Slice<'_>) -> f32) -> Kernels {
    Kernels {
        ty: GgmlType::Q5_0,
        level,
        dequantize: crate::packed::q5_0_dequantize,
        dot: crate::packed::q5_0_dot,
        dot_q8: Some(Q8Dot::Q8_0(dot_q8)),
        dot_q8_multi: None,
        packed: true,
    }
}

pub(crate) static NEON: &[Kernels] = table!(
    SimdLevel::Neon,
    neon::q4_0,
    neon::q4_1,
    neon::q5_0,
    neon::q5_1,
    neon::q8_0,
    neon::q2_k,
    neon::q3_k,
    neon::q4_k,
    neon::q5_k,
    neon::q6_k,
    neon::q8_k
);

pub(crate) static PACKED_NEON: &[Kernels] = &[packed(SimdLevel::Neon, neon::q5_0_packed)];

/// Defines plain-`fn` wrappers around the `dotprod` entry points.
macro_rules! wrappers {
    ($( $name:ident = $imp:path : ($($a:ident : $t:ty),*) ;)*) => {
        $(
            fn $name($($a: $t),*) -> f32 {
                // SAFETY: this wrapper is only reachable through a kernel table that
                // `Kernels::for_level` returns after checking (with
                // `is_aarch64_feature_detected!`) that the CPU has `dotprod`.
                unsafe { $imp($($a),*) }
            }
        )*
    };
}

mod dot_entries {
    use super::*;
    wrappers! {
        q4_0 = neon::q4_0_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q4_1 = neon::q4_1_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q5_0 = neon::q5_0_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q5_1 = neon::q5_1_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q8_0 = neon::q8_0_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q5_0_packed = neon::q5_0_packed_dot: (r: &[u8], x: Q8_0Slice<'_>);
        q2_k = neon::q2_k_dot: (r: &[u8], x: Q8KSlice<'_>);
        q3_k = neon::q3_k_dot: (r: &[u8], x: Q8KSlice<'_>);
        q4_k = neon::q4_k_dot: (r: &[u8], x: Q8KSlice<'_>);
        q5_k = neon::q5_k_dot: (r: &[u8], x: Q8KSlice<'_>);
        q6_k = neon::q6_k_dot: (r: &[u8], x: Q8KSlice<'_>);
        q8_k = neon::q8_k_dot: (r: &[u8], x: Q8KSlice<'_>);
    }

    pub(crate) static TABLE: &[Kernels] = table!(
        SimdLevel::NeonDot,
        q4_0,
        q4_1,
        q5_0,
        q5_1,
        q8_0,
        q2_k,
        q3_k,
        q4_k,
        q5_k,
        q6_k,
        q8_k
    );

    pub(crate) static PACKED: &[Kernels] = &[packed(SimdLevel::NeonDot, q5_0_packed)];
}

pub(crate) use dot_entries::{PACKED as PACKED_NEON_DOT, TABLE as NEON_DOT};
