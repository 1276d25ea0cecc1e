//! Greedy continuations of the two other model families follow llama.cpp's token ids,
//! teacher-forced: Gemma-3-270M (gemma3: sliding-window layers, QK-norm, sandwich norms,
//! GeGLU, scaled embeddings) and SmolLM2-135M-Instruct (llama, Q4_1). The fixtures
//! (`tests/fixtures/{gemma,smollm}_greedy.json`, from `../shared/data/reference/`) record
//! llama.cpp's 64 argmax tokens per prompt and its own margin (top-1 minus top-2 logit) at
//! each step.
//!
//! A step where our top token differs from llama.cpp's is accepted only at a near-tie: where
//! llama.cpp's margin plus our lead for the other token — how far the two engines disagree
//! on that pair — stays within [`PAIR_TOL`]; every other step must agree. Why 0.5 and not
//! llama.cpp's margin alone below 0.1: both engines quantize activations to 8 bits before
//! each product, in their own blocking and order, and that alone moves a pair's difference
//! by tenths — our own runs of the same prompt disagree with each other by up to 0.44 on a
//! step's margin (SmolLM2 `sd1_tea` step 1: 2.26 with AVX2 and one batch, 2.69 scalar, 2.59
//! token by token; llama.cpp 2.76), so a tolerance below that would fail on our own
//! rounding. Measured on an AVX-512 host (f16 and f32 caches, two batch splits): Gemma 3
//! one flip (llama.cpp's margin 0.012, ours 0.18), SmolLM2 twelve distinct flips, llama.cpp's
//! margin under 0.1 at nine of them and at most 0.19, our lead at most 0.27, the sum at
//! most 0.39. A real fault moves logits by whole units (a prompt missing its last token:
//! 11 and 19 on Qwen, `greedy_reference.rs`).
//!
//! Gemma's prompts are short; `gemma3_sliding_layers_read_their_window_from_a_ring` runs
//! past the sliding window (512) to exercise the ring.

mod common;

use common::{argmax, forced_logits, Prefill};
use sparrow::{prompt_cache, KvType, Logits, Model};

/// How far the two engines may disagree on a pair of tokens at a step where they choose
/// differently: llama.cpp's margin for its token plus our lead for ours.
const PAIR_TOL: f32 = 0.5;

/// [`PAIR_TOL`] for Qwen2.5-Coder-1.5B. Measured (AVX-512, AVX2 and scalar, one batch and chunks
/// of 3): seven flips over four prompts of 64 steps, llama.cpp's margin at most 0.084 there,
/// the pair's disagreement (its margin plus our lead) at most 0.24.
const QWEN15B_PAIR_TOL: f32 = 0.3;

struct Case {
    name: String,
    prompt: Vec<u32>,
    ids: Vec<u32>,
    margins: Vec<f32>,
}

fn cases(fixture: &str) -> Vec<Case> {
    let f: serde_json::Value = serde_json::from_str(&common::fixture(fixture)).unwrap();
    let nums = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    f["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Case {
            name: p["name"].as_str().unwrap().to_string(),
            prompt: nums(&p["prompt_ids"]).iter().map(|&x| x as u32).collect(),
            ids: nums(&p["ids"]).iter().map(|&x| x as u32).collect(),
            margins: nums(&p["margins"]).iter().map(|&x| x as f32).collect(),
        })
        .collect()
}

/// Teacher-forces every case of `fixture` and checks each step; returns the near-ties seen.
fn check(model: &Model, fixture: &str, kv: KvType, prefill: Prefill) -> Vec<(String, usize, f32)> {
    check_steps(model, fixture, kv, prefill, usize::MAX, PAIR_TOL)
}

/// [`check`] over at most the first `max_steps` forced tokens of each case.
fn check_steps(
    model: &Model,
    fixture: &str,
    kv: KvType,
    prefill: Prefill,
    max_steps: usize,
    pair_tol: f32,
) -> Vec<(String, usize, f32)> {
    let mut ties = Vec::new();
    for mut case in cases(fixture) {
        case.ids.truncate(max_steps);
        let mut state = model.new_state(256, kv).unwrap();
        let steps = forced_logits(model, &mut state, &case.prompt, &case.ids, prefill);
        for (step, (logits, &theirs)) in steps.iter().zip(&case.ids).enumerate() {
            let ours = argmax(logits);

            if ours == theirs as usize {
                continue;
            }
            let gap = logits[ours] - logits[theirs as usize];
            let margin = case.margins[step];
            assert!(
                margin + gap <= pair_tol,
                "{fixture} {} ({kv:?}, {prefill:?}) step {step}: ours {ours} leads llama.cpp's \
                 {theirs} by {gap:.3} where llama.cpp's margin is {margin:.3}: not a near-tie",
                case.name
            );
            ties.push((case.name.clone(), step, gap));
        }
    }
    eprintln!("{fixture} ({kv:?}, {prefill:?}): near-ties (case, step, our gap) {ties:?}");
    ties
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    let model = Model::load(common::gemma_path()).unwrap();
    for kv in [KvType::F16, KvType::F32] {
        check(&model, "gemma_greedy.json", kv, Prefill::Batch);
    }
    check(&model, "gemma_greedy.json", KvType::F16, Prefill::Chunks(3));
}

#[test]
fn smollm2_greedy_matches_llama_cpp() {
    let model = Model::load(common::smollm_path()).unwrap();
    for kv in [KvType::F16, KvType::F32] {
        check(&model, "smollm_greedy.json", kv, Prefill::Batch);
    }
    check(
        &model,
        "smollm_greedy.json",
        KvType::F16,
        Prefill::Chunks(3),
    );
}

/// Qwen2.5-Coder-1.5B (the long-context model): llama.cpp's prompt ids from our tokenizer,
/// and its 64 greedy tokens per prompt (`tests/fixtures/qwen1.5b_greedy.json`, made by
/// `tests/fixtures/gen_llama_greedy.py` with llama.cpp 0.3.36), teacher-forced, in one batch
/// and in chunks of 3. A 1.5B model's logits sit closer to llama.cpp's than the tiny models'
/// do, so the near-tie rule is tighter: [`QWEN15B_PAIR_TOL`].
#[test]
fn qwen15b_greedy_matches_llama_cpp() {
    let engine = sparrow::Engine::load(common::qwen15b_path()).unwrap();
    let fixture: serde_json::Value =
        serde_json::from_str(&common::fixture("qwen1.5b_greedy.json")).unwrap();
    for (p, case) in fixture["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(cases("qwen1.5b_greedy.json"))
    {
        let ours = engine
            .tokenizer
            .encode(p["prompt"].as_str().unwrap(), true, true);
        assert_eq!(
            ours, case.prompt,
            "{}: token ids differ from llama.cpp's",
            case.name
        );
    }
    let model = &engine.model;
    for prefill in [Prefill::Batch, Prefill::Chunks(3)] {
        let f = "qwen1.5b_greedy.json";
        check_steps(model, f, KvType::F16, prefill, usize::MAX, QWEN15B_PAIR_TOL);
    }
}

/// One configuration of the test above (f16 cache, the prompt in one batch) over the first
/// 16 forced tokens of each prompt: what `scripts/test-aarch64.sh` runs under qemu, where
/// the three whole configurations take ten minutes and this one whole took three. Every
/// prompt's batched prefill and 15 decode steps still run through the NEON kernels, 16
/// steps checked; the host's run has the full test and ignores this one.
#[test]
#[ignore = "a quicker subset of smollm2_greedy_matches_llama_cpp, for scripts/test-aarch64.sh"]
fn smollm2_greedy_f16_batch_matches_llama_cpp() {
    let model = Model::load(common::smollm_path()).unwrap();
    check_steps(
        &model,
        "smollm_greedy.json",
        KvType::F16,
        Prefill::Batch,
        16,
        PAIR_TOL,
    );
}

/// Pseudo-random token ids below `vocab` (a fixed sequence: the test must not depend on a
/// tokenizer).
fn tokens(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Past the window (1,400 tokens in batches of 256, then 24 one at a time, so the rings of
/// the sliding layers wrap several times in batches and in decode), the ring states give
/// the logits, to the bit, of states whose sliding layers keep every position and read the
/// same window: the ring hands the executor the same rows, cut where it wraps. (The window
/// itself — which positions a sliding layer reads — is checked against llama.cpp by the
/// perplexity at `-c 2048` in docs/models.md, far past it.)
#[test]
fn gemma3_sliding_layers_read_their_window_from_a_ring() {
    let model = Model::load(common::gemma_path()).unwrap();
    assert!(model.config.has_sliding_layers());
    let prompt = tokens(1400, 256_000, 7);
    let forced = tokens(24, 256_000, 8);
    let mut ring = model.new_state(2048, KvType::F16).unwrap();
    let mut full = model.new_state_without_rings(2048, KvType::F16).unwrap();
    let a = forced_logits(&model, &mut ring, &prompt, &forced, Prefill::Chunks(256));
    let b = forced_logits(&model, &mut full, &prompt, &forced, Prefill::Chunks(256));
    assert!(a == b, "a ring and a full cache give different logits");
    // 15 of the 18 layers are rings of 1,024 rows: past that the ring state stops growing.
    let (r, f) = (ring.kv().bytes_resident(), full.kv().bytes_resident());
    eprintln!("KV resident after 1,424 positions: ring {r} bytes, full {f} bytes");
    assert!(r < f && full.kv().bytes_per_token() == 6 * ring.kv().bytes_per_token());
    // A prompt cache file keeps the rings' last positions: restored whole, the next step's
    // logits are the same to the bit; restored to a prefix the rings no longer hold, nothing.
    let all: Vec<u32> = prompt.iter().chain(&forced[..23]).copied().collect();
    let img = prompt_cache::encode(&prompt_cache::model_fingerprint(&model), &ring, &all).unwrap();
    let rows: Vec<usize> = (0..18).map(|l| ring.kv().layer_rows(l)).collect();
    let pc = prompt_cache::decode_for(
        &img,
        &prompt_cache::model_fingerprint(&model),
        KvType::F16,
        &rows,
        ring.kv().kv_dim(),
        2048,
    )
    .unwrap();
    let mut back = model.new_state(2048, KvType::F16).unwrap();
    assert_eq!(pc.restore(&mut back, all.len()).unwrap(), all.len());
    let next = [forced[23]];
    assert!(
        model.forward(&mut back, &next, Logits::Last).unwrap()
            == model.forward(&mut full, &next, Logits::Last).unwrap()
    );
    assert_eq!(pc.restore(&mut back, 100).unwrap(), 0);
    assert_eq!(back.n_past(), 0);
    // Rewinding inside what the rings still hold keeps the prefix; past it, nothing.
    assert_eq!(ring.truncate(1400), 1400);
    assert_eq!(ring.truncate(100), 0);
    assert_eq!(full.truncate(100), 100);
}
