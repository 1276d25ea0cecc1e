//! Saap (asymmetric partitions with a trained query classifier) for decode.
//!
//! Keys and queries follow different distributions, so instead of searching the keys with
//! the query, the *de-roped* keys (RoPE undone: position no longer colours them) are
//! partitioned by k-means trained offline, and a small trained classifier (the Q-model)
//! maps a de-roped query to the buckets that hold its attention mass
//! ([`crate::saap::SaapIndex`], built by `sparrow saap train`).
//!
//! As each KV block is sealed its keys are de-roped and appended to their bucket's
//! inverted list (positions, ascending). A decode step runs the Q-model on every query
//! head of a GQA group, sums the group's distributions (the paper's batched queries), and
//! reads the positions of the top-`probes` buckets plus a dense sink (position 0) and the
//! recent `window` positions, merged by log-sum-exp in the executor. Layer 0 stays dense
//! (as the paper: its attention is spread out); `--dense-layers` changes that. A rewind
//! prunes the lists.
//!
//! The same index read without its Q-model — the query picking buckets by its own
//! similarity to the centroids, plain k-means as in the paper's baseline — is the `kmeans`
//! policy ([`kmeans`]).
//!
//! The default router (`--saap-router cells`) keeps the partition but not the bucket
//! ranking: each bucket is split by position segment (8 × C positions by default) into
//! cells ([`cells`]), and a step reads the cells whose live statistics (the
//! longest RoPE'd key, and the count and mean of the others) promise the most mass for the
//! group's summed query — direction from the partition, locality from the segments. The
//! Q-model routers above remain (`--saap-router hedged` or `qmodel`).
//!
//! With `--saap-layout buckets` (the default) the store keeps each sparse layer's rows
//! grouped by bucket: the policy names the bucket of every sealed row
//! ([`SparsePolicy::placement`]) and reads a chosen bucket's entries as runs of the
//! store's slots — one copy of the KV (`crate::kv::ArrangedStore`).
//!
//! Files: [`settings`] (flags, checks, the index they name), [`lists`] (the inverted lists
//! kept as blocks seal), [`routing`] (one step's choice per KV head), [`cells`] (positional
//! cells), [`kmeans`] (the baseline policy).

pub mod cells;
pub mod kmeans;
mod lists;
mod routing;
pub mod settings;
#[cfg(test)]
mod tests;

use super::oracle::group_key_mass;
use super::{PolicyEntry, SettingsType};
use crate::model::rope::Rope;
use crate::saap::index::{RouterCopy, Scratch};
use crate::saap::SaapIndex;
use cells::CellStats;
use lists::{CellLists, LayerLists, Lists};
use rayon::prelude::*;
use routing::{router_weights, HeadReads, HeadWork, Step};
use settings::{load_index, settings, SINKS};
pub use settings::{Layout, Router, RouterPrecision, SaapSettings, KEYS_PER_CELL};
use sparrow_attn::kernel::{read_f32, Level};
use sparrow_attn::policy::{
    KeysView, Partition, PlanContext, PlanEntry, ReadPlan, Source, SparsePolicy,
};
use std::sync::Arc;

/// The registry's entry: a decode policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "saap",
    summary: "decode: buckets of de-roped keys chosen by a trained query classifier",
    prefill: false,
    decode: true,
    build: |b| {
        let s = settings(b.choice, None)?;
        let index = load_index(&s, b.model)?;
        Ok(Box::new(SaapAttention::new(s, index, Rope::of(b.model))?))
    },
    check: |c| settings(c, None).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<SaapSettings>(),
};

/// The Saap policy (one per sequence; the index is shared).
pub struct SaapAttention {
    settings: SaapSettings,
    index: Arc<SaapIndex>,
    rope: Rope,
    /// Per (layer, KV head), layer-major: the router matrices in Q8_0
    /// ([`RouterPrecision::Q8`]; empty with f32).
    copies: Vec<RouterCopy>,
    layers: Vec<LayerLists>,
    // Scratch, kept between calls.
    keys: Vec<f32>,
    /// With [`SaapSettings::oracle`]: every key of the layer, f32.
    all_keys: Vec<f32>,
    head_keys: Vec<f32>,
    buckets: Vec<u32>,
    scratch: Scratch,
    /// One per KV head: a decode step routes the KV heads in parallel.
    work: Vec<HeadWork>,
    /// Keys read to fold into the cells.
    fold_buf: Vec<f32>,
    /// The buckets of the block last sealed, per KV head (head-major), when its layer is
    /// placed by bucket ([`SparsePolicy::placement`]); empty otherwise.
    placed: Vec<u32>,
}

impl SaapAttention {
    /// A policy over `index` for a model rotating by `rope`, routing by `settings.router`.
    pub fn new(settings: SaapSettings, index: Arc<SaapIndex>, rope: Rope) -> Result<Self, String> {
        settings.validate()?;
        let m = &index.meta;
        let cells = settings.router == Router::Cells;
        let layers = (0..m.n_layer)
            .map(|l| LayerLists {
                heads: vec![
                    if !cells {
                        Lists {
                            buckets: vec![Vec::new(); m.clusters],
                            cells: None,
                        }
                    } else if settings.dense_layers.contains(&l) {
                        Lists::default()
                    } else {
                        Lists {
                            buckets: Vec::new(),
                            cells: Some(CellLists::new(CellStats::new(
                                settings.segment_for(m.clusters),
                                m.clusters,
                                m.head_dim,
                            ))),
                        }
                    };
                    m.n_head_kv
                ],
                assigned: 0,
            })
            .collect();
        let work = vec![HeadWork::default(); m.n_head_kv];
        // Cells rank by their own statistics: no router matrix is read.
        let copies = match settings.router_weights {
            RouterPrecision::Q8 if !cells => index.heads.iter().map(RouterCopy::of).collect(),
            _ => Vec::new(),
        };
        Ok(SaapAttention {
            settings,
            index,
            rope,
            copies,
            layers,
            keys: Vec::new(),
            all_keys: Vec::new(),
            head_keys: Vec::new(),
            buckets: Vec::new(),
            scratch: Scratch::default(),
            work,
            fold_buf: Vec::new(),
            placed: Vec::new(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &SaapSettings {
        &self.settings
    }

    fn is_dense(&self, layer: usize) -> bool {
        self.settings.dense_layers.contains(&layer) || layer >= self.layers.len()
    }
}

impl SparsePolicy for SaapAttention {
    fn name(&self) -> &str {
        if self.settings.oracle {
            return "bucket-oracle";
        }
        match self.settings.router {
            Router::Hedged | Router::Qmodel => "saap",
            Router::Centroids => "kmeans",
            Router::Cells => "saap-cells",
        }
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn requires_block_selection(&self) -> bool {
        true
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.settings.block)
    }

    /// With [`Layout::Buckets`], the store sorts each segment of the cells' length by
    /// bucket: a cell is one run of slots.
    fn partition(&self, layer: usize) -> Option<Partition> {
        let c = self.index.meta.clusters;
        (self.settings.layout == Layout::Buckets && !self.is_dense(layer)).then(|| Partition {
            bins: c,
            segment: self.settings.segment_for(c),
        })
    }

    fn placement(&self) -> Option<&[u32]> {
        (!self.placed.is_empty()).then_some(&self.placed[..])
    }

    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        self.placed.clear();
        if self.is_dense(layer) {
            return;
        }
        let start = block * self.settings.block;
        let lists = &self.layers[layer];
        if start < lists.assigned {
            // Already in the lists (sealed again without a rewind in between).
            return;
        }
        if start > lists.assigned {
            // Blocks arrive in order from the last rewind; a gap is a bug upstream. Skipping
            // keeps the lists sorted (the missing positions stay readable in the window only).
            debug_assert_eq!(start, lists.assigned, "blocks are sealed in order");
            return;
        }
        let (hd, kv) = (keys.head_dim(), keys.kv_heads());
        // De-rope the block's keys, then assign each KV head's in one product.
        self.keys.clear();
        self.keys.extend_from_slice(keys.as_slice());
        for (row, k) in self.keys.chunks_exact_mut(kv * hd).enumerate() {
            self.rope.unrotate(k, hd, start + row);
        }
        for h in 0..kv {
            self.head_keys.clear();
            for k in self.keys.chunks_exact(kv * hd) {
                self.head_keys.extend_from_slice(&k[h * hd..(h + 1) * hd]);
            }
            self.index.head(layer, h).assign(
                Level::active(),
                &self.head_keys,
                &mut self.scratch,
                &mut self.buckets,
            );
            let head = &mut self.layers[layer].heads[h];
            match &mut head.cells {
                // Bucket ids fit two bytes: an index has at most `MAX_WIDTH` (2¹⁶) buckets.
                Some(cells) => cells
                    .bucket_of
                    .extend(self.buckets.iter().map(|&b| b as u16)),
                None => {
                    for (row, &b) in self.buckets.iter().enumerate() {
                        head.buckets[b as usize].push((start + row) as u32);
                    }
                }
            }
            if self.settings.layout == Layout::Buckets {
                self.placed.extend_from_slice(&self.buckets);
            }
        }
        self.layers[layer].assigned = start + keys.rows();
    }

    fn forget_from(&mut self, pos: usize) {
        // Blocks are re-sealed whole, so forget from the start of the block `pos` is in.
        let from = pos / self.settings.block * self.settings.block;
        for layer in &mut self.layers {
            if layer.assigned <= from {
                continue;
            }
            for head in &mut layer.heads {
                head.forget_from(from);
            }
            layer.assigned = from;
        }
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, n) = (ctx.shape, ctx.pos0 + 1);
        if self.is_dense(ctx.layer) {
            return ReadPlan::causal(shape, ctx.pos0, ctx.n_tokens());
        }
        let hd = shape.head_dim;
        // Cells fold while prefill plans too, so the first decode step does not fold the
        // whole prompt.
        self.layers[ctx.layer].fold_cells(ctx.store, hd, &mut self.fold_buf);
        let window_start = n.saturating_sub(self.settings.window);
        if ctx.n_tokens() != 1 || window_start <= SINKS {
            return ReadPlan::causal(shape, ctx.pos0, ctx.n_tokens());
        }
        // Positions the lists do not hold yet (not sealed) must lie in the window.
        debug_assert!(self.layers[ctx.layer].assigned >= window_start);
        // A store that keeps the layer by bucket serves the cells' complete segments; for
        // any other, the policy sorts them itself.
        let by_bin = self.settings.layout == Layout::Buckets
            && (0..shape.n_head_kv).all(|h| ctx.store.keeps_bins(h));
        if !by_bin {
            self.layers[ctx.layer].sort_segments();
        }
        let SaapAttention {
            settings,
            index,
            rope,
            copies,
            layers,
            work,
            all_keys,
            ..
        } = self;
        if settings.oracle {
            all_keys.resize(n * shape.kv_dim(), 0.0);
            read_f32(ctx.store, false, hd, 0, all_keys);
        }
        let all_keys: &[f32] = all_keys;
        let lists: &'p LayerLists = &layers[ctx.layer];
        work.resize(shape.n_head_kv, HeadWork::default());
        // Routing (the Q-model's weights, 0.5 MiB per KV head at 1,024 buckets) is most of
        // the plan's cost: the KV heads route in parallel.
        let reads: Vec<HeadReads> = work
            .par_iter_mut()
            .enumerate()
            .map(|(h, w)| {
                w.queries.clear();
                w.queries.extend_from_slice(ctx.group_queries(0, h));
                if lists.heads[h].cells.is_some() {
                    w.query_sum.clear();
                    w.query_sum.resize(hd, 0.0);
                    for q in w.queries.chunks_exact(hd) {
                        w.query_sum.iter_mut().zip(q).for_each(|(s, &x)| *s += x);
                    }
                }
                if settings.oracle {
                    let q = ctx.group_queries(0, h);
                    w.key_mass = group_key_mass(q, all_keys, shape.kv_dim(), hd, h);
                }
                if lists.heads[h].cells.is_none() {
                    // The Q-model and centroids route de-roped queries; cells the RoPE'd.
                    rope.unrotate(&mut w.queries, hd, ctx.pos0);
                }
                let model = index.head(ctx.layer, h);
                let weights = router_weights(copies, model, ctx.layer * shape.n_head_kv + h);
                w.reads(&Step {
                    settings,
                    model,
                    weights,
                    lists: &lists.heads[h],
                    end: window_start,
                    n,
                    store: ctx.store,
                    by_bin,
                    kv_head: h,
                })
            })
            .collect();
        let mut plan = ReadPlan::default();
        for (h, r) in reads.into_iter().enumerate() {
            plan.entries.push(PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                weight: 1.0,
                visible: vec![r.store],
            });
            if !r.slots.is_empty() {
                plan.entries.push(PlanEntry {
                    kv_heads: h..h + 1,
                    source: Source::Slots,
                    weight: 1.0,
                    visible: vec![r.slots],
                });
            }
        }
        plan
    }

    /// The bucket routers' lists (4 bytes per position, KV head and sparse layer), or the
    /// cells router's bucket of every position (2 bytes) and cells, with each complete
    /// segment sorted by bucket (2 bytes a position, 4 per cell) under
    /// [`Layout::Positions`]. (With [`Layout::Buckets`] the store's own slot maps and open
    /// segments are the store's to count: `crate::kv::arranged::ram_bytes`.)
    fn summary_bytes(&self, n_ctx: usize, _kv_dim: usize) -> usize {
        let sparse = (0..self.layers.len())
            .filter(|&l| !self.is_dense(l))
            .count();
        let heads = self.index.meta.n_head_kv;
        let per_head = match self.settings.router {
            // Per segment, C cells of two 8-bit rows (the longest key, the others' mean)
            // with their scales, a count, the keys before it in its bucket and a logarithm;
            // the open segment's C f32 sums and lengths; the sinks per bucket.
            Router::Cells => {
                let (c, d) = (self.index.meta.clusters, self.index.meta.head_dim);
                let segments = n_ctx.div_ceil(self.settings.segment_for(c));
                let sorted = match self.settings.layout {
                    Layout::Positions => 2 * n_ctx + 4 * segments * (c + 1),
                    Layout::Buckets => 0,
                };
                2 * n_ctx + segments * c * (2 * d + 20) + c * (4 * d + 8) + sorted
            }
            _ => 4 * n_ctx,
        };
        sparse * heads * per_head
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let dense = (SINKS + self.settings.window).min(n_ctx);
        let c = self.index.meta.clusters.max(1);
        let Some(probes) = self.settings.probes else {
            let limit = self.settings.read_limit(n_ctx);
            return (limit.max(dense) as f64 / n_ctx as f64).min(1.0);
        };
        let share = probes.min(c) as f64 / c as f64;
        let probed = (n_ctx - dense) as f64 * share;
        (dense as f64 + probed) / n_ctx as f64
    }
}
