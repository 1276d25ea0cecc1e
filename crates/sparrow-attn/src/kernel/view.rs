//! The views of rows the tile kernels read: [`Tile`] (a safe, checked view over a slice)
//! and `RawRows` (the same rows as the vector loops walk them, by pointer). Below the
//! dispatcher (`tile.rs`) and the instruction-set files alike, so arrows only run down.

/// `n` rows of `width` values, row `t` at `data[t * stride..]`: a tile of keys or values as
/// the kernels read it — f32 (one KV head's rows of a cache, `stride` being the cache's row
/// width, or a tile converted from f16 or dequantized from Q8_0, `stride == width`), or the
/// f16 values or Q8_0 blocks a tile is converted from.
#[derive(Clone, Copy, Debug)]
pub struct Tile<'a, T = f32> {
    /// The rows; at least `(n - 1) * stride + width` values.
    pub data: &'a [T],
    /// Distance between the starts of consecutive rows.
    pub stride: usize,
    /// Number of rows (keys).
    pub n: usize,
    /// Floats used per row (the head size).
    pub width: usize,
}

impl<'a, T> Tile<'a, T> {
    /// Rows `t * stride..t * stride + width` of `data` for `t < n`.
    pub fn new(data: &'a [T], stride: usize, n: usize, width: usize) -> Self {
        Tile {
            data,
            stride,
            n,
            width,
        }
    }

    /// Row `t`'s `width` values.
    pub(crate) fn row(&self, t: usize) -> &'a [T] {
        &self.data[t * self.stride..][..self.width]
    }

    /// Panics unless the rows are disjoint and within `data` (what the SIMD twins rely on).
    pub(crate) fn check(&self) {
        let (n, stride, width) = (self.n, self.stride, self.width);
        assert!(width <= stride || n <= 1, "rows overlap");
        assert!(
            n == 0 || self.data.len() >= (n - 1) * stride + width,
            "tile out of bounds"
        );
    }
}

impl Tile<'_> {
    /// The tile as the vector loops read it (its bounds checked by the caller).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn raw(&self) -> RawRows {
        RawRows {
            ptr: self.data.as_ptr(),
            stride: self.stride,
            n: self.n,
            width: self.width,
        }
    }
}

/// `n` rows of `width` f32, row `t` starting at `ptr + t · stride`: a tile of keys or values
/// as the vector loops read it.
#[derive(Clone, Copy)]
pub(crate) struct RawRows {
    pub ptr: *const f32,
    pub stride: usize,
    pub n: usize,
    pub width: usize,
}
