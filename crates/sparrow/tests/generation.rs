//! `Generation` stepped by hand with scripted logits (every rule of the token loop seen
//! from outside: stop strings held back and cut, limits, end of generation, a full
//! context, log-probabilities against an f64 log-softmax and their text offsets),
//! `Session`'s prefix reuse and rewind on a synthetic model, and the scheduler generating
//! what a session generates alone.

use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow::{
    collect_text, Engine, Generation, KvType, Logits, Next, Sampler, SamplerConfig, Session,
    StopReason,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The synthetic model with its byte-level tokenizer, from a file of its own (the tests
/// run in parallel, and rewriting a file another test has mapped would pull its pages).
fn engine() -> Engine {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("sparrow-generation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path: PathBuf = dir.join(format!("synthetic-{n}.gguf"));
    std::fs::write(&path, synthetic_gguf(&SyntheticSpec::default())).unwrap();
    Engine::load(&path).unwrap()
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    })
}

/// Logits that make `id` the greedy choice, with some spread for the log-probabilities.
fn logits_for(id: u32, vocab: usize) -> Vec<f32> {
    let mut l: Vec<f32> = (0..vocab).map(|i| (i % 7) as f32 * 0.25).collect();
    l[id as usize] = 9.0;
    l
}

/// Step `gen` through the byte tokens `script`, returning each step's `Next` and the
/// text and log-probability ids it made final.
fn run(
    e: &Engine,
    gen: &mut Generation,
    script: &[u32],
    room: usize,
) -> (Vec<Next>, String, Vec<(u32, usize)>) {
    let vocab = e.tokenizer.vocab_size();
    let mut sampler = greedy();
    let (mut nexts, mut text, mut lps) = (Vec::new(), String::new(), Vec::new());
    for &id in script {
        let mut l = logits_for(id, vocab);
        let next = gen.next(&e.tokenizer, &mut sampler, &mut l, room);
        let out = gen.take_output();
        // Log-probabilities come before the text they start in.
        for t in &out.logprobs {
            assert!(t.offset <= text.len() + out.text.len());
            lps.push((t.id, t.offset));
        }
        text.push_str(&out.text);
        nexts.push(next);
        if matches!(next, Next::Done { .. }) {
            break;
        }
    }
    (nexts, text, lps)
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[test]
fn stop_strings_are_held_back_then_cut_with_their_tokens_logprobs() {
    let e = engine();
    let mut gen = Generation::new(100, false)
        .with_stops(vec!["END".into()])
        .with_logprobs(2);
    let vocab = e.tokenizer.vocab_size();
    let mut sampler = greedy();
    let mut seen = String::new();
    for (i, &id) in bytes("abENDx").iter().enumerate() {
        let mut l = logits_for(id, vocab);
        let next = gen.next(&e.tokenizer, &mut sampler, &mut l, 50);
        let out = gen.take_output();
        seen.push_str(&out.text);
        match i {
            // "E" and "N" could start "END": nothing new is final.
            2 | 3 => assert_eq!((out.text.as_str(), out.logprobs.len()), ("", 0)),
            4 => {
                assert_eq!(
                    next,
                    Next::Done {
                        token: Some(u32::from(b'D')),
                        reason: StopReason::StopString
                    }
                );
                // The tokens of the stop string have no log-probabilities.
                assert!(out.logprobs.is_empty());
                break;
            }
            _ => assert_eq!(out.logprobs.len(), 1),
        }
    }
    assert_eq!(seen, "ab");
    // A false start is released once it cannot be a stop string any more.
    let mut gen = Generation::new(100, false).with_stops(vec!["END".into()]);
    let (_, text, _) = run(&e, &mut gen, &bytes("aENx"), 50);
    assert_eq!(text, "aENx");
}

#[test]
fn limits_end_of_generation_and_a_full_context() {
    let e = engine();
    let eos = *e
        .tokenizer
        .eog_ids()
        .first()
        .expect("an end-of-generation token");
    let (nexts, text, _) = run(&e, &mut Generation::new(3, false), &bytes("abcd"), 50);
    assert_eq!(text, "abc");
    assert_eq!(
        nexts.last(),
        Some(&Next::Done {
            token: Some(u32::from(b'c')),
            reason: StopReason::Length
        })
    );
    let (nexts, text, _) = run(&e, &mut Generation::new(9, false), &[97, eos, 98], 50);
    assert_eq!(text, "a");
    assert_eq!(
        nexts,
        vec![
            Next::Feed(97),
            Next::Done {
                token: None,
                reason: StopReason::EndOfGeneration
            }
        ]
    );
    // ignore_eos: the end-of-generation token is generated like any other.
    let (nexts, _, _) = run(&e, &mut Generation::new(9, true), &[97, eos], 50);
    assert_eq!(nexts, vec![Next::Feed(97), Next::Feed(eos)]);
    // No room in the cache: the token is generated but cannot be fed.
    let (nexts, _, _) = run(&e, &mut Generation::new(9, false), &[97], 0);
    assert_eq!(
        nexts,
        vec![Next::Done {
            token: Some(97),
            reason: StopReason::ContextFull
        }]
    );
    // Cancelled: nothing more is generated.
    let mut gen = Generation::new(9, false);
    gen.cancel();
    let (nexts, _, _) = run(&e, &mut gen, &[97], 50);
    assert_eq!(
        nexts,
        vec![Next::Done {
            token: None,
            reason: StopReason::Cancelled
        }]
    );
}

#[test]
fn logprobs_are_the_raw_log_softmax_and_point_into_the_text() {
    let e = engine();
    let vocab = e.tokenizer.vocab_size();
    // "é" is two byte tokens: both start at offset 1 and arrive with the character.
    let script = [u32::from(b'a'), 0xC3, 0xA9, u32::from(b'b')];
    let mut gen = Generation::new(100, false).with_logprobs(3);
    let (_, text, lps) = run(&e, &mut gen, &script, 50);
    assert_eq!(text, "aéb");
    assert_eq!(lps, vec![(97, 0), (0xC3, 1), (0xA9, 1), (98, 3)]);
    // The value itself, against an f64 log-softmax of the logits it was sampled from.
    let raw = logits_for(98, vocab);
    let max = raw.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let norm = max
        + raw
            .iter()
            .map(|&v| (v as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut gen = Generation::new(100, false).with_logprobs(3);
    let mut l = raw.clone();
    // A temperature that reshapes the logits must not change the reported values.
    let mut hot = Sampler::new(SamplerConfig {
        temperature: 0.5,
        top_k: 1,
        ..SamplerConfig::default()
    });
    gen.next(&e.tokenizer, &mut hot, &mut l, 50);
    let out = gen.take_output();
    assert_eq!(out.logprobs.len(), 1);
    let t = &out.logprobs[0];
    assert_eq!(t.id, 98);
    assert!(
        (t.logprob as f64 - (9.0 - norm)).abs() < 1e-5,
        "{}",
        t.logprob
    );
    assert_eq!(t.top.len(), 3);
    assert_eq!(t.top[0].0, 98);
}

#[test]
fn a_session_reuses_the_prefix_it_shares_and_forgets_the_rest() {
    let e = engine();
    let new_session =
        || Session::new(e.model.new_state(128, KvType::F32).expect("a state")).with_batch_size(7);
    let go = |session: &mut Session, prompt: &[u32]| {
        let mut gen = Generation::new(5, true);
        let mut ids = Vec::new();
        let stats = session
            .generate(
                &e,
                prompt,
                &mut greedy(),
                &mut gen,
                &mut sparrow::collect_ids(&mut ids),
            )
            .unwrap();
        (stats, ids)
    };
    let mut session = new_session();
    let first: Vec<u32> = (10..40).collect();
    let (stats, ids) = go(&mut session, &first);
    assert_eq!((stats.n_reused, stats.n_prompt, ids.len()), (0, 30, 5));
    // The cache holds the prompt and every generated token but the last.
    assert_eq!(session.tokens(), [&first[..], &ids[..4]].concat());
    assert_eq!(session.state().n_past(), 34);
    // A prompt that shares the first 20 tokens keeps them and runs the rest: the session
    // rewinds from 34 positions to 20.
    let second: Vec<u32> = (10..30).chain(60..70).collect();
    let (stats, after_rewind) = go(&mut session, &second);
    assert_eq!((stats.n_reused, stats.n_prompt), (20, 10));
    assert_eq!(session.tokens(), [&second[..], &after_rewind[..4]].concat());
    // A session that never held anything past those 20 tokens, fed in the same batches
    // (7, 7, 6, then 7, 3 for the rest), generates the same tokens from the same logits, to
    // the bit: a rewind that left anything of the first prompt's tail behind (positions,
    // cached rows, the policy's state) shows here.
    let mut fresh = new_session();
    for chunk in second[..20].chunks(7) {
        fresh.feed(&e.model, chunk, Logits::None).unwrap();
    }
    let (stats, fresh_ids) = go(&mut fresh, &second);
    assert_eq!((stats.n_reused, stats.n_prompt), (20, 10));
    assert_eq!(after_rewind, fresh_ids);
    let bits = |s: &Session| -> Vec<u32> {
        s.state()
            .last_logits()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert_eq!(
        bits(&session),
        bits(&fresh),
        "a rewound session's logits differ"
    );
    // The same prompt again reuses all but its last token.
    assert_eq!(session.reuse_prefix(&second), 29);
    assert_eq!(session.tokens(), &second[..29]);
}

#[test]
fn the_scheduler_generates_what_a_session_generates_alone() {
    use sparrow::scheduler::{reply_channel, Config, Event, Job, Scheduler};
    let e = engine();
    let prompts: Vec<Vec<u32>> = vec![
        (10..40).collect(),
        (10..30).chain(60..75).collect(),
        (90..97).collect(),
    ];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let mut session = Session::new(e.model.new_state(128, KvType::F32).unwrap());
            let mut text = String::new();
            session
                .generate(
                    &e,
                    p,
                    &mut greedy(),
                    &mut Generation::new(6, true),
                    &mut collect_text(&mut text),
                )
                .unwrap();
            text
        })
        .collect();
    // Two slots for three jobs: the third waits for a slot; prompts are read 16 tokens a
    // pass, shared with the tokens being generated.
    let scheduler = Scheduler::start(
        &e,
        Config {
            slots: 2,
            n_ctx: 128,
            kv: KvType::F32.into(),
            batch: 16,
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
                generation: Generation::new(6, true),
                sampler: greedy(),
                reply: Box::new(reply),
            };
            assert!(scheduler.submit(job).is_ok(), "the queue has room");
            events
        })
        .collect();
    for (events, want) in receivers.into_iter().zip(&alone) {
        let mut text = String::new();
        let usage = loop {
            match events.recv().expect("the job ends") {
                Event::Text(t) => text.push_str(&t),
                Event::Done(u) => break u,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(&text, want);
        assert_eq!(usage.completion_tokens, 6);
        assert_eq!(usage.stop, StopReason::Length);
    }
    let stats = scheduler.stats();
    assert_eq!(stats.completed.load(Ordering::Relaxed), 3);
    assert!(stats.pass_sequences.load(Ordering::Relaxed) > stats.passes.load(Ordering::Relaxed));
}
