//! Ladder: `sparrow-attn`'s fixed sparse pattern inside the engine, for prefill and decode.
//!
//! A query at position `pos` reads, exactly,
//!
//! * the **sinks** — positions `0..sinks` (attention sinks / BOS), minus any in the window;
//! * the **window** — the `window` most recent positions `pos + 1 - window ..= pos`;
//! * the **ladder** (when `log_stride`) — single keys at distances `1, 2, 4, 8, …` from `pos`
//!   that fall outside the window and the sinks,
//!
//! and, when `landmarks` is on, one **landmark** per block of `block` positions lying
//! entirely before the window: a pseudo-key whose key and value are the block's mean key and
//! mean value (per KV head). This is `sparrow_attn::pattern`'s causal pattern with
//! [`LandmarkMode::All`](sparrow_attn::LandmarkMode::All), position for position
//! ([`LadderAttention::ranges`] and [`LadderAttention::landmark_blocks`] use its arithmetic,
//! and a test checks them against [`sparrow_attn::candidates_for`]). As there, a
//! landmark block may also hold sink or ladder keys, which are then read both exactly and
//! inside the mean.
//!
//! **Landmark weighting.** `sparrow-attn` scores a landmark exactly like a key,
//! `q · k̄ / √d`, with *no* `+ log(block)` term (its forward scores landmark rows with the
//! same `scores_multi` and scale as key rows): a landmark weighs as one key whose key and
//! value are the block means, not as the block's `block` keys. We do the same, so the two
//! crates compute the same function.
//!
//! **Its plan.** The exact keys are one store entry with per-token key ranges: `O(log T)`
//! ranges per token (sinks, ladder singletons, window), so prefill never builds per-token
//! lists of `O(T)` positions. The landmarks are a side table the policy owns (row `b` =
//! block `b`'s mean key and mean value, f32), read by a second entry (range `0..blocks` per
//! token); the executor merges the two partial softmaxes by log-sum-exp. Key means are
//! computed when a block is sealed (its keys are at hand then); value means lazily, the
//! first time a query needs the landmark, from the store. When no token of a batch has a
//! landmark (e.g. the window covers the context) the plan is the exact entry alone, so a
//! window covering everything *is* `full`, bit for bit. Layers in `dense_layers` read
//! everything.

use super::{AttentionChoice, PolicyEntry, SettingsType};
use sparrow_attn::kernel::{read_f32, F32Rows, KvSource};
use sparrow_attn::policy::{
    KeysView, PlanContext, PlanEntry, ReadPlan, SideTable, Source, SparsePolicy,
};
use std::ops::Range;

/// The registry's entry: both phases; `--kv-block` is its landmark block.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "ladder",
    summary: "window + sinks + log-stride + block landmarks",
    prefill: true,
    decode: true,
    build: |b| {
        Ok(Box::new(LadderAttention::new(
            settings(b.choice)?,
            b.model.n_layer,
        )?))
    },
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<LadderSettings>(),
};

/// The ladder's settings with the shared `--kv-block` (its landmark block) and
/// `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<LadderSettings, String> {
    let mut s = c.settings::<LadderSettings>();
    s.block = c.kv_block.unwrap_or(s.block);
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// Ladder settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct LadderSettings {
    /// Ladder: recent tokens every query reads (its own included).
    #[cfg_attr(feature = "cli", arg(id = "LADDER_WINDOW", long = "ladder-window", default_value_t = 256, help_heading = crate::policy::HELP_HEADING))]
    pub window: usize,
    /// Ladder: sink tokens every query reads.
    #[cfg_attr(feature = "cli", arg(id = "LADDER_SINKS", long = "ladder-sinks", default_value_t = 4, help_heading = crate::policy::HELP_HEADING))]
    pub sinks: usize,
    /// Positions per landmark block (the KV store's block size; set by `--kv-block`).
    #[cfg_attr(feature = "cli", arg(skip = 16usize))]
    pub block: usize,
    /// Read single keys at distances 1, 2, 4, … beyond the window.
    #[cfg_attr(feature = "cli", arg(skip = true))]
    pub log_stride: bool,
    /// Summarise blocks outside the window by landmark (mean key, mean value).
    #[cfg_attr(feature = "cli", arg(skip = true))]
    pub landmarks: bool,
    /// Layers that keep exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub dense_layers: Vec<usize>,
}

impl Default for LadderSettings {
    fn default() -> Self {
        LadderSettings {
            window: 256,
            sinks: 4,
            block: 16,
            log_stride: true,
            landmarks: true,
            dense_layers: Vec::new(),
        }
    }
}

/// Largest landmark block accepted (the same bound as Quest's page).
const MAX_BLOCK: usize = 4096;

impl LadderSettings {
    /// Checks the settings, naming the bad one and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 {
            return Err(format!(
                "ladder window {} is out of range (at least 1 token: the query's own position)",
                self.window
            ));
        }
        if self.block == 0 || self.block > MAX_BLOCK {
            return Err(format!(
                "ladder block {} is out of range (1..={MAX_BLOCK} tokens)",
                self.block
            ));
        }
        Ok(())
    }
}

/// One layer's landmarks: rows `0..keyed` of `key_means` and `0..valued` of `value_means`
/// (`kv_dim` each) hold blocks' mean keys and mean values.
#[derive(Default)]
struct LayerLandmarks {
    keyed: usize,
    key_means: Vec<f32>,
    valued: usize,
    value_means: Vec<f32>,
}

/// The ladder policy (one per sequence).
pub struct LadderAttention {
    settings: LadderSettings,
    layers: Vec<LayerLandmarks>,
}

/// Mean of the `kv_dim`-wide rows of `rows` into `dst`, summed in row order then scaled by
/// the reciprocal count, as `sparrow-attn` computes its landmarks.
fn mean_rows(rows: &[f32], kv_dim: usize, dst: &mut [f32]) {
    dst.fill(0.0);
    let mut count = 0usize;
    for row in rows.chunks_exact(kv_dim) {
        dst.iter_mut().zip(row).for_each(|(a, &x)| *a += x);
        count += 1;
    }
    let inv = 1.0 / count.max(1) as f32;
    dst.iter_mut().for_each(|a| *a *= inv);
}

/// Append `r` to ascending `ranges`, merging it with the last one when they touch.
fn push_range(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    if r.is_empty() {
        return;
    }
    match ranges.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => ranges.push(r),
    }
}

impl LadderAttention {
    /// A backend for a model of `n_layer` layers; out-of-range settings are an error naming
    /// the setting.
    pub fn new(settings: LadderSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(LadderAttention {
            settings,
            layers: (0..n_layer).map(|_| LayerLandmarks::default()).collect(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &LadderSettings {
        &self.settings
    }

    /// First position of the window of a query at `pos`.
    fn window_start(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.settings.window)
    }

    /// The exact key positions a query at `pos` reads, as ascending disjoint ranges: sinks,
    /// ladder singletons, window (adjacent ones merged). `O(log pos)` ranges.
    pub fn ranges(&self, pos: usize) -> Vec<Range<usize>> {
        let lo = self.window_start(pos);
        // As sparrow-attn's causal plan: `s` sinks are visible, those below the window are
        // read as sinks, and ladder keys must lie outside both.
        let s = self.settings.sinks.min(pos + 1);
        let mut ladder = Vec::new();
        if self.settings.log_stride {
            let mut d = 1usize;
            while d <= pos {
                let j = pos - d;
                if j < lo && j >= s {
                    ladder.push(j);
                }
                match d.checked_mul(2) {
                    Some(x) => d = x,
                    None => break,
                }
            }
        }
        let mut out = Vec::with_capacity(ladder.len() + 2);
        push_range(&mut out, 0..s.min(lo));
        for &j in ladder.iter().rev() {
            push_range(&mut out, j..j + 1);
        }
        push_range(&mut out, lo..pos + 1);
        out
    }

    /// How many landmarks a query at `pos` reads: blocks `0..landmark_blocks(pos)` are those
    /// lying entirely before its window (0 without landmarks).
    pub fn landmark_blocks(&self, pos: usize) -> usize {
        if self.settings.landmarks {
            self.window_start(pos) / self.settings.block
        } else {
            0
        }
    }

    /// Make rows `0..need` of `lm` hold (mean key, mean value): key means not recorded at
    /// seal time are computed from the store, value means always are.
    fn prepare(&self, lm: &mut LayerLandmarks, store: &dyn KvSource, hd: usize, need: usize) {
        let bs = self.settings.block;
        let kv_dim = store.kv_dim();
        lm.keyed = lm.keyed.min(lm.key_means.len() / kv_dim.max(1));
        lm.valued = lm.valued.min(lm.keyed);
        let mut rows = vec![0f32; bs * kv_dim];
        // Means of blocks `from..need` of the keys (or values) into `means`.
        let mut fill = |values: bool, from: usize, means: &mut Vec<f32>| {
            means.resize(need * kv_dim, 0.0);
            for b in from..need {
                read_f32(store, values, hd, b * bs, &mut rows);
                mean_rows(&rows, kv_dim, &mut means[b * kv_dim..(b + 1) * kv_dim]);
            }
        };
        if lm.keyed < need {
            fill(false, lm.keyed, &mut lm.key_means);
            lm.keyed = need;
        }
        if lm.valued < need {
            fill(true, lm.valued, &mut lm.value_means);
            lm.valued = need;
        }
    }
}

impl SparsePolicy for LadderAttention {
    fn name(&self) -> &str {
        "ladder"
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.settings.block)
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (n, pos0, layer) = (ctx.n_tokens(), ctx.pos0, ctx.layer);
        if layer >= self.layers.len() || self.settings.dense_layers.contains(&layer) {
            return ReadPlan::causal(ctx.shape, pos0, n);
        }
        let exact: Vec<Vec<Range<usize>>> = (0..n).map(|i| self.ranges(pos0 + i)).collect();
        // Landmark counts grow with the position: the batch's last token needs the most.
        let need = self.landmark_blocks(pos0 + n - 1);
        if need == 0 {
            return ReadPlan::same_for_all_heads(ctx.shape, exact);
        }
        let marks: Vec<Vec<Range<usize>>> = (0..n)
            .map(|i| match self.landmark_blocks(pos0 + i) {
                0 => Vec::new(),
                b => std::iter::once(0..b).collect(),
            })
            .collect();
        let mut lm = std::mem::take(&mut self.layers[layer]);
        self.prepare(&mut lm, ctx.store, ctx.shape.head_dim, need);
        self.layers[layer] = lm;
        let lm = &self.layers[layer];
        let kv_dim = ctx.shape.kv_dim();
        let heads = 0..ctx.shape.n_head_kv;
        ReadPlan {
            entries: vec![
                PlanEntry {
                    kv_heads: heads.clone(),
                    source: Source::Store,
                    weight: 1.0,
                    visible: exact,
                },
                PlanEntry {
                    kv_heads: heads,
                    source: Source::Side(0),
                    weight: 1.0,
                    visible: marks,
                },
            ],
            side: vec![SideTable {
                rows: F32Rows::all_heads(
                    &lm.key_means[..need * kv_dim],
                    &lm.value_means[..need * kv_dim],
                    kv_dim,
                )
                .into(),
                positions: None,
            }],
        }
    }

    /// Record the sealed block's mean key per KV head while its keys are at hand. A block
    /// sealed again (after a rewind) replaces its mean and drops everything after it.
    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        if !self.settings.landmarks
            || keys.rows() != self.settings.block
            || self.settings.dense_layers.contains(&layer)
        {
            // No landmarks (or none for this layer), or paged at another size: `plan`
            // reads the store if it ever needs them.
            return;
        }
        let Some(lm) = self.layers.get_mut(layer) else {
            return;
        };
        if block > lm.keyed {
            return; // an earlier block is missing: `plan` catches up from the store
        }
        let kv_dim = keys.kv_heads() * keys.head_dim();
        lm.key_means.resize((block + 1) * kv_dim, 0.0);
        mean_rows(
            keys.as_slice(),
            kv_dim,
            &mut lm.key_means[block * kv_dim..(block + 1) * kv_dim],
        );
        lm.keyed = block + 1;
        lm.valued = lm.valued.min(block);
    }

    fn forget_from(&mut self, pos: usize) {
        let keep = pos / self.settings.block;
        for lm in &mut self.layers {
            lm.keyed = lm.keyed.min(keep);
            lm.valued = lm.valued.min(keep);
            if pos == 0 {
                *lm = LayerLandmarks::default();
            }
        }
    }

    /// (exact keys + landmarks) read by a decode query at position `n_ctx - 1`, over
    /// `n_ctx`. Layers in `dense_layers` read everything; this is the sparse layers' figure.
    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let pos = n_ctx - 1;
        let keys: usize = self.ranges(pos).iter().map(|r| r.len()).sum();
        (keys + self.landmark_blocks(pos)) as f64 / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, read_set, AttnShape, DenseAttention};
    use crate::kv::{KvType, RamStore};
    use sparrow_attn::{candidates_for, LandmarkMode, QueryCandidates, SparseConfig};

    use sparrow_attn::kernel::reference::uniform as rng;

    fn ladder(window: usize, sinks: usize, block: usize, log: bool, lm: bool) -> LadderAttention {
        LadderAttention::new(
            LadderSettings {
                window,
                sinks,
                block,
                log_stride: log,
                landmarks: lm,
                dense_layers: vec![],
            },
            2,
        )
        .unwrap()
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let e = LadderAttention::new(
            LadderSettings {
                window: 0,
                ..Default::default()
            },
            1,
        )
        .err()
        .unwrap();
        assert!(e.contains("window 0") && e.contains("at least 1"), "{e}");
        let e = LadderAttention::new(
            LadderSettings {
                block: 0,
                ..Default::default()
            },
            1,
        )
        .err()
        .unwrap();
        assert!(e.contains("block 0") && e.contains("1..=4096"), "{e}");
    }

    /// The ranges and landmark counts are sparrow-attn's causal pattern, position by
    /// position, for assorted windows, sinks, blocks and switches.
    #[test]
    fn pattern_equals_sparrow_attn_candidates() {
        for &(window, sinks, block) in &[(1, 0, 1), (5, 3, 4), (8, 0, 16), (17, 40, 3), (64, 4, 16)]
        {
            for log in [false, true] {
                for lm in [false, true] {
                    let l = ladder(window, sinks, block, log, lm);
                    let cfg = SparseConfig {
                        window,
                        block_size: block,
                        sinks,
                        causal: true,
                        log_stride: log,
                        landmarks: if lm {
                            LandmarkMode::All
                        } else {
                            LandmarkMode::Off
                        },
                        sort_candidates: true,
                    };
                    for pos in 0..300 {
                        let c = candidates_for(&cfg, pos + 1, pos).unwrap();
                        let ours: Vec<usize> = l.ranges(pos).into_iter().flatten().collect();
                        assert_eq!(ours, c.tokens, "{window} {sinks} {block} {pos}");
                        let blocks: Vec<usize> = (0..l.landmark_blocks(pos)).collect();
                        assert_eq!(blocks, c.blocks, "{window} {sinks} {block} {pos}");
                    }
                }
            }
        }
    }

    /// A cache of random keys/values plus what it holds in f32 (f16-rounded when f16).
    fn random_cache(
        ty: KvType,
        n: usize,
        kv_dim: usize,
        seed: u64,
    ) -> (RamStore, Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let mut r = rng(seed);
        let mut cache = RamStore::new(ty, 2, n, kv_dim);
        let mut hk = vec![vec![0f32; kv_dim]; n];
        let mut hv = vec![vec![0f32; kv_dim]; n];
        for t in 0..n {
            let k: Vec<f32> = (0..kv_dim).map(|_| r() * 2.0).collect();
            let v: Vec<f32> = (0..kv_dim).map(|_| r()).collect();
            cache.write(1, t, &k, &v);
            cache.read_keys(1, t, &mut hk[t]);
            cache.read_values(1, t, &mut hv[t]);
        }
        (cache, hk, hv)
    }

    /// f64 attention of one token over the exact keys of `c` plus the landmarks of its
    /// blocks (means of `block` positions, each weighted like one key).
    fn reference(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        c: &QueryCandidates,
        block: usize,
    ) -> Vec<f32> {
        let (tokens, blocks) = (&c.tokens, &c.blocks);
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let mut out = vec![0f32; shape.n_head * hd];
        for h in 0..shape.n_head {
            let g = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let mut items: Vec<(Vec<f64>, Vec<f64>)> = tokens
                .iter()
                .map(|&t| {
                    let k = keys[t][g * hd..(g + 1) * hd].iter().map(|&x| x as f64);
                    let v = vals[t][g * hd..(g + 1) * hd].iter().map(|&x| x as f64);
                    (k.collect(), v.collect())
                })
                .collect();
            for &b in blocks {
                let mut k = vec![0f64; hd];
                let mut v = vec![0f64; hd];
                for t in b * block..(b + 1) * block {
                    for d in 0..hd {
                        k[d] += keys[t][g * hd + d] as f64 / block as f64;
                        v[d] += vals[t][g * hd + d] as f64 / block as f64;
                    }
                }
                items.push((k, v));
            }
            let s: Vec<f64> = items
                .iter()
                .map(|(k, _)| {
                    qh.iter().zip(k).map(|(&a, b)| a as f64 * b).sum::<f64>() / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for d in 0..hd {
                let acc: f64 = items.iter().zip(&w).map(|((_, v), w)| w * v[d]).sum();
                out[h * hd + d] = (acc / z) as f32;
            }
        }
        out
    }

    /// Prefill batches (from 0, and later ones mixing tokens with and without landmarks)
    /// and single decode tokens, f32 and f16 caches, landmarks from seals and from the
    /// cache: within 1e-4 of the f64 reference of the same pattern.
    #[test]
    fn matches_f64_reference_of_the_pattern() {
        let shape = AttnShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 16,
        };
        let (kv_dim, q_dim, n) = (32, 96, 400);
        for ty in [KvType::F32, KvType::F16] {
            let (cache, hk, hv) = random_cache(ty, n, kv_dim, 7);
            let mut r = rng(3);
            for &(window, sinks, block, log) in
                &[(40, 3, 8, true), (70, 0, 16, false), (1, 1, 5, true)]
            {
                let mut l = ladder(window, sinks, block, log, true);
                // Seal the first half of the blocks the way the block table does; the rest
                // are computed from the cache.
                let mut kb = vec![0f32; block * kv_dim];
                for b in 0..n / block / 2 {
                    cache.read_keys(1, b * block, &mut kb);
                    l.on_block_sealed(1, b, KeysView::new(&kb, block, 2, 16).unwrap());
                }
                let cfg = SparseConfig {
                    window,
                    block_size: block,
                    sinks,
                    causal: true,
                    log_stride: log,
                    landmarks: LandmarkMode::All,
                    sort_candidates: true,
                };
                for &(pos0, len) in &[(0usize, 120usize), (120, 150), (270, 129), (399, 1)] {
                    let q: Vec<f32> = (0..len * q_dim).map(|_| r()).collect();
                    let mut out = vec![0f32; len * q_dim];
                    attend(&mut l, shape, &cache, 1, &q, pos0, &mut out);
                    for i in 0..len {
                        let c = candidates_for(&cfg, pos0 + i + 1, pos0 + i).unwrap();
                        let want = reference(shape, &hk, &hv, &q[i * q_dim..][..q_dim], &c, block);
                        for (a, b) in out[i * q_dim..][..q_dim].iter().zip(&want) {
                            assert!(
                                (a - b).abs() < 1e-4,
                                "{ty:?} w{window} pos {}: {a} vs {b}",
                                pos0 + i
                            );
                        }
                    }
                }
            }
        }
    }

    /// A window covering the context reads exactly what `full` reads, through the same
    /// kernel: equal bit for bit, for a prefill batch and a decode token.
    #[test]
    fn a_window_covering_the_context_is_dense() {
        let shape = AttnShape {
            n_head: 14,
            n_head_kv: 2,
            head_dim: 64,
        };
        let (kv_dim, q_dim, n) = (128, 14 * 64, 300);
        let (cache, _, _) = random_cache(KvType::F16, n, kv_dim, 5);
        let mut l = ladder(n, 4, 16, true, true);
        let mut r = rng(9);
        for &(pos0, len) in &[(0usize, 299usize), (299, 1), (250, 50)] {
            let q: Vec<f32> = (0..len * q_dim).map(|_| r()).collect();
            let mut want = vec![0f32; len * q_dim];
            let mut got = vec![1f32; len * q_dim];
            attend(&mut DenseAttention, shape, &cache, 1, &q, pos0, &mut want);
            attend(&mut l, shape, &cache, 1, &q, pos0, &mut got);
            assert_eq!(want, got);
        }
        assert_eq!(l.fraction_read(n), 1.0);
    }

    #[test]
    fn dense_layers_are_exact_and_small_windows_read_little() {
        let shape = AttnShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
        };
        let (cache, _, _) = random_cache(KvType::F32, 500, 32, 11);
        let mut l = LadderAttention::new(
            LadderSettings {
                window: 32,
                dense_layers: vec![1],
                ..Default::default()
            },
            2,
        )
        .unwrap();
        let mut r = rng(1);
        let q: Vec<f32> = (0..64).map(|_| r()).collect();
        let (mut want, mut got) = (vec![0f32; 64], vec![0f32; 64]);
        attend(&mut DenseAttention, shape, &cache, 1, &q, 499, &mut want);
        attend(&mut l, shape, &cache, 1, &q, 499, &mut got);
        assert_eq!(want, got);
        assert_eq!(
            read_set(&mut l, shape, &cache, 1, &q, 499),
            vec![vec![0..500]; 2]
        );
        // Layer 0 is sparse: 4 sinks, a 32-token window, the ladder and 29 landmarks.
        let set = read_set(&mut l, shape, &cache, 0, &q, 499);
        let read: usize = set[0].iter().map(|r| r.len()).sum();
        assert_eq!(set[0], l.ranges(499));
        assert!(read < 50, "{read}");
        assert_eq!(l.landmark_blocks(499), (500 - 32) / 16);
        let f = l.fraction_read(500);
        assert!((f - (read + 29) as f64 / 500.0).abs() < 1e-12, "{f}");
    }

    /// After a rewind the landmarks of rewritten blocks are rebuilt, not reused.
    #[test]
    fn forget_from_drops_landmarks_of_rewritten_blocks() {
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 8,
        };
        let (mut cache, _, _) = random_cache(KvType::F32, 200, 8, 2);
        let mut l = ladder(16, 0, 8, false, true);
        let q: Vec<f32> = (0..16).map(|i| i as f32 / 8.0).collect();
        let mut out = vec![0f32; 16];
        attend(&mut l, shape, &cache, 1, &q, 199, &mut out);
        // Rewrite positions 40.. and rewind: a fresh backend must agree.
        for t in 40..200 {
            let k = vec![(t % 7) as f32; 8];
            cache.write(1, t, &k, &k);
        }
        l.forget_from(40);
        attend(&mut l, shape, &cache, 1, &q, 199, &mut out);
        let mut fresh = ladder(16, 0, 8, false, true);
        let mut want = vec![0f32; 16];
        attend(&mut fresh, shape, &cache, 1, &q, 199, &mut want);
        assert_eq!(out, want);
    }
}
