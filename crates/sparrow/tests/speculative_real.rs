//! Speculative decoding on the real models: decode steps checked in one pass have the bits
//! of one-token passes on quantized weights (Qwen's Q4_K/Q6_K, Gemma's sliding-window
//! layers, SmolLM's Q4_1), and greedy speculative output is the plain greedy output token
//! for token — the 0.5B drafting for the 1.5B, and prompt lookup — with full, Quest and
//! Saap decode and under a RAM budget for the KV. Run at each SIMD level
//! (`SPARROW_SIMD=scalar|avx2|avx512`): every level must hold it.

mod common;

use common::{gemma_path, qwen15b_path, qwen_path, smollm_path};
use sparrow::attention::AttentionChoice;
use sparrow::kv::{ColdTier, KvOptions};
use sparrow::policy::quest::QuestSettings;
use sparrow::policy::saap::Layout;
use sparrow::speculative::DEFAULT_DRAFT_VOCAB;
use sparrow::{
    DraftModel, Drafter, Engine, Generation, KvType, Logits, PromptLookup, Sampler, SamplerConfig,
    Session, Speculation,
};
use std::sync::Arc;

const N_CTX: usize = 1024;

/// A code-editing prompt (the text repeats in the answer: lookup finds drafts).
const EDIT: &str = "<|im_start|>user\nRename the variable `total` to `sum` in this function and change nothing else.\n\n```python\ndef mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n```<|im_end|>\n<|im_start|>assistant\n";

/// A sequence of `e` running `choice`, its KV in RAM or (`cold`) under the smallest RAM
/// budget of the form 2^k it accepts — a block or two of recent rows, far below the
/// prompt's KV, so most of it is read back from the cold file.
fn sequence(e: &Engine, choice: &AttentionChoice, cold: bool) -> sparrow::State {
    let kv = |ram_budget: Option<usize>| KvOptions {
        types: KvType::F16.into(),
        cold: ram_budget.map(|ram_budget| ColdTier {
            ram_budget,
            dir: None,
        }),
        reserved: 0,
    };
    if !cold {
        return e.model.new_sequence(N_CTX, kv(None), choice).unwrap();
    }
    (16..28)
        .find_map(|k| e.model.new_sequence(N_CTX, kv(Some(1 << k)), choice).ok())
        .expect("some budget is accepted")
}

fn quest() -> AttentionChoice {
    AttentionChoice::named("quest").with(QuestSettings {
        page: 16,
        budget: 64,
        dense_layers: vec![0, 1],
        rerank: 0,
    })
}

/// Saap over a random index for `e`'s shapes (see [`common::random_saap`]).
fn saap(e: &Engine) -> AttentionChoice {
    let dir = std::env::temp_dir().join(format!("sparrow-spec-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join(format!("random-{}.saap", e.model.config.n_layer));
    common::random_saap(&e.model, &index, (16, 4, 3), Layout::Positions)
}

#[test]
fn decode_steps_have_one_token_bits_on_real_weights() {
    for path in [qwen_path(), gemma_path(), smollm_path()] {
        let e = Engine::load(&path).unwrap();
        let m = &e.model;
        let vocab = m.config.vocab_size;
        let prompt = e.tokenizer.encode(EDIT, true, true);
        let steps: Vec<u32> = e.tokenizer.encode(
            " def mean(values):\n    sum = 0\n    for v in values:\n        sum += v\n    return sum",
            false,
            false,
        );
        assert!(steps.len() >= 20, "{}", steps.len());
        let mut alone = m.new_state(N_CTX, KvType::F16).unwrap();
        m.forward(&mut alone, &prompt, Logits::Last).unwrap();
        let want: Vec<Vec<f32>> = steps[..20]
            .iter()
            .map(|&t| m.forward(&mut alone, &[t], Logits::Last).unwrap().to_vec())
            .collect();
        let mut batched = m.new_state(N_CTX, KvType::F16).unwrap();
        m.forward(&mut batched, &prompt, Logits::Last).unwrap();
        let mut at = 0;
        // 17 rows: past the 16 at which a batched product would take the panel kernels.
        for n in [1, 2, 17] {
            let rows = m
                .forward_steps(&mut batched, &steps[at..at + n], Logits::All)
                .unwrap();
            for (i, row) in rows.chunks_exact(vocab).enumerate() {
                assert!(
                    row == &want[at + i][..],
                    "{}: step {} of a pass of {n} differs from its one-token pass",
                    path.display(),
                    at + i
                );
            }
            at += n;
        }
    }
}

/// Greedy tokens after `prompt` from a session over `e` with `choice`, with or without
/// drafts; the tokens and the speculation counts.
fn greedy(
    e: &Engine,
    choice: &AttentionChoice,
    cold: bool,
    spec: Option<Speculation>,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Option<sparrow::SpeculationStats>) {
    let mut session = Session::new(sequence(e, choice, cold));
    if let Some(s) = spec {
        session = session.with_speculation(s);
    }
    let mut ids = Vec::new();
    let stats = session
        .generate(
            e,
            prompt,
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Generation::new(n, true),
            &mut sparrow::collect_ids(&mut ids),
        )
        .unwrap();
    if cold {
        assert!(session.state().kv().bytes_cold() > 0, "the KV went cold");
    }
    (ids, stats.speculation)
}

fn lookup() -> Speculation {
    Speculation::new(Drafter::Lookup(PromptLookup::new(3).unwrap()), 8, 1)
        .unwrap()
        .always_draft_max()
}

#[test]
fn lookup_output_is_greedy_output_on_the_small_models() {
    for path in [qwen_path(), gemma_path()] {
        let e = Engine::load(&path).unwrap();
        let prompt = e.tokenizer.encode(EDIT, true, true);
        let mut choices = vec![("full", AttentionChoice::default()), ("quest", quest())];
        if e.model.config.arch.name() == "qwen2" {
            choices.push(("saap", saap(&e)));
        }
        for (name, choice) in choices {
            for cold in [false, true] {
                let plain = greedy(&e, &choice, cold, None, &prompt, 32);
                let (ids, stats) = greedy(&e, &choice, cold, Some(lookup()), &prompt, 32);
                assert_eq!(
                    ids,
                    plain.0,
                    "{}, {name}, cold {cold}: lookup changed the output",
                    path.display()
                );
                let stats = stats.unwrap();
                // The answer copies some of the code: some of lookup's drafts are right.
                assert!(stats.accepted >= 5, "{name}: {stats:?}");
            }
        }
    }
}

#[test]
fn the_small_qwen_drafts_for_the_large_one() {
    let target = Engine::load(qwen15b_path()).unwrap();
    let draft = Engine::load(qwen_path()).unwrap();
    sparrow::speculative::check_vocabularies(&target.tokenizer, &draft.tokenizer).unwrap();
    // A copying task (the draft is nearly always right) and an open question (it is not).
    let open = "<|im_start|>user\nIn two sentences, why do small birds sing at dawn?<|im_end|>\n<|im_start|>assistant\n";
    let (mut drafted, mut accepted, mut siblings, mut siblings_kept) = (0, 0, 0, 0);
    for text in [EDIT, open] {
        let prompt = target.tokenizer.encode(text, true, true);
        // The draft's default head (the first ids and the context's) and its whole one.
        for (name, choice, cold, vocab_head) in [
            (
                "full",
                AttentionChoice::default(),
                false,
                DEFAULT_DRAFT_VOCAB,
            ),
            ("full, whole head", AttentionChoice::default(), false, 0),
            // Siblings (full attention) written again and again under a cold tier.
            (
                "full, cold",
                AttentionChoice::default(),
                true,
                DEFAULT_DRAFT_VOCAB,
            ),
            ("quest, cold", quest(), true, DEFAULT_DRAFT_VOCAB),
        ] {
            let plain = greedy(&target, &choice, cold, None, &prompt, 32);
            let state = draft.model.new_state(N_CTX, KvType::F16).unwrap();
            let model = DraftModel::new(Arc::clone(&draft.model), state, 0.0, 256)
                .unwrap()
                .with_vocab_head(vocab_head);
            let spec = Speculation::new(Drafter::Model(Box::new(model)), 6, 0)
                .unwrap()
                .always_draft_max();
            let (ids, stats) = greedy(&target, &choice, cold, Some(spec), &prompt, 32);
            assert_eq!(ids, plain.0, "{name}: drafting changed the output");
            let stats = stats.unwrap();
            drafted += stats.drafted;
            accepted += stats.accepted;
            siblings += stats.siblings;
            siblings_kept += stats.siblings_kept;
        }
    }
    // Full attention's checks carried the draft's second choices where it was unsure.
    assert!(siblings > 0, "{siblings_kept} of {siblings}");
    // Drafts both kept and refused were judged.
    assert!(
        accepted > 16 && accepted < drafted,
        "{accepted} of {drafted}"
    );
}
