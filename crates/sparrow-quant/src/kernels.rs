//! The kernel dispatch: the seam where faster implementations plug in.
//!
//! Everything that computes (the free functions [`crate::dequantize`] / [`crate::dot`] /
//! [`crate::dot_q8`], [`crate::QMatrix`], [`crate::matvec`], [`crate::matmul`]) looks a
//! type's kernels up here once per call and then calls plain function pointers, so the
//! per-row cost of dispatch is one indirect call.
//!
//! There is one table per [`SimdLevel`], built from the format catalogue
//! (`crate::catalogue`) and the level's kernel set: the scalar reference (always present, the oracle
//! the others are tested against), AVX2 (+FMA, F16C), AVX-512 (F, BW, VL, VNNI) and AMX (AVX-512 with the tile unit) on
//! x86_64, NEON and NEON with `sdot` (the `dotprod` extension) on AArch64.
//! [`Kernels::get`] returns the best level this CPU supports, detected once with
//! `is_x86_feature_detected!` / `is_aarch64_feature_detected!` and cached; the
//! `SPARROW_SIMD` environment variable (`scalar`, `avx2`, `avx512`, `amx`, `neon`, `neondot`)
//! caps it, for benchmarking and debugging (a level of another architecture is ignored).
//! [`Kernels::for_level`] reaches a specific level, so tests can force each one.
//!
//! Each table has two dot kernels. `dot` takes f32 activations (the reference
//! semantics). `dot_q8`, the int8-activation kernel, takes the activations quantized once
//! per product to Q8_0 or Q8_K blocks (see [`crate::q8`]) and is what [`crate::matvec`] and
//! [`crate::matmul`] use whenever it exists (every quantized format); its results differ
//! from `dot` by the activation rounding, bounded by [`crate::q8::act_error_bound`].

pub use crate::catalogue::Kernels;
pub use crate::level::SimdLevel;

use crate::catalogue::{Scalar, Tables};
use crate::types::GgmlType;

static SCALAR: Tables = Tables::of::<Scalar>();
#[cfg(target_arch = "x86_64")]
static AVX2: Tables = Tables::of::<crate::x86::Avx2>();
#[cfg(target_arch = "x86_64")]
static AVX512: Tables = Tables::of::<crate::x86::Avx512>();
#[cfg(target_arch = "x86_64")]
static AMX: Tables = Tables::of::<crate::x86::Amx>();
#[cfg(target_arch = "aarch64")]
static NEON: Tables = Tables::of::<crate::aarch64::Neon>();
#[cfg(target_arch = "aarch64")]
static NEON_DOT: Tables = Tables::of::<crate::aarch64::NeonDot>();

/// The tables of `level`, if it is supported here (the check that makes the wrappers
/// around `#[target_feature]` kernels in the tables sound).
fn tables(level: SimdLevel) -> Option<&'static Tables> {
    if !level.is_supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(&AVX2),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => Some(&AVX512),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Amx => Some(&AMX),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => Some(&NEON),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::NeonDot => Some(&NEON_DOT),
        #[allow(unreachable_patterns)]
        _ => None,
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
        tables(level)?.formats.iter().find(|k| k.ty == ty)
    }

    /// The kernels for rows of `ty` in the packed layout (see [`crate::packed`]) at
    /// `level`, or `None` if `ty` has no packed layout or the level is not supported here.
    pub fn packed_for_level(ty: GgmlType, level: SimdLevel) -> Option<&'static Kernels> {
        tables(level)?.packed.iter().find(|k| k.ty == ty)
    }

    /// The scalar reference kernels for `ty`: portable, and bit-exact with ggml's reference
    /// dequantization. Kept separately reachable so faster kernels can be tested against it.
    pub fn scalar(ty: GgmlType) -> Option<&'static Kernels> {
        SCALAR.formats.iter().find(|k| k.ty == ty)
    }
}

/// Defined here rather than beside the type (`crate::types`, the file-format facts every
/// module uses) so that the type stays free of any tie to the kernels.
impl GgmlType {
    /// Whether sparrow has dequantize/dot kernels for this type (see [`crate::kernels`]).
    /// The others can be catalogued and inspected, but computing with them returns
    /// [`crate::QuantError::Unsupported`].
    pub fn has_kernels(self) -> bool {
        Kernels::get(self).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::panel_layout;

    /// Every supported level's tables list the catalogue's formats in its order, stamped
    /// with their level, with an int8 kernel (of the scalar reference's activation type)
    /// exactly where the format has a panel shape.
    #[test]
    fn every_level_follows_the_catalogue() {
        for level in SimdLevel::supported() {
            let t = tables(level).expect("supported");
            assert_eq!(t.formats.len(), SCALAR.formats.len());
            for (k, s) in t
                .formats
                .iter()
                .zip(&SCALAR.formats)
                .chain(t.packed.iter().zip(&SCALAR.packed))
            {
                assert_eq!((k.ty, k.level, k.packed), (s.ty, level, s.packed));
                let act = |k: &Kernels| k.dot_q8.map(|q| q.act_type());
                assert_eq!(act(k), act(s), "{} {}", k.ty, level.name());
                assert_eq!(k.dot_q8.is_some(), panel_layout(k.ty).is_some(), "{}", k.ty);
            }
        }
    }
}
