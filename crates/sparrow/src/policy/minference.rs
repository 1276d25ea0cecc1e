//! MInference (Jiang et al., 2024) for prefill: the vertical-slash pattern.
//!
//! For each prefill batch, layer and KV head, the last `last_q` queries of the batch attend
//! exactly to every visible key; their softmax probabilities, summed over the query heads of
//! the GQA group (the group shares one pattern, so the KV rows it gathers serve all its
//! heads), give a score per key column (vertical) and per diagonal offset `o = query − key`
//! (slash). The pattern keeps the first `sinks` columns and the `recent` nearest diagonals,
//! then the best columns and diagonals until a query reads about `budget × context` keys,
//! where the context is the batch's `pos0 + n`.
//!
//! **Selection rule.** The method uses fixed per-head counts (e.g. 1000 verticals and 6096
//! slashes) found by an offline search. Without that search, candidates are ranked online in
//! one currency: a column and a diagonal both cost about one key per query, and both scores
//! are attention mass of the last queries, so the top `budget × ctx − sinks − recent` of the
//! merged list are taken (a head with strong columns gets columns, a local head diagonals).
//! Mass that falls on a forced key (a sink column or a recent diagonal) is not counted
//! toward any candidate, so candidates are ranked by the mass they add; candidates with no
//! mass are not taken.
//!
//! **Attention is exact within the pattern.** Query `p` reads `{k ∈ columns : k ≤ p} ∪
//! {p − o : o ∈ offsets, o ≤ p}`, each key once, nothing else. Per (layer, KV head, batch)
//! the head's K/V rows `0..pos0 + n` are converted to f32 once; the selected columns' rows
//! are gathered into contiguous buffers and read by blocks of query rows (all heads of the
//! group for 56/group tokens) with the dense kernels, masked causally and where one of the
//! token's diagonals holds the key (that key is counted by the diagonal part). Diagonals are
//! read per 8 consecutive tokens with the tokens as vector lanes: for offset `o`, token slot
//! `j` of a block starting at `p0` reads key `p0 + j − o`, i.e. eight adjacent columns of
//! K/V transposed to `[dim][position]` — so no key outside the token's own diagonals is
//! computed, with no per-token gather. The column and diagonal parts are merged by
//! log-sum-exp. Work: O(budget · T²) for attention, plus the estimate's `last_q × group`
//! rows over all T keys per batch (two passes over its stored probabilities).
//!
//! Dense attention is used for layers in `dense_layers`, single-token calls, short contexts
//! (≤ sinks + recent + 256) and budgets that cover the whole context.

use super::{AttentionChoice, PolicyEntry, SettingsType};
use rayon::prelude::*;
use sparrow_attn::kernel::tile::{pv, scores, softmax_tile};
use sparrow_attn::kernel::{head_rows, AttnShape, KvSource, Level};
use sparrow_attn::policy::{PlanContext, PlanEntry, ReadPlan, Source, SparsePolicy};
use std::ops::Range;

/// The registry's entry: a prefill policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "minference",
    summary: "prefill: vertical-slash pattern",
    prefill: true,
    decode: false,
    build: |b| Ok(Box::new(MInferenceAttention::new(settings(b.choice)?, b.model.n_layer)?)),
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<MInferenceSettings>(),
};

/// The settings with the shared `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<MInferenceSettings, String> {
    let mut s = c.settings::<MInferenceSettings>();
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// MInference settings (defaults from the method's code).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MInferenceSettings {
    /// First key columns every query reads.
    #[cfg_attr(feature = "cli", arg(skip = 30usize))]
    pub sinks: usize,
    /// Most recent diagonals every query reads.
    #[cfg_attr(feature = "cli", arg(skip = 100usize))]
    pub recent: usize,
    /// MInference: keys read per prompt token, as a fraction of its context (0..=1).
    #[cfg_attr(feature = "cli", arg(id = "MINFERENCE_BUDGET", long = "minference-budget", default_value_t = 0.3, help_heading = crate::policy::HELP_HEADING))]
    pub budget: f64,
    /// Queries at the end of each prefill batch used to estimate the pattern.
    #[cfg_attr(feature = "cli", arg(skip = 64usize))]
    pub last_q: usize,
    /// Layers that keep exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub dense_layers: Vec<usize>,
}

impl Default for MInferenceSettings {
    fn default() -> Self {
        MInferenceSettings {
            sinks: 30,
            recent: 100,
            budget: 0.3,
            last_q: 64,
            dense_layers: Vec::new(),
        }
    }
}

impl MInferenceSettings {
    /// Checks the settings, naming the bad one and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.budget > 0.0 && self.budget <= 1.0) {
            return Err(format!(
                "minference budget {} is out of range (0 < budget <= 1, a fraction of the context)",
                self.budget
            ));
        }
        if self.last_q == 0 {
            return Err(format!(
                "minference last_q {} is out of range (at least 1 query)",
                self.last_q
            ));
        }
        Ok(())
    }

    /// Keys a query may read at a batch context of `ctx` positions.
    fn budget_keys(&self, ctx: usize) -> usize {
        ((self.budget * ctx as f64).ceil() as usize).min(ctx)
    }
}

/// Keys per tile.
const TILE: usize = 64;
/// Query rows (tokens × group heads) a block of the column part aims for.
const BLOCK_ROWS: usize = 56;
/// Tokens per task of the attention over the pattern.
const UNIT: usize = 64;
/// Keys per estimation task.
const EST_CHUNK: usize = 1024;
/// Contexts up to `sinks + recent + DENSE_MARGIN` run dense attention.
const DENSE_MARGIN: usize = 256;
/// Batch size assumed by [`SparsePolicy::fraction_read`]'s estimate (the default).
const PREFILL_BATCH: usize = 512;

/// One KV head's estimated scores for a batch: attention mass of the last queries per key
/// column (`vertical[k]`) and per diagonal offset (`slash[o]`, `o = query − key`), both of
/// length `pos0 + n`. Mass on a sink column or a recent diagonal is left out of both.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadScores {
    pub vertical: Vec<f32>,
    pub slash: Vec<f32>,
}

/// One KV head's vertical-slash pattern for a batch: the key columns and the diagonal
/// offsets read, both ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    pub columns: Vec<usize>,
    pub offsets: Vec<usize>,
}

/// The MInference prefill backend (one per sequence).
pub struct MInferenceAttention {
    settings: MInferenceSettings,
    n_layer: usize,
    /// Per layer, for the last batch: (sum over query rows × KV heads of the fraction of
    /// visible keys read, number of such rows).
    last: Vec<(f64, f64)>,
}

impl MInferenceAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: MInferenceSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(MInferenceAttention {
            settings,
            n_layer,
            last: vec![(0.0, 0.0); n_layer],
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &MInferenceSettings {
        &self.settings
    }

    /// Measured fraction of the visible keys read per query row (averaged over layers and
    /// KV heads; dense layers and batches count 1) in the last prefill batch, if any.
    pub fn last_selectivity(&self) -> Option<f64> {
        let (sum, count) = self
            .last
            .iter()
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        (count > 0.0).then(|| sum / count)
    }

    /// Whether a batch of `n` rows reaching context `ctx` in `layer` runs dense attention.
    fn dense_for(&self, layer: usize, n: usize, ctx: usize) -> bool {
        let s = &self.settings;
        n <= 1
            || s.dense_layers.contains(&layer)
            || ctx <= s.sinks + s.recent + DENSE_MARGIN
            || s.budget_keys(ctx) >= ctx
    }

    fn record(&mut self, layer: usize, sum: f64, count: f64) {
        if let Some(m) = self.last.get_mut(layer) {
            *m = (sum, count);
        }
    }

    /// The pattern of each KV head for this batch (as [`Self::attend`] uses it), or `None`
    /// when the batch runs dense attention.
    pub fn patterns(
        &self,
        shape: AttnShape,
        store: &dyn KvSource,
        layer: usize,
        q: &[f32],
        pos0: usize,
    ) -> Option<Vec<Pattern>> {
        let n = q.len() / (shape.n_head * shape.head_dim);
        if self.dense_for(layer, n, pos0 + n) {
            return None;
        }
        let scores = self.estimate(shape, store, q, pos0);
        Some(scores.iter().map(|s| self.select(s, pos0 + n)).collect())
    }

    /// Vertical and slash scores per KV head from the last `last_q` rows of the batch: their
    /// exact causal softmax over keys `0..pos0 + n`, summed over the group's heads.
    pub fn estimate(
        &self,
        shape: AttnShape,
        store: &dyn KvSource,
        q: &[f32],
        pos0: usize,
    ) -> Vec<HeadScores> {
        let level = Level::active();
        let ctx = pos0 + q.len() / (shape.n_head * shape.head_dim);
        (0..shape.n_head_kv)
            .map(|g| {
                let kv = HeadKv::new(level, store, g, shape.head_dim, ctx);
                self.estimate_head(level, shape, q, pos0, g, &kv)
            })
            .collect()
    }

    /// [`Self::estimate`] for KV head `g`, whose rows are `kv`.
    fn estimate_head(
        &self,
        level: Level,
        shape: AttnShape,
        q: &[f32],
        pos0: usize,
        g: usize,
        kv: &HeadKv,
    ) -> HeadScores {
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let q_dim = shape.n_head * hd;
        let n = q.len() / q_dim;
        let ctx = pos0 + n;
        let e = self.settings.last_q.min(n);
        let first = pos0 + n - e; // position of the first estimating query
        let rows = e * group;
        let rw = rows.div_ceil(8) * 8;
        let scale = 1.0 / (hd as f32).sqrt();
        let (sinks, recent) = (self.settings.sinks, self.settings.recent);
        let chunks: Vec<Range<usize>> = (0..ctx)
            .step_by(EST_CHUNK)
            .map(|c| c..(c + EST_CHUNK).min(ctx))
            .collect();
        let qt = transpose(shape, q, n - e..n, g);

        // Pass 1: probabilities up to each task's running maximum (kept per tile).
        struct Chunk {
            p: Vec<f32>,
            snaps: Vec<f32>,
            m: Vec<f32>,
            l: Vec<f32>,
        }
        let parts: Vec<Chunk> = chunks
            .par_iter()
            .map(|c| {
                let mut ch = Chunk {
                    p: vec![0.0; c.len() * rw],
                    snaps: Vec::with_capacity(c.len().div_ceil(TILE) * rw),
                    m: vec![f32::NEG_INFINITY; rw],
                    l: vec![0.0; rw],
                };
                let mut corr = vec![0.0f32; rw];
                for start in c.clone().step_by(TILE) {
                    let nt = TILE.min(c.end - start);
                    let s = &mut ch.p[(start - c.start) * rw..][..nt * rw];
                    scores(level, &kv.k[start * hd..], hd, nt, hd, &qt, rw, scale, s);
                    if start + nt > first + 1 {
                        for i in 0..e {
                            let pos = first + i;
                            for t in (pos + 1).saturating_sub(start)..nt {
                                s[t * rw + i * group..][..group].fill(f32::NEG_INFINITY);
                            }
                        }
                    }
                    softmax_tile(level, s, nt, rw, &mut ch.m, &mut ch.l, &mut corr);
                    ch.snaps.extend_from_slice(&ch.m);
                }
                ch
            })
            .collect();
        let mut m_all = vec![f32::NEG_INFINITY; rw];
        for ch in &parts {
            for (a, &b) in m_all.iter_mut().zip(&ch.m) {
                *a = a.max(b);
            }
        }
        let mut l_all = vec![0.0f32; rw];
        for ch in &parts {
            for r in 0..rw {
                if ch.m[r] > f32::NEG_INFINITY {
                    l_all[r] += ch.l[r] * (ch.m[r] - m_all[r]).exp();
                }
            }
        }
        // Pass 2: normalised probabilities summed into columns and diagonals.
        let sums: Vec<(Vec<f32>, usize, Vec<f32>)> = chunks
            .par_iter()
            .zip(&parts)
            .map(|(c, ch)| {
                let o_lo = first.saturating_sub(c.end - 1);
                let o_hi = ctx - 1 - c.start;
                let mut vert = vec![0.0f32; c.len()];
                let mut slash = vec![0.0f32; o_hi + 1 - o_lo];
                let mut f = vec![0.0f32; rw];
                for (ti, start) in c.clone().step_by(TILE).enumerate() {
                    let nt = TILE.min(c.end - start);
                    for r in 0..rows {
                        let snap = ch.snaps[ti * rw + r];
                        f[r] = if snap == f32::NEG_INFINITY || l_all[r] <= 0.0 {
                            0.0
                        } else {
                            (snap - m_all[r]).exp() / l_all[r]
                        };
                    }
                    let p = &ch.p[(start - c.start) * rw..][..nt * rw];
                    for t in 0..nt {
                        let k = start + t;
                        if k < sinks {
                            continue;
                        }
                        // Query `i` sees `k` from `first + i >= k` on; offsets below
                        // `recent` are forced anyway.
                        for i in (k + recent).saturating_sub(first)..e {
                            let o = first + i - k;
                            let at = t * rw + i * group;
                            let mass: f32 = p[at..at + group]
                                .iter()
                                .zip(&f[i * group..(i + 1) * group])
                                .map(|(a, b)| a * b)
                                .sum();
                            vert[k - c.start] += mass;
                            slash[o - o_lo] += mass;
                        }
                    }
                }
                (vert, o_lo, slash)
            })
            .collect();
        let mut vertical = Vec::with_capacity(ctx);
        let mut slash = vec![0.0f32; ctx];
        for (v, o_lo, s) in sums {
            vertical.extend_from_slice(&v);
            for (dst, x) in slash[o_lo..].iter_mut().zip(s) {
                *dst += x;
            }
        }
        HeadScores { vertical, slash }
    }

    /// The pattern for one KV head at a batch context of `ctx` positions: columns
    /// `0..sinks` and offsets `0..recent`, then the best-scoring columns and diagonals of
    /// the merged ranking (ties to the lower index, columns first) until `budget × ctx` keys
    /// per query; candidates with no mass are skipped.
    pub fn select(&self, scores: &HeadScores, ctx: usize) -> Pattern {
        let s = &self.settings;
        let sinks = s.sinks.min(ctx);
        let recent = s.recent.min(ctx);
        let extra = s.budget_keys(ctx).saturating_sub(sinks + recent);
        // (score, tag): tags below ctx are columns, from ctx on diagonals (offset + ctx).
        let mut cand: Vec<(f32, usize)> = Vec::new();
        if extra > 0 {
            let cols = (sinks..ctx).map(|k| (scores.vertical.get(k).copied(), k));
            let diags = (recent..ctx).map(|o| (scores.slash.get(o).copied(), ctx + o));
            cand = cols
                .chain(diags)
                .filter_map(|(x, tag)| x.filter(|x| *x > 0.0).map(|x| (x, tag)))
                .collect();
            if cand.len() > extra {
                cand.select_nth_unstable_by(extra - 1, |a, b| {
                    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
                });
                cand.truncate(extra);
            }
        }
        let mut columns: Vec<usize> = (0..sinks).collect();
        let mut offsets: Vec<usize> = (0..recent).collect();
        for &(_, tag) in &cand {
            if tag < ctx {
                columns.push(tag);
            } else {
                offsets.push(tag - ctx);
            }
        }
        columns.sort_unstable();
        offsets.sort_unstable();
        Pattern { columns, offsets }
    }
}

/// Running online-softmax state of a set of query rows (padded to `rw`), with scratch.
struct Acc {
    rows: usize,
    rw: usize,
    hd: usize,
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
    corr: Vec<f32>,
    s: Vec<f32>,
}

impl Acc {
    fn new(rows: usize, hd: usize) -> Acc {
        let rw = rows.div_ceil(8) * 8;
        Acc {
            rows,
            rw,
            hd,
            m: vec![f32::NEG_INFINITY; rw],
            l: vec![0.0; rw],
            o: vec![0.0; rows * hd],
            corr: vec![0.0; rw],
            s: vec![0.0; TILE * rw],
        }
    }

    /// Scores of `n` keys (rows `stride` apart) for the transposed queries `qt`.
    fn scores(&mut self, level: Level, k: &[f32], stride: usize, n: usize, qt: &[f32]) {
        let scale = 1.0 / (self.hd as f32).sqrt();
        let s = &mut self.s[..n * self.rw];
        scores(level, k, stride, n, self.hd, qt, self.rw, scale, s);
    }

    /// Softmax of the (masked) scores of the last [`Self::scores`] and their values added.
    fn values(&mut self, level: Level, v: &[f32], stride: usize, n: usize) {
        let (rw, hd) = (self.rw, self.hd);
        let s = &mut self.s[..n * rw];
        softmax_tile(level, s, n, rw, &mut self.m, &mut self.l, &mut self.corr);
        for (r, &c) in self.corr[..self.rows].iter().enumerate() {
            if c != 1.0 {
                self.o[r * hd..(r + 1) * hd]
                    .iter_mut()
                    .for_each(|a| *a *= c);
            }
        }
        pv(level, s, rw, self.rows, v, stride, n, hd, &mut self.o);
    }
}

/// Transposed queries (`qt[d * rw + r]`) of the heads of `kv_head` for batch rows `tokens`.
fn transpose(shape: AttnShape, q: &[f32], tokens: Range<usize>, kv_head: usize) -> Vec<f32> {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let q_dim = shape.n_head * hd;
    let rows = tokens.len() * group;
    let rw = rows.div_ceil(8) * 8;
    let mut qt = vec![0.0f32; hd * rw];
    for r in 0..rows {
        let token = tokens.start + r / group;
        let head = kv_head * group + r % group;
        for (d, &x) in q[token * q_dim + head * hd..][..hd].iter().enumerate() {
            qt[d * rw + r] = x;
        }
    }
    qt
}

/// One KV head's keys and values at positions `0..ctx` as f32 rows (`hd` apart), converted
/// once per (layer, KV head, batch) so that gathering a row is a copy.
struct HeadKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl HeadKv {
    fn new(level: Level, store: &dyn KvSource, g: usize, hd: usize, ctx: usize) -> Self {
        let convert = |values: bool| {
            let mut dst = vec![0.0f32; ctx * hd];
            dst.par_chunks_mut(EST_CHUNK * hd)
                .enumerate()
                .for_each(|(c, dst)| {
                    let mut tmp = vec![0.0f32; TILE * hd];
                    for (i, d) in dst.chunks_mut(TILE * hd).enumerate() {
                        let (start, n) = (c * EST_CHUNK + i * TILE, d.len() / hd);
                        let rows = if values {
                            store.value_rows(start, n)
                        } else {
                            store.key_rows(start, n)
                        };
                        let (src, stride) =
                            head_rows(level, rows, g * hd, store.kv_dim(), hd, n, &mut tmp);
                        for t in 0..n {
                            d[t * hd..(t + 1) * hd]
                                .copy_from_slice(&src[t * stride..t * stride + hd]);
                        }
                    }
                });
            dst
        };
        HeadKv {
            k: convert(false),
            v: convert(true),
        }
    }
}

/// Zero columns on each side of the transposed K/V, so that the eight token slots of a
/// block may address keys just outside `0..ctx` (masked) without bounds trouble.
const PAD: usize = 8;

/// `rows` (`ctx` rows of `hd`) transposed to `[d][PAD + key]`, rows `ctx + 2·PAD` wide.
fn transposed(rows: &[f32], ctx: usize, hd: usize) -> Vec<f32> {
    let width = ctx + 2 * PAD;
    let mut t = vec![0.0f32; hd * width];
    t.par_chunks_mut(8 * width)
        .enumerate()
        .for_each(|(c, dst)| {
            let d0 = c * 8;
            let nd = dst.len() / width;
            for k in 0..ctx {
                let src = &rows[k * hd + d0..][..nd];
                for (dd, &x) in src.iter().enumerate() {
                    dst[dd * width + PAD + k] = x;
                }
            }
        });
    t
}

/// Eight lanes of `a · b + c` (fused when `FMA`).
#[inline(always)]
fn fma8<const FMA: bool>(a: &[f32; 8], b: &[f32; 8], c: &mut [f32; 8]) {
    for l in 0..8 {
        c[l] = if FMA {
            a[l].mul_add(b[l], c[l])
        } else {
            a[l] * b[l] + c[l]
        };
    }
}

/// Eight floats at `x[at..]`, unchecked: the kernels below check their bounds once.
///
/// # Safety
/// `at + 8 <= x.len()`.
#[inline(always)]
unsafe fn lanes(x: &[f32], at: usize) -> &[f32; 8] {
    debug_assert!(at + 8 <= x.len());
    // SAFETY: in bounds by the caller's contract; `[f32; 8]` has `f32`'s alignment.
    unsafe { &*(x.as_ptr().add(at) as *const [f32; 8]) }
}

/// The bounds the diagonal kernels rely on, checked once per call.
fn check_diag(p_or_s: &[f32], kv_t: &[f32], width: usize, base: &[usize], hd: usize, heads: usize) {
    assert!(
        p_or_s.len() >= base.len() * heads * 8,
        "scores out of bounds"
    );
    assert!(kv_t.len() >= hd * width, "transposed rows out of bounds");
    assert!(
        base.iter().all(|&b| b + 8 <= width),
        "diagonal key out of bounds"
    );
}

/// Diagonal scores of a block's 8 token slots (the vector lanes) for `heads` heads:
/// `s[t·rw + h·8 + j] = scale · Σ_d qd[(h·hd + d)·8 + j] · kt[d·width + base[t] + j]`,
/// `rw = 8·heads`. Dimensions four at a time, so each score vector is loaded and stored
/// once per four products.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn diag_scores_body<const FMA: bool>(
    qd: &[f32],
    kt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    scale: f32,
    s: &mut [f32],
) {
    let rw = heads * 8;
    check_diag(s, kt, width, base, hd, heads);
    assert!(qd.len() >= heads * hd * 8, "queries out of bounds");
    let s = &mut s[..base.len() * rw];
    s.fill(0.0);
    // SAFETY (every `lanes` below): rows `d < hd` of `kt` are `width` long and every
    // `base[t] + 8 <= width`; score vectors `t·rw + h·8 + 8 <= base.len()·rw`; query vectors
    // `(h·hd + d)·8 + 8 <= heads·hd·8` — all checked just above.
    let mut d = 0;
    while d < hd {
        if d + 4 <= hd {
            let rows: [&[f32]; 4] = std::array::from_fn(|i| &kt[(d + i) * width..][..width]);
            for (t, &b) in base.iter().enumerate() {
                let k: [[f32; 8]; 4] = std::array::from_fn(|i| unsafe { *lanes(rows[i], b) });
                for h in 0..heads {
                    let q = (h * hd + d) * 8;
                    let at = t * rw + h * 8;
                    unsafe {
                        let mut a = *lanes(s, at);
                        fma8::<FMA>(lanes(qd, q), &k[0], &mut a);
                        fma8::<FMA>(lanes(qd, q + 8), &k[1], &mut a);
                        fma8::<FMA>(lanes(qd, q + 16), &k[2], &mut a);
                        fma8::<FMA>(lanes(qd, q + 24), &k[3], &mut a);
                        *(s.as_mut_ptr().add(at) as *mut [f32; 8]) = a;
                    }
                }
            }
            d += 4;
        } else {
            let row = &kt[d * width..][..width];
            for (t, &b) in base.iter().enumerate() {
                let k = unsafe { *lanes(row, b) };
                for h in 0..heads {
                    let at = t * rw + h * 8;
                    unsafe {
                        let mut a = *lanes(s, at);
                        fma8::<FMA>(lanes(qd, (h * hd + d) * 8), &k, &mut a);
                        *(s.as_mut_ptr().add(at) as *mut [f32; 8]) = a;
                    }
                }
            }
            d += 1;
        }
    }
    s.iter_mut().for_each(|x| *x *= scale);
}

/// Diagonal values: `o[(h·hd + d)·8 + j] += Σ_t p[t·rw + h·8 + j] · vt[d·width + base[t] + j]`,
/// with four independent sums (keys `t mod 4`) so the adds do not wait on each other.
#[inline(always)]
fn diag_pv_body<const FMA: bool>(
    p: &[f32],
    vt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    o: &mut [f32],
) {
    let rw = heads * 8;
    check_diag(p, vt, width, base, hd, heads);
    assert!(o.len() >= heads * hd * 8, "outputs out of bounds");
    let n4 = base.len() / 4 * 4;
    // SAFETY (every `lanes` below): as for `diag_scores_body`, checked just above.
    for d in 0..hd {
        let row = &vt[d * width..(d + 1) * width];
        for h in 0..heads {
            let (mut a0, mut a1, mut a2, mut a3) = ([0.0f32; 8], [0.0f32; 8], [0.0; 8], [0.0; 8]);
            let at = |t: usize| t * rw + h * 8;
            for (t, b) in base[..n4].chunks_exact(4).enumerate() {
                let t = 4 * t;
                unsafe {
                    fma8::<FMA>(lanes(p, at(t)), lanes(row, b[0]), &mut a0);
                    fma8::<FMA>(lanes(p, at(t + 1)), lanes(row, b[1]), &mut a1);
                    fma8::<FMA>(lanes(p, at(t + 2)), lanes(row, b[2]), &mut a2);
                    fma8::<FMA>(lanes(p, at(t + 3)), lanes(row, b[3]), &mut a3);
                }
            }
            for (t, &b) in base.iter().enumerate().skip(n4) {
                unsafe { fma8::<FMA>(lanes(p, at(t)), lanes(row, b), &mut a0) };
            }
            let dst = &mut o[(h * hd + d) * 8..][..8];
            for l in 0..8 {
                dst[l] += (a0[l] + a1[l]) + (a2[l] + a3[l]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn diag_scores_avx2(
    qd: &[f32],
    kt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    scale: f32,
    s: &mut [f32],
) {
    diag_scores_body::<true>(qd, kt, width, base, hd, heads, scale, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn diag_pv_avx2(
    p: &[f32],
    vt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    o: &mut [f32],
) {
    diag_pv_body::<true>(p, vt, width, base, hd, heads, o)
}

#[allow(clippy::too_many_arguments)]
fn diag_scores(
    level: Level,
    qd: &[f32],
    kt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    scale: f32,
    s: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { diag_scores_avx2(qd, kt, width, base, hd, heads, scale, s) };
        return;
    }
    let _ = level;
    diag_scores_body::<false>(qd, kt, width, base, hd, heads, scale, s)
}

#[allow(clippy::too_many_arguments)]
fn diag_pv(
    level: Level,
    p: &[f32],
    vt: &[f32],
    width: usize,
    base: &[usize],
    hd: usize,
    heads: usize,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { diag_pv_avx2(p, vt, width, base, hd, heads, o) };
        return;
    }
    let _ = level;
    diag_pv_body::<false>(p, vt, width, base, hd, heads, o)
}

/// The keys a query at `p` reads under `pat`: columns `k ≤ p` and keys `p − o` for offsets
/// `o ≤ p`, as ascending disjoint ranges.
pub fn pattern_ranges(pat: &Pattern, p: usize) -> Vec<Range<usize>> {
    let mut keys: Vec<usize> = pat.columns.iter().copied().filter(|&k| k <= p).collect();
    keys.extend(pat.offsets.iter().filter(|&&o| o <= p).map(|&o| p - o));
    keys.sort_unstable();
    keys.dedup();
    let mut out: Vec<Range<usize>> = Vec::new();
    for k in keys {
        match out.last_mut() {
            Some(last) if last.end == k => last.end = k + 1,
            _ => out.push(k..k + 1),
        }
    }
    out
}

/// Exact attention of every row of the batch over its own keys of `patterns` (one per KV
/// head): for the query at `p`, columns `k ≤ p` and keys `p − o` for offsets `o ≤ p`, each
/// key once. Writes `out` like [`crate::attention::attend`] and returns the sum over query
/// rows × KV heads of the fraction of visible keys read, and the number of such rows.
pub fn attend_pattern(
    shape: AttnShape,
    store: &dyn KvSource,
    q: &[f32],
    pos0: usize,
    patterns: &[Pattern],
    out: &mut [f32],
) -> (f64, f64) {
    assert_eq!(patterns.len(), shape.n_head_kv, "one pattern per KV head");
    let level = Level::active();
    let n = q.len() / (shape.n_head * shape.head_dim);
    let mut sum = 0.0;
    for (g, pat) in patterns.iter().enumerate() {
        let kv = HeadKv::new(level, store, g, shape.head_dim, pos0 + n);
        sum += attend_head(level, shape, q, pos0, g, pat, &kv, out);
    }
    (sum, (n * shape.n_head_kv) as f64)
}

/// [`attend_pattern`] for KV head `g` (rows `kv`): writes the outputs of its query heads and
/// returns the sum over query rows of the fraction of visible keys read.
#[allow(clippy::too_many_arguments)]
fn attend_head(
    level: Level,
    shape: AttnShape,
    q: &[f32],
    pos0: usize,
    g: usize,
    pat: &Pattern,
    kv: &HeadKv,
    out: &mut [f32],
) -> f64 {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let q_dim = shape.n_head * hd;
    let n = q.len() / q_dim;
    let ctx = pos0 + n;
    if n == 0 {
        return 0.0;
    }
    // The columns' rows, gathered once; which offsets are diagonals; the offset runs.
    let nc = pat.columns.len();
    let mut kc = vec![0.0f32; nc * hd];
    let mut vc = vec![0.0f32; nc * hd];
    for (i, &k) in pat.columns.iter().enumerate() {
        kc[i * hd..(i + 1) * hd].copy_from_slice(&kv.k[k * hd..(k + 1) * hd]);
        vc[i * hd..(i + 1) * hd].copy_from_slice(&kv.v[k * hd..(k + 1) * hd]);
    }
    let mut is_off = vec![false; ctx];
    for &o in pat.offsets.iter().filter(|&&o| o < ctx) {
        is_off[o] = true;
    }
    // K and V transposed (`[d][PAD + key]`, zero-padded on both sides) for the diagonals.
    let width = ctx + 2 * PAD;
    let kt = transposed(&kv.k, ctx, hd);
    let vt = transposed(&kv.v, ctx, hd);
    let scale = 1.0 / (hd as f32).sqrt();

    // Tasks of UNIT consecutive tokens. Inside one, the column part runs per block of
    // 56/group tokens; the diagonal part per sub-block of 8 tokens, every sub-block taking
    // each tile of offsets in turn so that the transposed K/V columns a tile reads (which
    // shift by 8 from one sub-block to the next) stay in cache.
    let block = (BLOCK_ROWS / group).max(1);
    let units: Vec<Range<usize>> = (0..n.div_ceil(UNIT))
        .map(|u| u * UNIT..((u + 1) * UNIT).min(n))
        .collect();
    let rw2 = group * 8;
    struct Sub {
        start: usize,
        ns: usize,
        qd: Vec<f32>,
        od: Vec<f32>,
        m: Vec<f32>,
        l: Vec<f32>,
    }
    let results: Vec<(Vec<f32>, f64)> = units
        .par_iter()
        .map(|unit| {
            // Columns: each block's rows over the gathered columns, masked causally and
            // where a diagonal of the row's token holds the key.
            let mut cols: Vec<(Range<usize>, Acc)> = Vec::new();
            for b0 in unit.clone().step_by(block) {
                let tokens = b0..(b0 + block).min(unit.end);
                let nt = tokens.len();
                let mut acc = Acc::new(nt * group, hd);
                let qt = transpose(shape, q, tokens.clone(), g);
                let last_pos = pos0 + tokens.end - 1;
                let n_cols = pat.columns.partition_point(|&k| k <= last_pos);
                for start in (0..n_cols).step_by(TILE) {
                    let len = TILE.min(n_cols - start);
                    acc.scores(level, &kc[start * hd..], hd, len, &qt);
                    for j in 0..nt {
                        let p = pos0 + tokens.start + j;
                        for t in 0..len {
                            let k = pat.columns[start + t];
                            if k > p || is_off[p - k] {
                                acc.s[t * acc.rw + j * group..][..group].fill(f32::NEG_INFINITY);
                            }
                        }
                    }
                    acc.values(level, &vc[start * hd..], hd, len);
                }
                cols.push((tokens, acc));
            }

            // Diagonals, eight consecutive tokens at a time with the tokens as the vector
            // lanes: for offset `o`, token slot `j` reads key `p0 + j − o`, so the keys of
            // one offset are eight adjacent columns of the transposed K/V. Each token reads
            // exactly its own diagonal keys.
            let mut subs: Vec<Sub> = (unit.start..unit.end)
                .step_by(8)
                .map(|sb| {
                    let ns = 8.min(unit.end - sb);
                    let mut qd = vec![0.0f32; group * hd * 8];
                    for j in 0..ns {
                        for h in 0..group {
                            let qr = &q[(sb + j) * q_dim + (g * group + h) * hd..][..hd];
                            for (d, &x) in qr.iter().enumerate() {
                                qd[(h * hd + d) * 8 + j] = x;
                            }
                        }
                    }
                    Sub {
                        start: sb,
                        ns,
                        qd,
                        od: vec![0.0f32; group * hd * 8],
                        m: vec![f32::NEG_INFINITY; rw2],
                        l: vec![0.0; rw2],
                    }
                })
                .collect();
            let mut corr = vec![0f32; rw2];
            let mut s2 = vec![0.0f32; TILE * rw2];
            let mut base = Vec::with_capacity(TILE);
            let n_offs = pat.offsets.partition_point(|&o| o < pos0 + unit.end);
            for chunk in pat.offsets[..n_offs].chunks(TILE) {
                for sub in subs.iter_mut() {
                    let p0 = pos0 + sub.start;
                    let ns = sub.ns;
                    // Offsets beyond the sub-block's last position are read by none of it.
                    let chunk = &chunk[..chunk.partition_point(|&o| o < p0 + ns)];
                    let nt = chunk.len();
                    if nt == 0 {
                        continue;
                    }
                    base.clear();
                    base.extend(chunk.iter().map(|&o| p0 + PAD - o));
                    let s2 = &mut s2[..nt * rw2];
                    diag_scores(level, &sub.qd, &kt, width, &base, hd, group, scale, s2);
                    for (t, &o) in chunk.iter().enumerate() {
                        // Slot `j` exists and its key `p0 + j − o` is a position.
                        let lo = o.saturating_sub(p0);
                        if lo == 0 && ns == 8 {
                            continue;
                        }
                        for h in 0..group {
                            let v = &mut s2[t * rw2 + h * 8..][..8];
                            v[..lo.min(8)].fill(f32::NEG_INFINITY);
                            v[ns..].fill(f32::NEG_INFINITY);
                        }
                    }
                    softmax_tile(level, s2, nt, rw2, &mut sub.m, &mut sub.l, &mut corr);
                    if corr.iter().any(|&c| c != 1.0) {
                        for h in 0..group {
                            let c = &corr[h * 8..(h + 1) * 8];
                            for v in sub.od[h * hd * 8..(h + 1) * hd * 8].chunks_exact_mut(8) {
                                v.iter_mut().zip(c).for_each(|(a, &c)| *a *= c);
                            }
                        }
                    }
                    diag_pv(level, s2, &vt, width, &base, hd, group, &mut sub.od);
                }
            }

            // Merge the two parts of every row by log-sum-exp; count what each token read.
            let mut res = vec![0.0f32; unit.len() * group * hd];
            let mut frac = 0.0f64;
            for sub in &subs {
                for j in 0..sub.ns {
                    let tk = sub.start + j;
                    let p = pos0 + tk;
                    let n_diag = pat.offsets.partition_point(|&o| o <= p);
                    let n_cols_p = pat.columns.partition_point(|&k| k <= p);
                    let overlap = pat.columns[..n_cols_p]
                        .iter()
                        .filter(|&&k| is_off[p - k])
                        .count();
                    frac += (n_cols_p - overlap + n_diag) as f64 / (p + 1) as f64;
                    let (tokens, acc) = &cols[(tk - unit.start) / block];
                    for h in 0..group {
                        let r = (tk - tokens.start) * group + h;
                        let r2 = h * 8 + j;
                        let at = ((tk - unit.start) * group + h) * hd;
                        let dst = &mut res[at..at + hd];
                        let (m1, l1, o1) = (acc.m[r], acc.l[r], &acc.o[r * hd..(r + 1) * hd]);
                        let mx = m1.max(sub.m[r2]);
                        if mx == f32::NEG_INFINITY {
                            continue;
                        }
                        let w = |m: f32| {
                            if m == f32::NEG_INFINITY {
                                0.0
                            } else {
                                (m - mx).exp()
                            }
                        };
                        let (w1, w2) = (w(m1), w(sub.m[r2]));
                        let inv = 1.0 / (w1 * l1 + w2 * sub.l[r2]);
                        for (d, x) in dst.iter_mut().enumerate() {
                            *x = (w1 * o1[d] + w2 * sub.od[(h * hd + d) * 8 + j]) * inv;
                        }
                    }
                }
            }
            (res, frac)
        })
        .collect();

    let mut frac = 0.0;
    for (tokens, (res, f)) in units.iter().zip(results) {
        frac += f;
        for (j, token) in tokens.clone().enumerate() {
            let src = &res[j * group * hd..(j + 1) * group * hd];
            out[token * q_dim + g * group * hd..][..group * hd].copy_from_slice(src);
        }
    }
    frac
}

impl SparsePolicy for MInferenceAttention {
    fn name(&self) -> &str {
        "minference"
    }

    fn supports_decode(&self) -> bool {
        false
    }

    /// The vertical-slash pattern as per-token key ranges, per KV head (or everything for a
    /// batch that runs dense). The executor could run it, but token-level diagonals cost it
    /// a tile per key: [`Self::attend_own`] runs the pattern instead; this plan is what the
    /// policy reads (for evaluation and stores).
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, pos0, n) = (ctx.shape, ctx.pos0, ctx.n_tokens());
        let Some(patterns) = self.patterns(shape, ctx.store, ctx.layer, ctx.q, pos0) else {
            return ReadPlan::causal(shape, pos0, n);
        };
        let entries = patterns
            .iter()
            .enumerate()
            .map(|(h, pat)| PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                visible: (0..n).map(|i| pattern_ranges(pat, pos0 + i)).collect(),
            })
            .collect();
        ReadPlan {
            entries,
            side: Vec::new(),
        }
    }

    /// Runs the pattern with its own kernels (columns through the dense kernel, diagonals
    /// with tokens as vector lanes); dense batches are left to the executor.
    fn attend_own(&mut self, ctx: &PlanContext<'_>, out: &mut [f32]) -> bool {
        let (shape, pos0, layer, q) = (ctx.shape, ctx.pos0, ctx.layer, ctx.q);
        let n = ctx.n_tokens();
        let rows = (n * shape.n_head_kv) as f64;
        if self.dense_for(layer, n, pos0 + n) {
            if n > 1 {
                self.record(layer, rows, rows);
            }
            return false;
        }
        // One KV head at a time (its f32 rows live only that long), each parallel inside.
        let level = Level::active();
        let mut sum = 0.0;
        for g in 0..shape.n_head_kv {
            let kv = HeadKv::new(level, ctx.store, g, shape.head_dim, pos0 + n);
            let scores = self.estimate_head(level, shape, q, pos0, g, &kv);
            let pattern = self.select(&scores, pos0 + n);
            sum += attend_head(level, shape, q, pos0, g, &pattern, &kv, out);
        }
        self.record(layer, sum, rows);
        true
    }

    /// Estimated average fraction of the visible keys a query row reads in a prefill of
    /// `n_ctx` tokens in batches of 512: a query at `p` of a batch reaching context `c`
    /// reads `min(p + 1, budget × c)` keys in sparse layers and batches, all in dense ones.
    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let mut sparse_sum = 0.0f64;
        for pos0 in (0..n_ctx).step_by(PREFILL_BATCH) {
            let n = PREFILL_BATCH.min(n_ctx - pos0);
            let ctx = pos0 + n;
            // Dense layers are accounted below; here any layer not listed as dense.
            let dense = n <= 1
                || ctx <= self.settings.sinks + self.settings.recent + DENSE_MARGIN
                || self.settings.budget_keys(ctx) >= ctx;
            let want = self.settings.budget_keys(ctx);
            for p in pos0..ctx {
                sparse_sum += if dense {
                    1.0
                } else {
                    (p + 1).min(want) as f64 / (p + 1) as f64
                };
            }
        }
        let sparse = sparse_sum / n_ctx as f64;
        let n_layer = self.n_layer.max(1);
        let n_dense = (0..n_layer)
            .filter(|l| self.settings.dense_layers.contains(l))
            .count();
        (n_dense as f64 + (n_layer - n_dense) as f64 * sparse) / n_layer as f64
    }
}
