//! Times one decode token's attention over every layer of a real model's shape at a given
//! depth — plan and read, no matrix products — for full, quest, saap (both
//! `--saap-layout`s), kmeans and the sketch at their defaults, on the model's trained Saap index and an f16
//! cache of keys drawn around its centroids, random values (decode cost does not depend
//! on their content beyond how the keys fill the buckets).
//!
//! `cargo run --release -p sparrow --example saap_timing -- MODEL.gguf [depth] [reps]`
//! (`ONLY=name` times the policies whose name starts with it)

use sparrow::attention::{attend, read_set, AttentionChoice, AttnShape, KeysView, SparsePolicy};
use sparrow::policy::{SaapSettings, SketchSettings};
use sparrow::{KvType, RamStore};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .ok_or("usage: saap_timing MODEL.gguf [depth] [reps]")?;
    let depth: usize = args.get(2).map_or(Ok(32000), |s| s.parse())?;
    let reps: usize = args.get(3).map_or(Ok(50), |s| s.parse())?;
    // The model's shapes and fingerprint only: its weights are not needed.
    let config = sparrow::ModelConfig::from_gguf(&sparrow_gguf::GgufFile::open(model)?)?;
    let shape = AttnShape {
        n_head: config.n_head,
        n_head_kv: config.n_head_kv,
        head_dim: config.head_dim,
    };
    let (kv_dim, n_layer, n) = (config.kv_dim(), config.n_layer, depth + 1);
    // Each timed step is one position further, as a decode is (the sketch keeps
    // per-sequence state that a step at the same position again would rebuild).
    let room = n + reps + 1;
    let mut rnd = sparrow_attn::kernel::reference::uniform(7);
    // Keys spread over the index's buckets as real ones are (a centroid, chosen at random,
    // plus a little noise, rotated to its position); uniform random keys would crowd into a
    // few buckets and measure reading them, not the budget.
    let index = sparrow::saap::SaapIndex::load(
        &sparrow::saap::default_index_path(&config.fingerprint).ok_or("no cache directory")?,
        &config,
    )?;
    let rope = sparrow::model::rope::Rope::of(&config);
    let (hd, c) = (config.head_dim, index.meta.clusters);
    let mut cache = RamStore::new(KvType::F16, n_layer, room, kv_dim);
    for l in 0..n_layer {
        for t in 0..room {
            let mut k = vec![0f32; kv_dim];
            for (h, head) in k.chunks_exact_mut(hd).enumerate() {
                let b = ((rnd() * 0.5 + 0.5) * c as f32) as usize % c;
                let centroid = &index.head(l, h).centroids[b * hd..(b + 1) * hd];
                for (x, &m) in head.iter_mut().zip(centroid) {
                    *x = m + 0.05 * rnd();
                }
            }
            rope.rotate(&mut k, hd, t);
            let v: Vec<f32> = (0..kv_dim).map(|_| rnd()).collect();
            cache.write(l, t, &k, &v);
        }
    }
    let q: Vec<Vec<f32>> = (0..n_layer)
        .map(|_| (0..shape.q_dim()).map(|_| rnd()).collect())
        .collect();
    let mut out = vec![0f32; shape.q_dim()];
    let with_layout = |layout| {
        AttentionChoice::named("saap").with(SaapSettings {
            layout,
            ..Default::default()
        })
    };
    use sparrow::policy::SaapLayout as Layout;
    let policies = [
        ("full", AttentionChoice::named("full")),
        ("quest", AttentionChoice::named("quest")),
        ("saap (buckets)", with_layout(Layout::Buckets)),
        ("saap (positions)", with_layout(Layout::Positions)),
        ("kmeans", AttentionChoice::named("kmeans")),
        ("sketch", AttentionChoice::named("sketch")),
        (
            "sketch (ranked only)",
            AttentionChoice::named("sketch").with(SketchSettings {
                sample: 0,
                ..Default::default()
            }),
        ),
    ];
    for (name, choice) in policies {
        // `ONLY=quest` times one policy (for a profiler).
        if std::env::var("ONLY").is_ok_and(|o| !name.starts_with(&o)) {
            continue;
        }
        let mut p: Box<dyn SparsePolicy> = choice.build(&config)?;
        if let Some(bs) = p.block_size() {
            let mut keys = vec![0f32; bs * kv_dim];
            for l in 0..n_layer {
                for b in 0..n / bs {
                    cache.read_keys(l, b * bs, &mut keys);
                    let view = KeysView::new(&keys, bs, shape.n_head_kv, shape.head_dim)?;
                    p.on_block_sealed(l, b, view);
                }
            }
        }
        let mut step = |p: &mut Box<dyn SparsePolicy>, pos: usize| {
            for (l, q) in q.iter().enumerate() {
                attend(p.as_mut(), shape, &cache, l, q, pos, &mut out);
            }
        };
        step(&mut p, n - 1); // warm-up (copies saap's rows, sketches every key)
                             // Share of the context each (layer, KV head) reads.
        let shares: Vec<f64> = (0..n_layer)
            .flat_map(|l| read_set(p.as_mut(), shape, &cache, l, &q[l], n))
            .map(|r| r.iter().map(|r| r.len()).sum::<usize>() as f64 / n as f64)
            .collect();
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        let max = shares.iter().cloned().fold(0.0, f64::max);
        let mut times: Vec<f64> = (0..reps)
            .map(|r| {
                let t0 = Instant::now();
                step(&mut p, n + r);
                t0.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{name:>17}: median {:.2} ms, best {:.2} ms per token ({n_layer} layers, depth {depth}, {} threads); read {:.1}% of the context (mean over layers and KV heads; most {:.1}%)",
            times[reps / 2],
            times[0],
            rayon::current_num_threads(),
            mean * 100.0,
            max * 100.0
        );
    }
    Ok(())
}
