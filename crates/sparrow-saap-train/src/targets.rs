//! Training targets: where each recorded query's attention mass lies among the buckets.
//!
//! For a query row at position `p` and each query head of a KV head's group, the exact
//! softmax attention over keys `1..=p` (the sink, position 0, excluded as in the paper's
//! Appendix A: it is read densely anyway and would dominate), with keys and query rotated
//! back by RoPE so the scores are the model's `rope(q,p)·rope(k,t)/√d`, summed per bucket
//! (`A·H_k` in the paper). The scores of a block of rows against all keys are one matrix
//! product; the softmax is taken in f32 from the row's maximum (no overflow) and summed in
//! f64.
//!
//! The paper trains on long-range queries only, those whose best key lies at least
//! `min_distance` tokens back ([`GroupTargets::long_range`]): the recent window is read
//! densely, so short-range queries teach the Q-model nothing it needs.
//!
//! With a target window `W > 0`, the mass is the softmax over keys `1..=p - W` only: the
//! keys the policy's dense window (the last `W` positions) does not hold, i.e. what the
//! buckets must supply. Mass the window already reads then no longer pulls the target
//! toward the buckets of recent keys.

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use sparrow::saap::ContextRecord;

/// Scores computed per matrix product (bounds the block's memory: 16 MiB).
const BLOCK_VALUES: usize = 1 << 22;

/// One query row's targets for the query heads of one KV head's group.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupTargets {
    /// Row of the record's queries, and its position.
    pub row: usize,
    pub position: usize,
    /// `group × C`: each head's attention mass per bucket (each row sums to 1).
    pub mass: Vec<f32>,
    /// Per head of the group: the position of its highest-scoring key (sink excluded).
    pub best: Vec<usize>,
}

impl GroupTargets {
    /// Whether head `h` of the group is a long-range query: its best key at least
    /// `min_distance` tokens back.
    pub fn long_range(&self, h: usize, min_distance: usize) -> bool {
        self.position - self.best[h] >= min_distance
    }

    /// Head `h`'s mass per bucket.
    pub fn head_mass(&self, h: usize) -> &[f32] {
        let c = self.mass.len() / self.best.len();
        &self.mass[h * c..][..c]
    }
}

/// The targets of `rows` (row indices into the record's queries, each at a position
/// `> window`) for KV head `kv_head` of `layer`, whose keys fall in `buckets` (per
/// position, `< C`): mass over the keys `1..=p - window` (all past the sink when `window`
/// is 0), best key over all of `1..=p`.
pub fn group_targets(
    record: &ContextRecord,
    layer: usize,
    kv_head: usize,
    buckets: &[u32],
    clusters: usize,
    rows: &[usize],
    window: usize,
) -> candle_core::Result<Vec<GroupTargets>> {
    let m = &record.meta;
    let (d, g) = (m.head_dim, m.n_head / m.n_head_kv);
    let rope = m.rope.rope();
    let scale = 1.0 / (d as f32).sqrt();
    let Some(last) = rows.iter().map(|&i| m.query_positions[i]).max() else {
        return Ok(Vec::new());
    };
    let mut keys = Vec::with_capacity((last + 1) * d);
    for t in 0..=last {
        let at = keys.len();
        keys.extend_from_slice(record.key(layer, kv_head, t));
        rope.rotate(&mut keys[at..], d, t);
    }
    let keys = Tensor::from_vec(keys, (last + 1, d), &Device::Cpu)?;
    // Rows in position order, so a block's keys are those of its last row.
    let mut order = rows.to_vec();
    order.sort_by_key(|&i| m.query_positions[i]);
    let per_block = (BLOCK_VALUES / (g * (last + 1))).max(1);
    let mut out = Vec::with_capacity(rows.len());
    for block in order.chunks(per_block) {
        let end = m.query_positions[*block.last().expect("non-empty")] + 1;
        let mut q = Vec::with_capacity(block.len() * g * d);
        for &i in block {
            let p = m.query_positions[i];
            assert!(
                p > window,
                "a target query needs a key past the sink and the window"
            );
            for h in 0..g {
                let at = q.len();
                q.extend(
                    record
                        .query(layer, kv_head * g + h, i)
                        .iter()
                        .map(|&x| x * scale),
                );
                rope.rotate(&mut q[at..], d, p);
            }
        }
        let scores = Tensor::from_vec(q, (block.len() * g, d), &Device::Cpu)?
            .matmul(&keys.narrow(0, 0, end)?.t()?)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let done: Vec<GroupTargets> = block
            .par_iter()
            .enumerate()
            .map(|(r, &i)| {
                let p = m.query_positions[i];
                let mut mass = vec![0f32; g * clusters];
                let mut best = vec![0usize; g];
                for h in 0..g {
                    let s = &scores[(r * g + h) * end..][1..=p];
                    best[h] = 1 + argmax(s);
                    let far = p - window;
                    bucket_mass(
                        &s[..far],
                        &buckets[1..=far],
                        &mut mass[h * clusters..][..clusters],
                    );
                }
                GroupTargets {
                    row: i,
                    position: p,
                    mass,
                    best,
                }
            })
            .collect();
        out.extend(done);
    }
    // Back in the order asked for.
    let mut rank = vec![0usize; m.query_positions.len()];
    for (k, &i) in rows.iter().enumerate() {
        rank[i] = k;
    }
    out.sort_by_key(|t| rank[t.row]);
    Ok(out)
}

/// The index of the highest score (the first, on ties).
fn argmax(scores: &[f32]) -> usize {
    let (mut best, mut mx) = (0, f32::NEG_INFINITY);
    for (j, &s) in scores.iter().enumerate() {
        if s > mx {
            (best, mx) = (j, s);
        }
    }
    best
}

/// Softmax of `scores` summed per bucket into `mass`.
fn bucket_mass(scores: &[f32], buckets: &[u32], mass: &mut [f32]) {
    let mx = scores[argmax(scores)];
    let mut acc = vec![0f64; mass.len()];
    let mut z = 0f64;
    for (&s, &b) in scores.iter().zip(buckets) {
        let e = (s - mx).exp() as f64;
        acc[b as usize] += e;
        z += e;
    }
    for (m, a) in mass.iter_mut().zip(&acc) {
        *m = (a / z) as f32;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use sparrow::saap::{RecordMeta, RopeParams};

    /// A random record: `n` tokens, queries at `positions`, values `±scale`.
    pub(crate) fn random_record(
        shape: (usize, usize, usize, usize),
        n: usize,
        positions: Vec<usize>,
        scale: f32,
        seed: u64,
    ) -> ContextRecord {
        let (n_layer, n_head, n_head_kv, d) = shape;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut v = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.random_range(-scale..scale)).collect()
        };
        let q = positions.len();
        ContextRecord {
            meta: RecordMeta {
                n_layer,
                n_head,
                n_head_kv,
                head_dim: d,
                n_tokens: n,
                query_positions: positions,
                rope: RopeParams {
                    n_rot: d,
                    base: 10000.0,
                    freq_scale: 1.0,
                    neox: true,
                },
                source: format!("random {seed}"),
            },
            fingerprint: [7; 32],
            keys: (0..n_layer).map(|_| v(n * n_head_kv * d)).collect(),
            queries: (0..n_layer).map(|_| v(q * n_head * d)).collect(),
        }
    }

    /// NeoX RoPE in f64, written independently of the engine's.
    fn rope64(x: &[f32], pos: usize, base: f64) -> Vec<f64> {
        let d = x.len();
        let half = d / 2;
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for i in 0..half {
            let a = pos as f64 * base.powf(-2.0 * i as f64 / d as f64);
            let (s, c) = a.sin_cos();
            let (x0, x1) = (x[i] as f64, x[i + half] as f64);
            out[i] = x0 * c - x1 * s;
            out[i + half] = x0 * s + x1 * c;
        }
        out
    }

    /// Per-bucket masses equal an f64 brute force (RoPE, softmax over keys `1..=p`, or
    /// `1..=p - W` with a target window `W`, sums per bucket), and the long-range filter
    /// keeps exactly the queries whose best key (over all of `1..=p`) is far enough back.
    #[test]
    fn masses_and_filter_match_f64_brute_force() {
        let (n_head, n_head_kv, d, c) = (4, 2, 8, 3);
        let positions = vec![1, 5, 9, 12, 17, 23];
        let rec = random_record((2, n_head, n_head_kv, d), 24, positions.clone(), 3.0, 11);
        let buckets: Vec<u32> = (0..24).map(|t| (t * 7 % 3) as u32).collect();
        let g = n_head / n_head_kv;
        let min_distance = 6;
        let mut kept = 0;
        for (window, layer) in [0usize, 4]
            .into_iter()
            .flat_map(|w| (0..2).map(move |l| (w, l)))
        {
            for kv in 0..n_head_kv {
                let rows: Vec<usize> = [5, 0, 3, 1, 2, 4]
                    .into_iter()
                    .filter(|&i| positions[i] > window)
                    .collect();
                let got = group_targets(&rec, layer, kv, &buckets, c, &rows, window).unwrap();
                assert_eq!(got.iter().map(|t| t.row).collect::<Vec<_>>(), rows);
                for t in &got {
                    let p = positions[t.row];
                    assert_eq!(t.position, p);
                    for h in 0..g {
                        let q = rope64(rec.query(layer, kv * g + h, t.row), p, 10000.0);
                        let s: Vec<f64> = (1..=p)
                            .map(|j| {
                                let k = rope64(rec.key(layer, kv, j), j, 10000.0);
                                q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>()
                                    / (d as f64).sqrt()
                            })
                            .collect();
                        let far_keys = &s[..p - window];
                        let fmx = far_keys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = far_keys.iter().map(|x| (x - fmx).exp()).sum();
                        let mut want = vec![0f64; c];
                        for (j, x) in far_keys.iter().enumerate() {
                            want[buckets[j + 1] as usize] += (x - fmx).exp() / z;
                        }
                        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        for (a, b) in t.head_mass(h).iter().zip(&want) {
                            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
                        }
                        let mut sorted = s.clone();
                        sorted.sort_by(|a, b| b.total_cmp(a));
                        let best = 1 + s.iter().position(|&x| x == mx).unwrap();
                        if p > 1 {
                            assert!(sorted[0] - sorted[1] > 1e-4, "near tie in the test data");
                        }
                        assert_eq!(t.best[h], best);
                        let far = p - best >= min_distance;
                        assert_eq!(t.long_range(h, min_distance), far);
                        kept += far as usize;
                    }
                }
            }
        }
        // The data exercises both sides of the filter.
        assert!(kept > 3 && kept < 2 * 2 * 2 * 6 * g - 3, "kept {kept}");
    }
}
