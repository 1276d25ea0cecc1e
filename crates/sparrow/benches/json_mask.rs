//! Cost of the JSON mask (plain, and under a JSON schema) against unmasked sampling, per
//! generated token, on the real Qwen2.5 vocabulary (151,936 tokens), next to one decode step
//! of the model for scale.
//!
//! `cargo bench -p sparrow --bench json_mask`

use criterion::{criterion_group, criterion_main, Criterion};
use sparrow::grammar::{JsonConstraint, JsonVocab, Root, Schema};
use sparrow::{Engine, KvType, Logits, Sampler, SamplerConfig};
use std::path::PathBuf;
use std::sync::Arc;

fn model_path() -> PathBuf {
    let dir = std::env::var("SPARROW_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/sparrow/models")
        });
    dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

const DOC: &str = r#"{"name": "sparrow", "tags": ["fast", "small", "cpu"], "version": 12.5, "ok": true, "nested": {"list": [1, 2, 3], "note": "caf\u00e9 \"quoted\""}, "none": null}"#;

/// A schema DOC is valid against, properties in DOC's order.
const SCHEMA: &str = r#"{"type":"object","additionalProperties":false,
  "properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},
    "version":{"type":"number"},"ok":{"type":"boolean"},
    "nested":{"type":"object","properties":{"list":{"type":"array","items":{"type":"integer"}},"note":{"type":"string"}},
              "required":["list","note"]},
    "none":{"type":"null"}},
  "required":["name","tags","version","ok","nested","none"]}"#;

fn random_logits(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 40) as f32 / (1u64 << 24) as f32 * 8.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let engine = Engine::load(model_path()).expect("the Qwen model (scripts/fetch_models.py qwen)");
    let tok = engine.tokenizer.clone();
    let vocab = Arc::new(JsonVocab::new(&tok));
    let script = tok.encode(DOC, false, false);
    let n = tok.vocab_size();
    let mut seed = 1;
    let logits: Vec<Vec<f32>> = (0..script.len())
        .map(|_| random_logits(n, &mut seed))
        .collect();
    let cfg = SamplerConfig::default();

    let mut g = c.benchmark_group("per_token");
    g.sample_size(20);
    g.bench_function("sample_unmasked", |b| {
        let mut s = Sampler::new(cfg.clone());
        b.iter(|| {
            for l in &logits {
                let mut l = l.clone();
                std::hint::black_box(s.sample(&mut l));
            }
        })
    });
    g.bench_function("sample_json_masked_cached", |b| {
        let mut s = Sampler::new(cfg.clone());
        b.iter(|| {
            let mut cons = JsonConstraint::new(vocab.clone(), Root::Object);
            for (l, &t) in logits.iter().zip(&script) {
                let mut l = l.clone();
                let mask = cons.allowed(None);
                std::hint::black_box(s.sample_masked(&mut l, |t| mask.contains(t)));
                assert!(cons.accept(t));
            }
        })
    });
    g.bench_function("sample_json_masked_cold_cache", |b| {
        let mut s = Sampler::new(cfg.clone());
        b.iter(|| {
            let fresh = Arc::new(JsonVocab::new_from(&vocab));
            let mut cons = JsonConstraint::new(fresh, Root::Object);
            for (l, &t) in logits.iter().zip(&script) {
                let mut l = l.clone();
                let mask = cons.allowed(None);
                std::hint::black_box(s.sample_masked(&mut l, |t| mask.contains(t)));
                assert!(cons.accept(t));
            }
        })
    });
    let schema = Arc::new(Schema::parse(SCHEMA).unwrap());
    g.bench_function("sample_schema_masked_cached", |b| {
        let mut s = Sampler::new(cfg.clone());
        b.iter(|| {
            let mut cons = JsonConstraint::with_schema(vocab.clone(), schema.clone());
            for (l, &t) in logits.iter().zip(&script) {
                let mut l = l.clone();
                let mask = cons.allowed(None);
                std::hint::black_box(s.sample_masked(&mut l, |t| mask.contains(t)));
                assert!(cons.accept(t));
            }
        })
    });
    g.bench_function("sample_schema_masked_cold_cache", |b| {
        let mut s = Sampler::new(cfg.clone());
        b.iter(|| {
            let fresh = Arc::new(JsonVocab::new_from(&vocab));
            let mut cons = JsonConstraint::with_schema(fresh, schema.clone());
            for (l, &t) in logits.iter().zip(&script) {
                let mut l = l.clone();
                let mask = cons.allowed(None);
                std::hint::black_box(s.sample_masked(&mut l, |t| mask.contains(t)));
                assert!(cons.accept(t));
            }
        })
    });
    g.finish();
    eprintln!(
        "({} tokens per iteration; divide by it for the per-token cost)",
        script.len()
    );

    let mut g = c.benchmark_group("model");
    g.sample_size(10);
    let model = engine.model.clone();
    let mut state = model.new_state(512, KvType::F16).unwrap();
    let prompt = tok.encode("Reply in JSON: ", false, false);
    model.forward(&mut state, &prompt, Logits::Last).unwrap();
    let base = state.n_past();
    g.bench_function("decode_one_token", |b| {
        b.iter(|| {
            assert_eq!(state.truncate(base), base);
            std::hint::black_box(
                model
                    .forward(&mut state, &[90], Logits::Last)
                    .unwrap()
                    .len(),
            );
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
