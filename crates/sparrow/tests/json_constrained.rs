//! JSON-constrained generation end to end: sampled completions at temperature 1.0 always
//! parse with serde_json, on the synthetic model and on the real Qwen2.5 (100 completions
//! each, of varied token budgets, so many are closed by the budget rather than by EOS).

mod common;

use sparrow::grammar::{generate_json, JsonConstraint, JsonVocab, Root};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow::{Engine, GenerateOptions, KvType, Sampler, SamplerConfig};
use std::ops::ControlFlow;
use std::sync::Arc;

fn complete(
    engine: &Engine,
    vocab: &Arc<JsonVocab>,
    prompt: &str,
    seed: u64,
    n: usize,
    root: Root,
) -> String {
    let ids = engine.tokenizer.encode(prompt, true, true);
    let mut state = engine.model.new_state(512, KvType::F16).unwrap();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..Default::default()
    });
    let mut c = JsonConstraint::new(vocab.clone(), root);
    let opts = GenerateOptions {
        n_predict: Some(n),
        ..Default::default()
    };
    let mut out = String::new();
    generate_json(
        &engine.model,
        &engine.tokenizer,
        &mut state,
        &ids,
        &mut sampler,
        &opts,
        &mut c,
        |_, _| {},
        |_, t| {
            out.push_str(t);
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    out
}

#[test]
fn hundred_synthetic_completions_parse() {
    let dir = std::env::temp_dir().join(format!("sparrow-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("synthetic.gguf");
    std::fs::write(&p, synthetic_gguf(&SyntheticSpec::default())).unwrap();
    let engine = Engine::load(&p).unwrap();
    let vocab = Arc::new(JsonVocab::new(&engine.tokenizer));
    let mut ended_by_eos = 0;
    for seed in 0..100u64 {
        let root = if seed % 4 == 3 {
            Root::Any
        } else {
            Root::Object
        };
        let n = 8 + (seed as usize * 7) % 120;
        let out = complete(&engine, &vocab, "Give me JSON: ", seed, n, root);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("seed {seed}: {e}: {out:?}"));
        if root == Root::Object {
            assert!(v.is_object(), "{out}");
        }
        if out.len() < n {
            ended_by_eos += 1;
        }
    }
    eprintln!(
        "{ended_by_eos}/100 completions ended before the token limit; masks cached: {}",
        vocab.cached_masks()
    );
}

#[test]
fn real_model_json_completions_parse() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tmpl = engine.chat_template.as_ref().unwrap();
    let vocab = Arc::new(JsonVocab::new(&engine.tokenizer));
    let asks = [
        "Describe a sparrow as a JSON object.",
        "List three cities with their populations, as JSON.",
        "Give a JSON config for a web server with nested settings.",
        "Return a JSON object with a quoted string, a number, a list and null.",
    ];
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..100u64 {
        let ask = asks[seed as usize % asks.len()];
        let prompt = tmpl
            .render(&[sparrow::ChatMessage::new("user", ask)], true)
            .unwrap();
        let n = 4 + (seed as usize * 7) % 17;
        let out = complete(&engine, &vocab, &prompt, seed, n, Root::Object);
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("seed {seed} ({n} tokens): {e}: {out:?}"));
        assert!(v.is_object(), "seed {seed}: {out}");
        distinct.insert(out);
    }
    // Temperature 1.0 must actually sample: the completions are not all one text.
    assert!(
        distinct.len() > 50,
        "only {} distinct completions",
        distinct.len()
    );
}
