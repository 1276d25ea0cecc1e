//! Prefill attention: `forward`, `forward_flash`, `forward_gqa`, `forward_gqa_flash`,
//! `forward_auto`, and the dense references `forward_dense` / `forward_dense_flash`.
//!
//! Every path is the same two pieces: scores of a group of query rows against a set of
//! key rows, absorbed into online softmax states, then a weighted sum of value rows.
//! `forward` handles one query position at a time with all its candidates in one pass;
//! `forward_flash` takes tiles of 16 positions and runs three phases: (1) the window keys
//! of the whole tile, in key chunks, with a causal/window mask; (2) each query's sinks,
//! ladder and landmarks; (3) normalisation. Both visit the same pairs, so their outputs
//! agree to rounding.

use crate::error::{AttnError, Result};
use crate::pattern::{candidates, CandidateCount, LandmarkMode, Plan, SparseConfig};
use crate::simd::{self, Rows};
use crate::softmax::{first_diff, RowStates};
use crate::tensor::Tensor3;

/// Query positions per flash tile.
const TILE_Q: usize = 16;
/// Key columns per flash phase-1 chunk.
const TILE_K: usize = 256;
/// Query positions per parallel work item.
const CHUNK: usize = 256;

/// Sparse attention with a fixed pattern ([`SparseConfig`]).
///
/// Scores are `q·k / sqrt(dim)`. Tensors are `(seq, heads, dim)`; for grouped-query
/// attention query head `h` reads key/value head `h / (q_heads / kv_heads)`.
#[derive(Clone, Debug)]
pub struct SparseAttention {
    config: SparseConfig,
    parallel: bool,
}

/// Block means of keys and values, head-major: `[kv_head][block][dim]`.
pub(crate) struct Landmarks {
    pub(crate) keys: Vec<f32>,
    pub(crate) values: Vec<f32>,
    pub(crate) nblocks: usize,
}

impl Landmarks {
    fn from_kv(k: &Tensor3, v: &Tensor3, bs: usize) -> Self {
        let (seq, heads, dim) = k.shape();
        let nblocks = seq.div_ceil(bs);
        let mut keys = vec![0.0f32; heads * nblocks * dim];
        let mut values = vec![0.0f32; heads * nblocks * dim];
        let (kd, vd) = (k.data(), v.data());
        for h in 0..heads {
            for b in 0..nblocks {
                let (t0, t1) = (b * bs, ((b + 1) * bs).min(seq));
                let o = (h * nblocks + b) * dim;
                let (ko, vo) = (&mut keys[o..o + dim], &mut values[o..o + dim]);
                for t in t0..t1 {
                    let r = (t * heads + h) * dim;
                    ko.iter_mut()
                        .zip(&kd[r..r + dim])
                        .for_each(|(a, x)| *a += x);
                    vo.iter_mut()
                        .zip(&vd[r..r + dim])
                        .for_each(|(a, x)| *a += x);
                }
                let inv = 1.0 / (t1 - t0) as f32;
                ko.iter_mut().for_each(|a| *a *= inv);
                vo.iter_mut().for_each(|a| *a *= inv);
            }
        }
        Self {
            keys,
            values,
            nblocks,
        }
    }

    fn head(&self, h: usize, dim: usize) -> (&[f32], &[f32]) {
        let o = h * self.nblocks * dim;
        let e = o + self.nblocks * dim;
        (&self.keys[o..e], &self.values[o..e])
    }
}

/// Everything one prefill call shares across work items.
struct Inputs<'a> {
    q: &'a Tensor3,
    k: &'a Tensor3,
    v: &'a Tensor3,
    seq: usize,
    qh: usize,
    kvh: usize,
    g: usize,
    dim: usize,
    scale: f32,
    lm: Option<Landmarks>,
}

impl SparseAttention {
    /// Validate `config` and build the attention.
    pub fn new(config: SparseConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            parallel: true,
        })
    }

    /// The pattern configuration.
    pub fn config(&self) -> &SparseConfig {
        &self.config
    }

    /// Turn the rayon paths on or off at run time (only has an effect with feature
    /// `parallel`; on by default).
    pub fn with_parallel(mut self, on: bool) -> Self {
        self.parallel = on;
        self
    }

    /// Whether this instance will use rayon (feature `parallel` and not switched off).
    pub fn is_parallel(&self) -> bool {
        cfg!(feature = "parallel") && self.parallel
    }

    /// Pairs visited per head at sequence length `seq` (see [`candidates`]).
    pub fn candidates(&self, seq: usize) -> Result<CandidateCount> {
        candidates(&self.config, seq)
    }

    /// Multi-head sparse attention; `q`, `k`, `v` must have the same shape.
    pub fn forward(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_mha(q, k, v)?;
        self.run(q, k, v, false)
    }

    /// [`forward`](Self::forward) computed in tiles (same pairs, same result to rounding).
    pub fn forward_flash(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_mha(q, k, v)?;
        self.run(q, k, v, true)
    }

    /// Grouped-query sparse attention: `q` has `q_heads`, `k`/`v` have `kv_heads`, and
    /// `q_heads` must be a multiple of `kv_heads`.
    pub fn forward_gqa(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_gqa(q, k, v)?;
        self.run(q, k, v, false)
    }

    /// [`forward_gqa`](Self::forward_gqa) computed in tiles.
    pub fn forward_gqa_flash(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_gqa(q, k, v)?;
        self.run(q, k, v, true)
    }

    /// Dispatch on head counts: equal → [`forward_flash`](Self::forward_flash), otherwise
    /// [`forward_gqa_flash`](Self::forward_gqa_flash).
    pub fn forward_auto(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        if q.heads() == k.heads() {
            self.forward_flash(q, k, v)
        } else {
            self.forward_gqa_flash(q, k, v)
        }
    }

    fn run(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3, flash: bool) -> Result<Tensor3> {
        let (seq, qh, dim) = q.shape();
        let kvh = k.heads();
        let mut out = Tensor3::zeros(seq, qh, dim)?;
        if seq == 0 {
            return Ok(out);
        }
        let lm = match self.config.landmarks {
            LandmarkMode::Off => None,
            _ => Some(Landmarks::from_kv(k, v, self.config.block_size)),
        };
        let x = Inputs {
            q,
            k,
            v,
            seq,
            qh,
            kvh,
            g: qh / kvh,
            dim,
            scale: 1.0 / (dim as f32).sqrt(),
            lm,
        };
        let items: Vec<(usize, usize)> = (0..kvh)
            .flat_map(|h| (0..seq.div_ceil(CHUNK)).map(move |c| (h, c * CHUNK)))
            .collect();
        let work = |&(h, p0): &(usize, usize)| {
            let p1 = (p0 + CHUNK).min(seq);
            if flash {
                self.item_flash(&x, h, p0, p1)
            } else {
                self.item_rows(&x, h, p0, p1)
            }
        };
        let bufs: Vec<Vec<f32>> = self.map_items(&items, work);
        let w = x.g * dim;
        let od = out.data_mut();
        for (&(h, p0), buf) in items.iter().zip(&bufs) {
            for (n, chunk) in buf.chunks_exact(w).enumerate() {
                let o = ((p0 + n) * qh + h * x.g) * dim;
                od[o..o + w].copy_from_slice(chunk);
            }
        }
        Ok(out)
    }

    /// Run `f` over `items`, on rayon when enabled.
    pub(crate) fn map_items<T, R, F>(&self, items: &[T], f: F) -> Vec<R>
    where
        T: Sync,
        R: Send,
        F: Fn(&T) -> R + Sync + Send,
    {
        #[cfg(feature = "parallel")]
        if self.parallel && items.len() > 1 {
            use rayon::prelude::*;
            return items.par_iter().map(f).collect();
        }
        items.iter().map(f).collect()
    }

    /// `forward`: one query position at a time, every candidate in one pass.
    fn item_rows(&self, x: &Inputs<'_>, h: usize, p0: usize, p1: usize) -> Vec<f32> {
        let (g, dim) = (x.g, x.dim);
        let mut out = vec![0.0f32; (p1 - p0) * g * dim];
        let mut plan = Plan::default();
        let mut st = RowStates::new(g, dim);
        let mut scores: Vec<f32> = Vec::new();
        let ks = x.kvh * dim;
        let (kb, vb) = (&x.k.data()[h * dim..], &x.v.data()[h * dim..]);
        let (lk, lv) = x.lm.as_ref().map_or((&[][..], &[][..]), |l| l.head(h, dim));
        for i in p0..p1 {
            plan.build(&self.config, x.seq, i);
            let qo = (i * x.qh + h * g) * dim;
            let qrows = &x.q.data()[qo..qo + g * dim];
            let tp = plan.token_pieces(self.config.sort_candidates);
            let bp = plan.block_pieces();
            let n = tp.total() + bp.total();
            scores.resize(g * n, 0.0);
            let mut col = 0;
            for r in tp.as_slice() {
                simd::scores_multi(qrows, g, kb, ks, *r, x.scale, &mut scores, n, col);
                col += r.len();
            }
            for r in bp.as_slice() {
                simd::scores_multi(qrows, g, lk, dim, *r, x.scale, &mut scores, n, col);
                col += r.len();
            }
            st.reset(g);
            st.absorb(0, g, &mut scores, n, n);
            let mut col = 0;
            for r in tp.as_slice() {
                simd::accumulate_multi(&mut st.acc, g, &scores, n, col, vb, ks, *r);
                col += r.len();
            }
            for r in bp.as_slice() {
                simd::accumulate_multi(&mut st.acc, g, &scores, n, col, lv, dim, *r);
                col += r.len();
            }
            let o = (i - p0) * g * dim;
            for r in 0..g {
                st.finish_row(r, &mut out[o + r * dim..o + (r + 1) * dim]);
            }
        }
        out
    }

    /// `forward_flash`: tiles of `TILE_Q` positions, three phases.
    fn item_flash(&self, x: &Inputs<'_>, h: usize, p0: usize, p1: usize) -> Vec<f32> {
        let (g, dim) = (x.g, x.dim);
        let cfg = &self.config;
        let mut out = vec![0.0f32; (p1 - p0) * g * dim];
        let mut plan = Plan::default();
        let mut st = RowStates::new(TILE_Q * g, dim);
        let mut qt = vec![0.0f32; TILE_Q * g * dim];
        let mut sc: Vec<f32> = Vec::new();
        let ks = x.kvh * dim;
        let (kb, vb) = (&x.k.data()[h * dim..], &x.v.data()[h * dim..]);
        let (lk, lv) = x.lm.as_ref().map_or((&[][..], &[][..]), |l| l.head(h, dim));
        let mut t0 = p0;
        while t0 < p1 {
            let t1 = (t0 + TILE_Q).min(p1);
            let nq = t1 - t0;
            let rows = nq * g;
            for i in t0..t1 {
                let qo = (i * x.qh + h * g) * dim;
                qt[(i - t0) * g * dim..(i - t0 + 1) * g * dim]
                    .copy_from_slice(&x.q.data()[qo..qo + g * dim]);
            }
            st.reset(rows);
            // Phase 1: the union of the tile's windows, in key chunks, masked per query.
            let (ulo, _) = cfg.window_of(x.seq, t0);
            let (_, uhi) = cfg.window_of(x.seq, t1 - 1);
            let mut c0 = ulo;
            while c0 < uhi {
                let c1 = (c0 + TILE_K).min(uhi);
                let nc = c1 - c0;
                sc.resize(rows * nc, 0.0);
                let keys = Rows::Range { start: c0, end: c1 };
                simd::scores_multi(
                    &qt[..rows * dim],
                    rows,
                    kb,
                    ks,
                    keys,
                    x.scale,
                    &mut sc,
                    nc,
                    0,
                );
                for qi in 0..nq {
                    let (lo, hi) = cfg.window_of(x.seq, t0 + qi);
                    let a = lo.clamp(c0, c1) - c0;
                    let b = hi.clamp(c0, c1) - c0;
                    for r in qi * g..(qi + 1) * g {
                        let row = &mut sc[r * nc..(r + 1) * nc];
                        row[..a].fill(f32::NEG_INFINITY);
                        row[b..].fill(f32::NEG_INFINITY);
                    }
                }
                st.absorb(0, rows, &mut sc, nc, nc);
                simd::accumulate_multi(&mut st.acc[..rows * dim], rows, &sc, nc, 0, vb, ks, keys);
                c0 = c1;
            }
            // Phase 2: sinks, ladder and landmarks of each query.
            for qi in 0..nq {
                plan.build(cfg, x.seq, t0 + qi);
                let ep = plan.extra_pieces();
                let bp = plan.block_pieces();
                let n = ep.total() + bp.total();
                if n == 0 {
                    continue;
                }
                let qrows = &qt[qi * g * dim..(qi + 1) * g * dim];
                sc.resize(g * n, 0.0);
                let mut col = 0;
                for r in ep.as_slice() {
                    simd::scores_multi(qrows, g, kb, ks, *r, x.scale, &mut sc, n, col);
                    col += r.len();
                }
                for r in bp.as_slice() {
                    simd::scores_multi(qrows, g, lk, dim, *r, x.scale, &mut sc, n, col);
                    col += r.len();
                }
                st.absorb(qi * g, g, &mut sc, n, n);
                let acc = &mut st.acc[qi * g * dim..(qi + 1) * g * dim];
                let mut col = 0;
                for r in ep.as_slice() {
                    simd::accumulate_multi(acc, g, &sc, n, col, vb, ks, *r);
                    col += r.len();
                }
                for r in bp.as_slice() {
                    simd::accumulate_multi(acc, g, &sc, n, col, lv, dim, *r);
                    col += r.len();
                }
            }
            // Phase 3: normalise.
            for r in 0..rows {
                let o = ((t0 - p0) * g + r) * dim;
                st.finish_row(r, &mut out[o..o + dim]);
            }
            t0 = t1;
        }
        out
    }
}

/// Dense softmax attention (every key; causal or not). Accepts grouped-query shapes
/// (`q_heads` a multiple of `kv_heads`). The exact reference the sparse paths are
/// measured against.
pub fn forward_dense(q: &Tensor3, k: &Tensor3, v: &Tensor3, causal: bool) -> Result<Tensor3> {
    validate_gqa(q, k, v)?;
    SparseAttention::new(SparseConfig::dense(causal))?.run(q, k, v, false)
}

/// [`forward_dense`] computed flash-style: tiles of queries against chunks of keys with
/// online softmax, never holding more than a tile × chunk block of scores.
pub fn forward_dense_flash(q: &Tensor3, k: &Tensor3, v: &Tensor3, causal: bool) -> Result<Tensor3> {
    validate_gqa(q, k, v)?;
    SparseAttention::new(SparseConfig::dense(causal))?.run(q, k, v, true)
}

fn validate_mha(q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<()> {
    for t in [k, v] {
        if q.shape() != t.shape() {
            let (what, expected, got) = first_diff(q.shape(), t.shape());
            return Err(AttnError::ShapeMismatch {
                what,
                expected,
                got,
            });
        }
    }
    Ok(())
}

pub(crate) fn validate_gqa(q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<()> {
    if k.shape() != v.shape() {
        let (what, expected, got) = first_diff(k.shape(), v.shape());
        return Err(AttnError::ShapeMismatch {
            what,
            expected,
            got,
        });
    }
    if q.seq() != k.seq() {
        return Err(AttnError::ShapeMismatch {
            what: "seq",
            expected: q.seq(),
            got: k.seq(),
        });
    }
    if q.dim() != k.dim() {
        return Err(AttnError::ShapeMismatch {
            what: "dim",
            expected: q.dim(),
            got: k.dim(),
        });
    }
    if q.heads().checked_rem(k.heads()) != Some(0) {
        return Err(AttnError::HeadsNotDivisible {
            q_heads: q.heads(),
            kv_heads: k.heads(),
        });
    }
    Ok(())
}
