//! The test oracle every attention path is checked against: naive attention of one token's
//! query heads in f64, over explicit key positions. Slow and plain on purpose.

use super::block::AttnShape;

/// Attention of the query row `q` (`n_head × head_dim`) where the query heads of KV head
/// `g` read the positions `visible[g]` of `keys` / `values` (one row of `kv_dim` per
/// position), computed in f64 and rounded once.
pub fn attention_f64(
    shape: AttnShape,
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    q: &[f32],
    visible: &[Vec<usize>],
) -> Vec<f32> {
    let weighted: Vec<Vec<(usize, f64)>> = visible
        .iter()
        .map(|keys| keys.iter().map(|&t| (t, 1.0)).collect())
        .collect();
    weighted_attention_f64(shape, keys, values, q, &weighted).0
}

/// [`attention_f64`] with each visible key counted `w` times (`(position, w)` per KV
/// head), and each query head's log-sum-exp `ln Σ w·e^s`: what a plan's weighted entries
/// compute.
pub fn weighted_attention_f64(
    shape: AttnShape,
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    q: &[f32],
    visible: &[Vec<(usize, f64)>],
) -> (Vec<f32>, Vec<f64>) {
    let hd = shape.head_dim;
    let group = shape.group();
    let mut out = vec![0.0f32; shape.n_head * hd];
    let mut lse = vec![0.0f64; shape.n_head];
    for h in 0..shape.n_head {
        let g = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let s: Vec<f64> = visible[g]
            .iter()
            .map(|&(t, _)| {
                let k = &keys[t][g * hd..(g + 1) * hd];
                qh.iter()
                    .zip(k)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s
            .iter()
            .zip(&visible[g])
            .map(|(x, &(_, weight))| weight * (x - m).exp())
            .collect();
        let z: f64 = w.iter().sum();
        lse[h] = m + z.ln();
        for d in 0..hd {
            let v: f64 = visible[g]
                .iter()
                .enumerate()
                .map(|(i, &(t, _))| w[i] * values[t][g * hd + d] as f64)
                .sum();
            out[h * hd + d] = (v / z) as f32;
        }
    }
    (out, lse)
}

/// Deterministic test inputs, uniform in `[-1, 1)`: a 64-bit linear congruential generator
/// (Knuth's MMIX constants), so every test and benchmark of the attention code draws its
/// data the same way without a dependency.
pub fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }
}
