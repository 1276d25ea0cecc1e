//! Attention policies through the engine on a synthetic model: exact where they claim to
//! be, active where they claim to save work, and consistent across rewinds.

use sparrow::attention::AttentionChoice;
use sparrow::attention::StreamingAttention;
use sparrow::policy::quest::QuestSettings;
use sparrow::synthetic::{synthetic_model, synthetic_tokens, SyntheticSpec};
use sparrow::{KvType, Logits, Model, State};

fn model() -> Model {
    let spec = SyntheticSpec {
        context_length: 512,
        seed: 11,
        ..Default::default()
    };
    synthetic_model(&spec).unwrap()
}

fn state(m: &Model, choice: &AttentionChoice) -> State {
    let mut s = m.new_state(512, KvType::F16).unwrap();
    s.set_attention(choice.build(&m.config).unwrap());
    s
}

fn quest(page: usize, budget: usize) -> AttentionChoice {
    AttentionChoice {
        name: "quest".into(),
        ..Default::default()
    }
    .with(QuestSettings {
        page,
        budget,
        dense_layers: vec![],
    })
}

/// Prefill `prompt`, then feed `steps` one token at a time; the logits of every decode step.
fn decode_logits(m: &Model, s: &mut State, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    m.forward(s, prompt, Logits::None).unwrap();
    steps
        .iter()
        .map(|&t| m.forward(s, &[t], Logits::Last).unwrap().to_vec())
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn full_policy_equals_the_default_state() {
    let m = model();
    let (p, d) = (synthetic_tokens(150, 1), synthetic_tokens(12, 2));
    let mut plain = m.new_state(512, KvType::F16).unwrap();
    let want = decode_logits(&m, &mut plain, &p, &d);
    let got = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    assert_eq!(want, got);
}

#[test]
fn quest_with_a_budget_covering_the_context_equals_full() {
    let m = model();
    let (p, d) = (synthetic_tokens(200, 3), synthetic_tokens(16, 4));
    let want = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let got = decode_logits(&m, &mut state(&m, &quest(16, 512)), &p, &d);
    assert_eq!(want, got);
}

#[test]
fn quest_with_a_small_budget_reads_less_and_changes_the_output() {
    let m = model();
    let (p, d) = (synthetic_tokens(300, 5), synthetic_tokens(8, 6));
    let full = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let mut s = state(&m, &quest(8, 64));
    let sparse = decode_logits(&m, &mut s, &p, &d);
    assert!(s.attention().fraction_read(308) < 0.25);
    assert!(sparse.iter().flatten().all(|x| x.is_finite()));
    let worst = full
        .iter()
        .zip(&sparse)
        .map(|(a, b)| max_diff(a, b))
        .fold(0.0, f32::max);
    assert!(
        worst > 0.0,
        "a 64-token budget over 300 positions changed nothing"
    );
}

/// Fill the cache with `a` (prefilled as `a[..64]` then `a[64..]`) and decode, rewind to 64
/// tokens and continue with `b`: pages summarised from `a`'s later tokens must not survive,
/// so the result is a fresh sequence's, `a[..64]` then `b`.
///
/// Bit for bit, at every SIMD level: after the rewind both states make the same forward calls
/// (the same tokens in the same batches at the same positions) over the same cache rows
/// below 64, which both computed with the same call. Only what the policy remembers of the
/// rewritten positions can differ, and that is what is tested. (A fresh sequence prefilled as
/// one 154-token batch would split the work differently: other attention row blocks, and
/// with quantized weights other GEMM kernels, so it would equal this one only to rounding.)
#[test]
fn quest_after_a_rewind_equals_a_fresh_sequence() {
    let m = model();
    let (a, b, d) = (
        synthetic_tokens(180, 7),
        synthetic_tokens(90, 8),
        synthetic_tokens(6, 9),
    );
    let rewound = |to: usize| {
        let mut s = state(&m, &quest(8, 48));
        m.forward(&mut s, &a[..64], Logits::None).unwrap();
        decode_logits(&m, &mut s, &a[64..], &d);
        assert_eq!(s.truncate(to), to);
        decode_logits(&m, &mut s, &b[to - 64..], &d)
    };
    let mut fresh = state(&m, &quest(8, 48));
    m.forward(&mut fresh, &a[..64], Logits::None).unwrap();
    let want = decode_logits(&m, &mut fresh, &b, &d);
    assert_eq!(want, rewound(64));
    // The comparison sees a wrong cache: rewinding to 72 instead leaves `a`'s tokens at
    // 64..72 where the fresh sequence has `b`'s.
    assert_ne!(want, rewound(72));
}

#[test]
fn bad_policy_settings_list_what_is_valid() {
    let unknown = AttentionChoice {
        name: "sparsest".into(),
        ..Default::default()
    };
    let e = unknown.build(&shapes()).err().unwrap();
    assert!(
        e.contains("sparsest") && e.contains(&sparrow::attention::policy_names()),
        "{e}"
    );
    let e = quest(16, 4).build(&shapes()).err().unwrap();
    assert!(e.contains("budget 4"), "{e}");
    let e = AttentionChoice {
        prefill: Some("h2o".into()),
        ..Default::default()
    }
    .build(&shapes())
    .err()
    .unwrap();
    assert!(e.contains("does not support prefill"), "{e}");
}

/// Through the phase router, `--attn-prefill full --attn-decode full` is the plain engine.
#[test]
fn full_through_the_policy_layer_equals_the_engine_path() {
    let m = model();
    let (p, d) = (synthetic_tokens(200, 5), synthetic_tokens(12, 6));
    let plain = {
        let mut s = m.new_state(512, KvType::F16).unwrap();
        decode_logits(&m, &mut s, &p, &d)
    };
    for choice in [
        AttentionChoice::named("full"),
        AttentionChoice {
            prefill: Some("full".into()),
            decode: Some("full".into()),
            ..AttentionChoice::named("quest")
        },
    ] {
        assert_eq!(plain, decode_logits(&m, &mut state(&m, &choice), &p, &d));
    }
}

/// A phased choice routes batches to the prefill policy and single tokens to the decode
/// policy: streaming prefill with a tiny window must differ from full prefill, and a quest
/// decode with a covering budget must not change anything.
#[test]
fn phases_route_to_their_own_policy() {
    let m = model();
    let (p, d) = (synthetic_tokens(300, 8), synthetic_tokens(6, 9));
    let full = decode_logits(&m, &mut state(&m, &AttentionChoice::default()), &p, &d);
    let quest_decode = AttentionChoice {
        decode: Some("quest".into()),
        ..quest(16, 4096)
    };
    assert_eq!(
        full,
        decode_logits(&m, &mut state(&m, &quest_decode), &p, &d)
    );
    let streaming_prefill = AttentionChoice {
        prefill: Some("streaming".into()),
        ..AttentionChoice::named("full")
    }
    .with(StreamingAttention {
        window: 16,
        sinks: 0,
    });
    let got = decode_logits(&m, &mut state(&m, &streaming_prefill), &p, &d);
    assert!(
        max_diff(&got[0], &full[0]) > 1e-3,
        "prefill policy had no effect"
    );
}

/// A small model's shapes, for building policies whose settings are refused before use.
fn shapes() -> sparrow::ModelConfig {
    sparrow::synthetic::synthetic_config(&sparrow::synthetic::SyntheticSpec::default()).unwrap()
}
