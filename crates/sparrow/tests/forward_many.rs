//! `Model::forward_many`: several sequences in one forward pass give each sequence the
//! logits it gets alone — on a synthetic model to the bit (f32 weights: every product is
//! the same dot whatever the batch), on the real models teacher-forced within the
//! tolerance of a different batch split (batched rows may take the panel GEMM).

mod common;

use common::{assert_close, gemma_path, qwen_path, ORDER_TOL};
use sparrow::attention::{AttentionChoice, StreamingAttention};
use sparrow::synthetic::{synthetic_model, synthetic_tokens, SyntheticSpec};
use sparrow::{Error, KvOptions, KvType, Logits, Model, SeqStep, State, Workspace};

/// `full`, or `streaming` with a window short enough (2 sinks + 6 recent positions) that
/// the test's longer sequences read less than everything.
fn choice(policy: &str) -> AttentionChoice {
    match policy {
        "streaming" => AttentionChoice::named(policy).with(StreamingAttention {
            sinks: 2,
            window: 6,
        }),
        other => AttentionChoice::named(other),
    }
}

fn state(model: &Model, policy: &str) -> State {
    model
        .new_sequence(256, KvOptions::from(KvType::F32), &choice(policy))
        .unwrap()
}

/// Feeds each sequence its prompt alone (all logits), then `steps` forced tokens one pass
/// each; returns every logits row in order.
fn alone(model: &Model, policy: &str, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let mut st = state(model, policy);
    let vocab = model.config.vocab_size;
    let mut rows: Vec<Vec<f32>> = model
        .forward(&mut st, prompt, Logits::All)
        .unwrap()
        .chunks(vocab)
        .map(<[f32]>::to_vec)
        .collect();
    for &t in forced {
        rows.push(model.forward(&mut st, &[t], Logits::Last).unwrap().to_vec());
    }
    rows
}

/// The same, every sequence in one pass per step: the prompts together, then one forced
/// token of each per pass.
fn together(
    model: &Model,
    policies: &[&str],
    prompts: &[Vec<u32>],
    forced: &[Vec<u32>],
) -> Vec<Vec<Vec<f32>>> {
    let vocab = model.config.vocab_size;
    let mut states: Vec<State> = policies.iter().map(|p| state(model, p)).collect();
    let mut ws = Workspace::default();
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    {
        let mut steps: Vec<SeqStep<'_>> = states
            .iter_mut()
            .zip(prompts)
            .map(|(state, p)| SeqStep {
                state,
                tokens: p,
                want: Logits::All,
                as_steps: false,
                siblings: &[],
            })
            .collect();
        model.forward_many(&mut ws, &mut steps).unwrap();
    }
    for (o, s) in out.iter_mut().zip(&states) {
        o.extend(s.logits().chunks(vocab).map(<[f32]>::to_vec));
    }
    for i in 0..forced[0].len() {
        let toks: Vec<[u32; 1]> = forced.iter().map(|f| [f[i]]).collect();
        let mut steps: Vec<SeqStep<'_>> = states
            .iter_mut()
            .zip(&toks)
            .map(|(state, t)| SeqStep {
                state,
                tokens: t,
                want: Logits::Last,
                as_steps: false,
                siblings: &[],
            })
            .collect();
        model.forward_many(&mut ws, &mut steps).unwrap();
        for (o, s) in out.iter_mut().zip(&states) {
            o.push(s.logits().to_vec());
        }
    }
    out
}

#[test]
fn batched_sequences_equal_each_alone_to_the_bit() {
    let model = synthetic_model(&SyntheticSpec::default()).unwrap();
    let prompts = vec![
        synthetic_tokens(5, 1),
        synthetic_tokens(23, 2),
        synthetic_tokens(1, 3),
    ];
    let forced: Vec<Vec<u32>> = (0..3).map(|s| synthetic_tokens(6, 10 + s)).collect();
    // Each sequence has its own policy: attention runs per sequence over its own plan. The
    // streaming sequence (23 + 6 tokens over an 8-position window) must read less than
    // full, or a batch that ran every sequence as full would pass too.
    let policies = ["full", "streaming", "full"];
    assert_ne!(
        alone(&model, "streaming", &prompts[1], &forced[1]),
        alone(&model, "full", &prompts[1], &forced[1]),
        "the streaming window covers the sequence: the test cannot see a policy mix-up"
    );
    let got = together(&model, &policies, &prompts, &forced);
    for i in 0..3 {
        let want = alone(&model, policies[i], &prompts[i], &forced[i]);
        assert_eq!(want.len(), got[i].len());
        for (step, (w, g)) in want.iter().zip(&got[i]).enumerate() {
            assert!(
                w == g,
                "sequence {i} step {step}: batched logits differ from alone"
            );
        }
    }
}

#[test]
fn logits_rows_follow_each_sequences_want() {
    let model = synthetic_model(&SyntheticSpec::default()).unwrap();
    let vocab = model.config.vocab_size;
    let (a, b, c) = (
        synthetic_tokens(7, 4),
        synthetic_tokens(4, 5),
        synthetic_tokens(9, 6),
    );
    let mut st: Vec<State> = (0..3).map(|_| state(&model, "full")).collect();
    let mut ws = Workspace::default();
    let [s0, s1, s2] = &mut st[..] else {
        unreachable!()
    };
    model
        .forward_many(
            &mut ws,
            &mut [
                SeqStep {
                    state: s0,
                    tokens: &a,
                    want: Logits::None,
                    as_steps: false,
                    siblings: &[],
                },
                SeqStep {
                    state: s1,
                    tokens: &b,
                    want: Logits::Tail(2),
                    as_steps: false,
                    siblings: &[],
                },
                SeqStep {
                    state: s2,
                    tokens: &c,
                    want: Logits::Last,
                    as_steps: false,
                    siblings: &[],
                },
            ],
        )
        .unwrap();
    assert_eq!(st[0].logits().len(), 0);
    assert_eq!(st[1].logits().len(), 2 * vocab);
    assert_eq!(st[2].logits().len(), vocab);
    assert_eq!((st[0].n_past(), st[1].n_past(), st[2].n_past()), (7, 4, 9));
    let want_b = alone(&model, "full", &b, &[]);
    assert!(st[1].logits() == [want_b[2].clone(), want_b[3].clone()].concat());
    let want_c = alone(&model, "full", &c, &[]);
    assert!(st[2].last_logits() == &want_c[8][..]);
}

/// The error of one pass of `a` on the first state and `b` on the second (which must fail).
fn pass_two(model: &Model, ws: &mut Workspace, st: &mut [State], a: &[u32], b: &[u32]) -> Error {
    let [s0, s1] = st else { unreachable!() };
    let steps = &mut [
        SeqStep {
            state: s0,
            tokens: a,
            want: Logits::Last,
            as_steps: false,
            siblings: &[],
        },
        SeqStep {
            state: s1,
            tokens: b,
            want: Logits::Last,
            as_steps: false,
            siblings: &[],
        },
    ];
    model.forward_many(ws, steps).unwrap_err()
}

#[test]
fn a_bad_step_is_refused_before_anything_runs() {
    let model = synthetic_model(&SyntheticSpec::default()).unwrap();
    let mut st: Vec<State> = (0..2).map(|_| state(&model, "full")).collect();
    let mut ws = Workspace::default();
    let ok = synthetic_tokens(4, 1);
    let bad = [3u32, model.config.vocab_size as u32];
    let err = pass_two(&model, &mut ws, &mut st, &ok, &bad);
    assert!(matches!(err, Error::BadToken { .. }), "{err}");
    assert_eq!((st[0].n_past(), st[1].n_past()), (0, 0));
    // A step past a sequence's context is refused the same way.
    let long = synthetic_tokens(257, 2);
    let err = pass_two(&model, &mut ws, &mut st, &ok, &long);
    assert!(matches!(err, Error::ContextFull { .. }), "{err}");
    assert_eq!((st[0].n_past(), st[1].n_past()), (0, 0));
}

/// Real models, quantized weights: three sequences teacher-forced through batched passes
/// (prompts of different lengths together, then one token each per pass) stay within the
/// tolerance of each sequence alone (a different batch split: other kernels). Gemma 3 has sliding-window layers (each
/// sequence's own ring), Qwen2.5 global ones with GQA.
fn real_model_batched_matches_alone(path: std::path::PathBuf) {
    let model = Model::load(&path).unwrap();
    let text = [
        "The sparrow is a small bird that",
        "fn main() { let x = vec![1, 2, 3]; println!(\"{:?}\", x",
        "Once upon a time, in a village by the sea, there lived an old fisherman who",
    ];
    let engine_tok = sparrow::Engine::load(&path).unwrap().tokenizer;
    let prompts: Vec<Vec<u32>> = text
        .iter()
        .map(|t| engine_tok.encode(t, true, false))
        .collect();
    let forced: Vec<Vec<u32>> = text
        .iter()
        .map(|t| engine_tok.encode(&format!(" {t}"), false, false)[..5].to_vec())
        .collect();
    let policies = ["full", "full", "full"];
    let got = together(&model, &policies, &prompts, &forced);
    for i in 0..3 {
        let want = alone(&model, "full", &prompts[i], &forced[i]);
        assert_close(&format!("sequence {i}"), &want, &got[i], ORDER_TOL);
    }
}

#[test]
fn qwen_batched_sequences_match_each_alone() {
    real_model_batched_matches_alone(qwen_path());
}

#[test]
fn gemma_batched_sequences_match_each_alone() {
    real_model_batched_matches_alone(gemma_path());
}
