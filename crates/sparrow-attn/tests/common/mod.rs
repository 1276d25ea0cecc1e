//! Helpers shared by the integration tests: deterministic random tensors and dense attention
//! from the crate's f64 oracle (naive, written independently of the kernel).
#![allow(dead_code)]

use sparrow_attn::kernel::{reference::attention_f64, AttnShape};
use sparrow_attn::{candidates_for, SparseConfig, Tensor3};

/// SplitMix64 stream of uniforms in [-1, 1).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

pub fn rand_tensor(seq: usize, heads: usize, dim: usize, seed: u64, amp: f32) -> Tensor3 {
    let mut r = Rng::new(seed);
    Tensor3::from_fn(seq, heads, dim, |_, _, _| r.uniform() * amp).unwrap()
}

/// Queries, keys and values of `seq` tokens (`q_heads` and `kv_heads` heads of `dim`) from
/// seeds `seed`, `seed + 1`, `seed + 2`: queries and keys scaled by `amp` (so scores spread
/// over several units), values in `[-1, 1)`.
pub fn qkv(
    seq: usize,
    q_heads: usize,
    kv_heads: usize,
    dim: usize,
    seed: u64,
    amp: f32,
) -> (Tensor3, Tensor3, Tensor3) {
    (
        rand_tensor(seq, q_heads, dim, seed, amp),
        rand_tensor(seq, kv_heads, dim, seed.wrapping_add(1), amp),
        rand_tensor(seq, kv_heads, dim, seed.wrapping_add(2), 1.0),
    )
}

/// What `cfg`'s sparse prefill should give, from the f64 oracle: query `i` reads the keys
/// [`candidates_for`] lists plus the listed landmarks, given as block-mean rows appended
/// after the keys (means of the f32 rows, computed here independently of the crate).
/// `seq × q_heads × dim`, as the output tensor's data.
pub fn sparse_oracle(cfg: &SparseConfig, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Vec<f32> {
    let (seq, kvh, dim) = k.shape();
    let shape = AttnShape {
        n_head: q.heads(),
        n_head_kv: kvh,
        head_dim: dim,
    };
    let bs = cfg.block_size;
    let rows = |x: &Tensor3| -> Vec<Vec<f32>> {
        let mean = |b: usize| -> Vec<f32> {
            let t = b * bs..((b + 1) * bs).min(seq);
            (0..kvh * dim)
                .map(|j| t.clone().map(|i| x.token(i).unwrap()[j]).sum::<f32>() / t.len() as f32)
                .collect()
        };
        (0..seq)
            .map(|i| x.token(i).unwrap().to_vec())
            .chain((0..seq.div_ceil(bs)).map(mean))
            .collect()
    };
    let (keys, values) = (rows(k), rows(v));
    let mut out = Vec::with_capacity(q.data().len());
    for i in 0..seq {
        let c = candidates_for(cfg, seq, i).unwrap();
        let vis: Vec<usize> = c
            .tokens
            .iter()
            .copied()
            .chain(c.blocks.iter().map(|b| seq + b))
            .collect();
        out.extend(attention_f64(
            shape,
            &keys,
            &values,
            q.token(i).unwrap(),
            &vec![vis; kvh],
        ));
    }
    out
}

/// Largest absolute difference between a tensor's data and `want`.
pub fn max_diff(a: &Tensor3, want: &[f32]) -> f32 {
    assert_eq!(a.data().len(), want.len());
    a.data()
        .iter()
        .zip(want)
        .fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

/// Dense attention in f64 (query head `h` reads kv head `h / (qh / kvh)`), token by token
/// through the crate's shared oracle, [`sparrow_attn::kernel::reference::attention_f64`].
pub fn naive_dense(q: &Tensor3, k: &Tensor3, v: &Tensor3, causal: bool) -> Vec<f64> {
    let shape = AttnShape {
        n_head: q.heads(),
        n_head_kv: k.heads(),
        head_dim: q.dim(),
    };
    let rows = |t: &Tensor3| -> Vec<Vec<f32>> {
        (0..t.seq()).map(|i| t.token(i).unwrap().to_vec()).collect()
    };
    let (keys, values) = (rows(k), rows(v));
    let mut out = Vec::with_capacity(q.data().len());
    for i in 0..q.seq() {
        let visible: Vec<usize> = (0..if causal { i + 1 } else { q.seq() }).collect();
        let per_head = vec![visible; k.heads()];
        let o = attention_f64(shape, &keys, &values, q.token(i).unwrap(), &per_head);
        out.extend(o.iter().map(|&x| x as f64));
    }
    out
}

pub fn max_diff_f64(a: &Tensor3, b: &[f64]) -> f64 {
    a.data()
        .iter()
        .zip(b)
        .fold(0.0, |m, (x, y)| m.max((*x as f64 - y).abs()))
}

/// The first `n` tokens of a tensor.
pub fn prefix(t: &Tensor3, n: usize) -> Tensor3 {
    let w = t.heads() * t.dim();
    Tensor3::from_vec(t.data()[..n * w].to_vec(), n, t.heads(), t.dim()).unwrap()
}

/// Token `i` of a tensor as a one-token tensor.
pub fn token(t: &Tensor3, i: usize) -> Tensor3 {
    Tensor3::from_vec(t.token(i).unwrap().to_vec(), 1, t.heads(), t.dim()).unwrap()
}

/// Last token row of a tensor as a one-token tensor.
pub fn last(t: &Tensor3) -> Tensor3 {
    token(t, t.seq() - 1)
}
