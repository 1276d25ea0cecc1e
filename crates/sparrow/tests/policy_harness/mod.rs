//! What the synthetic-model policy tests share: the model, a state running a policy, the
//! decode loop they compare, and the rewind check every stateful policy must pass.
#![allow(dead_code)]

use sparrow::attention::AttentionChoice;
use sparrow::policy::QuestSettings;
use sparrow::synthetic::{synthetic_model, synthetic_tokens, SyntheticSpec};
use sparrow::{KvType, Logits, Model, State};

/// A two-layer synthetic model with room for the tests' 512 positions.
pub fn model() -> Model {
    let spec = SyntheticSpec {
        context_length: 512,
        seed: 11,
        ..Default::default()
    };
    synthetic_model(&spec).unwrap()
}

/// A 512-position f16 state of `m` running `choice`.
pub fn state(m: &Model, choice: &AttentionChoice) -> State {
    let mut s = m.new_state(512, KvType::F16).unwrap();
    s.set_attention(choice.build(&m.config).unwrap());
    s
}

/// Quest over pages of `page` positions reading `budget` of them, every layer sparse.
pub fn quest(page: usize, budget: usize) -> AttentionChoice {
    AttentionChoice::named("quest").with(QuestSettings {
        page,
        budget,
        dense_layers: vec![],
        rerank: 0,
    })
}

/// Prefill `prompt`, then feed `steps` one token at a time; the logits of every decode step.
pub fn decode_logits(m: &Model, s: &mut State, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    m.forward(s, prompt, Logits::None).unwrap();
    steps
        .iter()
        .map(|&t| m.forward(s, &[t], Logits::Last).unwrap().to_vec())
        .collect()
}

/// The largest absolute difference between two runs' logits.
pub fn worst_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Fill the cache with `a` (prefilled as `a[..64]` then `a[64..]`) and decode, rewind to 64
/// tokens and continue with `b`: what `choice` summarised of `a`'s later tokens must not
/// survive, so the result is a fresh sequence's, `a[..64]` then `b` — and rewinding to
/// `wrong` (> 64) instead, which leaves some of `a`'s tokens where the fresh sequence has
/// `b`'s, must differ (the comparison can see a stale cache).
///
/// Bit for bit, at every SIMD level: after the rewind both states make the same forward
/// calls (the same tokens in the same batches at the same positions) over the same cache
/// rows below 64, which both computed with the same call. Only what the policy remembers of
/// the rewritten positions can differ, and that is what is tested. (A fresh sequence
/// prefilled as one 154-token batch would split the work differently — other attention row
/// blocks, and with quantized weights other GEMM kernels — equal only to rounding.)
pub fn assert_rewind_equals_fresh(choice: &AttentionChoice, wrong: usize) {
    let m = model();
    let (a, b, d) = (
        synthetic_tokens(180, 7),
        synthetic_tokens(90, 8),
        synthetic_tokens(6, 9),
    );
    let rewound = |to: usize| {
        let mut s = state(&m, choice);
        m.forward(&mut s, &a[..64], Logits::None).unwrap();
        decode_logits(&m, &mut s, &a[64..], &d);
        assert_eq!(s.truncate(to), to);
        decode_logits(&m, &mut s, &b[to - 64..], &d)
    };
    let mut fresh = state(&m, choice);
    m.forward(&mut fresh, &a[..64], Logits::None).unwrap();
    let want = decode_logits(&m, &mut fresh, &b, &d);
    assert_eq!(want, rewound(64), "{} after a rewind", choice.name);
    assert_ne!(
        want,
        rewound(wrong),
        "{}: a stale cache went unseen",
        choice.name
    );
}
