//! KV cache: decode equals prefill, batches equal steps, f16 close to f32, H2O eviction
//! protects sinks and the window, keeps the cache full, and leaves a cache that decodes
//! exactly like a prefill over the tokens it kept.

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use sparrow_attn::*;

fn cfg(window: usize, block_size: usize, sinks: usize, landmarks: LandmarkMode) -> SparseConfig {
    SparseConfig {
        window,
        block_size,
        sinks,
        causal: true,
        log_stride: true,
        landmarks,
        sort_candidates: true,
    }
}

#[test]
fn decode_step_equals_last_row_of_forward() {
    let (seq, qh, kvh, dim) = (333, 8, 2, 24);
    let (q, k, v) = qkv(seq, qh, kvh, dim, 1, 1.0);
    for landmarks in [LandmarkMode::Off, LandmarkMode::Ladder, LandmarkMode::All] {
        let c = cfg(40, 16, 3, landmarks);
        let a = SparseAttention::new(c).unwrap();
        let full = a.forward_gqa(&q, &k, &v).unwrap();
        let mut cache = KvCache::new(seq, kvh, dim, 16).unwrap();
        for t in 0..seq {
            cache.try_append(&token(&k, t), &token(&v, t)).unwrap();
            if t % 37 == 0 || t + 1 == seq {
                let o = a.decode_step(&token(&q, t), &cache).unwrap();
                let d = o
                    .token(0)
                    .unwrap()
                    .iter()
                    .zip(full.token(t).unwrap())
                    .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(d < 1e-5, "{landmarks:?} t={t}: {d}");
            }
        }
        assert!(cache.is_full());
    }
}

#[test]
fn decode_batch_equals_forward_rows() {
    let (seq, qh, kvh, dim) = (180, 4, 4, 16);
    let (q, k, v) = qkv(seq, qh, kvh, dim, 4, 1.0);
    let a = SparseAttention::new(cfg(32, 8, 1, LandmarkMode::All)).unwrap();
    let full = a.forward(&q, &k, &v).unwrap();
    let mut cache = KvCache::new(seq, kvh, dim, 8).unwrap();
    let m = 7;
    cache
        .append_all(&prefix(&k, seq - m), &prefix(&v, seq - m))
        .unwrap();
    let tail = |t: &Tensor3| {
        let w = t.heads() * t.dim();
        Tensor3::from_vec(t.data()[(seq - m) * w..].to_vec(), m, t.heads(), t.dim()).unwrap()
    };
    let out = a
        .decode_batch(&tail(&q), &tail(&k), &tail(&v), &mut cache)
        .unwrap();
    assert!(out.max_abs_diff(&tail(&full)) < 1e-5);
    assert_eq!(cache.len(), seq);
}

#[test]
fn partials_over_cache_views_merge_to_decode_step() {
    // What a sparse policy does: choose key subsets itself, then merge by LSE.
    let (seq, kvh, dim) = (300, 1, 16);
    let (q, k, v) = (
        rand_tensor(1, 1, dim, 7, 1.0),
        rand_tensor(seq, kvh, dim, 8, 1.0),
        rand_tensor(seq, kvh, dim, 9, 1.0),
    );
    let c = cfg(64, 32, 1, LandmarkMode::All);
    let mut cache = KvCache::new(seq, kvh, dim, 32).unwrap();
    cache.append_all(&k, &v).unwrap();
    let dec = SparseAttention::new(c.clone())
        .unwrap()
        .decode_step(&q, &cache)
        .unwrap();
    let cand = candidates_for(&c, seq, seq - 1).unwrap();
    let scale = 1.0 / (dim as f32).sqrt();
    let qr = q.row(0, 0).unwrap();
    let mut st = OnlineSoftmax::new(dim).unwrap();
    st.attend(
        qr,
        &cache.view(0).unwrap(),
        KeySet::Indices(&cand.tokens),
        scale,
    )
    .unwrap();
    let lm = partial_attention(
        qr,
        &cache.landmark_view(0).unwrap(),
        KeySet::Indices(&cand.blocks),
        scale,
    )
    .unwrap();
    st.merge_partial(&lm.out, lm.lse).unwrap();
    let p = st.to_partial();
    for d in 0..dim {
        assert!((p.out[d] - dec.row(0, 0).unwrap()[d]).abs() < 1e-5);
    }
}

#[cfg(feature = "fp16")]
#[test]
fn f16_cache_close_to_f32() {
    let (seq, qh, kvh, dim) = (400, 8, 2, 64);
    let (q, k, v) = qkv(seq, qh, kvh, dim, 10, 1.0);
    let a = SparseAttention::new(cfg(64, 16, 1, LandmarkMode::All)).unwrap();
    let mut c32 = KvCache::new(seq, kvh, dim, 16).unwrap();
    let mut c16 = KvCacheF16::new(seq, kvh, dim, 16).unwrap();
    c32.append_all(&k, &v).unwrap();
    c16.append_all(&k, &v).unwrap();
    let ql = last(&q);
    let d = a
        .decode_step(&ql, &c32)
        .unwrap()
        .max_abs_diff(&a.decode_step(&ql, &c16).unwrap());
    assert!(d < 1e-3, "{d}");
    assert_eq!(c16.storage_bytes() * 2, c32.storage_bytes());
}

fn h2o_run<E: KvElement>(
    window: usize,
    sinks: usize,
    bs: usize,
    cap: usize,
    steps: usize,
    seed: u64,
) {
    let (qh, kvh, dim) = (4, 2, 8);
    let total = cap + steps;
    let (q, k, v) = qkv(total, qh, kvh, dim, seed, 2.0);
    let c = cfg(window, bs, sinks, LandmarkMode::All);
    let a = SparseAttention::new(c.clone()).unwrap();
    let mut cache = LayerCache::<E>::new(cap, kvh, dim, bs).unwrap();
    let mut kept: Vec<usize> = Vec::new(); // original positions of the cached tokens
    for t in 0..total {
        if cache.is_full() {
            let expect = cache.eviction_victim(&c).unwrap();
            let ev = cache
                .evict_and_append(&token(&k, t), &token(&v, t), &c)
                .unwrap()
                .unwrap();
            assert_eq!(ev, expect);
            if cap > sinks + window {
                assert!(ev >= sinks, "evicted sink {ev}");
                assert!(ev < cap - window, "evicted window token {ev}");
            }
            kept.remove(ev);
            assert_eq!(cache.len(), cap);
        } else {
            assert_eq!(
                cache
                    .evict_and_append(&token(&k, t), &token(&v, t), &c)
                    .unwrap(),
                None
            );
        }
        kept.push(t);
        a.decode_step_tracked(&token(&q, t), &mut cache).unwrap();
    }
    // The cache now holds exactly the kept tokens, in order: decoding matches a prefill
    // over them (landmark means were maintained incrementally through the evictions).
    let gather = |x: &Tensor3| {
        let mut d = Vec::new();
        for &t in &kept {
            d.extend_from_slice(x.token(t).unwrap());
        }
        Tensor3::from_vec(d, kept.len(), x.heads(), x.dim()).unwrap()
    };
    let (kk, vv, qq) = (gather(&k), gather(&v), gather(&q));
    let full = a.forward_gqa(&qq, &kk, &vv).unwrap();
    let dec = a.decode_step(&last(&qq), &cache).unwrap();
    let tol = if E::NAME == "f32" { 1e-4 } else { 2e-3 };
    assert!(
        dec.max_abs_diff(&last(&full)) < tol,
        "{}",
        dec.max_abs_diff(&last(&full))
    );
}

#[test]
fn h2o_protects_sinks_and_window_and_stays_full() {
    h2o_run::<f32>(8, 2, 4, 40, 120, 20);
    h2o_run::<f32>(3, 0, 5, 17, 60, 30);
    h2o_run::<f32>(16, 1, 8, 64, 300, 40);
}

#[test]
fn h2o_fallback_when_everything_is_protected() {
    // capacity <= sinks + window: the oldest non-sink token goes.
    let c = cfg(10, 4, 2, LandmarkMode::All);
    let mut cache = KvCache::new(8, 1, 4, 4).unwrap();
    let one = Tensor3::from_vec(vec![1.0; 4], 1, 1, 4).unwrap();
    for _ in 0..8 {
        cache.try_append(&one, &one).unwrap();
    }
    assert_eq!(cache.evict_and_append(&one, &one, &c).unwrap(), Some(2));
    assert_eq!(cache.len(), 8);
    // Only sinks: nothing to evict is an error, not a panic.
    let c = cfg(1, 4, 8, LandmarkMode::All);
    assert_eq!(
        cache.evict_and_append(&one, &one, &c),
        Err(AttnError::NothingToEvict)
    );
}

#[cfg(feature = "fp16")]
#[test]
fn h2o_on_f16_cache() {
    h2o_run::<f16>(8, 2, 4, 40, 120, 50);
}

#[test]
fn h2o_evicts_the_least_attended_token() {
    // Token 5 gets keys pointing away from every query: least attention, first victim.
    let (cap, dim) = (16, 4);
    let c = cfg(4, 4, 1, LandmarkMode::Off);
    let a = SparseAttention::new(SparseConfig {
        log_stride: false,
        window: 16,
        ..c.clone()
    })
    .unwrap();
    let mut cache = KvCache::new(cap, 1, dim, 4).unwrap();
    let qv = Tensor3::from_vec(vec![1.0; dim], 1, 1, dim).unwrap();
    for t in 0..cap {
        let kv = Tensor3::from_vec(vec![if t == 5 { -5.0 } else { 0.5 }; dim], 1, 1, dim).unwrap();
        cache.try_append(&kv, &kv).unwrap();
        a.decode_step_tracked(&qv, &mut cache).unwrap();
    }
    assert_eq!(cache.eviction_victim(&c), Some(5));
    let s = cache.h2o_scores();
    assert_eq!(s.len(), cap);
    assert!(s[5] < s[4] && s[5] < s[6]);
}

#[test]
fn reset_and_capacity() {
    let mut cache = KvCache::new(4, 2, 3, 2).unwrap();
    let t = rand_tensor(4, 2, 3, 60, 1.0);
    cache.append_all(&t, &t).unwrap();
    assert!(cache.is_full());
    assert!(matches!(
        cache.try_append(&token(&t, 0), &token(&t, 0)),
        Err(AttnError::CacheFull { .. })
    ));
    cache.reset();
    assert!(cache.is_empty());
    cache.append_all(&t, &t).unwrap();
    assert_eq!(cache.len(), 4);
    assert_eq!(
        (
            cache.capacity(),
            cache.kv_heads(),
            cache.head_dim(),
            cache.block_size()
        ),
        (4, 2, 3, 2)
    );
}
