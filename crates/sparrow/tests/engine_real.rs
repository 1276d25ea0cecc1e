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
