//! Every invalid input is an `Err`, never a panic.

#![allow(clippy::needless_range_loop)]

mod common;
use common::*;
use sparrow_attn::*;

#[test]
fn config_errors() {
    assert!(matches!(
        SparseAttention::new(SparseConfig {
            window: 0,
            ..Default::default()
        }),
        Err(AttnError::InvalidConfig {
            field: "window",
            ..
        })
    ));
    assert!(matches!(
        SparseAttention::new(SparseConfig {
            block_size: 0,
            ..Default::default()
        }),
        Err(AttnError::InvalidConfig {
            field: "block_size",
            ..
        })
    ));
    assert!(candidates(
        &SparseConfig {
            window: 0,
            ..Default::default()
        },
        4
    )
    .is_err());
    assert!(candidates_for(&SparseConfig::default(), 4, 4).is_err());
}

#[test]
fn tensor_errors() {
    assert!(Tensor3::zeros(2, 0, 2).is_err());
    assert!(Tensor3::zeros(2, 2, 0).is_err());
    assert!(Tensor3::zeros(usize::MAX / 2, 3, 1).is_err());
    assert!(Tensor3::from_vec(vec![0.0; 7], 2, 2, 2).is_err());
    let t = Tensor3::zeros(2, 2, 2).unwrap();
    assert!(t.row(2, 0).is_err() && t.row(0, 2).is_err());
}

#[test]
fn forward_shape_errors() {
    let a = SparseAttention::new(SparseConfig::default()).unwrap();
    let q = rand_tensor(10, 4, 8, 1, 1.0);
    let wrong_seq = rand_tensor(9, 4, 8, 2, 1.0);
    let wrong_dim = rand_tensor(10, 4, 6, 3, 1.0);
    let kv3 = rand_tensor(10, 3, 8, 4, 1.0);
    let kv2 = rand_tensor(10, 2, 8, 5, 1.0);
    let kv8 = rand_tensor(10, 8, 8, 6, 1.0);
    for f in [SparseAttention::forward, SparseAttention::forward_flash] {
        assert!(matches!(
            f(&a, &q, &wrong_seq, &q),
            Err(AttnError::ShapeMismatch { what: "seq", .. })
        ));
        assert!(matches!(
            f(&a, &q, &q, &wrong_dim),
            Err(AttnError::ShapeMismatch { what: "dim", .. })
        ));
        assert!(f(&a, &q, &kv2, &kv2).is_err(), "MHA rejects GQA shapes");
    }
    for f in [
        SparseAttention::forward_gqa,
        SparseAttention::forward_gqa_flash,
        SparseAttention::forward_auto,
    ] {
        assert!(matches!(
            f(&a, &q, &kv3, &kv3),
            Err(AttnError::HeadsNotDivisible {
                q_heads: 4,
                kv_heads: 3
            })
        ));
        assert!(matches!(
            f(&a, &q, &kv8, &kv8),
            Err(AttnError::HeadsNotDivisible { .. })
        ));
        assert!(f(&a, &q, &kv2, &kv3).is_err(), "k and v disagree");
        assert!(f(&a, &q, &wrong_seq, &wrong_seq).is_err());
        assert!(f(&a, &q, &wrong_dim, &wrong_dim).is_err());
    }
    assert!(forward_dense(&q, &kv3, &kv3, true).is_err());
    assert!(forward_dense_flash(&q, &wrong_seq, &wrong_seq, false).is_err());
}

#[test]
fn cache_errors() {
    for (c, h, d, b) in [(0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)] {
        assert!(matches!(
            KvCache::new(c, h, d, b),
            Err(AttnError::ZeroDim { .. })
        ));
    }
    assert!(KvCache::new(usize::MAX / 2, 4, 4, 1).is_err());
    let mut cache = KvCache::new(4, 2, 8, 2).unwrap();
    let a = SparseAttention::new(SparseConfig {
        block_size: 2,
        ..Default::default()
    })
    .unwrap();
    let tok = rand_tensor(1, 2, 8, 1, 1.0);
    let q = rand_tensor(1, 4, 8, 2, 1.0);
    assert_eq!(a.decode_step(&q, &cache), Err(AttnError::EmptyCache));
    assert!(cache
        .try_append(&rand_tensor(1, 3, 8, 3, 1.0), &tok)
        .is_err());
    assert!(cache
        .try_append(&tok, &rand_tensor(1, 2, 7, 3, 1.0))
        .is_err());
    assert!(cache
        .try_append(&rand_tensor(2, 2, 8, 3, 1.0), &rand_tensor(2, 2, 8, 3, 1.0))
        .is_err());
    assert!(cache.append_rows(&[0.0; 15], &[0.0; 16]).is_err());
    assert!(cache
        .append_all(&rand_tensor(5, 2, 8, 4, 1.0), &rand_tensor(5, 2, 8, 4, 1.0))
        .is_err());
    assert!(
        cache.is_empty(),
        "failed append_all leaves the cache unchanged"
    );
    cache.try_append(&tok, &tok).unwrap();
    assert!(
        a.decode_step(&rand_tensor(1, 3, 8, 5, 1.0), &cache)
            .is_err(),
        "3 q heads over 2 kv heads"
    );
    assert!(
        a.decode_step(&rand_tensor(1, 4, 6, 5, 1.0), &cache)
            .is_err(),
        "dim"
    );
    assert!(
        a.decode_step(&rand_tensor(2, 4, 8, 5, 1.0), &cache)
            .is_err(),
        "two query rows"
    );
    let other_block = SparseAttention::new(SparseConfig {
        block_size: 3,
        ..Default::default()
    })
    .unwrap();
    assert!(
        other_block.decode_step(&q, &cache).is_err(),
        "block size mismatch"
    );
    let m3 = rand_tensor(3, 2, 8, 6, 1.0);
    assert!(a
        .decode_batch(&rand_tensor(3, 4, 8, 7, 1.0), &m3, &m3, &mut cache.clone())
        .is_ok());
    assert!(a
        .decode_batch(
            &rand_tensor(4, 4, 8, 7, 1.0),
            &rand_tensor(4, 2, 8, 6, 1.0),
            &rand_tensor(4, 2, 8, 6, 1.0),
            &mut cache
        )
        .is_err());
    assert!(
        a.decode_batch(&rand_tensor(2, 4, 8, 7, 1.0), &m3, &m3, &mut cache)
            .is_err(),
        "q/k rows differ"
    );
    assert_eq!(cache.len(), 1);
    assert!(cache.view(2).is_err() && cache.landmark_view(2).is_err());
    assert!(cache
        .evict_and_append(
            &tok,
            &tok,
            &SparseConfig {
                window: 0,
                ..Default::default()
            }
        )
        .is_err());
    assert!(cache
        .evict_and_append(
            &rand_tensor(1, 1, 8, 8, 1.0),
            &tok,
            &SparseConfig::default()
        )
        .is_err());
}

#[test]
fn partial_attention_errors() {
    let k = vec![0.0f32; 32];
    let view = KvView::new(&k, &k, 4, 8, 8).unwrap();
    assert!(KvView::new(&k, &k, 5, 8, 8).is_err());
    assert!(partial_attention(&[0.0; 7], &view, KeySet::All, 1.0).is_err());
    assert!(partial_attention(&[0.0; 8], &view, KeySet::Range(2..5), 1.0).is_err());
    assert!(partial_attention(&[0.0; 8], &view, KeySet::Ranges(&[0..1, 3..9]), 1.0).is_err());
    assert!(partial_attention(&[0.0; 8], &view, KeySet::Indices(&[0, 4]), 1.0).is_err());
    assert!(partial_attention_into(&[0.0; 8], &view, KeySet::All, 1.0, &mut [0.0; 7]).is_err());
    assert!(merge_into(&mut [0.0; 3], 0.0, &[0.0; 4], 0.0).is_err());
    let mut st = OnlineSoftmax::new(8).unwrap();
    assert!(st.merge_partial(&[0.0; 9], 0.0).is_err());
    assert!(st.attend(&[0.0; 9], &view, KeySet::All, 1.0).is_err());
}
