//! Quest (Tang et al., 2024) inside the engine: query-aware selection of KV pages for
//! decode.
//!
//! The cache is viewed as pages of `page` positions. When a page is complete its keys'
//! element-wise minimum and maximum per KV head are recorded (once; a page's keys never
//! change while it stays below the write position). For a decode query, each complete page
//! is scored with the upper bound `Σ_d max(q_d · min_d, q_d · max_d)` of `q · k` over its keys
//! — summed over the query heads that share the KV head, so a GQA group reads one selection
//! (computed as one dot product per page from the page's centre and radius:
//! [`group_upper_bounds`]) — and exact attention runs over the best pages that fit the token
//! budget plus the incomplete last page. Prefill, and layers listed as dense, use exact
//! attention: Quest is a decode method, and its authors keep the first two layers dense.
//!
//! The page summaries live here rather than in the cache: they are per-sequence policy
//! state, built as pages are sealed, and dropped from the first page a rewind touches
//! ([`SparsePolicy::forget_from`]). A decode plan names one entry per KV head — the pages
//! that head's group reads — before anything is read, so a tiered store can fetch them.
//!
//! `--quest-rerank F` adds an exact second pass, for prompts whose pages look alike to
//! their bounds (a needle among look-alike needles): `F` times the budget's pages are taken
//! as candidates — ranked by each query head's softmax of the bounds summed over the group
//! ([`group_block_mass`], the oracle's criterion, so one retrieval head's sharp page is not
//! outvoted by broad heads) — their keys are read, and the budget's positions with the most
//! exact mass among them are attended to. It reads `F` times the budget's keys to choose
//! (the plan reads them from the store, so a tiered store serves them from its cold file).

use super::oracle::top_by_exact_mass;
use super::{AttentionChoice, PolicyEntry, SettingsType};
use rayon::prelude::*;
use sparrow_attn::kernel::{read_f32, AttnShape, KvSource, Level};
use sparrow_attn::policy::{
    center_radius, group_block_mass, group_query, group_upper_bounds, key_bounds, KeysView,
    PlanContext, PlanEntry, ReadPlan, Source, SparsePolicy,
};
use std::ops::Range;

/// The registry's entry: a decode policy; `--kv-block` is its page.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "quest",
    summary: "decode: best pages within a budget",
    prefill: false,
    decode: true,
    build: |b| {
        Ok(Box::new(QuestAttention::new(
            settings(b.choice)?,
            b.model.n_layer,
        )?))
    },
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<QuestSettings>(),
};

/// Quest's settings with the shared `--kv-block` (its page) and `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<QuestSettings, String> {
    let mut s = c.settings::<QuestSettings>();
    s.page = c.kv_block.unwrap_or(s.page);
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// Quest's settings (defaults from the method's code: 16-token pages, 1024-token budget,
/// layers 0 and 1 dense).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct QuestSettings {
    /// Positions per page (set by `--kv-block`).
    #[cfg_attr(feature = "cli", arg(skip = 16usize))]
    pub page: usize,
    /// Quest: tokens read per decode step (pages chosen + the last, incomplete page).
    #[cfg_attr(feature = "cli", arg(id = "QUEST_BUDGET", long = "quest-budget", default_value_t = 1024, help_heading = crate::policy::HELP_HEADING))]
    pub budget: usize,
    /// Layers that always use exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip = vec![0usize, 1]))]
    pub dense_layers: Vec<usize>,
    /// Quest: exact second pass — take RERANK times the budget's pages by their bounds,
    /// read those pages' keys, and attend to the budget's positions with the most exact
    /// attention mass among them (0 or 1: pages by bounds alone, the method as published).
    #[cfg_attr(feature = "cli", arg(id = "QUEST_RERANK", long = "quest-rerank", default_value_t = 0, help_heading = crate::policy::HELP_HEADING))]
    pub rerank: usize,
}

impl Default for QuestSettings {
    fn default() -> Self {
        QuestSettings {
            page: 16,
            budget: 1024,
            dense_layers: vec![0, 1],
            rerank: 0,
        }
    }
}

impl QuestSettings {
    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.page == 0 || self.page > 4096 {
            return Err(format!(
                "quest page size {} is out of range (1..=4096 tokens)",
                self.page
            ));
        }
        if self.budget < self.page {
            return Err(format!(
                "quest budget {} is out of range: it must hold at least one page ({} tokens)",
                self.budget, self.page
            ));
        }
        if self.rerank > 64 {
            return Err(format!(
                "quest re-rank factor {} is out of range (0..=64 times the budget)",
                self.rerank
            ));
        }
        Ok(())
    }
}

/// Bounds of the complete pages of one layer, as centre and radius per value (`pages ×
/// kv_dim` each; see [`group_upper_bounds`]).
#[derive(Default)]
struct LayerPages {
    pages: usize,
    center: Vec<f32>,
    radius: Vec<f32>,
}

impl LayerPages {
    /// Record page `p` from its keys (`rows × kv_dim`); pages `0..p` are recorded.
    fn record(&mut self, p: usize, keys: &[f32], kv_dim: usize) {
        let (mut lo, mut hi) = (vec![f32::INFINITY; kv_dim], vec![f32::NEG_INFINITY; kv_dim]);
        key_bounds(keys, kv_dim, &mut lo, &mut hi);
        self.center.resize((p + 1) * kv_dim, 0.0);
        self.radius.resize((p + 1) * kv_dim, 0.0);
        let span = p * kv_dim..(p + 1) * kv_dim;
        center_radius(
            &lo,
            &hi,
            &mut self.center[span.clone()],
            &mut self.radius[span],
        );
        self.pages = p + 1;
    }
}

/// The Quest policy (one per sequence).
pub struct QuestAttention {
    settings: QuestSettings,
    layers: Vec<LayerPages>,
}

impl QuestAttention {
    /// A policy for a model of `n_layer` layers.
    pub fn new(settings: QuestSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(QuestAttention {
            settings,
            layers: (0..n_layer).map(|_| LayerPages::default()).collect(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &QuestSettings {
        &self.settings
    }

    /// Record the bounds of every page of `pages` that is complete within `0..filled` and
    /// not yet summarised, reading its keys from `store` (a catch-up: pages are normally
    /// summarised when sealed).
    fn seal_pages(&self, pages: &mut LayerPages, store: &dyn KvSource, hd: usize, filled: usize) {
        let (page, kv_dim) = (self.settings.page, store.kv_dim());
        let complete = filled / page;
        if pages.pages >= complete {
            return;
        }
        let mut keys = vec![0f32; page * kv_dim];
        for p in pages.pages..complete {
            read_f32(store, false, hd, p * page, &mut keys);
            pages.record(p, &keys, kv_dim);
        }
    }

    /// For a context of `n` positions: how many pages are complete, and how many of them
    /// the budget leaves room for next to the incomplete last page.
    fn read_plan(&self, n: usize) -> (usize, usize) {
        let page = self.settings.page;
        let complete = n / page;
        let tail = n - complete * page;
        (complete, self.settings.budget.saturating_sub(tail) / page)
    }

    /// The key ranges the query heads of `kv_head` (rows `q_group`, `group × head_dim`) read
    /// at a context of `n` positions: the best-scoring complete pages within the budget, in
    /// ascending order and merged where adjacent, then the incomplete last page.
    fn select(
        &self,
        store: &dyn KvSource,
        pages: &LayerPages,
        shape: AttnShape,
        kv_head: usize,
        q_group: &[f32],
        n: usize,
    ) -> Vec<Range<usize>> {
        let page = self.settings.page;
        let (complete, slots) = self.read_plan(n);
        debug_assert!(pages.pages >= complete, "pages are sealed before selection");
        let tail_start = complete * page;
        if slots >= complete {
            return std::iter::once(0..n).collect();
        }
        let hd = shape.head_dim;
        let kv_dim = shape.kv_dim();
        let at = kv_head * hd;
        let (center, radius) = (&pages.center[at..], &pages.radius[at..]);
        let mut bounds = vec![0.0f32; complete];
        if self.settings.rerank > 1 {
            // Candidates for the exact pass: each head's share of the group's estimated mass.
            group_block_mass(
                Level::active(),
                q_group,
                hd,
                center,
                radius,
                kv_dim,
                &mut bounds,
            );
        } else {
            let (mut sum, mut abs_sum) = (vec![0.0; hd], vec![0.0; hd]);
            group_query(q_group, &mut sum, &mut abs_sum);
            let level = Level::active();
            group_upper_bounds(level, &sum, &abs_sum, center, radius, kv_dim, &mut bounds);
        }
        // NaN (from a broken activation) ranks last instead of poisoning the order.
        let mut scored: Vec<(f32, usize)> = bounds
            .iter()
            .enumerate()
            .map(|(p, &s)| (if s.is_nan() { f32::NEG_INFINITY } else { s }, p))
            .collect();
        let candidates = if self.settings.rerank > 1 {
            (slots * self.settings.rerank).min(complete)
        } else {
            slots
        };
        let mut chosen: Vec<usize> = if candidates == 0 {
            Vec::new()
        } else {
            scored.select_nth_unstable_by(candidates - 1, |a, b| {
                b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
            });
            scored[..candidates].iter().map(|&(_, p)| p).collect()
        };
        chosen.sort_unstable();
        let mut ranges: Vec<Range<usize>> = if candidates > slots {
            rerank(store, shape, kv_head, q_group, &chosen, page, slots * page)
        } else {
            let mut ranges = Vec::with_capacity(chosen.len() + 1);
            for p in chosen {
                push_range(&mut ranges, p * page..(p + 1) * page);
            }
            ranges
        };
        if tail_start < n {
            push_range(&mut ranges, tail_start..n);
        }
        ranges
    }
}

/// The second pass: of the candidate `pages` (ascending), the `keep` positions with the
/// most exact attention mass for the group `q_group` of `kv_head`
/// ([`top_by_exact_mass`], the oracle's criterion within the candidates).
fn rerank(
    store: &dyn KvSource,
    shape: AttnShape,
    kv_head: usize,
    q_group: &[f32],
    pages: &[usize],
    page: usize,
    keep: usize,
) -> Vec<Range<usize>> {
    let candidates: Vec<usize> = pages
        .iter()
        .flat_map(|&p| p * page..(p + 1) * page)
        .collect();
    top_by_exact_mass(store, shape, kv_head, q_group, &candidates, keep)
}

/// Append `r` to ascending `ranges`, merging it with the last one when they touch.
fn push_range(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    match ranges.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => ranges.push(r),
    }
}

impl SparsePolicy for QuestAttention {
    fn name(&self) -> &str {
        "quest"
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn requires_block_selection(&self) -> bool {
        true
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.settings.page)
    }

    /// Prefill and dense layers read everything; a decode query reads, per KV head, the
    /// pages [`Self::select`] picks from the page bounds.
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let n = ctx.n_tokens();
        let dense = n != 1 || self.settings.dense_layers.contains(&ctx.layer);
        if dense || ctx.layer >= self.layers.len() {
            return ReadPlan::causal(ctx.shape, ctx.pos0, n);
        }
        let mut pages = std::mem::take(&mut self.layers[ctx.layer]);
        if pages.pages * self.settings.page > ctx.pos0 {
            // Positions from `pos0` on are being written again (a forward pass that failed
            // midway, which no rewind announces): their pages are stale.
            pages.pages = ctx.pos0 / self.settings.page;
        }
        self.seal_pages(&mut pages, ctx.store, ctx.shape.head_dim, ctx.pos0 + 1);
        // Scoring every page is the plan's whole cost at depth (1,000 pages per KV head per
        // layer at 16K): the KV heads select in parallel.
        let entries = (0..ctx.shape.n_head_kv)
            .into_par_iter()
            .map(|h| PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                weight: 1.0,
                visible: vec![self.select(
                    ctx.store,
                    &pages,
                    ctx.shape,
                    h,
                    ctx.group_queries(0, h),
                    ctx.pos0 + 1,
                )],
            })
            .collect();
        self.layers[ctx.layer] = pages;
        ReadPlan {
            entries,
            side: Vec::new(),
        }
    }

    /// Record the sealed page's per-head key bounds while its keys are at hand.
    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        let page = self.settings.page;
        let Some(pages) = self.layers.get_mut(layer) else {
            return;
        };
        if keys.rows() != page || block > pages.pages {
            return; // paged at another size, or an earlier page is missing: `plan` catches up
        }
        pages.record(block, keys.as_slice(), keys.kv_heads() * keys.head_dim());
    }

    /// Centre and radius (f32) per value of every page of every layer.
    fn summary_bytes(&self, n_ctx: usize, kv_dim: usize) -> usize {
        self.layers.len() * n_ctx.div_ceil(self.settings.page) * kv_dim * 8
    }

    fn forget_from(&mut self, pos: usize) {
        let keep = pos / self.settings.page;
        for pages in &mut self.layers {
            pages.pages = pages.pages.min(keep);
        }
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let page = self.settings.page;
        let (complete, slots) = self.read_plan(n_ctx);
        (slots.min(complete) * page + n_ctx % page) as f64 / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvType, RamStore};

    fn cache_with(keys: &[Vec<f32>], kv_dim: usize) -> RamStore {
        let mut c = RamStore::new(KvType::F32, 1, keys.len(), kv_dim);
        for (p, k) in keys.iter().enumerate() {
            c.write(0, p, k, k);
        }
        c
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = QuestSettings {
            budget: 8,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("budget 8"));
        let bad = QuestSettings {
            page: 0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("page size 0"));
    }

    #[test]
    fn selects_the_page_holding_the_aligned_key_and_keeps_the_tail() {
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
        };
        // 70 positions of small keys; position 37 (page 9 of 4-token pages) points along q.
        let mut keys: Vec<Vec<f32>> = (0..70)
            .map(|i| {
                let x = ((i * 7919) % 13) as f32 / 100.0 - 0.06;
                vec![x, -x, 0.5 * x, 0.01]
            })
            .collect();
        keys[37] = vec![3.0, 0.0, 0.0, 0.0];
        let cache = cache_with(&keys, 4);
        let quest = QuestAttention::new(
            QuestSettings {
                page: 4,
                budget: 10,
                dense_layers: vec![],
                rerank: 0,
            },
            1,
        )
        .unwrap();
        let mut pages = LayerPages::default();
        quest.seal_pages(&mut pages, &cache.layer(0), cache.kv_dim(), 70);
        assert_eq!(pages.pages, 17);
        let q = [1.0, 0.2, 0.0, 0.0, 0.9, -0.1, 0.0, 0.0];
        let ranges = quest.select(&cache.layer(0), &pages, shape, 0, &q, 70);
        // Tail 68..70 (2 tokens) leaves room for 2 pages; page 9 must be one of them.
        assert!(ranges.iter().any(|r| r.contains(&37)), "{ranges:?}");
        assert_eq!(ranges.last().unwrap(), &(68..70));
        let read: usize = ranges.iter().map(|r| r.len()).sum();
        assert_eq!(read, 10);
    }

    #[test]
    fn a_budget_covering_every_page_reads_everything() {
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 2,
        };
        let keys: Vec<Vec<f32>> = (0..33).map(|i| vec![i as f32, 1.0]).collect();
        let cache = cache_with(&keys, 2);
        let quest = QuestAttention::new(
            QuestSettings {
                page: 8,
                budget: 33,
                dense_layers: vec![],
                rerank: 0,
            },
            1,
        )
        .unwrap();
        let mut pages = LayerPages::default();
        quest.seal_pages(&mut pages, &cache.layer(0), cache.kv_dim(), 33);
        assert_eq!(
            quest.select(&cache.layer(0), &pages, shape, 0, &[1.0, 0.0], 33),
            vec![0..33]
        );
        assert!((quest.fraction_read(33) - 1.0).abs() < 1e-12);
        assert!((quest.fraction_read(1000) - 33.0 / 1000.0).abs() < 0.01);
    }

    #[test]
    fn rewinds_drop_stale_pages() {
        let mut quest = QuestAttention::new(
            QuestSettings {
                page: 4,
                budget: 8,
                dense_layers: vec![],
                rerank: 0,
            },
            2,
        )
        .unwrap();
        let keys: Vec<Vec<f32>> = (0..20).map(|i| vec![i as f32]).collect();
        let cache = cache_with(&keys, 1);
        let mut p = std::mem::take(&mut quest.layers[0]);
        quest.seal_pages(&mut p, &cache.layer(0), cache.kv_dim(), 20);
        assert_eq!(p.pages, 5);
        quest.layers[0] = p;
        quest.forget_from(9);
        assert_eq!(quest.layers[0].pages, 2);
    }

    /// With every complete page a candidate, the second pass keeps exactly the positions the
    /// exact group mass ranks first (the oracle's criterion, computed here in f64).
    #[test]
    fn reranking_every_page_keeps_the_top_keys_by_exact_mass() {
        let shape = AttnShape {
            n_head: 3,
            n_head_kv: 1,
            head_dim: 8,
        };
        let mut r = sparrow_attn::kernel::reference::uniform(17);
        let keys: Vec<Vec<f32>> = (0..64)
            .map(|_| (0..8).map(|_| r() * 3.0).collect())
            .collect();
        let cache = cache_with(&keys, 8);
        let q: Vec<f32> = (0..24).map(|_| r()).collect();
        let quest = QuestAttention::new(
            QuestSettings {
                page: 8,
                budget: 16,
                dense_layers: vec![],
                rerank: 64,
            },
            1,
        )
        .unwrap();
        let mut pages = LayerPages::default();
        quest.seal_pages(&mut pages, &cache.layer(0), cache.kv_dim(), 64);
        // 64 positions: 8 complete pages, no tail; 16 positions kept.
        let ranges = quest.select(&cache.layer(0), &pages, shape, 0, &q, 64);
        let got: Vec<usize> = ranges.into_iter().flatten().collect();
        let flat: Vec<f32> = keys.concat();
        let mass = crate::policy::oracle::group_key_mass(&q, &flat, 8, 8, 0);
        let mut want: Vec<usize> = (0..64).collect();
        want.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
        want.truncate(16);
        want.sort_unstable();
        assert_eq!(got, want);
    }

    /// A page of wide-ranging keys has the best bound without holding the best key; the
    /// second pass reads the candidates' keys and keeps the one key that matters, where
    /// bounds alone read the decoy page.
    #[test]
    fn the_second_pass_finds_the_key_a_loose_bound_hides() {
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 2,
        };
        // Pages of 4. Page 1 (4..8) spans [-5, 5] in both values: a bound of 10 for q = (1, 1),
        // though no key in it scores above 0. Page 3's key 13 scores 8; all else is near 0.
        let mut keys: Vec<Vec<f32>> = (0..20).map(|i| vec![0.01 * i as f32, 0.0]).collect();
        keys[4] = vec![5.0, -5.0];
        keys[5] = vec![-5.0, 5.0];
        keys[13] = vec![4.0, 4.0];
        let cache = cache_with(&keys, 2);
        let q = [1.0, 1.0];
        let plan = |rerank| {
            let quest = QuestAttention::new(
                QuestSettings {
                    page: 4,
                    budget: 4,
                    dense_layers: vec![],
                    rerank,
                },
                1,
            )
            .unwrap();
            let mut pages = LayerPages::default();
            quest.seal_pages(&mut pages, &cache.layer(0), cache.kv_dim(), 20);
            quest.select(&cache.layer(0), &pages, shape, 0, &q, 20)
        };
        // 20 positions: 5 complete pages, no tail; one page (4 positions) of budget.
        assert_eq!(plan(0), vec![4..8], "bounds alone read the decoy page");
        let reranked = plan(4);
        assert!(reranked.iter().any(|r| r.contains(&13)), "{reranked:?}");
        assert_eq!(reranked.iter().map(|r| r.len()).sum::<usize>(), 4);
    }

    #[test]
    fn a_rerank_factor_out_of_range_is_named() {
        let bad = QuestSettings {
            rerank: 65,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("re-rank factor 65"));
    }
}
