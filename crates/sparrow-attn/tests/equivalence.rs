//! The exactness claims, on fixed shapes: flash == plain, GQA(1) == MHA, full window ==
//! dense, dense == f64 reference, parallel == serial, candidate counts == listed pairs.

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use sparrow_attn::*;

const TOL: f32 = 1e-5;

fn configs() -> Vec<SparseConfig> {
    let mut v = Vec::new();
    for causal in [true, false] {
        for landmarks in [LandmarkMode::Off, LandmarkMode::Ladder, LandmarkMode::All] {
            for sort_candidates in [true, false] {
                v.push(SparseConfig {
                    window: 24,
                    block_size: 8,
                    sinks: 2,
                    causal,
                    log_stride: true,
                    landmarks,
                    sort_candidates,
                });
            }
        }
    }
    v
}

#[test]
fn forward_flash_matches_forward_mha() {
    let (q, k, v) = (
        rand_tensor(300, 3, 24, 1, 1.0),
        rand_tensor(300, 3, 24, 2, 1.0),
        rand_tensor(300, 3, 24, 3, 1.0),
    );
    for cfg in configs() {
        let a = SparseAttention::new(cfg.clone()).unwrap();
        let d = a
            .forward(&q, &k, &v)
            .unwrap()
            .max_abs_diff(&a.forward_flash(&q, &k, &v).unwrap());
        assert!(d < TOL, "{cfg:?}: {d}");
    }
}

#[test]
fn forward_gqa_flash_matches_forward_gqa() {
    let (q, k, v) = (
        rand_tensor(260, 8, 20, 4, 1.0),
        rand_tensor(260, 2, 20, 5, 1.0),
        rand_tensor(260, 2, 20, 6, 1.0),
    );
    for cfg in configs() {
        let a = SparseAttention::new(cfg.clone()).unwrap();
        let x = a.forward_gqa(&q, &k, &v).unwrap();
        let y = a.forward_gqa_flash(&q, &k, &v).unwrap();
        assert!(x.max_abs_diff(&y) < TOL, "{cfg:?}");
        assert!(x.max_abs_diff(&a.forward_auto(&q, &k, &v).unwrap()) < TOL);
    }
}

#[test]
fn forward_gqa_group_one_equals_forward() {
    let (q, k, v) = (
        rand_tensor(200, 4, 16, 7, 1.0),
        rand_tensor(200, 4, 16, 8, 1.0),
        rand_tensor(200, 4, 16, 9, 1.0),
    );
    for cfg in configs() {
        let a = SparseAttention::new(cfg).unwrap();
        assert_eq!(
            a.forward(&q, &k, &v).unwrap(),
            a.forward_gqa(&q, &k, &v).unwrap()
        );
        assert!(
            a.forward(&q, &k, &v)
                .unwrap()
                .max_abs_diff(&a.forward_auto(&q, &k, &v).unwrap())
                < TOL
        );
    }
}

#[test]
fn full_window_equals_dense() {
    let (q, k, v) = (
        rand_tensor(150, 4, 16, 10, 1.0),
        rand_tensor(150, 2, 16, 11, 1.0),
        rand_tensor(150, 2, 16, 12, 1.0),
    );
    for causal in [true, false] {
        let dense = forward_dense(&q, &k, &v, causal).unwrap();
        for landmarks in [LandmarkMode::Ladder, LandmarkMode::All] {
            let cfg = SparseConfig {
                window: 150,
                block_size: 16,
                sinks: 4,
                causal,
                log_stride: true,
                landmarks,
                sort_candidates: true,
            };
            let a = SparseAttention::new(cfg).unwrap();
            assert!(a.forward_gqa(&q, &k, &v).unwrap().max_abs_diff(&dense) < TOL);
            assert!(
                a.forward_gqa_flash(&q, &k, &v)
                    .unwrap()
                    .max_abs_diff(&dense)
                    < TOL
            );
        }
    }
}

#[test]
fn dense_matches_f64_reference() {
    for (qh, kvh) in [(2, 2), (6, 3), (4, 1)] {
        let (q, k, v) = (
            rand_tensor(130, qh, 40, 13, 2.0),
            rand_tensor(130, kvh, 40, 14, 2.0),
            rand_tensor(130, kvh, 40, 15, 1.0),
        );
        for causal in [true, false] {
            let r = naive_dense(&q, &k, &v, causal);
            assert!(max_diff_f64(&forward_dense(&q, &k, &v, causal).unwrap(), &r) < 1e-5);
            assert!(max_diff_f64(&forward_dense_flash(&q, &k, &v, causal).unwrap(), &r) < 1e-5);
        }
    }
}

#[test]
fn dense_flash_crosses_key_chunks() {
    // Longer than one 256-key chunk, so the online rescaling across chunks is exercised.
    let (q, k, v) = (
        rand_tensor(600, 1, 8, 16, 3.0),
        rand_tensor(600, 1, 8, 17, 3.0),
        rand_tensor(600, 1, 8, 18, 1.0),
    );
    let r = naive_dense(&q, &k, &v, true);
    assert!(max_diff_f64(&forward_dense_flash(&q, &k, &v, true).unwrap(), &r) < 1e-5);
}

#[test]
fn parallel_switch_does_not_change_results() {
    let (q, k, v) = (
        rand_tensor(700, 4, 16, 19, 1.0),
        rand_tensor(700, 2, 16, 20, 1.0),
        rand_tensor(700, 2, 16, 21, 1.0),
    );
    let a = SparseAttention::new(SparseConfig {
        window: 32,
        block_size: 16,
        ..Default::default()
    })
    .unwrap();
    let b = a.clone().with_parallel(false);
    assert_eq!(
        a.forward_gqa(&q, &k, &v).unwrap(),
        b.forward_gqa(&q, &k, &v).unwrap()
    );
    assert_eq!(
        a.forward_gqa_flash(&q, &k, &v).unwrap(),
        b.forward_gqa_flash(&q, &k, &v).unwrap()
    );
}

#[test]
fn sparse_forward_matches_partial_attention_over_listed_candidates() {
    // Rebuild the sparse output of one query from the public pieces: partial attention over
    // the listed tokens, partial attention over landmark means, merged.
    let (seq, dim) = (200, 12);
    let (q, k, v) = (
        rand_tensor(seq, 1, dim, 22, 1.0),
        rand_tensor(seq, 1, dim, 23, 1.0),
        rand_tensor(seq, 1, dim, 24, 1.0),
    );
    for cfg in configs() {
        let bs = cfg.block_size;
        let out = SparseAttention::new(cfg.clone())
            .unwrap()
            .forward(&q, &k, &v)
            .unwrap();
        let nb = seq.div_ceil(bs);
        let mut lk = vec![0.0f32; nb * dim];
        let mut lv = vec![0.0f32; nb * dim];
        for b in 0..nb {
            let t1 = ((b + 1) * bs).min(seq);
            for t in b * bs..t1 {
                for d in 0..dim {
                    lk[b * dim + d] += k.row(t, 0).unwrap()[d] / (t1 - b * bs) as f32;
                    lv[b * dim + d] += v.row(t, 0).unwrap()[d] / (t1 - b * bs) as f32;
                }
            }
        }
        let lview = KvView::new(&lk, &lv, nb, dim, dim).unwrap();
        let view = KvView::from_tensors(&k, &v, 0).unwrap();
        let scale = 1.0 / (dim as f32).sqrt();
        for i in [0, 5, 57, 130, 199] {
            let c = candidates_for(&cfg, seq, i).unwrap();
            let qi = q.row(i, 0).unwrap();
            let a = partial_attention(qi, &view, KeySet::Indices(&c.tokens), scale).unwrap();
            let b = partial_attention(qi, &lview, KeySet::Indices(&c.blocks), scale).unwrap();
            let m = merge(&a, &b).unwrap();
            let got = out.row(i, 0).unwrap();
            for d in 0..dim {
                assert!((m.out[d] - got[d]).abs() < TOL, "{cfg:?} i={i}");
            }
        }
    }
}

#[test]
fn sparse_forward_matches_f64_oracle_over_listed_candidates() {
    // The f64 oracle reads the listed keys and the listed landmarks, given as block-mean rows
    // appended after the keys.
    use sparrow_attn::kernel::{reference::attention_f64, AttnShape};
    let (seq, qh, kvh, dim) = (150, 4, 2, 16);
    let (q, k, v) = (
        rand_tensor(seq, qh, dim, 25, 1.5),
        rand_tensor(seq, kvh, dim, 26, 1.5),
        rand_tensor(seq, kvh, dim, 27, 1.0),
    );
    let shape = AttnShape {
        n_head: qh,
        n_head_kv: kvh,
        head_dim: dim,
    };
    for cfg in configs() {
        let out = SparseAttention::new(cfg.clone())
            .unwrap()
            .forward_gqa(&q, &k, &v)
            .unwrap();
        let bs = cfg.block_size;
        let rows = |x: &Tensor3| -> Vec<Vec<f32>> {
            let mean = |b: usize| -> Vec<f32> {
                let t = b * bs..((b + 1) * bs).min(seq);
                (0..kvh * dim)
                    .map(|j| {
                        t.clone().map(|i| x.token(i).unwrap()[j]).sum::<f32>() / t.len() as f32
                    })
                    .collect()
            };
            (0..seq)
                .map(|i| x.token(i).unwrap().to_vec())
                .chain((0..seq.div_ceil(bs)).map(mean))
                .collect()
        };
        let (keys, values) = (rows(&k), rows(&v));
        for i in 0..seq {
            let c = candidates_for(&cfg, seq, i).unwrap();
            let vis: Vec<usize> = c
                .tokens
                .iter()
                .copied()
                .chain(c.blocks.iter().map(|b| seq + b))
                .collect();
            let r = attention_f64(shape, &keys, &values, q.token(i).unwrap(), &vec![vis; kvh]);
            let d = r
                .iter()
                .zip(out.token(i).unwrap())
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(d < TOL, "{cfg:?} i={i}: {d}");
        }
    }
}

#[test]
fn candidate_counts_match_listed_pairs() {
    for cfg in configs() {
        for seq in [1, 9, 100, 257] {
            let c = candidates(&cfg, seq).unwrap();
            let (mut t, mut b) = (0u64, 0u64);
            for i in 0..seq {
                let l = candidates_for(&cfg, seq, i).unwrap();
                t += l.tokens.len() as u64;
                b += l.blocks.len() as u64;
            }
            assert_eq!(
                (c.token_pairs, c.landmark_pairs),
                (t, b),
                "{cfg:?} seq {seq}"
            );
        }
    }
    let big = candidates(&SparseConfig::default(), 32768).unwrap();
    assert!(big.reduction() > 30.0, "{big:?}");
}

#[test]
fn empty_sequence_gives_empty_output() {
    let q = Tensor3::zeros(0, 2, 4).unwrap();
    let a = SparseAttention::new(SparseConfig::default()).unwrap();
    assert_eq!(a.forward(&q, &q, &q).unwrap().seq(), 0);
    assert_eq!(a.forward_flash(&q, &q, &q).unwrap().seq(), 0);
    assert_eq!(forward_dense(&q, &q, &q, true).unwrap().seq(), 0);
}
