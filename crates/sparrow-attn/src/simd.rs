//! Row kernels: scaled dot products of query rows against key rows, weighted sums of value
//! rows, and `exp` over a score buffer.
//!
//! The scalar module is the reference; the AVX2/FMA/F16C module is its twin, chosen once
//! at run time with `is_x86_feature_detected!` and tested against the scalar code below.
//! Every kernel works on *many* rows per call so the dispatch cost is paid once per batch.
//!
//! A "row" `r` of a base slice is `base[r * stride .. r * stride + dim]`.

use crate::element::KvElement;

/// Which rows of a base slice a kernel visits, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rows<'a> {
    /// Rows `start..end`.
    Range { start: usize, end: usize },
    /// Rows listed explicitly.
    List(&'a [usize]),
}

impl Rows<'_> {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self {
            Rows::Range { start, end } => end.saturating_sub(*start),
            Rows::List(l) => l.len(),
        }
    }

    #[inline]
    pub(crate) fn get(&self, k: usize) -> usize {
        match self {
            Rows::Range { start, .. } => start + k,
            Rows::List(l) => l[k],
        }
    }

    fn max_row(&self) -> Option<usize> {
        match self {
            Rows::Range { start, end } => (end > start).then(|| end - 1),
            Rows::List(l) => l.iter().copied().max(),
        }
    }
}

/// Panics (an internal bug, never caller input: public entry points validate first) when
/// a row would read past `len`.
#[inline]
fn check_rows(len: usize, stride: usize, dim: usize, rows: Rows<'_>) {
    if let Some(r) = rows.max_row() {
        let end = r.checked_mul(stride).and_then(|x| x.checked_add(dim));
        assert!(
            matches!(end, Some(e) if e <= len),
            "kernel row out of bounds"
        );
    }
}

/// Whether the AVX2 kernels run: the attention level chosen once for the process
/// ([`crate::kernel::Level::active`], capped by `SPARROW_SIMD`).
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    crate::kernel::Level::active() == crate::kernel::Level::Avx2
}

/// Name of the kernel set in use ("avx2+fma+f16c" or "scalar").
pub fn kernel_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return "avx2+fma+f16c";
    }
    "scalar"
}

/// `out[k] = scale * dot(q, row(rows[k]))`.
pub(crate) fn scores<E: KvElement>(
    q: &[f32],
    base: &[E],
    stride: usize,
    rows: Rows<'_>,
    scale: f32,
    out: &mut [f32],
) {
    check_rows(base.len(), stride, q.len(), rows);
    assert!(out.len() >= rows.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports avx2/fma/f16c (checked above); every row lies inside
        // `base` (check_rows) and `out` holds `rows.len()` values (asserted).
        unsafe { avx2::scores(q, base, stride, rows, scale, out) };
        return;
    }
    scalar::scores(q, base, stride, rows, scale, out)
}

/// For `g` query rows stored back to back in `qs` (each `dim` long):
/// `out[r * ostride + ocol + k] = scale * dot(q_r, row(rows[k]))`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_multi<E: KvElement>(
    qs: &[f32],
    g: usize,
    base: &[E],
    stride: usize,
    rows: Rows<'_>,
    scale: f32,
    out: &mut [f32],
    ostride: usize,
    ocol: usize,
) {
    let dim = qs.len() / g.max(1);
    assert!(g > 0 && qs.len() == g * dim);
    check_rows(base.len(), stride, dim, rows);
    let n = rows.len();
    assert!(ocol + n <= ostride && out.len() >= (g - 1) * ostride + ocol + n);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked; rows inside `base`; output window asserted above.
        unsafe { avx2::scores_multi(qs, g, dim, base, stride, rows, scale, out, ostride, ocol) };
        return;
    }
    for r in 0..g {
        let o = r * ostride + ocol;
        scalar::scores(
            &qs[r * dim..(r + 1) * dim],
            base,
            stride,
            rows,
            scale,
            &mut out[o..o + n],
        );
    }
}

/// `acc += sum_k w[k] * row(rows[k])`.
pub(crate) fn accumulate<E: KvElement>(
    acc: &mut [f32],
    w: &[f32],
    base: &[E],
    stride: usize,
    rows: Rows<'_>,
) {
    check_rows(base.len(), stride, acc.len(), rows);
    assert!(w.len() >= rows.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked; rows inside `base`; `w` long enough (asserted).
        unsafe { avx2::accumulate(acc, w, base, stride, rows) };
        return;
    }
    scalar::accumulate(acc, w, base, stride, rows)
}

/// For `g` accumulators stored back to back in `acc`:
/// `acc_r += sum_k w[r * wstride + wcol + k] * row(rows[k])`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_multi<E: KvElement>(
    acc: &mut [f32],
    g: usize,
    w: &[f32],
    wstride: usize,
    wcol: usize,
    base: &[E],
    stride: usize,
    rows: Rows<'_>,
) {
    let dim = acc.len() / g.max(1);
    assert!(g > 0 && acc.len() == g * dim);
    check_rows(base.len(), stride, dim, rows);
    let n = rows.len();
    assert!(wcol + n <= wstride && w.len() >= (g - 1) * wstride + wcol + n);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked; rows inside `base`; weight window asserted above.
        unsafe { avx2::accumulate_multi(acc, g, dim, w, wstride, wcol, base, stride, rows) };
        return;
    }
    for r in 0..g {
        let o = r * wstride + wcol;
        scalar::accumulate(
            &mut acc[r * dim..(r + 1) * dim],
            &w[o..o + n],
            base,
            stride,
            rows,
        );
    }
}

/// `xs[k] = exp(xs[k] - m)`; returns the sum of the new values. `m` must be finite.
pub(crate) fn exp_sub_sum(xs: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked; the kernel only touches `xs`.
        return unsafe { avx2::exp_sub_sum(xs, m) };
    }
    scalar::exp_sub_sum(xs, m)
}

/// `dst[i] = E::from_f32(src[i])` (rounding to f16 when `E` is f16).
pub(crate) fn store<E: KvElement>(dst: &mut [E], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: features checked; lengths equal (asserted).
        unsafe { avx2::store(dst, src) };
        return;
    }
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, x)| *d = E::from_f32(*x));
}

/// The reference kernels: plain loops, bounds-checked indexing.
pub(crate) mod scalar {
    use super::Rows;
    use crate::element::KvElement;

    #[inline]
    pub(crate) fn dot<E: KvElement>(q: &[f32], row: &[E]) -> f32 {
        q.iter().zip(row).map(|(a, b)| a * b.to_f32()).sum()
    }

    pub(crate) fn scores<E: KvElement>(
        q: &[f32],
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
        scale: f32,
        out: &mut [f32],
    ) {
        let dim = q.len();
        for (k, o) in out.iter_mut().enumerate().take(rows.len()) {
            let r = rows.get(k) * stride;
            *o = scale * dot(q, &base[r..r + dim]);
        }
    }

    pub(crate) fn accumulate<E: KvElement>(
        acc: &mut [f32],
        w: &[f32],
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
    ) {
        let dim = acc.len();
        for (k, &wk) in w.iter().enumerate().take(rows.len()) {
            let r = rows.get(k) * stride;
            for (a, x) in acc.iter_mut().zip(&base[r..r + dim]) {
                *a += wk * x.to_f32();
            }
        }
    }

    pub(crate) fn exp_sub_sum(xs: &mut [f32], m: f32) -> f32 {
        let mut s = 0.0;
        for x in xs.iter_mut() {
            *x = (*x - m).exp();
            s += *x;
        }
        s
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 + FMA + F16C twins of the scalar kernels. Every function here is `unsafe`:
    //! callers must have checked the CPU features and the row bounds (see `super`).
    #![allow(clippy::needless_range_loop)] // index loops mirror the pointer arithmetic
    use super::Rows;
    use crate::element::{ElemKind, KvElement};
    use crate::kernel::avx2::exp8;
    use core::arch::x86_64::*;

    /// Load 8 elements at `p` as f32.
    ///
    /// # Safety
    /// `p..p+8` must be readable; avx2+f16c must be available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<E: KvElement>(p: *const E) -> __m256 {
        match E::KIND {
            // `KIND == F32` is only set by the f32 impl of the sealed trait, so E is f32.
            ElemKind::F32 => _mm256_loadu_ps(p.cast::<f32>()),
            // `KIND == F16` is only set by half::f16, a transparent u16: 8 of them are 16 bytes.
            ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
        }
    }

    /// See [`super::store`].
    ///
    /// # Safety
    /// Features available; `dst.len() == src.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn store<E: KvElement>(dst: &mut [E], src: &[f32]) {
        let n = src.len();
        let mut i = 0;
        if E::KIND == ElemKind::F16 {
            while i + 8 <= n {
                let h = _mm256_cvtps_ph(
                    _mm256_loadu_ps(src.as_ptr().add(i)),
                    _MM_FROUND_TO_NEAREST_INT,
                );
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
                i += 8;
            }
        }
        while i < n {
            dst[i] = E::from_f32(src[i]);
            i += 1;
        }
    }

    /// Horizontal sum of one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Lane `x` of the result is the horizontal sum of `a[x]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum8x8(a: [__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t2 = _mm256_hadd_ps(a[4], a[5]);
        let t3 = _mm256_hadd_ps(a[6], a[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        let lo = _mm256_permute2f128_ps(u0, u1, 0x20);
        let hi = _mm256_permute2f128_ps(u0, u1, 0x31);
        _mm256_add_ps(lo, hi)
    }

    /// Dot product of `q` (len `dim`) with the `dim` elements at `p`.
    ///
    /// # Safety
    /// `p..p+dim` readable; features available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot1<E: KvElement>(q: &[f32], p: *const E) -> f32 {
        let dim = q.len();
        let qp = q.as_ptr();
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut d = 0;
        while d + 16 <= dim {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d)), load8(p.add(d)), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d + 8)), load8(p.add(d + 8)), a1);
            d += 16;
        }
        if d + 8 <= dim {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d)), load8(p.add(d)), a0);
            d += 8;
        }
        let mut s = hsum(_mm256_add_ps(a0, a1));
        while d < dim {
            s += q[d] * (*p.add(d)).to_f32();
            d += 1;
        }
        s
    }

    /// See [`super::scores`].
    ///
    /// # Safety
    /// Features available; all rows inside `base`; `out.len() >= rows.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn scores<E: KvElement>(
        q: &[f32],
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
        scale: f32,
        out: &mut [f32],
    ) {
        let dim = q.len();
        let d8 = dim - dim % 8;
        let n = rows.len();
        let bp = base.as_ptr();
        let qp = q.as_ptr();
        let sv = _mm256_set1_ps(scale);
        let mut k = 0;
        while k + 8 <= n {
            let p: [*const E; 8] = core::array::from_fn(|x| bp.add(rows.get(k + x) * stride));
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut d = 0;
            while d < d8 {
                let qv = _mm256_loadu_ps(qp.add(d));
                for x in 0..8 {
                    acc[x] = _mm256_fmadd_ps(qv, load8(p[x].add(d)), acc[x]);
                }
                d += 8;
            }
            let mut r = hsum8x8(acc);
            if d8 < dim {
                let mut t = [0f32; 8];
                for (x, tx) in t.iter_mut().enumerate() {
                    for dd in d8..dim {
                        *tx += q[dd] * (*p[x].add(dd)).to_f32();
                    }
                }
                r = _mm256_add_ps(r, _mm256_loadu_ps(t.as_ptr()));
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(k), _mm256_mul_ps(r, sv));
            k += 8;
        }
        while k < n {
            out[k] = scale * dot1(q, bp.add(rows.get(k) * stride));
            k += 1;
        }
    }

    /// See [`super::scores_multi`]: 4 query rows × 2 key rows per inner step.
    ///
    /// # Safety
    /// Features available; rows inside `base`; output window inside `out`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn scores_multi<E: KvElement>(
        qs: &[f32],
        g: usize,
        dim: usize,
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
        scale: f32,
        out: &mut [f32],
        ostride: usize,
        ocol: usize,
    ) {
        let n = rows.len();
        let d8 = dim - dim % 8;
        let bp = base.as_ptr();
        let mut r0 = 0;
        while r0 + 4 <= g {
            let qp: [*const f32; 4] = core::array::from_fn(|x| qs.as_ptr().add((r0 + x) * dim));
            let mut k = 0;
            while k + 2 <= n {
                let p0 = bp.add(rows.get(k) * stride);
                let p1 = bp.add(rows.get(k + 1) * stride);
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut d = 0;
                while d < d8 {
                    let k0 = load8(p0.add(d));
                    let k1 = load8(p1.add(d));
                    for x in 0..4 {
                        let qv = _mm256_loadu_ps(qp[x].add(d));
                        acc[2 * x] = _mm256_fmadd_ps(qv, k0, acc[2 * x]);
                        acc[2 * x + 1] = _mm256_fmadd_ps(qv, k1, acc[2 * x + 1]);
                    }
                    d += 8;
                }
                let mut t = [0f32; 8];
                _mm256_storeu_ps(t.as_mut_ptr(), hsum8x8(acc));
                for x in 0..4 {
                    let q = core::slice::from_raw_parts(qp[x], dim);
                    let (mut s0, mut s1) = (t[2 * x], t[2 * x + 1]);
                    for dd in d8..dim {
                        s0 += q[dd] * (*p0.add(dd)).to_f32();
                        s1 += q[dd] * (*p1.add(dd)).to_f32();
                    }
                    let o = (r0 + x) * ostride + ocol + k;
                    out[o] = s0 * scale;
                    out[o + 1] = s1 * scale;
                }
                k += 2;
            }
            if k < n {
                let p = bp.add(rows.get(k) * stride);
                for x in 0..4 {
                    let q = core::slice::from_raw_parts(qp[x], dim);
                    out[(r0 + x) * ostride + ocol + k] = scale * dot1(q, p);
                }
            }
            r0 += 4;
        }
        while r0 < g {
            let o = r0 * ostride + ocol;
            scores(
                &qs[r0 * dim..(r0 + 1) * dim],
                base,
                stride,
                rows,
                scale,
                &mut out[o..o + n],
            );
            r0 += 1;
        }
    }

    /// See [`super::accumulate`].
    ///
    /// # Safety
    /// Features available; rows inside `base`; `w.len() >= rows.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn accumulate<E: KvElement>(
        acc: &mut [f32],
        w: &[f32],
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
    ) {
        match rows {
            Rows::Range { start, .. } => {
                accumulate_with(acc, w, base, stride, rows.len(), |k| start + k)
            }
            Rows::List(l) => accumulate_with(acc, w, base, stride, l.len(), |k| l[k]),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate_with<E: KvElement, F: Fn(usize) -> usize>(
        acc: &mut [f32],
        w: &[f32],
        base: &[E],
        stride: usize,
        n: usize,
        row: F,
    ) {
        let dim = acc.len();
        let bp = base.as_ptr();
        let ap = acc.as_mut_ptr();
        let mut d = 0;
        while d + 32 <= dim {
            let mut a0 = _mm256_loadu_ps(ap.add(d));
            let mut a1 = _mm256_loadu_ps(ap.add(d + 8));
            let mut a2 = _mm256_loadu_ps(ap.add(d + 16));
            let mut a3 = _mm256_loadu_ps(ap.add(d + 24));
            for k in 0..n {
                let wk = _mm256_set1_ps(w[k]);
                let p = bp.add(row(k) * stride + d);
                a0 = _mm256_fmadd_ps(wk, load8(p), a0);
                a1 = _mm256_fmadd_ps(wk, load8(p.add(8)), a1);
                a2 = _mm256_fmadd_ps(wk, load8(p.add(16)), a2);
                a3 = _mm256_fmadd_ps(wk, load8(p.add(24)), a3);
            }
            _mm256_storeu_ps(ap.add(d), a0);
            _mm256_storeu_ps(ap.add(d + 8), a1);
            _mm256_storeu_ps(ap.add(d + 16), a2);
            _mm256_storeu_ps(ap.add(d + 24), a3);
            d += 32;
        }
        while d + 8 <= dim {
            let mut a0 = _mm256_loadu_ps(ap.add(d));
            for k in 0..n {
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), load8(bp.add(row(k) * stride + d)), a0);
            }
            _mm256_storeu_ps(ap.add(d), a0);
            d += 8;
        }
        while d < dim {
            let mut s = acc[d];
            for k in 0..n {
                s += w[k] * (*bp.add(row(k) * stride + d)).to_f32();
            }
            acc[d] = s;
            d += 1;
        }
    }

    /// See [`super::accumulate_multi`]: 4 accumulators × 16 dims share each value row load.
    ///
    /// # Safety
    /// Features available; rows inside `base`; weight window inside `w`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn accumulate_multi<E: KvElement>(
        acc: &mut [f32],
        g: usize,
        dim: usize,
        w: &[f32],
        wstride: usize,
        wcol: usize,
        base: &[E],
        stride: usize,
        rows: Rows<'_>,
    ) {
        match rows {
            Rows::Range { start, .. } => accumulate_multi_with(
                acc,
                g,
                dim,
                w,
                wstride,
                wcol,
                base,
                stride,
                rows.len(),
                |k| start + k,
            ),
            Rows::List(l) => {
                accumulate_multi_with(acc, g, dim, w, wstride, wcol, base, stride, l.len(), |k| {
                    l[k]
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate_multi_with<E: KvElement, F: Fn(usize) -> usize>(
        acc: &mut [f32],
        g: usize,
        dim: usize,
        w: &[f32],
        wstride: usize,
        wcol: usize,
        base: &[E],
        stride: usize,
        n: usize,
        row: F,
    ) {
        let bp = base.as_ptr();
        let mut r0 = 0;
        while r0 + 4 <= g {
            let ap: [*mut f32; 4] = core::array::from_fn(|x| acc.as_mut_ptr().add((r0 + x) * dim));
            let wp: [*const f32; 4] =
                core::array::from_fn(|x| w.as_ptr().add((r0 + x) * wstride + wcol));
            let mut d = 0;
            while d + 16 <= dim {
                let mut a: [__m256; 8] =
                    core::array::from_fn(|x| _mm256_loadu_ps(ap[x / 2].add(d + 8 * (x % 2))));
                for k in 0..n {
                    let p = bp.add(row(k) * stride + d);
                    let v0 = load8(p);
                    let v1 = load8(p.add(8));
                    for x in 0..4 {
                        let wk = _mm256_broadcast_ss(&*wp[x].add(k));
                        a[2 * x] = _mm256_fmadd_ps(wk, v0, a[2 * x]);
                        a[2 * x + 1] = _mm256_fmadd_ps(wk, v1, a[2 * x + 1]);
                    }
                }
                for (x, ax) in a.iter().enumerate() {
                    _mm256_storeu_ps(ap[x / 2].add(d + 8 * (x % 2)), *ax);
                }
                d += 16;
            }
            while d < dim {
                for x in 0..4 {
                    let mut s = *ap[x].add(d);
                    for k in 0..n {
                        s += *wp[x].add(k) * (*bp.add(row(k) * stride + d)).to_f32();
                    }
                    *ap[x].add(d) = s;
                }
                d += 1;
            }
            r0 += 4;
        }
        while r0 < g {
            let o = r0 * wstride + wcol;
            accumulate_with(
                &mut acc[r0 * dim..(r0 + 1) * dim],
                &w[o..o + n],
                base,
                stride,
                n,
                &row,
            );
            r0 += 1;
        }
    }

    /// See [`super::exp_sub_sum`].
    ///
    /// # Safety
    /// Features available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn exp_sub_sum(xs: &mut [f32], m: f32) -> f32 {
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            let y = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
            _mm256_storeu_ps(c.as_mut_ptr(), y);
            sum = _mm256_add_ps(sum, y);
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut t = [f32::NEG_INFINITY; 8];
            t[..rest.len()].copy_from_slice(rest);
            let y = exp8(_mm256_sub_ps(_mm256_loadu_ps(t.as_ptr()), mv));
            _mm256_storeu_ps(t.as_mut_ptr(), y);
            rest.copy_from_slice(&t[..rest.len()]);
            sum = _mm256_add_ps(sum, y);
        }
        hsum(sum)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    //! Every AVX2 kernel against its scalar reference, over dims with and without tails.
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn rows_cases(n_rows: usize) -> Vec<Vec<usize>> {
        vec![
            (0..n_rows).collect(),
            (0..n_rows).rev().step_by(3).collect(),
            vec![n_rows - 1, 0, n_rows / 2],
            vec![],
        ]
    }

    fn run_scores<E: KvElement>() {
        if !has_avx2() {
            return;
        }
        let mut s = 7u64;
        for dim in [1usize, 3, 8, 13, 16, 31, 64, 72, 128] {
            let stride = dim + 5;
            let n_rows = 23;
            let base: Vec<E> = (0..n_rows * stride)
                .map(|_| E::from_f32(lcg(&mut s)))
                .collect();
            let qs: Vec<f32> = (0..6 * dim).map(|_| lcg(&mut s)).collect();
            for list in rows_cases(n_rows) {
                for rows in [
                    Rows::List(&list),
                    Rows::Range {
                        start: 2,
                        end: 2 + list.len().min(n_rows - 2),
                    },
                ] {
                    let n = rows.len();
                    let mut a = vec![0.0; n];
                    let mut b = vec![0.0; n];
                    scalar::scores(&qs[..dim], &base, stride, rows, 0.5, &mut a);
                    // SAFETY: features checked at the top; rows are inside `base`.
                    unsafe { avx2::scores(&qs[..dim], &base, stride, rows, 0.5, &mut b) };
                    for (x, y) in a.iter().zip(&b) {
                        assert!((x - y).abs() < 1e-5, "dim {dim}: {x} vs {y}");
                    }
                    for g in [1usize, 4, 6] {
                        let ostride = n + 3;
                        let mut a = vec![0.0; g * ostride];
                        let mut b = vec![0.0; g * ostride];
                        for r in 0..g {
                            let o = r * ostride + 2;
                            scalar::scores(
                                &qs[r * dim..(r + 1) * dim],
                                &base,
                                stride,
                                rows,
                                0.5,
                                &mut a[o..o + n],
                            );
                        }
                        // SAFETY: as above; output window fits `b`.
                        unsafe {
                            avx2::scores_multi(
                                &qs[..g * dim],
                                g,
                                dim,
                                &base,
                                stride,
                                rows,
                                0.5,
                                &mut b,
                                ostride,
                                2,
                            )
                        };
                        for (x, y) in a.iter().zip(&b) {
                            assert!((x - y).abs() < 1e-5, "multi dim {dim} g {g}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    fn run_accumulate<E: KvElement>() {
        if !has_avx2() {
            return;
        }
        let mut s = 11u64;
        for dim in [1usize, 5, 8, 16, 24, 33, 64, 100, 128] {
            let stride = dim + 1;
            let n_rows = 19;
            let base: Vec<E> = (0..n_rows * stride)
                .map(|_| E::from_f32(lcg(&mut s)))
                .collect();
            for list in rows_cases(n_rows) {
                let rows = Rows::List(&list);
                let n = list.len();
                let w: Vec<f32> = (0..6 * (n + 2)).map(|_| lcg(&mut s).abs()).collect();
                let init: Vec<f32> = (0..6 * dim).map(|_| lcg(&mut s)).collect();
                let mut a = init[..dim].to_vec();
                let mut b = a.clone();
                scalar::accumulate(&mut a, &w, &base, stride, rows);
                // SAFETY: features checked; rows inside `base`; `w` longer than `rows`.
                unsafe { avx2::accumulate(&mut b, &w, &base, stride, rows) };
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() < 1e-5);
                }
                for g in [1usize, 4, 6] {
                    let wstride = n + 2;
                    let mut a = init[..g * dim].to_vec();
                    let mut b = a.clone();
                    for r in 0..g {
                        let o = r * wstride + 1;
                        scalar::accumulate(
                            &mut a[r * dim..(r + 1) * dim],
                            &w[o..o + n],
                            &base,
                            stride,
                            rows,
                        );
                    }
                    // SAFETY: as above; weight window fits `w`.
                    unsafe {
                        avx2::accumulate_multi(&mut b, g, dim, &w, wstride, 1, &base, stride, rows)
                    };
                    for (x, y) in a.iter().zip(&b) {
                        assert!((x - y).abs() < 1e-5, "multi acc dim {dim} g {g}");
                    }
                }
            }
        }
    }

    #[test]
    fn avx2_scores_match_scalar_f32() {
        run_scores::<f32>();
    }

    #[test]
    fn avx2_accumulate_matches_scalar_f32() {
        run_accumulate::<f32>();
    }

    #[cfg(feature = "fp16")]
    #[test]
    fn avx2_scores_match_scalar_f16() {
        run_scores::<half::f16>();
    }

    #[cfg(feature = "fp16")]
    #[test]
    fn avx2_accumulate_matches_scalar_f16() {
        run_accumulate::<half::f16>();
    }

    #[cfg(feature = "fp16")]
    #[test]
    fn avx2_store_matches_scalar_f16() {
        if !has_avx2() {
            return;
        }
        let mut s = 5u64;
        let src: Vec<f32> = (0..37).map(|_| lcg(&mut s) * 1000.0).collect();
        let a: Vec<half::f16> = src.iter().map(|x| half::f16::from_f32(*x)).collect();
        let mut b = vec![half::f16::ZERO; 37];
        // SAFETY: features checked; equal lengths.
        unsafe { avx2::store(&mut b, &src) };
        assert_eq!(a, b);
    }

    #[test]
    fn avx2_exp_matches_scalar() {
        if !has_avx2() {
            return;
        }
        let mut s = 3u64;
        for n in [0usize, 1, 7, 8, 9, 100] {
            let xs: Vec<f32> = (0..n)
                .map(|i| {
                    if i == 3 {
                        f32::NEG_INFINITY
                    } else {
                        lcg(&mut s) * 90.0
                    }
                })
                .collect();
            let m = 1.5;
            let mut a = xs.clone();
            let mut b = xs.clone();
            let sa = scalar::exp_sub_sum(&mut a, m);
            // SAFETY: features checked at the top.
            let sb = unsafe { avx2::exp_sub_sum(&mut b, m) };
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 2e-7 * x.abs().max(1e-30), "{x} vs {y}");
            }
            assert!((sa - sb).abs() <= 1e-6 * sa.abs().max(1e-30));
        }
    }
}
