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
    /// x86_64 AVX-512 (as above, plus VBMI) with the AMX-INT8 tile unit (Sapphire Rapids
    /// and later), once the OS has granted this process the tile state. The AVX-512
    /// kernels, except that a pass of several tokens multiplies Q4_K and Q6_K rows sixteen
    /// at a time in the tiles (see `crate::x86::amx`), and their one-token kernels sum in the
    /// order the tiles can reproduce.
    Amx,
    /// AArch64 Advanced SIMD (NEON), which every AArch64 CPU has.
    Neon,
    /// AArch64 NEON plus `sdot` (the `dotprod` extension, Armv8.2+).
    NeonDot,
}

impl SimdLevel {
    /// Every level, lowest first within each architecture.
    pub const ALL: [SimdLevel; 6] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Amx,
        SimdLevel::Neon,
        SimdLevel::NeonDot,
    ];

    /// Lower-case name (`scalar`, `avx2`, `avx512`, `amx`, `neon`, `neondot`), as accepted
    /// by `SPARROW_SIMD`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Amx => "amx",
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
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Amx => {
                SimdLevel::Avx512.is_supported()
                    && is_x86_feature_detected!("avx512vbmi")
                    && amx::tiles_granted()
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
            SimdLevel::Avx2 | SimdLevel::Avx512 | SimdLevel::Amx => {
                cfg!(target_arch = "x86_64")
            }
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

/// The AMX-INT8 check: the CPU has the tile unit and its int8 products, and the OS (Linux,
/// which hands the tile state out per process on request) grants it.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::sync::OnceLock;

    /// `XFEATURE_XTILEDATA`, the state component of the tile registers (Linux's
    /// `arch/x86/include/asm/fpu/types.h`).
    const XTILEDATA: u64 = 18;
    /// `ARCH_REQ_XCOMP_PERM` (Linux's `arch/x86/include/uapi/asm/prctl.h`).
    const ARCH_REQ_XCOMP_PERM: i32 = 0x1023;

    /// Whether this process may use the AMX-INT8 tiles: CPUID leaf 7 reports AMX-TILE and
    /// AMX-INT8, XCR0 enables the tile state, and Linux grants the permission (asked once;
    /// the answer holds for every thread of the process).
    pub(super) fn tiles_granted() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| cpu_has_amx_int8() && os_grants_tiles())
    }

    fn cpu_has_amx_int8() -> bool {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        let (tile, int8) = (edx >> 24 & 1 == 1, edx >> 25 & 1 == 1);
        // OSXSAVE (leaf 1, ECX bit 27): XGETBV may be executed.
        let osxsave = __cpuid(1).ecx >> 27 & 1 == 1;
        tile && int8 && osxsave && xcr0() & 0b11 << 17 == 0b11 << 17
    }

    #[target_feature(enable = "xsave")]
    fn xcr0_with_xsave() -> u64 {
        // SAFETY: `xgetbv` with ECX = 0 reads XCR0; it faults only without OSXSAVE, which
        // the caller checked.
        unsafe { std::arch::x86_64::_xgetbv(0) }
    }

    fn xcr0() -> u64 {
        // SAFETY: the caller checked OSXSAVE, which implies the XSAVE feature.
        unsafe { xcr0_with_xsave() }
    }

    #[cfg(target_os = "linux")]
    fn os_grants_tiles() -> bool {
        // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)` takes two integers and
        // touches no memory of ours; it returns 0 when the permission is granted.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA) };
        rc == 0
    }

    #[cfg(not(target_os = "linux"))]
    fn os_grants_tiles() -> bool {
        false
    }
}
