//! Rotary position embedding with precomputed cos/sin tables, applied in place.

use crate::model::config::RopeLayout;

/// cos/sin of every (position, frequency) pair up to the context size.
pub struct RopeTable {
    n_rot: usize,
    layout: RopeLayout,
    /// `[pos][i]` for i in 0..n_rot/2.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Tables for positions `0..n_ctx`. Angles are computed in f64 and rounded once.
    pub fn new(n_ctx: usize, n_rot: usize, base: f32, freq_scale: f32, layout: RopeLayout) -> Self {
        let half = n_rot / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / n_rot as f64))
            .collect();
        let mut cos = Vec::with_capacity(n_ctx * half);
        let mut sin = Vec::with_capacity(n_ctx * half);
        for p in 0..n_ctx {
            let pos = p as f64 * freq_scale as f64;
            for f in &inv_freq {
                let (s, c) = (pos * f).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        RopeTable {
            n_rot,
            layout,
            cos,
            sin,
        }
    }

    /// Rotate every head of `x` (heads × head_dim, contiguous) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.n_rot / 2;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(head_dim) {
            match self.layout {
                RopeLayout::Normal => {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * cos[i] - b * sin[i];
                        head[2 * i + 1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeLayout::Neox => {
                    for i in 0..half {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * cos[i] - b * sin[i];
                        head[i + half] = a * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        for layout in [RopeLayout::Normal, RopeLayout::Neox] {
            let t = RopeTable::new(64, 8, 10000.0, 1.0, layout);
            let orig: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut x = orig.clone();
            t.apply(&mut x, 8, 0);
            assert_eq!(x, orig);
            t.apply(&mut x, 8, 63);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
    }

    #[test]
    fn relative_position_property() {
        // q(m)·k(n) depends only on m - n.
        let t = RopeTable::new(128, 4, 10000.0, 1.0, RopeLayout::Neox);
        let q = [0.3f32, -0.2, 0.9, 0.1];
        let k = [0.5f32, 0.4, -0.7, 0.2];
        let dot_at = |m: usize, n: usize| {
            let (mut a, mut b) = (q, k);
            t.apply(&mut a, 4, m);
            t.apply(&mut b, 4, n);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot_at(10, 3) - dot_at(107, 100)).abs() < 1e-4);
    }
}
