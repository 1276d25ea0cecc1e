//! Greedy continuations of the real Qwen2.5 model equal llama.cpp's token ids.

mod common;

use sparrow::{KvType, Logits, Model};

fn argmax(v: &[f32]) -> (usize, f32) {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
}

fn run_greedy(kv: KvType, min_match: usize) {
    let model = Model::load(common::qwen_path()).unwrap();
    let fixture: serde_json::Value =
        serde_json::from_str(&common::fixture("qwen_greedy.json")).unwrap();
    for p in fixture["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt: Vec<u32> = p["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let expected: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut state = model.new_state(512, kv).unwrap();
        let logits = model.forward(&mut state, &prompt, Logits::Last).unwrap();
        // The first step's top logit should be close to llama.cpp's (it quantizes activations
        // to 8 bits, so not bit-equal).
        let (top, top_logit) = argmax(logits);
        let ref_top = &p["top5_first_step"][0];
        assert_eq!(top as u64, ref_top[0].as_u64().unwrap(), "{name}");
        let ref_logit = ref_top[1].as_f64().unwrap() as f32;
        assert!(
            (top_logit - ref_logit).abs() < 0.25,
            "{name}: logit {top_logit} vs llama.cpp {ref_logit}"
        );
        let mut got = vec![top as u32];
        while got.len() < expected.len() {
            let logits = model
                .forward(&mut state, &got[got.len() - 1..], Logits::Last)
                .unwrap();
            got.push(argmax(logits).0 as u32);
        }
        let same = got
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            same >= min_match,
            "{name} ({kv:?}): first divergence at step {same}: ours {:?} llama.cpp {:?}",
            &got[same..(same + 4).min(got.len())],
            &expected[same..(same + 4).min(expected.len())]
        );
    }
}

#[test]
fn greedy_matches_llama_cpp_f16_cache() {
    run_greedy(KvType::F16, 32);
}

#[test]
fn greedy_matches_llama_cpp_f32_cache() {
    run_greedy(KvType::F32, 32);
}
