//! The ladder and H2O policies through the engine: on a synthetic model (exact where they
//! claim to be, active where they save work, consistent across rewinds) and on the real
//! Qwen2.5 file (greedy decoding equals `full` when the policy covers the context).

use sparrow::attention::AttentionChoice;
use sparrow::policy::{H2oSettings, LadderSettings};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow::{Engine, KvType, Logits, Model, State};
use sparrow_gguf::GgufFile;
use std::path::PathBuf;
use std::sync::Arc;

fn model() -> Model {
    let spec = SyntheticSpec {
        context_length: 512,
        seed: 11,
        ..Default::default()
    };
    Model::from_gguf(Arc::new(
        GgufFile::from_bytes(synthetic_gguf(&spec)).unwrap(),
    ))
    .unwrap()
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 250 + 3)
        .collect()
}

fn state(m: &Model, choice: &AttentionChoice) -> State {
    let mut s = m.new_state(512, KvType::F16).unwrap();
    s.set_attention(choice.build(m.config.n_layer).unwrap());
    s
}

fn ladder(window: usize, landmarks: bool) -> AttentionChoice {
    AttentionChoice {
        name: "ladder".into(),
        ladder: LadderSettings {
            window,
            sinks: 4,
            block: 16,
            log_stride: true,
            landmarks,
            dense_layers: vec![],
        },
        ..Default::default()
    }
}

fn h2o(heavy: f64, recent: f64) -> AttentionChoice {
    AttentionChoice {
        name: "h2o".into(),
        h2o: H2oSettings {
            heavy,
            recent,
            dense_layers: vec![],
        },
        ..Default::default()
    }
}

/// Prefill `prompt`, then feed `steps` one token at a time; the logits of every decode step.
fn decode_logits(m: &Model, s: &mut State, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    m.forward(s, prompt, Logits::None).unwrap();
    steps
        .iter()
        .map(|&t| m.forward(s, &[t], Logits::Last).unwrap().to_vec())
        .collect()
}

fn worst_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A window covering prompt and generation: the ladder is `full`, bit for bit, in prefill
/// and decode.
#[test]
fn ladder_with_a_covering_window_equals_full() {
    let m = model();
    let (p, d) = (tokens(200, 3), tokens(16, 4));
    let want = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let got = decode_logits(&m, &mut state(&m, &ladder(216, true)), &p, &d);
    assert_eq!(want, got);
}

/// A small window with the ladder and landmarks reads a fraction of the context, changes
/// the output, and stays finite; landmarks change it again.
#[test]
fn ladder_with_a_small_window_reads_less_and_changes_the_output() {
    let m = model();
    let (p, d) = (tokens(300, 5), tokens(8, 6));
    let full = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let mut s = state(&m, &ladder(32, true));
    let with_lm = decode_logits(&m, &mut s, &p, &d);
    assert!(s.attention().fraction_read(308) < 0.25);
    let without = decode_logits(&m, &mut state(&m, &ladder(32, false)), &p, &d);
    assert!(with_lm.iter().flatten().all(|x| x.is_finite()));
    assert!(worst_diff(&full, &with_lm) > 0.0);
    assert!(
        worst_diff(&with_lm, &without) > 0.0,
        "landmarks changed nothing"
    );
}

/// Landmarks of blocks rewritten after a rewind are rebuilt: the same as a fresh sequence.
#[test]
fn ladder_after_a_rewind_equals_a_fresh_sequence() {
    let m = model();
    let (a, b, d) = (tokens(180, 7), tokens(90, 8), tokens(6, 9));
    let mut reused = state(&m, &ladder(24, true));
    decode_logits(&m, &mut reused, &a, &d);
    reused.truncate(64);
    let got = decode_logits(&m, &mut reused, &b, &d);
    let fresh_prompt: Vec<u32> = a[..64].iter().chain(&b).copied().collect();
    let want = decode_logits(&m, &mut state(&m, &ladder(24, true)), &fresh_prompt, &d);
    assert_eq!(want, got);
}

/// A budget covering the context (heavy + recent ≥ 1) evicts nothing: H2O is exact
/// attention through its own kernel, equal to `full` to rounding.
#[test]
fn h2o_with_a_covering_budget_equals_full() {
    let m = model();
    let (p, d) = (tokens(200, 3), tokens(16, 4));
    let want = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let got = decode_logits(&m, &mut state(&m, &h2o(0.5, 0.5)), &p, &d);
    let worst = worst_diff(&want, &got);
    assert!(worst < 1e-3, "{worst}");
}

/// The default 10% + 10% budget reads a fifth of the context and changes the output.
#[test]
fn h2o_with_the_default_budget_reads_less_and_changes_the_output() {
    let m = model();
    let (p, d) = (tokens(300, 5), tokens(8, 6));
    let full = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let mut s = state(&m, &AttentionChoice::named("h2o"));
    let sparse = decode_logits(&m, &mut s, &p, &d);
    let f = s.attention().fraction_read(308);
    assert!(f > 0.19 && f < 0.21, "{f}");
    assert!(sparse.iter().flatten().all(|x| x.is_finite()));
    assert!(worst_diff(&full, &sparse) > 0.0);
}

#[test]
fn bad_settings_name_the_setting_and_its_range() {
    let e = ladder(0, true).build(2).err().unwrap();
    assert!(e.contains("window 0"), "{e}");
    let mut c = ladder(8, true);
    c.ladder.block = 0;
    let e = c.build(2).err().unwrap();
    assert!(e.contains("block 0") && e.contains("1..="), "{e}");
    let e = h2o(0.0, 0.1).build(2).err().unwrap();
    assert!(e.contains("heavy") && e.contains("<= 1"), "{e}");
    let e = h2o(0.1, 1.5).build(2).err().unwrap();
    assert!(e.contains("recent") && e.contains("<= 1"), "{e}");
}

// ---- The real model (as tests/common.rs finds it) ----

fn qwen_path() -> PathBuf {
    let dir = match std::env::var("SPARROW_MODELS") {
        Ok(d) => PathBuf::from(d),
        Err(_) => {
            PathBuf::from(std::env::var("HOME").expect("HOME is set")).join(".cache/sparrow/models")
        }
    };
    let p = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/fetch_models.py qwen`",
        p.display()
    );
    p
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of `steps` tokens after `prompt` with `choice` (`None`: the default
/// state, exact attention).
fn greedy(e: &Engine, choice: Option<&AttentionChoice>, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut s = e.model.new_state(512, KvType::F16).unwrap();
    if let Some(c) = choice {
        s.set_attention(c.build(e.model.config.n_layer).unwrap());
    }
    let mut next = argmax(e.model.forward(&mut s, prompt, Logits::Last).unwrap());
    let mut out = vec![next];
    for _ in 1..steps {
        next = argmax(e.model.forward(&mut s, &[next], Logits::Last).unwrap());
        out.push(next);
    }
    out
}

fn qwen_prompt(e: &Engine) -> Vec<u32> {
    let text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
                Write a Python function that returns the n-th Fibonacci number, iteratively.\
                <|im_end|>\n<|im_start|>assistant\n";
    e.tokenizer.encode(text, true, true)
}

/// On the real model: a ladder window covering prompt + generation and an H2O budget
/// covering the context give the same greedy tokens as `full`; small budgets decode.
#[test]
fn qwen_greedy_tokens_match_full_when_the_policies_cover_the_context() {
    let e = Engine::load(qwen_path()).unwrap();
    let prompt = qwen_prompt(&e);
    let steps = 24;
    let want = greedy(&e, None, &prompt, steps);
    let covering = ladder(prompt.len() + steps, true);
    assert_eq!(greedy(&e, Some(&covering), &prompt, steps), want, "ladder");
    assert_eq!(
        greedy(&e, Some(&h2o(0.5, 0.5)), &prompt, steps),
        want,
        "h2o"
    );

    // Sparse settings: decoding runs and yields valid tokens.
    let vocab = e.tokenizer.vocab_size() as u32;
    for choice in [ladder(16, true), AttentionChoice::named("h2o")] {
        let got = greedy(&e, Some(&choice), &prompt, steps);
        assert_eq!(got.len(), steps);
        assert!(got.iter().all(|&t| t < vocab), "{}: {got:?}", choice.name);
    }
}
