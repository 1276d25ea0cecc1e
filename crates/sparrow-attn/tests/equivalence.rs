//! The exactness claims, on fixed shapes: every prefill entry point == the f64 oracle over
//! the listed keys and landmarks, full window == dense, dense == f64 reference, the sparse
//! output == partial attention merged with the landmarks, parallel == serial, candidate
//! counts == listed pairs.

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use sparrow_attn::*;

/// f32 outputs against the f64 oracle (or two f32 paths over the same keys in another
/// order). Outputs are convex combinations of values in `[-1, 1)`, and the scores (up to ~9;
/// dot products of ≤ 40 terms) carry a relative rounding of a few `2^-24`, so the errors
/// measure below 1e-6 (worst seen 7.5e-7, `dense_crosses_key_tiles` at `SPARROW_SIMD=scalar`;
/// ~2e-7 for the sparse entry points); a key missed or counted twice, a landmark mean off
/// by a row, or a score scale off by 1e-4 moves an output by more than 1e-5.
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

/// Every prefill entry point against the f64 oracle over the keys and landmarks the pattern
/// lists, MHA and GQA, causal or not, each landmark mode. (`forward_flash`,
/// `forward_gqa_flash` and `forward_auto` are names for the same computation as `forward` /
/// `forward_gqa`; comparing them with each other could not fail, so each is held to the
/// oracle on its own.)
#[test]
fn every_prefill_entry_point_matches_f64_oracle() {
    type Entry = fn(&SparseAttention, &Tensor3, &Tensor3, &Tensor3) -> Result<Tensor3>;
    let mha: [(&str, Entry); 4] = [
        ("forward", SparseAttention::forward),
        ("forward_flash", SparseAttention::forward_flash),
        ("forward_gqa", SparseAttention::forward_gqa),
        ("forward_auto", SparseAttention::forward_auto),
    ];
    let gqa: [(&str, Entry); 3] = [
        ("forward_gqa", SparseAttention::forward_gqa),
        ("forward_gqa_flash", SparseAttention::forward_gqa_flash),
        ("forward_auto", SparseAttention::forward_auto),
    ];
    let cases: [(_, &[(&str, Entry)]); 2] = [
        (qkv(300, 3, 3, 24, 1, 1.5), &mha),
        (qkv(260, 8, 2, 20, 4, 1.5), &gqa),
    ];
    for ((q, k, v), entries) in cases {
        for cfg in configs() {
            let want = sparse_oracle(&cfg, &q, &k, &v);
            let a = SparseAttention::new(cfg.clone()).unwrap();
            for (name, f) in entries {
                let d = max_diff(&f(&a, &q, &k, &v).unwrap(), &want);
                assert!(d < TOL, "{name} {:?} {cfg:?}: {d}", q.shape());
            }
        }
    }
}

#[test]
fn full_window_equals_dense() {
    let (q, k, v) = qkv(150, 4, 2, 16, 10, 1.0);
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
            let d = a.forward_gqa(&q, &k, &v).unwrap().max_abs_diff(&dense);
            assert!(d < TOL, "{landmarks:?} causal {causal}: {d}");
        }
    }
}

#[test]
fn dense_matches_f64_reference() {
    for (qh, kvh) in [(2, 2), (6, 3), (4, 1)] {
        let (q, k, v) = qkv(130, qh, kvh, 40, 13, 2.0);
        for causal in [true, false] {
            let r = naive_dense(&q, &k, &v, causal);
            assert!(max_diff_f64(&forward_dense(&q, &k, &v, causal).unwrap(), &r) < 1e-5);
            assert!(max_diff_f64(&forward_dense_flash(&q, &k, &v, causal).unwrap(), &r) < 1e-5);
        }
    }
}

#[test]
fn dense_crosses_key_tiles() {
    // Ten tiles of 64 keys, large scores: the online rescaling between tiles is exercised.
    let (q, k, v) = qkv(600, 1, 1, 8, 16, 3.0);
    let r = naive_dense(&q, &k, &v, true);
    let d = max_diff_f64(&forward_dense(&q, &k, &v, true).unwrap(), &r);
    assert!(d < TOL as f64, "{d}");
}

/// Without feature `parallel` both runs are the same serial path, so the test only means
/// something with it.
#[cfg(feature = "parallel")]
#[test]
fn parallel_switch_does_not_change_results() {
    let (q, k, v) = qkv(700, 4, 2, 16, 19, 1.0);
    let a = SparseAttention::new(SparseConfig {
        window: 32,
        block_size: 16,
        ..Default::default()
    })
    .unwrap();
    let b = a.clone().with_parallel(false);
    assert!(a.is_parallel() && !b.is_parallel());
    assert_eq!(
        a.forward_gqa(&q, &k, &v).unwrap(),
        b.forward_gqa(&q, &k, &v).unwrap()
    );
}

#[test]
fn sparse_forward_matches_partial_attention_over_listed_candidates() {
    // Rebuild the sparse output of one query from the public pieces: partial attention over
    // the listed tokens, partial attention over landmark means, merged.
    let (seq, dim) = (200, 12);
    let (q, k, v) = qkv(seq, 1, 1, dim, 22, 1.0);
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
