//! The engine on the real Qwen2.5 file: chat template rendering and the generation loop.

mod common;

use sparrow::{ChatMessage, Engine, Generation, KvType, Sampler, SamplerConfig, Session};
use std::ops::ControlFlow;

#[test]
fn qwen_chat_template_renders_chatml_with_default_system() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tmpl = engine
        .chat_template
        .as_ref()
        .expect("Qwen ships a template");
    let user = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    let text = tmpl
        .render(&[ChatMessage::new("user", "What is 2+2?")], true)
        .unwrap();
    assert_eq!(
        text,
        format!(
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n{user}"
        )
    );
    let text = tmpl
        .render(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "What is 2+2?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        text,
        format!("<|im_start|>system\nBe brief.<|im_end|>\n{user}")
    );
    // Without the generation prompt the assistant turn is not opened.
    let text = tmpl
        .render(&[ChatMessage::new("user", "x")], false)
        .unwrap();
    assert!(text.ends_with("<|im_start|>user\nx<|im_end|>\n"), "{text}");
}

#[test]
fn chat_generation_stops_at_end_of_turn_and_streams_valid_text() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tmpl = engine.chat_template.as_ref().unwrap();
    let prompt = tmpl
        .render(
            &[ChatMessage::new("user", "Reply with just the word: yes")],
            true,
        )
        .unwrap();
    let ids = engine.tokenizer.encode(&prompt, true, true);
    let mut session =
        Session::new(engine.model.new_state(256, KvType::F16).unwrap()).with_batch_size(7);
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut text = String::new();
    let mut n_ids = 0;
    let stats = session
        .generate(
            &engine,
            &ids,
            &mut sampler,
            &mut Generation::new(24, false),
            &mut |id: Option<u32>, piece: &str| {
                n_ids += id.is_some() as usize;
                text.push_str(piece);
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    assert_eq!(stats.stop, sparrow::StopReason::EndOfGeneration, "{text:?}");
    assert_eq!(stats.n_generated, n_ids);
    assert!(text.to_lowercase().contains("yes"), "{text:?}");
    assert_eq!(session.state().n_past(), ids.len() + stats.n_generated);
}

#[test]
fn needle_documents_have_the_asked_length_and_depth_and_the_model_finds_it() {
    use sparrow::eval::needle::{
        build_document, build_document_with, run_cell, CellSettings, Needle,
    };
    let engine = Engine::load(common::qwen_path()).unwrap();
    // A small generated haystack: numbered sentences, so positions are easy to read.
    let haystack: String = (0..3000)
        .map(|i| format!("Sentence {i} says that the weather was mild and the road was long. "))
        .collect();
    for (len, depth) in [(300usize, 0.0f64), (600, 0.5), (900, 0.25), (600, 1.0)] {
        let needle = Needle::new(len as u64);
        let (doc, offset) = build_document(&engine, &haystack, &needle, len, depth).unwrap();
        let n = engine.tokenizer.encode(&doc, false, false).len();
        assert!(n.abs_diff(len) <= 4, "asked {len} tokens, got {n}");
        assert_eq!(doc.matches(&needle.value).count(), 1);
        let at = offset as f64 / len as f64;
        assert!((at - depth).abs() < 0.05, "depth {depth}: needle at {at}");
    }
    // Multi-key: every distractor once, spread over the document, the asked needle where it
    // was asked, the length still the one asked for.
    let needle = Needle::new(5);
    let others = needle.distractors(5, 4).unwrap();
    let (doc, offset) =
        build_document_with(&engine, &haystack, &needle, 900, 0.6, &others).unwrap();
    let n = engine.tokenizer.encode(&doc, false, false).len();
    assert!(n.abs_diff(900) <= 6, "asked 900 tokens, got {n}");
    let at: Vec<usize> = others
        .iter()
        .map(|d| {
            assert_eq!(doc.matches(&d.sentence).count(), 1, "{}", d.key);
            doc.find(&d.sentence).unwrap()
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "distractors out of order"
    );
    assert_eq!(doc.matches(&needle.value).count(), 1);
    assert!(
        (offset as f64 / 900.0 - 0.6).abs() < 0.05,
        "needle at {offset}"
    );
    let mut settings = CellSettings {
        kv: KvType::F16.into(),
        batch_size: 128,
        attention: sparrow::attention::AttentionChoice::default(),
        format: Default::default(),
        distractors: 0,
    };
    let r = run_cell(&engine, &haystack, 400, 0.5, 7, &settings).unwrap();
    assert!(
        r.found,
        "the model missed an easy needle: {:?} vs {}",
        r.answer, r.needle.value
    );
    settings.distractors = 3;
    let r = run_cell(&engine, &haystack, 600, 0.5, 7, &settings).unwrap();
    assert_eq!(r.distractors, 3);
    assert!(
        r.found,
        "the model took a distractor for the needle: {:?} vs {}",
        r.answer, r.needle.value
    );
    // A haystack too short for the request is an error, not a silent shorter test.
    assert!(build_document(&engine, "tiny text.", &Needle::new(1), 500, 0.5).is_err());
}
