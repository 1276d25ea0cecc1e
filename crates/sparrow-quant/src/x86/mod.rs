//! x86_64 SIMD kernels, selected at run time.
//!
//! [`avx2`] needs AVX2 + FMA + F16C (Haswell and later); `avx512` needs AVX-512
//! F/BW/VL + VNNI (its intrinsics are stable since Rust 1.89, the workspace's minimum).
//! Each level is a [`KernelSet`]: the kernels it has, format by format, each
//! `#[target_feature]` function wrapped in a plain `fn` by [`checked!`]. Their tables are
//! only handed out by [`crate::kernels::Kernels::for_level`] after
//! [`SimdLevel::is_supported`] confirmed the features, which is what makes the wrappers
//! sound.

pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod gemm;
pub(crate) mod row_groups;

use crate::catalogue::{int8, Int8, KernelSet, RowDot};
use crate::entry_points::checked;
use crate::formats::BlockFormat;
use crate::level::SimdLevel;
use crate::q8::{Q8KSlice, Q8_0Slice};

/// The AVX2 (+FMA, F16C) kernels.
pub(crate) struct Avx2;

impl KernelSet for Avx2 {
    const LEVEL: SimdLevel = SimdLevel::Avx2;
    const F32: RowDot = checked!(avx2::dot_f32: &[f32]);
    const F16: RowDot = checked!(avx2::dot_f16: &[f32]);
    const BF16: RowDot = checked!(avx2::dot_bf16: &[f32]);
    const Q4_0: int8::Q8_0 = Int8::new(checked!(avx2::q4_0: Q8_0Slice<'_>));
    const Q4_1: int8::Q8_0 = Int8::new(checked!(avx2::q4_1: Q8_0Slice<'_>));
    const Q5_0: int8::Q8_0 = Int8::new(checked!(avx2::q5_0: Q8_0Slice<'_>));
    const Q5_1: int8::Q8_0 = Int8::new(checked!(avx2::q5_1: Q8_0Slice<'_>));
    const Q8_0: int8::Q8_0 = Int8::multi(
        checked!(avx2::q8_0: Q8_0Slice<'_>),
        checked!(multi avx2::q8_0_multi: Q8_0Slice<'_>),
    );
    const Q2_K: int8::Q8K = Int8::new(checked!(avx2::q2_k: Q8KSlice<'_>));
    const Q3_K: int8::Q8K = Int8::new(checked!(avx2::q3_k: Q8KSlice<'_>));
    const Q4_K: int8::Q8K = Int8::multi(
        checked!(avx2::q4_k: Q8KSlice<'_>),
        checked!(multi avx2::q4_k_multi: Q8KSlice<'_>),
    );
    const Q5_K: int8::Q8K = Int8::new(checked!(avx2::q5_k: Q8KSlice<'_>));
    const Q6_K: int8::Q8K = Int8::multi(
        checked!(avx2::q6_k: Q8KSlice<'_>),
        checked!(multi avx2::q6_k_multi: Q8KSlice<'_>),
    );
    const Q8_K: int8::Q8K = Int8::new(checked!(avx2::q8_k: Q8KSlice<'_>));
    const Q5_0_PACKED: int8::Q8_0 = Int8::multi(
        checked!(avx2::q5_0_packed: Q8_0Slice<'_>),
        checked!(multi avx2::q5_0_packed_multi: Q8_0Slice<'_>),
    );

    fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: as in `checked!`: reachable only through this level's table, handed out
        // after the CPU was checked for AVX2, FMA and F16C.
        unsafe { avx2::dot_dequant::<F>(row, x) }
    }
}

/// The AVX-512 (F/BW/VL + VNNI) kernels: AVX-512 bodies where they pay, else the AVX2
/// bodies compiled with VNNI (their `*_vnni` entry points). Q4_K's and Q6_K's single-token
/// kernels are the 256-bit ones (decode reads weights, it does not wait on products), their
/// multi-token kernels 512-bit with the same bits.
pub(crate) type Avx512 = Avx512Set<false>;

/// The AMX level: the AVX-512 kernels, except Q4_K and Q6_K, whose kernels sum in block
/// totals (`avx512::q4_k_totals`, `q6_k_totals`) so that their rows kernels in the tiles
/// (`amx::q4_k_rows`, `q6_k_rows`) give the same bits.
pub(crate) type Amx = Avx512Set<true>;

/// The AVX-512 kernel set, with (`AMX`) or without the tile unit.
pub(crate) struct Avx512Set<const AMX: bool>;

impl<const AMX: bool> KernelSet for Avx512Set<AMX> {
    const LEVEL: SimdLevel = if AMX {
        SimdLevel::Amx
    } else {
        SimdLevel::Avx512
    };
    const F32: RowDot = checked!(avx512::dot_f32: &[f32]);
    const F16: RowDot = checked!(avx512::dot_f16: &[f32]);
    const BF16: RowDot = checked!(avx512::dot_bf16: &[f32]);
    const Q4_0: int8::Q8_0 = Int8::new(checked!(avx2::q4_0_vnni: Q8_0Slice<'_>));
    const Q4_1: int8::Q8_0 = Int8::new(checked!(avx2::q4_1_vnni: Q8_0Slice<'_>));
    const Q5_0: int8::Q8_0 = int8::Q8_0::new(checked!(avx512::q5_0: Q8_0Slice<'_>))
        .with_groups(checked!(groups row_groups::q5_0_group: Q8_0Slice<'_>));
    const Q5_1: int8::Q8_0 = Int8::new(checked!(avx2::q5_1_vnni: Q8_0Slice<'_>));
    const Q8_0: int8::Q8_0 = Int8::multi(
        checked!(avx512::q8_0: Q8_0Slice<'_>),
        checked!(multi avx512::q8_0_multi: Q8_0Slice<'_>),
    );
    const Q2_K: int8::Q8K = Int8::new(checked!(avx2::q2_k_vnni: Q8KSlice<'_>));
    const Q3_K: int8::Q8K = Int8::new(checked!(avx2::q3_k_vnni: Q8KSlice<'_>));
    const Q4_K: int8::Q8K = if AMX {
        int8::Q8K::multi(
            checked!(avx512::q4_k_totals: Q8KSlice<'_>),
            checked!(multi avx512::q4_k_totals_multi: Q8KSlice<'_>),
        )
        .with_rows(checked!(rows amx::q4_k_rows))
    } else {
        int8::Q8K::multi(
            checked!(avx512::q4_k_totals: Q8KSlice<'_>),
            checked!(multi avx512::q4_k_totals_multi: Q8KSlice<'_>),
        )
        .with_groups(checked!(groups row_groups::q4_k_group: Q8KSlice<'_>))
    };
    const Q5_K: int8::Q8K = Int8::new(checked!(avx2::q5_k_vnni: Q8KSlice<'_>));
    const Q6_K: int8::Q8K = if AMX {
        int8::Q8K::multi(
            checked!(avx512::q6_k_totals: Q8KSlice<'_>),
            checked!(multi avx512::q6_k_totals_multi: Q8KSlice<'_>),
        )
        .with_rows(checked!(rows amx::q6_k_rows))
    } else {
        int8::Q8K::multi(
            checked!(avx512::q6_k_totals: Q8KSlice<'_>),
            checked!(multi avx512::q6_k_totals_multi: Q8KSlice<'_>),
        )
        .with_groups(checked!(groups row_groups::q6_k_group: Q8KSlice<'_>))
    };
    const Q8_K: int8::Q8K = Int8::new(checked!(avx2::q8_k_vnni: Q8KSlice<'_>));
    const Q5_0_PACKED: int8::Q8_0 = Int8::multi(
        checked!(avx2::q5_0_packed_vnni: Q8_0Slice<'_>),
        checked!(multi avx2::q5_0_packed_vnni_multi: Q8_0Slice<'_>),
    );

    fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: as in `checked!`: reachable only through this level's table, handed out
        // after the CPU was checked for AVX-512 F/BW/VL/VNNI (and AVX2's features).
        unsafe { avx512::dot_dequant::<F>(row, x) }
    }
}
