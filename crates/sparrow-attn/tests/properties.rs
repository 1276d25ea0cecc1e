//! Property tests over random shapes and configurations.

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use proptest::prelude::*;
use sparrow_attn::*;

fn arb_config() -> impl Strategy<Value = SparseConfig> {
    (
        1usize..40,
        1usize..20,
        0usize..5,
        any::<bool>(),
        any::<bool>(),
        0u8..3,
        any::<bool>(),
    )
        .prop_map(
            |(window, block_size, sinks, causal, log_stride, lm, sort_candidates)| SparseConfig {
                window,
                block_size,
                sinks,
                causal,
                log_stride,
                landmarks: [LandmarkMode::Off, LandmarkMode::Ladder, LandmarkMode::All]
                    [lm as usize],
                sort_candidates,
            },
        )
}

/// (seq, kv_heads, group, dim, seed)
fn arb_shape() -> impl Strategy<Value = (usize, usize, usize, usize, u64)> {
    (1usize..120, 1usize..4, 1usize..5, 1usize..40, any::<u64>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every prefill entry point that takes the shape against the f64 oracle over the keys
    /// and landmarks the pattern lists (the `_flash` names and `forward_auto` are the same
    /// computation as `forward` / `forward_gqa`, so each is held to the oracle rather than
    /// compared with another). Tolerance as in `equivalence.rs`.
    #[test]
    fn prefill_matches_f64_oracle((seq, kvh, g, dim, seed) in arb_shape(), cfg in arb_config()) {
        let (q, k, v) = qkv(seq, kvh * g, kvh, dim, seed, 1.5);
        let want = sparse_oracle(&cfg, &q, &k, &v);
        let a = SparseAttention::new(cfg).unwrap();
        let mut outs = vec![
            ("forward_gqa", a.forward_gqa(&q, &k, &v).unwrap()),
            ("forward_gqa_flash", a.forward_gqa_flash(&q, &k, &v).unwrap()),
            ("forward_auto", a.forward_auto(&q, &k, &v).unwrap()),
        ];
        if g == 1 {
            outs.push(("forward", a.forward(&q, &k, &v).unwrap()));
            outs.push(("forward_flash", a.forward_flash(&q, &k, &v).unwrap()));
        }
        for (name, out) in outs {
            let d = max_diff(&out, &want);
            prop_assert!(d < 1e-5, "{}: {}", name, d);
        }
    }

    #[test]
    fn covering_window_is_dense((seq, kvh, g, dim, seed) in arb_shape(), cfg in arb_config()) {
        let (q, k, v) = qkv(seq, kvh * g, kvh, dim, seed, 1.5);
        let a = SparseAttention::new(SparseConfig { window: seq + cfg.window, ..cfg.clone() }).unwrap();
        let dense = forward_dense(&q, &k, &v, cfg.causal).unwrap();
        prop_assert!(a.forward_gqa(&q, &k, &v).unwrap().max_abs_diff(&dense) < 1e-5);
        prop_assert!(max_diff_f64(&dense, &naive_dense(&q, &k, &v, cfg.causal)) < 1e-5);
        prop_assert!(max_diff_f64(&forward_dense_flash(&q, &k, &v, cfg.causal).unwrap(), &naive_dense(&q, &k, &v, cfg.causal)) < 1e-5);
    }

    #[test]
    fn decode_equals_prefill_last_row((seq, kvh, g, dim, seed) in arb_shape(), cfg in arb_config()) {
        let (q, k, v) = qkv(seq, kvh * g, kvh, dim, seed, 1.5);
        let cfg = SparseConfig { causal: true, ..cfg };
        let a = SparseAttention::new(cfg.clone()).unwrap();
        let full = a.forward_gqa(&q, &k, &v).unwrap();
        let mut cache = KvCache::new(seq, kvh, dim, cfg.block_size).unwrap();
        cache.append_all(&k, &v).unwrap();
        prop_assert!(a.decode_step(&last(&q), &cache).unwrap().max_abs_diff(&last(&full)) < 1e-5);
        #[cfg(feature = "fp16")]
        {
            let mut c16 = KvCacheF16::new(seq, kvh, dim, cfg.block_size).unwrap();
            c16.append_all(&k, &v).unwrap();
            prop_assert!(a.decode_step(&last(&q), &c16).unwrap().max_abs_diff(&last(&full)) < 1e-3);
        }
    }

    #[test]
    fn h2o_keeps_capacity_and_protects(cap in 2usize..40, extra in 1usize..60, cfg in arb_config(), seed in any::<u64>()) {
        let cfg = SparseConfig { causal: true, ..cfg };
        let (kvh, g, dim) = (1, 2, 4);
        let total = cap + extra;
        let (q, k, v) = qkv(total, kvh * g, kvh, dim, seed, 2.0);
        let a = SparseAttention::new(cfg.clone()).unwrap();
        let mut cache = KvCache::new(cap, kvh, dim, cfg.block_size).unwrap();
        let mut kept = Vec::new();
        for t in 0..total {
            match cache.evict_and_append(&token(&k, t), &token(&v, t), &cfg) {
                Ok(Some(ev)) => {
                    prop_assert_eq!(cache.len(), cap);
                    prop_assert!(ev >= cfg.sinks);
                    if cap > cfg.sinks + cfg.window {
                        prop_assert!(ev < cap - cfg.window);
                    }
                    kept.remove(ev);
                }
                Ok(None) => {}
                Err(e) => {
                    prop_assert_eq!(e, AttnError::NothingToEvict);
                    prop_assert!(cfg.sinks >= cap);
                    return Ok(());
                }
            }
            kept.push(t);
            a.decode_step_tracked(&token(&q, t), &mut cache).unwrap();
        }
        let pick = |x: &Tensor3| {
            let d: Vec<f32> = kept.iter().flat_map(|&t| x.token(t).unwrap().to_vec()).collect();
            Tensor3::from_vec(d, kept.len(), x.heads(), x.dim()).unwrap()
        };
        let full = a.forward_gqa(&pick(&q), &pick(&k), &pick(&v)).unwrap();
        prop_assert!(a.decode_step(&last(&pick(&q)), &cache).unwrap().max_abs_diff(&last(&full)) < 1e-4);
    }

    #[test]
    fn merge_of_any_split_is_whole(n in 1usize..80, dim in 1usize..24, cut in 0usize..80, seed in any::<u64>()) {
        let cut = cut.min(n);
        let k = rand_tensor(n, 1, dim, seed, 3.0);
        let v = rand_tensor(n, 1, dim, seed ^ 9, 1.0);
        let q = rand_tensor(1, 1, dim, seed ^ 10, 3.0);
        let view = KvView::from_tensors(&k, &v, 0).unwrap();
        let qr = q.row(0, 0).unwrap();
        let a = partial_attention(qr, &view, KeySet::Range(0..cut), 0.5).unwrap();
        let b = partial_attention(qr, &view, KeySet::Range(cut..n), 0.5).unwrap();
        let whole = partial_attention(qr, &view, KeySet::All, 0.5).unwrap();
        let m = merge(&a, &b).unwrap();
        prop_assert!((m.lse - whole.lse).abs() < 1e-4);
        for d in 0..dim {
            prop_assert!((m.out[d] - whole.out[d]).abs() < 1e-5);
        }
    }

    #[test]
    fn candidate_counts_are_listed_pairs(cfg in arb_config(), seq in 1usize..150) {
        let c = candidates(&cfg, seq).unwrap();
        let mut t = 0u64;
        for i in 0..seq {
            let l = candidates_for(&cfg, seq, i).unwrap();
            prop_assert!(l.tokens.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(l.tokens.iter().all(|&j| j < seq && (!cfg.causal || j <= i)));
            t += (l.tokens.len() + l.blocks.len()) as u64;
        }
        prop_assert_eq!(c.total(), t);
        prop_assert!(c.token_pairs <= c.dense_pairs);
    }
}
