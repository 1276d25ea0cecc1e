//! The instruction-set levels kernels are written for, and which of them this CPU runs.
//!
//! This sits below both the kernel tables of each architecture (which stamp their entries
//! with their level) and the dispatch in [`crate::kernels`] (which picks a level), so the
//! CPU checks live here rather than in the architecture folders: then the dispatch never
//! has to reach back into them for anything but their kernels.

use std::sync::OnceLock;

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

    /// Whether this level's kernels are compiled in and the CPU can run them. The kernel
    /// tables of a level are only handed out after this said yes, which is what makes
    /// their plain-`fn` wrappers around `#[target_feature]` kernels sound.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => true,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::NeonDot => std::arch::is_aarch64_feature_detected!("dotprod"),
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

    /// The level [`crate::Kernels::get`] uses: the best supported one, capped by
    /// `SPARROW_SIMD` if set (to the best supported level at or below it; a name that is
    /// unknown or belongs to another architecture is ignored). Detected once per process.
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
