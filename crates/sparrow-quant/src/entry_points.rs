//! What the architecture folders share to turn `#[target_feature]` kernel bodies into
//! entries of a [`crate::catalogue::KernelSet`]: the entry points of a body at two levels
//! ([`entry_pairs!`]) and the plain-`fn` wrapper a table needs ([`checked!`]).

/// For each kernel body generic over a trailing `const bool` (whether it may use the
/// higher level's instructions), two entry points: `$lo` with the flag clear and `$hi` with
/// it set, each with the attributes given (the `#[target_feature]`s the body needs at that
/// flag; none where the target's baseline is enough).
macro_rules! entry_pairs {
    (lo $lo_attrs:tt, hi $hi_attrs:tt; $($entries:tt)*) => {
        $crate::entry_points::entry_pairs!(@each $lo_attrs $hi_attrs $($entries)*);
    };
    (
        @each [$($lo_attr:tt)*] [$($hi_attr:tt)*]
        $lo:ident, $hi:ident = $body:ident::<$($c:literal,)*>($x:ty);
        $($rest:tt)*
    ) => {
        $($lo_attr)*
        pub(crate) fn $lo(row: &[u8], x: $x) -> f32 {
            // SAFETY: the body with the flag clear needs only what this function enables
            // (or, where it enables nothing, what the target always has).
            unsafe { $body::<$($c,)* false>(row, x) }
        }

        $($hi_attr)*
        pub(crate) fn $hi(row: &[u8], x: $x) -> f32 {
            // SAFETY: the body with the flag set needs only what this function enables.
            unsafe { $body::<$($c,)* true>(row, x) }
        }

        $crate::entry_points::entry_pairs!(@each [$($lo_attr)*] [$($hi_attr)*] $($rest)*);
    };
    (@each $lo_attrs:tt $hi_attrs:tt) => {};
}
pub(crate) use entry_pairs;

/// A plain `fn` around the `#[target_feature]` kernel `$f` taking `(row, x: $x)` (or, with
/// `multi`, `(row, xs: &[$x], out)`; with `rows`, a [`crate::q8_tiles::Q8KRows`]; with `groups`, a
/// [`crate::row_groups::Q8KGroups`] or [`crate::row_groups::Q8_0Groups`] on `$x`), for the [`crate::catalogue::KernelSet`] of a level
/// that needs features beyond the target's baseline.
///
/// A named `fn`, not a closure: a closure coerced to a `fn` pointer goes through a shim
/// that copies the activation slices (48 bytes) on every call, which measurably slowed
/// short rows; a `fn` with the kernel's own signature compiles to a single jump.
macro_rules! checked {
    ($f:path : $x:ty) => {{
        fn entry(row: &[u8], x: $x) -> f32 {
            // SAFETY: a kernel set's kernels are only reachable through its level's table,
            // which `crate::kernels` hands out only after `SimdLevel::is_supported`
            // confirmed that this CPU has every feature the level's kernels enable.
            unsafe { $f(row, x) }
        }
        entry
    }};
    (multi $f:path : $x:ty) => {{
        fn entry(row: &[u8], xs: &[$x], out: &mut [f32]) {
            // SAFETY: as for the single-token form above.
            unsafe { $f(row, xs, out) }
        }
        entry
    }};
    (groups $f:path : $x:ty) => {{
        fn entry(group: &[u8], blocks: usize, xs: &[$x], out: &mut [f32]) {
            // SAFETY: as for the single-token form above.
            unsafe { $f(group, blocks, xs, out) }
        }
        entry
    }};
    (rows $f:path) => {{
        fn entry(rows: &[u8], n_rows: usize, xs: &$crate::q8_tiles::Q8KTiles, out: &mut [f32]) {
            // SAFETY: as for the single-token form above.
            unsafe { $f(rows, n_rows, xs, out) }
        }
        entry
    }};
}
pub(crate) use checked;
