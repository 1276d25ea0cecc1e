//! JSON-constrained generation end to end: sampled completions at temperature 1.0 always
//! parse with serde_json, on the synthetic model and on the real Qwen2.5 (100 completions
//! each, of varied token budgets, so many are closed by the budget rather than by EOS).
//! The real model's completions continue a state holding their prompt but its last token
//! (prefilled once per prompt, truncated back after each completion), as a server reusing
//! a prefix does: most of the model's work is then the completions themselves.

mod common;

use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow::{collect_text, Engine, Generation, KvType, Sampler, SamplerConfig, Session};
use std::sync::Arc;

/// Samples a JSON completion of at most `n` tokens of `prompt` (running only what `session`
/// does not already hold).
fn complete(
    engine: &Engine,
    vocab: &Arc<JsonVocab>,
    session: &mut Session,
    prompt: &[u32],
    seed: u64,
    n: usize,
    root: Root,
) -> String {
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..Default::default()
    });
    let mut gen =
        Generation::new(n, false).with_constraint(JsonConstraint::new(vocab.clone(), root));
    let mut out = String::new();
    session
        .generate(
            engine,
            prompt,
            &mut sampler,
            &mut gen,
            &mut collect_text(&mut out),
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
    let ids = engine.tokenizer.encode("Give me JSON: ", true, true);
    let mut ended_by_eos = 0;
    for seed in 0..100u64 {
        let root = if seed % 4 == 3 {
            Root::Any
        } else {
            Root::Object
        };
        let n = 8 + (seed as usize * 7) % 120;
        let mut session = Session::new(engine.model.new_state(512, KvType::F16).unwrap());
        let out = complete(&engine, &vocab, &mut session, &ids, seed, n, root);
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
    // Per ask: its prompt's ids and a session holding all of them but the last.
    let mut prompts: Vec<(Vec<u32>, Session)> = asks
        .iter()
        .map(|ask| {
            let text = tmpl
                .render(&[sparrow::ChatMessage::new("user", ask)], true)
                .unwrap();
            let ids = engine.tokenizer.encode(&text, true, true);
            let mut state = engine.model.new_state(512, KvType::F16).unwrap();
            let held = &ids[..ids.len() - 1];
            sparrow::prefill(&engine.model, &mut state, held, 64, |_, _| {}).unwrap();
            let session = Session::holding(state, held.to_vec()).unwrap();
            (ids, session)
        })
        .collect();
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..100u64 {
        let (ids, session) = &mut prompts[seed as usize % asks.len()];
        let n = 4 + (seed as usize * 7) % 17;
        // The session keeps the prompt's prefix and drops the previous completion.
        let out = complete(&engine, &vocab, session, ids, seed, n, Root::Object);
        assert_eq!(session.tokens()[..ids.len()], ids[..], "the prompt is kept");
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
