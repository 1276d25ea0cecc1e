//! Greedy continuations of the real Qwen2.5 model follow llama.cpp's token ids
//! (`tests/fixtures/qwen_greedy.json`), teacher-forced: fed llama.cpp's 64 tokens one at a
//! time, our top token at every step is llama.cpp's, except at a near-tie.
//!
//! llama.cpp is one more rounding of the same quantized math (8-bit activations in its own
//! blocking and order, f16 cache), so our logits may sit as far from its logits as two of our
//! own SIMD levels or batch splits sit from each other: [`common::ORDER_TOL`] per logit. The
//! fixture records llama.cpp's five best logits of the first step, and ours must lie within
//! that of them (measured: at most 0.18 off, SPARROW_SIMD=scalar, avx2 and avx512, f16 and
//! f32 caches). At a later step where llama.cpp's token is not our top token, both tokens' logits
//! lie within `ORDER_TOL` of llama.cpp's, which preferred its own, so ours can prefer the other
//! by at most `2 * ORDER_TOL`; where the fixture also records llama.cpp's margin (its top logit
//! minus its second; the Qwen fixture does not), that margin is subtracted, since llama.cpp's
//! token led ours by at least as much there. Measured: at most one such step per run, the
//! capital prompt's step 2, ours ahead by 0.02 to 0.10 depending on level and cache type. A
//! prompt missing its last token moves the first step's logits by 11 and 19: far outside
//! (checked below).

mod common;

use common::{argmax, forced_logits, Prefill, ORDER_TOL};
use sparrow::{KvType, Model};

struct Case {
    name: String,
    prompt: Vec<u32>,
    ids: Vec<u32>,
    /// llama.cpp's five best (token, logit) at the first step.
    top5: Vec<(usize, f32)>,
    /// llama.cpp's top-1 minus top-2 logit per step, if recorded.
    margins: Option<Vec<f32>>,
}

fn cases() -> Vec<Case> {
    let fixture: serde_json::Value =
        serde_json::from_str(&common::fixture("qwen_greedy.json")).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    fixture["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Case {
            name: p["name"].as_str().unwrap().to_string(),
            prompt: ids(&p["prompt_ids"]),
            ids: ids(&p["ids"]),
            top5: p["top5_first_step"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t[0].as_u64().unwrap() as usize,
                        t[1].as_f64().unwrap() as f32,
                    )
                })
                .collect(),
            margins: p["margins"]
                .as_array()
                .map(|m| m.iter().map(|x| x.as_f64().unwrap() as f32).collect()),
        })
        .collect()
}

/// Largest difference between our first-step logits and llama.cpp's recorded top five.
fn first_step_deviation(logits: &[f32], top5: &[(usize, f32)]) -> f32 {
    top5.iter()
        .map(|&(t, l)| (logits[t] - l).abs())
        .fold(0.0, f32::max)
}

fn run_greedy(kv: KvType) {
    let model = Model::load(common::qwen_path()).unwrap();
    for case in cases() {
        let Case {
            name,
            prompt,
            ids,
            top5,
            margins,
        } = &case;
        let mut state = model.new_state(512, kv).unwrap();
        let steps = forced_logits(&model, &mut state, prompt, ids, Prefill::Batch);
        assert_eq!(top5[0].0, ids[0] as usize, "{name}: fixture");
        let dev = first_step_deviation(&steps[0], top5);
        assert!(
            dev <= ORDER_TOL,
            "{name} ({kv:?}): first-step logits {dev} away from llama.cpp's top five"
        );
        let mut ties = Vec::new();
        for (step, (logits, &theirs)) in steps.iter().zip(ids).enumerate() {
            let ours = argmax(logits);
            if ours == theirs as usize {
                continue;
            }
            let gap = logits[ours] - logits[theirs as usize];
            let their_margin = margins.as_ref().map_or(0.0, |m| m[step]);
            assert!(
                gap + their_margin <= 2.0 * ORDER_TOL,
                "{name} ({kv:?}) step {step}: ours {ours} leads llama.cpp's {theirs} by {gap} \
                 (llama.cpp's margin {their_margin}): not a near-tie within {}",
                2.0 * ORDER_TOL
            );
            ties.push((step, gap));
        }
        eprintln!(
            "{name} ({kv:?}): first step within {dev:.3} of llama.cpp; near-ties (step, gap) {ties:?}"
        );

        // The check can fail: a cache missing the prompt's last token (an off-by-one at the
        // end of prefill) moves the first step far outside the tolerance.
        let mut short = model.new_state(512, kv).unwrap();
        let n = prompt.len();
        let cut = forced_logits(
            &model,
            &mut short,
            &prompt[..n - 1],
            &ids[..1],
            Prefill::Batch,
        );
        let dev = first_step_deviation(&cut[0], top5);
        eprintln!("{name} ({kv:?}) without its last token: first step {dev:.3} off");
        assert!(
            dev > 3.0 * ORDER_TOL,
            "{name}: a prompt missing its last token is only {dev} off"
        );
    }
}

#[test]
fn greedy_matches_llama_cpp_f16_cache() {
    run_greedy(KvType::F16);
}

#[test]
fn greedy_matches_llama_cpp_f32_cache() {
    run_greedy(KvType::F32);
}
