//! Rotary position embedding with precomputed cos/sin tables, applied in place.

use crate::model::config::{ModelConfig, RopeLayout};

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
        let rope = Rope {
            n_rot,
            base,
            freq_scale,
            layout,
        };
        let half = n_rot / 2;
        let mut cos = vec![0.0; n_ctx * half];
        let mut sin = vec![0.0; n_ctx * half];
        for p in 0..n_ctx {
            rope.angles(
                p,
                &mut cos[p * half..][..half],
                &mut sin[p * half..][..half],
            );
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
        rotate_heads(x, head_dim, self.layout, cos, sin, 1.0);
    }
}

/// RoPE's parameters, rotating one position at a time without tables — for code that
/// handles scattered positions, such as Saap, which indexes keys and queries *before*
/// rotation (de-roped) and so undoes the rotation of what the cache holds. The angles are
/// the tables' exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Leading dimensions of each head that rotate.
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Positions are multiplied by this (linear scaling).
    pub freq_scale: f32,
    /// How dimensions pair up.
    pub layout: RopeLayout,
}

impl Rope {
    /// The rotation of `config`'s model.
    pub fn of(config: &ModelConfig) -> Rope {
        Rope {
            n_rot: config.n_rot,
            base: config.rope_base,
            freq_scale: config.rope_freq_scale,
            layout: config.rope_layout,
        }
    }

    /// cos and sin of position `pos` for each of the `n_rot / 2` frequencies, computed in
    /// f64 and rounded once.
    fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let p = pos as f64 * self.freq_scale as f64;
        for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
            let f = (self.base as f64).powf(-2.0 * i as f64 / self.n_rot as f64);
            let (si, co) = (p * f).sin_cos();
            *c = co as f32;
            *s = si as f32;
        }
    }

    /// Rotate every head of `x` (heads × head_dim) for position `pos`, as the model does.
    pub fn rotate(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.turn(x, head_dim, pos, 1.0);
    }

    /// Undo [`Rope::rotate`] for position `pos` (the inverse rotation; exact up to f32
    /// rounding).
    pub fn unrotate(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.turn(x, head_dim, pos, -1.0);
    }

    fn turn(&self, x: &mut [f32], head_dim: usize, pos: usize, sign: f32) {
        let half = self.n_rot / 2;
        let (mut cos, mut sin) = ([0f32; 256], [0f32; 256]);
        if half > cos.len() {
            let (mut c, mut s) = (vec![0f32; half], vec![0f32; half]);
            self.angles(pos, &mut c, &mut s);
            return rotate_heads(x, head_dim, self.layout, &c, &s, sign);
        }
        self.angles(pos, &mut cos[..half], &mut sin[..half]);
        rotate_heads(x, head_dim, self.layout, &cos[..half], &sin[..half], sign);
    }
}

/// Rotate each head of `x` by the angles whose cos and sin are given (`sign` -1 turns the
/// other way: the inverse).
fn rotate_heads(
    x: &mut [f32],
    head_dim: usize,
    layout: RopeLayout,
    cos: &[f32],
    sin: &[f32],
    sign: f32,
) {
    let half = cos.len();
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (c, s) = (cos[i], sign * sin[i]);
            let (ia, ib) = match layout {
                RopeLayout::Normal => (2 * i, 2 * i + 1),
                RopeLayout::Neox => (i, i + half),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * c - b * s;
            head[ib] = a * s + b * c;
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

    /// The table-free rotation is the table's bit for bit, and `unrotate` undoes it.
    #[test]
    fn rope_matches_the_table_and_unrotates() {
        for layout in [RopeLayout::Normal, RopeLayout::Neox] {
            let t = RopeTable::new(4000, 8, 1e6, 1.0, layout);
            let r = Rope {
                n_rot: 8,
                base: 1e6,
                freq_scale: 1.0,
                layout,
            };
            // Two heads of 12, of which 8 dimensions rotate.
            let orig: Vec<f32> = (0..24).map(|i| (i as f32 * 0.71).cos()).collect();
            for pos in [0, 1, 17, 3999] {
                let (mut a, mut b) = (orig.clone(), orig.clone());
                t.apply(&mut a, 12, pos);
                r.rotate(&mut b, 12, pos);
                assert_eq!(a, b);
                r.unrotate(&mut b, 12, pos);
                for (x, y) in b.iter().zip(&orig) {
                    assert!((x - y).abs() < 1e-5, "{pos}: {x} vs {y}");
                }
                assert_eq!(b[8..12], orig[8..12], "unrotated dimensions stay");
            }
        }
    }
}
