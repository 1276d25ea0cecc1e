//! Quest (Tang et al., 2024): query-aware block selection for decode. Each sealed block keeps
//! the element-wise minimum and maximum of its keys per KV head; for a query `q` the score
//! `Σ_d max(q_d · min_d, q_d · max_d)` is an upper bound of `q · k` for every key `k` in the
//! block, so ranking blocks by it and reading the top ones (within a token budget) keeps the
//! keys that can matter most.

use super::{BlockId, KeysView, Phase, PolicyContext, SparsePolicy};
use crate::error::{AttnError, Result};

/// Element-wise bounds of one block's keys, per KV head (`kv_heads × head_dim` each).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockBounds {
    head_dim: usize,
    min: Vec<f32>,
    max: Vec<f32>,
}

impl BlockBounds {
    /// Bounds of the keys in `keys`.
    pub fn from_keys(keys: KeysView<'_>) -> BlockBounds {
        let width = keys.kv_heads() * keys.head_dim();
        let mut min = vec![f32::INFINITY; width];
        let mut max = vec![f32::NEG_INFINITY; width];
        key_bounds(keys.as_slice(), width, &mut min, &mut max);
        BlockBounds {
            head_dim: keys.head_dim(),
            min,
            max,
        }
    }

    /// Upper bound of `q · k` over the block's keys of `kv_head`.
    pub fn score(&self, kv_head: usize, q: &[f32]) -> f32 {
        let r = kv_head * self.head_dim..(kv_head + 1) * self.head_dim;
        upper_bound_score(q, &self.min[r.clone()], &self.max[r])
    }
}

/// Widen the element-wise bounds `min`/`max` (`width` values each) to cover every row of
/// `rows` (row-major, `width` values per row): Quest's page summary, computed in one place
/// for whoever builds it (at seal time or catching up from the cache).
pub fn key_bounds(rows: &[f32], width: usize, min: &mut [f32], max: &mut [f32]) {
    for row in rows.chunks_exact(width.max(1)) {
        for ((l, h), &x) in min.iter_mut().zip(max.iter_mut()).zip(row) {
            *l = l.min(x);
            *h = h.max(x);
        }
    }
}

/// `Σ_d max(q_d · min_d, q_d · max_d)`: no key with `min ≤ k ≤ max` element-wise can have a
/// larger dot product with `q`.
///
/// A decode query scores every block of a long context with this (2,000 blocks per KV head
/// per layer at 32K), so it is written with eight independent partial sums, which the
/// compiler turns into vector code; a single running sum would be a serial chain.
pub fn upper_bound_score(q: &[f32], min: &[f32], max: &[f32]) -> f32 {
    const LANES: usize = 8;
    let n = q.len().min(min.len()).min(max.len());
    let (q, min, max) = (&q[..n], &min[..n], &max[..n]);
    let mut acc = [0.0f32; LANES];
    let whole = n / LANES * LANES;
    for ((qc, lc), hc) in q[..whole]
        .chunks_exact(LANES)
        .zip(min[..whole].chunks_exact(LANES))
        .zip(max[..whole].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] += (qc[i] * lc[i]).max(qc[i] * hc[i]);
        }
    }
    let tail: f32 = q[whole..]
        .iter()
        .zip(min[whole..].iter().zip(&max[whole..]))
        .map(|(&q, (&lo, &hi))| (q * lo).max(q * hi))
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// Quest's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuestConfig {
    /// Tokens per block ("page"); Quest uses 16.
    pub block_size: usize,
    /// Tokens read per query beyond the tail block; Quest's default is 1024.
    pub budget_tokens: usize,
}

impl Default for QuestConfig {
    fn default() -> Self {
        QuestConfig {
            block_size: 16,
            budget_tokens: 1024,
        }
    }
}

/// The Quest policy: per-layer block bounds, top-k selection under a token budget. Scores of
/// the query heads sharing a KV head are summed, so a GQA group reads one set of blocks.
#[derive(Clone, Debug)]
pub struct Quest {
    config: QuestConfig,
    /// `bounds[layer][block]`.
    bounds: Vec<Vec<BlockBounds>>,
}

impl Quest {
    /// A Quest policy; errors on a zero block size or budget.
    pub fn new(config: QuestConfig) -> Result<Quest> {
        if config.block_size == 0 {
            return Err(AttnError::InvalidConfig {
                field: "block_size",
                reason: "must be at least 1",
            });
        }
        if config.budget_tokens == 0 {
            return Err(AttnError::InvalidConfig {
                field: "budget_tokens",
                reason: "must be at least 1",
            });
        }
        Ok(Quest {
            config,
            bounds: Vec::new(),
        })
    }

    /// Settings.
    pub fn config(&self) -> QuestConfig {
        self.config
    }

    /// Blocks read per query group.
    pub fn max_blocks(&self) -> usize {
        (self.config.budget_tokens / self.config.block_size).max(1)
    }

    /// The bounds recorded for `layer`'s `block`, if sealed.
    pub fn bounds(&self, layer: usize, block: BlockId) -> Option<&BlockBounds> {
        self.bounds.get(layer)?.get(block)
    }
}

impl SparsePolicy for Quest {
    fn name(&self) -> &'static str {
        "quest"
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn supports_decode(&self) -> bool {
        true
    }

    fn requires_block_selection(&self) -> bool {
        true
    }

    fn select_blocks(
        &self,
        ctx: &PolicyContext<'_>,
        available: &[BlockId],
        out: &mut Vec<BlockId>,
    ) {
        let k = self.max_blocks();
        if ctx.phase == Phase::Prefill || available.len() <= k {
            out.extend_from_slice(available);
            return;
        }
        let layer = self.bounds.get(ctx.layer).map(Vec::as_slice).unwrap_or(&[]);
        let mut scored: Vec<(f32, BlockId)> = available
            .iter()
            .map(|&b| {
                let s = match layer.get(b) {
                    // A block without bounds cannot be ranked: keep it (never drop silently).
                    None => f32::INFINITY,
                    Some(bb) => ctx
                        .queries
                        .chunks_exact(ctx.head_dim.max(1))
                        .map(|q| bb.score(ctx.kv_head, q))
                        .sum(),
                };
                (if s.is_nan() { f32::INFINITY } else { s }, b)
            })
            .collect();
        // Highest score first; ties to the earlier block, so selection is deterministic.
        scored.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let start = out.len();
        out.extend(scored[..k].iter().map(|&(_, b)| b));
        out[start..].sort_unstable();
    }

    fn on_block_sealed(&mut self, layer: usize, block: BlockId, keys: KeysView<'_>) {
        if self.bounds.len() <= layer {
            self.bounds.resize_with(layer + 1, Vec::new);
        }
        let blocks = &mut self.bounds[layer];
        if blocks.len() <= block {
            blocks.resize(
                block + 1,
                BlockBounds {
                    head_dim: keys.head_dim(),
                    min: Vec::new(),
                    max: Vec::new(),
                },
            );
        }
        blocks[block] = BlockBounds::from_keys(keys);
    }

    fn reset(&mut self) {
        self.bounds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    #[test]
    fn the_lane_split_score_equals_the_f64_sum_at_every_length() {
        let mut r = Lcg(5);
        for n in [0usize, 1, 7, 8, 9, 16, 63, 64, 65, 130] {
            let q: Vec<f32> = (0..n).map(|_| r.next() * 2.0).collect();
            let lo: Vec<f32> = (0..n).map(|_| r.next() * 3.0 - 1.0).collect();
            let hi: Vec<f32> = lo.iter().map(|&l| l + r.next().abs() * 2.0).collect();
            let want: f64 = (0..n)
                .map(|d| (q[d] as f64 * lo[d] as f64).max(q[d] as f64 * hi[d] as f64))
                .sum();
            let got = upper_bound_score(&q, &lo, &hi) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "n {n}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn the_score_bounds_every_key_in_the_block() {
        let mut r = Lcg(9);
        for _ in 0..200 {
            let (rows, heads, dim) = (16, 2, 8);
            let keys: Vec<f32> = (0..rows * heads * dim).map(|_| r.next() * 3.0).collect();
            let view = KeysView::new(&keys, rows, heads, dim).unwrap();
            let b = BlockBounds::from_keys(view);
            let q: Vec<f32> = (0..dim).map(|_| r.next()).collect();
            for h in 0..heads {
                let bound = b.score(h, &q);
                for row in 0..rows {
                    let dot: f32 = q.iter().zip(view.key(row, h)).map(|(a, b)| a * b).sum();
                    assert!(dot <= bound + 1e-4, "{dot} > {bound}");
                }
            }
        }
    }

    fn sealed(n_blocks: usize, needle_block: usize, needle: &[f32]) -> Quest {
        let (bs, dim) = (16, needle.len());
        let mut quest = Quest::new(QuestConfig {
            block_size: bs,
            budget_tokens: 32,
        })
        .unwrap();
        let mut r = Lcg(3);
        for b in 0..n_blocks {
            let mut keys: Vec<f32> = (0..bs * dim).map(|_| r.next() * 0.1).collect();
            if b == needle_block {
                keys[5 * dim..6 * dim].copy_from_slice(needle);
            }
            quest.on_block_sealed(0, b, KeysView::new(&keys, bs, 1, dim).unwrap());
        }
        quest
    }

    #[test]
    fn selects_the_block_holding_a_key_aligned_with_the_query() {
        let needle = [3.0f32, -2.0, 1.0, 4.0];
        let quest = sealed(40, 23, &needle);
        let available: Vec<BlockId> = (0..40).collect();
        let ctx = PolicyContext {
            layer: 0,
            phase: Phase::Decode,
            kv_head: 0,
            queries: &needle,
            head_dim: 4,
        };
        let mut out = Vec::new();
        quest.select_blocks(&ctx, &available, &mut out);
        assert_eq!(out.len(), 2, "budget 32 tokens = 2 blocks of 16");
        assert!(out.contains(&23), "{out:?}");
        assert!(out.windows(2).all(|w| w[0] < w[1]));
        // Prefill, or a budget covering everything, reads every block.
        let mut all = Vec::new();
        quest.select_blocks(
            &PolicyContext {
                phase: Phase::Prefill,
                ..ctx
            },
            &available,
            &mut all,
        );
        assert_eq!(all, available);
        let mut few = Vec::new();
        quest.select_blocks(&ctx, &available[..2], &mut few);
        assert_eq!(few, vec![0, 1]);
    }

    #[test]
    fn unsealed_blocks_are_kept_and_reset_forgets() {
        let needle = [1.0f32, 0.0, 0.0, 0.0];
        let mut quest = sealed(4, 0, &needle);
        let ctx = PolicyContext {
            layer: 0,
            phase: Phase::Decode,
            kv_head: 0,
            queries: &needle,
            head_dim: 4,
        };
        let mut out = Vec::new();
        quest.select_blocks(&ctx, &[0, 1, 2, 3, 9], &mut out);
        assert!(
            out.contains(&9),
            "block 9 has no bounds and must not be dropped: {out:?}"
        );
        quest.reset();
        assert!(quest.bounds(0, 0).is_none());
    }

    #[test]
    fn bad_settings_and_views_are_errors() {
        assert!(Quest::new(QuestConfig {
            block_size: 0,
            budget_tokens: 8
        })
        .is_err());
        assert!(Quest::new(QuestConfig {
            block_size: 8,
            budget_tokens: 0
        })
        .is_err());
        assert!(KeysView::new(&[0.0; 10], 2, 1, 4).is_err());
        assert!(KeysView::new(&[], 0, 1, 4).is_err());
    }
}
