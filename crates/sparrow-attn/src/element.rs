//! Storage element types for keys and values: `f32`, and `half::f16` with feature `fp16`.

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    #[cfg(feature = "fp16")]
    impl Sealed for half::f16 {}
}

/// Which concrete type a [`KvElement`] is; lets the SIMD kernels pick their load instruction.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemKind {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
}

/// A type keys and values can be stored as. Sealed: implemented for `f32` and (feature
/// `fp16`) `half::f16`. Queries, landmark means and outputs are always `f32`.
pub trait KvElement:
    Copy + Default + Send + Sync + core::fmt::Debug + 'static + sealed::Sealed
{
    /// Short name used in benchmarks and messages.
    const NAME: &'static str;
    #[doc(hidden)]
    const KIND: ElemKind;
    /// Round an `f32` to this type.
    fn from_f32(x: f32) -> Self;
    /// Widen to `f32`.
    fn to_f32(self) -> f32;
}

impl KvElement for f32 {
    const NAME: &'static str = "f32";
    const KIND: ElemKind = ElemKind::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

#[cfg(feature = "fp16")]
impl KvElement for half::f16 {
    const NAME: &'static str = "f16";
    const KIND: ElemKind = ElemKind::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}
