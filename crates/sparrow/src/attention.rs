//! The attention seam. The model hands each layer's queries and the KV cache to an
//! [`AttentionBackend`]; today that is exact dense attention, and the sparse policies plug in
//! here without the model changing.

#[allow(unused_imports)] // named in doc links
use crate::kv_blocks::DEFAULT_BLOCK;
use crate::kv_cache::KvCache;
pub use crate::policy::{AttentionChoice, POLICY_NAMES};
pub use sparrow_attn::kernel::AttnShape;
use sparrow_attn::kernel::{self, attend_block, Level, Unit};
use sparrow_attn::policy::KeysView;
use std::ops::Range;

/// Computes causal attention for a batch of query rows against the cache.
pub trait AttentionBackend: Send + Sync {
    /// Short name for logs and benchmarks.
    fn name(&self) -> &str;

    /// `q` holds `n` rows of `n_head * head_dim` (already rotated); row `i` is at position
    /// `pos0 + i` and may attend to cache positions `0..=pos0 + i` of `layer`, which the
    /// caller has already written. Writes `n` rows of `n_head * head_dim` to `out`.
    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    );

    /// The cache positions from `pos` on are about to be rewritten (a rewind, a restored or
    /// reused prefix): forget any per-position state kept for them.
    fn forget_from(&self, _pos: usize) {}

    /// Fraction of the `n_ctx` cached positions one decode query reads (1.0 for exact
    /// attention): the selectivity a policy reports.
    fn fraction_read(&self, _n_ctx: usize) -> f64 {
        1.0
    }

    /// Whether the policy may be used for prompt processing (batches of several tokens).
    fn supports_prefill(&self) -> bool {
        true
    }

    /// Whether the policy may be used for generation (one token at a time).
    fn supports_decode(&self) -> bool {
        true
    }

    /// True when the policy itself chooses which KV blocks a query reads (Quest), so a
    /// tiered store would only need to load those blocks.
    fn requires_block_selection(&self) -> bool {
        false
    }

    /// Positions per KV block the policy works in, if it summarises blocks: the store is
    /// paged (and blocks sealed) at this size, else at [`DEFAULT_BLOCK`].
    fn block_size(&self) -> Option<usize> {
        None
    }

    /// Block `block` of `layer` (positions `block * block_size ..`) has just been completely
    /// written and is sealed: `keys` holds its keys in f32. Blocks are sealed in order; a
    /// block may be sealed again after a rewind ([`Self::forget_from`]).
    fn on_block_sealed(&self, _layer: usize, _block: usize, _keys: KeysView<'_>) {}

    /// The cache positions each KV head's query group reads when the single query row `q`
    /// at position `pos` of `layer` attends (one list of ascending ranges per KV head), for
    /// evaluation (selectivity, attention mass captured). Default: everything up to `pos`.
    fn read_set(
        &self,
        shape: AttnShape,
        _cache: &KvCache,
        _layer: usize,
        _q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        vec![std::iter::once(0..pos + 1).collect(); shape.n_head_kv]
    }
}

/// Exact causal attention, flash-style: `sparrow_attn`'s block primitive over the cache
/// ([`sparrow_attn::kernel::attend_batch`]): blocks of query rows (every head of a GQA group
/// for a few consecutive tokens) walk the keys in tiles, each K/V row read once per block
/// straight from the cache, with a one-pass online softmax; long key ranges are split
/// across threads and the pieces merged exactly by their log-sum-exp.
pub struct DenseAttention;

/// Attention of one token's query heads sharing `kv_head` over the cache positions in
/// `ranges` (ascending, disjoint), writing `group × head_dim` outputs; `q_row` is the
/// token's whole query row. Runs on the calling thread.
pub(crate) fn attend_group(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q_row: &[f32],
    kv_head: usize,
    ranges: &[Range<usize>],
    out_group: &mut [f32],
) {
    let hd = shape.head_dim;
    let unit = Unit {
        tokens: 0..1,
        kv_head,
        keys: ranges.to_vec(),
    };
    let visible = [ranges.to_vec()];
    let part = attend_block(
        Level::active(),
        shape,
        &cache.layer(layer),
        q_row,
        &unit,
        &visible,
    );
    for (r, dst) in out_group.chunks_exact_mut(hd).enumerate() {
        if part.m[r] == f32::NEG_INFINITY {
            dst.fill(0.0);
            continue;
        }
        let inv = 1.0 / part.l[r];
        dst.iter_mut()
            .zip(&part.o[r * hd..(r + 1) * hd])
            .for_each(|(d, &a)| *d = a * inv);
    }
}

/// Run dense attention for every token of a batch, with the key ranges `ranges_for(position)`
/// gives for each token's position.
pub(crate) fn attend_batch(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
    ranges_for: impl Fn(usize) -> Vec<Range<usize>> + Sync,
) {
    let n = q.len() / shape.q_dim();
    let visible: Vec<Vec<Range<usize>>> = (0..n).map(|i| ranges_for(pos0 + i)).collect();
    kernel::attend_batch(
        Level::active(),
        rayon::current_num_threads(),
        shape,
        &cache.layer(layer),
        q,
        &visible,
        out,
    );
}

impl AttentionBackend for DenseAttention {
    fn name(&self) -> &str {
        "full"
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
        attend_batch(shape, cache, layer, q, pos0, out, |pos| {
            std::iter::once(0..pos + 1).collect()
        });
    }
}

/// StreamingLLM's pattern: every query attends to the first `sinks` positions (attention
/// sinks) and the `window` most recent ones, whatever the context length. Positions keep
/// their original RoPE angles; nothing is evicted, the middle is simply not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamingAttention {
    pub sinks: usize,
    pub window: usize,
}

impl StreamingAttention {
    /// The key ranges a query at `pos` reads: sinks, then the recent window (merged when
    /// they touch).
    #[allow(clippy::single_range_in_vec_init)] // a list of ranges that may hold one
    pub fn ranges(&self, pos: usize) -> Vec<Range<usize>> {
        let n = pos + 1;
        let recent = n.saturating_sub(self.window.max(1));
        let sinks = self.sinks.min(n);
        if recent <= sinks {
            vec![0..n]
        } else if sinks == 0 {
            vec![recent..n]
        } else {
            vec![0..sinks, recent..n]
        }
    }
}

impl AttentionBackend for StreamingAttention {
    fn name(&self) -> &str {
        "streaming"
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
        attend_batch(shape, cache, layer, q, pos0, out, |pos| self.ranges(pos));
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let read: usize = self.ranges(n_ctx - 1).iter().map(|r| r.len()).sum();
        read as f64 / n_ctx as f64
    }

    fn read_set(
        &self,
        shape: AttnShape,
        _cache: &KvCache,
        _layer: usize,
        _q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        vec![self.ranges(pos); shape.n_head_kv]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvType;

    /// Naive f64 causal attention as the reference.
    fn reference(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        pos: usize,
    ) -> Vec<f32> {
        reference_over(shape, keys, vals, q, &(0..=pos).collect::<Vec<_>>())
    }

    /// Naive f64 attention over the listed key positions.
    fn reference_over(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        visible: &[usize],
    ) -> Vec<f32> {
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let mut out = vec![0.0f32; shape.n_head * hd];
        for h in 0..shape.n_head {
            let g = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let s: Vec<f64> = visible
                .iter()
                .map(|&t| {
                    let k = &keys[t][g * hd..(g + 1) * hd];
                    qh.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for d in 0..hd {
                let v: f64 = visible
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| w[i] * vals[t][g * hd + d] as f64)
                    .sum();
                out[h * hd + d] = (v / z) as f32;
            }
        }
        out
    }

    #[test]
    fn streaming_ranges_cover_sinks_and_window() {
        let s = StreamingAttention {
            sinks: 4,
            window: 10,
        };
        assert_eq!(s.ranges(5), vec![0..6]);
        assert_eq!(s.ranges(13), vec![0..14]);
        assert_eq!(s.ranges(14), vec![0..4, 5..15]);
        assert_eq!(s.ranges(99), vec![0..4, 90..100]);
        let no_sinks = StreamingAttention {
            sinks: 0,
            window: 3,
        };
        assert_eq!(no_sinks.ranges(9), vec![7..10]);
    }

    #[test]
    fn dense_matches_f64_reference_across_tiles() {
        let shape = AttnShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 16,
        };
        let kv_dim = 32;
        let n = 300; // spans several tiles
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd() * 3.0).collect())
            .collect();
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd()).collect())
            .collect();
        let mut cache = KvCache::new(KvType::F32, 1, n, kv_dim);
        for t in 0..n {
            cache.write(0, t, &keys[t], &vals[t]);
        }
        let n_q = 3;
        let pos0 = n - n_q;
        let q: Vec<f32> = (0..n_q * 96).map(|_| rnd()).collect();
        let mut out = vec![0.0; n_q * 96];
        DenseAttention.attend(shape, &cache, 0, &q, pos0, &mut out);
        for i in 0..n_q {
            let r = reference(shape, &keys, &vals, &q[i * 96..(i + 1) * 96], pos0 + i);
            for (a, b) in out[i * 96..(i + 1) * 96].iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        // Streaming reads only sinks and the recent window: equal to the reference over
        // exactly those keys, and different from full attention.
        let streaming = StreamingAttention {
            sinks: 3,
            window: 130,
        };
        let mut sout = vec![0.0; n_q * 96];
        streaming.attend(shape, &cache, 0, &q, pos0, &mut sout);
        for i in 0..n_q {
            let visible: Vec<usize> = streaming.ranges(pos0 + i).into_iter().flatten().collect();
            assert_eq!(visible.len(), 133);
            let r = reference_over(shape, &keys, &vals, &q[i * 96..(i + 1) * 96], &visible);
            for (a, b) in sout[i * 96..(i + 1) * 96].iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        assert!(out.iter().zip(&sout).any(|(a, b)| (a - b).abs() > 1e-3));
    }
}
