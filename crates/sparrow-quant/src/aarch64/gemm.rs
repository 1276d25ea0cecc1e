//! The NEON micro-kernel of the batched product (see `crate::gemm`), for CPUs with `sdot`
//! (the `dotprod` extension): one token at a time through the 32 decoded rows of a panel,
//! `sdot` on 4 rows per register (the panel stores 4 columns of a row together, so one
//! broadcast of the token's 4 activation bytes meets 4 rows' 4 weights per instruction).
//!
//! The panel holds `s + off`; for every format but the 8-bit ones that is at most 63, a
//! valid signed byte, so `sdot` takes it as it is and the group's sum starts at
//! `-off * sum(x)` as in the reference. The 8-bit formats (Q8_0, Q8_K: `off = 128`) store
//! `s + 128` wrapped; flipping the top bit gives `s` back, and their sum starts at 0.

use core::arch::aarch64::*;

use super::neon::{ld16, ld4f, sdot};
use crate::panel::{BatchActs, Layout, Panel, PANEL};

/// Token `t` through the panel; writes `res[t * PANEL..][..PANEL]`.
///
/// # Safety
/// The CPU must have `dotprod`.
#[inline(always)]
unsafe fn token(lay: Layout, p: &Panel, a: &BatchActs, t: usize, res: &mut [f32]) {
    let (g, ng, cols) = (lay.g, a.groups, a.cols);
    let wide = lay.qmax > 127;
    let flip = vdupq_n_u8(if wide { 0x80 } else { 0 });
    let xq = &a.qs[t * cols..][..cols];
    let mut fa = [vdupq_n_f32(0.0); PANEL / 4];
    for gi in 0..ng {
        let start = if wide { 0 } else { a.negc[t * ng + gi] };
        let mut ia = [vdupq_n_s32(start); PANEL / 4];
        let qg = &p.q[gi * g * PANEL..][..g * PANEL];
        for j in 0..g / 4 {
            let b: &[u8; 4] = xq[gi * g + 4 * j..].first_chunk().expect("4 bytes");
            let xb = vreinterpretq_s8_s32(vdupq_n_s32(i32::from_le_bytes(*b)));
            for (k, acc) in ia.iter_mut().enumerate() {
                let w = vreinterpretq_s8_u8(veorq_u8(ld16(&qg[j * 4 * PANEL + 16 * k..]), flip));
                *acc = sdot(*acc, w, xb);
            }
        }
        let dx = a.dx[t * ng + gi];
        for (k, f) in fa.iter_mut().enumerate() {
            let dw = ld4f(&p.dw[gi * PANEL + 4 * k..]);
            *f = vfmaq_f32(*f, vcvtq_f32_s32(ia[k]), vmulq_n_f32(dw, dx));
            if lay.mins {
                let mw = ld4f(&p.mw[gi * PANEL + 4 * k..]);
                *f = vfmaq_n_f32(*f, mw, a.xs[t * ng + gi]);
            }
        }
    }
    let out: &mut [f32; PANEL] = (&mut res[t * PANEL..]).first_chunk_mut().expect("a panel");
    for (k, &f) in fa.iter().enumerate() {
        // SAFETY: `out` holds PANEL = 32 floats; lanes `4k..4k + 4` with `k < 8`.
        unsafe { vst1q_f32(out.as_mut_ptr().add(4 * k), f) };
    }
}

#[target_feature(enable = "dotprod")]
fn panel_dotprod(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    for t in 0..n {
        // SAFETY: `dotprod` is enabled for this function.
        unsafe { token(lay, p, a, t, res) };
    }
}

/// The `dotprod` panel micro-kernel (a `crate::gemm` `PanelKernel`).
pub(crate) fn panel_neondot(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    // SAFETY: `gemm::panel_kernel` hands this kernel out only for `SimdLevel::NeonDot`
    // after `is_supported` confirmed (with `is_aarch64_feature_detected!`) that the CPU
    // has `dotprod`.
    unsafe { panel_dotprod(lay, p, a, n, res) }
}
