//! Block-sparse prefill with key blocks chosen by antidiagonal scores (after XAttention,
//! Xu et al., 2025).
//!
//! A prefill batch is cut into query blocks of `block` tokens and the context into key
//! blocks of `block` positions. For each (layer, KV head, query block) the policy estimates
//! how much attention mass each key block gets, keeps the smallest set of blocks holding a
//! `threshold` share of it (plus the first block — the attention sink — and the diagonal
//! and previous blocks), and plans exactly those key ranges. The shared executor then runs
//! them through the dense tile kernel: whole 64-key blocks, contiguous reads, nothing
//! computed outside the plan — unlike token-level diagonals, which a kernel reads at
//! scattered addresses.
//!
//! **The estimate.** Within a `stride × stride` cell of the score matrix, the antidiagonal
//! (query `S − 1 − j` with key `j` of the cell) touches every query row and every key
//! column of the cell once, so a large score anywhere in a row or column shows on it — a
//! vertical line (a sink, a needle) as well as a slash. Summing it costs one dot product
//! of `stride·head_dim` values per cell: stacking `S` consecutive queries in reverse order
//! and `S` consecutive keys in order gives vectors whose product *is* the antidiagonal sum,
//! so the estimate is one dense product at `1 / stride` of the full `QKᵀ` work, run on
//! the attention kernel's tested `scores` tile. Keys of a head are contiguous once
//! converted to f32, so the stacked keys need no copy. Each stacked query row's scores
//! (scaled by `1 / (√d · S)`: the antidiagonal's mean) go through a causal softmax; the
//! probabilities, summed over the cells of a (query block, key block) pair and over the
//! query heads of the GQA group (they share one plan, as they share the K/V rows the
//! executor loads), are the block's estimated mass.
//!
//! **The question at its own threshold.** The prompt's last `tail` tokens (the question,
//! whose states the answer reads first) keep `tail_threshold` of the mass, the body before
//! them `threshold`: on RULER a body at 0.95 lost a look-alike key that the question's 0.99
//! brought back, and chains and counts the body needs 0.97 for. The caller says where the
//! prompt ends ([`SparsePolicy::prompt_ends_at`]); without that, every block is the tail's.
//!
//! **Exact within the plan.** Every query reads its selected blocks up to its own
//! position, through the same kernel as `full`; with a threshold of 1 every block is kept
//! and the plan is `full`'s. Dense attention is used for single tokens, layers in
//! `dense_layers` and contexts of at most [`DENSE_CONTEXT`] positions.

use super::{AttentionChoice, PolicyEntry, SettingsType};
use rayon::prelude::*;
use sparrow_attn::kernel::tile::{scores, softmax_tile, Tile};
use sparrow_attn::kernel::{read_head_f32, AttnShape, KvSource, Level, TILE};
use sparrow_attn::policy::{PlanContext, PlanEntry, ReadPlan, Source, SparsePolicy};
use std::ops::Range;

/// The registry's entry: a prefill policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "xattention",
    summary: "prefill: block-sparse, key blocks chosen by antidiagonal scores",
    prefill: true,
    decode: false,
    build: |b| {
        Ok(Box::new(XAttention::new(
            settings(b.choice)?,
            b.model.n_layer,
        )?))
    },
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<XAttentionSettings>(),
};

/// The settings with the shared `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<XAttentionSettings, String> {
    let mut s = c.settings::<XAttentionSettings>();
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// Contexts up to this many positions run dense attention: a few blocks, little to skip.
pub const DENSE_CONTEXT: usize = 1024;

/// XAttention settings.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct XAttentionSettings {
    /// XAttention: share of each query block's estimated attention mass its key blocks
    /// must hold, in the prompt's body (0..=1; 1 keeps every block).
    #[cfg_attr(feature = "cli", arg(id = "XATTN_THRESHOLD", long = "xattn-threshold", default_value_t = 0.97, help_heading = crate::policy::HELP_HEADING))]
    pub threshold: f64,
    /// XAttention: the same share for the prompt's last `--xattn-tail` tokens (the
    /// question, whose states the answer reads first) and for every block when the prompt's
    /// end is not known.
    #[cfg_attr(feature = "cli", arg(id = "XATTN_TAIL_THRESHOLD", long = "xattn-tail-threshold", default_value_t = 0.99, help_heading = crate::policy::HELP_HEADING))]
    pub tail_threshold: f64,
    /// XAttention: tokens at the end of the prompt that use `--xattn-tail-threshold`.
    #[cfg_attr(feature = "cli", arg(id = "XATTN_TAIL", long = "xattn-tail", default_value_t = 256, help_heading = crate::policy::HELP_HEADING))]
    pub tail: usize,
    /// XAttention: queries and keys per antidiagonal of the estimate (the estimate costs
    /// 1/stride of the dense scores; a divisor of the block size).
    #[cfg_attr(feature = "cli", arg(id = "XATTN_STRIDE", long = "xattn-stride", default_value_t = 16, help_heading = crate::policy::HELP_HEADING))]
    pub stride: usize,
    /// Tokens per query block and positions per key block.
    #[cfg_attr(feature = "cli", arg(skip = 64usize))]
    pub block: usize,
    /// Key blocks at the start every query block reads (the attention sink).
    #[cfg_attr(feature = "cli", arg(skip = 1usize))]
    pub sink_blocks: usize,
    /// Key blocks before the diagonal one every query block reads.
    #[cfg_attr(feature = "cli", arg(skip = 1usize))]
    pub recent_blocks: usize,
    /// Layers that keep exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub dense_layers: Vec<usize>,
}

impl Default for XAttentionSettings {
    fn default() -> Self {
        XAttentionSettings {
            threshold: 0.97,
            tail_threshold: 0.99,
            tail: 256,
            stride: 16,
            block: 64,
            sink_blocks: 1,
            recent_blocks: 1,
            dense_layers: Vec::new(),
        }
    }
}

impl XAttentionSettings {
    /// Checks the settings, naming the bad one and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, t) in [
            ("threshold", self.threshold),
            ("tail threshold", self.tail_threshold),
        ] {
            if !(t > 0.0 && t <= 1.0) {
                return Err(format!(
                    "xattention {name} {t} is out of range (0 < threshold <= 1, a share of the attention mass)"
                ));
            }
        }
        if self.block == 0 || self.block > 4096 {
            return Err(format!(
                "xattention block {} is out of range (1..=4096 tokens)",
                self.block
            ));
        }
        if self.stride == 0 || !self.block.is_multiple_of(self.stride) {
            return Err(format!(
                "xattention stride {} must divide the block size {} (and be at least 1)",
                self.stride, self.block
            ));
        }
        Ok(())
    }
}

/// Estimated attention mass of one KV head's query blocks over the key blocks:
/// `mass[qb * k_blocks + kb]`, query blocks counted from the batch's first token, key
/// blocks from position 0.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockMass {
    /// Query blocks in the batch.
    pub q_blocks: usize,
    /// Key blocks in the context.
    pub k_blocks: usize,
    /// The mass, row-major by query block.
    pub mass: Vec<f32>,
}

impl BlockMass {
    /// The mass query block `qb` gives each key block.
    pub fn row(&self, qb: usize) -> &[f32] {
        &self.mass[qb * self.k_blocks..(qb + 1) * self.k_blocks]
    }
}

/// The XAttention prefill backend (one per sequence).
pub struct XAttention {
    settings: XAttentionSettings,
    /// Per layer, for the last prefill batch: (sum over query rows × KV heads of the
    /// fraction of visible keys read, number of such rows).
    last: Vec<(f64, f64)>,
    /// Where the prompt being prefilled ends, when the caller said
    /// ([`SparsePolicy::prompt_ends_at`]).
    prompt_end: Option<usize>,
}

impl XAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: XAttentionSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(XAttention {
            settings,
            last: vec![(0.0, 0.0); n_layer],
            prompt_end: None,
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &XAttentionSettings {
        &self.settings
    }

    /// Measured fraction of the visible keys read per query row in the last prefill batch
    /// (averaged over layers and KV heads; dense layers count 1), if any.
    pub fn last_selectivity(&self) -> Option<f64> {
        let (sum, count) = self
            .last
            .iter()
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        (count > 0.0).then(|| sum / count)
    }

    /// Whether a batch of `n` tokens reaching context `ctx` in `layer` runs dense attention.
    fn dense_for(&self, layer: usize, n: usize, ctx: usize) -> bool {
        n <= 1 || ctx <= DENSE_CONTEXT || self.settings.dense_layers.contains(&layer)
    }

    /// Estimated block mass of KV head `kv_head` for the batch `q` at `pos0` (see the
    /// module notes), from keys `0..pos0 + n` of `store`.
    pub fn block_mass(
        &self,
        shape: AttnShape,
        store: &dyn KvSource,
        q: &[f32],
        pos0: usize,
        kv_head: usize,
    ) -> BlockMass {
        let (hd, group) = (shape.head_dim, shape.group());
        let (s, b) = (self.settings.stride, self.settings.block);
        let n = q.len() / shape.q_dim().max(1);
        let ctx = pos0 + n;
        let level = Level::active();
        let wide = s * hd;

        // Stacked keys: the head's keys as f32, zero rows up to a whole stride.
        let nk = ctx.div_ceil(s);
        let keys = head_keys(level, store, kv_head, hd, ctx, nk * s);
        // Stacked queries, transposed: row `h * nr + r` is head `h` of the group over batch
        // tokens `r·S + S − 1, …, r·S` (reversed; tokens past the batch are zero).
        let nr = n.div_ceil(s);
        let rows = group * nr;
        let rw = rows.div_ceil(8) * 8;
        let mut qt = vec![0.0f32; wide * rw];
        for h in 0..group {
            let head = kv_head * group + h;
            for r in 0..nr {
                for j in 0..s {
                    let t = r * s + (s - 1 - j);
                    if t >= n {
                        continue;
                    }
                    let qr = &q[t * shape.q_dim() + head * hd..][..hd];
                    for (d, &x) in qr.iter().enumerate() {
                        qt[(j * hd + d) * rw + h * nr + r] = x;
                    }
                }
            }
        }
        // Scores of every stacked key (key-major, `sc[c * rw + row]`), in parallel chunks.
        let scale = 1.0 / ((hd as f32).sqrt() * s as f32);
        let mut sc = vec![0.0f32; nk * rw];
        sc.par_chunks_mut(TILE * rw)
            .enumerate()
            .for_each(|(i, dst)| {
                let c0 = i * TILE;
                let m = dst.len() / rw;
                let keys = Tile::new(&keys[c0 * wide..], wide, m, wide);
                scores(level, keys, &qt, rw, scale, dst);
            });
        // Causal: a stacked query sees the stacked keys up to its last real token's position.
        let last_key = |row: usize| {
            let r = row % nr;
            ((pos0 + ((r + 1) * s).min(n) - 1) / s).min(nk - 1)
        };
        for c in pos0 / s..nk {
            for row in (0..rows).filter(|&row| c > last_key(row)) {
                sc[c * rw + row] = f32::NEG_INFINITY;
            }
        }
        // Each row's softmax over its stacked keys (padding rows have all-zero scores and
        // are never read).
        let mut m = vec![f32::NEG_INFINITY; rw];
        let mut l = vec![0.0f32; rw];
        let mut corr = vec![0.0f32; rw];
        softmax_tile(level, &mut sc, nk, rw, &mut m, &mut l, &mut corr);
        let inv: Vec<f32> = l
            .iter()
            .map(|&z| if z > 0.0 { 1.0 / z } else { 0.0 })
            .collect();
        // Probabilities summed per (key block, row), then rows into their query block.
        let (q_blocks, k_blocks) = (n.div_ceil(b), ctx.div_ceil(b));
        let per_block = b / s;
        let mut per_row = vec![0.0f32; k_blocks * rw];
        for (c, p) in sc.chunks_exact(rw).enumerate() {
            let acc = &mut per_row[(c / per_block) * rw..][..rw];
            for ((a, &p), &w) in acc.iter_mut().zip(p).zip(&inv) {
                *a += p * w;
            }
        }
        let mut mass = vec![0.0f32; q_blocks * k_blocks];
        for (kb, acc) in per_row.chunks_exact(rw).enumerate() {
            for (row, &x) in acc[..rows].iter().enumerate() {
                mass[(row % nr) / per_block * k_blocks + kb] += x;
            }
        }
        BlockMass {
            q_blocks,
            k_blocks,
            mass,
        }
    }

    /// The share of the estimated mass a query block whose last token is at `last` keeps:
    /// `tail_threshold` in the prompt's last `tail` tokens, after it, and everywhere when
    /// the prompt's end is unknown; `threshold` in the body before them.
    pub fn threshold_at(&self, last: usize) -> f64 {
        let st = &self.settings;
        match self.prompt_end {
            Some(end) if last.saturating_add(st.tail) < end => st.threshold,
            _ => st.tail_threshold,
        }
    }

    /// The key blocks query block `qb` of a batch at `pos0` of `n` tokens reads, ascending:
    /// the sink and recent blocks, then the blocks of most estimated mass until they hold
    /// [`Self::threshold_at`] of the row's total (every block at a threshold of 1).
    pub fn select(&self, mass: &BlockMass, qb: usize, pos0: usize, n: usize) -> Vec<usize> {
        let st = &self.settings;
        let first = pos0 + qb * st.block;
        let last = pos0 + ((qb + 1) * st.block).min(n) - 1;
        let visible = last / st.block + 1;
        let recent_from = (first / st.block).saturating_sub(st.recent_blocks);
        let forced = |kb: usize| kb < st.sink_blocks || kb >= recent_from;
        let threshold = self.threshold_at(last);
        if threshold >= 1.0 {
            return (0..visible).collect();
        }
        // `visible <= k_blocks`: the batch's last position is below the context's end.
        let row = &mass.row(qb)[..visible];
        let total: f64 = row.iter().map(|&x| x as f64).sum();
        let mut kept = 0.0f64;
        let mut chosen = vec![false; visible];
        for kb in (0..visible).filter(|&kb| forced(kb)) {
            chosen[kb] = true;
            kept += row[kb] as f64;
        }
        let mut rest: Vec<usize> = (0..visible).filter(|&kb| !forced(kb)).collect();
        rest.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for kb in rest {
            if kept >= threshold * total || row[kb] <= 0.0 {
                break;
            }
            chosen[kb] = true;
            kept += row[kb] as f64;
        }
        (0..visible).filter(|&kb| chosen[kb]).collect()
    }

    /// Per KV head, per query block, the key blocks read ([`Self::select`] over
    /// [`Self::block_mass`]), or `None` when the batch runs dense attention.
    pub fn selections(
        &self,
        shape: AttnShape,
        store: &dyn KvSource,
        layer: usize,
        q: &[f32],
        pos0: usize,
    ) -> Option<Vec<Vec<Vec<usize>>>> {
        let n = q.len() / shape.q_dim().max(1);
        if self.dense_for(layer, n, pos0 + n) {
            return None;
        }
        let heads = (0..shape.n_head_kv)
            .into_par_iter()
            .map(|g| {
                let mass = self.block_mass(shape, store, q, pos0, g);
                (0..mass.q_blocks)
                    .map(|qb| self.select(&mass, qb, pos0, n))
                    .collect()
            })
            .collect();
        Some(heads)
    }

    fn record(&mut self, layer: usize, sum: f64, count: f64) {
        if let Some(m) = self.last.get_mut(layer) {
            *m = (sum, count);
        }
    }
}

/// The read plan of per-head, per-query-block key block lists (`blocks[kv_head][qb]`,
/// ascending) for a batch of `n` tokens at `pos0`: token `i` reads its query block's key
/// blocks up to its own position, adjacent blocks merged into one range.
pub fn block_plan<'p>(
    shape: AttnShape,
    block: usize,
    pos0: usize,
    n: usize,
    blocks: &[Vec<Vec<usize>>],
) -> ReadPlan<'p> {
    let entries = blocks
        .iter()
        .enumerate()
        .take(shape.n_head_kv)
        .map(|(g, per_qb)| {
            let visible = (0..n)
                .map(|i| {
                    let end = pos0 + i + 1;
                    let mut ranges: Vec<Range<usize>> = Vec::new();
                    for &kb in &per_qb[i / block] {
                        let r = kb * block..((kb + 1) * block).min(end);
                        if r.is_empty() {
                            continue;
                        }
                        match ranges.last_mut() {
                            Some(prev) if prev.end == r.start => prev.end = r.end,
                            _ => ranges.push(r),
                        }
                    }
                    ranges
                })
                .collect();
            PlanEntry {
                kv_heads: g..g + 1,
                source: Source::Store,
                weight: 1.0,
                visible,
            }
        })
        .collect();
    ReadPlan {
        entries,
        side: Vec::new(),
    }
}

/// KV head `kv_head`'s keys `0..ctx` of `store` as f32 rows of `hd`, followed by zero rows
/// up to `rows`, converted in parallel chunks.
fn head_keys(
    level: Level,
    store: &dyn KvSource,
    kv_head: usize,
    hd: usize,
    ctx: usize,
    rows: usize,
) -> Vec<f32> {
    const CHUNK: usize = 1024;
    let mut dst = vec![0.0f32; rows.max(ctx) * hd];
    dst[..ctx * hd]
        .par_chunks_mut(CHUNK * hd)
        .enumerate()
        .for_each(|(c, d)| read_head_f32(level, store, false, kv_head, hd, c * CHUNK, d));
    dst
}

/// Sum over tokens of the fraction of its visible keys token `i` reads in `visible[i]`.
fn fraction_sum(pos0: usize, visible: &[Vec<Range<usize>>]) -> f64 {
    visible
        .iter()
        .enumerate()
        .map(|(i, v)| v.iter().map(|r| r.len()).sum::<usize>() as f64 / (pos0 + i + 1) as f64)
        .sum()
}

impl SparsePolicy for XAttention {
    fn name(&self) -> &str {
        "xattention"
    }

    fn supports_decode(&self) -> bool {
        false
    }

    fn prompt_ends_at(&mut self, end: usize) {
        self.prompt_end = Some(end);
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, pos0, n) = (ctx.shape, ctx.pos0, ctx.n_tokens());
        let rows = (n * shape.n_head_kv) as f64;
        let Some(blocks) = self.selections(shape, ctx.store, ctx.layer, ctx.q, pos0) else {
            if n > 1 {
                self.record(ctx.layer, rows, rows);
            }
            return ReadPlan::causal(shape, pos0, n);
        };
        let plan = block_plan(shape, self.settings.block, pos0, n, &blocks);
        let sum = plan
            .entries
            .iter()
            .map(|e| fraction_sum(pos0, &e.visible))
            .sum();
        self.record(ctx.layer, sum, rows);
        plan
    }

    /// The fraction of the visible keys a prefill query read in the last batch (measured;
    /// the threshold, not a budget, sets it), 1 before any prefill.
    fn fraction_read(&self, _n_ctx: usize) -> f64 {
        self.last_selectivity().unwrap_or(1.0)
    }
}
