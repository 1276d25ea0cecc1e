//! The cost of Saap's routing per decode token: each router (`--saap-router`: hedged,
//! the Q-model alone, the centroids alone), with Q8_0 and f32 weights
//! (`--saap-router-weights`), run for every KV head group of every sparse layer, as the
//! `saap` policy runs it.
//!
//! `cargo run --release -p sparrow --example saap_cost -- MODEL.gguf [INDEX]` (default
//! index: the model's in the sparrow cache).

use sparrow::saap::{default_index_path, Level, Router, RouterCopy, SaapIndex, Scratch};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).ok_or("usage: saap_cost MODEL.gguf [INDEX]")?;
    // The model's shapes and fingerprint only: its weights are not needed.
    let config = sparrow::ModelConfig::from_gguf(&sparrow_gguf::GgufFile::open(model)?)?;
    let path = match args.get(2) {
        Some(p) => p.into(),
        None => default_index_path(&config.fingerprint).ok_or("no cache directory")?,
    };
    let index = SaapIndex::load(&path, &config)?;
    let m = &index.meta;
    let group = config.n_head / config.n_head_kv;
    let mut rnd = sparrow_attn::kernel::reference::uniform(3);
    let q: Vec<f32> = (0..group * m.head_dim).map(|_| rnd()).collect();
    let mut scratch = Scratch::default();
    let mut mass = vec![0f32; m.clusters];
    let sparse = (1..m.n_layer).flat_map(|l| (0..m.n_head_kv).map(move |h| (l, h)));
    let q8: Vec<RouterCopy> = index.heads.iter().map(RouterCopy::of).collect();
    let runs = [Router::Hedged, Router::Qmodel, Router::Centroids]
        .into_iter()
        .flat_map(|r| [(r, Some(&q8)), (r, None)]);
    for (router, copies) in runs {
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t0 = Instant::now();
            for (l, h) in sparse.clone() {
                let (head, level) = (index.head(l, h), Level::active());
                let weights = match &copies {
                    Some(c) => c[l * m.n_head_kv + h].weights(head),
                    None => head.weights(),
                };
                head.add_mass(router, weights, level, &q, &mut scratch, &mut mass);
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{router:?}, {} weights: {:.3} ms per token ({} layers x {} KV heads, group of {group}, C = {}, hidden {}, centroid prior {}; best of 20, one thread)",
            if copies.is_some() { "Q8_0" } else { "f32" },
            best * 1e3,
            m.n_layer - 1,
            m.n_head_kv,
            m.clusters,
            m.hidden,
            m.centroid_prior
        );
    }
    Ok(())
}
