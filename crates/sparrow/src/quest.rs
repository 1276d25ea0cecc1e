//! Quest (Tang et al., 2024) inside the engine: query-aware selection of KV pages for
//! decode.
//!
//! The cache is viewed as pages of `page` positions. When a page is complete its keys'
//! element-wise minimum and maximum per KV head are recorded (once; a page's keys never
//! change while it stays below the write position). For a decode query, each complete page
//! is scored with the upper bound `Σ_d max(q_d · min_d, q_d · max_d)` of `q · k` over its keys
//! — summed over the query heads that share the KV head, so a GQA group reads one selection
//! — and exact attention runs over the best pages that fit the token budget plus the
//! incomplete last page. Prefill, and layers listed as dense, use exact attention: Quest
//! is a decode method, and its authors keep the first two layers dense.
//!
//! The page summaries live here, behind a mutex per layer, rather than in the cache: they are
//! per-sequence policy state, built lazily as pages fill, and dropped from the first page a
//! rewind touches ([`AttentionBackend::forget_from`]).

use crate::attention::{attend_group, AttentionBackend, AttnShape, DenseAttention};
use crate::kv_cache::KvCache;
use rayon::prelude::*;
use sparrow_attn::policy::{key_bounds, upper_bound_score, KeysView};
use std::ops::Range;
use std::sync::Mutex;

/// Quest's settings (defaults from the method's code: 16-token pages, 1024-token budget,
/// layers 0 and 1 dense).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuestSettings {
    /// Positions per page.
    pub page: usize,
    /// Positions read per decode query, including the incomplete last page.
    pub budget: usize,
    /// Layers that always use exact attention.
    pub dense_layers: Vec<usize>,
}

impl Default for QuestSettings {
    fn default() -> Self {
        QuestSettings {
            page: 16,
            budget: 1024,
            dense_layers: vec![0, 1],
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
        Ok(())
    }
}

/// Bounds of the complete pages of one layer: `min` and `max` hold `pages × kv_dim` values.
#[derive(Default)]
struct LayerPages {
    pages: usize,
    min: Vec<f32>,
    max: Vec<f32>,
}

/// The Quest attention backend (one per sequence).
pub struct QuestAttention {
    settings: QuestSettings,
    layers: Vec<Mutex<LayerPages>>,
}

impl QuestAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: QuestSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(QuestAttention {
            settings,
            layers: (0..n_layer).map(|_| Mutex::default()).collect(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &QuestSettings {
        &self.settings
    }

    /// Record the bounds of every page of `layer` that is complete within `0..filled`.
    fn seal_pages(&self, pages: &mut LayerPages, cache: &KvCache, layer: usize, filled: usize) {
        let (page, kv_dim) = (self.settings.page, cache.kv_dim());
        let complete = filled / page;
        if pages.pages >= complete {
            return;
        }
        let mut keys = vec![0f32; page * kv_dim];
        pages.min.resize(complete * kv_dim, 0.0);
        pages.max.resize(complete * kv_dim, 0.0);
        for p in pages.pages..complete {
            cache.read_keys(layer, p * page, &mut keys);
            let lo = &mut pages.min[p * kv_dim..(p + 1) * kv_dim];
            let hi = &mut pages.max[p * kv_dim..(p + 1) * kv_dim];
            lo.fill(f32::INFINITY);
            hi.fill(f32::NEG_INFINITY);
            key_bounds(&keys, kv_dim, lo, hi);
        }
        pages.pages = complete;
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
        let kv_dim = shape.n_head_kv * hd;
        let at = kv_head * hd;
        let mut scored: Vec<(f32, usize)> = (0..complete)
            .map(|p| {
                let lo = &pages.min[p * kv_dim + at..p * kv_dim + at + hd];
                let hi = &pages.max[p * kv_dim + at..p * kv_dim + at + hd];
                let s = q_group
                    .chunks_exact(hd)
                    .map(|q| upper_bound_score(q, lo, hi))
                    .sum::<f32>();
                // NaN (from a broken activation) ranks last instead of poisoning the order.
                (if s.is_nan() { f32::NEG_INFINITY } else { s }, p)
            })
            .collect();
        let mut chosen: Vec<usize> = if slots == 0 {
            Vec::new()
        } else {
            scored
                .select_nth_unstable_by(slots - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            scored[..slots].iter().map(|&(_, p)| p).collect()
        };
        chosen.sort_unstable();
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(chosen.len() + 1);
        for p in chosen {
            push_range(&mut ranges, p * page..(p + 1) * page);
        }
        if tail_start < n {
            push_range(&mut ranges, tail_start..n);
        }
        ranges
    }
}

/// Append `r` to ascending `ranges`, merging it with the last one when they touch.
fn push_range(ranges: &mut Vec<Range<usize>>, r: Range<usize>) {
    match ranges.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => ranges.push(r),
    }
}

impl AttentionBackend for QuestAttention {
    fn name(&self) -> &str {
        "quest"
    }

    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    ) {
        let q_dim = shape.n_head * shape.head_dim;
        let n = q.len() / q_dim;
        let Some(slot) = self.layers.get(layer) else {
            return DenseAttention.attend(shape, cache, layer, q, pos0, out);
        };
        // A poisoned lock only means another thread panicked mid-update; the summaries are
        // rebuilt from the cache below, so take them as they are.
        let mut pages = slot.lock().unwrap_or_else(|e| e.into_inner());
        if pages.pages * self.settings.page > pos0 {
            // Positions from `pos0` on are being written again (e.g. after a forward pass
            // that failed midway, which no rewind call announces): their pages are stale.
            pages.pages = pos0 / self.settings.page;
        }
        self.seal_pages(&mut pages, cache, layer, pos0 + n);
        if n != 1 || self.settings.dense_layers.contains(&layer) {
            drop(pages);
            return DenseAttention.attend(shape, cache, layer, q, pos0, out);
        }
        let group_width = q_dim / shape.n_head_kv;
        let ctx = pos0 + 1;
        out[..q_dim]
            .par_chunks_mut(group_width)
            .enumerate()
            .for_each(|(kv_head, out_group)| {
                let q_group = &q[kv_head * group_width..(kv_head + 1) * group_width];
                let ranges = self.select(&pages, shape, kv_head, q_group, ctx);
                attend_group(shape, cache, layer, q, kv_head, &ranges, out_group);
            });
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn read_set(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        let full = vec![std::iter::once(0..pos + 1).collect(); shape.n_head_kv];
        let Some(slot) = self.layers.get(layer) else {
            return full;
        };
        if self.settings.dense_layers.contains(&layer) {
            return full;
        }
        let mut pages = slot.lock().unwrap_or_else(|e| e.into_inner());
        self.seal_pages(&mut pages, cache, layer, pos + 1);
        let group_width = shape.n_head * shape.head_dim / shape.n_head_kv;
        (0..shape.n_head_kv)
            .map(|h| {
                let q_group = &q[h * group_width..(h + 1) * group_width];
                self.select(&pages, shape, h, q_group, pos + 1)
            })
            .collect()
    }

    fn requires_block_selection(&self) -> bool {
        true
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.settings.page)
    }

    /// Record the sealed page's per-head key bounds while its keys are at hand.
    fn on_block_sealed(&self, layer: usize, block: usize, keys: KeysView<'_>) {
        let Some(slot) = self.layers.get(layer) else {
            return;
        };
        if keys.rows() != self.settings.page {
            return; // paged at another size: `attend` builds the bounds from the cache
        }
        let mut pages = slot.lock().unwrap_or_else(|e| e.into_inner());
        if block > pages.pages {
            return; // an earlier page is missing: `attend` catches up from the cache
        }
        let kv_dim = keys.kv_heads() * keys.head_dim();
        pages.pages = block + 1;
        pages.min.resize((block + 1) * kv_dim, 0.0);
        pages.max.resize((block + 1) * kv_dim, 0.0);
        let span = block * kv_dim..(block + 1) * kv_dim;
        let pages = &mut *pages;
        let (lo, hi) = (&mut pages.min[span.clone()], &mut pages.max[span]);
        lo.fill(f32::INFINITY);
        hi.fill(f32::NEG_INFINITY);
        key_bounds(keys.as_slice(), kv_dim, lo, hi);
    }

    fn forget_from(&self, pos: usize) {
        let page = self.settings.page;
        for slot in &self.layers {
            let mut pages = slot.lock().unwrap_or_else(|e| e.into_inner());
            pages.pages = pages.pages.min(pos / page);
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
    use crate::kv_cache::KvType;

    fn cache_with(keys: &[Vec<f32>], kv_dim: usize) -> KvCache {
        let mut c = KvCache::new(KvType::F32, 1, keys.len(), kv_dim);
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
            },
            1,
        )
        .unwrap();
        let mut pages = LayerPages::default();
        quest.seal_pages(&mut pages, &cache, 0, 70);
        assert_eq!(pages.pages, 17);
        let q = [1.0, 0.2, 0.0, 0.0, 0.9, -0.1, 0.0, 0.0];
        let ranges = quest.select(&pages, shape, 0, &q, 70);
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
            },
            1,
        )
        .unwrap();
        let mut pages = LayerPages::default();
        quest.seal_pages(&mut pages, &cache, 0, 33);
        assert_eq!(quest.select(&pages, shape, 0, &[1.0, 0.0], 33), vec![0..33]);
        assert!((quest.fraction_read(33) - 1.0).abs() < 1e-12);
        assert!((quest.fraction_read(1000) - 33.0 / 1000.0).abs() < 0.01);
    }

    #[test]
    fn rewinds_drop_stale_pages() {
        let quest = QuestAttention::new(
            QuestSettings {
                page: 4,
                budget: 8,
                dense_layers: vec![],
            },
            2,
        )
        .unwrap();
        let keys: Vec<Vec<f32>> = (0..20).map(|i| vec![i as f32]).collect();
        let cache = cache_with(&keys, 1);
        {
            let mut p = quest.layers[0].lock().unwrap();
            quest.seal_pages(&mut p, &cache, 0, 20);
            assert_eq!(p.pages, 5);
        }
        quest.forget_from(9);
        assert_eq!(quest.layers[0].lock().unwrap().pages, 2);
    }
}
