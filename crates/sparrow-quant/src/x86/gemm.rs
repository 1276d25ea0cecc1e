//! AVX-512 VNNI micro-kernel of the batched product (see `crate::gemm`): 32 decoded rows
//! times 4 tokens per pass, `vpdpbusd` on 16 rows per register.

use core::arch::x86_64::*;

use crate::gemm::{BatchActs, Layout, Panel, PANEL};

#[inline]
#[target_feature(enable = "avx512f")]
fn ld64(p: &[u8]) -> __m512i {
    let p: &[u8; 64] = p.first_chunk().expect("64 bytes");
    // SAFETY: `p` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ld16f(p: &[f32]) -> __m512 {
    let p: &[f32; 16] = p.first_chunk().expect("16 floats");
    // SAFETY: `p` is 16 readable f32; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_ps(p.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn st16f(p: &mut [f32], v: __m512) {
    let p: &mut [f32; 16] = p.first_chunk_mut().expect("16 floats");
    // SAFETY: `p` is 16 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm512_storeu_ps(p.as_mut_ptr(), v) }
}

/// `T` tokens starting at `t0` through the panel; writes `res[(t0 + t) * PANEL ..][..32]`.
#[inline(always)]
fn tile<const T: usize, const MINS: bool>(
    g: usize,
    p: &Panel,
    a: &BatchActs,
    t0: usize,
    res: &mut [f32],
) {
    let ng = a.groups;
    let cols = a.cols;
    let steps = g / 4;
    // SAFETY (for the intrinsics below): only called from `panel_avx512`, whose
    // `#[target_feature]` enables AVX-512 F/BW/VL/VNNI, checked at dispatch.
    unsafe {
        let mut fa = [[_mm512_setzero_ps(); 2]; T];
        let xq: [&[u8]; T] = core::array::from_fn(|t| &a.qs[(t0 + t) * cols..][..cols]);
        let dx: [&[f32]; T] = core::array::from_fn(|t| &a.dx[(t0 + t) * ng..][..ng]);
        let nc: [&[i32]; T] = core::array::from_fn(|t| &a.negc[(t0 + t) * ng..][..ng]);
        let xs: [&[f32]; T] = core::array::from_fn(|t| &a.xs[(t0 + t) * ng..][..ng]);
        for gi in 0..ng {
            let mut ia = [[_mm512_setzero_si512(); 2]; T];
            for t in 0..T {
                let c = _mm512_set1_epi32(nc[t][gi]);
                ia[t] = [c, c];
            }
            let qg = &p.q[gi * g * PANEL..][..g * PANEL];
            for j in 0..steps {
                let w0 = ld64(&qg[j * 128..]);
                let w1 = ld64(&qg[j * 128 + 64..]);
                for t in 0..T {
                    let b: &[u8; 4] = xq[t][gi * g + 4 * j..].first_chunk().expect("4 bytes");
                    let xb = _mm512_set1_epi32(i32::from_le_bytes(*b));
                    ia[t][0] = _mm512_dpbusd_epi32(ia[t][0], w0, xb);
                    ia[t][1] = _mm512_dpbusd_epi32(ia[t][1], w1, xb);
                }
            }
            let d0 = ld16f(&p.dw[gi * PANEL..]);
            let d1 = ld16f(&p.dw[gi * PANEL + 16..]);
            for t in 0..T {
                let dxb = _mm512_set1_ps(dx[t][gi]);
                fa[t][0] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(ia[t][0]),
                    _mm512_mul_ps(d0, dxb),
                    fa[t][0],
                );
                fa[t][1] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(ia[t][1]),
                    _mm512_mul_ps(d1, dxb),
                    fa[t][1],
                );
            }
            if MINS {
                let m0 = ld16f(&p.mw[gi * PANEL..]);
                let m1 = ld16f(&p.mw[gi * PANEL + 16..]);
                for t in 0..T {
                    let sb = _mm512_set1_ps(xs[t][gi]);
                    fa[t][0] = _mm512_fmadd_ps(m0, sb, fa[t][0]);
                    fa[t][1] = _mm512_fmadd_ps(m1, sb, fa[t][1]);
                }
            }
        }
        for (t, f) in fa.iter().enumerate() {
            let o = &mut res[(t0 + t) * PANEL..][..PANEL];
            st16f(&mut o[..16], f[0]);
            st16f(&mut o[16..], f[1]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn panel_impl<const MINS: bool>(g: usize, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    let mut t = 0;
    while t + 4 <= n {
        tile::<4, MINS>(g, p, a, t, res);
        t += 4;
    }
    while t < n {
        tile::<1, MINS>(g, p, a, t, res);
        t += 1;
    }
}

/// The AVX-512 VNNI panel kernel: same contract as `crate::gemm::panel_scalar`.
pub(crate) fn panel_avx512(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    // SAFETY: only handed out by `crate::gemm` for `SimdLevel::Avx512` after
    // `is_supported()` confirmed AVX-512 F/BW/VL/VNNI, AVX2 and FMA on this CPU.
    unsafe {
        if lay.mins {
            panel_impl::<true>(lay.g, p, a, n, res)
        } else {
            panel_impl::<false>(lay.g, p, a, n, res)
        }
    }
}
