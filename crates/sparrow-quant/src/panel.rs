//! What the panel micro-kernels of the batched product ([`crate::gemm`]) share: the decoded weight panel, the regrouped
//! activations, the shape of a format's integers, and the portable reference kernel.
//!
//! Kept apart from the dispatch in [`crate::gemm`] so that the architecture folders'
//! micro-kernels (`x86::gemm`, `aarch64::gemm`) import these types without importing the
//! module that imports them.

use rayon::prelude::*;

use crate::q8::{Q8KActs, Q8_0Acts, Q8K_BLOCK, Q8_0_BLOCK};

/// Rows decoded together (two 16-lane registers).
pub(crate) const PANEL: usize = 32;

/// How a weight format maps onto groups.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Elements per scale group: a legacy block (32), a k-quant's sub-block (16, or 32 for
    /// Q4_K and Q5_K, whose 32-element sub-blocks then pay one scaling per 32 products).
    pub(crate) g: usize,
    /// Whether `w = dw * s + mw` has a non-zero `mw`.
    pub(crate) mins: bool,
    /// Legacy (Q8_0 activations) or k-quant (Q8_K activations).
    pub(crate) legacy: bool,
    /// The panel stores `s + off`, which lies in `0..=qmax` (see [`Panel`]).
    pub(crate) off: u8,
    /// The largest stored value `s + off`: at most 128 except for the 8-bit formats
    /// (Q8_0, Q8_K: `off = 128`, `qmax = 255`).
    pub(crate) qmax: u8,
}

/// The quantized activations of a batch, per token and group (see [`crate::gemm`]).
#[derive(Debug, Default)]
pub(crate) struct BatchActs {
    /// Elements per token.
    pub(crate) cols: usize,
    /// Groups per token.
    pub(crate) groups: usize,
    /// Quants (as raw bytes of `i8`), `cols` per token.
    pub(crate) qs: Vec<u8>,
    /// Activation scale per group.
    pub(crate) dx: Vec<f32>,
    /// `-off * sum(quants)` per group (`off` of the weight [`Layout`]).
    pub(crate) negc: Vec<i32>,
    /// `dx * sum(quants)` per group.
    pub(crate) xs: Vec<f32>,
    /// `sum(quants)` per group, as f32 (for kernels that apply `dx` once per 256 elements,
    /// the scale block of the k-quants' Q8_K activations).
    pub(crate) sums: Vec<f32>,
}

impl BatchActs {
    /// Quantizes the `n` rows of `xs` (`cols` each) as the per-row kernels of a format of
    /// `lay` would, in parallel over tokens.
    pub(crate) fn new(lay: Layout, xs: &[f32], cols: usize, n: usize) -> Self {
        let groups = cols / lay.g;
        let mut a = BatchActs {
            cols,
            groups,
            qs: vec![0; n * cols],
            dx: vec![0.0; n * groups],
            negc: vec![0; n * groups],
            xs: vec![0.0; n * groups],
            sums: vec![0.0; n * groups],
        };
        a.qs.par_chunks_mut(cols)
            .zip(a.dx.par_chunks_mut(groups))
            .zip(a.negc.par_chunks_mut(groups))
            .zip(a.xs.par_chunks_mut(groups))
            .zip(a.sums.par_chunks_mut(groups))
            .zip(xs.par_chunks_exact(cols))
            .for_each_init(
                || (Q8_0Acts::default(), Q8KActs::default()),
                |(a0, ak), (((((qs, dx), negc), sx), sums), x)| {
                    let mut put = |gi: usize, d: f32, sum: i32| {
                        dx[gi] = d;
                        negc[gi] = -(lay.off as i32) * sum;
                        sx[gi] = d * sum as f32;
                        sums[gi] = sum as f32;
                    };
                    if lay.legacy {
                        a0.quantize_from(x);
                        let s = a0.as_slice();
                        for (q, &v) in qs.iter_mut().zip(s.qs) {
                            *q = v as u8;
                        }
                        for b in 0..cols / Q8_0_BLOCK {
                            put(b, s.d[b], s.sum[b]);
                        }
                    } else {
                        ak.quantize_from(x);
                        let s = ak.as_slice();
                        for (q, &v) in qs.iter_mut().zip(s.qs) {
                            *q = v as u8;
                        }
                        // Q8_K sums its quants per 16; a group of 32 adds two sums
                        for (gi, bs) in s.bsums.chunks_exact(lay.g / 16).enumerate() {
                            let sum = bs.iter().map(|&b| b as i32).sum();
                            put(gi, s.d[gi * lay.g / Q8K_BLOCK], sum);
                        }
                    }
                },
            );
        a
    }
}

/// [`PANEL`] weight rows decoded for the micro-kernel (see [`crate::gemm`]).
#[derive(Debug, Default)]
pub(crate) struct Panel {
    /// `s + off` per weight (unsigned, `off` of the [`Layout`]); 4 columns of row 0, of
    /// row 1, ..., then the next 4 columns.
    pub(crate) q: Vec<u8>,
    /// `dw` per group: [`PANEL`] rows per group.
    pub(crate) dw: Vec<f32>,
    /// `mw` per group (empty for formats without minimums).
    pub(crate) mw: Vec<f32>,
}

/// Runs all `n` tokens of `a` through the decoded panel `p`; `res[t * PANEL + r]` receives
/// row `r`'s output for token `t`. Portable reference of the SIMD micro-kernel.
pub(crate) fn panel_scalar(lay: Layout, p: &Panel, a: &BatchActs, n: usize, res: &mut [f32]) {
    let (g, ng, cols) = (lay.g, a.groups, a.cols);
    for t in 0..n {
        for r in 0..PANEL {
            let mut acc = 0f32;
            for gi in 0..ng {
                let mut isum = a.negc[t * ng + gi];
                for c in gi * g..(gi + 1) * g {
                    let w = p.q[((c / 4) * PANEL + r) * 4 + c % 4] as i32;
                    isum += w * (a.qs[t * cols + c] as i8) as i32;
                }
                acc += isum as f32 * (p.dw[gi * PANEL + r] * a.dx[t * ng + gi]);
                if lay.mins {
                    acc += p.mw[gi * PANEL + r] * a.xs[t * ng + gi];
                }
            }
            res[t * PANEL + r] = acc;
        }
    }
}

/// A panel micro-kernel: `res[t * PANEL + r]` for every token `t` of the batch and every
/// row `r` of the panel.
pub(crate) type PanelKernel = fn(Layout, &Panel, &BatchActs, usize, &mut [f32]);
