//! The loop structure the SIMD twins share, written once over a small per-instruction-set
//! trait ([`Simd`]): the AVX2 and NEON modules supply vector primitives (load, store,
//! fused multiply-add, `exp`, f16 widening, Q8_0 dequantization of one block) and pick the
//! register blocking of their entry points; everything else — register-blocked scores and
//! P·V, the scalar tails, the online-softmax step, the walk over rows — lives here, so the
//! twins cannot drift apart in their order of operations.
//!
//! Everything here is `#[inline(always)]` and carries no target features of its own: it is
//! inlined into the `#[target_feature]` entry points of `avx2.rs` (and into the NEON ones,
//! where Advanced SIMD is the baseline), where the intrinsics behind [`Simd`] then inline
//! too. The functions are `unsafe`: they read and write through raw pointers within bounds
//! their callers guarantee (the `tile` wrappers assert them).

#[cfg(feature = "fp16")]
use super::rows::{BlockQ8_0, QK8_0};
use super::view::RawRows;
#[cfg(feature = "fp16")]
use super::view::Tile;
#[cfg(feature = "fp16")]
use half::f16;

/// One instruction set's f32 vector of [`LANES`](Simd::LANES) lanes.
///
/// # Safety
/// Implementations may only be called where the instruction set is available (inside the
/// entry points that enable it), through pointers valid for `LANES` floats.
pub(crate) trait Simd {
    /// The vector type.
    type V: Copy;
    /// Floats per vector.
    const LANES: usize;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `LANES` floats from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// `LANES` floats to `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `acc + a · b`, fused.
    unsafe fn mul_add(acc: Self::V, a: Self::V, b: f32) -> Self::V;
    /// Lane-wise `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise `a - b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `exp` per lane (Cephes' polynomial; below -87.33 gives 0, `exp(0)` is 1).
    unsafe fn exp(x: Self::V) -> Self::V;
    /// `x` with `-inf` lanes set to 0 (the shift of a softmax row that has seen no score).
    unsafe fn zero_neg_inf(x: Self::V) -> Self::V;
    /// Eight f16 from `src` widened to eight f32 at `dst`.
    #[cfg(feature = "fp16")]
    unsafe fn widen8(src: *const f16, dst: *mut f32);
    /// One Q8_0 block's 32 values (`q · d`, one rounding) to `dst`.
    #[cfg(feature = "fp16")]
    unsafe fn dequant_block(b: &BlockQ8_0, dst: *mut f32);
}

/// One tile's scores: `s[t · rw + r] = scale · Σ_d k[t][d] · qt[d · rw + r]` for the keys
/// `k` (`width` = head size) and the query rows the pointers start at.
#[derive(Clone, Copy)]
pub(crate) struct ScoreTile {
    /// The keys.
    pub k: RawRows,
    /// The transposed query block, `qt[d · rw + r]`.
    pub qt: *const f32,
    /// The scores, `s[t · rw + r]`.
    pub s: *mut f32,
    /// Padded rows of the block: the stride of `qt` and `s`.
    pub rw: usize,
    pub scale: f32,
}

impl ScoreTile {
    /// The same tile from key `t` and query row `r` on.
    ///
    /// # Safety
    /// `t <= k.n` and `r < rw`, so the pointers stay within the tile.
    #[inline(always)]
    pub(crate) unsafe fn at(self, t: usize, r: usize) -> Self {
        // SAFETY: within the tile, as the caller guarantees.
        unsafe {
            ScoreTile {
                k: RawRows {
                    ptr: self.k.ptr.add(t * self.k.stride),
                    n: self.k.n - t,
                    ..self.k
                },
                qt: self.qt.add(r),
                s: self.s.add(t * self.rw + r),
                ..self
            }
        }
    }
}

/// `KB` keys × `RB` row vectors of scores, from the tile's first key and row.
///
/// # Safety
/// Keys `0..KB`, and query and score vectors `0..RB` of the tile, in bounds.
#[inline(always)]
unsafe fn score_block<S: Simd, const KB: usize, const RB: usize>(j: ScoreTile) {
    let l = S::LANES;
    // SAFETY (whole function): the caller guarantees keys `0..KB` (rows `stride` apart,
    // `width` long), query vectors `0..RB` of each dimension and score vectors `0..RB` of
    // keys `0..KB` are in bounds.
    unsafe {
        let mut acc = [[S::splat(0.0); RB]; KB];
        for d in 0..j.k.width {
            let mut qv = [S::splat(0.0); RB];
            for (c, v) in qv.iter_mut().enumerate() {
                *v = S::load(j.qt.add(d * j.rw + c * l));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let kv = *j.k.ptr.add(i * j.k.stride + d);
                for (x, &q) in a.iter_mut().zip(&qv) {
                    *x = S::mul_add(*x, q, kv);
                }
            }
        }
        let scale = S::splat(j.scale);
        for (i, a) in acc.iter().enumerate() {
            for (c, &x) in a.iter().enumerate() {
                S::store(j.s.add(i * j.rw + c * l), S::mul(x, scale));
            }
        }
    }
}

/// Every key of the tile for `RB` row vectors: blocks of `KB` keys, then of 4, then single
/// keys (each score is the same sum in the same order whichever block computes it).
///
/// # Safety
/// As [`score_block`], for keys `0..n`.
#[inline(always)]
pub(crate) unsafe fn score_rows<S: Simd, const KB: usize, const RB: usize>(j: ScoreTile) {
    // SAFETY (every call): keys `t..t + block` with `t + block <= n` and the tile's `RB`
    // row vectors, which the caller guarantees are in bounds.
    unsafe {
        let mut t = 0;
        while t + KB <= j.k.n {
            score_block::<S, KB, RB>(j.at(t, 0));
            t += KB;
        }
        while t + 4 <= j.k.n {
            score_block::<S, 4, RB>(j.at(t, 0));
            t += 4;
        }
        while t < j.k.n {
            score_block::<S, 1, RB>(j.at(t, 0));
            t += 1;
        }
    }
}

/// One tile of online softmax (see `tile::softmax_tile`): the scores of `n` keys for `rw`
/// rows (`s[t · rw + r]`), and each row's running maximum `m`, sum `l` and the correction
/// `corr` its earlier output is to be scaled by.
pub(crate) struct SoftmaxTile<'a> {
    pub s: &'a mut [f32],
    pub n: usize,
    pub rw: usize,
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
}

/// One tile of online softmax for every row, `LANES` rows per vector.
///
/// # Safety
/// `rw` a multiple of `LANES`; `s` holds `n × rw` floats, `m`, `l`, `corr` at least `rw`.
#[inline(always)]
pub(crate) unsafe fn softmax_tile<S: Simd>(j: SoftmaxTile<'_>) {
    let SoftmaxTile {
        s,
        n,
        rw,
        m,
        l,
        corr,
    } = j;
    let sp = s.as_mut_ptr();
    // SAFETY: a splat touches no memory.
    let ninf = unsafe { S::splat(f32::NEG_INFINITY) };
    for v in 0..rw / S::LANES {
        let o = v * S::LANES;
        // SAFETY: `o + LANES <= rw`, within `m`, `l`, `corr` (≥ rw) and, for `t < n`,
        // within `s` (≥ n × rw), as the caller guarantees.
        unsafe {
            let m_old = S::load(m.as_ptr().add(o));
            let mut mx = ninf;
            for t in 0..n {
                mx = S::max(mx, S::load(sp.add(t * rw + o)));
            }
            let m_new = S::max(m_old, mx);
            // Rows with every score -inf so far subtract 0 (and get zeros).
            let m_use = S::zero_neg_inf(m_new);
            let c = S::exp(S::sub(m_old, m_use));
            let mut sum = S::splat(0.0);
            for t in 0..n {
                let at = sp.add(t * rw + o);
                let p = S::exp(S::sub(S::load(at), m_use));
                S::store(at, p);
                sum = S::add(sum, p);
            }
            let l_old = S::load(l.as_ptr().add(o));
            S::store(l.as_mut_ptr().add(o), S::add(S::mul(l_old, c), sum));
            S::store(m.as_mut_ptr().add(o), m_new);
            S::store(corr.as_mut_ptr().add(o), c);
        }
    }
}

/// One tile's weighted values: `o[r · o_stride + d] += Σ_t p[t · rw + r] · v[t][d]` for
/// the rows the pointers start at and the dimensions `0..v.width`.
#[derive(Clone, Copy)]
pub(crate) struct PvTile {
    /// Probabilities, `p[t · rw + r]`.
    pub p: *const f32,
    /// Padded rows of the block: the stride of `p`.
    pub rw: usize,
    /// The values (`n` keys; `width` dimensions from the pointer on).
    pub v: RawRows,
    /// Output accumulators, row `r` at `o + r · o_stride`.
    pub o: *mut f32,
    /// The head size: the stride of `o`.
    pub o_stride: usize,
}

impl PvTile {
    /// The same tile from row `r` on.
    ///
    /// # Safety
    /// `r` within the block's rows.
    #[inline(always)]
    pub(crate) unsafe fn rows_from(self, r: usize) -> Self {
        // SAFETY: as the caller guarantees.
        unsafe {
            PvTile {
                p: self.p.add(r),
                o: self.o.add(r * self.o_stride),
                ..self
            }
        }
    }

    /// The same tile from dimension `d` on.
    ///
    /// # Safety
    /// `d <= v.width`.
    #[inline(always)]
    unsafe fn dims_from(self, d: usize) -> Self {
        // SAFETY: as the caller guarantees.
        unsafe {
            PvTile {
                v: RawRows {
                    ptr: self.v.ptr.add(d),
                    width: self.v.width - d,
                    ..self.v
                },
                o: self.o.add(d),
                ..self
            }
        }
    }
}

/// `RB` rows × `CB` vectors of output dimensions, from the tile's first row and dimension.
///
/// # Safety
/// Rows `0..RB` of `p` (for every key) and of `o`, and dimensions `0..LANES·CB` of the
/// values and of `o`, in bounds.
#[inline(always)]
unsafe fn pv_block<S: Simd, const RB: usize, const CB: usize>(j: PvTile) {
    let l = S::LANES;
    // SAFETY (whole function): as the caller guarantees.
    unsafe {
        let mut acc = [[S::splat(0.0); CB]; RB];
        for (r, a) in acc.iter_mut().enumerate() {
            for (c, x) in a.iter_mut().enumerate() {
                *x = S::load(j.o.add(r * j.o_stride + c * l));
            }
        }
        for t in 0..j.v.n {
            let mut vv = [S::splat(0.0); CB];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = S::load(j.v.ptr.add(t * j.v.stride + c * l));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = *j.p.add(t * j.rw + r);
                for (x, &y) in a.iter_mut().zip(&vv) {
                    *x = S::mul_add(*x, y, w);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, &x) in a.iter().enumerate() {
                S::store(j.o.add(r * j.o_stride + c * l), x);
            }
        }
    }
}

/// `RB` rows over every dimension: vectors of `LANES·CB` dimensions, then of `LANES`, then a
/// scalar tail.
///
/// # Safety
/// Rows `0..RB` of `p` and `o`, and dimensions `0..width` of the values and `o`, in bounds.
#[inline(always)]
pub(crate) unsafe fn pv_rows<S: Simd, const RB: usize, const CB: usize>(j: PvTile) {
    let (l, width) = (S::LANES, j.v.width);
    // SAFETY (whole function): as the caller guarantees; each block covers a sub-range of
    // the dimensions.
    unsafe {
        let mut d = 0;
        while d + l * CB <= width {
            pv_block::<S, RB, CB>(j.dims_from(d));
            d += l * CB;
        }
        while d + l <= width {
            pv_block::<S, RB, 1>(j.dims_from(d));
            d += l;
        }
        for r in 0..RB {
            for dd in d..width {
                let at = j.o.add(r * j.o_stride + dd);
                let mut acc = *at;
                for t in 0..j.v.n {
                    acc += *j.p.add(t * j.rw + r) * *j.v.ptr.add(t * j.v.stride + dd);
                }
                *at = acc;
            }
        }
    }
}

/// `dst[t · width + j] = src[t · stride + j]` as f32: eight at a time, then a scalar tail.
///
/// # Safety
/// The bounds `tile::convert_tile` asserts.
#[cfg(feature = "fp16")]
#[inline(always)]
pub(crate) unsafe fn convert_tile<S: Simd>(src: Tile<'_, f16>, dst: &mut [f32]) {
    let Tile {
        data: src,
        stride,
        n,
        width,
    } = src;
    let full = width / 8 * 8;
    for t in 0..n {
        let s = &src[t * stride..][..width];
        let d = &mut dst[t * width..][..width];
        let mut j = 0;
        while j < full {
            // SAFETY: `j + 8 <= width`, the length of both `s` and `d`.
            unsafe { S::widen8(s.as_ptr().add(j), d.as_mut_ptr().add(j)) };
            j += 8;
        }
        for j in full..width {
            d[j] = s[j].to_f32();
        }
    }
}

/// Dequantize Q8_0 rows (see `tile::dequant_q8_0_tile`) block by block.
///
/// # Safety
/// The bounds `tile::dequant_q8_0_tile` asserts.
#[cfg(feature = "fp16")]
#[inline(always)]
pub(crate) unsafe fn dequant_q8_0_tile<S: Simd>(src: Tile<'_, BlockQ8_0>, dst: &mut [f32]) {
    let Tile {
        data: src,
        stride,
        n,
        width,
    } = src;
    for t in 0..n {
        let row = &src[t * stride..][..width];
        let out = &mut dst[t * width * QK8_0..][..width * QK8_0];
        for (b, o) in row.iter().zip(out.chunks_exact_mut(QK8_0)) {
            // SAFETY: `o` holds the block's 32 floats.
            unsafe { S::dequant_block(b, o.as_mut_ptr()) };
        }
    }
}
