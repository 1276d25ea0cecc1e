//! Times attention on the Qwen2.5-0.5B shape (14 q heads, 2 kv heads, head size 64) at a
//! given depth, per layer call: dense for one decode query and a 64-token prefill batch,
//! and Quest's decode (default settings, plan included: page scoring and selection).
//!
//! `cargo run --release -p sparrow --example attn_timing -- [depth] [threads] [f16|f32]`

use sparrow::attention::{attend, AttnShape, DenseAttention, SparsePolicy};
use sparrow::policy::{QuestAttention, QuestSettings};
use sparrow::{KvType, RamStore};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let depth: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let ty: KvType = args
        .get(3)
        .map(|s| s.parse().unwrap())
        .unwrap_or(KvType::F16);
    let shape = AttnShape {
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
    };
    let kv_dim = 128;
    let q_dim = 14 * 64;
    let batch = 64;
    let n_ctx = depth + batch;
    let mut rnd = sparrow_attn::kernel::reference::uniform(1);
    let mut cache = RamStore::new(ty, 1, n_ctx, kv_dim);
    for t in 0..n_ctx {
        let k: Vec<f32> = (0..kv_dim).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..kv_dim).map(|_| rnd()).collect();
        cache.write(0, t, &k, &v);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let q: Vec<f32> = (0..batch * q_dim).map(|_| rnd()).collect();
    let mut out = vec![0.0; batch * q_dim];
    pool.install(|| {
        let quest = || -> Box<dyn SparsePolicy> {
            let settings = QuestSettings {
                dense_layers: vec![],
                ..Default::default()
            };
            Box::new(QuestAttention::new(settings, 1).unwrap())
        };
        for (name, n, reps, mut policy) in [
            (
                "decode",
                1usize,
                400usize,
                Box::new(DenseAttention) as Box<dyn SparsePolicy>,
            ),
            ("prefill64", batch, 30, Box::new(DenseAttention)),
            ("quest-decode", 1, 400, quest()),
        ] {
            if std::env::var("ATTN_ONLY").is_ok_and(|o| o != name) {
                continue;
            }
            let pos0 = depth + batch - n;
            let mut run = || {
                let t0 = Instant::now();
                let (q, out) = (&q[..n * q_dim], &mut out[..n * q_dim]);
                attend(policy.as_mut(), shape, &cache, 0, q, pos0, out);
                t0.elapsed().as_secs_f64()
            };
            run(); // warm-up
            let mut times: Vec<f64> = (0..reps).map(|_| run()).collect();
            times.sort_by(f64::total_cmp);
            let (min, med) = (times[0], times[reps / 2]);
            println!(
                "{name}: min {:.3} ms, median {:.3} ms per layer call; x24 layers: min {:.1} ms",
                min * 1e3,
                med * 1e3,
                min * 24e3
            );
        }
    });
}
