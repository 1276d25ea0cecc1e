//! x86_64 SIMD kernels, selected at run time.
//!
//! [`avx2`] needs AVX2 + FMA + F16C (Haswell and later); `avx512` needs AVX-512
//! F/BW/VL + VNNI (its intrinsics are stable since Rust 1.89, the workspace's minimum).
//! The kernel tables below wrap each `#[target_feature]` function in a plain `fn`; they are
//! only handed out by [`crate::kernels::Kernels::for_level`] after [`has_avx2`] /
//! [`has_avx512`] confirmed the features, which is what makes the wrappers sound.

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod gemm;

use crate::formats::{float, kquants, legacy};
use crate::kernels::{Kernels, SimdLevel};
use crate::q8::{Q8Dot, Q8DotMulti, Q8KSlice, Q8_0Slice};
use crate::GgmlType;

/// Whether the AVX2 kernels may run here.
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether the AVX-512 kernels are compiled in and may run here.
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Defines plain-`fn` wrappers around `#[target_feature]` multi-token kernels.
macro_rules! multi_wrappers {
    ($( $name:ident = $imp:path : $x:ty ;)*) => {
        $(
            fn $name(r: &[u8], xs: &[$x], out: &mut [f32]) {
                // SAFETY: as for `wrappers!`: only reachable through a kernel table handed
                // out after the CPU was checked for every feature the kernel enables.
                unsafe { $imp(r, xs, out) }
            }
        )*
    };
}

/// Defines plain-`fn` wrappers around `#[target_feature]` kernels.
macro_rules! wrappers {
    ($( $name:ident = $imp:path : ($($a:ident : $t:ty),*) ;)*) => {
        $(
            fn $name($($a: $t),*) -> f32 {
                // SAFETY: this wrapper is only reachable through a kernel table that
                // `Kernels::for_level` returns after checking (with `is_x86_feature_detected!`)
                // that the CPU has every feature the wrapped kernel enables.
                unsafe { $imp($($a),*) }
            }
        )*
    };
}

mod avx2_entries {
    use super::*;
    const LEVEL: SimdLevel = SimdLevel::Avx2;
    wrappers! {
        f32_ = avx2::dot_f32: (r: &[u8], x: &[f32]);
        f16_ = avx2::dot_f16: (r: &[u8], x: &[f32]);
        bf16_ = avx2::dot_bf16: (r: &[u8], x: &[f32]);
        f_q4_0 = avx2::dot_dequant::<legacy::Q4_0>: (r: &[u8], x: &[f32]);
        f_q4_1 = avx2::dot_dequant::<legacy::Q4_1>: (r: &[u8], x: &[f32]);
        f_q5_0 = avx2::dot_dequant::<legacy::Q5_0>: (r: &[u8], x: &[f32]);
        f_q5_1 = avx2::dot_dequant::<legacy::Q5_1>: (r: &[u8], x: &[f32]);
        f_q8_0 = avx2::dot_dequant::<legacy::Q8_0>: (r: &[u8], x: &[f32]);
        f_q2_k = avx2::dot_dequant::<kquants::Q2_K>: (r: &[u8], x: &[f32]);
        f_q3_k = avx2::dot_dequant::<kquants::Q3_K>: (r: &[u8], x: &[f32]);
        f_q4_k = avx2::dot_dequant::<kquants::Q4_K>: (r: &[u8], x: &[f32]);
        f_q5_k = avx2::dot_dequant::<kquants::Q5_K>: (r: &[u8], x: &[f32]);
        f_q6_k = avx2::dot_dequant::<kquants::Q6_K>: (r: &[u8], x: &[f32]);
        f_q8_k = avx2::dot_dequant::<kquants::Q8_K>: (r: &[u8], x: &[f32]);
        i_q4_0 = avx2::q4_0: (r: &[u8], x: Q8_0Slice<'_>);
        i_q4_1 = avx2::q4_1: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_0 = avx2::q5_0: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_1 = avx2::q5_1: (r: &[u8], x: Q8_0Slice<'_>);
        i_q8_0 = avx2::q8_0: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_0_packed = avx2::q5_0_packed: (r: &[u8], x: Q8_0Slice<'_>);
        i_q2_k = avx2::q2_k: (r: &[u8], x: Q8KSlice<'_>);
        i_q3_k = avx2::q3_k: (r: &[u8], x: Q8KSlice<'_>);
        i_q4_k = avx2::q4_k: (r: &[u8], x: Q8KSlice<'_>);
        i_q5_k = avx2::q5_k: (r: &[u8], x: Q8KSlice<'_>);
        i_q6_k = avx2::q6_k: (r: &[u8], x: Q8KSlice<'_>);
        i_q8_k = avx2::q8_k: (r: &[u8], x: Q8KSlice<'_>);
    }
    multi_wrappers! {
        m_q8_0 = avx2::q8_0_multi: Q8_0Slice<'_>;
        m_q5_0_packed = avx2::q5_0_packed_multi: Q8_0Slice<'_>;
        m_q4_k = avx2::q4_k_multi: Q8KSlice<'_>;
        m_q6_k = avx2::q6_k_multi: Q8KSlice<'_>;
    }

    const fn k(
        ty: GgmlType,
        dequantize: fn(&[u8], &mut [f32]),
        dot: fn(&[u8], &[f32]) -> f32,
        dot_q8: Option<Q8Dot>,
    ) -> Kernels {
        Kernels {
            ty,
            level: LEVEL,
            dequantize,
            dot,
            dot_q8,
            dot_q8_multi: None,
            packed: false,
        }
    }

    const fn multi(k: Kernels, m: Q8DotMulti) -> Kernels {
        Kernels {
            dot_q8_multi: Some(m),
            ..k
        }
    }

    use crate::formats::BlockFormat;
    pub(crate) static TABLE: &[Kernels] = &[
        k(GgmlType::F32, float::F32::dequantize_row, f32_, None),
        k(GgmlType::F16, float::F16::dequantize_row, f16_, None),
        k(GgmlType::BF16, float::BF16::dequantize_row, bf16_, None),
        k(
            GgmlType::Q4_0,
            legacy::Q4_0::dequantize_row,
            f_q4_0,
            Some(Q8Dot::Q8_0(i_q4_0)),
        ),
        k(
            GgmlType::Q4_1,
            legacy::Q4_1::dequantize_row,
            f_q4_1,
            Some(Q8Dot::Q8_0(i_q4_1)),
        ),
        k(
            GgmlType::Q5_0,
            legacy::Q5_0::dequantize_row,
            f_q5_0,
            Some(Q8Dot::Q8_0(i_q5_0)),
        ),
        k(
            GgmlType::Q5_1,
            legacy::Q5_1::dequantize_row,
            f_q5_1,
            Some(Q8Dot::Q8_0(i_q5_1)),
        ),
        multi(
            k(
                GgmlType::Q8_0,
                legacy::Q8_0::dequantize_row,
                f_q8_0,
                Some(Q8Dot::Q8_0(i_q8_0)),
            ),
            Q8DotMulti::Q8_0(m_q8_0),
        ),
        k(
            GgmlType::Q2_K,
            kquants::Q2_K::dequantize_row,
            f_q2_k,
            Some(Q8Dot::Q8K(i_q2_k)),
        ),
        k(
            GgmlType::Q3_K,
            kquants::Q3_K::dequantize_row,
            f_q3_k,
            Some(Q8Dot::Q8K(i_q3_k)),
        ),
        multi(
            k(
                GgmlType::Q4_K,
                kquants::Q4_K::dequantize_row,
                f_q4_k,
                Some(Q8Dot::Q8K(i_q4_k)),
            ),
            Q8DotMulti::Q8K(m_q4_k),
        ),
        k(
            GgmlType::Q5_K,
            kquants::Q5_K::dequantize_row,
            f_q5_k,
            Some(Q8Dot::Q8K(i_q5_k)),
        ),
        multi(
            k(
                GgmlType::Q6_K,
                kquants::Q6_K::dequantize_row,
                f_q6_k,
                Some(Q8Dot::Q8K(i_q6_k)),
            ),
            Q8DotMulti::Q8K(m_q6_k),
        ),
        k(
            GgmlType::Q8_K,
            kquants::Q8_K::dequantize_row,
            f_q8_k,
            Some(Q8Dot::Q8K(i_q8_k)),
        ),
    ];

    /// Kernels for rows in the packed layout (`crate::packed`).
    pub(crate) static PACKED: &[Kernels] = &[Kernels {
        ty: GgmlType::Q5_0,
        level: LEVEL,
        dequantize: crate::packed::q5_0_dequantize,
        dot: crate::packed::q5_0_dot,
        dot_q8: Some(Q8Dot::Q8_0(i_q5_0_packed)),
        dot_q8_multi: Some(Q8DotMulti::Q8_0(m_q5_0_packed)),
        packed: true,
    }];
}

pub(crate) use avx2_entries::{PACKED as PACKED_AVX2, TABLE as AVX2};

mod avx512_entries {
    use super::*;
    const LEVEL: SimdLevel = SimdLevel::Avx512;
    wrappers! {
        f32_ = avx512::dot_f32: (r: &[u8], x: &[f32]);
        f16_ = avx512::dot_f16: (r: &[u8], x: &[f32]);
        bf16_ = avx512::dot_bf16: (r: &[u8], x: &[f32]);
        f_q4_0 = avx512::dot_dequant::<legacy::Q4_0>: (r: &[u8], x: &[f32]);
        f_q4_1 = avx512::dot_dequant::<legacy::Q4_1>: (r: &[u8], x: &[f32]);
        f_q5_0 = avx512::dot_dequant::<legacy::Q5_0>: (r: &[u8], x: &[f32]);
        f_q5_1 = avx512::dot_dequant::<legacy::Q5_1>: (r: &[u8], x: &[f32]);
        f_q8_0 = avx512::dot_dequant::<legacy::Q8_0>: (r: &[u8], x: &[f32]);
        f_q2_k = avx512::dot_dequant::<kquants::Q2_K>: (r: &[u8], x: &[f32]);
        f_q3_k = avx512::dot_dequant::<kquants::Q3_K>: (r: &[u8], x: &[f32]);
        f_q4_k = avx512::dot_dequant::<kquants::Q4_K>: (r: &[u8], x: &[f32]);
        f_q5_k = avx512::dot_dequant::<kquants::Q5_K>: (r: &[u8], x: &[f32]);
        f_q6_k = avx512::dot_dequant::<kquants::Q6_K>: (r: &[u8], x: &[f32]);
        f_q8_k = avx512::dot_dequant::<kquants::Q8_K>: (r: &[u8], x: &[f32]);
        i_q4_0 = avx2::q4_0_vnni: (r: &[u8], x: Q8_0Slice<'_>);
        i_q4_1 = avx2::q4_1_vnni: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_0 = avx512::q5_0: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_1 = avx2::q5_1_vnni: (r: &[u8], x: Q8_0Slice<'_>);
        i_q8_0 = avx512::q8_0: (r: &[u8], x: Q8_0Slice<'_>);
        i_q5_0_packed = avx2::q5_0_packed_vnni: (r: &[u8], x: Q8_0Slice<'_>);
        i_q2_k = avx2::q2_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
        i_q3_k = avx2::q3_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
        i_q4_k = avx2::q4_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
        i_q5_k = avx2::q5_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
        i_q6_k = avx2::q6_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
        i_q8_k = avx2::q8_k_vnni: (r: &[u8], x: Q8KSlice<'_>);
    }
    multi_wrappers! {
        m_q8_0 = avx512::q8_0_multi: Q8_0Slice<'_>;
        m_q5_0_packed = avx2::q5_0_packed_vnni_multi: Q8_0Slice<'_>;
        m_q4_k = avx2::q4_k_vnni_multi: Q8KSlice<'_>;
        m_q6_k = avx2::q6_k_vnni_multi: Q8KSlice<'_>;
    }
    const fn k(
        ty: GgmlType,
        dequantize: fn(&[u8], &mut [f32]),
        dot: fn(&[u8], &[f32]) -> f32,
        dot_q8: Option<Q8Dot>,
    ) -> Kernels {
        Kernels {
            ty,
            level: LEVEL,
            dequantize,
            dot,
            dot_q8,
            dot_q8_multi: None,
            packed: false,
        }
    }

    const fn multi(k: Kernels, m: Q8DotMulti) -> Kernels {
        Kernels {
            dot_q8_multi: Some(m),
            ..k
        }
    }

    use crate::formats::BlockFormat;
    pub(crate) static TABLE: &[Kernels] = &[
        k(GgmlType::F32, float::F32::dequantize_row, f32_, None),
        k(GgmlType::F16, float::F16::dequantize_row, f16_, None),
        k(GgmlType::BF16, float::BF16::dequantize_row, bf16_, None),
        k(
            GgmlType::Q4_0,
            legacy::Q4_0::dequantize_row,
            f_q4_0,
            Some(Q8Dot::Q8_0(i_q4_0)),
        ),
        k(
            GgmlType::Q4_1,
            legacy::Q4_1::dequantize_row,
            f_q4_1,
            Some(Q8Dot::Q8_0(i_q4_1)),
        ),
        k(
            GgmlType::Q5_0,
            legacy::Q5_0::dequantize_row,
            f_q5_0,
            Some(Q8Dot::Q8_0(i_q5_0)),
        ),
        k(
            GgmlType::Q5_1,
            legacy::Q5_1::dequantize_row,
            f_q5_1,
            Some(Q8Dot::Q8_0(i_q5_1)),
        ),
        multi(
            k(
                GgmlType::Q8_0,
                legacy::Q8_0::dequantize_row,
                f_q8_0,
                Some(Q8Dot::Q8_0(i_q8_0)),
            ),
            Q8DotMulti::Q8_0(m_q8_0),
        ),
        k(
            GgmlType::Q2_K,
            kquants::Q2_K::dequantize_row,
            f_q2_k,
            Some(Q8Dot::Q8K(i_q2_k)),
        ),
        k(
            GgmlType::Q3_K,
            kquants::Q3_K::dequantize_row,
            f_q3_k,
            Some(Q8Dot::Q8K(i_q3_k)),
        ),
        multi(
            k(
                GgmlType::Q4_K,
                kquants::Q4_K::dequantize_row,
                f_q4_k,
                Some(Q8Dot::Q8K(i_q4_k)),
            ),
            Q8DotMulti::Q8K(m_q4_k),
        ),
        k(
            GgmlType::Q5_K,
            kquants::Q5_K::dequantize_row,
            f_q5_k,
            Some(Q8Dot::Q8K(i_q5_k)),
        ),
        multi(
            k(
                GgmlType::Q6_K,
                kquants::Q6_K::dequantize_row,
                f_q6_k,
                Some(Q8Dot::Q8K(i_q6_k)),
            ),
            Q8DotMulti::Q8K(m_q6_k),
        ),
        k(
            GgmlType::Q8_K,
            kquants::Q8_K::dequantize_row,
            f_q8_k,
            Some(Q8Dot::Q8K(i_q8_k)),
        ),
    ];

    /// Kernels for rows in the packed layout (`crate::packed`).
    pub(crate) static PACKED: &[Kernels] = &[Kernels {
        ty: GgmlType::Q5_0,
        level: LEVEL,
        dequantize: crate::packed::q5_0_dequantize,
        dot: crate::packed::q5_0_dot,
        dot_q8: Some(Q8Dot::Q8_0(i_q5_0_packed)),
        dot_q8_multi: Some(Q8DotMulti::Q8_0(m_q5_0_packed)),
        packed: true,
    }];
}

pub(crate) use avx512_entries::{PACKED as PACKED_AVX512, TABLE as AVX512};
