//! `sketch`: decode attention over the keys that a few channels rank first (after Double
//! Sparsity, Yang et al. 2024, and Loki, Singhania et al. 2024: a head's logits are carried
//! by a few of its channels, so scoring every key on those channels finds the keys that
//! matter without reading the keys).
//!
//! Why: Quest ranks pages by a bound over their keys. Where pages look alike — a needle
//! among look-alike needles — the bounds rank them alike and the needle's page is lost,
//! while the oracle, which scores every key exactly, keeps it at the same budget. A sketch
//! scores every key too, approximately: `R` of its `head_dim` channels, 8-bit, one scale —
//! `R + 4` bytes per position and KV head (68 at the default R = 64 of 128), about Quest's 64
//! (a 16-position page's centre and radius in f32 over 128 channels), against the key's
//! own 256 in f16.
//!
//! **The channels.** Per layer and KV head they are chosen once, at the first decode step,
//! from the keys then cached and that step's queries. A logit's spread over positions is
//! about `Σ_c q_c² · Var_t(k_{t,c})` (channels taken as independent), so channel `c` weighs
//! `Σ_h q_{h,c}² · Var_t(k_{t,c})` summed over the group's query heads; a part of the
//! logits that every key shares moves none of them against the others, and a softmax does
//! not see it. RoPE turns each channel pair together, so the channels are taken pair by
//! pair. The sketch holds each key's chosen channels minus their mean over the keys seen at
//! the choice, so the 8 bits resolve what differs between keys rather than an offset they
//! all carry.
//!
//! **A decode query**, per KV head: each query head's logits over the sketches, a softmax
//! per head, summed over the group (the oracle's criterion, so a retrieval head's one sharp
//! key is not outvoted by broad heads); the positions with the most are read, within the
//! budget, beside the open block's positions (which have no sketch yet and are always
//! read). With `--sketch-rerank F`, `F` times as many candidates are taken and their keys
//! read to keep the best by exact mass. Prefill and the dense layers read everything.
//!
//! **The sample** (`--sketch-sample P`, off by default). Up to `P`% of the budget is not
//! ranked: it is an even sample of the sketched keys the ranking left out, read in a plan
//! entry whose keys each count `N / m` times (`N` left out, `m` sampled), so the softmax's
//! numerator and denominator get an unbiased estimate of the part a top-k drops instead of
//! nothing (after MagicPIG, Chen et al. 2024, and vAttention, Desai et al. 2025: top-k alone
//! renormalises over its few keys). Retrieval lives on the ranked keys; aggregation over
//! the whole context — counting words in RULER's cwe/fwe — on the many small weights. So
//! the sample's size follows the estimated mass the ranked keys would leave out: the whole
//! share where that is a tenth of a head's mass or more, proportionally less below it (a
//! sharp head keeps its budget for ranking). The sample's offset comes from the layer, step
//! and head, so runs repeat. Off by default because an estimate is noisier per query than
//! the keys it replaces: on the 1.5B at 4K it moves the attention output further from full
//! attention on average (relative L2 0.20 against 0.12) while it wins the aggregation tasks
//! (docs/long-context.md).

//! The choice and the sketches are per-sequence state. The channels are chosen at the first
//! decode step after a prompt (a pass of several tokens, or positions imported from a
//! prefix, since the last step): a later prompt — the next turn of a chat — has them chosen
//! again for its own question. A rewind to the step that chose them drops them, a rewind
//! past it drops the sketches of the blocks it reopens. So the reads depend on where the
//! last prompt ended, not on the cache alone: a sequence restored from a prefix mid-answer
//! chooses at its first step where the original kept its choice.

use super::oracle::top_by_exact_mass;
use super::{AttentionChoice, PolicyEntry, SettingsType};
use crate::model::config::{ModelConfig, RopeLayout};
use rayon::prelude::*;
use sparrow_attn::kernel::{read_f32, runs, Level};
use sparrow_attn::policy::{
    add_softmax, tile_scores, Int8Queries, Int8Tiles, KeysView, PlanContext, PlanEntry, ReadPlan,
    Source, SparsePolicy,
};
use std::cell::RefCell;
use std::ops::Range;

/// The registry's entry: a decode policy; `--kv-block` is the block a sketch is made for.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "sketch",
    summary: "decode: every key scored on a few channels, the best within a budget",
    prefill: false,
    decode: true,
    build: |b| {
        Ok(Box::new(SketchAttention::new(
            settings(b.choice)?,
            b.model,
        )?))
    },
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<SketchSettings>(),
};

/// The sketch's settings with the shared `--kv-block` and `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<SketchSettings, String> {
    let mut s = c.settings::<SketchSettings>();
    s.block = c.kv_block.unwrap_or(s.block);
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// The sketch's settings (budget and dense layers as Quest's, so the two compare at equal
/// reads).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct SketchSettings {
    /// Positions per sealed block (set by `--kv-block`).
    #[cfg_attr(feature = "cli", arg(skip = 16usize))]
    pub block: usize,
    /// Sketch: tokens read per decode step and KV head (the best-scoring keys + the open
    /// block).
    #[cfg_attr(feature = "cli", arg(id = "SKETCH_BUDGET", long = "sketch-budget", default_value_t = 1024, help_heading = crate::policy::HELP_HEADING))]
    pub budget: usize,
    /// Sketch: channels of each key kept in the sketch (8-bit) and scored, of the head's
    /// `head_dim` (all of a narrower head's); more ranks keys closer to their exact logits
    /// and reads more.
    #[cfg_attr(feature = "cli", arg(id = "SKETCH_CHANNELS", long = "sketch-channels", default_value_t = 64, help_heading = crate::policy::HELP_HEADING))]
    pub channels: usize,
    /// Layers that always use exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip = vec![0usize, 1]))]
    pub dense_layers: Vec<usize>,
    /// Sketch: exact second pass — take RERANK times the budget's keys by their sketches,
    /// read those keys, and attend to the budget's with the most exact attention mass among
    /// them (0 or 1: sketches alone).
    #[cfg_attr(feature = "cli", arg(id = "SKETCH_RERANK", long = "sketch-rerank", default_value_t = 0, help_heading = crate::policy::HELP_HEADING))]
    pub rerank: usize,
    /// Sketch: percent of the budget at most spent on an even sample of the keys the ranking
    /// leaves out, each sampled key weighted to stand for its share of them — all of it
    /// where the ranked keys would leave a tenth of a head's estimated mass out, less where
    /// they hold more (0, the default: the ranked keys alone). What aggregation over the
    /// whole context needs (75 on RULER's counting tasks): the many small weights a top-k
    /// drops.
    #[cfg_attr(feature = "cli", arg(id = "SKETCH_SAMPLE", long = "sketch-sample", default_value_t = 0, help_heading = crate::policy::HELP_HEADING))]
    pub sample: usize,
}

impl Default for SketchSettings {
    fn default() -> Self {
        SketchSettings {
            block: 16,
            budget: 1024,
            channels: 64,
            dense_layers: vec![0, 1],
            rerank: 0,
            sample: 0,
        }
    }
}

impl SketchSettings {
    /// Checks the settings, naming the bad one (the channels against the model's head size
    /// are checked when the policy is built).
    pub fn validate(&self) -> Result<(), String> {
        if self.block == 0 || self.block > 4096 {
            return Err(format!(
                "sketch block size {} is out of range (1..=4096 tokens)",
                self.block
            ));
        }
        if self.budget == 0 {
            return Err("sketch budget 0 is out of range (at least 1 token)".into());
        }
        if self.channels == 0 {
            return Err("sketch channels 0 is out of range (at least 1)".into());
        }
        if self.rerank > 64 {
            return Err(format!(
                "sketch re-rank factor {} is out of range (0..=64 times the budget)",
                self.rerank
            ));
        }
        if self.sample > 90 {
            return Err(format!(
                "sketch sample {}% is out of range (0..=90 percent of the budget)",
                self.sample
            ));
        }
        Ok(())
    }
}

/// The channels of a head that RoPE turns together — pairs `(2i, 2i+1)` or `(i, i + n_rot/2)`
/// — and each channel past `n_rot` alone.
fn rotation_groups(head_dim: usize, n_rot: usize, layout: RopeLayout) -> Vec<Vec<usize>> {
    let half = n_rot / 2;
    let pairs = (0..half).map(|i| match layout {
        RopeLayout::Normal => vec![2 * i, 2 * i + 1],
        RopeLayout::Neox => vec![i, i + half],
    });
    pairs.chain((2 * half..head_dim).map(|c| vec![c])).collect()
}

/// `count` channels (ascending) by `weight` (one per channel): whole rotation groups with
/// the most summed weight first, while they fit; the rest single channels by weight. Ties go
/// to the lower channel, so the choice is the same on every run.
fn choose_channels(weight: &[f64], groups: &[Vec<usize>], count: usize) -> Vec<usize> {
    let sum = |g: &Vec<usize>| g.iter().map(|&c| weight[c]).sum::<f64>();
    let mut order: Vec<&Vec<usize>> = groups.iter().collect();
    order.sort_by(|a, b| sum(b).total_cmp(&sum(a)).then(a[0].cmp(&b[0])));
    let mut taken = vec![false; weight.len()];
    let mut chosen = Vec::with_capacity(count);
    for g in order {
        if chosen.len() + g.len() <= count {
            for &c in g {
                taken[c] = true;
                chosen.push(c);
            }
        }
    }
    let mut rest: Vec<usize> = (0..weight.len()).filter(|&c| !taken[c]).collect();
    rest.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    chosen.extend(rest.into_iter().take(count - chosen.len().min(count)));
    chosen.sort_unstable();
    chosen
}

/// The `k` positions of `mass` (non-negative) with the most, ascending; ties go to the later
/// positions (recent keys are the safer guess). This runs over every sketched key per KV head
/// and decode step, so it ranks values by their bits (a non-negative float orders as its
/// bits do) and ranks few of them: an evenly spaced sample, ranked with room to spare, gives
/// a floor at or below the `k`-th largest value; one pass gathers the positions at or above
/// it (or every position, if the sample misjudged and fewer than `k` are), and the `k`-th
/// largest is found among those alone.
fn most_mass(mass: &[f32], k: usize) -> Vec<usize> {
    let n = mass.len();
    if k >= n {
        return (0..n).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let key = |m: f32| if m > 0.0 { m.to_bits() } else { 0 };
    let step = (n / 2048).max(1);
    let mut sample: Vec<u32> = mass.iter().step_by(step).map(|&m| key(m)).collect();
    let s = sample.len();
    // The k-th largest's expected rank in the sample, a quarter more and 8 more.
    let rank = (k * s / n + k * s / n / 4 + 8).min(s);
    let floor = *sample.select_nth_unstable(s - rank).1;
    let gather = |floor: u32| {
        let mut out = Vec::with_capacity(2 * k + 64);
        for (t, &m) in mass.iter().enumerate() {
            let b = key(m);
            if b >= floor {
                out.push((b, t));
            }
        }
        out
    };
    let mut candidates = gather(floor);
    if candidates.len() < k {
        candidates = gather(0);
    }
    let mut keys: Vec<u32> = candidates.iter().map(|c| c.0).collect();
    let at = keys.len() - k;
    let threshold = *keys.select_nth_unstable(at).1;
    let mut ties = k - candidates.iter().filter(|c| c.0 > threshold).count();
    let mut chosen = Vec::with_capacity(k);
    for &(b, t) in candidates.iter().rev() {
        if b > threshold || (b == threshold && ties > 0) {
            ties -= usize::from(b == threshold);
            chosen.push(t);
        }
    }
    chosen.reverse();
    chosen
}

thread_local! {
    /// Per-thread buffers for a selection's logits (every query head's over every sketched
    /// key: about a megabyte at 32K) and masses, so a decode step does not allocate and
    /// zero them for each layer and KV head.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = RefCell::default();
}

/// Runs `f` with this thread's logits and mass buffers, or fresh ones if they are in use (a
/// selection nested in another on the same thread, through rayon's work stealing).
fn with_scratch<T>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            let (logits, mass) = &mut *s;
            f(logits, mass)
        }
        Err(_) => f(&mut Vec::new(), &mut Vec::new()),
    })
}

/// One KV head's sketches: its channels, their mean at the choice, and per sketched position
/// the centred channels as 8-bit quants with one scale.
struct HeadSketch {
    channels: Vec<usize>,
    mean: Vec<f32>,
    sketches: Int8Tiles,
}

impl HeadSketch {
    /// Channels chosen for the group `q_group` (rows of `hd`) over `keys` (rows of
    /// `kv_dim`, this head's values from `at`).
    fn choose(
        q_group: &[f32],
        keys: &[f32],
        kv_dim: usize,
        at: usize,
        hd: usize,
        groups: &[Vec<usize>],
        count: usize,
    ) -> HeadSketch {
        let n = (keys.len() / kv_dim).max(1);
        let (mut mean, mut square) = (vec![0f64; hd], vec![0f64; hd]);
        for key in keys.chunks_exact(kv_dim) {
            for (c, &v) in key[at..at + hd].iter().enumerate() {
                mean[c] += v as f64;
                square[c] += v as f64 * v as f64;
            }
        }
        let mut q_square = vec![0f64; hd];
        for q in q_group.chunks_exact(hd) {
            for (s, &v) in q_square.iter_mut().zip(q) {
                *s += v as f64 * v as f64;
            }
        }
        let weight: Vec<f64> = (0..hd)
            .map(|c| {
                let m = mean[c] / n as f64;
                let var = (square[c] / n as f64 - m * m).max(0.0);
                let w = q_square[c] * var;
                if w.is_finite() {
                    w
                } else {
                    0.0
                }
            })
            .collect();
        // Pairs for the model's head size; a head of another size has its channels alone.
        let singles: Vec<Vec<usize>>;
        let groups = if groups.iter().map(Vec::len).sum::<usize>() == hd {
            groups
        } else {
            singles = (0..hd).map(|c| vec![c]).collect();
            &singles
        };
        let channels = choose_channels(&weight, groups, count.min(hd));
        let mean = channels
            .iter()
            .map(|&c| (mean[c] / n as f64) as f32)
            .collect();
        HeadSketch {
            sketches: Int8Tiles::new(channels.len()),
            channels,
            mean,
        }
    }

    /// Append the sketch of `key` (this head's `hd` values).
    fn push(&mut self, key: &[f32], centred: &mut Vec<f32>) {
        centred.clear();
        centred.extend(
            self.channels
                .iter()
                .zip(&self.mean)
                .map(|(&c, &m)| key[c] - m),
        );
        self.sketches.push(centred);
    }

    /// Each query head's estimated logits (unscaled) over the first `n` sketched positions,
    /// head after head, into `out` (grown if short; its first `heads × n` values written):
    /// the query rows of `q_group` (`hd` each) on the channels, 8-bit, against the sketches,
    /// every tile of eight sketches read once for the whole group.
    fn logits(&self, q_group: &[f32], hd: usize, n: usize, out: &mut Vec<f32>) {
        let picked: Vec<Vec<f32>> = q_group
            .chunks_exact(hd)
            .map(|q| self.channels.iter().map(|&c| q[c]).collect())
            .collect();
        let queries = Int8Queries::new(self.channels.len(), picked.iter().map(Vec::as_slice));
        let len = queries.len() * n;
        if out.len() < len {
            out.resize(len, 0.0);
        }
        tile_scores(
            Level::active(),
            &self.sketches,
            &queries,
            n,
            &mut out[..len],
        );
    }

    fn truncate(&mut self, positions: usize) {
        self.sketches.truncate(positions);
    }
}

/// One layer's state: the position whose query chose the channels, the last decode step's,
/// how many positions are sketched (whole blocks), and each KV head's sketches.
struct LayerSketch {
    chosen_at: usize,
    last_step: usize,
    sketched: usize,
    heads: Vec<HeadSketch>,
}

impl LayerSketch {
    /// Sketch `keys` (rows of `kv_dim`) as the next positions, the KV heads in parallel (at
    /// a prompt's first step this is every key of the layer).
    fn extend(&mut self, keys: &[f32], kv_dim: usize, hd: usize) {
        self.heads.par_iter_mut().enumerate().for_each(|(h, head)| {
            let mut centred = Vec::new();
            for key in keys.chunks_exact(kv_dim) {
                head.push(&key[h * hd..(h + 1) * hd], &mut centred);
            }
        });
        self.sketched += keys.len() / kv_dim;
    }

    fn truncate(&mut self, positions: usize) {
        if positions < self.sketched {
            self.sketched = positions;
            for head in &mut self.heads {
                head.truncate(positions);
            }
        }
    }
}

/// The sketch policy (one per sequence).
pub struct SketchAttention {
    settings: SketchSettings,
    groups: Vec<Vec<usize>>,
    layers: Vec<Option<LayerSketch>>,
}

impl SketchAttention {
    /// A policy for `model` (a head narrower than the channels asked for is sketched whole),
    /// or why its settings are refused.
    pub fn new(settings: SketchSettings, model: &ModelConfig) -> Result<Self, String> {
        settings.validate()?;
        let groups = rotation_groups(model.head_dim, model.n_rot, model.rope_layout);
        Ok(Self::with_groups(settings, groups, model.n_layer))
    }

    /// A policy for `n_layer` layers whose heads' channels rotate in `groups`.
    fn with_groups(settings: SketchSettings, groups: Vec<Vec<usize>>, n_layer: usize) -> Self {
        SketchAttention {
            groups,
            layers: (0..n_layer).map(|_| None).collect(),
            settings,
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &SketchSettings {
        &self.settings
    }

    /// `layer` with its sketches up to the last sealed block below `n` positions: the
    /// channels chosen now from the cached keys and the query of `ctx` if they are not yet,
    /// else the blocks sealed since caught up from the store.
    fn up_to_date(&self, layer: Option<LayerSketch>, ctx: &PlanContext<'_>) -> LayerSketch {
        let (shape, block) = (ctx.shape, self.settings.block);
        let (kv_dim, hd) = (shape.kv_dim(), shape.head_dim);
        let sealed = (ctx.pos0 + 1) / block * block;
        let mut layer = layer.unwrap_or_else(|| {
            let mut keys = vec![0f32; sealed * kv_dim];
            read_f32(ctx.store, false, hd, 0, &mut keys);
            let heads = (0..shape.n_head_kv)
                .into_par_iter()
                .map(|h| {
                    HeadSketch::choose(
                        ctx.group_queries(0, h),
                        &keys,
                        kv_dim,
                        h * hd,
                        hd,
                        &self.groups,
                        self.settings.channels,
                    )
                })
                .collect();
            let mut layer = LayerSketch {
                chosen_at: ctx.pos0,
                last_step: ctx.pos0,
                sketched: 0,
                heads,
            };
            layer.extend(&keys, kv_dim, hd);
            layer
        });
        if layer.sketched < sealed {
            let mut keys = vec![0f32; (sealed - layer.sketched) * kv_dim];
            read_f32(ctx.store, false, hd, layer.sketched, &mut keys);
            layer.extend(&keys, kv_dim, hd);
        }
        layer
    }

    /// What the query heads of `kv_head` (rows `q_group`) read at a context of `n` positions:
    /// the sketched positions with the most estimated mass within the budget (or, with a
    /// re-rank factor, the best of more candidates by exact mass), ascending, then the
    /// positions not yet sketched — less the sample's part of the budget ([`sample_size`]),
    /// spent on an even sample of the sketched positions left out (placed by the layer, step
    /// and head, so a run is repeatable).
    fn select(&self, layer: &LayerSketch, ctx: &PlanContext<'_>, kv_head: usize) -> Selection {
        let (store, shape, n) = (ctx.store, ctx.shape, ctx.pos0 + 1);
        let q_group = ctx.group_queries(0, kv_head);
        let sealed = layer.sketched;
        let slots = self.settings.budget.saturating_sub(n - sealed);
        if slots >= sealed {
            return Selection::everything(n);
        }
        let head = &layer.heads[kv_head];
        // Each query head's softmax over its logits, in place, summed: the oracle's
        // criterion on the sketches.
        let (chosen, ranked, sampled) = with_scratch(|logits, mass| {
            head.logits(q_group, shape.head_dim, sealed, logits);
            mass.clear();
            mass.resize(sealed, 0.0);
            let (level, scale) = (Level::active(), 1.0 / (shape.head_dim as f32).sqrt());
            let heads = q_group.len() / shape.head_dim;
            for row in logits[..heads * sealed].chunks_exact_mut(sealed) {
                add_softmax(level, row, scale, mass);
            }
            // With a sample, its size needs the budget's best first.
            let (best, sampled) = if self.settings.sample == 0 {
                (None, 0)
            } else {
                let best = most_mass(mass, slots);
                let sampled = sample_size(mass, &best, self.settings.sample);
                (Some(best), sampled)
            };
            let ranked = slots - sampled;
            let chosen = match best {
                _ if self.settings.rerank > 1 => {
                    most_mass(mass, (ranked * self.settings.rerank).min(sealed))
                }
                Some(best) => most_of(mass, best, ranked),
                None => most_mass(mass, ranked),
            };
            (chosen, ranked, sampled)
        });
        let candidates = chosen.len();
        let mut ranges = if candidates > ranked {
            top_by_exact_mass(store, shape, kv_head, q_group, &chosen, ranked)
        } else {
            runs(chosen)
        };
        let seed = (ctx.layer as u64) << 40 ^ (kv_head as u64) << 56 ^ ctx.pos0 as u64;
        let sample = even_sample(&ranges, sealed, sampled, unit_interval(seed));
        if sealed < n {
            match ranges.last_mut() {
                Some(last) if last.end == sealed => last.end = n,
                _ => ranges.push(sealed..n),
            }
        }
        match sample {
            Some((keys, weight)) => Selection {
                exact: ranges,
                sample: keys,
                weight,
            },
            // The keys left out are no more than the sample would read: read them all.
            None if sampled > 0 => Selection::everything(n),
            None => Selection::exact(ranges),
        }
    }
}

/// One KV head's reads at a decode step: keys read exactly, and an even sample of the
/// others, each sampled key standing for `weight` of them.
struct Selection {
    exact: Vec<Range<usize>>,
    sample: Vec<Range<usize>>,
    weight: f32,
}

impl Selection {
    fn everything(n: usize) -> Self {
        Selection::exact(std::iter::once(0..n).collect())
    }

    fn exact(exact: Vec<Range<usize>>) -> Self {
        Selection {
            exact,
            sample: Vec::new(),
            weight: 1.0,
        }
    }
}

/// The positions of `0..end` outside `kept` (ascending, disjoint ranges), as ranges.
fn left_out(kept: &[Range<usize>], end: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for r in kept {
        if r.start > at {
            out.push(at..r.start.min(end));
        }
        at = at.max(r.end);
    }
    if at < end {
        out.push(at..end);
    }
    out.retain(|r| !r.is_empty());
    out
}

/// `m` positions of `0..end` outside `kept`, evenly spaced over those `N` positions from
/// `offset` (in `[0, 1)`: one draw places them all — systematic sampling), with the weight
/// `N / m` each stands for; `None` when there is nothing to sample (`m` is 0 or the rest
/// has no more than `m` positions, which are then simply read: see the caller).
fn even_sample(
    kept: &[Range<usize>],
    end: usize,
    m: usize,
    offset: f64,
) -> Option<(Vec<Range<usize>>, f32)> {
    let gaps = left_out(kept, end);
    let population: usize = gaps.iter().map(|r| r.len()).sum();
    if m == 0 || population <= m {
        return None;
    }
    let stride = population as f64 / m as f64;
    let mut picks = Vec::with_capacity(m);
    let mut target = 0;
    let next = |i: usize| ((i as f64 + offset) * stride) as usize;
    let mut index = 0; // rest positions before the gap
    for gap in &gaps {
        while target < m && next(target) < index + gap.len() {
            picks.push(gap.start + next(target) - index);
            target += 1;
        }
        index += gap.len();
    }
    Some((runs(picks), (population as f64 / m as f64) as f32))
}

/// The share of a head's estimated mass the ranked keys may leave out before the whole
/// sample share is spent: below it the sample shrinks in proportion. Chosen on RULER at 8K
/// on the 1.5B (every family within 3 of full at 0.05 and 0.1; 0.25 gave back most of the
/// aggregation gain; a fixed share lost a variable chain's last hop).
const TAIL_FOR_FULL_SAMPLE: f32 = 0.1;

/// How many of the budget's `best.len()` reads go to the sample: `share`% of them, scaled
/// by how much of the estimated mass the ranked rest would leave out (up to
/// [`TAIL_FOR_FULL_SAMPLE`]) — a head whose mass the ranked keys hold nearly whole (a
/// needle, a chain's next hop) keeps its budget for ranking; one whose mass is spread thin
/// (counting over the whole text) samples the full share. `best` are the budget's best
/// positions by `mass`.
fn sample_size(mass: &[f32], best: &[usize], share: usize) -> usize {
    let nominal = best.len() * share / 100;
    if nominal == 0 {
        return 0;
    }
    let mut top: Vec<f32> = best.iter().map(|&t| mass[t]).collect();
    let ranked = best.len() - nominal;
    if ranked > 0 {
        top.select_nth_unstable_by(ranked - 1, |a, b| b.total_cmp(a));
    }
    let total: f32 = mass.iter().sum();
    let kept: f32 = top[..ranked].iter().sum();
    if total <= 0.0 {
        return 0;
    }
    let left_out = (1.0 - kept / total).max(0.0);
    (nominal as f32 * (left_out / TAIL_FOR_FULL_SAMPLE).min(1.0)).round() as usize
}

/// The `k` of `best` (positions, ascending) with the most `mass`, ascending; ties go to
/// the later positions, as [`most_mass`]'s.
fn most_of(mass: &[f32], best: Vec<usize>, k: usize) -> Vec<usize> {
    if k >= best.len() {
        return best;
    }
    if k == 0 {
        return Vec::new();
    }
    let mut order = best;
    order.select_nth_unstable_by(k - 1, |&a, &b| mass[b].total_cmp(&mass[a]).then(b.cmp(&a)));
    order.truncate(k);
    order.sort_unstable();
    order
}

/// A number in `[0, 1)` from `seed` (SplitMix64's finaliser): the sample's offset, the same
/// on every run for the same layer, step and head.
fn unit_interval(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl SparsePolicy for SketchAttention {
    fn name(&self) -> &str {
        "sketch"
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

    /// Prefill, dense layers and contexts within the budget read everything; a decode query
    /// reads, per KV head, the positions [`Self::select`] ranks first.
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let n = ctx.pos0 + 1;
        let dense = ctx.n_tokens() != 1 || self.settings.dense_layers.contains(&ctx.layer);
        if dense
            || ctx.layer >= self.layers.len()
            || self.settings.budget >= n
            || n < self.settings.block
        {
            return ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens());
        }
        let mut layer = self.layers[ctx.layer].take();
        if let Some(l) = &mut layer {
            // Positions from `pos0` on are being written again (a forward pass that failed
            // midway, which no rewind announces): what was made from them is stale.
            // A prompt read since the last decode step (more than one new position): the
            // channels are chosen again for its first step, as a fresh sequence would.
            if l.chosen_at >= ctx.pos0 || l.last_step + 1 < ctx.pos0 {
                layer = None;
            } else {
                l.truncate(n / self.settings.block * self.settings.block);
            }
        }
        let mut layer = self.up_to_date(layer, ctx);
        layer.last_step = ctx.pos0;
        let selections: Vec<Selection> = (0..ctx.shape.n_head_kv)
            .into_par_iter()
            .map(|h| self.select(&layer, ctx, h))
            .collect();
        let mut entries = Vec::with_capacity(2 * selections.len());
        for (h, s) in selections.into_iter().enumerate() {
            entries.push(PlanEntry::exact(h..h + 1, Source::Store, vec![s.exact]));
            if !s.sample.is_empty() {
                entries.push(PlanEntry {
                    kv_heads: h..h + 1,
                    source: Source::Store,
                    visible: vec![s.sample],
                    weight: s.weight,
                });
            }
        }
        self.layers[ctx.layer] = Some(layer);
        ReadPlan {
            entries,
            side: Vec::new(),
        }
    }

    /// Sketch the sealed block while its keys are at hand, once the channels are chosen
    /// (before that, the first decode step reads the blocks from the store).
    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        let rows = self.settings.block;
        let Some(Some(l)) = self.layers.get_mut(layer) else {
            return;
        };
        // A block sealed again was written again: what was made from it is stale.
        l.truncate(block * rows);
        if keys.rows() != rows || block * rows != l.sketched || keys.kv_heads() != l.heads.len() {
            return; // another size, or a block missing: `plan` catches up from the store
        }
        l.extend(
            keys.as_slice(),
            keys.kv_heads() * keys.head_dim(),
            keys.head_dim(),
        );
    }

    fn forget_from(&mut self, pos: usize) {
        let keep = pos / self.settings.block * self.settings.block;
        for layer in &mut self.layers {
            match layer {
                Some(l) if l.chosen_at >= pos => *layer = None,
                Some(l) => {
                    l.truncate(keep);
                    l.last_step = l.last_step.min(pos - 1);
                }
                None => {}
            }
        }
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        self.settings.budget.min(n_ctx) as f64 / n_ctx as f64
    }

    /// Per layer, position and KV head: the channels' quants and a scale.
    fn summary_bytes(&self, n_ctx: usize, kv_dim: usize) -> usize {
        let heads = kv_dim.div_ceil(self.groups.iter().map(Vec::len).sum::<usize>().max(1));
        let channels = self.settings.channels.min(kv_dim / heads.max(1));
        self.layers.len() * n_ctx * heads * (channels.div_ceil(4) * 4 + 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, read_set, DenseAttention};
    use crate::kv::{KvType, RamStore};
    use crate::policy::oracle::group_key_mass;
    use sparrow_attn::kernel::AttnShape;

    const SHAPE: AttnShape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 8,
    };

    fn settings(budget: usize, channels: usize, rerank: usize) -> SketchSettings {
        SketchSettings {
            block: 4,
            budget,
            channels,
            dense_layers: vec![],
            rerank,
            sample: 0,
        }
    }

    /// A policy for SHAPE's heads (8 channels, NeoX pairs `(i, i + 4)`), one layer.
    fn policy(s: SketchSettings) -> SketchAttention {
        SketchAttention::with_groups(s, rotation_groups(8, 8, RopeLayout::Neox), 1)
    }

    fn store(keys: &[Vec<f32>]) -> RamStore {
        let mut c = RamStore::new(KvType::F32, 1, keys.len(), keys[0].len());
        for (p, k) in keys.iter().enumerate() {
            c.write(0, p, k, k);
        }
        c
    }

    fn random_keys(n: usize, seed: u64, spread: f32) -> Vec<Vec<f32>> {
        let mut r = sparrow_attn::kernel::reference::uniform(seed);
        (0..n)
            .map(|_| (0..16).map(|_| r() * spread).collect())
            .collect()
    }

    /// The selection equals a sort by mass (ties to the later position) at every k: on values
    /// with many ties, zeros and a negative zero; on values crowded into a
    /// few top bits, with ties among them, NaN (no mass), a subnormal and infinity; on a
    /// spread of a few thousand; and on values long enough to be sampled, the sample
    /// misjudging where the k-th largest lies.
    #[test]
    fn most_mass_is_the_top_of_a_sort_with_ties_to_later_positions() {
        let check = |mass: &[f32], ks: &mut dyn Iterator<Item = usize>| {
            let n = mass.len();
            // Zero, negative zero and NaN are one value: no mass.
            let v = |t: usize| if mass[t] > 0.0 { mass[t] } else { 0.0 };
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| v(b).total_cmp(&v(a)).then(b.cmp(&a)));
            for k in ks {
                let mut want = order[..k.min(n)].to_vec();
                want.sort_unstable();
                assert_eq!(most_mass(mass, k), want, "n {n}, k {k}");
            }
        };
        let few: Vec<f32> = (0..50)
            .map(|i| match i % 7 {
                0 => 0.0,
                1 => -0.0,
                2 => 0.25,
                _ => ((i * 37) % 11) as f32 * 0.1,
            })
            .collect();
        check(&few, &mut (0..=51));
        let crowded: Vec<f32> = (0..200)
            .map(|i| match i % 23 {
                3 => f32::NAN,
                7 => 1e-40,
                19 => f32::INFINITY,
                _ => 1.0 + ((i * 7) % 13) as f32 * 0.001,
            })
            .collect();
        check(&crowded, &mut (0..=201));
        let mut r = sparrow_attn::kernel::reference::uniform(11);
        let spread: Vec<f32> = (0..3000)
            .map(|_| {
                let x = r();
                // Masses over many octaves, and a tenth of them exactly equal.
                if x > 0.8 {
                    0.5
                } else {
                    (x * 20.0).exp() * 1e-6
                }
            })
            .collect();
        check(
            &spread,
            &mut [1, 2, 150, 299, 300, 301, 1500, 2999, 3000].into_iter(),
        );
        // Long enough to be sampled (every fourth value here), and laid out so the sample
        // misjudges: every sampled value is large, most of the others small.
        let sampled: Vec<f32> = (0..10_000)
            .map(|t| {
                if t % 4 == 0 {
                    1.0 + (t % 97) as f32 * 0.01
                } else {
                    (t % 89) as f32 * 1e-3
                }
            })
            .collect();
        check(
            &sampled,
            &mut [1, 100, 2499, 2500, 2501, 5000, 9999].into_iter(),
        );
    }

    #[test]
    fn channels_rotate_in_the_models_pairs() {
        assert_eq!(
            rotation_groups(6, 4, RopeLayout::Normal),
            vec![vec![0, 1], vec![2, 3], vec![4], vec![5]]
        );
        assert_eq!(
            rotation_groups(6, 4, RopeLayout::Neox),
            vec![vec![0, 2], vec![1, 3], vec![4], vec![5]]
        );
        // Whole pairs by summed weight; an odd count ends on the best single channel left.
        let groups = rotation_groups(6, 6, RopeLayout::Neox);
        let weight = [1.0, 0.0, 5.0, 1.0, 0.5, 0.1];
        // Pairs (0, 3), (1, 4), (2, 5) weigh 2, 0.5 and 5.1: channel 5 comes with 2, though
        // alone it weighs less than 0 or 3.
        assert_eq!(choose_channels(&weight, &groups, 2), vec![2, 5]);
        assert_eq!(choose_channels(&weight, &groups, 3), vec![0, 2, 5]);
        assert_eq!(choose_channels(&weight, &groups, 4), vec![0, 2, 3, 5]);
        assert_eq!(choose_channels(&weight, &groups, 6), vec![0, 1, 2, 3, 4, 5]);
    }

    /// A channel every key holds at the same large value carries no ranking, however much
    /// the query weighs it; a channel the query ignores carries none either. The pair with
    /// both spread and query weight is chosen.
    #[test]
    fn the_channels_chosen_are_those_whose_spread_the_query_weighs() {
        let mut r = sparrow_attn::kernel::reference::uniform(3);
        let keys: Vec<f32> = (0..64)
            .flat_map(|_| {
                let mut k = vec![0.01 * r(); 8];
                k[0] = 9.0; // constant offset
                k[1] = 3.0 * r(); // spread, weighed by the query
                k[5] = 3.0 * r(); // its NeoX partner
                k[2] = 5.0 * r(); // spread, ignored by the query
                k
            })
            .collect();
        let q = [5.0, 1.0, 0.0, 0.01, 0.01, 1.0, 0.01, 0.01];
        let groups = rotation_groups(8, 8, RopeLayout::Neox);
        let head = HeadSketch::choose(&q, &keys, 8, 0, 8, &groups, 2);
        assert_eq!(head.channels, vec![1, 5]);
    }

    /// One key among noise points along the query on the channels the sketch keeps: it is
    /// read, with the open block, and the read count is the budget.
    #[test]
    fn the_key_that_stands_out_is_read_with_the_open_block() {
        let mut keys = random_keys(70, 5, 0.3);
        keys[37][1] = 4.0;
        keys[37][5] = 4.0;
        let c = store(&keys);
        let mut q = vec![0.05f32; 32];
        for h in 0..2 {
            q[h * 8 + 1] = 1.0;
            q[h * 8 + 5] = 1.0;
        }
        let mut p = policy(settings(10, 2, 0));
        let read = read_set(&mut p, SHAPE, &c, 0, &q, 69);
        let ranges = &read[0];
        assert!(ranges.iter().any(|r| r.contains(&37)), "{ranges:?}");
        assert_eq!(ranges.last().unwrap(), &(68..70), "the open block is read");
        assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), 10);
        assert!((p.fraction_read(70) - 10.0 / 70.0).abs() < 1e-12);
    }

    /// With every key a candidate of the exact pass, the read set is the oracle's: the top
    /// keys by exact mass (f64, computed independently), whatever the sketch ranked.
    #[test]
    fn a_rerank_over_every_key_keeps_the_oracles_keys() {
        let keys = random_keys(64, 17, 3.0);
        let c = store(&keys);
        let mut r = sparrow_attn::kernel::reference::uniform(23);
        let q: Vec<f32> = (0..32).map(|_| r()).collect();
        // 64 positions, all sealed: 16 kept of 64 candidates.
        let mut p = policy(settings(16, 2, 4));
        let read = read_set(&mut p, SHAPE, &c, 0, &q, 63);
        let flat: Vec<f32> = keys.concat();
        for (h, ranges) in read.iter().enumerate() {
            let got: Vec<usize> = ranges.iter().cloned().flatten().collect();
            let mass = group_key_mass(&q[h * 16..(h + 1) * 16], &flat, 16, 8, h);
            let mut want: Vec<usize> = (0..64).collect();
            want.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
            want.truncate(16);
            want.sort_unstable();
            assert_eq!(got, want, "KV head {h}");
        }
    }

    /// All channels kept: the sketch's ranking is the exact one up to 8-bit rounding, so on
    /// keys whose masses are far apart it reads the oracle's keys.
    #[test]
    fn with_every_channel_the_sketch_ranks_as_the_exact_logits() {
        let keys = random_keys(128, 29, 4.0);
        let c = store(&keys);
        let mut r = sparrow_attn::kernel::reference::uniform(31);
        let q: Vec<f32> = (0..32).map(|_| r()).collect();
        let mut p = policy(settings(8, 8, 0));
        let read = read_set(&mut p, SHAPE, &c, 0, &q, 127);
        let flat: Vec<f32> = keys.concat();
        for (h, ranges) in read.iter().enumerate() {
            let got: Vec<usize> = ranges.iter().cloned().flatten().collect();
            let mass = group_key_mass(&q[h * 16..(h + 1) * 16], &flat, 16, 8, h);
            let mut order: Vec<usize> = (0..128).collect();
            order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
            // The 8 read hold the top 6 (a near-tie may swap the last two).
            for t in &order[..6] {
                assert!(got.contains(t), "KV head {h}: {t} missing from {got:?}");
            }
        }
    }

    /// Decoding position by position, sketches made from sealed blocks (the engine's way)
    /// and sketches caught up from the store (a policy installed after the prompt) plan the
    /// same reads; a rewind to the choosing step and the same steps again plan as before;
    /// a rewind past it keeps the choice.
    #[test]
    fn sealed_caught_up_and_rewound_sketches_plan_alike() {
        let keys = random_keys(96, 41, 2.0);
        let c = store(&keys);
        let mut r = sparrow_attn::kernel::reference::uniform(43);
        let queries: Vec<Vec<f32>> = (0..96).map(|_| (0..32).map(|_| r()).collect()).collect();
        let s = settings(12, 4, 0);
        let steps =
            |p: &mut SketchAttention, from: usize, seal: bool| -> Vec<Vec<Vec<Range<usize>>>> {
                (from..96)
                    .map(|pos| {
                        if seal && pos % 4 == 0 && pos > 0 {
                            let flat: Vec<f32> = keys[pos - 4..pos].concat();
                            let view = KeysView::new(&flat, 4, 2, 8).unwrap();
                            p.on_block_sealed(0, pos / 4 - 1, view);
                        }
                        read_set(p, SHAPE, &c, 0, &queries[pos], pos)
                    })
                    .collect()
            };
        let mut sealed = policy(s.clone());
        let by_seal = steps(&mut sealed, 40, true);
        let mut caught_up = policy(s.clone());
        assert_eq!(steps(&mut caught_up, 40, false), by_seal);
        // Back to the step that chose the channels: chosen again, the same.
        sealed.forget_from(40);
        assert!(sealed.layers[0].is_none());
        assert_eq!(steps(&mut sealed, 40, true), by_seal);
        // Back past it: the choice stays, the reopened blocks are sketched again.
        sealed.forget_from(61);
        assert_eq!(sealed.layers[0].as_ref().unwrap().sketched, 60);
        assert_eq!(steps(&mut sealed, 61, true), by_seal[21..].to_vec());
        // A prompt between two steps (positions 72..90 read at once): chosen again at 90,
        // as a policy that first decodes there chooses.
        let mut first = policy(s.clone());
        read_set(&mut first, SHAPE, &c, 0, &queries[71], 71);
        let again = read_set(&mut first, SHAPE, &c, 0, &queries[90], 90);
        assert_eq!(first.layers[0].as_ref().unwrap().chosen_at, 90);
        let mut fresh = policy(s);
        assert_eq!(read_set(&mut fresh, SHAPE, &c, 0, &queries[90], 90), again);
    }

    /// The even sample: `m` positions outside the kept ranges, one in each stride of
    /// `N / m` of the rest, weighted `N / m`; over offsets spread evenly in `[0, 1)` every
    /// position left out is picked in the share `m / N` of them — what makes the weighted
    /// sample an unbiased estimate of the keys it stands for.
    #[test]
    fn the_even_sample_picks_each_key_left_out_at_the_same_rate() {
        let kept = vec![0..3, 10..12, 40..41, 70..75];
        let (end, m) = (90, 12);
        let rest: Vec<usize> = (0..end)
            .filter(|p| !kept.iter().any(|r| r.contains(p)))
            .collect();
        let population = rest.len();
        assert_eq!(population, 79);
        let offsets = 4000;
        let mut picked = vec![0usize; end];
        for j in 0..offsets {
            let (sample, weight) =
                even_sample(&kept, end, m, (j as f64 + 0.5) / offsets as f64).expect("a sample");
            assert!((weight - 79.0 / 12.0).abs() < 1e-6);
            let flat: Vec<usize> = sample.into_iter().flatten().collect();
            assert_eq!(flat.len(), m);
            for (k, &p) in flat.iter().enumerate() {
                let i = rest.binary_search(&p).expect("a position left out");
                // One per stride: the k-th pick lies in the k-th N/m of the rest (its start
                // rounded down).
                let stride = population as f64 / m as f64;
                let (low, high) = (k as f64 * stride - 1.0, (k + 1) as f64 * stride);
                assert!(
                    (i as f64) > low && (i as f64) < high,
                    "pick {k}: position {p} (rest index {i})"
                );
                picked[p] += 1;
            }
        }
        for (p, &count) in picked.iter().enumerate() {
            let rate = count as f64 / offsets as f64;
            let want = if rest.contains(&p) {
                m as f64 / 79.0
            } else {
                0.0
            };
            assert!((rate - want).abs() < 2e-3, "position {p}: {rate} vs {want}");
        }
        // Nothing to sample: no share asked, or no more left out than asked.
        assert!(even_sample(&kept, end, 0, 0.3).is_none());
        assert!(even_sample(&kept, end, 79, 0.3).is_none());
        assert!(left_out(&[0..40, 40..90], 90).is_empty());
        assert_eq!(left_out(&[5..40, 41..80], 90), vec![0..5, 40..41, 80..90]);
    }

    /// The sample's size follows the mass the ranked keys leave out: none when they hold
    /// it all, the whole share at a tenth left out or more, in proportion between.
    #[test]
    fn the_sample_grows_with_the_mass_the_ranked_keys_leave_out() {
        // 1000 positions; the budget's best 100 are the first 100, ranking 50 of them.
        let best: Vec<usize> = (0..100).collect();
        let even = vec![0.001f32; 1000];
        assert_eq!(
            sample_size(&even, &best, 50),
            50,
            "a spread head: the whole share"
        );
        let sharp = {
            let mut mass = vec![0.0f32; 1000];
            mass[3] = 1.0;
            sample_size(&mass, &best, 50)
        };
        assert_eq!(sharp, 0, "one key holds everything");
        let mut mass = vec![0.0f32; 1000];
        mass[..50].iter_mut().for_each(|m| *m = 0.95 / 50.0);
        mass[50..].iter_mut().for_each(|m| *m = 0.05 / 950.0);
        // 5% left out: half the share.
        assert_eq!(sample_size(&mass, &best, 50), 25);
        assert_eq!(sample_size(&mass, &best, 0), 0);
    }

    /// The ranked part of the best: the `k` with the most mass, ties to later positions, as
    /// a full sort orders them.
    #[test]
    fn the_ranked_part_is_the_top_of_the_best_by_mass() {
        let mut r = sparrow_attn::kernel::reference::uniform(71);
        // Coarse masses, so ties are common.
        let mass: Vec<f32> = (0..500).map(|_| ((r() + 1.0) * 4.0).floor()).collect();
        let best: Vec<usize> = (0..500).filter(|p| p % 3 != 1).collect();
        for k in [0, 1, 7, 100, 200, 333, 400] {
            let mut want = best.clone();
            want.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]).then(b.cmp(&a)));
            want.truncate(k);
            want.sort_unstable();
            assert_eq!(most_of(&mass, best.clone(), k), want, "k = {k}");
        }
    }

    /// Most of the mass on a long flat tail (aggregation's shape): the ranked keys alone
    /// renormalise over a few and miss the tail's share of the output; spending half the
    /// budget on a weighted sample of the tail recovers it, at the same reads.
    #[test]
    fn a_weighted_sample_recovers_the_mass_a_top_k_drops() {
        let n = 400;
        let mut r = sparrow_attn::kernel::reference::uniform(61);
        let mut c = RamStore::new(KvType::F32, 1, n, 16);
        let mut q = vec![0f32; 32];
        for h in 0..4 {
            q[h * 8 + 2] = 3.0;
        }
        for p in 0..n {
            // Eight heavy keys (logit ~ +3.5 each), the rest ~0: the tail holds ~60% of the
            // mass; the values tell the two apart (+1 / -1 on channel 0).
            let heavy = p % 50 == 7;
            let mut k: Vec<f32> = (0..16).map(|_| 0.05 * r()).collect();
            let mut v: Vec<f32> = (0..16).map(|_| 0.1 * r()).collect();
            for h in 0..2 {
                k[h * 8 + 2] += if heavy { 3.3 } else { 0.0 };
                v[h * 8] = if heavy { -1.0 } else { 1.0 };
            }
            c.write(0, p, &k, &v);
        }
        let out = |p: &mut dyn SparsePolicy| {
            let mut o = vec![0f32; 32];
            attend(p, SHAPE, &c, 0, &q, n - 1, &mut o);
            o
        };
        let dense = out(&mut DenseAttention);
        let error = |o: &[f32]| {
            o.iter()
                .zip(&dense)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        };
        let mut top_k = policy(settings(40, 2, 0));
        let top_k_error = error(&out(&mut top_k));
        let mut sampled = policy(SketchSettings {
            sample: 50,
            ..settings(40, 2, 0)
        });
        let sampled_error = error(&out(&mut sampled));
        assert!(
            top_k_error > 0.5,
            "the top-k misses the tail ({top_k_error})"
        );
        assert!(
            sampled_error < 0.1 * top_k_error,
            "sampled {sampled_error} vs top-k {top_k_error}"
        );
        // The same reads: 20 ranked + 20 sampled (the open block among them) per KV head.
        let read = read_set(&mut sampled, SHAPE, &c, 0, &q, n - 1);
        for ranges in &read {
            assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), 40);
        }
    }

    #[test]
    fn a_budget_covering_the_context_is_exact_attention() {
        let keys = random_keys(40, 7, 1.0);
        let c = store(&keys);
        let q: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut p = policy(settings(40, 2, 0));
        let (mut a, mut b) = (vec![0f32; 32], vec![0f32; 32]);
        attend(&mut p, SHAPE, &c, 0, &q, 39, &mut a);
        attend(&mut DenseAttention, SHAPE, &c, 0, &q, 39, &mut b);
        assert_eq!(a, b);
        assert!(p.layers[0].is_none(), "nothing to sketch within the budget");
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = |s: SketchSettings| s.validate().unwrap_err();
        assert!(bad(settings(0, 4, 0)).contains("budget 0"));
        assert!(bad(settings(8, 0, 0)).contains("channels 0"));
        assert!(bad(settings(8, 4, 65)).contains("re-rank factor 65"));
        let over = SketchSettings {
            sample: 91,
            ..settings(8, 4, 0)
        };
        assert!(bad(over).contains("sample 91%"));
        // More channels than a head has: the head is sketched whole.
        let keys = random_keys(40, 9, 1.0);
        let q = vec![0.5f32; 32];
        let mut p = policy(settings(12, 100, 0));
        read_set(&mut p, SHAPE, &store(&keys), 0, &q, 39);
        let head = &p.layers[0].as_ref().unwrap().heads[1];
        assert_eq!(head.channels, (0..8).collect::<Vec<_>>());
    }
}
