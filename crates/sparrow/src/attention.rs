//! The attention seam. The model hands each layer's queries and the KV cache to an
//! [`AttentionBackend`]; today that is exact dense attention, and the sparse policies plug in
//! here without the model changing.

use crate::kv_cache::KvCache;
use rayon::prelude::*;
use std::ops::Range;

/// Shapes the backend needs to interpret queries and cache rows.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

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
}

/// Exact causal attention. Positions are processed in tiles: each tile of keys and values is
/// converted from the cache's element type once and shared by all query heads of a GQA
/// group, with a one-pass online softmax so no score row of the full length is kept.
pub struct DenseAttention;

/// Positions per tile.
const TILE: usize = 128;

/// Attention of one token's query heads sharing `kv_head` over the cache positions in
/// `ranges` (ascending, disjoint), writing `group × head_dim` outputs.
fn attend_group(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q_row: &[f32],
    kv_head: usize,
    ranges: &[Range<usize>],
    out_group: &mut [f32],
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let kv_dim = cache.kv_dim();
    let scale = 1.0 / (hd as f32).sqrt();
    let q_group = &q_row[kv_head * group * hd..(kv_head + 1) * group * hd];

    let mut ktile = vec![0.0f32; TILE * kv_dim];
    let mut vtile = vec![0.0f32; TILE * kv_dim];
    let mut scores = vec![0.0f32; TILE];
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut denom = vec![0.0f32; group];
    out_group.fill(0.0);

    for range in ranges {
        let mut start = range.start;
        while start < range.end {
            let len = TILE.min(range.end - start);
            cache.read_keys(layer, start, &mut ktile[..len * kv_dim]);
            cache.read_values(layer, start, &mut vtile[..len * kv_dim]);
            for h in 0..group {
                let q = &q_group[h * hd..(h + 1) * hd];
                let mut tile_max = f32::NEG_INFINITY;
                for (t, s) in scores[..len].iter_mut().enumerate() {
                    let k = &ktile[t * kv_dim + kv_head * hd..][..hd];
                    *s = dot(q, k) * scale;
                    tile_max = tile_max.max(*s);
                }
                let new_max = max[h].max(tile_max);
                let acc = &mut out_group[h * hd..(h + 1) * hd];
                let correction = (max[h] - new_max).exp();
                if correction != 1.0 {
                    denom[h] *= correction;
                    acc.iter_mut().for_each(|a| *a *= correction);
                }
                max[h] = new_max;
                for (t, &s) in scores[..len].iter().enumerate() {
                    let p = (s - new_max).exp();
                    denom[h] += p;
                    let v = &vtile[t * kv_dim + kv_head * hd..][..hd];
                    acc.iter_mut().zip(v).for_each(|(a, &x)| *a += p * x);
                }
            }
            start += len;
        }
    }
    for h in 0..group {
        let inv = 1.0 / denom[h];
        out_group[h * hd..(h + 1) * hd]
            .iter_mut()
            .for_each(|a| *a *= inv);
    }
}

/// Plain f32 dot product (the compiler vectorises this loop shape).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for j in 0..8 {
            acc[j] += a[c * 8 + j] * b[c * 8 + j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Run `attend_group` for every (token, kv head) of a batch in parallel, with the key
/// ranges `ranges_for(position)` gives for each token's position.
fn attend_batch(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
    ranges_for: impl Fn(usize) -> Vec<Range<usize>> + Sync,
) {
    let q_dim = shape.n_head * shape.head_dim;
    let group_width = q_dim / shape.n_head_kv;
    // One task per (token, kv head): each converts its key/value tiles once.
    out.par_chunks_mut(group_width)
        .enumerate()
        .for_each(|(task, out_group)| {
            let token = task / shape.n_head_kv;
            let kv_head = task % shape.n_head_kv;
            let q_row = &q[token * q_dim..(token + 1) * q_dim];
            let ranges = ranges_for(pos0 + token);
            attend_group(shape, cache, layer, q_row, kv_head, &ranges, out_group);
        });
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
}

/// Settings that choose an attention backend by name (`--attn`).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionChoice {
    /// `full` or `streaming`.
    pub name: String,
    /// Streaming: sink tokens kept.
    pub sinks: usize,
    /// Streaming: recent tokens kept.
    pub window: usize,
}

impl Default for AttentionChoice {
    fn default() -> Self {
        // StreamingLLM's defaults: 4 sinks and a 2000-token recent window.
        AttentionChoice {
            name: "full".into(),
            sinks: 4,
            window: 2000,
        }
    }
}

impl AttentionChoice {
    /// Build the backend, or explain which names exist.
    pub fn build(&self) -> Result<Box<dyn AttentionBackend>, String> {
        match self.name.as_str() {
            "full" => Ok(Box::new(DenseAttention)),
            "streaming" => {
                if self.window == 0 {
                    return Err("streaming attention needs a window of at least 1 token".into());
                }
                Ok(Box::new(StreamingAttention {
                    sinks: self.sinks,
                    window: self.window,
                }))
            }
            other => Err(format!(
                "unknown attention policy '{other}' (available: full, streaming)"
            )),
        }
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
        assert!(AttentionChoice {
            name: "quest".into(),
            ..Default::default()
        }
        .build()
        .is_err());
        assert!(AttentionChoice {
            name: "streaming".into(),
            window: 0,
            ..Default::default()
        }
        .build()
        .is_err());
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
