//! Attention policies through the engine on a synthetic model: exact where they claim to
//! be, active where they claim to save work, and consistent across rewinds.

mod policy_harness;

use policy_harness::{assert_rewind_equals_fresh, decode_logits, model, quest, state, worst_diff};
use sparrow::attention::AttentionChoice;
use sparrow::attention::StreamingAttention;
use sparrow::synthetic::synthetic_tokens;
use sparrow::KvType;

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
    let worst = worst_diff(&full, &sparse);
    assert!(
        worst > 0.0,
        "a 64-token budget over 300 positions changed nothing"
    );
}

/// Pages summarised from tokens a rewind forgot do not survive it (rewinding to 72 instead
/// of 64 leaves `a`'s tokens at 64..72, which the comparison must see).
#[test]
fn quest_after_a_rewind_equals_a_fresh_sequence() {
    assert_rewind_equals_fresh(&quest(8, 48), 72);
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
        worst_diff(&got[..1], &full[..1]) > 1e-3,
        "prefill policy had no effect"
    );
}

/// A small model's shapes, for building policies whose settings are refused before use.
fn shapes() -> sparrow::ModelConfig {
    sparrow::synthetic::synthetic_config(&sparrow::synthetic::SyntheticSpec::default()).unwrap()
}
