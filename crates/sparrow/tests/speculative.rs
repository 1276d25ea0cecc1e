//! Speculative decoding on synthetic models: `Model::forward_steps` gives each token the
//! logits of a one-token pass to the bit (for exact and selecting decode policies, in RAM
//! and under a cold tier, across a rewind), and a session decoding with drafts — a draft
//! model or prompt lookup — generates exactly what it generates without, greedy and
//! sampled, with penalties, stop strings and a full context.

mod common;

use sparrow::attention::AttentionChoice;
use sparrow::kv::{ColdTier, KvOptions};
use sparrow::policy::H2oSettings;
use sparrow::speculative::{check_vocabularies, lookup};
use sparrow::synthetic::{synthetic_gguf, synthetic_tokens, SyntheticSpec};
use sparrow::{
    collect_text, DraftModel, Drafter, Engine, Generation, KvType, Logits, Model, PromptLookup,
    Sampler, SamplerConfig, Session, Speculation, State, StopReason, VocabHead,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const N_CTX: usize = 512;

fn spec(seed: u64) -> SyntheticSpec {
    common::small_spec(seed, N_CTX)
}

/// A scratch directory of this test process.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sparrow-speculative-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The synthetic model of `seed` with its byte tokenizer, from a file of its own.
fn engine(seed: u64) -> Engine {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = scratch().join(format!("synthetic-{seed}-{n}.gguf"));
    std::fs::write(&path, synthetic_gguf(&spec(seed))).unwrap();
    Engine::load(&path).unwrap()
}

/// Every decode policy that reads less than everything (or keeps per-step state), and full.
fn choices(m: &Model) -> Vec<(&'static str, AttentionChoice)> {
    common::small_policies(m, &scratch())
}

/// H2O: its scores accumulate what every query attended to.
fn h2o() -> AttentionChoice {
    AttentionChoice::named("h2o").with(H2oSettings {
        heavy: 0.1,
        recent: 0.1,
        dense_layers: vec![],
    })
}

fn sequence(m: &Model, choice: &AttentionChoice, cold: Option<ColdTier>) -> State {
    let kv = KvOptions {
        types: KvType::F16.into(),
        cold,
        reserved: 0,
    };
    m.new_sequence(N_CTX, kv, choice).unwrap()
}

/// The tiered store at a RAM budget of a few blocks, well below the KV of the tests (plus Saap's copy in bucket
/// order, which it charges to the budget).
fn cold(name: &str) -> Option<ColdTier> {
    let copy = if name.contains("bucket") {
        304 << 10
    } else {
        0
    };
    Some(ColdTier {
        ram_budget: (112 << 10) + copy,
        dir: None,
    })
}

/// The logits of one-token passes over `steps` after a prefill of `prompt`.
fn one_token_rows(
    m: &Model,
    choice: &AttentionChoice,
    tier: &Option<ColdTier>,
    prompt: &[u32],
    steps: &[u32],
) -> Vec<Vec<f32>> {
    let mut alone = sequence(m, choice, tier.clone());
    m.forward(&mut alone, prompt, Logits::Last).unwrap();
    steps
        .iter()
        .map(|&t| m.forward(&mut alone, &[t], Logits::Last).unwrap().to_vec())
        .collect()
}

/// Decode steps in passes of several tokens — with a rewind of a rejected tail between —
/// give every row the bits of one-token passes, for every policy, in RAM and cold.
#[test]
fn decode_steps_match_one_token_passes_to_the_bit() {
    let e = engine(31);
    let m = &e.model;
    let vocab = m.config.vocab_size;
    let prompt = synthetic_tokens(150, 5);
    let steps = synthetic_tokens(40, 6);
    for (name, choice) in choices(m) {
        for tier in [None, cold(name)] {
            let label = format!("{name}, cold tier {}", tier.is_some());
            let want = one_token_rows(m, &choice, &tier, &prompt, &steps);
            let mut batched = sequence(m, &choice, tier);
            m.forward(&mut batched, &prompt, Logits::Last).unwrap();
            let mut at = 0;
            // Pass sizes below and above the batched products' panel threshold (16).
            for n in [1, 5, 17, 3, 14] {
                let base = batched.n_past();
                // Run three tokens that are not the steps first, rewind them: a rejected
                // draft must leave nothing behind.
                let wrong: Vec<u32> = steps[at..at + 3]
                    .iter()
                    .map(|t| (t + 1) % 250 + 3)
                    .collect();
                m.forward_steps(&mut batched, &wrong, Logits::All).unwrap();
                assert_eq!(batched.truncate(base), base, "{label}");
                let rows = m
                    .forward_steps(&mut batched, &steps[at..at + n], Logits::All)
                    .unwrap();
                assert_eq!(rows.len(), n * vocab, "{label}");
                for (i, row) in rows.chunks_exact(vocab).enumerate() {
                    assert!(
                        row == &want[at + i][..],
                        "{label}: step {} of a pass of {n} differs from its one-token pass",
                        at + i
                    );
                }
                at += n;
            }
        }
    }
}

/// A check's siblings: the sibling standing for row `r` gets the bits of a one-token pass
/// after the rows before `r`, the other rows keep theirs, and the cache afterwards is the
/// cache without the siblings (the next steps' bits) — full attention alone and under a
/// sparse prefill, in RAM and under a cold tier, at offsets that cross the store's blocks.
#[test]
fn siblings_get_the_bits_of_a_one_token_pass_after_the_rows_before_them() {
    let e = engine(31);
    let m = &e.model;
    let vocab = m.config.vocab_size;
    let prompt = synthetic_tokens(150, 5);
    let steps = synthetic_tokens(60, 6);
    let under_xattention = AttentionChoice {
        prefill: Some("xattention".into()),
        ..Default::default()
    };
    for (name, choice) in [
        ("full", AttentionChoice::default()),
        ("xattention+full", under_xattention),
    ] {
        for tier in [None, cold(name)] {
            let label = format!("{name}, cold tier {}", tier.is_some());
            // One-token passes: the steps, and each sibling after the steps before it.
            let want = one_token_rows(m, &choice, &tier, &prompt, &steps);
            let sibling_of = |t: u32| (t * 7 + 3) % 250 + 3;
            let after = |at: usize| {
                let mut s = sequence(m, &choice, tier.clone());
                m.forward(&mut s, &prompt, Logits::Last).unwrap();
                for &t in &steps[..at] {
                    m.forward(&mut s, &[t], Logits::Last).unwrap();
                }
                m.forward(&mut s, &[sibling_of(steps[at])], Logits::Last)
                    .unwrap()
                    .to_vec()
            };
            let mut batched = sequence(m, &choice, tier.clone());
            m.forward(&mut batched, &prompt, Logits::Last).unwrap();
            let mut at = 0;
            for (n, rows) in [(7, vec![1, 3, 6]), (12, vec![11]), (9, vec![1, 2, 4, 5, 8])] {
                let base = batched.n_past();
                let mut tokens = steps[at..at + n].to_vec();
                tokens.extend(rows.iter().map(|&r| sibling_of(steps[at + r])));
                let out = m
                    .forward_steps_with_siblings(&mut batched, &tokens, &rows, Logits::All)
                    .unwrap();
                assert_eq!(out.len(), tokens.len() * vocab, "{label}");
                for (i, row) in out.chunks_exact(vocab).take(n).enumerate() {
                    assert!(row == &want[at + i][..], "{label}: step {} differs", at + i);
                }
                for (j, row) in out.chunks_exact(vocab).skip(n).enumerate() {
                    let r = rows[j];
                    assert!(
                        row == &after(at + r)[..],
                        "{label}: the sibling of step {} differs from its one-token pass",
                        at + r
                    );
                }
                assert_eq!(
                    batched.n_past(),
                    base + n,
                    "{label}: siblings take no position"
                );
                at += n;
            }
            // The cache holds the steps, not the siblings: the next step's bits.
            let next = m.forward(&mut batched, &[steps[at]], Logits::Last).unwrap();
            assert!(
                next == &want[at][..],
                "{label}: the step after the checks differs"
            );
        }
    }
}

/// Siblings are refused, with the state untouched, where they cannot be exact (a decode
/// policy that selects keys) or do not make sense (rows out of order or out of range).
#[test]
fn siblings_are_refused_where_they_cannot_be_exact() {
    let e = engine(31);
    let m = &e.model;
    let prompt = synthetic_tokens(40, 5);
    let tokens = synthetic_tokens(7, 6);
    let mut quest = sequence(m, &common::small_quest(), None);
    m.forward(&mut quest, &prompt, Logits::Last).unwrap();
    assert!(!quest.takes_siblings());
    let err = m
        .forward_steps_with_siblings(&mut quest, &tokens, &[2], Logits::All)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sibling"), "{err}");
    assert_eq!(quest.n_past(), 40);
    let mut full = sequence(m, &AttentionChoice::default(), None);
    m.forward(&mut full, &prompt, Logits::Last).unwrap();
    assert!(full.takes_siblings());
    // Five steps and their siblings: rows in 1..5 only, increasing.
    for rows in [&[0][..], &[5], &[3, 2]] {
        let t = &tokens[..5 + rows.len()];
        let err = m
            .forward_steps_with_siblings(&mut full, t, rows, Logits::All)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sibling rows"), "{rows:?}: {err}");
        assert_eq!(full.n_past(), 40);
    }
}

/// The plain prefill of several tokens is not decode: with a selecting decode policy, the
/// rows `forward` gives for a batch differ from one-token passes — the difference
/// `forward_steps` exists for (so the test above can fail).
#[test]
fn a_prefill_batch_is_not_decode_steps() {
    let e = engine(31);
    let m = &e.model;
    let vocab = m.config.vocab_size;
    let prompt = synthetic_tokens(150, 5);
    let steps = synthetic_tokens(8, 6);
    let mut alone = sequence(m, &common::small_quest(), None);
    m.forward(&mut alone, &prompt, Logits::Last).unwrap();
    let mut batched = sequence(m, &common::small_quest(), None);
    m.forward(&mut batched, &prompt, Logits::Last).unwrap();
    let rows = m
        .forward(&mut batched, &steps, Logits::All)
        .unwrap()
        .to_vec();
    let differs = steps.iter().enumerate().any(|(i, &t)| {
        let one = m.forward(&mut alone, &[t], Logits::Last).unwrap();
        one != &rows[i * vocab..(i + 1) * vocab]
    });
    assert!(differs, "quest planned a prefill batch as decode steps");
}

/// Generate `limit` tokens after `prompt` with `sampler`'s settings, with or without
/// speculation; the text, the ids and the stop reason.
fn generate(
    e: &Engine,
    choice: &AttentionChoice,
    speculation: Option<Speculation>,
    prompt: &[u32],
    sampler: SamplerConfig,
    gen: Generation,
) -> (
    String,
    Vec<u32>,
    StopReason,
    Option<sparrow::SpeculationStats>,
) {
    let state = sequence(&e.model, choice, None);
    let mut session = Session::new(state);
    if let Some(s) = speculation {
        session = session.with_speculation(s);
    }
    let mut gen = gen;
    let mut sampler = Sampler::new(sampler);
    let mut text = String::new();
    let mut ids = Vec::new();
    let stats = session
        .generate(
            e,
            prompt,
            &mut sampler,
            &mut gen,
            &mut |id: Option<u32>, t: &str| {
                ids.extend(id);
                text.push_str(t);
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
    (text, ids, stats.stop, stats.speculation)
}

fn draft(target: &Engine, seed: u64, choice: &AttentionChoice) -> Speculation {
    draft_over(target, seed, choice, 0)
}

/// [`draft`] scoring only the first `vocab_head` ids and the context's (0: every id).
fn draft_over(
    target: &Engine,
    seed: u64,
    choice: &AttentionChoice,
    vocab_head: usize,
) -> Speculation {
    let d = engine(seed);
    check_vocabularies(&target.tokenizer, &d.tokenizer).unwrap();
    let state = sequence(&d.model, choice, None);
    let model = DraftModel::new(Arc::clone(&d.model), state, 0.0, 64)
        .unwrap()
        .with_vocab_head(vocab_head);
    // Every step drafts (a synthetic draft costs as much as its target, which the
    // length chooser would rightly refuse): many drafts judged, right and wrong.
    Speculation::new(Drafter::Model(Box::new(model)), 6, 0)
        .unwrap()
        .always_draft_max()
}

/// A sequence of `m` over a Q8_0 cache, full attention: as a draft of `m` itself, its
/// second choice is often `m`'s first where its first is not (siblings taken).
fn q8_0_sequence(m: &Model) -> State {
    let kv = KvOptions {
        types: KvType::Q8_0.into(),
        cold: None,
        reserved: 0,
    };
    m.new_sequence(N_CTX, kv, &AttentionChoice::default())
        .unwrap()
}

/// [`draft`] of the model of `seed` over a Q8_0 cache ([`q8_0_sequence`]).
fn draft_q8_0_cache(target: &Engine, seed: u64) -> Speculation {
    let d = engine(seed);
    let state = q8_0_sequence(&d.model);
    check_vocabularies(&target.tokenizer, &d.tokenizer).unwrap();
    let model = DraftModel::new(Arc::clone(&d.model), state, 0.0, 64).unwrap();
    Speculation::new(Drafter::Model(Box::new(model)), 6, 0)
        .unwrap()
        .always_draft_max()
}

/// A draft checks every token it computed, the one that took the product of its drafts'
/// probabilities below `--draft-p-min` included (never declining an unsure first token),
/// and stops there: at 1.0 each check holds exactly one draft, at 0 as many as asked.
#[test]
fn a_draft_checks_what_it_computed_and_stops_at_its_odds() {
    let e = engine(31);
    let prompt = repeating_prompt();
    let full = AttentionChoice::named("full");
    let run = |p_min: f32| {
        let d = engine(33);
        let state = sequence(&d.model, &full, None);
        let model = DraftModel::new(Arc::clone(&d.model), state, p_min, 64).unwrap();
        let s = Speculation::new(Drafter::Model(Box::new(model)), 6, 0)
            .unwrap()
            .always_draft_max();
        let greedy = SamplerConfig::greedy();
        generate(
            &e,
            &full,
            Some(s),
            &prompt,
            greedy,
            Generation::new(40, false),
        )
    };
    let plain = generate(
        &e,
        &full,
        None,
        &prompt,
        SamplerConfig::greedy(),
        Generation::new(40, false),
    );
    let (one, all) = (run(1.0), run(0.0));
    for (got, p_min) in [(&one, 1.0), (&all, 0.0)] {
        assert_eq!(got.1, plain.1, "p_min {p_min}: the plain output");
    }
    let (one, all) = (one.3.unwrap(), all.3.unwrap());
    // (every pass after the prompt's is a check of one draft)
    assert_eq!(
        one.drafted + 1,
        one.target_passes,
        "one draft a check: {one:?}"
    );
    assert!(
        all.drafted as f64 > 4.0 * all.target_passes as f64,
        "six drafts a check: {all:?}"
    );
}

fn lookup_drafts(max: usize) -> Speculation {
    Speculation::new(Drafter::Lookup(PromptLookup::new(3).unwrap()), max, 1)
        .unwrap()
        .always_draft_max()
}

/// A prompt that repeats itself, so lookup finds drafts and a draft model's greedy guesses
/// are sometimes right and sometimes wrong.
fn repeating_prompt() -> Vec<u32> {
    let piece = synthetic_tokens(24, 9);
    let mut p = piece.clone();
    p.extend_from_slice(&synthetic_tokens(10, 10));
    p.extend_from_slice(&piece);
    p.extend_from_slice(&piece[..12]);
    p
}

#[test]
fn speculative_output_is_the_plain_output() {
    let e = engine(31);
    let prompt = repeating_prompt();
    let samplers = [
        SamplerConfig::greedy(),
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.7,
            repeat_penalty: 1.3,
            seed: 11,
            ..SamplerConfig::default()
        },
    ];
    let mut siblings_taken = 0;
    for (name, choice) in choices(&e.model) {
        for sampler in &samplers {
            let plain = generate(
                &e,
                &choice,
                None,
                &prompt,
                sampler.clone(),
                Generation::new(60, true),
            );
            assert_eq!(plain.1.len(), 60);
            // The target itself as draft model (every draft right), another model (some
            // right), and lookup.
            let drafters = [
                ("self-draft", draft(&e, 31, &choice)),
                // Its head over a quarter of the vocabulary and the context's tokens.
                (
                    "self-draft, part of the vocabulary",
                    draft_over(&e, 31, &choice, 64),
                ),
                ("other draft", draft(&e, 32, &AttentionChoice::default())),
                // The target over an 8-bit cache: its second choice is often the target's
                // token where its first is not (a sibling taken).
                ("self-draft, q8_0 cache", draft_q8_0_cache(&e, 31)),
                ("lookup", lookup_drafts(5)),
                (
                    "lookup, measured lengths",
                    Speculation::new(Drafter::Lookup(PromptLookup::new(2).unwrap()), 8, 0).unwrap(),
                ),
            ];
            for (how, s) in drafters {
                let takes_siblings = how.starts_with("self-draft, q8_0") && name == "full";
                let got = generate(
                    &e,
                    &choice,
                    Some(s),
                    &prompt,
                    sampler.clone(),
                    Generation::new(60, true),
                );
                assert_eq!(
                    got.1, plain.1,
                    "{name}, {how}, temperature {}: the speculative tokens differ",
                    sampler.temperature
                );
                assert_eq!(got.0, plain.0);
                let stats = got.3.expect("speculative stats");
                assert!(stats.target_passes <= 60, "{name}, {how}: {stats:?}");
                if takes_siblings {
                    // Second choices checked beside unsure drafts, and some taken (the
                    // output above is the plain one all the same).
                    assert!(stats.siblings > 0, "{name}, {how}: {stats:?}");
                    siblings_taken += stats.siblings_kept;
                } else if name != "full" {
                    assert_eq!(stats.siblings, 0, "{name}, {how}: a sparse policy's check");
                }
                if how == "self-draft" && sampler.temperature == 0.0 {
                    // Its own greedy guesses are the greedy output: nearly all kept.
                    // (The draft catches up on kept tokens in a prefill batch, which a
                    // selecting policy attends differently: not every guess is the same.)
                    assert!(stats.acceptance() > 0.8, "{name}: {stats:?}");
                    assert!(stats.target_passes < 20, "{name}: {stats:?}");
                }
                if how == "self-draft, part of the vocabulary" && sampler.temperature == 0.0 {
                    // The output wanders past the head's first part, then settles into a
                    // cycle of tokens known once generated: proposed right, few passes
                    // (17 full, 26 quest; misread as the logits' places, ~55).
                    assert!(stats.target_passes < 32, "{name}, {how}: {stats:?}");
                }
            }
        }
    }
    assert!(
        siblings_taken > 0,
        "no sibling was ever taken: the path went untested"
    );
}

/// Stop strings, the token limit and a context that fills up end a speculative generation
/// where they end a plain one, with the same text.
#[test]
fn speculation_ends_where_plain_decoding_ends() {
    let e = engine(31);
    let prompt = repeating_prompt();
    let choice = AttentionChoice::default();
    let plain = generate(
        &e,
        &choice,
        None,
        &prompt,
        SamplerConfig::greedy(),
        Generation::new(40, true),
    );
    // A stop string made of a few tokens from the middle of the plain output.
    let stop = plain.0.chars().skip(12).take(3).collect::<String>();
    for limit in [1, 2, 7, 40] {
        let g = || Generation::new(limit, true).with_stops(vec![stop.clone()]);
        let want = generate(&e, &choice, None, &prompt, SamplerConfig::greedy(), g());
        for s in [lookup_drafts(8), draft(&e, 31, &choice)] {
            let got = generate(&e, &choice, Some(s), &prompt, SamplerConfig::greedy(), g());
            assert_eq!(
                (&got.0, &got.1, got.2),
                (&want.0, &want.1, want.2),
                "limit {limit}"
            );
        }
    }
    // A context with room for a few tokens only.
    let e_small = engine(31);
    let short = |spec: Option<Speculation>| {
        let state = e_small
            .model
            .new_sequence(prompt.len() + 5, KvType::F16, &choice)
            .unwrap();
        let mut session = Session::new(state);
        if let Some(s) = spec {
            session = session.with_speculation(s);
        }
        let mut text = String::new();
        let stats = session
            .generate(
                &e_small,
                &prompt,
                &mut Sampler::new(SamplerConfig::greedy()),
                &mut Generation::new(50, true),
                &mut collect_text(&mut text),
            )
            .unwrap();
        (text, stats.stop, stats.n_generated, session.tokens().len())
    };
    let want = short(None);
    assert_eq!(want.1, StopReason::ContextFull);
    assert_eq!(short(Some(lookup_drafts(8))), want);
    assert_eq!(short(Some(draft(&e, 31, &choice))), want);
}

/// A policy that cannot rewind exactly is refused with speculation, naming it.
#[test]
fn speculation_refuses_a_policy_that_cannot_rewind() {
    let e = engine(31);
    let mut session =
        Session::new(sequence(&e.model, &h2o(), None)).with_speculation(lookup_drafts(4));
    let err = session
        .generate(
            &e,
            &repeating_prompt(),
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Generation::new(4, true),
            &mut collect_text(&mut String::new()),
        )
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("'h2o'") && err.contains("rewind"), "{err}");
}

#[test]
fn vocabularies_must_agree() {
    let e = engine(31);
    let other = Engine::load({
        let path = scratch().join("other-vocab.gguf");
        let mut s = spec(31);
        s.overrides.push((
            "tokenizer.ggml.tokens".into(),
            sparrow_gguf::Value::Array(
                (0..257u32)
                    .map(|i| {
                        sparrow_gguf::Value::String(if i == 70 {
                            "<different>".into()
                        } else {
                            e.tokenizer.token_text(i).unwrap().to_string()
                        })
                    })
                    .collect(),
            ),
        ));
        std::fs::write(&path, synthetic_gguf(&s)).unwrap();
        path
    })
    .unwrap();
    let err = check_vocabularies(&e.tokenizer, &other.tokenizer)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token 70") && err.contains("<different>"),
        "{err}"
    );
}

#[test]
fn lookup_finds_the_repeat() {
    let p = repeating_prompt();
    // The prompt ends inside its second copy of `piece`: what followed there comes next.
    let got = lookup(&p, 3, 4);
    assert_eq!(got, &p[46..50]);
}

/// The scheduler with drafts in every slot (checks batched with the other slots' tokens and
/// prompt chunks) generates what sessions generate alone, greedy and sampled.
#[test]
fn the_scheduler_speculates_per_slot_with_the_plain_output() {
    use sparrow::scheduler::{reply_channel, Config, Event, Job, Scheduler, SpeculationFactory};
    let e = engine(31);
    let d = Arc::new(engine(32));
    let prompts = [
        repeating_prompt(),
        synthetic_tokens(30, 21),
        repeating_prompt()[5..].to_vec(),
    ];
    let samplers = [
        SamplerConfig::greedy(),
        SamplerConfig {
            temperature: 0.9,
            seed: 3,
            ..SamplerConfig::default()
        },
    ];
    let lookup = SpeculationFactory(Arc::new(|| Ok(lookup_drafts(4))));
    let draft_model = {
        let d = Arc::clone(&d);
        SpeculationFactory(Arc::new(move || {
            let state = sequence(&d.model, &AttentionChoice::default(), None);
            let model = DraftModel::new(Arc::clone(&d.model), state, 0.0, 16)?;
            Ok(Speculation::new(Drafter::Model(Box::new(model)), 5, 0)?.always_draft_max())
        }))
    };
    // The target over a Q8_0 cache: second choices often taken (as in the session test).
    let near_draft = {
        let e = Arc::new(engine(31));
        SpeculationFactory(Arc::new(move || {
            let state = q8_0_sequence(&e.model);
            let model = DraftModel::new(Arc::clone(&e.model), state, 0.0, 16)?;
            Ok(Speculation::new(Drafter::Model(Box::new(model)), 5, 0)?.always_draft_max())
        }))
    };
    let mut siblings_taken = 0;
    for choice in [AttentionChoice::default(), common::small_quest()] {
        for sampler in &samplers {
            let alone: Vec<Vec<u32>> = prompts
                .iter()
                .map(|p| {
                    generate(
                        &e,
                        &choice,
                        None,
                        p,
                        sampler.clone(),
                        Generation::new(24, true),
                    )
                    .1
                })
                .collect();
            let factories = [
                None,
                Some(lookup.clone()),
                Some(draft_model.clone()),
                Some(near_draft.clone()),
            ];
            for (f, factory) in factories.into_iter().enumerate() {
                let scheduler = Scheduler::start(
                    &e,
                    Config {
                        slots: 2,
                        n_ctx: N_CTX,
                        kv: KvType::F16.into(),
                        attention: choice.clone(),
                        batch: 16,
                        speculation: factory.clone(),
                        ..Config::default()
                    },
                )
                .unwrap();
                let receivers: Vec<_> = prompts
                    .iter()
                    .map(|p| {
                        let (reply, events) = reply_channel();
                        let job = Job {
                            prompt: p.clone(),
                            generation: Generation::new(24, true),
                            sampler: Sampler::new(sampler.clone()),
                            reply: Box::new(reply),
                        };
                        assert!(scheduler.submit(job).is_ok());
                        events
                    })
                    .collect();
                for (events, want) in receivers.into_iter().zip(&alone) {
                    let mut text = String::new();
                    loop {
                        match events.recv().expect("the job ends") {
                            Event::Text(t) => text.push_str(&t),
                            Event::Done(u) => {
                                assert_eq!(u.completion_tokens, 24);
                                break;
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                    assert_eq!(
                        text,
                        e.tokenizer.decode(want),
                        "{}, temperature {}, drafts {}",
                        choice.label(),
                        sampler.temperature,
                        factory.is_some()
                    );
                }
                let stats = scheduler.stats();
                let drafted = stats.drafted_tokens.load(Ordering::Relaxed);
                let kept = stats.accepted_tokens.load(Ordering::Relaxed);
                if factory.is_some() {
                    assert!(drafted > 0 && kept <= drafted, "{drafted} {kept}");
                }
                let siblings = stats.sibling_tokens.load(Ordering::Relaxed);
                let taken = stats.siblings_taken.load(Ordering::Relaxed);
                if f >= 2 && choice.label() == "full" {
                    // A draft model's checks under full attention carry second choices.
                    assert!(siblings > 0 && taken <= siblings, "{siblings} {taken}");
                    siblings_taken += taken;
                } else {
                    assert_eq!(
                        siblings,
                        0,
                        "{}: siblings without a draft model or under a selecting policy",
                        choice.label()
                    );
                }
            }
        }
    }
    assert!(
        siblings_taken > 0,
        "no sibling was taken: the path went untested"
    );
}

/// The classes of the rank of a generated token among the model's own choices at its step:
/// the most likely, the second, 3rd–5th, 6th–16th, any other.
const RANK_CLASSES: [usize; 4] = [1, 2, 5, 16];

/// Counts of the rank classes of the 2nd and 3rd tokens generated after `prompt` (ranks
/// under the model's logits at each step, recomputed), one generation per seed, with the
/// speculation `spec` makes (or none).
fn rank_classes(
    e: &Engine,
    prompt: &[u32],
    seeds: std::ops::Range<u64>,
    spec: &dyn Fn() -> Option<Speculation>,
) -> Vec<f64> {
    let mut counts = vec![0.0; RANK_CLASSES.len() + 1];
    let choice = AttentionChoice::default();
    for seed in seeds {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerConfig::default()
        };
        let (_, ids, _, _) = generate(e, &choice, spec(), prompt, cfg, Generation::new(3, true));
        let mut st = sequence(&e.model, &choice, None);
        let mut ctx = prompt.to_vec();
        ctx.push(ids[0]);
        let mut logits = e
            .model
            .forward(&mut st, &ctx, Logits::Last)
            .unwrap()
            .to_vec();
        for &id in &ids[1..] {
            let mine = logits[id as usize];
            let rank = logits.iter().filter(|&&l| l > mine).count();
            counts[RANK_CLASSES.iter().take_while(|&&c| rank >= c).count()] += 1.0;
            logits = e
                .model
                .forward(&mut st, &[id], Logits::Last)
                .unwrap()
                .to_vec();
        }
    }
    counts
}

/// Pearson's statistic for two samples having one distribution over the same classes
/// (a 2 × k contingency table; k − 1 degrees of freedom).
fn chi_square(a: &[f64], b: &[f64]) -> f64 {
    let (na, nb): (f64, f64) = (a.iter().sum(), b.iter().sum());
    let n = na + nb;
    a.iter()
        .zip(b)
        .filter(|(x, y)| *x + *y > 0.0)
        .map(|(&x, &y)| {
            let (ea, eb) = (na * (x + y) / n, nb * (x + y) / n);
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum()
}

/// With sampling, speculative decoding's tokens follow the model's distribution: on
/// disjoint seeds, the classes of the tokens generated through drafts and directly pass a
/// chi-square test at significance 0.001 — and a deliberately wrong acceptance rule (every
/// draft taken unsampled) fails it.
#[test]
fn sampled_speculative_tokens_follow_the_models_distribution() {
    let e = engine(31);
    let d = Arc::new(engine(31));
    let prompt = synthetic_tokens(12, 40);
    // χ²(4) at 0.001 (five rank classes).
    const CRITICAL: f64 = 18.467;
    let draft = |wrong: bool| {
        let d = Arc::clone(&d);
        move || {
            let state = sequence(&d.model, &AttentionChoice::default(), None);
            let model = DraftModel::new(Arc::clone(&d.model), state, 0.0, 64).unwrap();
            let s = Speculation::new(Drafter::Model(Box::new(model)), 3, 0)
                .unwrap()
                .always_draft_max();
            Some(if wrong { s.take_drafts_unchecked() } else { s })
        }
    };
    let direct = rank_classes(&e, &prompt, 0..1000, &|| None);
    let right = rank_classes(&e, &prompt, 10_000..11_000, &draft(false));
    let wrong = rank_classes(&e, &prompt, 10_000..11_000, &draft(true));
    let (ok, bad) = (chi_square(&direct, &right), chi_square(&direct, &wrong));
    eprintln!("χ² of the rule in use {ok:.1}, of the wrong rule {bad:.1} (critical {CRITICAL})");
    assert!(
        ok < CRITICAL,
        "the rule in use: χ² = {ok:.1} ({direct:?} / {right:?})"
    );
    assert!(
        bad > CRITICAL,
        "the wrong rule passed: χ² = {bad:.1} ({direct:?} / {wrong:?})"
    );
}

/// A lean model (small scratch) checks a draft longer than its batch in pieces, with the
/// same rows.
#[test]
fn a_lean_model_checks_long_drafts_in_pieces() {
    let e = engine(31);
    let path = scratch().join("lean-31.gguf");
    std::fs::write(&path, synthetic_gguf(&spec(31))).unwrap();
    let lean = Engine::load_with(
        &path,
        sparrow::LoadOptions {
            lean: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    let vocab = e.model.config.vocab_size;
    let prompt = synthetic_tokens(40, 5);
    let steps = synthetic_tokens(80, 6);
    let mut a = sequence(&e.model, &common::small_quest(), None);
    e.model.forward(&mut a, &prompt, Logits::Last).unwrap();
    let want = e
        .model
        .forward_steps(&mut a, &steps, Logits::All)
        .unwrap()
        .to_vec();
    let mut b = sequence(&lean.model, &common::small_quest(), None);
    lean.model.forward(&mut b, &prompt, Logits::Last).unwrap();
    let got = lean
        .model
        .forward_steps(&mut b, &steps, Logits::All)
        .unwrap();
    assert_eq!(got.len(), 80 * vocab);
    assert!(got == &want[..], "the lean model's rows differ");
    let _ = b.truncate(40);
    let last = lean
        .model
        .forward_steps(&mut b, &steps, Logits::Last)
        .unwrap();
    assert!(last == &want[79 * vocab..]);
}

/// A pass over part of the vocabulary ([`Model::forward_head`]) gives each of its tokens
/// the logit a whole-vocabulary pass gives it, to the bit, after a prompt in batches and
/// after decode steps; a head of another vocabulary and an empty pass are refused.
#[test]
fn a_vocab_head_gives_its_tokens_the_whole_vocabularys_logits() {
    let e = engine(31);
    let m = &e.model;
    let vocab = m.config.vocab_size;
    let mut head = VocabHead::new(70, vocab);
    assert_eq!(head.first(), 128);
    head.include(&[200, 129, 256, 130, 200]);
    let ids: Vec<u32> = (0..head.len()).map(|i| head.id(i)).collect();
    assert_eq!(&ids[128..], &[129, 130, 200, 256]);

    let prompt = repeating_prompt();
    let mut whole = sequence(m, &AttentionChoice::default(), None);
    let mut part = sequence(m, &AttentionChoice::default(), None);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let check = |whole: &[f32], part: &[f32], what: &str| {
        assert_eq!(part.len(), head.len(), "{what}");
        let want: Vec<f32> = ids.iter().map(|&t| whole[t as usize]).collect();
        assert_eq!(bits(part), bits(&want), "{what}");
    };
    // The prompt in batches of 16 (the last a short one), then three decode steps.
    for chunk in prompt.chunks(16) {
        m.forward(&mut whole, chunk, Logits::Last).unwrap();
        m.forward_head(&mut part, chunk, &head).unwrap();
    }
    check(whole.last_logits(), part.logits(), "after the prompt");
    for t in [5u32, 250, 77] {
        let w = m.forward(&mut whole, &[t], Logits::Last).unwrap().to_vec();
        let p = m.forward_head(&mut part, &[t], &head).unwrap().to_vec();
        check(&w, &p, &format!("after token {t}"));
    }
    assert!(m.forward_head(&mut part, &[], &head).is_err());
    assert!(m
        .forward_head(&mut part, &[1], &VocabHead::new(64, vocab + 1))
        .is_err());
}
