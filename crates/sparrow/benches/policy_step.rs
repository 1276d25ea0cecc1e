//! Cost of one decode step's attention in one sparse layer at depth, per policy: the plan
//! (routing, summaries) and the read it names, on Qwen2.5-0.5B's attention shape (14 query
//! heads, 2 KV heads of 64) over an f16 cache of pseudo-random keys. Same-sitting ratios
//! between policies show what a policy's own work costs beside the read; the model's
//! weights (most of a real step) are not in it — `sparrow bench` measures whole steps.
//!
//! `cargo bench -p sparrow --bench policy_step` (`POLICY_STEP_DEPTH`, default 32000)

use criterion::{criterion_group, criterion_main, Criterion};
use sparrow::attention::{attend, AttnShape, DenseAttention, KeysView, SparsePolicy};
use sparrow::kv::RamStore;
use sparrow::model::rope::Rope;
use sparrow::policy::{QuestAttention, QuestSettings, SaapAttention, SaapRouter, SaapSettings};
use sparrow::saap::SaapIndex;
use sparrow::synthetic::{synthetic_config, synthetic_saap_index, SyntheticSpec};
use sparrow::KvType;
use std::sync::Arc;
use std::time::Duration;

/// The layer measured (layer 0 is dense under every sparse policy's defaults; Quest's
/// keep layer 1 dense too).
const LAYER: usize = 2;

/// Buckets of the default trained index (`sparrow saap train`'s `--clusters`).
const DEFAULT_CLUSTERS: usize = 256;

/// Buckets the bucket routers were tuned at, and the cells router's previous default.
const FINE_CLUSTERS: usize = 1024;

fn depth() -> usize {
    std::env::var("POLICY_STEP_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(32_000)
}

/// Values in [-1, 1) from a 64-bit LCG.
fn values(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn policy_step(c: &mut Criterion) {
    let n = depth();
    let spec = SyntheticSpec {
        n_layer: LAYER + 1,
        n_embd: 896,
        n_head: 14,
        n_head_kv: 2,
        context_length: n + 1,
        ..Default::default()
    };
    let m = synthetic_config(&spec).expect("a valid synthetic shape");
    let shape = AttnShape {
        n_head: m.n_head,
        n_head_kv: m.n_head_kv,
        head_dim: m.head_dim,
    };
    let kv_dim = m.kv_dim();
    let mut cache = RamStore::new(KvType::F16, m.n_layer, n, kv_dim);
    let mut seed = 1;
    for l in 0..m.n_layer {
        for t in 0..n {
            let k = values(kv_dim, &mut seed);
            let v = values(kv_dim, &mut seed);
            cache.write(l, t, &k, &v);
        }
    }
    let q = values(shape.q_dim(), &mut seed);
    // An index of the default bucket count, and one of 1,024 buckets.
    let index = Arc::new(synthetic_saap_index(&m, DEFAULT_CLUSTERS, 64, 7));
    let index_fine = Arc::new(synthetic_saap_index(&m, FINE_CLUSTERS, 64, 7));
    let saap = |index: &Arc<SaapIndex>, router, max_read, segment| {
        let s = SaapSettings {
            router,
            max_read,
            segment,
            ..Default::default()
        };
        let p = SaapAttention::new(s, index.clone(), Rope::of(&m)).expect("valid settings");
        Box::new(p) as Box<dyn SparsePolicy>
    };
    let quest = QuestAttention::new(QuestSettings::default(), m.n_layer).expect("defaults");
    // Saap at its defaults (5% of the context, at most 1,024 positions: Quest's default
    // read at 32K; segments of 8 × C), at 5% uncapped, over 1,024 buckets (segments of
    // 4 × C, the previous default, and 8 × C), and with the trained router over whole
    // buckets of the 1,024-bucket index.
    let d = SaapSettings::default();
    let fine_segment = |keys_per_cell| Some(keys_per_cell * FINE_CLUSTERS);
    let policies: Vec<(String, Box<dyn SparsePolicy>)> = vec![
        ("full".into(), Box::new(DenseAttention)),
        ("quest".into(), Box::new(quest)),
        (
            "saap (cells)".into(),
            saap(&index, SaapRouter::Cells, d.max_read, None),
        ),
        (
            "saap (cells, uncapped)".into(),
            saap(&index, SaapRouter::Cells, 0, None),
        ),
        (
            "saap (cells, C 1024, segment 4096)".into(),
            saap(&index_fine, SaapRouter::Cells, d.max_read, fine_segment(4)),
        ),
        (
            "saap (cells, C 1024, segment 8192)".into(),
            saap(&index_fine, SaapRouter::Cells, d.max_read, fine_segment(8)),
        ),
        (
            "saap (hedged, C 1024)".into(),
            saap(&index_fine, SaapRouter::Hedged, d.max_read, None),
        ),
    ];
    let mut group = c.benchmark_group(format!("decode step, one layer, depth {n}"));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(4));
    let mut out = vec![0f32; shape.q_dim()];
    for (name, mut p) in policies {
        // Seal every complete block, as the engine does while the context is written.
        if let Some(bs) = p.block_size() {
            let mut keys = vec![0f32; bs * kv_dim];
            for l in 0..m.n_layer {
                for b in 0..n / bs {
                    cache.read_keys(l, b * bs, &mut keys);
                    let view =
                        KeysView::new(&keys, bs, m.n_head_kv, m.head_dim).expect("a whole block");
                    p.on_block_sealed(l, b, view);
                }
            }
        }
        group.bench_function(&name, |b| {
            b.iter(|| attend(p.as_mut(), shape, &cache, LAYER, &q, n - 1, &mut out))
        });
    }
    group.finish();
}

criterion_group!(benches, policy_step);
criterion_main!(benches);
