//! The instruction set the attention kernels run at: detected once per process, capped by
//! the `SPARROW_SIMD` environment variable (`scalar`, `avx2`, `avx512`, `neon`, `neondot`),
//! the same variable and names the engine's weight kernels honour, so one setting forces
//! the whole engine down to a level (for tests and benchmarks).

use std::sync::OnceLock;

/// Instruction set of the attention kernels. There is no AVX-512 twin: the tile kernels are
/// bound by the f16 loads and the `exp`, where 512-bit vectors measured no gain, so an
/// AVX-512 CPU runs the AVX2 kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Portable Rust; the reference every other level is tested against.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AArch64 NEON (always present there; `sdot` has nothing to add to float kernels).
    Neon,
}

impl Level {
    /// The levels usable on this CPU, lowest first.
    pub fn supported() -> Vec<Level> {
        let mut v = vec![Level::Scalar];
        if avx2_available() {
            v.push(Level::Avx2);
        }
        if cfg!(target_arch = "aarch64") {
            v.push(Level::Neon);
        }
        v
    }

    /// The best supported level, capped by `SPARROW_SIMD` (`scalar` → scalar; the other
    /// names leave the best level on; an unknown value is ignored); detected once.
    pub fn active() -> Level {
        static ACTIVE: OnceLock<Level> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let best = *Self::supported().last().unwrap_or(&Level::Scalar);
            match std::env::var("SPARROW_SIMD").as_deref().map(str::trim) {
                Ok("scalar") => Level::Scalar,
                _ => best,
            }
        })
    }

    /// Lower-case name (`scalar`, `avx2`, `neon`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Neon => "neon",
        }
    }

    /// Whether this level's kernels may run on this CPU (callers fall back to scalar).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn usable(self) -> bool {
        match self {
            Level::Scalar => true,
            Level::Avx2 => avx2_available(),
            Level::Neon => cfg!(target_arch = "aarch64"),
        }
    }
}

/// Whether the AVX2 kernels may use AVX-512 VNNI's byte products (`vpdpbusd` on 256-bit
/// registers: AVX-512 VL + VNNI): the CPU has them and `SPARROW_SIMD` does not cap the
/// engine at `avx2` (or `scalar`), as it caps the weight kernels. Only the 8-bit scoring
/// kernels use them, with the same bits as without.
pub fn vnni_available() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        let capped = matches!(
            std::env::var("SPARROW_SIMD").as_deref().map(str::trim),
            Ok("scalar") | Ok("avx2")
        );
        !capped && avx512_vnni_present()
    })
}

#[cfg(target_arch = "x86_64")]
fn avx512_vnni_present() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_vnni_present() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}
