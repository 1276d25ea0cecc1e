//! Time to render a chat through the sandboxed template: the real Qwen2.5 template (from
//! the default model's metadata) on one and on 20 messages, and ChatML on 5,000 — the
//! cost the memory cap on template values must not change (docs/reliability.md).
//!
//! `cargo bench -p sparrow --bench chat_render`

use criterion::{criterion_group, criterion_main, Criterion};
use sparrow::{ChatMessage, ChatTemplate};
use std::path::PathBuf;
use std::time::Duration;

/// As the `sparrow` binary: renders run capped, in a coroutine. Without this line they
/// run inline, as before the cap (the "uncapped" figures of docs/reliability.md).
#[global_allocator]
static ALLOCATOR: sparrow::TemplateAllocator = sparrow::TemplateAllocator;

fn qwen_template() -> Option<ChatTemplate> {
    let dir = std::env::var("SPARROW_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/sparrow/models")
        });
    let file =
        sparrow_gguf::GgufFile::open(dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")).ok()?;
    let source = file.metadata().opt_str("tokenizer.chat_template").ok()??;
    ChatTemplate::new(source, "", "<|im_end|>").ok()
}

fn conversation(n: usize) -> Vec<ChatMessage> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            ChatMessage::new(
                role,
                "Some words of a message, about as long as a short reply.",
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("chat_render");
    g.measurement_time(Duration::from_secs(4));
    if let Some(qwen) = qwen_template() {
        for n in [1, 20] {
            let msgs = conversation(n);
            g.bench_function(format!("qwen_{n}_messages"), |b| {
                b.iter(|| qwen.render(&msgs, true).unwrap().len())
            });
        }
    }
    let chatml = ChatTemplate::builtin("chatml").unwrap();
    let msgs = conversation(5000);
    g.bench_function("chatml_5000_messages", |b| {
        b.iter(|| chatml.render(&msgs, true).unwrap().len())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
