//! sparrow: the engine. Loads llama-family GGUF models, tokenizes, runs the forward pass over
//! a KV cache behind an attention seam, samples, and renders chat templates.

pub mod attention;
pub mod chat;
pub mod engine;
pub mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod generate;
pub mod grammar;
pub mod kv;
pub mod memory;
pub mod model;
pub mod policy;
pub mod prefix_cache;
pub mod prompt_cache;
pub mod saap;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod speculative;
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;
pub mod threads;
pub mod tokenizer;

/// The unit tests render hostile chat templates under the heap cap, as the binary does.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: chat::TemplateAllocator = chat::TemplateAllocator;

pub use chat::{ChatMessage, ChatTemplate, TemplateAllocator, TemplateLimits};
pub use engine::Engine;
pub use error::{Error, Result};
pub use generate::{
    collect_ids, collect_text, prefill, Generation, GenerationStats, Next, Output,
    SpeculationStats, StopReason, TokenLogprob, TokenSink, WithProgress,
};
pub use kv::{ColdTier, KvOptions, KvStore, KvType, KvTypes, RamStore, TieredStore};
pub use model::{
    LoadOptions, Logits, Model, ModelConfig, RowGroups, SeqStep, State, VocabHead, Workspace,
};
pub use sampler::{LogProbs, Sampler, SamplerConfig};
pub use scheduler::Scheduler;
pub use session::{Session, SessionStep};
pub use speculative::{DraftModel, Drafter, PromptLookup, Speculation};
