//! Prompt cache files: a restored prefix continues exactly like the prefilled one (greedy
//! tokens and logits equal), on the synthetic model with a ~1,000-token prefix and on the
//! real Qwen2.5;
//! files from another model or damaged files are refused with a clear message.

mod common;

use sparrow::kv::minimum_budget;
use sparrow::prompt_cache::{self, model_fingerprint};
use sparrow::synthetic::SyntheticSpec;
use sparrow::{
    ColdTier, Engine, Generation, KvOptions, KvType, Sampler, SamplerConfig, Session, State,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-pc-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The synthetic model (2,048 positions) written to `dir/name` and loaded.
fn synthetic_engine(dir: &Path, name: &str) -> Engine {
    let spec = SyntheticSpec {
        context_length: 2048,
        ..Default::default()
    };
    common::synthetic_engine(&dir.join(name), &spec)
}

/// `n` greedy tokens after `question`, continuing a state whose cache holds `held`; the
/// state comes back.
fn greedy(
    engine: &Engine,
    state: State,
    held: &[u32],
    question: &[u32],
    n: usize,
) -> (Vec<u32>, State) {
    let mut out = Vec::new();
    let mut session = Session::holding(state, held.to_vec())
        .unwrap()
        .with_batch_size(256);
    session
        .generate(
            engine,
            &[held, question].concat(),
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Generation::new(n, true),
            &mut sparrow::collect_ids(&mut out),
        )
        .unwrap();
    (out, session.into_parts().0)
}

/// A fresh state that prefills `prefix` and then generates after `question`, against a state
/// whose `prefix` is restored from a file, then generates after `question`.
///
/// Bit for bit, at every SIMD level: both sides compute `prefix` with the same call
/// (`prefill`, batches of 256) and then make the same calls for `question` and the greedy
/// steps, so the restored side differs only by the file's round trip of the K/V rows —
/// which is what is tested, and which must be exact (raw rows). The full prefill of
/// `prefix + question` as one batch is not a fair reference: it splits the work differently
/// (with quantized weights `question`'s rows go through the panel GEMM in one split and the
/// per-row kernels in the other, depending on the SIMD level), equal only to rounding.
fn check(
    engine: &Engine,
    kv: &KvOptions,
    file: &Path,
    prefix: &[u32],
    question: &[u32],
    n_ctx: usize,
    n: usize,
) {
    let model = &engine.model;
    let t0 = Instant::now();
    let mut s1 = model.new_state(n_ctx, kv.clone()).unwrap();
    sparrow::prefill(model, &mut s1, prefix, 256, |_, _| {}).unwrap();
    let (want, s1) = greedy(engine, s1, prefix, question, n);
    let full = t0.elapsed();

    // Save the prefix's state (from a run over the prefix alone).
    let mut s2 = model.new_state(n_ctx, kv.clone()).unwrap();
    sparrow::prefill(model, &mut s2, prefix, 256, |_, _| {}).unwrap();
    prompt_cache::save(file, model, &s2, prefix).unwrap();

    let t1 = Instant::now();
    let mut s3 = model.new_state(n_ctx, kv.clone()).unwrap();
    let pc = prompt_cache::load(file, model, &s3).unwrap();
    assert_eq!(pc.tokens, prefix);
    pc.restore(&mut s3, prefix.len()).unwrap();
    if kv.cold.is_some() {
        assert!(
            s3.kv().bytes_cold() > 0,
            "the restored rows went to the cold file"
        );
    }
    let (got, s3) = greedy(engine, s3, prefix, question, n);
    let restored = t1.elapsed();
    assert_eq!(got, want, "restored prefix diverged from the prefilled one");
    // Same calls on the same rows: the last step's logits are equal to the bit.
    let bits = |s: &sparrow::State| {
        s.last_logits()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&s3), bits(&s1), "restored prefix: logits differ");
    // The comparison sees a wrong cache: the prefix restored one position short, `question`
    // then lands one position early and over a missing token.
    let mut short = model.new_state(n_ctx, kv.clone()).unwrap();
    pc.restore(&mut short, prefix.len() - 1).unwrap();
    let (_, short) = greedy(engine, short, &prefix[..prefix.len() - 1], question, n);
    assert_ne!(
        bits(&short),
        bits(&s1),
        "a prefix one token short went unnoticed"
    );
    eprintln!(
        "prefix {} tokens + {} new: prefill + {n} tokens {:.2} s, restored {:.2} s (saved {:.2} s)",
        prefix.len(),
        question.len(),
        full.as_secs_f64(),
        restored.as_secs_f64(),
        full.as_secs_f64() - restored.as_secs_f64()
    );
}

#[test]
fn synthetic_restored_prefix_matches_full_prefill() {
    let dir = tmpdir();
    let engine = synthetic_engine(&dir, "syn.gguf");
    let prefix: Vec<u32> = (0..1000u32).map(|i| (i * 31 + 7) % 256).collect();
    let question: Vec<u32> = b"what now?".iter().map(|&b| b as u32).collect();
    check(
        &engine,
        &KvType::F16.into(),
        &dir.join("syn.cache"),
        &prefix,
        &question,
        1100,
        16,
    );

    // Another model (same shapes, other weights) refuses the file.
    let other = common::synthetic_engine(
        &dir.join("syn2.gguf"),
        &SyntheticSpec {
            context_length: 2048,
            seed: 9,
            ..Default::default()
        },
    );
    assert_ne!(
        model_fingerprint(&other.model),
        model_fingerprint(&engine.model)
    );
    let st = other.model.new_state(1100, KvType::F16).unwrap();
    let e = prompt_cache::load(&dir.join("syn.cache"), &other.model, &st)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("different model"), "{e}");
    // f32 state refuses an f16 file.
    let st = engine.model.new_state(1100, KvType::F32).unwrap();
    let e = prompt_cache::load(&dir.join("syn.cache"), &engine.model, &st)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("f16"), "{e}");
    // Damaged files: every kind gives an error, never a panic.
    let good = std::fs::read(dir.join("syn.cache")).unwrap();
    let st = engine.model.new_state(1100, KvType::F16).unwrap();
    let mut seed = 1u64;
    for i in 0..200 {
        let mut bad = good.clone();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if i % 2 == 0 {
            bad.truncate((seed >> 33) as usize % good.len());
        } else {
            let at = (seed >> 33) as usize % good.len();
            bad[at] ^= 1 << (seed % 8);
        }
        let f = dir.join("bad.cache");
        std::fs::write(&f, &bad).unwrap();
        assert!(
            prompt_cache::load(&f, &engine.model, &st).is_err(),
            "damage {i} accepted"
        );
    }
}

#[test]
fn real_model_restored_prefix_matches_full_prefill() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tmpl = engine.chat_template.as_ref().unwrap();
    let system = "You are a careful assistant for a small bird-watching club. Answer briefly, \
                  name species precisely, and say when you are unsure.";
    let prefix_text = tmpl
        .render(&[sparrow::ChatMessage::new("system", system)], false)
        .unwrap();
    let prefix = engine.tokenizer.encode(&prefix_text, true, true);
    let question = engine.tokenizer.encode(
        "<|im_start|>user\nWhat is a sparrow?<|im_end|>\n<|im_start|>assistant\n",
        false,
        true,
    );
    check(
        &engine,
        &KvType::F16.into(),
        &tmpdir().join("qwen.cache"),
        &prefix,
        &question,
        512,
        4,
    );
}

/// A state whose keys and values are mostly in a cold tier saves its prefix to a file and
/// restores it (the file mapped, the rows written to the new state's cold file) with the
/// same greedy tokens and logits, bit for bit, as the state that prefilled it.
#[test]
fn a_cold_tier_state_saves_and_restores_through_the_file() {
    let dir = tmpdir();
    let engine = synthetic_engine(&dir, "syn-cold.gguf");
    let cfg = &engine.model.config;
    let n_ctx = 1100;
    let types = KvType::F16.into();
    let budget = minimum_budget(types, &vec![None; cfg.n_layer], n_ctx, cfg.kv_dim(), 0);
    let kv = KvOptions {
        types,
        cold: Some(ColdTier {
            ram_budget: budget,
            dir: Some(dir.clone()),
        }),
        reserved: 0,
    };
    let prefix: Vec<u32> = (0..1000u32).map(|i| (i * 17 + 3) % 256).collect();
    let question: Vec<u32> = b"and then?".iter().map(|&b| b as u32).collect();
    let file = dir.join("syn-cold.cache");
    check(&engine, &kv, &file, &prefix, &question, n_ctx, 16);
    // The cold-tier state's file is the RAM state's file, byte for byte.
    let mut ram = engine.model.new_state(n_ctx, KvType::F16).unwrap();
    sparrow::prefill(&engine.model, &mut ram, &prefix, 256, |_, _| {}).unwrap();
    let ram_file = dir.join("syn-ram.cache");
    prompt_cache::save(&ram_file, &engine.model, &ram, &prefix).unwrap();
    assert!(std::fs::read(&ram_file).unwrap() == std::fs::read(&file).unwrap());
}
