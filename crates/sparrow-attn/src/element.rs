//! Storage element types for keys and values: `f32`, and `half::f16` with feature `fp16`.

use crate::kernel::KvRows;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    #[cfg(feature = "fp16")]
    impl Sealed for half::f16 {}
}

/// A type keys and values can be stored as. Sealed: implemented for `f32` and (feature
/// `fp16`) `half::f16`. Queries, landmark means and outputs are always `f32`.
pub trait KvElement:
    Copy + Default + Send + Sync + core::fmt::Debug + 'static + sealed::Sealed
{
    /// Short name used in benchmarks and messages.
    const NAME: &'static str;
    /// Round an `f32` to this type.
    fn from_f32(x: f32) -> Self;
    /// Widen to `f32`.
    fn to_f32(self) -> f32;
    /// Rows of this type as the kernel reads them.
    #[doc(hidden)]
    fn rows(x: &[Self]) -> KvRows<'_>;
    /// `dst[i] = from_f32(src[i])`, vectorised where the type allows.
    #[doc(hidden)]
    fn store(dst: &mut [Self], src: &[f32]);
}

impl KvElement for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn rows(x: &[Self]) -> KvRows<'_> {
        KvRows::F32(x)
    }
    fn store(dst: &mut [Self], src: &[f32]) {
        dst.copy_from_slice(src)
    }
}

#[cfg(feature = "fp16")]
impl KvElement for half::f16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn rows(x: &[Self]) -> KvRows<'_> {
        KvRows::F16(x)
    }
    fn store(dst: &mut [Self], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src)
    }
}
