//! The attention seam. The model hands each layer's queries and the KV cache to an
//! [`AttentionBackend`]; today that is exact dense attention, and the sparse policies plug in
//! here without the model changing.

use crate::kv_cache::KvCache;
use rayon::prelude::*;

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

impl DenseAttention {
    #[allow(clippy::too_many_arguments)]
    fn attend_group(
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q_row: &[f32],
        kv_head: usize,
        n_keys: usize,
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

        let mut start = 0;
        while start < n_keys {
            let len = TILE.min(n_keys - start);
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
        for h in 0..group {
            let inv = 1.0 / denom[h];
            out_group[h * hd..(h + 1) * hd]
                .iter_mut()
                .for_each(|a| *a *= inv);
        }
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
        let q_dim = shape.n_head * shape.head_dim;
        let group_width = q_dim / shape.n_head_kv;
        // One task per (token, kv head): each converts its key/value tiles once.
        out.par_chunks_mut(group_width)
            .enumerate()
            .for_each(|(task, out_group)| {
                let token = task / shape.n_head_kv;
                let kv_head = task % shape.n_head_kv;
                let q_row = &q[token * q_dim..(token + 1) * q_dim];
                Self::attend_group(
                    shape,
                    cache,
                    layer,
                    q_row,
                    kv_head,
                    pos0 + token + 1,
                    out_group,
                );
            });
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
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let mut out = vec![0.0f32; shape.n_head * hd];
        for h in 0..shape.n_head {
            let g = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let s: Vec<f64> = (0..=pos)
                .map(|t| {
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
                let v: f64 = (0..=pos).map(|t| w[t] * vals[t][g * hd + d] as f64).sum();
                out[h * hd + d] = (v / z) as f32;
            }
        }
        out
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
    }
}
