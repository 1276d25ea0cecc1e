//! The kernel dispatch table: the seam where faster implementations plug in.
//!
//! Everything that computes (the free functions [`crate::dequantize`] / [`crate::dot`] /
//! [`crate::dot_q8`], [`crate::QMatrix`], [`crate::matvec`], [`crate::matmul`]) looks a
//! type's kernels up here once per call and then calls plain function pointers, so the
//! per-row cost of dispatch is one indirect call.
//!
//! There is one table per [`SimdLevel`]: the scalar reference (always present, the oracle
//! the others are tested against), AVX2 (+FMA, F16C) and AVX-512 (F, BW, VL, VNNI) on
//! x86_64, NEON and NEON with `sdot` (the `dotprod` extension) on AArch64.
//! [`Kernels::get`] returns the best level this CPU supports, detected once with
//! `is_x86_feature_detected!` / `is_aarch64_feature_detected!` and cached; the
//! `SPARROW_SIMD` environment variable (`scalar`, `avx2`, `avx512`, `neon`, `neondot`)
//! caps it, for benchmarking and debugging (a level of another architecture is ignored).
//! [`Kernels::for_level`] reaches a specific level, so tests can force each one.
//!
//! Each table has two dot kernels. `dot` takes f32 activations (the reference
//! semantics). `dot_q8`, the int8-activation kernel, takes the activations quantized once
//! per product to Q8_0 or Q8_K blocks (see [`crate::q8`]) and is what [`crate::matvec`] and
//! [`crate::matmul`] use whenever it exists (every quantized format); its results differ
//! from `dot` by the activation rounding, bounded by [`crate::q8::act_error_bound`].

use std::sync::OnceLock;

use crate::formats::{float, kquants, legacy, BlockFormat};
use crate::q8::{self, Q8Dot, Q8DotMulti};
use crate::{packed, GgmlType};

/// An instruction-set level with its own kernel table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable scalar reference code.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX-512 F/BW/VL with VNNI (plus everything AVX2 needs).
    Avx512,
    /// AArch64 Advanced SIMD (NEON), which every AArch64 CPU has.
    Neon,
    /// AArch64 NEON plus `sdot` (the `dotprod` extension, Armv8.2+).
    NeonDot,
}

impl SimdLevel {
    /// Every level, lowest first within each architecture.
    pub const ALL: [SimdLevel; 5] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Neon,
        SimdLevel::NeonDot,
    ];

    /// Lower-case name (`scalar`, `avx2`, `avx512`, `neon`, `neondot`), as accepted by
    /// `SPARROW_SIMD`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
            SimdLevel::NeonDot => "neondot",
        }
    }

    /// Whether this level's kernels are compiled in and the CPU can run them.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => crate::x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => crate::x86::has_avx512(),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => true,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::NeonDot => crate::aarch64::has_dotprod(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether this level belongs to the architecture compiled for (scalar always does).
    fn is_native(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            SimdLevel::Avx2 | SimdLevel::Avx512 => cfg!(target_arch = "x86_64"),
            SimdLevel::Neon | SimdLevel::NeonDot => cfg!(target_arch = "aarch64"),
        }
    }

    /// The levels usable here, lowest first (always starts with `Scalar`).
    pub fn supported() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.is_supported()).collect()
    }

    /// The level [`Kernels::get`] uses: the best supported one, capped by `SPARROW_SIMD` if
    /// set (to the best supported level at or below it; a name that is unknown or belongs
    /// to another architecture is ignored). Detected once per process.
    pub fn active() -> SimdLevel {
        static ACTIVE: OnceLock<SimdLevel> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let cap = std::env::var("SPARROW_SIMD").ok().and_then(|v| {
                Self::ALL
                    .into_iter()
                    .find(|l| l.name() == v.trim() && l.is_native())
            });
            Self::supported()
                .into_iter()
                .rfind(|&l| cap.is_none_or(|c| l <= c))
                .unwrap_or(SimdLevel::Scalar)
        })
    }
}

/// The kernels of one block format at one [`SimdLevel`].
///
/// The functions require slices already validated by the caller: `bytes` a whole number
/// of blocks, and `out`/`x` exactly the matching element count. They may panic otherwise
/// (never read out of bounds); the crate's public functions never pass them anything else.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    /// The format these kernels decode.
    pub ty: GgmlType,
    /// The instruction set they use.
    pub level: SimdLevel,
    /// Dequantize whole blocks into `out`.
    pub dequantize: fn(bytes: &[u8], out: &mut [f32]),
    /// Fused dequant-dot of whole blocks with f32 activations `x`.
    pub dot: fn(bytes: &[u8], x: &[f32]) -> f32,
    /// Dot of whole blocks with int8-quantized activations, if this format has one.
    pub dot_q8: Option<Q8Dot>,
    /// The multi-token form of `dot_q8` (one weight row against several tokens, each
    /// block unpacked once; bit-identical to `dot_q8` per token), where this level has one.
    /// [`crate::matmul`] uses it for batches below the panel threshold.
    pub dot_q8_multi: Option<Q8DotMulti>,
    /// Whether these kernels read rows in sparrow's packed layout (see [`crate::packed`])
    /// rather than ggml's.
    pub packed: bool,
}

const fn table_of<F: BlockFormat>() -> Kernels {
    Kernels {
        ty: F::TYPE,
        level: SimdLevel::Scalar,
        dequantize: F::dequantize_row,
        dot: F::dot_row,
        dot_q8: None,
        dot_q8_multi: None,
        packed: false,
    }
}

const fn with_q8(k: Kernels, q: Q8Dot) -> Kernels {
    Kernels {
        dot_q8: Some(q),
        ..k
    }
}

static SCALAR: &[Kernels] = &[
    table_of::<float::F32>(),
    table_of::<float::F16>(),
    table_of::<float::BF16>(),
    with_q8(table_of::<legacy::Q4_0>(), Q8Dot::Q8_0(q8::q4_0)),
    with_q8(table_of::<legacy::Q4_1>(), Q8Dot::Q8_0(q8::q4_1)),
    with_q8(table_of::<legacy::Q5_0>(), Q8Dot::Q8_0(q8::q5_0)),
    with_q8(table_of::<legacy::Q5_1>(), Q8Dot::Q8_0(q8::q5_1)),
    with_q8(table_of::<legacy::Q8_0>(), Q8Dot::Q8_0(q8::q8_0)),
    with_q8(table_of::<kquants::Q2_K>(), Q8Dot::Q8K(q8::q2_k)),
    with_q8(table_of::<kquants::Q3_K>(), Q8Dot::Q8K(q8::q3_k)),
    with_q8(table_of::<kquants::Q4_K>(), Q8Dot::Q8K(q8::q4_k)),
    with_q8(table_of::<kquants::Q5_K>(), Q8Dot::Q8K(q8::q5_k)),
    with_q8(table_of::<kquants::Q6_K>(), Q8Dot::Q8K(q8::q6_k)),
    with_q8(table_of::<kquants::Q8_K>(), Q8Dot::Q8K(q8::q8_k)),
];

/// Scalar kernels for packed rows (the reference the SIMD ones are tested against).
static PACKED_SCALAR: &[Kernels] = &[Kernels {
    ty: GgmlType::Q5_0,
    level: SimdLevel::Scalar,
    dequantize: packed::q5_0_dequantize,
    dot: packed::q5_0_dot,
    dot_q8: Some(Q8Dot::Q8_0(packed::q5_0_dot_q8)),
    dot_q8_multi: None,
    packed: true,
}];

fn packed_table(level: SimdLevel) -> &'static [Kernels] {
    match level {
        SimdLevel::Scalar => PACKED_SCALAR,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => crate::x86::PACKED_AVX2,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => crate::x86::PACKED_AVX512,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => crate::aarch64::PACKED_NEON,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::NeonDot => crate::aarch64::PACKED_NEON_DOT,
        #[allow(unreachable_patterns)]
        _ => &[],
    }
}

fn table(level: SimdLevel) -> &'static [Kernels] {
    match level {
        SimdLevel::Scalar => SCALAR,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => crate::x86::AVX2,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => crate::x86::AVX512,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => crate::aarch64::NEON,
        #[cfg(target_arch = "aarch64")]
        SimdLevel::NeonDot => crate::aarch64::NEON_DOT,
        #[allow(unreachable_patterns)]
        _ => &[],
    }
}

impl Kernels {
    /// The kernels for `ty` at the active level (see [`SimdLevel::active`]), or `None` if
    /// sparrow has none for this type.
    pub fn get(ty: GgmlType) -> Option<&'static Kernels> {
        Self::for_level(ty, SimdLevel::active())
    }

    /// The kernels for `ty` at `level`, or `None` if the type has none or the level is not
    /// supported on this machine (see [`SimdLevel::is_supported`]).
    pub fn for_level(ty: GgmlType, level: SimdLevel) -> Option<&'static Kernels> {
        if !level.is_supported() {
            return None;
        }
        table(level).iter().find(|k| k.ty == ty)
    }

    /// The kernels for rows of `ty` in the packed layout (see [`crate::packed`]) at
    /// `level`, or `None` if `ty` has no packed layout or the level is not supported here.
    pub fn packed_for_level(ty: GgmlType, level: SimdLevel) -> Option<&'static Kernels> {
        if !level.is_supported() {
            return None;
        }
        packed_table(level).iter().find(|k| k.ty == ty)
    }

    /// The scalar reference kernels for `ty`: portable, and bit-exact with ggml's reference
    /// dequantization. Kept separately reachable so faster kernels can be tested against it.
    pub fn scalar(ty: GgmlType) -> Option<&'static Kernels> {
        SCALAR.iter().find(|k| k.ty == ty)
    }
}
