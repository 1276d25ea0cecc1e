//! The kernel catalogue: every block format sparrow computes with, named once.
//!
//! (Of the ggml types, [`GgmlType`], only these have kernels.)
//!
//! The one invocation of [`catalogue!`] at the bottom of this file lists the formats, one
//! line each: its [`GgmlType`] name, its scalar reference type (in [`crate::formats`]) and,
//! for a quantized format, the activation type of its int8 kernel with that kernel's
//! scalar reference (in [`crate::q8`]) and the shape of its integers in a GEMM panel (see
//! [`crate::gemm`]). From that list the macro writes
//!
//! * [`KernelSet`], the trait a SIMD level implements to supply its kernels: one item per
//!   format, each defaulting to the scalar reference, so a level overrides only the kernels
//!   it has and falls back to scalar for the rest;
//! * [`Tables::of`], which turns any [`KernelSet`] into the level's dispatch table (and
//!   the table of packed rows), so no level lists the formats again;
//! * [`panel_layout`], the panel shape of each format for the batched product.
//!
//! This module sits below both the dispatch ([`crate::kernels`]) and the architecture
//! folders (which implement [`KernelSet`]), so imports only run downwards: dispatch →
//! architecture → catalogue.

use crate::formats::{float, kquants, legacy, BlockFormat};
use crate::level::SimdLevel;
use crate::packed;
use crate::panel::Layout;
use crate::q8::{self, Q8Dot, Q8DotMulti};
use crate::q8_tiles::Q8KRows;
use crate::row_groups::GroupDot;
use crate::types::GgmlType;

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
    /// The rows form of `dot_q8` (many weight rows against up to sixteen tokens in a
    /// matrix unit; bit-identical to `dot_q8` per row and token), where this level has one
    /// (AMX, Q8_K formats). [`crate::matmul`] prefers it to `dot_q8_multi`.
    pub dot_q8_rows: Option<Q8KRows>,
    /// The row-group form of `dot_q8` (16 rows of a matrix in [`crate::row_groups`]' layout
    /// against any number of tokens, 16 rows in the lanes; bit-identical per row and token
    /// to `dot_q8` for the k-quants, to the scalar level's `dot_q8` for Q5_0), where this
    /// level has one. A matrix is stored in row groups only where
    /// the active level has this kernel.
    pub dot_q8_groups: Option<GroupDot>,
    /// Whether these kernels read rows in sparrow's packed layout (see [`crate::packed`])
    /// rather than ggml's.
    pub packed: bool,
}

/// A dot of whole blocks with f32 activations (the type of [`Kernels::dot`]).
pub(crate) type RowDot = fn(&[u8], &[f32]) -> f32;

/// A level's int8 kernel of one format, and its multi-token form if the level has one.
/// The activation type is in the type (see [`int8`]), so a level cannot hand a Q8_K kernel
/// to a Q8_0 format.
#[derive(Clone, Copy)]
pub(crate) struct Int8<D, M, G> {
    pub(crate) dot: D,
    pub(crate) multi: Option<M>,
    pub(crate) rows: Option<Q8KRows>,
    pub(crate) groups: Option<G>,
}

impl<D: Copy, M: Copy, G: Copy> Int8<D, M, G> {
    /// A single-token kernel; batches below the panel threshold call it once per token.
    pub(crate) const fn new(dot: D) -> Self {
        Int8 {
            dot,
            multi: None,
            rows: None,
            groups: None,
        }
    }

    /// A single-token kernel and its multi-token form (see [`Kernels::dot_q8_multi`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has them so far
    pub(crate) const fn multi(dot: D, multi: M) -> Self {
        Int8 {
            dot,
            multi: Some(multi),
            rows: None,
            groups: None,
        }
    }

    /// These kernels plus a rows form (see [`Kernels::dot_q8_rows`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only AMX has them so far
    pub(crate) const fn with_rows(self, rows: Q8KRows) -> Self {
        Int8 {
            rows: Some(rows),
            ..self
        }
    }

    /// These kernels plus a row-group form (see [`Kernels::dot_q8_groups`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only AVX-512 has one so far
    pub(crate) const fn with_groups(self, groups: G) -> Self {
        Int8 {
            groups: Some(groups),
            ..self
        }
    }
}

/// [`Int8`] by activation type, named as the variants of [`Q8Dot`] so that the
/// catalogue's activation column picks both.
pub(crate) mod int8 {
    use crate::q8::{Q8KSlice, Q8_0Slice};

    /// Kernels of a legacy format, on Q8_0 activations.
    pub(crate) type Q8_0 = super::Int8<
        fn(&[u8], Q8_0Slice<'_>) -> f32,
        fn(&[u8], &[Q8_0Slice<'_>], &mut [f32]),
        crate::row_groups::Q8_0Groups,
    >;
    /// Kernels of a k-quant, on Q8_K activations.
    pub(crate) type Q8K = super::Int8<
        fn(&[u8], Q8KSlice<'_>) -> f32,
        fn(&[u8], &[Q8KSlice<'_>], &mut [f32]),
        crate::row_groups::Q8KGroups,
    >;
}

/// The scalar reference level: the catalogue's defaults, overriding nothing.
pub(crate) struct Scalar;

impl KernelSet for Scalar {
    const LEVEL: SimdLevel = SimdLevel::Scalar;
}

/// One level's dispatch tables: ggml-layout rows of every format, and packed rows.
pub(crate) struct Tables {
    /// One entry per format of the catalogue, in its order.
    pub(crate) formats: [Kernels; FORMATS],
    /// One entry per packed layout (see [`crate::packed`]).
    pub(crate) packed: [Kernels; PACKED],
}

/// The panel shape of a quantized format whose int8 kernel takes activations like
/// `scalar`, with one weight scale per `group` elements (see [`Layout`]).
const fn panel(scalar: Q8Dot, group: usize, mins: bool, off: u8, qmax: u8) -> Layout {
    let legacy = matches!(scalar, Q8Dot::Q8_0(_));
    Layout {
        g: group,
        mins,
        legacy,
        off,
        qmax,
    }
}

/// Writes [`KernelSet`], [`Tables::of`] and [`panel_layout`] from the list of formats
/// (see the module docs; invoked once, below).
macro_rules! catalogue {
    (
        floats { $($f:ident = $ffmt:ty;)* }
        quants {
            $($q:ident = $qfmt:ty, $act:ident($scalar:path),
                panel(group $group:literal, mins $mins:literal, off $off:literal,
                    qmax $qmax:literal);)*
        }
        packed {
            $($p:ident = $pty:ident, $pdeq:path, $pdot:path, $pact:ident($pscalar:path);)*
        }
    ) => {
        /// The kernels of one SIMD level, one item per format of the catalogue, each
        /// defaulting to the scalar reference. A level implements it once and gets its
        /// dispatch table from [`Tables::of`].
        pub(crate) trait KernelSet {
            /// The level the table entries are stamped with.
            const LEVEL: SimdLevel;
            $(
                #[doc = concat!("The f32 dot of ", stringify!($f), " rows.")]
                const $f: RowDot = <$ffmt as BlockFormat>::dot_row;
            )*
            $(
                #[doc = concat!("The int8 kernels of ", stringify!($q), ".")]
                const $q: int8::$act = Int8::new($scalar);
            )*
            $(
                #[doc = concat!("The int8 kernels of packed ", stringify!($pty), " rows.")]
                const $p: int8::$pact = Int8::new($pscalar);
            )*

            /// The f32 dot of a quantized format `F` (each level has one generic body).
            fn dot_dequant<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
                F::dot_row(row, x)
            }
        }

        /// Formats in the catalogue.
        pub(crate) const FORMATS: usize = [$(stringify!($f),)* $(stringify!($q),)*].len();
        /// Packed layouts in the catalogue.
        pub(crate) const PACKED: usize = [$(stringify!($p),)*].len();

        impl Tables {
            /// The tables of the level `K`.
            pub(crate) const fn of<K: KernelSet>() -> Tables {
                Tables {
                    formats: [
                        $(Kernels {
                            ty: GgmlType::$f,
                            level: K::LEVEL,
                            dequantize: <$ffmt as BlockFormat>::dequantize_row,
                            dot: K::$f,
                            dot_q8: None,
                            dot_q8_multi: None,
                            dot_q8_rows: None,
                            dot_q8_groups: None,
                            packed: false,
                        },)*
                        $(catalogue!(@int8 $q, K::LEVEL, false,
                            <$qfmt as BlockFormat>::dequantize_row,
                            K::dot_dequant::<$qfmt>,
                            $act(K::$q)),)*
                    ],
                    packed: [
                        $(catalogue!(@int8 $pty, K::LEVEL, true, $pdeq, $pdot, $pact(K::$p)),)*
                    ],
                }
            }
        }

        /// The panel shape of `ty` for the batched product, if it has one (every
        /// quantized format does).
        pub(crate) fn panel_layout(ty: GgmlType) -> Option<Layout> {
            match ty {
                $(GgmlType::$q => Some(panel(Q8Dot::$act($scalar), $group, $mins, $off, $qmax)),)*
                _ => None,
            }
        }
    };
    // The table entry of a format (or packed layout) with int8 kernels `$int8` on `$act`
    // activations.
    (@int8 $ty:ident, $level:expr, $packed:literal, $dequantize:expr, $dot:expr,
        $act:ident($int8:expr)) => {
        Kernels {
            ty: GgmlType::$ty,
            level: $level,
            dequantize: $dequantize,
            dot: $dot,
            dot_q8: Some(Q8Dot::$act($int8.dot)),
            dot_q8_multi: match $int8.multi {
                Some(m) => Some(Q8DotMulti::$act(m)),
                None => None,
            },
            dot_q8_rows: $int8.rows,
            dot_q8_groups: match $int8.groups {
                Some(g) => Some(GroupDot::$act(g)),
                None => None,
            },
            packed: $packed,
        }
    };
}

// The formats, once. A quantized format's panel shape: the elements sharing one weight
// scale (a legacy block; a k-quant's sub-block, 16 or 32 elements), whether its weights have
// a minimum (`w = d * s + m`), and the range `-off ..= qmax - off` of its integers `s` (as
// `q8::legacy_ints` and `q8::k_ints` decode them).
catalogue! {
    floats {
        F32 = float::F32;
        F16 = float::F16;
        BF16 = float::BF16;
    }
    quants {
        Q4_0 = legacy::Q4_0, Q8_0(q8::q4_0), panel(group 32, mins false, off 8, qmax 15);
        Q4_1 = legacy::Q4_1, Q8_0(q8::q4_1), panel(group 32, mins true, off 0, qmax 15);
        Q5_0 = legacy::Q5_0, Q8_0(q8::q5_0), panel(group 32, mins false, off 16, qmax 31);
        Q5_1 = legacy::Q5_1, Q8_0(q8::q5_1), panel(group 32, mins true, off 0, qmax 31);
        Q8_0 = legacy::Q8_0, Q8_0(q8::q8_0), panel(group 32, mins false, off 128, qmax 255);
        Q2_K = kquants::Q2_K, Q8K(q8::q2_k), panel(group 16, mins true, off 0, qmax 3);
        Q3_K = kquants::Q3_K, Q8K(q8::q3_k), panel(group 16, mins false, off 4, qmax 7);
        Q4_K = kquants::Q4_K, Q8K(q8::q4_k), panel(group 32, mins true, off 0, qmax 15);
        Q5_K = kquants::Q5_K, Q8K(q8::q5_k), panel(group 32, mins true, off 0, qmax 31);
        Q6_K = kquants::Q6_K, Q8K(q8::q6_k), panel(group 16, mins false, off 32, qmax 63);
        Q8_K = kquants::Q8_K, Q8K(q8::q8_k), panel(group 16, mins false, off 128, qmax 255);
    }
    packed {
        Q5_0_PACKED = Q5_0, packed::q5_0_dequantize, packed::q5_0_dot, Q8_0(packed::q5_0_dot_q8);
    }
}
